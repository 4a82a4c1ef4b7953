// SPDX-License-Identifier: MIT
/*
 * skv-dtype.c - element types: sizes, names, the scalar f16/bf16 conversions
 * (round to nearest even on the way down) and the fp8 decoders.
 */
#include <string.h>

#include "skv-driver.h"

size_t skv_dtype_size(enum skv_dtype dt)
{
	switch (dt) {
	case SKV_DTYPE_F32:
		return 4;
	case SKV_DTYPE_F16:
	case SKV_DTYPE_BF16:
		return 2;
	case SKV_DTYPE_F8E4M3FN:
	case SKV_DTYPE_F8E5M2:
		return 1;
	default:
		return 0;
	}
}

int skv_dtype_is_fp8(enum skv_dtype dt)
{
	return dt == SKV_DTYPE_F8E4M3FN || dt == SKV_DTYPE_F8E5M2;
}

const char *skv_dtype_name(enum skv_dtype dt)
{
	switch (dt) {
	case SKV_DTYPE_F32:
		return "f32";
	case SKV_DTYPE_F16:
		return "f16";
	case SKV_DTYPE_BF16:
		return "bf16";
	case SKV_DTYPE_F8E4M3FN:
		return "f8e4m3fn";
	case SKV_DTYPE_F8E5M2:
		return "f8e5m2";
	default:
		return NULL;
	}
}

/* ---------------------------------------------------------- conversions */

static inline uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

float skv_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;

	if (exp == 0x1f)
		return u2f(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		if (man == 0)
			return u2f(sign);
		/* subnormal: value = man * 2^-24, exact in f32 */
		float v = (float)man * (1.0f / 16777216.0f);
		return sign ? -v : v;
	}
	return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t skv_f32_to_f16(float f)
{
	uint32_t u = f2u(f);
	uint32_t sign = (u >> 16) & 0x8000;
	uint32_t a = u & 0x7fffffffu;

	if (a >= 0x7f800000u) /* inf or nan (keep nan quiet and non-zero) */
		return (uint16_t)(sign | 0x7c00 |
				  (a > 0x7f800000u ? 0x200 | ((a >> 13) & 0x3ff) : 0));
	if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
		return (uint16_t)(sign | 0x7c00);
	if (a < 0x38800000u) {	     /* below 2^-14: subnormal half or zero */
		if (a < 0x33000000u) /* below 2^-25: rounds to zero */
			return (uint16_t)sign;
		uint32_t e = a >> 23;
		uint32_t m = (a & 0x7fffff) | 0x800000;
		uint32_t shift = 126 - e; /* 14 .. 24 */
		uint32_t v = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (v & 1)))
			v++;
		return (uint16_t)(sign | v);
	}
	uint32_t v = ((a >> 13) - (112u << 10));
	uint32_t rem = a & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (v & 1)))
		v++;
	return (uint16_t)(sign | v);
}

float skv_bf16_to_f32(uint16_t b)
{
	return u2f((uint32_t)b << 16);
}

uint16_t skv_f32_to_bf16(float f)
{
	uint32_t u = f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

/* E4M3 (bias 7, 3 mantissa bits, no inf): S.1111.111 is NaN; exponent 0
 * is subnormal, man * 2^-9 */
float skv_f8e4m3fn_to_f32(uint8_t b)
{
	uint32_t sign = (uint32_t)(b & 0x80) << 24, exp = (b >> 3) & 0xf, man = b & 7;

	if (exp == 0xf && man == 7)
		return u2f(sign | 0x7fc00000u);
	if (exp == 0) {
		float v = (float)man * (1.0f / 512.0f);
		return sign ? -v : v;
	}
	return u2f(sign | ((exp + 120) << 23) | (man << 20));
}

/* E5M2 is the top byte of an IEEE half: the same exponent and bias */
float skv_f8e5m2_to_f32(uint8_t b)
{
	return skv_f16_to_f32((uint16_t)(b << 8));
}

void skv_fp8_to_f32(const void *src, enum skv_dtype dt, float scale, float *dst, uint32_t n)
{
	const uint8_t *b = src;

	/* decoded exactly, then one f32 rounding of the product (SPEC.md) */
	if (dt == SKV_DTYPE_F8E4M3FN)
		for (uint32_t i = 0; i < n; i++)
			dst[i] = skv_f8e4m3fn_to_f32(b[i]) * scale;
	else
		for (uint32_t i = 0; i < n; i++)
			dst[i] = skv_f8e5m2_to_f32(b[i]) * scale;
}
