// SPDX-License-Identifier: MIT
/*
 * snapkvd-dispatch.c - a session's requests and completions; see
 * snapkvd-dispatch.h.
 */
#include "snapkvd-dispatch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/snapkv.pb-c.h"
#include "snapkvd-admission.h"
#include "snapkvd-arena.h"
#include "snapkvd-cache.h"
#include "snapkvd-cacheinfo.h"
#include "snapkvd-clock.h"
#include "snapkvd-compactor.h"
#include "snapkvd-config.h"
#include "snapkvd-device.h"
#include "snapkvd-group.h"
#include "snapkvd-job.h"
#include "snapkvd-log.h"
#include "snapkvd-paged.h"
#include "snapkvd-policy.h"
#include "snapkvd-pool.h"
#include "snapkvd-request.h"
#include "snapkvd-ring.h"
#include "snapkvd-server.h"
#include "snapkvd-session.h"
#include "snapkvd-tally.h"

static void complete(struct snapkvd_session *s, const struct snapkvd_origin *o, int status,
		     const char *err, Snapkv__V1__Response *resp);

static struct snapkvd_cache *find_cache(struct snapkvd_session *s, uint64_t id)
{
	for (struct snapkvd_cache *c = s->caches; c; c = c->next)
		if (c->id == id && !c->lingering) /* released: gone for the engine */
			return c;
	return NULL;
}

static void complete_cache(struct snapkvd_session *s, const struct snapkvd_origin *o,
			   const struct snapkvd_cache *c)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;

	snapkvd_cacheinfo_fill(c, &ci);
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_CACHE;
	resp.cache = &ci;
	complete(s, o, 0, NULL, &resp);
}

/*
 * Replies are sized before any state changes: a COMPACT or GROW whose
 * answer could not reach the engine (larger than the ring's argument slot,
 * or than a frame) is refused up front, so no cache is ever committed, or
 * old region freed, for a reply that then cannot be sent. 0 or -EMSGSIZE.
 */
static int reply_fits(struct snapkvd_session *s, const struct snapkvd_origin *o,
		      const struct snapkvd_cache *c, char *err, size_t errlen)
{
	size_t need = snapkvd_cacheinfo_reply_bound(c);
	size_t room =
	    o->ring ? (o->has_slot ? snapkvd_ring_slot_size(s->ring) : 0) : SKV_FRAME_MAX_PAYLOAD;

	if (o->ring && !o->has_slot)
		return 0; /* a ring request without a slot gets no reply body */
	if (need <= room)
		return 0;
	snprintf(
	    err, errlen,
	    "the reply (up to %zu bytes for %u layers x %u heads) exceeds the %s of %zu "
	    "bytes%s; nothing was done",
	    need, c->layers, c->h_store, o->ring ? "ring's argument slot" : "frame limit", room,
	    o->ring ? " (slot_bytes; send this request over the socket or raise slot_bytes)" : "");
	return -EMSGSIZE;
}

static void do_append(struct snapkvd_session *s, const struct snapkvd_origin *o,
		      const Snapkv__V1__AppendRequest *a)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	struct snapkvd_cache *c = find_cache(s, a->cache_id);
	char err[128];

	if (!c) {
		complete(s, o, -ENOENT, "no such cache", NULL);
		return;
	}
	if (c->busy) {
		complete(s, o, -EBUSY, "a GROW of this cache is in progress", NULL);
		return;
	}
	if (a->tokens > snapkvd_cache_decode_limit(c) - c->appended) {
		snprintf(err, sizeof(err), "%u tokens but %u decode slots left%s", a->tokens,
			 snapkvd_cache_decode_limit(c) - c->appended,
			 c->max_decode ? " (the cache's declared max_decode)" : ": GROW first");
		complete(s, o, -ENOSPC, err, NULL);
		return;
	}
	/* Logical positions continue at L + g, whatever slot they sit in; a
	 * writeback cache's slots past its position rows have none (its
	 * max_decode: slot kept + i is position L + i). */
	for (uint32_t l = 0; l < c->layers; l++) {
		int32_t *pos = (int32_t *)(s->arena->base + c->pos_off[l]);

		for (uint32_t h = 0; h < c->h_store; h++) {
			uint32_t first = snapkvd_cache_head_kept(c, l, h) + c->appended;
			uint64_t at = snapkvd_cache_pos_index(c, l, h, first);

			for (uint32_t i = 0; i < a->tokens; i++) {
				if (c->writeback && first + i >= c->slots)
					break;
				pos[at + i] = (int32_t)(c->prompt_len + c->appended + i);
			}
		}
	}
	c->appended += a->tokens;
	(void)snapkvd_tally_update(&s->srv->tally, s, s->tenant, c);
	c->last_use_ns = snapkvd_now_ns();
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_APPENDED;
	resp.appended = c->appended;
	complete(s, o, 0, NULL, &resp);
}

