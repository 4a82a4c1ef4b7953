// SPDX-License-Identifier: MIT
/*
 * fuzz-request - libFuzzer target: a COMPACT request (snapkv.v1.Request, as
 * it arrives in a ring slot), checked by snapkvd's own validation
 * (daemon/snapkvd-request.c, #included, as tests/unit/daemon/test-request.c
 * does: limits on every dimension, one layer description per layer, params
 * with their explicit-field flags and budget modes, skv_plan, the scratch
 * and work bounds, every tensor's strides, offset, dtype, overlap and block
 * table against the registered buffer it names, the output cache's shape),
 * then, when accepted, compacted by libskv's real kernels on the tensors
 * the job resolved.
 *
 * The property is the contract between validation and the kernels: a
 * request snapkvd accepts never makes a kernel read outside the buffers
 * (each an exact malloc, so ASan sees a stray byte) or write outside the
 * output the plan sized; every kept position is inside the prompt and
 * ascending per head; nothing overflows (UBSan); an accepted job holds its
 * buffers once each and a refused one holds none. The limits are small (a
 * daemon configured with max_layers 2, max_heads 4, max_head_dim 16,
 * max_prompt_len 96) so that one input runs in microseconds. Uniform
 * requests run skv_compact(); budget modes are validated only (their
 * kernels are fuzzed through the daemon by fuzz-compact-diff).
 *
 * The fakes stand for what validation reads of the rest of the daemon: a
 * host runner (no GPU arena), the session's two registered buffers, the
 * policy (no pressure scaling to count).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-request.c"

#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz-request: %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

#define MAX_LAYERS 2u

/* ------------------------------------------------------------- the fakes */

bool snapkvd_device_present(const struct snapkvd_device *d)
{
	(void)d;
	return false;
}

const char *snapkvd_device_backend(const struct snapkvd_device *d)
{
	(void)d;
	return "host";
}

/* no GPU is ever open here: every buffer is host memory */
int snapkvd_device_ordinal(const struct snapkvd_device *d, unsigned gpu)
{
	(void)d, (void)gpu;
	return -1;
}

uint8_t *snapkvd_device_arena_base(struct snapkvd_device *d, struct skv_cuda_arena *a)
{
	(void)d;
	(void)a;
	return NULL;
}

/* a job's membership: none is ever joined here (no admission) */
void snapkvd_group_member_clear(struct snapkvd_group_member *m)
{
	skv_pending_free(m->pending);
	m->pending = NULL;
	m->group = NULL;
}

/* no decision group is ever open here (env.groups is NULL) */
int snapkvd_groups_level(struct snapkvd_groups *g, uint32_t uid, const char *key, int *ret_level)
{
	(void)g, (void)uid, (void)key, (void)ret_level;
	return -ENOENT;
}

struct snapkvd_buffer *snapkvd_buffer_find(struct snapkvd_buffer *list, uint64_t id)
{
	for (struct snapkvd_buffer *b = list; b; b = b->next)
		if (b->id == id)
			return b;
	return NULL;
}

void snapkvd_buffer_unref(struct snapkvd_buffer *b)
{
	b->refs--;
}

void snapkvd_policy_count_scaled(struct snapkvd_policy *ops)
{
	(void)ops;
}

/* validation joins no group (admission does): a job here never holds one */
void snapkvd_group_put(struct snapkvd_group *g)
{
	REQUIRE(!g);
}

/* --------------------------------------------------- the session and daemon */

/* The session's registered buffers: id 1 (64 KiB) and id 2 (4 KiB). */
static struct snapkvd_buffer bufs[2];
static struct snapkvd_config cfg;
static struct snapkvd_policy policy;
static struct snapkvd_request_env env;
static struct skv_ctx *ctx;
/* FUZZ_VERBOSE=1: say where each input stopped (to check that seeds get through) */
static int verbose;

static void setup(void)
{
	static const uint64_t size[2] = {64 << 10, 4 << 10};

	verbose = getenv("FUZZ_VERBOSE") != NULL;
	REQUIRE(skv_ctx_new(1, &ctx) == 0);
	snapkvd_config_defaults(&cfg);
	cfg.max_layers = MAX_LAYERS;
	cfg.max_heads = 4;
	cfg.max_head_dim = 16;
	cfg.max_prompt_len = 96;
	cfg.max_reserve = 8;
	cfg.max_scratch_bytes = 64u << 20;
	REQUIRE(snapkvd_pressure_new(&cfg.policy.pressure, NULL, NULL, &policy.pressure) == 0);
	for (int b = 0; b < 2; b++) {
		uint8_t *m = malloc(size[b]);

		REQUIRE(m);
		/* finite values in every dtype's reading of the bytes: each
		 * 16-bit half is a small f16/bf16, each f32 small too */
		for (uint64_t i = 0; i < size[b] / 2; i++) {
			uint16_t v = (uint16_t)(0x3000 + ((i * 2654435761u) >> 22 & 0x3ff));

			memcpy(m + 2 * i, &v, 2);
		}
		bufs[b] = (struct snapkvd_buffer){
		    .id = (uint64_t)b + 1, .size = size[b], .map = m, .refs = 1};
	}
	bufs[0].next = &bufs[1];
	env = (struct snapkvd_request_env){
	    .cfg = &cfg,
	    .buffers = &bufs[0],
	    .arena_bytes = 4 << 20,
	    .device = NULL,
	    .threads = 1,
	    .ops = &policy,
	};
}

