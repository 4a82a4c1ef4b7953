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
	const uint32_t kept = jb->pl->kept;
	const uint32_t ga = gq < 0 ? 0 : (uint32_t)gq;
	const uint32_t gz = gq < 0 ? (expand ? G : 1) : (uint32_t)gq + 1;

	if (!jb->score || !jb->select) {
		/* the same positions for every head: bypass or no scoring */
		for (uint32_t g = ga; g < gz; g++) {
			uint32_t h = expand ? kvh * G + g : kvh;
			float mass;
			if (jb->pl->bypass) {
				mass = 1.0f;
			} else if (!jb->score) {
				mass = NAN;
			} else if (expand) {
				mass = skv_mass_of(colsum + (size_t)g * L, jb->base_pos, kept,
						   jb->n_obs);
			} else {
				skv_group_votes(jb, w, colsum);
				mass = skv_mass_of(w->vote, jb->base_pos, kept, jb->n_obs);
			}
			skv_emit(jb, w, layer, kvh, h, jb->base_pos, kept, mass);
		}
		return;
	}
	if (expand) {
		for (uint32_t g = ga; g < gz; g++) {
			const float *v = colsum + (size_t)g * L;
			uint32_t cnt = skv_choose(jb, w, v);
			skv_emit(jb, w, layer, kvh, kvh * G + g, w->pos, cnt,
				 skv_mass_of(v, w->pos, cnt, jb->n_obs));
		}
	} else {
		/* group: the G heads' votes are averaged before pooling */
		skv_group_votes(jb, w, colsum);
		uint32_t cnt = skv_choose(jb, w, w->vote);
		skv_emit(jb, w, layer, kvh, kvh, w->pos, cnt,
			 skv_mass_of(w->vote, w->pos, cnt, jb->n_obs));
	}
}

static int run_item(const struct skv_job *jb, struct skv_ws *w, uint32_t item, int32_t *ret_head)
{
	const uint32_t layer = item / jb->sh->h_kv, kvh = item % jb->sh->h_kv;

	if (jb->score) {
		uint32_t bad_g = 0;
		int r = skv_score_item(jb, w, layer, kvh, 0, jb->G, w->colsum, &bad_g);
		if (r < 0) {
			*ret_head = (int32_t)(kvh * jb->G + bad_g);
			return r;
		}
	}
	finish_item(jb, w, layer, kvh, w->colsum, -1);
	return 0;
}

static void run_unit(struct skv_job *jb, struct skv_ws *w, uint32_t u)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len, h_kv = jb->sh->h_kv;

	switch (jb->phase) {
	case PH_ITEMS: {
		int32_t head = -1;
		jb->errs[u].rc = run_item(jb, w, u, &head);
		jb->errs[u].head = head;
		break;
	}
	case PH_SCORE_HEADS: { /* split mode: unit = (item, g) */
		uint32_t item = u / G, g = u % G, bad_g = 0;
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
	}
}

static size_t ws_layout(struct skv_ws *w, const struct skv_job *j, char *base)
{
	const size_t L = j->sh->prompt_len, D = j->sh->head_dim, rb = j->rb, G = j->G;
	const size_t nt = (L + SKV_TILE - 1) / SKV_TILE;
	const size_t sc = j->score ? 1 : 0, se = j->select ? 1 : 0;
	size_t n = 0;

#define T(field, type, count)                                                                      \
	do {                                                                                       \
		if (base)                                                                          \
			w->field = (type *)(base + n);                                             \
		n += ((size_t)(count) * sizeof(type) + 63) & ~(size_t)63;                          \
	} while (0)
	T(qt, float, (sc * D * rb));		  /* packed query rows, [D][rb]    */
	T(kt, float, (sc * SKV_TILE * D));	  /* key tile, f32                 */
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
	T(keep, uint8_t, (se * L));		  /* kept flags                    */
	T(key, uint64_t, (se * L));		  /* ranking keys                  */
	T(pos, int32_t, (se * L));		  /* kept positions                */
	T(segs, struct skv_seg, (sc * (G + rb))); /* rows of each head         */
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
	};
	jb->score = !pl->bypass && (skv_policy_scores(p->policy) || sh->n_q > 0);
	jb->select = !pl->bypass && skv_policy_scores(p->policy);
	jb->n_obs = !jb->score			     ? 0
		    : p->policy == SKV_POLICY_SNAPKV ? p->window
		    : p->policy == SKV_POLICY_H2O    ? L
						     : sh->n_q;

	/*
	 * Fewer items than threads (one layer on a big machine): score the query
	 * heads of each item as separate units, then select. Same bits as the
	 * item-at-a-time path (score_item), G times the key traffic.
	 */
	sz->split = jb->score && G > 1 && jb->n_items < threads &&
		    (uint64_t)jb->n_items * G * L * 4 <= SKV_SPLIT_BUDGET;

	/* call-wide scratch, held by the context: forced positions, the full list
	 * when nothing is chosen, per-item status, split mode's column sums */
	sz->o_pos = align64(L);
	sz->o_errs = sz->o_pos + align64((size_t)L * 4);
	sz->o_cs = sz->o_errs + align64((size_t)jb->n_items * sizeof(struct skv_item_err));
	sz->o_uerrs = sz->o_cs + (sz->split ? align64((size_t)jb->n_items * G * L * 4) : 0);
	sz->common =
	    sz->o_uerrs + (sz->split ? (size_t)jb->n_items * G * sizeof(struct skv_item_err) : 0);

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
	sz->nth = threads < max_units ? threads : max_units;
}

