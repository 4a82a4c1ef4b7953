// SPDX-License-Identifier: MIT
/*
 * libsnapkv-ring.c - the session's shared-memory rings: a slot per request
 * from submit until its result is collected, reaping CQEs (and pressure
 * events), waiting by spinning then sleeping on the CQ eventfd, and the
 * small requests that go over the ring (NOP, STATS, pressure).
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/skv-frame.h"
#include "proto/skv-io.h"

/*
 * Release cache `id` of an abandoned compaction through its own slot i, just
 * freed, so that there is always a slot and room in the SQ (its SQE was
 * consumed before it completed). Nobody waits: the slot is an orphan, freed
 * by the RELEASE's completion. Should the SQ refuse it, the cache stays
 * counted until the session ends, as before. Locked.
 */
static void release_orphan(struct skv_client *c, uint32_t i, uint64_t id)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__ReleaseRequest rl = SNAPKV__V1__RELEASE_REQUEST__INIT;
	struct skv_sqe sqe = {.opcode = SKV_OP_REQUEST, .slot = i};
	size_t n;

	rl.cache_id = id;
	req.op_case = SNAPKV__V1__REQUEST__OP_RELEASE;
	req.release = &rl;
	sqe.user_data = (uint64_t)i | (++c->seq << 32);
	req.user_data = sqe.user_data;
	n = snapkv__v1__request__get_packed_size(&req);
	if (n > c->layout.arg_slot_size)
		return;
	snapkv__v1__request__pack(&req, c->ring + c->layout.arg_off +
					    (size_t)i * c->layout.arg_slot_size);
	sqe.len = (uint32_t)n;
	c->slots[i] = (struct slot){.state = SLOT_PENDING,
				    .user_data = sqe.user_data,
				    .orphan = true,
				    .owner = pthread_self()};
	if (skv_ring_produce(&c->sq, &sqe) < 0) {
		c->slots[i] = (struct slot){0};
		return;
	}
	/* W2 on the SQ, as in skv__submit() */
	if (skv_ring_needs_wakeup(&c->sq))
		(void)!eventfd_write(c->sq_efd, 1);
}

/* Orphan slot i completed: free it, and give back the cache of an abandoned
 * compaction that succeeded. Locked. */
static void orphan_done(struct skv_client *c, uint32_t i)
{
	struct slot *s = &c->slots[i];
	bool rel = s->release && s->res == 0 && s->resp &&
		   s->resp->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE && s->resp->cache;
	uint64_t id = rel ? s->resp->cache->cache_id : 0;

	if (s->resp)
		snapkv__v1__response__free_unpacked(s->resp, NULL);
	*s = (struct slot){0};
	if (rel)
		release_orphan(c, i, id);
}

/* Take every CQE; mark slots done. Locked. */
int skv__reap(struct skv_client *c)
{
	struct skv_cqe cqe;
	int r, n = 0;

	while ((r = skv_ring_consume(&c->cq, &cqe)) == 0) {
		uint32_t i = (uint32_t)(cqe.user_data & 0xffffffffu);
		struct slot *s;

		n++;
		if (cqe.flags & SKV_CQE_F_EVENT) {
			/* not a completion: remember the latest pressure event */
			if (cqe.user_data == SKV_EVENT_PRESSURE) {
				c->pressure.level = (uint32_t)cqe.res;
				c->pressure.suggested_capacity = cqe.slot;
				c->pressure.scale_permille = cqe.len;
				c->pressure.pool_used = cqe.reserved;
				c->pressure.events++;
			}
			continue;
		}
		if (i >= c->n_slots)
			continue;
		s = &c->slots[i];
		if (s->state != SLOT_PENDING || s->user_data != cqe.user_data)
			continue;
		s->res = cqe.res;
		s->flags = cqe.flags;
		if (cqe.len && cqe.len <= c->layout.arg_slot_size)
			s->resp = snapkv__v1__response__unpack(
			    NULL, cqe.len,
			    c->ring + c->layout.arg_off + (size_t)i * c->layout.arg_slot_size);
		s->state = SLOT_DONE;
		if (s->orphan)
			orphan_done(c, i);
	}
	if (r == -EBADMSG) {
		skv__mark_dead(c, -EPROTO);
		return skv__fail(c, -EPROTO, "completion ring corrupt");
	}
	/* CQ room again: a daemon that slept on our full CQ needs the doorbell
	 * if entries still wait in the SQ (W2, paired with the loop's W1). */
	if (n && skv_ring_needs_wakeup(&c->sq) &&
	    atomic_load_explicit(&c->sq.ctl->head, memory_order_acquire) != c->sq.local)
		(void)!eventfd_write(c->sq_efd, 1);
	return n;
}

