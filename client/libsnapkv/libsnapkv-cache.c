// SPDX-License-Identifier: MIT
/*
 * libsnapkv-cache.c - a compact cache's handle: adopting the daemon's
 * CacheInfo (every offset checked against the mapped arena, the budget
 * outcome), APPEND, GROW and RELEASE.
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void skv__wb_free(struct skv_wb *w)
{
	if (!w)
		return;
	free(w->data);
	free(w->size);
	free(w->table);
	free(w);
}

void skv__cache_free(struct skv_cache *k)
{
	if (!k)
		return;
	skv__wb_free(k->wb);
	free(k->k_off);
	free(k->v_off);
	free(k->pos_off);
	free(k->mass);
	free(k->kv_scale);
	free(k->hkept);
	free(k->hstart);
	free(k->lmass);
	free(k);
}

/*
 * The bytes of one layer's K (= V) that must lie in the arena: the dense
 * tensor, a paged arena cache's run (which must hold its blocks), 0 for
 * writeback (the engine's buffers). -EPROTO for a paged description that
 * does not add up.
 */
static int cache_kv_bytes(struct skv_client *c, const Snapkv__V1__CacheInfo *ci, uint64_t es,
			  uint64_t *ret)
{
	uint64_t blocks;

	if (ci->layout != SNAPKV__V1__LAYOUT__LAYOUT_PAGED) {
		*ret = (uint64_t)ci->h_store * ci->capacity * ci->head_dim * es;
		return 0;
	}
	if (!ci->block_size || ci->block_size > SKV_MAX_OUT_BLOCK_SIZE || ci->block_stride < 0)
		return skv__fail(c, -EPROTO, "malformed paged cache description");
	if (ci->out_dest == SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK) {
		*ret = 0;
		return 0;
	}
	if ((uint64_t)ci->n_blocks * ci->block_size < ci->capacity ||
	    __builtin_mul_overflow((uint64_t)ci->n_blocks, (uint64_t)ci->block_stride, &blocks) ||
	    __builtin_mul_overflow(blocks, es, &blocks) || blocks > ci->run_bytes)
		return skv__fail(c, -EPROTO, "paged cache: its blocks do not fit its runs");
	*ret = ci->run_bytes;
	return 0;
}

/*
 * The budget outcome of a CacheInfo (120-128): the per-head counts, and a
 * ragged cache's head blocks, each inside its layer's K/V (h_store x
 * capacity rows, checked against the arena by the caller).
 */
static int cache_budget_from_info(struct skv_client *c, const Snapkv__V1__CacheInfo *ci,
				  struct skv_cache *k)
{
	size_t nm = (size_t)ci->layers * ci->h_store;
	uint64_t rows = (uint64_t)ci->h_store * ci->capacity, tot = 0;
	uint32_t mn = UINT32_MAX;

	if (!ci->budget_mode)
		return 0;
	if (ci->n_head_kept != nm || ci->n_layer_mass_min != ci->layers ||
	    ci->n_layer_mass_mean != ci->layers || (ci->ragged && ci->n_head_start != nm) ||
	    ci->budget_mode > SNAPKV__V1__BUDGET_MODE__BUDGET_MODE_MASS_HEADS)
		return skv__fail(c, -EPROTO, "malformed budget description");
	for (size_t i = 0; i < nm; i++) {
		uint64_t cap = (uint64_t)ci->head_kept[i] + ci->capacity - ci->kept;

		if (ci->head_kept[i] > ci->kept ||
		    (ci->ragged && (ci->head_start[i] > rows || cap > rows - ci->head_start[i])))
			return skv__fail(c, -EPROTO,
					 "budget description: a head outside its layer");
		tot += ci->head_kept[i];
		mn = ci->head_kept[i] < mn ? ci->head_kept[i] : mn;
	}
	k->hkept = malloc(nm * sizeof(*k->hkept));
	k->hstart = ci->ragged ? malloc(nm * sizeof(*k->hstart)) : NULL;
	k->lmass = malloc((size_t)ci->layers * 2 * sizeof(float));
	if (!k->hkept || (ci->ragged && !k->hstart) || !k->lmass)
		return skv__fail(c, -ENOMEM, "out of memory");
	memcpy(k->hkept, ci->head_kept, nm * sizeof(*k->hkept));
	if (ci->ragged)
		memcpy(k->hstart, ci->head_start, nm * sizeof(*k->hstart));
	memcpy(k->lmass, ci->layer_mass_min, ci->layers * sizeof(float));
	memcpy(k->lmass + ci->layers, ci->layer_mass_mean, ci->layers * sizeof(float));
	k->budget = (struct skv_cache_budget){
	    .budget_size = sizeof(k->budget),
	    .mode = (enum skv_budget)(ci->budget_mode - 1),
	    .c_star = ci->c_star,
	    .fallback = ci->fallback,
	    .ragged = ci->ragged,
	    .mass_min = ci->mass_min,
	    .kept_min = nm ? mn : 0,
	    .kept_mean = nm ? (float)((double)tot / (double)nm) : 0.0f,
	};
	return 0;
}