int skv_scratch_bytes(const struct skv_shape *sh, const struct skv_params *p, uint32_t n_layers,
		      unsigned threads, uint64_t *ret_bytes, struct skv_error *err)
{
	struct skv_plan pl;
	struct skv_job jb;
	struct skv_sizing sz;
	struct skv_ws w;
	int r;

	skv_error_clear(err);
	r = skv_plan(sh, p, &pl, err);
	if (r < 0)
		return r;
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
	job_derive(sh, p, &pl, n_layers, threads, &jb, &sz);
	*ret_bytes = (uint64_t)sz.common + (uint64_t)sz.nth * ws_layout(&w, &jb, NULL);
	return 0;
}

int skv_compact(struct skv_ctx *ctx, const struct skv_shape *sh, const struct skv_params *p,
		uint32_t n_layers, const struct skv_layer_in *in, const struct skv_layer_out *out,
		struct skv_error *err)
{
	struct skv_plan pl;
	int r;

	skv_error_clear(err);
	if (!ctx)
		return skv_fail(err, -1, -1, "no context");
	r = skv_plan(sh, p, &pl, err);
	if (r < 0)
		return r;
	if (n_layers == 0)
		return 0;
	if (n_layers > SKV_MAX_LAYERS)
		return skv_fail(err, -1, -1, "%u layers exceed %u", n_layers, SKV_MAX_LAYERS);
	if (!in || !out)
		return skv_fail(err, -1, -1, "layer inputs and outputs are required");

	const uint32_t L = sh->prompt_len, G = sh->h_q / sh->h_kv;
	struct skv_job jb;
	struct skv_sizing sz;

	job_derive(sh, p, &pl, n_layers, ctx->threads, &jb, &sz);
	jb.in = in;
	jb.out = out;
	jb.isa = ctx->isa;
	jb.run_unit = run_unit;

	for (uint32_t l = 0; l < n_layers; l++) {
		const struct skv_layer_out *o = &out[l];
		if (jb.score) {
			r = skv_check_tensor(&in[l].q, "q", l, sh->h_q, sh->n_q, sh->head_dim,
					     false, err);
			if (r < 0)
				return r;
		}
		r = skv_check_tensor(&in[l].k, "k", l, sh->h_kv, L, sh->head_dim, NULL, err);
		if (!r)
			r = skv_check_tensor(&in[l].v, "v", l, sh->h_kv, L, sh->head_dim, false,
					     err);
		if (!r)
			r = skv_check_tensor(&o->k, "output k", l, pl.h_store, pl.kept,
					     sh->head_dim, o, err);
		if (!r)
			r = skv_check_tensor(&o->v, "output v", l, pl.h_store, pl.kept,
					     sh->head_dim, o, err);
		if (r < 0)
			return r;
		if (!o->positions)
			return skv_fail(err, (int32_t)l, -1, "layer %u: no positions output", l);
		if (o->pos_stride < pl.kept && pl.h_store > 1)
			return skv_fail(err, (int32_t)l, -1,
					"layer %u: pos_stride %u is below the kept count %u", l,
					o->pos_stride, pl.kept);
	}
	uint32_t *rows = malloc((size_t)n_layers * sizeof(*rows));
	if (!rows)
		return skv_fail(err, -1, -1, "out of memory for scratch"), -ENOMEM;
	for (uint32_t l = 0; l < n_layers; l++)
		rows[l] = pl.kept;
	r = skv_check_paged_disjoint(n_layers, out, rows, pl.h_store, sh->head_dim, err);
	free(rows);
	if (r < 0)
		return r;

