// SPDX-License-Identifier: MIT
/*
 * test-daemon-e2e: snapkvd + libsnapkv across processes: handshake,
 * registration, compaction byte-identical to the in-process kernels, append,
 * grow, release, two engines at once, isolation, an engine killed mid-request,
 * the daemon killed and restarted, SIGTERM draining.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "daemon-harness.h"
#include "skv.h"
#include "snapkv.h"

static struct harness H;

/* A Llama-shaped toy problem in one registered buffer, HND per layer. */
struct prob {
	uint32_t layers, h_q, h_kv, d, L, w, C;
	size_t q_off[4], k_off[4], v_off[4], bytes;
};

static void prob_init(struct prob *p, uint32_t L)
{
	size_t off = 0;

	*p = (struct prob){.layers = 2, .h_q = 4, .h_kv = 2, .d = 16, .L = L, .w = 8, .C = 24};
	for (uint32_t l = 0; l < p->layers; l++) {
		p->q_off[l] = off;
		off += (size_t)p->h_q * p->w * p->d * 4;
		p->k_off[l] = off;
		off += (size_t)p->h_kv * L * p->d * 4;
		p->v_off[l] = off;
		off += (size_t)p->h_kv * L * p->d * 4;
	}
	p->bytes = off;
}

static void prob_fill(const struct prob *p, void *data, uint64_t seed)
{
	float *f = data;

	for (size_t i = 0; i < p->bytes / 4; i++)
		f[i] = h_rand(&seed) * 2.0f;
}

static void prob_desc(const struct prob *p, struct skv_buffer *b, struct skv_layer_ref *lr,
		      struct skv_compact_desc *d)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape = (struct skv_shape){
	    .prompt_len = p->L, .head_dim = p->d, .h_q = p->h_q, .h_kv = p->h_kv, .n_q = p->w};
	d->layers = p->layers;
	skv_client_params_init(&d->params);
	d->params.window = p->w;
	d->params.capacity = p->C;
	d->params.kernel = 5;
	for (uint32_t l = 0; l < p->layers; l++) {
		lr[l].q = (struct skv_tensor_ref){
		    b, p->q_off[l], SKV_DTYPE_F32, (int64_t)p->w * p->d, p->d, 0, 0};
		lr[l].k = (struct skv_tensor_ref){
		    b, p->k_off[l], SKV_DTYPE_F32, (int64_t)p->L * p->d, p->d, 0, 0};
		lr[l].v = (struct skv_tensor_ref){
		    b, p->v_off[l], SKV_DTYPE_F32, (int64_t)p->L * p->d, p->d, 0, 0};
	}
	d->layer = lr;
	d->decode_reserve = 4;
}

static struct skv_client *connect_engine(const char *name)
{
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = name};
	struct skv_client *c = NULL;
	int r = skv_client_connect(H.sock, &o, &c);

	CU_ASSERT_EQUAL(r, 0);
	return r ? NULL : c;
}

static int suite_init(void)
{
	return h_start(&H, NULL) == 0 ? 0 : -1;
}

