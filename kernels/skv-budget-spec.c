// SPDX-License-Identifier: MIT
/*
 * skv-budget-spec.c - budget modes written as text (skv_budget_parse()) and
 * the defaults of a mass ladder (skv_budget_defaults()): one spelling for
 * snapkvctl, the engines and the Python module. Ranges are skv_plan()'s to
 * check, so every front end refuses a value with the same words.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "skv-driver.h"
#include "skv.h"

#define SPEC_MAX 4096 /* bytes of a spec, the list of 256 per-layer budgets included */

/* A finite decimal number, nothing after it. */
static int parse_float(const char *s, float *ret)
{
	char *end;
	double v;

	if (!s || !*s || strchr(" \t\n", *s))
		return -EINVAL;
	errno = 0;
	v = strtod(s, &end);
	if (*end || errno || !isfinite(v) || fabs(v) > 1e30)
		return -EINVAL;
	*ret = (float)v;
	return 0;
}

/* A decimal integer in [lo, UINT32_MAX], nothing after it. */
static int parse_u32(const char *s, uint32_t lo, uint32_t *ret)
{
	char *end;
	unsigned long long v;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (*end || errno || v < lo || v > UINT32_MAX)
		return -EINVAL;
	*ret = (uint32_t)v;
	return 0;
}

/* Split s at ':' into at most n fields (in buf); the count, or -EINVAL. */
static int split(const char *s, char *buf, size_t len, char **f, int n)
{
	int k = 0;

	if (strlen(s) >= len)
		return -EINVAL;
	strcpy(buf, s);
	for (char *p = buf;; k++) {
		if (k == n)
			return -EINVAL;
		f[k] = p;
		p = strchr(p, ':');
		if (!p)
			return k + 1;
		*p++ = '\0';
	}
}

static int parse_list(char *s, struct skv_params *p, struct skv_error *err)
{
	char *save = NULL;

	p->n_layer_caps = 0;
	for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (p->n_layer_caps == SKV_MAX_LAYER_CAPS)
			return skv_fail(err, -1, -1, "layers: more than %d per-layer budgets",
					SKV_MAX_LAYER_CAPS);
		if (parse_u32(tok, 1, &p->layer_caps[p->n_layer_caps++]) < 0)
			return skv_fail(err, -1, -1, "layers: \"%.32s\" is not a positive integer",
					tok);
	}
	if (!p->n_layer_caps)
		return skv_fail(err, -1, -1, "layers: give C0,C1,.. (one per layer)");
	return 0;
}

/* mass:TAU[:CMIN:CMAX:STEP] and mass-heads:TAU[:CMIN:CMAX] (n fields). */
static int parse_mass(char **f, int n, struct skv_params *p, struct skv_error *err)
{
	p->budget_mode = f[0][4] ? SKV_BUDGET_MASS_HEADS : SKV_BUDGET_MASS;
	if (parse_float(f[1], &p->tau) < 0)
		return skv_fail(err, -1, -1, "%s: \"%.32s\" is not a number", f[0], f[1]);
	if (n < 4)
		return 0;
	if (parse_u32(f[2], 0, &p->c_min) < 0 || parse_u32(f[3], 0, &p->c_max) < 0 ||
	    (n == 5 && parse_u32(f[4], 0, &p->c_step) < 0))
		return skv_fail(err, -1, -1,
				"%s: C_min, C_max and step must be non-negative integers", f[0]);
	if (p->c_min == 0 || p->c_max == 0 || (n == 5 && p->c_step == 0))
		return skv_fail(err, -1, -1, "%s: C_min, C_max%s must be at least 1", f[0],
				n == 5 ? " and step" : "");
	return 0;
}

int skv_budget_parse(const char *spec, struct skv_params *p, struct skv_error *err)
{
	char buf[SPEC_MAX], *f[6];
	int n;

	skv_error_clear(err);
	if (!spec || !p)
		return skv_fail(err, -1, -1, "no budget to parse");
	n = split(spec, buf, sizeof(buf), f, 6);
	if (n < 0)
		return skv_fail(err, -1, -1, "\"%.64s\" has too many fields or is too long", spec);
	p->c_min = p->c_max = p->c_step = 0; /* 0: skv_budget_defaults() */
	if (!strcmp(f[0], "uniform") && n == 1) {
		p->budget_mode = SKV_BUDGET_UNIFORM;
	} else if (!strcmp(f[0], "layers") && n == 2) {
		p->budget_mode = SKV_BUDGET_LAYERS;
		p->pyramid_r = 0;
		return parse_list(f[1], p, err);
	} else if (!strcmp(f[0], "pyramid") && n == 2) {
		p->budget_mode = SKV_BUDGET_LAYERS;
		p->n_layer_caps = 0;
		if (parse_float(f[1], &p->pyramid_r) < 0)
			return skv_fail(err, -1, -1, "pyramid: \"%.32s\" is not a number", f[1]);
	} else if (!strcmp(f[0], "heads") && n <= 2) {
		p->budget_mode = SKV_BUDGET_HEADS;
		if (n == 2 && parse_float(f[1], &p->head_floor) < 0)
			return skv_fail(err, -1, -1, "heads: \"%.32s\" is not a number", f[1]);
	} else if ((!strcmp(f[0], "mass") && (n == 2 || n == 5)) ||
		   (!strcmp(f[0], "mass-heads") && (n == 2 || n == 4))) {
		return parse_mass(f, n, p, err);
	} else {
		return skv_fail(err, -1, -1,
				"\"%.64s\" is not uniform, layers:C0,C1,.., pyramid:R, heads[:A], "
				"mass:TAU[:CMIN:CMAX:STEP] or mass-heads:TAU[:CMIN:CMAX]",
				spec);
	}
	return 0;
}

void skv_budget_defaults(struct skv_params *p)
{
	if (!p || (p->budget_mode != SKV_BUDGET_MASS && p->budget_mode != SKV_BUDGET_MASS_HEADS))
		return;
	if (!p->c_max)
		p->c_max = p->budget;
	if (!p->c_min)
		p->c_min = p->window + 1 < p->c_max ? p->window + 1 : p->c_max;
	if (!p->c_step) {
		uint32_t span = p->c_max > p->window ? p->c_max - p->window : 1;

		p->c_step = span / 16 ? span / 16 : 1;
	}
}
