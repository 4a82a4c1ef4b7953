// SPDX-License-Identifier: MIT
/*
 * test-clock: the daemon's clocks (daemon/snapkvd-clock.c): the monotonic
 * one never goes back and is CLOCK_MONOTONIC in ns; the real-time one is
 * CLOCK_REALTIME in ns (what people see in timestamps).
 */
#include <CUnit/Basic.h>
#include <stdbool.h>
#include <time.h>

#include "daemon/snapkvd-clock.c"
#include "tests/test-skip.h"

static uint64_t ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void test_monotonic(void)
{
	uint64_t last = snapkvd_now_ns();
	bool back = false;

	for (int i = 0; i < 100000; i++) {
		uint64_t t = snapkvd_now_ns();

		back |= t < last;
		last = t;
	}
	CU_ASSERT_FALSE(back);
	/* the same clock: bracketed by direct reads */
	uint64_t a = ns(CLOCK_MONOTONIC), t = snapkvd_now_ns(), b = ns(CLOCK_MONOTONIC);
	CU_ASSERT(a <= t && t <= b);
}

static void test_realtime(void)
{
	uint64_t a = ns(CLOCK_REALTIME), t = snapkvd_realtime_ns(), b = ns(CLOCK_REALTIME);

	/* a step of the wall clock between the reads would break the bracket:
	 * it is re-read once */
	if (!(a <= t && t <= b)) {
		a = ns(CLOCK_REALTIME);
		t = snapkvd_realtime_ns();
		b = ns(CLOCK_REALTIME);
	}
	CU_ASSERT(a <= t && t <= b);
	CU_ASSERT(t > 1500000000ull * 1000000000ull); /* after 2017: seconds, not ns, would fail */
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("clock", NULL, NULL);
	CU_add_test(su, "monotonic, in ns", test_monotonic);
	CU_add_test(su, "real time, in ns", test_realtime);
	return t_run();
}
