// SPDX-License-Identifier: MIT
/*
 * test-daemon-window: a partial window (SPEC.md "Partial window") through
 * snapkvd. A COMPACT with n_q < W query rows gives the bytes libskv gives
 * here for the same input (W' = n_q), at the daemon's min_window (6 in this
 * suite's config) and at the request's own; below the one that applies, and
 * above W, it is refused naming the limit, nothing leaked; the same on
 * --backend cuda (the emulated plugin's kernels).
 * fp8 K/V (SPEC.md "Quantized K/V", e4m3fn and e5m2 with per-layer scales):
 * the cache holds libskv's bytes and carries the scales; a missing scale,
 * fp8 queries and a non-finite key are refused by name.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon-harness.h"
#include "skv.h"
#include "snapkv.h"

#define LAYERS 2
#define H_Q    4
#define H_KV   2
#define D      16
#define L      96
#define W      16
#define C      28

static struct harness H;

/* Q rows [H_Q][W][D] (the first n_q used), K and V [H_KV][L][D] per layer. */
#define Q_EL	  ((size_t)H_Q * W * D)
#define KV_EL	  ((size_t)H_KV * L * D)
#define LAYER_EL  (Q_EL + 2 * KV_EL)
#define BUF_BYTES (LAYERS * LAYER_EL * 4)

static void fill(float *f, uint64_t seed)
{
	for (size_t i = 0; i < LAYERS * LAYER_EL; i++)
		f[i] = h_rand(&seed) * 2.0f;
}

static struct skv_tensor_ref ref(const struct skv_buffer *b, size_t el, uint32_t tokens)
{
	return (struct skv_tensor_ref){b, el * 4, SKV_DTYPE_F32, (int64_t)tokens * D, D, 0, 0};
}

/* A description of n_q rows with the full skv_params (min_window travels). */
static void desc(struct skv_compact_desc *d, struct skv_layer_ref *lr, const struct skv_buffer *b,
		 uint32_t n_q, uint32_t min_window)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape = (struct skv_shape){
	    .prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = n_q};
	d->layers = LAYERS;
	skv_params_init(&d->params);
	d->params.window = W;
	d->params.capacity = C;
	d->params.gqa = SKV_GQA_GROUP;
	d->params.min_window = min_window;
	for (uint32_t l = 0; l < LAYERS; l++) {
		lr[l].q = ref(b, l * LAYER_EL, n_q);
		lr[l].k = ref(b, l * LAYER_EL + Q_EL, L);
		lr[l].v = ref(b, l * LAYER_EL + Q_EL + KV_EL, L);
	}
	d->layer = lr;
}

