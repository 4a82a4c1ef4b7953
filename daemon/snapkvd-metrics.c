// SPDX-License-Identifier: MIT
/*
 * snapkvd-metrics.c - Prometheus text exposition and atomic textfile.
 * See snapkvd-metrics.h.
 */
#include "snapkvd-metrics.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snapkvd-group.h"

int snapkvd_histogram_init(struct snapkvd_histogram *h, const double *bounds, uint32_t n)
{
	if (n > SNAPKVD_HIST_MAX_BUCKETS || (n > 0 && !bounds))
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
			return -EINVAL;
	}
	memset(h, 0, sizeof(*h));
	h->n_bounds = n;
	if (n)
		memcpy(h->bounds, bounds, n * sizeof(bounds[0]));
	return 0;
}

void snapkvd_histogram_init_seconds(struct snapkvd_histogram *h)
{
	static const double b[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
				   0.5,	  1,	  2.5,	 5,    10,    30,   60};

	snapkvd_histogram_init(h, b, sizeof(b) / sizeof(b[0]));
}

void snapkvd_histogram_init_mass(struct snapkvd_histogram *h)
{
	static const double b[] = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1};

	snapkvd_histogram_init(h, b, sizeof(b) / sizeof(b[0]));
}

void snapkvd_histogram_init_fraction(struct snapkvd_histogram *h)
{
	static const double b[] = {0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1};

	snapkvd_histogram_init(h, b, sizeof(b) / sizeof(b[0]));
}

void snapkvd_histogram_observe(struct snapkvd_histogram *h, double v)
{
	uint32_t i = 0;

	if (isnan(v))
		return;
	while (i < h->n_bounds && v > h->bounds[i])
		i++;
	h->counts[i]++;
	h->count++;
	h->sum += v;
}

double snapkvd_histogram_quantile(const struct snapkvd_histogram *h, double q)
{
	double rank, cum = 0;

	if (h->count == 0 || isnan(q))
		return NAN;
	if (q < 0)
		q = 0;
	if (q > 1)
		q = 1;
	rank = q * (double)h->count;
	for (uint32_t i = 0; i <= h->n_bounds; i++) {
		double c = (double)h->counts[i];

		if (c > 0 && cum + c >= rank) {
			double lo, hi;

			if (i == h->n_bounds)
				return h->n_bounds ? h->bounds[h->n_bounds - 1] : NAN;
			lo = i == 0 ? (h->bounds[0] > 0 ? 0 : h->bounds[0]) : h->bounds[i - 1];
			hi = h->bounds[i];
			return lo + (hi - lo) * ((rank - cum) / c);
		}
		cum += c;
	}
	return h->n_bounds ? h->bounds[h->n_bounds - 1] : NAN;
}

const char *snapkvd_cache_kind_name(enum snapkvd_cache_kind k)
{
	static const char *const names[SNAPKVD_CACHE_KINDS] = {"native_full", "compact", "index",
							       "reserved", "allocated"};

	if ((unsigned)k >= SNAPKVD_CACHE_KINDS)
		return "unknown";
	return names[k];
}

int snapkvd_metrics_escape_label(const char *in, char *out, size_t out_len)
{
	size_t o = 0;

	if (!in || !out || out_len == 0)
		return -EINVAL;
	for (const char *p = in; *p; p++) {
		const char *rep = NULL;
		char one[2] = {*p, 0};

		if (*p == '\\')
			rep = "\\\\";
		else if (*p == '"')
			rep = "\\\"";
		else if (*p == '\n')
			rep = "\\n";
		else
			rep = one;
		for (const char *r = rep; *r; r++) {
			if (o + 1 >= out_len)
				return -ENOBUFS;
			out[o++] = *r;
		}
	}
	out[o] = '\0';
	return (int)o;
}

static void put_label(FILE *f, const char *v)
{
	for (const char *p = v; *p; p++) {
		if (*p == '\\')
			fputs("\\\\", f);
		else if (*p == '"')
			fputs("\\\"", f);
		else if (*p == '\n')
			fputs("\\n", f);
		else
			fputc(*p, f);
	}
}