static struct snapkvd_request_env request_env(struct snapkvd_session *s)
{
	struct snapkvd_server *srv = s->srv;

	return (struct snapkvd_request_env){
	    .cfg = &srv->cfg,
	    .buffers = s->buffers.list,
	    .arena_bytes = s->arena ? s->arena->size : 0,
	    .has_garena = s->garena != NULL,
	    .garena_gpu = s->garena_gpu,
	    .device = srv->device,
	    .threads = snapkvd_compactor_threads(srv->compactor),
	    .ops = &srv->policy,
	    .groups = srv->groups,
	    .uid = s->uid,
	};
}

/* The GROW job of cache c: everything the copy needs, so the worker never
 * touches the cache object. 0 or -ENOMEM. */
static int grow_job(struct snapkvd_session *s, const struct snapkvd_origin *o,
		    struct snapkvd_cache *c, uint32_t slots, const struct snapkvd_cache_geom *geom,
		    uint8_t *kv_base, struct snapkvd_job **ret)
{
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_GROW, s, o);
	size_t nk = c->ragged ? (size_t)c->layers * c->h_store : 0;

	if (j) {
		j->g.old_k = malloc(c->layers * sizeof(uint64_t));
		j->g.old_v = malloc(c->layers * sizeof(uint64_t));
		/* a ragged cache's counts ride after the positions' offsets, so
		 * they are freed with them */
		j->g.old_pos = malloc(c->layers * sizeof(uint64_t) + nk * sizeof(uint32_t));
	}
	if (!j || !j->g.old_k || !j->g.old_v || !j->g.old_pos) {
		snapkvd_job_free(j);
		return -ENOMEM;
	}
	j->target = c;
	j->g.geom = *geom;
	j->g.gpu = c->gpu_kv;
	j->gpu = c->gpu; /* where its compaction ran: its arena's device */
	j->g.kv_base = kv_base;
	j->g.slots = slots;
	j->g.old_slots = c->slots;
	j->g.used = c->kept + c->appended;
	j->g.layers = c->layers;
	j->g.h_store = c->h_store;
	j->g.row = c->head_dim * c->dtype_bytes;
	j->g.hnd = c->layout == SNAPKVD_LAYOUT_HND;
	j->g.paged = c->layout == SNAPKVD_LAYOUT_PAGED;
	j->g.old_run = c->run_bytes;
	memcpy(j->g.old_k, c->k_off, c->layers * sizeof(uint64_t));
	memcpy(j->g.old_v, c->v_off, c->layers * sizeof(uint64_t));
	memcpy(j->g.old_pos, c->pos_off, c->layers * sizeof(uint64_t));
	if (nk) {
		uint32_t *hk = (uint32_t *)(j->g.old_pos + c->layers);

		memcpy(hk, c->hkept, nk * sizeof(uint32_t));
		j->g.hkept = hk;
		j->g.appended = c->appended;
		j->g.old_res = c->slots - c->kept;
		j->g.res = slots - c->kept;
	}
	*ret = j;
	return 0;
}

/* j goes to the workers; it is the session's until snapkvd_dispatch_job_done. */
static void submit_job(struct snapkvd_session *s, struct snapkvd_job *j)
{
	j->cancel = &s->cancelled;
	j->s_next = s->jobs;
	s->jobs = j;
	s->refs++;
	snapkvd_compactor_submit(s->srv->compactor, j);
}

