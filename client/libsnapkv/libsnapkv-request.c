// SPDX-License-Identifier: MIT
/*
 * libsnapkv-request.c - a submitted compaction until its cache: poll, wait
 * (adopting the CacheInfo), abandon (its cache released when it finishes),
 * cancel (returning once nothing of it can be written any more).
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <stdlib.h>

#include "proto/skv-io.h"

/*
 * The request's slot, or NULL when the session it was submitted on is gone
 * (skv_client_reconnect after a timeout or the daemon's death): it can never
 * complete, and its slot index may belong to a request of the new session
 * (user_data, unique across sessions, tells them apart) or to no ring at all.
 * Locked.
 */
static struct slot *request_slot(struct skv_client *c, const struct skv_request *rq)
{
	if (!c->slots || rq->slot >= c->n_slots || c->slots[rq->slot].user_data != rq->user_data)
		return NULL;
	return &c->slots[rq->slot];
}

/* The cache a COMPACT's reply describes, adopted into *ret (writeback: the
 * request's destination handed over). Locked. */
static int take_cache(struct skv_client *c, struct skv_request *rq,
		      const Snapkv__V1__Response *resp, struct skv_cache **ret)
{
	struct skv_cache *k;
	int r;

	if (resp->result_case != SNAPKV__V1__RESPONSE__RESULT_CACHE)
		return skv__fail(c, -EPROTO, "unexpected reply to COMPACT");
	k = calloc(1, sizeof(*k));
	if (!k)
		return skv__fail(c, -ENOMEM, "out of memory");
	*ret = k; /* freed by the caller on failure */
	r = skv__cache_from_info(c, resp->cache, k);
	if (r == 0 && k->info.out_dest == SKV_OUT_WRITEBACK) {
		if (!rq->wb || rq->wb->layers != k->info.layers)
			return skv__fail(c, -EPROTO,
					 "a writeback cache for a request that asked none");
		k->wb = rq->wb;
		rq->wb = NULL;
	}
	return r;
}

