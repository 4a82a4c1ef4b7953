// SPDX-License-Identifier: MIT
/*
 * snapkvd-request.c - validating a COMPACT or GROW request into a job; see
 * snapkvd-request.h. The checks run in the order of the functions below,
 * each of which says which checks it owns, so the first failing one names
 * the reason.
 */
#include "snapkvd-request.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/skv-frame.h"
#include "snapkvd-buffer.h"
#include "snapkvd-cleanup.h"
#include "snapkvd-config.h"
#include "snapkvd-group.h"
#include "snapkvd-job.h"
#include "snapkvd-paged.h"
#include "snapkvd-params.h"
#include "snapkvd-policy.h"
#include "snapkvd-device.h"

static int mul64(uint64_t a, uint64_t b, uint64_t *r)
{
	return __builtin_mul_overflow(a, b, r) ? -EOVERFLOW : 0;
}

static int add64(uint64_t a, uint64_t b, uint64_t *r)
{
	return __builtin_add_overflow(a, b, r) ? -EOVERFLOW : 0;
}

/* key: the config key that sets hi (NULL when hi is not one) */
static int limit(uint32_t v, uint32_t lo, uint32_t hi, const char *what, const char *key, char *err,
		 size_t errlen)
{
	if (v < lo) {
		snprintf(err, errlen, "%s = %u: must be at least %u", what, v, lo);
		return -EINVAL;
	}
	if (v > hi) {
		snprintf(err, errlen, "%s = %u exceeds the limit %u%s%s%s", what, v, hi,
			 key ? " (" : "", key ? key : "", key ? ")" : "");
		return -E2BIG;
	}
	return 0;
}

/* Owns: the shape limits of the config (layers, heads, head_dim, prompt
 * length, n_q <= prompt_len, decode_reserve), one layer description per
 * layer, the block table's length and the output layout's value. */
static int check_limits(const struct snapkvd_config *cfg, const Snapkv__V1__CompactRequest *req,
			char *err, size_t errlen)
{
	int r;

	if ((r = limit(req->layers, 1, cfg->max_layers, "layers", "max_layers", err, errlen)) ||
	    (r = limit(req->h_q, 1, cfg->max_heads, "h_q", "max_heads", err, errlen)) ||
	    (r = limit(req->h_kv, 1, cfg->max_heads, "h_kv", "max_heads", err, errlen)) ||
	    (r = limit(req->head_dim, 1, cfg->max_head_dim, "head_dim", "max_head_dim", err,
		       errlen)) ||
	    (r = limit(req->prompt_len, 1, cfg->max_prompt_len, "prompt_len", "max_prompt_len", err,
		       errlen)) ||
	    (r = limit(req->n_q, 0, req->prompt_len, "n_q", NULL, err, errlen)) ||
	    (r = limit(req->decode_reserve, 0, cfg->max_reserve, "decode_reserve", "max_reserve",
		       err, errlen)) ||
	    (r = limit(req->max_decode, 0, cfg->max_decode, "max_decode", "max_decode", err,
		       errlen)))
		return r == -E2BIG && !strncmp(err, "n_q", 3) ? -EINVAL : r;
	if (req->n_layer != req->layers) {
		snprintf(err, errlen, "%zu layer descriptions for %u layers", req->n_layer,
			 req->layers);
		return -EINVAL;
	}
	if (req->n_block_table > (size_t)cfg->max_block_table) {
		snprintf(err, errlen,
			 "block table of %zu entries exceeds the limit %u (max_block_table)",
			 req->n_block_table, cfg->max_block_table);
		return -E2BIG;
	}
	if (req->out_layout != SNAPKV__V1__LAYOUT__LAYOUT_UNSPECIFIED &&
	    req->out_layout != SNAPKV__V1__LAYOUT__LAYOUT_HND &&
	    req->out_layout != SNAPKV__V1__LAYOUT__LAYOUT_NHD &&
	    req->out_layout != SNAPKV__V1__LAYOUT__LAYOUT_PAGED) {
		snprintf(err, errlen, "unknown output layout %d", (int)req->out_layout);
		return -EINVAL;
	}
	return 0;
}