/* Check the socket for a hang-up or an error notice while we wait. Locked. */
static int check_socket(struct skv_client *c, short revents)
{
	if (revents & (POLLHUP | POLLERR)) {
		skv__mark_dead(c, -ECONNRESET);
		return skv__fail(c, -ECONNRESET, "snapkvd closed the connection");
	}
	if (revents & POLLIN) {
		struct skv_frame_hdr h;
		unsigned nf = 0;
		int r = skv_frame_recv(c->fd, c->rbuf, SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD,
				       &h, NULL, &nf, MSG_DONTWAIT);

		if (r == -EAGAIN)
			return 0;
		if (r < 0 || h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR) {
			skv__mark_dead(c, r < 0 ? r : -ECONNRESET);
			return skv__fail(c, c->dead, "snapkvd closed the session");
		}
	}
	return 0;
}

/* Slot i is done; ALL_SLOTS: no slot is pending any more. */
#define ALL_SLOTS UINT32_MAX

static bool wait_over(const struct skv_client *c, uint32_t i)
{
	if (i != ALL_SLOTS)
		return c->slots[i].state == SLOT_DONE;
	for (uint32_t k = 0; k < c->n_slots; k++)
		if (c->slots[k].state == SLOT_PENDING)
			return false;
	return true;
}

/* Wait until slot i is done (ALL_SLOTS: none pending) or deadline dl (0:
 * none) passes (-ETIMEDOUT, the slot still pending). Called locked; may
 * drop the lock to sleep. */
static int wait_loop(struct skv_client *c, uint32_t i, uint64_t dl)
{
	uint64_t spin_end = skv_io_now_ns() + (uint64_t)c->spin_us * 1000;

	for (;;) {
		int r = skv__reap(c);

		if (r < 0)
			return r;
		if (wait_over(c, i))
			return 0;
		if (c->dead)
			return skv__fail(c, c->dead, "snapkvd connection lost");
		/* one clock read per turn: this loop spins on the hot path */
		uint64_t now = skv_io_now_ns();

		if (dl && now >= dl)
			return skv__fail(c, -ETIMEDOUT,
					 "snapkvd did not complete the request in time");
		if (now < spin_end)
			continue;
		/* W1 on the CQ: the daemon writes cq_efd only if it sees the flag */
		r = skv_ring_prepare_sleep(&c->cq);
		if (r < 0) {
			skv__mark_dead(c, -EPROTO);
			return skv__fail(c, -EPROTO, "completion ring corrupt");
		}
		if (r == 0)
			continue;
		struct pollfd p[2] = {{c->cq_efd, POLLIN, 0}, {c->fd, POLLIN, 0}};
		int to = skv_io_poll_ms(dl);

		if (to < 0 || to > 1000)
			to = 1000;
		pthread_mutex_unlock(&c->mu);
		r = poll(p, 2, to);
		pthread_mutex_lock(&c->mu);
		skv_ring_clear_wakeup(&c->cq);
		if (r > 0 && (p[0].revents & POLLIN)) {
			uint64_t v;

			(void)!read(c->cq_efd, &v, sizeof(v));
		}
		if (r > 0 && p[1].revents) {
			r = check_socket(c, p[1].revents);
			if (r < 0) {
				skv__reap(c); /* anything posted before the close still counts */
				if (wait_over(c, i))
					return 0;
				return r;
			}
		}
		spin_end = skv_io_now_ns() + (uint64_t)c->spin_us * 1000;
	}
}

int skv__wait_slot(struct skv_client *c, uint32_t i, uint64_t dl)
{
	int r;

	c->waiters++;
	r = wait_loop(c, i, dl);
	c->waiters--;
	return r;
}

