// SPDX-License-Identifier: MIT
/*
 * snapkvd-compactor.c - validating a COMPACT request into a job, and the
 * worker that runs jobs on the kernels.
 *
 * A pool of workers takes jobs (compactions and GROW copies) from one FIFO
 * queue. Each worker owns one skv_ctx whose own thread pool spreads a
 * compaction over (layer, head) items; `threads` is split among the workers
 * (each at least one), so with several engines a small request runs beside a
 * large one instead of behind it. One worker is one compaction at a time
 * using every thread: the lowest latency per request. Results do not depend
 * on the thread count (the kernels reduce in a fixed order), so which worker
 * ran a job never shows in its output.
 *
 * Workers never touch a session or its CQ: a finished job goes on the done
 * list and the loop thread, the only producer of every CQ, posts it.
 *
 * With --backend cuda the worker runs the same jobs through the CUDA plugin
 * instead (kernels/cuda, dlopen()ed by main): the memfd buffers and the
 * output region are page-locked and mapped for the GPU for the job's
 * duration (zero-copy over the bus; transport "memfd, cuda host-mapped"),
 * one stream, synchronised before the completion is posted. The CUDA path
 * runs one worker: host registrations are per range, and two jobs sharing a
 * buffer on two workers would unregister it under each other. A request may
 * carry a prefill wait. A flag word in an engine buffer: the stream waits
 * on it before the kernels, and a waiter thread writes the flag itself when
 * the engine has not by the deadline, failing the job with -ETIMEDOUT. An
 * engine's IPC event: the worker polls it from the host and enqueues the
 * kernels once it has completed, or fails the job at the deadline.
 *
 * On the CUDA path a paged job's block table is copied into device memory
 * of the worker's context, and a GROW of a cache in the GPU arena copies its
 * rows device to device on the worker's stream.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cuda/skv-backend.h"
#include "kernels/cuda/skv-cuda.h"
#include "snapkvd-log.h"
#include "snapkvd-server.h"

struct snapkvd_worker {
	struct snapkvd_compactor *c;
	struct skv_ctx *ctx;
	struct skv_cuda_ctx *gctx; /* --backend cuda */
	/* a prefill wait in progress (under c->mu): the timer releases it at
	 * wait_deadline by writing wait_value into wait_flag, unless the flag
	 * holds it by then (wait_met: the kernels behind it may still run) */
	void *wait_flag;
	uint32_t wait_value;
	uint64_t wait_deadline;
	bool wait_fired, wait_met;
	pthread_t thread;
	bool started;
};

struct snapkvd_compactor {
	struct snapkvd_server *srv;
	unsigned n_workers;
	struct snapkvd_worker *w; /* [n_workers]; w[0] has the most threads */
	char gpu_desc[320];
	pthread_mutex_t mu;
	pthread_cond_t cond;
	/* --backend cuda: the thread that releases prefill waits past their
	 * deadline (its own thread: the loop thread may block in a device-wide
	 * synchronisation, e.g. releasing an import, behind the very wait) */
	pthread_cond_t wcond; /* CLOCK_MONOTONIC */
	pthread_t waiter;
	bool waiter_started, waiter_stop; /* stopped after the workers */
	struct snapkvd_job *queue, **queue_tail;
	struct snapkvd_job *done;
	unsigned pending; /* queued + running + done-not-reaped */
	unsigned queued;  /* not yet taken by a worker */
	bool stop;
};

void snapkvd_buffer_unref(struct snapkvd_buffer *b)
{
	if (!b || --b->refs)
		return;
	if (b->imp)
		snapkvd_gpu_buffer_release(b);
	else if (b->map)
		munmap((void *)b->map, b->size);
	free(b);
}

void snapkvd_cache_free(struct snapkvd_cache *c)
{
	if (!c)
		return;
	free(c->k_off);
	free(c->v_off);
	free(c->pos_off);
	free(c->mass);
	free(c);
}

void snapkvd_job_free(struct snapkvd_job *j)
{
	if (!j)
		return;
	for (unsigned i = 0; i < j->n_bufs; i++)
		snapkvd_buffer_unref(j->bufs[i]);
	free(j->bufs);
	if (j->req)
		snapkv__v1__compact_request__free_unpacked(j->req, NULL);
	free(j->in);
	free(j->out);
	free(j->block_table);
	snapkvd_cache_free(j->cache);
	free(j->g.old_k);
	free(j->g.old_v);
	free(j->g.old_pos);
	free(j);
}

static int mul64(uint64_t a, uint64_t b, uint64_t *r)
{
	return __builtin_mul_overflow(a, b, r) ? -EOVERFLOW : 0;
}

static int add64(uint64_t a, uint64_t b, uint64_t *r)
{
	return __builtin_add_overflow(a, b, r) ? -EOVERFLOW : 0;
}

static struct snapkvd_buffer *find_buffer(struct snapkvd_session *s, uint64_t id)
{
	for (struct snapkvd_buffer *b = s->buffers; b; b = b->next)
		if (b->id == id)
			return b;
	return NULL;
}

static int hold_buffer(struct snapkvd_job *j, struct snapkvd_buffer *b)
{
	for (unsigned i = 0; i < j->n_bufs; i++)
		if (j->bufs[i] == b)
			return 0;
	j->bufs[j->n_bufs++] = b;
	b->refs++;
	return 0;
}

/*
 * Resolve one tensor reference: the buffer must be the session's, every
 * element the kernels may touch (heads x tokens x dim) inside the
 * registered size, all arithmetic overflow-checked.
 */
