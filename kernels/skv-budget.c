// SPDX-License-Identifier: MIT
/*
 * skv-budget.c - the budget modes of SPEC.md beyond one C, from the one
 * scoring pass: the mass curve of each head from its pooled ranking
 * (mass-heads, mass), AdaKV's floor and layer-wide top-k (heads), and the
 * fallback to the full prompt.
 */
#include <stdlib.h>
#include <string.h>

#include "skv-driver.h"

/* Votes of stored head h of an item: its own column sums (expand) or the
 * group's average (group, computed into w->vote). */
static const float *head_votes(const struct skv_job *jb, struct skv_ws *w, const float *colsum,
			       uint32_t g)
{
	if (jb->p->gqa == SKV_GQA_EXPAND)
		return colsum + (size_t)g * jb->sh->prompt_len;
	skv_group_votes(jb, w, colsum);
	return w->vote;
}

/* Ranked positions of w->key[0..n) as plain positions, into w->rpos. */
static const uint32_t *ranked_positions(struct skv_ws *w, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		w->rpos[i] = ~(uint32_t)w->key[i];
	return w->rpos;
}

/*
 * mass-heads, one stored head: the smallest k in [C_min, C_max] with
 * m(k) >= tau, m from the ranking in rank order (skv.h), all L when k
 * reaches them. Writes the head.
 */
void skv_mass_heads_head(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
			 uint32_t h, const float *v)
{
	const struct skv_params *p = jb->p;
	const uint32_t L = jb->sh->prompt_len, F = jb->forced, avail = L - F;
	uint32_t n = skv_rank(jb, w, v, p->c_max - F);
	const uint32_t *rk = ranked_positions(w, n);
	double acc = skv_forced_sum(jb, v);
	uint32_t picks = 0, k = p->c_min;
	float m = 0.0f;

	for (;; k++) {
		while (picks < k - F && picks < n)
			acc += v[rk[picks++]];
		m = picks >= avail ? 1.0f : skv_curve(acc, jb->n_obs);
		if (m >= p->tau || k >= p->c_max)
			break;
		if (picks == n) { /* nothing left to add: C_max, as none reaches tau */
			k = p->c_max;
			break;
		}
	}
	uint32_t cnt = skv_keep_ranked(jb, w, rk, picks);
	skv_emit(jb, w, layer, kvh, h, w->pos, cnt, m);
}

/* The call-wide flag "some head needs C_max" (then C* = C_max, in a
 * decision group too). The job is never a const object: only the stages
 * see it const. */
static atomic_uint *cmax_seen(const struct skv_job *jb)
{
	return (atomic_uint *)&jb->cmax_seen;
}

/* A mass head at C* = c_star from its ranking rk[] and votes: the same
 * picks, additions (in rank order, onto the forced sum) and output in
 * either phase. */
static void mass_emit(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
		      uint32_t h, const uint32_t *rk, const float *rv, const float *v, double acc,
		      uint32_t c_star)
{
	const uint32_t L = jb->sh->prompt_len, F = jb->forced, avail = L - F;
	uint32_t picks = c_star - F < jb->R ? c_star - F : jb->R;

	if (rv)
		for (uint32_t i = 0; i < picks; i++)
			acc += rv[i];
	else
		for (uint32_t i = 0; i < picks; i++)
			acc += v[rk[i]];
	float m = picks >= avail ? 1.0f : skv_curve(acc, jb->n_obs);
	uint32_t cnt = skv_keep_ranked(jb, w, rk, picks);
	skv_emit(jb, w, layer, kvh, h, w->pos, cnt, m);
}

/*
 * mass, phase one: rank each stored head of the item and find the smallest
 * ladder C its curve reaches tau at (C_max when none). A head needing C_max
 * settles C* = C_max for the call: from then on a head is emitted here, its
 * K/V rows still warm from scoring, and marked SKV_MASS_EMITTED; the others hold
 * their ranking for phase two.
 */
int skv_mass_rank_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
		       const float *colsum)
{
	const struct skv_params *p = jb->p;
	const uint32_t G = jb->G, L = jb->sh->prompt_len, F = jb->forced, avail = L - F;
	const bool expand = p->gqa == SKV_GQA_EXPAND;

	for (uint32_t g = 0; g < (expand ? G : 1); g++) {
		uint32_t h = expand ? kvh * G + g : kvh;
		size_t hi = (size_t)layer * jb->h_store + h;
		const float *v = head_votes(jb, w, colsum, g);
		uint32_t n = skv_rank(jb, w, v, jb->R);
		const uint32_t *rk = ranked_positions(w, n);
		const double fs = skv_forced_sum(jb, v);
		double acc = fs;
		uint32_t picks = 0, c = p->c_min;

		if (!atomic_load_explicit(cmax_seen(jb), memory_order_relaxed)) {
			for (;;) {
				while (picks < c - F && picks < n)
					acc += v[rk[picks++]];
				float m = picks >= avail ? 1.0f : skv_curve(acc, jb->n_obs);
				if (m >= p->tau || c >= p->c_max)
					break;
				if (picks == n) { /* the curve is flat from here */
					c = p->c_max;
					break;
				}
				/* the ladder: C_min, C_min + step, .. below C_max, then C_max */
				c = p->c_max - c > p->c_step ? c + p->c_step : p->c_max;
			}
			if (c == p->c_max)
				atomic_store_explicit(cmax_seen(jb), 1, memory_order_relaxed);
		}
		if (atomic_load_explicit(cmax_seen(jb), memory_order_relaxed)) {
			jb->cneed[hi] = p->c_max;
			jb->fsum[hi] = SKV_MASS_EMITTED;
			mass_emit(jb, w, layer, kvh, h, rk, NULL, v, fs, p->c_max);
			continue;
		}
		uint32_t *keep_rank = jb->rank + hi * jb->R;
		float *keep_vote = jb->rvote + hi * jb->R;
		for (uint32_t i = 0; i < n; i++) {
			keep_rank[i] = rk[i];
			keep_vote[i] = v[rk[i]];
		}
		jb->fsum[hi] = fs;
		jb->cneed[hi] = c;
	}
	return 0;
}

