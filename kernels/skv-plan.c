// SPDX-License-Identifier: MIT
/*
 * skv-plan.c - validation of shape and parameters against SPEC.md and the plan
 * of what a compaction produces, computed before any work; the positions
 * kept whatever the scores say.
 */
#include <stdio.h>
#include <string.h>

#include "skv-driver.h"

bool skv_policy_scores(enum skv_policy p)
{
	return p == SKV_POLICY_SNAPKV || p == SKV_POLICY_H2O;
}

int skv_params_shaped(const struct skv_shape *sh, const struct skv_params *p,
		      struct skv_params *ret, struct skv_error *err)
{
	int r = skv_params_resolve(p, ret, err);

	if (r < 0 || ret->policy != SKV_POLICY_SNAPKV || sh->n_q == ret->window)
		return r;
	uint32_t wmin = ret->min_window ? ret->min_window : SKV_MIN_WINDOW_DEFAULT;
	if (sh->n_q > ret->window)
		return skv_fail(err, -1, -1, "snapkv takes at most W = %u query rows, n_q is %u",
				ret->window, sh->n_q);
	if (sh->n_q < wmin)
		return skv_fail(err, -1, -1,
				"n_q = %u query rows (a partial window of W = %u) is below "
				"min_window = %u",
				sh->n_q, ret->window, wmin);
	ret->window = sh->n_q;
	return 0;
}

/*
 * Mark the positions every stored head keeps whatever the scores say:
 * sinks, protected ranges and (scoring policies) the recent W_keep. For the
 * non-scoring policies the rest of the budget then goes to the most recent
 * positions not already kept, so that a protected range shortens the recent
 * window instead of making the combination invalid. Returns the count.
 */
uint32_t skv_mark_forced(const struct skv_shape *sh, const struct skv_params *p, uint32_t sinks,
			 uint32_t w_keep, uint8_t *keep)
{
	uint32_t L = sh->prompt_len, n = 0;

	memset(keep, 0, L);
	for (uint32_t j = 0; j < sinks && j < L; j++)
		keep[j] = 1;
	for (uint32_t j = L - w_keep; j < L; j++)
		keep[j] = 1;
	for (uint32_t i = 0; i < p->n_protected; i++)
		for (uint32_t j = p->protected_ranges[i].begin; j < p->protected_ranges[i].end; j++)
			keep[j] = 1;
	for (uint32_t j = 0; j < L; j++)
		n += keep[j];
	return n;
}

/* Count of positions in the union of sinks and protected ranges, without a buffer. */
static uint64_t union_count(const struct skv_params *p, uint32_t sinks, uint32_t tail_begin,
			    uint32_t L)
{
	/* ranges: sinks [0,S), tail [tail_begin, L), protected; sort and merge */
	struct skv_range r[SKV_MAX_PROTECTED + 2];
	uint32_t n = 0;

	if (sinks)
		r[n++] = (struct skv_range){0, sinks};
	if (tail_begin < L)
		r[n++] = (struct skv_range){tail_begin, L};
	for (uint32_t i = 0; i < p->n_protected; i++)
		r[n++] = p->protected_ranges[i];
	for (uint32_t i = 1; i < n; i++) /* insertion sort by begin */
		for (uint32_t j = i; j > 0 && r[j].begin < r[j - 1].begin; j--) {
			struct skv_range t = r[j];
			r[j] = r[j - 1];
			r[j - 1] = t;
		}
	uint64_t count = 0;
	uint32_t cb = 0, ce = 0;
	bool open = false;
	for (uint32_t i = 0; i < n; i++) {
		if (open && r[i].begin <= ce) {
			if (r[i].end > ce)
				ce = r[i].end;
			continue;
		}
		if (open)
			count += ce - cb;
		cb = r[i].begin;
		ce = r[i].end;
		open = true;
	}
	if (open)
		count += ce - cb;
	return count;
}

/*
 * Validation and plan at one budget C: the rules of SPEC.md that involve C
 * (C > W, protected + window <= C, S <= C) and the kept count at C.
 */
static int plan_at(const struct skv_shape *sh, const struct skv_params *p, uint32_t C,
		   struct skv_plan *ret_plan, struct skv_error *err)
{
	struct skv_plan pl = {0};
	uint32_t L = sh->prompt_len, W = p->window;

