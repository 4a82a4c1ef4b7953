// SPDX-License-Identifier: MIT
/*
 * skv-compact.c - skv_compact() and skv_scratch_bytes(): the job of one call, its
 * scratch layout, the per-item driver (score, select, gather) and the phases
 * it runs on the pool.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "skv-driver.h"

/* Whether layer `layer` keeps everything without scoring (L < C_l; the
 * mass modes: L < C_min for the whole call). */
static bool layer_bypass(const struct skv_job *jb, uint32_t layer)
{
	if (jb->mode == SKV_BUDGET_MASS || jb->mode == SKV_BUDGET_MASS_HEADS)
		return jb->pl->bypass;
	return jb->sh->prompt_len < jb->caps[layer];
}

/* Non-scoring selection of a layer into w->pos: the forced positions, then
 * the most recent others up to min(L, C_l). Returns the count. */
static uint32_t fill_recent(const struct skv_job *jb, struct skv_ws *w, uint32_t layer)
{
	const uint32_t L = jb->sh->prompt_len, C = jb->caps[layer];
	uint32_t fill = (L < C ? L : C) - jb->forced, cnt = 0;

	memcpy(w->keep, jb->base_keep, L);
	for (uint32_t j = L; j-- > 0 && fill;)
		if (!w->keep[j]) {
			w->keep[j] = 1;
			fill--;
		}
	for (uint32_t j = 0; j < L; j++)
		if (w->keep[j])
			w->pos[cnt++] = (int32_t)j;
	return cnt;
}

/* The same positions for every head of the item: bypass or no scoring. */
static void finish_unscored(const struct skv_job *jb, struct skv_ws *w, uint32_t layer,
			    uint32_t kvh, const float *colsum, uint32_t ga, uint32_t gz)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len;
	const bool expand = jb->p->gqa == SKV_GQA_EXPAND;
	const bool bypass = layer_bypass(jb, layer);
	const int32_t *pos = jb->all_pos;
	uint32_t cnt = L;

	if (!bypass)
		cnt = fill_recent(jb, w, layer), pos = w->pos;
	for (uint32_t g = ga; g < gz; g++) {
		uint32_t h = expand ? kvh * G + g : kvh;
		float mass;
		if (bypass) {
			mass = 1.0f;
		} else if (!jb->score) {
			mass = NAN;
		} else if (expand) {
			mass = skv_mass_of(colsum + (size_t)g * L, pos, cnt, jb->n_obs);
		} else {
			skv_group_votes(jb, w, colsum);
			mass = skv_mass_of(w->vote, pos, cnt, jb->n_obs);
		}
		skv_emit(jb, w, layer, kvh, h, pos, cnt, mass);
	}
}

/* One stored head with votes v: uniform and layers keep C_l, mass-heads
 * its own k. */
static void finish_head(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
			uint32_t h, const float *v)
{
	if (jb->mode == SKV_BUDGET_MASS_HEADS) {
		skv_mass_heads_head(jb, w, layer, kvh, h, v);
		return;
	}
	uint32_t cnt = skv_choose(jb, w, v, jb->caps[layer] - jb->forced);
	skv_emit(jb, w, layer, kvh, h, w->pos, cnt, skv_mass_of(v, w->pos, cnt, jb->n_obs));
}

/*
 * Selection, gather and retained mass for the stored heads of one item,
 * given the column sums of its G query heads ([G][L], unused when nothing
 * was scored). gq: one query head only (expand mode), or -1 for all.
 */
static void finish_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
			const float *colsum, int gq)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len;
	const bool expand = jb->p->gqa == SKV_GQA_EXPAND;
	const uint32_t ga = gq < 0 ? 0 : (uint32_t)gq;
	const uint32_t gz = gq < 0 ? (expand ? G : 1) : (uint32_t)gq + 1;

	if (!jb->score || !jb->select || layer_bypass(jb, layer)) {
		finish_unscored(jb, w, layer, kvh, colsum, ga, gz);
		return;
	}
	if (expand) {
		for (uint32_t g = ga; g < gz; g++)
			finish_head(jb, w, layer, kvh, kvh * G + g, colsum + (size_t)g * L);
	} else {
		/* group: the G heads' votes are averaged before pooling */
		skv_group_votes(jb, w, colsum);
		finish_head(jb, w, layer, kvh, kvh, w->vote);
	}
}

static int run_item(const struct skv_job *jb, struct skv_ws *w, uint32_t item, int32_t *ret_head)
{
	const uint32_t layer = item / jb->sh->h_kv, kvh = item % jb->sh->h_kv;
	const bool scored = jb->score && !layer_bypass(jb, layer);

	if (scored) {
		uint32_t bad_g = 0;
		int r = skv_score_item(jb, w, layer, kvh, 0, jb->G, w->colsum, &bad_g);
		if (r < 0) {
			*ret_head = (int32_t)(kvh * jb->G + bad_g);
			return r;
		}
	}
	if (jb->phase == PH_RANK && scored)
		return skv_mass_rank_item(jb, w, layer, kvh, w->colsum);
	finish_item(jb, w, layer, kvh, w->colsum, -1);
	return 0;
}