static int resolve_tensor(struct snapkvd_job *j, const Snapkv__V1__TensorRef *t, const char *what,
			  uint32_t layer, uint32_t heads, uint32_t tokens, uint32_t dim,
			  bool allow_paged, struct skv_tensor *out, char *err, size_t errlen)
{
	struct snapkvd_buffer *b;
	uint64_t s, max_el = 0, tmp, end;

	if (!t) {
		snprintf(err, errlen, "layer %u: %s tensor missing", layer, what);
		return -EINVAL;
	}
	if (t->dtype < SNAPKV__V1__DTYPE__D_TYPE_F32 || t->dtype > SNAPKV__V1__DTYPE__D_TYPE_BF16) {
		snprintf(err, errlen, "layer %u: %s: unknown dtype %d", layer, what, (int)t->dtype);
		return -EINVAL;
	}
	s = skv_dtype_size((enum skv_dtype)t->dtype);
	b = find_buffer(j->s, t->buffer_id);
	if (!b) {
		snprintf(err, errlen, "layer %u: %s: buffer %llu is not registered", layer, what,
			 (unsigned long long)t->buffer_id);
		return -ENOENT;
	}
	if (t->head_stride < 0 || t->token_stride < 0 || t->block_stride < 0) {
		snprintf(err, errlen, "layer %u: %s: negative stride", layer, what);
		return -EINVAL;
	}
	if (t->offset % s) {
		snprintf(err, errlen, "layer %u: %s: offset %llu not aligned to the dtype", layer,
			 what, (unsigned long long)t->offset);
		return -EINVAL;
	}
	if (tokens == 0)
		goto ok; /* nothing will be read */
	/* the largest element index the kernels can touch */
	if (mul64(heads - 1, (uint64_t)t->head_stride, &tmp) || add64(max_el, tmp, &max_el) ||
	    add64(max_el, dim - 1, &max_el))
		goto overflow;
	if (t->block_size) {
		uint64_t nb, maxb = 0;

		if (!allow_paged) {
			snprintf(err, errlen, "layer %u: %s must be strided", layer, what);
			return -EINVAL;
		}
		nb = (tokens + (uint64_t)t->block_size - 1) / t->block_size;
		if (nb > j->req->n_block_table) {
			snprintf(err, errlen,
				 "layer %u: %s: %llu blocks needed, block table has %zu", layer,
				 what, (unsigned long long)nb, j->req->n_block_table);
			return -EINVAL;
		}
		for (uint64_t i = 0; i < nb; i++) {
			if (j->req->block_table[i] < 0) {
				snprintf(err, errlen, "block table entry %llu is negative",
					 (unsigned long long)i);
				return -EINVAL;
			}
			if ((uint64_t)j->req->block_table[i] > maxb)
				maxb = j->req->block_table[i];
		}
		uint64_t in_blk = tokens < t->block_size ? tokens : t->block_size;
		if (mul64(in_blk - 1, (uint64_t)t->token_stride, &tmp) ||
		    add64(max_el, tmp, &max_el) || mul64(maxb, (uint64_t)t->block_stride, &tmp) ||
		    add64(max_el, tmp, &max_el))
			goto overflow;
	} else {
		if (mul64(tokens - 1, (uint64_t)t->token_stride, &tmp) ||
		    add64(max_el, tmp, &max_el))
			goto overflow;
	}
	if (add64(max_el, 1, &end) || mul64(end, s, &end) || add64(end, t->offset, &end))
		goto overflow;
	if (end > b->size) {
		snprintf(err, errlen,
			 "layer %u: %s: reaches byte %llu of buffer %llu, which has %llu", layer,
			 what, (unsigned long long)end, (unsigned long long)b->id,
			 (unsigned long long)b->size);
		return -ERANGE;
	}
ok:
	hold_buffer(j, b);
	*out = (struct skv_tensor){
	    .data = (void *)(b->map + t->offset),
	    .dtype = (enum skv_dtype)t->dtype,
	    .head_stride = t->head_stride,
	    .token_stride = t->token_stride,
	    .block_table = t->block_size ? j->block_table : NULL,
	    .block_size = t->block_size,
	    .n_blocks = t->block_size ? (uint32_t)j->req->n_block_table : 0,
	    .block_stride = t->block_stride,
	};
	return 0;
overflow:
	snprintf(err, errlen, "layer %u: %s: strides overflow", layer, what);
	return -ERANGE;
}

#define IPC_EVENT_BYTES 64 /* sizeof(cudaIpcEventHandle_t) */

/*
 * CompactRequest.prefill_wait: a CUDA_FLAG is a 4-aligned word inside a
 * registered CUDA buffer of the session, held by the job like its tensors;
 * a CUDA_IPC_EVENT is the 64 bytes of the engine's event handle.
 */
static int resolve_wait(struct snapkvd_job *j, const Snapkv__V1__PrefillWait *w, char *err,
			size_t errlen)
{
	const struct snapkvd_server *srv = j->s->srv;
	struct snapkvd_buffer *b;

	if (!srv->gpu) {
		snprintf(err, errlen,
			 "prefill_wait needs snapkvd --backend cuda; this daemon runs the %s "
			 "backend (synchronise before submitting instead)",
			 srv->cfg.backend);
		return -ENOTSUP;
	}
	if (w->timeout_ms > srv->cfg.prefill_wait_max_ms) {
		snprintf(err, errlen, "prefill_wait timeout_ms %u exceeds prefill_wait_max_ms %u",
			 w->timeout_ms, srv->cfg.prefill_wait_max_ms);
		return -E2BIG;
	}
	j->wait_ms = w->timeout_ms ? w->timeout_ms : srv->cfg.prefill_wait_max_ms;
	if (w->kind == SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_IPC_EVENT) {
		/* opened and polled by the worker: a bad handle fails the job there */
		if (w->ipc_event.len != IPC_EVENT_BYTES || !w->ipc_event.data) {
			snprintf(err, errlen,
				 "prefill_wait: ipc_event has %zu bytes, not %d (the bytes of a "
				 "cudaIpcEventHandle_t)",
				 w->ipc_event.len, IPC_EVENT_BYTES);
			return -EINVAL;
		}
		j->wait_event = w->ipc_event.data; /* inside j->req, freed with the job */
		return 0;
	}
	if (w->kind != SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_FLAG) {
		snprintf(err, errlen, "unknown prefill_wait kind %d", (int)w->kind);
		return -EINVAL;
	}
	b = find_buffer(j->s, w->buffer_id);
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
	hold_buffer(j, b);
	j->wait_flag = (void *)(b->map + w->offset); /* a device address */
	j->wait_value = w->value;
	return 0;
}

static int limit(uint32_t v, uint32_t lo, uint32_t hi, const char *what, char *err, size_t errlen)
{
	if (v < lo) {
		snprintf(err, errlen, "%s = %u: must be at least %u", what, v, lo);
		return -EINVAL;
	}
	if (v > hi) {
		snprintf(err, errlen, "%s = %u exceeds the limit %u", what, v, hi);
		return -E2BIG;
	}
	return 0;
}

