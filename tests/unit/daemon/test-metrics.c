// SPDX-License-Identifier: MIT
/* test-metrics (daemon/snapkvd-metrics.c): the exposition parses back under the text-format
 * grammar, values round-trip. */
#include <CUnit/Basic.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/snapkvd-group.h"
#include "daemon/snapkvd-metrics.c"

/* ---- a small, strict parser of the Prometheus text format 0.0.4 ---- */

#define MAX_SAMPLES  512
#define MAX_FAMILIES 64

struct sample {
	char name[128];
	char labels[512]; /* canonical: k="unescaped v",k2=... in input order */
	double value;
};

struct family {
	char name[128];
	char type[16];
	int has_help;
	int n_samples;
};

struct parsed {
	struct sample s[MAX_SAMPLES];
	int n;
	struct family f[MAX_FAMILIES];
	int nf;
	char err[256];
};

static int name_char(int c, int first)
{
	return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

static int parse_value(const char *p, const char **end, double *v)
{
	char *e;

	if (strncmp(p, "+Inf", 4) == 0) {
		*v = INFINITY;
		*end = p + 4;
		return 0;
	}
	if (strncmp(p, "-Inf", 4) == 0) {
		*v = -INFINITY;
		*end = p + 4;
		return 0;
	}
	if (strncmp(p, "NaN", 3) == 0) {
		*v = NAN;
		*end = p + 3;
		return 0;
	}
	if (!(isdigit((unsigned char)*p) || *p == '-' || *p == '+' || *p == '.'))
		return -1;
	errno = 0;
	*v = strtod(p, &e);
	if (e == p || errno)
		return -1;
	*end = e;
	return 0;
}

/* The family a sample belongs to: histogram suffixes map to their base. */
static struct family *family_of(struct parsed *ps, const char *name)
{
	for (int i = 0; i < ps->nf; i++) {
		size_t n = strlen(ps->f[i].name);

		if (strcmp(ps->f[i].name, name) == 0)
			return &ps->f[i];
		if (strcmp(ps->f[i].type, "histogram") == 0 &&
		    strncmp(name, ps->f[i].name, n) == 0 &&
		    (!strcmp(name + n, "_bucket") || !strcmp(name + n, "_sum") ||
		     !strcmp(name + n, "_count")))
			return &ps->f[i];
	}
	return NULL;
}

static int fail(struct parsed *ps, int line, const char *why)
{
	snprintf(ps->err, sizeof(ps->err), "line %d: %s", line, why);
	return -1;
}

static int parse_exposition(const char *text, struct parsed *ps)
{
	const char *p = text;
	int line = 0;
	struct family *cur = NULL;

	memset(ps, 0, sizeof(*ps));
	if (!*text || text[strlen(text) - 1] != '\n')
		return fail(ps, 0, "must end with a newline");
	while (*p) {
		const char *eol = strchr(p, '\n');
		char buf[1024];
		size_t len = (size_t)(eol - p);

		line++;
		if (len >= sizeof(buf))
			return fail(ps, line, "line too long");
		memcpy(buf, p, len);
		buf[len] = '\0';
		p = eol + 1;
		if (len == 0)
			return fail(ps, line, "empty line");
		if (buf[0] == '#') {
			char kw[8], name[128], rest[512] = "";
			int n = sscanf(buf, "# %7s %127s %511[^\n]", kw, name, rest);

			if (n < 2)
				return fail(ps, line, "bad comment");
			for (const char *q = name; *q; q++)
				if (!name_char((unsigned char)*q, q == name))
					return fail(ps, line, "bad metric name in comment");
			if (strcmp(kw, "HELP") == 0) {
				struct family *f = family_of(ps, name);

				if (f && f->n_samples)
					return fail(ps, line, "HELP after samples");
				if (!f) {
					if (ps->nf == MAX_FAMILIES)
						return fail(ps, line, "too many families");
					f = &ps->f[ps->nf++];
					snprintf(f->name, sizeof(f->name), "%s", name);
				}
				if (f->has_help)
					return fail(ps, line, "duplicate HELP");
				f->has_help = 1;
				cur = f;
			} else if (strcmp(kw, "TYPE") == 0) {
				struct family *f = family_of(ps, name);
				static const char *types[] = {"counter", "gauge", "histogram",
							      "summary", "untyped"};
				int ok = 0;

				for (size_t i = 0; i < 5; i++)
					ok |= strcmp(rest, types[i]) == 0;
				if (!ok)
					return fail(ps, line, "unknown TYPE");
				if (!f || f->type[0])
					return fail(ps, line, "TYPE without HELP or twice");
				if (f->n_samples)
					return fail(ps, line, "TYPE after samples");
				snprintf(f->type, sizeof(f->type), "%.15s", rest);
				cur = f;
			} else {
				return fail(ps, line, "unknown comment keyword");
			}
			continue;
		}
		/* sample: name [{labels}] value */
		struct sample *s;
		const char *q = buf, *e;
		size_t nl = 0, lo = 0;

		if (ps->n == MAX_SAMPLES)
			return fail(ps, line, "too many samples");
		s = &ps->s[ps->n];
		while (name_char((unsigned char)*q, q == buf)) {
			if (nl + 1 >= sizeof(s->name))
				return fail(ps, line, "name too long");
			s->name[nl++] = *q++;
		}
		s->name[nl] = '\0';
		if (nl == 0)
			return fail(ps, line, "no metric name");
		if (*q == '{') {
			q++;
			while (*q != '}') {
				const char *ln = q;

				if (!name_char((unsigned char)*q, 1) || *q == ':')
					return fail(ps, line, "bad label name");
				while (isalnum((unsigned char)*q) || *q == '_')
					q++;
				if (q[0] != '=' || q[1] != '"')
					return fail(ps, line, "expected =\"");
				lo += (size_t)snprintf(s->labels + lo, sizeof(s->labels) - lo,
						       "%s%.*s=", lo ? "," : "", (int)(q - ln), ln);
				q += 2;
				while (*q != '"') {
					char c = *q;

					if (!c)
						return fail(ps, line, "unterminated label value");
					if (c == '\\') {
						q++;
						if (*q == 'n')
							c = '\n';
						else if (*q == '\\' || *q == '"')
							c = *q;
						else
							return fail(ps, line, "bad escape");
					}
					if (lo + 2 >= sizeof(s->labels))
						return fail(ps, line, "labels too long");
					s->labels[lo++] = c;
					q++;
				}
				s->labels[lo] = '\0';
				q++;
				if (*q == ',')
					q++;
				else if (*q != '}')
					return fail(ps, line, "expected , or }");
			}
			q++;
		}
		if (*q != ' ')
			return fail(ps, line, "expected one space before the value");
		q++;
		if (parse_value(q, &e, &s->value) < 0)
			return fail(ps, line, "bad value");
		if (*e != '\0')
			return fail(ps, line, "trailing garbage (timestamps are not emitted)");
		{
			struct family *f = family_of(ps, s->name);

			if (!f || !f->type[0])
				return fail(ps, line, "sample without HELP/TYPE");
			if (f != cur)
				return fail(ps, line, "samples of a family not contiguous");
			if (strcmp(f->type, "counter") == 0 &&
			    (strlen(f->name) < 6 ||
			     strcmp(f->name + strlen(f->name) - 6, "_total")))
				return fail(ps, line, "counter name must end in _total");
			f->n_samples++;
		}
		ps->n++;
	}
	return 0;
}

static const struct sample *find(const struct parsed *ps, const char *name, const char *labels)
{
	for (int i = 0; i < ps->n; i++)
		if (strcmp(ps->s[i].name, name) == 0 && strcmp(ps->s[i].labels, labels) == 0)
			return &ps->s[i];
	return NULL;
}

static double val(const struct parsed *ps, const char *name, const char *labels)
{
	const struct sample *s = find(ps, name, labels);

	CU_ASSERT_PTR_NOT_NULL(s);
	if (!s)
		fprintf(stderr, "missing %s{%s}\n", name, labels);
	return s ? s->value : NAN;
}

/* ---- tests ---- */

static struct parsed ps;

static void test_parser_rejects(void)
{
	/* The parser itself must be able to fail, or the round trip proves nothing. */
	const char *bad[] = {
	    "x 1\n",
	    "# HELP x h\n# TYPE x gauge\nx{a=\"b} 1\n",
	    "# HELP x h\n# TYPE x gauge\nx{a=\"\\t\"} 1\n",
	    "# HELP x h\n# TYPE x gauge\nx  1\n",
	    "# HELP x h\n# TYPE x counter\nx 1\n",
	    "# HELP x h\n# TYPE x gauge\nx one\n",
	    "# HELP x h\n# TYPE x gauge\nx 1",
	    "# HELP x h\n# TYPE x gauge\n# HELP y h\n# TYPE y gauge\ny 1\nx 1\n",
	    "# HELP 1x h\n# TYPE 1x gauge\n",
	    "# HELP x h\n# TYPE x flavour\n",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CU_ASSERT_EQUAL(parse_exposition(bad[i], &ps), -1);
	CU_ASSERT_EQUAL(parse_exposition("# HELP x_total h\n# TYPE x_total counter\n"
					 "x_total{a=\"q\\\"\\\\\\n\",b=\"\"} 1e3\n",
					 &ps),
			0);
	CU_ASSERT_EQUAL(ps.n, 1);
	CU_ASSERT_STRING_EQUAL(ps.s[0].labels, "a=q\"\\\n,b=");
	CU_ASSERT_DOUBLE_EQUAL(ps.s[0].value, 1000, 0);
}

static void test_round_trip(void)
{
	struct snapkvd_histogram secs, mass;
	const struct snapkvd_stats_tenant tenants[] = {
	    {.name = "alice",
	     .uid = 1000,
	     .used_bytes = 123456789,
	     .quota_bytes = 1ull << 30,
	     .caches = 3,
	     .compactions_total = 17,
	     .quota_rejections_total = 2},
	    {.name = "we\"ird\\na\nme",
	     .uid = 4294967294u,
	     .used_bytes = 0,
	     .quota_bytes = 0,
	     .caches = 0,
	     .compactions_total = 0,
	     .quota_rejections_total = 0},
	};
	const struct snapkvd_stats_error errs[] = {{"EINVAL", 4}, {"EDQUOT", 2}, {"ENOSPC", 1}};
	struct snapkvd_stats st = {
	    .pool_used_bytes = 900000000000ull,
	    .pool_total_bytes = 1099511627776ull,
	    .pool_reserved_bytes = 4096,
	    .pressure_level = 2,
	    .pressure_transitions_total = 5,
	    .sessions = 2,
	    .caches = 3,
	    .cache_bytes = {2214592512ull, 805306368ull, 6291456ull, 131072ull, 815000000ull},
	    .compactions_total = 18446744073709551615ull,
	    .compactions_scaled_total = 7,
	    .refusals_total = 1,
	    .evictions_total = 9,
	    .evicted_bytes_total = 8192,
	    .hooks_started_total = 4,
	    .hooks_failed_total = 1,
	    .hooks_timed_out_total = 1,
	    .lingering_caches = 2,
	    .lingering_bytes = 65536,
	    .requests_total = 1234,
	    .errors_total = 7,
	    .sessions_total = 11,
	    .kernel_seconds_total = 0.125,
	    .n_tenants = 2,
	    .tenants = tenants,
	    .n_errors = 3,
	    .errors = errs,
	    .compaction_seconds = &secs,
	    .retained_mass = &mass,
	    .start_time_seconds = 1764417600.25,
	};
	struct snapkvd_group_stats gs = {
	    .decided = 3, .timeouts = 2, .failed = 1, .fallbacks = 1, .pending = 4, .parked = 5};
	const double obs[] = {0.0004, 0.003, 0.003, 0.7, 120.0};
	char *buf = NULL;
	size_t len = 0;
	char lbl[128];

	snapkvd_histogram_init_seconds(&secs);
	snapkvd_histogram_init_mass(&mass);
	for (size_t i = 0; i < 5; i++)
		snapkvd_histogram_observe(&secs, obs[i]);
	snapkvd_histogram_observe(&mass, 0.93);
	snapkvd_histogram_observe(&mass, 1.0);
	snapkvd_histogram_observe(&mass, NAN); /* ignored */
	snapkvd_histogram_init_seconds(&gs.wait);
	for (size_t i = 0; i < 3; i++)
		snapkvd_histogram_observe(&gs.wait, obs[i]);
	st.groups = &gs;

	CU_ASSERT_EQUAL_FATAL(snapkvd_metrics_format(&st, &buf, &len), 0);
	CU_ASSERT_EQUAL(len, strlen(buf));
	if (parse_exposition(buf, &ps) != 0) {
		fprintf(stderr, "%s\n%s", ps.err, buf);
		CU_FAIL("exposition does not parse");
	}
	/* Every family has HELP and TYPE. */
	for (int i = 0; i < ps.nf; i++) {
		CU_ASSERT(ps.f[i].has_help);
		CU_ASSERT(ps.f[i].type[0] != '\0');
	}
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_pool_used_bytes", ""), 900000000000.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_pool_total_bytes", ""), 1099511627776.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_pool_reserved_bytes", ""), 4096, 0);
	/* critical, numbered as enum skv_pressure_level and the wire */
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_pressure_level", ""), 3, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_pressure_transitions_total", ""), 5, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compactions_total", ""), 18446744073709551615.0,
			       0);
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "\nsnapkvd_compactions_total 18446744073709551615\n"));
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_cache_bytes", "kind=native_full"), 2214592512.0,
			       0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_cache_bytes", "kind=compact"), 805306368.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_cache_bytes", "kind=index"), 6291456.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_cache_bytes", "kind=reserved"), 131072.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_cache_bytes", "kind=allocated"), 815000000.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_tenant_used_bytes", "tenant=alice,uid=1000"),
			       123456789.0, 0);
	snprintf(lbl, sizeof(lbl), "tenant=%s,uid=4294967294", tenants[1].name);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_tenant_used_bytes", lbl), 0, 0);
	/* No quota: no series. */
	CU_ASSERT_PTR_NULL(find(&ps, "snapkvd_tenant_quota_bytes", lbl));
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_tenant_quota_bytes", "tenant=alice,uid=1000"),
			       1073741824.0, 0);
	CU_ASSERT_DOUBLE_EQUAL(
	    val(&ps, "snapkvd_tenant_quota_rejections_total", "tenant=alice,uid=1000"), 2, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_errors_total", "code=EINVAL"), 4, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_errors_total", "code=EDQUOT"), 2, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_pressure_refusals_total", ""), 1, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_evictions_total", ""), 9, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_hooks_timed_out_total", ""), 1, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_start_time_seconds", ""), 1764417600.25, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_lingering_caches", ""), 2, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_lingering_bytes", ""), 65536, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_requests_total", ""), 1234, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_errors_total", ""), 7, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_sessions_total", ""), 11, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_kernel_seconds_total", ""), 0.125, 0);

	/* Histogram: cumulative buckets computed here independently. */
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_bucket", "le=0.001"), 1, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_bucket", "le=0.0025"), 1, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_bucket", "le=0.005"), 3, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_bucket", "le=0.5"), 3, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_bucket", "le=1"), 4, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_bucket", "le=60"), 4, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_bucket", "le=+Inf"), 5, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_count", ""), 5, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_compaction_seconds_sum", ""),
			       0.0004 + 0.003 + 0.003 + 0.7 + 120.0, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_retained_mass_bucket", "le=0.9"), 0, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_retained_mass_bucket", "le=0.95"), 1, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_retained_mass_bucket", "le=1"), 2, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_retained_mass_count", ""), 2, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_retained_mass_sum", ""), 1.93, 1e-12);
	/* decision groups */
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_groups_decided_total", ""), 3, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_groups_timeouts_total", ""), 2, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_groups_failed_total", ""), 1, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_groups_fallbacks_total", ""), 1, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_groups_pending", ""), 4, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_groups_parked_jobs", ""), 5, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_group_wait_seconds_bucket", "le=0.001"), 1, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_group_wait_seconds_bucket", "le=0.005"), 3, 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_group_wait_seconds_count", ""), 3, 0);
	/* Buckets never decrease and end at _count. */
	{
		double prev = -1;

		for (int i = 0; i < ps.n; i++) {
			if (strcmp(ps.s[i].name, "snapkvd_compaction_seconds_bucket") == 0) {
				CU_ASSERT(ps.s[i].value >= prev);
				prev = ps.s[i].value;
			}
		}
		CU_ASSERT_DOUBLE_EQUAL(prev, 5, 0);
	}
	free(buf);

	/* Bad input. */
	st.tenants = NULL;
	CU_ASSERT_EQUAL(snapkvd_metrics_format(&st, &buf, &len), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_metrics_format(NULL, &buf, &len), -EINVAL);
}