/*
 * Owns: the parameters against the shape (skv_plan) and the working set.
 * The working set grows with G * L whatever the buffer's size: refuse
 * before any work rather than let one request take gigabytes. The default
 * bound (0) scales with the thread count, since each thread holds its own
 * scratch: a long prompt on a many-core host is not absurd.
 */
static int check_plan(const struct snapkvd_request_env *env, struct snapkvd_job *j,
		      struct skv_plan *plan, char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	unsigned nth = env->threads; /* the worker with the most: a job may land on any */
	uint64_t scratch, max = env->cfg->max_scratch_bytes;
	int r;

	r = skv_plan(&j->shape, &j->params, plan, &kerr);
	if (r == 0)
		r = skv_scratch_bytes(&j->shape, &j->params, j->layers, nth, &scratch, &kerr);
	if (r < 0) {
		snprintf(err, errlen, "%s", kerr.msg[0] ? kerr.msg : "invalid parameters");
		return r;
	}
	if (!max)
		max = (uint64_t)SNAPKVD_SCRATCH_PER_THREAD * (nth ? nth : 1);
	if (scratch > max) {
		snprintf(err, errlen,
			 "compaction needs %llu bytes of scratch (G %u, L %u, D %u, %u "
			 "layers, %u threads), over max_scratch_bytes %llu%s",
			 (unsigned long long)scratch, j->shape.h_q / j->shape.h_kv,
			 j->shape.prompt_len, j->shape.head_dim, j->layers, nth,
			 (unsigned long long)max,
			 env->cfg->max_scratch_bytes ? "" : " (default: 512 MiB per thread)");
		return -E2BIG;
	}
	return 0;
}

/*
 * Owns: the work of one request, bounded up front. Multiply-adds of the
 * scoring (layers x H_q x observation rows x L x D) against
 * max_request_macs, and the bytes the kernels read (K, V and Q of every
 * layer) against max_request_bytes: a request refused here has queued
 * nothing, so no engine waits behind a job of unbounded cost.
 */
static int check_work(const struct snapkvd_request_env *env, const struct snapkvd_job *j,
		      const struct skv_plan *plan, enum skv_dtype dt, char *err, size_t errlen)
{
	const struct skv_shape *sh = &j->shape;
	uint64_t s = skv_dtype_size(dt) ? skv_dtype_size(dt) : 4, macs, per_layer, bytes;
	bool over;

	over =
	    mul64((uint64_t)j->layers * sh->h_q, (uint64_t)plan->w_obs * sh->prompt_len, &macs) ||
	    mul64(macs, sh->head_dim, &macs);
	if (over || macs > env->cfg->max_request_macs) {
		snprintf(err, errlen,
			 "compaction needs %s%llu multiply-adds (%u layers x %u query heads x %u "
			 "rows x L %u x D %u), over max_request_macs %llu",
			 over ? "over " : "", (unsigned long long)(over ? UINT64_MAX : macs),
			 j->layers, sh->h_q, plan->w_obs, sh->prompt_len, sh->head_dim,
			 (unsigned long long)env->cfg->max_request_macs);
		return -E2BIG;
	}
	per_layer =
	    (2ull * sh->h_kv * sh->prompt_len + (uint64_t)sh->h_q * sh->n_q) * sh->head_dim * s;
	over = mul64(per_layer, j->layers, &bytes);
	if (over || bytes > env->cfg->max_request_bytes) {
		snprintf(err, errlen,
			 "compaction reads %s%llu bytes (%u layers of K, V and Q), over "
			 "max_request_bytes %llu",
			 over ? "over " : "", (unsigned long long)(over ? UINT64_MAX : bytes),
			 j->layers, (unsigned long long)env->cfg->max_request_bytes);
		return -E2BIG;
	}
	return 0;
}

/* The largest of the first nb block table entries; each must be >= 0.
 * Every paged K and V of every layer asks for the same nb: the answer is
 * kept, so a long table (up to max_block_table) is scanned once, not
 * 2 x layers times. */
static int block_table_max(struct snapkvd_job *j, uint64_t nb, uint64_t *ret, char *err,
			   size_t errlen)
{
	uint64_t maxb = 0;

	if (nb && nb == j->bt_scanned) {
		*ret = j->bt_max;
		return 0;
	}

	for (uint64_t i = 0; i < nb; i++) {
		if (j->block_table[i] < 0) {
			snprintf(err, errlen, "block table entry %llu is negative",
				 (unsigned long long)i);
			return -EINVAL;
		}
		if ((uint64_t)j->block_table[i] > maxb)
			maxb = j->block_table[i];
	}
	j->bt_scanned = nb;
	j->bt_max = maxb;
	*ret = maxb;
	return 0;
}

