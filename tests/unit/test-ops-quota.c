// SPDX-License-Identifier: MIT
/* test-ops-quota: reserve-then-commit never over-commits, with 8 threads racing for the last bytes.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-quota.h"

static void test_reserve_commit_cancel(void)
{
	struct snapkvd_quota *q = NULL;
	struct snapkvd_quota_account *a = NULL, *b = NULL;
	struct snapkvd_reservation r1, r2, r3;
	struct snapkvd_quota_usage u;
	char msg[256];

	CU_ASSERT_EQUAL_FATAL(snapkvd_quota_new(1000, &q), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_quota_account_new(q, "alice", 600, &a), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_quota_account_new(q, "bob", 0, &b), 0);

	CU_ASSERT_EQUAL(snapkvd_quota_reserve(a, 0, &r1, msg, sizeof(msg)), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_quota_reserve(a, 500, &r1, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL(r1.bytes, 500);
	snapkvd_quota_get_usage(q, &u);
	CU_ASSERT_EQUAL(u.charged, 500);
	CU_ASSERT_EQUAL(u.reserved, 500);
	/* 500 + 101 > 600: quota, with the numbers. */
	CU_ASSERT_EQUAL(snapkvd_quota_reserve(a, 101, &r2, msg, sizeof(msg)), -EDQUOT);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "alice"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "101"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "500"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "600"));
	CU_ASSERT_EQUAL(snapkvd_quota_reserve(a, 100, &r2, msg, sizeof(msg)), 0);
	/* Pool: 600 charged, bob's 401 does not fit, 400 does. */
	CU_ASSERT_EQUAL(snapkvd_quota_reserve(b, 401, &r3, msg, sizeof(msg)), -ENOSPC);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "pool"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "401"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "1000"));
	snapkvd_quota_account_get_usage(b, &u);
	CU_ASSERT_EQUAL(u.charged, 0); /* the failed pool step was undone */
	CU_ASSERT_EQUAL(u.rejected, 1);
	CU_ASSERT_EQUAL(snapkvd_quota_reserve(b, 400, &r3, msg, sizeof(msg)), 0);

	/* Commit less than reserved: the rest goes back to tenant and pool. */
	CU_ASSERT_EQUAL(snapkvd_quota_commit(&r1, 501), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_quota_commit(&r1, 300), 0);
	snapkvd_quota_account_get_usage(a, &u);
	CU_ASSERT_EQUAL(u.charged, 400);
	CU_ASSERT_EQUAL(u.reserved, 100);
	snapkvd_quota_cancel(&r2);
	snapkvd_quota_cancel(&r2); /* twice is harmless */
	snapkvd_quota_account_get_usage(a, &u);
	CU_ASSERT_EQUAL(u.charged, 300);
	CU_ASSERT_EQUAL(u.reserved, 0);
	CU_ASSERT_EQUAL(u.rejected, 1);
	snapkvd_quota_get_usage(q, &u);
	CU_ASSERT_EQUAL(u.charged, 700);
	CU_ASSERT_EQUAL(u.reserved, 400);
	CU_ASSERT_EQUAL(u.rejected, 2);

	CU_ASSERT_EQUAL(snapkvd_quota_release(a, 100), 100);
	CU_ASSERT_EQUAL(snapkvd_quota_release(a, 1000), 200); /* clamped */
	/* Shrinking the pool below use refuses new work but takes nothing. */
	snapkvd_quota_set_total(q, 300);
	CU_ASSERT_EQUAL(snapkvd_quota_reserve(a, 1, &r1, msg, sizeof(msg)), -ENOSPC);
	snapkvd_quota_get_usage(q, &u);
	CU_ASSERT_EQUAL(u.charged, 400);
	/* Freeing an account returns what it held. */
	snapkvd_quota_account_free(b);
	snapkvd_quota_get_usage(q, &u);
	CU_ASSERT_EQUAL(u.charged, 0);
	CU_ASSERT_EQUAL(u.reserved, 0);
	snapkvd_quota_account_set_limit(a, 10);
	snapkvd_quota_set_total(q, 1000);
	CU_ASSERT_EQUAL(snapkvd_quota_reserve(a, 11, &r1, NULL, 0), -EDQUOT);
	snapkvd_quota_account_free(a);
	snapkvd_quota_account_free(NULL);
	snapkvd_quota_free(q);
}

#define THREADS 8

struct race {
	struct snapkvd_quota *q;
	struct snapkvd_quota_account *acct[THREADS];
	uint64_t pool_total;
	uint64_t quota;
	pthread_barrier_t start;
	_Atomic int done;
	uint64_t committed[THREADS];
	uint64_t reserve_fail[THREADS];
	_Atomic int violations;
	int shared_account;
};

struct worker_arg {
	struct race *r;
	int id;
};

