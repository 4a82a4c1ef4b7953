// SPDX-License-Identifier: MIT
/*
 * test-kernels-random.c - libskv against the scalar reference on random
 * tensors: shapes, windows, budgets, kernels, poolings, GQA modes, dtypes,
 * layouts (HND, NHD, paged), every policy, protected ranges, bypass and
 * L == C; every SIMD path the CPU has; thread-count invariance.
 */
#include "test-kernels-util.h"

static const enum skv_dtype dtypes[3] = {SKV_DTYPE_F32, SKV_DTYPE_F16, SKV_DTYPE_BF16};

static uint32_t pick(uint32_t n)
{
	return (uint32_t)(rng_next() % n);
}

/* snapkv problems get a partial window (SPEC.md): n_q < W rows */
static bool partial_window;
/* K and V in this fp8 dtype with random scales (SPEC.md "Quantized K/V") */
static enum skv_dtype fp8_kv;

/* one random snapkv-family problem; policy chosen by the caller */
static void random_prob(struct prob *pb, enum skv_policy pol, bool protect)
{
	static const uint32_t Ls[] = {9, 37, 64, 100, 257};
	static const uint32_t Ds[] = {1, 4, 16, 24, 64, 128};
	static const uint32_t heads[][2] = {{1, 1}, {2, 2}, {4, 2}, {6, 2}, {8, 1}};
	uint32_t L = Ls[pick(5)], D = Ds[pick(6)];
	const uint32_t *hh = heads[pick(5)];
	uint32_t n_layers = 1 + pick(3);

	prob_init(pb, L, D, hh[0], hh[1], n_layers);
	pb->p.policy = pol;
	uint32_t W = 1 + pick(L < 16 ? L : 16);
	if (W >= L)
		W = L - 1 ? L - 1 : 1;
	pb->p.window = W;
	/* C: just above W, mid, == L, or above L (bypass) */
	uint32_t cs[4] = {W + 1 + pick(3), W + 1 + (L - W) / 2, L, L + 1 + pick(5)};
	pb->p.capacity = cs[pick(4)];
	if (pb->p.capacity <= W)
		pb->p.capacity = W + 1;
	pb->p.kernel = 1 + 2 * pick(4);
	pb->p.pooling = pick(2) ? SKV_POOL_AVG : SKV_POOL_MAX;
	pb->p.gqa = pick(2) ? SKV_GQA_EXPAND : SKV_GQA_GROUP;
	pb->p.sinks = pick(6);
	if (pb->p.sinks > pb->p.capacity)
		pb->p.sinks = pb->p.capacity;
	switch (pol) {
	case SKV_POLICY_SNAPKV:
		pb->sh.n_q = W;
		if (partial_window && W >= 2) {
			/* min_window 1 .. W-1 given, or 0 (8) when W > 8; n_q in
			 * [min, W); C sometimes in (W', W] where only W' < C holds */
			uint32_t wmin = W > 8 && pick(2) ? 0 : 1 + pick(W - 1);
			uint32_t lo = wmin ? wmin : 8;
			pb->p.min_window = wmin;
			pb->sh.n_q = lo + pick(W - lo);
			if (pick(3) == 0)
				pb->p.capacity = pb->sh.n_q + 1 + pick(W - pb->sh.n_q);
		}
		break;
	case SKV_POLICY_H2O:
		pb->sh.n_q = L;
		break;
	default:
		pb->sh.n_q = pick(2) ? 0 : 1 + pick(L);
		break;
	}
	if (protect && L > 8) {
		/* up to 3 ranges in the prefix, kept within the budget */
		uint32_t n = 1 + pick(3);
		for (uint32_t i = 0; i < n; i++) {
			uint32_t b = pick(L - 4), len = 1 + pick(4);
			pb->p.protected_ranges[pb->p.n_protected++] =
			    (struct skv_range){b, b + len};
		}
		struct skv_plan pl;
		while (pb->p.n_protected && skv_plan(&pb->sh, &pb->p, &pl, NULL) < 0)
			pb->p.n_protected--;
	}
	pb->dq = dtypes[pick(3)];
	pb->dk = dtypes[pick(3)];
	pb->dv = dtypes[pick(3)];
	pb->dout = pick(2) ? pb->dk : dtypes[pick(3)];
	if (fp8_kv) {
		/* scales that are not powers of two, so that s * byte rounds */
		static const float scales[5] = {1.0f, 0.0371f, 0.31f, 2.7f, 1.0f / 448.0f};
		pb->dk = pb->dv = pb->dout = fp8_kv;
		pb->sk = scales[pick(5)];
		pb->sv = scales[pick(5)];
	}
	pb->lin = (enum layout)pick(3);
	pb->lout = (enum layout)pick(2);
	pb->block_size = 1 + pick(8);
}

