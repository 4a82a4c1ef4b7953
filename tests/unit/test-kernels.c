// SPDX-License-Identifier: MIT
/*
 * test-kernels.c - libskv on the worked examples of SPEC.md (A-E and the
 * ledger), conversions, plans, every invalid parameter, NaN/Inf reporting.
 */
#include "test-kernels-util.h"

#define SQ2 1.41421356237309515

/* An L-token single-head problem whose window logits are ln(w[row][j]). */
static void build_exp_weights(struct prob *pb, uint32_t L, uint32_t W, const double (*w)[8])
{
	prob_init(pb, L, 2, 1, 1, 1);
	pb->sh.n_q = W;
	pb->q[0] = track(pb, calloc(2 * W, sizeof(float)));
	pb->k[0] = track(pb, calloc(2 * L, sizeof(float)));
	pb->v[0] = track(pb, calloc(2 * L, sizeof(float)));
	/* two window rows: q = [sqrt2, 0] and [0, sqrt2], k_j = [ln w0_j, ln w1_j] */
	pb->q[0][0] = (float)SQ2;
	pb->q[0][3] = (float)SQ2;
	for (uint32_t j = 0; j < L; j++) {
		pb->k[0][2 * j] = w[0][j] > 0 ? (float)log(w[0][j]) : 0.0f;
		pb->k[0][2 * j + 1] = (float)log(w[1][j]);
		pb->v[0][2 * j] = (float)j;
		pb->v[0][2 * j + 1] = (float)(100 + j);
	}
}

static void test_example_a(void)
{
	static const double w[2][8] = {{1, 2, 10, 8, 1, 1, 2, 0}, {1, 1, 8, 12, 1, 1, 1, 1}};
	struct prob pb;
	struct ref_result rr;

	build_exp_weights(&pb, 8, 2, w);
	pb.p.window = 2;
	pb.p.capacity = 5;
	pb.p.kernel = 3;
	pb.p.pooling = SKV_POOL_AVG;
	prob_build(&pb);

	/* the reference itself reproduces SPEC's numbers */
	CU_ASSERT_FATAL(ref_compact(&pb.sh, &pb.p, pb.q[0], pb.k[0], &rr) == 0);
	static const double pooled[6] = {0.06564, 0.30154, 0.53590, 0.52256, 0.31282, 0.05231};
	for (int j = 0; j < 6; j++)
		CU_ASSERT_DOUBLE_EQUAL(rr.score[j], pooled[j], 1e-5);
	ref_result_free(&rr);

	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, NULL), 0);
	static const int32_t want[5] = {2, 3, 4, 6, 7};
	CU_ASSERT(memcmp(pb.out[0].positions, want, sizeof(want)) == 0);
	const float *v = pb.out[0].v.data;
	for (int i = 0; i < 5; i++) {
		CU_ASSERT_EQUAL(v[2 * i], (float)want[i]);
		CU_ASSERT_EQUAL(v[2 * i + 1], (float)(100 + want[i]));
	}
	/* retained: row 6 keeps (10+8+1+2)/25, row 7 keeps (8+12+1+1+1)/26 */
	CU_ASSERT_DOUBLE_EQUAL(pb.out[0].retained_mass[0], (21.0 / 25 + 23.0 / 26) / 2, 1e-5);
	CU_ASSERT(prob_check(&pb, 0, NULL) == 0);
	prob_free(&pb);
}

static void test_example_a_raw_top(void)
{
	/* without pooling the raw top (3) wins instead: kept [0?]. k = 1 keeps 2 and 3
	 * both (budget 3), so shrink C to 3: one prefix slot, raw top is 3 */
	static const double w[2][8] = {{1, 2, 10, 8, 1, 1, 2, 0}, {1, 1, 8, 12, 1, 1, 1, 1}};
	struct prob pb;

	build_exp_weights(&pb, 8, 2, w);
	pb.p.window = 2;
	pb.p.capacity = 3;
	pb.p.kernel = 1;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, NULL), 0);
	static const int32_t raw[3] = {3, 6, 7};
	CU_ASSERT(memcmp(pb.out[0].positions, raw, sizeof(raw)) == 0);
	prob_free(&pb);

	build_exp_weights(&pb, 8, 2, w);
	pb.p.window = 2;
	pb.p.capacity = 3;
	pb.p.kernel = 3;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, NULL), 0);
	static const int32_t pooled[3] = {2, 6, 7};
	CU_ASSERT(memcmp(pb.out[0].positions, pooled, sizeof(pooled)) == 0);
	prob_free(&pb);
}

