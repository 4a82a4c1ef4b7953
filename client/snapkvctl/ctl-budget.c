// SPDX-License-Identifier: MIT
/*
 * ctl-budget.c - the --budget and --fallback-below values of `compact`
 * (SPEC.md "Budgets beyond one C"): libskv parses the text and fills in
 * the ladder's defaults (skv_budget_parse, skv_budget_defaults), and checks
 * the ranges (skv_plan), so the CLI, the engines and the daemon refuse with
 * the same words.
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

int ctl_parse_budget(const char *cmd, const char *spec, struct skv_params *p)
{
	struct skv_error e;

	if (skv_budget_parse(spec, p, &e) < 0) {
		ctl_err(cmd, "--budget: %s", e.msg);
		return CTL_EXIT_USAGE;
	}
	return 0;
}

void ctl_budget_defaults(struct skv_params *p)
{
	skv_budget_defaults(p);
}
