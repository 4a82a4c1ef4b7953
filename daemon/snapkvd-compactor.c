// SPDX-License-Identifier: MIT
/*
 * snapkvd-compactor.c - the worker pool; see snapkvd-compactor.h.
 *
 * Each worker owns one runner context whose own thread pool spreads a
 * compaction over (layer, head) items; `threads` is split among the workers
 * (each at least one), so with several engines a small request runs beside a
 * large one instead of behind it. One worker is one compaction at a time
 * using every thread: the lowest latency per request. Results do not depend
 * on the thread count (the kernels reduce in a fixed order), so which worker
 * ran a job never shows in its output.
 *
 * On a runner with one stream per device (CUDA), there is one worker per
 * device, and each takes only its device's jobs (j->gpu): one FIFO queue
 * per device, interleaved in one list.
 */
#include "snapkvd-compactor.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "snapkvd-cache.h"
#include "snapkvd-clock.h"
#include "snapkvd-device.h"
#include "snapkvd-group.h"
#include "snapkvd-job.h"
#include "snapkvd-runner.h"

struct snapkvd_worker {
	struct snapkvd_compactor *c;
	struct snapkvd_runner_ctx *x;
	int gpu; /* the device whose jobs it takes (an index); -1: any */
	pthread_t thread;
	bool started;
};

struct snapkvd_compactor {
	struct snapkvd_runner *runner;
	struct snapkvd_groups *groups; /* where group members arrive */
	unsigned n_workers;
	struct snapkvd_worker *w; /* [n_workers]; w[0] has the most threads */
	int efd;		  /* written once per finished job */
	pthread_mutex_t mu;
	pthread_cond_t cond;
	struct snapkvd_job *queue, **queue_tail;
	struct snapkvd_job *done;
	unsigned pending; /* queued + running + done-not-reaped */
	unsigned queued;  /* not yet taken by a worker */
	bool stop;
	uint64_t busy_ns; /* atomic */
};

static void run_compact(struct snapkvd_worker *w, struct snapkvd_job *j)
{
	const struct snapkvd_runner_ops *o = w->c->runner->ops;
	struct skv_error kerr = {{0}, -1, -1};
	struct snapkvd_cache *ca = j->cache;
	uint64_t t0 = snapkvd_now_ns();

	j->status = o->compact(w->x, j, &kerr);
	if (j->status < 0) {
		snprintf(j->err, sizeof(j->err), "%s",
			 kerr.msg[0] ? kerr.msg : "compaction failed");
		return;
	}
	if (j->gm.group && !j->gm.decided) { /* a group member's first step */
		__atomic_add_fetch(&w->c->busy_ns, snapkvd_now_ns() - t0, __ATOMIC_RELAXED);
		return;
	}
	/* decode slots carry position -1 until APPEND names them (a budget
	 * mode's settle has set them, its heads at their own rows) */
	for (uint32_t l = 0; !ca->budgeted && l < ca->layers; l++)
		for (uint32_t h = 0; h < ca->h_store; h++)
			for (uint32_t i = ca->kept; i < ca->slots; i++)
				j->out[l].positions[(size_t)h * ca->slots + i] = -1;
	/* a mass C* below C_max: the region's tail is not needed */
	snapkvd_cache_shrink(ca, j->host_base, &j->geom);
	/* a region of this session's released caches: the rest reads as zero */
	if (ca->region_dirty)
		snapkvd_cache_zero_unwritten(ca, &j->geom, j->host_base);
	__atomic_add_fetch(&w->c->busy_ns, snapkvd_now_ns() - t0, __ATOMIC_RELAXED);
}

static void run_job(struct snapkvd_worker *w, struct snapkvd_job *j)
{
	struct skv_error kerr = {{0}, -1, -1};

	if (snapkvd_job_cancelled(j)) { /* its session ended, or cancelled, while it waited */
		j->status = -ECANCELED;
		snprintf(j->err, sizeof(j->err), "%s before the job ran",
			 snapkvd_job_cancel_reason(j));
		return;
	}
	if (j->kind == SNAPKVD_JOB_COMPACT) {
		run_compact(w, j);
		return;
	}
	j->status = w->c->runner->ops->grow(w->x, j, &kerr);
	if (j->status < 0)
		snprintf(j->err, sizeof(j->err), "GROW in the GPU arena: %.200s",
			 kerr.msg[0] ? kerr.msg : "no CUDA context");
}