/* Shortest decimal that reads back as the same double; Prometheus spells
 * the special values +Inf, -Inf and NaN. */
static void put_double(FILE *f, double v)
{
	char buf[40];

	if (isnan(v)) {
		fputs("NaN", f);
		return;
	}
	if (isinf(v)) {
		fputs(v > 0 ? "+Inf" : "-Inf", f);
		return;
	}
	for (int prec = 6; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	fputs(buf, f);
}

static void head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void scalar(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
	head(f, name, type, help);
	fprintf(f, "%s %" PRIu64 "\n", name, v);
}

static void histogram(FILE *f, const char *name, const char *help,
		      const struct snapkvd_histogram *h)
{
	uint64_t cum = 0;

	head(f, name, "histogram", help);
	for (uint32_t i = 0; i < h->n_bounds; i++) {
		cum += h->counts[i];
		fprintf(f, "%s_bucket{le=\"", name);
		put_double(f, h->bounds[i]);
		fprintf(f, "\"} %" PRIu64 "\n", cum);
	}
	fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, h->count);
	fprintf(f, "%s_sum ", name);
	put_double(f, h->sum);
	fprintf(f, "\n%s_count %" PRIu64 "\n", name, h->count);
}

/* One histogram family with a series per budget mode (label mode). */
static void budget_histogram(FILE *f, const char *name, const char *help,
			     const struct snapkvd_histogram *hs)
{
	static const char *const modes[SNAPKVD_BUDGET_MODES] = {"uniform", "layers", "heads",
								"mass", "mass-heads"};

	head(f, name, "histogram", help);
	for (int m = 0; m < SNAPKVD_BUDGET_MODES; m++) {
		const struct snapkvd_histogram *h = &hs[m];
		uint64_t cum = 0;

		for (uint32_t i = 0; i < h->n_bounds; i++) {
			cum += h->counts[i];
			fprintf(f, "%s_bucket{mode=\"%s\",le=\"", name, modes[m]);
			put_double(f, h->bounds[i]);
			fprintf(f, "\"} %" PRIu64 "\n", cum);
		}
		fprintf(f, "%s_bucket{mode=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", name, modes[m],
			h->count);
		fprintf(f, "%s_sum{mode=\"%s\"} ", name, modes[m]);
		put_double(f, h->sum);
		fprintf(f, "\n%s_count{mode=\"%s\"} %" PRIu64 "\n", name, modes[m], h->count);
	}
}

static void tenant_series(FILE *f, const struct snapkvd_stats *s, const char *name,
			  const char *type, const char *help, size_t field_off, int skip_zero)
{
	uint64_t sum = 0;

	if (s->tenants_shown == SNAPKVD_METRICS_TENANTS_NONE)
		return;
	head(f, name, type, help);
	if (s->tenants_shown == SNAPKVD_METRICS_TENANTS_AGGREGATE) {
		/* no name, no uid; a sum of quotas (skip_zero) says nothing */
		for (size_t i = 0; i < s->n_tenants; i++)
			sum += *(const uint64_t *)((const char *)&s->tenants[i] + field_off);
		if (!skip_zero && s->n_tenants)
			fprintf(f, "%s %" PRIu64 "\n", name, sum);
		return;
	}
	for (size_t i = 0; i < s->n_tenants; i++) {
		const struct snapkvd_stats_tenant *t = &s->tenants[i];
		uint64_t v = *(const uint64_t *)((const char *)t + field_off);

		if (skip_zero && v == 0)
			continue;
		fprintf(f, "%s{tenant=\"", name);
		put_label(f, t->name);
		fprintf(f, "\",uid=\"%" PRIu32 "\"} %" PRIu64 "\n", t->uid, v);
	}
}

