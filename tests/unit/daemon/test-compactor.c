// SPDX-License-Identifier: MIT
/*
 * test-compactor: the worker pool (daemon/snapkvd-compactor.c) on a fake
 * runner whose compactions wait at a gate the test opens: threads split
 * among workers (the first the most), the default count, more workers
 * than the runner serves refused by name, a runner context that cannot be
 * made, jobs done in the order they finished with each failure's reason,
 * a queued job cancelled and a running one not, a job whose session ended
 * before it ran, and the drain running every queued job before free
 * returns.
 */
#include <CUnit/Basic.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-compactor.c"
#include "tests/test-skip.h"

/* ------------------------------------------------------ the fake runner */

struct snapkvd_runner_ctx {
	unsigned threads;
};

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static bool gate_open = true;
static unsigned running, ran, ctx_made, ctx_freed, stops;
static int ctx_fail_at = -1; /* the ctx_new call that fails */

static int fake_ctx_new(struct snapkvd_runner *r, unsigned threads, unsigned gpu,
			struct snapkvd_runner_ctx **ret, struct skv_error *err)
{
	(void)r;
	(void)gpu;
	if ((int)ctx_made == ctx_fail_at) {
		snprintf(err->msg, sizeof(err->msg), "no context for you");
		return -ENODEV;
	}
	*ret = calloc(1, sizeof(**ret));
	(*ret)->threads = threads;
	ctx_made++;
	return 0;
}

static void fake_ctx_free(struct snapkvd_runner_ctx *x)
{
	ctx_freed++;
	free(x);
}

static unsigned fake_threads(const struct snapkvd_runner_ctx *x)
{
	return x->threads;
}

static const char *fake_isa(const struct snapkvd_runner_ctx *x)
{
	(void)x;
	return "fake";
}

/* Waits at the gate; then j->status as the test set it in wait_value
 * (0 ok, else -errno, with a reason when wait_ms is set). */
static int run(struct snapkvd_job *j, struct skv_error *kerr)
{
	pthread_mutex_lock(&gate_mu);
	running++;
	pthread_cond_broadcast(&gate_cond);
	while (!gate_open)
		pthread_cond_wait(&gate_cond, &gate_mu);
	running--;
	ran++;
	pthread_mutex_unlock(&gate_mu);
	if (j->wait_ms)
		snprintf(kerr->msg, sizeof(kerr->msg), "boom %u", j->wait_ms);
	return -(int)j->wait_value;
}

static int fake_compact(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	(void)x;
	return run(j, kerr);
}

static int fake_grow(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	(void)x;
	return run(j, kerr);
}

static void fake_stop(struct snapkvd_runner *r)
{
	(void)r;
	stops++;
}

static struct snapkvd_runner_ops ops = {
    .ctx_new = fake_ctx_new,
    .ctx_free = fake_ctx_free,
    .ctx_threads = fake_threads,
    .ctx_isa = fake_isa,
    .compact = fake_compact,
    .grow = fake_grow,
    .stop = fake_stop,
};
static struct snapkvd_runner runner = {.ops = &ops};

static void close_gate(void)
{
	pthread_mutex_lock(&gate_mu);
	gate_open = false;
	pthread_mutex_unlock(&gate_mu);
}

static void open_gate(void)
{
	pthread_mutex_lock(&gate_mu);
	gate_open = true;
	pthread_cond_broadcast(&gate_cond);
	pthread_mutex_unlock(&gate_mu);
}

/* Until n jobs wait at the gate (no time bound: a hang is the failure). */
static void wait_running(unsigned n)
{
	pthread_mutex_lock(&gate_mu);
	while (running < n)
		pthread_cond_wait(&gate_cond, &gate_mu);
	pthread_mutex_unlock(&gate_mu);
}

/* A GROW job (no cache needed) answering status, with a reason or not. */
static struct snapkvd_job *job(int status, unsigned reason)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_GROW, NULL, &o);

	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	j->wait_value = (uint32_t)-status;
	j->wait_ms = reason;
	return j;
}

