// SPDX-License-Identifier: MIT
/*
 * skv-plan.c - validation of shape and parameters against SPEC.md and the plan
 * of what a compaction produces, computed before any work; the positions
 * kept whatever the scores say.
 */
#include <string.h>

#include "skv-driver.h"

bool skv_policy_scores(enum skv_policy p)
{
	return p == SKV_POLICY_SNAPKV || p == SKV_POLICY_H2O;
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

int skv_plan(const struct skv_shape *sh, const struct skv_params *p, struct skv_plan *ret_plan,
	     struct skv_error *err)
{
	struct skv_plan pl = {0};

	if (!sh || !p)
		return skv_fail(err, -1, -1, "shape and params are required");
	if (p->params_size != sizeof(*p))
		return skv_fail(err, -1, -1,
				"params_size is %u, expected %zu (use skv_params_init)",
				p->params_size, sizeof(*p));
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
	if (p->capacity == 0)
		return skv_fail(err, -1, -1, "capacity must be at least 1");
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

	uint32_t L = sh->prompt_len, C = p->capacity, W = p->window;
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
	if (pl.bypass) {
		/* Nothing is scored: every position is kept as it is. */
		pl.sinks = 0;
		pl.w_obs = 0;
		pl.w_keep = L;
	}
	*ret_plan = pl;
	return 0;
}
