/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-metrics.h - Prometheus text exposition (format 0.0.4) of the
 * daemon's counters, and an atomic textfile writer for node_exporter's
 * textfile collector.
 *
 * The daemon fills a plain struct snapkvd_stats (a snapshot, under whatever
 * lock it uses) and this module formats it; it holds no state of its own
 * except the histograms' bucket layout. Names follow the Prometheus
 * conventions: snapkvd_ prefix, base units (bytes, seconds), counters end
 * in _total.
 */
#ifndef SNAPKVD_METRICS_H
#define SNAPKVD_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct snapkvd_group_stats; /* snapkvd-group.h */

#define SNAPKVD_HIST_MAX_BUCKETS 32

/* A cumulative-on-output histogram: counts[i] counts observations in
 * (bounds[i-1], bounds[i]]; counts[n_bounds] is the +Inf bucket. */
struct snapkvd_histogram {
	uint32_t n_bounds;
	double bounds[SNAPKVD_HIST_MAX_BUCKETS];
	uint64_t counts[SNAPKVD_HIST_MAX_BUCKETS + 1];
	uint64_t count;
	double sum;
};

/* bounds must be finite and strictly increasing; -EINVAL otherwise. */
int snapkvd_histogram_init(struct snapkvd_histogram *h, const double *bounds, uint32_t n);
/* Default layouts: compaction seconds (1 ms .. 60 s) and retained mass (0.1 .. 1). */
void snapkvd_histogram_init_seconds(struct snapkvd_histogram *h);
void snapkvd_histogram_init_mass(struct snapkvd_histogram *h);
/* Kept fraction of a prompt (0.01 .. 1). */
void snapkvd_histogram_init_fraction(struct snapkvd_histogram *h);

/* Budget modes (SPEC.md), in enum skv_budget's order: the label values of
 * snapkvd_budget_kept_fraction. */
#define SNAPKVD_BUDGET_MODES 5
/* NaN observations are ignored. */
void snapkvd_histogram_observe(struct snapkvd_histogram *h, double v);
/*
 * Quantile estimate as Prometheus' histogram_quantile() computes it: linear
 * interpolation inside the bucket (lower bound 0 for the first), the
 * highest finite bound when it falls into +Inf. NaN when empty.
 */
double snapkvd_histogram_quantile(const struct snapkvd_histogram *h, double q);

enum snapkvd_cache_kind {
	SNAPKVD_CACHE_NATIVE_FULL = 0,
	SNAPKVD_CACHE_COMPACT = 1,
	SNAPKVD_CACHE_INDEX = 2,
	SNAPKVD_CACHE_RESERVED = 3,
	SNAPKVD_CACHE_ALLOCATED = 4, /* arena bytes held, alignment padding included */
};
#define SNAPKVD_CACHE_KINDS 5
const char *snapkvd_cache_kind_name(enum snapkvd_cache_kind k);

struct snapkvd_stats_tenant {
	const char *name;
	uint32_t uid;
	uint64_t used_bytes;
	uint64_t quota_bytes; /* 0: no quota (the series is omitted) */
	uint64_t caches;
	uint64_t compactions_total;
	uint64_t quota_rejections_total;
};

/* One CUDA device of --backend cuda (the label device="ORDINAL"). */
struct snapkvd_stats_device {
	int ordinal;
	uint64_t imports, import_bytes; /* engine buffers imported there */
	uint64_t arenas, arena_bytes;	/* sessions' GPU arenas there */
	uint64_t jobs_total;		/* compactions run there */
};

struct snapkvd_stats_error {
	const char *code; /* e.g. "EINVAL", "ENOSPC", "EDQUOT" */
	uint64_t count;
};

/*
 * Which per-tenant series (snapkvd_tenant_*) an exposition shows: every
 * tenant's (snapkvctl metrics as root, the textfile), one unlabelled series
 * per family summed over the tenants (quota omitted), or none of those
 * families. metrics_http_tenants picks it for the HTTP listener, which
 * asks for no credentials.
 */
