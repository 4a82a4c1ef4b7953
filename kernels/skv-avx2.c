// SPDX-License-Identifier: MIT
/*
 * skv-avx2.c - AVX2 + FMA + F16C kernels, the same scheme as skv-avx512.c
 * with 8 rows per vector and 2 x 6 accumulators (16 registers in all).
 */
#include <immintrin.h>
#include <string.h>

#include "skv-internal.h"

static inline __m256 exp8(__m256 x)
{
	__m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
	x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
	x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
				   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
	r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
	__m256 p = _mm256_set1_ps(1.0f / 720.0f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
	__m256i e =
	    _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

static inline __attribute__((always_inline)) void micro(const int RV, const int NK, const float *qt,
							uint32_t rbp, const float *kt, uint32_t D,
							float *z, float scale, int *badm)
{
	__m256 acc[2][6];

#pragma GCC unroll 4
	for (int v = 0; v < RV; v++)
#pragma GCC unroll 6
		for (int k = 0; k < NK; k++)
			acc[v][k] = _mm256_setzero_ps();
	for (uint32_t d = 0; d < D; d++) {
		__m256 q[2];
#pragma GCC unroll 4
		for (int v = 0; v < RV; v++)
			q[v] = _mm256_loadu_ps(qt + (size_t)d * rbp + 8 * v);
#pragma GCC unroll 6
		for (int k = 0; k < NK; k++) {
			__m256 b = _mm256_broadcast_ss(kt + (size_t)k * D + d);
#pragma GCC unroll 4
			for (int v = 0; v < RV; v++)
				acc[v][k] = _mm256_fmadd_ps(q[v], b, acc[v][k]);
		}
	}
	const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 6
	for (int k = 0; k < NK; k++)
#pragma GCC unroll 4
		for (int v = 0; v < RV; v++) {
			__m256 x = _mm256_mul_ps(acc[v][k], sc);
			__m256 dd = _mm256_sub_ps(x, x); /* NaN exactly when x is NaN or Inf */
			badm[v] |= _mm256_movemask_ps(_mm256_cmp_ps(dd, dd, _CMP_UNORD_Q));
			_mm256_storeu_ps(z + (size_t)k * rbp + 8 * v, x);
		}
}

#define MK(rv, nk)                                                                                 \
	case (rv)*8 + (nk):                                                                        \
		micro(rv, nk, qt, rbp, kt, D, z, scale, badm);                                     \
		break

static void micro_dispatch(int rv, int nk, const float *qt, uint32_t rbp, const float *kt,
			   uint32_t D, float *z, float scale, int *badm)
{
	switch (rv * 8 + nk) {
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

static void tile_avx2(const struct skv_tile_args *a)
{
	const uint32_t rbp = a->rbp, D = a->d, nk = a->nk, nv = rbp / 8;

	for (uint32_t v0 = 0; v0 < nv; v0 += 2) {
		int rv = nv - v0 < 2 ? (int)(nv - v0) : 2;
		int badm[2] = {0, 0};
		for (uint32_t k0 = 0; k0 < nk; k0 += 6) {
			int kk = nk - k0 < 6 ? (int)(nk - k0) : 6;
			micro_dispatch(rv, kk, a->qt + 8 * v0, rbp, a->kt + (size_t)k0 * D, D,
				       a->z + (size_t)k0 * rbp + 8 * v0, a->scale, badm);
		}
		for (int v = 0; v < rv; v++)
			for (int l = 0; l < 8; l++)
				if (badm[v] >> l & 1)
					a->bad[8 * (v0 + v) + l] = 1;
	}
	const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
	for (uint32_t v = 0; v < nv; v++) {
		__m256i tr = _mm256_loadu_si256((const __m256i *)(a->trow + 8 * v));
		__m256 tm = ninf;
		for (uint32_t j = 0; j < nk; j++) {
			float *zp = a->z + (size_t)j * rbp + 8 * v;
			/* hidden when j0 + j > trow */
			__m256i hid =
			    _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(a->j0 + j)), tr);
			__m256 x =
			    _mm256_blendv_ps(_mm256_loadu_ps(zp), ninf, _mm256_castsi256_ps(hid));
			_mm256_storeu_ps(zp, x);
			tm = _mm256_max_ps(tm, x);
		}
		__m256 m = _mm256_loadu_ps(a->m + 8 * v);
		__m256 mn = _mm256_max_ps(m, tm);
		__m256 s = _mm256_mul_ps(_mm256_loadu_ps(a->s + 8 * v), exp8(_mm256_sub_ps(m, mn)));
		for (uint32_t j = 0; j < nk; j++) {
			float *zp = a->z + (size_t)j * rbp + 8 * v;
			__m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(zp), mn));
			s = _mm256_add_ps(s, e);
			_mm256_storeu_ps(zp, e);
		}
		_mm256_storeu_ps(a->m + 8 * v, mn);
		_mm256_storeu_ps(a->s + 8 * v, s);
		_mm256_storeu_ps(a->tmax + 8 * v, mn);
	}
}

