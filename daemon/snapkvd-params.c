// SPDX-License-Identifier: MIT
/*
 * snapkvd-params.c - a CompactRequest's parameters; see snapkvd-params.h.
 */
#include "snapkvd-params.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/skv-frame.h"
#include "snapkvd-config.h"
#include "snapkvd-device.h"
#include "snapkvd-job.h"
#include "snapkvd-policy.h"
#include "snapkvd-request.h"

/*
 * A Params field flagged in explicit_fields is taken as sent, 0 included
 * (SPEC: --sinks 0 keeps no sinks); unflagged (senders older than the flag),
 * 0 means the default. Enums start at UNSPECIFIED = 0, so 0 is unset there.
 */
static bool param_given(const Snapkv__V1__Params *p, unsigned field_no, uint32_t v)
{
	return (p->explicit_fields & SKV_PARAMS_EXPLICIT(field_no)) || v;
}

/* Owns: the number of protected ranges and their presence; the values
 * themselves are skv_plan()'s to judge. */
int snapkvd_params_read(const Snapkv__V1__Params *p, struct skv_params *ret, char *err,
			size_t errlen)
{
	skv_params_init(ret);
	if (!p)
		return 0;
	if (p->policy)
		ret->policy = (enum skv_policy)p->policy;
	if (param_given(p, 2, p->window))
		ret->window = p->window;
	if (param_given(p, 3, p->capacity))
		ret->capacity = p->capacity;
	if (param_given(p, 4, p->kernel))
		ret->kernel = p->kernel;
	if (p->pooling)
		ret->pooling = (enum skv_pooling)p->pooling;
	if (p->gqa)
		ret->gqa = (enum skv_gqa)p->gqa;
	if (param_given(p, 7, p->sinks))
		ret->sinks = p->sinks;
	ret->min_window = p->min_window; /* 0: the config's, snapkvd_request_compact */
	ret->span = p->span;		 /* skv_plan() judges it (at most SKV_MAX_SPAN) */
	if (p->n_protected_ranges > SKV_MAX_PROTECTED) {
		snprintf(err, errlen, "%zu protected ranges, at most %d", p->n_protected_ranges,
			 SKV_MAX_PROTECTED);
		return -E2BIG;
	}
	ret->n_protected = p->n_protected_ranges;
	for (size_t i = 0; i < p->n_protected_ranges; i++) {
		if (!p->protected_ranges[i])
			return -EINVAL;
		ret->protected_ranges[i].begin = p->protected_ranges[i]->begin;
		ret->protected_ranges[i].end = p->protected_ranges[i]->end;
	}
	return 0;
}

/*
 * Owns: the budget mode's fields (CompactRequest 120-129) into params: the
 * mode's value and the list's length; the values themselves are
 * skv_plan()'s and skv_budget_rows()'s to judge. Absent fields (older
 * senders) leave uniform with no fallback, as before.
 */
int snapkvd_params_read_budget(const Snapkv__V1__CompactRequest *req, struct skv_params *p,
			       char *err, size_t errlen)
{
	if (req->budget_mode < 0 ||
	    req->budget_mode > SNAPKV__V1__BUDGET_MODE__BUDGET_MODE_MASS_HEADS) {
		snprintf(err, errlen, "unknown budget mode %d", (int)req->budget_mode);
		return -EINVAL;
	}
	if (req->n_layer_caps > SKV_MAX_LAYER_CAPS) {
		snprintf(err, errlen, "%zu per-layer budgets, at most %d", req->n_layer_caps,
			 SKV_MAX_LAYER_CAPS);
		return -E2BIG;
	}
	p->budget_mode =
	    req->budget_mode ? (enum skv_budget)(req->budget_mode - 1) : SKV_BUDGET_UNIFORM;
	p->n_layer_caps = (uint32_t)req->n_layer_caps;
	if (req->n_layer_caps)
		memcpy(p->layer_caps, req->layer_caps, req->n_layer_caps * sizeof(uint32_t));
	p->pyramid_r = req->pyramid_r;
	if (req->head_floor_given || req->head_floor != 0.0f)
		p->head_floor = req->head_floor;
	p->tau = req->tau;
	p->c_min = req->c_min;
	p->c_max = req->c_max;
	p->c_step = req->c_step;
	p->fallback_below = req->fallback_below;
	return 0;
}

