// SPDX-License-Identifier: MIT
/*
 * test-pool: the global byte budget (daemon/snapkvd-pool.c): reserve then
 * commit or cancel, quotas of the pool and of one tenant and their
 * refusals with the numbers, a lower limit while in use, no overshoot
 * under four racing threads, the snapshot the admin views read, and the
 * mapped-buffer limits, each refusal naming its key.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-pool.c"
#include "tests/test-skip.h"

static void test_pool(void)
{
	struct snapkvd_pool p;
	struct snapkvd_tenant *a, *b, *a2;
	struct snapkvd_resv r1, r2, r3;

	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_init(&p, 1000, 600), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(&p, 1000, &a), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(&p, 1001, &b), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(&p, 1000, &a2), 0);
	CU_ASSERT_PTR_EQUAL(a, a2);
	CU_ASSERT_EQUAL(a->sessions, 2);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 500, &r1), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_used(&p), 500); /* a reservation counts at once */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 200, &r2), -EDQUOT); /* a's quota */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 501, &r2), -ENOSPC); /* the pool */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 500, &r2), 0);
	snapkvd_pool_commit(&p, &r1);
	CU_ASSERT_EQUAL(a->used, 500);
	CU_ASSERT_EQUAL(a->reserved, 0);
	snapkvd_pool_cancel(&p, &r2);
	CU_ASSERT_EQUAL(snapkvd_pool_used(&p), 500);
	snapkvd_pool_cancel(&p, &r2); /* twice is harmless */
	CU_ASSERT_EQUAL(snapkvd_pool_used(&p), 500);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, UINT64_MAX, &r3), -ENOSPC);
	snapkvd_pool_give_back(&p, a, 500);
	CU_ASSERT_EQUAL(snapkvd_pool_used(&p), 0);
	/* a lower limit while in use: allowed, new work refused until it drains */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 400, &r3), 0);
	snapkvd_pool_commit(&p, &r3);
	snapkvd_pool_set_limits(&p, 100, 0);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 1, &r1), -ENOSPC);
	snapkvd_pool_give_back(&p, b, 400);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 100, &r1), 0);
	snapkvd_pool_cancel(&p, &r1);
	snapkvd_pool_tenant_put(&p, a);
	snapkvd_pool_tenant_put(&p, a);
	CU_ASSERT_EQUAL(a->sessions, 0);
	snapkvd_pool_destroy(&p);
}

static struct snapkvd_pool race_pool;
static struct snapkvd_tenant *race_tenant;
static int race_ok[4];

static void *racer(void *arg)
{
	int id = (int)(intptr_t)arg;

	for (int i = 0; i < 10000; i++) {
		struct snapkvd_resv r;

		if (snapkvd_pool_reserve(&race_pool, race_tenant, 7, &r) == 0) {
			race_ok[id]++;
			snapkvd_pool_commit(&race_pool, &r);
		}
	}
	return NULL;
}

static void test_pool_race(void)
{
	pthread_t t[4];
	int total = 0;

	snapkvd_pool_init(&race_pool, 7 * 1000, 0);
	snapkvd_pool_tenant_get(&race_pool, 1, &race_tenant);
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, racer, (void *)(intptr_t)i);
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		total += race_ok[i];
	}
	/* reserve-then-commit: exactly the budget, never more */
	CU_ASSERT_EQUAL(total, 1000);
	CU_ASSERT_EQUAL(snapkvd_pool_used(&race_pool), 7000);
	snapkvd_pool_destroy(&race_pool);
}

/* The refusals say the numbers; quotas per tenant and anew on SIGHUP. */
static uint64_t quota_of(void *data, uid_t uid)
{
	(void)data;
	return uid == 1000 ? 300 : 0;
}

