/* SPDX-License-Identifier: MIT */
/*
 * mma.h (emulator shim): WMMA 16x16x16 fragments. Lane 0 of the warp holds
 * the whole tile and does the work; products and sums in fp32, as the
 * tensor cores do for f16/bf16 inputs (accumulation order aside).
 */
#ifndef SKV_CUDA_EMU_MMA_H
#define SKV_CUDA_EMU_MMA_H

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_runtime.h"

namespace nvcuda
{
namespace wmma
{
struct matrix_a {
};
struct matrix_b {
};
struct accumulator {
};
struct row_major {
};
struct col_major {
};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
	float x[16 * 16]; /* x[r * 16 + c]: row r, column c of the logical tile */
};

static inline float emu_f(float v)
{
	return v;
}
static inline float emu_f(__half v)
{
	return __half2float(v);
}
static inline float emu_f(__nv_bfloat16 v)
{
	return __bfloat162float(v);
}
static inline bool emu_lane0()
{
	return (threadIdx.x & 31) == 0;
}

template <typename Use, typename T, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const T *p,
				    unsigned ldm)
{
	if (!emu_lane0())
		return;
	for (int r = 0; r < 16; r++)
		for (int c = 0; c < 16; c++)
			f.x[r * 16 + c] =
			    emu_f(std::is_same<Layout, row_major>::value ? p[r * ldm + c]
									 : p[c * ldm + r]);
}

template <typename T>
static inline void fill_fragment(fragment<accumulator, 16, 16, 16, T> &f, float v)
{
	for (int i = 0; i < 256; i++)
		f.x[i] = v;
}

template <typename TA, typename LA, typename TB, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
			    const fragment<matrix_a, 16, 16, 16, TA, LA> &a,
			    const fragment<matrix_b, 16, 16, 16, TB, LB> &b,
			    const fragment<accumulator, 16, 16, 16, float> &c)
{
	if (!emu_lane0())
		return;
	float t[256];
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 16; j++) {
			float s = c.x[i * 16 + j];
			for (int k = 0; k < 16; k++)
				s += a.x[i * 16 + k] * b.x[k * 16 + j];
			t[i * 16 + j] = s;
		}
	memcpy(d.x, t, sizeof(t));
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
				     unsigned ldm, layout_t l)
{
	if (!emu_lane0())
		return;
	for (int r = 0; r < 16; r++)
		for (int c = 0; c < 16; c++) {
			if (l == mem_row_major)
				p[r * ldm + c] = f.x[r * 16 + c];
			else
				p[c * ldm + r] = f.x[r * 16 + c];
		}
}
} /* namespace wmma */
} /* namespace nvcuda */

#endif