/*
 * Owns: the decision-group fields (CompactRequest 130-132): a key of 1..64
 * printable ASCII bytes with a size of 1..max_group_size, a wait of at most
 * max_group_timeout_ms (0: group_timeout_ms), a mode whose counts a group
 * can share (not heads, mass-heads), on the CUDA backend no mass fallback
 * above tau. The registry
 * (snapkvd-group.c) judges the members against each other at admission.
 */
int snapkvd_params_read_group(const struct snapkvd_request_env *env,
			      const Snapkv__V1__CompactRequest *req, struct snapkvd_job *j,
			      char *err, size_t errlen)
{
	const struct snapkvd_config *cfg = env->cfg;
	const char *key = req->group_key ? req->group_key : "";
	size_t n = strlen(key);

	if (!n && !req->group_size && !req->group_timeout_ms)
		return 0;
	if (!n || !req->group_size) {
		snprintf(err, errlen,
			 "a decision group needs a group_key and a group_size above 0");
		return -EINVAL;
	}
	if (n > SNAPKVD_GROUP_KEY_MAX) {
		snprintf(err, errlen, "group_key of %zu bytes, at most %d", n,
			 SNAPKVD_GROUP_KEY_MAX);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		if (key[i] < 0x20 || key[i] > 0x7e) {
			snprintf(err, errlen, "group_key byte %zu is not printable ASCII", i);
			return -EINVAL;
		}
	if (req->group_size > cfg->max_group_size) {
		snprintf(err, errlen, "group_size %u above %u (max_group_size)", req->group_size,
			 cfg->max_group_size);
		return -EINVAL;
	}
	if (req->group_timeout_ms > cfg->max_group_timeout_ms) {
		snprintf(err, errlen, "group_timeout_ms %u above %u (max_group_timeout_ms)",
			 req->group_timeout_ms, cfg->max_group_timeout_ms);
		return -EINVAL;
	}
	if (j->params.budget_mode == SKV_BUDGET_HEADS ||
	    j->params.budget_mode == SKV_BUDGET_MASS_HEADS) {
		snprintf(err, errlen,
			 "budget mode %s gives every head its own count: it cannot be decided in "
			 "a group",
			 skv_budget_name(j->params.budget_mode));
		return -EINVAL;
	}
	/* on the GPU a member knows its smallest mass at its own C* only: a
	 * larger group C* is above tau there, so a fallback threshold above
	 * tau could not be judged (snapkvd-group.c, member_below) */
	if (snapkvd_device_present(env->device) && j->params.budget_mode == SKV_BUDGET_MASS &&
	    j->params.fallback_below > j->params.tau) {
		snprintf(err, errlen,
			 "decision groups on the CUDA backend: fallback_below %g above tau %g "
			 "(mass) cannot be decided from the members' own choices; use "
			 "fallback_below <= tau or the host backend",
			 (double)j->params.fallback_below, (double)j->params.tau);
		return -EOPNOTSUPP;
	}
	memcpy(j->gm.key, key, n + 1);
	j->gm.size = req->group_size;
	j->gm.timeout_ms = req->group_timeout_ms ? req->group_timeout_ms
			   : cfg->group_timeout_ms < cfg->max_group_timeout_ms
			       ? cfg->group_timeout_ms
			       : cfg->max_group_timeout_ms;
	return 0;
}

/* Not today's single C: a mode other than uniform, or a fallback. */
bool snapkvd_params_budgeted(const struct skv_params *p)
{
	return p->budget_mode != SKV_BUDGET_UNIFORM || p->fallback_below != 0.0f;
}

/* Heads keep different counts: stored ragged (SPEC.md). */
static bool ragged_mode(const struct skv_params *p)
{
	return p->budget_mode == SKV_BUDGET_LAYERS || p->budget_mode == SKV_BUDGET_HEADS ||
	       p->budget_mode == SKV_BUDGET_MASS_HEADS;
}

/*
 * Owns, for a budget mode: the per-layer rules (skv_budget_rows: list
 * length, every pyramid C_l), the room of the region (the most rows a head
 * of any layer may keep, as plan->kept) and the output layout (ragged modes
 * store row blocks: HND). Either backend, either arena: the runner settles
 * the heads where the K/V are.
 */
int snapkvd_params_check_budget(struct snapkvd_job *j, const Snapkv__V1__CompactRequest *req,
				struct skv_plan *plan, char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	const char *mode = skv_budget_name(j->params.budget_mode);
	uint32_t *rows;
	int r;

	if (!snapkvd_params_budgeted(&j->params))
		return 0;
	if (ragged_mode(&j->params) && req->out_layout == SNAPKV__V1__LAYOUT__LAYOUT_NHD) {
		snprintf(err, errlen,
			 "budget mode %s stores heads ragged (one row block per layer): "
			 "out_layout must be HND",
			 mode);
		return -EINVAL;
	}
	rows = calloc(j->layers, sizeof(*rows));
	if (!rows)
		return -ENOMEM;
	r = skv_budget_rows(&j->shape, &j->params, j->layers, rows, &kerr);
	plan->kept = 0;
	for (uint32_t l = 0; r == 0 && l < j->layers; l++)
		plan->kept = rows[l] > plan->kept ? rows[l] : plan->kept;
	free(rows);
	if (r < 0)
		snprintf(err, errlen, "%s", kerr.msg[0] ? kerr.msg : "invalid budget");
	return r;
}

/* One budget of a mode scaled by f, never below keep + 1 nor above itself. */
static uint32_t scale_one(uint32_t v, double f, uint32_t keep)
{
	uint32_t s = (uint32_t)(v * f);

	s = s > keep ? s : keep + 1;
	return s < v ? s : v;
}

/* Under pressure a budget mode's own budgets scale with C, by C's factor:
 * every C_l of a layers list and the mass ladder's C_min and C_max (tau,
 * the floor and the step are not budgets). The cache reports budget <
 * requested_budget as for uniform. */
static void scale_budgets(struct skv_params *p, double f, uint32_t keep)
{
	for (uint32_t l = 0; l < p->n_layer_caps && l < SKV_MAX_LAYER_CAPS; l++)
		p->layer_caps[l] = scale_one(p->layer_caps[l], f, keep);
	if (p->budget_mode == SKV_BUDGET_MASS || p->budget_mode == SKV_BUDGET_MASS_HEADS) {
		p->c_min = scale_one(p->c_min, f, keep);
		p->c_max = scale_one(p->c_max, f, keep);
	}
}

/* Memory pressure: new requests at high/critical get a smaller C, never
 * below what the policy keeps unconditionally plus one slot, and a budget
 * mode's own budgets with it (scale_budgets). Reads the level only;
 * admission counts a scaled request. */
void snapkvd_params_scale(const struct snapkvd_policy *ops, int level, struct skv_params *p,
			  bool *ret_scaled)
{
	uint64_t keep = p->policy == SKV_POLICY_STREAMINGLLM ? p->sinks
			: p->policy == SKV_POLICY_WINDOW     ? 0
							     : p->window;
	int scaled = 0;

	for (uint32_t i = 0; i < p->n_protected && i < SKV_MAX_PROTECTED; i++)
		if (p->protected_ranges[i].end > p->protected_ranges[i].begin)
			keep += p->protected_ranges[i].end - p->protected_ranges[i].begin;
	if (keep < UINT32_MAX) {
		uint32_t asked = p->capacity;

		p->capacity = snapkvd_pressure_scale_capacity_at(
		    ops->pressure, (enum snapkvd_pressure_level)level, p->capacity, (uint32_t)keep,
		    &scaled);
		if (scaled && asked)
			scale_budgets(p, (double)p->capacity / asked, (uint32_t)keep);
	}
	*ret_scaled = scaled;
}