/* Reap until n jobs came back, in order, into out. */
static void reap(struct snapkvd_compactor *c, struct snapkvd_job **out, unsigned n)
{
	unsigned got = 0;

	while (got < n) {
		struct pollfd p = {.fd = snapkvd_compactor_fd(c), .events = POLLIN};
		eventfd_t v;

		CU_ASSERT_EQUAL_FATAL(poll(&p, 1, -1), 1);
		(void)!eventfd_read(p.fd, &v);
		for (struct snapkvd_job *j = snapkvd_compactor_reap(c), *nx; j; j = nx) {
			nx = j->next;
			CU_ASSERT_FATAL(got < n);
			out[got++] = j;
		}
	}
}

/* ------------------------------------------------------------- the tests */

static void test_split(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_compactor *c = NULL;

	ctx_made = ctx_freed = 0;
	CU_ASSERT_EQUAL_FATAL(snapkvd_compactor_new(&runner, 10, 3, &err, &c), 0);
	CU_ASSERT_EQUAL(snapkvd_compactor_workers(c), 3);
	CU_ASSERT_EQUAL(snapkvd_compactor_threads(c), 4); /* 4, 3, 3 */
	CU_ASSERT_EQUAL(c->w[1].x->threads, 3);
	CU_ASSERT_STRING_EQUAL(snapkvd_compactor_isa(c), "fake");
	CU_ASSERT_EQUAL(snapkvd_compactor_pending(c), 0);
	snapkvd_compactor_free(c);
	CU_ASSERT_EQUAL(ctx_freed, 3);
	/* the default: min(4, max(1, threads / 8)) */
	const unsigned threads[] = {7, 16, 31, 100}, want[] = {1, 2, 3, 4};
	for (int i = 0; i < 4; i++) {
		CU_ASSERT_EQUAL_FATAL(snapkvd_compactor_new(&runner, threads[i], 0, &err, &c), 0);
		CU_ASSERT_EQUAL(snapkvd_compactor_workers(c), want[i]);
		snapkvd_compactor_free(c);
	}
	/* more workers than threads, asked for: one thread each */
	CU_ASSERT_EQUAL_FATAL(snapkvd_compactor_new(&runner, 2, 5, &err, &c), 0);
	CU_ASSERT_EQUAL(snapkvd_compactor_workers(c), 5);
	CU_ASSERT_EQUAL(snapkvd_compactor_threads(c), 1);
	snapkvd_compactor_free(c);
	snapkvd_compactor_free(NULL);
	CU_ASSERT_EQUAL(snapkvd_compactor_workers(NULL), 0);
	CU_ASSERT_STRING_EQUAL(snapkvd_compactor_isa(NULL), "none");
}

static void test_refusals(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_compactor *c = NULL;
	struct snapkvd_device *dev = NULL;

	CU_ASSERT_EQUAL_FATAL(snapkvd_device_new("host", NULL, 0, &dev, &err), 0);
	runner.dev = dev;
	ops.max_workers = 1;
	CU_ASSERT_EQUAL(snapkvd_compactor_new(&runner, 8, 2, &err, &c), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "workers = 2 is over the host backend's maximum of 1 (one "
					"stream per device, 1 device)");
	CU_ASSERT_PTR_NULL(c);
	/* the default only lowered to it */
	CU_ASSERT_EQUAL_FATAL(snapkvd_compactor_new(&runner, 64, 0, &err, &c), 0);
	CU_ASSERT_EQUAL(snapkvd_compactor_workers(c), 1);
	CU_ASSERT_EQUAL(snapkvd_compactor_threads(c), 64);
	snapkvd_compactor_free(c);
	ops.max_workers = 0;
	runner.dev = NULL;
	snapkvd_device_free(dev);
	/* the third context fails: its reason, the two made freed */
	ctx_made = ctx_freed = 0;
	ctx_fail_at = 2;
	err.msg[0] = 0;
	CU_ASSERT_EQUAL(snapkvd_compactor_new(&runner, 8, 4, &err, &c), -ENODEV);
	CU_ASSERT_STRING_EQUAL(err.msg, "no context for you");
	CU_ASSERT_EQUAL(ctx_freed, 2);
	ctx_fail_at = -1;
}