static void run_unit(struct skv_job *jb, struct skv_ws *w, uint32_t u)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len, h_kv = jb->sh->h_kv;

	switch (jb->phase) {
	case PH_ITEMS:
	case PH_RANK: {
		int32_t head = -1;
		jb->errs[u].rc = run_item(jb, w, u, &head);
		jb->errs[u].head = head;
		break;
	}
	case PH_SCORE_HEADS: { /* split mode: unit = (item, g) */
		uint32_t item = u / G, g = u % G, bad_g = 0;
		if (layer_bypass(jb, item / h_kv))
			break;
		jb->uerrs[u].rc = skv_score_item(jb, w, item / h_kv, item % h_kv, g, g + 1,
						 jb->cs + (size_t)u * L, &bad_g);
		break;
	}
	case PH_FINISH: { /* split mode: unit = (item, g) in expand, item in group */
		bool expand = jb->p->gqa == SKV_GQA_EXPAND;
		uint32_t item = expand ? u / G : u;
		if (jb->errs[item].rc < 0)
			break;
		finish_item(jb, w, item / h_kv, item % h_kv, jb->cs + (size_t)item * G * L,
			    expand ? (int)(u % G) : -1);
		break;
	}
	case PH_MASS: /* unit = item; bypassed calls never get here */
		skv_mass_finish_item(jb, w, u / h_kv, u % h_kv);
		break;
	case PH_LAYERS: { /* heads: unit = layer */
		uint32_t item = 0;
		int32_t head = -1;
		if (layer_bypass(jb, u)) {
			for (uint32_t k = 0; k < h_kv; k++)
				finish_unscored(jb, w, u, k, NULL, 0,
						jb->p->gqa == SKV_GQA_EXPAND ? G : 1);
			break;
		}
		int r = skv_heads_layer(jb, w, u, &item, &head);
		if (r < 0) {
			jb->errs[item].rc = r;
			jb->errs[item].head = head;
		}
		break;
	}
	case PH_FULL:
		skv_full_item(jb, w, u / h_kv, u % h_kv);
		break;
	}
}

static size_t ws_layout(struct skv_ws *w, const struct skv_job *j, char *base)
{
	const size_t L = j->sh->prompt_len, D = j->sh->head_dim, rb = j->rb, G = j->G;
	const size_t nt = (L + SKV_TILE - 1) / SKV_TILE;
	const size_t sc = j->score ? 1 : 0, se = j->select ? 1 : 0;
	const size_t hl = j->mode == SKV_BUDGET_HEADS && j->select ? (size_t)j->h_store * L : 0;
	const size_t rk = j->mode == SKV_BUDGET_MASS || j->mode == SKV_BUDGET_MASS_HEADS ? se : 0;
	const size_t sp = j->p->span ? se : 0; /* span's ranking sort buffer */
	size_t n = 0;

#define T(field, type, count)                                                                      \
	do {                                                                                       \
		if (base)                                                                          \
			w->field = (type *)(base + n);                                             \
		n += ((size_t)(count) * sizeof(type) + 63) & ~(size_t)63;                          \
	} while (0)
	T(qt, float, (sc * D * rb));		  /* packed query rows, [D][rb]    */
	T(kt, float, (sc * SKV_TILE * D));	  /* key tile, f32                 */
	T(qb, uint32_t, (sc * D / 2 * rb));	  /* query bf16 pairs, [D/2][rb]   */
	T(kb, uint16_t, (sc * SKV_TILE * D));	  /* key tile, bf16                */
	T(z, float, (sc * L * rb));		  /* exp(z - m_tile), [L][rb]      */
	T(f, float, (sc * nt * rb));		  /* tile maxima, then factors     */
	T(m, float, (sc * rb));			  /* running max per row           */
	T(s, float, (sc * rb));			  /* running sum per row           */
	T(rowbuf, float, (D));			  /* one converted row             */
	T(colsum, float, (sc * G * L));		  /* column sums per query head    */
	T(vote, float, (sc * L));		  /* group votes                   */
	T(pooled, float, (se * L));		  /* pooled votes                  */
	T(trow, int32_t, (sc * rb));		  /* last visible key per row      */
	T(bad, uint8_t, (sc * rb));		  /* NaN/Inf seen per row          */
	T(keep, uint8_t, (L));			  /* kept flags                    */
	T(key, uint64_t, (se * L));		  /* ranking keys                  */
	T(pos, int32_t, (L));			  /* kept positions                */
	T(segs, struct skv_seg, (sc * (G + rb))); /* rows of each head         */
	T(rpos, uint32_t, (rk * L));		  /* ranked positions (mass)   */
	T(rtmp, uint64_t, ((rk | sp) * L));	  /* ranking sort buffer (mass, span) */
	T(hpool, float, (hl));			  /* heads: pooled, per head   */
	T(hvote, float, (hl));			  /* heads: votes, per head    */
	T(hkeep, uint8_t, (hl));		  /* heads: kept flags         */
	T(hkey, unsigned __int128, (hl));	  /* heads: pair keys          */
#undef T
	return n;
}