static const char *isa_names[5] = {"scalar", "avx2", "avx512", "avx512bf16", NULL};

static void run_random(enum skv_policy pol, bool protect, int cases)
{
	int tolerated_total = 0, bad = 0;

	for (int c = 0; c < cases; c++) {
		struct prob pb;
		random_prob(&pb, pol, protect);
		prob_random(&pb, 1.2);
		prob_build(&pb);
		struct skv_error e;
		/* rotate over the SIMD paths: scalar, avx2, avx512 (f32 dots), vdpbf16ps, default
		 */
		const char *isa = isa_names[c % 5];
		if (isa)
			setenv("SKV_ISA", isa, 1);
		else
			unsetenv("SKV_ISA");
		int r = prob_run(&pb, 1 + c % 3, &e);
		unsetenv("SKV_ISA");
		if (r != 0) {
			fprintf(stderr, "\n  case %d: rc %d %s\n", c, r, e.msg);
			CU_FAIL("compact failed");
			prob_free(&pb);
			continue;
		}
		int tol = 0;
		/* f32 inputs: sets equal up to near-ties at 1e-5; half inputs alike */
		if (prob_check(&pb, 1e-5, &tol) < 0) {
			fprintf(stderr,
				"\n  case %d: policy %s L %u D %u hq %u hkv %u W %u C %u k %u "
				"pool %d gqa %d isa %s dt %d/%d/%d->%d lay %d/%d np %u\n",
				c, skv_policy_name(pol), pb.sh.prompt_len, pb.sh.head_dim,
				pb.sh.h_q, pb.sh.h_kv, pb.p.window, pb.p.capacity, pb.p.kernel,
				pb.p.pooling, pb.p.gqa, isa ? isa : "best", pb.dq, pb.dk, pb.dv,
				pb.dout, pb.lin, pb.lout, pb.p.n_protected);
			bad++;
		}
		tolerated_total += tol;
		prob_free(&pb);
	}
	CU_ASSERT_EQUAL(bad, 0);
	/* near-ties must stay rare, or the comparison proves nothing */
	CU_ASSERT(tolerated_total <= cases / 10);
}

static void test_random_snapkv(void)
{
	run_random(SKV_POLICY_SNAPKV, false, 150);
}

static void test_random_snapkv_protected(void)
{
	run_random(SKV_POLICY_SNAPKV, true, 60);
}

/* SPEC.md "Partial window": n_q < W rows vote and are the kept window */
static void test_random_partial_window(void)
{
	partial_window = true;
	run_random(SKV_POLICY_SNAPKV, false, 120);
	run_random(SKV_POLICY_SNAPKV, true, 40);
	partial_window = false;
}

static int partial_rc(uint32_t W, uint32_t n_q, uint32_t min_window, uint32_t params_size,
		      struct skv_error *e)
{
	struct skv_shape sh = {.prompt_len = 64, .head_dim = 8, .h_q = 2, .h_kv = 1, .n_q = n_q};
	struct skv_params p;
	struct skv_plan pl;

	skv_params_init(&p);
	p.window = W;
	p.capacity = 40;
	p.min_window = min_window;
	if (params_size)
		p.params_size = params_size;
	int r = skv_plan(&sh, &p, &pl, e);
	if (r == 0)
		CU_ASSERT_EQUAL(pl.w_obs, n_q < W ? n_q : W);
	return r;
}