static void test_histogram_quantile(void)
{
	const double b[] = {1, 2, 4};
	const double bad[] = {1, 1};
	struct snapkvd_histogram h;

	CU_ASSERT_EQUAL(snapkvd_histogram_init(&h, bad, 2), -EINVAL);
	CU_ASSERT_EQUAL_FATAL(snapkvd_histogram_init(&h, b, 3), 0);
	CU_ASSERT(isnan(snapkvd_histogram_quantile(&h, 0.5)));
	snapkvd_histogram_observe(&h, 0.5);
	snapkvd_histogram_observe(&h, 1.5);
	snapkvd_histogram_observe(&h, 1.5);
	snapkvd_histogram_observe(&h, 3);
	snapkvd_histogram_observe(&h, 10);
	CU_ASSERT_EQUAL(h.counts[0], 1);
	CU_ASSERT_EQUAL(h.counts[1], 2);
	CU_ASSERT_EQUAL(h.counts[2], 1);
	CU_ASSERT_EQUAL(h.counts[3], 1);
	/* rank 2.5 in (1, 2] holding ranks 1..3: 1 + 1.5/2. */
	CU_ASSERT_DOUBLE_EQUAL(snapkvd_histogram_quantile(&h, 0.5), 1.75, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(snapkvd_histogram_quantile(&h, 0.1), 0.5, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(snapkvd_histogram_quantile(&h, 0.7), 3.0, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(snapkvd_histogram_quantile(&h, 0.99), 4.0, 1e-12);
	/* Exactly on a bound counts into that bucket (le is inclusive). */
	snapkvd_histogram_init(&h, b, 3);
	snapkvd_histogram_observe(&h, 2.0);
	CU_ASSERT_EQUAL(h.counts[1], 1);
}

static void test_label_escape(void)
{
	char out[32];

	CU_ASSERT_EQUAL(snapkvd_metrics_escape_label("a\"b\\c\nd", out, sizeof(out)), 10);
	CU_ASSERT_STRING_EQUAL(out, "a\\\"b\\\\c\\nd");
	CU_ASSERT_EQUAL(snapkvd_metrics_escape_label("abcdef", out, 4), -ENOBUFS);
}

static void test_atomic_textfile(void)
{
	char dir[256], path[300], bad[300];
	struct snapkvd_stats st = {.pool_total_bytes = 1000, .pool_used_bytes = 10};
	struct stat sb;
	struct dirent *de;
	DIR *d;
	FILE *f;
	char content[8192];
	size_t n;
	int entries = 0;

	snprintf(dir, sizeof(dir), "%s/snapkvd-metrics-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/snapkvd.prom", dir);
	CU_ASSERT_EQUAL(snapkvd_atomic_write(path, "old\n", 4, 0600), 0);
	CU_ASSERT_EQUAL(snapkvd_metrics_write_textfile(path, &st), 0);
	CU_ASSERT_EQUAL(stat(path, &sb), 0);
	CU_ASSERT_EQUAL(sb.st_mode & 0777, 0644);
	f = fopen(path, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	n = fread(content, 1, sizeof(content) - 1, f);
	content[n] = '\0';
	fclose(f);
	CU_ASSERT_EQUAL(parse_exposition(content, &ps), 0);
	CU_ASSERT_DOUBLE_EQUAL(val(&ps, "snapkvd_pool_used_bytes", ""), 10, 0);
	/* No temporary left behind. */
	d = opendir(dir);
	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' || strstr(de->d_name, ".tmp."))
			entries++;
	closedir(d);
	CU_ASSERT_EQUAL(entries, 1);
	snprintf(bad, sizeof(bad), "%s/missing/snapkvd.prom", dir);
	CU_ASSERT_EQUAL(snapkvd_metrics_write_textfile(bad, &st), -ENOENT);
	CU_ASSERT_EQUAL(snapkvd_atomic_write(dir, "x", 1, 0644) < 0, 1); /* a directory */
	CU_ASSERT_EQUAL(unlink(path), 0);
	CU_ASSERT_EQUAL(rmdir(dir), 0);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("metrics", NULL, NULL);
	CU_add_test(s, "test parser rejects bad text", test_parser_rejects);
	CU_add_test(s, "exposition parses back, values round-trip", test_round_trip);
	CU_add_test(s, "histogram quantiles", test_histogram_quantile);
	CU_add_test(s, "label escaping", test_label_escape);
	CU_add_test(s, "atomic textfile", test_atomic_textfile);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