static bool fp8_dtype(Snapkv__V1__DType dt)
{
	return dt == SNAPKV__V1__DTYPE__D_TYPE_F8E4M3FN || dt == SNAPKV__V1__DTYPE__D_TYPE_F8E5M2;
}

/* An fp8 cache's [layers][K, V] scales; none for other dtypes. */
static int cache_scales_from_info(struct skv_client *c, const Snapkv__V1__CacheInfo *ci,
				  struct skv_cache *k)
{
	free(k->kv_scale);
	k->kv_scale = NULL;
	if (!fp8_dtype(ci->dtype))
		return 0;
	if (ci->n_kv_scale != (size_t)ci->layers * 2)
		return skv__fail(c, -EPROTO, "fp8 cache without its scales");
	k->kv_scale = malloc(ci->n_kv_scale * sizeof(float));
	if (!k->kv_scale)
		return skv__fail(c, -ENOMEM, "out of memory");
	memcpy(k->kv_scale, ci->kv_scale, ci->n_kv_scale * sizeof(float));
	return 0;
}

SKV_EXPORT float skv_cache_kv_scale(const struct skv_cache *k, uint32_t layer, int v)
{
	if (!k || layer >= k->info.layers || v < 0 || v > 1)
		return NAN;
	return k->kv_scale ? k->kv_scale[2 * layer + v] : 1.0f;
}