static void test_example_b(void)
{
	static const double w[2][8] = {{9, 1, 90, 0}, {9, 27, 2, 2}};
	struct prob pb;
	struct ref_result rr;

	build_exp_weights(&pb, 4, 2, w);
	pb.p.window = 2;
	pb.p.capacity = 3;
	pb.p.kernel = 1;
	prob_build(&pb);
	CU_ASSERT_FATAL(ref_compact(&pb.sh, &pb.p, pb.q[0], pb.k[0], &rr) == 0);
	CU_ASSERT_DOUBLE_EQUAL(rr.score[0], 0.315, 1e-6);
	CU_ASSERT_DOUBLE_EQUAL(rr.score[1], 0.685, 1e-6);
	ref_result_free(&rr);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, NULL), 0);
	static const int32_t want[3] = {1, 2, 3};
	CU_ASSERT(memcmp(pb.out[0].positions, want, sizeof(want)) == 0);
	prob_free(&pb);
}

static void test_example_c_bypass(void)
{
	struct prob pb;

	prob_init(&pb, 7, 4, 2, 1, 1);
	pb.p.window = 2;
	pb.p.capacity = 8; /* L = C - 1 */
	pb.sh.n_q = 2;
	pb.dout = SKV_DTYPE_BF16;
	prob_random(&pb, 1.0);
	/* nothing is scored: a NaN query changes nothing */
	pb.q[0][0] = NAN;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 2, NULL), 0);
	for (uint32_t h = 0; h < 2; h++) {
		for (int i = 0; i < 7; i++)
			CU_ASSERT_EQUAL(pb.out[0].positions[h * pb.out[0].pos_stride + i], i);
		CU_ASSERT_EQUAL(pb.out[0].retained_mass[h], 1.0f);
	}
	pb.q[0][0] = 0; /* the reference computes nothing in bypass either */
	CU_ASSERT(prob_check(&pb, 0, NULL) == 0);

	struct skv_plan pl;
	CU_ASSERT_EQUAL(skv_plan(&pb.sh, &pb.p, &pl, NULL), 0);
	CU_ASSERT_EQUAL(pl.bypass, 1);
	CU_ASSERT_EQUAL(pl.kept, 7);
	CU_ASSERT_EQUAL(pl.h_store, 2);
	prob_free(&pb);
}

static void test_example_d_heads_differ(void)
{
	struct prob pb;

	/* two heads, L 6, W 2, C 4: head 0 looks at 0 and 1, head 1 at 2 and 3 */
	prob_init(&pb, 6, 2, 2, 2, 1);
	pb.p.window = 2;
	pb.p.capacity = 4;
	pb.p.kernel = 1;
	pb.sh.n_q = 2;
	pb.q[0] = track(&pb, calloc(2 * 2 * 2, sizeof(float)));
	pb.k[0] = track(&pb, calloc(2 * 6 * 2, sizeof(float)));
	pb.v[0] = track(&pb, calloc(2 * 6 * 2, sizeof(float)));
	for (int h = 0; h < 2; h++) {
		for (int i = 0; i < 2; i++)
			pb.q[0][(h * 2 + i) * 2] = 1.0f;
		for (int j = 0; j < 6; j++) {
			bool hot = h == 0 ? j < 2 : (j == 2 || j == 3);
			pb.k[0][(h * 6 + j) * 2] = hot ? 3.0f : 0.0f;
			pb.k[0][(h * 6 + j) * 2 + 1] = (float)(10 * h + j);
			pb.v[0][(h * 6 + j) * 2] = (float)(100 * h + j);
			pb.v[0][(h * 6 + j) * 2 + 1] = -(float)(100 * h + j);
		}
	}
	pb.lout = LAY_NHD;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 2, NULL), 0);
	static const int32_t w0[4] = {0, 1, 4, 5}, w1[4] = {2, 3, 4, 5};
	const struct skv_layer_out *o = &pb.out[0];
	CU_ASSERT(memcmp(o->positions, w0, sizeof(w0)) == 0);
	CU_ASSERT(memcmp(o->positions + o->pos_stride, w1, sizeof(w1)) == 0);
	CU_ASSERT(prob_check(&pb, 0, NULL) == 0); /* checks K/V pairing too */
	prob_free(&pb);
}

