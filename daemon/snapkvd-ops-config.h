/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-ops-config.h - configuration keys of the operations modules
 * (pressure policy, hooks, metrics textfile, per-tenant quotas).
 *
 * The daemon's config parser hands every key it does not know to
 * snapkvd_ops_config_set(); -ENOENT means "not ours either". Keys:
 *
 *   pressure_high = 80%            enter high (fraction, percent or bytes)
 *   pressure_high_leave = 75%      leave high below this
 *   pressure_critical = 95%        enter critical
 *   pressure_critical_leave = 90%  leave critical below this
 *   pressure_actions = notify,hooks,scale,evict,refuse   order; omit to disable
 *   pressure_scale_high = 0.5      C factor for new requests at high
 *   pressure_scale_critical = 0.25 C factor at critical
 *   pressure_guaranteed_share = 10%  pool share admitted at critical
 *   hook_dir = /etc/snapkvd/hooks.d  executables run on each level change
 *   hook_timeout_ms = 5000         SIGKILL after this long
 *   hook_max = 16                  hooks run per event
 *   hook_max_output = 16K          output kept per hook for the log
 *   hook_ledger_json = PATH        ledger snapshot handed to hooks
 *   metrics_textfile = PATH        node_exporter textfile (*.prom), "" = off
 *   metrics_interval_s = 15        textfile rewrite period
 *   tenant_quota = UID:BYTES[:SHARE]   per-tenant quota and guaranteed
 *                                      share; repeatable, one per uid
 */
#ifndef SNAPKVD_OPS_CONFIG_H
#define SNAPKVD_OPS_CONFIG_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "snapkvd-hooks.h"
#include "snapkvd-pressure.h"

#define SNAPKVD_OPS_MAX_TENANT_QUOTAS 64

struct snapkvd_tenant_quota {
	uid_t uid;
	uint64_t quota_bytes;	 /* 0: none                          */
	double guaranteed_share; /* < 0: the pressure config's share */
};

struct snapkvd_ops_config {
	struct snapkvd_pressure_config pressure;
	/* hooks.dir is left NULL here (the struct is copied by value on
	 * reload); point it at hook_dir right before running hooks. */
	struct snapkvd_hooks_config hooks;
	char hook_dir[PATH_MAX];
	char hook_ledger_json[PATH_MAX];
	char metrics_textfile[PATH_MAX];
	uint32_t metrics_interval_s;
	unsigned n_quotas;
	struct snapkvd_tenant_quota quotas[SNAPKVD_OPS_MAX_TENANT_QUOTAS];
};

void snapkvd_ops_config_init(struct snapkvd_ops_config *c);
/*
 * Apply one key. 0; -ENOENT for a key that is not an ops key; -EINVAL with
 * a reason in err for a bad value. Cross-key consistency (leave <= enter,
 * ...) is checked by snapkvd_ops_config_check() once the file is read.
 */
int snapkvd_ops_config_set(struct snapkvd_ops_config *c, const char *key, const char *value,
			   char *err, size_t errlen);
int snapkvd_ops_config_check(const struct snapkvd_ops_config *c, char *err, size_t errlen);
/* The tenant's entry, or NULL. */
const struct snapkvd_tenant_quota *snapkvd_ops_config_quota(const struct snapkvd_ops_config *c,
							    uid_t uid);

#endif /* SNAPKVD_OPS_CONFIG_H */
