/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-ctx.cuh - a compaction context of libskv-cuda (struct
 * skv_cuda_ctx): one stream with its completion event and device status
 * word, the scoring path read from the environment, the pinned copy of a
 * budget result, and the device memory the context keeps for uploads and
 * staged copies. skv-cuda-ctx.cu holds its life cycle, stream waits,
 * sync/query and upload; skv-cuda-copy.cu its device copies;
 * skv-cuda-compact.cu enqueues compactions on it. Not installed.
 */
#ifndef SKV_CUDA_CTX_CUH
#define SKV_CUDA_CTX_CUH

#include <stdint.h>

#include "skv-cuda-common.cuh"
#include "skv-cuda-internal.h"

/*
 * Scoring path, from $SKV_CUDA_SCORE when the context is created:
 *   twopass (or unset): two kernels over K (the path that has run on GPUs);
 *   fused, auto: the fused kernel wherever it applies, else two-pass (auto is
 *     meant to choose per shape, and to become the default, once a GPU run
 *     has measured both: bench/README-gpu.md);
 *   fused-only: the fused kernel or -ENOTSUP (tests: proves which ran).
 * Tests only: $SKV_CUDA_FUSED_GRID overrides the fused grid's block count,
 * $SKV_CUDA_FUSED_WAIT_MS the bound on a block's wait (default 10 s).
 */
enum score_path { SCORE_TWOPASS, SCORE_FUSED, SCORE_AUTO, SCORE_FUSED_ONLY };

struct skv_cuda_ctx {
	struct skv_cuda_dev *dev;
	cudaStream_t stream;
	cudaEvent_t done;
	skvcuda::dev_status *d_status; /* device: written by the kernels    */
	skvcuda::dev_status *h_status; /* pinned: copied back at the end    */
	int pending;		       /* a compaction awaits sync/query    */
	enum score_path score;
	int fused_grid;		/* 0: the device's resident capacity */
	uint64_t wait_limit_ns; /* fused: bound on a block's wait    */
	/* resident capacity of the fused kernel for (dtype, head_dim), asked once */
	int cap_dt;
	uint32_t cap_d;
	int cap;
	void *up; /* skv_cuda_ctx_upload()'s device copy */
	uint64_t up_cap;
	void *mv; /* skv_cuda_ctx_copy()'s staging of overlapping copies */
	uint64_t mv_cap;
	/* budget modes: the caller's result, filled at sync from the pinned copy */
	struct skv_budget_result *res;
	uint32_t res_heads; /* entries of res->kept                  */
	void *h_res;	    /* pinned: budget_res, then kept[heads]  */
	uint64_t h_res_cap;
};

namespace skvcuda
{

/* A CUDA runtime error into err: -ENOMEM for an allocation, else -EIO, naming what failed. */
int rt_fail(struct skv_error *err, cudaError_t e, const char *what);
/* Room in the context's pinned result copy for `heads` kept counts: 0, -ENOMEM or -EIO. */
int ctx_reserve_result(struct skv_cuda_ctx *c, uint32_t heads, struct skv_error *err);

} /* namespace skvcuda */

#endif /* SKV_CUDA_CTX_CUH */