/* The daemon's cache against skv_compact() here; returns the differences. */
static int compare_local(struct skv_cache *k, const struct skv_compact_desc *d, const float *buf,
			 uint32_t min_window)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	struct skv_params p = d->params;
	struct skv_layer_in in[LAYERS];
	struct skv_layer_out out[LAYERS];
	struct skv_plan plan;
	struct skv_error err;
	struct skv_ctx *ctx;
	int diff = 0;

	p.min_window = min_window;
	CU_ASSERT_EQUAL_FATAL(skv_plan(&d->shape, &p, &plan, &err), 0);
	CU_ASSERT_EQUAL(plan.w_obs, d->shape.n_q);
	CU_ASSERT_EQUAL(ci->kept, plan.kept);
	uint32_t hs = plan.h_store, n = plan.kept;
	float *ok = calloc((size_t)LAYERS * hs * n * D, 4),
	      *ov = calloc((size_t)LAYERS * hs * n * D, 4);
	int32_t *op = calloc((size_t)LAYERS * hs * n, 4);
	for (uint32_t l = 0; l < LAYERS; l++) {
		const float *base = buf + l * LAYER_EL;
		in[l].q = (struct skv_tensor){
		    (void *)base, SKV_DTYPE_F32, (int64_t)d->shape.n_q * D, D, NULL, 0, 0, 0, 0};
		in[l].k = (struct skv_tensor){
		    (void *)(base + Q_EL), SKV_DTYPE_F32, (int64_t)L * D, D, NULL, 0, 0, 0, 0};
		in[l].v = (struct skv_tensor){(void *)(base + Q_EL + KV_EL),
					      SKV_DTYPE_F32,
					      (int64_t)L * D,
					      D,
					      NULL,
					      0,
					      0,
					      0,
					      0};
		out[l] = (struct skv_layer_out){
		    .k = {ok + (size_t)l * hs * n * D, SKV_DTYPE_F32, (int64_t)n * D, D, NULL, 0, 0,
			  0, 0},
		    .v = {ov + (size_t)l * hs * n * D, SKV_DTYPE_F32, (int64_t)n * D, D, NULL, 0, 0,
			  0, 0},
		    .positions = op + (size_t)l * hs * n,
		    .pos_stride = n,
		};
	}
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &d->shape, &p, LAYERS, in, out, &err), 0);
	skv_ctx_free(ctx);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < hs; h++) {
			const float *dk = skv_cache_k(k, l, h), *dv = skv_cache_v(k, l, h);
			const int32_t *dp = skv_cache_positions(k, l, h);
			for (uint32_t i = 0; i < n; i++) {
				size_t o = ((size_t)(l * hs + h) * n + i) * D;
				diff +=
				    memcmp(dk + (size_t)i * ci->token_stride, ok + o, D * 4) != 0;
				diff +=
				    memcmp(dv + (size_t)i * ci->token_stride, ov + o, D * 4) != 0;
				diff += dp[i] != op[(size_t)(l * hs + h) * n + i];
			}
		}
	free(ok);
	free(ov);
	free(op);
	return diff;
}

static int suite_init(void)
{
	return h_start_config(&H, "snapkvd-window", "min_window = 6\n") == 0 ? 0 : -1;
}

static int suite_clean(void)
{
	int st = h_stop(&H);

	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

static struct skv_client *engine(void)
{
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = "window"};
	struct skv_client *c = NULL;

	CU_ASSERT_EQUAL(skv_client_connect(H.sock, &o, &c), 0);
	return c;
}

/* n_q rows at the request's min_window (0: the daemon's 6): 0 or the error */
static int compact(struct skv_client *c, struct skv_buffer *b, uint32_t n_q, uint32_t min_window,
		   uint32_t local_min)
{
	struct skv_layer_ref lr[LAYERS];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;

	desc(&d, lr, b, n_q, min_window);
	int r = skv_client_compact(c, &d, &k);
	if (r < 0)
		return r;
	CU_ASSERT_EQUAL(compare_local(k, &d, skv_buffer_data(b), local_min), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	return 0;
}

static void expect_refused(struct skv_client *c, struct skv_buffer *b, uint32_t n_q,
			   uint32_t min_window, int want, const char *needle)
{
	int r = compact(c, b, n_q, min_window, 0);

	if (r != want || !strstr(skv_client_error(c), needle))
		fprintf(stderr, "\n  n_q %u min_window %u: want %d \"%s\", got %d \"%s\"\n", n_q,
			min_window, want, needle, r, skv_client_error(c));
	CU_ASSERT_EQUAL(r, want);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), needle));
}

static void test_partial_window(void)
{
	struct skv_client *c = engine();
	struct skv_buffer *b = NULL;
	long long base = h_pool_used(H.sock);

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, BUF_BYTES, &b), 0);
	fill(skv_buffer_data(b), 7);
	/* a full window runs on every backend */
	int r = compact(c, b, W, 0, 0);
	if (r)
		fprintf(stderr, "\n  full window: %d %s\n", r, skv_client_error(c));
	CU_ASSERT_EQUAL(r, 0);
	/* the config's min_window 6, then the request's own 3 (on --backend
	 * cuda the plugin's kernels, the same bytes) */
	for (uint32_t n_q = 6; n_q < W; n_q += 3)
		CU_ASSERT_EQUAL(compact(c, b, n_q, 0, 6), 0);
	CU_ASSERT_EQUAL(compact(c, b, 3, 3, 3), 0);
	CU_ASSERT_EQUAL(compact(c, b, 4, 1, 1), 0);
	expect_refused(c, b, 5, 0, -EINVAL, "min_window = 6");
	expect_refused(c, b, 8, 9, -EINVAL, "min_window = 9");
	expect_refused(c, b, W + 1, 0, -EINVAL, "at most W = 16");
	CU_ASSERT_EQUAL(h_pool_used(H.sock), base);
	skv_buffer_free(b);
	skv_client_close(c);
}