/* An accepted uniform job through the kernels, into outputs the plan sized. */
static void run(const struct snapkvd_job *j)
{
	struct skv_plan plan;
	struct skv_error kerr = {{0}, -1, -1};
	struct skv_layer_out out[MAX_LAYERS];
	void *mem[MAX_LAYERS][4] = {{0}};
	enum skv_dtype odt = j->in[0].k.dtype;
	int r;

	REQUIRE(j->layers <= MAX_LAYERS);
	REQUIRE(skv_plan(&j->shape, &j->params, &plan, &kerr) == 0);
	REQUIRE(plan.h_store == j->shape.h_q || plan.h_store == j->shape.h_kv);
	REQUIRE(plan.kept <= j->shape.prompt_len);
	size_t es = skv_dtype_size(odt), kept = plan.kept ? plan.kept : 1;
	size_t kvb = (size_t)plan.h_store * kept * j->shape.head_dim * es;
	for (uint32_t l = 0; l < j->layers; l++) {
		for (int m = 0; m < 4; m++) {
			size_t n = m < 2    ? kvb
				   : m == 2 ? (size_t)plan.h_store * kept * 4
					    : (size_t)plan.h_store * 4;
			mem[l][m] = malloc(n);
			REQUIRE(mem[l][m]);
		}
		out[l] = (struct skv_layer_out){
		    .k = {.data = mem[l][0],
			  .dtype = odt,
			  .head_stride = (int64_t)plan.kept * j->shape.head_dim,
			  .token_stride = j->shape.head_dim},
		    .v = {.data = mem[l][1],
			  .dtype = odt,
			  .head_stride = (int64_t)plan.kept * j->shape.head_dim,
			  .token_stride = j->shape.head_dim},
		    .positions = mem[l][2],
		    .pos_stride = plan.kept,
		    .retained_mass = mem[l][3],
		};
	}
	r = skv_compact(ctx, &j->shape, &j->params, j->layers, j->in, out, &kerr);
	/* the kernels may still refuse (NaN/Inf in the data: -EDOM), never crash */
	REQUIRE(r == 0 || r == -EDOM || r == -EINVAL || r == -ENOMEM || r == -ERANGE);
	if (verbose)
		fprintf(stderr, "fuzz-request: compacted: %d %s\n", r, r ? kerr.msg : "");
	if (r == 0)
		for (uint32_t l = 0; l < j->layers; l++)
			for (uint32_t h = 0; h < plan.h_store; h++) {
				const int32_t *p =
				    (const int32_t *)mem[l][2] + (size_t)h * plan.kept;

				for (uint32_t i = 0; i < plan.kept; i++) {
					REQUIRE(p[i] >= 0 && (uint32_t)p[i] < j->shape.prompt_len);
					REQUIRE(i == 0 || p[i] > p[i - 1]);
				}
			}
	for (uint32_t l = 0; l < j->layers; l++)
		for (int m = 0; m < 4; m++)
			free(mem[l][m]);
}

static void compact(const Snapkv__V1__CompactRequest *req)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = NULL;
	char err[256] = "";
	int r = snapkvd_request_compact(&env, NULL, &o, req, &j, err, sizeof(err));

	if (r < 0) {
		/* refused: nothing held, a reason given */
		REQUIRE(!j && err[0]);
		REQUIRE(bufs[0].refs == 1 && bufs[1].refs == 1);
		if (verbose)
			fprintf(stderr, "fuzz-request: refused %d: %s\n", r, err);
		return;
	}
	REQUIRE(r == 0 && j && j->cache);
	/* each buffer the job reads is held once */
	REQUIRE(bufs[0].refs <= 2 && bufs[1].refs <= 2);
	REQUIRE(j->n_bufs == (unsigned)(bufs[0].refs - 1) + (unsigned)(bufs[1].refs - 1));
	if (!snapkvd_params_budgeted(&j->params) && !j->gm.size)
		run(j);
	else if (verbose)
		fprintf(stderr, "fuzz-request: accepted (budget mode or group: not run)\n");
	snapkvd_job_free(j);
	REQUIRE(bufs[0].refs == 1 && bufs[1].refs == 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Snapkv__V1__Request *req;

	if (!ctx)
		setup();
	if (size > 65536)
		return -1;
	req = snapkv__v1__request__unpack(NULL, size, data);
	if (!req)
		return 0;
	if (req->op_case == SNAPKV__V1__REQUEST__OP_COMPACT)
		compact(req->compact);
	snapkv__v1__request__free_unpacked(req, NULL);
	return 0;
}