static uint64_t align64(uint64_t v)
{
	return (v + 63) & ~63ull;
}

/*
 * A Params field flagged in explicit_fields is taken as sent, 0 included
 * (SPEC: --sinks 0 keeps no sinks); unflagged (senders older than the flag),
 * 0 means the default. Enums start at UNSPECIFIED = 0, so 0 is unset there.
 */
static bool param_given(const Snapkv__V1__Params *p, unsigned field_no, uint32_t v)
{
	return (p->explicit_fields & SKV_PARAMS_EXPLICIT(field_no)) || v;
}

int snapkvd_job_prepare(struct snapkvd_session *s, const struct snapkvd_origin *o,
			Snapkv__V1__CompactRequest *req, struct snapkvd_job **ret, char *err,
			size_t errlen)
{
	const struct snapkvd_config *cfg = &s->srv->cfg;
	struct snapkvd_job *j;
	struct skv_plan plan;
	struct skv_error kerr = {{0}, -1, -1};
	struct snapkvd_cache *c;
	uint64_t kv_bytes, pos_bytes, layer_bytes, region, tmp;
	uint32_t slots, requested_c;
	uint8_t *kv_base;
	enum skv_dtype odt;
	int r;

	if ((r = limit(req->layers, 1, cfg->max_layers, "layers", err, errlen)) ||
	    (r = limit(req->h_q, 1, cfg->max_heads, "h_q", err, errlen)) ||
	    (r = limit(req->h_kv, 1, cfg->max_heads, "h_kv", err, errlen)) ||
	    (r = limit(req->head_dim, 1, cfg->max_head_dim, "head_dim", err, errlen)) ||
	    (r = limit(req->prompt_len, 1, cfg->max_prompt_len, "prompt_len", err, errlen)) ||
	    (r = limit(req->n_q, 0, req->prompt_len, "n_q", err, errlen)) ||
	    (r = limit(req->decode_reserve, 0, cfg->max_reserve, "decode_reserve", err, errlen)))
		return r == -E2BIG && !strncmp(err, "n_q", 3) ? -EINVAL : r;
	if (req->n_layer != req->layers) {
		snprintf(err, errlen, "%zu layer descriptions for %u layers", req->n_layer,
			 req->layers);
		return -EINVAL;
	}
	if (req->n_block_table > (size_t)cfg->max_prompt_len) {
		snprintf(err, errlen, "block table of %zu entries is too long", req->n_block_table);
		return -E2BIG;
	}
	if (req->out_layout != SNAPKV__V1__LAYOUT__LAYOUT_UNSPECIFIED &&
	    req->out_layout != SNAPKV__V1__LAYOUT__LAYOUT_HND &&
	    req->out_layout != SNAPKV__V1__LAYOUT__LAYOUT_NHD) {
		snprintf(err, errlen, "unknown output layout %d", (int)req->out_layout);
		return -EINVAL;
	}

	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->s = s;
	j->origin = *o;
	j->t_start = snapkvd_now_ns();
	j->req = req;
	j->shape = (struct skv_shape){
	    .prompt_len = req->prompt_len,
	    .head_dim = req->head_dim,
	    .h_q = req->h_q,
	    .h_kv = req->h_kv,
	    .n_q = req->n_q,
	};
	skv_params_init(&j->params);
	if (req->params) {
		const Snapkv__V1__Params *p = req->params;

		if (p->policy)
			j->params.policy = (enum skv_policy)p->policy;
		if (param_given(p, 2, p->window))
			j->params.window = p->window;
		if (param_given(p, 3, p->capacity))
			j->params.capacity = p->capacity;
		if (param_given(p, 4, p->kernel))
			j->params.kernel = p->kernel;
		if (p->pooling)
			j->params.pooling = (enum skv_pooling)p->pooling;
		if (p->gqa)
			j->params.gqa = (enum skv_gqa)p->gqa;
		if (param_given(p, 7, p->sinks))
			j->params.sinks = p->sinks;
		if (p->n_protected_ranges > SKV_MAX_PROTECTED) {
			snprintf(err, errlen, "%zu protected ranges, at most %d",
				 p->n_protected_ranges, SKV_MAX_PROTECTED);
			r = -E2BIG;
			goto fail;
		}
		j->params.n_protected = p->n_protected_ranges;
		for (size_t i = 0; i < p->n_protected_ranges; i++) {
			if (!p->protected_ranges[i]) {
				r = -EINVAL;
				goto fail;
			}
			j->params.protected_ranges[i].begin = p->protected_ranges[i]->begin;
			j->params.protected_ranges[i].end = p->protected_ranges[i]->end;
		}
	}
	/* Memory pressure: new requests at high/critical get a smaller C, never
	 * below what the policy keeps unconditionally plus one slot. */
	requested_c = j->params.capacity;
	{
		uint64_t keep = j->params.policy == SKV_POLICY_STREAMINGLLM ? j->params.sinks
				: j->params.policy == SKV_POLICY_WINDOW	    ? 0
									    : j->params.window;

		for (uint32_t i = 0; i < j->params.n_protected && i < SKV_MAX_PROTECTED; i++)
			if (j->params.protected_ranges[i].end > j->params.protected_ranges[i].begin)
				keep += j->params.protected_ranges[i].end -
					j->params.protected_ranges[i].begin;
		if (keep < UINT32_MAX)
			j->params.capacity = snapkvd_ops_scale_capacity(&s->srv->ops, requested_c,
									(uint32_t)keep, NULL);
	}
	r = skv_plan(&j->shape, &j->params, &plan, &kerr);
	if (r < 0) {
		snprintf(err, errlen, "%s", kerr.msg[0] ? kerr.msg : "invalid parameters");
		goto fail;
	}
	/* The working set grows with G * L whatever the buffer's size: refuse
	 * before any work rather than let one request take gigabytes. The
	 * default (0) scales with the thread count, since each thread holds
	 * its own scratch: a long prompt on a many-core host is not absurd. */
	{
		/* the worker with the most threads: a job may land on any */
		unsigned nth = snapkvd_compactor_threads(s->srv->compactor);
		uint64_t scratch, max = cfg->max_scratch_bytes;

		if (!max)
			max = (uint64_t)SNAPKVD_SCRATCH_PER_THREAD * (nth ? nth : 1);

		r = skv_scratch_bytes(&j->shape, &j->params, req->layers, nth, &scratch, &kerr);
		if (r < 0) {
			snprintf(err, errlen, "%s", kerr.msg[0] ? kerr.msg : "invalid parameters");
			goto fail;
		}
		if (scratch > max) {
			snprintf(err, errlen,
				 "compaction needs %llu bytes of scratch (G %u, L %u, D %u, %u "
				 "layers, %u threads), over max_scratch_bytes %llu%s",
				 (unsigned long long)scratch, req->h_q / req->h_kv, req->prompt_len,
				 req->head_dim, req->layers, nth, (unsigned long long)max,
				 cfg->max_scratch_bytes ? "" : " (default: 512 MiB per thread)");
			r = -E2BIG;
			goto fail;
		}
	}
	if (req->n_block_table) {
		j->block_table = malloc(req->n_block_table * sizeof(int32_t));
		if (!j->block_table) {
			r = -ENOMEM;
			goto fail;
		}
		memcpy(j->block_table, req->block_table, req->n_block_table * sizeof(int32_t));
	}
	j->bufs = calloc((size_t)req->layers * 3 + 1, sizeof(*j->bufs)); /* + the wait flag's */
	j->in = calloc(req->layers, sizeof(*j->in));
	j->out = calloc(req->layers, sizeof(*j->out));
	c = j->cache = calloc(1, sizeof(*c));
	if (!j->bufs || !j->in || !j->out || !c) {
		r = -ENOMEM;
		goto fail;
	}
	odt = SKV_DTYPE_UNSPECIFIED;
	for (uint32_t l = 0; l < req->layers; l++) {
		const Snapkv__V1__LayerRef *lr = req->layer[l];

		if (!lr) {
			r = -EINVAL;
			goto fail;
		}
		if (req->n_q) {
			r = resolve_tensor(j, lr->q, "q", l, req->h_q, req->n_q, req->head_dim,
					   false, &j->in[l].q, err, errlen);
			if (r < 0)
				goto fail;
		}
		r = resolve_tensor(j, lr->k, "k", l, req->h_kv, req->prompt_len, req->head_dim,
				   true, &j->in[l].k, err, errlen);
		if (r < 0)
			goto fail;
		r = resolve_tensor(j, lr->v, "v", l, req->h_kv, req->prompt_len, req->head_dim,
				   true, &j->in[l].v, err, errlen);
		if (r < 0)
			goto fail;
		if (odt == SKV_DTYPE_UNSPECIFIED)
			odt = j->in[l].k.dtype;
		if (j->in[l].k.dtype != odt || j->in[l].v.dtype != odt) {
			snprintf(err, errlen,
				 "layer %u: K and V of every layer must share one dtype", l);
			r = -EINVAL;
			goto fail;
		}
	}
	if (req->prefill_wait && req->prefill_wait->kind !=
				     SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_UNSPECIFIED) {
		r = resolve_wait(j, req->prefill_wait, err, errlen);
		if (r < 0)
			goto fail;
	}
	if (req->out_dtype && (enum skv_dtype)req->out_dtype != odt) {
		snprintf(err, errlen, "out_dtype must equal the K/V dtype");
		r = -EINVAL;
		goto fail;
	}

	/* The cache: per layer K [h][slots][D], V the same, positions [h][slots]. */
	slots = plan.kept + req->decode_reserve;
	c->id = ++s->srv->next_cache_id;
	c->layers = req->layers;
	c->h_q = req->h_q;
	c->h_kv = req->h_kv;
	c->h_store = plan.h_store;
	c->head_dim = req->head_dim;
	c->dtype = odt;
	c->dtype_bytes = skv_dtype_size(odt);
	c->layout = req->out_layout == SNAPKV__V1__LAYOUT__LAYOUT_NHD
			? SNAPKV__V1__LAYOUT__LAYOUT_NHD
			: SNAPKV__V1__LAYOUT__LAYOUT_HND;
	c->gqa = j->params.gqa;
	c->policy = j->params.policy;
	c->prompt_len = req->prompt_len;
	c->kept = plan.kept;
	c->slots = slots;
	c->budget = j->params.capacity;
	c->requested_budget = requested_c;
	c->pressure_level = (int)snapkvd_pressure_level(s->srv->ops.pressure);
	c->evictable = req->evictable;
	/* the ledger names the transports the inputs really came over */
	for (unsigned i = 0; i < j->n_bufs; i++) {
		const char *t = j->bufs[i]->transport ? j->bufs[i]->transport : "memfd";
		size_t n = strlen(c->transport);

		if (!strstr(c->transport, t))
			snprintf(c->transport + n, sizeof(c->transport) - n, "%s%s", n ? "+" : "",
				 t);
	}
	if (c->layout == SNAPKV__V1__LAYOUT__LAYOUT_HND) {
		c->head_stride = (int64_t)slots * req->head_dim;
		c->token_stride = req->head_dim;
	} else {
		c->head_stride = req->head_dim;
		c->token_stride = (int64_t)plan.h_store * req->head_dim;
	}
	if (mul64((uint64_t)plan.h_store * slots, (uint64_t)req->head_dim * c->dtype_bytes,
		  &kv_bytes) ||
	    mul64((uint64_t)plan.h_store * slots, 4, &pos_bytes))
		goto too_big;
	kv_bytes = align64(kv_bytes);
	pos_bytes = align64(pos_bytes);
	if (add64(2 * kv_bytes, pos_bytes, &layer_bytes) ||
	    mul64(layer_bytes, req->layers, &region))
		goto too_big;
	region = snapkvd_arena_round(region);
	if (!region || region > s->arena->size)
		goto too_big;
	if (req->out_arena == SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM) {
		if (!s->srv->gpu) {
			snprintf(err, errlen, "out_arena CUDA_VMM needs snapkvd --backend cuda");
			r = -ENOTSUP;
			goto fail;
		}
		if (!s->garena) {
			snprintf(err, errlen, "out_arena CUDA_VMM: ask for the GPU arena first");
			r = -EINVAL;
			goto fail;
		}
		c->gpu_kv = true;
	} else if (req->out_arena != SNAPKV__V1__ARENA_KIND__ARENA_KIND_UNSPECIFIED &&
		   req->out_arena != SNAPKV__V1__ARENA_KIND__ARENA_KIND_HOST_MEMFD) {
		snprintf(err, errlen, "unknown out_arena %d", (int)req->out_arena);
		r = -EINVAL;
		goto fail;
	}
	c->k_off = calloc(req->layers, sizeof(uint64_t));
	c->v_off = calloc(req->layers, sizeof(uint64_t));
	c->pos_off = calloc(req->layers, sizeof(uint64_t));
	c->mass = calloc((size_t)req->layers * plan.h_store, sizeof(float));
	if (!c->k_off || !c->v_off || !c->pos_off || !c->mass) {
		r = -ENOMEM;
		goto fail;
	}
	/* The level must reflect every pool change so far before admission. */
	snapkvd_server_pool_changed(s->srv);
	{
		uint64_t t_use;

		pthread_mutex_lock(&s->srv->pool.mu);
		t_use = s->tenant->used + s->tenant->reserved;
		pthread_mutex_unlock(&s->srv->pool.mu);
		r = snapkvd_ops_admit(&s->srv->ops, s->uid, t_use, region, err, errlen);
		if (r < 0)
			goto fail;
	}
	r = snapkvd_pool_reserve(&s->srv->pool, s->tenant, region, &j->resv);
	if (r < 0) {
		snapkvd_pool_explain(&s->srv->pool, s->tenant, region, r, err, errlen);
		goto fail;
	}
	r = snapkvd_arena_alloc(s->arena, region, &c->region_off);
	if (r < 0) {
		snapkvd_pool_cancel(&s->srv->pool, &j->resv);
		snprintf(err, errlen, "session arena full: %llu bytes wanted",
			 (unsigned long long)region);
		goto fail;
	}
	c->region_bytes = region;
	/* GPU arena: the region's K/V at the same offsets there; positions stay
	 * in the host arena, where APPEND and the decode slots write them */
	kv_base = s->arena->base;
	if (c->gpu_kv)
		kv_base = snapkvd_gpu_arena_base(s);
	for (uint32_t l = 0; l < req->layers; l++) {
		snapkvd_region_layer(c->region_off, req->layers, l, kv_bytes, pos_bytes, c->gpu_kv,
				     &c->k_off[l], &c->v_off[l], &c->pos_off[l]);
		j->out[l] = (struct skv_layer_out){
		    .k = {.data = kv_base + c->k_off[l],
			  .dtype = odt,
			  .head_stride = c->head_stride,
			  .token_stride = c->token_stride},
		    .v = {.data = kv_base + c->v_off[l],
			  .dtype = odt,
			  .head_stride = c->head_stride,
			  .token_stride = c->token_stride},
		    .positions = (int32_t *)(s->arena->base + c->pos_off[l]),
		    .pos_stride = slots,
		    .retained_mass = c->mass + (size_t)l * plan.h_store,
		};
	}
	(void)tmp;
	*ret = j;
	return 0;
too_big:
	snprintf(err, errlen, "compact cache of %u layers x %u heads x %u slots does not fit",
		 req->layers, plan.h_store, slots);
	r = -E2BIG;
fail:
	j->req = NULL; /* the caller still owns it on failure */
	snapkvd_job_free(j);
	return r;
}