/* fp8 K/V against the reference that dequantizes, every policy, all ISAs */
static void test_random_fp8(void)
{
	static const enum skv_dtype f8[2] = {SKV_DTYPE_F8E4M3FN, SKV_DTYPE_F8E5M2};
	for (int i = 0; i < 2; i++) {
		fp8_kv = f8[i];
		run_random(SKV_POLICY_SNAPKV, false, 60);
		run_random(SKV_POLICY_SNAPKV, true, 20);
		run_random(SKV_POLICY_H2O, false, 10);
		run_random(SKV_POLICY_STREAMINGLLM, true, 10);
		partial_window = true;
		run_random(SKV_POLICY_SNAPKV, false, 20);
		partial_window = false;
	}
	fp8_kv = SKV_DTYPE_UNSPECIFIED;
}

/* one fp8 problem: L 40, W 8, C 16, K/V in dt at scale 0.5 */
static void fp8_prob(struct prob *pb, enum skv_dtype dt)
{
	prob_init(pb, 40, 8, 2, 1, 1);
	pb->p.window = 8;
	pb->p.capacity = 16;
	pb->sh.n_q = 8;
	pb->dk = pb->dv = pb->dout = dt;
	pb->sk = pb->sv = 0.5f;
	prob_random(pb, 1.0);
	prob_build(pb);
}

/* NaN and inf keys fail as non-finite input does; what fp8 may not be */
static void test_fp8_refusals(void)
{
	struct skv_error e;
	struct prob pb;

	/* the byte codes of NaN (E4M3: S.1111.111) and inf (E5M2: S.11111.00) */
	static const struct {
		enum skv_dtype dt;
		uint8_t b;
	} bad[4] = {{SKV_DTYPE_F8E4M3FN, 0x7f},
		    {SKV_DTYPE_F8E4M3FN, 0xff},
		    {SKV_DTYPE_F8E5M2, 0x7c},
		    {SKV_DTYPE_F8E5M2, 0x7e}};
	for (int i = 0; i < 4; i++) {
		fp8_prob(&pb, bad[i].dt);
		((uint8_t *)pb.in[0].k.data)[toff(&pb.in[0].k, 0, 13, 3)] = bad[i].b;
		CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), -EDOM);
		CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "NaN or Inf"));
		prob_free(&pb);
	}
	/* s * byte overflowing f32 is an infinite key too */
	fp8_prob(&pb, SKV_DTYPE_F8E5M2);
	pb.in[0].k.scale = 3e38f; /* keys of |byte| >= 2 overflow */
	CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), -EDOM);
	prob_free(&pb);
	/* a NaN V byte is copied, never read */
	fp8_prob(&pb, SKV_DTYPE_F8E4M3FN);
	((uint8_t *)pb.in[0].v.data)[toff(&pb.in[0].v, 0, 39, 0)] = 0x7f;
	CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), 0);
	CU_ASSERT_EQUAL(((uint8_t *)pb.out[0].v.data)[toff(&pb.out[0].v, 0, 15, 0)], 0x7f);
	prob_free(&pb);
	/* scales: finite and above 0 */
	static const float scales[4] = {0.0f, -1.0f, NAN, INFINITY};
	for (int i = 0; i < 4; i++) {
		fp8_prob(&pb, SKV_DTYPE_F8E4M3FN);
		(i % 2 ? &pb.in[0].v : &pb.in[0].k)->scale = scales[i];
		CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "finite and above 0"));
		CU_ASSERT(canary_intact(&pb));
		prob_free(&pb);
	}
	/* no conversion to or from fp8, and no fp8 queries */
	for (int i = 0; i < 3; i++) {
		fp8_prob(&pb, SKV_DTYPE_F8E5M2);
		if (i == 0)
			pb.out[0].k.dtype = SKV_DTYPE_F8E4M3FN;
		else if (i == 1)
			pb.in[0].v.dtype = SKV_DTYPE_F8E4M3FN;
		else
			pb.in[0].q.dtype = SKV_DTYPE_F8E5M2;
		CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), -EINVAL);
		CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, i < 2 ? "byte for byte" : "queries stay"));
		prob_free(&pb);
	}
	fp8_prob(&pb, SKV_DTYPE_F16);
	pb.out[0].v.dtype = SKV_DTYPE_F8E4M3FN;
	CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), -EINVAL);
	prob_free(&pb);
	CU_ASSERT_STRING_EQUAL(skv_dtype_name(SKV_DTYPE_F8E4M3FN), "f8e4m3fn");
	CU_ASSERT_STRING_EQUAL(skv_dtype_name(SKV_DTYPE_F8E5M2), "f8e5m2");
	CU_ASSERT_EQUAL(skv_dtype_size(SKV_DTYPE_F8E5M2), 1);
}