static int suite_clean(void)
{
	int st = h_stop(&H);

	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

static void test_handshake(void)
{
	struct skv_client *c = connect_engine("hs");
	struct skv_stats st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT(skv_client_session_id(c) > 0);
	CU_ASSERT_EQUAL(skv_client_nop(c), 0);
	CU_ASSERT_EQUAL(skv_client_nop_socket(c), 0);
	CU_ASSERT_EQUAL(skv_client_stats(c, &st), 0);
	CU_ASSERT_EQUAL(st.caches, 0);
	CU_ASSERT(st.arena_bytes > 0);
	for (int i = 0; i < 1000; i++)
		if (skv_client_nop(c) != 0) {
			CU_FAIL("nop failed");
			break;
		}
	skv_client_close(c);
	/* no daemon at this path */
	struct skv_client *x = NULL;
	int r = skv_client_connect("/nonexistent/snapkvd.sock", NULL, &x);
	CU_ASSERT(r == -ENOTCONN || r == -ENOENT);
	CU_ASSERT_PTR_NULL(x);
}

static void test_registration(void)
{
	struct skv_client *c = connect_engine("reg");
	struct skv_buffer *a = NULL, *b = NULL, *u = NULL;
	int fd;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL(skv_buffer_alloc(c, 1 << 16, &a), 0);
	CU_ASSERT_EQUAL(skv_buffer_alloc(c, 4096, &b), 0);
	CU_ASSERT(skv_buffer_id(a) > 0 && skv_buffer_id(b) > skv_buffer_id(a));
	CU_ASSERT_EQUAL(skv_buffer_free(b), 0);
	CU_ASSERT_EQUAL(skv_buffer_alloc(c, 4096, &b), 0);
	CU_ASSERT(skv_buffer_id(b) > skv_buffer_id(a) + 1); /* ids never reused */
	/* an unsealed memfd could shrink under the daemon's mapping: refused */
	fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CU_ASSERT_EQUAL(ftruncate(fd, 4096), 0);
	CU_ASSERT_EQUAL(skv_buffer_register_fd(c, fd, 4096, &u), -EPERM);
	CU_ASSERT(strstr(skv_client_error(c), "SEAL") != NULL);
	/* a pipe is no memfd */
	int p[2];
	CU_ASSERT_EQUAL(pipe(p), 0);
	CU_ASSERT_EQUAL(skv_buffer_register_fd(c, p[0], 4096, &u), -EINVAL);
	close(p[0]);
	close(p[1]);
	/* larger than the file */
	CU_ASSERT_EQUAL(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	CU_ASSERT_EQUAL(skv_buffer_register_fd(c, fd, 8192, &u), -ERANGE);
	CU_ASSERT_EQUAL(skv_buffer_register_fd(c, fd, 4096, &u), 0);
	close(fd);
	CU_ASSERT_EQUAL(skv_buffer_free(u), 0);
	CU_ASSERT_EQUAL(skv_buffer_free(a), 0);
	CU_ASSERT_EQUAL(skv_buffer_free(b), 0);
	skv_client_close(c);
}

/* Compact through the daemon and in-process; compare every byte. */
static void check_matches_offline(enum skv_layout layout, enum skv_gqa gqa, uint32_t L)
{
	struct skv_client *c = connect_engine("e2e");
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[4];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct prob p;
	struct skv_ctx *ctx = NULL;
	struct skv_error err;
	struct skv_plan plan;
	long long base = h_pool_used(H.sock);

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	prob_init(&p, L);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, p.bytes, &b), 0);
	prob_fill(&p, skv_buffer_data(b), 42 + L);
	prob_desc(&p, b, lr, &d);
	d.out_layout = layout;
	d.params.gqa = gqa;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	const struct skv_cache_info *ci = skv_cache_info(k);
	CU_ASSERT_EQUAL_FATAL(skv_plan(&d.shape, &d.params, &plan, &err), 0);
	CU_ASSERT_EQUAL(ci->kept, plan.kept);
	CU_ASSERT_EQUAL(ci->h_store, plan.h_store);
	CU_ASSERT_EQUAL(ci->capacity, plan.kept + 4);
	CU_ASSERT_EQUAL(ci->prompt_len, L);
	CU_ASSERT_EQUAL(skv_cache_next_position(k), L);

	/* the same problem in this process, through the kernels directly */
	uint32_t hs = plan.h_store, slots = plan.kept;
	float *ok = calloc((size_t)p.layers * hs * slots * p.d, 4);
	float *ov = calloc((size_t)p.layers * hs * slots * p.d, 4);
	int32_t *op = calloc((size_t)p.layers * hs * slots, 4);
	float *om = calloc((size_t)p.layers * hs, 4);
	struct skv_layer_in in[4];
	struct skv_layer_out out[4];
	const uint8_t *base8 = skv_buffer_data(b);
	for (uint32_t l = 0; l < p.layers; l++) {
		in[l].q = (struct skv_tensor){(void *)(base8 + p.q_off[l]),
					      SKV_DTYPE_F32,
					      (int64_t)p.w * p.d,
					      p.d,
					      NULL,
					      0,
					      0,
					      0,
					      0};
		in[l].k = (struct skv_tensor){(void *)(base8 + p.k_off[l]),
					      SKV_DTYPE_F32,
					      (int64_t)p.L * p.d,
					      p.d,
					      NULL,
					      0,
					      0,
					      0,
					      0};
		in[l].v = (struct skv_tensor){(void *)(base8 + p.v_off[l]),
					      SKV_DTYPE_F32,
					      (int64_t)p.L * p.d,
					      p.d,
					      NULL,
					      0,
					      0,
					      0,
					      0};
		out[l] = (struct skv_layer_out){
		    .k = {ok + (size_t)l * hs * slots * p.d, SKV_DTYPE_F32, (int64_t)slots * p.d,
			  p.d, NULL, 0, 0, 0},
		    .v = {ov + (size_t)l * hs * slots * p.d, SKV_DTYPE_F32, (int64_t)slots * p.d,
			  p.d, NULL, 0, 0, 0},
		    .positions = op + (size_t)l * hs * slots,
		    .pos_stride = slots,
		    .retained_mass = om + (size_t)l * hs,
		};
	}
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &d.shape, &d.params, p.layers, in, out, &err), 0);
	skv_ctx_free(ctx);
	int diff = 0;
	for (uint32_t l = 0; l < p.layers; l++)
		for (uint32_t h = 0; h < hs; h++) {
			const float *dk = skv_cache_k(k, l, h), *dv = skv_cache_v(k, l, h);
			const int32_t *dp = skv_cache_positions(k, l, h);
			for (uint32_t i = 0; i < slots; i++) {
				diff += memcmp(dk + (size_t)i * ci->token_stride,
					       ok + ((size_t)(l * hs + h) * slots + i) * p.d,
					       p.d * 4) != 0;
				diff += memcmp(dv + (size_t)i * ci->token_stride,
					       ov + ((size_t)(l * hs + h) * slots + i) * p.d,
					       p.d * 4) != 0;
				diff += dp[i] != op[(size_t)(l * hs + h) * slots + i];
			}
			for (uint32_t i = slots; i < ci->capacity; i++)
				diff += dp[i] != -1;
			diff += memcmp(&om[l * hs + h], &(float){skv_cache_retained_mass(k, l, h)},
				       4) != 0;
		}
	CU_ASSERT_EQUAL(diff, 0);
	free(ok);
	free(ov);
	free(op);
	free(om);
	CU_ASSERT(h_pool_used(H.sock) > base);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(h_pool_used(H.sock), base);
	skv_buffer_free(b);
	skv_client_close(c);
}

static void test_compact_hnd(void)
{
	check_matches_offline(SKV_LAYOUT_HND, SKV_GQA_EXPAND, 64);
}

static void test_compact_nhd_group(void)
{
	check_matches_offline(SKV_LAYOUT_NHD, SKV_GQA_GROUP, 64);
}

static void test_compact_bypass(void)
{
	check_matches_offline(SKV_LAYOUT_HND, SKV_GQA_EXPAND, 20); /* L < C */
}

/* vLLM-style paged K/V (blocks of 16 tokens, [block][token][head][dim], shuffled
 * block table) in f16, through the daemon and in-process: every byte equal. */
