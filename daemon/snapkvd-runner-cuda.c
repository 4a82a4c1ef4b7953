// SPDX-License-Identifier: MIT
/*
 * snapkvd-runner-cuda.c - jobs on the CUDA plugin of the device
 * (snapkvd-device.h: the plugin, imports, GPU arenas and the waiter thread
 * are the device's; this file only runs jobs).
 *
 * A job's memfd buffers, its output region and its mass array are
 * page-locked and mapped for the GPU for the job's duration (zero-copy over
 * the bus; transport "memfd, cuda host-mapped"; the registrations are
 * shared by the devices' workers, snapkvd-device-hostreg.h), one worker and
 * stream per device, each running the jobs of its device (the one holding
 * their buffers: snapkvd-request.c), synchronised before the completion is
 * posted. A paged job's block table is
 * copied into device memory of the worker's context, and a GROW of a cache
 * in the GPU arena copies its rows device to device on the worker's stream,
 * as a budget mode's settle there moves its heads.
 *
 * A request may carry a prefill wait. A flag word in an engine buffer: the
 * stream waits on it before the kernels, and the waiter thread writes the
 * flag itself when the engine has not by the deadline, failing the job with
 * -ETIMEDOUT (the device's waiter, which this file arms). An engine's IPC event: the worker polls
 * it from the host and enqueues the kernels once it has completed, or fails the job at the
 * deadline.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/skv-backend.h"
#include "kernels/cuda/skv-cuda.h"
#include "snapkvd-buffer.h"
#include "snapkvd-clock.h"
#include "snapkvd-device-hostreg.h"
#include "snapkvd-device.h"
#include "snapkvd-group.h"
#include "snapkvd-job.h"
#include "snapkvd-log.h"
#include "snapkvd-runner.h"

struct cuda_runner {
	struct snapkvd_device *dev;
	struct snapkvd_hostreg *hostreg; /* every device's workers' */
	char isa[1100];
};

struct snapkvd_runner_ctx {
	struct cuda_runner *c;
	unsigned gpu;		  /* the device its stream is on (an index) */
	struct skv_cuda_dev *dev; /* that device's handle */
	struct skv_ctx *ctx;	  /* for the thread count shown in status */
	struct skv_cuda_ctx *gctx;
	/* a prefill flag wait in progress: the device's waiter releases it
	 * at its deadline */
	struct snapkvd_device_wait wait;
};

static const struct skv_backend_ops *ops_of(const struct cuda_runner *c)
{
	return snapkvd_device_ops(c->dev);
}

static int cuda_ctx_new(struct snapkvd_runner *r, unsigned threads, unsigned gpu,
			struct snapkvd_runner_ctx **ret, struct skv_error *err)
{
	struct cuda_runner *c = r->priv;
	struct snapkvd_runner_ctx *x = calloc(1, sizeof(*x));
	int e;

	if (!x)
		return -ENOMEM;
	x->c = c;
	x->gpu = gpu;
	x->dev = snapkvd_device_dev(c->dev, gpu);
	x->wait.gpu = gpu;
	e = skv_ctx_new(threads, &x->ctx);
	if (e == 0)
		e = ops_of(c)->ctx_new(x->dev, &x->gctx, err);
	if (e < 0) {
		skv_ctx_free(x->ctx);
		free(x);
		return e;
	}
	snapkvd_device_wait_add(c->dev, &x->wait);
	*ret = x;
	return 0;
}

static void cuda_ctx_free(struct snapkvd_runner_ctx *x)
{
	struct cuda_runner *c;

	if (!x)
		return;
	c = x->c;
	snapkvd_device_wait_remove(c->dev, &x->wait);
	ops_of(c)->ctx_free(x->gctx);
	skv_ctx_free(x->ctx);
	free(x);
}

static unsigned cuda_ctx_threads(const struct snapkvd_runner_ctx *x)
{
	return skv_ctx_threads(x->ctx);
}

static const char *cuda_ctx_isa(const struct snapkvd_runner_ctx *x)
{
	return x->c->isa;
}

/* when a prefill wait that starts now gives up: both kinds have the same bound */
static uint64_t wait_deadline(const struct snapkvd_job *j)
{
	return snapkvd_now_ns() + (uint64_t)j->wait_ms * 1000000u;
}

