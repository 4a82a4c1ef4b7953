// SPDX-License-Identifier: MIT
/*
 * snapkvd-admission.c - admitting validated jobs; see snapkvd-admission.h.
 *
 * The pressure policy is brought up to date first, so that its level
 * reflects every pool change made so far (a cache released earlier in this
 * loop round) before its admission rule judges the request. The actions
 * that runs (events, hooks, eviction of lingering caches) are those due to
 * changes already made, which the loop would run at the end of the round
 * anyway; none is caused by this request, and a request refused by
 * validation never gets here.
 */
#include "snapkvd-admission.h"

#include <stdio.h>

#include "snapkvd-arena.h"
#include "snapkvd-cache.h"
#include "snapkvd-clock.h"
#include "snapkvd-group.h"
#include "snapkvd-job.h"
#include "snapkvd-paged.h"
#include "snapkvd-policy.h"
#include "snapkvd-pool.h"
#include "snapkvd-device.h"
#include "snapkvd-server.h"
#include "snapkvd-session.h"

/* The kernels' outputs: K/V at kv_base (the host arena, or the GPU arena
 * whose offsets are the host arena's), positions always in the host arena,
 * where APPEND and the decode slots write them. */
static void point_outputs(struct snapkvd_job *j, uint8_t *host_base, uint8_t *kv_base)
{
	const struct snapkvd_cache *c = j->cache;

	j->host_base = host_base;
	for (uint32_t l = 0; l < c->layers; l++)
		j->out[l] = (struct skv_layer_out){
		    .k = {.data = kv_base + c->k_off[l],
			  .dtype = c->dtype,
			  .head_stride = c->head_stride,
			  .token_stride = c->token_stride},
		    .v = {.data = kv_base + c->v_off[l],
			  .dtype = c->dtype,
			  .head_stride = c->head_stride,
			  .token_stride = c->token_stride},
		    .positions = (int32_t *)(host_base + c->pos_off[l]),
		    .pos_stride = c->slots,
		    .retained_mass = c->mass + (size_t)l * c->h_store,
		};
	if (j->paged)
		snapkvd_paged_outputs(j, kv_base);
}

/* Pool then arena: 0, or -errno with the reason (nothing held). */
static int reserve(struct snapkvd_server *srv, struct snapkvd_session *s, uint64_t bytes,
		   struct snapkvd_resv *resv, uint64_t *ret_off, bool *ret_dirty, char *err,
		   size_t errlen)
{
	int r = snapkvd_pool_reserve(srv->pool, s->tenant, bytes, resv);

	if (r < 0) {
		snapkvd_pool_explain(srv->pool, s->tenant, bytes, r, err, errlen);
		return r;
	}
	r = snapkvd_arena_take(s->arena, bytes, ret_off, ret_dirty);
	if (r < 0) {
		snapkvd_pool_cancel(srv->pool, resv);
		snprintf(err, errlen, "session arena full: %llu bytes wanted",
			 (unsigned long long)bytes);
	}
	return r;
}

int snapkvd_admission_compact(struct snapkvd_server *srv, struct snapkvd_session *s,
			      struct snapkvd_job *j, char *err, size_t errlen)
{
	struct snapkvd_cache *c = j->cache;
	uint64_t off, region = j->geom.region;
	uint8_t *kv_base = s->arena->base;
	int r;

	c->id = ++srv->next_cache_id;
	if (j->scaled)
		snapkvd_policy_count_scaled(&srv->policy);
	snapkvd_policy_pool_changed(&srv->policy, snapkvd_pool_used(srv->pool),
				    snapkvd_pool_total(srv->pool));
	r = snapkvd_policy_admit(&srv->policy, s->uid,
				 snapkvd_pool_tenant_use(srv->pool, s->tenant), region, err,
				 errlen);
	if (r < 0)
		return r;
	r = reserve(srv, s, region, &j->resv, &off, &c->region_dirty, err, errlen);
	if (r < 0)
		return r;
	if (j->gm.size) { /* last: the one step a refusal must undo */
		r = snapkvd_groups_join(srv->groups, j, s->uid, srv->cfg.max_tenant_groups,
					snapkvd_now_ns(), err, errlen);
		if (r < 0) {
			snapkvd_arena_release(s->arena, off, region);
			snapkvd_pool_cancel(srv->pool, &j->resv);
			return r;
		}
	}
	snapkvd_cache_place(c, off, c->slots, &j->geom);
	if (c->gpu_kv)
		kv_base = snapkvd_device_arena_base(srv->device, s->garena);
	point_outputs(j, s->arena->base, kv_base);
	return 0;
}

int snapkvd_admission_grow(struct snapkvd_server *srv, struct snapkvd_session *s,
			   struct snapkvd_job *j, char *err, size_t errlen)
{
	int r = snapkvd_pool_reserve(srv->pool, s->tenant, j->g.geom.region, &j->resv);

	/* GROW's messages: the pool's reason as is, the arena's bare */
	if (r < 0) {
		snapkvd_pool_explain(srv->pool, s->tenant, j->g.geom.region, r, err, errlen);
		return r;
	}
	r = snapkvd_arena_take(s->arena, j->g.geom.region, &j->g.off, &j->g.dirty);
	if (r < 0) {
		snapkvd_pool_cancel(srv->pool, &j->resv);
		snprintf(err, errlen, "session arena full");
		return r;
	}
	j->host_base = s->arena->base;
	return 0;
}