/* Pool, pressure level, sessions and the caches' ledger bytes. */
static void write_pool(FILE *f, const struct snapkvd_stats *s)
{
	scalar(f, "snapkvd_pool_total_bytes", "gauge", "Size of the daemon's memory pool.",
	       s->pool_total_bytes);
	scalar(f, "snapkvd_pool_used_bytes", "gauge", "Pool bytes in use: committed plus reserved.",
	       s->pool_used_bytes);
	scalar(f, "snapkvd_pool_reserved_bytes", "gauge",
	       "Pool bytes reserved by admissions not yet committed.", s->pool_reserved_bytes);
	scalar(f, "snapkvd_arena_cached_bytes", "gauge",
	       "Pages of released cache regions kept for reuse (arena_cache_bytes; not in the "
	       "pool).",
	       s->arena_cached_bytes);
	/* exported as the wire and snapkv.h number it (enum skv_pressure_level),
	 * the one encoding users see */
	scalar(f, "snapkvd_pressure_level", "gauge",
	       "Memory pressure level: 1 normal, 2 high, 3 critical (enum skv_pressure_level).",
	       (uint64_t)s->pressure_level + 1);
	scalar(f, "snapkvd_pressure_transitions_total", "counter", "Changes of the pressure level.",
	       s->pressure_transitions_total);
	scalar(f, "snapkvd_sessions", "gauge", "Connected engine sessions.", s->sessions);
	scalar(f, "snapkvd_caches", "gauge", "Compact caches held.", s->caches);

	head(f, "snapkvd_cache_bytes", "gauge",
	     "Ledger bytes of all caches by kind: native_full is what the engine would hold "
	     "without compaction; allocated is what the caches really occupy, padding "
	     "included.");
	for (unsigned k = 0; k < SNAPKVD_CACHE_KINDS; k++)
		fprintf(f, "snapkvd_cache_bytes{kind=\"%s\"} %" PRIu64 "\n",
			snapkvd_cache_kind_name((enum snapkvd_cache_kind)k), s->cache_bytes[k]);
}

static void write_tenants(FILE *f, const struct snapkvd_stats *s)
{
	tenant_series(f, s, "snapkvd_tenant_used_bytes", "gauge", "Pool bytes held by a tenant.",
		      offsetof(struct snapkvd_stats_tenant, used_bytes), 0);
	tenant_series(f, s, "snapkvd_tenant_quota_bytes", "gauge",
		      "Configured quota of a tenant (absent: none).",
		      offsetof(struct snapkvd_stats_tenant, quota_bytes), 1);
	tenant_series(f, s, "snapkvd_tenant_caches", "gauge", "Compact caches held by a tenant.",
		      offsetof(struct snapkvd_stats_tenant, caches), 0);
	tenant_series(f, s, "snapkvd_tenant_compactions_total", "counter",
		      "Compactions completed for a tenant.",
		      offsetof(struct snapkvd_stats_tenant, compactions_total), 0);
	tenant_series(f, s, "snapkvd_tenant_quota_rejections_total", "counter",
		      "Requests of a tenant refused with EDQUOT.",
		      offsetof(struct snapkvd_stats_tenant, quota_rejections_total), 0);
}

/* Lingering caches, requests, compactions and their errors. */
static void write_work(FILE *f, const struct snapkvd_stats *s)
{
	scalar(f, "snapkvd_lingering_caches", "gauge",
	       "Caches released with linger, kept until pressure evicts them.",
	       s->lingering_caches);
	scalar(f, "snapkvd_lingering_bytes", "gauge", "Pool bytes held by lingering caches.",
	       s->lingering_bytes);
	scalar(f, "snapkvd_requests_total", "counter", "Requests received from engines.",
	       s->requests_total);
	scalar(f, "snapkvd_errors_total", "counter", "Requests answered with an error.",
	       s->errors_total);
	scalar(f, "snapkvd_sessions_total", "counter", "Sessions accepted since start.",
	       s->sessions_total);
	head(f, "snapkvd_compaction_kernel_seconds_total", "counter",
	     "Time spent inside the compaction kernels.");
	fputs("snapkvd_compaction_kernel_seconds_total ", f);
	put_double(f, s->kernel_seconds_total);
	fputc('\n', f);
	scalar(f, "snapkvd_compactions_total", "counter", "Compactions completed.",
	       s->compactions_total);
	if (s->workers) {
		scalar(f, "snapkvd_workers", "gauge", "Compaction workers.", s->workers);
		scalar(f, "snapkvd_queue_depth", "gauge",
		       "Compactions and GROW copies waiting for a worker.", s->queue_depth);
	}
	scalar(f, "snapkvd_compactions_scaled_total", "counter",
	       "Compactions whose budget C was scaled down under pressure.",
	       s->compactions_scaled_total);
	head(f, "snapkvd_compaction_errors_total", "counter",
	     "Requests that failed, by errno name.");
	for (size_t i = 0; i < s->n_errors; i++) {
		fputs("snapkvd_compaction_errors_total{code=\"", f);
		put_label(f, s->errors[i].code);
		fprintf(f, "\"} %" PRIu64 "\n", s->errors[i].count);
	}
}

