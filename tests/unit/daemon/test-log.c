// SPDX-License-Identifier: MIT
/*
 * test-log: the daemon's log (daemon/snapkvd-log.c), its stderr read back
 * from a memfd: level names, the level filter, the errno text appended,
 * journald's priority prefix, an overlong line cut to one line, and causes
 * summarised to at most one line per interval (the first as is, the rest
 * counted, the summary naming the count, the interval and the last).
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/snapkvd-log.c"
#include "tests/test-skip.h"

static int out = -1, saved = -1;

/* What was logged since the last call (stderr is the memfd meanwhile). */
static char *logged(void)
{
	static char buf[8192];
	off_t n = lseek(out, 0, SEEK_CUR);

	if (n < 0 || n >= (off_t)sizeof(buf) || pread(out, buf, n, 0) != n)
		return strcpy(buf, "(unreadable)");
	buf[n] = 0;
	(void)!ftruncate(out, 0);
	lseek(out, 0, SEEK_SET);
	return buf;
}

static int capture(void)
{
	out = memfd_create("test-log", MFD_CLOEXEC);
	saved = dup(STDERR_FILENO);
	return out < 0 || saved < 0 || dup2(out, STDERR_FILENO) < 0 ? -1 : 0;
}

static int restore(void)
{
	dup2(saved, STDERR_FILENO);
	close(saved);
	close(out);
	return 0;
}

static void test_levels(void)
{
	char want[128];

	CU_ASSERT_EQUAL(snapkvd_log_parse_level("error"), SNAPKVD_LOG_ERR);
	CU_ASSERT_EQUAL(snapkvd_log_parse_level("err"), SNAPKVD_LOG_ERR);
	CU_ASSERT_EQUAL(snapkvd_log_parse_level("debug"), SNAPKVD_LOG_DEBUG);
	CU_ASSERT_EQUAL(snapkvd_log_parse_level("Debug"), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_log_parse_level(""), -EINVAL);
	unsetenv("JOURNAL_STREAM");
	snapkvd_log_init();
	snapkvd_log_max = SNAPKVD_LOG_NOTICE;
	log_info("not shown");
	log_debug("not shown %d", 1);
	CU_ASSERT_STRING_EQUAL(logged(), "");
	log_warning("shown %d", 2);
	snprintf(want, sizeof(want), "snapkvd[%d]: warning: shown 2\n", (int)getpid());
	CU_ASSERT_STRING_EQUAL(logged(), want);
	CU_ASSERT_EQUAL(log_error_errno(-ENOENT, "open %s", "x"), -ENOENT);
	snprintf(want, sizeof(want), "snapkvd[%d]: error: open x: %s\n", (int)getpid(),
		 strerror(ENOENT));
	CU_ASSERT_STRING_EQUAL(logged(), want);
	/* under journald: the priority, no name */
	setenv("JOURNAL_STREAM", "8:1", 1);
	snapkvd_log_init();
	log_notice("hello");
	CU_ASSERT_STRING_EQUAL(logged(), "<5>hello\n");
	unsetenv("JOURNAL_STREAM");
	snapkvd_log_init();
}

/* A line longer than the buffer: cut, still one line, the errno text lost
 * rather than the newline. */
static void test_long_line(void)
{
	char *big = malloc(3000), *got;

	memset(big, 'x', 2999);
	big[2999] = 0;
	snapkvd_log_max = SNAPKVD_LOG_INFO;
	log_warning_errno(-EIO, "%s", big);
	got = logged();
	CU_ASSERT_EQUAL(strlen(got), 1023);
	CU_ASSERT_EQUAL(got[1022], '\n');
	CU_ASSERT_PTR_EQUAL(strchr(got, '\n'), got + 1022); /* one line */
	free(big);
}

static void test_causes(void)
{
	struct snapkvd_log_cause c = {.what = "bad frames", .level = SNAPKVD_LOG_WARNING};
	const uint64_t s = 1000000000ull, t0 = 100 * s;
	char *got;

	snapkvd_log_max = SNAPKVD_LOG_INFO;
	snapkvd_log_cause(&c, t0, "frame %d", 1);
	got = logged();
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(got, "frame 1 (more bad frames are summarised, at most one line per 10 s)\n"));
	for (int i = 2; i <= 5; i++)
		snapkvd_log_cause(&c, t0 + (uint64_t)i * s, "frame %d", i);
	CU_ASSERT_STRING_EQUAL(logged(), ""); /* counted */
	snapkvd_log_cause_flush(&c, t0 + 9 * s, false);
	CU_ASSERT_STRING_EQUAL(logged(), ""); /* the interval has not passed */
	snapkvd_log_cause_flush(&c, t0 + 10 * s, false);
	CU_ASSERT_PTR_NOT_NULL(strstr(logged(), "4 more bad frames in the last 10 s; the last: "
						"frame 5\n"));
	snapkvd_log_cause_flush(&c, t0 + 30 * s, true);
	CU_ASSERT_STRING_EQUAL(logged(), ""); /* nothing counted since */
	/* counted, then a later event past the interval: one summary with it */
	snapkvd_log_cause(&c, t0 + 11 * s, "frame 6");
	snapkvd_log_cause(&c, t0 + 21 * s, "frame 7");
	CU_ASSERT_PTR_NOT_NULL(strstr(logged(), "2 more bad frames in the last 11 s; the last: "
						"frame 7\n"));
	/* forced at shutdown */
	snapkvd_log_cause(&c, t0 + 22 * s, "frame 8");
	snapkvd_log_cause_flush(&c, t0 + 22 * s, true);
	CU_ASSERT_PTR_NOT_NULL(strstr(logged(), "1 more bad frames"));
	/* a level filtered out: nothing written, nothing counted */
	struct snapkvd_log_cause d = {.what = "x", .level = SNAPKVD_LOG_DEBUG};
	snapkvd_log_cause(&d, t0, "y");
	CU_ASSERT_EQUAL(d.count, 0);
	CU_ASSERT_STRING_EQUAL(logged(), "");
	CU_ASSERT_STRING_EQUAL(d.last, "y");
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("log", capture, restore);
	CU_add_test(su, "levels, errno, journald", test_levels);
	CU_add_test(su, "an overlong line", test_long_line);
	CU_add_test(su, "causes summarised", test_causes);
	return t_run();
}