/* One tensor to validate: which, of what shape, and where it goes. */
struct tensor_want {
	const char *what;
	uint32_t layer, heads, tokens, dim;
	bool allow_paged;
};

/* The largest element index the kernels can touch of t, as *ret_max. */
static int tensor_extent(struct snapkvd_job *j, const Snapkv__V1__TensorRef *t,
			 const struct tensor_want *w, uint64_t *ret_max, char *err, size_t errlen)
{
	uint64_t max_el = 0, tmp;
	int r;

	if (mul64(w->heads - 1, (uint64_t)t->head_stride, &tmp) || add64(max_el, tmp, &max_el) ||
	    add64(max_el, w->dim - 1, &max_el))
		return -EOVERFLOW;
	if (t->block_size) {
		uint64_t nb, maxb, in_blk;

		if (!w->allow_paged) {
			snprintf(err, errlen, "layer %u: %s must be strided", w->layer, w->what);
			return -EINVAL;
		}
		nb = (w->tokens + (uint64_t)t->block_size - 1) / t->block_size;
		if (nb > j->n_block_table) {
			snprintf(err, errlen,
				 "layer %u: %s: %llu blocks needed, block table has %u", w->layer,
				 w->what, (unsigned long long)nb, j->n_block_table);
			return -EINVAL;
		}
		r = block_table_max(j, nb, &maxb, err, errlen);
		if (r < 0)
			return r;
		in_blk = w->tokens < t->block_size ? w->tokens : t->block_size;
		if (mul64(in_blk - 1, (uint64_t)t->token_stride, &tmp) ||
		    add64(max_el, tmp, &max_el) || mul64(maxb, (uint64_t)t->block_stride, &tmp) ||
		    add64(max_el, tmp, &max_el))
			return -EOVERFLOW;
	} else if (mul64(w->tokens - 1, (uint64_t)t->token_stride, &tmp) ||
		   add64(max_el, tmp, &max_el)) {
		return -EOVERFLOW;
	}
	*ret_max = max_el;
	return 0;
}

/*
 * Owns: no tensor reads an element twice. Strides that overlap (a zero
 * token stride, heads closer than a row, a block table naming one block
 * twice) make a tiny buffer stand for any amount of work; the elements a
 * tensor names must fit in the bytes its strides span (span, from its
 * offset). 0 or -EINVAL.
 */
static int check_overlap(const struct tensor_want *w, uint64_t span, uint64_t s,
			 const struct snapkvd_buffer *b, char *err, size_t errlen)
{
	uint64_t need;

	if (mul64((uint64_t)w->heads * w->tokens, (uint64_t)w->dim * s, &need) || need > span) {
		snprintf(err, errlen,
			 "layer %u: %s: strides overlap: %u heads x %u tokens x %u elements "
			 "fit in %llu bytes of buffer %llu; each element must be distinct",
			 w->layer, w->what, w->heads, w->tokens, w->dim, (unsigned long long)span,
			 (unsigned long long)b->id);
		return -EINVAL;
	}
	return 0;
}

/*
 * Owns fp8 (SPEC.md "Quantized K/V"): K and V only (queries stay f32, f16
 * or bf16), a finite scale above 0, the host backend (the CUDA plugin has
 * no fp8 kernels yet).
 */
static int check_fp8(const struct snapkvd_request_env *env, const Snapkv__V1__TensorRef *t,
		     const struct tensor_want *w, char *err, size_t errlen)
{
	const enum skv_dtype dt = (enum skv_dtype)t->dtype;

	if (!skv_dtype_is_fp8(dt))
		return 0;
	if (!strcmp(w->what, "q")) {
		snprintf(err, errlen, "layer %u: %s is %s: queries stay f32, f16 or bf16", w->layer,
			 w->what, skv_dtype_name(dt));
		return -EINVAL;
	}
	if (!(t->scale > 0.0f && t->scale < INFINITY)) {
		snprintf(err, errlen,
			 "layer %u: %s is %s with scale %g: it must be finite and above 0",
			 w->layer, w->what, skv_dtype_name(dt), (double)t->scale);
		return -EINVAL;
	}
	if (snapkvd_device_present(env->device)) {
		snprintf(err, errlen,
			 "layer %u: %s is %s: fp8 K/V run on the host backend only (backend %s)",
			 w->layer, w->what, skv_dtype_name(dt),
			 snapkvd_device_backend(env->device));
		return -EOPNOTSUPP;
	}
	return 0;
}