static void do_grow(struct snapkvd_session *s, const struct snapkvd_origin *o,
		    const Snapkv__V1__GrowRequest *g)
{
	struct snapkvd_cache *c = find_cache(s, g->cache_id);
	struct snapkvd_request_env env = request_env(s);
	struct snapkvd_cache_geom geom;
	struct snapkvd_job *j;
	const char *why = NULL;
	char err[256];
	uint8_t *kv_base = NULL;
	int32_t *table = NULL;
	uint32_t slots;
	int r;

	if (!c) {
		complete(s, o, -ENOENT, "no such cache", NULL);
		return;
	}
	if (c->busy) {
		complete(s, o, -EBUSY, "a GROW of this cache is in progress", NULL);
		return;
	}
	r = snapkvd_request_grow(&env, c, g->extra, &slots, &geom, &why);
	if (r < 0) {
		complete(s, o, r, why, NULL);
		return;
	}
	r = reply_fits(s, o, c, err, sizeof(err));
	if (r == 0)
		r = snapkvd_paged_grow_blocks(&env, c, slots, g->out_block_table,
					      g->n_out_block_table, &table, err, sizeof(err));
	if (r < 0) {
		complete(s, o, r, err, NULL);
		return;
	}
	/* K/V in the GPU arena: the same offsets there, copied on the device */
	if (c->gpu_kv && !(kv_base = snapkvd_device_arena_base(s->srv->device, s->garena))) {
		complete(s, o, -EIO, "the session's GPU arena is gone", NULL);
		return;
	}
	if (grow_job(s, o, c, slots, &geom, kv_base, &j) < 0) {
		free(table);
		complete(s, o, -ENOMEM, "out of memory", NULL);
		return;
	}
	/* writeback: the grown table, the cache's at grow_done */
	j->out_table = table;
	j->n_out_table = table ? c->n_blocks + (uint32_t)g->n_out_block_table : 0;
	if (c->writeback && j->g.used > c->slots)
		j->g.used = c->slots; /* g past the position rows (max_decode) */
	r = snapkvd_admission_grow(s->srv, s, j, err, sizeof(err));
	if (r < 0) {
		snapkvd_job_free(j);
		complete(s, o, r, err, NULL);
		return;
	}
	/* The copy can be large (GBs): the worker does it, the loop moves on. */
	c->busy = true;
	submit_job(s, j);
}

/* A GROW copy finished: switch the cache to its new region. */
static void grow_done(struct snapkvd_job *j)
{
	struct snapkvd_session *s = j->s;
	struct snapkvd_pool *pool = s->srv->pool;
	struct snapkvd_cache *c = NULL;

	if (!s->closing)
		for (c = s->caches; c && c != j->target; c = c->next)
			;
	if (!c || j->status < 0) {
		/* the session went (and freed the cache) meanwhile, or the copy
		 * failed (GPU arena): the cache stays as it was */
		snapkvd_arena_release(s->arena, j->g.off, j->g.geom.region);
		snapkvd_pool_cancel(pool, &j->resv);
		if (c) {
			c->busy = false;
			complete(s, &j->origin, j->status, j->err, NULL);
		}
		return;
	}
	snapkvd_arena_release(s->arena, c->region_off, c->region_bytes);
	snapkvd_pool_give_back(pool, s->tenant, c->region_bytes);
	snapkvd_pool_commit(pool, &j->resv);
	snapkvd_cache_place(c, j->g.off, j->g.slots, &j->g.geom);
	if (c->writeback)
		snapkvd_paged_grow_done(c, j, s->arena->base, j->g.old_slots);
	c->busy = false;
	c->last_use_ns = snapkvd_now_ns();
	(void)snapkvd_tally_update(&s->srv->tally, s, s->tenant, c);
	complete_cache(s, &j->origin, c);
}

/* RELEASE's reported g (ReleaseRequest.appended): from the cache's g to
 * its decode limit; set before the cache lingers or goes. 0 or -EINVAL. */