/* Nothing moved: give the daemon a moment, and notice if it is gone. Locked;
 * drops the lock while waiting. */
static int stall(struct skv_client *c)
{
	struct pollfd p = {c->fd, POLLIN, 0};
	int r;

	pthread_mutex_unlock(&c->mu);
	r = poll(&p, 1, 1);
	pthread_mutex_lock(&c->mu);
	if (c->dead)
		return skv__fail(c, c->dead, "not connected to snapkvd");
	if (r > 0)
		return check_socket(c, p.revents);
	return 0;
}

/* The ring had no room for us until deadline dl: the daemon stopped taking
 * requests. Nothing was submitted; the ring itself is fine. */
static int ring_full_timeout(struct skv_client *c, uint64_t dl)
{
	if (!dl || skv_io_now_ns() < dl)
		return 0;
	return skv__fail(c, -ETIMEDOUT, "snapkvd took no request within %u ms (ring full)",
			 skv__timeout_of(c));
}

int skv__send_cancel(struct skv_client *c, uint64_t ud, uint64_t dl)
{
	/* no slot and no completion of its own: the target's answers it */
	struct skv_sqe sqe = {.opcode = SKV_OP_CANCEL, .user_data = ud};
	int r;

	if (c->dead)
		return skv__fail(c, c->dead, "not connected to snapkvd");
	while ((r = skv_ring_produce(&c->sq, &sqe)) == -EAGAIN)
		if ((r = skv__reap(c)) < 0 || (r = ring_full_timeout(c, dl)) < 0 ||
		    (r = stall(c)) < 0)
			return r;
	if (r < 0)
		return skv__fail(c, r == -EBADMSG ? -EPROTO : r, "submission ring unusable");
	/* W2 on the SQ, as in skv__submit() */
	if (skv_ring_needs_wakeup(&c->sq))
		(void)!eventfd_write(c->sq_efd, 1);
	return 0;
}

int skv__wait_hangup(struct skv_client *c, uint64_t dl)
{
	/* a session dead on our side only (a corrupt ring, a timeout) ends in
	 * the daemon too: it sees the end of our stream */
	if (c->fd >= 0)
		shutdown(c->fd, SHUT_WR);
	while (c->fd >= 0) {
		struct pollfd p = {c->fd, POLLIN, 0};
		int to = skv_io_poll_ms(dl), r;

		if (to < 0 || to > 1000)
			to = 1000;
		pthread_mutex_unlock(&c->mu);
		r = poll(&p, 1, to);
		pthread_mutex_lock(&c->mu);
		if (c->fd < 0 || (r > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))))
			return 0;
		if (r > 0 && (p.revents & POLLIN)) { /* a notice after the error: read on */
			char b[256];

			if (recv(c->fd, b, sizeof(b), MSG_DONTWAIT) == 0)
				return 0;
		}
		if (dl && skv_io_now_ns() >= dl)
			return skv__fail(c, -ETIMEDOUT,
					 "snapkvd did not finish the session's work in time");
	}
	return 0;
}

int skv__fence(struct skv_client *c, uint64_t dl)
{
	int r;

	if (!c->ring)
		return 0;
	if (c->dead)
		return skv__wait_hangup(c, dl);
	r = skv__reap(c);
	for (uint32_t i = 0; r >= 0 && i < c->n_slots; i++)
		if (c->slots[i].state == SLOT_PENDING && (c->layout.features & SKV_RING_F_CANCEL))
			r = skv__send_cancel(c, c->slots[i].user_data, dl);
	if (r < 0)
		return r;
	c->waiters++;
	r = wait_loop(c, ALL_SLOTS, dl);
	c->waiters--;
	return r;
}

/*
 * No slot is free, and only this thread could free one: every slot holds a
 * request it submitted and has neither waited for nor abandoned, and no
 * other thread is waiting on this client (a thread may wait on requests
 * another submitted). Waiting for room would only run into the deadline.
 * Locked.
 */