static void test_jobs(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_compactor *c = NULL;
	struct snapkvd_job *a = job(0, 0), *b = job(-EIO, 7), *d = job(-EIO, 0), *e = job(0, 0);
	struct snapkvd_job *out[4];

	CU_ASSERT_EQUAL_FATAL(snapkvd_compactor_new(&runner, 1, 1, &err, &c), 0);
	close_gate();
	snapkvd_compactor_submit(c, a);
	wait_running(1); /* a runs, b d e wait in the queue */
	snapkvd_compactor_submit(c, b);
	snapkvd_compactor_submit(c, d);
	snapkvd_compactor_submit(c, e);
	CU_ASSERT_EQUAL(snapkvd_compactor_pending(c), 4);
	CU_ASSERT_EQUAL(snapkvd_compactor_queued(c), 3);
	/* running: not cancellable here; queued: done at once */
	CU_ASSERT_FALSE(snapkvd_compactor_cancel(c, a));
	CU_ASSERT_TRUE(snapkvd_compactor_cancel(c, e));
	CU_ASSERT_EQUAL(e->status, -ECANCELED);
	CU_ASSERT_STRING_EQUAL(e->err, "cancelled before it ran; nothing was written");
	CU_ASSERT_EQUAL(snapkvd_compactor_queued(c), 2);
	CU_ASSERT_FALSE(snapkvd_compactor_cancel(c, e)); /* not queued any more */
	open_gate();
	reap(c, out, 4);
	/* in the order they finished: e (cancelled), a, b, d */
	CU_ASSERT_PTR_EQUAL(out[0], e);
	CU_ASSERT_PTR_EQUAL(out[1], a);
	CU_ASSERT_PTR_EQUAL(out[2], b);
	CU_ASSERT_PTR_EQUAL(out[3], d);
	CU_ASSERT_EQUAL(a->status, 0);
	CU_ASSERT_EQUAL(b->status, -EIO);
	CU_ASSERT_STRING_EQUAL(b->err, "GROW in the GPU arena: boom 7");
	CU_ASSERT_STRING_EQUAL(d->err, "GROW in the GPU arena: no CUDA context");
	CU_ASSERT_EQUAL(snapkvd_compactor_pending(c), 0);
	for (int i = 0; i < 4; i++)
		snapkvd_job_free(out[i]);
	/* a job whose session ended, or that was cancelled, before it ran */
	bool ended = true;
	a = job(0, 0);
	a->cancel = &ended;
	b = job(0, 0);
	b->cancel_req = true;
	ran = 0;
	snapkvd_compactor_submit(c, a);
	snapkvd_compactor_submit(c, b);
	reap(c, out, 2);
	CU_ASSERT_EQUAL(ran, 0);
	CU_ASSERT_EQUAL(a->status, -ECANCELED);
	CU_ASSERT_STRING_EQUAL(a->err, "the session ended before the job ran");
	CU_ASSERT_STRING_EQUAL(b->err, "the request was cancelled before the job ran");
	snapkvd_job_free(a);
	snapkvd_job_free(b);
	/* jobs a group failed while parked: done like any other */
	a = job(0, 0);
	a->status = -ETIMEDOUT;
	b = job(0, 0);
	a->next = b;
	b->next = NULL;
	snapkvd_compactor_finish(c, a);
	snapkvd_compactor_finish(c, NULL);
	reap(c, out, 2);
	CU_ASSERT_EQUAL(out[0]->status + out[1]->status, -ETIMEDOUT);
	snapkvd_job_free(a);
	snapkvd_job_free(b);
	snapkvd_compactor_free(c);
}

/* free() drains: every queued job runs before it returns. */
static void test_drain(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_compactor *c = NULL;
	struct snapkvd_job *js[6];

	CU_ASSERT_EQUAL_FATAL(snapkvd_compactor_new(&runner, 2, 2, &err, &c), 0);
	ran = stops = 0;
	for (int i = 0; i < 6; i++) {
		js[i] = job(0, 0);
		snapkvd_compactor_submit(c, js[i]);
	}
	snapkvd_compactor_free(c);
	CU_ASSERT_EQUAL(ran, 6);
	CU_ASSERT_EQUAL(stops, 1);
	for (int i = 0; i < 6; i++) {
		CU_ASSERT_EQUAL(js[i]->status, 0);
		snapkvd_job_free(js[i]);
	}
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("compactor", NULL, NULL);
	CU_add_test(su, "threads split among workers", test_split);
	CU_add_test(su, "refusals: workers over the runner's, a context not made", test_refusals);
	CU_add_test(su, "jobs: order, reasons, cancel", test_jobs);
	CU_add_test(su, "free drains the queue", test_drain);
	return t_run();
}
