/* SPDX-License-Identifier: MIT */
/*
 * tl-compact.h - compact a tiny-llama full cache in process with libskv
 * (kernels/skv.h), the way the daemon does it for a remote engine: the
 * full cache's post-RoPE K/V and the captured prefill queries go in, a
 * compact cache (struct tl_kv, H_q or H_kv stored heads, `reserve` decode
 * slots of headroom) comes out with next_pos = L.
 */
#ifndef TL_COMPACT_H
#define TL_COMPACT_H

#include <skv.h>

#include "tl-model.h"

/*
 * Query rows a policy needs (skv_shape.n_q) for a prompt of length L:
 * W for snapkv, L for h2o, 0 for streamingllm and window.
 */
uint32_t tl_compact_n_q(const struct skv_params *p, uint32_t L);

/*
 * full: a full cache of L = full->len tokens (H_kv stored heads, slot i =
 * position i). q: post-RoPE queries [layers][H_q][q_n][D] of positions
 * q_first .. q_first + q_n - 1 (q_first + q_n == L), at least
 * tl_compact_n_q() of them. Returns 0 and a new owning cache; -EINVAL with
 * err filled for bad params/shape; other -errno from skv_compact.
 */
int tl_compact(struct skv_ctx *ctx, const struct tl_model *m, const struct tl_kv *full,
	       const float *q, uint32_t q_first, uint32_t q_n, const struct skv_params *p,
	       uint32_t reserve, struct tl_kv **ret_kv, struct skv_plan *ret_plan,
	       struct skv_error *err);

/* What a budget mode chose (SPEC.md "Budgets beyond one C"). */
struct tl_budget {
	uint32_t c_star;     /* mass: C*; uniform: C; otherwise 0 */
	int fallback;	     /* the full prompt was kept */
	float min_mass;	     /* smallest retained mass of the choice */
	uint64_t kept_total; /* kept slots over every layer and stored head */
	uint32_t kept_min, kept_max;
};

/*
 * tl_compact() for every budget mode and fallback_below: each head gets
 * room for what skv_budget_rows() says it may keep (+ reserve), the kept
 * counts come from skv_compact_budget(), and heads that keep different
 * counts get layers[l].head_len (owned by the cache; len is the largest).
 * res may be NULL. Same returns as tl_compact().
 */
int tl_compact_budget(struct skv_ctx *ctx, const struct tl_model *m, const struct tl_kv *full,
		      const float *q, uint32_t q_first, uint32_t q_n, const struct skv_params *p,
		      uint32_t reserve, struct tl_kv **ret_kv, struct tl_budget *res,
		      struct skv_error *err);

/* The skv_tensor view of one layer of a cache (K or V). */
struct skv_tensor tl_kv_tensor(const struct tl_kv *kv, uint32_t layer, int want_v);

#endif /* TL_COMPACT_H */
