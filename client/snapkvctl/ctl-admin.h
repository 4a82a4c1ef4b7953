/* SPDX-License-Identifier: MIT */
/*
 * ctl-admin.h - snapkvctl's admin round trip with snapkvd (ctl-admin.c).
 */
#ifndef CTL_ADMIN_H
#define CTL_ADMIN_H

#include <stddef.h>

#include "proto/snapkv.pb-c.h"

/*
 * Connect to sock, hello as an admin session, send req and wait for its
 * reply, all of it within one deadline (--timeout). 0 and *ret (free with
 * snapkv__v1__admin_reply__free_unpacked), or -errno with the reason in err
 * (the daemon's own message when it refused the request).
 */
int ctl_admin_call(const char *sock, Snapkv__V1__AdminRequest *req, Snapkv__V1__AdminReply **ret,
		   char *err, size_t errlen);

#endif
