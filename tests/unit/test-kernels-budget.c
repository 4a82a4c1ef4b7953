// SPDX-License-Identifier: MIT
/*
 * test-kernels-budget.c - the budget modes of SPEC.md ("Budgets beyond one
 * C"): worked cases written out by hand, random cases against a plain
 * reference written here from SPEC.md, uniform byte-identical to before the
 * modes, and every invalid parameter rejected before any work.
 */
#include "test-kernels-util.h"

#define SQ2 1.41421356237309515

/* ------------------------------------------------------------ helpers */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static uint32_t pick(uint32_t n)
{
	return (uint32_t)(rng_next() % n);
}

static uint32_t h_store(const struct prob *pb)
{
	return pb->p.gqa == SKV_GQA_GROUP ? pb->sh.h_kv : pb->sh.h_q;
}

/* Run with a result; kept[] sized for every (layer, head). */
static int run_budget(struct prob *pb, unsigned threads, uint32_t *kept,
		      struct skv_budget_result *res, struct skv_error *err)
{
	struct skv_ctx *ctx;
	int r = skv_ctx_new(threads, &ctx);
	if (r)
		return r;
	*res = (struct skv_budget_result){.result_size = sizeof(*res), .kept = kept};
	r = skv_compact_budget(ctx, &pb->sh, &pb->p, pb->n_layers, pb->in, pb->out, res, err);
	skv_ctx_free(ctx);
	return r;
}

/*
 * One layer, D = 2, h_kv = 1, expand: query head h's rows are given as
 * weights; rows[h][r] uses the key component r (q = sqrt2 * e_r), so with
 * k_j = [ln w0_j, ln w1_j] a row of head h sees exp-weights w[comp][j].
 * comp[h][i]: the component window row i of head h reads.
 */
static void build_weights(struct prob *pb, uint32_t L, uint32_t W, uint32_t H, const int comp[][2],
			  const double (*w)[8])
{
	prob_init(pb, L, 2, H, 1, 1);
	pb->sh.n_q = W;
	pb->p.window = W;
	pb->p.kernel = 1;
	pb->q[0] = track(pb, calloc((size_t)2 * W * H + 2, sizeof(float)));
	pb->k[0] = track(pb, calloc(2 * L, sizeof(float)));
	pb->v[0] = track(pb, calloc(2 * L, sizeof(float)));
	for (uint32_t h = 0; h < H; h++)
		for (uint32_t i = 0; i < W; i++)
			pb->q[0][((size_t)h * W + i) * 2 + comp[h][i]] = (float)SQ2;
	for (uint32_t j = 0; j < L; j++) {
		pb->k[0][2 * j] = w[0][j] > 0 ? (float)log(w[0][j]) : 0.0f;
		pb->k[0][2 * j + 1] = w[1][j] > 0 ? (float)log(w[1][j]) : 0.0f;
		pb->v[0][2 * j] = (float)j;
		pb->v[0][2 * j + 1] = (float)(100 + j);
	}
}

/* SPEC example A's single head: L 8, W 2, k 3 avg. */
static const double ex_a[2][8] = {{1, 2, 10, 8, 1, 1, 2, 0}, {1, 1, 8, 12, 1, 1, 1, 1}};
static const int ex_a_comp[1][2] = {{0, 1}};

static void build_ex_a(struct prob *pb)
{
	build_weights(pb, 8, 2, 1, ex_a_comp, ex_a);
	pb->p.kernel = 3;
	pb->p.pooling = SKV_POOL_AVG;
}

static bool positions_are(const struct prob *pb, uint32_t layer, uint32_t h, const int32_t *want,
			  uint32_t n)
{
	const struct skv_layer_out *o = &pb->out[layer];
	return memcmp(o->positions + (size_t)h * o->pos_stride, want, n * sizeof(int32_t)) == 0;
}

/* ------------------------------------------------- uniform, unchanged */

/* FNV-1a of every output byte of fixed random problems, scalar path, as the
 * libskv before the budget modes produced them (main f3a03cc). */
static const uint64_t golden[] = {
    0x672a9bc6f39df1eeull, 0xc7aa0093eb067b35ull, 0x606c5dab7eb459e8ull,
    0xccae652edaae9215ull, 0xc36bc2127a1346beull, 0xcce59d9e8a651fb9ull,
};

static uint64_t golden_case(int c, bool v1)
{
	static const struct {
		uint32_t L, D, hq, hkv, nl, W, C, k;
		enum skv_policy pol;
		enum skv_gqa gqa;
		enum skv_pooling pool;
		enum skv_dtype dt;
	} g[] = {
	    {97, 16, 4, 2, 2, 8, 40, 5, SKV_POLICY_SNAPKV, SKV_GQA_EXPAND, SKV_POOL_AVG,
	     SKV_DTYPE_F32},
	    {130, 8, 6, 2, 3, 16, 48, 7, SKV_POLICY_SNAPKV, SKV_GQA_GROUP, SKV_POOL_MAX,
	     SKV_DTYPE_F16},
	    {64, 8, 2, 1, 1, 4, 64, 3, SKV_POLICY_SNAPKV, SKV_GQA_EXPAND, SKV_POOL_AVG,
	     SKV_DTYPE_BF16},
	    {50, 8, 2, 2, 2, 4, 20, 1, SKV_POLICY_H2O, SKV_GQA_EXPAND, SKV_POOL_AVG, SKV_DTYPE_F32},
	    {80, 8, 4, 4, 1, 0, 30, 5, SKV_POLICY_STREAMINGLLM, SKV_GQA_GROUP, SKV_POOL_AVG,
	     SKV_DTYPE_F32},
	    {40, 8, 2, 1, 2, 8, 64, 5, SKV_POLICY_SNAPKV, SKV_GQA_EXPAND, SKV_POOL_AVG,
	     SKV_DTYPE_F32},
	};
	struct prob pb;
	uint64_t h = 0xcbf29ce484222325ull;

	rng_state = 0x1234567ull + (uint64_t)c * 7919;
	prob_init(&pb, g[c].L, g[c].D, g[c].hq, g[c].hkv, g[c].nl);
	pb.p.policy = g[c].pol;
	pb.p.window = g[c].W;
	pb.p.capacity = g[c].C;
	pb.p.kernel = g[c].k;
	pb.p.gqa = g[c].gqa;
	pb.p.pooling = g[c].pool;
	pb.dq = pb.dk = pb.dv = pb.dout = g[c].dt;
	pb.sh.n_q = g[c].pol == SKV_POLICY_H2O ? g[c].L : g[c].W;
	prob_random(&pb, 1.5);
	prob_build(&pb);
	if (v1) {
		/* a caller built before the modes: its struct ends before them, and
		 * whatever lies beyond is not read */
		memset(&pb.p.budget_mode, 0x5a, sizeof(pb.p) - SKV_PARAMS_SIZE_V1);
		pb.p.params_size = SKV_PARAMS_SIZE_V1;
	}
	if (prob_run(&pb, 2, NULL) != 0) {
		prob_free(&pb);
		return 0;
	}
	for (uint32_t l = 0; l < pb.n_layers; l++) {
		h = fnv(h, pb.out[l].k.data, pb.out_k_bytes);
		h = fnv(h, pb.out[l].v.data, pb.out_v_bytes);
		h = fnv(h, pb.out[l].positions, pb.pos_count * 4);
		h = fnv(h, pb.out[l].retained_mass, h_store(&pb) * 4);
	}
	prob_free(&pb);
	return h;
}

static void test_uniform_unchanged(void)
{
	setenv("SKV_ISA", "scalar", 1);
	for (int c = 0; c < (int)(sizeof(golden) / sizeof(golden[0])); c++) {
		CU_ASSERT_EQUAL(golden_case(c, false), golden[c]);
		CU_ASSERT_EQUAL(golden_case(c, true), golden[c]);
	}
	unsetenv("SKV_ISA");
}

/* ---------------------------------------------------- worked examples */

/*
 * Example A's votes (sums over the two rows) are 1/25+1/26, 2/25+1/26,
 * 10/25+8/26, 8/25+12/26, 1/25+1/26, 1/25+1/26 for positions 0..5; the
 * window 6, 7 holds 2/25+1/26 + 1/26. Mass m = votes / 2. Pooled ranking
 * 2 > 3 > 4 > 1 > 0 > 5. The curve:
 *   C=3 [2]       (2/25+2/26 + 10/25+8/26) / 2      = 0.432308
 *   C=4 +3        ... + (8/25+12/26) / 2             = 0.823077
 *   C=5 +4        ... + (1/25+1/26) / 2              = 0.862308
 *   C=6 +1        ... + (2/25+1/26) / 2              = 0.921538
 *   C=7 +0        ... + (1/25+1/26) / 2              = 0.960769
 *   C=8           everything                          = 1
 */
static const double curve_a[9] = {0, 0, 0, 0.432308, 0.823077, 0.862308, 0.921538, 0.960769, 1};

static void mass_heads_case(float tau, uint32_t cmin, uint32_t cmax, const int32_t *want,
			    uint32_t n)
{
	struct prob pb;
	uint32_t kept[1];
	struct skv_budget_result res;
	struct skv_error e;

	build_ex_a(&pb);
	pb.p.budget_mode = SKV_BUDGET_MASS_HEADS;
	pb.p.tau = tau;
	pb.p.c_min = cmin;
	pb.p.c_max = cmax;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(run_budget(&pb, 1, kept, &res, &e), 0);
	CU_ASSERT_EQUAL(kept[0], n);
	CU_ASSERT(positions_are(&pb, 0, 0, want, n));
	CU_ASSERT_DOUBLE_EQUAL(pb.out[0].retained_mass[0], curve_a[n], 1e-5);
	CU_ASSERT_EQUAL(res.c_star, 0);
	CU_ASSERT_EQUAL(res.fallback, 0);
	/* the V rows come with the positions */
	const float *v = pb.out[0].v.data;
	for (uint32_t i = 0; i < n; i++)
		CU_ASSERT_EQUAL(v[2 * i], (float)want[i]);
	prob_free(&pb);
}