enum snapkvd_metrics_tenants {
	SNAPKVD_METRICS_TENANTS_ALL = 0,
	SNAPKVD_METRICS_TENANTS_AGGREGATE,
	SNAPKVD_METRICS_TENANTS_NONE,
};

struct snapkvd_stats {
	enum snapkvd_metrics_tenants tenants_shown; /* 0: all */
	uint64_t pool_used_bytes;
	uint64_t pool_total_bytes;
	uint64_t pool_reserved_bytes; /* reserved, not yet committed */
	uint64_t arena_cached_bytes;  /* released arena pages kept for reuse */
	int pressure_level;	      /* enum snapkvd_pressure_level: 0 normal,
				       * 1 high, 2 critical; exported + 1 */
	uint64_t pressure_transitions_total;
	uint64_t sessions;
	uint64_t caches;
	uint64_t cache_bytes[SNAPKVD_CACHE_KINDS];
	uint64_t compactions_total;
	uint64_t compactions_scaled_total; /* C scaled under pressure */
	uint64_t refusals_total;	   /* -ENOSPC at critical      */
	uint64_t evictions_total;
	uint64_t evicted_bytes_total;
	uint64_t hooks_started_total;
	uint64_t hooks_failed_total; /* non-zero exit, signal, or could not start */
	uint64_t hooks_timed_out_total;
	uint64_t lingering_caches; /* released with linger, evictable */
	uint64_t lingering_bytes;
	uint64_t requests_total;
	uint64_t errors_total; /* requests answered with an error */
	uint64_t sessions_total;
	double kernel_seconds_total; /* time inside the compaction kernels */
	uint64_t workers;	     /* compaction workers; 0 omits them and the queue */
	uint64_t queue_depth;	     /* jobs submitted, not yet taken by a worker */
	size_t n_tenants;
	const struct snapkvd_stats_tenant *tenants;
	size_t n_errors;
	const struct snapkvd_stats_error *errors;
	const struct snapkvd_histogram *compaction_seconds; /* may be NULL */
	const struct snapkvd_histogram *retained_mass;	    /* may be NULL */
	/* budget modes: caches that kept the full prompt (fallback_below),
	 * and per mode the kept fraction of the prompt (mean kept per head /
	 * L) of each compaction; NULL omits the histogram */
	uint64_t fallbacks_total;
	const struct snapkvd_histogram *kept_fraction; /* [SNAPKVD_BUDGET_MODES] */
	/* decision groups (snapkvd-group.h); NULL omits them */
	const struct snapkvd_group_stats *groups;
	double start_time_seconds; /* process start, Unix time; 0 omits it */
	const char *version;	   /* snapkvd_build_info; NULL omits it */
	const char *backend;	   /* its backend label (NULL: "") */
	/* --backend cuda: every opened device (none: the series are omitted) */
	size_t n_devices;
	const struct snapkvd_stats_device *devices;
};

/*
 * Format the exposition into a malloc'd NUL-terminated buffer.
 * 0, -EINVAL (NULL stats, a NULL tenant name or error code), -ENOMEM.
 */
int snapkvd_metrics_format(const struct snapkvd_stats *s, char **ret_buf, size_t *ret_len);

/* Escaping helpers, exposed for the test and snapkvctl: label values escape
 * backslash, double quote and newline; HELP text backslash and newline. */
int snapkvd_metrics_escape_label(const char *in, char *out, size_t out_len);

/*
 * Write data to path atomically: a temporary in the same directory
 * (".<name>.tmp.XXXXXX", which the textfile collector ignores), fsync,
 * chmod to mode, rename over path. 0 or -errno; nothing is left behind on
 * failure.
 */
int snapkvd_atomic_write(const char *path, const void *data, size_t len, mode_t mode);
/* snapkvd_metrics_format() + snapkvd_atomic_write(path, ..., 0644). */
int snapkvd_metrics_write_textfile(const char *path, const struct snapkvd_stats *s);

#endif /* SNAPKVD_METRICS_H */