static int release_appended(struct snapkvd_cache *c, const Snapkv__V1__ReleaseRequest *rl,
			    char *err, size_t errlen)
{
	if (!rl->appended_given)
		return 0;
	if (rl->appended < c->appended || rl->appended > snapkvd_cache_decode_limit(c)) {
		snprintf(err, errlen,
			 "appended %u: must be from the cache's g %u to its decode limit %u "
			 "(capacity - kept, or max_decode); nothing released",
			 rl->appended, c->appended, snapkvd_cache_decode_limit(c));
		return -EINVAL;
	}
	c->appended = rl->appended;
	return 0;
}

static void do_release(struct snapkvd_session *s, const struct snapkvd_origin *o,
		       const Snapkv__V1__ReleaseRequest *rl)
{
	struct snapkvd_cache **pp;
	uint64_t id = rl->cache_id;
	bool linger = rl->linger;
	char err[192];

	for (pp = &s->caches; *pp; pp = &(*pp)->next) {
		if ((*pp)->id != id || (*pp)->lingering)
			continue;
		struct snapkvd_cache *c = *pp;

		if (c->busy) {
			complete(s, o, -EBUSY, "a GROW of this cache is in progress", NULL);
			return;
		}
		if (release_appended(c, rl, err, sizeof(err)) < 0) {
			complete(s, o, -EINVAL, err, NULL);
			return;
		}
		if (linger || c->evictable) {
			/* Kept and counted until pressure evicts it (LRU) or the
			 * session ends; the engine's handle is gone either way. */
			c->lingering = true;
			c->last_use_ns = snapkvd_now_ns();
			s->n_caches--;
			(void)snapkvd_tally_update(&s->srv->tally, s, s->tenant, c);
			snapkvd_policy_mark_dirty(&s->srv->policy);
			complete(s, o, 0, NULL, NULL);
			return;
		}
		*pp = c->next;
		snapkvd_session_free_cache(s, c);
		complete(s, o, 0, NULL, NULL);
		return;
	}
	complete(s, o, -ENOENT, "no such cache", NULL);
}

/* The request with its registered pools and tables filled in
 * (snapkvd-kvpool.h), validated into *ret; the job holds the pools busy. */
static int compact_view(struct snapkvd_session *s, const struct snapkvd_origin *o,
			const Snapkv__V1__CompactRequest *req, struct snapkvd_job **ret, char *err,
			size_t errlen)
{
	const struct snapkvd_config *cfg = &s->srv->cfg;
	const struct snapkvd_kvpool_limits lim = {
	    .max_session_pools = cfg->max_session_pools,
	    .max_layers = cfg->max_layers,
	    .max_heads = cfg->max_heads,
	    .max_head_dim = cfg->max_head_dim,
	    .max_block_table = cfg->max_block_table,
	};
	struct snapkvd_request_env env = request_env(s);
	struct snapkvd_kvpool_view v;
	int r = snapkvd_kvpool_view(&s->kvpools, &lim, s->buffers.list, req, &v, err, errlen);

	if (r < 0)
		return r;
	r = snapkvd_request_compact(&env, s, o, &v.req, ret, err, errlen);
	if (r == 0) {
		(*ret)->kvpool[0] = v.pool;
		(*ret)->kvpool[1] = v.out_pool;
		for (unsigned i = 0; i < 2; i++)
			if ((*ret)->kvpool[i])
				(*ret)->kvpool[i]->busy++;
	}
	snapkvd_kvpool_view_free(&v);
	return r;
}

/* COMPACT: validated, then admitted, then queued; refused at either step,
 * it has changed nothing. */
