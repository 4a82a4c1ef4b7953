// SPDX-License-Identifier: MIT
/* test-cache: the cache region's size and layout formula, its overflow
 * limits, and the GROW copies (daemon/snapkvd-cache.c). */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-cache.c"
#include "tests/test-skip.h"
#include "kernels/cuda/skv-cuda.h"

static void test_geometry(void)
{
	struct snapkvd_cache_geom g;

	/* 2 layers, 4 heads, 10 slots, D 64, 2 bytes: K = 4*10*64*2 = 5120
	 * (64-aligned), positions 4*10*4 = 160 -> 192; layer 2*5120+192 */
	CU_ASSERT_EQUAL(snapkvd_cache_geometry(2, 4, 10, 64, 2, 1ull << 30, &g), 0);
	CU_ASSERT_EQUAL(g.kv_bytes, 5120);
	CU_ASSERT_EQUAL(g.pos_bytes, 192);
	CU_ASSERT_EQUAL(g.region, 24576); /* 2 * 10432 = 20864, page-rounded */
	/* one slot of one head, D 1, 1 byte: everything rounds up */
	CU_ASSERT_EQUAL(snapkvd_cache_geometry(1, 1, 1, 1, 1, 1ull << 30, &g), 0);
	CU_ASSERT_EQUAL(g.kv_bytes, 64);
	CU_ASSERT_EQUAL(g.pos_bytes, 64);
	CU_ASSERT_EQUAL(g.region, SNAPKVD_ARENA_ALIGN);
}

static void test_limits(void)
{
	struct snapkvd_cache_geom g = {.kv_bytes = 1, .pos_bytes = 2, .region = 3};

	/* exactly the arena: fits; one page less: does not */
	CU_ASSERT_EQUAL(snapkvd_cache_geometry(2, 4, 10, 64, 2, 24576, &g), 0);
	CU_ASSERT_EQUAL(snapkvd_cache_geometry(2, 4, 10, 64, 2, 24575, &g), -E2BIG);
	/* K/V bytes overflow 64 bits: rows (2^32-1)^2 times D * bytes */
	CU_ASSERT_EQUAL(
	    snapkvd_cache_geometry(1, UINT32_MAX, UINT32_MAX, UINT32_MAX, 8, UINT64_MAX, &g),
	    -E2BIG);
	/* the layer fits, times the layers does not */
	CU_ASSERT_EQUAL(
	    snapkvd_cache_geometry(UINT32_MAX, 1u << 16, 1u << 16, 1u << 10, 8, UINT64_MAX, &g),
	    -E2BIG);
	/* D x bytes near 2^64: twice the K/V overflows */
	CU_ASSERT_EQUAL(snapkvd_cache_geometry(1, 1, 1, UINT32_MAX, UINT32_MAX, UINT64_MAX, &g),
			-E2BIG);
	/* positions of 2^62 rows overflow */
	CU_ASSERT_EQUAL(snapkvd_cache_geometry(1, 1u << 31, 1u << 31, 1, 1, UINT64_MAX, &g),
			-E2BIG);
	/* a failure leaves *ret alone */
	CU_ASSERT_EQUAL(g.kv_bytes, 5120);
}

static void test_layout(void)
{
	struct snapkvd_cache_geom g = {.kv_bytes = 1000, .pos_bytes = 100, .region = 8192};
	uint64_t k, v, p;

	/* host arena: K, V, positions of each layer in turn */
	snapkvd_region_layer(4096, 3, 1, &g, false, &k, &v, &p);
	CU_ASSERT_EQUAL(k, 4096 + 2100);
	CU_ASSERT_EQUAL(v, 4096 + 3100);
	CU_ASSERT_EQUAL(p, 4096 + 4100);
	/* GPU arena: every K/V first, then every layer's positions */
	snapkvd_region_layer(4096, 3, 1, &g, true, &k, &v, &p);
	CU_ASSERT_EQUAL(k, 4096 + 2000);
	CU_ASSERT_EQUAL(v, 4096 + 3000);
	CU_ASSERT_EQUAL(p, 4096 + 6000 + 100);
}

