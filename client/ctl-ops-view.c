// SPDX-License-Identifier: MIT
/*
 * ctl-ops-view.c - Prometheus text parser and the `snapkvctl top` renderer.
 * Pure functions: no socket, no terminal control; see ctl-ops.h.
 */
#include "ctl-ops.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void ctl_prom_free(struct ctl_prom *p)
{
	if (!p || !p->s)
		return;
	for (size_t i = 0; i < p->n; i++) {
		free(p->s[i].name);
		for (unsigned j = 0; j < p->s[i].n_labels; j++) {
			free(p->s[i].labels[j].name);
			free(p->s[i].labels[j].value);
		}
	}
	free(p->s);
	p->s = NULL;
	p->n = 0;
}

static int is_name(int c, int first)
{
	return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

static int parse_line(const char *l, size_t len, struct ctl_prom_sample *s)
{
	const char *p = l, *end = l + len, *st;
	char num[64];
	char *e;

	memset(s, 0, sizeof(*s));
	st = p;
	while (p < end && is_name((unsigned char)*p, p == st))
		p++;
	if (p == st)
		return -EBADMSG;
	s->name = strndup(st, (size_t)(p - st));
	if (!s->name)
		return -ENOMEM;
	if (p < end && *p == '{') {
		p++;
		while (p < end && *p != '}') {
			struct ctl_prom_label *lb;
			char *v;
			size_t vl = 0;

			if (s->n_labels == CTL_PROM_MAX_LABELS)
				return -E2BIG;
			lb = &s->labels[s->n_labels];
			st = p;
			while (p < end && (isalnum((unsigned char)*p) || *p == '_'))
				p++;
			if (p == st || p + 1 >= end || p[0] != '=' || p[1] != '"')
				return -EBADMSG;
			lb->name = strndup(st, (size_t)(p - st));
			v = malloc((size_t)(end - p));
			if (!lb->name || !v) {
				free(v);
				s->n_labels++;
				return -ENOMEM;
			}
			lb->value = v;
			s->n_labels++;
			p += 2;
			while (p < end && *p != '"') {
				char c = *p++;

				if (c == '\\') {
					if (p >= end)
						return -EBADMSG;
					c = *p++;
					if (c == 'n')
						c = '\n';
					else if (c != '\\' && c != '"')
						return -EBADMSG;
				}
				v[vl++] = c;
			}
			if (p >= end)
				return -EBADMSG;
			v[vl] = '\0';
			p++;
			if (p < end && *p == ',')
				p++;
		}
		if (p >= end)
			return -EBADMSG;
		p++;
	}
	if (p >= end || (*p != ' ' && *p != '\t'))
		return -EBADMSG;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	st = p;
	while (p < end && *p != ' ' && *p != '\t')
		p++;
	if (p == st || (size_t)(p - st) >= sizeof(num))
		return -EBADMSG;
	memcpy(num, st, (size_t)(p - st));
	num[p - st] = '\0';
	if (strcmp(num, "+Inf") == 0)
		s->value = INFINITY;
	else if (strcmp(num, "-Inf") == 0)
		s->value = -INFINITY;
	else if (strcmp(num, "NaN") == 0)
		s->value = NAN;
	else {
		errno = 0;
		s->value = strtod(num, &e);
		if (*e || e == num)
			return -EBADMSG;
	}
	/* An optional timestamp may follow; it is ignored. */
	return 0;
}

int ctl_prom_parse(const char *text, size_t len, struct ctl_prom *ret, size_t *ret_line)
{
	struct ctl_prom p = {0};
	size_t cap = 0, line = 0, off = 0;
	int r = 0;

	if (len > CTL_PROM_MAX_TEXT)
		return -E2BIG;
	while (off < len) {
		const char *l = text + off;
		const char *nl = memchr(l, '\n', len - off);
		size_t ll = nl ? (size_t)(nl - l) : len - off;

		off += ll + (nl ? 1 : 0);
		line++;
		while (ll > 0 && (l[ll - 1] == '\r' || l[ll - 1] == ' '))
			ll--;
		if (ll == 0 || l[0] == '#')
			continue;
		if (p.n == CTL_PROM_MAX_SAMPLES) {
			r = -E2BIG;
			break;
		}
		if (p.n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			struct ctl_prom_sample *ns = realloc(p.s, nc * sizeof(*ns));

			if (!ns) {
				r = -ENOMEM;
				break;
			}
			p.s = ns;
			cap = nc;
		}
		r = parse_line(l, ll, &p.s[p.n]);
		p.n++; /* parse_line leaves a freeable sample even on failure */
		if (r < 0)
			break;
	}
	if (r < 0) {
		if (ret_line)
			*ret_line = line;
		ctl_prom_free(&p);
		return r;
	}
	*ret = p;
	return 0;
}

const char *ctl_prom_label(const struct ctl_prom_sample *s, const char *lname)
{
	for (unsigned i = 0; i < s->n_labels; i++)
		if (strcmp(s->labels[i].name, lname) == 0)
			return s->labels[i].value;
	return NULL;
}

double ctl_prom_get(const struct ctl_prom *p, const char *name, const char *lname,
		    const char *lvalue)
{
	for (size_t i = 0; i < p->n; i++) {
		const char *v;

		if (strcmp(p->s[i].name, name) != 0)
			continue;
		if (!lname)
			return p->s[i].value;
		v = ctl_prom_label(&p->s[i], lname);
		if (v && lvalue && strcmp(v, lvalue) == 0)
			return p->s[i].value;
	}
	return NAN;
}

double ctl_prom_quantile(const struct ctl_prom *p, const char *hist, double q)
{
	char name[160];
	double prev_le = 0, prev_cum = 0, total, rank;
	int first = 1;

	snprintf(name, sizeof(name), "%s_bucket", hist);
	total = ctl_prom_get(p, name, "le", "+Inf");
	if (isnan(total) || total <= 0)
		return NAN;
	rank = q * total;
	/* Buckets are emitted in ascending le order. */
	for (size_t i = 0; i < p->n; i++) {
		const char *les;
		double le, cum;

		if (strcmp(p->s[i].name, name) != 0)
			continue;
		les = ctl_prom_label(&p->s[i], "le");
		if (!les)
			continue;
		cum = p->s[i].value;
		if (strcmp(les, "+Inf") == 0)
			return prev_le; /* beyond the largest bound */
		le = strtod(les, NULL);
		if (cum >= rank && cum > prev_cum) {
			double lo = first && le > 0 ? 0 : prev_le;

			return lo + (le - lo) * ((rank - prev_cum) / (cum - prev_cum));
		}
		prev_le = le;
		prev_cum = cum;
		first = 0;
	}
	return NAN;
}

void ctl_fmt_iec(uint64_t bytes, char *buf, size_t len)
{
	static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	double v = (double)bytes;
	unsigned i = 0;

	while (v >= 1024.0 && i < 6) {
		v /= 1024.0;
		i++;
	}
	if (i == 0)
		snprintf(buf, len, "%" PRIu64 " B", bytes);
	else if (v >= 100)
		snprintf(buf, len, "%.0f %s", v, u[i]);
	else if (v >= 10)
		snprintf(buf, len, "%.1f %s", v, u[i]);
	else
		snprintf(buf, len, "%.2f %s", v, u[i]);
}

void ctl_fmt_seconds(double s, char *buf, size_t len)
{
	if (isnan(s))
		snprintf(buf, len, "-");
	else if (s < 1e-3)
		snprintf(buf, len, "%.0f us", s * 1e6);
	else if (s < 1)
		snprintf(buf, len, "%.1f ms", s * 1e3);
	else
		snprintf(buf, len, "%.2f s", s);
}

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
	static const char *const levels[] = {"normal", "high", "critical"};
	double used = ctl_prom_get(cur, "snapkvd_pool_used_bytes", NULL, NULL);
	double total = ctl_prom_get(cur, "snapkvd_pool_total_bytes", NULL, NULL);
	double lvl = ctl_prom_get(cur, "snapkvd_pressure_level", NULL, NULL);
	double comp = ctl_prom_get(cur, "snapkvd_compactions_total", NULL, NULL);
	double errors = 0, mass_total, mass_prev_cum = 0;
	char a[32], b[32], c[32];
	unsigned bw;
	int li = isnan(lvl) ? -1 : (int)lvl;

	if (width < 40)
		width = 40;
	bw = width > 60 ? width - 40 : 20;
	for (size_t i = 0; i < cur->n; i++)
		if (strcmp(cur->s[i].name, "snapkvd_compaction_errors_total") == 0)
			errors += cur->s[i].value;

	fprintf(out, "snapkvd  pressure %s  sessions %" PRIu64 "  caches %" PRIu64 "\n",
		li >= 0 && li <= 2 ? levels[li] : "?",
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
