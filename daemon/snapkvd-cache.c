// SPDX-License-Identifier: MIT
/* snapkvd-cache.c - cache objects and their region layout; see snapkvd-cache.h. */
#include "snapkvd-cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/skv-cuda.h" /* struct skv_cuda_copy */

#include "snapkvd-arena.h"
#include "snapkvd-cleanup.h"

static uint64_t align64(uint64_t v)
{
	return (v + 63) & ~63ull;
}

int snapkvd_cache_geometry(uint32_t layers, uint32_t h_store, uint32_t slots, uint32_t head_dim,
			   uint32_t dtype_bytes, uint64_t max_region,
			   struct snapkvd_cache_geom *ret)
{
	uint64_t rows = (uint64_t)h_store * slots, kv, pos, layer, region;

	/* rows < 2^64 always (two 32-bit factors); the rest is checked */
	if (__builtin_mul_overflow(rows, (uint64_t)head_dim * dtype_bytes, &kv) ||
	    __builtin_mul_overflow(rows, 4, &pos) || kv > UINT64_MAX - 63)
		return -E2BIG;
	kv = align64(kv);
	pos = align64(pos);
	if (__builtin_mul_overflow(kv, 2, &layer) || __builtin_add_overflow(layer, pos, &layer) ||
	    __builtin_mul_overflow(layer, (uint64_t)layers, &region))
		return -E2BIG;
	region = snapkvd_arena_round(region);
	if (!region || region > max_region)
		return -E2BIG;
	*ret = (struct snapkvd_cache_geom){.kv_bytes = kv, .pos_bytes = pos, .region = region};
	return 0;
}

int snapkvd_cache_geometry_paged(uint32_t layers, uint32_t h_store, uint32_t slots,
				 uint32_t head_dim, uint32_t dtype_bytes, uint32_t block_size,
				 bool writeback, uint64_t max_region,
				 struct snapkvd_cache_geom *ret)
{
	uint64_t blocks, block_bytes, run = 0, pos, all, region;

	if (!block_size)
		return -EINVAL;
	blocks = ((uint64_t)slots + block_size - 1) / block_size;
	if (blocks > UINT32_MAX ||
	    __builtin_mul_overflow((uint64_t)block_size * h_store, (uint64_t)head_dim * dtype_bytes,
				   &block_bytes) ||
	    __builtin_mul_overflow(blocks, block_bytes, &run) ||
	    run > UINT64_MAX - SNAPKVD_ARENA_ALIGN ||
	    __builtin_mul_overflow((uint64_t)h_store * slots, 4, &pos) || pos > UINT64_MAX - 63)
		return -E2BIG;
	run = writeback ? 0 : snapkvd_arena_round(run);
	pos = align64(pos);
	if (__builtin_mul_overflow(run, 2, &all) || __builtin_add_overflow(all, pos, &all) ||
	    __builtin_mul_overflow(all, (uint64_t)layers, &region) ||
	    region > UINT64_MAX - SNAPKVD_ARENA_ALIGN)
		return -E2BIG;
	region = snapkvd_arena_round(region);
	if (!region || region > max_region)
		return -E2BIG;
	*ret = (struct snapkvd_cache_geom){.kv_bytes = run,
					   .pos_bytes = pos,
					   .region = region,
					   .kv_first = true,
					   .n_blocks = (uint32_t)blocks};
	return 0;
}

void snapkvd_region_layer(uint64_t off, uint32_t layers, uint32_t l,
			  const struct snapkvd_cache_geom *g, bool gpu_kv, uint64_t *ret_k,
			  uint64_t *ret_v, uint64_t *ret_pos)
{
	if (gpu_kv || g->kv_first) {
		*ret_k = off + (uint64_t)l * 2 * g->kv_bytes;
		*ret_pos = off + (uint64_t)layers * 2 * g->kv_bytes + (uint64_t)l * g->pos_bytes;
	} else {
		*ret_k = off + (uint64_t)l * (2 * g->kv_bytes + g->pos_bytes);
		*ret_pos = *ret_k + 2 * g->kv_bytes;
	}
	*ret_v = *ret_k + g->kv_bytes;
}

