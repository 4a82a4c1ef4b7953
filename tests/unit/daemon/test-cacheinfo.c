// SPDX-License-Identifier: MIT
/*
 * test-cacheinfo: a cache as the engine sees it (daemon/snapkvd-cacheinfo.c):
 * the CacheInfo of a dense cache, a paged writeback one and a ragged
 * budgeted one, each field from the cache; and the reply bound, which must
 * cover the packed reply even when every offset, id and count later widens
 * to its largest value.
 */
#include <CUnit/Basic.h>
#include <stdint.h>

#include "daemon/snapkvd-cacheinfo.c"
#include "tests/test-skip.h"

enum { LAYERS = 3, HEADS = 4 };

static uint64_t k_off[LAYERS] = {0, 4096, 8192}, v_off[LAYERS] = {1, 2, 3},
		pos_off[LAYERS] = {7, 8, 9};
static float mass[LAYERS * HEADS], layer_mass[2 * LAYERS];
static uint32_t hkept[LAYERS * HEADS];
static uint64_t hstart[LAYERS * HEADS];

static void dense(struct snapkvd_cache *c)
{
	*c = (struct snapkvd_cache){0};
	c->id = 42;
	c->layers = LAYERS;
	c->h_store = HEADS;
	c->head_dim = 64;
	c->dtype = SKV_DTYPE_F16;
	c->layout = SNAPKVD_LAYOUT_HND;
	c->prompt_len = 1000;
	c->kept = 100;
	c->slots = 132;
	c->appended = 5;
	c->k_off = k_off;
	c->v_off = v_off;
	c->pos_off = pos_off;
	c->mass = mass;
	c->budget = 100;
	c->requested_budget = 128;
}

static size_t packed(const struct snapkvd_cache *c)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;

	snapkvd_cacheinfo_fill(c, &ci);
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_CACHE;
	resp.cache = &ci;
	return snapkv__v1__response__get_packed_size(&resp);
}

static void test_dense(void)
{
	struct snapkvd_cache c;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;

	dense(&c);
	snapkvd_cacheinfo_fill(&c, &ci);
	CU_ASSERT_EQUAL(ci.cache_id, 42);
	CU_ASSERT_EQUAL(ci.layers, LAYERS);
	CU_ASSERT_EQUAL(ci.h_store, HEADS);
	CU_ASSERT_EQUAL(ci.kept, 100);
	CU_ASSERT_EQUAL(ci.capacity, 132);
	CU_ASSERT_EQUAL(ci.pos_stride, 132);
	CU_ASSERT_EQUAL(ci.appended, 5);
	CU_ASSERT_EQUAL(ci.layout, SNAPKV__V1__LAYOUT__LAYOUT_HND);
	CU_ASSERT_EQUAL(ci.kv_arena, SNAPKV__V1__ARENA_KIND__ARENA_KIND_HOST_MEMFD);
	CU_ASSERT_EQUAL(ci.n_k_offset, LAYERS);
	CU_ASSERT_PTR_EQUAL(ci.k_offset, k_off);
	CU_ASSERT_PTR_EQUAL(ci.pos_offset, pos_off);
	CU_ASSERT_EQUAL(ci.n_retained_mass, LAYERS * HEADS);
	CU_ASSERT_TRUE(ci.budget_scaled);   /* 100 of the 128 asked for */
	CU_ASSERT_EQUAL(ci.n_kv_scale, 0);  /* not fp8 */
	CU_ASSERT_EQUAL(ci.block_size, 0);  /* not paged */
	CU_ASSERT_EQUAL(ci.n_head_kept, 0); /* not budgeted */
}

static void test_paged_writeback(void)
{
	struct snapkvd_cache c;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;

	dense(&c);
	c.layout = SNAPKVD_LAYOUT_PAGED;
	c.writeback = true;
	c.block_size = 16;
	c.n_blocks = 9;
	c.in_place_blocks = 2;
	c.max_decode = 32;
	snapkvd_cacheinfo_fill(&c, &ci);
	CU_ASSERT_EQUAL(ci.layout, SNAPKV__V1__LAYOUT__LAYOUT_PAGED);
	CU_ASSERT_EQUAL(ci.out_dest, SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK);
	CU_ASSERT_EQUAL(ci.block_size, 16);
	CU_ASSERT_EQUAL(ci.n_blocks, 9);
	CU_ASSERT_EQUAL(ci.in_place_blocks, 2);
	CU_ASSERT_EQUAL(ci.max_decode, 32);
}

static void test_ragged_budget(void)
{
	struct snapkvd_cache c;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;

	dense(&c);
	c.budgeted = c.ragged = true;
	c.budget_mode = SKV_BUDGET_HEADS;
	c.hkept = hkept;
	c.hstart = hstart;
	c.layer_mass = layer_mass;
	c.c_star = 77;
	snapkvd_cacheinfo_fill(&c, &ci);
	CU_ASSERT_EQUAL(ci.budget_mode, (Snapkv__V1__BudgetMode)(SKV_BUDGET_HEADS + 1));
	CU_ASSERT_EQUAL(ci.n_head_kept, LAYERS * HEADS);
	CU_ASSERT_PTR_EQUAL(ci.head_kept, hkept);
	CU_ASSERT_EQUAL(ci.n_head_start, LAYERS * HEADS);
	CU_ASSERT_EQUAL(ci.pos_stride, 0); /* ragged: per-head starts instead */
	CU_ASSERT_EQUAL(ci.c_star, 77);
	CU_ASSERT_PTR_EQUAL(ci.layer_mass_mean, layer_mass + LAYERS);
}

/* the bound holds when every value a placement may change is at its widest */
static void test_bound(void)
{
	struct snapkvd_cache c;
	size_t small, bound;

	dense(&c);
	c.budgeted = c.ragged = true;
	c.hkept = hkept;
	c.hstart = hstart;
	c.layer_mass = layer_mass;
	for (int i = 0; i < LAYERS * HEADS; i++)
		hkept[i] = 0, hstart[i] = 0;
	small = packed(&c);
	bound = snapkvd_cacheinfo_reply_bound(&c);
	CU_ASSERT(bound >= small);
	for (int i = 0; i < LAYERS; i++)
		k_off[i] = v_off[i] = pos_off[i] = UINT64_MAX;
	for (int i = 0; i < LAYERS * HEADS; i++)
		hkept[i] = UINT32_MAX, hstart[i] = UINT64_MAX;
	c.id = UINT64_MAX;
	c.region_off = c.region_bytes = UINT64_MAX;
	CU_ASSERT(packed(&c) <= bound);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("cacheinfo", NULL, NULL);
	CU_add_test(su, "a dense cache", test_dense);
	CU_add_test(su, "a paged writeback cache", test_paged_writeback);
	CU_add_test(su, "a ragged budgeted cache", test_ragged_budget);
	CU_add_test(su, "the reply bound covers the widest values", test_bound);
	return t_run();
}
