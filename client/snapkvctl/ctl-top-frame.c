// SPDX-License-Identifier: MIT
/*
 * ctl-top-frame.c - one frame of `snapkvctl top` drawn from the parsed
 * metrics. Pure: no socket, no terminal control (ctl-top.c does those).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctl-prom.h"
#include "ctl-top.h"
#include "snapkvctl.h"

static void bar(FILE *out, double frac, unsigned w)
{
	unsigned fill;

	if (isnan(frac) || frac < 0)
		frac = 0;
	if (frac > 1)
		frac = 1;
	fill = (unsigned)lround(frac * w);
	fputc('[', out);
	for (unsigned i = 0; i < w; i++)
		fputc(i < fill ? '#' : '.', out);
	fputc(']', out);
}

static uint64_t u64(double v)
{
	return isnan(v) || v < 0 ? 0 : v >= 1.8e19 ? UINT64_MAX : (uint64_t)v;
}

void ctl_top_render(FILE *out, const struct ctl_prom *cur, const struct ctl_prom *prev, double dt,
		    unsigned width)
{
	double used = ctl_prom_get(cur, "snapkvd_pool_used_bytes", NULL, NULL);
	double total = ctl_prom_get(cur, "snapkvd_pool_total_bytes", NULL, NULL);
	double lvl = ctl_prom_get(cur, "snapkvd_pressure_level", NULL, NULL);
	double comp = ctl_prom_get(cur, "snapkvd_compactions_total", NULL, NULL);
	double errors = 0, mass_total, mass_prev_cum = 0;
	char a[32], b[32], c[32];
	unsigned bw;

	if (width < 40)
		width = 40;
	bw = width > 60 ? width - 40 : 20;
	for (size_t i = 0; i < cur->n; i++)
		if (strcmp(cur->s[i].name, "snapkvd_compaction_errors_total") == 0)
			errors += cur->s[i].value;

	fprintf(out, "snapkvd  pressure %s  sessions %" PRIu64 "  caches %" PRIu64 "\n",
		ctl_pressure_name(ctl_pressure_from_metric(lvl)),
		u64(ctl_prom_get(cur, "snapkvd_sessions", NULL, NULL)),
		u64(ctl_prom_get(cur, "snapkvd_caches", NULL, NULL)));
	ctl_fmt_iec(u64(used), a, sizeof(a));
	ctl_fmt_iec(u64(total), b, sizeof(b));
	fprintf(out, "%-22s ", "pool");
	bar(out, total > 0 ? used / total : 0, bw);
	fprintf(out, " %s / %s %5.1f%%\n", a, b, total > 0 ? 100.0 * used / total : 0.0);

	for (size_t i = 0; i < cur->n; i++) {
		const struct ctl_prom_sample *s = &cur->s[i];
		const char *t = ctl_prom_label(s, "tenant");
		const char *uid = ctl_prom_label(s, "uid");
		double quota;
		char label[64];

		if (strcmp(s->name, "snapkvd_tenant_used_bytes") != 0 || !t)
			continue;
		quota = ctl_prom_get(cur, "snapkvd_tenant_quota_bytes", "tenant", t);
		snprintf(label, sizeof(label), "%.12s (%s)", t, uid ? uid : "?");
		ctl_fmt_iec(u64(s->value), a, sizeof(a));
		fprintf(out, "  %-20s ", label);
		/* A tenant's bar is against its quota, or the pool without one. */
		bar(out,
		    !isnan(quota) && quota > 0 ? s->value / quota
		    : total > 0		       ? s->value / total
					       : 0,
		    bw);
		if (!isnan(quota) && quota > 0) {
			ctl_fmt_iec(u64(quota), b, sizeof(b));
			fprintf(out, " %s / quota %s\n", a, b);
		} else {
			fprintf(out, " %s\n", a);
		}
	}

	if (prev && dt > 0) {
		double pc = ctl_prom_get(prev, "snapkvd_compactions_total", NULL, NULL);

		if (!isnan(pc) && !isnan(comp) && comp >= pc)
			snprintf(a, sizeof(a), "%.1f/s", (comp - pc) / dt);
		else
			snprintf(a, sizeof(a), "-");
	} else {
		snprintf(a, sizeof(a), "-");
	}
	ctl_fmt_seconds(ctl_prom_quantile(cur, "snapkvd_compaction_seconds", 0.5), b, sizeof(b));
	ctl_fmt_seconds(ctl_prom_quantile(cur, "snapkvd_compaction_seconds", 0.99), c, sizeof(c));
	fprintf(out, "compactions %s  total %" PRIu64 "  errors %" PRIu64 "  p50 %s  p99 %s\n", a,
		u64(comp), u64(errors), b, c);

	mass_total = ctl_prom_get(cur, "snapkvd_retained_mass_bucket", "le", "+Inf");
	fprintf(out, "retained mass (%" PRIu64 " heads)\n", u64(mass_total));
	for (size_t i = 0; i < cur->n; i++) {
		const struct ctl_prom_sample *s = &cur->s[i];
		const char *le = ctl_prom_label(s, "le");
		double n;

		if (strcmp(s->name, "snapkvd_retained_mass_bucket") != 0 || !le)
			continue;
		n = s->value - mass_prev_cum;
		mass_prev_cum = s->value;
		if (strcmp(le, "+Inf") == 0)
			continue; /* mass never exceeds 1 */
		fprintf(out, "  <= %-5s ", le);
		bar(out, mass_total > 0 ? n / mass_total : 0, bw);
		fprintf(out, " %" PRIu64 "\n", u64(n));
	}
}

void ctl_top_clip(FILE *out, const char *frame, size_t len, unsigned cols, unsigned rows)
{
	size_t off = 0;

	for (unsigned row = 0; row < rows && off < len; row++) {
		const char *l = frame + off;
		const char *nl = memchr(l, '\n', len - off);
		size_t ll = nl ? (size_t)(nl - l) : len - off, cut = 0;
		unsigned col = 0;

		off += ll + (nl ? 1 : 0);
		/* a column starts at each byte that is not a UTF-8 continuation */
		while (cut < ll) {
			if (((unsigned char)l[cut] & 0xc0) != 0x80 && col++ == cols)
				break;
			cut++;
		}
		fwrite(l, 1, cut, out);
		fputs("\033[K", out);
		if (row + 1 < rows && off < len)
			fputs("\r\n", out);
	}
}