static void test_compact_paged_f16(void)
{
	struct skv_client *c = connect_engine("paged");
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[1];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct skv_ctx *ctx = NULL;
	struct skv_error err;
	struct skv_plan plan;
	const uint32_t L = 96, D = 16, HQ = 4, HKV = 2, W = 8, BS = 16, NB = L / BS;
	int32_t bt[6] = {4, 0, 5, 2, 1, 3};
	size_t qb = (size_t)HQ * W * D * 2, blk = (size_t)BS * HKV * D, kvb = NB * blk * 2;
	uint64_t seed = 77;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, qb + 2 * kvb, &b), 0);
	uint16_t *h = skv_buffer_data(b);
	for (size_t i = 0; i < (qb + 2 * kvb) / 2; i++)
		h[i] = skv_f32_to_f16(h_rand(&seed) * 2.0f);
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = HQ, .h_kv = HKV, .n_q = W};
	d.layers = 1;
	skv_client_params_init(&d.params);
	d.params.window = W;
	d.params.capacity = 40;
	d.params.kernel = 7;
	d.params.pooling = SKV_POOL_MAX;
	lr[0].q = (struct skv_tensor_ref){b, 0, SKV_DTYPE_F16, (int64_t)W * D, D, 0, 0};
	lr[0].k =
	    (struct skv_tensor_ref){b, qb, SKV_DTYPE_F16, D, (int64_t)HKV * D, BS, (int64_t)blk};
	lr[0].v = (struct skv_tensor_ref){b,  qb + kvb,	   SKV_DTYPE_F16, D, (int64_t)HKV * D,
					  BS, (int64_t)blk};
	d.layer = lr;
	d.block_table = bt;
	d.n_blocks = NB;
	d.out_layout = SKV_LAYOUT_NHD;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	CU_ASSERT_EQUAL_FATAL(skv_plan(&d.shape, &d.params, &plan, &err), 0);
	const struct skv_cache_info *ci = skv_cache_info(k);
	CU_ASSERT_EQUAL(ci->dtype, SKV_DTYPE_F16);
	CU_ASSERT_EQUAL(ci->layout, SKV_LAYOUT_NHD);

	uint32_t hs = plan.h_store, n = plan.kept;
	uint16_t *ok = calloc((size_t)hs * n * D, 2), *ov = calloc((size_t)hs * n * D, 2);
	int32_t *op = calloc((size_t)hs * n, 4);
	float *om = calloc(hs, 4);
	const uint8_t *base = skv_buffer_data(b);
	struct skv_layer_in in = {
	    .q = {(void *)base, SKV_DTYPE_F16, (int64_t)W * D, D, NULL, 0, 0, 0},
	    .k = {(void *)(base + qb), SKV_DTYPE_F16, D, (int64_t)HKV * D, bt, BS, NB,
		  (int64_t)blk},
	    .v = {(void *)(base + qb + kvb), SKV_DTYPE_F16, D, (int64_t)HKV * D, bt, BS, NB,
		  (int64_t)blk},
	};
	struct skv_layer_out out = {
	    .k = {ok, SKV_DTYPE_F16, (int64_t)n * D, D, NULL, 0, 0, 0},
	    .v = {ov, SKV_DTYPE_F16, (int64_t)n * D, D, NULL, 0, 0, 0},
	    .positions = op,
	    .pos_stride = n,
	    .retained_mass = om,
	};
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &d.shape, &d.params, 1, &in, &out, &err), 0);
	skv_ctx_free(ctx);
	int diff = 0;
	for (uint32_t hh = 0; hh < hs; hh++) {
		const uint16_t *dk = skv_cache_k(k, 0, hh), *dv = skv_cache_v(k, 0, hh);
		const int32_t *dp = skv_cache_positions(k, 0, hh);
		for (uint32_t i = 0; i < n; i++) {
			diff += memcmp(dk + (size_t)i * ci->token_stride,
				       ok + ((size_t)hh * n + i) * D, D * 2) != 0;
			diff += memcmp(dv + (size_t)i * ci->token_stride,
				       ov + ((size_t)hh * n + i) * D, D * 2) != 0;
			diff += dp[i] != op[(size_t)hh * n + i];
		}
	}
	CU_ASSERT_EQUAL(diff, 0);
	free(ok);
	free(ov);
	free(op);
	free(om);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	skv_buffer_free(b);
	skv_client_close(c);
}

/* A block table too long for a ring slot (block size 1, 32K tokens): the
 * request goes over the socket, the result is the same as in-process. */