static void do_compact(struct snapkvd_session *s, const struct snapkvd_origin *o,
		       const Snapkv__V1__CompactRequest *req)
{
	struct snapkvd_job *j = NULL;
	char err[256] = "";
	int r;

	if (s->srv->draining) {
		complete(s, o, -ESHUTDOWN, "daemon is shutting down", NULL);
		return;
	}
	if (s->n_caches >= s->srv->cfg.max_caches) {
		complete(s, o, -EMFILE, "too many caches", NULL);
		return;
	}
	r = compact_view(s, o, req, &j, err, sizeof(err));
	if (r == 0 && (r = reply_fits(s, o, j->cache, err, sizeof(err))) < 0)
		snapkvd_job_free(j);
	if (r == 0) {
		r = snapkvd_admission_compact(s->srv, s, j, err, sizeof(err));
		if (r < 0)
			snapkvd_job_free(j);
	}
	if (r < 0) {
		complete(s, o, r, err, NULL);
		return;
	}
	s->n_caches++; /* counts against max_caches while running */
	submit_job(s, j);
}

/*
 * SKV_OP_CANCEL of the ring request `user_data`: a COMPACT still queued is
 * done now (-ECANCELED, nothing written); a running one stops at its next
 * safe point (its flag; on a GPU once its stream work is complete); a
 * parked decision-group member fails its group now. Its completion, posted
 * when its worker is done with it, answers the cancel. Nothing in flight
 * by that name (completed already): nothing to do.
 */
static void do_cancel(struct snapkvd_session *s, uint64_t user_data)
{
	struct snapkvd_job *j;

	for (j = s->jobs; j; j = j->s_next)
		if (j->kind == SNAPKVD_JOB_COMPACT && j->origin.ring &&
		    j->origin.user_data == user_data)
			break;
	if (!j || __atomic_load_n(&j->cancel_req, __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&j->cancel_req, true, __ATOMIC_RELEASE);
	if (snapkvd_compactor_cancel(s->srv->compactor, j))
		return;
	/* in a prefill flag wait: the device's waiter releases it now */
	if (j->wait_flag)
		snapkvd_device_wait_poke(s->srv->device);
	if (!j->gm.group)
		return;
	/* parked (or about to be): the arrival sees the flag; a parked one
	 * fails its group here rather than at the next housekeeping tick */
	snapkvd_compactor_finish(s->srv->compactor,
				 snapkvd_groups_sweep(s->srv->groups, snapkvd_now_ns(), false));
}

static void do_stats(struct snapkvd_session *s, const struct snapkvd_origin *o)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	Snapkv__V1__Stats st = SNAPKV__V1__STATS__INIT;

	st.caches = s->n_caches;
	st.buffers = s->buffers.n;
	st.kv_pools = s->kvpools.n;
	st.arena_used = s->arena ? s->arena->used : 0;
	st.arena_bytes = s->arena ? s->arena->size : 0;
	st.requests = s->requests;
	st.errors = s->errors;
	st.pool_total = snapkvd_pool_total(s->srv->pool);
	st.pool_used = snapkvd_pool_used(s->srv->pool);
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_STATS;
	resp.stats = &st;
	complete(s, o, 0, NULL, &resp);
}

void snapkvd_dispatch_request(struct snapkvd_session *s, const struct snapkvd_origin *o0,
			      const uint8_t *buf, size_t len)
{
	Snapkv__V1__Request *req = snapkv__v1__request__unpack(NULL, len, buf);
	struct snapkvd_origin o = *o0;

	s->srv->requests++;
	if (!req) {
		complete(s, &o, -EBADMSG, "malformed Request", NULL);
		return;
	}
	if (!o.ring)
		o.user_data = req->user_data;
	if (s->admin && req->op_case != SNAPKV__V1__REQUEST__OP_NOP &&
	    req->op_case != SNAPKV__V1__REQUEST__OP_STATS) {
		complete(s, &o, -EPERM, "admin sessions have no arena", NULL);
		goto out;
	}
	switch (req->op_case) {
	case SNAPKV__V1__REQUEST__OP_NOP:
		complete(s, &o, 0, NULL, NULL);
		break;
	case SNAPKV__V1__REQUEST__OP_COMPACT:
		do_compact(s, &o, req->compact);
		break;
	case SNAPKV__V1__REQUEST__OP_APPEND:
		do_append(s, &o, req->append);
		break;
	case SNAPKV__V1__REQUEST__OP_GROW:
		do_grow(s, &o, req->grow);
		break;
	case SNAPKV__V1__REQUEST__OP_RELEASE:
		do_release(s, &o, req->release);
		break;
	case SNAPKV__V1__REQUEST__OP_STATS:
		do_stats(s, &o);
		break;
	default:
		complete(s, &o, -EOPNOTSUPP, "unknown request", NULL);
		break;
	}
out:
	snapkv__v1__request__free_unpacked(req, NULL);
}

