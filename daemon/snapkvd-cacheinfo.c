// SPDX-License-Identifier: MIT
/*
 * snapkvd-cacheinfo.c - a cache as the engine sees it: its CacheInfo, and
 * the bound of the reply carrying one; see snapkvd-cacheinfo.h.
 */
#include "snapkvd-cacheinfo.h"

#include "kernels/skv.h"
#include "proto/snapkv.pb-c.h"
#include "snapkvd-cache.h"

/* The block format of a PAGED cache (CacheInfo fields 100-105). */
static void fill_paged_info(const struct snapkvd_cache *c, Snapkv__V1__CacheInfo *ci)
{
	ci->layout = SNAPKV__V1__LAYOUT__LAYOUT_PAGED;
	ci->block_size = c->block_size;
	ci->n_blocks = c->n_blocks;
	ci->in_place_blocks = c->in_place_blocks;
	ci->max_decode = c->max_decode;
	ci->block_stride = c->block_stride;
	ci->out_dest = c->writeback ? SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK
				    : SNAPKV__V1__OUT_DEST__OUT_DEST_ARENA;
	ci->run_bytes = c->run_bytes;
	ci->out_buffer_id = c->out_buffer_id;
}

/* The budget mode's outcome (CacheInfo 120-128): per-head counts, and for
 * a ragged cache the head starts. */
static void fill_budget_info(const struct snapkvd_cache *c, Snapkv__V1__CacheInfo *ci)
{
	size_t n = (size_t)c->layers * c->h_store;

	ci->budget_mode = (Snapkv__V1__BudgetMode)(c->budget_mode + 1);
	ci->n_head_kept = n;
	ci->head_kept = c->hkept;
	ci->ragged = c->ragged;
	if (c->ragged) {
		ci->n_head_start = n;
		ci->head_start = c->hstart;
		ci->pos_stride = 0;
	}
	ci->c_star = c->c_star;
	ci->fallback = c->fallback;
	ci->mass_min = c->mass_choice;
	ci->n_layer_mass_min = ci->n_layer_mass_mean = c->layers;
	ci->layer_mass_min = c->layer_mass;
	ci->layer_mass_mean = c->layer_mass + c->layers;
}

void snapkvd_cacheinfo_fill(const struct snapkvd_cache *c, Snapkv__V1__CacheInfo *ci)
{
	ci->group_size = c->group_size;
	ci->group_wait_us = c->group_wait_ns / 1000;
	ci->cache_id = c->id;
	ci->kv_arena = c->gpu_kv ? SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM
				 : SNAPKV__V1__ARENA_KIND__ARENA_KIND_HOST_MEMFD;
	ci->layers = c->layers;
	ci->h_store = c->h_store;
	ci->head_dim = c->head_dim;
	ci->dtype = (Snapkv__V1__DType)c->dtype;
	if (skv_dtype_is_fp8(c->dtype)) {
		ci->n_kv_scale = (size_t)c->layers * 2;
		ci->kv_scale = c->kv_scale;
	}
	ci->layout = c->layout == SNAPKVD_LAYOUT_NHD ? SNAPKV__V1__LAYOUT__LAYOUT_NHD
						     : SNAPKV__V1__LAYOUT__LAYOUT_HND;
	ci->prompt_len = c->prompt_len;
	ci->kept = c->kept;
	ci->capacity = c->slots;
	ci->appended = c->appended;
	ci->head_stride = c->head_stride;
	ci->token_stride = c->token_stride;
	ci->pos_stride = c->slots;
	ci->n_k_offset = ci->n_v_offset = ci->n_pos_offset = c->layers;
	ci->k_offset = c->k_off;
	ci->v_offset = c->v_off;
	ci->pos_offset = c->pos_off;
	ci->n_retained_mass = (size_t)c->layers * c->h_store;
	ci->retained_mass = c->mass;
	ci->region_offset = c->region_off;
	ci->region_bytes = c->region_bytes;
	ci->budget = c->budget;
	ci->requested_budget = c->requested_budget;
	ci->budget_scaled = c->budget < c->requested_budget;
	ci->pressure = (Snapkv__V1__PressureLevel)(c->pressure_level + 1);
	if (c->layout == SNAPKVD_LAYOUT_PAGED)
		fill_paged_info(c, ci);
	if (c->budgeted)
		fill_budget_info(c, ci);
}

/*
 * An upper bound of the reply describing cache c (its Response with the
 * CacheInfo): its arrays are packed as they are, every varint that a later
 * placement may widen (offsets, ids, counts) counted at its widest.
 */
size_t snapkvd_cacheinfo_reply_bound(const struct snapkvd_cache *c)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;

	snapkvd_cacheinfo_fill(c, &ci);
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_CACHE;
	resp.cache = &ci;
	/* a budget mode's per-head counts are 0 before the compaction and its
	 * ragged starts absent: count every one at its widest (5 + 10 bytes) */
	return snapkv__v1__response__get_packed_size(&resp) + (size_t)c->layers * 3 * 10 + 256 +
	       (c->budgeted ? (size_t)c->layers * c->h_store * 15 + 32 : 0);
}
