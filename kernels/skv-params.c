// SPDX-License-Identifier: MIT
/*
 * skv-params.c - parameter defaults, policy names and the error helper every
 * validating function of libskv reports through.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "skv-driver.h"

const char *skv_policy_name(enum skv_policy p)
{
	switch (p) {
	case SKV_POLICY_SNAPKV:
		return "snapkv";
	case SKV_POLICY_H2O:
		return "h2o";
	case SKV_POLICY_STREAMINGLLM:
		return "streamingllm";
	case SKV_POLICY_WINDOW:
		return "window";
	default:
		return NULL;
	}
}

const char *skv_budget_name(enum skv_budget b)
{
	switch (b) {
	case SKV_BUDGET_UNIFORM:
		return "uniform";
	case SKV_BUDGET_LAYERS:
		return "layers";
	case SKV_BUDGET_HEADS:
		return "heads";
	case SKV_BUDGET_MASS:
		return "mass";
	case SKV_BUDGET_MASS_HEADS:
		return "mass-heads";
	default:
		return NULL;
	}
}

int skv_fail(struct skv_error *err, int32_t layer, int32_t head, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		err->layer = layer;
		err->head = head;
	}
	return -EINVAL;
}

void skv_error_clear(struct skv_error *err)
{
	if (err) {
		err->msg[0] = 0;
		err->layer = -1;
		err->head = -1;
	}
}

/* ----------------------------------------------------------- parameters */

void skv_params_init(struct skv_params *p)
{
	/* static: its padding is zero too, as memset left it before */
	static const struct skv_params d = SKV_PARAMS_DEFAULTS;

	memcpy(p, &d, sizeof(*p));
}

int skv_params_resolve(const struct skv_params *p, struct skv_params *ret, struct skv_error *err)
{
	static const struct skv_params d = SKV_PARAMS_DEFAULTS;

	if (p->params_size == SKV_PARAMS_SIZE_V1) {
		/* a caller built before the budget modes: uniform, no fallback */
		memcpy(ret, &d, sizeof(*ret));
		memcpy(ret, p, SKV_PARAMS_SIZE_V1);
		ret->params_size = sizeof(*ret);
		return 0;
	}
	if (p->params_size == SKV_PARAMS_SIZE_V2) {
		/* a caller built before the partial window: min_window 0 (8) */
		memcpy(ret, &d, sizeof(*ret));
		memcpy(ret, p, SKV_PARAMS_SIZE_V2);
		ret->params_size = sizeof(*ret);
		return 0;
	}
	if (p->params_size == SKV_PARAMS_SIZE_V3) {
		/* a caller built before span-aware selection: span 0 (top-k) */
		memcpy(ret, &d, sizeof(*ret));
		memcpy(ret, p, SKV_PARAMS_SIZE_V3);
		ret->params_size = sizeof(*ret);
		return 0;
	}
	if (p->params_size != sizeof(*p))
		return skv_fail(err, -1, -1,
				"params_size is %u, expected %zu, %zu, %zu or %zu (use "
				"skv_params_init)",
				p->params_size, sizeof(*p), (size_t)SKV_PARAMS_SIZE_V3,
				(size_t)SKV_PARAMS_SIZE_V2, (size_t)SKV_PARAMS_SIZE_V1);
	memcpy(ret, p, sizeof(*ret));
	return 0;
}