/* Softmax attention output of a D = 1 query over n (k, v) rows. */
static double attend1(float q, const float *k, const float *v, unsigned n)
{
	double m = -INFINITY, sum = 0, out = 0;
	for (unsigned j = 0; j < n; j++)
		m = fmax(m, (double)q * k[j]);
	for (unsigned j = 0; j < n; j++) {
		double w = exp((double)q * k[j] - m);
		sum += w;
		out += w * v[j];
	}
	return out / sum;
}

static void test_example_e_dropping(void)
{
	struct prob pb;

	/* equal logits on the prefix, V = [0, 10]: keeping one slot of two keeps the
	 * smaller position (tie), and the attention output moves from 5 to 0 */
	prob_init(&pb, 3, 1, 1, 1, 1);
	pb.p.window = 1;
	pb.p.capacity = 2;
	pb.p.kernel = 1;
	pb.sh.n_q = 1;
	pb.q[0] = track(&pb, calloc(1, sizeof(float)));
	pb.k[0] = track(&pb, calloc(3, sizeof(float)));
	pb.v[0] = track(&pb, calloc(3, sizeof(float)));
	pb.q[0][0] = 1;
	pb.k[0][0] = pb.k[0][1] = 1;
	pb.k[0][2] = -30;
	pb.v[0][0] = 0;
	pb.v[0][1] = 10;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, NULL), 0);
	const int32_t *pos = pb.out[0].positions;
	CU_ASSERT_EQUAL(pos[0], 0);
	CU_ASSERT_EQUAL(pos[1], 2);
	/* the window query attends over the full cache, then over the compact
	 * one (K and V rows as gathered by the kernel) */
	double full = attend1(pb.q[0][0], pb.k[0], pb.v[0], 3);
	double compact = attend1(pb.q[0][0], pb.out[0].k.data, pb.out[0].v.data, 2);
	CU_ASSERT_DOUBLE_EQUAL(full, 5.0, 1e-9);
	CU_ASSERT_DOUBLE_EQUAL(compact, 0.0, 1e-9);
	prob_free(&pb);
}

/* all logits equal: ties everywhere; avg pooling's zero padding lowers the edges */
static void test_ties(void)
{
	static const struct {
		enum skv_pooling pool;
		uint32_t kernel;
		int32_t want[7];
	} cases[] = {
	    {SKV_POOL_AVG, 1, {0, 1, 2, 3, 4, 18, 19}},
	    {SKV_POOL_MAX, 3, {0, 1, 2, 3, 4, 18, 19}},
	    {SKV_POOL_AVG, 3, {1, 2, 3, 4, 5, 18, 19}}, /* 0 and 17 see one pad */
	    {SKV_POOL_AVG, 5, {2, 3, 4, 5, 6, 18, 19}},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct prob pb;
		prob_init(&pb, 20, 4, 1, 1, 1);
		pb.p.window = 2;
		pb.p.capacity = 7;
		pb.p.kernel = cases[c].kernel;
		pb.p.pooling = cases[c].pool;
		pb.sh.n_q = 2;
		pb.q[0] = track(&pb, calloc(2 * 4, sizeof(float))); /* q = 0: logits 0 */
		pb.k[0] = master_random(&pb, SKV_DTYPE_F32, 20 * 4, 1.0);
		pb.v[0] = master_random(&pb, SKV_DTYPE_F32, 20 * 4, 1.0);
		prob_build(&pb);
		CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, NULL), 0);
		CU_ASSERT(memcmp(pb.out[0].positions, cases[c].want, sizeof(cases[c].want)) == 0);
		CU_ASSERT(prob_check(&pb, 0, NULL) == 0);
		prob_free(&pb);
	}
}

static void test_zero_layers(void)
{
	struct skv_ctx *ctx;
	struct skv_shape sh = {.prompt_len = 8, .head_dim = 4, .h_q = 1, .h_kv = 1, .n_q = 2};
	struct skv_params p;
	struct skv_error e;

	skv_params_init(&p);
	p.window = 2;
	p.capacity = 4;
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL(skv_compact(ctx, &sh, &p, 0, NULL, NULL, &e), 0);
	CU_ASSERT_EQUAL(skv_compact(ctx, &sh, &p, 1, NULL, NULL, &e), -EINVAL);
	CU_ASSERT_EQUAL(skv_compact(NULL, &sh, &p, 1, NULL, NULL, &e), -EINVAL);
	skv_ctx_free(ctx);
}