static void test_compact_long_block_table(void)
{
	struct skv_client *c = connect_engine("long-bt");
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[1];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct skv_request *rq = NULL;
	struct skv_ctx *ctx = NULL;
	struct skv_error err;
	const uint32_t L = 32768, D = 16, W = 16, C = 64;
	size_t qb = (size_t)W * D * 4, kvb = (size_t)L * D * 4;
	int32_t *bt = malloc(L * sizeof(int32_t));
	uint64_t seed = 5;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	for (uint32_t i = 0; i < L; i++)
		bt[i] = (int32_t)i;
	for (uint32_t i = L - 1; i > 0; i--) { /* shuffle the physical blocks */
		uint32_t j = (uint32_t)((h_rand(&seed) + 1.0f) * 0.5f * i);
		int32_t t = bt[i];
		bt[i] = bt[j > i ? i : j];
		bt[j > i ? i : j] = t;
	}
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, qb + 2 * kvb, &b), 0);
	float *f = skv_buffer_data(b);
	for (size_t i = 0; i < (qb + 2 * kvb) / 4; i++)
		f[i] = h_rand(&seed);
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape = (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = 1, .h_kv = 1, .n_q = W};
	d.layers = 1;
	skv_client_params_init(&d.params);
	d.params.window = W;
	d.params.capacity = C;
	lr[0].q = (struct skv_tensor_ref){b, 0, SKV_DTYPE_F32, (int64_t)W * D, D, 0, 0};
	lr[0].k = (struct skv_tensor_ref){b, qb, SKV_DTYPE_F32, 0, D, 1, D};
	lr[0].v = (struct skv_tensor_ref){b, qb + kvb, SKV_DTYPE_F32, 0, D, 1, D};
	d.layer = lr;
	d.block_table = bt;
	d.n_blocks = L;
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c, &d, &rq), 0);
	CU_ASSERT_EQUAL(skv_request_poll(rq), 1);
	CU_ASSERT_EQUAL_FATAL(skv_request_wait(rq, -1, &k), 0);

	float ok[C * D], ov[C * D], om;
	int32_t op[C];
	struct skv_layer_in in = {
	    .q = {f, SKV_DTYPE_F32, (int64_t)W * D, D, NULL, 0, 0, 0},
	    .k = {(char *)f + qb, SKV_DTYPE_F32, 0, D, bt, 1, L, D},
	    .v = {(char *)f + qb + kvb, SKV_DTYPE_F32, 0, D, bt, 1, L, D},
	};
	struct skv_layer_out out = {
	    .k = {ok, SKV_DTYPE_F32, (int64_t)C * D, D, NULL, 0, 0, 0},
	    .v = {ov, SKV_DTYPE_F32, (int64_t)C * D, D, NULL, 0, 0, 0},
	    .positions = op,
	    .pos_stride = C,
	    .retained_mass = &om,
	};
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &d.shape, &d.params, 1, &in, &out, &err), 0);
	skv_ctx_free(ctx);
	CU_ASSERT_EQUAL(memcmp(skv_cache_positions(k, 0, 0), op, sizeof(op)), 0);
	CU_ASSERT_EQUAL(memcmp(skv_cache_k(k, 0, 0), ok, sizeof(ok)), 0);
	CU_ASSERT_EQUAL(memcmp(skv_cache_v(k, 0, 0), ov, sizeof(ov)), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	/* an invalid one fails the same way as over the ring */
	bt[7] = -1;
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c, &d, &rq), 0);
	CU_ASSERT_EQUAL(skv_request_wait(rq, -1, &k), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(c), "negative") != NULL);
	free(bt);
	skv_buffer_free(b);
	skv_client_close(c);
}

static void test_append_grow_release(void)
{
	struct skv_client *c = connect_engine("decode");
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[4];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct prob p;
	long long base = h_pool_used(H.sock);

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	prob_init(&p, 64);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, p.bytes, &b), 0);
	prob_fill(&p, skv_buffer_data(b), 7);
	prob_desc(&p, b, lr, &d);
	/* asynchronous: submit, poll until done, then collect */
	struct skv_request *rq = NULL;
	int polled = 0;
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c, &d, &rq), 0);
	for (int i = 0; i < 5000 && (polled = skv_request_poll(rq)) == 0; i++)
		h_sleep_ms(1);
	CU_ASSERT_EQUAL(polled, 1);
	CU_ASSERT_EQUAL_FATAL(skv_request_wait(rq, 0, &k), 0);
	const struct skv_cache_info *ci = skv_cache_info(k);
	uint32_t kept = ci->kept;
	/* decode 3 tokens: write K/V rows at the next slot, then report them */
	for (int g = 0; g < 3; g++) {
		uint32_t slot = skv_cache_next_slot(k);
		for (uint32_t l = 0; l < ci->layers; l++)
			for (uint32_t h = 0; h < ci->h_store; h++) {
				float *kr = (float *)skv_cache_k(k, l, h) + slot * ci->token_stride;
				float *vr = (float *)skv_cache_v(k, l, h) + slot * ci->token_stride;
				for (uint32_t x = 0; x < ci->head_dim; x++)
					kr[x] = vr[x] = 1000.0f * g + l * 10 + h + x * 0.001f;
			}
		CU_ASSERT_EQUAL(skv_cache_append(k, 1), 0);
	}
	CU_ASSERT_EQUAL(skv_cache_info(k)->appended, 3);
	CU_ASSERT_EQUAL(skv_cache_next_position(k), 64 + 3);
	const int32_t *pos = skv_cache_positions(k, 1, 2);
	CU_ASSERT_EQUAL(pos[kept], 64);
	CU_ASSERT_EQUAL(pos[kept + 2], 66);
	CU_ASSERT_EQUAL(pos[kept + 3], -1);
	/* reserve is 4: two more do not fit */
	CU_ASSERT_EQUAL(skv_cache_append(k, 2), -ENOSPC);
	CU_ASSERT(strstr(skv_client_error(c), "GROW") != NULL);
	/* snapshot, grow, compare */
	size_t row = ci->head_dim * 4;
	float *snap = malloc((kept + 3) * row);
	for (uint32_t i = 0; i < kept + 3; i++)
		memcpy((char *)snap + i * row,
		       (float *)skv_cache_k(k, 1, 2) + i * skv_cache_info(k)->token_stride, row);
	CU_ASSERT_EQUAL(skv_cache_grow(k, 16), 0);
	ci = skv_cache_info(k);
	CU_ASSERT_EQUAL(ci->capacity, kept + 20);
	int diff = 0;
	for (uint32_t i = 0; i < kept + 3; i++)
		diff += memcmp((char *)snap + i * row,
			       (float *)skv_cache_k(k, 1, 2) + i * ci->token_stride, row) != 0;
	CU_ASSERT_EQUAL(diff, 0);
	free(snap);
	pos = skv_cache_positions(k, 1, 2);
	CU_ASSERT_EQUAL(pos[kept + 2], 66);
	CU_ASSERT_EQUAL(pos[kept + 3], -1);
	CU_ASSERT_EQUAL(skv_cache_append(k, 2), 0);
	CU_ASSERT_EQUAL(skv_cache_next_position(k), 69);
	CU_ASSERT_EQUAL(skv_cache_grow(k, 0), -EINVAL);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(h_pool_used(H.sock), base);
	skv_buffer_free(b);
	skv_client_close(c);
}