/* A finished job to the done list (c->mu held). */
static void put_done(struct snapkvd_compactor *c, struct snapkvd_job *j)
{
	/* the mutex orders the job's writes before the loop's reap */
	j->next = c->done;
	c->done = j;
	(void)!eventfd_write(c->efd, 1);
}

/* Jobs a decision group released (c->mu held): decided ones to their
 * second step, at the head of the queue (they have waited), failed ones
 * done. */
static void route_released(struct snapkvd_compactor *c, struct snapkvd_job *list)
{
	while (list) {
		struct snapkvd_job *j = list;

		list = j->next;
		if (j->status < 0 || !j->gm.decided) {
			put_done(c, j);
			continue;
		}
		j->next = c->queue;
		if (!c->queue)
			c->queue_tail = &j->next;
		c->queue = j;
		c->queued++;
		pthread_cond_broadcast(&c->cond); /* its device's worker, whichever */
	}
}

/* The first queued job worker w takes (c->mu held), off the queue; NULL: none. */
static struct snapkvd_job *take(struct snapkvd_compactor *c, const struct snapkvd_worker *w)
{
	for (struct snapkvd_job **pp = &c->queue; *pp; pp = &(*pp)->next) {
		struct snapkvd_job *j = *pp;

		if (w->gpu >= 0 && j->gpu != (unsigned)w->gpu)
			continue;
		*pp = j->next;
		if (c->queue_tail == &j->next)
			c->queue_tail = pp;
		c->queued--;
		return j;
	}
	return NULL;
}

static void *worker(void *arg)
{
	struct snapkvd_worker *w = arg;
	struct snapkvd_compactor *c = w->c;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct snapkvd_job *j;

		while (!(j = take(c, w)) && !c->stop)
			pthread_cond_wait(&c->cond, &c->mu);
		if (!j)
			break; /* stop, and every job of its device taken: drain is complete */
		pthread_mutex_unlock(&c->mu);
		bool first_step = j->kind == SNAPKVD_JOB_COMPACT && j->gm.group && !j->gm.decided;
		run_job(w, j);
		struct snapkvd_job *released =
		    first_step ? snapkvd_groups_arrive(c->groups, j, snapkvd_now_ns()) : NULL;
		pthread_mutex_lock(&c->mu);
		if (first_step)
			route_released(c, released);
		else
			put_done(c, j);
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

static int start_workers(struct snapkvd_compactor *c, unsigned total, unsigned n_dev,
			 struct skv_error *err)
{
	unsigned workers = c->n_workers;
	int r;

	for (unsigned i = 0; i < workers; i++) {
		c->w[i].c = c;
		/* a stream per device: worker i is device i's */
		c->w[i].gpu = c->runner->ops->max_workers ? (int)(i % n_dev) : -1;
		/* the remainder goes to the first workers: w[0] has the most */
		r = c->runner->ops->ctx_new(c->runner, total / workers + (i < total % workers),
					    c->w[i].gpu < 0 ? 0 : (unsigned)c->w[i].gpu, &c->w[i].x,
					    err);
		if (r < 0)
			return r;
	}
	for (unsigned i = 0; i < workers; i++) {
		r = -pthread_create(&c->w[i].thread, NULL, worker, &c->w[i]);
		if (r < 0)
			return r;
		c->w[i].started = true;
	}
	return 0;
}

int snapkvd_compactor_new(struct snapkvd_runner *runner, unsigned threads, unsigned workers,
			  struct skv_error *err, struct snapkvd_compactor **ret)
{
	struct snapkvd_compactor *c = calloc(1, sizeof(*c));
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n_dev = snapkvd_device_count(runner->dev) ? snapkvd_device_count(runner->dev) : 1;
	unsigned total, max = runner->ops->max_workers * n_dev;
	int r;

	if (!c)
		return -ENOMEM;
	c->runner = runner;
	c->queue_tail = &c->queue;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->efd = eventfd(0, EFD_CLOEXEC);
	total = threads ? threads : cores > 0 ? (unsigned)cores : 1;
	/* more workers than the runner serves, asked for: refused by name, not
	 * clamped without a word; the default is only ever lowered */
	if (max && workers > max) {
		snprintf(err->msg, sizeof(err->msg),
			 "workers = %u is over the %s backend's maximum of %u (one stream per "
			 "device, %u device%s)",
			 workers, snapkvd_device_backend(runner->dev), max, n_dev,
			 n_dev > 1 ? "s" : "");
		r = -EINVAL;
		goto fail;
	}
	if (max && workers && workers < n_dev) {
		snprintf(err->msg, sizeof(err->msg),
			 "workers = %u is below the %s backend's one worker per device (%u "
			 "devices)",
			 workers, snapkvd_device_backend(runner->dev), n_dev);
		r = -EINVAL;
		goto fail;
	}
	if (!workers)
		workers = default_workers(total);
	if (max) /* one per device, whatever the default says */
		workers = max;
	if (workers > total) /* asked for explicitly: every worker gets one thread */
		total = workers;
	c->w = calloc(workers, sizeof(*c->w));
	if (c->efd < 0 || !c->w) {
		r = c->efd < 0 ? -errno : -ENOMEM;
		goto fail;
	}
	c->n_workers = workers;
	r = start_workers(c, total, n_dev, err);
	if (r < 0)
		goto fail;
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
	snapkvd_runner_stop(c->runner);
	for (unsigned i = 0; c->w && i < c->n_workers; i++)
		if (c->w[i].started)
			pthread_join(c->w[i].thread, NULL);
	for (unsigned i = 0; c->w && i < c->n_workers; i++)
		if (c->w[i].x)
			c->runner->ops->ctx_free(c->w[i].x);
	free(c->w);
	if (c->efd >= 0)
		close(c->efd);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->cond);
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
	pthread_cond_broadcast(&c->cond); /* its device's worker, whichever */
	pthread_mutex_unlock(&c->mu);
}