static void test_ledger(void)
{
	struct skv_ledger_in in = {
	    .batch = 1,
	    .layers = 32,
	    .h_q = 32,
	    .h_kv = 8,
	    .head_dim = 128,
	    .dtype_bytes = 2,
	    .prompt_len = 16384,
	    .capacity = 1024,
	    .appended = 512,
	    .reserve = 512,
	    .gqa = SKV_GQA_EXPAND,
	};
	struct skv_ledger l;

	CU_ASSERT_EQUAL_FATAL(skv_ledger_compute(&in, &l), 0);
	CU_ASSERT_EQUAL(l.native_full, 2214592512ull);
	CU_ASSERT_EQUAL(l.compact, 805306368ull);
	CU_ASSERT_EQUAL(l.compact * 11, l.native_full * 4);
	CU_ASSERT_EQUAL(l.index, 4ull * 32 * 32 * 1536);
	CU_ASSERT_EQUAL(l.reserved, 0);
	CU_ASSERT_EQUAL(l.h_store, 32);
	in.gqa = SKV_GQA_GROUP;
	in.reserve = 1024;
	CU_ASSERT_EQUAL_FATAL(skv_ledger_compute(&in, &l), 0);
	CU_ASSERT_EQUAL(l.compact, 201326592ull);
	CU_ASSERT_EQUAL(l.compact * 11, l.native_full);
	CU_ASSERT_EQUAL(l.reserved, 2ull * 32 * 8 * 512 * 128 * 2);
	CU_ASSERT_EQUAL(l.h_store, 8);
	/* bad inputs */
	struct skv_ledger_in b = in;
	b.appended = b.reserve + 1;
	CU_ASSERT_EQUAL(skv_ledger_compute(&b, &l), -EINVAL);
	b = in;
	b.head_dim = 0;
	CU_ASSERT_EQUAL(skv_ledger_compute(&b, &l), -EINVAL);
	b = in;
	b.h_kv = 7;
	CU_ASSERT_EQUAL(skv_ledger_compute(&b, &l), -EINVAL);
	b = in;
	b.batch = 1ull << 40;
	b.layers = 1ull << 30;
	CU_ASSERT_EQUAL(skv_ledger_compute(&b, &l), -EOVERFLOW);
}

static void test_conversions(void)
{
	CU_ASSERT_EQUAL(skv_f32_to_f16(1.0f), 0x3c00);
	CU_ASSERT_EQUAL(skv_f32_to_f16(-2.0f), 0xc000);
	CU_ASSERT_EQUAL(skv_f32_to_f16(65504.0f), 0x7bff);
	CU_ASSERT_EQUAL(skv_f32_to_f16(65520.0f), 0x7c00);
	CU_ASSERT_EQUAL(skv_f32_to_f16(5.9604645e-8f), 0x0001);	     /* smallest subnormal */
	CU_ASSERT_EQUAL(skv_f32_to_f16(2.9802322e-8f), 0x0000);	     /* half of it: even */
	CU_ASSERT_EQUAL(skv_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00); /* tie to even */
	CU_ASSERT_EQUAL(skv_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02); /* tie to even (up) */
	CU_ASSERT(isnan(skv_f16_to_f32(skv_f32_to_f16(NAN))));
	CU_ASSERT_EQUAL(skv_f16_to_f32(0x0001), 5.9604645e-8f);
	CU_ASSERT_EQUAL(skv_f16_to_f32(0x7c00), INFINITY);
	CU_ASSERT_EQUAL(skv_f32_to_bf16(1.0f), 0x3f80);
	CU_ASSERT_EQUAL(skv_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie to even */
	CU_ASSERT_EQUAL(skv_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82); /* tie to even */
	CU_ASSERT_EQUAL(skv_f32_to_bf16(1.0f + 1.5f / 256), 0x3f81); /* above half */
	CU_ASSERT(isnan(skv_bf16_to_f32(skv_f32_to_bf16(NAN))));
	CU_ASSERT_EQUAL(skv_bf16_to_f32(0x3f80), 1.0f);
	/* every f16 survives a round trip through f32 */
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = skv_f16_to_f32((uint16_t)h);
		if (isnan(f))
			continue;
		if (skv_f32_to_f16(f) != h) {
			CU_FAIL("f16 round trip");
			break;
		}
	}
	CU_ASSERT_EQUAL(skv_dtype_size(SKV_DTYPE_BF16), 2);
	CU_ASSERT_EQUAL(skv_dtype_size(SKV_DTYPE_UNSPECIFIED), 0);
	CU_ASSERT_STRING_EQUAL(skv_dtype_name(SKV_DTYPE_F16), "f16");
	CU_ASSERT_PTR_NULL(skv_dtype_name((enum skv_dtype)9));
	CU_ASSERT_STRING_EQUAL(skv_policy_name(SKV_POLICY_STREAMINGLLM), "streamingllm");
}