static void wait_msg_prefix(struct skv_error *kerr)
{
	char m[sizeof(kerr->msg)];

	snprintf(m, sizeof(m), "%s", kerr->msg);
	snprintf(kerr->msg, sizeof(kerr->msg), "prefill_wait: %.*s",
		 (int)sizeof(m) - (int)sizeof("prefill_wait: "), m);
}

/* One poll of the event: 0 done, -EAGAIN not yet, -ETIMEDOUT, -ECANCELED, -errno. */
static int event_poll(struct cuda_runner *c, struct skv_cuda_event *ev, const struct snapkvd_job *j,
		      uint64_t deadline, uint64_t polls, struct skv_error *kerr)
{
	int r = ops_of(c)->event_query(ev, kerr);

	if (r < 0 && r != -EAGAIN)
		wait_msg_prefix(kerr);
	if (r != -EAGAIN)
		return r;
	if (snapkvd_now_ns() >= deadline) {
		snprintf(kerr->msg, sizeof(kerr->msg),
			 "prefill_wait: IPC event not complete within %u ms (nothing was run)",
			 j->wait_ms);
		log_warning("prefill wait: engine's IPC event not complete within %u ms "
			    "(%llu polls); job failed, nothing run",
			    j->wait_ms, (unsigned long long)polls);
		return -ETIMEDOUT;
	}
	if (snapkvd_device_stopping(c->dev)) {
		snprintf(kerr->msg, sizeof(kerr->msg), "prefill_wait: the daemon is stopping");
		return -ECANCELED;
	}
	if (snapkvd_job_cancelled(j)) { /* nothing is on the stream yet */
		snprintf(kerr->msg, sizeof(kerr->msg), "prefill_wait: %s (nothing was run)",
			 snapkvd_job_cancel_reason(j));
		return -ECANCELED;
	}
	return -EAGAIN;
}

/*
 * CUDA_IPC_EVENT: poll the engine's event from the worker, and return only
 * once it has completed (0), at the deadline (-ETIMEDOUT), or when the
 * daemon stops. Nothing is on the stream meanwhile: an event cannot be
 * released from here the way a flag can, so a stream wait on it could hold
 * the worker (and any device-wide synchronisation behind it) past every
 * bound. Host polling costs at most one backoff period (1 ms) of latency; it
 * runs on the worker because the job can do nothing else until the event
 * completes, and it keeps the loop thread out of it. Once the query has seen
 * the work complete, its writes are in device memory before any kernel
 * launched afterwards, so no stream wait follows either (one would also wait
 * for a later record of the same event, an engine's next prefill).
 */
static int wait_event(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	struct cuda_runner *c = x->c;
	const uint64_t deadline = wait_deadline(j);
	struct skv_cuda_event *ev = NULL;
	uint64_t nap_ns = 50000, polls = 0;
	int r;

	r = ops_of(c)->event_open(x->dev, j->wait_event, &ev, kerr);
	if (r < 0) {
		wait_msg_prefix(kerr);
		return r;
	}
	while ((r = event_poll(c, ev, j, deadline, ++polls, kerr)) == -EAGAIN) {
		/* 50 us, doubling to 1 ms: a prefill that ends soon costs little
		 * latency, a long one little CPU; never past the deadline */
		uint64_t now = snapkvd_now_ns();
		uint64_t nap = deadline > now && deadline - now < nap_ns ? deadline - now : nap_ns;
		struct timespec ts = {(time_t)(nap / 1000000000u), (long)(nap % 1000000000u)};

		nanosleep(&ts, NULL);
		if (nap_ns < 1000000)
			nap_ns = nap_ns * 2 > 1000000 ? 1000000 : nap_ns * 2;
	}
	ops_of(c)->event_close(ev);
	return r;
}

/*
 * Every host range the kernels touch (input buffers, the output region, the
 * mass array) held registered for the job; under unified addressing the
 * kernels use the host addresses. The holds go into done[].
 */
static int register_ranges(struct snapkvd_runner_ctx *x, struct snapkvd_job *j,
			   struct snapkvd_hostreg_hold **done, unsigned *n_done,
			   struct skv_error *kerr)
{
	struct snapkvd_cache *ca = j->cache;
	struct {
		void *p;
		uint64_t n;
	} rg[j->n_bufs + 2];
	unsigned n_rg = 0;
	int r = 0;

