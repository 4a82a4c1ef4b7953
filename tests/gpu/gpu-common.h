/* SPDX-License-Identifier: MIT */
/*
 * gpu-common.h - helpers shared by the GPU test programs (header-only):
 * deterministic random tensors, dtype stores, CUDA error checks.
 */
#ifndef GPU_COMMON_H
#define GPU_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "skv.h"

#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,              \
				cudaGetErrorString(e_));                                           \
			return -1;                                                                 \
		}                                                                                  \
	} while (0)

struct rng {
	uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
	/* splitmix64: every seed gives a full-period, well-mixed stream */
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline float rng_unit(struct rng *r)
{
	return (float)((rng_next(r) >> 40) + 0.5) / (float)(1ull << 24);
}

static inline float rng_normal(struct rng *r)
{
	float u = rng_unit(r), v = rng_unit(r);
	return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Store x into element i of a dtype array. */
static inline void store_dt(void *base, enum skv_dtype dt, size_t i, float x)
{
	if (dt == SKV_DTYPE_F32)
		((float *)base)[i] = x;
	else if (dt == SKV_DTYPE_F16)
		((uint16_t *)base)[i] = skv_f32_to_f16(x);
	else
		((uint16_t *)base)[i] = skv_f32_to_bf16(x);
}

static inline float load_dt(const void *base, enum skv_dtype dt, size_t i)
{
	if (dt == SKV_DTYPE_F32)
		return ((const float *)base)[i];
	if (dt == SKV_DTYPE_F16)
		return skv_f16_to_f32(((const uint16_t *)base)[i]);
	return skv_bf16_to_f32(((const uint16_t *)base)[i]);
}

/* n random normal values * scale in dtype dt (malloc'ed). */
static inline void *rand_tensor(struct rng *r, enum skv_dtype dt, size_t n, float scale)
{
	void *p = malloc(n * skv_dtype_size(dt) + 1);
	if (!p)
		return NULL;
	for (size_t i = 0; i < n; i++)
		store_dt(p, dt, i, scale * rng_normal(r));
	return p;
}

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif /* GPU_COMMON_H */
