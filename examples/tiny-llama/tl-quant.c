// SPDX-License-Identifier: MIT
#include "tl-quant.h"

#include <errno.h>
#include <string.h>

#include "tl-gguf.h"

float tl_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
	float f;

	if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13);
	} else if (exp) {
		bits = sign | ((exp + 112) << 23) | (man << 13);
	} else if (man) {
		/* subnormal: man * 2^-24, exact in a float */
		f = (float)man * 0x1p-24f;
		return sign ? -f : f;
	} else {
		bits = sign;
	}
	memcpy(&f, &bits, 4);
	return f;
}

static float rd_f16(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return tl_f16_to_f32(h);
}

int tl_dequant(uint32_t type, const void *src, uint64_t n, float *dst)
{
	const uint8_t *p = src;
	const uint32_t be = tl_ggml_block_elems(type), bb = tl_ggml_block_bytes(type);

	if (!be || n % be)
		return -EINVAL;
	for (uint64_t b = 0; b < n / be; b++, p += bb, dst += be) {
		switch (type) {
		case TL_GGML_F32:
			memcpy(dst, p, 4);
			break;
		case TL_GGML_F16:
			dst[0] = rd_f16(p);
			break;
		case TL_GGML_Q4_0: {
			/* low nibbles are elements 0..15, high ones 16..31 */
			const float d = rd_f16(p);
			for (int j = 0; j < 16; j++) {
				dst[j] = (float)((p[2 + j] & 0xf) - 8) * d;
				dst[j + 16] = (float)((p[2 + j] >> 4) - 8) * d;
			}
			break;
		}
		case TL_GGML_Q4_1: {
			const float d = rd_f16(p), m = rd_f16(p + 2);
			for (int j = 0; j < 16; j++) {
				dst[j] = (float)(p[4 + j] & 0xf) * d + m;
				dst[j + 16] = (float)(p[4 + j] >> 4) * d + m;
			}
			break;
		}
		case TL_GGML_Q8_0: {
			const float d = rd_f16(p);
			for (int j = 0; j < 32; j++)
				dst[j] = (float)(int8_t)p[2 + j] * d;
			break;
		}
		}
	}
	return 0;
}