static void test_mass_heads_worked(void)
{
	static const int32_t k4[] = {2, 3, 6, 7}, k6[] = {1, 2, 3, 4, 6, 7};
	static const int32_t k3[] = {2, 6, 7}, k8[] = {0, 1, 2, 3, 4, 5, 6, 7};
	static const int32_t k5[] = {2, 3, 4, 6, 7};
	mass_heads_case(0.8f, 3, 8, k4, 4);  /* 0.823 at 4 */
	mass_heads_case(0.9f, 3, 8, k6, 6);  /* 0.922 at 6 */
	mass_heads_case(0.4f, 3, 8, k3, 3);  /* C_min already */
	mass_heads_case(0.97f, 3, 5, k5, 5); /* none by C_max = 5: C_max */
	mass_heads_case(0.99f, 3, 9, k8, 8); /* all L: mass 1 */
	mass_heads_case(0.8f, 5, 8, k5, 5);  /* never below C_min */
}

static void mass_case(float tau, uint32_t cmin, uint32_t cmax, uint32_t step, uint32_t c_star,
		      const int32_t *want, uint32_t n)
{
	struct prob pb;
	uint32_t kept[1];
	struct skv_budget_result res;
	struct skv_error e;

	build_ex_a(&pb);
	pb.p.budget_mode = SKV_BUDGET_MASS;
	pb.p.tau = tau;
	pb.p.c_min = cmin;
	pb.p.c_max = cmax;
	pb.p.c_step = step;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(run_budget(&pb, 1, kept, &res, &e), 0);
	CU_ASSERT_EQUAL(res.c_star, c_star);
	CU_ASSERT_EQUAL(kept[0], n);
	CU_ASSERT(positions_are(&pb, 0, 0, want, n));
	CU_ASSERT_DOUBLE_EQUAL(pb.out[0].retained_mass[0], curve_a[n], 1e-5);
	prob_free(&pb);
}

static void test_mass_worked(void)
{
	static const int32_t k5[] = {2, 3, 4, 6, 7}, k7[] = {0, 1, 2, 3, 4, 6, 7};
	static const int32_t k8[] = {0, 1, 2, 3, 4, 5, 6, 7};
	mass_case(0.85f, 3, 8, 2, 5, k5, 5);   /* ladder 3, 5: 0.862 at 5 */
	mass_case(0.83f, 3, 8, 2, 5, k5, 5);   /* 4 would do, but is not on the ladder */
	mass_case(0.95f, 3, 8, 2, 7, k7, 7);   /* 3, 5, 7 */
	mass_case(0.97f, 3, 7, 2, 7, k7, 7);   /* none on 3, 5, 7: C_max */
	mass_case(0.97f, 3, 8, 2, 8, k8, 8);   /* 3, 5, 7, then C_max 8 = L */
	mass_case(0.97f, 3, 20, 4, 11, k8, 8); /* 3, 7, 11 >= L: all */
	/* L < C_min: nothing scored, all kept, C* = C_min */
	mass_case(0.5f, 9, 12, 1, 9, k8, 8);
}

/*
 * Three heads over one shared K (expand, h_kv 1), W = 1, no pooling. The
 * window row (position 5) of heads 0 and 2 sees weights [5,1,1,1,1,1] / 10
 * (.5, .1 ..), of head 1 [2,3,2,.5,.5,1] / 9 (.222, .333, .222, .056, .056);
 * heads 0 and 2 compute the same bits, so they tie exactly. F = {5},
 * P(C) = C - 1.
 */
static const double hw[2][8] = {{5, 1, 1, 1, 1, 1}, {2, 3, 2, 0.5, 0.5, 1}};
static const int hw_comp[3][2] = {{0}, {1}, {0}};

static void heads_case(uint32_t C, float a, const int32_t *const want[3], const uint32_t n[3])
{
	struct prob pb;
	uint32_t kept[3];
	struct skv_budget_result res;
	struct skv_error e;

	build_weights(&pb, 6, 1, 3, hw_comp, hw);
	pb.p.budget_mode = SKV_BUDGET_HEADS;
	pb.p.capacity = C;
	pb.p.head_floor = a;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(run_budget(&pb, 1, kept, &res, &e), 0);
	CU_ASSERT_EQUAL(kept[0] + kept[1] + kept[2], 3 * (C < 6 ? C : 6));
	for (int h = 0; h < 3; h++) {
		CU_ASSERT_EQUAL(kept[h], n[h]);
		CU_ASSERT(positions_are(&pb, 0, (uint32_t)h, want[h], n[h]));
		if (kept[h] != n[h] || !positions_are(&pb, 0, (uint32_t)h, want[h], n[h]))
			fprintf(stderr, "\n  heads C=%u a=%g head %d: kept %u\n", C, (double)a, h,
				kept[h]);
	}
	prob_free(&pb);
}

static void test_heads_worked(void)
{
	static const int32_t k015[] = {0, 1, 5}, k0125[] = {0, 1, 2, 5}, k05[] = {0, 5};
	static const int32_t all[] = {0, 1, 2, 3, 4, 5};
	/* C = 3: two picks a head, six in the layer. a = 0.5: floor 1 each
	 * (0 for heads 0 and 2 at .5, 1 for head 1 at .333); the other three go
	 * to the best remaining pairs: head 1's 0 and 2 (.222), then the .1 tie
	 * of heads 0 and 2 to the smaller head, its smaller position: head 0's 1 */
	const int32_t *const w1[3] = {k015, k0125, k05};
	const uint32_t n1[3] = {3, 4, 2};
	heads_case(3, 0.5f, w1, n1);
	/* a = 0: the same six best pairs */
	heads_case(3, 0.0f, w1, n1);
	/* a = 1: each head its own two, ties to the smaller position */
	const int32_t *const w2[3] = {k015, k015, k015};
	const uint32_t n2[3] = {3, 3, 3};
	heads_case(3, 1.0f, w2, n2);
	/* C = 4, a = 0: nine picks: .5 .5 .333 .222 .222, then four of the
	 * eight .1s of heads 0 and 2: all head 0's */
	const int32_t *const w3[3] = {all, k0125, k05};
	const uint32_t n3[3] = {6, 4, 2};
	heads_case(4, 0.0f, w3, n3);
	/* C = 6 = L: everything; C = 7: bypass */
	const int32_t *const w4[3] = {all, all, all};
	const uint32_t n4[3] = {6, 6, 6};
	heads_case(6, 0.2f, w4, n4);
	heads_case(7, 0.2f, w4, n4);
}

static void test_layers_worked(void)
{
	struct skv_shape sh = {.prompt_len = 1000, .head_dim = 4, .h_q = 1, .h_kv = 1, .n_q = 2};
	struct skv_params p;
	struct skv_error e;
	uint32_t rows[4];

	skv_params_init(&p);
	p.window = 2;
	p.capacity = 10;
	p.budget_mode = SKV_BUDGET_LAYERS;
	/* r = 0.5, N = 4: w = 1, 5/6, 2/3, 1/2, sum 3; 40 w / 3 = 13.33, 11.11,
	 * 8.89, 6.67 -> 13, 11, 8, 6 = 38; the 2 left go to layers 0 and 1 */
	p.pyramid_r = 0.5f;
	CU_ASSERT_EQUAL_FATAL(skv_budget_rows(&sh, &p, 4, rows, &e), 0);
	CU_ASSERT(rows[0] == 14 && rows[1] == 12 && rows[2] == 8 && rows[3] == 6);
	/* r = 2: 40 w / 6 with w = 1, 4/3, 5/3, 2 -> 6, 8, 11, 13, then +1 +1 */
	p.pyramid_r = 2.0f;
	CU_ASSERT_EQUAL_FATAL(skv_budget_rows(&sh, &p, 4, rows, &e), 0);
	CU_ASSERT(rows[0] == 7 && rows[1] == 9 && rows[2] == 11 && rows[3] == 13);
	/* N = 1: C */
	CU_ASSERT_EQUAL_FATAL(skv_budget_rows(&sh, &p, 1, rows, &e), 0);
	CU_ASSERT_EQUAL(rows[0], 10);
	/* r = 1 is uniform */
	p.pyramid_r = 1.0f;
	CU_ASSERT_EQUAL_FATAL(skv_budget_rows(&sh, &p, 3, rows, &e), 0);
	CU_ASSERT(rows[0] == 10 && rows[1] == 10 && rows[2] == 10);
	/* a pyramid C_l at or below W is refused, naming the layer */
	p.capacity = 4;
	p.pyramid_r = 0.1f;
	CU_ASSERT_EQUAL(skv_budget_rows(&sh, &p, 4, rows, &e), -EINVAL);
	CU_ASSERT(strstr(e.msg, "layer 2") != NULL); /* 8, 6, 2, 0 */

	/* an explicit list on example A doubled: layer 0 keeps 3, layer 1 8 */
	struct prob pb;
	build_ex_a(&pb);
	pb.n_layers = 1;
	pb.p.budget_mode = SKV_BUDGET_LAYERS;
	pb.p.n_layer_caps = 1;
	pb.p.layer_caps[0] = 4;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, NULL), 0);
	static const int32_t k4[] = {2, 3, 6, 7};
	CU_ASSERT(positions_are(&pb, 0, 0, k4, 4));
	CU_ASSERT_DOUBLE_EQUAL(pb.out[0].retained_mass[0], curve_a[4], 1e-5);
	prob_free(&pb);
}

