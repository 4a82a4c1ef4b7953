// SPDX-License-Identifier: MIT
/* snapkvd-ring.c - the daemon's end of a session's ring; see snapkvd-ring.h. */
#include "snapkvd-ring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "snapkvd-cleanup.h"

void snapkvd_ring_free(struct snapkvd_ring *r)
{
	if (!r)
		return;
	if (r->map)
		munmap(r->map, r->bytes);
	if (r->sq_efd >= 0)
		close(r->sq_efd);
	if (r->cq_efd >= 0)
		close(r->cq_efd);
	if (r->fd >= 0)
		close(r->fd);
	free(r->scratch);
	free(r);
}

static void ring_freep(struct snapkvd_ring **r)
{
	snapkvd_ring_free(*r);
}

/* The sealed memfd, mapped, with the layout header written. */
static int ring_map(struct snapkvd_ring *r)
{
	r->bytes = r->layout.total_size;
	r->fd = memfd_create("snapkvd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (r->fd < 0)
		return -errno;
	if (ftruncate(r->fd, (off_t)r->bytes) < 0 ||
	    fcntl(r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return -errno;
	r->map = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	if (r->map == MAP_FAILED) {
		r->map = NULL;
		return -errno;
	}
	memcpy(r->map, &r->layout, sizeof(r->layout));
	skv_ring_q_init(&r->sq, r->map, r->layout.sq_off, r->layout.sq_entries,
			sizeof(struct skv_sqe));
	skv_ring_q_init(&r->cq, r->map, r->layout.cq_off, r->layout.cq_entries,
			sizeof(struct skv_cqe));
	return 0;
}

int snapkvd_ring_new(uint32_t want_sq, uint32_t default_sq, uint32_t slot_bytes,
		     struct snapkvd_ring **ret)
{
	_cleanup_(ring_freep) struct snapkvd_ring *r = calloc(1, sizeof(*r));
	uint32_t sq = default_sq;
	int e;

	if (!r)
		return -ENOMEM;
	r->fd = r->sq_efd = r->cq_efd = -1;
	if (want_sq && want_sq <= SKV_RING_MAX_ENTRIES) {
		sq = 2;
		while (sq < want_sq)
			sq <<= 1;
	}
	e = skv_ring_layout_init(&r->layout, sq, sq * 2, slot_bytes);
	if (e < 0)
		return e;
	e = ring_map(r);
	if (e < 0)
		return e;
	r->sq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	r->cq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (r->sq_efd < 0 || r->cq_efd < 0)
		return -errno;
	*ret = TAKE_PTR(r);
	return 0;
}

void snapkvd_ring_memfd_sent(struct snapkvd_ring *r)
{
	if (r->fd >= 0) {
		close(r->fd);
		r->fd = -1;
	}
}

int snapkvd_ring_next(struct snapkvd_ring *r, struct skv_sqe *ret_sqe)
{
	int space = skv_ring_space(&r->cq), e;

	if (space < 0)
		return -EBADMSG;
	/* every SQE taken must find a CQ slot later; the loop never blocks */
	if ((unsigned)space <= r->inflight)
		return 0;
	e = skv_ring_consume(&r->sq, ret_sqe);
	if (e == -EAGAIN)
		return 0;
	if (e < 0)
		return -EBADMSG;
	r->inflight++;
	return 1;
}

uint8_t *snapkvd_ring_slot(struct snapkvd_ring *r, uint32_t slot)
{
	return r->map + r->layout.arg_off + (size_t)slot * r->layout.arg_slot_size;
}

size_t snapkvd_ring_slot_size(const struct snapkvd_ring *r)
{
	return r->layout.arg_slot_size;
}

int snapkvd_ring_arg(struct snapkvd_ring *r, const struct skv_sqe *sqe, const uint8_t **ret_buf)
{
	if (sqe->slot >= r->layout.arg_slots || sqe->len > r->layout.arg_slot_size)
		return -EINVAL;
	if (!r->scratch && !(r->scratch = malloc(r->layout.arg_slot_size)))
		return -ENOMEM;
	memcpy(r->scratch, snapkvd_ring_slot(r, sqe->slot), sqe->len);
	*ret_buf = r->scratch;
	return 0;
}

int snapkvd_ring_complete(struct snapkvd_ring *r, const struct skv_cqe *cqe)
{
	r->inflight--;
	/* cannot fail with honest accounting: the head is corrupt */
	if (skv_ring_produce(&r->cq, cqe) < 0)
		return -EBADMSG;
	r->cq_dirty = true;
	return 0;
}

void snapkvd_ring_no_completion(struct snapkvd_ring *r)
{
	r->inflight--;
}

/* Post one event CQE now: 1, -EAGAIN (no room beside the in-flight
 * requests' completions) or -EBADMSG. */
static int post_event(struct snapkvd_ring *r, const struct skv_cqe *cqe)
{
	int space = skv_ring_space(&r->cq);

	if (space < 0)
		return -EBADMSG;
	/* Every in-flight request keeps its completion slot: an engine that
	 * does not read its CQ misses events, never completions. */
	if ((unsigned)space <= r->inflight)
		return -EAGAIN;
	if (skv_ring_produce(&r->cq, cqe) < 0)
		return -EBADMSG;
	r->cq_dirty = true;
	r->pev_unread = true;
	r->pev_end = r->cq.local;
	return 1;
}

/* Whether the engine has read the last PRESSURE event we posted. */
static bool pev_read(const struct snapkvd_ring *r)
{
	uint32_t head = atomic_load_explicit(&r->cq.ctl->head, memory_order_acquire);

	return !r->pev_unread || (int32_t)(head - r->pev_end) >= 0;
}

int snapkvd_ring_post_pressure(struct snapkvd_ring *r, int level, uint32_t suggested,
			       uint32_t scale_permille, uint64_t used)
{
	const struct skv_cqe cqe = {
	    .user_data = SKV_EVENT_PRESSURE,
	    .res = (int32_t)level + 1,
	    .flags = SKV_CQE_F_EVENT,
	    .slot = suggested,
	    .len = scale_permille,
	    .reserved = used,
	};

	if (!pev_read(r)) {
		/* one unread event per ring: the newest waits for it */
		if (r->pev_waiting)
			r->events_coalesced++;
		r->pev = cqe;
		r->pev_waiting = true;
		return 1;
	}
	r->pev_waiting = false;
	return post_event(r, &cqe);
}

void snapkvd_ring_flush(struct snapkvd_ring *r)
{
	if (r->pev_waiting && pev_read(r) && post_event(r, &r->pev) != -EAGAIN)
		r->pev_waiting = false;
	if (!r->cq_dirty)
		return;
	r->cq_dirty = false;
	/* W2 on the CQ: the engine set NEED_WAKEUP before sleeping on cq_efd. */
	if (skv_ring_needs_wakeup(&r->cq))
		(void)!eventfd_write(r->cq_efd, 1);
}

int snapkvd_ring_prepare_sleep(struct snapkvd_ring *r)
{
	int ready, space;

	/* W1, extended: a ring whose CQ is full (the engine stopped reading
	 * completions) has SQEs we may not take yet; they must not keep us
	 * spinning. libsnapkv rings the doorbell after reaping CQEs when it
	 * sees the flag and an SQ we have not drained. */
	atomic_fetch_or_explicit(&r->sq.ctl->flags, SKV_RING_NEED_WAKEUP, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	ready = skv_ring_ready(&r->sq);
	space = skv_ring_space(&r->cq);
	if (ready < 0 || space < 0)
		return -EBADMSG;
	if (ready > 0 && (unsigned)space > r->inflight) {
		skv_ring_clear_wakeup(&r->sq);
		return 1;
	}
	return 0;
}

void snapkvd_ring_wake(struct snapkvd_ring *r)
{
	skv_ring_clear_wakeup(&r->sq);
}