static void test_plan(void)
{
	struct skv_shape sh = {
	    .prompt_len = 4096, .head_dim = 128, .h_q = 32, .h_kv = 8, .n_q = 32};
	struct skv_params p;
	struct skv_plan pl;
	struct skv_error e;

	skv_params_init(&p);
	CU_ASSERT_EQUAL(p.window, 32);
	CU_ASSERT_EQUAL(p.capacity, 2048);
	CU_ASSERT_EQUAL(p.kernel, 5);
	CU_ASSERT_EQUAL(p.pooling, SKV_POOL_AVG);
	CU_ASSERT_EQUAL(p.gqa, SKV_GQA_EXPAND);
	CU_ASSERT_EQUAL(p.policy, SKV_POLICY_SNAPKV);
	CU_ASSERT_EQUAL_FATAL(skv_plan(&sh, &p, &pl, &e), 0);
	CU_ASSERT_EQUAL(pl.h_store, 32);
	CU_ASSERT_EQUAL(pl.kept, 2048);
	CU_ASSERT_EQUAL(pl.w_obs, 32);
	CU_ASSERT_EQUAL(pl.w_keep, 32);
	CU_ASSERT_EQUAL(pl.sinks, 0);
	CU_ASSERT_EQUAL(pl.bypass, 0);
	p.gqa = SKV_GQA_GROUP;
	CU_ASSERT_EQUAL_FATAL(skv_plan(&sh, &p, &pl, &e), 0);
	CU_ASSERT_EQUAL(pl.h_store, 8);
	/* L == C scores */
	sh.prompt_len = 2048;
	CU_ASSERT_EQUAL_FATAL(skv_plan(&sh, &p, &pl, &e), 0);
	CU_ASSERT_EQUAL(pl.bypass, 0);
	CU_ASSERT_EQUAL(pl.kept, 2048);
	sh.prompt_len = 4096;
	/* h2o: all rows vote */
	p.policy = SKV_POLICY_H2O;
	sh.n_q = 4096;
	CU_ASSERT_EQUAL_FATAL(skv_plan(&sh, &p, &pl, &e), 0);
	CU_ASSERT_EQUAL(pl.w_obs, 4096);
	CU_ASSERT_EQUAL(pl.w_keep, 32);
	/* streamingllm: S sinks + C - S recent */
	p.policy = SKV_POLICY_STREAMINGLLM;
	sh.n_q = 0;
	CU_ASSERT_EQUAL_FATAL(skv_plan(&sh, &p, &pl, &e), 0);
	CU_ASSERT_EQUAL(pl.sinks, 4);
	CU_ASSERT_EQUAL(pl.w_keep, 2044);
	CU_ASSERT_EQUAL(pl.w_obs, 0);
	p.n_protected = 1;
	p.protected_ranges[0] = (struct skv_range){2, 100}; /* overlaps the sinks */
	CU_ASSERT_EQUAL_FATAL(skv_plan(&sh, &p, &pl, &e), 0);
	CU_ASSERT_EQUAL(pl.w_keep, 2048 - 100);
	p.policy = SKV_POLICY_WINDOW;
	p.n_protected = 0;
	CU_ASSERT_EQUAL_FATAL(skv_plan(&sh, &p, &pl, &e), 0);
	CU_ASSERT_EQUAL(pl.sinks, 0);
	CU_ASSERT_EQUAL(pl.w_keep, 2048);
}

