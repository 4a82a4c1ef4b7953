/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-copy.cu - skv_cuda_ctx_copy(): 2-D device copies on a context's
 * stream, run in order, each as if through a buffer: a copy whose source and
 * destination overlap (cudaMemcpy* between overlapping ranges is undefined)
 * goes through staging memory the context keeps. The daemon settles budget
 * caches and GROWs GPU-arena caches with it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "skv-cuda-ctx.cuh"

using namespace skvcuda;

/* The bytes a 2-D copy spans on one side (width and height not 0). */
static uint64_t copy_span(uint64_t width, uint64_t height, uint64_t pitch)
{
	return (height - 1) * pitch + width;
}

/* Whether copy x (not empty, not onto itself) reads bytes it also writes:
 * cudaMemcpy* between overlapping ranges is undefined, so such a copy is
 * staged. */
static bool copy_overlaps(const skv_cuda_copy &x)
{
	const uintptr_t d = (uintptr_t)x.dst, s = (uintptr_t)x.src;

	return d < s + copy_span(x.width, x.height, x.spitch) &&
	       s < d + copy_span(x.width, x.height, x.dpitch);
}

/* A copy with no bytes, or of a range onto itself: nothing to do. */
static bool copy_noop(const skv_cuda_copy &x)
{
	return !x.width || !x.height || (x.dst == x.src && x.dpitch == x.spitch);
}

/* One 2-D copy on the stream: the 2-D copy takes pitches below 2^31
 * (cudaDevAttrMaxPitch), wider ones go row by row. */
static cudaError_t copy_2d(void *dst, uint64_t dpitch, const void *src, uint64_t spitch,
			   uint64_t width, uint64_t height, cudaStream_t stream)
{
	const uint64_t max_pitch = INT32_MAX;
	cudaError_t e = cudaSuccess;

	if (height == 1)
		return cudaMemcpyAsync(dst, src, width, cudaMemcpyDefault, stream);
	if (dpitch <= max_pitch && spitch <= max_pitch)
		return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault,
					 stream);
	for (uint64_t y = 0; y < height && e == cudaSuccess; y++)
		e = cudaMemcpyAsync((char *)dst + y * dpitch, (const char *)src + y * spitch, width,
				    cudaMemcpyDefault, stream);
	return e;
}

/* Room for the largest overlapping copy (packed), before anything is
 * queued; nothing queued still reads the old staging (the previous
 * operation was synced). */
static int stage_room(struct skv_cuda_ctx *c, const struct skv_cuda_copy *cp, uint32_t n,
		      struct skv_error *err)
{
	uint64_t most = 0;

	for (uint32_t i = 0; i < n; i++)
		if (!copy_noop(cp[i]) && copy_overlaps(cp[i]))
			most =
			    cp[i].width * cp[i].height > most ? cp[i].width * cp[i].height : most;
	if (most <= c->mv_cap)
		return 0;
	uint64_t cap = (most + 65535) & ~(uint64_t)65535;
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, cap);
	if (e != cudaSuccess)
		return rt_fail(err, e, "device memory to stage an overlapping copy");
	if (c->mv)
		cudaFree(c->mv);
	c->mv = p;
	c->mv_cap = cap;
	return 0;
}

extern "C" int skv_cuda_ctx_copy(struct skv_cuda_ctx *c, const struct skv_cuda_copy *cp, uint32_t n,
				 struct skv_error *err)
{
	if (!c || (n && !cp))
		return skv_cuda_fail(err, -EINVAL, -1, -1, "context and copies are required");
	if (c->pending)
		return skv_cuda_fail(err, -EBUSY, -1, -1,
				     "the previous operation of this context was not synced");
	for (uint32_t i = 0; i < n; i++) {
		if (!cp[i].width || !cp[i].height)
			continue;
		if (!cp[i].dst || !cp[i].src)
			return skv_cuda_fail(err, -EINVAL, -1, -1, "copy %u: no address", i);
		if (cp[i].height > 1 && (cp[i].dpitch < cp[i].width || cp[i].spitch < cp[i].width))
			return skv_cuda_fail(
			    err, -EINVAL, -1, -1, "copy %u: pitch %llu/%llu below the width %llu",
			    i, (unsigned long long)cp[i].dpitch, (unsigned long long)cp[i].spitch,
			    (unsigned long long)cp[i].width);
	}
	int r = skv_cuda_dev_enter(c->dev, err);
	if (r == 0)
		r = stage_room(c, cp, n, err);
	if (r < 0)
		return r;
	/* no kernel reports here: sync/query read a clean status word */
	memset(c->h_status, 0, sizeof(dev_status));
	cudaError_t e = cudaSuccess;
	for (uint32_t i = 0; i < n && e == cudaSuccess; i++) {
		const skv_cuda_copy &x = cp[i];
		if (copy_noop(x))
			continue;
		if (!copy_overlaps(x)) {
			e = copy_2d(x.dst, x.dpitch, x.src, x.spitch, x.width, x.height, c->stream);
			continue;
		}
		/* through the staging, packed; the stream orders both halves */
		e = copy_2d(c->mv, x.width, x.src, x.spitch, x.width, x.height, c->stream);
		if (e == cudaSuccess)
			e = copy_2d(x.dst, x.dpitch, c->mv, x.width, x.width, x.height, c->stream);
	}
	cudaEventRecord(c->done, c->stream);
	if (e != cudaSuccess) {
		/* drain what was queued so the context is reusable */
		cudaEventSynchronize(c->done);
		return rt_fail(err, e, "device copy");
	}
	c->pending = 1;
	return 0;
}
