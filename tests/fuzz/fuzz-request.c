// SPDX-License-Identifier: MIT
/*
 * fuzz-request - libFuzzer target: a COMPACT request (snapkv.v1.Request, as
 * it arrives in a ring slot), checked the way snapkvd checks one before it
 * queues it (limits on every dimension, one layer description per layer,
 * params with their explicit-field flags, skv_plan, the scratch bound,
 * every tensor's strides, offset, dtype and block table against the
 * registered buffer it names), then, when accepted, compacted by libskv's
 * real kernels on those buffers.
 *
 * The property is the contract between validation and the kernels: a
 * request the checks accept never makes a kernel read outside the buffers
 * (each an exact malloc, so ASan sees a stray byte) or write outside the
 * output the plan sized; every kept position is inside the prompt and
 * ascending per head; nothing overflows (UBSan). The limits are small (as a
 * daemon configured with max_layers 2, max_heads 4, max_head_dim 16,
 * max_prompt_len 96) so that one input runs in microseconds; the checks
 * follow snapkvd-compactor.c's snapkvd_job_prepare() and resolve_tensor().
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/skv-frame.h"
#include "proto/snapkv.pb-c.h"
#include "skv.h"

#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz-request: %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

#define MAX_LAYERS  2u
#define MAX_HEADS   4u
#define MAX_DIM	    16u
#define MAX_PROMPT  96u
#define MAX_RESERVE 8u
#define MAX_SCRATCH (64u << 20)

/* The session's registered buffers: id 1 and id 2. */
static const uint64_t buf_size[3] = {0, 64 << 10, 4 << 10};
static uint8_t *bufs[3];
static struct skv_ctx *ctx;
/* FUZZ_VERBOSE=1: say where each input stopped (to check that seeds get through) */
static int verbose;
#define REFUSED(why)                                                                               \
	do {                                                                                       \
		if (verbose)                                                                       \
			fprintf(stderr, "fuzz-request: refused: %s\n", why);                       \
		return;                                                                            \
	} while (0)

static int resolve(const Snapkv__V1__TensorRef *t, uint32_t heads, uint32_t tokens, uint32_t dim,
		   int allow_paged, const int32_t *table, size_t n_table, struct skv_tensor *out)
{
	uint64_t s, max_el = 0, tmp, end;

	if (!t || t->dtype < SNAPKV__V1__DTYPE__D_TYPE_F32 ||
	    t->dtype > SNAPKV__V1__DTYPE__D_TYPE_BF16)
		return -EINVAL;
	s = skv_dtype_size((enum skv_dtype)t->dtype);
	if (t->buffer_id < 1 || t->buffer_id > 2)
		return -ENOENT;
	if (t->head_stride < 0 || t->token_stride < 0 || t->block_stride < 0 || t->offset % s)
		return -EINVAL;
	if (tokens == 0)
		goto ok;
	if (__builtin_mul_overflow((uint64_t)(heads - 1), (uint64_t)t->head_stride, &tmp) ||
	    __builtin_add_overflow(max_el, tmp, &max_el) ||
	    __builtin_add_overflow(max_el, (uint64_t)dim - 1, &max_el))
		return -ERANGE;
	if (t->block_size) {
		uint64_t nb = ((uint64_t)tokens + t->block_size - 1) / t->block_size, maxb = 0;
		uint64_t in_blk = tokens < t->block_size ? tokens : t->block_size;

		if (!allow_paged || nb > n_table)
			return -EINVAL;
		for (uint64_t i = 0; i < nb; i++) {
			if (table[i] < 0)
				return -EINVAL;
			if ((uint64_t)table[i] > maxb)
				maxb = (uint64_t)table[i];
		}
		if (__builtin_mul_overflow(in_blk - 1, (uint64_t)t->token_stride, &tmp) ||
		    __builtin_add_overflow(max_el, tmp, &max_el) ||
		    __builtin_mul_overflow(maxb, (uint64_t)t->block_stride, &tmp) ||
		    __builtin_add_overflow(max_el, tmp, &max_el))
			return -ERANGE;
	} else if (__builtin_mul_overflow((uint64_t)tokens - 1, (uint64_t)t->token_stride, &tmp) ||
		   __builtin_add_overflow(max_el, tmp, &max_el)) {
		return -ERANGE;
	}
	if (__builtin_add_overflow(max_el, 1, &end) || __builtin_mul_overflow(end, s, &end) ||
	    __builtin_add_overflow(end, t->offset, &end))
		return -ERANGE;
	if (end > buf_size[t->buffer_id])
		return -ERANGE;
ok:
	*out = (struct skv_tensor){
	    .data = bufs[t->buffer_id] + t->offset,
	    .dtype = (enum skv_dtype)t->dtype,
	    .head_stride = t->head_stride,
	    .token_stride = t->token_stride,
	    .block_table = t->block_size ? table : NULL,
	    .block_size = t->block_size,
	    .n_blocks = t->block_size ? (uint32_t)n_table : 0,
	    .block_stride = t->block_stride,
	};
	return 0;
}