static void test_place(void)
{
	struct snapkvd_cache *c;
	struct snapkvd_cache_geom g;

	CU_ASSERT_EQUAL_FATAL(snapkvd_cache_new(2, 4, &c), 0);
	c->head_dim = 64;
	CU_ASSERT_EQUAL(snapkvd_cache_geometry(2, 4, 10, 64, 2, 1ull << 30, &g), 0);
	c->layout = SNAPKVD_LAYOUT_HND;
	snapkvd_cache_place(c, 8192, 10, &g);
	CU_ASSERT_EQUAL(c->region_off, 8192);
	CU_ASSERT_EQUAL(c->region_bytes, g.region);
	CU_ASSERT_EQUAL(c->head_stride, 640);
	CU_ASSERT_EQUAL(c->token_stride, 64);
	CU_ASSERT_EQUAL(c->k_off[1], 8192 + 2 * 5120 + 192);
	CU_ASSERT_EQUAL(c->pos_off[0], 8192 + 2 * 5120);
	c->layout = SNAPKVD_LAYOUT_NHD;
	snapkvd_cache_place(c, 0, 10, &g);
	CU_ASSERT_EQUAL(c->head_stride, 64);
	CU_ASSERT_EQUAL(c->token_stride, 256);
	snapkvd_cache_free(c);
	snapkvd_cache_free(NULL);
}

/* GROW of one layer, two heads, HND, 1-byte rows: 3 of 4 slots to 6. */
static void test_grow(void)
{
	uint8_t base[4096] = {0};
	uint64_t old_k = 0, old_v = 64, old_pos = 128;
	struct snapkvd_grow gr = {
	    .geom = {.kv_bytes = 64, .pos_bytes = 64, .region = 4096},
	    .off = 1024,
	    .slots = 6,
	    .old_slots = 4,
	    .used = 3,
	    .layers = 1,
	    .h_store = 2,
	    .row = 1,
	    .hnd = true,
	    .old_k = &old_k,
	    .old_v = &old_v,
	    .old_pos = &old_pos,
	};
	int32_t *op = (int32_t *)(base + old_pos), *np = (int32_t *)(base + 1024 + 128);

	for (int h = 0; h < 2; h++)
		for (int i = 0; i < 4; i++) {
			base[old_k + h * 4 + i] = (uint8_t)(10 * h + i + 1);
			base[old_v + h * 4 + i] = (uint8_t)(100 + 10 * h + i);
			op[h * 4 + i] = 7 * h + i;
		}
	snapkvd_grow_host(&gr, base);
	for (int h = 0; h < 2; h++) {
		for (int i = 0; i < 3; i++) {
			CU_ASSERT_EQUAL(base[1024 + h * 6 + i], 10 * h + i + 1);
			CU_ASSERT_EQUAL(base[1024 + 64 + h * 6 + i], 100 + 10 * h + i);
			CU_ASSERT_EQUAL(np[h * 6 + i], 7 * h + i);
		}
		for (int i = 3; i < 6; i++)
			CU_ASSERT_EQUAL(np[h * 6 + i], -1);
	}
}

/* Bytes of [from, to) of base all equal to v. */
static bool all(const uint8_t *base, uint64_t from, uint64_t to, uint8_t v)
{
	for (uint64_t i = from; i < to; i++)
		if (base[i] != v)
			return false;
	return true;
}

/* A dirty region (earlier caches' bytes, here 0xee): after the compaction
 * the kept rows are as the kernels wrote them (0x5a), the decode headroom,
 * the padding and the region's tail read as zero, the positions as set. */
static void test_zero_unwritten(void)
{
	struct snapkvd_cache_geom g;
	struct snapkvd_cache *c = NULL;
	uint8_t *base = malloc(3 * 4096);
	const uint64_t off = 4096;

	CU_ASSERT_FATAL(base != NULL);
	for (int layout = SNAPKVD_LAYOUT_HND; layout <= SNAPKVD_LAYOUT_NHD; layout++) {
		/* 2 layers, 3 heads, 10 slots (7 kept), D 4, f32: K 480 -> 512 */
		CU_ASSERT_EQUAL_FATAL(snapkvd_cache_geometry(2, 3, 10, 4, 4, 1 << 20, &g), 0);
		CU_ASSERT_EQUAL_FATAL(snapkvd_cache_new(2, 3, &c), 0);
		c->layout = (enum snapkvd_layout)layout;
		c->head_dim = 4;
		c->dtype_bytes = 4;
		c->kept = 7;
		snapkvd_cache_place(c, off, 10, &g);
		memset(base, 0xee, 3 * 4096);
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t h = 0; h < 3; h++)
				for (uint32_t i = 0; i < 7; i++) {
					int64_t e = (int64_t)h * c->head_stride +
						    (int64_t)i * c->token_stride;

					memset(base + c->k_off[l] + e * 4, 0x5a, 16);
					memset(base + c->v_off[l] + e * 4, 0x5a, 16);
				}
		snapkvd_cache_zero_unwritten(c, &g, base);
		for (uint32_t l = 0; l < 2; l++) {
			uint64_t k = c->k_off[l], v = c->v_off[l];

			for (uint32_t h = 0; h < 3; h++)
				for (uint32_t i = 0; i < 10; i++) {
					int64_t e = (int64_t)h * c->head_stride +
						    (int64_t)i * c->token_stride;
					uint8_t want = i < 7 ? 0x5a : 0;

					CU_ASSERT_TRUE(all(base, k + e * 4, k + e * 4 + 16, want));
					CU_ASSERT_TRUE(all(base, v + e * 4, v + e * 4 + 16, want));
				}
			CU_ASSERT_TRUE(all(base, k + 480, k + 512, 0)); /* alignment */
			/* positions: 120 bytes the kernels and -1 fill, padding zero */
			CU_ASSERT_TRUE(all(base, c->pos_off[l], c->pos_off[l] + 120, 0xee));
			CU_ASSERT_TRUE(all(base, c->pos_off[l] + 120, c->pos_off[l] + 128, 0));
		}
		CU_ASSERT_TRUE(all(base, c->pos_off[1] + 128, off + g.region, 0)); /* tail */
		CU_ASSERT_TRUE(all(base, 0, off, 0xee)); /* outside: untouched */
		CU_ASSERT_TRUE(all(base, off + g.region, 3 * 4096, 0xee));
		snapkvd_cache_free(c);
	}
	free(base);
}