/*
 * fp8 K/V (SPEC.md "Quantized K/V"): per layer Q f32 [H_Q][W][D], then K and
 * V bytes [H_KV][L][D]; scales per layer and tensor.
 */
#define F8_LAYER (Q_EL * 4 + 2 * KV_EL)
#define F8_BYTES (LAYERS * F8_LAYER)
static const float f8_scales[LAYERS][2] = {{0.0371f, 0.5f}, {2.7f, 0.31f}};

static void f8_fill(uint8_t *buf, uint64_t seed, enum skv_dtype dt)
{
	for (uint32_t l = 0; l < LAYERS; l++) {
		float *q = (float *)(buf + l * F8_LAYER);
		uint8_t *kv = buf + l * F8_LAYER + Q_EL * 4;
		for (size_t i = 0; i < Q_EL; i++)
			q[i] = h_rand(&seed) * 2.0f;
		for (size_t i = 0; i < 2 * KV_EL; i++) {
			uint8_t b = (uint8_t)(h_rand(&seed) * 128.0f + 128.0f);
			/* finite codes only: E4M3 S.1111.111 and E5M2 S.11111.xx are not */
			b &= dt == SKV_DTYPE_F8E4M3FN ? 0xf7 : 0xfb;
			kv[i] = b;
		}
	}
}

static void f8_desc(struct skv_compact_desc *d, struct skv_layer_ref *lr,
		    const struct skv_buffer *b, enum skv_dtype dt)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	d->layers = LAYERS;
	skv_params_init(&d->params);
	d->params.window = W;
	d->params.capacity = C;
	for (uint32_t l = 0; l < LAYERS; l++) {
		size_t o = l * F8_LAYER;
		lr[l].q = (struct skv_tensor_ref){b, o, SKV_DTYPE_F32, (int64_t)W * D, D, 0, 0};
		lr[l].k = (struct skv_tensor_ref){b, o + Q_EL * 4, dt, (int64_t)L * D, D, 0, 0};
		lr[l].v =
		    (struct skv_tensor_ref){b, o + Q_EL * 4 + KV_EL, dt, (int64_t)L * D, D, 0, 0};
	}
	d->layer = lr;
	d->kv_scales = &f8_scales[0][0];
}

