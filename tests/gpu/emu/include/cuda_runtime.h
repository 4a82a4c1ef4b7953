/* SPDX-License-Identifier: MIT */
/*
 * cuda_runtime.h (emulator shim) - lets the CUDA kernels of kernels/cuda
 * compile as host C++ and run on a CPU: every block runs its threads as
 * cooperative coroutines (tests/gpu/emu/cuda-emu.cpp), __syncthreads() and
 * the warp intrinsics are real barriers among them, shared memory is shared
 * by them. For testing the kernels' logic where no GPU is; not a simulator of
 * timing or of the memory model beyond barriers.
 */
#ifndef SKV_CUDA_EMU_RUNTIME_H
#define SKV_CUDA_EMU_RUNTIME_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <vector>

#undef __host__
#undef __device__
#undef __global__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#undef __grid_constant__
#define __host__
#define __device__
#define __global__
#define __shared__	static
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__

#include <vector_functions.h>

namespace emu
{
const dim3 &thread_idx();
const dim3 &block_index();
unsigned char *dyn_smem();
void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
/* every block of the grid resident at once (they may wait for each other) */
void launch_resident(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
/* blocks per SM the occupancy calculator reports ($SKV_EMU_BLOCKS_PER_SM, default 4) */
int blocks_per_sm();
void syncthreads();
/* the calling thread polls again later: other threads and blocks run meanwhile */
void spin_yield();
/*
 * %globaltimer: the monotonic clock plus the time spinners have "slept"
 * (1 ms for each scheduler pass in which only they ran).
 */
uint64_t globaltimer_ns();
/* every lane of the calling warp publishes v and receives all 32 values */
void warp_exchange(uint64_t v, uint64_t *all);
} /* namespace emu */

#define threadIdx	(emu::thread_idx())
#define blockIdx	(emu::block_index())
#define __syncthreads() emu::syncthreads()

template <typename T> static inline uint64_t emu_bits(T v)
{
	uint64_t b = 0;
	memcpy(&b, &v, sizeof(T));
	return b;
}
template <typename T> static inline T emu_from_bits(uint64_t b)
{
	T v;
	memcpy(&v, &b, sizeof(T));
	return v;
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int off)
{
	uint64_t all[32];
	emu::warp_exchange(emu_bits(v), all);
	return emu_from_bits<T>(all[(threadIdx.x & 31) ^ (unsigned)off]);
}
template <typename T> static inline T __shfl_up_sync(unsigned, T v, int d)
{
	uint64_t all[32];
	unsigned lane = threadIdx.x & 31;
	emu::warp_exchange(emu_bits(v), all);
	return lane >= (unsigned)d ? emu_from_bits<T>(all[lane - d]) : v;
}
static inline unsigned __match_any_sync(unsigned, unsigned v)
{
	uint64_t all[32];
	unsigned m = 0;
	emu::warp_exchange(v, all);
	for (int i = 0; i < 32; i++)
		if (all[i] == v)
			m |= 1u << i;
	return m;
}
static inline int __ffs(unsigned x)
{
	return __builtin_ffs((int)x);
}
static inline int __popc(unsigned x)
{
	return __builtin_popcount(x);
}
static inline unsigned __float_as_uint(float f)
{
	return emu_from_bits<unsigned>(emu_bits(f));
}
static inline uint32_t min(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}
static inline uint32_t max(uint32_t a, uint32_t b)
{
	return a > b ? a : b;
}
/* coroutines never preempt each other: plain read-modify-write is atomic */
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
	unsigned o = *p;
	*p = o + v;
	return o;
}
static inline float atomicAdd(float *p, float v)
{
	float o = *p;
	*p = o + v;
	return o;
}
static inline int atomicCAS(int *p, int cmp, int v)
{
	int o = *p;
	if (o == cmp)
		*p = v;
	return o;
}
static inline unsigned atomicExch(unsigned *p, unsigned v)
{
	unsigned o = *p;
	*p = v;
	return o;
}
/* threads switch only at barriers, warp intrinsics and __nanosleep: a fence orders nothing more */
static inline void __threadfence(void)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void __nanosleep(unsigned)
{
	emu::spin_yield();
}
template <typename T> static inline T __ldcg(const T *p)
{
	return *p; /* other blocks ran only inside an opaque call (swapcontext) */
}

/* The opt-in shared memory limit of sm_90 (227 KiB): larger requests fail as on an H100/H200. */
#define SKV_EMU_MAX_DYN_SMEM (227 * 1024)
template <typename T>
static inline cudaError_t cudaFuncSetAttribute(T *, cudaFuncAttribute a, int v)
{
	if (a == cudaFuncAttributeMaxDynamicSharedMemorySize && v > SKV_EMU_MAX_DYN_SMEM)
		return cudaErrorInvalidValue;
	return cudaSuccess;
}
template <typename T>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, T *, int,
									size_t smem)
{
	*n = smem > SKV_EMU_MAX_DYN_SMEM ? 0 : emu::blocks_per_sm();
	return cudaSuccess;
}

/*
 * Several devices: a launch runs on the calling thread's current device
 * (cudaSetDevice), on a stream of that device, and may reach only memory that
 * device can (its own, another's with peer access, host memory): the bytes of
 * its arguments are scanned for addresses of device memory, and a launch that
 * names memory its device cannot reach is refused as a GPU would fault
 * (cuda-emu.cpp, "Devices").
 */
namespace emu
{
struct arg_span {
	const void *p;
	size_t n;
};
template <typename... A> static inline std::vector<arg_span> arg_spans(const A &...a)
{
	return std::vector<arg_span>{arg_span{(const void *)&a, sizeof(a)}...};
}
/* false: refused (the error is left for cudaGetLastError) */
bool launch_device_ok(const void *stream, const std::vector<arg_span> &args);
} /* namespace emu */

#define SKV_LAUNCH(kern, grid, block, smem, stream, ...)                                           \
	(emu::launch_device_ok((const void *)(stream), emu::arg_spans(__VA_ARGS__))                \
	     ? emu::launch(dim3(grid), dim3(block), (smem), [&]() { kern(__VA_ARGS__); })          \
	     : (void)0)
#define SKV_LAUNCH_PERSISTENT(kern, grid, block, smem, stream, ...)                                \
	(emu::launch_device_ok((const void *)(stream), emu::arg_spans(__VA_ARGS__))                \
	     ? emu::launch_resident(dim3(grid), dim3(block), (smem), [&]() { kern(__VA_ARGS__); }) \
	     : (void)0)
#define SKV_DYNAMIC_SMEM(name) unsigned char *name = emu::dyn_smem()

#endif /* SKV_CUDA_EMU_RUNTIME_H */
