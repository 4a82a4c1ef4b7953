// SPDX-License-Identifier: MIT
/*
 * snapkvd-runner-host.c - jobs on the CPU kernels (libskv): one skv_ctx per
 * worker, whose thread pool spreads a compaction over (layer, head) items.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "snapkvd-job.h"
#include "snapkvd-runner.h"

struct snapkvd_runner_ctx {
	struct skv_ctx *ctx;
};

static int host_ctx_new(struct snapkvd_runner *r, unsigned threads, unsigned gpu,
			struct snapkvd_runner_ctx **ret, struct skv_error *err)
{
	struct snapkvd_runner_ctx *x = calloc(1, sizeof(*x));
	int e;

	(void)r;
	(void)gpu; /* one kind of worker: every job runs anywhere */
	(void)err;
	if (!x)
		return -ENOMEM;
	e = skv_ctx_new(threads, &x->ctx);
	if (e < 0) {
		free(x);
		return e;
	}
	*ret = x;
	return 0;
}

static void host_ctx_free(struct snapkvd_runner_ctx *x)
{
	if (!x)
		return;
	skv_ctx_free(x->ctx);
	free(x);
}

static unsigned host_ctx_threads(const struct snapkvd_runner_ctx *x)
{
	return skv_ctx_threads(x->ctx);
}

static const char *host_ctx_isa(const struct snapkvd_runner_ctx *x)
{
	return skv_ctx_isa(x->ctx);
}

/*
 * Layers are independent: a job runs in groups of layers, and between two
 * groups (the safe point) it stops when its session has ended, so a long
 * job of a closed session does not hold the worker for the rest of it.
 */
#define HOST_LAYERS_PER_STEP 8

/*
 * A budget mode (SPEC.md "Budgets beyond one C"): one call over every layer
 * (mass chooses C* over the whole cache), the per-head counts into the
 * job's cache (its own until the job is done), then the heads packed or
 * laid out ragged in the region.
 */
static int host_compact_budget(struct snapkvd_runner_ctx *x, struct snapkvd_job *j,
			       struct skv_error *kerr)
{
	struct snapkvd_cache *c = j->cache;
	struct skv_budget_result res = {.result_size = sizeof(res), .kept = c->hkept};
	int r;

	r = skv_compact_budget(x->ctx, &j->shape, &j->params, j->layers, j->in, j->out, &res, kerr);
	if (r < 0)
		return r;
	snapkvd_cache_budget_done(c, &res, j->host_base, j->host_base, NULL);
	return 0;
}

/*
 * A decision-group member (snapkvd-group.h): the first step scores (and
 * for uniform and layers writes everything), the state held in the job;
 * the second, once the group has decided, writes the outputs for the
 * group's C* and fallback and settles a budgeted cache as above.
 */
static int host_compact_group(struct snapkvd_runner_ctx *x, struct snapkvd_job *j,
			      struct skv_error *kerr)
{
	struct snapkvd_cache *c = j->cache;
	struct skv_budget_result res = {.result_size = sizeof(res),
					.kept = c->budgeted ? c->hkept : NULL};
	struct skv_pending *pd = j->gm.pending;
	int r;

	if (!j->gm.decided)
		return skv_compact_begin(x->ctx, &j->shape, &j->params, j->layers, j->in, j->out,
					 &j->gm.pending, kerr);
	j->gm.pending = NULL; /* freed by the second step */
	r = skv_compact_end(x->ctx, pd, j->gm.c_star, j->gm.fallback, &res, kerr);
	if (r < 0)
		return r;
	if (c->budgeted)
		snapkvd_cache_budget_done(c, &res, j->host_base, j->host_base, NULL);
	return 0;
}

static int host_compact_layers(struct snapkvd_runner_ctx *x, struct snapkvd_job *j,
			       struct skv_error *kerr)
{
	for (uint32_t l = 0; l < j->layers; l += HOST_LAYERS_PER_STEP) {
		uint32_t n =
		    j->layers - l < HOST_LAYERS_PER_STEP ? j->layers - l : HOST_LAYERS_PER_STEP;
		int r;

		if (l && snapkvd_job_cancelled(j)) {
			snprintf(kerr->msg, sizeof(kerr->msg), "%s; stopped at layer %u",
				 snapkvd_job_cancel_reason(j), l);
			return -ECANCELED;
		}
		r = skv_compact(x->ctx, &j->shape, &j->params, n, j->in + l, j->out + l, kerr);
		if (r < 0 && l) { /* the kernels count layers from this group's first */
			char m[sizeof(kerr->msg)];

			snprintf(m, sizeof(m), "%s", kerr->msg);
			snprintf(kerr->msg, sizeof(kerr->msg), "in layers %u..%u: %.200s", l,
				 l + n - 1, m);
			if (kerr->layer >= 0)
				kerr->layer += (int32_t)l;
		}
		if (r < 0)
			return r;
	}
	return 0;
}

/* The kernels' cancel: the job's session has ended or the engine cancelled
 * it (any kernel thread). */
static int job_cancelled(void *arg)
{
	return snapkvd_job_cancelled(arg);
}

/*
 * Every path stops within one (layer, head) item once the session has ended
 * (skv_ctx_set_cancel), so a long job of a closed session does not hold the
 * worker: budget modes run all layers in one call, and a group member's
 * steps too.
 */
static int host_compact(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	int r;

	skv_ctx_set_cancel(x->ctx, job_cancelled, j);
	snapkvd_job_mark_writing(j);
	if (j->gm.group)
		r = host_compact_group(x, j, kerr);
	else if (j->cache && j->cache->budgeted)
		r = host_compact_budget(x, j, kerr);
	else
		r = host_compact_layers(x, j, kerr);
	skv_ctx_set_cancel(x->ctx, NULL, NULL);
	if (r == -ECANCELED && snapkvd_job_cancelled(j))
		snprintf(kerr->msg, sizeof(kerr->msg), "%s; the compaction stopped",
			 snapkvd_job_cancel_reason(j));
	return r;
}

/* a GPU-arena cache never reaches a host runner: refused at COMPACT */
static int host_grow(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	(void)x;
	(void)kerr;
	if (j->g.gpu)
		return -ENOTSUP;
	snapkvd_grow_host(&j->g, j->host_base);
	return 0;
}

static const struct snapkvd_runner_ops host_ops = {
    .ctx_new = host_ctx_new,
    .ctx_free = host_ctx_free,
    .ctx_threads = host_ctx_threads,
    .ctx_isa = host_ctx_isa,
    .compact = host_compact,
    .grow = host_grow,
};

int snapkvd_runner_host_new(struct snapkvd_runner *r, struct skv_error *kerr)
{
	(void)kerr;
	r->ops = &host_ops;
	return 0;
}
