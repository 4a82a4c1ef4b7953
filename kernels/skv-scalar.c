// SPDX-License-Identifier: MIT
/*
 * skv-scalar.c - portable kernels: the fallback when the CPU has neither
 * AVX-512 nor AVX2+F16C+FMA, and the structure the SIMD files vectorise.
 */
#include <math.h>
#include <string.h>

#include "skv-internal.h"

/*
 * exp(x) = 2^n * p(r), x = n ln2 + r, |r| <= ln2/2, degree-6 Taylor
 * polynomial (error ~1 ulp). Inputs below -87.3 give 0 (a weight that small
 * cannot move a vote), which also makes exp(-inf) = 0 for masked keys. Our
 * own so that libskv needs no libm and all ISAs share one approximation.
 */
float skv_expf(float x)
{
	if (!(x >= -87.3f))
		return 0.0f;
	if (x > 88.0f)
		x = 88.0f;
	float t = x * 1.44269504088896341f;
	int32_t ni = (int32_t)(t + (t >= 0.0f ? 0.5f : -0.5f));
	float n = (float)ni;
	float r = x - n * 0.693359375f;
	r = r + n * 2.12194440e-4f;
	float p = 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	union {
		float f;
		uint32_t u;
	} sc = {.u = (uint32_t)(ni + 127) << 23};
	return p * sc.f;
}

static void tile_scalar(const struct skv_tile_args *a)
{
	const uint32_t rbp = a->rbp, d = a->d, nk = a->nk;

	for (uint32_t j = 0; j < nk; j++) {
		const float *k = a->kt + (size_t)j * d;
		float *z = a->z + (size_t)j * rbp;
		for (uint32_t r = 0; r < rbp; r++) {
			float acc = 0.0f;
			for (uint32_t i = 0; i < d; i++)
				acc += a->qt[(size_t)i * rbp + r] * k[i];
			acc *= a->scale;
			if (!__builtin_isfinite(acc))
				a->bad[r] = 1;
			z[r] = acc;
		}
	}
	for (uint32_t r = 0; r < rbp; r++) {
		float tm = -INFINITY;
		for (uint32_t j = 0; j < nk; j++) {
			float *z = a->z + (size_t)j * rbp + r;
			if ((int64_t)a->j0 + j > a->trow[r])
				*z = -INFINITY;
			else if (*z > tm)
				tm = *z;
		}
		float mn = a->m[r] > tm ? a->m[r] : tm;
		float s = a->s[r] * skv_expf(a->m[r] - mn);
		for (uint32_t j = 0; j < nk; j++) {
			float *z = a->z + (size_t)j * rbp + r;
			float e = skv_expf(*z - mn);
			s += e;
			*z = e;
		}
		a->m[r] = mn;
		a->s[r] = s;
		a->tmax[r] = mn;
	}
}

static void factors_scalar(float *f, const float *m, const float *s, uint32_t ntiles, uint32_t rbp)
{
	for (uint32_t t = 0; t < ntiles; t++)
		for (uint32_t r = 0; r < rbp; r++)
			f[(size_t)t * rbp + r] = skv_expf(f[(size_t)t * rbp + r] - m[r]) / s[r];
}

static void votes_scalar(const struct skv_votes_args *a)
{
	for (uint32_t j = 0; j < a->ext; j++) {
		const float *e = a->e + (size_t)j * a->rbp;
		const float *f = a->f + (size_t)(j / SKV_TILE) * a->rbp;
		for (uint32_t i = 0; i < a->n_segs; i++) {
			const struct skv_seg *sg = &a->segs[i];
			float acc = 0.0f;
			for (uint32_t r = sg->begin; r < sg->end; r++)
				acc += e[r] * f[r];
			a->colsum[(size_t)sg->g * a->colsum_stride + j] += acc;
		}
	}
}

static void to_f32_scalar(const void *src, enum skv_dtype dt, float *dst, uint32_t n)
{
	const uint16_t *h = src;

	switch (dt) {
	case SKV_DTYPE_F32:
		memcpy(dst, src, (size_t)n * 4);
		break;
	case SKV_DTYPE_F16:
		for (uint32_t i = 0; i < n; i++)
			dst[i] = skv_f16_to_f32(h[i]);
		break;
	case SKV_DTYPE_BF16:
		for (uint32_t i = 0; i < n; i++)
			dst[i] = skv_bf16_to_f32(h[i]);
		break;
	default:
		break;
	}
}

static void copy_scalar(void *dst, const void *src, size_t bytes)
{
	memcpy(dst, src, bytes);
}

static void fence_scalar(void)
{
}

const struct skv_isa skv_isa_scalar = {
    .name = "scalar",
    .tile = tile_scalar,
    .factors = factors_scalar,
    .votes = votes_scalar,
    .to_f32 = to_f32_scalar,
    .copy = copy_scalar,
    .fence = fence_scalar,
};
