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
