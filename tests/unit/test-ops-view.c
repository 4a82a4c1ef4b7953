// SPDX-License-Identifier: MIT
/* test-ops-view: snapkvctl's Prometheus parser and the `top` frame, fed by the daemon's writer. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/snapkvctl/ctl-prom.h"
#include "client/snapkvctl/ctl-top.h"
#include "client/snapkvctl/snapkvctl.h"
#include "daemon/snapkvd-metrics.h"

static struct snapkvd_histogram secs, mass;
static struct snapkvd_stats_tenant tenants[2];
static struct snapkvd_stats st;

static void fill_stats(uint64_t compactions)
{
	snapkvd_histogram_init_seconds(&secs);
	snapkvd_histogram_init_mass(&mass);
	for (int i = 0; i < 90; i++)
		snapkvd_histogram_observe(&secs, 0.004); /* (0.0025, 0.005] */
	for (int i = 0; i < 10; i++)
		snapkvd_histogram_observe(&secs, 0.2); /* (0.1, 0.25] */
	for (int i = 0; i < 30; i++)
		snapkvd_histogram_observe(&mass, 0.97);
	for (int i = 0; i < 10; i++)
		snapkvd_histogram_observe(&mass, 0.55);
	tenants[0] = (struct snapkvd_stats_tenant){
	    .name = "alice", .uid = 1000, .used_bytes = 1ull << 30, .quota_bytes = 2ull << 30};
	tenants[1] = (struct snapkvd_stats_tenant){
	    .name = "b\"o\\b", .uid = 1001, .used_bytes = 512ull << 20};
	memset(&st, 0, sizeof(st));
	st.pool_total_bytes = 4ull << 30;
	st.pool_used_bytes = 3ull << 30;
	st.pressure_level = 1;
	st.sessions = 2;
	st.caches = 5;
	st.compactions_total = compactions;
	st.n_tenants = 2;
	st.tenants = tenants;
	st.compaction_seconds = &secs;
	st.retained_mass = &mass;
}

static void parse_stats(struct ctl_prom *p)
{
	char *buf;
	size_t len;

	CU_ASSERT_EQUAL_FATAL(snapkvd_metrics_format(&st, &buf, &len), 0);
	CU_ASSERT_EQUAL_FATAL(ctl_prom_parse(buf, len, p, NULL), 0);
	free(buf);
}

