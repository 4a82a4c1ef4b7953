// SPDX-License-Identifier: MIT
/*
 * ctl-budget.c - the --budget and --fallback-below values of `compact`
 * (SPEC.md "Budgets beyond one C"): parsed into struct skv_params, with the
 * CLI's defaults for what a value leaves out. Ranges are libskv's to check
 * (skv_plan), so the CLI and the daemon refuse with the same words.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"
#include "snapkvctl.h"

/* A finite decimal number, nothing after it. */
int ctl_parse_float(const char *s, float *ret)
{
	char *end;

	if (!s || !*s || strchr(" \t\n", *s))
		return -EINVAL;
	errno = 0;
	double v = strtod(s, &end);
	if (*end || errno || !isfinite(v) || fabs(v) > 1e30)
		return -EINVAL;
	*ret = (float)v;
	return 0;
}

/* Split `s` at ':' into at most n fields (copies in buf); returns the count
 * or -EINVAL when there are more. */
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

static int parse_list(const char *cmd, char *s, struct skv_params *p)
{
	p->n_layer_caps = 0;
	for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
		if (p->n_layer_caps == SKV_MAX_LAYER_CAPS) {
			ctl_err(cmd, "--budget layers: more than %d per-layer budgets",
				SKV_MAX_LAYER_CAPS);
			return CTL_EXIT_USAGE;
		}
		if (ctl_parse_u32(tok, 1, UINT32_MAX, &p->layer_caps[p->n_layer_caps++]) < 0) {
			ctl_err(cmd, "--budget layers: \"%s\" is not a positive integer", tok);
			return CTL_EXIT_USAGE;
		}
	}
	if (!p->n_layer_caps) {
		ctl_err(cmd, "--budget layers: give C0,C1,.. (one per layer)");
		return CTL_EXIT_USAGE;
	}
	return 0;
}

int ctl_parse_budget(const char *cmd, const char *spec, struct skv_params *p)
{
	char buf[4096], *f[6];
	int n = split(spec, buf, sizeof(buf), f, 6);

	if (n < 0) {
		ctl_err(cmd, "--budget: \"%.64s\" has too many fields or is too long", spec);
		return CTL_EXIT_USAGE;
	}
	p->c_min = p->c_max = p->c_step = 0; /* 0: the defaults, once W and C are known */
	if (!strcmp(f[0], "uniform") && n == 1) {
		p->budget_mode = SKV_BUDGET_UNIFORM;
	} else if (!strcmp(f[0], "layers") && n == 2) {
		p->budget_mode = SKV_BUDGET_LAYERS;
		p->pyramid_r = 0;
		return parse_list(cmd, f[1], p);
	} else if (!strcmp(f[0], "pyramid") && n == 2) {
		p->budget_mode = SKV_BUDGET_LAYERS;
		p->n_layer_caps = 0;
		if (ctl_parse_float(f[1], &p->pyramid_r) < 0)
			goto bad_num;
	} else if (!strcmp(f[0], "heads") && n <= 2) {
		p->budget_mode = SKV_BUDGET_HEADS;
		if (n == 2 && ctl_parse_float(f[1], &p->head_floor) < 0)
			goto bad_num;
	} else if ((!strcmp(f[0], "mass") && (n == 2 || n == 5)) ||
		   (!strcmp(f[0], "mass-heads") && (n == 2 || n == 4))) {
		p->budget_mode = f[0][4] ? SKV_BUDGET_MASS_HEADS : SKV_BUDGET_MASS;
		if (ctl_parse_float(f[1], &p->tau) < 0)
			goto bad_num;
		if (n >= 4 && (ctl_parse_u32(f[2], 0, UINT32_MAX, &p->c_min) < 0 ||
			       ctl_parse_u32(f[3], 0, UINT32_MAX, &p->c_max) < 0 ||
			       (n == 5 && ctl_parse_u32(f[4], 0, UINT32_MAX, &p->c_step) < 0))) {
			ctl_err(cmd,
				"--budget %s: C_min, C_max and step must be non-negative integers",
				f[0]);
			return CTL_EXIT_USAGE;
		}
		if (n >= 4 && (p->c_min == 0 || p->c_max == 0 || (n == 5 && p->c_step == 0))) {
			ctl_err(cmd, "--budget %s: C_min, C_max%s must be at least 1", f[0],
				n == 5 ? " and step" : "");
			return CTL_EXIT_USAGE;
		}
	} else {
		ctl_err(
		    cmd,
		    "--budget: \"%.64s\" is not uniform, layers:C0,C1,.., pyramid:R, heads[:A], "
		    "mass:TAU[:CMIN:CMAX:STEP] or mass-heads:TAU[:CMIN:CMAX]",
		    spec);
		return CTL_EXIT_USAGE;
	}
	return 0;
bad_num:
	ctl_err(cmd, "--budget %s: \"%.32s\" is not a number", f[0], f[1]);
	return CTL_EXIT_USAGE;
}

void ctl_budget_defaults(struct skv_params *p)
{
	if (p->budget_mode != SKV_BUDGET_MASS && p->budget_mode != SKV_BUDGET_MASS_HEADS)
		return;
	if (!p->c_max)
		p->c_max = p->capacity;
	if (!p->c_min)
		p->c_min = p->window + 1 < p->c_max ? p->window + 1 : p->c_max;
	if (!p->c_step) {
		uint32_t span = p->c_max > p->window ? p->c_max - p->window : 1;
		p->c_step = span / 16 ? span / 16 : 1;
	}
}