/* GROW: the positions of every (layer, head) (host arena); decode slots -1. */
static void grow_positions(struct snapkvd_job *j)
{
	uint8_t *base = j->s->arena->base;

	for (uint32_t l = 0; l < j->g.layers; l++) {
		uint64_t k, v, p;

		snapkvd_region_layer(j->g.off, j->g.layers, l, j->g.kv_bytes, j->g.pos_bytes,
				     j->g.gpu, &k, &v, &p);
		int32_t *np = (int32_t *)(base + p);
		const int32_t *op = (const int32_t *)(base + j->g.old_pos[l]);

		for (uint32_t h = 0; h < j->g.h_store; h++) {
			memcpy(np + (size_t)h * j->g.slots, op + (size_t)h * j->g.old_slots,
			       j->g.used * 4);
			for (uint32_t i = j->g.used; i < j->g.slots; i++)
				np[(size_t)h * j->g.slots + i] = -1;
		}
	}
}

/*
 * The filled K/V rows of layer l, old region to new, as one 2-D copy per
 * tensor: HND has h_store rows of `used` slots, each head `slots` apart;
 * NHD's first `used` slots hold every head and are contiguous.
 */
static void grow_copies(const struct snapkvd_job *j, uint32_t l, uint8_t *base,
			struct skv_cuda_copy *ret_k, struct skv_cuda_copy *ret_v)
{
	size_t row = j->g.row;
	uint64_t k, v, p;