/*
 * Owns, for one tensor reference: its presence, its dtype, that its buffer
 * is the session's, non-negative strides, an offset aligned to the dtype,
 * paging only where allowed and within the block table, and every element
 * the kernels may touch (heads x tokens x dim) inside the registered size,
 * all arithmetic overflow-checked. The job holds the buffer from here on.
 */
static int resolve_tensor(const struct snapkvd_request_env *env, struct snapkvd_job *j,
			  const Snapkv__V1__TensorRef *t, const struct tensor_want *w,
			  struct skv_tensor *out, char *err, size_t errlen)
{
	struct snapkvd_buffer *b;
	uint64_t s, max_el = 0, end;
	int r;

	if (!t) {
		snprintf(err, errlen, "layer %u: %s tensor missing", w->layer, w->what);
		return -EINVAL;
	}
	if (t->dtype < SNAPKV__V1__DTYPE__D_TYPE_F32 ||
	    t->dtype > SNAPKV__V1__DTYPE__D_TYPE_F8E5M2) {
		snprintf(err, errlen, "layer %u: %s: unknown dtype %d", w->layer, w->what,
			 (int)t->dtype);
		return -EINVAL;
	}
	r = check_fp8(env, t, w, err, errlen);
	if (r < 0)
		return r;
	s = skv_dtype_size((enum skv_dtype)t->dtype);
	b = snapkvd_buffer_find(env->buffers, t->buffer_id);
	if (!b) {
		snprintf(err, errlen, "layer %u: %s: buffer %llu is not registered", w->layer,
			 w->what, (unsigned long long)t->buffer_id);
		return -ENOENT;
	}
	if (t->head_stride < 0 || t->token_stride < 0 || t->block_stride < 0) {
		snprintf(err, errlen, "layer %u: %s: negative stride", w->layer, w->what);
		return -EINVAL;
	}
	if (t->offset % s) {
		snprintf(err, errlen, "layer %u: %s: offset %llu not aligned to the dtype",
			 w->layer, w->what, (unsigned long long)t->offset);
		return -EINVAL;
	}
	if (w->tokens) { /* else nothing will be read */
		r = tensor_extent(j, t, w, &max_el, err, errlen);
		if (r == 0 &&
		    (add64(max_el, 1, &end) || mul64(end, s, &end) || add64(end, t->offset, &end)))
			r = -EOVERFLOW;
		if (r == -EOVERFLOW) {
			snprintf(err, errlen, "layer %u: %s: strides overflow", w->layer, w->what);
			return -ERANGE;
		}
		if (r < 0)
			return r;
		if (end > b->size) {
			snprintf(err, errlen,
				 "layer %u: %s: reaches byte %llu of buffer %llu, which has %llu",
				 w->layer, w->what, (unsigned long long)end,
				 (unsigned long long)b->id, (unsigned long long)b->size);
			return -ERANGE;
		}
		r = check_overlap(w, end - t->offset, s, b, err, errlen);
		if (r < 0)
			return r;
	}
	snapkvd_job_hold(j, b);
	*out = (struct skv_tensor){
	    .data = (void *)(b->map + t->offset),
	    .dtype = (enum skv_dtype)t->dtype,
	    .head_stride = t->head_stride,
	    .token_stride = t->token_stride,
	    .block_table = t->block_size ? j->block_table : NULL,
	    .block_size = t->block_size,
	    .n_blocks = t->block_size ? j->n_block_table : 0,
	    .block_stride = t->block_stride,
	    .scale = t->scale,
	};
	return 0;
}

/* Owns: a description per layer, Q (when n_q), K and V of each layer
 * (resolve_tensor), and one dtype for the K and V of every layer. */