/* every fp8 byte decodes as the reference decodes it (scale 1) */
static void test_fp8_decode(void)
{
	for (int b = 0; b < 256; b++) {
		float a = skv_f8e4m3fn_to_f32((uint8_t)b),
		      x = ref_fp8_dequant(SKV_DTYPE_F8E4M3FN, (uint8_t)b, 1.0f);
		float c = skv_f8e5m2_to_f32((uint8_t)b),
		      y = ref_fp8_dequant(SKV_DTYPE_F8E5M2, (uint8_t)b, 1.0f);
		CU_ASSERT(isnan(a) ? isnan(x) : !memcmp(&a, &x, 4));
		CU_ASSERT(isnan(c) ? isnan(y) : !memcmp(&c, &y, 4));
	}
	CU_ASSERT_EQUAL(skv_f8e4m3fn_to_f32(0x7e), 448.0f);
	CU_ASSERT_EQUAL(skv_f8e5m2_to_f32(0x7b), 57344.0f);
	CU_ASSERT_EQUAL(skv_f8e4m3fn_to_f32(0x01), 0.001953125f);
}

/* the limits of a partial window: min_window (0 = 8) and n_q <= W */
static void test_partial_window_limits(void)
{
	struct skv_error e;

	CU_ASSERT_EQUAL(partial_rc(32, 32, 0, 0, &e), 0);
	CU_ASSERT_EQUAL(partial_rc(32, 8, 0, 0, &e), 0);
	CU_ASSERT_EQUAL(partial_rc(32, 7, 0, 0, &e), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "min_window = 8"));
	CU_ASSERT_EQUAL(partial_rc(32, 3, 3, 0, &e), 0);
	CU_ASSERT_EQUAL(partial_rc(32, 12, 16, 0, &e), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "min_window = 16"));
	/* a full window is never held to min_window */
	CU_ASSERT_EQUAL(partial_rc(4, 4, 0, 0, &e), 0);
	CU_ASSERT_EQUAL(partial_rc(32, 33, 0, 0, &e), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(e.msg, "at most W = 32"));
	/* C > W' is what counts: C 40 with W 48 and 20 rows */
	CU_ASSERT_EQUAL(partial_rc(48, 20, 0, 0, &e), 0);
	CU_ASSERT_EQUAL(partial_rc(48, 48, 0, 0, &e), -EINVAL);
	/* a caller built before min_window gets 8 */
	CU_ASSERT_EQUAL(partial_rc(32, 8, 99, SKV_PARAMS_SIZE_V2, &e), 0);
	CU_ASSERT_EQUAL(partial_rc(32, 7, 1, SKV_PARAMS_SIZE_V2, &e), -EINVAL);
}

