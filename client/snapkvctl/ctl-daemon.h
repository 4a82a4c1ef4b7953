/* SPDX-License-Identifier: MIT */
/*
 * ctl-daemon.h - snapkvctl's online subcommands (ctl-daemon.c) and the
 * daemon path of `snapkvctl compact`.
 */
#ifndef CTL_DAEMON_H
#define CTL_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include "skv.h"

int ctl_status(int argc, char **argv);
int ctl_caches(int argc, char **argv);
int ctl_ledger(int argc, char **argv);
int ctl_metrics(int argc, char **argv);

/* --group KEY:SIZE[:TIMEOUT_MS] of `snapkvctl compact` (key NULL: none),
 * and what the daemon said of the decision. */
struct ctl_group {
	const char *key;
	uint32_t size, timeout_ms;
	uint32_t decided_size; /* the cache's group_size */
	uint64_t wait_us;      /* the cache's group_wait_us */
};

/*
 * Run one compaction through snapkvd with exactly skv_compact()'s contract:
 * the inputs (any strides, strided only) are copied into a registered buffer,
 * the daemon compacts them with the same kernels, and the compact cache is
 * copied into `out` (kept slots per stored head, positions, retained mass),
 * so a file written from `out` is byte-identical to the --offline one.
 * socket_path: --socket, NULL to search (proto/skv-socket.h); the path used
 * lands in used[SKV_SOCKET_PATH_MAX]. group: NULL or a decision group
 * (its timeout_ms, when given, is added to the --timeout deadline of the
 * wait, since the daemon holds the request until the group is complete);
 * its decided_size and wait_us are filled. 0 or -errno with a reason in err.
 */
int ctl_daemon_compact(const char *socket_path, char *used, const struct skv_shape *shape,
		       const struct skv_params *params, uint32_t n_layers,
		       const struct skv_layer_in *in, const struct skv_layer_out *out,
		       struct ctl_group *group, struct skv_budget_result *outcome, char *err,
		       size_t errlen);

#endif