int snapkvd_cache_new(uint32_t layers, uint32_t h_store, struct snapkvd_cache **ret)
{
	_cleanup_(snapkvd_cache_freep) struct snapkvd_cache *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->layers = layers;
	c->h_store = h_store;
	c->k_off = calloc(layers, sizeof(uint64_t));
	c->v_off = calloc(layers, sizeof(uint64_t));
	c->pos_off = calloc(layers, sizeof(uint64_t));
	c->mass = calloc((size_t)layers * h_store, sizeof(float));
	c->kv_scale = calloc((size_t)layers * 2, sizeof(float));
	c->layer_mass = calloc((size_t)layers * 2, sizeof(float));
	c->layer_kept = calloc(layers, sizeof(uint64_t));
	if (!c->k_off || !c->v_off || !c->pos_off || !c->mass || !c->layer_mass || !c->layer_kept ||
	    !c->kv_scale)
		return -ENOMEM;
	*ret = TAKE_PTR(c);
	return 0;
}

void snapkvd_cache_free(struct snapkvd_cache *c)
{
	if (!c)
		return;
	free(c->k_off);
	free(c->v_off);
	free(c->pos_off);
	free(c->mass);
	free(c->kv_scale);
	free(c->hkept);
	free(c->hstart);
	free(c->layer_mass);
	free(c->layer_kept);
	free(c->tallied);
	free(c->wb_table);
	free(c->wb_pools);
	free(c);
}

void snapkvd_cache_freep(struct snapkvd_cache **c)
{
	snapkvd_cache_free(*c);
}

uint32_t snapkvd_cache_head_kept(const struct snapkvd_cache *c, uint32_t l, uint32_t h)
{
	return c->hkept ? c->hkept[(size_t)l * c->h_store + h] : c->kept;
}

void snapkvd_cache_summarise(struct snapkvd_cache *c)
{
	for (uint32_t l = 0; l < c->layers; l++) {
		float mn = __builtin_nanf(""), sum = 0;
		uint32_t n = 0;

		c->layer_kept[l] = 0;
		for (uint32_t h = 0; h < c->h_store; h++) {
			float m = c->mass[(size_t)l * c->h_store + h];

			c->layer_kept[l] += snapkvd_cache_head_kept(c, l, h);
			if (m != m)
				continue;
			mn = n == 0 || m < mn ? m : mn;
			sum += m;
			n++;
		}
		c->layer_mass[l] = mn;
		c->layer_mass[c->layers + l] = n ? sum / (float)n : __builtin_nanf("");
	}
}

int snapkvd_cache_budget_arrays(struct snapkvd_cache *c)
{
	size_t n = (size_t)c->layers * c->h_store;

	c->hkept = calloc(n, sizeof(*c->hkept));
	c->hstart = calloc(n, sizeof(*c->hstart));
	return c->hkept && c->hstart ? 0 : -ENOMEM;
}

/* A ragged cache's head starts: cap_h = hkept + the decode reserve. */
static void ragged_starts(struct snapkvd_cache *c)
{
	uint32_t res = c->slots - c->kept;

	for (uint32_t l = 0; l < c->layers; l++) {
		uint64_t st = 0;

		for (uint32_t h = 0; h < c->h_store; h++) {
			size_t i = (size_t)l * c->h_store + h;

			c->hstart[i] = st;
			st += (uint64_t)c->hkept[i] + res;
		}
	}
}

uint64_t snapkvd_cache_pos_index(const struct snapkvd_cache *c, uint32_t l, uint32_t h, uint32_t i)
{
	if (c->ragged)
		return c->hstart[(size_t)l * c->h_store + h] + i;
	return (uint64_t)h * c->slots + i;
}