static void test_fallback_worked(void)
{
	struct prob pb;
	uint32_t kept[1];
	struct skv_budget_result res;
	struct skv_error e;
	static const int32_t k3[] = {2, 6, 7}, k8[] = {0, 1, 2, 3, 4, 5, 6, 7};

	/* uniform C = 3 keeps 0.432: below 0.5 the full prompt is kept */
	build_ex_a(&pb);
	pb.p.capacity = 3;
	pb.p.fallback_below = 0.5f;
	prob_build(&pb);
	CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), -EINVAL); /* counts are not fixed */
	CU_ASSERT(canary_intact(&pb));
	CU_ASSERT_EQUAL_FATAL(run_budget(&pb, 1, kept, &res, &e), 0);
	CU_ASSERT_EQUAL(res.fallback, 1);
	CU_ASSERT_EQUAL(kept[0], 8);
	CU_ASSERT(positions_are(&pb, 0, 0, k8, 8));
	CU_ASSERT_EQUAL(pb.out[0].retained_mass[0], 1.0f);
	CU_ASSERT_DOUBLE_EQUAL(res.min_mass, curve_a[3], 1e-5);
	CU_ASSERT_EQUAL(res.c_star, 3);
	const float *v = pb.out[0].v.data;
	for (int i = 0; i < 8; i++)
		CU_ASSERT_EQUAL(v[2 * i], (float)i);
	prob_free(&pb);

	/* at 0.4 it is kept compact */
	build_ex_a(&pb);
	pb.p.capacity = 3;
	pb.p.fallback_below = 0.4f;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(run_budget(&pb, 1, kept, &res, &e), 0);
	CU_ASSERT_EQUAL(res.fallback, 0);
	CU_ASSERT_EQUAL(kept[0], 3);
	CU_ASSERT(positions_are(&pb, 0, 0, k3, 3));
	prob_free(&pb);

	/* mass: C_max 4 reaches 0.823 < tau 0.9; fallback 0.85 keeps all */
	build_ex_a(&pb);
	pb.p.budget_mode = SKV_BUDGET_MASS;
	pb.p.tau = 0.9f;
	pb.p.c_min = 3;
	pb.p.c_max = 4;
	pb.p.c_step = 1;
	pb.p.fallback_below = 0.85f;
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(run_budget(&pb, 1, kept, &res, &e), 0);
	CU_ASSERT_EQUAL(res.c_star, 4);
	CU_ASSERT_EQUAL(res.fallback, 1);
	CU_ASSERT_EQUAL(kept[0], 8);
	CU_ASSERT_DOUBLE_EQUAL(res.min_mass, curve_a[4], 1e-5);
	prob_free(&pb);
}

/* ------------------------------------------------------------ invalid */

static void expect_invalid(struct prob *pb, const char *what, const char *needle)
{
	uint32_t kept[64];
	struct skv_budget_result res;
	struct skv_error e;

	int r = run_budget(pb, 1, kept, &res, &e);
	CU_ASSERT_EQUAL(r, -EINVAL);
	CU_ASSERT(canary_intact(pb));
	if (r != -EINVAL || !strstr(e.msg, needle))
		fprintf(stderr, "\n  %s: rc %d, message '%s' (wanted '%s')\n", what, r, e.msg,
			needle);
	CU_ASSERT(strstr(e.msg, needle) != NULL);
}

static void test_invalid_budgets(void)
{
	static const struct {
		const char *what, *needle;
		enum skv_budget b;
		float tau, a, r, fb;
		uint32_t cmin, cmax, step, ncap, cap0, C;
		enum skv_policy pol;
	} c[] = {
	    {"tau 0", "tau", SKV_BUDGET_MASS, 0.0f, 0, 0, 0, 3, 6, 1, 0, 0, 5, 1},
	    {"tau > 1", "tau", SKV_BUDGET_MASS_HEADS, 1.5f, 0, 0, 0, 3, 6, 1, 0, 0, 5, 1},
	    {"tau NaN", "tau", SKV_BUDGET_MASS, NAN, 0, 0, 0, 3, 6, 1, 0, 0, 5, 1},
	    {"C_min > C_max", "C_min", SKV_BUDGET_MASS, 0.5f, 0, 0, 0, 6, 5, 1, 0, 0, 5, 1},
	    {"step 0", "step", SKV_BUDGET_MASS, 0.5f, 0, 0, 0, 3, 6, 0, 0, 0, 5, 1},
	    {"C_min <= W", "C_min = 2", SKV_BUDGET_MASS, 0.5f, 0, 0, 0, 2, 6, 1, 0, 0, 5, 1},
	    {"list length", "list has 2", SKV_BUDGET_LAYERS, 0, 0, 0, 0, 0, 0, 0, 2, 5, 5, 1},
	    {"C_l <= W", "layer 0", SKV_BUDGET_LAYERS, 0, 0, 0, 0, 0, 0, 0, 1, 2, 5, 1},
	    {"pyramid r 0", "pyramid r", SKV_BUDGET_LAYERS, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 1},
	    {"pyramid r 100", "pyramid r", SKV_BUDGET_LAYERS, 0, 0, 100, 0, 0, 0, 0, 0, 0, 5, 1},
	    {"floor < 0", "floor", SKV_BUDGET_HEADS, 0, -0.1f, 0, 0, 0, 0, 0, 0, 0, 5, 1},
	    {"floor > 1", "floor", SKV_BUDGET_HEADS, 0, 1.5f, 0, 0, 0, 0, 0, 0, 0, 5, 1},
	    {"fallback > 1", "fallback_below", SKV_BUDGET_UNIFORM, 0, 0.2f, 0, 2, 0, 0, 0, 0, 0, 5,
	     1},
	    {"fallback < 0", "fallback_below", SKV_BUDGET_UNIFORM, 0, 0.2f, 0, -1, 0, 0, 0, 0, 0, 5,
	     1},
	    {"unknown mode", "unknown budget", (enum skv_budget)9, 0, 0.2f, 0, 0, 0, 0, 0, 0, 0, 5,
	     1},
	    {"heads with window", "needs scores", SKV_BUDGET_HEADS, 0, 0.2f, 0, 0, 0, 0, 0, 0, 0, 5,
	     SKV_POLICY_WINDOW},
	    {"mass with streamingllm", "needs scores", SKV_BUDGET_MASS, 0.5f, 0.2f, 0, 0, 3, 6, 1,
	     0, 0, 5, SKV_POLICY_STREAMINGLLM},
	    {"heads without result", "kept array", SKV_BUDGET_HEADS, 0, 0.2f, 0, 0, 0, 0, 0, 0, 0,
	     5, 1},
	};
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct prob pb;
		build_ex_a(&pb);
		pb.n_layers = 1;
		pb.p.policy = c[i].pol;
		pb.p.budget_mode = c[i].b;
		pb.p.tau = c[i].tau;
		pb.p.head_floor = c[i].a;
		pb.p.pyramid_r = c[i].r;
		pb.p.fallback_below = c[i].fb;
		pb.p.c_min = c[i].cmin;
		pb.p.c_max = c[i].cmax;
		pb.p.c_step = c[i].step;
		pb.p.n_layer_caps = c[i].ncap;
		pb.p.layer_caps[0] = c[i].cap0;
		pb.p.layer_caps[1] = c[i].cap0;
		pb.p.capacity = c[i].C;
		if (c[i].pol == SKV_POLICY_WINDOW || c[i].pol == SKV_POLICY_STREAMINGLLM)
			pb.sh.n_q = 0;
		prob_build(&pb);
		if (!strcmp(c[i].what, "heads without result")) {
			struct skv_error e;
			CU_ASSERT_EQUAL(prob_run(&pb, 1, &e), -EINVAL);
			CU_ASSERT(canary_intact(&pb));
			CU_ASSERT(strstr(e.msg, c[i].needle) != NULL);
		} else {
			expect_invalid(&pb, c[i].what, c[i].needle);
		}
		prob_free(&pb);
	}
	/* params_size neither the current one nor V1 */
	struct prob pb;
	build_ex_a(&pb);
	prob_build(&pb);
	pb.p.params_size = SKV_PARAMS_SIZE_V1 + 4;
	expect_invalid(&pb, "params_size", "params_size");
	prob_free(&pb);
}

static void test_ledger_sum(void)
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
	struct skv_ledger a, b;
	static uint32_t kept[32 * 32];

	/* equal counts: SPEC's worked ledger exactly */
	for (int i = 0; i < 32 * 32; i++)
		kept[i] = 1024;
	CU_ASSERT_EQUAL_FATAL(skv_ledger_compute(&in, &a), 0);
	CU_ASSERT_EQUAL_FATAL(skv_ledger_sum(&in, kept, 32 * 32, &b), 0);
	CU_ASSERT_EQUAL(b.compact, 805306368ull);
	CU_ASSERT(memcmp(&a, &b, sizeof(a)) == 0);
	/* ragged: one head keeps 24 more, one 24 fewer, one 100 more */
	kept[0] += 24;
	kept[5] -= 24;
	kept[77] += 100;
	CU_ASSERT_EQUAL_FATAL(skv_ledger_sum(&in, kept, 32 * 32, &b), 0);
	CU_ASSERT_EQUAL(b.compact, 805306368ull + 2ull * 100 * 128 * 2);
	CU_ASSERT_EQUAL(b.index, a.index + 400);
	CU_ASSERT_EQUAL(b.native_full, a.native_full);
	CU_ASSERT_EQUAL(skv_ledger_sum(&in, kept, 32 * 31, &b), -EINVAL);
}

