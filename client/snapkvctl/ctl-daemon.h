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

/*
 * The deadline (proto/skv-io.h: CLOCK_MONOTONIC ns, 0 for none) of one
 * exchange with the daemon starting now: --timeout MS, which main() passes
 * on as $SNAPKV_TIMEOUT_MS (checked there), else libsnapkv's default.
 */
uint64_t ctl_daemon_deadline(void);
/* The same as milliseconds (0: none), for messages. */
uint32_t ctl_daemon_timeout_ms(void);

/*
 * Run one compaction through snapkvd with exactly skv_compact()'s contract:
 * the inputs (any strides, strided only) are copied into a registered buffer,
 * the daemon compacts them with the same kernels, and the compact cache is
 * copied into `out` (kept slots per stored head, positions, retained mass),
 * so a file written from `out` is byte-identical to the --offline one.
 * socket_path: --socket, NULL to search (proto/skv-socket.h); the path used
 * lands in used[SKV_SOCKET_PATH_MAX]. 0 or -errno with a reason in err.
 */
int ctl_daemon_compact(const char *socket_path, char *used, const struct skv_shape *shape,
		       const struct skv_params *params, uint32_t n_layers,
		       const struct skv_layer_in *in, const struct skv_layer_out *out,
		       struct skv_budget_result *outcome, char *err, size_t errlen);

#endif