/* each case: mutate a valid problem; expect -EINVAL, a reason, nothing written */
static void test_invalid(void)
{
	for (int c = 0;; c++) {
		struct prob pb;
		struct skv_error e;
		bool done = false;
		prob_init(&pb, 40, 8, 4, 2, 2);
		pb.p.window = 4;
		pb.p.capacity = 16;
		pb.p.kernel = 3;
		pb.sh.n_q = 4;
		pb.lin = LAY_PAGED;
		prob_random(&pb, 1.0);
		prob_build(&pb);
		const char *what = "";
		switch (c) {
		case 0:
			what = "even kernel";
			pb.p.kernel = 4;
			break;
		case 1:
			what = "kernel 0";
			pb.p.kernel = 0;
			break;
		case 2:
			what = "unknown policy";
			pb.p.policy = (enum skv_policy)9;
			break;
		case 3:
			what = "unknown pooling";
			pb.p.pooling = SKV_POOL_UNSPECIFIED;
			break;
		case 4:
			what = "unknown gqa";
			pb.p.gqa = (enum skv_gqa)7;
			break;
		case 5:
			what = "h_q not a multiple of h_kv";
			pb.sh.h_kv = 3;
			break;
		case 6:
			what = "D = 0";
			pb.sh.head_dim = 0;
			break;
		case 7:
			what = "W > L";
			pb.p.window = 41;
			pb.p.capacity = 60;
			pb.sh.n_q = 41;
			break;
		case 8:
			what = "C <= W";
			pb.p.capacity = 4;
			break;
		case 9:
			what = "protected + W > C";
			pb.p.n_protected = 2;
			pb.p.protected_ranges[0] = (struct skv_range){0, 8};
			pb.p.protected_ranges[1] = (struct skv_range){10, 15};
			break;
		case 10:
			what = "snapkv n_q != W";
			pb.sh.n_q = 5;
			break;
		case 11:
			what = "h2o n_q != L";
			pb.p.policy = SKV_POLICY_H2O;
			break;
		case 12:
			what = "params_size";
			pb.p.params_size = 12;
			break;
		case 13:
			what = "empty protected range";
			pb.p.n_protected = 1;
			pb.p.protected_ranges[0] = (struct skv_range){5, 5};
			break;
		case 14:
			what = "protected range past L";
			pb.p.n_protected = 1;
			pb.p.protected_ranges[0] = (struct skv_range){30, 41};
			break;
		case 15:
			what = "sinks > C";
			pb.p.policy = SKV_POLICY_STREAMINGLLM;
			pb.p.sinks = 17;
			break;
		case 16:
			what = "protected + S > C";
			pb.p.policy = SKV_POLICY_STREAMINGLLM;
			pb.p.sinks = 4;
			pb.p.n_protected = 1;
			pb.p.protected_ranges[0] = (struct skv_range){10, 23};
			break;
		case 17:
			what = "unknown dtype";
			pb.in[1].k.dtype = (enum skv_dtype)5;
			break;
		case 18:
			what = "no v data";
			pb.in[1].v.data = NULL;
			break;
		case 19:
			what = "paged output without pool_blocks";
			pb.out[1].k.block_table = pb.in[0].k.block_table;
			pb.out[1].k.block_size = 5;
			pb.out[1].k.n_blocks = 8;
			break;
		case 20:
			what = "pos_stride too small";
			pb.out[1].pos_stride = 15;
			break;
		case 21:
			what = "L = 0";
			pb.sh.prompt_len = 0;
			break;
		case 22:
			what = "h_kv = 0";
			pb.sh.h_kv = 0;
			break;
		case 23:
			what = "block table too short";
			pb.in[1].v.n_blocks = 7;
			break;
		case 24:
			what = "negative block";
			((int32_t *)pb.in[1].k.block_table)[2] = -1;
			break;
		case 25:
			what = "capacity 0";
			pb.p.capacity = 0;
			break;
		case 26:
			what = "no positions";
			pb.out[0].positions = NULL;
			break;
		case 27:
			what = "snapkv W = 0";
			pb.p.window = 0;
			pb.sh.n_q = 0;
			break;
		case 28:
			what = "no q data";
			pb.in[0].q.data = NULL;
			break;
		case 29:
			what = "block_size 0";
			pb.in[0].k.block_size = 0;
			break;
		case 30:
			what = "too many protected ranges";
			pb.p.n_protected = SKV_MAX_PROTECTED + 1;
			break;
		default:
			done = true;
		}
		if (done) {
			prob_free(&pb);
			break;
		}
		e.msg[0] = 0;
		int r = prob_run(&pb, 2, &e);
		if (r != -EINVAL || !e.msg[0] || !canary_intact(&pb)) {
			fprintf(stderr, "\n  case %d (%s): rc %d msg '%s' canary %d\n", c, what, r,
				e.msg, canary_intact(&pb));
			CU_FAIL("invalid parameter accepted or output written");
		}
		prob_free(&pb);
	}
}

