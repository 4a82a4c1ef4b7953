/* SPDX-License-Identifier: MIT */
/*
 * tl-quant.h - ggml tensor data (F32, F16, Q4_0, Q4_1, Q8_0) to F32, as
 * ggml's reference dequantizers define each block: the engine computes in
 * F32 on the dequantized weights, which is also what transformers does with
 * a GGUF it loads, so both run the same numbers.
 */
#ifndef TL_QUANT_H
#define TL_QUANT_H

#include <stdint.h>

/* IEEE half to float, subnormals, infinities and NaN included. */
float tl_f16_to_f32(uint16_t h);

/*
 * Dequantize n elements of a ggml type (n a multiple of its block size,
 * tl_ggml_block_elems()) from src to dst. -EINVAL for another type or n.
 */
int tl_dequant(uint32_t type, const void *src, uint64_t n, float *dst);

#endif /* TL_QUANT_H */