/* ------------------------------------------------ random vs reference */

/*
 * The reference, from SPEC.md on ref_compact()'s double scores and votes:
 * every mode decided the obvious way (full sorts). `fragile` is set when a
 * decision rests on a near tie (scores within 1e-5 relative, or a mass
 * within 1e-4 of tau or of the fallback), where float and double may part.
 */
struct rb {
	uint32_t L, hs, nl;
	uint32_t *kept; /* [nl][hs]    */
	uint8_t *keep;	/* [nl][hs][L] */
	double *mass;	/* [nl][hs]    */
	uint32_t c_star;
	int fallback, fragile;
};

struct rcand {
	double s;
	uint32_t h, j;
};

static int rcand_cmp(const void *a, const void *b)
{
	const struct rcand *x = a, *y = b;
	if (x->s != y->s)
		return x->s > y->s ? -1 : 1;
	if (x->h != y->h)
		return x->h < y->h ? -1 : 1;
	return x->j < y->j ? -1 : (x->j > y->j);
}

static bool near(double a, double b, double rel)
{
	double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
	return fabs(a - b) <= rel * (m > 1e-30 ? m : 1e-30);
}

/* near ties among the first n + 1 of a sorted candidate list */
static bool ties_at(const struct rcand *c, uint32_t total, uint32_t n)
{
	if (n == 0 || n >= total)
		return false;
	return near(c[n - 1].s, c[n].s, 1e-5);
}

/* the pooled ranking of head h (candidates: non-forced prefix positions) */
static uint32_t ref_rank(const struct ref_result *rr, uint32_t L, uint32_t P, const uint8_t *forced,
			 uint32_t h, struct rcand *out)
{
	uint32_t n = 0;
	for (uint32_t j = 0; j < P; j++)
		if (!forced[j])
			out[n++] = (struct rcand){rr->score[(size_t)h * L + j], h, j};
	qsort(out, n, sizeof(*out), rcand_cmp);
	return n;
}

static void ref_budget(const struct prob *pb, const uint32_t *caps, struct rb *o)
{
	const struct skv_params *p = &pb->p;
	const uint32_t L = pb->sh.prompt_len, W = p->window, hs = h_store(pb);
	const uint32_t P = L - W;
	uint8_t *forced = calloc(L, 1);
	uint32_t F = 0;

	memset(o, 0, sizeof(*o));
	o->L = L;
	o->hs = hs;
	o->nl = pb->n_layers;
	o->kept = calloc((size_t)o->nl * hs, 4);
	o->keep = calloc((size_t)o->nl * hs * L, 1);
	o->mass = calloc((size_t)o->nl * hs, sizeof(double));
	for (uint32_t j = P; j < L; j++)
		forced[j] = 1;
	for (uint32_t i = 0; i < p->n_protected; i++)
		for (uint32_t j = p->protected_ranges[i].begin; j < p->protected_ranges[i].end; j++)
			forced[j] = 1;
	for (uint32_t j = 0; j < L; j++)
		F += forced[j];
	const uint32_t avail = L - F;
	struct rcand *rank = calloc((size_t)hs * L + 1, sizeof(*rank));
	uint32_t *nrank = calloc(hs, 4);
	uint32_t *cneed = calloc((size_t)o->nl * hs, 4);
	struct ref_result *rr = calloc(o->nl, sizeof(*rr));
	struct skv_params pu = *p;
	pu.budget_mode = SKV_BUDGET_UNIFORM;
	pu.capacity = F + 1 <= L ? F + 1 : L; /* anything that scores */
	pu.fallback_below = 0;
	bool mass_mode =
	    p->budget_mode == SKV_BUDGET_MASS || p->budget_mode == SKV_BUDGET_MASS_HEADS;
	bool bypass_all = mass_mode && L < p->c_min;

	/* mass curve of head h at k kept, from its ranking */
#define CURVE(l, h, k, outv)                                                                       \
	do {                                                                                       \
		uint32_t picks_ = (k)-F;                                                           \
		if (picks_ >= avail) {                                                             \
			outv = 1.0;                                                                \
		} else {                                                                           \
			double a_ = 0;                                                             \
			const double *v_ = rr[l].vote + (size_t)(h)*L;                             \
			for (uint32_t j_ = 0; j_ < L; j_++)                                        \
				if (forced[j_])                                                    \
					a_ += v_[j_];                                              \
			for (uint32_t i_ = 0; i_ < picks_; i_++)                                   \
				a_ += v_[rank[(size_t)(h)*L + i_].j];                              \
			outv = a_ < 1.0 ? a_ : 1.0;                                                \
		}                                                                                  \
	} while (0)

	for (uint32_t l = 0; l < o->nl; l++) {
		CU_ASSERT_FATAL(ref_compact(&pb->sh, &pu, pb->q[l], pb->k[l], &rr[l]) == 0);
		for (uint32_t h = 0; h < hs; h++)
			nrank[h] = ref_rank(&rr[l], L, P, forced, h, rank + (size_t)h * L);
		for (uint32_t h = 0; h < hs; h++) {
			size_t hi = (size_t)l * hs + h;
			uint8_t *kp = o->keep + hi * L;
			const struct rcand *rk = rank + (size_t)h * L;
			uint32_t picks = 0;
			double m = 0;
			if (bypass_all || (!mass_mode && L < caps[l])) {
				memset(kp, 1, L);
				o->kept[hi] = L;
				o->mass[hi] = 1;
				continue;
			}
			memcpy(kp, forced, L);
			if (p->budget_mode == SKV_BUDGET_UNIFORM ||
			    p->budget_mode == SKV_BUDGET_LAYERS) {
				picks = caps[l] - F;
			} else if (p->budget_mode == SKV_BUDGET_MASS_HEADS) {
				uint32_t k = p->c_min;
				for (;; k++) {
					CURVE(l, h, k, m);
					if (near(m, p->tau, 1e-4))
						o->fragile = 1;
					if (m >= p->tau || k >= p->c_max || k - F >= nrank[h])
						break;
				}
				if (m < p->tau)
					k = p->c_max;
				picks = k - F;
			} else if (p->budget_mode == SKV_BUDGET_MASS) {
				uint32_t c = p->c_min;
				for (;;) {
					CURVE(l, h, c, m);
					if (near(m, p->tau, 1e-4))
						o->fragile = 1;
					if (m >= p->tau || c >= p->c_max)
						break;
					c = p->c_max - c > p->c_step ? c + p->c_step : p->c_max;
				}
				cneed[hi] = c;
				continue; /* decided below */
			} else {
				continue; /* heads: per layer below */
			}
			if (picks > nrank[h])
				picks = nrank[h];
			if (ties_at(rk, nrank[h], picks))
				o->fragile = 1;
			for (uint32_t i = 0; i < picks; i++)
				kp[rk[i].j] = 1;
			o->kept[hi] = F + picks;
			if (mass_mode) {
				CURVE(l, h, F + picks, o->mass[hi]);
			} else {
				double a = 0;
				for (uint32_t j = 0; j < L; j++)
					if (kp[j])
						a += rr[l].vote[(size_t)h * L + j];
				o->mass[hi] = a;
			}
		}
		if (p->budget_mode == SKV_BUDGET_HEADS && L >= caps[l]) {
			/* floor, then the layer-wide rest */
			uint32_t b = caps[l] - F, f = (uint32_t)((double)p->head_floor * b);
			if (f > avail)
				f = avail;
			struct rcand *rest = calloc((size_t)hs * L + 1, sizeof(*rest));
			uint32_t nr = 0;
			for (uint32_t h = 0; h < hs; h++) {
				uint8_t *kp = o->keep + ((size_t)l * hs + h) * L;
				const struct rcand *rk = rank + (size_t)h * L;
				if (ties_at(rk, nrank[h], f))
					o->fragile = 1;
				for (uint32_t i = 0; i < nrank[h]; i++) {
					if (i < f)
						kp[rk[i].j] = 1;
					else
						rest[nr++] = rk[i];
				}
			}
			qsort(rest, nr, sizeof(*rest), rcand_cmp);
			uint32_t take = hs * (b - f) < nr ? hs * (b - f) : nr;
			if (ties_at(rest, nr, take))
				o->fragile = 1;
			for (uint32_t i = 0; i < take; i++)
				o->keep[((size_t)l * hs + rest[i].h) * L + rest[i].j] = 1;
			for (uint32_t h = 0; h < hs; h++) {
				size_t hi = (size_t)l * hs + h;
				double a = 0;
				uint32_t n = 0;
				for (uint32_t j = 0; j < L; j++)
					if (o->keep[hi * L + j]) {
						n++;
						a += rr[l].vote[(size_t)h * L + j];
					}
				o->kept[hi] = n;
				o->mass[hi] = a;
			}
			free(rest);
		}
		if (p->budget_mode == SKV_BUDGET_MASS && !bypass_all) {
			/* rankings of this layer kept for the decision after all layers */
			for (uint32_t h = 0; h < hs; h++)
				memcpy(o->keep + ((size_t)l * hs + h) * L, forced, L);
		}
	}
	if (p->budget_mode == SKV_BUDGET_MASS) {
		o->c_star = p->c_min;
		for (size_t i = 0; i < (size_t)o->nl * hs && !bypass_all; i++)
			o->c_star = cneed[i] > o->c_star ? cneed[i] : o->c_star;
		for (uint32_t l = 0; l < o->nl && !bypass_all; l++)
			for (uint32_t h = 0; h < hs; h++) {
				size_t hi = (size_t)l * hs + h;
				const struct rcand *rk = rank + (size_t)h * L;
				/* the ranking of layer l: recompute */
				nrank[h] = ref_rank(&rr[l], L, P, forced, h, rank + (size_t)h * L);
				uint32_t picks =
				    o->c_star - F < nrank[h] ? o->c_star - F : nrank[h];
				if (ties_at(rk, nrank[h], picks))
					o->fragile = 1;
				for (uint32_t i = 0; i < picks; i++)
					o->keep[hi * L + rk[i].j] = 1;
				o->kept[hi] = F + picks;
				CURVE(l, h, F + picks, o->mass[hi]);
			}
	} else if (p->budget_mode == SKV_BUDGET_UNIFORM) {
		o->c_star = p->capacity;
	}
#undef CURVE
	if (p->fallback_below > 0) {
		for (size_t i = 0; i < (size_t)o->nl * hs; i++) {
			if (near(o->mass[i], p->fallback_below, 1e-4))
				o->fragile = 1;
			if (o->mass[i] < p->fallback_below)
				o->fallback = 1;
		}
		if (o->fallback)
			for (size_t i = 0; i < (size_t)o->nl * hs; i++) {
				o->kept[i] = L;
				o->mass[i] = 1;
				memset(o->keep + i * L, 1, L);
			}
	}
	for (uint32_t l = 0; l < o->nl; l++)
		ref_result_free(&rr[l]);
	free(rr);
	free(rank);
	free(nrank);
	free(cneed);
	free(forced);
}

