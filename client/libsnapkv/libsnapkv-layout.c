// SPDX-License-Identifier: MIT
/*
 * libsnapkv-layout.c - where a cache's data lies: K/V of each (layer, head),
 * slots in any layout, paged blocks and their runs (SNAPKV_1.5), positions,
 * and the per-head counts and masses of the budget modes (SNAPKV_1.6).
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Elements from a layer's K/V start to (layer, head)'s slot 0: a ragged
 * head's start row, else head * head_stride. */
static int64_t head_elems(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	if (k->hstart)
		return (int64_t)k->hstart[(size_t)layer * k->info.h_store + head] *
		       k->info.token_stride;
	return (int64_t)head * k->info.head_stride;
}

/* Bytes per element of the cache's dtype (fp8: 1). */
static size_t cache_es(const struct skv_cache *k)
{
	switch (k->info.dtype) {
	case SKV_DTYPE_F32:
		return 4;
	case SKV_DTYPE_F8E4M3FN:
	case SKV_DTYPE_F8E5M2:
		return 1;
	default:
		return 2;
	}
}

static uint8_t *cache_ptr(const struct skv_cache *k, const uint64_t *offs, uint32_t layer,
			  uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return NULL;
	return k->arena + offs[layer] + (size_t)head_elems(k, layer, head) * cache_es(k);
}

SKV_EXPORT void *skv_cache_k(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	return k && k->info.kv_arena == SKV_ARENA_HOST && k->info.out_dest != SKV_OUT_WRITEBACK
		   ? cache_ptr(k, k->k_off, layer, head)
		   : NULL;
}

SKV_EXPORT void *skv_cache_v(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	return k && k->info.kv_arena == SKV_ARENA_HOST && k->info.out_dest != SKV_OUT_WRITEBACK
		   ? cache_ptr(k, k->v_off, layer, head)
		   : NULL;
}

static int64_t cache_off(const struct skv_cache *k, const uint64_t *offs, uint32_t layer,
			 uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return -1;
	return (int64_t)(offs[layer] + (uint64_t)head_elems(k, layer, head) * cache_es(k));
}

SKV_EXPORT int64_t skv_cache_k_offset(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	return k ? cache_off(k, k->k_off, layer, head) : -1;
}

SKV_EXPORT int64_t skv_cache_v_offset(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	return k ? cache_off(k, k->v_off, layer, head) : -1;
}

/* Element offset of slot `slot` of head h within a (paged) pool or dense tensor. */
static int64_t slot_elems(const struct skv_cache *k, uint32_t h, uint32_t slot, int64_t block)
{
	const struct skv_cache_info *i = &k->info;

	if (i->layout != SKV_LAYOUT_PAGED)
		return (int64_t)slot * i->token_stride; /* + head_elems() */
	return block * i->block_stride + (int64_t)(slot % i->block_size) * i->token_stride +
	       (int64_t)h * i->head_stride;
}

static void *cache_slot(const struct skv_cache *k, enum skv_kv kv, uint32_t layer, uint32_t head,
			uint32_t slot)
{
	const struct skv_cache_info *i;
	const uint64_t *offs;
	size_t es, row;

	if (!k || layer >= k->info.layers || head >= k->info.h_store ||
	    slot >= skv_cache_head_capacity(k, layer, head))
		return NULL;
	i = &k->info;
	es = cache_es(k);
	row = (size_t)i->head_dim * es;
	offs = kv == SKV_KV_V ? k->v_off : k->k_off;
	if (i->layout == SKV_LAYOUT_PAGED && i->out_dest == SKV_OUT_WRITEBACK) {
		uint32_t j = slot / i->block_size;
		size_t t = 2 * (size_t)layer + (kv == SKV_KV_V);
		uint64_t at;

		if (!k->wb || j >= k->wb->n_table || !k->wb->data[t])
			return NULL;
		at = offs[layer] + (uint64_t)slot_elems(k, head, slot, k->wb->table[j]) * es;
		if (at > k->wb->size[t] || row > k->wb->size[t] - at)
			return NULL;
		return k->wb->data[t] + at;
	}
	if (i->kv_arena != SKV_ARENA_HOST)
		return NULL;
	if (i->layout != SKV_LAYOUT_PAGED)
		return k->arena + offs[layer] +
		       (uint64_t)(head_elems(k, layer, head) + slot_elems(k, head, slot, 0)) * es;
	return k->arena + offs[layer] +
	       (uint64_t)slot_elems(k, head, slot, (int64_t)(slot / i->block_size)) * es;
}

SKV_EXPORT void *skv_cache_k_slot(const struct skv_cache *k, uint32_t layer, uint32_t head,
				  uint32_t slot)
{
	return cache_slot(k, SKV_KV_K, layer, head, slot);
}

SKV_EXPORT void *skv_cache_v_slot(const struct skv_cache *k, uint32_t layer, uint32_t head,
				  uint32_t slot)
{
	return cache_slot(k, SKV_KV_V, layer, head, slot);
}

