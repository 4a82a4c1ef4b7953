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
				w->trow[r] = INT32_MAX;
				continue;
			}
			uint32_t g = gb + r / per, i = ib + r % per;
			uint32_t t = L - n_obs + i;
			const void *qrow = skv_elem(&in->q, kvh * G + g, sh->n_q - n_obs + i, qes);
			isa->to_f32(qrow, in->q.dtype, w->rowbuf, D);
			for (uint32_t d = 0; d < D; d++)
				w->qt[(size_t)d * rbp + r] = w->rowbuf[d];
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
			/* Copy/convert the tile into L1 even for f32: the micro-kernel
			 * reads its keys with a broadcast pattern the prefetchers do not
			 * follow from DRAM, a plain sequential copy they do (measured). */
			const float *kt = w->kt;
			for (uint32_t j = 0; j < nk; j++)
				isa->to_f32(skv_elem(&in->k, kvh, j0 + j, kes), in->k.dtype,
					    w->kt + (size_t)j * D, D);
			struct skv_tile_args ta = {
			    .qt = w->qt,
			    .kt = kt,
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
			};
			isa->tile(&ta);
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