static void rb_free(struct rb *o)
{
	free(o->kept);
	free(o->keep);
	free(o->mass);
}

/* one random problem of budget mode b; snapkv or h2o, any GQA */
static void random_budget_prob(struct prob *pb, enum skv_budget b)
{
	static const uint32_t heads[][2] = {{1, 1}, {2, 2}, {4, 2}, {3, 1}};
	uint32_t L = 12 + pick(80), D = 1u << pick(5);
	const uint32_t *hh = heads[pick(4)];
	uint32_t n_layers = 1 + pick(3);

	prob_init(pb, L, D, hh[0], hh[1], n_layers);
	pb->p.policy = pick(5) ? SKV_POLICY_SNAPKV : SKV_POLICY_H2O;
	uint32_t W = 1 + pick(8);
	pb->p.window = W;
	pb->sh.n_q = pb->p.policy == SKV_POLICY_H2O ? L : W;
	pb->p.kernel = 1 + 2 * pick(3);
	pb->p.pooling = pick(2) ? SKV_POOL_AVG : SKV_POOL_MAX;
	pb->p.gqa = pick(2) ? SKV_GQA_EXPAND : SKV_GQA_GROUP;
	if (pick(3) == 0) {
		uint32_t a = pick(L - W - 2);
		pb->p.protected_ranges[pb->p.n_protected++] =
		    (struct skv_range){a, a + 1 + pick(3)};
	}
	uint32_t F = W;
	if (pb->p.n_protected) {
		const struct skv_range *r = &pb->p.protected_ranges[0];
		F += r->end <= L - W ? r->end - r->begin : L - W - r->begin;
	}
	pb->p.budget_mode = b;
	pb->p.capacity = F + 1 + pick(L - F + 3);
	switch (b) {
	case SKV_BUDGET_LAYERS:
		if (pick(2)) {
			pb->p.n_layer_caps = n_layers;
			for (uint32_t l = 0; l < n_layers; l++)
				pb->p.layer_caps[l] = F + 1 + pick(L - F + 3);
		} else {
			static const float rs[] = {0.5f, 1.0f, 2.0f, 0.8f};
			pb->p.pyramid_r = rs[pick(4)];
			pb->p.capacity = F + 2 + pick(L - F);
			uint32_t rows[4];
			while (skv_budget_rows(&pb->sh, &pb->p, n_layers, rows, NULL) < 0)
				pb->p.capacity++;
		}
		break;
	case SKV_BUDGET_HEADS: {
		static const float as[] = {0.0f, 0.2f, 0.5f, 1.0f, 0.33f};
		pb->p.head_floor = as[pick(5)];
		break;
	}
	case SKV_BUDGET_MASS:
	case SKV_BUDGET_MASS_HEADS: {
		static const float taus[] = {0.3f, 0.5f, 0.7f, 0.9f, 0.97f, 1.0f};
		pb->p.tau = taus[pick(6)];
		pb->p.c_min = F + pick(L - F + 2);
		if (pb->p.c_min <= W)
			pb->p.c_min = W + 1;
		pb->p.c_max = pb->p.c_min + pick(L);
		pb->p.c_step = 1 + pick(6);
		break;
	}
	default:
		break;
	}
	if (pick(4) == 0)
		pb->p.fallback_below = 0.3f + 0.1f * (float)pick(5);
	pb->lout = pick(2) ? LAY_HND : LAY_NHD;
}

static void run_random_mode(enum skv_budget b, int cases)
{
	int tolerated = 0, bad = 0;
	static const char *isas[] = {"scalar", "avx2", "avx512"};

	for (int c = 0; c < cases; c++) {
		struct prob pb;
		struct skv_error e;
		struct skv_budget_result res;
		struct rb o;

		random_budget_prob(&pb, b);
		prob_random(&pb, 1.0 + rng_unif() * 2);
		prob_build(&pb);
		uint32_t hs = h_store(&pb), nh = pb.n_layers * hs;
		uint32_t *kept = calloc(nh, 4), *caps = calloc(pb.n_layers, 4);
		setenv("SKV_ISA", isas[c % 3], 1);
		int r = run_budget(&pb, 1 + (unsigned)pick(3), kept, &res, &e);
		unsetenv("SKV_ISA");
		if (r != 0)
			fprintf(stderr, "\n  %s case %d: rc %d: %s\n", skv_budget_name(b), c, r,
				e.msg);
		CU_ASSERT_EQUAL_FATAL(r, 0);
		/* C_l per layer: skv_budget_rows without a fallback is C_l (<= L) */
		struct skv_params q = pb.p;
		q.fallback_below = 0;
		uint32_t *rows = calloc(pb.n_layers, 4);
		CU_ASSERT_FATAL(skv_budget_rows(&pb.sh, &q, pb.n_layers, rows, NULL) == 0);
		for (uint32_t l = 0; l < pb.n_layers; l++) {
			caps[l] = rows[l];
			if (b == SKV_BUDGET_LAYERS && pb.p.n_layer_caps)
				caps[l] = pb.p.layer_caps[l];
			else if (b == SKV_BUDGET_LAYERS || b == SKV_BUDGET_UNIFORM ||
				 b == SKV_BUDGET_HEADS) {
				/* rows is min(L, C_l) or more (heads): recompute C_l */
				caps[l] = b == SKV_BUDGET_LAYERS ? rows[l] : pb.p.capacity;
				if (b == SKV_BUDGET_LAYERS && rows[l] == pb.sh.prompt_len)
					caps[l] = pb.sh.prompt_len; /* >= L: all kept either way */
			}
		}
		free(rows);
		ref_budget(&pb, caps, &o);
		bool same = res.fallback == o.fallback;
		if (b == SKV_BUDGET_MASS || b == SKV_BUDGET_UNIFORM)
			same &= res.c_star == o.c_star;
		for (uint32_t l = 0; l < pb.n_layers && same; l++)
			for (uint32_t h = 0; h < hs && same; h++) {
				size_t hi = (size_t)l * hs + h;
				const int32_t *got =
				    pb.out[l].positions + (size_t)h * pb.out[l].pos_stride;
				same &= kept[hi] == o.kept[hi];
				for (uint32_t i = 0, j = 0; same && j < pb.sh.prompt_len; j++)
					if (o.keep[hi * pb.sh.prompt_len + j])
						same &= got[i++] == (int32_t)j;
				same &= fabs(pb.out[l].retained_mass[h] - o.mass[hi]) < 1e-4;
				/* K rows follow the positions (f32 in and out: exact) */
				for (uint32_t i = 0; same && i < kept[hi] && pb.dk == pb.dout;
				     i++) {
					uint32_t kvh = pb.p.gqa == SKV_GQA_EXPAND
							   ? h / (pb.sh.h_q / pb.sh.h_kv)
							   : h;
					float want =
					    pb.k[l][((size_t)kvh * pb.sh.prompt_len + got[i]) *
						    pb.sh.head_dim];
					same &= load(pb.dout, pb.out[l].k.data,
						     toff(&pb.out[l].k, h, i, 0)) == want;
				}
			}
		if (!same && o.fragile) {
			tolerated++;
		} else if (!same) {
			bad++;
			fprintf(stderr, "\n  %s case %d mismatch (L %u, layers %u, hs %u)\n",
				skv_budget_name(b), c, pb.sh.prompt_len, pb.n_layers, hs);
			for (uint32_t l = 0; l < pb.n_layers; l++)
				for (uint32_t h = 0; h < hs; h++)
					fprintf(stderr,
						"   l%u h%u cap %u: kept %u want %u mass %g want "
						"%g fb %d/%d\n",
						l, h, caps[l], kept[l * hs + h], o.kept[l * hs + h],
						(double)pb.out[l].retained_mass[h],
						o.mass[l * hs + h], res.fallback, o.fallback);
		}
		rb_free(&o);
		free(kept);
		free(caps);
		prob_free(&pb);
	}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT(tolerated * 10 <= cases);
}

static void test_random_uniform(void)
{
	run_random_mode(SKV_BUDGET_UNIFORM, 60);
}
static void test_random_layers(void)
{
	run_random_mode(SKV_BUDGET_LAYERS, 80);
}
static void test_random_heads(void)
{
	run_random_mode(SKV_BUDGET_HEADS, 80);
}
static void test_random_mass(void)
{
	run_random_mode(SKV_BUDGET_MASS, 80);
}
static void test_random_mass_heads(void)
{
	run_random_mode(SKV_BUDGET_MASS_HEADS, 80);
}