static int ws_reserve(struct skv_ws *w, const struct skv_job *j)
{
	size_t need = ws_layout(w, j, NULL);

	if (need > w->cap) {
		void *m = NULL;
		if (posix_memalign(&m, 64, need))
			return -ENOMEM;
		free(w->mem);
		w->mem = m;
		w->cap = need;
	}
	ws_layout(w, j, w->mem);
	return 0;
}

/* --------------------------------------------------------------- compact */

/* How a call is laid out: derived from shape, params and plan alone, so that
 * skv_scratch_bytes() and skv_compact() cannot disagree. */
struct skv_sizing {
	bool split;   /* score query heads as separate units          */
	unsigned nth; /* threads taking part, each with its scratch   */
	size_t o_pos, o_errs, o_cs, o_uerrs;
	/* budget modes: 0 .. L-1, C_l, kept and mass per head, mass rankings */
	size_t o_all, o_caps, o_kept, o_mass, o_rank, o_rvote, o_fsum, o_cneed;
	size_t common; /* call-wide scratch bytes                      */
};

static void job_derive(const struct skv_shape *sh, const struct skv_params *p,
		       const struct skv_plan *pl, uint32_t n_layers, unsigned threads,
		       struct skv_job *jb, struct skv_sizing *sz)
{
	const uint32_t L = sh->prompt_len, G = sh->h_q / sh->h_kv;

	*jb = (struct skv_job){
	    .sh = sh,
	    .p = p,
	    .pl = pl,
	    .n_items = n_layers * sh->h_kv,
	    .G = G,
	    .scale = (float)(1.0 / __builtin_sqrt((double)sh->head_dim)),
	    .mode = p->budget_mode,
	    .h_store = pl->h_store,
	};
	jb->score = !pl->bypass && (skv_policy_scores(p->policy) || sh->n_q > 0);
	jb->select = !pl->bypass && skv_policy_scores(p->policy);
	jb->n_obs = !jb->score			     ? 0
		    : p->policy == SKV_POLICY_SNAPKV ? p->window
		    : p->policy == SKV_POLICY_H2O    ? L
						     : sh->n_q;
	jb->forced = pl->bypass ? 0 : skv_forced_count(sh, p);
	/* mass ranks each head: R best picks held per head, 0 when the forced
	 * positions already fill C_max or all of L (skv.h: the zero-width
	 * ranking); the per-head sums and needs exist whenever it ranks */
	jb->ranked = p->budget_mode == SKV_BUDGET_MASS && jb->select;
	if (jb->ranked) {
		uint32_t avail = L - jb->forced, most = p->c_max - jb->forced;
		jb->R = most < avail ? most : avail;
	}

	/*
	 * Fewer items than threads (one layer on a big machine): score the query
	 * heads of each item as separate units, then select. Same bits as the
	 * item-at-a-time path (score_item), G times the key traffic. Not for
	 * the modes that decide across items (mass, heads).
	 */
	sz->split = jb->score && G > 1 && jb->n_items < threads &&
		    (uint64_t)jb->n_items * G * L * 4 <= SKV_SPLIT_BUDGET &&
		    ((p->budget_mode != SKV_BUDGET_MASS && p->budget_mode != SKV_BUDGET_HEADS) ||
		     !jb->select);

	/* call-wide scratch, held by the context: forced positions, the full list
	 * when nothing is chosen, per-item status, split mode's column sums */
	const size_t nh = (size_t)n_layers * pl->h_store, nr = jb->R ? nh * jb->R : 0;
	sz->o_pos = align64(L);
	sz->o_errs = sz->o_pos + align64((size_t)L * 4);
	sz->o_cs = sz->o_errs + align64((size_t)jb->n_items * sizeof(struct skv_item_err));
	sz->o_uerrs = sz->o_cs + (sz->split ? align64((size_t)jb->n_items * G * L * 4) : 0);
	sz->o_all =
	    sz->o_uerrs +
	    (sz->split ? align64((size_t)jb->n_items * G * sizeof(struct skv_item_err)) : 0);
	sz->o_caps = sz->o_all + align64((size_t)L * 4);
	sz->o_kept = sz->o_caps + align64((size_t)n_layers * 4);
	sz->o_mass = sz->o_kept + align64(nh * 4);
	sz->o_rank = sz->o_mass + align64(nh * 4);
	sz->o_rvote = sz->o_rank + align64(nr * 4);
	sz->o_fsum = sz->o_rvote + align64(nr * 4);
	sz->o_cneed = sz->o_fsum + (jb->ranked ? align64(nh * 8) : 0);
	sz->common = sz->o_cneed + (jb->ranked ? align64(nh * 4) : 0);