static int resolve_layers(const struct snapkvd_request_env *env, struct snapkvd_job *j,
			  const Snapkv__V1__CompactRequest *req, enum skv_dtype *ret_dtype,
			  char *err, size_t errlen)
{
	enum skv_dtype odt = SKV_DTYPE_UNSPECIFIED;
	int r;

	for (uint32_t l = 0; l < req->layers; l++) {
		const Snapkv__V1__LayerRef *lr = req->layer[l];
		struct tensor_want q = {"q", l, req->h_q, req->n_q, req->head_dim, false};
		struct tensor_want k = {"k", l, req->h_kv, req->prompt_len, req->head_dim, true};
		struct tensor_want v = k;

		v.what = "v";
		if (!lr)
			return -EINVAL;
		if (req->n_q && (r = resolve_tensor(env, j, lr->q, &q, &j->in[l].q, err, errlen)))
			return r;
		if ((r = resolve_tensor(env, j, lr->k, &k, &j->in[l].k, err, errlen)) ||
		    (r = resolve_tensor(env, j, lr->v, &v, &j->in[l].v, err, errlen)))
			return r;
		if (odt == SKV_DTYPE_UNSPECIFIED)
			odt = j->in[l].k.dtype;
		if (j->in[l].k.dtype != odt || j->in[l].v.dtype != odt) {
			snprintf(err, errlen,
				 "layer %u: K and V of every layer must share one dtype", l);
			return -EINVAL;
		}
	}
	*ret_dtype = odt;
	return 0;
}

/*
 * Owns CompactRequest.prefill_wait: a CUDA runner, the bound
 * prefill_wait_max_ms, the kind; a CUDA_FLAG is a 4-aligned word inside a
 * registered CUDA buffer of the session, held by the job like its tensors;
 * a CUDA_IPC_EVENT is the 64 bytes of the engine's event handle.
 */
static int resolve_wait(const struct snapkvd_request_env *env, struct snapkvd_job *j,
			const Snapkv__V1__PrefillWait *w, char *err, size_t errlen)
{
	const struct snapkvd_config *cfg = env->cfg;
	struct snapkvd_buffer *b;

	if (!snapkvd_device_present(env->device)) {
		snprintf(err, errlen,
			 "prefill_wait needs snapkvd --backend cuda; this daemon runs the %s "
			 "backend (synchronise before submitting instead)",
			 snapkvd_device_backend(env->device));
		return -ENOTSUP;
	}
	if (w->timeout_ms > cfg->prefill_wait_max_ms) {
		snprintf(err, errlen, "prefill_wait timeout_ms %u exceeds prefill_wait_max_ms %u",
			 w->timeout_ms, cfg->prefill_wait_max_ms);
		return -E2BIG;
	}
	j->wait_ms = w->timeout_ms ? w->timeout_ms : cfg->prefill_wait_max_ms;
	if (w->kind == SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_IPC_EVENT) {
		/* opened and polled by the worker: a bad handle fails the job there */
		if (w->ipc_event.len != SNAPKVD_IPC_EVENT_BYTES || !w->ipc_event.data) {
			snprintf(err, errlen,
				 "prefill_wait: ipc_event has %zu bytes, not %d (the bytes of a "
				 "cudaIpcEventHandle_t)",
				 w->ipc_event.len, SNAPKVD_IPC_EVENT_BYTES);
			return -EINVAL;
		}
		memcpy(j->wait_event, w->ipc_event.data, SNAPKVD_IPC_EVENT_BYTES);
		j->has_event = true;
		return 0;
	}
	if (w->kind != SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_FLAG) {
		snprintf(err, errlen, "unknown prefill_wait kind %d", (int)w->kind);
		return -EINVAL;
	}
	b = snapkvd_buffer_find(env->buffers, w->buffer_id);
	if (!b) {
		snprintf(err, errlen, "prefill_wait: buffer %llu is not registered",
			 (unsigned long long)w->buffer_id);
		return -ENOENT;
	}
	if (!b->imp) {
		snprintf(err, errlen, "prefill_wait: buffer %llu is not a CUDA buffer",
			 (unsigned long long)w->buffer_id);
		return -EINVAL;
	}
	if (w->offset % 4 || b->size < 4 || w->offset > b->size - 4) {
		snprintf(err, errlen,
			 "prefill_wait: offset %llu is not a 4-aligned word inside buffer %llu "
			 "(%llu bytes)",
			 (unsigned long long)w->offset, (unsigned long long)b->id,
			 (unsigned long long)b->size);
		return -ERANGE;
	}
	snapkvd_job_hold(j, b);
	j->wait_flag = (void *)(b->map + w->offset); /* a device address */
	j->wait_value = w->value;
	return 0;
}

