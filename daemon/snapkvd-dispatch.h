/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-dispatch.h - a session's requests and their completions, ring
 * and socket alike: SQEs taken from the ring, each Request decoded and
 * dispatched (NOP, COMPACT, APPEND, GROW, RELEASE, STATS), and every
 * answer posted by the loop thread (a CQE with the Response in the
 * request's argument slot, or a RESPONSE frame), CacheInfo encoded here.
 *
 * COMPACT and GROW are validated (snapkvd-request.c), admitted
 * (snapkvd-admission.c) and queued (snapkvd-compactor.c); their jobs come
 * back through snapkvd_dispatch_job_done(), where the cache becomes the
 * session's. APPEND, RELEASE and STATS are answered at once.
 */
#ifndef SNAPKVD_DISPATCH_H
#define SNAPKVD_DISPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "snapkvd-forward.h"

/* Take up to `budget` SQEs from the session's ring. Returns how many. */
int snapkvd_dispatch_poll_ring(struct snapkvd_session *s, unsigned budget);
/* One Request (a socket frame's or a ring slot's copy), answered to o. */
void snapkvd_dispatch_request(struct snapkvd_session *s, const struct snapkvd_origin *o,
			      const uint8_t *buf, size_t len);
/* A finished job (loop thread): its completion is posted, its session
 * reference dropped. */
void snapkvd_dispatch_job_done(struct snapkvd_job *j);

#endif
