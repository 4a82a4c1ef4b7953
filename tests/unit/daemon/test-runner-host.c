// SPDX-License-Identifier: MIT
/*
 * test-runner-host: jobs on the CPU kernels (daemon/snapkvd-runner-host.c)
 * and the runner chosen for a host device (daemon/snapkvd-runner.c): a
 * context's threads and ISA; a job of more layers than one step gives the
 * bytes libskv gives in one call over all layers; a kernel refusal in a
 * later step names the layers of that step and the job's layer; a job
 * cancelled before it ran or whose session ended stops with its reason;
 * a GPU-arena GROW refused.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-device.h"
#include "daemon/snapkvd-runner-host.c"
#include "tests/test-skip.h"

#define LAYERS 10 /* more than HOST_LAYERS_PER_STEP */
#define H      2
#define D      16
#define L      64
#define W      8
#define C      24

static float q[LAYERS][H * W * D], k[LAYERS][H * L * D], v[LAYERS][H * L * D];

struct outs {
	float k[LAYERS][H * C * D], v[LAYERS][H * C * D];
	int32_t pos[LAYERS][H * C];
	float mass[LAYERS][H];
};
static struct outs got, want;

static struct skv_tensor t(void *data, uint32_t rows)
{
	return (struct skv_tensor){.data = data,
				   .dtype = SKV_DTYPE_F32,
				   .head_stride = (int64_t)rows * D,
				   .token_stride = D};
}

static void fill(struct skv_shape *sh, struct skv_params *p, struct skv_layer_in *in,
		 struct skv_layer_out *out, struct outs *o)
{
	*sh = (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = H, .h_kv = H, .n_q = W};
	skv_params_init(p);
	p->window = W;
	p->budget = C;
	for (int l = 0; l < LAYERS; l++) {
		in[l] = (struct skv_layer_in){.q = t(q[l], W), .k = t(k[l], L), .v = t(v[l], L)};
		out[l] = (struct skv_layer_out){.k = t(o->k[l], C),
						.v = t(o->v[l], C),
						.positions = o->pos[l],
						.pos_stride = C,
						.retained_mass = o->mass[l]};
	}
}

static struct snapkvd_runner runner;
static struct snapkvd_runner_ctx *x;

static int setup(void)
{
	unsigned seed = 7;

	for (int l = 0; l < LAYERS; l++) {
		for (int i = 0; i < H * W * D; i++)
			q[l][i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
		for (int i = 0; i < H * L * D; i++) {
			k[l][i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
			v[l][i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
		}
	}
	if (snapkvd_runner_host_new(&runner, NULL) < 0)
		return 1;
	return runner.ops->ctx_new(&runner, 2, 0, &x, NULL) < 0;
}

static int cleanup(void)
{
	runner.ops->ctx_free(x);
	runner.ops->ctx_free(NULL);
	return 0;
}

static struct snapkvd_job *job(void)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_COMPACT, NULL, &o);

	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	j->layers = LAYERS;
	j->in = calloc(LAYERS, sizeof(*j->in));
	j->out = calloc(LAYERS, sizeof(*j->out));
	fill(&j->shape, &j->params, j->in, j->out, &got);
	return j;
}

static void test_ctx(void)
{
	CU_ASSERT_EQUAL(runner.ops->ctx_threads(x), 2);
	CU_ASSERT(strlen(runner.ops->ctx_isa(x)) > 0);
	CU_ASSERT_EQUAL(runner.ops->max_workers, 0);
	CU_ASSERT_PTR_NULL(runner.ops->stop);
}

/* In steps of 8 layers, the bytes of one call over all 10. */
static void test_compact(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct skv_layer_in in[LAYERS];
	struct skv_layer_out out[LAYERS];
	struct skv_shape sh;
	struct skv_params p;
	struct skv_ctx *ctx = NULL;
	struct snapkvd_job *j = job();

	memset(&got, 0, sizeof(got));
	memset(&want, 0xee, sizeof(want));
	CU_ASSERT_EQUAL_FATAL(runner.ops->compact(x, j, &err), 0);
	CU_ASSERT_TRUE(j->writing);
	fill(&sh, &p, in, out, &want);
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &sh, &p, LAYERS, in, out, &err), 0);
	skv_ctx_free(ctx);
	CU_ASSERT_EQUAL(memcmp(&got, &want, sizeof(got)), 0);
	CU_ASSERT_EQUAL(got.pos[LAYERS - 1][C - 1], L - 1); /* the window is kept */
	snapkvd_job_free(j);
}

/* A refusal in the second step: its layers named, the job's layer index. */
static void test_later_step_fails(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_job *j = job();

	j->in[9].k.data = NULL;
	CU_ASSERT_EQUAL(runner.ops->compact(x, j, &err), -EINVAL);
	CU_ASSERT_NSTRING_EQUAL(err.msg, "in layers 8..9: ", 16);
	CU_ASSERT_EQUAL(err.layer, 9);
	snapkvd_job_free(j);
}

static void test_cancelled(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_job *j = job();
	bool ended = true;

	j->cancel_req = true;
	CU_ASSERT_EQUAL(runner.ops->compact(x, j, &err), -ECANCELED);
	CU_ASSERT_STRING_EQUAL(err.msg, "the request was cancelled; the compaction stopped");
	j->cancel_req = false;
	j->cancel = &ended;
	CU_ASSERT_EQUAL(runner.ops->compact(x, j, &err), -ECANCELED);
	CU_ASSERT_STRING_EQUAL(err.msg, "the session ended; the compaction stopped");
	/* the context is usable again: the cancel hook was cleared */
	j->cancel = NULL;
	CU_ASSERT_EQUAL(runner.ops->compact(x, j, &err), 0);
	snapkvd_job_free(j);
}

static void test_grow_gpu(void)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_GROW, NULL, &o);
	struct skv_error err = {{0}, -1, -1};

	j->g.gpu = true;
	CU_ASSERT_EQUAL(runner.ops->grow(x, j, &err), -ENOTSUP);
	snapkvd_job_free(j);
}

/* snapkvd_runner_new on a host device: the host runner, the backend named. */
static void test_runner_new(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_device *dev = NULL;
	struct snapkvd_runner *r = NULL;

	CU_ASSERT_EQUAL_FATAL(snapkvd_device_new("host", NULL, 0, &dev, &err), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_runner_new(dev, &r, &err), 0);
	CU_ASSERT_PTR_EQUAL(r->ops, &host_ops);
	CU_ASSERT_PTR_EQUAL(r->dev, dev);
	CU_ASSERT_STRING_EQUAL(r->desc, "host");
	snapkvd_runner_stop(r); /* no stop: nothing to do */
	snapkvd_runner_free(r);
	snapkvd_runner_free(NULL);
	snapkvd_device_free(dev);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("runner-host", setup, cleanup);
	CU_add_test(su, "a context", test_ctx);
	CU_add_test(su, "steps of layers: the bytes of one call", test_compact);
	CU_add_test(su, "a refusal in a later step", test_later_step_fails);
	CU_add_test(su, "cancelled jobs stop with their reason", test_cancelled);
	CU_add_test(su, "a GPU-arena GROW refused", test_grow_gpu);
	CU_add_test(su, "the runner of a host device", test_runner_new);
	return t_run();
}