/* One head's rows and positions from `src` to `dst` (rows from the layer's
 * start; dst <= src, so heads move in ascending order), decode slots -1.
 * moves: K/V in the GPU arena, each head's K and V move is queued there
 * (n_moves of them) for the device instead of done here. */
struct settle_move {
	uint8_t *k, *v;
	int32_t *pos;
	size_t row;
	bool kv; /* HND: the K/V rows move too */
	struct skv_cuda_copy *moves;
	uint32_t n_moves;
};

static void settle_rows(struct settle_move *m, uint8_t *t, uint64_t src, uint64_t dst, uint32_t n)
{
	uint64_t bytes = (uint64_t)n * m->row;

	if (!m->moves) {
		memmove(t + dst * m->row, t + src * m->row, bytes);
		return;
	}
	m->moves[m->n_moves++] = (struct skv_cuda_copy){.dst = t + dst * m->row,
							.src = t + src * m->row,
							.width = bytes,
							.height = 1,
							.dpitch = bytes,
							.spitch = bytes};
}

static void settle_head(struct settle_move *m, uint64_t src, uint64_t dst, uint32_t n, uint32_t res)
{
	if (m->kv && src != dst && n) {
		settle_rows(m, m->k, src, dst, n);
		settle_rows(m, m->v, src, dst, n);
	}
	if (src != dst)
		memmove(m->pos + dst, m->pos + src, (size_t)n * 4);
	for (uint32_t i = 0; i < res; i++)
		m->pos[dst + n + i] = -1;
}

/*
 * A PAGED cache after its budget mode chose (every head keeps c->kept; the
 * rows sit in their blocks already, row i in block i / block_size): the
 * blocks that hold its slots. Arena: the run's first ceil(slots /
 * block_size) blocks, run_bytes their page-rounded bytes (the rest of the
 * region's run, sized for the most a head could keep, stays allocated and
 * zero; a GROW copies only these). Writeback: the first such entries of
 * the engine's table (at most its length); the engine's other blocks were
 * never written.
 */
static void paged_used(struct snapkvd_cache *c)
{
	uint64_t n = ((uint64_t)c->slots + c->block_size - 1) / c->block_size;

	if (c->writeback) {
		c->n_blocks = n < c->n_blocks ? (uint32_t)n : c->n_blocks;
		return;
	}
	c->n_blocks = (uint32_t)n;
	c->run_bytes =
	    snapkvd_arena_round(n * c->block_size * c->h_store * c->head_dim * c->dtype_bytes);
}

uint32_t snapkvd_cache_settle(struct snapkvd_cache *c, uint8_t *kv_base, uint8_t *host_base,
			      struct skv_cuda_copy *moves)
{
	size_t n = (size_t)c->layers * c->h_store;
	uint32_t room = c->slots, res = c->slots - c->kept, most = 0, n_moves = 0;

	for (size_t i = 0; i < n; i++)
		most = c->hkept[i] > most ? c->hkept[i] : most;
	c->kept = c->ragged ? most : c->hkept[0];
	c->slots = c->kept + res;
	if (c->ragged)
		ragged_starts(c);
	for (uint32_t l = 0; l < c->layers; l++) {
		struct settle_move m = {.k = kv_base + c->k_off[l],
					.v = kv_base + c->v_off[l],
					.pos = (int32_t *)(host_base + c->pos_off[l]),
					.row = (size_t)c->head_dim * c->dtype_bytes,
					.kv = c->layout == SNAPKVD_LAYOUT_HND,
					.moves = moves ? moves + n_moves : NULL};

		for (uint32_t h = 0; h < c->h_store; h++) {
			size_t i = (size_t)l * c->h_store + h;

			settle_head(&m, (uint64_t)h * room, snapkvd_cache_pos_index(c, l, h, 0),
				    c->hkept[i], res);
		}
		n_moves += m.n_moves;
	}
	if (c->layout == SNAPKVD_LAYOUT_HND)
		c->head_stride = c->ragged ? 0 : (int64_t)c->slots * c->head_dim;
	if (c->layout == SNAPKVD_LAYOUT_PAGED)
		paged_used(c);
	return n_moves;
}