/* GROW into a dirty region: rows past the copied ones read as zero. */
static void test_grow_dirty(void)
{
	uint8_t base[4096];
	uint64_t old_k = 0, old_v = 64, old_pos = 128;
	struct snapkvd_grow gr = {
	    .geom = {.kv_bytes = 64, .pos_bytes = 64, .region = 1024},
	    .off = 1024,
	    .slots = 6,
	    .old_slots = 4,
	    .used = 3,
	    .layers = 1,
	    .h_store = 2,
	    .row = 1,
	    .hnd = true,
	    .dirty = true,
	    .old_k = &old_k,
	    .old_v = &old_v,
	    .old_pos = &old_pos,
	};

	memset(base, 0xee, sizeof(base));
	memset(base, 0x11, 256); /* the old cache: rows and positions */
	snapkvd_grow_host(&gr, base);
	for (int h = 0; h < 2; h++) {
		CU_ASSERT_TRUE(all(base, 1024 + h * 6, 1024 + h * 6 + 3, 0x11));
		CU_ASSERT_TRUE(all(base, 1024 + h * 6 + 3, 1024 + h * 6 + 6, 0));
		CU_ASSERT_TRUE(all(base, 1024 + 64 + h * 6 + 3, 1024 + 64 + h * 6 + 6, 0));
	}
	CU_ASSERT_TRUE(all(base, 1024 + 12, 1024 + 64, 0));
	CU_ASSERT_TRUE(all(base, 1024 + 128 + 48, 2048, 0)); /* padding and tail */
	CU_ASSERT_TRUE(all(base, 2048, sizeof(base), 0xee));
}

/* PAGED: runs are page multiples, all runs first, positions after; writeback
 * has no runs; block size 0 and overflow refused. */
