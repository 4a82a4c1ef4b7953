/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-select.cuh - device helpers of the selection kernels (select.cu,
 * budget.cu): forced positions, (group) votes, pooling, block-wide scans and
 * sums. Not installed.
 */
#ifndef SKV_CUDA_SELECT_CUH
#define SKV_CUDA_SELECT_CUH

#include "skv-cuda-common.cuh"

namespace skvcuda
{

constexpr int SEL_THREADS = 1024;

__device__ __forceinline__ bool is_forced(const sel_consts &c, uint32_t j)
{
	if (j < c.sinks || j >= c.L - c.tail)
		return true;
	for (uint32_t i = 0; i < c.n_protected; i++)
		if (j >= c.prot_begin[i] && j < c.prot_end[i])
			return true;
	return false;
}

/* Vote of a stored head at position x: group mode averages its G query heads. */
__device__ __forceinline__ float vote_at(const sel_consts &c, const float *v, uint32_t x)
{
	if (!c.group)
		return v[x];
	float s = 0.f;
	for (uint32_t g = 0; g < c.G; g++)
		s += v[(size_t)g * c.L + x];
	return s / (float)c.G;
}

/* Pooled vote over the prefix [0, P): avg counts padding as 0 (divisor k), max skips it. */
__device__ __forceinline__ float pooled_at(const sel_consts &c, const float *v, uint32_t P,
					   uint32_t j)
{
	if (c.kernel <= 1)
		return vote_at(c, v, j);
	const int half = (int)c.kernel / 2;
	if (c.pooling == SKV_POOL_MAX) {
		float m = -INFINITY;
		for (int o = -half; o <= half; o++) {
			int x = (int)j + o;
			if (x >= 0 && x < (int)P)
				m = fmaxf(m, vote_at(c, v, (uint32_t)x));
		}
		return m;
	}
	float s = 0.f;
	for (int o = -half; o <= half; o++) {
		int x = (int)j + o;
		if (x >= 0 && x < (int)P)
			s += vote_at(c, v, (uint32_t)x);
	}
	return s / (float)c.kernel;
}

/* Exclusive prefix sum over the block; *ret_total gets the block's sum. */
__device__ __forceinline__ uint32_t block_excl_scan(uint32_t x, uint32_t *ws, uint32_t *ret_total)
{
	const uint32_t lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	constexpr uint32_t NW = SEL_THREADS / 32;
	uint32_t incl = x;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
		if (lane >= (uint32_t)o)
			incl += y;
	}
	if (lane == 31)
		ws[wid] = incl;
	__syncthreads();
	if (wid == 0) {
		uint32_t w = lane < NW ? ws[lane] : 0;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			uint32_t y = __shfl_up_sync(0xffffffffu, w, o);
			if (lane >= (uint32_t)o)
				w += y;
		}
		ws[lane] = w;
	}
	__syncthreads();
	uint32_t before = wid ? ws[wid - 1] : 0;
	*ret_total = ws[NW - 1];
	__syncthreads();
	return before + incl - x;
}

template <typename V> __device__ __forceinline__ V block_sum(V x, V *ws)
{
	const uint32_t lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		x += __shfl_xor_sync(0xffffffffu, x, o);
	if (lane == 0)
		ws[wid] = x;
	__syncthreads();
	V t = V(0);
	for (uint32_t w = 0; w < SEL_THREADS / 32; w++)
		t += ws[w];
	__syncthreads();
	return t;
}

} /* namespace skvcuda */

#endif /* SKV_CUDA_SELECT_CUH */