uint32_t snapkvd_cache_budget_done(struct snapkvd_cache *c, const struct skv_budget_result *res,
				   uint8_t *kv_base, uint8_t *host_base,
				   struct skv_cuda_copy *moves)
{
	c->c_star = res->c_star;
	c->fallback = res->fallback != 0;
	c->mass_choice = res->min_mass;
	/* heads keep different counts, unless all kept all L (fallback) */
	c->ragged = !c->fallback &&
		    (c->budget_mode == SKV_BUDGET_LAYERS || c->budget_mode == SKV_BUDGET_HEADS ||
		     c->budget_mode == SKV_BUDGET_MASS_HEADS);
	return snapkvd_cache_settle(c, kv_base, host_base, moves);
}

bool snapkvd_cache_shrink(struct snapkvd_cache *c, uint8_t *host_base, struct snapkvd_cache_geom *g)
{
	struct snapkvd_cache_geom n;
	size_t kv, pos;

	if (!c->budgeted || c->ragged || c->gpu_kv || c->layout == SNAPKVD_LAYOUT_PAGED ||
	    snapkvd_cache_geometry(c->layers, c->h_store, c->slots, c->head_dim, c->dtype_bytes,
				   g->region, &n) < 0 ||
	    n.region >= g->region)
		return false;
	/* the settled rows of a layer are the prefix of its K, V and positions;
	 * each new place is at or below the old one, so layers move in order */
	kv = (size_t)c->h_store * c->slots * c->head_dim * c->dtype_bytes;
	pos = (size_t)c->h_store * c->slots * 4;
	for (uint32_t l = 0; l < c->layers; l++) {
		uint64_t k, v, p;

		snapkvd_region_layer(c->region_off, c->layers, l, &n, false, &k, &v, &p);
		memmove(host_base + k, host_base + c->k_off[l], kv);
		memmove(host_base + v, host_base + c->v_off[l], kv);
		memmove(host_base + p, host_base + c->pos_off[l], pos);
		c->k_off[l] = k;
		c->v_off[l] = v;
		c->pos_off[l] = p;
	}
	*g = n;
	return true;
}

void snapkvd_cache_place(struct snapkvd_cache *c, uint64_t off, uint32_t slots,
			 const struct snapkvd_cache_geom *g)
{
	c->region_off = off;
	c->region_bytes = g->region;
	c->slots = slots;
	if (c->layout == SNAPKVD_LAYOUT_PAGED) {
		/* [block][row][head][dim]; writeback keeps the engine's strides
		 * and offsets, set when the request was read */
		if (!c->writeback) {
			c->head_stride = c->head_dim;
			c->token_stride = (int64_t)c->h_store * c->head_dim;
			c->block_stride = c->token_stride * c->block_size;
			c->run_bytes = g->kv_bytes;
			c->n_blocks = g->n_blocks;
		}
		for (uint32_t l = 0; l < c->layers; l++) {
			uint64_t k, v;

			snapkvd_region_layer(off, c->layers, l, g, c->gpu_kv, &k, &v,
					     &c->pos_off[l]);
			if (!c->writeback) {
				c->k_off[l] = k;
				c->v_off[l] = v;
			}
		}
		return;
	}
	if (c->layout == SNAPKVD_LAYOUT_HND) {
		c->head_stride = c->ragged ? 0 : (int64_t)slots * c->head_dim;
		c->token_stride = c->head_dim;
		if (c->ragged)
			ragged_starts(c);
	} else {
		c->head_stride = c->head_dim;
		c->token_stride = (int64_t)c->h_store * c->head_dim;
	}
	for (uint32_t l = 0; l < c->layers; l++)
		snapkvd_region_layer(off, c->layers, l, g, c->gpu_kv, &c->k_off[l], &c->v_off[l],
				     &c->pos_off[l]);
}