SKV_EXPORT int64_t skv_cache_block_offset(const struct skv_cache *k, uint32_t layer, enum skv_kv kv,
					  uint32_t block)
{
	const uint64_t *offs;
	int64_t b;

	if (!k || k->info.layout != SKV_LAYOUT_PAGED || layer >= k->info.layers ||
	    (kv != SKV_KV_K && kv != SKV_KV_V))
		return -1;
	offs = kv == SKV_KV_V ? k->v_off : k->k_off;
	if (k->info.out_dest == SKV_OUT_WRITEBACK) {
		if (!k->wb || block >= k->wb->n_table)
			return -1;
		b = k->wb->table[block];
	} else {
		if (block >= k->info.n_blocks)
			return -1;
		b = block;
	}
	return (int64_t)offs[layer] + b * k->info.block_stride * (int64_t)cache_es(k);
}

SKV_EXPORT int skv_cache_block_run(const struct skv_cache *k, uint32_t layer, enum skv_kv kv,
				   uint64_t *ret_offset, uint64_t *ret_bytes)
{
	if (!k || k->info.layout != SKV_LAYOUT_PAGED || k->info.out_dest != SKV_OUT_ARENA ||
	    layer >= k->info.layers || (kv != SKV_KV_K && kv != SKV_KV_V) || !ret_offset ||
	    !ret_bytes)
		return -EINVAL;
	*ret_offset = kv == SKV_KV_V ? k->v_off[layer] : k->k_off[layer];
	*ret_bytes = k->run_bytes;
	return 0;
}

SKV_EXPORT int skv_cache_map_blocks(const struct skv_cache *k, uint32_t layer, enum skv_kv kv,
				    void *addr)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t off, len;
	struct skv_client *c;
	void *p;
	int r;

	if (!k || k->info.kv_arena != SKV_ARENA_HOST ||
	    skv_cache_block_run(k, layer, kv, &off, &len) < 0 || !addr ||
	    (uintptr_t)addr % (uintptr_t)pg || off % (uint64_t)pg || len % (uint64_t)pg)
		return -EINVAL;
	c = k->c;
	pthread_mutex_lock(&c->mu);
	if (c->session_id != k->session_id || c->arena_fd < 0) {
		r = skv__fail(c, -ENOTCONN, "the cache's session is gone");
	} else {
		p = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, c->arena_fd,
			 (off_t)off);
		r = p == MAP_FAILED
			? skv__fail(c, -errno, "mmap of the cache's blocks: %s", strerror(errno))
			: 0;
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

SKV_EXPORT const int32_t *skv_cache_positions(const struct skv_cache *k, uint32_t layer,
					      uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return NULL;
	return (const int32_t *)(k->arena + k->pos_off[layer]) +
	       (k->hstart ? k->hstart[(size_t)layer * k->info.h_store + head]
			  : (size_t)head * k->info.capacity);
}

SKV_EXPORT int skv_cache_budget(const struct skv_cache *k, struct skv_cache_budget *ret)
{
	uint32_t n;

	if (!k || !ret || ret->budget_size < offsetof(struct skv_cache_budget, kept_min))
		return -EINVAL;
	n = ret->budget_size < sizeof(*ret) ? ret->budget_size : (uint32_t)sizeof(*ret);
	memcpy(ret, &k->budget, n);
	ret->budget_size = n;
	if (!k->hkept) {
		ret->kept_min = k->info.kept;
		ret->kept_mean = (float)k->info.kept;
	}
	return 0;
}

SKV_EXPORT uint32_t skv_cache_head_kept(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return 0;
	return k->hkept ? k->hkept[(size_t)layer * k->info.h_store + head] : k->info.kept;
}

SKV_EXPORT uint32_t skv_cache_head_capacity(const struct skv_cache *k, uint32_t layer,
					    uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return 0;
	return skv_cache_head_kept(k, layer, head) + (k->info.capacity - k->info.kept);
}

SKV_EXPORT int64_t skv_cache_head_start(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return -1;
	if (k->hstart)
		return (int64_t)k->hstart[(size_t)layer * k->info.h_store + head];
	return k->info.layout == SKV_LAYOUT_HND ? (int64_t)head * k->info.capacity : -1;
}

/* Min (which 0) or mean (1) over a layer's heads, NaN heads skipped. */
static float layer_mass(const struct skv_cache *k, uint32_t layer, int which)
{
	float mn = 0.0f / 0.0f, sum = 0;
	uint32_t n = 0;

	if (!k || layer >= k->info.layers)
		return 0.0f / 0.0f;
	if (k->lmass)
		return k->lmass[(size_t)which * k->info.layers + layer];
	for (uint32_t h = 0; h < k->info.h_store; h++) {
		float m = k->mass[(size_t)layer * k->info.h_store + h];

		if (m != m)
			continue;
		mn = n == 0 || m < mn ? m : mn;
		sum += m;
		n++;
	}
	return which ? (n ? sum / (float)n : 0.0f / 0.0f) : mn;
}

SKV_EXPORT float skv_cache_layer_mass_min(const struct skv_cache *k, uint32_t layer)
{
	return layer_mass(k, layer, 0);
}

SKV_EXPORT float skv_cache_layer_mass_mean(const struct skv_cache *k, uint32_t layer)
{
	return layer_mass(k, layer, 1);
}

SKV_EXPORT float skv_cache_retained_mass(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return 0.0f / 0.0f;
	return k->mass[(size_t)layer * k->info.h_store + head];
}

SKV_EXPORT uint32_t skv_cache_next_slot(const struct skv_cache *k)
{
	return k ? k->info.kept + k->info.appended : 0;
}

SKV_EXPORT uint32_t skv_cache_next_position(const struct skv_cache *k)
{
	return k ? k->info.prompt_len + k->info.appended : 0;
}