static void test_parse(void)
{
	struct ctl_prom p;
	size_t line = 0;
	const char *bad = "# HELP a b\na 1\nb{x=\"1} 2\n";

	fill_stats(100);
	parse_stats(&p);
	CU_ASSERT_DOUBLE_EQUAL(ctl_prom_get(&p, "snapkvd_pool_used_bytes", NULL, NULL),
			       3221225472.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(ctl_prom_get(&p, "snapkvd_tenant_used_bytes", "tenant", "b\"o\\b"),
			       536870912.0, 0);
	CU_ASSERT(isnan(ctl_prom_get(&p, "snapkvd_tenant_quota_bytes", "tenant", "b\"o\\b")));
	CU_ASSERT(isnan(ctl_prom_get(&p, "nope", NULL, NULL)));
	/* The two quantile implementations (daemon side, client side) agree. */
	CU_ASSERT_DOUBLE_EQUAL(ctl_prom_quantile(&p, "snapkvd_compaction_seconds", 0.5),
			       snapkvd_histogram_quantile(&secs, 0.5), 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(ctl_prom_quantile(&p, "snapkvd_compaction_seconds", 0.99),
			       snapkvd_histogram_quantile(&secs, 0.99), 1e-12);
	/* And both equal the hand computation: rank 50 of 90 in (0.0025, 0.005]. */
	CU_ASSERT_DOUBLE_EQUAL(ctl_prom_quantile(&p, "snapkvd_compaction_seconds", 0.5),
			       0.0025 + 0.0025 * 50.0 / 90.0, 1e-12);
	/* rank 99: 9th of 10 in (0.1, 0.25]. */
	CU_ASSERT_DOUBLE_EQUAL(ctl_prom_quantile(&p, "snapkvd_compaction_seconds", 0.99),
			       0.1 + 0.15 * 9.0 / 10.0, 1e-12);
	ctl_prom_free(&p);

	CU_ASSERT_EQUAL(ctl_prom_parse(bad, strlen(bad), &p, &line), -EBADMSG);
	CU_ASSERT_EQUAL(line, 3);
	CU_ASSERT_EQUAL(ctl_prom_parse("a{b=\"\\t\"} 1\n", 12, &p, NULL), -EBADMSG);
	CU_ASSERT_EQUAL(ctl_prom_parse("a 1x\n", 5, &p, NULL), -EBADMSG);
	CU_ASSERT_EQUAL(ctl_prom_parse("a 1 1700000000000\n", 18, &p, NULL), 0);
	CU_ASSERT_EQUAL(p.n, 1);
	ctl_prom_free(&p);
}

static void test_units(void)
{
	char b[32];

	ctl_fmt_iec(512, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "512 B");
	ctl_fmt_iec(1536, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "1.50 KiB");
	ctl_fmt_iec(3ull << 30, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "3.00 GiB");
	ctl_fmt_iec(2214592512ull, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "2.06 GiB");
	ctl_fmt_iec(200ull << 20, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "200 MiB");
	ctl_fmt_seconds(0.0041, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "4.1 ms");
	ctl_fmt_seconds(NAN, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "-");
}

static void test_top_frame(void)
{
	struct ctl_prom prev, cur;
	char *text = NULL;
	size_t len = 0;
	FILE *f;

	fill_stats(100);
	parse_stats(&prev);
	fill_stats(130);
	parse_stats(&cur);
	f = open_memstream(&text, &len);
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	/* width 80: bars are 40 cells. */
	ctl_top_render(f, &cur, &prev, 2.0, 80);
	fclose(f);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "pressure high"));
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "sessions 2  caches 5"));
	/* 3 of 4 GiB: 30 of 40 cells. */
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "[##############################..........] "
					    "3.00 GiB / 4.00 GiB  75.0%"));
	/* alice against its quota: half. */
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "alice (1000)"));
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "[####################....................] "
					    "1.00 GiB / quota 2.00 GiB"));
	/* bob has no quota: against the pool, 1/8 = 5 cells. */
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "b\"o\\b (1001)"));
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "[#####...................................] 512 MiB"));
	/* 30 compactions over 2 s. */
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "compactions 15.0/s  total 130  errors 0  "
					    "p50 3.9 ms  p99 235.0 ms"));
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "retained mass (40 heads)"));
	/* 30 of 40 heads in (0.95, 0.99]; 10 in (0.5, 0.6]. */
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(text, "<= 0.99  [##############################..........] 30"));
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(text, "<= 0.6   [##########..............................] 10"));
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(text, "<= 0.1   [........................................] 0"));
	if (!strstr(text, "compactions 15.0/s"))
		fputs(text, stderr);
	free(text);

	/* Without a previous sample there is no rate. */
	text = NULL;
	f = open_memstream(&text, &len);
	ctl_top_render(f, &cur, NULL, 0, 80);
	fclose(f);
	CU_ASSERT_PTR_NOT_NULL(strstr(text, "compactions -  total 130"));
	free(text);
	ctl_prom_free(&prev);
	ctl_prom_free(&cur);
}

/* ctl_top_clip: a frame cut to a terminal's width and height. */
static void clip(const char *frame, unsigned cols, unsigned rows, const char *want)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);

	CU_ASSERT_PTR_NOT_NULL_FATAL(m);
	ctl_top_clip(m, frame, strlen(frame), cols, rows);
	fclose(m);
	CU_ASSERT_STRING_EQUAL(buf, want);
	free(buf);
}

static void test_top_clip(void)
{
	clip("abcdef\nxy\n", 4, 5, "abcd\033[K\r\nxy\033[K");
	/* rows past the terminal are dropped, the last row has no newline */
	clip("1\n2\n3\n4\n", 10, 2, "1\033[K\r\n2\033[K");
	/* a UTF-8 sequence is one column and never cut in half */
	clip("\xc3\xa9t\xc3\xa9\n", 2, 1, "\xc3\xa9t\033[K");
	clip("abc", 0, 1, "\033[K");
	clip("abc\n", 3, 0, "");
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("ops-view", NULL, NULL);
	CU_add_test(s, "prometheus parser", test_parse);
	CU_add_test(s, "IEC units and durations", test_units);
	CU_add_test(s, "top frame", test_top_frame);
	CU_add_test(s, "top frame clipped to the terminal", test_top_clip);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