/* budget modes with a partial window give the bytes of W = n_q given in full */
static void test_partial_window_budget(void)
{
	static const enum skv_budget modes[3] = {SKV_BUDGET_MASS, SKV_BUDGET_HEADS,
						 SKV_BUDGET_MASS_HEADS};
	for (int c = 0; c < 6; c++) {
		struct prob pb[2];
		uint32_t got[2][2 * 4];
		for (int i = 0; i < 2; i++) {
			rng_state = 0xabcdef12ull + (uint64_t)c;
			prob_init(&pb[i], 120, 16, 4, 2, 2);
			pb[i].p.window = i ? 12 : 20;
			pb[i].sh.n_q = 12;
			pb[i].p.capacity = 40;
			pb[i].p.gqa = c & 1 ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
			pb[i].p.budget_mode = modes[c % 3];
			pb[i].p.tau = 0.6f;
			pb[i].p.c_min = 16;
			pb[i].p.c_max = 60;
			pb[i].p.c_step = 4;
			prob_random(&pb[i], 1.0);
			pb[i].p.capacity = 60; /* room for c_max */
			prob_build(&pb[i]);
			pb[i].p.capacity = 40;
			struct skv_ctx *ctx;
			struct skv_error e;
			struct skv_budget_result res = {.result_size = sizeof(res), .kept = got[i]};
			CU_ASSERT_EQUAL_FATAL(skv_ctx_new(2, &ctx), 0);
			int r = skv_compact_budget(ctx, &pb[i].sh, &pb[i].p, 2, pb[i].in, pb[i].out,
						   &res, &e);
			if (r)
				fprintf(stderr, "\n  case %d: %s\n", c, e.msg);
			CU_ASSERT_EQUAL_FATAL(r, 0);
			skv_ctx_free(ctx);
		}
		uint32_t hs = c & 1 ? 2 : 4;
		CU_ASSERT(!memcmp(got[0], got[1], 2 * hs * sizeof(uint32_t)));
		for (uint32_t l = 0; l < 2; l++) {
			const struct skv_layer_out *a = &pb[0].out[l], *b = &pb[1].out[l];
			CU_ASSERT(!memcmp(a->k.data, b->k.data, pb[0].out_k_bytes));
			CU_ASSERT(!memcmp(a->v.data, b->v.data, pb[0].out_v_bytes));
			CU_ASSERT(
			    !memcmp(a->positions, b->positions, pb[0].pos_count * sizeof(int32_t)));
			CU_ASSERT(!memcmp(a->retained_mass, b->retained_mass, hs * sizeof(float)));
		}
		prob_free(&pb[0]);
		prob_free(&pb[1]);
	}
}

static void test_random_h2o(void)
{
	run_random(SKV_POLICY_H2O, false, 40);
	run_random(SKV_POLICY_H2O, true, 20);
}

static void test_random_streaming(void)
{
	run_random(SKV_POLICY_STREAMINGLLM, false, 30);
	run_random(SKV_POLICY_STREAMINGLLM, true, 30);
}

static void test_random_window(void)
{
	run_random(SKV_POLICY_WINDOW, false, 20);
	run_random(SKV_POLICY_WINDOW, true, 20);
}

/* bigger, structured cases: long prompt, several row blocks and key tiles */
static void test_llama_like(void)
{
	for (int c = 0; c < 4; c++) {
		struct prob pb;
		prob_init(&pb, 1000 + 333 * c, 64, 8, 2, 2);
		pb.p.window = 32;
		pb.p.capacity = 256;
		pb.p.gqa = c & 1 ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
		pb.p.pooling = c & 2 ? SKV_POOL_MAX : SKV_POOL_AVG;
		pb.p.kernel = c & 2 ? 7 : 5;
		pb.sh.n_q = 32;
		pb.dq = pb.dk = pb.dv = pb.dout = c == 3 ? SKV_DTYPE_BF16 : SKV_DTYPE_F32;
		pb.lin = (enum layout)(c % 3);
		prob_random(&pb, 1.0);
		prob_build(&pb);
		CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 2, NULL), 0);
		int tol = 0;
		CU_ASSERT(prob_check(&pb, 1e-5, &tol) == 0);
		CU_ASSERT(tol <= 2);
		prob_free(&pb);
	}
}