/*
 * mass: C* = C_max set by one flat layer (q = 0: every head needs C_max),
 * last or first; the other layers alone stop below C_max. Heads ranked
 * before the flat layer wait for phase two, heads after it are emitted in
 * phase one (skv-budget.c); either way the reference's counts, positions
 * and masses, and the same bytes at 1 and 4 threads.
 */
static void test_mass_cmax_order(void)
{
	for (int first = 0; first < 2; first++) {
		uint64_t hash[2], seed = rng_state;
		for (int t = 0; t < 2; t++) {
			struct prob pb;
			rng_state = seed;
			prob_init(&pb, 96, 8, 4, 2, 3);
			pb.p.window = 4;
			pb.sh.n_q = 4;
			pb.p.budget_mode = SKV_BUDGET_MASS;
			pb.p.capacity = 40;
			pb.p.tau = 0.6f;
			pb.p.c_min = 8;
			pb.p.c_max = 40;
			pb.p.c_step = 8;
			prob_random(&pb, 3.0);
			memset(pb.q[first ? 0 : 2], 0,
			       (size_t)pb.sh.h_q * (pb.sh.n_q + 1) * pb.sh.head_dim *
				   sizeof(float));
			prob_build(&pb);
			uint32_t hs = h_store(&pb), kept[3 * 4], caps[3] = {40, 40, 40};
			struct skv_budget_result res;
			struct skv_error e;
			struct rb o;
			CU_ASSERT_EQUAL_FATAL(run_budget(&pb, t ? 4 : 1, kept, &res, &e), 0);
			ref_budget(&pb, caps, &o);
			CU_ASSERT_EQUAL(res.c_star, 40);
			CU_ASSERT_EQUAL(o.c_star, 40);
			hash[t] = fnv(0xcbf29ce484222325ull, kept, sizeof(kept));
			for (uint32_t l = 0; l < 3; l++) {
				for (uint32_t h = 0; h < hs; h++) {
					const int32_t *got =
					    pb.out[l].positions + (size_t)h * pb.out[l].pos_stride;
					size_t hi = (size_t)l * hs + h;
					CU_ASSERT_EQUAL(kept[hi], o.kept[hi]);
					for (uint32_t i = 0, j = 0; j < pb.sh.prompt_len; j++)
						if (o.keep[hi * pb.sh.prompt_len + j])
							CU_ASSERT_EQUAL(got[i++], (int32_t)j);
					CU_ASSERT(fabs(pb.out[l].retained_mass[h] - o.mass[hi]) <
						  1e-4);
				}
				hash[t] = fnv(hash[t], pb.out[l].k.data, pb.out_k_bytes);
				hash[t] = fnv(hash[t], pb.out[l].v.data, pb.out_v_bytes);
				hash[t] = fnv(hash[t], pb.out[l].positions, pb.pos_count * 4);
				hash[t] = fnv(hash[t], pb.out[l].retained_mass, hs * 4);
			}
			rb_free(&o);
			prob_free(&pb);
		}
		CU_ASSERT_EQUAL(hash[0], hash[1]);
	}
}

/* every mode: the same bytes whatever the thread count */
static void test_threads_invariant(void)
{
	for (int b = SKV_BUDGET_UNIFORM; b <= SKV_BUDGET_MASS_HEADS; b++)
		for (int c = 0; c < 6; c++) {
			struct prob pb;
			uint64_t seed = rng_state;
			uint64_t hash[2];
			for (int t = 0; t < 2; t++) {
				rng_state = seed;
				random_budget_prob(&pb, (enum skv_budget)b);
				prob_random(&pb, 2.0);
				prob_build(&pb);
				uint32_t kept[64 * 3];
				struct skv_budget_result res;
				struct skv_error e;
				CU_ASSERT_EQUAL_FATAL(run_budget(&pb, t ? 4 : 1, kept, &res, &e),
						      0);
				hash[t] = fnv(0xcbf29ce484222325ull, kept,
					      pb.n_layers * h_store(&pb) * 4);
				for (uint32_t l = 0; l < pb.n_layers; l++) {
					hash[t] = fnv(hash[t], pb.out[l].k.data, pb.out_k_bytes);
					hash[t] =
					    fnv(hash[t], pb.out[l].positions, pb.pos_count * 4);
					hash[t] =
					    fnv(hash[t], pb.out[l].retained_mass, h_store(&pb) * 4);
				}
				prob_free(&pb);
			}
			CU_ASSERT_EQUAL(hash[0], hash[1]);
		}
}

/* --------------------------------------------------- decision groups */

/* Outputs, kept counts and result of a member, as one hash. */
static uint64_t member_hash(const struct prob *pb, const uint32_t *kept,
			    const struct skv_budget_result *res)
{
	uint64_t h = fnv(0xcbf29ce484222325ull, kept, pb->n_layers * h_store(pb) * 4);

	for (uint32_t l = 0; l < pb->n_layers; l++) {
		h = fnv(h, pb->out[l].k.data, pb->out_k_bytes);
		h = fnv(h, pb->out[l].v.data, pb->out_v_bytes);
		h = fnv(h, pb->out[l].positions, pb->pos_count * 4);
		h = fnv(h, pb->out[l].retained_mass, h_store(pb) * 4);
	}
	h = fnv(h, &res->c_star, sizeof(res->c_star));
	h = fnv(h, &res->fallback, sizeof(res->fallback));
	return fnv(h, &res->min_mass, sizeof(res->min_mass));
}

/* Member m of a group: the shape and parameters of `seed`, its own data. */
static void group_member(struct prob *pb, enum skv_budget b, uint64_t seed, int m)
{
	rng_state = seed;
	random_budget_prob(pb, b);
	rng_state = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(m + 1));
	for (int i = 0; i < 4; i++)
		rng_next();
	prob_random(pb, 0.5 + rng_unif() * 3);
	prob_build(pb);
}

/* Whether every head of pb kept the full prompt (a fallback). */
static bool kept_full(const struct prob *pb, const uint32_t *kept)
{
	const uint32_t L = pb->sh.prompt_len, hs = h_store(pb);
	bool ok = true;

	for (uint32_t l = 0; l < pb->n_layers; l++)
		for (uint32_t h = 0; h < hs; h++) {
			const int32_t *pos =
			    pb->out[l].positions + (size_t)h * pb->out[l].pos_stride;
			ok &= kept[l * hs + h] == L && pb->out[l].retained_mass[h] == 1.0f;
			for (uint32_t j = 0; ok && j < L; j++)
				ok &= pos[j] == (int32_t)j;
		}
	return ok;
}

/*
 * skv_compact_begin/_end: with its own choice a member equals one
 * skv_compact_budget() call bit for bit; in a group of 2-4 members (same
 * shape and parameters, their own data) C* is the largest own C*, every
 * member equals a one-call run on the ladder {C*}, and the fallback, when
 * one member's mass at C* is below tau_f, makes every member keep all L.
 */
static void test_group_two_step(void)
{
	static const enum skv_budget modes[] = {SKV_BUDGET_MASS, SKV_BUDGET_UNIFORM,
						SKV_BUDGET_LAYERS};
	int groups_fell = 0, groups_raised = 0;

	for (int c = 0; c < 90; c++) {
		enum skv_budget b = modes[c % 3];
		uint64_t seed = rng_next();
		unsigned M = 2 + (unsigned)(c % 3);
		struct prob pb[4];
		struct skv_pending *pd[4];
		uint32_t *kept[4], own[4], cg = 0;
		struct skv_ctx *ca, *cb;
		struct skv_error e;
		bool fall = false;

		CU_ASSERT_FATAL(skv_ctx_new(1 + (unsigned)(c % 3), &ca) == 0);
		CU_ASSERT_FATAL(skv_ctx_new(1 + (unsigned)((c + 1) % 4), &cb) == 0);
		for (unsigned m = 0; m < M; m++) {
			group_member(&pb[m], b, seed, (int)m);
			kept[m] = calloc(pb[m].n_layers * h_store(&pb[m]), 4);
			int r = skv_compact_begin(ca, &pb[m].sh, &pb[m].p, pb[m].n_layers, pb[m].in,
						  pb[m].out, &pd[m], &e);
			if (r)
				fprintf(stderr, "\n  group case %d member %u: %s\n", c, m, e.msg);
			CU_ASSERT_EQUAL_FATAL(r, 0);
			own[m] = skv_pending_c_star(pd[m]);
			cg = own[m] > cg ? own[m] : cg;
		}
		groups_raised += b == SKV_BUDGET_MASS && own[0] != cg;
		float tau_f = pb[0].p.fallback_below, low[4];
		for (unsigned m = 0; m < M; m++) {
			low[m] = skv_pending_min_mass(pd[m], cg);
			fall |= tau_f > 0 && low[m] < tau_f;
		}
		groups_fell += fall;
		for (unsigned m = 0; m < M; m++) {
			struct skv_budget_result res = {.result_size = sizeof(res),
							.kept = kept[m]};
			CU_ASSERT_EQUAL_FATAL(skv_compact_end(cb, pd[m], cg, fall, &res, &e), 0);
			CU_ASSERT_EQUAL(res.fallback, fall);
			if (b == SKV_BUDGET_MASS)
				CU_ASSERT_EQUAL(res.c_star, cg);
			if (fall) {
				CU_ASSERT(kept_full(&pb[m], kept[m]));
				CU_ASSERT(res.min_mass == low[m]);
				continue;
			}
			/* the reference: one call, on the ladder {C*} for mass */
			uint64_t got = member_hash(&pb[m], kept[m], &res);
			struct prob ref;
			struct skv_budget_result rr;
			uint32_t *rk = calloc(pb[m].n_layers * h_store(&pb[m]), 4);
			group_member(&ref, b, seed, (int)m);
			if (b == SKV_BUDGET_MASS)
				ref.p.c_min = ref.p.c_max = cg;
			CU_ASSERT_EQUAL_FATAL(run_budget(&ref, 2, rk, &rr, &e), 0);
			CU_ASSERT_EQUAL(rr.fallback, 0);
			CU_ASSERT_EQUAL(got, member_hash(&ref, rk, &rr));
			free(rk);
			prob_free(&ref);
		}
		/* member 0 alone, its own choice: one skv_compact_budget() call */
		for (unsigned m = 0; m < M; m++)
			prob_free(&pb[m]), free(kept[m]);
		struct prob one, two;
		struct skv_budget_result r1, r2 = {.result_size = sizeof(r2)};
		uint32_t *k1 = NULL, *k2 = NULL;
		group_member(&one, b, seed, 0);
		group_member(&two, b, seed, 0);
		k1 = calloc(one.n_layers * h_store(&one), 4);
		k2 = calloc(one.n_layers * h_store(&one), 4);
		r2.kept = k2;
		CU_ASSERT_EQUAL_FATAL(run_budget(&one, 1, k1, &r1, &e), 0);
		CU_ASSERT_EQUAL_FATAL(skv_compact_begin(cb, &two.sh, &two.p, two.n_layers, two.in,
							two.out, &pd[0], &e),
				      0);
		uint32_t c0 = skv_pending_c_star(pd[0]);
		float lo = skv_pending_min_mass(pd[0], c0);
		bool f0 = two.p.fallback_below > 0 && lo < two.p.fallback_below;
		CU_ASSERT_EQUAL_FATAL(skv_compact_end(ca, pd[0], c0, f0, &r2, &e), 0);
		CU_ASSERT_EQUAL(member_hash(&one, k1, &r1), member_hash(&two, k2, &r2));
		free(k1), free(k2);
		prob_free(&one), prob_free(&two);
		skv_ctx_free(ca);
		skv_ctx_free(cb);
	}
	/* the cases exercise both decisions */
	CU_ASSERT(groups_fell > 0);
	CU_ASSERT(groups_raised > 0);
}

