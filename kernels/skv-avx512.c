// SPDX-License-Identifier: MIT
/*
 * skv-avx512.c - AVX-512 kernels (F, DQ, BW, VL). Compiled with those flags
 * on its own; only reached when the CPU reports them (skv.c pick_isa).
 *
 * 16 rows per vector. The logit micro-kernel holds RV row vectors x NK keys
 * of accumulators (at most 4 x 6 = 24 of the 32 registers) and broadcasts
 * one key element per FMA column, so the keys need no transposition: each
 * key tile is a plain [nk][D] f32 copy, read from L1.
 */
#include <immintrin.h>
#include <string.h>

#include "skv-internal.h"

/* exp(x) with skv_expf's polynomial; 0 for x < -87.3 (and x = -inf). */
static inline __m512 exp16(__m512 x)
{
	__mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
	x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
	x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
					_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
	r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
	__m512 p = _mm512_set1_ps(1.0f / 720.0f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
}

/* QNaN | +Inf | -Inf | SNaN */
#define NONFINITE 0x99

static inline __attribute__((always_inline)) void micro(const int RV, const int NK, const float *qt,
							uint32_t rbp, const float *kt, uint32_t D,
							float *z, float scale, __mmask16 *badm)
{
	__m512 acc[4][6];

	for (int v = 0; v < RV; v++)
		for (int k = 0; k < NK; k++)
			acc[v][k] = _mm512_setzero_ps();
	for (uint32_t d = 0; d < D; d++) {
		__m512 q[4];
		for (int v = 0; v < RV; v++)
			q[v] = _mm512_loadu_ps(qt + (size_t)d * rbp + 16 * v);
		for (int k = 0; k < NK; k++) {
			__m512 b = _mm512_set1_ps(kt[(size_t)k * D + d]);
			for (int v = 0; v < RV; v++)
				acc[v][k] = _mm512_fmadd_ps(q[v], b, acc[v][k]);
		}
	}
	const __m512 sc = _mm512_set1_ps(scale);
	for (int k = 0; k < NK; k++)
		for (int v = 0; v < RV; v++) {
			__m512 x = _mm512_mul_ps(acc[v][k], sc);
			badm[v] |= _mm512_fpclass_ps_mask(x, NONFINITE);
			_mm512_storeu_ps(z + (size_t)k * rbp + 16 * v, x);
		}
}

#define MK(rv, nk)                                                                                 \
	case (rv)*8 + (nk):                                                                        \
		micro(rv, nk, qt, rbp, kt, D, z, scale, badm);                                     \
		break

static void micro_dispatch(int rv, int nk, const float *qt, uint32_t rbp, const float *kt,
			   uint32_t D, float *z, float scale, __mmask16 *badm)
{
	switch (rv * 8 + nk) {
		MK(4, 6);
		MK(4, 5);
		MK(4, 4);
		MK(4, 3);
		MK(4, 2);
		MK(4, 1);
		MK(3, 6);
		MK(3, 5);
		MK(3, 4);
		MK(3, 3);
		MK(3, 2);
		MK(3, 1);
		MK(2, 6);
		MK(2, 5);
		MK(2, 4);
		MK(2, 3);
		MK(2, 2);
		MK(2, 1);
		MK(1, 6);
		MK(1, 5);
		MK(1, 4);
		MK(1, 3);
		MK(1, 2);
		MK(1, 1);
	default:
		break;
	}
}

static void tile_avx512(const struct skv_tile_args *a)
{
	const uint32_t rbp = a->rbp, D = a->d, nk = a->nk, nv = rbp / 16;

	/* logits: row groups of up to 4 vectors, key groups of up to 6 */
	for (uint32_t v0 = 0; v0 < nv; v0 += 4) {
		int rv = nv - v0 < 4 ? (int)(nv - v0) : 4;
		__mmask16 badm[4] = {0, 0, 0, 0};
		for (uint32_t k0 = 0; k0 < nk; k0 += 6) {
			int kk = nk - k0 < 6 ? (int)(nk - k0) : 6;
			micro_dispatch(rv, kk, a->qt + 16 * v0, rbp, a->kt + (size_t)k0 * D, D,
				       a->z + (size_t)k0 * rbp + 16 * v0, a->scale, badm);
		}
		for (int v = 0; v < rv; v++)
			if (badm[v])
				for (int l = 0; l < 16; l++)
					if (badm[v] >> l & 1)
						a->bad[16 * (v0 + v) + l] = 1;
	}
	/* mask, one online-softmax step per row, logits -> exp(z - m_tile) */
	const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
	for (uint32_t v = 0; v < nv; v++) {
		__m512i tr = _mm512_loadu_si512(a->trow + 16 * v);
		__m512 tm = ninf;
		for (uint32_t j = 0; j < nk; j++) {
			float *zp = a->z + (size_t)j * rbp + 16 * v;
			__mmask16 vis = _mm512_cmp_epi32_mask(
			    _mm512_set1_epi32((int32_t)(a->j0 + j)), tr, _MM_CMPINT_LE);
			__m512 x = _mm512_mask_blend_ps(vis, ninf, _mm512_loadu_ps(zp));
			_mm512_storeu_ps(zp, x);
			tm = _mm512_max_ps(tm, x);
		}
		__m512 m = _mm512_loadu_ps(a->m + 16 * v);
		__m512 mn = _mm512_max_ps(m, tm);
		__m512 s =
		    _mm512_mul_ps(_mm512_loadu_ps(a->s + 16 * v), exp16(_mm512_sub_ps(m, mn)));
		for (uint32_t j = 0; j < nk; j++) {
			float *zp = a->z + (size_t)j * rbp + 16 * v;
			__m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(zp), mn));
			s = _mm512_add_ps(s, e);
			_mm512_storeu_ps(zp, e);
		}
		_mm512_storeu_ps(a->m + 16 * v, mn);
		_mm512_storeu_ps(a->s + 16 * v, s);
		_mm512_storeu_ps(a->tmax + 16 * v, mn);
	}
}