static void test_paged(void)
{
	struct snapkvd_cache_geom g;
	struct snapkvd_cache *c = NULL;

	/* 2 layers, 2 heads, 100 slots, D 64, f32, blocks of 16: 7 blocks of 8 KiB */
	CU_ASSERT_EQUAL_FATAL(
	    snapkvd_cache_geometry_paged(2, 2, 100, 64, 4, 16, false, 1 << 30, &g), 0);
	CU_ASSERT_EQUAL(g.n_blocks, 7);
	CU_ASSERT_EQUAL(g.kv_bytes, 7 * 8192);
	CU_ASSERT(g.kv_first);
	CU_ASSERT_EQUAL(g.region % SNAPKVD_ARENA_ALIGN, 0);
	/* 3 slots of 2 heads x 10 dims f16 per block: 120 B, a run of one page */
	CU_ASSERT_EQUAL(snapkvd_cache_geometry_paged(1, 2, 5, 10, 2, 3, false, 1 << 30, &g), 0);
	CU_ASSERT_EQUAL(g.kv_bytes, SNAPKVD_ARENA_ALIGN);
	CU_ASSERT_EQUAL(g.n_blocks, 2);
	CU_ASSERT_EQUAL(snapkvd_cache_geometry_paged(2, 2, 100, 64, 4, 16, true, 1 << 30, &g), 0);
	CU_ASSERT_EQUAL(g.kv_bytes, 0);
	CU_ASSERT_EQUAL(g.region, SNAPKVD_ARENA_ALIGN); /* positions only */
	CU_ASSERT_EQUAL(snapkvd_cache_geometry_paged(2, 2, 100, 64, 4, 0, false, 1 << 30, &g),
			-EINVAL);
	CU_ASSERT_EQUAL(snapkvd_cache_geometry_paged(1000, 4096, UINT32_MAX, 4096, 4, 4096, false,
						     UINT64_MAX, &g),
			-E2BIG);
	CU_ASSERT_EQUAL(snapkvd_cache_geometry_paged(2, 2, 100, 64, 4, 16, false, 4096, &g),
			-E2BIG);
	/* placement: every run page-aligned at a page-aligned region */
	CU_ASSERT_EQUAL_FATAL(
	    snapkvd_cache_geometry_paged(3, 2, 100, 64, 2, 16, false, 1 << 30, &g), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_cache_new(3, 2, &c), 0);
	c->layout = SNAPKVD_LAYOUT_PAGED;
	c->head_dim = 64;
	c->block_size = 16;
	snapkvd_cache_place(c, 8192, 100, &g);
	CU_ASSERT_EQUAL(c->token_stride, 2 * 64);
	CU_ASSERT_EQUAL(c->block_stride, 16 * 2 * 64);
	CU_ASSERT_EQUAL(c->n_blocks, 7);
	for (uint32_t l = 0; l < 3; l++) {
		CU_ASSERT_EQUAL(c->k_off[l] % SNAPKVD_ARENA_ALIGN, 0);
		CU_ASSERT_EQUAL(c->v_off[l], c->k_off[l] + c->run_bytes);
		CU_ASSERT(c->pos_off[l] >= 8192 + 6 * c->run_bytes);
		CU_ASSERT(c->pos_off[l] + 4 * 2 * 100 <= 8192 + g.region);
	}
	snapkvd_cache_free(c);
}

/* Run copies in their order, each as if through a buffer (ctx_copy's contract). */
static void run_moves(const struct skv_cuda_copy *cp, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		for (uint64_t y = 0; y < cp[i].height; y++)
			memmove((uint8_t *)cp[i].dst + y * cp[i].dpitch,
				(const uint8_t *)cp[i].src + y * cp[i].spitch, cp[i].width);
}

/* A ragged budget cache (2 layers, 3 heads, room 10 = 8 kept + 2 reserve,
 * D 2, f32) as the kernels leave it: head h at rows h * 10. */
static struct snapkvd_cache *budget_cache(struct snapkvd_cache_geom *g, uint8_t *base, bool mass)
{
	static const uint32_t hk[6] = {8, 5, 3, 2, 7, 8};
	struct snapkvd_cache *c = NULL;

	CU_ASSERT_FATAL(snapkvd_cache_new(2, 3, &c) == 0);
	CU_ASSERT_FATAL(snapkvd_cache_geometry(2, 3, 10, 2, 4, 1 << 20, g) == 0);
	c->layout = SNAPKVD_LAYOUT_HND;
	c->head_dim = 2;
	c->dtype_bytes = 4;
	c->kept = 8;
	c->budgeted = true;
	c->budget_mode = mass ? SKV_BUDGET_MASS : SKV_BUDGET_HEADS;
	CU_ASSERT_FATAL(snapkvd_cache_budget_arrays(c) == 0);
	for (int i = 0; i < 6; i++)
		c->hkept[i] = mass ? 6 : hk[i];
	snapkvd_cache_place(c, 0, 10, g);
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t r = 0; r < 30; r++) {
			float *k = (float *)(base + c->k_off[l]) + r * 2,
			      *v = (float *)(base + c->v_off[l]) + r * 2;

			k[0] = k[1] = (float)(l * 1000 + r);
			v[0] = v[1] = (float)(l * 1000 + r) + 0.5f;
			((int32_t *)(base + c->pos_off[l]))[r] = (int32_t)(l * 100 + r);
		}
	return c;
}

/* A settle in the GPU arena (its K/V moves run in order, memmove-like, as
 * ctx_copy does) leaves the bytes a host-arena settle leaves, ragged
 * (heads) and packed (mass). */