SKV_EXPORT int skv_request_poll(struct skv_request *rq)
{
	struct skv_client *c;
	int r;

	if (!rq)
		return -EINVAL;
	c = rq->c;
	if (rq->sync)
		return rq->sync_res < 0 ? rq->sync_res : 1;
	pthread_mutex_lock(&c->mu);
	if (!request_slot(c, rq)) {
		r = skv__fail(c, c->dead ? c->dead : -ENOTCONN, "the request's session is gone");
	} else {
		r = skv__reap(c);
		if (r >= 0)
			r = c->slots[rq->slot].state == SLOT_DONE ? 1 : (c->dead ? c->dead : 0);
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

SKV_EXPORT int skv_request_wait(struct skv_request *rq, int timeout_ms,
				struct skv_cache **ret_cache)
{
	struct skv_client *c;
	Snapkv__V1__Response *resp = NULL;
	struct skv_cache *k = NULL;
	int r;

	if (!rq)
		return -EINVAL;
	c = rq->c;
	pthread_mutex_lock(&c->mu);
	if (rq->sync) {
		resp = rq->sync_resp;
		r = rq->sync_res;
		if (r < 0)
			skv__result_fail(c, r, resp);
		goto result;
	}
	if (!request_slot(c, rq)) {
		r = skv__fail(c, c->dead ? c->dead : -ENOTCONN, "the request's session is gone");
		goto out;
	}
	r = skv__wait_slot(c, rq->slot,
			   timeout_ms < 0 ? 0 : skv_io_now_ns() + (uint64_t)timeout_ms * 1000000u);
	if (r == -ETIMEDOUT) {
		pthread_mutex_unlock(&c->mu);
		return r;
	}
	if (r < 0) {
		skv__slot_give_up(c, rq->slot);
		goto out;
	}
	r = skv__collect(c, rq->slot, &resp);
result:
	/* the daemon's -ETIMEDOUT (a prefill wait not signalled in time, a
	 * decision group not complete in time) is
	 * -ETIME here: -ETIMEDOUT from this call means "not freed, wait again" */
	if (r == -ETIMEDOUT)
		r = -ETIME;
	if (r == 0)
		r = take_cache(c, rq, resp, &k);
out:
	if (resp)
		snapkv__v1__response__free_unpacked(resp, NULL);
	pthread_mutex_unlock(&c->mu);
	skv__request_free(rq);
	if (r < 0) {
		skv__cache_free(k);
		return r;
	}
	if (ret_cache)
		*ret_cache = k;
	else
		skv_cache_release(k);
	return 0;
}

SKV_EXPORT void skv_request_abandon(struct skv_request *rq)
{
	Snapkv__V1__Response *resp = NULL;
	struct skv_cache *k = NULL;
	struct skv_client *c;
	struct slot *s;

	if (!rq)
		return;
	c = rq->c;
	pthread_mutex_lock(&c->mu);
	if (rq->sync) {
		if (rq->sync_res == 0)
			resp = rq->sync_resp;
		else if (rq->sync_resp)
			snapkv__v1__response__free_unpacked(rq->sync_resp, NULL);
	} else if ((s = request_slot(c, rq))) {
		(void)skv__reap(c);
		if (s->state == SLOT_DONE) {
			if (skv__collect(c, rq->slot, &resp) < 0)
				resp = NULL;
		} else {
			/* skv__reap() releases its cache when it completes */
			s->orphan = true;
			s->release = true;
		}
	}
	/* finished already: give its cache back now rather than at session end */
	if (resp && resp->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE) {
		k = calloc(1, sizeof(*k));
		if (k && skv__cache_from_info(c, resp->cache, k) < 0) {
			skv__cache_free(k);
			k = NULL;
		}
	}
	if (resp)
		snapkv__v1__response__free_unpacked(resp, NULL);
	pthread_mutex_unlock(&c->mu);
	skv__request_free(rq);
	if (k)
		(void)skv_cache_release(k);
}

/*
 * Cancel the request in slot i: SKV_OP_CANCEL unless it completed, then its
 * completion, by dl (0: none). A daemon without SKV_RING_F_CANCEL is only
 * waited for: its completion is as good a fence. Locked.
 */
static int cancel_slot(struct skv_client *c, struct skv_request *rq, uint64_t dl)
{
	int r = skv__reap(c);

	if (r < 0)
		return r;
	if (c->slots[rq->slot].state != SLOT_DONE && !rq->cancel_sent &&
	    (c->layout.features & SKV_RING_F_CANCEL)) {
		r = skv__send_cancel(c, rq->user_data, dl);
		if (r < 0)
			return r;
		rq->cancel_sent = true;
	}
	return skv__wait_slot(c, rq->slot, dl);
}

/* What a finished request wrote, from its result r and CQE flags. */
static int cancel_outcome(int r, uint32_t flags, bool ring_flags)
{
	if (r == 0)
		return SKV_CANCEL_COMPLETED;
	/* a daemon that does not say: anything may have been written */
	if (!ring_flags || (flags & SKV_CQE_F_WRITTEN))
		return SKV_CANCEL_STOPPED;
	return SKV_CANCEL_UNWRITTEN;
}

SKV_EXPORT int skv_request_cancel(struct skv_request *rq, int timeout_ms,
				  struct skv_cache **ret_cache)
{
	Snapkv__V1__Response *resp = NULL;
	struct skv_cache *k = NULL;
	struct skv_client *c;
	uint64_t dl;
	int r, res;

	if (!rq)
		return -EINVAL;
	c = rq->c;
	dl = timeout_ms < 0 ? 0 : skv_io_now_ns() + (uint64_t)timeout_ms * 1000000u;
	pthread_mutex_lock(&c->mu);
	if (rq->sync) { /* went over the socket: complete when submitted */
		resp = rq->sync_resp;
		res = cancel_outcome(rq->sync_res, 0, false);
		r = rq->sync_res;
	} else if (!request_slot(c, rq)) {
		/* the session is gone, and with it every write of it */
		r = skv__fail(c, c->dead ? c->dead : -ENOTCONN, "the request's session is gone");
		goto out;
	} else {
		r = cancel_slot(c, rq, dl);
		/* the session ended: its jobs are done once snapkvd hangs up */
		if (r == -ETIMEDOUT || (r < 0 && c->dead && skv__wait_hangup(c, dl) < 0)) {
			pthread_mutex_unlock(&c->mu);
			return -ETIMEDOUT;
		}
		if (r < 0) {
			skv__slot_give_up(c, rq->slot);
			goto out;
		}
		res = cancel_outcome(c->slots[rq->slot].res, c->slots[rq->slot].flags,
				     c->layout.features & SKV_RING_F_CANCEL);
		r = skv__collect(c, rq->slot, &resp);
	}
	if (r == 0)
		r = take_cache(c, rq, resp, &k);
	/* the request's own failure is its outcome here, not the cancel's */
	r = r < 0 && res != SKV_CANCEL_COMPLETED ? res : r < 0 ? r : res;
out:
	if (resp)
		snapkv__v1__response__free_unpacked(resp, NULL);
	pthread_mutex_unlock(&c->mu);
	skv__request_free(rq);
	if (r != SKV_CANCEL_COMPLETED) {
		skv__cache_free(k);
		return r;
	}
	if (ret_cache)
		*ret_cache = k;
	else
		skv_cache_release(k);
	return r;
}

SKV_EXPORT int skv_client_compact(struct skv_client *c, const struct skv_compact_desc *d,
				  struct skv_cache **ret_cache)
{
	struct skv_request *rq;
	int r = skv_compact_submit(c, d, &rq);

	if (r < 0)
		return r;
	return skv_request_wait(rq, -1, ret_cache);
}