/* L == C scores, keeps everything, retained mass ~1; L = C - 1 is bypass */
static void test_l_equals_c(void)
{
	struct prob pb;

	prob_init(&pb, 50, 16, 4, 2, 1);
	pb.p.window = 8;
	pb.p.capacity = 50;
	pb.sh.n_q = 8;
	prob_random(&pb, 1.0);
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, NULL), 0);
	for (uint32_t h = 0; h < 4; h++) {
		for (int i = 0; i < 50; i++)
			CU_ASSERT_EQUAL(pb.out[0].positions[h * pb.out[0].pos_stride + i], i);
		CU_ASSERT_DOUBLE_EQUAL(pb.out[0].retained_mass[h], 1.0, 1e-5);
	}
	CU_ASSERT(prob_check(&pb, 0, NULL) == 0);
	/* scored: a NaN is found (bypass would not look) */
	pb.q[0][3] = NAN;
	prob_free(&pb);

	prob_init(&pb, 50, 16, 4, 2, 1);
	pb.p.window = 8;
	pb.p.capacity = 50;
	pb.sh.n_q = 8;
	prob_random(&pb, 1.0);
	pb.q[0][3] = NAN;
	prob_build(&pb);
	CU_ASSERT_EQUAL(prob_run(&pb, 1, NULL), -EDOM);
	prob_free(&pb);
}

/* 1, 2, 3 and 7 threads give byte-identical outputs */
static void test_thread_invariance(void)
{
	for (int c = 0; c < 6; c++) {
		struct prob pb[4];
		static const unsigned th[4] = {1, 2, 3, 7};
		uint64_t seed = rng_state;
		for (int i = 0; i < 4; i++) {
			rng_state = seed; /* the same problem each time */
			random_prob(&pb[i], c < 4 ? SKV_POLICY_SNAPKV : SKV_POLICY_H2O, c & 1);
			pb[i].n_layers = 3;
			pb[i].q = track(&pb[i], calloc(3, sizeof(float *)));
			pb[i].k = track(&pb[i], calloc(3, sizeof(float *)));
			pb[i].v = track(&pb[i], calloc(3, sizeof(float *)));
			prob_random(&pb[i], 1.0);
			prob_build(&pb[i]);
			CU_ASSERT_EQUAL_FATAL(prob_run(&pb[i], th[i], NULL), 0);
		}
		for (int i = 1; i < 4; i++)
			for (uint32_t l = 0; l < 3; l++) {
				const struct skv_layer_out *a = &pb[0].out[l], *b = &pb[i].out[l];
				uint32_t hs =
				    pb[0].p.gqa == SKV_GQA_GROUP ? pb[0].sh.h_kv : pb[0].sh.h_q;
				CU_ASSERT(!memcmp(a->k.data, b->k.data, pb[0].out_k_bytes));
				CU_ASSERT(!memcmp(a->v.data, b->v.data, pb[0].out_v_bytes));
				CU_ASSERT(!memcmp(a->positions, b->positions,
						  pb[0].pos_count * sizeof(int32_t)));
				CU_ASSERT(!memcmp(a->retained_mass, b->retained_mass,
						  hs * sizeof(float)));
			}
		for (int i = 0; i < 4; i++)
			prob_free(&pb[i]);
	}
}

/*
 * Fewer items than threads switches to scoring each query head as its own
 * unit; outputs must not change by a bit. h2o at L 2100 also cuts each
 * head's rows into chunks (the logit buffer budget), in both paths. Cases
 * 4-7 repeat 0-3 with bf16 queries and keys on SKV_ISA=avx512bf16 (the
 * vdpbf16ps path where the CPU has one).
 */
