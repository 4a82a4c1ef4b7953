/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-ctx.cu - a compaction context's life cycle (one stream, its
 * event, status word and pinned result), the waits enqueued on its stream
 * (an IPC event, a flag value), the flag's signal and read from the host,
 * sync/query (the status word and a budget result into the caller's
 * struct), and uploads into device memory the context keeps. Nothing here
 * launches a kernel.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "skv-cuda-ctx.cuh"

using namespace skvcuda;

static int parse_score_path(struct skv_cuda_ctx *c, struct skv_error *err)
{
	const char *v = getenv("SKV_CUDA_SCORE");
	if (!v || !*v || !strcmp(v, "twopass"))
		c->score = SCORE_TWOPASS;
	else if (!strcmp(v, "fused"))
		c->score = SCORE_FUSED;
	else if (!strcmp(v, "auto"))
		c->score = SCORE_AUTO;
	else if (!strcmp(v, "fused-only"))
		c->score = SCORE_FUSED_ONLY;
	else
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "SKV_CUDA_SCORE=%.32s: expected twopass, fused or auto", v);
	c->cap_dt = -1;
	const char *g = getenv("SKV_CUDA_FUSED_GRID");
	c->fused_grid = g ? atoi(g) : 0;
	if (c->fused_grid < 0 || c->fused_grid > 1 << 20)
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "SKV_CUDA_FUSED_GRID=%.32s: 0 .. 1048576", g);
	const char *w = getenv("SKV_CUDA_FUSED_WAIT_MS");
	long long ms = w ? atoll(w) : 0;
	if (ms < 0 || ms > 86400000)
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "SKV_CUDA_FUSED_WAIT_MS=%.32s: 0 .. 86400000", w);
	c->wait_limit_ns = ms ? (uint64_t)ms * 1000000u : FUSED_WAIT_LIMIT_NS;
	return 0;
}

int skvcuda::rt_fail(struct skv_error *err, cudaError_t e, const char *what)
{
	int r = e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
	return skv_cuda_fail(err, r, -1, -1, "%s: %s (%s)", what, cudaGetErrorString(e),
			     cudaGetErrorName(e));
}

extern "C" int skv_cuda_ctx_new(struct skv_cuda_dev *dev, struct skv_cuda_ctx **ret_ctx,
				struct skv_error *err)
{
	if (!dev || !ret_ctx)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "device and ret_ctx are required");
	int r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		return r;
	skv_cuda_ctx *c = (skv_cuda_ctx *)calloc(1, sizeof(*c));
	if (!c)
		return skv_cuda_fail(err, -ENOMEM, -1, -1, "out of memory");
	c->dev = dev;
	r = parse_score_path(c, err);
	if (r < 0) {
		free(c);
		return r;
	}
	cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming);
	if (e == cudaSuccess)
		e = cudaMalloc((void **)&c->d_status, sizeof(dev_status));
	if (e == cudaSuccess)
		e = cudaMallocHost((void **)&c->h_status, sizeof(dev_status));
	if (e == cudaSuccess) {
		/* keep freed scratch in the pool: the next compaction reuses it */
		cudaMemPool_t pool;
		uint64_t thr = UINT64_MAX;
		e = cudaDeviceGetDefaultMemPool(&pool, dev->device);
		if (e == cudaSuccess)
			e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr);
	}
	if (e != cudaSuccess) {
		r = rt_fail(err, e, "creating a CUDA context");
		skv_cuda_ctx_free(c);
		return r;
	}
	memset(c->h_status, 0, sizeof(dev_status));
	*ret_ctx = c;
	return 0;
}

extern "C" void skv_cuda_ctx_free(struct skv_cuda_ctx *c)
{
	if (!c)
		return;
	cudaSetDevice(c->dev->device);
	if (c->stream)
		cudaStreamSynchronize(c->stream);
	if (c->d_status)
		cudaFree(c->d_status);
	if (c->up)
		cudaFree(c->up);
	if (c->mv)
		cudaFree(c->mv);
	if (c->h_status)
		cudaFreeHost(c->h_status);
	if (c->h_res)
		cudaFreeHost(c->h_res);
	if (c->done)
		cudaEventDestroy(c->done);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	free(c);
}

