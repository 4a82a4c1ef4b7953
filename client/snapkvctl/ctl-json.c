// SPDX-License-Identifier: MIT
/*
 * ctl-json.c - how snapkvctl prints JSON for programs: always through
 * jansson (strings escaped, no NaN), indented, keys in the order built.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>

#include "snapkvctl.h"

json_t *ctl_json_real(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

json_t *ctl_json_str(const char *s)
{
	json_t *j = s ? json_string(s) : NULL;

	return j ? j : json_null(); /* absent, or not UTF-8 */
}

int ctl_json_print(const char *cmd, json_t *j)
{
	int r;

	if (!j) {
		ctl_err(cmd, "out of memory");
		return CTL_EXIT_FAIL;
	}
	r = json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (r < 0 || putchar('\n') == EOF) {
		ctl_err(cmd, "cannot write JSON to stdout");
		return CTL_EXIT_FAIL;
	}
	return CTL_EXIT_OK;
}