/* Each child: connect, compact a few times, verify, exit 0. */
static int engine_child(uint64_t seed)
{
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[4];
	struct skv_compact_desc d;
	struct prob p;

	if (skv_client_connect(H.sock, NULL, &c) < 0)
		return 10;
	prob_init(&p, 256);
	if (skv_buffer_alloc(c, p.bytes, &b) < 0)
		return 11;
	prob_fill(&p, skv_buffer_data(b), seed);
	prob_desc(&p, b, lr, &d);
	for (int i = 0; i < 10; i++) {
		struct skv_cache *k = NULL;

		if (skv_client_compact(c, &d, &k) < 0)
			return 12;
		if (skv_cache_info(k)->kept != p.C)
			return 13;
		if (skv_cache_append(k, 2) < 0 || skv_cache_release(k) < 0)
			return 14;
	}
	skv_client_close(c);
	return 0;
}

static void test_two_engines(void)
{
	pid_t a, b;
	int sa = -1, sb = -1;

	a = fork();
	if (a == 0)
		_exit(engine_child(1));
	b = fork();
	if (b == 0)
		_exit(engine_child(2));
	waitpid(a, &sa, 0);
	waitpid(b, &sb, 0);
	CU_ASSERT(WIFEXITED(sa) && WEXITSTATUS(sa) == 0);
	CU_ASSERT(WIFEXITED(sb) && WEXITSTATUS(sb) == 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 5000), 0);
}

/* A raw session: handshake by hand, keep the fds (ring, arena, doorbells). */
struct raw {
	int fd, fds[4];
	uint8_t buf[SKV_FRAME_HDR_SIZE + 65536];
};

static int raw_open(struct raw *r, int admin)
{
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	struct skv_frame_hdr h;
	unsigned nf = 4;
	size_t n;

	memset(r->fds, -1, sizeof(r->fds));
	r->fd = h_connect_raw(H.sock);
	if (r->fd < 0)
		return r->fd;
	hello.client_version = SKV_PROTO_VERSION;
	hello.admin = admin;
	n = snapkv__v1__hello__pack(&hello, r->buf);
	if (skv_frame_send(r->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, r->buf, n, NULL, 0, 0) < 0)
		return -EIO;
	if (skv_frame_recv(r->fd, r->buf, sizeof(r->buf), &h, r->fds, &nf, 0) < 0)
		return -EIO;
	return h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME ? 0 : -EPROTO;
}

static void raw_close(struct raw *r)
{
	for (int i = 0; i < 4; i++)
		if (r->fds[i] >= 0)
			close(r->fds[i]);
	close(r->fd);
}

/* Send a Request over the socket, return the Response status (or -errno). */
static int raw_request(struct raw *r, Snapkv__V1__Request *req, char *err, size_t errlen)
{
	struct skv_frame_hdr h;
	size_t n = snapkv__v1__request__pack(req, r->buf);
	Snapkv__V1__Response *resp;
	int st;

	if (skv_frame_send(r->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, r->buf, n, NULL, 0, 0) <
	    0)
		return -EIO;
	if (skv_frame_recv(r->fd, r->buf, sizeof(r->buf), &h, NULL, NULL, 0) < 0)
		return -EIO;
	if (h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE)
		return -EPROTO;
	resp = snapkv__v1__response__unpack(NULL, h.length, r->buf + SKV_FRAME_HDR_SIZE);
	if (!resp)
		return -EBADMSG;
	st = resp->status;
	if (err)
		snprintf(err, errlen, "%s", resp->error ? resp->error : "");
	snapkv__v1__response__free_unpacked(resp, NULL);
	return st;
}

/* RegisterBuffer by hand: returns the reply's status, *id its buffer id. */
static int raw_register(struct raw *r, int fd, uint64_t gen, uint64_t size, uint64_t *id)
{
	Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
	Snapkv__V1__RegisterReply *rr;
	struct skv_frame_hdr h;
	size_t n;
	int st;

	rb.generation = gen;
	rb.size = size;
	n = snapkv__v1__register_buffer__pack(&rb, r->buf);
	if (skv_frame_send(r->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, r->buf, n, &fd, 1, 0) <
	    0)
		return -EIO;
	if (skv_frame_recv(r->fd, r->buf, sizeof(r->buf), &h, NULL, NULL, 0) < 0 ||
	    h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY)
		return -EIO;
	rr = snapkv__v1__register_reply__unpack(NULL, h.length, r->buf + SKV_FRAME_HDR_SIZE);
	if (!rr)
		return -EBADMSG;
	st = rr->status;
	*id = rr->buffer_id;
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	return st;
}

static int raw_unregister(struct raw *r, uint64_t id)
{
	Snapkv__V1__Unregister m = SNAPKV__V1__UNREGISTER__INIT;
	Snapkv__V1__UnregisterReply *rr;
	struct skv_frame_hdr h;
	size_t n;
	int st;

	m.buffer_id = id;
	n = snapkv__v1__unregister__pack(&m, r->buf);
	if (skv_frame_send(r->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER, r->buf, n, NULL, 0,
			   0) < 0)
		return -EIO;
	if (skv_frame_recv(r->fd, r->buf, sizeof(r->buf), &h, NULL, NULL, 0) < 0 ||
	    h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY)
		return -EIO;
	rr = snapkv__v1__unregister_reply__unpack(NULL, h.length, r->buf + SKV_FRAME_HDR_SIZE);
	if (!rr)
		return -EBADMSG;
	st = rr->status;
	snapkv__v1__unregister_reply__free_unpacked(rr, NULL);
	return st;
}