	snapkvd_region_layer(j->g.off, j->g.layers, l, j->g.kv_bytes, j->g.pos_bytes, j->g.gpu, &k,
			     &v, &p);
	*ret_k = (struct skv_cuda_copy){
	    .dst = base + k,
	    .src = base + j->g.old_k[l],
	    .width = (uint64_t)j->g.used * row * (j->g.hnd ? 1 : j->g.h_store),
	    .height = j->g.hnd ? j->g.h_store : 1,
	    .dpitch = (uint64_t)j->g.slots * row,
	    .spitch = (uint64_t)j->g.old_slots * row,
	};
	*ret_v = *ret_k;
	ret_v->dst = base + v;
	ret_v->src = base + j->g.old_v[l];
}

/* GROW in the host arena: copy the filled slots of every (layer, head). */
static void run_grow(struct snapkvd_job *j)
{
	for (uint32_t l = 0; l < j->g.layers; l++) {
		struct skv_cuda_copy cp[2];

		grow_copies(j, l, j->s->arena->base, &cp[0], &cp[1]);
		for (unsigned t = 0; t < 2; t++)
			for (uint64_t y = 0; y < cp[t].height; y++)
				memcpy((uint8_t *)cp[t].dst + y * cp[t].dpitch,
				       (const uint8_t *)cp[t].src + y * cp[t].spitch, cp[t].width);
	}
	grow_positions(j);
	j->status = 0;
}

/*
 * GROW in the GPU arena: the K/V rows are copied device to device on the
 * worker's stream, the positions on the host meanwhile. The job completes
 * only once the stream has, so the loop frees the old region after the copy.
 */
