// SPDX-License-Identifier: MIT
/*
 * snapkvd-runner-cuda.c - jobs on the CUDA plugin (kernels/cuda, dlopen()ed:
 * no CUDA library is linked into snapkvd), and what lives on the device:
 * engine buffer imports and the sessions' GPU arenas.
 *
 * A job's memfd buffers, its output region and its mass array are
 * page-locked and mapped for the GPU for the job's duration (zero-copy over
 * the bus; transport "memfd, cuda host-mapped"), one stream per worker,
 * synchronised before the completion is posted. A paged job's block table is
 * copied into device memory of the worker's context, and a GROW of a cache
 * in the GPU arena copies its rows device to device on the worker's stream,
 * as a budget mode's settle there moves its heads.
 *
 * A request may carry a prefill wait. A flag word in an engine buffer: the
 * stream waits on it before the kernels, and the waiter thread writes the
 * flag itself when the engine has not by the deadline, failing the job with
 * -ETIMEDOUT. An engine's IPC event: the worker polls it from the host and
 * enqueues the kernels once it has completed, or fails the job at the
 * deadline.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/skv-backend.h"
#include "kernels/cuda/skv-cuda.h"
#include "snapkvd-buffer.h"
#include "snapkvd-clock.h"
#include "snapkvd-job.h"
#include "snapkvd-log.h"
#include "snapkvd-runner.h"

struct cuda_runner {
	struct skv_backend *gpu;
	char isa[320];
	atomic_bool stopping;
	/* the thread that releases prefill waits past their deadline (its own
	 * thread: the loop thread may block in a device-wide synchronisation,
	 * e.g. releasing an import, behind the very wait) */
	pthread_mutex_t mu;
	pthread_cond_t wcond; /* CLOCK_MONOTONIC */
	pthread_t waiter;
	bool waiter_started, waiter_stop;
	struct snapkvd_runner_ctx *ctxs; /* under mu, for the waiter */
};

struct snapkvd_runner_ctx {
	struct cuda_runner *c;
	struct skv_ctx *ctx; /* for the thread count shown in status */
	struct skv_cuda_ctx *gctx;
	/* a prefill wait in progress (under c->mu): the waiter releases it at
	 * wait_deadline by writing wait_value into wait_flag, unless the flag
	 * holds it by then (wait_met: the kernels behind it may still run) */
	void *wait_flag;
	uint32_t wait_value;
	uint64_t wait_deadline;
	bool wait_fired, wait_met;
	struct snapkvd_runner_ctx *next;
};

static const struct skv_backend_ops *ops_of(const struct cuda_runner *c)
{
	return c->gpu->ops;
}

static int cuda_ctx_new(struct snapkvd_runner *r, unsigned threads, struct snapkvd_runner_ctx **ret,
			struct skv_error *err)
{
	struct cuda_runner *c = r->priv;
	struct snapkvd_runner_ctx *x = calloc(1, sizeof(*x));
	int e;

	if (!x)
		return -ENOMEM;
	x->c = c;
	e = skv_ctx_new(threads, &x->ctx);
	if (e == 0)
		e = ops_of(c)->ctx_new(c->gpu->dev, &x->gctx, err);
	if (e < 0) {
		skv_ctx_free(x->ctx);
		free(x);
		return e;
	}
	pthread_mutex_lock(&c->mu);
	x->next = c->ctxs;
	c->ctxs = x;
	pthread_mutex_unlock(&c->mu);
	*ret = x;
	return 0;
}