/* The ledger names the transports the inputs really came over. */
static void name_transports(const struct snapkvd_job *j, struct snapkvd_cache *c)
{
	for (unsigned i = 0; i < j->n_bufs; i++) {
		const char *t = j->bufs[i]->transport ? j->bufs[i]->transport : "memfd";
		size_t n = strlen(c->transport);

		if (!strstr(c->transport, t))
			snprintf(c->transport + n, sizeof(c->transport) - n, "%s%s", n ? "+" : "",
				 t);
	}
}

/* Owns: the output dtype (the K/V's), the cache's size (it must fit the
 * session's arena) and the output arena (the GPU arena needs a CUDA runner
 * and the session's GPU arena). */
static int build_cache(const struct snapkvd_request_env *env, struct snapkvd_job *j,
		       const Snapkv__V1__CompactRequest *req, const struct skv_plan *plan,
		       enum skv_dtype odt, struct snapkvd_cache_geom *geom, char *err,
		       size_t errlen)
{
	_cleanup_(snapkvd_cache_freep) struct snapkvd_cache *c = NULL;
	uint32_t slots = plan->kept + req->decode_reserve;

	if (req->out_dtype && (enum skv_dtype)req->out_dtype != odt) {
		snprintf(err, errlen, "out_dtype must equal the K/V dtype");
		return -EINVAL;
	}
	if ((j->paged
		 ? snapkvd_paged_geometry(env, j, plan->h_store, slots, skv_dtype_size(odt), geom)
		 : snapkvd_cache_geometry(req->layers, plan->h_store, slots, req->head_dim,
					  skv_dtype_size(odt), env->arena_bytes, geom)) < 0) {
		snprintf(err, errlen,
			 "compact cache of %u layers x %u heads x %u slots does not fit",
			 req->layers, plan->h_store, slots);
		return -E2BIG;
	}
	if (req->out_arena == SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM) {
		if (!snapkvd_device_present(env->device)) {
			snprintf(err, errlen, "out_arena CUDA_VMM needs snapkvd --backend cuda");
			return -ENOTSUP;
		}
		if (!env->has_garena) {
			snprintf(err, errlen, "out_arena CUDA_VMM: ask for the GPU arena first");
			return -EINVAL;
		}
	} else if (req->out_arena != SNAPKV__V1__ARENA_KIND__ARENA_KIND_UNSPECIFIED &&
		   req->out_arena != SNAPKV__V1__ARENA_KIND__ARENA_KIND_HOST_MEMFD) {
		snprintf(err, errlen, "unknown out_arena %d", (int)req->out_arena);
		return -EINVAL;
	}
	if (snapkvd_cache_new(req->layers, plan->h_store, &c) < 0)
		return -ENOMEM;
	c->gpu_kv = req->out_arena == SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM;
	c->h_q = req->h_q;
	c->h_kv = req->h_kv;
	c->head_dim = req->head_dim;
	c->dtype = odt;
	c->dtype_bytes = skv_dtype_size(odt);
	for (uint32_t l = 0; l < req->layers && skv_dtype_is_fp8(odt); l++) {
		c->kv_scale[2 * l] = j->in[l].k.scale;
		c->kv_scale[2 * l + 1] = j->in[l].v.scale;
	}
	c->layout = req->out_layout == SNAPKV__V1__LAYOUT__LAYOUT_NHD ? SNAPKVD_LAYOUT_NHD
								      : SNAPKVD_LAYOUT_HND;
	c->gqa = j->params.gqa;
	c->policy = j->params.policy;
	c->prompt_len = req->prompt_len;
	c->kept = plan->kept;
	c->slots = slots;
	c->budget = j->params.capacity;
	c->evictable = req->evictable;
	c->pressure_level = j->pressure_level;
	if (snapkvd_params_budgeted(&j->params)) {
		c->budgeted = true;
		c->budget_mode = j->params.budget_mode;
		if (snapkvd_cache_budget_arrays(c) < 0)
			return -ENOMEM;
	}
	j->cache = TAKE_PTR(c); /* the job's from here: job_free frees it */
	name_transports(j, j->cache);
	if (j->paged)
		snapkvd_paged_cache(j);
	return 0;
}

