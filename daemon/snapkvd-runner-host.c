// SPDX-License-Identifier: MIT
/*
 * snapkvd-runner-host.c - jobs on the CPU kernels (libskv): one skv_ctx per
 * worker, whose thread pool spreads a compaction over (layer, head) items.
 */
#include <errno.h>
#include <stdlib.h>

#include "snapkvd-job.h"
#include "snapkvd-runner.h"

struct snapkvd_runner_ctx {
	struct skv_ctx *ctx;
};

static int host_ctx_new(struct snapkvd_runner *r, unsigned threads, struct snapkvd_runner_ctx **ret,
			struct skv_error *err)
{
	struct snapkvd_runner_ctx *x = calloc(1, sizeof(*x));
	int e;

	(void)r;
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

static int host_compact(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr)
{
	return skv_compact(x->ctx, &j->shape, &j->params, j->layers, j->in, j->out, kerr);
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
    .device = false,
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
