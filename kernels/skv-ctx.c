// SPDX-License-Identifier: MIT
/*
 * skv-ctx.c - the compaction context: thread pool, per-thread scratch storage,
 * the SIMD path chosen at run time, and the runner of one phase of a job.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "skv-driver.h"

static void run_items(struct skv_ctx *ctx, unsigned tid);

static void *worker(void *arg)
{
	struct skv_ctx *ctx = ((void **)arg)[0];
	unsigned tid = (unsigned)(uintptr_t)((void **)arg)[1];
	uint64_t seen = 0;

	free(arg);
	pthread_mutex_lock(&ctx->mu);
	for (;;) {
		while (!ctx->stop && ctx->gen == seen)
			pthread_cond_wait(&ctx->go, &ctx->mu);
		if (ctx->stop)
			break;
		seen = ctx->gen;
		pthread_mutex_unlock(&ctx->mu);
		run_items(ctx, tid);
		pthread_mutex_lock(&ctx->mu);
		if (--ctx->busy == 0)
			pthread_cond_signal(&ctx->done);
	}
	pthread_mutex_unlock(&ctx->mu);
	return NULL;
}

static const struct skv_isa *pick_isa(void)
{
	const char *force = getenv("SKV_ISA");

	__builtin_cpu_init();
	bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
		      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
	bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		    __builtin_cpu_supports("f16c");
	/* SKV_ISA lowers the choice (tests compare the paths), or asks for
	 * avx512bf16: vdpbf16ps adds each bf16 pair in another order than the
	 * FMA path, so its logits differ by rounding from the default's (and
	 * from the CUDA backend's, which the emulator tests hold bit for bit). */
	if (force && !strcmp(force, "avx512bf16"))
		return has512 && __builtin_cpu_supports("avx512bf16") ? &skv_isa_avx512bf16
		       : has512					      ? &skv_isa_avx512
		       : has2					      ? &skv_isa_avx2
								      : &skv_isa_scalar;
	if (force && !strcmp(force, "scalar"))
		return &skv_isa_scalar;
	if (force && !strcmp(force, "avx2"))
		return has2 ? &skv_isa_avx2 : &skv_isa_scalar;
	if (force && !strcmp(force, "avx512"))
		return has512 ? &skv_isa_avx512 : has2 ? &skv_isa_avx2 : &skv_isa_scalar;
	if (has512)
		return &skv_isa_avx512;
	if (has2)
		return &skv_isa_avx2;
	return &skv_isa_scalar;
}

void skv_ctx_free(struct skv_ctx *ctx)
{
	if (!ctx)
		return;
	if (ctx->started) {
		pthread_mutex_lock(&ctx->mu);
		ctx->stop = true;
		pthread_cond_broadcast(&ctx->go);
		pthread_mutex_unlock(&ctx->mu);
		for (unsigned i = 0; i < ctx->started; i++)
			pthread_join(ctx->tids[i], NULL);
	}
	pthread_mutex_destroy(&ctx->mu);
	pthread_cond_destroy(&ctx->go);
	pthread_cond_destroy(&ctx->done);
	if (ctx->ws)
		for (unsigned i = 0; i < ctx->threads; i++)
			free(ctx->ws[i].mem);
	free(ctx->ws);
	free(ctx->tids);
	free(ctx->common);
	free(ctx);
}

int skv_ctx_new(unsigned threads, struct skv_ctx **ret_ctx)
{
	struct skv_ctx *ctx;

	if (!ret_ctx)
		return -EINVAL;
	if (threads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		threads = n > 0 ? (unsigned)n : 1;
	}
	if (threads > SKV_MAX_THREADS)
		threads = SKV_MAX_THREADS;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	pthread_mutex_init(&ctx->mu, NULL);
	pthread_cond_init(&ctx->go, NULL);
	pthread_cond_init(&ctx->done, NULL);
	ctx->threads = threads;
	ctx->isa = pick_isa();
	ctx->ws = calloc(threads, sizeof(*ctx->ws));
	ctx->tids = calloc(threads, sizeof(*ctx->tids));
	if (!ctx->ws || !ctx->tids) {
		skv_ctx_free(ctx);
		return -ENOMEM;
	}
	for (unsigned i = 1; i < threads; i++) {
		void **arg = malloc(2 * sizeof(void *));
		if (!arg) {
			skv_ctx_free(ctx);
			return -ENOMEM;
		}
		arg[0] = ctx;
		arg[1] = (void *)(uintptr_t)i;
		int r = pthread_create(&ctx->tids[ctx->started], NULL, worker, arg);
		if (r) {
			free(arg);
			skv_ctx_free(ctx);
			return -r;
		}
		ctx->started++;
	}
	*ret_ctx = ctx;
	return 0;
}

void skv_ctx_set_cancel(struct skv_ctx *ctx, int (*cancelled)(void *arg), void *arg)
{
	if (!ctx)
		return;
	ctx->cancel = cancelled;
	ctx->cancel_arg = arg;
}

unsigned skv_ctx_threads(const struct skv_ctx *ctx)
{
	return ctx ? ctx->threads : 0;
}

const char *skv_ctx_isa(const struct skv_ctx *ctx)
{
	return ctx ? ctx->isa->name : NULL;
}

static void run_items(struct skv_ctx *ctx, unsigned tid)
{
	struct skv_job *jb = ctx->job;

	if (tid >= jb->nth) /* its scratch was not sized for this job */
		return;
	for (;;) {
		uint32_t u = atomic_fetch_add_explicit(&jb->next, 1, memory_order_relaxed);
		if (u >= jb->n_units)
			break;
		if (ctx->cancel && ctx->cancel(ctx->cancel_arg)) {
			/* the other threads find no unit left either */
			atomic_store_explicit(&jb->next, jb->n_units, memory_order_relaxed);
			atomic_store_explicit(&jb->cancelled, true, memory_order_relaxed);
			break;
		}
		jb->run_unit(jb, &ctx->ws[tid], u);
	}
	jb->isa->fence(); /* streamed output stores are visible before we return */
}

/* Run one phase of the job on the pool, the calling thread included. */
void skv_ctx_run(struct skv_ctx *ctx, struct skv_job *jb, int phase, uint32_t n_units)
{
	jb->phase = phase;
	jb->n_units = n_units;
	atomic_store(&jb->next, 0);
	ctx->job = jb;
	if (jb->nth > 1) {
		pthread_mutex_lock(&ctx->mu);
		ctx->gen++;
		/* every worker wakes; those at or past nth return at once */
		ctx->busy = ctx->started;
		pthread_cond_broadcast(&ctx->go);
		pthread_mutex_unlock(&ctx->mu);
	}
	run_items(ctx, 0);
	if (jb->nth > 1) {
		pthread_mutex_lock(&ctx->mu);
		while (ctx->busy)
			pthread_cond_wait(&ctx->done, &ctx->mu);
		pthread_mutex_unlock(&ctx->mu);
	}
	ctx->job = NULL;
}