	/* rows per block: as many as keep the logit buffer in budget */
	if (jb->score) {
		uint64_t M = (uint64_t)G * jb->n_obs;
		uint64_t rb = SKV_ZBUF_BUDGET / ((uint64_t)L * 4);
		rb = rb / SKV_ROWPAD * SKV_ROWPAD;
		if (rb < SKV_ROWPAD)
			rb = SKV_ROWPAD;
		uint64_t mp = (M + SKV_ROWPAD - 1) / SKV_ROWPAD * SKV_ROWPAD;
		jb->rb = (uint32_t)(rb < mp ? rb : mp);
	} else {
		jb->rb = SKV_ROWPAD;
	}
	uint32_t max_units = sz->split ? jb->n_items * G : jb->n_items;
	if (p->budget_mode == SKV_BUDGET_HEADS && jb->select)
		max_units = n_layers;
	sz->nth = threads < max_units ? threads : max_units;
}

int skv_scratch_bytes(const struct skv_shape *sh, const struct skv_params *params,
		      uint32_t n_layers, unsigned threads, uint64_t *ret_bytes,
		      struct skv_error *err)
{
	struct skv_params pr;
	struct skv_plan pl;
	struct skv_job jb;
	struct skv_sizing sz;
	struct skv_ws w;
	int r;

	skv_error_clear(err);
	r = skv_plan(sh, params, &pl, err);
	if (r < 0)
		return r;
	skv_params_shaped(sh, params, &pr, err);
	if (n_layers > SKV_MAX_LAYERS)
		return skv_fail(err, -1, -1, "%u layers exceed %u", n_layers, SKV_MAX_LAYERS);
	if (!ret_bytes)
		return skv_fail(err, -1, -1, "no result pointer");
	if (threads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		threads = n > 0 ? (unsigned)n : 1;
	}
	if (n_layers == 0) {
		*ret_bytes = 0;
		return 0;
	}
	job_derive(sh, &pr, &pl, n_layers, threads, &jb, &sz);
	*ret_bytes = (uint64_t)sz.common + (uint64_t)sz.nth * ws_layout(&w, &jb, NULL);
	return 0;
}

/* fp8 (SPEC.md "Quantized K/V"): queries stay f32/f16/bf16, and an fp8 K or
 * V is gathered byte for byte into an output of its own dtype (no
 * conversion either way). The scales are skv_check_tensor()'s. */
static int check_fp8(const struct skv_layer_in *in, const struct skv_layer_out *o, uint32_t l,
		     bool score, struct skv_error *err)
{
	const struct skv_tensor *pair[2][2] = {{&in->k, &o->k}, {&in->v, &o->v}};

	if (score && skv_dtype_is_fp8(in->q.dtype))
		return skv_fail(err, (int32_t)l, -1,
				"layer %u: q is %s: queries stay f32, f16 or bf16", l,
				skv_dtype_name(in->q.dtype));
	for (int i = 0; i < 2; i++) {
		enum skv_dtype a = pair[i][0]->dtype, b = pair[i][1]->dtype;
		if ((skv_dtype_is_fp8(a) || skv_dtype_is_fp8(b)) && a != b)
			return skv_fail(err, (int32_t)l, -1,
					"layer %u: %s is %s, its output %s: fp8 is gathered byte "
					"for byte into its own dtype",
					l, i ? "v" : "k",
					skv_dtype_name(a) ? skv_dtype_name(a) : "?",
					skv_dtype_name(b) ? skv_dtype_name(b) : "?");
	}
	return 0;
}

/* A paged output's leading SKV_BLOCK_IN_PLACE blocks: K and V alike, and
 * only over positions every head keeps in slots of the same index. */
static int check_in_place(const struct skv_job *jb, const struct skv_layer_out *o, uint32_t l,
			  uint32_t rows, struct skv_error *err)
{
	uint64_t nk = 0, nv = 0, bs = 0;

	if (o->k.block_table)
		nk = skv_in_place_blocks(&o->k,
					 (rows + (uint64_t)o->k.block_size - 1) / o->k.block_size);
	if (o->v.block_table)
		nv = skv_in_place_blocks(&o->v,
					 (rows + (uint64_t)o->v.block_size - 1) / o->v.block_size);
	if (!nk && !nv)
		return 0;
	if (nk != nv || o->k.block_size != o->v.block_size)
		return skv_fail(err, (int32_t)l, -1,
				"layer %u: output k has %llu in-place blocks, output v %llu: "
				"they must agree",
				l, (unsigned long long)nk, (unsigned long long)nv);
	bs = o->k.block_size;
	if (nk * bs > skv_kept_prefix(jb->sh, jb->p))
		return skv_fail(err, (int32_t)l, -1,
				"layer %u: %llu in-place blocks of %llu slots cover positions 0 .. "
				"%llu, but only the first %u positions are protected (kept in "
				"place by every head)",
				l, (unsigned long long)nk, (unsigned long long)bs,
				(unsigned long long)(nk * bs - 1), skv_kept_prefix(jb->sh, jb->p));
	return 0;
}

