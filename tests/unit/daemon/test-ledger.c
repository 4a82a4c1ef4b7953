// SPDX-License-Identifier: MIT
/*
 * test-ledger: the admin reply's ledger and the hooks' JSON snapshot
 * (daemon/snapkvd-ledger.c) over a real pool and tally, without a daemon:
 * every tenant and cache for an admin, its own for a tenant, pages by id
 * that list each cache once, each cache's line (owner, shape, layout,
 * where its K/V live, its budget), the sums equal to the tally's, and the
 * JSON bounded by max_caches with the totals over every cache.
 */
#include <CUnit/Basic.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-ledger.c"
#include "tests/test-skip.h"

#define N 7 /* caches: ids 10, 20, .. 70; odd ids uid 1000, even 2000 */

static struct snapkvd_server srv;
static struct snapkvd_session sess[2];
static struct snapkvd_tenant *ten[2];
static struct snapkvd_cache *cs[N];

static struct snapkvd_cache *cache(uint64_t id, int k)
{
	struct snapkvd_cache *c = NULL;

	if (snapkvd_cache_new(2, 2, &c) < 0)
		abort(); /* suite set-up: no test to fail yet */
	c->id = id;
	c->h_q = c->h_kv = 2;
	c->head_dim = 8;
	c->dtype_bytes = 4;
	c->dtype = SKV_DTYPE_F32;
	c->gqa = SKV_GQA_GROUP;
	c->prompt_len = 100;
	c->budget = c->requested_budget = 20;
	c->kept = 20;
	c->slots = 24;
	c->region_bytes = 8192;
	snprintf(c->transport, sizeof(c->transport), "memfd");
	for (int i = 0; i < 4; i++)
		c->mass[i] = 0.5f + 0.1f * (float)i;
	if (snapkvd_tally_update(&srv.tally, &sess[k], ten[k], c) < 0)
		abort();
	return c;
}

static int setup(void)
{
	if (snapkvd_pool_new(1 << 30, 0, &srv.pool) < 0)
		return 1;
	for (int k = 0; k < 2; k++) {
		sess[k].id = 1 + k;
		sess[k].uid = 1000 + 1000 * k;
		snprintf(sess[k].name, sizeof(sess[k].name), "engine-%d", k);
		if (snapkvd_pool_tenant_get(srv.pool, sess[k].uid, &ten[k]) < 0)
			return 1;
		sess[k].tenant = ten[k];
	}
	for (int i = 0; i < N; i++)
		cs[i] = cache(10 * (i + 1), i % 2);
	/* one paged writeback cache, one lingering, one budgeted */
	cs[1]->layout = SNAPKVD_LAYOUT_PAGED;
	cs[1]->block_size = 16;
	cs[1]->writeback = true;
	cs[2]->lingering = true;
	cs[3]->budgeted = true;
	cs[3]->budget_mode = SKV_BUDGET_HEADS;
	cs[3]->c_star = 12;
	cs[3]->hkept = calloc(4, sizeof(uint32_t));
	for (int i = 0; i < 4; i++)
		cs[3]->hkept[i] = 10 + 2 * (uint32_t)i;
	for (int i = 1; i < 4; i++)
		snapkvd_tally_update(&srv.tally, &sess[i % 2], ten[i % 2], cs[i]);
	return 0;
}

static int cleanup(void)
{
	for (int i = 0; i < N; i++) {
		snapkvd_tally_forget(&srv.tally, cs[i]);
		snapkvd_cache_free(cs[i]);
	}
	snapkvd_tally_fini(&srv.tally);
	for (int k = 0; k < 2; k++)
		snapkvd_pool_tenant_put(srv.pool, ten[k]);
	snapkvd_pool_free(srv.pool);
	return 0;
}

static const Snapkv__V1__CacheLedger *line_of(const Snapkv__V1__AdminReply *r, uint64_t id)
{
	for (size_t i = 0; i < r->n_caches; i++)
		if (r->caches[i]->id == id)
			return r->caches[i];
	return NULL;
}

