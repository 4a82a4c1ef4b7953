/* SPDX-License-Identifier: MIT */
/*
 * test-skip.h - a CUnit test that cannot run here is skipped visibly.
 *
 * CUnit 2.1 has no skip status, and a test that returns early counts as
 * passed. Instead, before the run, t_skip() makes the test inactive (CUnit's
 * summary counts it under "Inactive", never "Passed") and prints its reason
 * as "SKIP(WHAT): REASON", the line scripts/run-tests.sh lists; t_exit()
 * then gives exit status 77 (run-tests.sh's "skipped") where the rest
 * passed. Where SNAPKV_REQUIRE (comma-separated, or "all") names WHAT
 * (cuda, python, model, root, ...), the skip is a failure: a test "required
 * WHAT" that fails with the reason takes the skipped test's place.
 */
#ifndef TEST_SKIP_H
#define TEST_SKIP_H

#include <CUnit/Basic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_SKIP_MAX 32

static unsigned t_skipped;
static char t_required_msg[T_SKIP_MAX][320];
static unsigned t_required_n, t_required_next;

/* Whether SNAPKV_REQUIRE names WHAT (or is "all"). */
static inline bool t_required(const char *what)
{
	const char *req = getenv("SNAPKV_REQUIRE");
	size_t n = strlen(what);

	for (const char *p = req; p && *p;) {
		size_t len = strcspn(p, ",");
		if ((len == n && !strncmp(p, what, n)) || (len == 3 && !strncmp(p, "all", 3)))
			return true;
		p += len + (p[len] == ',');
	}
	return false;
}

/* Runs in place of a required test that cannot run: one failure, its reason. */
static inline void t_required_missing(void)
{
	const char *msg = t_required_next < t_required_n ? t_required_msg[t_required_next++]
							 : "required test missing";
	CU_assertImplementation(CU_FALSE, __LINE__, msg, __FILE__, "", CU_FALSE);
}

/*
 * Skips TEST of SUITE (both as CU_add_* returned them) for want of WHAT,
 * with a printf-style reason. Call it after registering, before the run.
 */
static inline __attribute__((format(printf, 4, 5))) void
t_skip(CU_pSuite suite, CU_pTest test, const char *what, const char *fmt, ...)
{
	char reason[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	if (test)
		CU_set_test_active(test, CU_FALSE);
	CU_set_fail_on_inactive(CU_FALSE);
	if (t_required(what) && suite && t_required_n < T_SKIP_MAX) {
		snprintf(t_required_msg[t_required_n++], sizeof(t_required_msg[0]),
			 "required %s (SNAPKV_REQUIRE): %s: %s", what, test ? test->pName : "",
			 reason);
		printf("FAIL required %s (SNAPKV_REQUIRE=%s): %s: %s\n", what,
		       getenv("SNAPKV_REQUIRE"), test ? test->pName : "", reason);
		CU_add_test(suite, "required test could not run", t_required_missing);
		return;
	}
	t_skipped++;
	printf("SKIP(%s): %s: %s\n", what, test ? test->pName : "", reason);
}

/*
 * A whole program that cannot run here for want of WHAT: prints the reason
 * and returns main's exit status, 77, or 1 where WHAT is required.
 */
static inline __attribute__((format(printf, 2, 3))) int t_skip_program(const char *what,
								       const char *fmt, ...)
{
	char reason[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	if (t_required(what)) {
		printf("FAIL required %s (SNAPKV_REQUIRE=%s): %s\n", what, getenv("SNAPKV_REQUIRE"),
		       reason);
		return 1;
	}
	printf("SKIP(%s): %s\n", what, reason);
	return 77;
}

/* The exit status of a CUnit run: 1 on any failure, 77 when something was skipped. */
static inline int t_exit(unsigned fails)
{
	if (fails)
		return 1;
	if (t_skipped)
		printf("%u test(s) skipped, not passed (SKIP lines above)\n", t_skipped);
	return t_skipped ? 77 : 0;
}

/*
 * Run the registered suites with the verbose summary scripts/run-tests.sh
 * reads, then free the registry: main's exit status (1 when a test or a
 * suite's init or cleanup failed, 77 when tests were skipped).
 */
static inline int t_run(void)
{
	unsigned fails;

	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
	CU_cleanup_registry();
	return t_exit(fails);
}

#endif