static int run_grow_gpu(struct snapkvd_worker *w, struct snapkvd_job *j, struct skv_error *kerr)
{
	const struct skv_backend_ops *o = w->c->srv->gpu->ops;
	struct skv_cuda_copy *cp = calloc((size_t)j->g.layers * 2, sizeof(*cp));
	int r;

	if (!cp) {
		snprintf(kerr->msg, sizeof(kerr->msg), "out of memory");
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < j->g.layers; l++)
		grow_copies(j, l, j->g.kv_base, &cp[2 * l], &cp[2 * l + 1]);
	r = o->ctx_copy(w->gctx, cp, j->g.layers * 2, kerr);
	free(cp);
	if (r < 0)
		return r;
	grow_positions(j);
	return o->ctx_sync(w->gctx, kerr);
}

/* when a prefill wait that starts now gives up: both kinds have the same bound */
static uint64_t wait_deadline(const struct snapkvd_job *j)
{
	return snapkvd_now_ns() + (uint64_t)j->wait_ms * 1000000u;
}

/*
 * CUDA_IPC_EVENT: poll the engine's event from the worker, and return only
 * once it has completed (0), at the deadline (-ETIMEDOUT), or when the
 * compactor stops. Nothing is on the stream meanwhile: an event cannot be
 * released from here the way a flag can, so a stream wait on it could hold
 * the worker (and any device-wide synchronisation behind it) past every
 * bound. Host polling costs at most one backoff period (1 ms) of latency; it
 * runs on the worker because the job can do nothing else until the event
 * completes, and it keeps the loop thread out of it. Once the query has seen
 * the work complete, its writes are in device memory before any kernel
 * launched afterwards, so no stream wait follows either (one would also wait
 * for a later record of the same event, an engine's next prefill).
 */
static void wait_msg_prefix(struct skv_error *kerr)
{
	char m[sizeof(kerr->msg)];

	snprintf(m, sizeof(m), "%s", kerr->msg);
	snprintf(kerr->msg, sizeof(kerr->msg), "prefill_wait: %.*s",
		 (int)sizeof(m) - (int)sizeof("prefill_wait: "), m);
}

static int wait_event(struct snapkvd_worker *w, struct snapkvd_job *j, struct skv_error *kerr)
{
	const struct skv_backend_ops *o = w->c->srv->gpu->ops;
	const uint64_t deadline = wait_deadline(j);
	struct skv_cuda_event *ev = NULL;
	uint64_t nap_ns = 50000, polls = 0;
	int r;

	r = o->event_open(w->c->srv->gpu->dev, j->wait_event, &ev, kerr);
	if (r < 0) {
		wait_msg_prefix(kerr);
		return r;
	}
	for (;;) {
		bool stop;
		uint64_t now;

		r = o->event_query(ev, kerr);
		polls++;
		if (r < 0 && r != -EAGAIN)
			wait_msg_prefix(kerr);
		if (r != -EAGAIN)
			break;
		now = snapkvd_now_ns();
		if (now >= deadline) {
			snprintf(kerr->msg, sizeof(kerr->msg),
				 "prefill_wait: IPC event not complete within %u ms (nothing was "
				 "run)",
				 j->wait_ms);
			log_warning("prefill wait: engine's IPC event not complete within %u ms "
				    "(%llu polls); job failed, nothing run",
				    j->wait_ms, (unsigned long long)polls);
			r = -ETIMEDOUT;
			break;
		}
		pthread_mutex_lock(&w->c->mu);
		stop = w->c->stop;
		pthread_mutex_unlock(&w->c->mu);
		if (stop) {
			snprintf(kerr->msg, sizeof(kerr->msg),
				 "prefill_wait: the daemon is stopping");
			r = -ECANCELED;
			break;
		}
		/* 50 us, doubling to 1 ms: a prefill that ends soon costs little
		 * latency, a long one little CPU; never past the deadline */
		uint64_t nap = deadline - now < nap_ns ? deadline - now : nap_ns;
		struct timespec ts = {(time_t)(nap / 1000000000u), (long)(nap % 1000000000u)};

		nanosleep(&ts, NULL);
		if (nap_ns < 1000000)
			nap_ns = nap_ns * 2 > 1000000 ? 1000000 : nap_ns * 2;
	}
	o->event_close(ev);
	return r;
}

/*
 * One job on the GPU: every host range the kernels touch (input buffers, the
 * output region, the mass array) is registered for the job and unregistered
 * after it; under unified addressing the kernels use the host addresses.
 */
