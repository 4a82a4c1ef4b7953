/* SPDX-License-Identifier: MIT */
/*
 * ctl-prom.h - a parser of the daemon's Prometheus text exposition
 * (ctl-prom.c), kept apart from the socket code so that it can be
 * unit-tested against the daemon's writer.
 */
#ifndef CTL_PROM_H
#define CTL_PROM_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* CTL_PROM_H */