static bool only_own_slots(const struct skv_client *c)
{
	pthread_t self = pthread_self();

	if (c->waiters)
		return false;
	for (uint32_t i = 0; i < c->n_slots; i++) {
		const struct slot *s = &c->slots[i];

		if (s->state == SLOT_FREE || s->orphan || !pthread_equal(s->owner, self))
			return false;
	}
	return true;
}

/* Take a slot and submit, waiting for room at most until dl (0: none).
 * Locked. For SKV_OP_REQUEST the Request is packed into the slot. */
int skv__submit(struct skv_client *c, uint8_t op, Snapkv__V1__Request *req, uint64_t dl,
		uint32_t *ret_slot)
{
	struct skv_sqe sqe = {.opcode = op};
	uint32_t i;
	int r;

	if (c->dead)
		return skv__fail(c, c->dead, "not connected to snapkvd");
	for (;;) {
		for (i = 0; i < c->n_slots; i++)
			if (c->slots[i].state == SLOT_FREE)
				break;
		if (i < c->n_slots)
			break;
		r = skv__reap(c);
		if (r < 0)
			return r;
		if (r == 0 && only_own_slots(c))
			return skv__fail(c, -EDEADLK,
					 "all %u ring slots hold requests this thread submitted "
					 "and has not reaped: skv_request_wait() or "
					 "skv_request_abandon() one before submitting more (the "
					 "ring's size is sq_entries in skv_client_opts or "
					 "snapkvd's config)",
					 c->n_slots);
		if (r == 0 && ((r = ring_full_timeout(c, dl)) < 0 || (r = stall(c)) < 0))
			return r;
	}
	sqe.slot = i;
	sqe.user_data = (uint64_t)i | (++c->seq << 32);
	if (req) {
		size_t n = snapkv__v1__request__get_packed_size(req);

		if (n > c->layout.arg_slot_size)
			return skv__fail(
			    c, -EMSGSIZE,
			    "request of %zu bytes exceeds the %u-byte ring slot (raise "
			    "slot_bytes in snapkvd's config)",
			    n, c->layout.arg_slot_size);
		req->user_data = sqe.user_data;
		snapkv__v1__request__pack(req, c->ring + c->layout.arg_off +
						   (size_t)i * c->layout.arg_slot_size);
		sqe.len = (uint32_t)n;
	}
	c->slots[i] = (struct slot){
	    .state = SLOT_PENDING, .user_data = sqe.user_data, .owner = pthread_self()};
	while ((r = skv_ring_produce(&c->sq, &sqe)) == -EAGAIN) {
		/* the daemon is behind (or back-pressuring us): make room */
		if ((r = skv__reap(c)) < 0 || (r = ring_full_timeout(c, dl)) < 0 ||
		    (r = stall(c)) < 0)
			break;
	}
	if (r < 0) {
		c->slots[i] = (struct slot){0};
		return skv__fail(c, r == -EBADMSG ? -EPROTO : r, "submission ring unusable");
	}
	/* W2 on the SQ: ring the doorbell only when the daemon sleeps (a
	 * batch rings it once, after its last entry) */
	if (c->defer_doorbell)
		c->doorbell_owed = true;
	else if (skv_ring_needs_wakeup(&c->sq))
		(void)!eventfd_write(c->sq_efd, 1);
	*ret_slot = i;
	return 0;
}

/* A failed result r as the client's error: the daemon's message if it sent
 * one, else strerror. Returns r. */
int skv__result_fail(struct skv_client *c, int r, const Snapkv__V1__Response *resp)
{
	return skv__fail(c, r, "%s",
			 resp && resp->error && resp->error[0] ? resp->error : strerror(-r));
}

/* Take a finished slot's result; frees the slot. */
int skv__collect(struct skv_client *c, uint32_t i, Snapkv__V1__Response **ret_resp)
{
	struct slot *s = &c->slots[i];
	int r = s->res;

	if (r < 0)
		skv__result_fail(c, r, s->resp);
	if (ret_resp && r == 0)
		*ret_resp = s->resp;
	else if (s->resp)
		snapkv__v1__response__free_unpacked(s->resp, NULL);
	*s = (struct slot){0};
	return r;
}

/* A wait on slot i failed (not by timeout): a late completion is dropped by
 * skv__reap(), and one that already came is freed now. */
