// SPDX-License-Identifier: MIT
/*
 * test-bucket: the admin rate limits' token bucket (daemon/snapkvd-bucket.c)
 * on a clock the test drives: a new bucket is full (burst), each take
 * spends one, an empty one says how long until the next token (and is
 * right about it, to the nanosecond), it never holds more than burst
 * however long it idles (no overflow after years), rate 0 never refuses,
 * and a burst lowered by a reload caps what was saved.
 */
#include <CUnit/Basic.h>

#include "daemon/snapkvd-bucket.c"
#include "tests/test-skip.h"

#define S 1000000000ull

static void test_burst_then_rate(void)
{
	struct snapkvd_bucket b = {0};
	uint64_t t = 5 * S, w;

	snapkvd_bucket_refill(&b, 2, 3, t);
	CU_ASSERT_TRUE(snapkvd_bucket_full(&b, 3));
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(snapkvd_bucket_wait_ns(&b, 2), 0);
		snapkvd_bucket_take(&b, 2);
	}
	/* empty: one token at 2 a second is 0.5 s away */
	w = snapkvd_bucket_wait_ns(&b, 2);
	CU_ASSERT_EQUAL(w, S / 2);
	snapkvd_bucket_refill(&b, 2, 3, t + w - 1);
	CU_ASSERT_EQUAL(snapkvd_bucket_wait_ns(&b, 2), 1);
	snapkvd_bucket_refill(&b, 2, 3, t + w);
	CU_ASSERT_EQUAL(snapkvd_bucket_wait_ns(&b, 2), 0);
	snapkvd_bucket_take(&b, 2);
	CU_ASSERT_EQUAL(snapkvd_bucket_wait_ns(&b, 2), S / 2);
	/* a clock that goes back adds nothing */
	snapkvd_bucket_refill(&b, 2, 3, t);
	CU_ASSERT_EQUAL(snapkvd_bucket_wait_ns(&b, 2), S / 2);
}

static void test_idle_caps(void)
{
	struct snapkvd_bucket b = {0};
	uint64_t t = 1;

	snapkvd_bucket_refill(&b, 1000000, 5, t);
	for (int i = 0; i < 5; i++)
		snapkvd_bucket_take(&b, 1000000);
	CU_ASSERT_NOT_EQUAL(snapkvd_bucket_wait_ns(&b, 1000000), 0);
	/* ten years idle at the highest rate: full, not wrapped */
	t += 10ull * 365 * 24 * 3600 * S;
	snapkvd_bucket_refill(&b, 1000000, 5, t);
	CU_ASSERT_TRUE(snapkvd_bucket_full(&b, 5));
	CU_ASSERT_EQUAL(b.nano, 5 * S);
	/* a reload lowers the burst: what was saved is capped */
	snapkvd_bucket_refill(&b, 1000000, 2, t + 1);
	CU_ASSERT_EQUAL(b.nano, 2 * S);
}

static void test_rate_zero(void)
{
	struct snapkvd_bucket b = {0};

	for (int i = 0; i < 1000; i++) {
		snapkvd_bucket_refill(&b, 0, 1, (uint64_t)i);
		CU_ASSERT_EQUAL(snapkvd_bucket_wait_ns(&b, 0), 0);
		snapkvd_bucket_take(&b, 0);
	}
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("bucket", NULL, NULL);
	CU_add_test(s, "full at first, then the rate, exact waits", test_burst_then_rate);
	CU_add_test(s, "idle: capped at burst, no overflow; a lowered burst", test_idle_caps);
	CU_add_test(s, "rate 0: never refuses", test_rate_zero);
	return t_run();
}