	if (C == 0)
		return skv_fail(err, -1, -1, "capacity must be at least 1");
	pl.h_store = p->gqa == SKV_GQA_EXPAND ? sh->h_q : sh->h_kv;
	pl.bypass = L < C;
	pl.kept = L < C ? L : C;

	switch (p->policy) {
	case SKV_POLICY_SNAPKV:
	case SKV_POLICY_H2O:
		if (p->policy == SKV_POLICY_SNAPKV && W == 0)
			return skv_fail(err, -1, -1, "snapkv needs an observation window W >= 1");
		if (C <= W)
			return skv_fail(err, -1, -1,
					"capacity C = %u must exceed the window W = %u", C, W);
		if (W > L)
			return skv_fail(err, -1, -1,
					"window W = %u exceeds the prompt length L = %u", W, L);
		if (p->policy == SKV_POLICY_SNAPKV && sh->n_q != W)
			return skv_fail(err, -1, -1,
					"snapkv needs the last W = %u query rows, n_q is %u", W,
					sh->n_q);
		if (p->policy == SKV_POLICY_H2O && sh->n_q != L)
			return skv_fail(err, -1, -1, "h2o needs all L = %u query rows, n_q is %u",
					L, sh->n_q);
		if (union_count(p, 0, L - W, L) > C)
			return skv_fail(
			    err, -1, -1,
			    "protected ranges plus the window W = %u exceed the capacity "
			    "C = %u",
			    W, C);
		pl.sinks = 0;
		pl.w_obs = p->policy == SKV_POLICY_SNAPKV ? W : L;
		pl.w_keep = W;
		break;
	case SKV_POLICY_STREAMINGLLM:
	case SKV_POLICY_WINDOW: {
		uint32_t S = p->policy == SKV_POLICY_STREAMINGLLM ? p->sinks : 0;
		if (S > C)
			return skv_fail(err, -1, -1, "sinks S = %u exceed the capacity C = %u", S,
					C);
		if (sh->n_q > L)
			return skv_fail(err, -1, -1, "n_q = %u query rows exceed L = %u", sh->n_q,
					L);
		uint64_t forced = union_count(p, S < L ? S : L, L, L);
		if (forced > C)
			return skv_fail(
			    err, -1, -1,
			    "protected ranges plus S = %u sinks exceed the capacity C = %u", S, C);
		pl.sinks = S;
		pl.w_obs = 0;
		pl.w_keep = (uint32_t)(C - forced);
		break;
	}
	default:
		return skv_fail(err, -1, -1, "unknown policy %d", (int)p->policy);
	}
	*ret_plan = pl;
	return 0;
}

uint32_t skv_kept_prefix(const struct skv_shape *sh, const struct skv_params *p)
{
	uint32_t L = sh->prompt_len, end = 0;
	bool grew = true;

	if (p->policy == SKV_POLICY_STREAMINGLLM)
		end = p->sinks < L ? p->sinks : L;
	/* ranges may come in any order and overlap: extend until none does */
	while (grew) {
		grew = false;
		for (uint32_t i = 0; i < p->n_protected && i < SKV_MAX_PROTECTED; i++) {
			const struct skv_range *r = &p->protected_ranges[i];

			if (r->begin <= end && r->end > end) {
				end = r->end < L ? r->end : L;
				grew = true;
			}
		}
	}
	return end;
}

/* |window U protected| (scoring) or |sinks U protected| (the others): the
 * positions kept whatever the budget, the same for every layer and head. */
uint32_t skv_forced_count(const struct skv_shape *sh, const struct skv_params *p)
{
	uint32_t L = sh->prompt_len;

	if (skv_policy_scores(p->policy))
		return (uint32_t)union_count(p, 0, L - (p->window < L ? p->window : L), L);
	uint32_t S = p->policy == SKV_POLICY_STREAMINGLLM ? p->sinks : 0;
	return (uint32_t)union_count(p, S < L ? S : L, L, L);
}

static bool unit_float(float x, bool zero_ok)
{
	return x == x && x <= 1.0f && (zero_ok ? x >= 0.0f : x > 0.0f);
}