/* One gauge or counter per CUDA device, labelled device="ORDINAL". */
static void device_series(FILE *f, const struct snapkvd_stats *s, const char *name,
			  const char *type, const char *help, size_t off)
{
	head(f, name, type, help);
	for (size_t i = 0; i < s->n_devices; i++)
		fprintf(f, "%s{device=\"%d\"} %" PRIu64 "\n", name, s->devices[i].ordinal,
			*(const uint64_t *)((const char *)&s->devices[i] + off));
}

static void write_devices(FILE *f, const struct snapkvd_stats *s)
{
	device_series(f, s, "snapkvd_device_imports", "gauge",
		      "Engine buffers imported on a CUDA device (one per session and generation).",
		      offsetof(struct snapkvd_stats_device, imports));
	device_series(f, s, "snapkvd_device_import_bytes", "gauge",
		      "Bytes of the engine allocations imported on a CUDA device.",
		      offsetof(struct snapkvd_stats_device, import_bytes));
	device_series(f, s, "snapkvd_device_arenas", "gauge",
		      "Sessions' GPU arenas on a CUDA device.",
		      offsetof(struct snapkvd_stats_device, arenas));
	device_series(f, s, "snapkvd_device_arena_bytes", "gauge",
		      "Bytes of the sessions' GPU arenas on a CUDA device.",
		      offsetof(struct snapkvd_stats_device, arena_bytes));
	device_series(f, s, "snapkvd_device_compactions_total", "counter",
		      "Compactions run on a CUDA device (by its worker).",
		      offsetof(struct snapkvd_stats_device, jobs_total));
}

/* Pressure actions, hooks, histograms, start time. */
/* Decision groups: how many were decided, timed out or failed, and how
 * long the first member waited for the last. */
static void write_groups(FILE *f, const struct snapkvd_group_stats *g)
{
	uint64_t n = g->decided;

	scalar(f, "snapkvd_groups_decided_total", "counter",
	       "Decision groups whose members all arrived and were decided together.", n);
	scalar(f, "snapkvd_groups_timeouts_total", "counter",
	       "Decision groups failed at their timeout (group_timeout_ms): nothing kept.",
	       g->timeouts);
	scalar(f, "snapkvd_groups_failed_total", "counter",
	       "Decision groups failed because a member failed or its session ended.", g->failed);
	scalar(f, "snapkvd_groups_fallbacks_total", "counter",
	       "Decided groups whose members all kept the full prompt.", g->fallbacks);
	scalar(f, "snapkvd_groups_pending", "gauge", "Decision groups waiting for members.",
	       g->pending);
	scalar(f, "snapkvd_groups_parked_jobs", "gauge",
	       "Scored members waiting in a decision group for the others.", g->parked);
	histogram(f, "snapkvd_group_wait_seconds",
		  "Wait of a decided group, from its first scored member to the last.", &g->wait);
}