bool snapkvd_compactor_cancel(struct snapkvd_compactor *c, struct snapkvd_job *j)
{
	bool found = false;

	pthread_mutex_lock(&c->mu);
	for (struct snapkvd_job **pp = &c->queue; *pp; pp = &(*pp)->next) {
		if (*pp != j)
			continue;
		*pp = j->next;
		if (c->queue_tail == &j->next)
			c->queue_tail = pp;
		c->queued--;
		found = true;
		break;
	}
	if (found) {
		j->status = -ECANCELED;
		snprintf(j->err, sizeof(j->err), "cancelled before it ran; nothing was written");
	}
	pthread_mutex_unlock(&c->mu);
	if (!found)
		return false;
	/* a decision-group member that never ran its first step arrives as
	 * failed, so that its group fails (and its key is free) now rather
	 * than holding a member that will never come; outside c->mu, as the
	 * workers arrive */
	struct snapkvd_job *list = j;
	j->next = NULL;
	if (j->gm.size && j->gm.group && !j->gm.decided && c->groups)
		list = snapkvd_groups_arrive(c->groups, j, snapkvd_now_ns());
	snapkvd_compactor_finish(c, list);
	return true;
}

void snapkvd_compactor_set_groups(struct snapkvd_compactor *c, struct snapkvd_groups *g)
{
	c->groups = g;
}

void snapkvd_compactor_finish(struct snapkvd_compactor *c, struct snapkvd_job *list)
{
	if (!list)
		return;
	pthread_mutex_lock(&c->mu);
	while (list) {
		struct snapkvd_job *n = list->next;

		put_done(c, list);
		list = n;
	}
	pthread_mutex_unlock(&c->mu);
}

int snapkvd_compactor_fd(const struct snapkvd_compactor *c)
{
	return c->efd;
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

unsigned snapkvd_compactor_workers(const struct snapkvd_compactor *c)
{
	return c ? c->n_workers : 0;
}

unsigned snapkvd_compactor_threads(const struct snapkvd_compactor *c)
{
	return c && c->n_workers && c->w[0].x ? c->runner->ops->ctx_threads(c->w[0].x) : 0;
}

const char *snapkvd_compactor_isa(const struct snapkvd_compactor *c)
{
	return c && c->n_workers && c->w[0].x ? c->runner->ops->ctx_isa(c->w[0].x) : "none";
}

uint64_t snapkvd_compactor_busy_ns(const struct snapkvd_compactor *c)
{
	return __atomic_load_n(&c->busy_ns, __ATOMIC_RELAXED);
}