static int sealed_memfd(size_t size)
{
	int fd = memfd_create("gen", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd >= 0 &&
	    (ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)) {
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * Imports are keyed by (session, generation), refcounted: the same
 * generation again is the same buffer id with one more ref (-EEXIST with
 * another size or memfd); each unregister drops one ref, and the buffer
 * stays usable until the last. Generation 0 is "none" and never matched.
 */
static void test_register_generation(void)
{
	struct raw r;
	uint64_t x = 0, y = 0, z = 0, z2 = 0, e = 0;
	int fa = sealed_memfd(16384), fb = sealed_memfd(16384);
	struct h_compact c;
	char err[256];

	CU_ASSERT_FATAL(fa >= 0 && fb >= 0);
	CU_ASSERT_EQUAL_FATAL(raw_open(&r, 0), 0);
	CU_ASSERT_EQUAL(raw_register(&r, fa, 7, 16384, &x), 0);
	CU_ASSERT(x != 0);
	CU_ASSERT_EQUAL(raw_register(&r, fa, 7, 16384, &y), 0);
	CU_ASSERT_EQUAL(y, x);
	CU_ASSERT_EQUAL(raw_register(&r, fa, 7, 8192, &e), -EEXIST);
	CU_ASSERT_EQUAL(raw_register(&r, fb, 7, 16384, &e), -EEXIST);
	CU_ASSERT_EQUAL(raw_register(&r, fb, 8, 16384, &y), 0);
	CU_ASSERT(y != x && y != 0);
	CU_ASSERT_EQUAL(raw_register(&r, fb, 0, 16384, &z), 0);
	CU_ASSERT_EQUAL(raw_register(&r, fb, 0, 16384, &z2), 0);
	CU_ASSERT(z != z2 && z != x && z != y);
	/* two registrations of generation 7: the first unregister leaves it usable */
	CU_ASSERT_EQUAL(raw_unregister(&r, x), 0);
	h_compact_init(&c, x, 1, 64, 16, 8, 4096, 8, 24);
	CU_ASSERT_EQUAL(raw_request(&r, &c.req, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(raw_unregister(&r, x), 0);
	CU_ASSERT_EQUAL(raw_request(&r, &c.req, err, sizeof(err)), -ENOENT);
	CU_ASSERT_EQUAL(raw_unregister(&r, x), -ENOENT);
	/* a fresh registration of the generation is a new import */
	CU_ASSERT_EQUAL(raw_register(&r, fa, 7, 16384, &e), 0);
	CU_ASSERT(e != x && e != 0);
	close(fa);
	close(fb);
	raw_close(&r);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 5000), 0);
}

static void test_isolation(void)
{
	struct skv_client *a = connect_engine("tenant-a");
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[4];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct prob p;
	struct raw r;
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__AppendRequest ap = SNAPKV__V1__APPEND_REQUEST__INIT;
	Snapkv__V1__ReleaseRequest rl = SNAPKV__V1__RELEASE_REQUEST__INIT;
	struct h_compact c;

	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	prob_init(&p, 64);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(a, p.bytes, &b), 0);
	prob_fill(&p, skv_buffer_data(b), 3);
	prob_desc(&p, b, lr, &d);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(a, &d, &k), 0);
	CU_ASSERT_EQUAL_FATAL(raw_open(&r, 0), 0);
	/* B names A's cache */
	ap.cache_id = skv_cache_info(k)->id;
	ap.tokens = 1;
	req.op_case = SNAPKV__V1__REQUEST__OP_APPEND;
	req.append = &ap;
	CU_ASSERT_EQUAL(raw_request(&r, &req, NULL, 0), -ENOENT);
	rl.cache_id = ap.cache_id;
	req.op_case = SNAPKV__V1__REQUEST__OP_RELEASE;
	req.release = &rl;
	CU_ASSERT_EQUAL(raw_request(&r, &req, NULL, 0), -ENOENT);
	/* B names A's buffer */
	h_compact_init(&c, skv_buffer_id(b), 1, 64, 16, 8, 0, 8, 24);
	CU_ASSERT_EQUAL(raw_request(&r, &c.req, NULL, 0), -ENOENT);
	raw_close(&r);
	/* A is untouched */
	CU_ASSERT_EQUAL(skv_cache_append(k, 1), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	skv_buffer_free(b);
	skv_client_close(a);
}

static void test_engine_killed(void)
{
	int pipefd[2];
	pid_t pid;
	char ch;
	struct timespec t0, t1;

	CU_ASSERT_EQUAL_FATAL(pipe(pipefd), 0);
	pid = fork();
	if (pid == 0) {
		struct skv_client *c = NULL;
		struct skv_buffer *b = NULL;
		struct skv_layer_ref lr[4];
		struct skv_compact_desc d;
		struct skv_request *rq;
		struct skv_cache *k;
		struct prob p;

		close(pipefd[0]);
		if (skv_client_connect(H.sock, NULL, &c) < 0)
			_exit(1);
		prob_init(&p, 2048);
		if (skv_buffer_alloc(c, p.bytes, &b) < 0)
			_exit(2);
		prob_fill(&p, skv_buffer_data(b), 9);
		prob_desc(&p, b, lr, &d);
		if (skv_client_compact(c, &d, &k) < 0) /* one cache held */
			_exit(3);
		for (int i = 0; i < 8; i++) /* several in flight */
			if (skv_compact_submit(c, &d, &rq) < 0)
				_exit(4);
		(void)!write(pipefd[1], "x", 1);
		pause();
		_exit(0);
	}
	close(pipefd[1]);
	CU_ASSERT_EQUAL(read(pipefd[0], &ch, 1), 1);
	close(pipefd[0]);
	CU_ASSERT(h_pool_used(H.sock) > 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	/*
	 * The target is "freed within 1 s"; the time is measured and printed,
	 * but only a 5 s deadline fails the test, so that a loaded CI machine
	 * cannot make it flake. Over 1 s is reported on stderr.
	 */
	int freed = h_wait_pool(H.sock, 0, 5000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	printf("\n    caches and arena freed %.1f ms after SIGKILL (target 1000 ms)\n    ", ms);
	if (freed == 0 && ms > 1000.0)
		fprintf(stderr, "engine SIGKILLed: freed only after %.1f ms (target 1000)\n", ms);
	CU_ASSERT_EQUAL(freed, 0);
	CU_ASSERT_EQUAL(h_sessions(H.sock), 0);
}

static void test_daemon_killed(void)
{
	struct skv_client *c = connect_engine("survivor");
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[4];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL, *k2 = NULL;
	struct prob p;
	int r;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	prob_init(&p, 64);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, p.bytes, &b), 0);
	prob_fill(&p, skv_buffer_data(b), 5);
	prob_desc(&p, b, lr, &d);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	int32_t first = skv_cache_positions(k, 0, 0)[0];
	h_kill(&H);
	r = skv_client_nop(c);
	CU_ASSERT(r == -ECONNRESET || r == -ENOTCONN);
	r = skv_cache_append(k, 1);
	CU_ASSERT(r == -ECONNRESET || r == -ENOTCONN);
	/* what the engine mapped stays readable */
	CU_ASSERT_EQUAL(skv_cache_positions(k, 0, 0)[0], first);
	/* refused, or reset by a listener the dying daemon's io_uring still held */
	r = skv_client_reconnect(c);
	CU_ASSERT(r == -ENOTCONN || r == -ECONNRESET);
	if (r != -ENOTCONN && r != -ECONNRESET)
		fprintf(stderr, "reconnect to a dead daemon: %d %s\n", r, skv_client_error(c));
	CU_ASSERT_EQUAL_FATAL(h_start(&H, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_reconnect(c), 0);
	CU_ASSERT_EQUAL(skv_client_nop(c), 0);
	/* the old cache is gone with the old daemon; buffers were re-registered */
	CU_ASSERT_EQUAL(skv_cache_append(k, 1), -ENOENT);
	skv_cache_release(k);
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k2), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k2), 0);
	skv_buffer_free(b);
	skv_client_close(c);
}

