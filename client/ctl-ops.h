/* SPDX-License-Identifier: MIT */
/*
 * ctl-ops.h - what `snapkvctl top` and `snapkvctl pressure` share: a parser
 * of the daemon's Prometheus text exposition and the pure renderers of the
 * views, kept apart from the socket code so that they can be unit-tested.
 */
#ifndef CTL_OPS_H
#define CTL_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CTL_PROM_MAX_SAMPLES 4096
#define CTL_PROM_MAX_LABELS  8
#define CTL_PROM_MAX_TEXT    (4u << 20)

struct ctl_prom_label {
	char *name;
	char *value;
};

struct ctl_prom_sample {
	char *name;
	unsigned n_labels;
	struct ctl_prom_label labels[CTL_PROM_MAX_LABELS];
	double value;
};

struct ctl_prom {
	size_t n;
	struct ctl_prom_sample *s;
};

/* Parse text format 0.0.4 (comments skipped). 0, -EBADMSG (line number in
 * *ret_line when not NULL), -E2BIG past the limits, -ENOMEM. */
int ctl_prom_parse(const char *text, size_t len, struct ctl_prom *ret, size_t *ret_line);
void ctl_prom_free(struct ctl_prom *p);
/* Value of the sample named `name` whose label `lname` is `lvalue`
 * (lname NULL: the first sample of that name). NaN when absent. */
double ctl_prom_get(const struct ctl_prom *p, const char *name, const char *lname,
		    const char *lvalue);
const char *ctl_prom_label(const struct ctl_prom_sample *s, const char *lname);

/* Quantile from the cumulative _bucket series of a histogram, as
 * Prometheus' histogram_quantile() does. NaN when empty or absent. */
double ctl_prom_quantile(const struct ctl_prom *p, const char *hist, double q);

/* "1.5 GiB", "512 B": IEC units, 3 significant digits. */
void ctl_fmt_iec(uint64_t bytes, char *buf, size_t len);
/* "4.1 ms", "1.20 s", "-" for NaN. */
void ctl_fmt_seconds(double s, char *buf, size_t len);

/*
 * One frame of `snapkvctl top`: pool bar, per-tenant bars, compactions per
 * second (from prev when given, over dt seconds), p50/p99 compaction time,
 * retained-mass histogram. width is the terminal width (>= 40).
 */
void ctl_top_render(FILE *out, const struct ctl_prom *cur, const struct ctl_prom *prev, double dt,
		    unsigned width);

#endif /* CTL_OPS_H */