/* What a group cannot take, and end's own checks; nothing leaks. */
static void test_group_refusals(void)
{
	struct prob pb;
	struct skv_pending *pd = (struct skv_pending *)1;
	struct skv_ctx *ctx;
	struct skv_error e;
	uint32_t kept[64 * 3];
	struct skv_budget_result res = {.result_size = sizeof(res), .kept = kept};

	CU_ASSERT_FATAL(skv_ctx_new(2, &ctx) == 0);
	for (int b = SKV_BUDGET_HEADS; b <= SKV_BUDGET_MASS_HEADS; b += 2) {
		group_member(&pb, (enum skv_budget)b, 77, 0);
		CU_ASSERT_EQUAL(
		    skv_compact_begin(ctx, &pb.sh, &pb.p, pb.n_layers, pb.in, pb.out, &pd, &e),
		    -EINVAL);
		CU_ASSERT(pd == NULL);
		CU_ASSERT(strstr(e.msg, "group") != NULL);
		prob_free(&pb);
	}
	/* mass: C* off the ladder, a fallback without room for L */
	for (int i = 0; i < 40; i++) {
		group_member(&pb, SKV_BUDGET_MASS, 1000 + (uint64_t)i, 0);
		if (pb.sh.prompt_len >= pb.p.c_min && pb.p.fallback_below == 0)
			break;
		prob_free(&pb);
	}
	CU_ASSERT_FATAL(pb.p.fallback_below == 0);
	CU_ASSERT_FATAL(
	    skv_compact_begin(ctx, &pb.sh, &pb.p, pb.n_layers, pb.in, pb.out, &pd, &e) == 0);
	CU_ASSERT_EQUAL(skv_compact_end(ctx, pd, pb.p.c_max + 1, 0, &res, &e), -EINVAL);
	CU_ASSERT(strstr(e.msg, "ladder") != NULL);
	/* below the member's own C*: its heads would not all reach tau */
	CU_ASSERT_FATAL(
	    skv_compact_begin(ctx, &pb.sh, &pb.p, pb.n_layers, pb.in, pb.out, &pd, &e) == 0);
	uint32_t own = skv_pending_c_star(pd);
	if (own > pb.p.c_min) {
		CU_ASSERT_EQUAL(skv_compact_end(ctx, pd, own - 1, 0, &res, &e), -EINVAL);
		CU_ASSERT(strstr(e.msg, "own C*") != NULL);
	} else {
		skv_pending_free(pd);
	}
	CU_ASSERT_FATAL(
	    skv_compact_begin(ctx, &pb.sh, &pb.p, pb.n_layers, pb.in, pb.out, &pd, &e) == 0);
	CU_ASSERT_EQUAL(skv_compact_end(ctx, pd, pb.p.c_min, 1, &res, &e), -EINVAL);
	CU_ASSERT(strstr(e.msg, "fallback_below") != NULL);
	CU_ASSERT_FATAL(
	    skv_compact_begin(ctx, &pb.sh, &pb.p, pb.n_layers, pb.in, pb.out, &pd, &e) == 0);
	skv_pending_free(pd); /* never ended: freed as is */
	prob_free(&pb);
	skv_ctx_free(ctx);
}

/* Cancel after `left` questions (the count shared by the pool's threads). */
static int cancel_after(void *arg)
{
	return __atomic_sub_fetch((int *)arg, 1, __ATOMIC_RELAXED) < 0;
}

/*
 * skv_ctx_set_cancel: a context whose cancel answers yes stops the call
 * with -ECANCELED in every mode (also a group member's steps); one that
 * answers no changes no byte.
 */
static void test_cancel(void)
{
	for (int b = SKV_BUDGET_UNIFORM; b <= SKV_BUDGET_MASS_HEADS; b++)
		for (int c = 0; c < 4; c++) {
			uint64_t seed = rng_next();
			struct prob one, two;
			struct skv_budget_result r1, r2;
			struct skv_ctx *ctx;
			struct skv_error e;
			uint32_t k1[64 * 3], k2[64 * 3];
			int never = 1 << 30, soon = 0, later = 1 + c;

			group_member(&one, (enum skv_budget)b, seed, 0);
			group_member(&two, (enum skv_budget)b, seed, 0);
			CU_ASSERT_FATAL(skv_ctx_new(1 + (unsigned)c % 3, &ctx) == 0);
			CU_ASSERT_EQUAL_FATAL(run_budget(&one, 2, k1, &r1, &e), 0);
			skv_ctx_set_cancel(ctx, cancel_after, &never);
			r2 = (struct skv_budget_result){.result_size = sizeof(r2), .kept = k2};
			CU_ASSERT_EQUAL(skv_compact_budget(ctx, &two.sh, &two.p, two.n_layers,
							   two.in, two.out, &r2, &e),
					0);
			CU_ASSERT_EQUAL(member_hash(&one, k1, &r1), member_hash(&two, k2, &r2));
			skv_ctx_set_cancel(ctx, cancel_after, &soon);
			CU_ASSERT_EQUAL(skv_compact_budget(ctx, &two.sh, &two.p, two.n_layers,
							   two.in, two.out, &r2, &e),
					-ECANCELED);
			CU_ASSERT(strstr(e.msg, "cancelled") != NULL);
			/* mid-call: cancelled, or done before the cancel was asked */
			skv_ctx_set_cancel(ctx, cancel_after, &later);
			int rl = skv_compact_budget(ctx, &two.sh, &two.p, two.n_layers, two.in,
						    two.out, &r2, &e);
			CU_ASSERT(rl == -ECANCELED || (rl == 0 && member_hash(&one, k1, &r1) ==
								      member_hash(&two, k2, &r2)));
			skv_ctx_set_cancel(ctx, cancel_after, &soon);
			if (b != SKV_BUDGET_HEADS && b != SKV_BUDGET_MASS_HEADS) {
				struct skv_pending *pd = NULL;
				soon = 0;
				CU_ASSERT_EQUAL(skv_compact_begin(ctx, &two.sh, &two.p,
								  two.n_layers, two.in, two.out,
								  &pd, &e),
						-ECANCELED);
				CU_ASSERT(pd == NULL);
			}
			skv_ctx_set_cancel(ctx, NULL, NULL);
			CU_ASSERT_EQUAL(skv_compact_budget(ctx, &two.sh, &two.p, two.n_layers,
							   two.in, two.out, &r2, &e),
					0);
			CU_ASSERT_EQUAL(member_hash(&one, k1, &r1), member_hash(&two, k2, &r2));
			skv_ctx_free(ctx);
			prob_free(&one);
			prob_free(&two);
		}
}

/*
 * Zero ranking width (issue 24, skv.h): the forced positions fill C_max
 * (mass:0.9:12:12:1, W 8, protected [0,4)) or all of L (L 16, protected
 * [0,8), mass:0.9:16:32:4). Phase one wrote through unallocated per-head
 * scratch here (SIGSEGV). Every head keeps exactly the forced positions, in
 * one call, in every thread count and GQA mode, and through the two steps of
 * a decision group; mass-heads takes the same inputs.
 */