/* The metrics of a cache's budget: its mode, kept fraction, fallback. */
static void observe_budget(struct snapkvd_session *s, const struct snapkvd_cache *c)
{
	uint64_t kept = 0, n = (uint64_t)c->layers * c->h_store;

	for (uint32_t l = 0; l < c->layers; l++)
		kept += c->layer_kept[l];
	if (n && c->prompt_len)
		snapkvd_policy_observe_budget(&s->srv->policy, (int)c->budget_mode,
					      (double)kept / ((double)n * c->prompt_len),
					      c->fallback);
}

/* A COMPACT job succeeded: its cache becomes the session's. */
static void compact_done(struct snapkvd_session *s, struct snapkvd_job *j)
{
	struct snapkvd_pool *pool = s->srv->pool;
	struct snapkvd_cache *c = j->cache;
	uint64_t now = snapkvd_now_ns();

	j->cache = NULL;
	c->last_use_ns = now;
	if (j->gm.size) {
		snprintf(c->group_key, sizeof(c->group_key), "%s", j->gm.key);
		c->group_size = j->gm.size;
		c->group_wait_ns = j->gm.wait_ns;
	}
	snapkvd_cache_summarise(c);
	observe_budget(s, c);
	snapkvd_policy_observe_compaction(&s->srv->policy, (double)(now - j->t_start) / 1e9,
					  c->mass, (size_t)c->layers * c->h_store);
	if (j->geom.region < c->region_bytes) { /* shrunk (snapkvd_cache_shrink) */
		uint64_t cut = c->region_bytes - j->geom.region;
		struct snapkvd_resv tail = {.tenant = j->resv.tenant, .bytes = cut};

		snapkvd_arena_release(s->arena, c->region_off + j->geom.region, cut);
		snapkvd_pool_cancel(pool, &tail);
		j->resv.bytes -= cut;
		c->region_bytes = j->geom.region;
	}
	snapkvd_pool_tenant_compaction(pool, s->tenant);
	snapkvd_pool_commit(pool, &j->resv);
	snapkvd_pool_cache_count(pool, s->tenant, 1);
	c->next = s->caches;
	s->caches = c;
	s->n_caches++;
	(void)snapkvd_tally_update(&s->srv->tally, s, s->tenant, c);
	complete_cache(s, &j->origin, c);
}

/* Take j off its session's jobs in flight. */
static void untrack(struct snapkvd_session *s, struct snapkvd_job *j)
{
	for (struct snapkvd_job **pp = &s->jobs; *pp; pp = &(*pp)->s_next)
		if (*pp == j) {
			*pp = j->s_next;
			return;
		}
}

void snapkvd_dispatch_job_done(struct snapkvd_job *j)
{
	struct snapkvd_session *s = j->s;

	untrack(s, j);
	if (j->status == -ECANCELED)
		s->srv->jobs_cancelled++;
	if (j->kind == SNAPKVD_JOB_COMPACT && j->status < 0) {
		if (j->status == -ECANCELED && __atomic_load_n(&j->cancel_req, __ATOMIC_ACQUIRE))
			j->origin.cqe_flags |= SKV_CQE_F_CANCELLED;
		if (__atomic_load_n(&j->writing, __ATOMIC_ACQUIRE))
			j->origin.cqe_flags |= SKV_CQE_F_WRITTEN;
	}
	if (j->kind == SNAPKVD_JOB_GROW) {
		grow_done(j);
	} else {
		s->n_caches--;
		s->srv->compactions++;
		if (s->closing || j->status < 0) {
			/* failed, or the engine is gone: give back what the job held */
			snapkvd_arena_release(s->arena, j->cache->region_off,
					      j->cache->region_bytes);
			snapkvd_pool_cancel(s->srv->pool, &j->resv);
			if (!s->closing)
				complete(s, &j->origin, j->status, j->err, NULL);
		} else {
			compact_done(s, j);
		}
	}
	snapkvd_job_free(j);
	snapkvd_session_unref(s);
}