/* the daemon's fp8 cache against skv_compact() here: bytes, positions */
static int f8_compare(struct skv_cache *k, const struct skv_compact_desc *d, const uint8_t *buf,
		      enum skv_dtype dt)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	struct skv_layer_in in[LAYERS];
	struct skv_layer_out out[LAYERS];
	struct skv_error err;
	struct skv_ctx *ctx;
	uint32_t hs = H_Q, n = C; /* expand, L > C */
	uint8_t *ok = calloc((size_t)LAYERS * hs * n, D), *ov = calloc((size_t)LAYERS * hs * n, D);
	int32_t *op = calloc((size_t)LAYERS * hs * n, 4);
	int diff = 0;

	CU_ASSERT_EQUAL(ci->dtype, dt);
	CU_ASSERT_EQUAL(ci->kept, n);
	for (uint32_t l = 0; l < LAYERS; l++) {
		const uint8_t *base = buf + l * F8_LAYER;
		in[l] = (struct skv_layer_in){
		    .q = {.data = (void *)base,
			  .dtype = SKV_DTYPE_F32,
			  .head_stride = W * D,
			  .token_stride = D},
		    .k = {.data = (void *)(base + Q_EL * 4),
			  .dtype = dt,
			  .head_stride = L * D,
			  .token_stride = D,
			  .scale = f8_scales[l][0]},
		    .v = {.data = (void *)(base + Q_EL * 4 + KV_EL),
			  .dtype = dt,
			  .head_stride = L * D,
			  .token_stride = D,
			  .scale = f8_scales[l][1]},
		};
		out[l] = (struct skv_layer_out){
		    .k = {.data = ok + (size_t)l * hs * n * D,
			  .dtype = dt,
			  .head_stride = (int64_t)n * D,
			  .token_stride = D},
		    .v = {.data = ov + (size_t)l * hs * n * D,
			  .dtype = dt,
			  .head_stride = (int64_t)n * D,
			  .token_stride = D},
		    .positions = op + (size_t)l * hs * n,
		    .pos_stride = n,
		};
		diff += skv_cache_kv_scale(k, l, 0) != f8_scales[l][0];
		diff += skv_cache_kv_scale(k, l, 1) != f8_scales[l][1];
	}
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &d->shape, &d->params, LAYERS, in, out, &err), 0);
	skv_ctx_free(ctx);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < hs; h++) {
			const uint8_t *dk = skv_cache_k(k, l, h), *dv = skv_cache_v(k, l, h);
			const int32_t *dp = skv_cache_positions(k, l, h);
			for (uint32_t i = 0; i < n; i++) {
				size_t o = ((size_t)(l * hs + h) * n + i) * D;
				diff += memcmp(dk + (size_t)i * ci->token_stride, ok + o, D) != 0;
				diff += memcmp(dv + (size_t)i * ci->token_stride, ov + o, D) != 0;
				diff += dp[i] != op[(size_t)(l * hs + h) * n + i];
			}
		}
	free(ok);
	free(ov);
	free(op);
	return diff;
}

static void test_fp8(void)
{
	static const enum skv_dtype dts[2] = {SKV_DTYPE_F8E4M3FN, SKV_DTYPE_F8E5M2};
	struct skv_client *c = engine();
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[LAYERS];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	long long base = h_pool_used(H.sock);

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, F8_BYTES, &b), 0);
	for (int i = 0; i < 2; i++) {
		uint8_t *buf = skv_buffer_data(b);
		f8_fill(buf, 11 + i, dts[i]);
		f8_desc(&d, lr, b, dts[i]);
		int r = skv_client_compact(c, &d, &k);
		if (h_backend_cuda()) {
			CU_ASSERT_EQUAL(r, -EOPNOTSUPP);
			CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "host backend only"));
			continue;
		}
		if (r)
			fprintf(stderr, "\n  fp8 %d: %d %s\n", i, r, skv_client_error(c));
		CU_ASSERT_EQUAL_FATAL(r, 0);
		CU_ASSERT_EQUAL(f8_compare(k, &d, buf, dts[i]), 0);
		CU_ASSERT_EQUAL(skv_cache_release(k), 0);
		/* a missing scale, an fp8 query, a NaN key: each refused by name */
		d.kv_scales = NULL;
		CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "finite and above 0"));
		f8_desc(&d, lr, b, dts[i]);
		lr[1].q.dtype = dts[i];
		CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "queries stay"));
		f8_desc(&d, lr, b, dts[i]);
		buf[F8_LAYER + Q_EL * 4 + 5 * D + 1] = i ? 0x7c : 0x7f; /* inf, NaN */
		CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EDOM);
		CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "NaN or Inf"));
	}
	CU_ASSERT_EQUAL(h_pool_used(H.sock), base);
	skv_buffer_free(b);
	skv_client_close(c);
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	CU_pSuite s = CU_add_suite("daemon_window", suite_init, suite_clean);
	CU_add_test(s, "partial window vs libskv, its limits", test_partial_window);
	CU_add_test(s, "fp8 K/V vs libskv, scales, refusals", test_fp8);
	return h_run_tests();
}