/*
 * Owns the device a job runs on (--backend cuda): the one holding its CUDA
 * buffers, which must all be on one (each device has its own context and
 * work queue, and no kernel reads another device's memory), and the
 * session's GPU arena's for a cache placed there, which must be the same.
 * A job with no CUDA buffer and its cache on the host runs on the first.
 */
static int place_on_device(const struct snapkvd_request_env *env, struct snapkvd_job *j, char *err,
			   size_t errlen)
{
	const struct snapkvd_buffer *first = NULL;

	for (unsigned i = 0; i < j->n_bufs; i++) {
		const struct snapkvd_buffer *b = j->bufs[i];

		if (!b->imp)
			continue;
		if (first && b->gpu != first->gpu) {
			snprintf(err, errlen,
				 "buffer %llu is on CUDA device %d and buffer %llu on device %d: a "
				 "request's buffers must all be on one device",
				 (unsigned long long)first->id,
				 snapkvd_device_ordinal(env->device, first->gpu),
				 (unsigned long long)b->id,
				 snapkvd_device_ordinal(env->device, b->gpu));
			return -EXDEV;
		}
		if (!first)
			first = b;
	}
	j->gpu = first ? first->gpu : 0;
	if (j->cache->gpu_kv) {
		if (first && first->gpu != env->garena_gpu) {
			snprintf(err, errlen,
				 "out_arena CUDA_VMM: the session's GPU arena is on CUDA device "
				 "%d, buffer %llu on device %d",
				 snapkvd_device_ordinal(env->device, env->garena_gpu),
				 (unsigned long long)first->id,
				 snapkvd_device_ordinal(env->device, first->gpu));
			return -EXDEV;
		}
		j->gpu = env->garena_gpu;
	}
	j->cache->gpu = j->gpu;
	j->cache->device_ordinal =
	    snapkvd_device_present(env->device) ? snapkvd_device_ordinal(env->device, j->gpu) : -1;
	return 0;
}

/* The job's private copies and arrays (no check owned). */
static int job_arrays(struct snapkvd_job *j, const Snapkv__V1__CompactRequest *req)
{
	if (req->n_block_table) {
		j->block_table = malloc(req->n_block_table * sizeof(int32_t));
		if (!j->block_table)
			return -ENOMEM;
		memcpy(j->block_table, req->block_table, req->n_block_table * sizeof(int32_t));
		j->n_block_table = (uint32_t)req->n_block_table;
	}
	/* Q, K, V and writeback's two pools of each layer, + the wait flag's */
	j->bufs = calloc((size_t)req->layers * 5 + 1, sizeof(*j->bufs));
	j->in = calloc(req->layers, sizeof(*j->in));
	j->out = calloc(req->layers, sizeof(*j->out));
	return j->bufs && j->in && j->out ? 0 : -ENOMEM;
}

static bool wait_given(const Snapkv__V1__CompactRequest *req)
{
	return req->prefill_wait &&
	       req->prefill_wait->kind !=
		   SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_UNSPECIFIED;
}

int snapkvd_request_compact(const struct snapkvd_request_env *env, struct snapkvd_session *s,
			    const struct snapkvd_origin *o, const Snapkv__V1__CompactRequest *req,
			    struct snapkvd_job **ret, char *err, size_t errlen)
{
	struct snapkvd_cache_geom geom;
	struct snapkvd_job *j;
	struct skv_plan plan;
	enum skv_dtype odt;
	uint32_t requested_c;
	bool scaled;
	int r;