static int param_given(const Snapkv__V1__Params *p, unsigned field_no, uint32_t v)
{
	return (p->explicit_fields & SKV_PARAMS_EXPLICIT(field_no)) || v;
}

static void compact(const Snapkv__V1__CompactRequest *req)
{
	struct skv_shape sh;
	struct skv_params pm;
	struct skv_plan plan;
	struct skv_error kerr = {{0}, -1, -1};
	struct skv_layer_in in[MAX_LAYERS];
	struct skv_layer_out out[MAX_LAYERS];
	void *mem[MAX_LAYERS][4] = {{0}};
	enum skv_dtype odt = SKV_DTYPE_UNSPECIFIED;
	uint64_t scratch;
	int r;

	if (req->layers < 1 || req->layers > MAX_LAYERS || req->h_q < 1 || req->h_q > MAX_HEADS ||
	    req->h_kv < 1 || req->h_kv > MAX_HEADS || req->head_dim < 1 ||
	    req->head_dim > MAX_DIM || req->prompt_len < 1 || req->prompt_len > MAX_PROMPT ||
	    req->n_q > req->prompt_len || req->decode_reserve > MAX_RESERVE)
		REFUSED("a dimension over its limit");
	if (req->n_layer != req->layers || req->n_block_table > MAX_PROMPT)
		REFUSED("layer descriptions or block table");
	sh = (struct skv_shape){.prompt_len = req->prompt_len,
				.head_dim = req->head_dim,
				.h_q = req->h_q,
				.h_kv = req->h_kv,
				.n_q = req->n_q};
	skv_params_init(&pm);
	if (req->params) {
		const Snapkv__V1__Params *p = req->params;

		if (p->policy)
			pm.policy = (enum skv_policy)p->policy;
		if (param_given(p, 2, p->window))
			pm.window = p->window;
		if (param_given(p, 3, p->capacity))
			pm.capacity = p->capacity;
		if (param_given(p, 4, p->kernel))
			pm.kernel = p->kernel;
		if (p->pooling)
			pm.pooling = (enum skv_pooling)p->pooling;
		if (p->gqa)
			pm.gqa = (enum skv_gqa)p->gqa;
		if (param_given(p, 7, p->sinks))
			pm.sinks = p->sinks;
		if (p->n_protected_ranges > SKV_MAX_PROTECTED)
			REFUSED("protected ranges");
		pm.n_protected = (uint32_t)p->n_protected_ranges;
		for (size_t i = 0; i < p->n_protected_ranges; i++) {
			pm.protected_ranges[i].begin = p->protected_ranges[i]->begin;
			pm.protected_ranges[i].end = p->protected_ranges[i]->end;
		}
	}
	if (skv_plan(&sh, &pm, &plan, &kerr) < 0)
		REFUSED(kerr.msg);
	REQUIRE(plan.h_store == req->h_q || plan.h_store == req->h_kv);
	REQUIRE(plan.kept <= req->prompt_len);
	if (skv_scratch_bytes(&sh, &pm, req->layers, 1, &scratch, &kerr) < 0 ||
	    scratch > MAX_SCRATCH)
		REFUSED("scratch");
	for (uint32_t l = 0; l < req->layers; l++) {
		const Snapkv__V1__LayerRef *lr = req->layer[l];

		memset(&in[l], 0, sizeof(in[l]));
		if (req->n_q && resolve(lr->q, req->h_q, req->n_q, req->head_dim, 0,
					req->block_table, req->n_block_table, &in[l].q) < 0)
			REFUSED("q tensor");
		if (resolve(lr->k, req->h_kv, req->prompt_len, req->head_dim, 1, req->block_table,
			    req->n_block_table, &in[l].k) < 0 ||
		    resolve(lr->v, req->h_kv, req->prompt_len, req->head_dim, 1, req->block_table,
			    req->n_block_table, &in[l].v) < 0)
			REFUSED("k or v tensor");
		if (odt == SKV_DTYPE_UNSPECIFIED)
			odt = in[l].k.dtype;
		if (in[l].k.dtype != odt || in[l].v.dtype != odt)
			REFUSED("dtypes differ");
	}
	/* accepted: outputs exactly as large as the plan says, then the kernels */
	size_t es = skv_dtype_size(odt), kept = plan.kept ? plan.kept : 1;
	size_t kvb = (size_t)plan.h_store * kept * req->head_dim * es;
	for (uint32_t l = 0; l < req->layers; l++) {
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
			  .head_stride = (int64_t)plan.kept * req->head_dim,
			  .token_stride = req->head_dim},
		    .v = {.data = mem[l][1],
			  .dtype = odt,
			  .head_stride = (int64_t)plan.kept * req->head_dim,
			  .token_stride = req->head_dim},
		    .positions = mem[l][2],
		    .pos_stride = plan.kept,
		    .retained_mass = mem[l][3],
		};
	}
	r = skv_compact(ctx, &sh, &pm, req->layers, in, out, &kerr);
	/* the kernels may still refuse (NaN/Inf in the data: -EDOM), never crash */
	REQUIRE(r == 0 || r == -EDOM || r == -EINVAL || r == -ENOMEM || r == -ERANGE);
	if (verbose)
		fprintf(stderr, "fuzz-request: compacted: %d %s\n", r, r ? kerr.msg : "");
	if (r == 0)
		for (uint32_t l = 0; l < req->layers; l++)
			for (uint32_t h = 0; h < plan.h_store; h++) {
				const int32_t *p =
				    (const int32_t *)mem[l][2] + (size_t)h * plan.kept;

				for (uint32_t i = 0; i < plan.kept; i++) {
					REQUIRE(p[i] >= 0 && (uint32_t)p[i] < req->prompt_len);
					REQUIRE(i == 0 || p[i] > p[i - 1]);
				}
			}
	for (uint32_t l = 0; l < req->layers; l++)
		for (int m = 0; m < 4; m++)
			free(mem[l][m]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Snapkv__V1__Request *req;

	if (!ctx) {
		verbose = getenv("FUZZ_VERBOSE") != NULL;
		REQUIRE(skv_ctx_new(1, &ctx) == 0);
		for (int b = 1; b <= 2; b++) {
			bufs[b] = malloc(buf_size[b]);
			REQUIRE(bufs[b]);
			/* finite values in every dtype's reading of the bytes:
			 * each 16-bit half is a small f16/bf16, each f32 small too */
			for (uint64_t i = 0; i < buf_size[b] / 2; i++) {
				uint16_t v = (uint16_t)(0x3000 + ((i * 2654435761u) >> 22 & 0x3ff));

				memcpy(bufs[b] + 2 * i, &v, 2);
			}
		}
	}
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