	for (unsigned i = 0; i < j->n_bufs; i++)
		if (!j->bufs[i]->imp) /* CUDA imports are device memory already */
			rg[n_rg++] = (typeof(rg[0])){(void *)j->bufs[i]->map, j->bufs[i]->size};
	if (ca->gpu_kv) /* K/V in the GPU arena: only the positions (the region's tail) */
		rg[n_rg++] = (typeof(rg[0])){j->host_base + ca->pos_off[0],
					     ca->region_off + ca->region_bytes - ca->pos_off[0]};
	else
		rg[n_rg++] = (typeof(rg[0])){j->host_base + ca->region_off, ca->region_bytes};
	rg[n_rg++] = (typeof(rg[0])){ca->mass, (uint64_t)ca->layers * ca->h_store * sizeof(float)};
	for (unsigned i = 0; i < n_rg && r == 0; i++) {
		r = snapkvd_hostreg_hold(x->c->hostreg, x->dev, rg[i].p, rg[i].n, &done[*n_done],
					 kerr);
		if (r == 0)
			(*n_done)++;
	}
	return r;
}

/*
 * The kernels read the block table once per token: into device memory of
 * the context, on the stream, before any wait (a copy from pageable memory
 * waits for the stream); its entries were range-checked by the request.
 */
static int upload_block_table(struct snapkvd_runner_ctx *x, struct snapkvd_job *j,
			      struct skv_error *kerr)
{
	/* one upload (the context keeps one device copy): the input table,
	 * then a paged output's table (staged before ctx_upload returns) */
	uint64_t n_in = j->block_table ? j->n_block_table : 0, n_out = j->n_out_table;
	int32_t *both = malloc((n_in + n_out) * 4);
	void *dbt = NULL;
	int r;

	if (!both) {
		snprintf(kerr->msg, sizeof(kerr->msg), "out of memory");
		return -ENOMEM;
	}
	if (n_in)
		memcpy(both, j->block_table, n_in * 4);
	if (n_out)
		memcpy(both + n_in, j->out_table, n_out * 4);
	r = ops_of(x->c)->ctx_upload(x->gctx, both, (n_in + n_out) * 4, &dbt, kerr);
	free(both);
	for (uint32_t l = 0; r == 0 && l < j->layers; l++) {
		if (j->in[l].k.block_table)
			j->in[l].k.block_table = dbt;
		if (j->in[l].v.block_table)
			j->in[l].v.block_table = dbt;
		if (j->out[l].k.block_table)
			j->out[l].k.block_table = (const int32_t *)dbt + n_in;
		if (j->out[l].v.block_table)
			j->out[l].v.block_table = (const int32_t *)dbt + n_in;
	}
	return r;
}

/* The waiter's stop(): the job was cancelled, or its session ended. */
static bool wait_stop(const void *arg)
{
	return snapkvd_job_cancelled(arg);
}

/* A CUDA_FLAG wait on the stream, armed for the waiter before it is
 * enqueued (the emulator's stream wait blocks here). A cancel releases it
 * early: the kernels behind it then run on whatever the buffers hold. */
static int wait_flag(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	struct cuda_runner *c = x->c;

	x->wait.stop = wait_stop;
	x->wait.stop_arg = j;
	snapkvd_device_wait_arm(c->dev, &x->wait, j->wait_flag, j->wait_value, wait_deadline(j));
	return ops_of(c)->ctx_wait_value(x->gctx, j->wait_flag, j->wait_value, kerr);
}

/* The flag wait is over: -ETIMEDOUT when the waiter had to release it
 * (the kernels ran on unsignalled input: discard), else r. */
static int wait_flag_done(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, int r,
			  struct skv_error *kerr)
{
	if (!snapkvd_device_wait_disarm(x->c->dev, &x->wait))
		return r;
	if (x->wait.stopped) {
		snprintf(kerr->msg, sizeof(kerr->msg),
			 "prefill_wait: %s while waiting for the flag; the stream was released",
			 snapkvd_job_cancel_reason(j));
		return -ECANCELED;
	}
	snprintf(kerr->msg, sizeof(kerr->msg),
		 "prefill_wait: flag not reached (>= %u) within %u ms", j->wait_value, j->wait_ms);
	return -ETIMEDOUT;
}

/*
 * A budget mode's heads, once its kernels are done: settled in the host
 * arena there, or with K/V in the GPU arena (at the offsets the host arena
 * has: kv_base is the GPU arena's base) the positions on the host and each
 * head's K/V rows moved down its layer on the worker's stream, in order
 * (ctx_copy stages a move whose source and destination overlap).
 */