/* Every layer's tensors against the shape and the rows[l] each stored head
 * of its output must hold; paged outputs must not overlap. */
static int check_io(const struct skv_job *jb, uint32_t n_layers, const uint32_t *rows,
		    struct skv_error *err)
{
	const struct skv_shape *sh = jb->sh;
	const uint32_t L = sh->prompt_len, hs = jb->h_store;
	int r;

	for (uint32_t l = 0; l < n_layers; l++) {
		const struct skv_layer_out *o = &jb->out[l];
		const struct skv_layer_in *in = &jb->in[l];
		r = check_fp8(in, o, l, jb->score, err);
		if (r < 0)
			return r;
		if (jb->score) {
			r = skv_check_tensor(&in->q, "q", l, sh->h_q, sh->n_q, sh->head_dim, false,
					     err);
			if (r < 0)
				return r;
		}
		r = skv_check_tensor(&in->k, "k", l, sh->h_kv, L, sh->head_dim, NULL, err);
		if (!r)
			r = skv_check_tensor(&in->v, "v", l, sh->h_kv, L, sh->head_dim, false, err);
		if (!r)
			r = skv_check_tensor(&o->k, "output k", l, hs, rows[l], sh->head_dim, o,
					     err);
		if (!r)
			r = skv_check_tensor(&o->v, "output v", l, hs, rows[l], sh->head_dim, o,
					     err);
		if (r < 0)
			return r;
		if (!o->positions)
			return skv_fail(err, (int32_t)l, -1, "layer %u: no positions output", l);
		r = check_in_place(jb, o, l, rows[l], err);
		if (r < 0)
			return r;
		if (o->pos_stride < rows[l] && hs > 1)
			return skv_fail(err, (int32_t)l, -1,
					"layer %u: pos_stride %u is below the kept count %u", l,
					o->pos_stride, rows[l]);
	}
	return skv_check_paged_disjoint(n_layers, jb->out, rows, hs, sh->head_dim, err);
}

/* The first failing item's error into err; 0 when none failed. */
static int item_errors(const struct skv_job *jb, struct skv_error *err)
{
	for (uint32_t i = 0; i < jb->n_items; i++)
		if (jb->errs[i].rc < 0) {
			uint32_t layer = i / jb->sh->h_kv;
			if (err) {
				snprintf(err->msg, sizeof(err->msg),
					 "layer %u query head %d (kv head %u): NaN or Inf in the "
					 "attention logits",
					 layer, jb->errs[i].head, i % jb->sh->h_kv);
				err->layer = (int32_t)layer;
				err->head = jb->errs[i].head;
			}
			return jb->errs[i].rc;
		}
	return 0;
}

/* -ECANCELED when the context's cancel stopped the last phases. */
static int stopped(struct skv_job *jb, struct skv_error *err)
{
	if (!atomic_load_explicit(&jb->cancelled, memory_order_relaxed))
		return 0;
	skv_fail(err, -1, -1, "cancelled (skv_ctx_set_cancel)");
	return -ECANCELED;
}

/*
 * The phases of one call on the pool that do not depend on a decision
 * group: mass scores and ranks (its own C* into jb->c_star), every other
 * mode runs whole.
 */
static int run_first(struct skv_ctx *ctx, struct skv_job *jb, bool split, uint32_t n_layers,
		     struct skv_error *err)
{
	const struct skv_params *p = jb->p;
	const uint32_t G = jb->G, h_kv = jb->sh->h_kv;
	const size_t nh = (size_t)n_layers * jb->h_store;

	if (p->budget_mode == SKV_BUDGET_HEADS && jb->select) {
		skv_ctx_run(ctx, jb, PH_LAYERS, n_layers);
	} else if (p->budget_mode == SKV_BUDGET_MASS && jb->select) {
		skv_ctx_run(ctx, jb, PH_RANK, jb->n_items);
		/* C*: the smallest ladder C every head reaches tau at */
		jb->c_star = p->c_min;
		for (size_t i = 0; i < nh; i++)
			jb->c_star = jb->cneed[i] > jb->c_star ? jb->cneed[i] : jb->c_star;
	} else if (!split) {
		skv_ctx_run(ctx, jb, PH_ITEMS, jb->n_items);
	} else {
		skv_ctx_run(ctx, jb, PH_SCORE_HEADS, jb->n_items * G);
		for (uint32_t i = 0; i < jb->n_items; i++)
			for (uint32_t g = 0; g < G; g++)
				if (jb->uerrs[(size_t)i * G + g].rc < 0) {
					jb->errs[i].rc = jb->uerrs[(size_t)i * G + g].rc;
					jb->errs[i].head = (int32_t)((i % h_kv) * G + g);
					break;
				}
		skv_ctx_run(ctx, jb, PH_FINISH,
			    p->gqa == SKV_GQA_EXPAND ? jb->n_items * G : jb->n_items);
	}
	int r = stopped(jb, err);
	return r < 0 ? r : item_errors(jb, err);
}