/*
 * A daemon that has died is not alive to the harness: kill(pid, 0) still
 * succeeds on its unreaped zombie, h_alive's waitpid(WNOHANG) reports it.
 */
static void test_harness_sees_death(void)
{
	struct harness h2 = {0};
	siginfo_t si;
	pid_t pid;
	int i;

	CU_ASSERT_EQUAL_FATAL(h_start(&h2, NULL), 0);
	pid = h2.pid;
	CU_ASSERT(h_alive(&h2));
	CU_ASSERT_EQUAL(kill(pid, SIGKILL), 0);
	/* until it can be reaped, left unreaped (WNOWAIT; 60 s: a hang guard) */
	for (i = 0; i < 6000; i++) {
		si.si_pid = 0;
		if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
		    si.si_pid == pid)
			break;
		h_sleep_ms(10);
	}
	CU_ASSERT_EQUAL(si.si_pid, pid);
	CU_ASSERT_EQUAL(kill(pid, 0), 0); /* the old check: "alive" */
	CU_ASSERT(!h_alive(&h2));
	CU_ASSERT_EQUAL(h2.pid, 0);
	CU_ASSERT(kill(pid, 0) < 0 && errno == ESRCH); /* reaped */
	h_cleanup(&h2);
}

/*
 * A test process that exits without stopping its daemon (a suite whose init
 * failed, a _FATAL assert past its h_stop) must not leave it behind: the
 * harness kills and reaps it at exit, and removes its socket directory.
 */
static void test_harness_reaps(void)
{
	int pfd[2];
	pid_t child, d = 0;
	char dir[64] = "";
	struct stat sb;
	int st, gone = 0;

	CU_ASSERT_EQUAL_FATAL(pipe(pfd), 0);
	fflush(NULL); /* the child exit()s: it must not print our buffers again */
	child = fork();
	if (child == 0) {
		struct harness h = {.pid = 0};

		close(pfd[0]);
		if (h_start(&h, NULL) < 0)
			_exit(1);
		if (write(pfd[1], &h.pid, sizeof(h.pid)) != sizeof(h.pid) ||
		    write(pfd[1], h.dir, sizeof(h.dir)) != sizeof(h.dir))
			_exit(2);
		exit(0); /* no h_stop, no h_cleanup: exit() runs the harness's atexit */
	}
	close(pfd[1]);
	CU_ASSERT_EQUAL(read(pfd[0], &d, sizeof(d)), (ssize_t)sizeof(d));
	CU_ASSERT_EQUAL(read(pfd[0], dir, sizeof(dir)), (ssize_t)sizeof(dir));
	close(pfd[0]);
	CU_ASSERT_EQUAL(waitpid(child, &st, 0), child);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CU_ASSERT_FATAL(d > 0 && dir[0] == '/');
	dir[sizeof(dir) - 1] = 0;
	/* reaped before the child exited: already gone, no zombie left to init */
	gone = kill(d, 0) < 0 && errno == ESRCH;
	CU_ASSERT(gone);
	if (!gone) { /* do not leave it behind either way */
		kill(d, SIGKILL);
		h_sleep_ms(100);
	}
	CU_ASSERT(stat(dir, &sb) < 0 && errno == ENOENT);
	/* the suite's own daemon is untouched */
	CU_ASSERT(h_alive(&H));
	CU_ASSERT_EQUAL(h_daemon_pid(H.sock), H.pid);
}