static int run_gpu(struct snapkvd_worker *w, struct snapkvd_job *j, struct skv_error *kerr)
{
	const struct skv_backend_ops *o = w->c->srv->gpu->ops;
	struct skv_cuda_dev *dev = w->c->srv->gpu->dev;
	struct snapkvd_cache *ca = j->cache;
	struct {
		void *p;
		uint64_t n;
	} rg[j->n_bufs + 2];
	void *done[j->n_bufs + 2];
	unsigned n_rg = 0, n_done = 0;
	int r = 0;

	if (j->wait_event) { /* before anything is page-locked for the job */
		r = wait_event(w, j, kerr);
		if (r < 0)
			return r;
	}
	for (unsigned i = 0; i < j->n_bufs; i++)
		if (!j->bufs[i]->imp) /* CUDA imports are device memory already */
			rg[n_rg++] = (typeof(rg[0])){(void *)j->bufs[i]->map, j->bufs[i]->size};
	if (ca->gpu_kv) /* K/V in the GPU arena: only the positions (the region's tail) */
		rg[n_rg++] = (typeof(rg[0])){j->s->arena->base + ca->pos_off[0],
					     ca->region_off + ca->region_bytes - ca->pos_off[0]};
	else
		rg[n_rg++] = (typeof(rg[0])){j->s->arena->base + ca->region_off, ca->region_bytes};
	rg[n_rg++] = (typeof(rg[0])){ca->mass, (uint64_t)ca->layers * ca->h_store * sizeof(float)};
	for (unsigned i = 0; i < n_rg && r == 0; i++) {
		void *d = NULL;
		r = o->host_register(dev, rg[i].p, rg[i].n, &d, kerr);
		if (r == -EEXIST) { /* shares pages with a range registered above */
			r = 0;
			continue;
		}
		if (r == 0)
			done[n_done++] = rg[i].p;
		if (r == 0 && d != rg[i].p) {
			snprintf(kerr->msg, sizeof(kerr->msg),
				 "the GPU does not see host memory at its host address");
			r = -ENOTSUP;
		}
	}
	if (r == 0 && j->block_table) {
		/* the kernels read the block table once per token: into device
		 * memory of the context, on the stream, before any wait (a copy
		 * from pageable memory waits for the stream); its entries were
		 * range-checked when the job was prepared */
		void *dbt = NULL;

		r = o->ctx_upload(w->gctx, j->block_table, (uint64_t)j->req->n_block_table * 4,
				  &dbt, kerr);
		for (uint32_t l = 0; r == 0 && l < ca->layers; l++) {
			if (j->in[l].k.block_table)
				j->in[l].k.block_table = dbt;
			if (j->in[l].v.block_table)
				j->in[l].v.block_table = dbt;
		}
	}
	if (r == 0 && j->wait_flag) {
		/* armed before the wait: the emulator's stream wait blocks here */
		pthread_mutex_lock(&w->c->mu);
		w->wait_flag = j->wait_flag;
		w->wait_value = j->wait_value;
		w->wait_deadline = wait_deadline(j);
		w->wait_fired = false;
		w->wait_met = false;
		pthread_cond_signal(&w->c->wcond);
		pthread_mutex_unlock(&w->c->mu);
		r = o->ctx_wait_value(w->gctx, j->wait_flag, j->wait_value, kerr);
	}
	if (r == 0)
		r = o->compact(w->gctx, &j->shape, &j->params, ca->layers, j->in, j->out, kerr);
	if (r == 0)
		r = o->ctx_sync(w->gctx, kerr);
	if (j->wait_flag) {
		bool fired;

		pthread_mutex_lock(&w->c->mu);
		fired = w->wait_fired;
		w->wait_flag = NULL;
		pthread_mutex_unlock(&w->c->mu);
		if (fired) { /* the kernels ran on unsignalled input: discard */
			snprintf(kerr->msg, sizeof(kerr->msg),
				 "prefill_wait: flag not reached (>= %u) within %u ms",
				 j->wait_value, j->wait_ms);
			r = -ETIMEDOUT;
		}
	}
	while (n_done)
		o->host_unregister(dev, done[--n_done]);
	return r;
}

static void run_job(struct snapkvd_worker *w, struct snapkvd_job *j)
{
	struct skv_error kerr = {{0}, -1, -1};
	struct snapkvd_cache *ca = j->cache;
	uint64_t t0 = snapkvd_now_ns();

	if (j->grow && !j->g.gpu) {
		run_grow(j);
		return;
	}
	if (j->grow) {
		j->status = w->gctx ? run_grow_gpu(w, j, &kerr) : -ENOTSUP;
		if (j->status < 0)
			snprintf(j->err, sizeof(j->err), "GROW in the GPU arena: %.200s",
				 kerr.msg[0] ? kerr.msg : "no CUDA context");
		return;
	}
	if (w->gctx)
		j->status = run_gpu(w, j, &kerr);
	else
		j->status =
		    skv_compact(w->ctx, &j->shape, &j->params, ca->layers, j->in, j->out, &kerr);
	if (j->status < 0) {
		snprintf(j->err, sizeof(j->err), "%s",
			 kerr.msg[0] ? kerr.msg : "compaction failed");
		return;
	}
	/* decode slots carry position -1 until APPEND names them */
	for (uint32_t l = 0; l < ca->layers; l++)
		for (uint32_t h = 0; h < ca->h_store; h++)
			for (uint32_t i = ca->kept; i < ca->slots; i++)
				j->out[l].positions[(size_t)h * ca->slots + i] = -1;
	__atomic_add_fetch(&w->c->srv->compact_ns, snapkvd_now_ns() - t0, __ATOMIC_RELAXED);
}