static void test_settle_moves(void)
{
	for (int mass = 0; mass < 2; mass++) {
		struct skv_budget_result res = {.result_size = sizeof(res)};
		struct snapkvd_cache_geom g;
		uint8_t *a = calloc(1, 8192), *b = calloc(1, 8192);
		struct snapkvd_cache *ca = budget_cache(&g, a, mass),
				     *cb = budget_cache(&g, b, mass);
		struct skv_cuda_copy mv[12];
		uint32_t n;

		CU_ASSERT_EQUAL(snapkvd_cache_budget_done(ca, &res, a, a, NULL), 0);
		n = snapkvd_cache_budget_done(cb, &res, b, b, mv);
		/* K and V of every head whose start changed: ragged, layer 0's
		 * head 2 and layer 1's heads 1 and 2 (rows 20..27 to 13..20:
		 * its own rows overlap); packed, heads 1 and 2 of each layer */
		CU_ASSERT_EQUAL(n, mass ? 8 : 6);
		run_moves(mv, n);
		CU_ASSERT(!memcmp(a, b, 8192));
		CU_ASSERT_EQUAL(ca->ragged, !mass);
		CU_ASSERT_EQUAL(cb->kept, ca->kept);
		CU_ASSERT_EQUAL(cb->slots, mass ? 8 : 10);
		CU_ASSERT(!memcmp(ca->hstart, cb->hstart, 6 * sizeof(uint64_t)));
		snapkvd_cache_free(ca);
		snapkvd_cache_free(cb);
		free(a);
		free(b);
	}
}

/* GROW of a ragged cache in the GPU arena: one copy per (head, tensor),
 * each head's kept + appended rows at its new start, positions after them
 * -1 up to its new capacity. */
static void test_grow_ragged_copies(void)
{
	static const uint32_t hk[3] = {4, 1, 3};
	uint8_t *base = calloc(1, 16384);
	uint64_t old_k = 0, old_v = 256, old_pos = 512;
	struct snapkvd_grow gr = {
	    .geom = {.kv_bytes = 256, .pos_bytes = 64, .region = 4096},
	    .off = 4096,
	    .layers = 1,
	    .h_store = 3,
	    .row = 4,
	    .hnd = true,
	    .gpu = true,
	    .old_k = &old_k,
	    .old_v = &old_v,
	    .old_pos = &old_pos,
	    .hkept = hk,
	    .appended = 1,
	    .old_res = 2,
	    .res = 5,
	};
	struct skv_cuda_copy cp[6];
	uint64_t os = 0, ns = 0, k, v, p;

	CU_ASSERT_FATAL(base != NULL);
	for (uint32_t r = 0; r < 14; r++) { /* old caps 6, 3, 5 */
		((uint32_t *)(base + old_k))[r] = 100 + r;
		((uint32_t *)(base + old_v))[r] = 200 + r;
		((int32_t *)(base + old_pos))[r] = (int32_t)r;
	}
	CU_ASSERT_EQUAL(snapkvd_grow_n_copies(&gr), 6);
	CU_ASSERT_EQUAL(snapkvd_grow_copies(&gr, 0, base, cp), 6);
	run_moves(cp, 6);
	snapkvd_grow_positions(&gr, base);
	snapkvd_region_layer(gr.off, 1, 0, &gr.geom, true, &k, &v, &p);
	for (uint32_t h = 0; h < 3; h++) {
		for (uint32_t i = 0; i < hk[h] + 5; i++) {
			int32_t pos = ((int32_t *)(base + p))[ns + i];

			if (i <= hk[h]) { /* kept + the appended one */
				CU_ASSERT_EQUAL(((uint32_t *)(base + k))[ns + i], 100 + os + i);
				CU_ASSERT_EQUAL(((uint32_t *)(base + v))[ns + i], 200 + os + i);
				CU_ASSERT_EQUAL(pos, (int32_t)(os + i));
			} else {
				CU_ASSERT_EQUAL(pos, -1);
			}
		}
		os += hk[h] + 2;
		ns += hk[h] + 5;
	}
	free(base);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("cache", NULL, NULL);
	CU_add_test(s, "region sizes", test_geometry);
	CU_add_test(s, "overflow and arena limits", test_limits);
	CU_add_test(s, "layer offsets, host and GPU arena", test_layout);
	CU_add_test(s, "placement and strides", test_place);
	CU_add_test(s, "GROW copies and positions", test_grow);
	CU_add_test(s, "a dirty region: headroom, padding and tail zeroed", test_zero_unwritten);
	CU_add_test(s, "GROW into a dirty region", test_grow_dirty);
	CU_add_test(s, "PAGED: page-aligned runs, writeback, limits", test_paged);
	CU_add_test(s, "budget settle: GPU-arena moves = the host arena's memmove",
		    test_settle_moves);
	CU_add_test(s, "GROW of a ragged cache in the GPU arena: per-head copies",
		    test_grow_ragged_copies);
	return t_run();
}