static int budget_settle(struct snapkvd_runner_ctx *x, struct snapkvd_job *j,
			 const struct skv_budget_result *res, struct skv_cuda_copy *moves,
			 struct skv_error *kerr)
{
	struct snapkvd_cache *ca = j->cache;
	uint8_t *kv_base = ca->gpu_kv ? (uint8_t *)j->out[0].k.data - ca->k_off[0] : j->host_base;
	uint32_t n = snapkvd_cache_budget_done(ca, res, kv_base, j->host_base, moves);
	int r;

	if (!n)
		return 0;
	r = ops_of(x->c)->ctx_copy(x->gctx, moves, n, kerr);
	if (r == 0)
		r = ops_of(x->c)->ctx_sync(x->gctx, kerr);
	if (r < 0) {
		char m[sizeof(kerr->msg)];

		snprintf(m, sizeof(m), "%s", kerr->msg);
		snprintf(kerr->msg, sizeof(kerr->msg),
			 "budget mode %s, heads in the GPU arena: %.*s",
			 skv_budget_name(j->params.budget_mode), (int)sizeof(m) - 64, m);
	}
	return r;
}

/*
 * The kernels of a job, enqueued: 1 when there are none to run. A
 * decision-group member (snapkvd-group.h) runs a whole compaction for its
 * own choice first (the group reads it from j->gm); once the group has
 * decided, one for the group's C* and fallback, unless that is its own:
 * then its first step's outputs and result stand.
 */
static int enqueue_kernels(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, bool budget,
			   struct skv_budget_result *res, struct skv_error *kerr)
{
	const struct skv_backend_ops *o = ops_of(x->c);
	const struct snapkvd_group_member *m = &j->gm;

	if (m->group && m->decided) {
		if (m->c_star == m->own_c_star && m->fallback == m->own_fallback) {
			res->c_star = m->own_c_star;
			res->fallback = m->own_fallback;
			res->min_mass = m->own_min_mass;
			return 1;
		}
		if (!o->compact_decided) {
			snprintf(kerr->msg, sizeof(kerr->msg),
				 "decision group '%s': the CUDA plugin has no decided compaction",
				 m->key);
			return -EOPNOTSUPP;
		}
		return o->compact_decided(x->gctx, &j->shape, &j->params, j->layers, j->in, j->out,
					  m->c_star, m->fallback, res, kerr);
	}
	if (budget)
		return o->compact_budget(x->gctx, &j->shape, &j->params, j->layers, j->in, j->out,
					 res, kerr);
	return o->compact(x->gctx, &j->shape, &j->params, j->layers, j->in, j->out, kerr);
}

/* A group member's first step is done: its own choice, for the group. */
static void note_own_choice(struct snapkvd_job *j, bool budget, const struct skv_budget_result *res)
{
	j->gm.gpu_step = true;
	/* not budgeted: uniform without a fallback, C for every member */
	j->gm.own_c_star = budget ? res->c_star : j->params.capacity;
	j->gm.own_fallback = budget && res->fallback;
	j->gm.own_min_mass = budget ? res->min_mass : 1.0f;
}

/* The job's device, counted; -EXDEV on another device's worker (never:
 * the compactor's queues). */
static int on_device(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	struct cuda_runner *c = x->c;

	if (j->gpu != x->gpu) {
		snprintf(kerr->msg, sizeof(kerr->msg), "a job of device %d on device %d's worker",
			 snapkvd_device_ordinal(c->dev, j->gpu),
			 snapkvd_device_ordinal(c->dev, x->gpu));
		return -EXDEV;
	}
	snapkvd_device_job_ran(c->dev, x->gpu);
	return 0;
}