/* The rest for C* in jb->c_star: mass gathers every head at it. */
static void run_second(struct skv_ctx *ctx, struct skv_job *jb)
{
	if (jb->p->budget_mode == SKV_BUDGET_MASS && jb->select)
		skv_ctx_run(ctx, jb, PH_MASS, jb->n_items);
}

/* Common scratch of the call: sized by job_derive, held by the context. */
static int setup_common(struct skv_ctx *ctx, struct skv_job *jb, const struct skv_sizing *sz,
			const struct skv_params *p, uint32_t n_layers, struct skv_error *err)
{
	const struct skv_shape *sh = jb->sh;
	const uint32_t L = sh->prompt_len;

	if (sz->common > ctx->common_cap) {
		void *m = NULL;
		if (posix_memalign(&m, 64, sz->common))
			return skv_fail(err, -1, -1, "out of memory for scratch"), -ENOMEM;
		free(ctx->common);
		ctx->common = m;
		ctx->common_cap = sz->common;
	}
	char *cm = ctx->common;
	uint8_t *base_keep = (uint8_t *)cm;
	int32_t *base_pos = (int32_t *)(cm + sz->o_pos), *all_pos = (int32_t *)(cm + sz->o_all);
	jb->errs = (struct skv_item_err *)(cm + sz->o_errs);
	memset(jb->errs, 0, (size_t)jb->n_items * sizeof(*jb->errs));
	if (sz->split) {
		jb->cs = (float *)(cm + sz->o_cs);
		jb->uerrs = (struct skv_item_err *)(cm + sz->o_uerrs);
		memset(jb->uerrs, 0, (size_t)jb->n_items * jb->G * sizeof(*jb->uerrs));
	}
	uint32_t *caps = (uint32_t *)(cm + sz->o_caps);
	int r = skv_layer_caps(p, n_layers, caps, err);
	if (r < 0)
		return r;
	jb->caps = caps;
	jb->kept_all = (uint32_t *)(cm + sz->o_kept);
	jb->mass_all = (float *)(cm + sz->o_mass);
	if (jb->ranked) {
		jb->rank = (uint32_t *)(cm + sz->o_rank);
		jb->rvote = (float *)(cm + sz->o_rvote);
		jb->fsum = (double *)(cm + sz->o_fsum);
		jb->cneed = (uint32_t *)(cm + sz->o_cneed);
	}
	memset(base_keep, 0, L);
	if (!jb->pl->bypass)
		skv_mark_forced(sh, p, jb->select ? 0 : jb->pl->sinks,
				jb->select ? jb->pl->w_keep : 0, base_keep);
	jb->P = L - (jb->select ? jb->pl->w_keep : 0);
	for (uint32_t j = 0, n = 0; j < L; j++) {
		all_pos[j] = (int32_t)j;
		if (base_keep[j])
			base_pos[n++] = (int32_t)j;
	}
	jb->base_keep = base_keep;
	jb->base_pos = base_pos;
	jb->all_pos = all_pos;
	jb->budget = 0;
	return 0;
}

/* Fallback (SPEC.md): some head below fallback_below keeps the full prompt
 * in every head; NaN masses (nothing voted) never trigger it. */
static void finish_result(struct skv_ctx *ctx, struct skv_job *jb, uint32_t n_layers,
			  const bool *decided, struct skv_budget_result *res)
{
	const struct skv_params *p = jb->p;
	const size_t nh = (size_t)n_layers * jb->h_store;
	float lo = INFINITY;
	bool fall = false;

	for (size_t i = 0; i < nh; i++) {
		float m = jb->mass_all[i];
		lo = m < lo ? m : lo;
		fall |= m < p->fallback_below;
	}
	if (decided) /* a decision group's: its members', this one's included */
		fall = *decided;
	if (fall)
		skv_ctx_run(ctx, jb, PH_FULL, jb->n_items);
	if (!res)
		return;
	if (res->kept)
		memcpy(res->kept, jb->kept_all, nh * sizeof(*res->kept));
	res->c_star = p->budget_mode == SKV_BUDGET_MASS	     ? (jb->select ? jb->c_star : p->c_min)
		      : p->budget_mode == SKV_BUDGET_UNIFORM ? p->capacity
							     : 0;
	res->fallback = fall;
	res->min_mass = nh ? lo : NAN;
}

/* One call's job, checked and set up on ctx up to its first phase: the
 * plan into *pl, the resolved parameters into *pr. 1 when there is nothing
 * to do (no layers), 0, or -errno. */