static void test_split_mode(void)
{
	static const unsigned th[4] = {1, 2, 3, 7};
	for (int c = 0; c < 8; c++) {
		if (c >= 4)
			setenv("SKV_ISA", "avx512bf16", 1);
		struct prob pb[4];
		for (int i = 0; i < 4; i++) {
			rng_state = 0x1234567ull + (uint64_t)c;
			bool h2o = (c & 3) >= 2;
			prob_init(&pb[i], h2o ? 2100 : 300, 16, h2o ? 4 : 8, h2o ? 1 : 2, 1);
			pb[i].p.policy = h2o ? SKV_POLICY_H2O : SKV_POLICY_SNAPKV;
			pb[i].p.window = 16;
			pb[i].p.capacity = h2o ? 700 : 100;
			pb[i].p.gqa = c & 1 ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
			pb[i].sh.n_q = h2o ? 2100 : 16;
			pb[i].dk = SKV_DTYPE_F16;
			if (c >= 4)
				pb[i].dq = pb[i].dk = SKV_DTYPE_BF16;
			prob_random(&pb[i], 1.0);
			prob_build(&pb[i]);
			CU_ASSERT_EQUAL_FATAL(prob_run(&pb[i], th[i], NULL), 0);
		}
		uint32_t hs = pb[0].p.gqa == SKV_GQA_GROUP ? pb[0].sh.h_kv : pb[0].sh.h_q;
		for (int i = 1; i < 4; i++) {
			const struct skv_layer_out *a = &pb[0].out[0], *b = &pb[i].out[0];
			CU_ASSERT(!memcmp(a->k.data, b->k.data, pb[0].out_k_bytes));
			CU_ASSERT(!memcmp(a->v.data, b->v.data, pb[0].out_v_bytes));
			CU_ASSERT(
			    !memcmp(a->positions, b->positions, pb[0].pos_count * sizeof(int32_t)));
			CU_ASSERT(!memcmp(a->retained_mass, b->retained_mass, hs * sizeof(float)));
		}
		int tol = 0;
		CU_ASSERT(prob_check(&pb[3], 1e-5, &tol) == 0);
		CU_ASSERT(tol <= 2);
		for (int i = 0; i < 4; i++)
			prob_free(&pb[i]);
	}
	unsetenv("SKV_ISA");

	/* -EDOM names the same head either way */
	for (int i = 0; i < 2; i++) {
		struct prob pb;
		struct skv_error e;
		prob_init(&pb, 64, 8, 8, 2, 1);
		pb.p.window = 8;
		pb.p.capacity = 20;
		pb.sh.n_q = 8;
		prob_random(&pb, 1.0);
		pb.q[0][((size_t)6 * 8 + 2) * 8 + 1] = NAN;
		pb.q[0][((size_t)7 * 8 + 2) * 8 + 1] = NAN;
		prob_build(&pb);
		CU_ASSERT_EQUAL(prob_run(&pb, i ? 7 : 1, &e), -EDOM);
		CU_ASSERT_EQUAL(e.layer, 0);
		CU_ASSERT_EQUAL(e.head, 6);
		prob_free(&pb);
	}
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	CU_pSuite s = CU_add_suite("kernels_random", NULL, NULL);
	CU_add_test(s, "snapkv vs reference", test_random_snapkv);
	CU_add_test(s, "snapkv with protected ranges", test_random_snapkv_protected);
	CU_add_test(s, "partial window vs reference", test_random_partial_window);
	CU_add_test(s, "partial window limits", test_partial_window_limits);
	CU_add_test(s, "partial window in budget modes", test_partial_window_budget);
	CU_add_test(s, "fp8 K/V vs the dequantizing reference", test_random_fp8);
	CU_add_test(s, "fp8 bytes decode as SPEC.md says", test_fp8_decode);
	CU_add_test(s, "fp8 non-finite keys and refusals", test_fp8_refusals);
	CU_add_test(s, "h2o vs reference", test_random_h2o);
	CU_add_test(s, "streamingllm vs reference", test_random_streaming);
	CU_add_test(s, "window vs reference", test_random_window);
	CU_add_test(s, "llama-like shapes", test_llama_like);
	CU_add_test(s, "L == C scores and keeps all", test_l_equals_c);
	CU_add_test(s, "thread-count invariance", test_thread_invariance);
	CU_add_test(s, "split mode (fewer items than threads)", test_split_mode);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned f = CU_get_number_of_failures();
	CU_cleanup_registry();
	return f ? 1 : 0;
}