/* Adopt a CacheInfo: every offset checked against the arena we mapped. */
int skv__cache_from_info(struct skv_client *c, const Snapkv__V1__CacheInfo *ci, struct skv_cache *k)
{
	uint64_t es = ci->dtype == SNAPKV__V1__DTYPE__D_TYPE_F32 ? 4 : fp8_dtype(ci->dtype) ? 1 : 2;
	uint64_t kv = 0;
	uint64_t pos = (uint64_t)ci->h_store * ci->capacity * 4;
	size_t nm = (size_t)ci->layers * ci->h_store;
	bool wb = ci->layout == SNAPKV__V1__LAYOUT__LAYOUT_PAGED &&
		  ci->out_dest == SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK;
	int r;

	if (!ci->layers || ci->n_k_offset != ci->layers || ci->n_v_offset != ci->layers ||
	    ci->n_pos_offset != ci->layers || ci->n_retained_mass != nm)
		return skv__fail(c, -EPROTO, "malformed cache description");
	if ((r = cache_kv_bytes(c, ci, es, &kv)) < 0)
		return r;
	for (uint32_t l = 0; l < ci->layers; l++)
		if ((!wb &&
		     (ci->k_offset[l] > c->arena_bytes || kv > c->arena_bytes - ci->k_offset[l] ||
		      ci->v_offset[l] > c->arena_bytes || kv > c->arena_bytes - ci->v_offset[l])) ||
		    ci->pos_offset[l] > c->arena_bytes || pos > c->arena_bytes - ci->pos_offset[l])
			return skv__fail(c, -EPROTO, "cache outside the arena");
	free(k->k_off);
	free(k->v_off);
	free(k->pos_off);
	free(k->mass);
	free(k->hkept);
	free(k->hstart);
	free(k->lmass);
	k->hkept = NULL;
	k->hstart = NULL;
	k->lmass = NULL;
	k->budget = (struct skv_cache_budget){
	    .budget_size = sizeof(k->budget), .mode = SKV_BUDGET_UNIFORM, .c_star = ci->budget};
	k->k_off = malloc(ci->layers * sizeof(uint64_t));
	k->v_off = malloc(ci->layers * sizeof(uint64_t));
	k->pos_off = malloc(ci->layers * sizeof(uint64_t));
	k->mass = malloc(nm * sizeof(float));
	if (!k->k_off || !k->v_off || !k->pos_off || !k->mass)
		return skv__fail(c, -ENOMEM, "out of memory");
	memcpy(k->k_off, ci->k_offset, ci->layers * sizeof(uint64_t));
	memcpy(k->v_off, ci->v_offset, ci->layers * sizeof(uint64_t));
	memcpy(k->pos_off, ci->pos_offset, ci->layers * sizeof(uint64_t));
	memcpy(k->mass, ci->retained_mass, nm * sizeof(float));
	k->c = c;
	k->session_id = c->session_id;
	k->arena = c->arena;
	k->info = (struct skv_cache_info){
	    .id = ci->cache_id,
	    .layers = ci->layers,
	    .h_store = ci->h_store,
	    .head_dim = ci->head_dim,
	    .dtype = (enum skv_dtype)ci->dtype,
	    .layout = (enum skv_layout)ci->layout,
	    .prompt_len = ci->prompt_len,
	    .kept = ci->kept,
	    .capacity = ci->capacity,
	    .appended = ci->appended,
	    .budget = ci->budget,
	    .head_stride = ci->head_stride,
	    .token_stride = ci->token_stride,
	    .requested_budget = ci->requested_budget ? ci->requested_budget : ci->budget,
	    .budget_scaled = ci->budget_scaled,
	    .pressure = ci->pressure,
	    .kv_arena = ci->kv_arena == SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM
			    ? SKV_ARENA_CUDA
			    : SKV_ARENA_HOST,
	};
	if ((r = cache_budget_from_info(c, ci, k)) < 0 ||
	    (r = cache_scales_from_info(c, ci, k)) < 0)
		return r;
	k->budget.group_size = ci->group_size;
	k->budget.group_wait_us = ci->group_wait_us;
	if (ci->layout == SNAPKV__V1__LAYOUT__LAYOUT_PAGED) {
		k->info.block_size = ci->block_size;
		k->info.n_blocks = ci->n_blocks;
		k->info.block_stride = ci->block_stride;
		k->info.out_dest = wb ? SKV_OUT_WRITEBACK : SKV_OUT_ARENA;
		k->run_bytes = wb ? 0 : ci->run_bytes;
		k->info.in_place_blocks = wb ? ci->in_place_blocks : 0;
		k->info.max_decode = wb ? ci->max_decode : 0;
		k->info.decode_limit = k->info.capacity - k->info.kept;
		if (k->info.max_decode > k->info.decode_limit)
			k->info.decode_limit = k->info.max_decode;
	}
	return 0;
}

SKV_EXPORT const struct skv_cache_info *skv_cache_info(const struct skv_cache *k)
{
	return k ? &k->info : NULL;
}

static int cache_check(struct skv_cache *k)
{
	if (!k)
		return -EINVAL;
	if (k->session_id != k->c->session_id)
		return skv__fail(k->c, -ENOENT, "cache belongs to a previous session");
	return 0;
}

SKV_EXPORT int skv_cache_append(struct skv_cache *k, uint32_t tokens)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__AppendRequest a = SNAPKV__V1__APPEND_REQUEST__INIT;
	Snapkv__V1__Response *resp = NULL;
	int r = cache_check(k);

	if (r < 0)
		return r;
	a.cache_id = k->info.id;
	a.tokens = tokens;
	req.op_case = SNAPKV__V1__REQUEST__OP_APPEND;
	req.append = &a;
	pthread_mutex_lock(&k->c->mu);
	r = skv__call(k->c, &req, &resp);
	if (r == 0) {
		if (resp->result_case == SNAPKV__V1__RESPONSE__RESULT_APPENDED)
			k->info.appended = resp->appended;
		else
			r = skv__fail(k->c, -EPROTO, "unexpected reply to APPEND");
		snapkv__v1__response__free_unpacked(resp, NULL);
	}
	pthread_mutex_unlock(&k->c->mu);
	return r;
}