	r = check_limits(env->cfg, req, err, errlen);
	if (r < 0)
		return r;
	j = snapkvd_job_new(SNAPKVD_JOB_COMPACT, s, o);
	if (!j)
		return -ENOMEM;
	j->layers = req->layers;
	j->shape = (struct skv_shape){
	    .prompt_len = req->prompt_len,
	    .head_dim = req->head_dim,
	    .h_q = req->h_q,
	    .h_kv = req->h_kv,
	    .n_q = req->n_q,
	};
	r = snapkvd_params_read(req->params, &j->params, err, errlen);
	if (r == 0)
		r = snapkvd_params_read_budget(req, &j->params, err, errlen);
	if (r == 0)
		r = snapkvd_params_read_group(env, req, j, err, errlen);
	if (r < 0)
		goto fail;
	/* partial window (SPEC.md): the request's min_window, else the config's */
	if (!j->params.min_window)
		j->params.min_window = env->cfg->min_window;
	requested_c = j->params.capacity;
	/* pressure scales every request, a decision group's members alike: at
	 * the level their open group was created at (they must agree), else
	 * at today's */
	j->pressure_level = (int)snapkvd_pressure_level(env->ops->pressure);
	if (j->gm.size && env->groups)
		(void)snapkvd_groups_level(env->groups, env->uid, j->gm.key, &j->pressure_level);
	snapkvd_params_scale(env->ops, j->pressure_level, &j->params, &scaled);
	if ((r = check_plan(env, j, &plan, err, errlen)) ||
	    (r = snapkvd_params_check_budget(j, req, &plan, err, errlen)) ||
	    (r = job_arrays(j, req)) || (r = resolve_layers(env, j, req, &odt, err, errlen)) ||
	    (r = check_work(env, j, &plan, odt, err, errlen)) ||
	    (wait_given(req) && (r = resolve_wait(env, j, req->prefill_wait, err, errlen))) ||
	    (r = snapkvd_paged_check(env, j, req, &plan, odt, err, errlen)) ||
	    (r = build_cache(env, j, req, &plan, odt, &geom, err, errlen)) ||
	    (r = place_on_device(env, j, err, errlen)))
		goto fail;
	j->cache->requested_budget = requested_c;
	j->cache->region_bytes = geom.region;
	j->scaled = scaled;
	j->geom = geom;
	*ret = j;
	return 0;
fail:
	snapkvd_job_free(j);
	return r;
}

int snapkvd_request_grow(const struct snapkvd_request_env *env, const struct snapkvd_cache *c,
			 uint32_t extra, uint32_t *ret_slots, struct snapkvd_cache_geom *ret_geom,
			 const char **err)
{
	uint32_t max = env->cfg->max_reserve;

	if (c->writeback) {
		/* more position rows and the engine's new blocks; no K/V moves */
		uint64_t dec = (uint64_t)c->slots - c->kept + extra;

		if (extra == 0 || dec > (c->max_decode ? c->max_decode : max)) {
			*err = !extra ? "extra must be at least 1"
			       : c->max_decode
				   ? "GROW beyond the declared maximum: capacity - kept + extra "
				     "exceeds the cache's max_decode"
				   : "extra must be 1..max_reserve in all (declare max_decode "
				     "when compacting for more)";
			return extra ? -E2BIG : -EINVAL;
		}
		if (snapkvd_cache_geometry_paged(c->layers, c->h_store, c->slots + extra,
						 c->head_dim, c->dtype_bytes, c->block_size, true,
						 env->arena_bytes, ret_geom) < 0) {
			*err = "grown cache does not fit the arena";
			return -E2BIG;
		}
		*ret_slots = c->slots + extra;
		return 0;
	}
	if (c->layout == SNAPKVD_LAYOUT_PAGED) {
		if (extra == 0 || extra > max || c->slots - c->kept + (uint64_t)extra > max) {
			*err = "extra must be 1..max_reserve in all";
			return extra ? -E2BIG : -EINVAL;
		}
		if (snapkvd_cache_geometry_paged(c->layers, c->h_store, c->slots + extra,
						 c->head_dim, c->dtype_bytes, c->block_size, false,
						 env->arena_bytes, ret_geom) < 0) {
			*err = "grown cache does not fit the arena";
			return -E2BIG;
		}
		*ret_slots = c->slots + extra;
		return 0;
	}
	if (extra == 0 || extra > max || c->slots - c->kept + (uint64_t)extra > max) {
		*err = "extra must be 1..max_reserve in all";
		return extra ? -E2BIG : -EINVAL;
	}
	if (snapkvd_cache_geometry(c->layers, c->h_store, c->slots + extra, c->head_dim,
				   c->dtype_bytes, env->arena_bytes, ret_geom) < 0) {
		*err = "grown cache does not fit the arena";
		return -E2BIG;
	}
	*ret_slots = c->slots + extra;
	return 0;
}
