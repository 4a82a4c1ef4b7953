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
#include <stdbool.h>
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

/* Micro-kernel shape: row vectors x keys of accumulators (<= 28 registers). */
#ifndef SKV_RVB
#define SKV_RVB 4
#define SKV_NKB 6
#endif

/* QNaN | +Inf | -Inf | SNaN */
#define NONFINITE 0x99

static inline __attribute__((always_inline)) void micro(const int RV, const int NK, const float *qt,
							uint32_t rbp, const float *kt, uint32_t D,
							float *z, float scale, __mmask16 *badm)
{
	__m512 acc[SKV_RVB][SKV_NKB];

#pragma GCC unroll 4
	for (int v = 0; v < RV; v++)
#pragma GCC unroll 12
		for (int k = 0; k < NK; k++)
			acc[v][k] = _mm512_setzero_ps();
	for (uint32_t d = 0; d < D; d++) {
		__m512 q[SKV_RVB];
#pragma GCC unroll 4
		for (int v = 0; v < RV; v++)
			q[v] = _mm512_loadu_ps(qt + (size_t)d * rbp + 16 * v);
#pragma GCC unroll 12
		for (int k = 0; k < NK; k++) {
			__m512 b = _mm512_set1_ps(kt[(size_t)k * D + d]);
#pragma GCC unroll 4
			for (int v = 0; v < RV; v++)
				acc[v][k] = _mm512_fmadd_ps(q[v], b, acc[v][k]);
		}
	}
	const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 12
	for (int k = 0; k < NK; k++)
#pragma GCC unroll 4
		for (int v = 0; v < RV; v++) {
			__m512 x = _mm512_mul_ps(acc[v][k], sc);
			badm[v] |= _mm512_fpclass_ps_mask(x, NONFINITE);
			_mm512_storeu_ps(z + (size_t)k * rbp + 16 * v, x);
		}
}

#define MK(rv, nk)                                                                                 \
	case (rv)*16 + (nk):                                                                       \
		if ((rv) <= SKV_RVB && (nk) <= SKV_NKB)                                            \
			micro((rv) <= SKV_RVB ? (rv) : 1, (nk) <= SKV_NKB ? (nk) : 1, qt, rbp, kt, \
			      D, z, scale, badm);                                                  \
		break