static void factors_avx512(float *f, const float *m, const float *s, uint32_t ntiles, uint32_t rbp)
{
	for (uint32_t t = 0; t < ntiles; t++)
		for (uint32_t r = 0; r < rbp; r += 16) {
			float *fp = f + (size_t)t * rbp + r;
			__m512 x = _mm512_sub_ps(_mm512_loadu_ps(fp), _mm512_loadu_ps(m + r));
			_mm512_storeu_ps(fp, _mm512_div_ps(exp16(x), _mm512_loadu_ps(s + r)));
		}
}

static void votes_avx512(const struct skv_votes_args *a)
{
	for (uint32_t j = 0; j < a->ext; j++) {
		const float *e = a->e + (size_t)j * a->rbp;
		const float *f = a->f + (size_t)(j / SKV_TILE) * a->rbp;
		for (uint32_t i = 0; i < a->n_segs; i++) {
			const struct skv_seg *sg = &a->segs[i];
			__m512 acc = _mm512_setzero_ps();
			for (uint32_t r = sg->begin; r < sg->end; r += 16) {
				uint32_t n = sg->end - r < 16 ? sg->end - r : 16;
				__mmask16 mk = (__mmask16)((1u << n) - 1);
				acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, e + r),
						      _mm512_maskz_loadu_ps(mk, f + r), acc);
			}
			a->colsum[(size_t)sg->g * a->colsum_stride + j] +=
			    _mm512_reduce_add_ps(acc);
		}
	}
}

static void to_f32_avx512(const void *src, enum skv_dtype dt, float *dst, uint32_t n)
{
	uint32_t i = 0;
	const uint16_t *h = src;

	switch (dt) {
	case SKV_DTYPE_F32:
		memcpy(dst, src, (size_t)n * 4);
		return;
	case SKV_DTYPE_F16:
		for (; i + 16 <= n; i += 16)
			_mm512_storeu_ps(
			    dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
		for (; i < n; i++)
			dst[i] = skv_f16_to_f32(h[i]);
		return;
	case SKV_DTYPE_BF16:
		for (; i + 16 <= n; i += 16) {
			__m512i w =
			    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + i)));
			_mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
		}
		for (; i < n; i++)
			dst[i] = skv_bf16_to_f32(h[i]);
		return;
	default:
		return;
	}
}

const struct skv_isa skv_isa_avx512 = {
    .name = "avx512",
    .tile = tile_avx512,
    .factors = factors_avx512,
    .votes = votes_avx512,
    .to_f32 = to_f32_avx512,
};