/* -------------------------------------------------------------- completions */

/* A ring request's CQE, its Response in the request's own slot (a reply
 * body, or any failure's reason). */
static void complete_ring(struct snapkvd_session *s, const struct snapkvd_origin *o, int status,
			  bool body, const Snapkv__V1__Response *resp)
{
	struct skv_cqe cqe = {
	    .user_data = o->user_data, .res = status, .flags = o->cqe_flags, .slot = o->slot};
	size_t n = 0;

	if (o->has_slot && (body || status < 0)) {
		n = snapkv__v1__response__get_packed_size(resp);
		if (n > snapkvd_ring_slot_size(s->ring)) {
			cqe.res = -EMSGSIZE;
			n = 0;
		} else {
			snapkv__v1__response__pack(resp, snapkvd_ring_slot(s->ring, o->slot));
		}
	}
	cqe.len = (uint32_t)n;
	if (snapkvd_ring_complete(s->ring, &cqe) < 0)
		snapkvd_session_close(s, -EBADMSG);
}

static void complete(struct snapkvd_session *s, const struct snapkvd_origin *o, int status,
		     const char *err, Snapkv__V1__Response *resp)
{
	Snapkv__V1__Response local = SNAPKV__V1__RESPONSE__INIT;
	int r;

	if (!resp)
		resp = &local;
	resp->status = status;
	resp->error = (char *)(err ? err : "");
	resp->user_data = o->user_data;
	if (status < 0) {
		snapkvd_session_count_error(s);
		snapkvd_policy_count_error(&s->srv->policy, status);
		log_debug("session %llu: request failed: %s: %s", (unsigned long long)s->id,
			  strerror(-status), err ? err : "");
	}
	if (s->closing)
		return;
	if (o->ring) {
		complete_ring(s, o, status, resp != &local, resp);
		return;
	}
	r = snapkvd_session_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE, &resp->base, NULL, 0);
	if (r < 0)
		snapkvd_session_close(s, 0);
}

/* One SQE taken from the ring. */
static void on_sqe(struct snapkvd_session *s, const struct skv_sqe *sqe)
{
	struct snapkvd_origin o = {.ring = true, .slot = sqe->slot, .user_data = sqe->user_data};
	const uint8_t *arg;
	int r;

	s->requests++;
	switch (sqe->opcode) {
	case SKV_OP_NOP:
		s->srv->requests++;
		complete(s, &o, 0, NULL, NULL);
		break;
	case SKV_OP_REQUEST:
		r = snapkvd_ring_arg(s->ring, sqe, &arg);
		if (r < 0) {
			complete(s, &o, r, r == -ENOMEM ? "out of memory" : "bad argument slot",
				 NULL);
			break;
		}
		o.has_slot = true;
		snapkvd_dispatch_request(s, &o, arg, sqe->len);
		break;
	case SKV_OP_CANCEL: /* answered by its target's completion */
		snapkvd_ring_no_completion(s->ring);
		do_cancel(s, sqe->user_data);
		break;
	default:
		complete(s, &o, -EOPNOTSUPP, "unknown opcode", NULL);
		break;
	}
}

int snapkvd_dispatch_poll_ring(struct snapkvd_session *s, unsigned budget)
{
	int done = 0;

	if (s->closing || !s->ring)
		return 0;
	while ((unsigned)done < budget && !s->closing) {
		struct skv_sqe sqe;
		int r = snapkvd_ring_next(s->ring, &sqe);

		if (r == 0)
			break;
		if (r < 0) {
			log_notice("session %llu: corrupt SQ tail or CQ head",
				   (unsigned long long)s->id);
			snapkvd_session_close(s, r);
			break;
		}
		done++;
		on_sqe(s, &sqe);
	}
	return done;
}