static void test_admin_view(void)
{
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	struct snapkvd_ledger_view v = {.all = true};
	struct snapkvd_ledger_buf b;
	const Snapkv__V1__CacheLedger *l;
	uint64_t compact = 0;

	CU_ASSERT_EQUAL_FATAL(snapkvd_ledger_reply(&srv, &r, &b, &v), 0);
	CU_ASSERT_TRUE(r.all_tenants);
	CU_ASSERT_EQUAL(r.n_tenants, 2);
	CU_ASSERT_EQUAL(r.n_caches, N);
	CU_ASSERT_EQUAL(r.caches_visible, N);
	CU_ASSERT_EQUAL(r.next_page_after, 0);
	CU_ASSERT_EQUAL(r.pool_total, 1 << 30);
	CU_ASSERT_EQUAL(r.lingering_caches, 1);
	for (size_t i = 0; i < r.n_caches; i++) {
		CU_ASSERT_EQUAL(r.caches[i]->id, 10 * (i + 1)); /* by id */
		compact += r.caches[i]->bytes->compact;
	}
	/* the pool's line is the tally's sums, which the caches add up to */
	CU_ASSERT_EQUAL(r.pool_bytes->compact, srv.tally.pool.compact);
	CU_ASSERT_EQUAL(compact, srv.tally.pool.compact);
	CU_ASSERT(compact > 0);
	l = line_of(&r, 10);
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_STRING_EQUAL(l->tenant, snapkvd_tenant_name(ten[0]));
	CU_ASSERT_STRING_EQUAL(l->engine, "engine-0");
	CU_ASSERT_EQUAL(l->session_id, 1);
	CU_ASSERT_EQUAL(l->capacity, 20);
	CU_ASSERT_EQUAL(l->layout, SNAPKV__V1__LAYOUT__LAYOUT_HND);
	CU_ASSERT_STRING_EQUAL(l->arena_transport, "host-memfd");
	CU_ASSERT_DOUBLE_EQUAL(l->mass_min, 0.5, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(l->mass_mean, 0.65, 1e-6);
	CU_ASSERT_EQUAL(l->budget_mode, 0); /* not budgeted: unset */
	l = line_of(&r, 20);
	CU_ASSERT_EQUAL(l->layout, SNAPKV__V1__LAYOUT__LAYOUT_PAGED);
	CU_ASSERT_EQUAL(l->block_size, 16);
	CU_ASSERT_STRING_EQUAL(l->arena_transport, "engine");
	CU_ASSERT_TRUE(l->engine_held);
	CU_ASSERT_TRUE(line_of(&r, 30)->lingering);
	l = line_of(&r, 40);
	CU_ASSERT_EQUAL(l->budget_mode, (Snapkv__V1__BudgetMode)(SKV_BUDGET_HEADS + 1));
	CU_ASSERT_EQUAL(l->c_star, 12);
	CU_ASSERT_EQUAL(l->kept_min, 10);
	CU_ASSERT_DOUBLE_EQUAL(l->kept_mean, 13.0, 1e-6);
	for (size_t i = 0; i < r.n_tenants; i++)
		CU_ASSERT_EQUAL(r.tenants[i]->caches, 0); /* the pool counts none here */
	snapkvd_ledger_reply_free(&b);
	CU_ASSERT_PTR_NULL(b.cl);
	snapkvd_ledger_reply_free(&b); /* twice: harmless */
}

static void test_tenant_view(void)
{
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	struct snapkvd_ledger_view v = {.all = false, .uid = 2000};
	struct snapkvd_ledger_buf b;

	CU_ASSERT_EQUAL_FATAL(snapkvd_ledger_reply(&srv, &r, &b, &v), 0);
	CU_ASSERT_FALSE(r.all_tenants);
	CU_ASSERT_EQUAL(r.n_tenants, 1);
	CU_ASSERT_EQUAL(r.tenants[0]->uid, 2000);
	CU_ASSERT_EQUAL(r.n_caches, 3); /* 20, 40, 60 */
	CU_ASSERT_EQUAL(r.caches_visible, 3);
	for (size_t i = 0; i < r.n_caches; i++)
		CU_ASSERT_EQUAL(r.caches[i]->session_id, 2);
	snapkvd_ledger_reply_free(&b);
	/* a uid with nothing: no tenant line, no cache */
	v.uid = 4242;
	CU_ASSERT_EQUAL_FATAL(snapkvd_ledger_reply(&srv, &r, &b, &v), 0);
	CU_ASSERT_EQUAL(r.n_tenants, 0);
	CU_ASSERT_EQUAL(r.n_caches, 0);
	snapkvd_ledger_reply_free(&b);
}

/* Pages of 3: 10 20 30, 40 50 60, 70; the cursor continues, 0 at the end. */
static void test_pages(void)
{
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	struct snapkvd_ledger_view v = {.all = true, .page = 3};
	struct snapkvd_ledger_buf b;
	uint64_t seen = 0;

	do {
		CU_ASSERT_EQUAL_FATAL(snapkvd_ledger_reply(&srv, &r, &b, &v), 0);
		CU_ASSERT_EQUAL(r.caches_visible, N);
		CU_ASSERT(r.n_caches == 3 || r.next_page_after == 0);
		for (size_t i = 0; i < r.n_caches; i++)
			CU_ASSERT_EQUAL(r.caches[i]->id, 10 * (++seen));
		if (r.next_page_after)
			CU_ASSERT_EQUAL(r.next_page_after, 10 * seen);
		v.after = r.next_page_after;
		snapkvd_ledger_reply_free(&b);
	} while (v.after);
	CU_ASSERT_EQUAL(seen, N);
}

static void test_json(void)
{
	json_error_t je;
	json_t *j;
	char *text = snapkvd_ledger_json(&srv, "high", 2);

	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT_EQUAL(text[strlen(text) - 1], '\n');
	j = json_loads(text, 0, &je);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_STRING_EQUAL(
	    json_string_value(json_object_get(json_object_get(j, "pressure"), "level")), "high");
	CU_ASSERT_EQUAL(json_array_size(json_object_get(j, "caches")), 2);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "caches_listed")), 2);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(j, "caches_total")), N);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(json_object_get(j, "pool"), "caches")),
			N);
	json_decref(j);
	free(text);
	/* every cache fits: no caches_listed */
	text = snapkvd_ledger_json(&srv, "normal", N);
	j = json_loads(text, 0, &je);
	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_EQUAL(json_array_size(json_object_get(j, "caches")), N);
	CU_ASSERT_PTR_NULL(json_object_get(j, "caches_listed"));
	json_decref(j);
	free(text);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("ledger", setup, cleanup);
	CU_add_test(su, "an admin sees every tenant and cache", test_admin_view);
	CU_add_test(su, "a tenant sees its own", test_tenant_view);
	CU_add_test(su, "pages by id", test_pages);
	CU_add_test(su, "the hooks' JSON, bounded", test_json);
	return t_run();
}