static int prepare(struct skv_ctx *ctx, const struct skv_shape *sh, const struct skv_params *params,
		   uint32_t n_layers, const struct skv_layer_in *in,
		   const struct skv_layer_out *out, const struct skv_budget_result *res,
		   bool two_step, struct skv_params *pr, struct skv_plan *pl, struct skv_job *jb,
		   bool *split, struct skv_error *err)
{
	struct skv_sizing sz;
	int r;

	skv_error_clear(err);
	if (!ctx)
		return skv_fail(err, -1, -1, "no context");
	r = skv_plan(sh, params, pl, err);
	if (r < 0)
		return r;
	skv_params_shaped(sh, params, pr, err);
	const struct skv_params *p = pr;
	if (res && res->result_size != sizeof(*res))
		return skv_fail(err, -1, -1, "result_size is %u, expected %zu", res->result_size,
				sizeof(*res));
	if (two_step &&
	    (p->budget_mode == SKV_BUDGET_HEADS || p->budget_mode == SKV_BUDGET_MASS_HEADS))
		return skv_fail(err, -1, -1,
				"budget mode %s gives every head its own count: it cannot be "
				"decided in a group",
				skv_budget_name(p->budget_mode));
	if (n_layers == 0)
		return 1;
	if (n_layers > SKV_MAX_LAYERS)
		return skv_fail(err, -1, -1, "%u layers exceed %u", n_layers, SKV_MAX_LAYERS);
	if (!in || !out)
		return skv_fail(err, -1, -1, "layer inputs and outputs are required");
	if (!two_step && (!res || !res->kept) &&
	    (p->budget_mode == SKV_BUDGET_HEADS || p->budget_mode == SKV_BUDGET_MASS ||
	     p->budget_mode == SKV_BUDGET_MASS_HEADS || p->fallback_below > 0.0f))
		return skv_fail(err, -1, -1,
				"budget mode %s%s decides the counts per head: give a result "
				"with a kept array (skv_compact_budget)",
				skv_budget_name(p->budget_mode),
				p->fallback_below > 0.0f ? " with a fallback" : "");

	uint32_t *rows = malloc((size_t)n_layers * sizeof(*rows));
	if (!rows)
		return skv_fail(err, -1, -1, "out of memory for scratch"), -ENOMEM;
	r = skv_budget_rows(sh, p, n_layers, rows, err);
	job_derive(sh, p, pl, n_layers, ctx->threads, jb, &sz);
	jb->in = in;
	jb->out = out;
	jb->isa = ctx->isa;
	jb->run_unit = run_unit;
	if (!r)
		r = check_io(jb, n_layers, rows, err);
	free(rows);
	if (r < 0)
		return r;
	r = setup_common(ctx, jb, &sz, p, n_layers, err);
	if (r < 0)
		return r;
	for (unsigned t = 0; t < sz.nth; t++)
		if (ws_reserve(&ctx->ws[t], jb) < 0)
			return skv_fail(err, -1, -1, "out of memory for scratch"), -ENOMEM;
	jb->nth = sz.nth;
	*split = sz.split;
	return 0;
}

int skv_compact_budget(struct skv_ctx *ctx, const struct skv_shape *sh,
		       const struct skv_params *params, uint32_t n_layers,
		       const struct skv_layer_in *in, const struct skv_layer_out *out,
		       struct skv_budget_result *res, struct skv_error *err)
{
	struct skv_params pr;
	struct skv_plan pl;
	struct skv_job jb;
	bool split;
	int r;

	r = prepare(ctx, sh, params, n_layers, in, out, res, false, &pr, &pl, &jb, &split, err);
	if (r)
		return r < 0 ? r : 0;
	r = run_first(ctx, &jb, split, n_layers, err);
	if (r < 0)
		return r;
	run_second(ctx, &jb);
	finish_result(ctx, &jb, n_layers, NULL, res);
	return stopped(&jb, err);
}

int skv_compact(struct skv_ctx *ctx, const struct skv_shape *sh, const struct skv_params *p,
		uint32_t n_layers, const struct skv_layer_in *in, const struct skv_layer_out *out,
		struct skv_error *err)
{
	return skv_compact_budget(ctx, sh, p, n_layers, in, out, NULL, err);
}

/* ------------------------------------------------------ decision groups */

/* A compaction between its two steps: copies of what the job points at, and
 * the call-wide scratch taken from the context that began it. */
struct skv_pending {
	struct skv_shape sh;
	struct skv_params p;
	struct skv_plan pl;
	struct skv_job jb;
	uint32_t n_layers;
	bool empty; /* no layers: nothing to write */
	void *common;
};

void skv_pending_free(struct skv_pending *pd)
{
	if (!pd)
		return;
	free(pd->common);
	free(pd);
}

int skv_compact_begin(struct skv_ctx *ctx, const struct skv_shape *sh,
		      const struct skv_params *params, uint32_t n_layers,
		      const struct skv_layer_in *in, const struct skv_layer_out *out,
		      struct skv_pending **ret, struct skv_error *err)
{
	struct skv_pending *pd;
	bool split = false;
	int r;