/* Layer l's positions: each head's filled slots copied, its decode slots -1
 * (ragged: at its own start, cap_h = kept_h + res). */
static void grow_layer_positions(const struct snapkvd_grow *g, uint32_t l, int32_t *np,
				 const int32_t *op)
{
	uint64_t os = 0, ns = 0;

	for (uint32_t h = 0; h < g->h_store; h++) {
		uint32_t n = g->used, cap = g->slots, old_cap = g->old_slots;

		if (g->hkept) {
			uint32_t kept = g->hkept[(size_t)l * g->h_store + h];

			n = kept + g->appended;
			cap = kept + g->res;
			old_cap = kept + g->old_res;
		}
		memcpy(np + ns, op + os, (size_t)n * 4);
		for (uint32_t i = n; i < cap; i++)
			np[ns + i] = -1;
		os += old_cap;
		ns += cap;
	}
}

void snapkvd_grow_positions(const struct snapkvd_grow *g, uint8_t *host_base)
{
	for (uint32_t l = 0; l < g->layers; l++) {
		uint64_t k, v, p;

		snapkvd_region_layer(g->off, g->layers, l, &g->geom, g->gpu, &k, &v, &p);
		grow_layer_positions(g, l, (int32_t *)(host_base + p),
				     (const int32_t *)(host_base + g->old_pos[l]));
	}
}

/* Head h of a ragged layer (K/V at k and v in the new region): its kept and
 * appended rows, K then V, from its old start *os to its new one *ns, which
 * then advance to head h + 1's (each head's decode reserve old_res, then res). */
static void ragged_head(const struct snapkvd_grow *g, uint32_t l, uint32_t h, uint8_t *k,
			uint8_t *v, uint8_t *base, uint64_t *os, uint64_t *ns,
			struct skv_cuda_copy *ret)
{
	uint32_t kept = g->hkept[(size_t)l * g->h_store + h];
	uint64_t bytes = ((uint64_t)kept + g->appended) * g->row;

	ret[0] = (struct skv_cuda_copy){.dst = k + *ns * g->row,
					.src = base + g->old_k[l] + *os * g->row,
					.width = bytes,
					.height = 1,
					.dpitch = bytes,
					.spitch = bytes};
	ret[1] = ret[0];
	ret[1].dst = v + *ns * g->row;
	ret[1].src = base + g->old_v[l] + *os * g->row;
	*os += (uint64_t)kept + g->old_res;
	*ns += (uint64_t)kept + g->res;
}

/*
 * HND has h_store rows of `used` slots, each head `slots` apart; NHD's
 * first `used` slots hold every head and are contiguous; PAGED copies the
 * old runs whole; a ragged layer one copy per (head, tensor).
 */
uint32_t snapkvd_grow_copies(const struct snapkvd_grow *g, uint32_t l, uint8_t *base,
			     struct skv_cuda_copy *ret)
{
	size_t row = g->row;
	uint64_t k, v, p;

	snapkvd_region_layer(g->off, g->layers, l, &g->geom, g->gpu, &k, &v, &p);
	if (g->hkept) {
		uint64_t os = 0, ns = 0;

		for (uint32_t h = 0; h < g->h_store; h++)
			ragged_head(g, l, h, base + k, base + v, base, &os, &ns, ret + 2 * h);
		return 2 * g->h_store;
	}
	if (g->paged) /* the same blocks, more of them: the old run as is */
		ret[0] = (struct skv_cuda_copy){.dst = base + k,
						.src = base + g->old_k[l],
						.width = g->old_run,
						.height = 1,
						.dpitch = g->old_run,
						.spitch = g->old_run};
	else
		ret[0] = (struct skv_cuda_copy){
		    .dst = base + k,
		    .src = base + g->old_k[l],
		    .width = (uint64_t)g->used * row * (g->hnd ? 1 : g->h_store),
		    .height = g->hnd ? g->h_store : 1,
		    .dpitch = (uint64_t)g->slots * row,
		    .spitch = (uint64_t)g->old_slots * row,
		};
	ret[1] = ret[0];
	ret[1].dst = base + v;
	ret[1].src = base + g->old_v[l];
	return 2;
}