static int cuda_compact(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	struct cuda_runner *c = x->c;
	struct snapkvd_hostreg_hold *done[j->n_bufs + 2];
	unsigned n_done = 0;
	struct snapkvd_cache *ca = j->cache;
	const bool budget = ca && ca->budgeted;
	const bool first_step = j->gm.group && !j->gm.decided;
	/* a group's second step: the prefill was waited for in the first */
	const bool waits = !(j->gm.group && j->gm.decided);
	struct skv_budget_result res = {.result_size = sizeof(res), .kept = ca ? ca->hkept : NULL};
	struct skv_cuda_copy *moves = NULL;
	int r;

	if (budget && !ops_of(c)->compact_budget) {
		snprintf(kerr->msg, sizeof(kerr->msg),
			 "budget mode %s: the CUDA plugin has no budget kernels",
			 skv_budget_name(j->params.budget_mode));
		return -EOPNOTSUPP;
	}
	r = on_device(x, j, kerr);
	if (r < 0)
		return r;
	/* K/V in the GPU arena: the heads' moves of the settle, before any work */
	if (budget && ca->gpu_kv && !first_step &&
	    !(moves = calloc((size_t)ca->layers * ca->h_store * 2, sizeof(*moves)))) {
		snprintf(kerr->msg, sizeof(kerr->msg), "out of memory");
		return -ENOMEM;
	}
	if (waits && j->has_event) { /* before anything is page-locked for the job */
		r = wait_event(x, j, kerr);
		if (r < 0) {
			free(moves);
			return r;
		}
	}
	r = register_ranges(x, j, done, &n_done, kerr);
	if (r == 0 && (j->block_table || j->n_out_table))
		r = upload_block_table(x, j, kerr);
	if (r == 0 && waits && j->wait_flag)
		r = wait_flag(x, j, kerr);
	/* from here the stream may write the output; the job completes only
	 * after ctx_sync, so nothing of it lands after its completion */
	if (r == 0)
		snapkvd_job_mark_writing(j);
	if (r == 0)
		r = enqueue_kernels(x, j, budget, &res, kerr);
	if (r == 0)
		r = ops_of(c)->ctx_sync(x->gctx, kerr);
	else if (r == 1) /* nothing enqueued */
		r = 0;
	if (waits && j->wait_flag)
		r = wait_flag_done(x, j, r, kerr);
	while (n_done)
		snapkvd_hostreg_release(c->hostreg, x->dev, done[--n_done]);
	if (r == 0 && first_step)
		note_own_choice(j, budget, &res);
	else if (r == 0 && budget) /* res is filled once the stream is done */
		r = budget_settle(x, j, &res, moves, kerr);
	free(moves);
	return r;
}

/*
 * GROW in the GPU arena: the K/V rows are copied device to device on the
 * worker's stream (a ragged cache's head by head, each to its new start),
 * the positions on the host meanwhile. The job completes only once the
 * stream has, so the loop frees the old region after the copy. A cache in
 * the host arena is copied on the host.
 */
static int cuda_grow(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	struct skv_cuda_copy *cp;
	uint32_t n = 0;
	int r;

	if (!j->g.gpu) {
		snapkvd_grow_host(&j->g, j->host_base);
		return 0;
	}
	cp = calloc((size_t)j->g.layers * snapkvd_grow_n_copies(&j->g), sizeof(*cp));
	if (!cp) {
		snprintf(kerr->msg, sizeof(kerr->msg), "out of memory");
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < j->g.layers; l++)
		n += snapkvd_grow_copies(&j->g, l, j->g.kv_base, cp + n);
	r = ops_of(x->c)->ctx_copy(x->gctx, cp, n, kerr);
	free(cp);
	if (r < 0)
		return r;
	snapkvd_grow_positions(&j->g, j->host_base);
	return ops_of(x->c)->ctx_sync(x->gctx, kerr);
}

static void cuda_stop(struct snapkvd_runner *r)
{
	struct cuda_runner *c = r->priv;

	snapkvd_device_stop(c->dev);
}

static void cuda_free(struct snapkvd_runner *r)
{
	struct cuda_runner *c = r->priv;

	if (c)
		snapkvd_hostreg_free(c->hostreg);
	free(c);
	r->priv = NULL;
}

static const struct snapkvd_runner_ops cuda_ops = {
    .max_workers = 1,
    .ctx_new = cuda_ctx_new,
    .ctx_free = cuda_ctx_free,
    .ctx_threads = cuda_ctx_threads,
    .ctx_isa = cuda_ctx_isa,
    .compact = cuda_compact,
    .grow = cuda_grow,
    .stop = cuda_stop,
    .free = cuda_free,
};

int snapkvd_runner_cuda_new(struct snapkvd_runner *r, struct skv_error *kerr)
{
	struct cuda_runner *c = calloc(1, sizeof(*c));

	(void)kerr;
	if (!c || snapkvd_hostreg_new(snapkvd_device_ops(r->dev), &c->hostreg) < 0) {
		free(c);
		return -ENOMEM;
	}
	c->dev = r->dev;
	snprintf(c->isa, sizeof(c->isa), "%s, memfd cuda host-mapped", snapkvd_device_desc(c->dev));
	snprintf(r->desc, sizeof(r->desc), "cuda: %s", c->isa);
	r->ops = &cuda_ops;
	r->priv = c;
	return 0;
}