/* A request given up on: once finished, its cache goes back to the pool at
 * once; given up on before it finishes, the session end frees it. */
static void test_abandon(void)
{
	struct skv_client *c = connect_engine("abandon");
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[4];
	struct skv_compact_desc d;
	struct skv_request *rq = NULL;
	long long base;
	struct prob p;
	int polled = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	prob_init(&p, 512);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, p.bytes, &b), 0);
	prob_fill(&p, skv_buffer_data(b), 5);
	prob_desc(&p, b, lr, &d);
	base = h_pool_used(H.sock);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c, &d, &rq), 0);
	for (int i = 0; i < 5000 && (polled = skv_request_poll(rq)) == 0; i++)
		h_sleep_ms(1);
	CU_ASSERT_EQUAL(polled, 1);
	CU_ASSERT(h_pool_used(H.sock) > base);
	skv_request_abandon(rq); /* finished: its cache is released now */
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, base, 5000), 0);
	/* not finished yet (most likely): dropped when it completes, freed
	 * with the session */
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c, &d, &rq), 0);
	skv_request_abandon(rq);
	CU_ASSERT_EQUAL(skv_client_nop(c), 0); /* the ring is fine */
	skv_buffer_free(b);
	skv_client_close(c);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, base, 5000), 0);
}

static void test_sigterm_drains(void)
{
	struct skv_client *c = connect_engine("drain");
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[4];
	struct skv_compact_desc d;
	struct skv_request *rq[4];
	struct skv_cache *k[4] = {NULL};
	struct prob p;
	int st, ok = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	prob_init(&p, 1024);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, p.bytes, &b), 0);
	prob_fill(&p, skv_buffer_data(b), 11);
	prob_desc(&p, b, lr, &d);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c, &d, &rq[i]), 0);
	/* make sure the daemon has taken them off the ring: it consumes the SQ
	 * in order, so a NOP answered after them means they were taken (a fixed
	 * sleep was too short under ThreadSanitizer) */
	CU_ASSERT_EQUAL(skv_client_nop(c), 0);
	kill(H.pid, SIGTERM);
	for (int i = 0; i < 4; i++)
		if (skv_request_wait(rq[i], 5000, &k[i]) == 0)
			ok++;
	CU_ASSERT_EQUAL(ok, 4);
	waitpid(H.pid, &st, 0);
	h_reaped(&H);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fprintf(stderr, "snapkvd wait status 0x%x\n", st);
	/* The daemon is gone, and the caches it answered with are still whole in
	 * our mapping of the arena: exiting does not punch them out. */
	for (int i = 0; ok == 4 && i < 4; i++) {
		const struct skv_cache_info *ci = skv_cache_info(k[i]);
		int bad = 0, nonzero = 0;

		for (uint32_t l = 0; l < p.layers; l++)
			for (uint32_t h = 0; h < ci->h_store; h++) {
				const int32_t *pos = skv_cache_positions(k[i], l, h);
				const float *kk = skv_cache_k(k[i], l, h);

				for (uint32_t j = 0; j < ci->kept; j++) {
					bad += pos[j] < 0 || pos[j] >= (int32_t)p.L ||
					       (j && pos[j] <= pos[j - 1]);
					for (uint32_t e = 0; e < p.d; e++)
						nonzero +=
						    kk[(size_t)j * ci->token_stride + e] != 0.0f;
					if (i)
						bad +=
						    memcmp(kk + (size_t)j * ci->token_stride,
							   (const float *)skv_cache_k(k[0], l, h) +
							       (size_t)j * ci->token_stride,
							   p.d * 4) != 0;
				}
			}
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT(nonzero > 0);
		if (bad || !nonzero)
			fprintf(stderr,
				"cache %d after the daemon exited: %d bad rows, %d nonzero\n", i,
				bad, nonzero);
	}
	for (int i = 0; i < 4; i++)
		skv_cache_release(k[i]); /* the daemon is gone: just the handle */
	skv_buffer_free(b);
	skv_client_close(c);
	CU_ASSERT_EQUAL(h_start(&H, NULL), 0); /* for the suite's cleanup */
}

int main(void)
{
	CU_pSuite s;

	signal(SIGPIPE, SIG_IGN);
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("daemon-e2e", suite_init, suite_clean);
	CU_add_test(s, "handshake", test_handshake);
	CU_add_test(s, "registration", test_registration);
	CU_add_test(s, "compact HND = offline", test_compact_hnd);
	CU_add_test(s, "compact NHD group = offline", test_compact_nhd_group);
	CU_add_test(s, "compact bypass = offline", test_compact_bypass);
	CU_add_test(s, "compact paged f16 = offline", test_compact_paged_f16);
	CU_add_test(s, "compact with a long block table (socket)", test_compact_long_block_table);
	CU_add_test(s, "append, grow, release", test_append_grow_release);
	CU_add_test(s, "two engines at once", test_two_engines);
	CU_add_test(s, "registration keyed by generation, refcounted", test_register_generation);
	CU_add_test(s, "isolation", test_isolation);
	CU_add_test(s, "engine SIGKILLed mid-request", test_engine_killed);
	CU_add_test(s, "daemon killed, reconnect", test_daemon_killed);
	CU_add_test(s, "a daemon left running is reaped at exit", test_harness_reaps);
	CU_add_test(s, "a dead daemon is not alive (waitpid, not kill 0)", test_harness_sees_death);
	CU_add_test(s, "a request given up on", test_abandon);
	CU_add_test(s, "SIGTERM drains", test_sigterm_drains);
	return h_run_tests();
}
