// SPDX-License-Identifier: MIT
/*
 * skv-ledger.c - SPEC.md's capacity ledger of one cache, every product checked.
 */
#include <errno.h>

#include "skv-driver.h"

/* --------------------------------------------------------------- ledger */

int skv_ledger_compute(const struct skv_ledger_in *in, struct skv_ledger *ret)
{
	struct skv_ledger l = {0};

	if (!in || !ret)
		return -EINVAL;
	if (!in->batch || !in->layers || !in->h_q || !in->h_kv || !in->head_dim ||
	    !in->dtype_bytes || !in->prompt_len || !in->capacity)
		return -EINVAL;
	if (in->h_q % in->h_kv || in->appended > in->reserve)
		return -EINVAL;
	if (in->gqa != SKV_GQA_EXPAND && in->gqa != SKV_GQA_GROUP)
		return -EINVAL;
	l.h_store = in->gqa == SKV_GQA_EXPAND ? in->h_q : in->h_kv;
	uint64_t kept = in->prompt_len < in->capacity ? in->prompt_len : in->capacity;
	uint64_t bnh_kv, bnh_st, t, full_tok, comp_tok;
	if (__builtin_add_overflow(in->prompt_len, in->appended, &full_tok) ||
	    __builtin_add_overflow(kept, in->appended, &comp_tok) ||
	    __builtin_mul_overflow(in->batch, in->layers, &t) ||
	    __builtin_mul_overflow(t, in->h_kv, &bnh_kv) ||
	    __builtin_mul_overflow(t, l.h_store, &bnh_st))
		return -EOVERFLOW;
	uint64_t ds;
	if (__builtin_mul_overflow(in->head_dim, in->dtype_bytes, &ds))
		return -EOVERFLOW;
	/* 2 * bnh * tok * ds, each product checked */
	if (__builtin_mul_overflow(bnh_kv, full_tok, &t) || __builtin_mul_overflow(t, ds, &t) ||
	    __builtin_mul_overflow(t, 2, &l.native_full))
		return -EOVERFLOW;
	if (__builtin_mul_overflow(bnh_st, comp_tok, &t) || __builtin_mul_overflow(t, ds, &t) ||
	    __builtin_mul_overflow(t, 2, &l.compact))
		return -EOVERFLOW;
	if (__builtin_mul_overflow(bnh_st, comp_tok, &t) || __builtin_mul_overflow(t, 4, &l.index))
		return -EOVERFLOW;
	if (__builtin_mul_overflow(bnh_st, in->reserve - in->appended, &t) ||
	    __builtin_mul_overflow(t, ds, &t) || __builtin_mul_overflow(t, 2, &l.reserved))
		return -EOVERFLOW;
	*ret = l;
	return 0;
}

int skv_ledger_sum(const struct skv_ledger_in *in, const uint32_t *kept, uint64_t n_kept,
		   struct skv_ledger *ret)
{
	struct skv_ledger_in u;
	struct skv_ledger l;
	int r;

	if (!in || !kept || !ret)
		return -EINVAL;
	u = *in;
	u.capacity = in->capacity ? in->capacity : 1;
	r = skv_ledger_compute(&u, &l);
	if (r < 0)
		return r;
	uint64_t pairs, slots = 0, t, ds;
	if (__builtin_mul_overflow(in->layers, l.h_store, &pairs))
		return -EOVERFLOW;
	if (pairs != n_kept)
		return -EINVAL;
	for (uint64_t i = 0; i < n_kept; i++)
		if (__builtin_add_overflow(slots, (uint64_t)kept[i] + in->appended, &slots))
			return -EOVERFLOW;
	if (__builtin_mul_overflow(slots, in->batch, &slots) ||
	    __builtin_mul_overflow(in->head_dim, in->dtype_bytes, &ds) ||
	    __builtin_mul_overflow(slots, ds, &t) || __builtin_mul_overflow(t, 2, &l.compact) ||
	    __builtin_mul_overflow(slots, 4, &l.index))
		return -EOVERFLOW;
	*ret = l;
	return 0;
}
