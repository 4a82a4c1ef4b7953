// SPDX-License-Identifier: MIT
/*
 * skv-score.c - scoring of one item: logits, full causal softmax and per-key
 * column sums of the attention weights, streamed through the ISA kernels.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "skv-driver.h"

/* ------------------------------------------------------------- scoring */

/*
 * Logits, full causal softmax and per-column sums of the attention weights
 * for the n_obs rows of query heads g0 .. g1-1 of K/V head kvh:
 * colsum[(g - g0) * L + j] = sum over rows t of a[t][j]. Row i of head g is
 * at position t = L - n_obs + i. Returns 0 or -EDOM with *bad_g the first
 * query head (within the group) with a NaN/Inf logit.
 *
 * Rows go through in blocks of at most jb->rb: whole heads while they fit,
 * else chunks of one head. Every row's arithmetic is independent of the
 * other rows of its block, and each head's rows are cut into the same
 * chunks whatever g0 and g1 are, so scoring heads one at a time (split mode)
 * gives the same bits as scoring the whole group at once.
 */
/*
 * bf16 queries and keys go through isa->tile_bf16 when the CPU has one, the
 * head dim is even and no query row of the whole group (all G heads, so
 * that split and group mode decide alike) holds a subnormal.
 */
static bool use_bf16(const struct skv_job *jb, struct skv_ws *w, const struct skv_layer_in *in,
		     uint32_t kvh)
{
	const struct skv_shape *sh = jb->sh;
	const uint32_t D = sh->head_dim, G = jb->G, n_obs = jb->n_obs;
	bool ok = true;

	if (!jb->isa->tile_bf16 || in->q.dtype != SKV_DTYPE_BF16 || in->k.dtype != SKV_DTYPE_BF16 ||
	    D % 2)
		return false;
	for (uint32_t g = 0; g < G; g++)
		for (uint32_t i = 0; i < n_obs; i++)
			ok &= jb->isa->stage_bf16(
			    w->kb, skv_elem(&in->q, kvh * G + g, sh->n_q - n_obs + i, 2), D);
	return ok;
}

/*
 * Stage keys j0 .. j0+nk-1 and compute the tile: bf16 pairs when bf and
 * none of the tile's keys is subnormal (a fixed set of tiles, whatever the
 * row blocks), else f32 with FMAs.
 */
static void score_tile(const struct skv_job *jb, struct skv_ws *w, const struct skv_layer_in *in,
		       uint32_t kvh, bool bf, struct skv_tile_args *ta)
{
	const struct skv_isa *isa = jb->isa;
	const uint32_t D = ta->d;
	const size_t kes = skv_dtype_size(in->k.dtype);

	if (bf) {
		bool ok = true;
		for (uint32_t j = 0; j < ta->nk; j++)
			ok &= isa->stage_bf16(w->kb + (size_t)j * D,
					      skv_elem(&in->k, kvh, ta->j0 + j, kes), D);
		if (ok) {
			ta->qt = (const float *)w->qb;
			ta->kt = (const float *)w->kb;
			isa->tile_bf16(ta);
			return;
		}
		for (uint32_t j = 0; j < ta->nk; j++)
			isa->to_f32(w->kb + (size_t)j * D, SKV_DTYPE_BF16, w->kt + (size_t)j * D,
				    D);
	} else {
		/* Copy/convert the tile into L1 even for f32: the micro-kernel
		 * reads its keys with a broadcast pattern the prefetchers do not
		 * follow from DRAM, a plain sequential copy they do (measured).
		 * fp8 keys are widened and scaled here, in C, whatever the ISA:
		 * its tile then sees the f32 keys SPEC.md defines. */
		const bool f8 = skv_dtype_is_fp8(in->k.dtype);
		for (uint32_t j = 0; j < ta->nk; j++) {
			const void *src = skv_elem(&in->k, kvh, ta->j0 + j, kes);
			if (f8)
				skv_fp8_to_f32(src, in->k.dtype, in->k.scale, w->kt + (size_t)j * D,
					       D);
			else
				isa->to_f32(src, in->k.dtype, w->kt + (size_t)j * D, D);
		}
	}
	ta->qt = w->qt;
	ta->kt = w->kt;
	isa->tile(ta);
}