extern "C" void *skv_cuda_ctx_stream(struct skv_cuda_ctx *c)
{
	return c ? (void *)c->stream : NULL;
}

extern "C" int skv_cuda_ctx_wait_ipc_event(struct skv_cuda_ctx *c, const void *handle64,
					   struct skv_error *err)
{
	if (!c || !handle64)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "context and event handle are required");
	int r = skv_cuda_dev_enter(c->dev, err);
	if (r < 0)
		return r;
	cudaIpcEventHandle_t h;
	cudaEvent_t ev;
	memcpy(&h, handle64, sizeof(h));
	cudaError_t e = cudaIpcOpenEventHandle(&ev, h);
	if (e != cudaSuccess)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "cudaIpcOpenEventHandle: %s",
				     cudaGetErrorString(e));
	e = cudaStreamWaitEvent(c->stream, ev, 0);
	/* destroying an event with a pending wait is allowed: the wait stands */
	cudaEventDestroy(ev);
	if (e != cudaSuccess)
		return rt_fail(err, e, "cudaStreamWaitEvent");
	return 0;
}

extern "C" int skv_cuda_ctx_wait_value(struct skv_cuda_ctx *c, const void *flag, uint32_t value,
				       struct skv_error *err)
{
	if (!c || !flag || ((uintptr_t)flag & 3))
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "context and a 4-byte aligned flag address are required");
	int r = skv_cuda_dev_enter(c->dev, err);
	if (r < 0)
		return r;
	CUresult cr = c->dev->drv.StreamWaitValue32(
	    (CUstream)c->stream, (CUdeviceptr)(uintptr_t)flag, value, CU_STREAM_WAIT_VALUE_GEQ);
	if (cr != CUDA_SUCCESS)
		return skv_cuda_fail(err, -EIO, -1, -1, "cuStreamWaitValue32: CUresult %d",
				     (int)cr);
	return 0;
}

extern "C" int skv_cuda_signal_value(struct skv_cuda_dev *dev, void *flag, uint32_t value,
				     struct skv_error *err)
{
	if (!dev || !flag || ((uintptr_t)flag & 3))
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "device and a 4-byte aligned flag address are required");
	int r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		return r;
	/* the legacy default stream does not wait for our non-blocking streams,
	 * so this lands while a context's stream still waits on the word */
	cudaError_t e = cudaMemcpy(flag, &value, sizeof(value), cudaMemcpyHostToDevice);
	if (e != cudaSuccess)
		return rt_fail(err, e, "cudaMemcpy (signal)");
	return 0;
}

extern "C" int skv_cuda_read_value(struct skv_cuda_dev *dev, const void *flag, uint32_t *ret_value,
				   struct skv_error *err)
{
	if (!dev || !flag || !ret_value || ((uintptr_t)flag & 3))
		return skv_cuda_fail(
		    err, -EINVAL, -1, -1,
		    "device, ret_value and a 4-byte aligned flag address are required");
	int r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		return r;
	uint32_t v = 0;
	/* the legacy default stream, as skv_cuda_signal_value */
	cudaError_t e = cudaMemcpy(&v, flag, sizeof(v), cudaMemcpyDeviceToHost);
	if (e != cudaSuccess)
		return rt_fail(err, e, "cudaMemcpy (read flag)");
	*ret_value = v;
	return 0;
}

/* A budget-mode compaction's result into the caller's struct (after the stream). */
static void fill_result(skv_cuda_ctx *c)
{
	struct skv_budget_result *res = c->res;
	const budget_res *hr = (const budget_res *)c->h_res;

	c->res = NULL;
	if (!res)
		return;
	res->c_star = hr->c_star;
	res->fallback = hr->fallback;
	res->min_mass = hr->min_mass;
	if (res->kept)
		memcpy(res->kept, hr + 1, (size_t)c->res_heads * sizeof(uint32_t));
}