/* One K or V tensor of kv_bytes at t whose first `from` slots of every
 * head hold rows: zero the rest (HND: each head's slots [from, slots), then
 * the tail; NHD and PAGED: everything from slot `from` on). */
static void zero_tensor(uint8_t *t, uint64_t kv_bytes, bool hnd, uint32_t h_store, uint32_t slots,
			uint32_t from, size_t row)
{
	uint64_t end = (uint64_t)h_store * slots * row;

	if (hnd) {
		for (uint32_t h = 0; h < h_store && from < slots; h++)
			memset(t + ((uint64_t)h * slots + from) * row, 0,
			       (uint64_t)(slots - from) * row);
	} else {
		end = (uint64_t)from * h_store * row;
	}
	if (end < kv_bytes)
		memset(t + end, 0, kv_bytes - end);
}

/* Layer positions at p: the padding after the h_store x slots entries. */
static void zero_pos_pad(uint8_t *p, uint32_t h_store, uint32_t slots, uint64_t pos_bytes)
{
	uint64_t used = (uint64_t)h_store * slots * 4;

	if (used < pos_bytes)
		memset(p + used, 0, pos_bytes - used);
}

/* The region's tail: after the last layer's positions (the last thing in
 * the region whatever the layout) to its end. */
static void zero_tail(uint8_t *base, uint64_t last_pos, uint64_t pos_bytes, uint64_t end)
{
	if (last_pos + pos_bytes < end)
		memset(base + last_pos + pos_bytes, 0, end - last_pos - pos_bytes);
}

/* A dirty GROW region: what the copies below do not write, zero first. */
static void grow_zero(const struct snapkvd_grow *g, uint8_t *base)
{
	uint64_t k, v, p = 0;

	if (g->hkept) { /* ragged: every layer's K, V (host arena) and positions whole */
		for (uint32_t l = 0; l < g->layers; l++) {
			snapkvd_region_layer(g->off, g->layers, l, &g->geom, g->gpu, &k, &v, &p);
			if (!g->gpu) {
				memset(base + k, 0, g->geom.kv_bytes);
				memset(base + v, 0, g->geom.kv_bytes);
			}
			memset(base + p, 0, g->geom.pos_bytes);
		}
		zero_tail(base, p, g->geom.pos_bytes, g->off + g->geom.region);
		return;
	}

	for (uint32_t l = 0; l < g->layers; l++) {
		snapkvd_region_layer(g->off, g->layers, l, &g->geom, g->gpu, &k, &v, &p);
		zero_pos_pad(base + p, g->h_store, g->slots, g->geom.pos_bytes);
		if (g->gpu || !g->geom.kv_bytes)
			continue;
		if (g->paged) { /* the old run is copied whole */
			memset(base + k + g->old_run, 0, g->geom.kv_bytes - g->old_run);
			memset(base + v + g->old_run, 0, g->geom.kv_bytes - g->old_run);
			continue;
		}
		zero_tensor(base + k, g->geom.kv_bytes, g->hnd, g->h_store, g->slots, g->used,
			    g->row);
		zero_tensor(base + v, g->geom.kv_bytes, g->hnd, g->h_store, g->slots, g->used,
			    g->row);
	}
	zero_tail(base, p, g->geom.pos_bytes, g->off + g->geom.region);
}

/* zero_unwritten of a ragged cache (HND): each head's decode rows, then
 * every row and position after the layer's last head (K/V in the GPU arena
 * are not in this region: its positions only). */