/* The parameters of the budget mode on their own, before any shape rule. */
static int check_budget_params(const struct skv_params *p, struct skv_error *err)
{
	const char *name = skv_budget_name(p->budget_mode);

	if (!name)
		return skv_fail(err, -1, -1, "unknown budget mode %d", (int)p->budget_mode);
	if (!unit_float(p->fallback_below, true))
		return skv_fail(err, -1, -1, "fallback_below %g must be in [0, 1]",
				(double)p->fallback_below);
	if (p->budget_mode != SKV_BUDGET_UNIFORM && p->budget_mode != SKV_BUDGET_LAYERS &&
	    !skv_policy_scores(p->policy))
		return skv_fail(err, -1, -1,
				"budget mode %s needs scores: policy %s takes uniform or layers",
				name, skv_policy_name(p->policy));
	switch (p->budget_mode) {
	case SKV_BUDGET_LAYERS:
		if (p->n_layer_caps > SKV_MAX_LAYER_CAPS)
			return skv_fail(err, -1, -1, "%u per-layer budgets, at most %u",
					p->n_layer_caps, SKV_MAX_LAYER_CAPS);
		if (p->n_layer_caps == 0 && !(p->pyramid_r > 0.0f && p->pyramid_r <= 64.0f))
			return skv_fail(err, -1, -1,
					"layers: pyramid r %g must be in (0, 64] (or give a list)",
					(double)p->pyramid_r);
		if (p->n_layer_caps && p->pyramid_r != 0.0f)
			return skv_fail(err, -1, -1,
					"layers: give a list or pyramid r, not both (r = %g)",
					(double)p->pyramid_r);
		break;
	case SKV_BUDGET_HEADS:
		if (!unit_float(p->head_floor, true))
			return skv_fail(err, -1, -1, "heads: floor a = %g must be in [0, 1]",
					(double)p->head_floor);
		break;
	case SKV_BUDGET_MASS:
	case SKV_BUDGET_MASS_HEADS:
		if (!unit_float(p->tau, false))
			return skv_fail(err, -1, -1, "%s: tau = %g must be in (0, 1]", name,
					(double)p->tau);
		if (p->c_min == 0 || p->c_min > p->c_max)
			return skv_fail(err, -1, -1,
					"%s: C_min = %u must be at least 1 and at most C_max = %u",
					name, p->c_min, p->c_max);
		if (p->budget_mode == SKV_BUDGET_MASS && p->c_step == 0)
			return skv_fail(err, -1, -1, "mass: step must be at least 1");
		break;
	default:
		break;
	}
	return 0;
}

/*
 * Budget C_l of every layer: C for uniform and heads, the list or SPEC's
 * pyramid for layers, C_max for the mass modes (their most). Pyramid in
 * double: w_l = 1 + (r - 1) * l / (N - 1), S = sum w_l (in layer order),
 * C_l = floor(N * C * w_l / S); the remainder N * C - sum C_l adds 1 to
 * layers 0, 1, .. (should rounding ever make it negative, 1 comes off layers
 * N-1, N-2, .. instead). Params already checked by check_budget_params.
 */
int skv_layer_caps(const struct skv_params *p, uint32_t n_layers, uint32_t *caps,
		   struct skv_error *err)
{
	if (p->budget_mode == SKV_BUDGET_LAYERS && p->n_layer_caps) {
		if (p->n_layer_caps != n_layers)
			return skv_fail(err, -1, -1,
					"layers: the list has %u budgets for %u layers",
					p->n_layer_caps, n_layers);
		memcpy(caps, p->layer_caps, (size_t)n_layers * sizeof(*caps));
		return 0;
	}
	if (p->budget_mode != SKV_BUDGET_LAYERS) {
		uint32_t c =
		    p->budget_mode == SKV_BUDGET_MASS || p->budget_mode == SKV_BUDGET_MASS_HEADS
			? p->c_max
			: p->capacity;
		for (uint32_t l = 0; l < n_layers; l++)
			caps[l] = c;
		return 0;
	}
	const double N = n_layers, r = p->pyramid_r, total = (double)n_layers * p->capacity;
	double sum = 0;
	int64_t left = (int64_t)n_layers * p->capacity;
	for (uint32_t l = 0; l < n_layers; l++)
		sum += n_layers == 1 ? 1.0 : 1.0 + (r - 1.0) * l / (N - 1.0);
	for (uint32_t l = 0; l < n_layers; l++) {
		double w = n_layers == 1 ? 1.0 : 1.0 + (r - 1.0) * l / (N - 1.0);
		double c = __builtin_floor(total * w / sum);
		if (!(c >= 0 && c < 4294967295.0))
			return skv_fail(err, (int32_t)l, -1, "layers: pyramid C_%u out of range",
					l);
		caps[l] = (uint32_t)c;
		left -= caps[l];
	}
	for (uint32_t l = 0; left > 0; l = (l + 1) % n_layers, left--)
		caps[l]++;
	for (uint32_t l = n_layers; left < 0; left++) {
		l = l == 0 ? n_layers - 1 : l - 1;
		if (caps[l])
			caps[l]--;
	}
	return 0;
}

