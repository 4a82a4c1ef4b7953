/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-config.h - daemon configuration: defaults, the key = value file
 * format (systemd/snapkvd.conf documents every key), command-line overrides.
 * One parser reads every key, the pressure policy's too:
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
 *   hook_ledger_max_caches = 4096  caches listed in it (totals: all)
 *   metrics_textfile = PATH        node_exporter textfile (*.prom), "" = off
 *   metrics_interval_s = 15        textfile rewrite period
 *   metrics_listen = 9464          HTTP /metrics for Prometheus, "" = off
 *                                  (snapkvd-http.h: its limits' keys)
 *   tenant_quota = UID:BYTES[:SHARE]   per-tenant quota and guaranteed
 *                                      share; repeatable, one per uid
 */
#ifndef SNAPKVD_CONFIG_H
#define SNAPKVD_CONFIG_H

#include <stdint.h>
#include <sys/types.h>

#include <limits.h>
#include <stddef.h>

#include "snapkvd-hooks.h"
#include "snapkvd-http.h"
#include "snapkvd-pressure.h"
#include "snapkvd-value.h" /* the value types, struct snapkvd_tenant_quota */

struct snapkvd_policy_config {
	struct snapkvd_pressure_config pressure;
	/* hooks.dir is left NULL here (the struct is copied by value on
	 * reload); point it at hook_dir right before running hooks. */
	struct snapkvd_hooks_config hooks;
	char hook_dir[PATH_MAX];
	char hook_ledger_json[PATH_MAX];
	uint32_t hook_ledger_max_caches; /* caches the snapshot lists, lowest ids */
	char metrics_textfile[PATH_MAX];
	uint32_t metrics_interval_s;
	unsigned n_quotas;
	struct snapkvd_tenant_quota quotas[SNAPKVD_POLICY_MAX_TENANT_QUOTAS];
};

void snapkvd_policy_config_init(struct snapkvd_policy_config *c);
/*
 * Apply one of the policy's keys (the rows of the config table in struct
 * snapkvd_policy_config). 0; -ENOENT for a key that is not one of them;
 * -EINVAL with "KEY: why" in err (may be NULL) for a bad value, c unchanged.
 * Cross-key consistency (leave <= enter, ...) is checked by
 * snapkvd_policy_config_check() once every key is set.
 */
int snapkvd_policy_config_set(struct snapkvd_policy_config *c, const char *key, const char *value,
			      struct skv_error *err);
/* 0, or -EINVAL with the reason in err (may be NULL). */
int snapkvd_policy_config_check(const struct snapkvd_policy_config *c, struct skv_error *err);
/* The tenant's entry, or NULL. */
const struct snapkvd_tenant_quota *
snapkvd_policy_config_quota(const struct snapkvd_policy_config *c, uid_t uid);

#define SNAPKVD_MAX_ALLOW SNAPKVD_VALUE_MAX_IDS
/* CUDA devices one daemon opens (`devices`; SNAPKVD_DEVICES_MAX) */
#define SNAPKVD_CONFIG_MAX_DEVICES 16
#define SNAPKVD_CONFIG_MAX_BYTES   (64 * 1024)
#define SNAPKVD_CONFIG_MAX_LINE	   SNAPKVD_VALUE_MAX

/* Default scratch bound per compaction thread. One thread needs about
 * L * (4 G + 100) bytes at long L (column sums per query head, at least 16
 * logit rows, votes, ranking keys): G 16 at the default max_prompt_len 2^21
 * is 311 MiB, G 4 at L 2^17 21 MiB; G 1024 at L 2^21 (8.2 GiB) is refused. */
#define SNAPKVD_SCRATCH_PER_THREAD (512ull << 20)

struct snapkvd_config {
	char socket_path[108];
	char backend[16];
	uint64_t pool_bytes;	      /* global budget of all arenas            */
	uint64_t session_arena_bytes; /* arena memfd size per session (virtual) */
	uint64_t arena_cache_bytes;   /* released arena pages kept for reuse,
				       * all sessions (0: punched at release) */
	uint64_t tenant_quota_bytes;  /* 0: the pool                            */
	uint64_t max_buffer_bytes;    /* one registered buffer                  */
	uint64_t max_scratch_bytes;   /* compaction scratch of one request
				       * (0: SNAPKVD_SCRATCH_PER_THREAD x threads) */
	unsigned threads;	      /* compaction threads (0: one per core)   */
	unsigned workers;	      /* compaction workers sharing them (0: auto) */
	unsigned max_sessions;
	unsigned max_buffers; /* per session */
	unsigned max_caches;  /* per session */
	unsigned max_layers, max_heads, max_head_dim, max_prompt_len, max_reserve;
	/* writeback: the most decode tokens a cache may declare (max_decode) */
	unsigned max_decode;
	unsigned sq_entries;	      /* per session ring, power of two */
	unsigned slot_bytes;	      /* argument slot per SQ entry     */
	unsigned poll_idle_us;	      /* spin on the rings this long before sleeping */
	unsigned watchdog_ms;	      /* timer period for housekeeping */
	unsigned prefill_wait_max_ms; /* bound on CompactRequest.prefill_wait */
	int log_level;
	/* hardening (issue 11): every resource a client can claim is bounded */
	unsigned max_sessions_per_tenant; /* engine sessions of one uid            */
	unsigned max_group_size;	  /* members of one decision group         */
	unsigned min_window;		  /* fewest query rows of a partial window */
	unsigned group_timeout_ms;	  /* a group's wait when the request names none */
	unsigned max_group_timeout_ms;	  /* the longest wait a request may name   */
	unsigned max_tenant_groups;	  /* undecided groups of one uid           */
	unsigned max_admin_sessions;	  /* snapkvctl sessions (own slots)        */
	unsigned max_handshakes;	  /* connections not yet past HELLO        */
	unsigned hello_timeout_ms;	  /* HELLO deadline after accept           */
	unsigned max_tenant_buffers;	  /* registered buffers of one uid         */
	uint64_t max_tenant_mapped_bytes; /* bytes of buffers mapped for one uid   */
	uint64_t max_mapped_bytes;	  /* bytes of buffers mapped, all tenants  */
	uint64_t max_request_macs;	  /* work of one COMPACT (multiply-adds)   */
	uint64_t max_request_bytes;	  /* K/V/Q bytes one COMPACT reads         */
	/* registered KV pools (issue 20): pools of one session, and entries of
	 * one block table (inline or in a registered buffer) */
	unsigned max_session_pools;
	unsigned max_block_table;
	/* byte ranges a writeback's overlap check may hold (40 bytes each) */
	unsigned max_writeback_ranges;
	/* admin answers off the loop's critical path (snapkvd-adminq.h): caches
	 * a ledger page builds per loop round, and the admin requests a second
	 * (burst: at most kept) of one admin session, of one uid, of root and
	 * admin_uids (each uid its own bucket); rate 0: no limit */
	unsigned admin_slice_caches;
	unsigned admin_session_rate, admin_session_burst;
	unsigned admin_tenant_rate, admin_tenant_burst;
	unsigned admin_root_rate, admin_root_burst;
	unsigned n_admin_uids;
	uid_t admin_uids[SNAPKVD_MAX_ALLOW]; /* see every tenant in admin views */
	/* --backend cuda: the devices opened, CUDA ordinals (n_devices 0:
	 * every device visible, "all"); read at start only */
	unsigned n_devices;
	int devices[SNAPKVD_CONFIG_MAX_DEVICES];
	unsigned n_allow_uids, n_allow_gids;
	uid_t allow_uids[SNAPKVD_MAX_ALLOW];
	gid_t allow_gids[SNAPKVD_MAX_ALLOW];
	/* pressure_*, hook_*, metrics_textfile, metrics_interval_s, tenant_quota */
	struct snapkvd_policy_config policy;
	/* metrics_listen, metrics_http_*: the Prometheus listener */
	struct snapkvd_http_config http;
};

void snapkvd_config_defaults(struct snapkvd_config *c);

/*
 * Parse a config file's text into c (which holds defaults or earlier
 * values), all or nothing. Every line is `key = value`, `# comment` or
 * blank. Unknown keys, bad values, overlong lines: -EINVAL with "line N:
 * KEY: why" in err (may be NULL); a text over SNAPKVD_CONFIG_MAX_BYTES:
 * -EFBIG; keys that contradict each other: -EINVAL, "pressure: why".
 */
int snapkvd_config_parse(struct snapkvd_config *c, const char *text, size_t len,
			 struct skv_error *err);
/* The same for a file; -errno of open or read with strerror's text in err.
 * err does not name the file: the caller says "PATH: why". */
int snapkvd_config_load(struct snapkvd_config *c, const char *path, struct skv_error *err);
/* One key, as a command-line option sets it: the same checks as in a file,
 * all or nothing. 0 or -EINVAL with "why" (no line, no key) in err. */
int snapkvd_config_set(struct snapkvd_config *c, const char *key, const char *value,
		       struct skv_error *err);
/*
 * A reload (SIGHUP) from next (the file read again) while cur runs: every
 * key a reload does not apply (the table's RESTART rows: socket, backend,
 * threads, workers, sq_entries, slot_bytes, session_arena_bytes,
 * metrics_listen and metrics_http_*) keeps cur's value in next. Returns how
 * many of those the file changed, the first max of their names in
 * ret_kept: the daemon logs each, and applies the rest of the file.
 */
size_t snapkvd_config_keep_running(struct snapkvd_config *next, const struct snapkvd_config *cur,
				   const char **ret_kept, size_t max);
/*
 * The effective configuration as a config file: every key with its value,
 * one per line, in the order of systemd/snapkvd.conf (tenant_quota once per
 * tenant); parsing it gives c back. A malloc'd string; 0 or -ENOMEM.
 */
int snapkvd_config_dump(const struct snapkvd_config *c, char **ret);

/* Whether a peer is allowed in: both allow lists empty means everyone who
 * can reach the socket (its file mode decides). */
int snapkvd_config_allows(const struct snapkvd_config *c, uid_t uid, gid_t gid);
/* Whether uid sees every tenant in admin views and gets the reserved admin
 * slot: root, the daemon's own user, or an admin_uids member. */
int snapkvd_config_is_admin(const struct snapkvd_config *c, uid_t uid);

#endif
