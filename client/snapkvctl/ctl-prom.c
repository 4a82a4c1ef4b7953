// SPDX-License-Identifier: MIT
/*
 * ctl-prom.c - parser of the Prometheus text exposition (format 0.0.4) that
 * `snapkvctl metrics`, `top` and `pressure` read from the daemon, and
 * histogram quantiles over it. Pure functions: no socket; see ctl-prom.h.
 */
#include "ctl-prom.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
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