static void *worker(void *arg)
{
	struct snapkvd_worker *w = arg;
	struct snapkvd_compactor *c = w->c;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct snapkvd_job *j;

		while (!c->queue && !c->stop)
			pthread_cond_wait(&c->cond, &c->mu);
		if (!c->queue)
			break; /* stop, and every queued job taken: drain is complete */
		j = c->queue;
		c->queue = j->next;
		if (!c->queue)
			c->queue_tail = &c->queue;
		c->queued--;
		pthread_mutex_unlock(&c->mu);
		run_job(w, j);
		pthread_mutex_lock(&c->mu);
		/* the mutex orders the job's writes before the loop's reap */
		j->next = c->done;
		c->done = j;
		(void)!eventfd_write(c->srv->jobs_efd, 1);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/*
 * An engine that never sets its flag must not hold a worker forever: at the
 * deadline the flag gets the value from here (under c->mu, so the worker
 * cannot drop the buffer meanwhile), the stream runs on and the job fails
 * with -ETIMEDOUT.
 */
static void *waiter(void *arg)
{
	struct snapkvd_compactor *c = arg;
	const struct skv_backend_ops *o = c->srv->gpu->ops;

	pthread_mutex_lock(&c->mu);
	while (!c->waiter_stop) {
		uint64_t now = snapkvd_now_ns(), next = UINT64_MAX;

		for (unsigned i = 0; i < c->n_workers; i++) {
			struct snapkvd_worker *w = &c->w[i];
			struct skv_error kerr = {{0}, -1, -1};
			int r;

			uint32_t v = 0;

			if (!w->wait_flag || w->wait_fired || w->wait_met)
				continue;
			if (now < w->wait_deadline) {
				next = w->wait_deadline < next ? w->wait_deadline : next;
				continue;
			}
			/*
			 * The deadline bounds the wait, not the kernels queued behind
			 * it: a flag the engine reached in time is neither failed
			 * -ETIMEDOUT nor overwritten (an engine's counter may be past
			 * wait_value by now)
			 */
			if (o->read_value(c->srv->gpu->dev, w->wait_flag, &v, &kerr) == 0 &&
			    v >= w->wait_value) {
				w->wait_met = true;
				continue;
			}
			w->wait_fired = true;
			r = o->signal_value(c->srv->gpu->dev, w->wait_flag, w->wait_value, &kerr);
			if (r < 0)
				log_error_errno(r, "prefill wait: could not release the stream: %s",
						kerr.msg);
			else
				log_warning("prefill wait: engine did not signal in time; stream "
					    "released");
		}
		if (next == UINT64_MAX) {
			pthread_cond_wait(&c->wcond, &c->mu);
		} else {
			struct timespec ts = {(time_t)(next / 1000000000u),
					      (long)(next % 1000000000u)};

			pthread_cond_timedwait(&c->wcond, &c->mu, &ts);
		}
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/*
 * Default worker count: min(4, max(1, threads / 8)), threads being
 * `threads` or one per core. Up to 15 threads one worker (every thread on
 * one request) gives each request the lowest latency, and few threads split
 * between workers slow every request; from 16 on, a compaction's (layer,
 * head) items rarely keep all threads busy and a second engine's request
 * gains more from its own 8+ threads than the first loses; beyond 4 workers
 * the scratch held at once grows with no latency gain.
 */
static unsigned default_workers(unsigned threads)
{
	unsigned n = threads / 8;

	return n < 1 ? 1 : n > 4 ? 4 : n;
}

int snapkvd_compactor_new(struct snapkvd_server *srv, unsigned threads, unsigned workers,
			  struct skv_error *err, struct snapkvd_compactor **ret)
{
	struct snapkvd_compactor *c = calloc(1, sizeof(*c));
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned total;
	int r;

	if (!c)
		return -ENOMEM;
	c->srv = srv;
	c->queue_tail = &c->queue;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cond, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* snapkvd_now_ns() */
		pthread_cond_init(&c->wcond, &ca);
		pthread_condattr_destroy(&ca);
	}
	total = threads ? threads : cores > 0 ? (unsigned)cores : 1;
	if (!workers)
		workers = default_workers(total);
	if (srv->gpu)
		workers = 1; /* see the top of this file */
	if (workers > total) /* asked for explicitly: every worker gets one thread */
		total = workers;
	c->w = calloc(workers, sizeof(*c->w));
	if (!c->w) {
		r = -ENOMEM;
		goto fail;
	}
	c->n_workers = workers;
	for (unsigned i = 0; i < workers; i++) {
		struct snapkvd_worker *w = &c->w[i];

		w->c = c;
		/* the remainder goes to the first workers: w[0] has the most */
		r = skv_ctx_new(total / workers + (i < total % workers), &w->ctx);
		if (r < 0)
			goto fail;
		if (srv->gpu) {
			const struct skv_backend_ops *o = srv->gpu->ops;
			struct skv_cuda_info info;

			r = o->ctx_new(srv->gpu->dev, &w->gctx, err);
			if (r < 0)
				goto fail;
			o->dev_info(srv->gpu->dev, &info);
			snprintf(c->gpu_desc, sizeof(c->gpu_desc),
				 "%s sm_%d%d, memfd cuda host-mapped", info.name, info.cc_major,
				 info.cc_minor);
		}
	}
	for (unsigned i = 0; i < workers; i++) {
		r = -pthread_create(&c->w[i].thread, NULL, worker, &c->w[i]);
		if (r < 0)
			goto fail;
		c->w[i].started = true;
	}
	if (srv->gpu) {
		r = -pthread_create(&c->waiter, NULL, waiter, c);
		if (r < 0)
			goto fail;
		c->waiter_started = true;
	}
	*ret = c;
	return 0;
fail:
	snapkvd_compactor_free(c);
	return r;
}

void snapkvd_compactor_free(struct snapkvd_compactor *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->stop = true;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->mu);
	/* workers first: one may still wait on a flag only the waiter releases
	 * (at its deadline, so shutdown takes at most prefill_wait_max_ms more) */
	for (unsigned i = 0; c->w && i < c->n_workers; i++)
		if (c->w[i].started)
			pthread_join(c->w[i].thread, NULL);
	if (c->waiter_started) {
		pthread_mutex_lock(&c->mu);
		c->waiter_stop = true;
		pthread_cond_broadcast(&c->wcond);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->waiter, NULL);
	}
	for (unsigned i = 0; c->w && i < c->n_workers; i++) {
		if (c->w[i].gctx)
			c->srv->gpu->ops->ctx_free(c->w[i].gctx);
		skv_ctx_free(c->w[i].ctx);
	}
	free(c->w);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cond);
	pthread_cond_destroy(&c->wcond);
	free(c);
}

void snapkvd_compactor_submit(struct snapkvd_compactor *c, struct snapkvd_job *j)
{
	j->next = NULL;
	pthread_mutex_lock(&c->mu);
	*c->queue_tail = j;
	c->queue_tail = &j->next;
	c->pending++;
	c->queued++;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->mu);
}

struct snapkvd_job *snapkvd_compactor_reap(struct snapkvd_compactor *c)
{
	struct snapkvd_job *list, *rev = NULL;

	pthread_mutex_lock(&c->mu);
	list = c->done;
	c->done = NULL;
	for (struct snapkvd_job *j = list; j; j = j->next)
		c->pending--;
	pthread_mutex_unlock(&c->mu);
	/* in the order they finished */
	while (list) {
		struct snapkvd_job *n = list->next;

		list->next = rev;
		rev = list;
		list = n;
	}
	return rev;
}

unsigned snapkvd_compactor_pending(struct snapkvd_compactor *c)
{
	unsigned n;

	pthread_mutex_lock(&c->mu);
	n = c->pending;
	pthread_mutex_unlock(&c->mu);
	return n;
}

unsigned snapkvd_compactor_queued(struct snapkvd_compactor *c)
{
	unsigned n;

	pthread_mutex_lock(&c->mu);
	n = c->queued;
	pthread_mutex_unlock(&c->mu);
	return n;
}

unsigned snapkvd_compactor_workers(struct snapkvd_compactor *c)
{
	return c ? c->n_workers : 0;
}

unsigned snapkvd_compactor_threads(struct snapkvd_compactor *c)
{
	return c && c->n_workers ? skv_ctx_threads(c->w[0].ctx) : 0;
}

const char *snapkvd_compactor_isa(struct snapkvd_compactor *c)
{
	if (c && c->n_workers && c->w[0].gctx)
		return c->gpu_desc;
	return c && c->n_workers && c->w[0].ctx ? skv_ctx_isa(c->w[0].ctx) : "none";
}