static void test_pool_quota_and_explain(void)
{
	struct snapkvd_pool *p = NULL;
	struct snapkvd_tenant *a, *b;
	struct snapkvd_resv r;
	struct snapkvd_pool_stats st;
	struct snapkvd_tenant_stats *ts = NULL;
	size_t n = 0;
	char why[256];

	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_new(1000, 0, &p), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(p, 1000, &a), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(p, 1001, &b), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(p, a, 400, &r), 0); /* no quota yet */
	snapkvd_pool_cancel(p, &r);
	snapkvd_pool_requota(p, quota_of, NULL);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(p, a, 400, &r), -EDQUOT);
	snapkvd_pool_explain(p, a, 400, -EDQUOT, why, sizeof(why));
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "over quota: wants 400 bytes, holds 0 of its 300"));
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(p, b, 1001, &r), -ENOSPC);
	snapkvd_pool_explain(p, b, 1001, -ENOSPC, why, sizeof(why));
	CU_ASSERT_STRING_EQUAL(why, "pool exhausted: wants 1001 bytes, pool holds 0 of 1000 "
				    "(1000 free)");
	/* a tenant's own quota over the pool's */
	snapkvd_pool_tenant_set_quota(p, b, 100);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(p, b, 101, &r), -EDQUOT);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(p, b, 100, &r), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_use(p, b), 100);
	snapkvd_pool_commit(p, &r);
	snapkvd_pool_cache_count(p, b, 1);
	snapkvd_pool_tenant_compaction(p, b);
	CU_ASSERT_EQUAL(snapkvd_pool_snapshot(p, &st, &ts, &n), 0);
	CU_ASSERT_EQUAL(st.total, 1000);
	CU_ASSERT_EQUAL(st.used, 100);
	CU_ASSERT_EQUAL(n, 2);
	for (size_t i = 0; i < n; i++) {
		if (ts[i].uid == 1001) {
			CU_ASSERT_EQUAL(ts[i].used_bytes, 100);
			CU_ASSERT_EQUAL(ts[i].quota_bytes, 100);
			CU_ASSERT_EQUAL(ts[i].caches, 1);
			CU_ASSERT_EQUAL(ts[i].compactions, 1);
			CU_ASSERT_EQUAL(ts[i].quota_rejections, 1);
		} else {
			CU_ASSERT_EQUAL(ts[i].uid, 1000);
			CU_ASSERT_EQUAL(ts[i].quota_bytes, 300);
		}
	}
	free(ts);
	snapkvd_pool_give_back(p, b, 100);
	snapkvd_pool_tenant_put(p, a);
	snapkvd_pool_tenant_put(p, b);
	snapkvd_pool_free(p);
	snapkvd_pool_free(NULL);
}

/* Mapped buffers against max_tenant_buffers, max_tenant_mapped_bytes and
 * max_mapped_bytes: each refusal names its key, nothing is charged. */
static void test_pool_map_limits(void)
{
	struct snapkvd_pool *p = NULL;
	struct snapkvd_tenant *a, *b;
	char why[256];

	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_new(1 << 20, 0, &p), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(p, 1, &a), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(p, 2, &b), 0);
	/* no limit until set */
	CU_ASSERT_EQUAL(snapkvd_pool_map(p, a, 1ull << 40, why, sizeof(why)), 0);
	snapkvd_pool_unmap(p, a, 1ull << 40);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(p), 0);
	snapkvd_pool_set_map_limits(p, 2, 1000, 1500);
	CU_ASSERT_EQUAL(snapkvd_pool_map(p, a, 600, why, sizeof(why)), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_map(p, a, 401, why, sizeof(why)), -EDQUOT);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "max_tenant_mapped_bytes 1000"));
	CU_ASSERT_EQUAL(snapkvd_pool_map(p, a, UINT64_MAX, why, sizeof(why)), -EDQUOT);
	CU_ASSERT_EQUAL(snapkvd_pool_map(p, a, 400, why, sizeof(why)), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_map(p, a, 0, why, sizeof(why)), -EMFILE);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "max_tenant_buffers is 2"));
	CU_ASSERT_EQUAL(snapkvd_pool_map(p, b, 501, why, sizeof(why)), -ENOSPC);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "max_mapped_bytes 1500"));
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(p), 1000);
	CU_ASSERT_EQUAL(snapkvd_pool_map(p, b, 500, why, sizeof(why)), 0);
	snapkvd_pool_unmap(p, a, 600);
	snapkvd_pool_unmap(p, a, 400);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(p), 500);
	snapkvd_pool_unmap(p, b, 500);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(p), 0);
	snapkvd_pool_tenant_put(p, a);
	snapkvd_pool_tenant_put(p, b);
	snapkvd_pool_free(p);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("pool", NULL, NULL);
	CU_add_test(su, "reserve, commit, cancel, limits", test_pool);
	CU_add_test(su, "reserve race", test_pool_race);
	CU_add_test(su, "quotas and their reasons", test_pool_quota_and_explain);
	CU_add_test(su, "mapped-buffer limits", test_pool_map_limits);
	return t_run();
}