	/*
	 * Fewer items than threads (one layer on a big machine): score the query
	 * heads of each item as separate units, then select. Same bits as the
	 * item-at-a-time path (score_item), G times the key traffic.
	 */
	const bool split = sz.split;
	size_t o_pos = sz.o_pos, o_errs = sz.o_errs, o_cs = sz.o_cs, o_uerrs = sz.o_uerrs;
	size_t total = sz.common;
	if (total > ctx->common_cap) {
		void *m = NULL;
		if (posix_memalign(&m, 64, total))
			return skv_fail(err, -1, -1, "out of memory for scratch"), -ENOMEM;
		free(ctx->common);
		ctx->common = m;
		ctx->common_cap = total;
	}
	char *cm = ctx->common;
	uint8_t *base_keep = (uint8_t *)cm;
	int32_t *base_pos = (int32_t *)(cm + o_pos);
	struct skv_item_err *errs = (struct skv_item_err *)(cm + o_errs);
	memset(errs, 0, (size_t)jb.n_items * sizeof(*errs));
	if (split) {
		jb.cs = (float *)(cm + o_cs);
		jb.uerrs = (struct skv_item_err *)(cm + o_uerrs);
		memset(jb.uerrs, 0, (size_t)jb.n_items * G * sizeof(*jb.uerrs));
	}
	if (pl.bypass) {
		memset(base_keep, 1, L);
	} else if (jb.select) {
		jb.P = L - pl.w_keep;
		uint32_t forced = skv_mark_forced(sh, p, 0, pl.w_keep, base_keep);
		jb.budget = pl.kept - forced;
	} else {
		uint32_t forced = skv_mark_forced(sh, p, pl.sinks, 0, base_keep);
		uint32_t fill = pl.kept - forced;
		for (uint32_t j = L; j-- > 0 && fill;)
			if (!base_keep[j]) {
				base_keep[j] = 1;
				fill--;
			}
	}
	for (uint32_t j = 0, n = 0; j < L; j++)
		if (base_keep[j])
			base_pos[n++] = (int32_t)j;
	jb.base_keep = base_keep;
	jb.base_pos = base_pos;

	unsigned nth = sz.nth;
	for (unsigned t = 0; t < nth; t++)
		if (ws_reserve(&ctx->ws[t], &jb) < 0)
			return skv_fail(err, -1, -1, "out of memory for scratch"), -ENOMEM;
	jb.errs = errs;
	jb.nth = nth;
	if (!split) {
		skv_ctx_run(ctx, &jb, PH_ITEMS, jb.n_items);
	} else {
		skv_ctx_run(ctx, &jb, PH_SCORE_HEADS, jb.n_items * G);
		for (uint32_t i = 0; i < jb.n_items; i++)
			for (uint32_t g = 0; g < G; g++)
				if (jb.uerrs[(size_t)i * G + g].rc < 0) {
					errs[i].rc = jb.uerrs[(size_t)i * G + g].rc;
					errs[i].head = (int32_t)((i % sh->h_kv) * G + g);
					break;
				}
		skv_ctx_run(ctx, &jb, PH_FINISH,
			    p->gqa == SKV_GQA_EXPAND ? jb.n_items * G : jb.n_items);
	}
	r = 0;
	for (uint32_t i = 0; i < jb.n_items; i++)
		if (errs[i].rc < 0) {
			uint32_t layer = i / sh->h_kv;
			r = errs[i].rc;
			if (err) {
				snprintf(err->msg, sizeof(err->msg),
					 "layer %u query head %d (kv head %u): NaN or Inf in the "
					 "attention logits",
					 layer, errs[i].head, i % sh->h_kv);
				err->layer = (int32_t)layer;
				err->head = errs[i].head;
			}
			break;
		}
	return r;
}
