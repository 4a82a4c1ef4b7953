/* SPDX-License-Identifier: MIT */
/*
 * ctl-admin.h - snapkvctl's admin round trip with snapkvd (ctl-admin.c) and
 * the deadline of every exchange with it, which ctl-daemon.c shares.
 */
#ifndef CTL_ADMIN_H
#define CTL_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include "proto/snapkv.pb-c.h"

struct skv_socket_search;

/*
 * Connect to snapkvd at sock (--socket; NULL: the search of
 * proto/skv-socket.h), hello as an admin session, send req and wait for its
 * reply, all of it within one deadline (--timeout). 0 and *ret (free with
 * snapkv__v1__admin_reply__free_unpacked) and, when used is not NULL, the
 * path that answered in used[SKV_SOCKET_PATH_MAX]; or -errno with the
 * reason in err (every path tried, or the daemon's own message when it
 * refused the request).
 */
int ctl_admin_call(const char *sock, Snapkv__V1__AdminRequest *req, Snapkv__V1__AdminReply **ret,
		   char *used, char *err, size_t errlen);

/*
 * The deadline (proto/skv-io.h: CLOCK_MONOTONIC ns, 0 for none) of one
 * exchange with the daemon starting now: --timeout MS, which main() passes
 * on as $SNAPKV_TIMEOUT_MS (checked there), else libsnapkv's default.
 */
uint64_t ctl_admin_deadline(void);
/* The same as milliseconds (0: none), for messages. */
uint32_t ctl_admin_timeout_ms(void);

/* "cannot reach snapkvd: tried A (from): why, ..." into err after the
 * search s ended in r. */
void ctl_admin_unreachable(const struct skv_socket_search *s, int r, char *err, size_t errlen);

#endif