static void micro_dispatch(int rv, int nk, const float *qt, uint32_t rbp, const float *kt,
			   uint32_t D, float *z, float scale, __mmask16 *badm)
{
	switch (rv * 16 + nk) {
		MK(4, 12);
		MK(4, 11);
		MK(4, 10);
		MK(4, 9);
		MK(4, 8);
		MK(4, 7);
		MK(4, 6);
		MK(4, 5);
		MK(4, 4);
		MK(4, 3);
		MK(4, 2);
		MK(4, 1);
		MK(3, 12);
		MK(3, 11);
		MK(3, 10);
		MK(3, 9);
		MK(3, 8);
		MK(3, 7);
		MK(3, 6);
		MK(3, 5);
		MK(3, 4);
		MK(3, 3);
		MK(3, 2);
		MK(3, 1);
		MK(2, 12);
		MK(2, 11);
		MK(2, 10);
		MK(2, 9);
		MK(2, 8);
		MK(2, 7);
		MK(2, 6);
		MK(2, 5);
		MK(2, 4);
		MK(2, 3);
		MK(2, 2);
		MK(2, 1);
		MK(1, 12);
		MK(1, 11);
		MK(1, 10);
		MK(1, 9);
		MK(1, 8);
		MK(1, 7);
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

static void mark_bad(const struct skv_tile_args *a, uint32_t v0, int rv, const __mmask16 *badm)
{
	for (int v = 0; v < rv; v++)
		if (badm[v])
			for (int l = 0; l < 16; l++)
				if (badm[v] >> l & 1)
					a->bad[16 * (v0 + v) + l] = 1;
}

/* mask, one online-softmax step per row, logits -> exp(z - m_tile) */
static void softmax_step(const struct skv_tile_args *a)
{
	const uint32_t rbp = a->rbp, nk = a->nk, nv = rbp / 16;
	const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
	const bool masked = (int64_t)a->j0 + nk - 1 > a->trow_min;

	for (uint32_t v = 0; v < nv; v++) {
		__m512 tm = ninf;
		if (masked) {
			__m512i tr = _mm512_loadu_si512(a->trow + 16 * v);
			for (uint32_t j = 0; j < nk; j++) {
				float *zp = a->z + (size_t)j * rbp + 16 * v;
				__mmask16 vis = _mm512_cmp_epi32_mask(
				    _mm512_set1_epi32((int32_t)(a->j0 + j)), tr, _MM_CMPINT_LE);
				__m512 x = _mm512_mask_blend_ps(vis, ninf, _mm512_loadu_ps(zp));
				_mm512_storeu_ps(zp, x);
				tm = _mm512_max_ps(tm, x);
			}
		} else {
			for (uint32_t j = 0; j < nk; j++)
				tm = _mm512_max_ps(
				    tm, _mm512_loadu_ps(a->z + (size_t)j * rbp + 16 * v));
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

/* prefetch into L2 the share c of n of the next tile's key rows */
static inline void prefetch_next(const struct skv_tile_args *a, uint32_t c, uint32_t n)
{
	for (uint32_t r = c * a->pf_n / n; r < (c + 1) * a->pf_n / n; r++)
		for (uint32_t b = 0; b < a->pf_bytes; b += 64)
			_mm_prefetch((const char *)a->pf[r] + b, _MM_HINT_T1);
}

static void tile_avx512(const struct skv_tile_args *a)
{
	const uint32_t rbp = a->rbp, D = a->d, nk = a->nk, nv = rbp / 16;
	const uint32_t n_calls = (nv + SKV_RVB - 1) / SKV_RVB * ((nk + SKV_NKB - 1) / SKV_NKB);
	uint32_t c = 0;

	/* logits: row groups of up to SKV_RVB vectors, key groups of up to SKV_NKB */
	for (uint32_t v0 = 0; v0 < nv; v0 += SKV_RVB) {
		int rv = nv - v0 < SKV_RVB ? (int)(nv - v0) : SKV_RVB;
		__mmask16 badm[4] = {0, 0, 0, 0};
		for (uint32_t k0 = 0; k0 < nk; k0 += SKV_NKB) {
			int kk = nk - k0 < SKV_NKB ? (int)(nk - k0) : SKV_NKB;
			prefetch_next(a, c++, n_calls);
			micro_dispatch(rv, kk, a->qt + 16 * v0, rbp, a->kt + (size_t)k0 * D, D,
				       a->z + (size_t)k0 * rbp + 16 * v0, a->scale, badm);
		}
		mark_bad(a, v0, rv, badm);
	}
	softmax_step(a);
}

/*
 * AVX512-BF16 logits: one vdpbf16ps per row vector and key does two
 * multiply-adds per lane, a pair d, d+1 of the packed query words against
 * the same pair of the key row, broadcast as one 32-bit word. The products
 * of two bf16 are exact in fp32 and each of the two adds rounds to nearest
 * even, so every logit is an fp32 sum in a fixed order; subnormal inputs
 * are flushed by the instruction, so the driver keeps them off this path.
 */
#define BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

static inline __attribute__((always_inline)) BF16_TARGET void
micro_bf16(const int RV, const int NK, const uint32_t *qp, uint32_t rbp, const uint16_t *kb,
	   uint32_t D, float *z, float scale, __mmask16 *badm)
{
	__m512 acc[SKV_RVB][SKV_NKB];

#pragma GCC unroll 4
	for (int v = 0; v < RV; v++)
#pragma GCC unroll 12
		for (int k = 0; k < NK; k++)
			acc[v][k] = _mm512_setzero_ps();
	for (uint32_t p = 0; p < D / 2; p++) {
		__m512bh q[SKV_RVB];
#pragma GCC unroll 4
		for (int v = 0; v < RV; v++)
			q[v] = (__m512bh)_mm512_loadu_si512(qp + (size_t)p * rbp + 16 * v);
#pragma GCC unroll 12
		for (int k = 0; k < NK; k++) {
			uint32_t w;
			memcpy(&w, kb + (size_t)k * D + 2 * p, 4);
			__m512bh b = (__m512bh)_mm512_set1_epi32((int)w);
#pragma GCC unroll 4
			for (int v = 0; v < RV; v++)
				acc[v][k] = _mm512_dpbf16_ps(acc[v][k], q[v], b);
		}
	}
	const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 12
	for (int k = 0; k < NK; k++)
#pragma GCC unroll 4
		for (int v = 0; v < RV; v++) {
			__m512 x = _mm512_mul_ps(acc[v][k], sc);
			badm[v] |= _mm512_fpclass_ps_mask(x, NONFINITE);
			_mm512_storeu_ps(z + (size_t)k * rbp + 16 * v, x);
		}
}

#define MKB(rv, nk)                                                                                \
	case (rv)*16 + (nk):                                                                       \
		micro_bf16((rv), (nk), qp, rbp, kb, D, z, scale, badm);                            \
		break

static BF16_TARGET void micro_bf16_dispatch(int rv, int nk, const uint32_t *qp, uint32_t rbp,
					    const uint16_t *kb, uint32_t D, float *z, float scale,
					    __mmask16 *badm)
{
	switch (rv * 16 + nk) {
		MKB(4, 6);
		MKB(4, 5);
		MKB(4, 4);
		MKB(4, 3);
		MKB(4, 2);
		MKB(4, 1);
		MKB(3, 6);
		MKB(3, 5);
		MKB(3, 4);
		MKB(3, 3);
		MKB(3, 2);
		MKB(3, 1);
		MKB(2, 6);
		MKB(2, 5);
		MKB(2, 4);
		MKB(2, 3);
		MKB(2, 2);
		MKB(2, 1);
		MKB(1, 6);
		MKB(1, 5);
		MKB(1, 4);
		MKB(1, 3);
		MKB(1, 2);
		MKB(1, 1);
	default:
		break;
	}
}

static void tile_bf16_avx512(const struct skv_tile_args *a)
{
	const uint32_t rbp = a->rbp, D = a->d, nk = a->nk, nv = rbp / 16;
	const uint32_t n_calls = (nv + SKV_RVB - 1) / SKV_RVB * ((nk + SKV_NKB - 1) / SKV_NKB);
	const uint32_t *qp = (const uint32_t *)a->qt;
	const uint16_t *kb = (const uint16_t *)a->kt;
	uint32_t c = 0;

	for (uint32_t v0 = 0; v0 < nv; v0 += SKV_RVB) {
		int rv = nv - v0 < SKV_RVB ? (int)(nv - v0) : SKV_RVB;
		__mmask16 badm[4] = {0, 0, 0, 0};
		for (uint32_t k0 = 0; k0 < nk; k0 += SKV_NKB) {
			int kk = nk - k0 < SKV_NKB ? (int)(nk - k0) : SKV_NKB;
			prefetch_next(a, c++, n_calls);
			micro_bf16_dispatch(rv, kk, qp + 16 * v0, rbp, kb + (size_t)k0 * D, D,
					    a->z + (size_t)k0 * rbp + 16 * v0, a->scale, badm);
		}
		mark_bad(a, v0, rv, badm);
	}
	softmax_step(a);
}

/* copy n bf16; false if one is subnormal (exponent 0, mantissa not 0) */
static bool stage_bf16_avx512(uint16_t *dst, const uint16_t *src, uint32_t n)
{
	const __m512i ex = _mm512_set1_epi16(0x7f80), mant = _mm512_set1_epi16(0x007f);
	__mmask32 sub = 0;
	uint32_t i = 0;

	for (; i + 32 <= n; i += 32) {
		__m512i x = _mm512_loadu_si512(src + i);
		sub |= _mm512_mask_test_epi16_mask(_mm512_testn_epi16_mask(x, ex), x, mant);
		_mm512_storeu_si512(dst + i, x);
	}
	bool ok = sub == 0;
	for (; i < n; i++) {
		dst[i] = src[i];
		ok &= !(!(src[i] & 0x7f80) && (src[i] & 0x7f));
	}
	return ok;
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

/* horizontal sums of 4 vectors at once: lane i of the result is sum(v[i]) */
static inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
	/* fold 512 -> 256 -> 128 per vector, then a 4x4 transpose-add */
	__m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
	__m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
	__m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
	__m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
	__m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
	__m128 b4 = _mm_add_ps(_mm256_castps256_ps128(b8), _mm256_extractf128_ps(b8, 1));
	__m128 c4 = _mm_add_ps(_mm256_castps256_ps128(c8), _mm256_extractf128_ps(c8, 1));
	__m128 d4 = _mm_add_ps(_mm256_castps256_ps128(d8), _mm256_extractf128_ps(d8, 1));
	__m128 ab = _mm_hadd_ps(a4, b4);
	__m128 cd = _mm_hadd_ps(c4, d4);
	return _mm_hadd_ps(ab, cd);
}

static void votes_avx512(const struct skv_votes_args *a)
{
	const uint32_t rbp = a->rbp;

	for (uint32_t t0 = 0; t0 < a->ext; t0 += SKV_TILE) {
		const float *f = a->f + (size_t)(t0 / SKV_TILE) * rbp;
		uint32_t t1 = a->ext - t0 < SKV_TILE ? a->ext : t0 + SKV_TILE;
		for (uint32_t i = 0; i < a->n_segs; i++) {
			const struct skv_seg *sg = &a->segs[i];
			float *cs = a->colsum + (size_t)sg->g * a->colsum_stride;
			uint32_t n = sg->end - sg->begin;
			if (sg->begin % 16 == 0 && n == 32) {
				/* the common window of 32 rows: factors stay in registers,
				 * four keys per horizontal reduction */
				__m512 f0 = _mm512_loadu_ps(f + sg->begin);
				__m512 f1 = _mm512_loadu_ps(f + sg->begin + 16);
				uint32_t j = t0;
				for (; j + 4 <= t1; j += 4) {
					__m512 v[4];
					for (int q = 0; q < 4; q++) {
						const float *e =
						    a->e + (size_t)(j + q) * rbp + sg->begin;
						v[q] = _mm512_fmadd_ps(
						    _mm512_loadu_ps(e + 16), f1,
						    _mm512_mul_ps(_mm512_loadu_ps(e), f0));
					}
					__m128 sum = hsum4(v[0], v[1], v[2], v[3]);
					_mm_storeu_ps(cs + j,
						      _mm_add_ps(_mm_loadu_ps(cs + j), sum));
				}
				for (; j < t1; j++) {
					const float *e = a->e + (size_t)j * rbp + sg->begin;
					__m512 v =
					    _mm512_fmadd_ps(_mm512_loadu_ps(e + 16), f1,
							    _mm512_mul_ps(_mm512_loadu_ps(e), f0));
					cs[j] += _mm512_reduce_add_ps(v);
				}
				continue;
			}
			for (uint32_t j = t0; j < t1; j++) {
				const float *e = a->e + (size_t)j * rbp;
				__m512 acc = _mm512_setzero_ps();
				for (uint32_t r = sg->begin; r < sg->end; r += 16) {
					uint32_t m = sg->end - r < 16 ? sg->end - r : 16;
					__mmask16 mk = (__mmask16)((1u << m) - 1);
					acc =
					    _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, e + r),
							    _mm512_maskz_loadu_ps(mk, f + r), acc);
				}
				cs[j] += _mm512_reduce_add_ps(acc);
			}
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

/* Gathered rows are written once and read by someone else later: stream them. */
static void copy_avx512(void *dst, const void *src, size_t bytes)
{
	if (((uintptr_t)dst & 63) || (bytes & 63)) {
		memcpy(dst, src, bytes);
		return;
	}
	for (size_t i = 0; i < bytes; i += 64)
		_mm512_stream_si512((void *)((char *)dst + i),
				    _mm512_loadu_si512((const char *)src + i));
}

static void fence_avx512(void)
{
	_mm_sfence();
}

const struct skv_isa skv_isa_avx512 = {
    .name = "avx512",
    .tile = tile_avx512,
    .factors = factors_avx512,
    .votes = votes_avx512,
    .to_f32 = to_f32_avx512,
    .copy = copy_avx512,
    .fence = fence_avx512,
};

/* the same, with bf16 x bf16 logits on vdpbf16ps (CPUs with AVX512-BF16) */
const struct skv_isa skv_isa_avx512bf16 = {
    .name = "avx512bf16",
    .tile = tile_avx512,
    .tile_bf16 = tile_bf16_avx512,
    .stage_bf16 = stage_bf16_avx512,
    .factors = factors_avx512,
    .votes = votes_avx512,
    .to_f32 = to_f32_avx512,
    .copy = copy_avx512,
    .fence = fence_avx512,
};