static void write_actions(FILE *f, const struct snapkvd_stats *s)
{
	scalar(f, "snapkvd_pressure_refusals_total", "counter",
	       "New compactions refused with ENOSPC at critical pressure.", s->refusals_total);
	scalar(f, "snapkvd_evictions_total", "counter", "Lingering caches evicted under pressure.",
	       s->evictions_total);
	scalar(f, "snapkvd_evicted_bytes_total", "counter",
	       "Pool bytes freed by evicting lingering caches.", s->evicted_bytes_total);
	scalar(f, "snapkvd_hooks_started_total", "counter", "Pressure hook processes started.",
	       s->hooks_started_total);
	scalar(f, "snapkvd_hooks_failed_total", "counter",
	       "Pressure hooks that failed to start, exited non-zero or were killed.",
	       s->hooks_failed_total);
	scalar(f, "snapkvd_hooks_timed_out_total", "counter",
	       "Pressure hooks killed after their timeout.", s->hooks_timed_out_total);
	if (s->compaction_seconds)
		histogram(f, "snapkvd_compaction_seconds",
			  "Wall time of a compaction, from admission to completion.",
			  s->compaction_seconds);
	if (s->retained_mass)
		histogram(f, "snapkvd_retained_mass",
			  "Retained attention mass per stored head and layer (1 = all kept).",
			  s->retained_mass);
	scalar(f, "snapkvd_fallbacks_total", "counter",
	       "Compactions that kept the full prompt: a head's retained mass was below "
	       "fallback_below.",
	       s->fallbacks_total);
	if (s->kept_fraction)
		budget_histogram(f, "snapkvd_budget_kept_fraction",
				 "Kept fraction of the prompt (mean kept per stored head / L) of "
				 "each compaction, by budget mode.",
				 s->kept_fraction);
	if (s->start_time_seconds > 0) {
		head(f, "snapkvd_start_time_seconds", "gauge",
		     "Start time of the daemon since the Unix epoch.");
		fputs("snapkvd_start_time_seconds ", f);
		put_double(f, s->start_time_seconds);
		fputc('\n', f);
	}
	if (s->version) {
		head(f, "snapkvd_build_info", "gauge",
		     "Always 1: the version (the project's one, libsnapkv's and snapkvd "
		     "--version's) and the compute backend as labels.");
		fputs("snapkvd_build_info{version=\"", f);
		put_label(f, s->version);
		fputs("\",backend=\"", f);
		put_label(f, s->backend ? s->backend : "");
		fputs("\"} 1\n", f);
	}
}

int snapkvd_metrics_format(const struct snapkvd_stats *s, char **ret_buf, size_t *ret_len)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f;

	if (!s || (s->n_tenants && !s->tenants) || (s->n_errors && !s->errors))
		return -EINVAL;
	for (size_t i = 0; i < s->n_tenants; i++)
		if (!s->tenants[i].name)
			return -EINVAL;
	for (size_t i = 0; i < s->n_errors; i++)
		if (!s->errors[i].code)
			return -EINVAL;
	f = open_memstream(&buf, &len);
	if (!f)
		return -ENOMEM;

	write_pool(f, s);
	write_tenants(f, s);
	write_work(f, s);
	write_actions(f, s);
	if (s->groups)
		write_groups(f, s->groups);
	if (s->n_devices)
		write_devices(f, s);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		return -ENOMEM;
	}
	*ret_buf = buf;
	*ret_len = len;
	return 0;
}

int snapkvd_atomic_write(const char *path, const void *data, size_t len, mode_t mode)
{
	const char *slash, *base;
	char tmp[PATH_MAX];
	size_t dirlen, off = 0;
	int fd, r = 0, n;

	if (!path || !*path || (len && !data))
		return -EINVAL;
	slash = strrchr(path, '/');
	base = slash ? slash + 1 : path;
	dirlen = slash ? (size_t)(slash - path) + 1 : 0;
	if (!*base)
		return -EISDIR;
	n = snprintf(tmp, sizeof(tmp), "%.*s.%s.tmp.XXXXXX", (int)dirlen, path, base);
	if (n < 0 || (size_t)n >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (off < len) {
		ssize_t k = write(fd, (const char *)data + off, len - off);

		if (k < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			break;
		}
		off += (size_t)k;
	}
	if (r == 0 && fchmod(fd, mode) < 0)
		r = -errno;
	if (r == 0 && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0)
		unlink(tmp);
	return r;
}

int snapkvd_metrics_write_textfile(const char *path, const struct snapkvd_stats *s)
{
	char *buf;
	size_t len;
	int r;

	r = snapkvd_metrics_format(s, &buf, &len);
	if (r < 0)
		return r;
	r = snapkvd_atomic_write(path, buf, len, 0644);
	free(buf);
	return r;
}