static void factors_avx2(float *f, const float *m, const float *s, uint32_t ntiles, uint32_t rbp)
{
	for (uint32_t t = 0; t < ntiles; t++)
		for (uint32_t r = 0; r < rbp; r += 8) {
			float *fp = f + (size_t)t * rbp + r;
			__m256 x = _mm256_sub_ps(_mm256_loadu_ps(fp), _mm256_loadu_ps(m + r));
			_mm256_storeu_ps(fp, _mm256_div_ps(exp8(x), _mm256_loadu_ps(s + r)));
		}
}

static inline float hsum8(__m256 v)
{
	__m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	a = _mm_add_ps(a, _mm_movehl_ps(a, a));
	a = _mm_add_ss(a, _mm_movehdup_ps(a));
	return _mm_cvtss_f32(a);
}

static void votes_avx2(const struct skv_votes_args *a)
{
	for (uint32_t j = 0; j < a->ext; j++) {
		const float *e = a->e + (size_t)j * a->rbp;
		const float *f = a->f + (size_t)(j / SKV_TILE) * a->rbp;
		for (uint32_t i = 0; i < a->n_segs; i++) {
			const struct skv_seg *sg = &a->segs[i];
			__m256 acc = _mm256_setzero_ps();
			uint32_t r = sg->begin;
			for (; r + 8 <= sg->end; r += 8)
				acc = _mm256_fmadd_ps(_mm256_loadu_ps(e + r),
						      _mm256_loadu_ps(f + r), acc);
			float tail = 0.0f;
			for (; r < sg->end; r++)
				tail += e[r] * f[r];
			a->colsum[(size_t)sg->g * a->colsum_stride + j] += hsum8(acc) + tail;
		}
	}
}

static void to_f32_avx2(const void *src, enum skv_dtype dt, float *dst, uint32_t n)
{
	uint32_t i = 0;
	const uint16_t *h = src;

	switch (dt) {
	case SKV_DTYPE_F32:
		memcpy(dst, src, (size_t)n * 4);
		return;
	case SKV_DTYPE_F16:
		for (; i + 8 <= n; i += 8)
			_mm256_storeu_ps(
			    dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
		for (; i < n; i++)
			dst[i] = skv_f16_to_f32(h[i]);
		return;
	case SKV_DTYPE_BF16:
		for (; i + 8 <= n; i += 8) {
			__m256i w =
			    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
			_mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
		}
		for (; i < n; i++)
			dst[i] = skv_bf16_to_f32(h[i]);
		return;
	default:
		return;
	}
}

/* Gathered rows are written once and read by someone else later: stream them. */
static void copy_avx2(void *dst, const void *src, size_t bytes)
{
	if (((uintptr_t)dst & 31) || (bytes & 31)) {
		memcpy(dst, src, bytes);
		return;
	}
	for (size_t i = 0; i < bytes; i += 32)
		_mm256_stream_si256((__m256i *)((char *)dst + i),
				    _mm256_loadu_si256((const __m256i *)((const char *)src + i)));
}

static void fence_avx2(void)
{
	_mm_sfence();
}

const struct skv_isa skv_isa_avx2 = {
    .name = "avx2",
    .tile = tile_avx2,
    .factors = factors_avx2,
    .votes = votes_avx2,
    .to_f32 = to_f32_avx2,
    .copy = copy_avx2,
    .fence = fence_avx2,
};