static void test_nan_edom(void)
{
	struct prob pb;
	struct skv_error e;

	prob_init(&pb, 40, 8, 4, 2, 2);
	pb.p.window = 4;
	pb.p.capacity = 16;
	pb.sh.n_q = 4;
	prob_random(&pb, 1.0);
	/* layer 1, query head 3, last window row */
	pb.q[1][((size_t)3 * 4 + 3) * 8 + 5] = NAN;
	prob_build(&pb);
	CU_ASSERT_EQUAL(prob_run(&pb, 3, &e), -EDOM);
	CU_ASSERT_EQUAL(e.layer, 1);
	CU_ASSERT_EQUAL(e.head, 3);
	CU_ASSERT(strstr(e.msg, "layer 1") != NULL);
	prob_free(&pb);

	/* Inf in a key of layer 0, kv head 1: the first query head of that group */
	prob_init(&pb, 40, 8, 4, 2, 2);
	pb.p.window = 4;
	pb.p.capacity = 16;
	pb.p.gqa = SKV_GQA_GROUP;
	pb.sh.n_q = 4;
	pb.dk = SKV_DTYPE_BF16;
	prob_random(&pb, 1.0);
	pb.k[0][((size_t)1 * 40 + 17) * 8 + 2] = INFINITY;
	pb.lin = LAY_NHD;
	prob_build(&pb);
	CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), -EDOM);
	CU_ASSERT_EQUAL(e.layer, 0);
	CU_ASSERT_EQUAL(e.head, 2);
	prob_free(&pb);

	/* bf16 queries and keys (the BF16 dot-product path where the CPU has it) */
	prob_init(&pb, 60, 16, 4, 1, 3);
	pb.p.window = 8;
	pb.p.capacity = 20;
	pb.sh.n_q = 8;
	pb.dq = pb.dk = SKV_DTYPE_BF16;
	prob_random(&pb, 1.0);
	pb.q[2][((size_t)1 * 8 + 0) * 16 + 9] = -INFINITY;
	prob_build(&pb);
	CU_ASSERT_EQUAL(prob_run(&pb, 2, &e), -EDOM);
	CU_ASSERT_EQUAL(e.layer, 2);
	CU_ASSERT_EQUAL(e.head, 1);
	prob_free(&pb);
}

static void test_ctx(void)
{
	struct skv_ctx *ctx;

	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(0, &ctx), 0);
	CU_ASSERT(skv_ctx_threads(ctx) >= 1);
	const char *isa = skv_ctx_isa(ctx);
	CU_ASSERT(isa && (!strcmp(isa, "avx512") || !strcmp(isa, "avx512bf16") ||
			  !strcmp(isa, "avx2") || !strcmp(isa, "scalar")));
	skv_ctx_free(ctx);
	skv_ctx_free(NULL);
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(3, &ctx), 0);
	CU_ASSERT_EQUAL(skv_ctx_threads(ctx), 3);
	skv_ctx_free(ctx);
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	CU_pSuite s = CU_add_suite("kernels_spec", NULL, NULL);
	CU_add_test(s, "example A: pooling changes the winner", test_example_a);
	CU_add_test(s, "example A: raw top without pooling", test_example_a_raw_top);
	CU_add_test(s, "example B: full-softmax denominator", test_example_b);
	CU_add_test(s, "example C: bypass", test_example_c_bypass);
	CU_add_test(s, "example D: heads differ", test_example_d_heads_differ);
	CU_add_test(s, "example E: dropping changes outputs", test_example_e_dropping);
	CU_add_test(s, "ties go to the smaller position; pooling edges", test_ties);
	CU_add_test(s, "zero layers, missing arguments", test_zero_layers);
	CU_add_test(s, "ledger worked example", test_ledger);
	CU_add_test(s, "dtype conversions", test_conversions);
	CU_add_test(s, "plan", test_plan);
	CU_add_test(s, "invalid parameters: -EINVAL, nothing written", test_invalid);
	CU_add_test(s, "NaN/Inf: -EDOM naming layer and head", test_nan_edom);
	CU_add_test(s, "context", test_ctx);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned f = CU_get_number_of_failures();
	CU_cleanup_registry();
	return f ? 1 : 0;
}