/* Most rows one stored head keeps at per-layer budget C (what an output
 * needs room for): L with a fallback, else by mode. */
uint32_t skv_rows_at(const struct skv_shape *sh, const struct skv_params *p, uint32_t C)
{
	const uint64_t L = sh->prompt_len;

	if (p->fallback_below > 0.0f)
		return (uint32_t)L;
	if (p->budget_mode == SKV_BUDGET_HEADS && L >= C) {
		uint64_t f = skv_forced_count(sh, p);
		uint64_t hs = p->gqa == SKV_GQA_EXPAND ? sh->h_q : sh->h_kv;
		uint64_t most = f + hs * (C - f);
		return (uint32_t)(most < L ? most : L);
	}
	return (uint32_t)(L < C ? L : C);
}

static int budget_plan(const struct skv_shape *sh, const struct skv_params *p,
		       struct skv_plan *ret_plan, struct skv_error *err)
{
	struct skv_plan pl;
	int r = check_budget_params(p, err);

	if (r < 0)
		return r;
	switch (p->budget_mode) {
	case SKV_BUDGET_LAYERS:
		if (p->n_layer_caps) {
			/* every C_l on its own, then the plan at the smallest */
			uint32_t lo = UINT32_MAX, hi = 0;
			for (uint32_t l = 0; l < p->n_layer_caps; l++) {
				uint32_t c = p->layer_caps[l];
				r = plan_at(sh, p, c, &pl, err);
				if (r < 0) {
					if (err) {
						char m[sizeof(err->msg)];
						snprintf(m, sizeof(m), "%s", err->msg);
						skv_fail(err, (int32_t)l, -1,
							 "layers: layer %u (C_l = %u): %s", l, c,
							 m);
					}
					return r;
				}
				lo = c < lo ? c : lo;
				hi = c > hi ? c : hi;
			}
			r = plan_at(sh, p, lo, &pl, err);
			pl.kept = skv_rows_at(sh, p, hi);
		} else {
			/* pyramid: the layers' C_l are checked once N is known;
			 * every C_l is below 2 C */
			r = plan_at(sh, p, p->capacity, &pl, err);
			pl.bypass = 0;
			pl.kept = skv_rows_at(sh, p, 2 * p->capacity);
		}
		break;
	case SKV_BUDGET_MASS:
	case SKV_BUDGET_MASS_HEADS:
		r = plan_at(sh, p, p->c_min, &pl, err);
		if (r < 0 && err) {
			char m[sizeof(err->msg)];
			snprintf(m, sizeof(m), "%s", err->msg);
			skv_fail(err, -1, -1, "%s: at C_min = %u: %s",
				 skv_budget_name(p->budget_mode), p->c_min, m);
		}
		pl.kept = skv_rows_at(sh, p, p->c_max);
		break;
	default: /* uniform, heads */
		r = plan_at(sh, p, p->capacity, &pl, err);
		pl.kept = skv_rows_at(sh, p, p->capacity);
		break;
	}
	if (r < 0)
		return r;
	if (pl.bypass) {
		/* Nothing is scored: every position is kept as it is. */
		pl.sinks = 0;
		pl.w_obs = 0;
		pl.w_keep = sh->prompt_len;
	}
	*ret_plan = pl;
	return 0;
}

int skv_budget_rows(const struct skv_shape *sh, const struct skv_params *params, uint32_t n_layers,
		    uint32_t *ret_rows, struct skv_error *err)
{
	struct skv_params pr;
	struct skv_plan pl;
	int r;

	skv_error_clear(err);
	r = skv_plan(sh, params, &pl, err);
	if (r < 0)
		return r;
	skv_params_shaped(sh, params, &pr, err);
	if (n_layers > SKV_MAX_LAYERS)
		return skv_fail(err, -1, -1, "%u layers exceed %u", n_layers, SKV_MAX_LAYERS);
	if (!ret_rows && n_layers)
		return skv_fail(err, -1, -1, "no result array");
	r = skv_layer_caps(&pr, n_layers, ret_rows, err);
	if (r < 0)
		return r;
	for (uint32_t l = 0; l < n_layers; l++) {
		if (pr.budget_mode == SKV_BUDGET_LAYERS && !pr.n_layer_caps) {
			r = plan_at(sh, &pr, ret_rows[l], &pl, err);
			if (r < 0) {
				if (err) {
					char m[sizeof(err->msg)];
					snprintf(m, sizeof(m), "%s", err->msg);
					skv_fail(err, (int32_t)l, -1,
						 "layers: pyramid layer %u (C_l = %u): %s", l,
						 ret_rows[l], m);
				}
				return r;
			}
		}
		ret_rows[l] = skv_rows_at(sh, &pr, ret_rows[l]);
	}
	return 0;
}

