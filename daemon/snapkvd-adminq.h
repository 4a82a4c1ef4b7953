/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-adminq.h - admin requests without stalling the loop (issue 20,
 * point 9): each admin request first passes the rate limits, then is
 * answered by snapkvd-admin.c; an answer that lists caches (LEDGER,
 * CACHES) is built in slices of at most admin_slice_caches caches per loop
 * round, the sliced answers taking turns, so that ring requests and
 * compaction completions are served between two slices whatever the
 * number of caches.
 *
 * Rate limits: token buckets (snapkvd-bucket.h), one per admin session
 * (admin_session_rate, admin_session_burst) and one per uid
 * (admin_tenant_rate/_burst; admin_root_rate/_burst for root, the daemon's
 * user and admin_uids), a request taking a token from both. Over either,
 * the request is answered at once with -EAGAIN, an error naming the key,
 * and retry_after_ms. A rate of 0 turns that limit off.
 *
 * While its answer is being built a session's next frame is not read (one
 * answer in the making per session, so at most max_admin_sessions). A
 * session that closes meanwhile loses its answer at the next slice.
 */
#ifndef SNAPKVD_ADMINQ_H
#define SNAPKVD_ADMINQ_H

#include <stddef.h>
#include <stdint.h>

#include "snapkvd-forward.h"

struct snapkvd_adminq;

/* Loop thread only. 0 or -ENOMEM. */
int snapkvd_adminq_new(struct snapkvd_adminq **ret);
/* Frees the answers in the making; touches no session (they are freed
 * apart, at shutdown). Accepts NULL. */
void snapkvd_adminq_free(struct snapkvd_adminq *q);

/* What the control socket does with an answer built in slices: sends buf
 * (len bytes, the caller frees it) and reads the session's next frame. */
typedef void snapkvd_adminq_done_fn(struct snapkvd_session *s, const uint8_t *buf, size_t len);

/*
 * One ADMIN frame of session s: 0 with the packed reply to send now in a
 * malloc'd *ret_buf (a refusal too), 1 queued (done is called from a later
 * snapkvd_adminq_run once it is built; s->admin_pending meanwhile), or
 * -ENOMEM (nothing queued: close the session).
 */
int snapkvd_adminq_request(struct snapkvd_adminq *q, struct snapkvd_server *srv,
			   struct snapkvd_session *s, const uint8_t *payload, size_t len,
			   snapkvd_adminq_done_fn *done, uint8_t **ret_buf, size_t *ret_len);
/* From the loop's round: one slice of the answer whose turn it is (at most
 * admin_slice_caches caches). The caches built (0: nothing queued). */
unsigned snapkvd_adminq_run(struct snapkvd_adminq *q, struct snapkvd_server *srv);
/* The counts the status answer shows are the server's: admin_slices,
 * admin_refused, admin_pending (snapkvd-server.h). */

#endif
