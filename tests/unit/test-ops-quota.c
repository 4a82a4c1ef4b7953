// SPDX-License-Identifier: MIT
/* test-ops-quota: the pool's reserve-then-commit with per-tenant quotas never over-commits, 8
 * threads racing for the last bytes. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-pool.c"

static void usage(struct snapkvd_pool *p, uint64_t *used, uint64_t *reserved)
{
	pthread_mutex_lock(&p->mu);
	*used = p->used;
	*reserved = p->reserved;
	pthread_mutex_unlock(&p->mu);
}

static void test_quota_and_message(void)
{
	struct snapkvd_pool p;
	struct snapkvd_tenant *a = NULL, *b = NULL;
	struct snapkvd_resv r1, r2, r3;
	uint64_t used, resv;
	char msg[256];

	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_init(&p, 1000, 0), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_tenant_get(&p, 1000, &a), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_tenant_get(&p, 1001, &b), 0);
	a->quota = 600; /* tenant_quota = 1000:600 */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 500, &r1), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 101, &r2), -EDQUOT);
	CU_ASSERT_EQUAL(a->quota_rejections, 1);
	snapkvd_pool_explain(&p, a, 101, -EDQUOT, msg, sizeof(msg));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "over quota"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "wants 101 bytes, holds 500 of its 600 (100 free)"));
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 100, &r2), 0);
	/* b has no quota of its own: only the pool bounds it. */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 401, &r3), -ENOSPC);
	snapkvd_pool_explain(&p, b, 401, -ENOSPC, msg, sizeof(msg));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "wants 401 bytes, pool holds 600 of 1000 (400 free)"));
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 400, &r3), 0);
	snapkvd_pool_commit(&p, &r1);
	snapkvd_pool_cancel(&p, &r2);
	snapkvd_pool_commit(&p, &r3);
	usage(&p, &used, &resv);
	CU_ASSERT_EQUAL(used, 900);
	CU_ASSERT_EQUAL(resv, 0);
	/* The per-tenant quota wins over the pool-wide one. */
	snapkvd_pool_set_limits(&p, 1000, 50);
	snapkvd_pool_give_back(&p, a, 500);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 60, &r1), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 1, &r2), -EDQUOT);
	snapkvd_pool_cancel(&p, &r1);
	snapkvd_pool_give_back(&p, b, 400);
	snapkvd_pool_tenant_put(&p, a);
	snapkvd_pool_tenant_put(&p, b);
	snapkvd_pool_destroy(&p);
}

#define THREADS 8
#define ROUNDS	40

struct race {
	struct snapkvd_pool pool;
	struct snapkvd_tenant *t[THREADS];
	uint64_t quota;
	int shared;
	pthread_barrier_t start;
	_Atomic int done;
	_Atomic int violations;
	uint64_t committed[THREADS];
};

struct warg {
	struct race *r;
	int id;
};

static void *worker(void *p)
{
	struct warg *w = p;
	struct race *r = w->r;
	struct snapkvd_tenant *t = r->t[r->shared ? 0 : w->id];
	unsigned seed = (unsigned)w->id * 7919u + 1;

	pthread_barrier_wait(&r->start);
	for (int misses = 0; misses < 200;) {
		struct snapkvd_resv res;
		uint64_t want = 1 + (uint64_t)(rand_r(&seed) % 97);
		int rc = snapkvd_pool_reserve(&r->pool, t, want, &res);

		if (rc < 0) {
			if (rc != -ENOSPC && rc != -EDQUOT)
				atomic_fetch_add(&r->violations, 1);
			misses++;
			continue;
		}
		if (rand_r(&seed) % 4 == 0) {
			snapkvd_pool_cancel(&r->pool, &res);
		} else {
			snapkvd_pool_commit(&r->pool, &res);
			r->committed[w->id] += want;
		}
	}
	return NULL;
}

/* Reads the counters while the workers race: no limit is ever passed. */
static void *watcher(void *p)
{
	struct race *r = p;

	while (!atomic_load(&r->done)) {
		pthread_mutex_lock(&r->pool.mu);
		if (r->pool.used + r->pool.reserved > r->pool.total)
			atomic_fetch_add(&r->violations, 1);
		for (int i = 0; i < (r->shared ? 1 : THREADS); i++)
			if (r->quota && r->t[i]->used + r->t[i]->reserved > r->quota)
				atomic_fetch_add(&r->violations, 1);
		pthread_mutex_unlock(&r->pool.mu);
	}
	return NULL;
}

static void run_race(uint64_t total, uint64_t quota, int shared)
{
	static struct race r;
	struct warg args[THREADS];
	pthread_t th[THREADS], wt;
	uint64_t sum = 0, tsum = 0, used, resv;
	int n_t = shared ? 1 : THREADS;

	memset(&r, 0, sizeof(r));
	r.quota = quota;
	r.shared = shared;
	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_init(&r.pool, total, 0), 0);
	for (int i = 0; i < n_t; i++) {
		CU_ASSERT_EQUAL_FATAL(snapkvd_pool_tenant_get(&r.pool, 2000 + i, &r.t[i]), 0);
		r.t[i]->quota = quota;
	}
	pthread_barrier_init(&r.start, NULL, THREADS);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&wt, NULL, watcher, &r), 0);
	for (int i = 0; i < THREADS; i++) {
		args[i] = (struct warg){.r = &r, .id = i};
		CU_ASSERT_EQUAL_FATAL(pthread_create(&th[i], NULL, worker, &args[i]), 0);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	atomic_store(&r.done, 1);
	pthread_join(wt, NULL);
	pthread_barrier_destroy(&r.start);
	CU_ASSERT_EQUAL(atomic_load(&r.violations), 0);
	for (int i = 0; i < THREADS; i++)
		sum += r.committed[i];
	usage(&r.pool, &used, &resv);
	/* What the threads believe they hold is exactly what is charged. */
	CU_ASSERT_EQUAL(used, sum);
	CU_ASSERT_EQUAL(resv, 0);
	CU_ASSERT(used <= total);
	for (int i = 0; i < n_t; i++) {
		CU_ASSERT(!quota || r.t[i]->used <= quota);
		tsum += r.t[i]->used;
		if (!shared)
			CU_ASSERT_EQUAL(r.t[i]->used, r.committed[i]);
	}
	CU_ASSERT_EQUAL(tsum, used);
	/* Without quotas only the pool stops them: they raced to its end. */
	if (!quota)
		CU_ASSERT(total - used < 97);
	for (int i = 0; i < n_t; i++) {
		snapkvd_pool_give_back(&r.pool, r.t[i], r.t[i]->used);
		snapkvd_pool_tenant_put(&r.pool, r.t[i]);
	}
	snapkvd_pool_destroy(&r.pool);
}

static void test_race_pool(void)
{
	for (int i = 0; i < ROUNDS; i++)
		run_race(100000, 0, 0);
}

static void test_race_tenant_quota(void)
{
	for (int i = 0; i < ROUNDS; i++)
		run_race(100000, 20000, 0);
}

static void test_race_shared_tenant(void)
{
	for (int i = 0; i < ROUNDS; i++)
		run_race(1000000, 50000, 1);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("ops-quota", NULL, NULL);
	CU_add_test(s, "per-tenant quota and the numbers in the message", test_quota_and_message);
	CU_add_test(s, "8 threads race for the pool's last bytes", test_race_pool);
	CU_add_test(s, "8 tenants race against quotas and pool", test_race_tenant_quota);
	CU_add_test(s, "8 engines of one tenant race for its quota", test_race_shared_tenant);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