/* A writeback cache's table with n more entries (a GROW's new blocks),
 * installed only once the daemon has said yes. */
static int wb_grow_table(struct skv_cache *k, const int32_t *table, uint32_t n, int32_t **ret)
{
	*ret = NULL;
	if (!n)
		return 0;
	if (!k->wb || !table)
		return skv__fail(k->c, -EINVAL,
				 "new destination blocks are for a writeback cache (and not NULL)");
	*ret = malloc(((size_t)k->wb->n_table + n) * sizeof(int32_t));
	if (!*ret)
		return skv__fail(k->c, -ENOMEM, "out of memory");
	memcpy(*ret, k->wb->table, (size_t)k->wb->n_table * sizeof(int32_t));
	memcpy(*ret + k->wb->n_table, table, (size_t)n * sizeof(int32_t));
	return 0;
}

SKV_EXPORT int skv_cache_grow_blocks(struct skv_cache *k, uint32_t extra, const int32_t *table,
				     uint32_t n)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__GrowRequest g = SNAPKV__V1__GROW_REQUEST__INIT;
	Snapkv__V1__Response *resp = NULL;
	int32_t *grown = NULL;
	int r = cache_check(k);

	if (r == 0)
		r = wb_grow_table(k, table, n, &grown);
	if (r < 0)
		return r;
	g.cache_id = k->info.id;
	g.extra = extra;
	g.n_out_block_table = n;
	g.out_block_table = (int32_t *)table;
	req.op_case = SNAPKV__V1__REQUEST__OP_GROW;
	req.grow = &g;
	pthread_mutex_lock(&k->c->mu);
	r = skv__call(k->c, &req, &resp);
	if (r == 0) {
		if (resp->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE)
			r = skv__cache_from_info(k->c, resp->cache, k);
		else
			r = skv__fail(k->c, -EPROTO, "unexpected reply to GROW");
		snapkv__v1__response__free_unpacked(resp, NULL);
	}
	if (r == 0 && grown) {
		free(k->wb->table);
		k->wb->table = grown;
		k->wb->n_table += n;
		grown = NULL;
	}
	pthread_mutex_unlock(&k->c->mu);
	free(grown);
	return r;
}

SKV_EXPORT int skv_cache_grow(struct skv_cache *k, uint32_t extra)
{
	return skv_cache_grow_blocks(k, extra, NULL, 0);
}

/* appended < 0: not reported */
static int release(struct skv_cache *k, bool linger, int64_t appended)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__ReleaseRequest rl = SNAPKV__V1__RELEASE_REQUEST__INIT;
	int r;

	if (!k)
		return 0;
	r = cache_check(k);
	if (r == 0 && !k->c->dead) {
		rl.cache_id = k->info.id;
		rl.linger = linger;
		rl.appended_given = appended >= 0;
		rl.appended = appended >= 0 ? (uint32_t)appended : 0;
		req.op_case = SNAPKV__V1__REQUEST__OP_RELEASE;
		req.release = &rl;
		pthread_mutex_lock(&k->c->mu);
		r = skv__call(k->c, &req, NULL);
		pthread_mutex_unlock(&k->c->mu);
		/* a refused report released nothing: the handle stays */
		if (r == -EINVAL && appended >= 0)
			return r;
	} else if (r == 0) {
		r = k->c->dead;
	}
	skv__cache_free(k);
	return r;
}

SKV_EXPORT int skv_cache_release(struct skv_cache *k)
{
	return release(k, false, -1);
}

SKV_EXPORT int skv_cache_release_linger(struct skv_cache *k)
{
	return release(k, true, -1);
}

SKV_EXPORT int skv_cache_release_appended(struct skv_cache *k, uint32_t appended, int linger)
{
	return release(k, linger != 0, appended);
}