	if (!ret || !sh || !params)
		return skv_error_clear(err), skv_fail(err, -1, -1, "no result pointer");
	*ret = NULL;
	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return skv_error_clear(err), skv_fail(err, -1, -1, "out of memory"), -ENOMEM;
	pd->sh = *sh;
	r = prepare(ctx, &pd->sh, params, n_layers, in, out, NULL, true, &pd->p, &pd->pl, &pd->jb,
		    &split, err);
	if (r > 0) {
		pd->empty = true;
		*ret = pd;
		return 0;
	}
	/* job_derive() pointed the job at pd's copies; the scratch goes with it */
	if (!r)
		r = run_first(ctx, &pd->jb, split, n_layers, err);
	if (r < 0) {
		free(pd);
		return r;
	}
	pd->n_layers = n_layers;
	pd->common = ctx->common;
	ctx->common = NULL;
	ctx->common_cap = 0;
	*ret = pd;
	return 0;
}

uint32_t skv_pending_c_star(const struct skv_pending *pd)
{
	const struct skv_params *p = &pd->p;

	if (p->budget_mode == SKV_BUDGET_MASS)
		return pd->jb.select ? pd->jb.c_star : p->c_min;
	return p->budget_mode == SKV_BUDGET_UNIFORM ? p->budget : 0;
}

/* m_h(c) of stored head hi from its ranking, as skv_mass_finish_item()
 * computes it (the same additions in the same order). */
static float ranked_mass(const struct skv_job *jb, size_t hi, uint32_t c)
{
	if (jb->fsum[hi] == SKV_MASS_EMITTED) /* at C_max, which is then c */
		return jb->mass_all[hi];
	const uint32_t F = jb->forced, avail = jb->sh->prompt_len - F;
	const float *rv = jb->rvote + hi * jb->R;
	uint32_t picks = c - F < jb->R ? c - F : jb->R;
	double acc = jb->fsum[hi];

	for (uint32_t i = 0; i < picks; i++)
		acc += rv[i];
	return picks >= avail ? 1.0f : skv_curve(acc, jb->n_obs);
}

float skv_pending_min_mass(const struct skv_pending *pd, uint32_t c)
{
	const struct skv_job *jb = &pd->jb;
	const size_t nh = (size_t)pd->n_layers * jb->h_store;
	const bool ranked = pd->p.budget_mode == SKV_BUDGET_MASS && jb->select;
	float lo = INFINITY;

	if (ranked)
		c = c < pd->jb.c_star ? pd->jb.c_star : c > pd->p.c_max ? pd->p.c_max : c;
	for (size_t i = 0; i < nh; i++) {
		float m = ranked ? ranked_mass(jb, i, c) : jb->mass_all[i];
		lo = m < lo ? m : lo;
	}
	return lo;
}

int skv_compact_end(struct skv_ctx *ctx, struct skv_pending *pd, uint32_t c_star, int fallback,
		    struct skv_budget_result *res, struct skv_error *err)
{
	struct skv_job *jb;
	const bool fall = fallback != 0;
	int r = 0;

	skv_error_clear(err);
	if (!ctx || !pd)
		r = skv_fail(err, -1, -1, "no context or pending compaction");
	else if (res && res->result_size != sizeof(*res))
		r = skv_fail(err, -1, -1, "result_size is %u, expected %zu", res->result_size,
			     sizeof(*res));
	else if (pd->empty)
		goto out;
	else if (res && !res->kept && pd->p.budget_mode == SKV_BUDGET_MASS)
		r = skv_fail(err, -1, -1, "budget mode mass needs a result with a kept array");
	else if (pd->p.budget_mode == SKV_BUDGET_MASS && pd->jb.select &&
		 (c_star < pd->jb.c_star || c_star > pd->p.c_max))
		r = skv_fail(err, -1, -1,
			     "C* %u is outside the ladder from this member's own C* %u to C_max %u",
			     c_star, pd->jb.c_star, pd->p.c_max);
	else if (fall && !(pd->p.fallback_below > 0.0f))
		r = skv_fail(err, -1, -1,
			     "a fallback needs fallback_below > 0: the outputs have no room for L");
	if (r < 0)
		goto out;
	jb = &pd->jb;
	/* this context's threads and scratch from here on */
	jb->isa = ctx->isa;
	jb->nth = jb->nth < ctx->threads ? jb->nth : ctx->threads;
	for (unsigned t = 0; t < jb->nth; t++)
		if (ws_reserve(&ctx->ws[t], jb) < 0) {
			skv_fail(err, -1, -1, "out of memory for scratch");
			r = -ENOMEM;
			goto out;
		}
	if (pd->p.budget_mode == SKV_BUDGET_MASS && jb->select)
		jb->c_star = c_star;
	run_second(ctx, jb);
	finish_result(ctx, jb, pd->n_layers, &fall, res);
	r = stopped(jb, err);
out:
	skv_pending_free(pd);
	return r;
}