static void zero_width_prob(struct prob *pb, int variant, enum skv_gqa gqa, enum skv_budget b,
			    uint64_t seed)
{
	rng_state = seed;
	if (variant == 0) {
		prob_init(pb, 40, 8, 4, 2, 2);
		pb->p.protected_ranges[0] = (struct skv_range){0, 4};
		pb->p.c_min = pb->p.c_max = 12;
		pb->p.c_step = 1;
	} else {
		prob_init(pb, 16, 8, 4, 2, 2);
		pb->p.protected_ranges[0] = (struct skv_range){0, 8};
		pb->p.c_min = 16;
		pb->p.c_max = 32;
		pb->p.c_step = 4;
	}
	pb->p.n_protected = 1;
	pb->p.window = 8;
	pb->sh.n_q = 8;
	pb->p.capacity = pb->p.c_min;
	pb->p.kernel = 3;
	pb->p.gqa = gqa;
	pb->p.budget_mode = b;
	pb->p.tau = 0.9f;
	prob_random(pb, 1.5);
	prob_build(pb);
}

static void test_mass_zero_width(void)
{
	static const enum skv_budget modes[] = {SKV_BUDGET_MASS, SKV_BUDGET_MASS_HEADS};
	const uint64_t rng_saved = rng_state; /* the random suites' draws unchanged */

	for (int variant = 0; variant < 2; variant++)
		for (int gm = 0; gm < 2; gm++)
			for (int mi = 0; mi < 2; mi++)
				for (unsigned th = 1; th <= 3; th++) {
					enum skv_gqa gqa = gm ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
					struct prob pb;
					struct skv_budget_result res;
					struct skv_error e;
					uint32_t kept[2 * 4];

					zero_width_prob(&pb, variant, gqa, modes[mi], 77 + th);
					const uint32_t F = variant == 0 ? 12 : 16;
					const uint32_t hs = h_store(&pb);
					int r = run_budget(&pb, th, kept, &res, &e);
					if (r)
						fprintf(stderr, "\n  zero width %d: %s\n", variant,
							e.msg);
					CU_ASSERT_EQUAL_FATAL(r, 0);
					int32_t want[16];
					uint32_t n = 0;
					for (uint32_t j = 0; j < pb.sh.prompt_len; j++)
						if (j < (variant == 0 ? 4u : 8u) ||
						    j >= pb.sh.prompt_len - 8)
							want[n++] = (int32_t)j;
					CU_ASSERT_EQUAL(n, F);
					for (uint32_t l = 0; l < pb.n_layers; l++)
						for (uint32_t h = 0; h < hs; h++) {
							CU_ASSERT_EQUAL(kept[l * hs + h], F);
							CU_ASSERT(
							    positions_are(&pb, l, h, want, F));
						}
					if (modes[mi] == SKV_BUDGET_MASS)
						CU_ASSERT_EQUAL(res.c_star,
								variant == 0 ? 12u : 16u);
					if (variant == 1)
						CU_ASSERT(res.min_mass == 1.0f);
					prob_free(&pb);
				}

	/* a decision group of two such members, and one member with a wider
	 * partner: the group's C* is the partner's, the zero-width member
	 * still keeps what its C_max allows */
	for (int variant = 0; variant < 2; variant++) {
		struct prob pb[2];
		struct skv_pending *pd[2];
		struct skv_ctx *ctx;
		struct skv_error e;
		uint32_t cg = 0, kept[2][8];

		CU_ASSERT_FATAL(skv_ctx_new(2, &ctx) == 0);
		for (int m = 0; m < 2; m++) {
			zero_width_prob(&pb[m], variant, SKV_GQA_EXPAND, SKV_BUDGET_MASS,
					900 + (uint64_t)m);
			int r = skv_compact_begin(ctx, &pb[m].sh, &pb[m].p, pb[m].n_layers,
						  pb[m].in, pb[m].out, &pd[m], &e);
			if (r)
				fprintf(stderr, "\n  zero width group: %s\n", e.msg);
			CU_ASSERT_EQUAL_FATAL(r, 0);
			uint32_t c = skv_pending_c_star(pd[m]);
			cg = c > cg ? c : cg;
		}
		CU_ASSERT_EQUAL(cg, variant == 0 ? 12u : 16u);
		for (int m = 0; m < 2; m++) {
			float lo = skv_pending_min_mass(pd[m], cg);
			CU_ASSERT(lo >= 0.0f && lo <= 1.0f);
			struct skv_budget_result res = {.result_size = sizeof(res),
							.kept = kept[m]};
			CU_ASSERT_EQUAL_FATAL(skv_compact_end(ctx, pd[m], cg, 0, &res, &e), 0);
			for (int i = 0; i < 8; i++)
				CU_ASSERT_EQUAL(kept[m][i], variant == 0 ? 12u : 16u);
			prob_free(&pb[m]);
		}
		skv_ctx_free(ctx);
	}
	rng_state = rng_saved;
}

/* The text form of every mode, the ladder's defaults, and what is refused. */
static void test_budget_parse(void)
{
	static const char *const bad[] = {"",
					  "adaptive",
					  "uniform:1",
					  "layers",
					  "layers:",
					  "layers:20,x",
					  "layers:0",
					  "pyramid",
					  "pyramid:r",
					  "heads:a",
					  "heads:0.2:1",
					  "mass",
					  "mass:0.9:1:2",
					  "mass:x",
					  "mass:0.9:0:64:4",
					  "mass:0.9:16:64:0",
					  "mass-heads:0.9:1:2:3",
					  "mass-heads:0.9:-1:20",
					  "mass:1e99"};
	struct skv_params p;
	struct skv_error e;

	skv_params_init(&p);
	CU_ASSERT_EQUAL(skv_budget_parse("layers:20,30,40", &p, &e), 0);
	CU_ASSERT_EQUAL(p.budget_mode, SKV_BUDGET_LAYERS);
	CU_ASSERT_EQUAL(p.n_layer_caps, 3);
	CU_ASSERT_EQUAL(p.layer_caps[2], 40);
	CU_ASSERT_EQUAL(skv_budget_parse("pyramid:0.5", &p, &e), 0);
	CU_ASSERT_EQUAL(p.n_layer_caps, 0);
	CU_ASSERT_EQUAL(p.pyramid_r, 0.5f);
	CU_ASSERT_EQUAL(skv_budget_parse("heads:0.3", &p, &e), 0);
	CU_ASSERT_EQUAL(p.budget_mode, SKV_BUDGET_HEADS);
	CU_ASSERT_EQUAL(p.head_floor, 0.3f);
	CU_ASSERT_EQUAL(skv_budget_parse("mass:0.9:40:200:8", &p, &e), 0);
	CU_ASSERT_EQUAL(p.budget_mode, SKV_BUDGET_MASS);
	CU_ASSERT(p.tau == 0.9f && p.c_min == 40 && p.c_max == 200 && p.c_step == 8);
	/* defaults from W and C, only where the spec left them out */
	p.window = 32;
	p.budget = 2048;
	CU_ASSERT_EQUAL(skv_budget_parse("mass-heads:0.95", &p, &e), 0);
	CU_ASSERT_EQUAL(p.budget_mode, SKV_BUDGET_MASS_HEADS);
	skv_budget_defaults(&p);
	CU_ASSERT(p.c_min == 33 && p.c_max == 2048 && p.c_step == (2048 - 32) / 16);
	CU_ASSERT_EQUAL(skv_budget_parse("mass:0.9:40:200:8", &p, &e), 0);
	skv_budget_defaults(&p);
	CU_ASSERT(p.c_min == 40 && p.c_max == 200 && p.c_step == 8);
	CU_ASSERT_EQUAL(skv_budget_parse("uniform", &p, &e), 0);
	CU_ASSERT_EQUAL(p.budget_mode, SKV_BUDGET_UNIFORM);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		e.msg[0] = 0;
		CU_ASSERT_EQUAL(skv_budget_parse(bad[i], &p, &e), -EINVAL);
		CU_ASSERT(e.msg[0] != 0);
	}
	CU_ASSERT_EQUAL(skv_budget_parse(NULL, &p, &e), -EINVAL);
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	CU_pSuite s = CU_add_suite("kernels_budget", NULL, NULL);
	CU_add_test(s, "uniform: byte-identical to before the modes (and V1 params)",
		    test_uniform_unchanged);
	CU_add_test(s, "mass-heads: worked cases on example A", test_mass_heads_worked);
	CU_add_test(s, "mass: worked cases on example A, the ladder", test_mass_worked);
	CU_add_test(s, "heads: worked floor and layer-wide cases", test_heads_worked);
	CU_add_test(s, "layers: pyramid by hand, list", test_layers_worked);
	CU_add_test(s, "fallback: worked cases", test_fallback_worked);
	CU_add_test(s, "summed ledger", test_ledger_sum);
	CU_add_test(s, "budget modes as text", test_budget_parse);
	CU_add_test(s, "invalid budget parameters: -EINVAL, nothing written", test_invalid_budgets);
	CU_add_test(s, "random uniform (with fallback) vs reference", test_random_uniform);
	CU_add_test(s, "random layers vs reference", test_random_layers);
	CU_add_test(s, "random heads vs reference", test_random_heads);
	CU_add_test(s, "random mass vs reference", test_random_mass);
	CU_add_test(s, "random mass-heads vs reference", test_random_mass_heads);
	CU_add_test(s, "thread-count invariance, every mode", test_threads_invariant);
	CU_add_test(s, "mass: C* = C_max from the first or the last layer", test_mass_cmax_order);
	CU_add_test(s, "mass, mass-heads: zero ranking width (forced fill C_max or L)",
		    test_mass_zero_width);
	CU_add_test(s, "decision groups: two steps, group C* and fallback", test_group_two_step);
	CU_add_test(s, "decision groups: refusals", test_group_refusals);
	CU_add_test(s, "cancel: -ECANCELED in every mode, no change when not", test_cancel);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned f = CU_get_number_of_failures();
	CU_cleanup_registry();
	return f ? 1 : 0;
}