void skv__slot_give_up(struct skv_client *c, uint32_t i)
{
	c->slots[i].orphan = true;
	if (c->slots[i].state == SLOT_DONE)
		skv__collect(c, i, NULL);
}

/* The ring did not complete a request by its deadline. The slot is left to
 * complete later (and be freed then); the ring stays usable. */
static int ring_timeout(struct skv_client *c, uint32_t i)
{
	c->slots[i].orphan = true;
	return skv__fail(c, -ETIMEDOUT, "snapkvd did not complete the request within %u ms",
			 skv__timeout_of(c));
}

/* Submit and wait, both by the client's deadline. Locked. */
int skv__call(struct skv_client *c, Snapkv__V1__Request *req, Snapkv__V1__Response **ret)
{
	uint64_t dl = skv__call_deadline(c);
	uint32_t i;
	int r = skv__submit(c, SKV_OP_REQUEST, req, dl, &i);

	if (r < 0)
		return r;
	r = skv__wait_slot(c, i, dl);
	if (r == -ETIMEDOUT)
		return ring_timeout(c, i);
	if (r < 0) {
		skv__slot_give_up(c, i);
		return r;
	}
	return skv__collect(c, i, ret);
}

SKV_EXPORT int skv_client_nop(struct skv_client *c)
{
	uint64_t dl;
	uint32_t i;
	int r;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	dl = skv__call_deadline(c);
	r = skv__submit(c, SKV_OP_NOP, NULL, dl, &i);
	if (r == 0) {
		r = skv__wait_slot(c, i, dl);
		if (r == 0)
			r = skv__collect(c, i, NULL);
		else if (r == -ETIMEDOUT)
			r = ring_timeout(c, i);
		else
			c->slots[i].orphan = true;
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

SKV_EXPORT int skv_client_nop_socket(struct skv_client *c)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__NopRequest nop = SNAPKV__V1__NOP_REQUEST__INIT;
	Snapkv__V1__Response *resp = NULL;
	int r;

	if (!c)
		return -EINVAL;
	req.op_case = SNAPKV__V1__REQUEST__OP_NOP;
	req.nop = &nop;
	pthread_mutex_lock(&c->mu);
	r = skv__rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, NULL, 0,
		     SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE, (ProtobufCMessage **)&resp, NULL,
		     NULL, skv__call_deadline(c));
	if (r == 0) {
		r = resp->status;
		snapkv__v1__response__free_unpacked(resp, NULL);
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

SKV_EXPORT int skv_client_stats(struct skv_client *c, struct skv_stats *ret_stats)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__StatsRequest st = SNAPKV__V1__STATS_REQUEST__INIT;
	Snapkv__V1__Response *resp = NULL;
	int r;

	if (!c || !ret_stats)
		return -EINVAL;
	req.op_case = SNAPKV__V1__REQUEST__OP_STATS;
	req.stats = &st;
	pthread_mutex_lock(&c->mu);
	r = skv__call(c, &req, &resp);
	pthread_mutex_unlock(&c->mu);
	if (r < 0)
		return r;
	if (resp->result_case != SNAPKV__V1__RESPONSE__RESULT_STATS) {
		snapkv__v1__response__free_unpacked(resp, NULL);
		return skv__fail(c, -EPROTO, "unexpected reply");
	}
	*ret_stats = (struct skv_stats){
	    .caches = resp->stats->caches,
	    .buffers = resp->stats->buffers,
	    .arena_used = resp->stats->arena_used,
	    .arena_bytes = resp->stats->arena_bytes,
	    .requests = resp->stats->requests,
	    .errors = resp->stats->errors,
	    .pool_total = resp->stats->pool_total,
	    .pool_used = resp->stats->pool_used,
	};
	snapkv__v1__response__free_unpacked(resp, NULL);
	return 0;
}

SKV_EXPORT int skv_client_pressure(struct skv_client *c, struct skv_pressure *ret)
{
	int r;

	if (!c || !ret)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	r = c->dead;
	if (!r && c->ring)
		r = skv__reap(c);
	if (r >= 0) {
		*ret = c->pressure;
		r = 0;
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}