static void zero_ragged(const struct snapkvd_cache *c, const struct snapkvd_cache_geom *g,
			uint8_t *host_base)
{
	size_t row = (size_t)c->head_dim * c->dtype_bytes;
	uint32_t res = c->slots - c->kept;

	for (uint32_t l = 0; l < c->layers; l++) {
		size_t last = (size_t)l * c->h_store + c->h_store - 1;
		uint64_t end = c->hstart[last] + c->hkept[last] + res;

		for (uint32_t h = 0; !c->gpu_kv && h < c->h_store; h++) {
			size_t i = (size_t)l * c->h_store + h;
			uint64_t at = (c->hstart[i] + c->hkept[i]) * row;

			memset(host_base + c->k_off[l] + at, 0, (size_t)res * row);
			memset(host_base + c->v_off[l] + at, 0, (size_t)res * row);
		}
		if (!c->gpu_kv && end * row < g->kv_bytes) {
			memset(host_base + c->k_off[l] + end * row, 0, g->kv_bytes - end * row);
			memset(host_base + c->v_off[l] + end * row, 0, g->kv_bytes - end * row);
		}
		if (end * 4 < g->pos_bytes)
			memset(host_base + c->pos_off[l] + end * 4, 0, g->pos_bytes - end * 4);
	}
	zero_tail(host_base, c->pos_off[c->layers - 1], g->pos_bytes,
		  c->region_off + c->region_bytes);
}

void snapkvd_cache_zero_unwritten(const struct snapkvd_cache *c, const struct snapkvd_cache_geom *g,
				  uint8_t *host_base)
{
	bool hnd = c->layout == SNAPKVD_LAYOUT_HND;

	if (c->ragged) {
		zero_ragged(c, g, host_base);
		return;
	}
	/* K/V in the GPU arena or the engine's buffer are not in this region;
	 * a layout whose heads are not `slots` apart is not one this knows */
	bool kv = !c->gpu_kv && !c->writeback && g->kv_bytes &&
		  (!hnd || c->head_stride == (int64_t)c->slots * c->head_dim);
	size_t row = (size_t)c->head_dim * c->dtype_bytes;

	for (uint32_t l = 0; kv && l < c->layers; l++) {
		zero_tensor(host_base + c->k_off[l], g->kv_bytes, hnd, c->h_store, c->slots,
			    c->kept, row);
		zero_tensor(host_base + c->v_off[l], g->kv_bytes, hnd, c->h_store, c->slots,
			    c->kept, row);
	}
	for (uint32_t l = 0; l < c->layers; l++)
		zero_pos_pad(host_base + c->pos_off[l], c->h_store, c->slots, g->pos_bytes);
	zero_tail(host_base, c->pos_off[c->layers - 1], g->pos_bytes,
		  c->region_off + c->region_bytes);
}

static void run_copies(const struct skv_cuda_copy *cp, uint32_t n)
{
	for (uint32_t t = 0; t < n; t++)
		for (uint64_t y = 0; y < cp[t].height; y++)
			memcpy((uint8_t *)cp[t].dst + y * cp[t].dpitch,
			       (const uint8_t *)cp[t].src + y * cp[t].spitch, cp[t].width);
}

void snapkvd_grow_host(const struct snapkvd_grow *g, uint8_t *host_base)
{
	struct skv_cuda_copy cp[2];

	if (g->dirty)
		grow_zero(g, host_base);
	for (uint32_t l = 0; l < g->layers; l++) {
		uint64_t k, v, p, os = 0, ns = 0;

		if (!g->hkept) {
			run_copies(cp, snapkvd_grow_copies(g, l, host_base, cp));
			continue;
		}
		/* ragged: head by head (snapkvd_grow_copies would need 2 h_store) */
		snapkvd_region_layer(g->off, g->layers, l, &g->geom, g->gpu, &k, &v, &p);
		for (uint32_t h = 0; h < g->h_store; h++) {
			ragged_head(g, l, h, host_base + k, host_base + v, host_base, &os, &ns, cp);
			run_copies(cp, 2);
		}
	}
	snapkvd_grow_positions(g, host_base);
}
