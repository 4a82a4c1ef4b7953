/* SPDX-License-Identifier: MIT */
/* cuda_pipeline.h (emulator shim): async copies complete at once. */
#ifndef SKV_CUDA_EMU_PIPELINE_H
#define SKV_CUDA_EMU_PIPELINE_H
#include <string.h>

static inline void __pipeline_memcpy_async(void *dst, const void *src, size_t n, size_t = 0)
{
	memcpy(dst, src, n);
}
static inline void __pipeline_commit(void)
{
}
static inline void __pipeline_wait_prior(size_t)
{
}
#endif
