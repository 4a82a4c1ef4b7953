/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-ring.h - the daemon's end of one session's shared-memory ring
 * (proto/skv-ring.h): the memfd with its SQ, CQ and argument slots, the two
 * eventfds, SQ polling with back-pressure, CQ posting, NEED_WAKEUP on both
 * queues, and PRESSURE event coalescing.
 *
 * It owns the mapping, the eventfds and, until the session has sent it to
 * the engine, the memfd. It knows nothing of sessions or requests: the
 * session's dispatcher takes SQEs from it and gives it CQEs, all on the
 * loop thread, so every CQ keeps one producer. A return of -EBADMSG means
 * the engine corrupted its end (a head or tail out of range): the caller
 * closes the session.
 */
#ifndef SNAPKVD_RING_H
#define SNAPKVD_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/skv-ring.h"

struct snapkvd_ring {
	int fd;	      /* the memfd, until snapkvd_ring_memfd_sent() */
	int sq_efd;   /* the engine's doorbell */
	int cq_efd;   /* the engine sleeps on it (CQ NEED_WAKEUP) */
	uint8_t *map; /* the whole memfd */
	uint64_t bytes;
	struct skv_ring_layout layout; /* our private copy, never re-read */
	struct skv_ring_q sq, cq;
	unsigned inflight; /* SQEs taken whose CQE is not posted yet */
	bool cq_dirty;	   /* CQEs posted since the last wakeup check */
	/* PRESSURE events coalesce: while one is unread (the CQ head has not
	 * passed pev_end), a newer one waits in pev and replaces any other
	 * waiting; it is posted once the engine has read the first */
	bool pev_unread, pev_waiting;
	uint32_t pev_end;
	struct skv_cqe pev;
	uint64_t events_coalesced;
	uint8_t *scratch; /* private copy of one argument slot */
};

/*
 * A ring of `want_sq` SQ entries rounded up to a power of two (0, or more
 * than SKV_RING_MAX_ENTRIES: default_sq), twice as many CQ entries, and
 * argument slots of slot_bytes, in a sealed memfd, with its eventfds.
 * 0 or -errno; *ret untouched on failure.
 */
int snapkvd_ring_new(uint32_t want_sq, uint32_t default_sq, uint32_t slot_bytes,
		     struct snapkvd_ring **ret);
void snapkvd_ring_free(struct snapkvd_ring *r);
/* The engine has its own fd now: ours closes (the mapping stays). */
void snapkvd_ring_memfd_sent(struct snapkvd_ring *r);

/*
 * Take the next SQE, only when a CQ slot is left for its completion
 * (back-pressure: an engine that stops reading completions stops being
 * served, nothing is dropped). 1 taken (it counts as in flight until
 * snapkvd_ring_complete), 0 none or no room, -EBADMSG.
 */
int snapkvd_ring_next(struct snapkvd_ring *r, struct skv_sqe *ret_sqe);
/*
 * The argument slot of an SQE, copied first (the engine may rewrite the
 * slot while we parse): 0 with *ret_buf valid until the next call, -EINVAL
 * a slot or length out of range, -ENOMEM.
 */
int snapkvd_ring_arg(struct snapkvd_ring *r, const struct skv_sqe *sqe, const uint8_t **ret_buf);
/* Where a reply of an SQE's slot is packed (snapkvd_ring_slot_size bytes). */
uint8_t *snapkvd_ring_slot(struct snapkvd_ring *r, uint32_t slot);
size_t snapkvd_ring_slot_size(const struct snapkvd_ring *r);
/* The completion of an SQE taken by snapkvd_ring_next. 0 or -EBADMSG. */
int snapkvd_ring_complete(struct snapkvd_ring *r, const struct skv_cqe *cqe);
/* An SQE taken by snapkvd_ring_next that has no completion (SKV_OP_CANCEL):
 * its CQ slot is free again. */
void snapkvd_ring_no_completion(struct snapkvd_ring *r);

/*
 * A PRESSURE event: 1 posted or waiting behind an unread one, -EAGAIN no
 * room beside the in-flight requests' completions, -EBADMSG.
 */
int snapkvd_ring_post_pressure(struct snapkvd_ring *r, int level, uint32_t suggested,
			       uint32_t scale_permille, uint64_t used);
/* A waiting event posted once the engine read the last; the engine woken
 * when it sleeps on its CQ and CQEs were posted (W2 in skv-ring.h). */
void snapkvd_ring_flush(struct snapkvd_ring *r);
/*
 * The loop is about to sleep: NEED_WAKEUP on the SQ (W1 in skv-ring.h).
 * 1 when work it may take arrived meanwhile (the flag is cleared again),
 * 0, or -EBADMSG.
 */
int snapkvd_ring_prepare_sleep(struct snapkvd_ring *r);
/* The loop is awake again: clear NEED_WAKEUP. */
void snapkvd_ring_wake(struct snapkvd_ring *r);

#endif