int skv_plan(const struct skv_shape *sh, const struct skv_params *params, struct skv_plan *ret_plan,
	     struct skv_error *err)
{
	struct skv_params pr;
	int r;

	if (!sh || !params)
		return skv_fail(err, -1, -1, "shape and params are required");
	r = skv_params_shaped(sh, params, &pr, err);
	if (r < 0)
		return r;
	const struct skv_params *p = &pr;
	if (!skv_policy_name(p->policy))
		return skv_fail(err, -1, -1, "unknown policy %d", (int)p->policy);
	if (p->pooling != SKV_POOL_AVG && p->pooling != SKV_POOL_MAX)
		return skv_fail(err, -1, -1, "unknown pooling %d", (int)p->pooling);
	if (p->gqa != SKV_GQA_EXPAND && p->gqa != SKV_GQA_GROUP)
		return skv_fail(err, -1, -1, "unknown gqa mode %d", (int)p->gqa);
	if (p->kernel == 0 || p->kernel % 2 == 0)
		return skv_fail(err, -1, -1, "pooling kernel %u must be odd (1 = no pooling)",
				p->kernel);
	if (p->kernel > SKV_MAX_KERNEL)
		return skv_fail(err, -1, -1, "pooling kernel %u exceeds %u", p->kernel,
				SKV_MAX_KERNEL);
	if (p->span > SKV_MAX_SPAN)
		return skv_fail(err, -1, -1, "span %u exceeds %u", p->span, SKV_MAX_SPAN);
	if (p->span && p->budget_mode != SKV_BUDGET_UNIFORM && p->budget_mode != SKV_BUDGET_LAYERS)
		return skv_fail(
		    err, -1, -1, "span %u needs budget mode uniform or layers, not %s (skv.h)",
		    p->span,
		    skv_budget_name(p->budget_mode) ? skv_budget_name(p->budget_mode) : "unknown");
	if (sh->prompt_len == 0)
		return skv_fail(err, -1, -1, "prompt length L must be at least 1");
	if (sh->prompt_len > SKV_MAX_L)
		return skv_fail(err, -1, -1, "prompt length %u exceeds %u", sh->prompt_len,
				SKV_MAX_L);
	if (sh->head_dim == 0)
		return skv_fail(err, -1, -1, "head_dim D must be at least 1");
	if (sh->head_dim > SKV_MAX_D)
		return skv_fail(err, -1, -1, "head_dim %u exceeds %u", sh->head_dim, SKV_MAX_D);
	if (sh->h_q == 0 || sh->h_kv == 0)
		return skv_fail(err, -1, -1, "h_q and h_kv must be at least 1");
	if (sh->h_q > SKV_MAX_HEADS)
		return skv_fail(err, -1, -1, "h_q %u exceeds %u", sh->h_q, SKV_MAX_HEADS);
	if (sh->h_q % sh->h_kv != 0)
		return skv_fail(err, -1, -1, "h_q %u is not a multiple of h_kv %u", sh->h_q,
				sh->h_kv);
	if (p->n_protected > SKV_MAX_PROTECTED)
		return skv_fail(err, -1, -1, "%u protected ranges, at most %u", p->n_protected,
				SKV_MAX_PROTECTED);

	uint32_t L = sh->prompt_len;
	for (uint32_t i = 0; i < p->n_protected; i++) {
		const struct skv_range *r = &p->protected_ranges[i];
		if (r->begin >= r->end)
			return skv_fail(err, -1, -1, "protected range %u [%u, %u) is empty", i,
					r->begin, r->end);
		if (r->end > L)
			return skv_fail(err, -1, -1,
					"protected range %u [%u, %u) ends past the prompt (L = %u)",
					i, r->begin, r->end, L);
	}

	return budget_plan(sh, p, ret_plan, err);
}