static void cuda_ctx_free(struct snapkvd_runner_ctx *x)
{
	struct cuda_runner *c;

	if (!x)
		return;
	c = x->c;
	pthread_mutex_lock(&c->mu);
	for (struct snapkvd_runner_ctx **pp = &c->ctxs; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			break;
		}
	pthread_mutex_unlock(&c->mu);
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
	if (atomic_load(&c->stopping)) {
		snprintf(kerr->msg, sizeof(kerr->msg), "prefill_wait: the daemon is stopping");
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
static int wait_event(struct cuda_runner *c, struct snapkvd_job *j, struct skv_error *kerr)
{
	const uint64_t deadline = wait_deadline(j);
	struct skv_cuda_event *ev = NULL;
	uint64_t nap_ns = 50000, polls = 0;
	int r;

	r = ops_of(c)->event_open(c->gpu->dev, j->wait_event, &ev, kerr);
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
 * mass array) registered for the job; under unified addressing the kernels
 * use the host addresses. The ones registered go into done[].
 */
static int register_ranges(struct cuda_runner *c, struct snapkvd_job *j, void **done,
			   unsigned *n_done, struct skv_error *kerr)
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
		void *d = NULL;

		r = ops_of(c)->host_register(c->gpu->dev, rg[i].p, rg[i].n, &d, kerr);
		if (r == -EEXIST) { /* shares pages with a range registered above */
			r = 0;
			continue;
		}
		if (r == 0)
			done[(*n_done)++] = rg[i].p;
		if (r == 0 && d != rg[i].p) {
			snprintf(kerr->msg, sizeof(kerr->msg),
				 "the GPU does not see host memory at its host address");
			r = -ENOTSUP;
		}
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

/* A CUDA_FLAG wait on the stream, armed for the waiter before it is
 * enqueued (the emulator's stream wait blocks here). */
static int wait_flag(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	struct cuda_runner *c = x->c;

	pthread_mutex_lock(&c->mu);
	x->wait_flag = j->wait_flag;
	x->wait_value = j->wait_value;
	x->wait_deadline = wait_deadline(j);
	x->wait_fired = false;
	x->wait_met = false;
	pthread_cond_signal(&c->wcond);
	pthread_mutex_unlock(&c->mu);
	return ops_of(c)->ctx_wait_value(x->gctx, j->wait_flag, j->wait_value, kerr);
}

/* The flag wait is over: -ETIMEDOUT when the waiter had to release it
 * (the kernels ran on unsignalled input: discard), else r. */
static int wait_flag_done(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, int r,
			  struct skv_error *kerr)
{
	bool fired;

	pthread_mutex_lock(&x->c->mu);
	fired = x->wait_fired;
	x->wait_flag = NULL;
	pthread_mutex_unlock(&x->c->mu);
	if (!fired)
		return r;
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

static int cuda_compact(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	struct cuda_runner *c = x->c;
	void *done[j->n_bufs + 2];
	unsigned n_done = 0;
	struct snapkvd_cache *ca = j->cache;
	const bool budget = ca && ca->budgeted;
	struct skv_budget_result res = {.result_size = sizeof(res), .kept = ca ? ca->hkept : NULL};
	struct skv_cuda_copy *moves = NULL;
	int r;

	if (budget && !ops_of(c)->compact_budget) {
		snprintf(kerr->msg, sizeof(kerr->msg),
			 "budget mode %s: the CUDA plugin has no budget kernels",
			 skv_budget_name(j->params.budget_mode));
		return -EOPNOTSUPP;
	}
	/* K/V in the GPU arena: the heads' moves of the settle, before any work */
	if (budget && ca->gpu_kv &&
	    !(moves = calloc((size_t)ca->layers * ca->h_store * 2, sizeof(*moves)))) {
		snprintf(kerr->msg, sizeof(kerr->msg), "out of memory");
		return -ENOMEM;
	}
	if (j->has_event) { /* before anything is page-locked for the job */
		r = wait_event(c, j, kerr);
		if (r < 0) {
			free(moves);
			return r;
		}
	}
	r = register_ranges(c, j, done, &n_done, kerr);
	if (r == 0 && (j->block_table || j->n_out_table))
		r = upload_block_table(x, j, kerr);
	if (r == 0 && j->wait_flag)
		r = wait_flag(x, j, kerr);
	if (r == 0 && budget)
		r = ops_of(c)->compact_budget(x->gctx, &j->shape, &j->params, j->layers, j->in,
					      j->out, &res, kerr);
	else if (r == 0)
		r = ops_of(c)->compact(x->gctx, &j->shape, &j->params, j->layers, j->in, j->out,
				       kerr);
	if (r == 0)
		r = ops_of(c)->ctx_sync(x->gctx, kerr);
	if (j->wait_flag)
		r = wait_flag_done(x, j, r, kerr);
	while (n_done)
		ops_of(c)->host_unregister(c->gpu->dev, done[--n_done]);
	if (r == 0 && budget) /* res is filled once the stream is done */
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

/*
 * The deadline bounds the wait, not the kernels queued behind it: a flag
 * the engine reached in time is neither failed -ETIMEDOUT nor overwritten
 * (an engine's counter may be past wait_value by now). Under c->mu, so the
 * worker cannot drop the buffer meanwhile.
 */
static void release_wait(struct cuda_runner *c, struct snapkvd_runner_ctx *x)
{
	struct skv_error kerr = {{0}, -1, -1};
	uint32_t v = 0;
	int r;

	if (ops_of(c)->read_value(c->gpu->dev, x->wait_flag, &v, &kerr) == 0 &&
	    v >= x->wait_value) {
		x->wait_met = true;
		return;
	}
	x->wait_fired = true;
	r = ops_of(c)->signal_value(c->gpu->dev, x->wait_flag, x->wait_value, &kerr);
	if (r < 0)
		log_error_errno(r, "prefill wait: could not release the stream: %s", kerr.msg);
	else
		log_warning("prefill wait: engine did not signal in time; stream released");
}

/*
 * An engine that never sets its flag must not hold a worker forever: at the
 * deadline the flag gets the value from here, the stream runs on and the job
 * fails with -ETIMEDOUT.
 */
static void *waiter(void *arg)
{
	struct cuda_runner *c = arg;

	pthread_mutex_lock(&c->mu);
	while (!c->waiter_stop) {
		uint64_t now = snapkvd_now_ns(), next = UINT64_MAX;

		for (struct snapkvd_runner_ctx *x = c->ctxs; x; x = x->next) {
			if (!x->wait_flag || x->wait_fired || x->wait_met)
				continue;
			if (now < x->wait_deadline)
				next = x->wait_deadline < next ? x->wait_deadline : next;
			else
				release_wait(c, x);
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

static int cuda_import(struct snapkvd_runner *r, uint64_t session_id, uint64_t key, int fd,
		       uint64_t size, const void *ipc_handle, struct snapkvd_import *ret,
		       struct skv_error *kerr)
{
	struct cuda_runner *c = r->priv;
	struct skv_cuda_import *imp = NULL;
	int e;

	/*
	 * The plugin shares the import of a repeated (tenant, key). A repeated
	 * generation of a live buffer never gets here (the session counts it
	 * on that buffer), so a match in the plugin could only be generation 0
	 * ("none") again or a generation unregistered while a job still holds
	 * its import: both name another allocation, which must not be read
	 * through the old mapping. The key is therefore the buffer id the
	 * buffer will get, never reused within the session.
	 */
	if (fd >= 0)
		e = ops_of(c)->import_fd(c->gpu->dev, session_id, key, fd, size, &imp, kerr);
	else
		e = ops_of(c)->import_ipc(c->gpu->dev, session_id, key, ipc_handle, &imp, kerr);
	if (e < 0)
		return e;
	*ret = (struct snapkvd_import){
	    .imp = imp,
	    .ptr = ops_of(c)->import_ptr(imp),
	    .size = ops_of(c)->import_size(imp),
	    .transport = ops_of(c)->import_transport(imp),
	};
	return 0;
}

static void cuda_import_release(struct snapkvd_runner *r, void *imp)
{
	/* the plugin synchronises the device before the last reference unmaps */
	ops_of(r->priv)->import_release(imp);
}

static int cuda_arena_new(struct snapkvd_runner *r, uint64_t size, struct skv_cuda_arena **ret,
			  struct skv_error *kerr)
{
	struct cuda_runner *c = r->priv;

	return ops_of(c)->arena_new(c->gpu->dev, size, ret, kerr);
}

/* ret_fd NULL: the size only. */
static int cuda_arena_export(struct snapkvd_runner *r, struct skv_cuda_arena *a, int *ret_fd,
			     uint64_t *ret_size, int *ret_device, struct skv_error *kerr)
{
	struct cuda_runner *c = r->priv;
	struct skv_cuda_info info;
	int e, fd;

	*ret_size = ops_of(c)->arena_size(a);
	if (!ret_fd)
		return 0;
	e = ops_of(c)->arena_export_fd(a, &fd, kerr);
	if (e < 0)
		return e;
	ops_of(c)->dev_info(c->gpu->dev, &info);
	*ret_fd = fd;
	*ret_device = info.device;
	return 0;
}

static uint8_t *cuda_arena_base(struct snapkvd_runner *r, struct skv_cuda_arena *a)
{
	return ops_of(r->priv)->arena_ptr(a);
}

static void cuda_arena_free(struct snapkvd_runner *r, struct skv_cuda_arena *a)
{
	ops_of(r->priv)->arena_free(a);
}

static void cuda_stop(struct snapkvd_runner *r)
{
	struct cuda_runner *c = r->priv;

	atomic_store(&c->stopping, true);
}

/* After the workers: one may still wait on a flag only the waiter releases
 * (at its deadline, so shutdown takes at most prefill_wait_max_ms more). */
static void cuda_free(struct snapkvd_runner *r)
{
	struct cuda_runner *c = r->priv;

	if (!c)
		return;
	if (c->waiter_started) {
		pthread_mutex_lock(&c->mu);
		c->waiter_stop = true;
		pthread_cond_broadcast(&c->wcond);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->waiter, NULL);
	}
	skv_backend_unload(c->gpu);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->wcond);
	free(c);
	r->priv = NULL;
}

static const struct snapkvd_runner_ops cuda_ops = {
    .device = true,
    .max_workers = 1,
    .ctx_new = cuda_ctx_new,
    .ctx_free = cuda_ctx_free,
    .ctx_threads = cuda_ctx_threads,
    .ctx_isa = cuda_ctx_isa,
    .compact = cuda_compact,
    .grow = cuda_grow,
    .import = cuda_import,
    .import_release = cuda_import_release,
    .arena_new = cuda_arena_new,
    .arena_export = cuda_arena_export,
    .arena_base = cuda_arena_base,
    .arena_free = cuda_arena_free,
    .stop = cuda_stop,
    .free = cuda_free,
};

int snapkvd_runner_cuda_new(struct snapkvd_runner *r, struct skv_error *kerr)
{
	struct cuda_runner *c = calloc(1, sizeof(*c));
	pthread_condattr_t ca;
	struct skv_cuda_info info;
	int e;

	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* snapkvd_now_ns() */
	pthread_cond_init(&c->wcond, &ca);
	pthread_condattr_destroy(&ca);
	r->ops = &cuda_ops;
	r->priv = c;
	e = skv_backend_load(NULL, -1, &c->gpu, kerr);
	if (e < 0) {
		char m[sizeof(kerr->msg)];

		snprintf(m, sizeof(m), "%s", kerr->msg);
		snprintf(kerr->msg, sizeof(kerr->msg), "backend cuda: %.*s",
			 (int)sizeof(m) - (int)sizeof("backend cuda: "), m);
		cuda_free(r);
		return e;
	}
	ops_of(c)->dev_info(c->gpu->dev, &info);
	snprintf(c->isa, sizeof(c->isa), "%s sm_%d%d, memfd cuda host-mapped", info.name,
		 info.cc_major, info.cc_minor);
	snprintf(r->desc, sizeof(r->desc), "cuda: %s", c->isa);
	e = -pthread_create(&c->waiter, NULL, waiter, c);
	if (e < 0) {
		cuda_free(r);
		return e;
	}
	c->waiter_started = true;
	return 0;
}