int skv_score_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
		   uint32_t g0, uint32_t g1, float *colsum, uint32_t *bad_g)
{
	const struct skv_shape *sh = jb->sh;
	const struct skv_layer_in *in = &jb->in[layer];
	const struct skv_isa *isa = jb->isa;
	const uint32_t L = sh->prompt_len, D = sh->head_dim, G = jb->G, n_obs = jb->n_obs;
	const uint32_t rb = jb->rb;
	const size_t qes = skv_dtype_size(in->q.dtype), kes = skv_dtype_size(in->k.dtype);
	uint32_t gb = g0, i0 = 0;
	const bool bf = use_bf16(jb, w, in, kvh);

	memset(colsum, 0, (size_t)(g1 - g0) * L * sizeof(float));
	while (gb < g1) {
		/* this block: heads [gb, ge), rows [ib, ie) of each */
		uint32_t ge, ib, ie;
		if (n_obs <= rb) {
			ge = gb + rb / n_obs < g1 ? gb + rb / n_obs : g1;
			ib = 0;
			ie = n_obs;
		} else {
			ge = gb + 1;
			ib = i0;
			ie = n_obs - i0 < rb ? n_obs : i0 + rb;
		}
		const uint32_t per = ie - ib, rows = (ge - gb) * per;
		uint32_t rbp = (rows + SKV_ROWPAD - 1) / SKV_ROWPAD * SKV_ROWPAD;
		uint32_t ext = 0, n_segs = 0;

		/* pack the block's query rows, transposed, zero padding rows */
		for (uint32_t r = 0; r < rbp; r++) {
			if (r >= rows) {
				for (uint32_t d = 0; d < D; d++)
					w->qt[(size_t)d * rbp + r] = 0.0f;
				for (uint32_t p = 0; bf && p < D / 2; p++)
					w->qb[(size_t)p * rbp + r] = 0;
				w->trow[r] = INT32_MAX;
				continue;
			}
			uint32_t g = gb + r / per, i = ib + r % per;
			uint32_t t = L - n_obs + i;
			const void *qrow = skv_elem(&in->q, kvh * G + g, sh->n_q - n_obs + i, qes);
			isa->to_f32(qrow, in->q.dtype, w->rowbuf, D);
			for (uint32_t d = 0; d < D; d++)
				w->qt[(size_t)d * rbp + r] = w->rowbuf[d];
			for (uint32_t p = 0; bf && p < D / 2; p++) {
				const uint16_t *h = qrow;
				w->qb[(size_t)p * rbp + r] = h[2 * p] | (uint32_t)h[2 * p + 1]
									    << 16;
			}
			w->trow[r] = (int32_t)t;
			if (t + 1 > ext)
				ext = t + 1;
			if (n_segs && w->segs[n_segs - 1].g == g - g0)
				w->segs[n_segs - 1].end = r + 1;
			else
				w->segs[n_segs++] = (struct skv_seg){g - g0, r, r + 1};
			w->bad[r] = 0;
		}
		for (uint32_t r = rows; r < rbp; r++)
			w->bad[r] = 0;
		int32_t trow_min = INT32_MAX;
		for (uint32_t r = 0; r < rbp; r++) {
			w->m[r] = -INFINITY;
			w->s[r] = 0.0f;
			trow_min = w->trow[r] < trow_min ? w->trow[r] : trow_min;
		}

		uint32_t nt = 0;
		for (uint32_t j0 = 0; j0 < ext; j0 += SKV_TILE, nt++) {
			uint32_t nk = ext - j0 < SKV_TILE ? ext - j0 : SKV_TILE;
			uint32_t j1 = j0 + nk, pf_n = ext - j1 < SKV_TILE ? ext - j1 : SKV_TILE;
			const void *pf[SKV_TILE];
			for (uint32_t j = 0; j < pf_n; j++)
				pf[j] = skv_elem(&in->k, kvh, j1 + j, kes);
			struct skv_tile_args ta = {
			    .z = w->z + (size_t)j0 * rbp,
			    .m = w->m,
			    .s = w->s,
			    .tmax = w->f + (size_t)nt * rbp,
			    .bad = w->bad,
			    .trow = w->trow,
			    .rbp = rbp,
			    .d = D,
			    .nk = nk,
			    .j0 = j0,
			    .scale = jb->scale,
			    .trow_min = trow_min,
			    .pf = pf,
			    .pf_n = pf_n,
			    .pf_bytes = (uint32_t)(D * kes),
			};
			score_tile(jb, w, in, kvh, bf, &ta);
		}
		for (uint32_t r = 0; r < rows; r++)
			if (w->bad[r]) {
				*bad_g = gb + r / per;
				return -EDOM;
			}
		isa->factors(w->f, w->m, w->s, nt, rbp);
		struct skv_votes_args va = {
		    .e = w->z,
		    .f = w->f,
		    .colsum = colsum,
		    .segs = w->segs,
		    .n_segs = n_segs,
		    .rbp = rbp,
		    .ext = ext,
		    .colsum_stride = L,
		};
		isa->votes(&va);
		if (n_obs <= rb) {
			gb = ge;
		} else if ((i0 = ie) == n_obs) {
			gb++;
			i0 = 0;
		}
	}
	return 0;
}