/* mass, phase two: every stored head of the item not yet emitted keeps
 * min(L, C*). */
void skv_mass_finish_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh)
{
	const uint32_t G = jb->G;
	const bool expand = jb->p->gqa == SKV_GQA_EXPAND;

	for (uint32_t g = 0; g < (expand ? G : 1); g++) {
		uint32_t h = expand ? kvh * G + g : kvh;
		size_t hi = (size_t)layer * jb->h_store + h;
		if (jb->fsum[hi] == SKV_MASS_EMITTED)
			continue;
		mass_emit(jb, w, layer, kvh, h, jb->rank + hi * jb->R, jb->rvote + hi * jb->R, NULL,
			  jb->fsum[hi], jb->c_star);
	}
}

/* Fallback: every stored head of the item keeps all L positions, as bypass. */
void skv_full_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len;
	const bool expand = jb->p->gqa == SKV_GQA_EXPAND;

	for (uint32_t g = 0; g < (expand ? G : 1); g++)
		skv_emit(jb, w, layer, kvh, expand ? kvh * G + g : kvh, jb->all_pos, L, 1.0f);
}

/* heads: key of pair (head, position), higher is better, ties to the
 * smaller head, then the smaller position. */
static inline unsigned __int128 pair_key(float score, uint32_t h, uint32_t pos)
{
	uint64_t k = skv_rank_key(score, pos);

	return (unsigned __int128)(k >> 32) << 64 | (uint64_t)(~h) << 32 | (uint32_t)k;
}

/*
 * heads, one layer (all its K/V heads): each stored head takes its own top
 * f = floor(a * P(C)) prefix picks, then the layer's remaining H * (P(C) - f)
 * picks go to the best remaining (head, position) pairs. Returns 0 or -EDOM
 * (*ret_item, *ret_head: the failing item and query head).
 */
int skv_heads_layer(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t *ret_item,
		    int32_t *ret_head)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len, P = jb->P, HS = jb->h_store;
	const uint32_t h_kv = jb->sh->h_kv, F = jb->forced, avail = L - F;
	const bool expand = jb->p->gqa == SKV_GQA_EXPAND;
	const uint32_t b = jb->caps[layer] - F;
	const uint32_t f0 = (uint32_t)((double)jb->p->head_floor * b);
	const uint32_t f = f0 < avail ? f0 : avail;

	for (uint32_t kvh = 0; kvh < h_kv; kvh++) {
		uint32_t bad_g = 0;
		int r = skv_score_item(jb, w, layer, kvh, 0, G, w->colsum, &bad_g);
		if (r < 0) {
			*ret_item = layer * h_kv + kvh;
			*ret_head = (int32_t)(kvh * G + bad_g);
			return r;
		}
		for (uint32_t g = 0; g < (expand ? G : 1); g++) {
			uint32_t h = expand ? kvh * G + g : kvh;
			const float *v = head_votes(jb, w, w->colsum, g);
			memcpy(w->hvote + (size_t)h * L, v, (size_t)L * sizeof(float));
			skv_pool_votes(jb, v, w->hpool + (size_t)h * L);
		}
	}
	/* the floor: each head's own top f */
	size_t n = 0;
	for (uint32_t h = 0; h < HS; h++) {
		uint8_t *keep = w->hkeep + (size_t)h * L;
		const float *ps = w->hpool + (size_t)h * L;
		uint32_t m = 0;
		memcpy(keep, jb->base_keep, L);
		for (uint32_t j = 0; j < P; j++)
			if (!keep[j])
				w->key[m++] = skv_rank_key(ps[j], j);
		uint32_t top = skv_top_keys(w->key, m, f);
		for (uint32_t i = 0; i < top; i++)
			keep[~(uint32_t)w->key[i]] = 1;
		for (uint32_t j = 0; j < P; j++)
			if (!keep[j])
				w->hkey[n++] = pair_key(ps[j], h, j);
	}
	/* the layer-wide rest */
	uint64_t rest = (uint64_t)HS * (b - f);
	size_t take = rest < n ? (size_t)rest : n;
	if (take < n)
		skv_select_top128(w->hkey, n, take);
	for (size_t i = 0; i < take; i++) {
		uint32_t h = ~(uint32_t)(uint64_t)(w->hkey[i] >> 32);
		w->hkeep[(size_t)h * L + ~(uint32_t)(uint64_t)w->hkey[i]] = 1;
	}
	for (uint32_t h = 0; h < HS; h++) {
		const uint8_t *keep = w->hkeep + (size_t)h * L;
		uint32_t cnt = 0;
		for (uint32_t j = 0; j < L; j++)
			if (keep[j])
				w->pos[cnt++] = (int32_t)j;
		float m = skv_mass_of(w->hvote + (size_t)h * L, w->pos, cnt, jb->n_obs);
		skv_emit(jb, w, layer, expand ? h / G : h, h, w->pos, cnt, m);
	}
	return 0;
}