static int status_result(skv_cuda_ctx *c, struct skv_error *err)
{
	c->pending = 0;
	const dev_status st = *c->h_status;
	if (st.code != STATUS_OK)
		c->res = NULL;
	switch (st.code) {
	case STATUS_OK:
		fill_result(c);
		return 0;
	case STATUS_NONFINITE:
		return skv_cuda_fail(err, -EDOM, st.layer, st.head,
				     "layer %d, head %d: logits hold NaN or Inf", st.layer,
				     st.head);
	case STATUS_STALLED:
		return skv_cuda_fail(
		    err, -EIO, st.layer, st.head,
		    "layer %d: fused scoring stalled (a block waited over %llu ms for "
		    "the rest of its item; resident blocks taken by another "
		    "spinning grid?): the result is void",
		    st.layer, (unsigned long long)(c->wait_limit_ns / 1000000u));
	default:
		return skv_cuda_fail(err, -EIO, st.layer, st.head,
				     "layer %d, head %d: selection did not fill the plan "
				     "(internal error)",
				     st.layer, st.head);
	}
}

extern "C" int skv_cuda_ctx_sync(struct skv_cuda_ctx *c, struct skv_error *err)
{
	if (!c)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "no context");
	if (!c->pending)
		return 0;
	cudaError_t e = cudaEventSynchronize(c->done);
	if (e != cudaSuccess) {
		c->pending = 0;
		c->res = NULL;
		return rt_fail(err, e, "compaction");
	}
	return status_result(c, err);
}

extern "C" int skv_cuda_ctx_query(struct skv_cuda_ctx *c, struct skv_error *err)
{
	if (!c)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "no context");
	if (!c->pending)
		return 0;
	cudaError_t e = cudaEventQuery(c->done);
	if (e == cudaErrorNotReady)
		return -EAGAIN;
	if (e != cudaSuccess) {
		c->pending = 0;
		c->res = NULL;
		return rt_fail(err, e, "compaction");
	}
	return status_result(c, err);
}

/* Room in the context's pinned result copy for `heads` kept counts. */
int skvcuda::ctx_reserve_result(struct skv_cuda_ctx *c, uint32_t heads, struct skv_error *err)
{
	const uint64_t need = sizeof(budget_res) + (uint64_t)heads * sizeof(uint32_t);
	if (need <= c->h_res_cap)
		return 0;
	void *h = NULL;
	cudaError_t e = cudaMallocHost(&h, need);
	if (e != cudaSuccess)
		return rt_fail(err, e, "pinned memory for the budget result");
	if (c->h_res)
		cudaFreeHost(c->h_res);
	c->h_res = h;
	c->h_res_cap = need;
	return 0;
}

extern "C" int skv_cuda_ctx_upload(struct skv_cuda_ctx *c, const void *host, uint64_t bytes,
				   void **ret_dev, struct skv_error *err)
{
	if (!c || !host || !bytes || !ret_dev)
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "context, host range and ret_dev are required");
	if (c->pending)
		return skv_cuda_fail(err, -EBUSY, -1, -1,
				     "the previous operation of this context was not synced");
	int r = skv_cuda_dev_enter(c->dev, err);
	if (r < 0)
		return r;
	if (bytes > c->up_cap) {
		/* grown in steps of 64 KiB; nothing queued still reads the old one
		 * (the previous operation was synced) */
		uint64_t cap = (bytes + 65535) & ~(uint64_t)65535;
		void *p = NULL;
		cudaError_t e = cudaMalloc(&p, cap);
		if (e != cudaSuccess)
			return rt_fail(err, e, "device memory for an upload");
		if (c->up)
			cudaFree(c->up);
		c->up = p;
		c->up_cap = cap;
	}
	cudaError_t e = cudaMemcpyAsync(c->up, host, bytes, cudaMemcpyHostToDevice, c->stream);
	if (e != cudaSuccess) {
		cudaStreamSynchronize(c->stream);
		return rt_fail(err, e, "upload to the device");
	}
	*ret_dev = c->up;
	return 0;
}
