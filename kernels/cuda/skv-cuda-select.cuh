/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-select.cuh - device helpers of the selection kernels (select.cu,
 * budget.cu): forced positions, (group) votes, pooling, block-wide scans and
 * sums, and the radix cut of a top-k selection. Not installed.
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

/*
 * Selection keys, one per position: 0 is not a candidate, MARK a candidate
 * already picked (budget.cu), any other key the ordered_key() of a
 * candidate's score (>= 0, so >= 2^31).
 */
constexpr uint32_t MARK = 1;

/* The cut of a top-`fill` selection: keys above thr, then the first `need`
 * keys equal to thr in index order (ties to the smaller index). */
struct cut {
	uint32_t thr;
	uint32_t need;
};

/* Whether a key ties at the cut (taken or not: decided by its rank among ties). */
__device__ __forceinline__ bool at_cut(uint32_t key, const cut &ct)
{
	return key > MARK && key == ct.thr && ct.need > 0;
}

/* Whether the candidate key is taken; tie_rank: ties at the cut before it. */
__device__ __forceinline__ bool taken(uint32_t key, const cut &ct, uint32_t tie_rank)
{
	return key > MARK && (key > ct.thr || (key == ct.thr && tie_rank < ct.need));
}

/*
 * The cut of the `fill` best of the n_cand candidates of keys[0..n): an
 * exact MSD radix select, 4 passes of 8 bits, each a block histogram of the
 * keys that match the prefix so far (one shared atomic per distinct bin of a
 * warp) and a scan of it from the top by one warp. Every thread of the block
 * calls it and gets the same cut. select.cu and budget.cu both cut with it.
 */
__device__ __forceinline__ cut radix_cut(const uint32_t *keys, uint32_t n, uint32_t fill,
					 uint32_t n_cand)
{
	__shared__ uint32_t hist[256];
	__shared__ uint32_t sh_prefix, sh_need;
	const uint32_t tid = threadIdx.x;

	if (fill >= n_cand)
		return cut{MARK, 0};
	if (fill == 0)
		return cut{0xffffffffu, 0};
	uint32_t prefix = 0, mask = 0, need = fill;
	for (int shift = 24; shift >= 0; shift -= 8) {
		for (uint32_t i = tid; i < 256; i += SEL_THREADS)
			hist[i] = 0;
		__syncthreads();
		for (uint32_t base = 0; base < n; base += SEL_THREADS) {
			const uint32_t j = base + tid;
			const uint32_t key = j < n ? keys[j] : 0;
			const bool in = key > MARK && (key & mask) == prefix;
			/* scores crowd into few bins in the first passes */
			const uint32_t bin = in ? (key >> shift) & 255 : 256;
			const uint32_t peers = __match_any_sync(0xffffffffu, bin);
			if (in && (tid & 31) == (uint32_t)(__ffs(peers) - 1))
				atomicAdd(&hist[bin], (uint32_t)__popc(peers));
		}
		__syncthreads();
		if (tid < 32) {
			/* lane l holds bins 255 - 8l .. 248 - 8l, scanned from the top */
			uint32_t sum = 0;
			for (int b = 0; b < 8; b++)
				sum += hist[255 - 8 * tid - b];
			uint32_t incl = sum;
			for (int o = 1; o < 32; o <<= 1) {
				uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
				if (tid >= (uint32_t)o)
					incl += y;
			}
			uint32_t acc = incl - sum;
			if (acc < need && incl >= need) {
				for (int b = 0; b < 8; b++) {
					uint32_t bin = 255 - 8 * tid - b;
					if (acc + hist[bin] >= need) {
						sh_prefix = prefix | (bin << shift);
						sh_need = need - acc;
						break;
					}
					acc += hist[bin];
				}
			}
		}
		__syncthreads();
		/* read before the next pass's writer passes two more barriers */
		prefix = sh_prefix;
		need = sh_need;
		mask |= 255u << shift;
	}
	return cut{prefix, need};
}

} /* namespace skvcuda */

#endif /* SKV_CUDA_SELECT_CUH */