static void *worker(void *p)
{
	struct worker_arg *w = p;
	struct race *r = w->r;
	struct snapkvd_quota_account *a = r->acct[r->shared_account ? 0 : w->id];
	unsigned seed = (unsigned)w->id * 7919u + 1;

	pthread_barrier_wait(&r->start);
	/* Race for the last bytes: reserve odd sizes, commit most, sometimes
	 * cancel or shrink, until several refusals in a row. */
	for (int misses = 0; misses < 200;) {
		struct snapkvd_reservation res;
		uint64_t want = 1 + (uint64_t)(rand_r(&seed) % 97);
		int rc = snapkvd_quota_reserve(a, want, &res, NULL, 0);

		if (rc < 0) {
			if (rc != -ENOSPC && rc != -EDQUOT)
				atomic_fetch_add(&r->violations, 1);
			r->reserve_fail[w->id]++;
			misses++;
			continue;
		}
		switch (rand_r(&seed) % 4) {
		case 0:
			snapkvd_quota_cancel(&res);
			break;
		case 1:
			snapkvd_quota_commit(&res, want / 2);
			r->committed[w->id] += want / 2;
			break;
		default:
			snapkvd_quota_commit(&res, want);
			r->committed[w->id] += want;
		}
	}
	return NULL;
}

/* Watches the counters while the workers race: they must never pass a limit. */
static void *watcher(void *p)
{
	struct race *r = p;

	while (!atomic_load(&r->done)) {
		struct snapkvd_quota_usage u;

		snapkvd_quota_get_usage(r->q, &u);
		if (u.charged > r->pool_total)
			atomic_fetch_add(&r->violations, 1);
		for (int i = 0; i < (r->shared_account ? 1 : THREADS); i++) {
			snapkvd_quota_account_get_usage(r->acct[i], &u);
			if (r->quota && u.charged > r->quota)
				atomic_fetch_add(&r->violations, 1);
		}
	}
	return NULL;
}

static void run_race(uint64_t pool_total, uint64_t quota, int shared)
{
	static struct race r;
	struct worker_arg args[THREADS];
	pthread_t th[THREADS], wt;
	struct snapkvd_quota_usage u;
	uint64_t sum = 0;
	int n_acct = shared ? 1 : THREADS;

	memset(&r, 0, sizeof(r));
	r.pool_total = pool_total;
	r.quota = quota;
	r.shared_account = shared;
	CU_ASSERT_EQUAL_FATAL(snapkvd_quota_new(pool_total, &r.q), 0);
	for (int i = 0; i < n_acct; i++) {
		char name[16];

		snprintf(name, sizeof(name), "t%d", i);
		CU_ASSERT_EQUAL_FATAL(snapkvd_quota_account_new(r.q, name, quota, &r.acct[i]), 0);
	}
	pthread_barrier_init(&r.start, NULL, THREADS);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&wt, NULL, watcher, &r), 0);
	for (int i = 0; i < THREADS; i++) {
		args[i] = (struct worker_arg){.r = &r, .id = i};
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
	snapkvd_quota_get_usage(r.q, &u);
	/* What the threads believe they hold is exactly what is charged. */
	CU_ASSERT_EQUAL(u.charged, sum);
	CU_ASSERT_EQUAL(u.reserved, 0);
	CU_ASSERT(u.charged <= pool_total);
	/* They raced to the end: less than one largest request is left over
	 * (without quotas, only the pool can stop them). */
	if (!quota)
		CU_ASSERT(pool_total - u.charged < 97 * THREADS);
	for (int i = 0; i < n_acct; i++) {
		struct snapkvd_quota_usage au;

		snapkvd_quota_account_get_usage(r.acct[i], &au);
		if (quota)
			CU_ASSERT(au.charged <= quota);
		if (!shared)
			CU_ASSERT_EQUAL(au.charged, r.committed[i]);
		snapkvd_quota_account_free(r.acct[i]);
	}
	snapkvd_quota_get_usage(r.q, &u);
	CU_ASSERT_EQUAL(u.charged, 0);
	snapkvd_quota_free(r.q);
}

/* Many short rounds: each ends in a scramble for the last bytes, which is
 * where a check-then-charge race would show. */
#define ROUNDS 100

static void test_race_pool(void)
{
	for (int i = 0; i < ROUNDS; i++)
		run_race(100000, 0, 0);
}

static void test_race_tenant_quota(void)
{
	/* Eight tenants, quotas that together exceed the pool. */
	for (int i = 0; i < ROUNDS; i++)
		run_race(100000, 20000, 0);
}

static void test_race_shared_account(void)
{
	/* Eight engines of one tenant against its quota, pool larger. */
	for (int i = 0; i < ROUNDS; i++)
		run_race(1000000, 50000, 1);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("quota", NULL, NULL);
	CU_add_test(s, "reserve, commit, cancel, release", test_reserve_commit_cancel);
	CU_add_test(s, "8 threads race for the pool's last bytes", test_race_pool);
	CU_add_test(s, "8 tenants race against quotas and pool", test_race_tenant_quota);
	CU_add_test(s, "8 engines of one tenant race for its quota", test_race_shared_account);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
