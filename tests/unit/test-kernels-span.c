// SPDX-License-Identifier: MIT
/*
 * test-kernels-span.c - span-aware selection (skv_params.span, the rule in
 * kernels/skv.h): worked cases written out by hand, random cases against a
 * walk of the reference's ranking written here from the rule, span 0 equal
 * to top-k, and every invalid span rejected before any work.
 */
#include "test-kernels-util.h"
#include "tests/test-skip.h"

/* ------------------------------------------------------------ helpers */

/*
 * One head, D 1, one query row value 1 repeated over the window: a prefix
 * position's vote grows with its key, so the keys set the ranking. keys[j]
 * for the prefix; the window's keys are 0. Returns the kept positions.
 */
static int run_keys(uint32_t L, uint32_t W, uint32_t C, uint32_t span, const float *keys,
		    const struct skv_range *prot, uint32_t n_prot, int32_t *out, uint32_t *ret_kept)
{
	struct prob pb;
	struct skv_error e;
	struct skv_plan pl;

	prob_init(&pb, L, 1, 1, 1, 1);
	pb.sh.n_q = W;
	pb.p.window = W;
	pb.p.capacity = C;
	pb.p.kernel = 1;
	pb.p.span = span;
	pb.p.n_protected = n_prot;
	for (uint32_t i = 0; i < n_prot; i++)
		pb.p.protected_ranges[i] = prot[i];
	pb.q[0] = track(&pb, calloc(W + 1, sizeof(float)));
	pb.k[0] = track(&pb, calloc(L, sizeof(float)));
	pb.v[0] = track(&pb, calloc(L, sizeof(float)));
	for (uint32_t i = 0; i < W; i++)
		pb.q[0][i] = 1.0f;
	for (uint32_t j = 0; j < L - W; j++)
		pb.k[0][j] = keys[j];
	prob_build(&pb);
	int r = skv_plan(&pb.sh, &pb.p, &pl, &e);
	if (r == 0)
		r = prob_run(&pb, 1, &e);
	if (r == 0) {
		*ret_kept = pl.kept;
		memcpy(out, pb.out[0].positions, pl.kept * sizeof(int32_t));
	}
	prob_free(&pb);
	return r;
}

/* keys for the prefix [0, P): a low floor, and the given positions high,
 * the first the highest */
static void keys_ranked(float *keys, uint32_t P, const uint32_t *top, uint32_t n)
{
	for (uint32_t j = 0; j < P; j++)
		keys[j] = -4.0f + 0.001f * (float)j; /* the later the higher, below every top */
	for (uint32_t i = 0; i < n; i++)
		keys[top[i]] = 4.0f - 0.5f * (float)i;
}

static void expect(const int32_t *got, uint32_t kept, const int32_t *want, uint32_t n)
{
	CU_ASSERT_EQUAL(kept, n);
	if (kept != n)
		return;
	for (uint32_t i = 0; i < n; i++)
		if (got[i] != want[i]) {
			fprintf(stderr, "\n  slot %u: got %d, want %d\n", i, got[i], want[i]);
			CU_FAIL("kept positions differ");
			return;
		}
}

/* ------------------------------------------------------- worked cases */

/* L 40, W 8 (window 32..39), k = C - 8 picks from the prefix [0, 32) */
#define WIN 32, 33, 34, 35, 36, 37, 38, 39

static void test_worked(void)
{
	float keys[32];
	int32_t got[40];
	uint32_t kept = 0;

	/* one centre fills k = 7 with +-3: 7..13 */
	{
		const uint32_t top[] = {10};
		const int32_t want[] = {7, 8, 9, 10, 11, 12, 13, WIN};
		keys_ranked(keys, 32, top, 1);
		CU_ASSERT_EQUAL_FATAL(run_keys(40, 8, 15, 3, keys, NULL, 0, got, &kept), 0);
		expect(got, kept, want, 15);
	}
	/* the edge cuts the span (1: 1, 0, 2, 3, 4), the next centre is cut
	 * short nearest first, left before right (20, 19) */
	{
		const uint32_t top[] = {1, 20};
		const int32_t want[] = {0, 1, 2, 3, 4, 19, 20, WIN};
		keys_ranked(keys, 32, top, 2);
		CU_ASSERT_EQUAL_FATAL(run_keys(40, 8, 15, 3, keys, NULL, 0, got, &kept), 0);
		expect(got, kept, want, 15);
	}
	/* the window is forced, not a place for a span: 31, 30, 29, 28 */
	{
		const uint32_t top[] = {31, 5};
		const int32_t want[] = {4, 5, 6, 28, 29, 30, 31, WIN};
		keys_ranked(keys, 32, top, 2);
		CU_ASSERT_EQUAL_FATAL(run_keys(40, 8, 15, 3, keys, NULL, 0, got, &kept), 0);
		expect(got, kept, want, 15);
	}
	/* a centre already kept still opens its span: 10 keeps 7..13, 12
	 * adds 14 and 15, then 25 gets the last pick */
	{
		const uint32_t top[] = {10, 12, 25};
		const int32_t want[] = {7, 8, 9, 10, 11, 12, 13, 14, 15, 25, WIN};
		keys_ranked(keys, 32, top, 3);
		CU_ASSERT_EQUAL_FATAL(run_keys(40, 8, 18, 3, keys, NULL, 0, got, &kept), 0);
		expect(got, kept, want, 18);
	}
	/* a protected range inside a span is skipped (already kept) and counts
	 * against the budget: C 16 = 8 window + 2 protected + 6 picks, five
	 * of them 10's span (7..13 less 11, 12), then the floor's best (31) */
	{
		const uint32_t top[] = {10};
		const struct skv_range pr = {11, 13};
		const int32_t want[] = {7, 8, 9, 10, 11, 12, 13, 31, WIN};
		keys_ranked(keys, 32, top, 1);
		CU_ASSERT_EQUAL_FATAL(run_keys(40, 8, 16, 3, keys, &pr, 1, got, &kept), 0);
		expect(got, kept, want, 16);
	}
	/* span 1 and the ranking's second centre: 10 (9, 11), 20 (19, 21), 30 */
	{
		const uint32_t top[] = {10, 20, 30};
		const int32_t want[] = {9, 10, 11, 19, 20, 21, 30, WIN};
		keys_ranked(keys, 32, top, 3);
		CU_ASSERT_EQUAL_FATAL(run_keys(40, 8, 15, 1, keys, NULL, 0, got, &kept), 0);
		expect(got, kept, want, 15);
	}
	/* span 0 is top-k: 10, 20, 30 and the four latest of the floor */
	{
		const uint32_t top[] = {10, 20, 30};
		const int32_t want[] = {10, 20, 26, 27, 28, 29, 30, 31, WIN};
		keys_ranked(keys, 32, top, 3);
		/* 31 is the floor's highest: 31, 29, 28, 27, 26 after the tops */
		CU_ASSERT_EQUAL_FATAL(run_keys(40, 8, 16, 0, keys, NULL, 0, got, &kept), 0);
		expect(got, kept, want, 16);
	}
	/* a budget that holds every candidate keeps them all, as top-k does */
	{
		const uint32_t top[] = {10};
		keys_ranked(keys, 32, top, 1);
		CU_ASSERT_EQUAL_FATAL(run_keys(40, 8, 40, 3, keys, NULL, 0, got, &kept), 0);
		CU_ASSERT_EQUAL(kept, 40);
		for (uint32_t i = 0; i < kept && i < 40; i++)
			CU_ASSERT_EQUAL(got[i], (int32_t)i);
	}
}

/* ------------------------------------------- random vs the rule's walk */

struct rk {
	double s;
	uint32_t j;
};

static int rk_cmp(const void *a, const void *b)
{
	const struct rk *x = a, *y = b;
	if (x->s != y->s)
		return x->s > y->s ? -1 : 1;
	return x->j < y->j ? -1 : (x->j > y->j);
}

/*
 * The rule of skv.h over the reference's pooled scores of one stored head:
 * returns 0 and the kept flags, or 1 when two of the centres the walk used
 * (or the next one) are within tol of each other (a near-tie: the float
 * kernels may rank them the other way, and the case proves nothing).
 */
static int walk(const double *sc, char *keep, uint32_t L, uint32_t P, uint32_t need, uint32_t s,
		double tol)
{
	struct rk *r = calloc(P, sizeof(*r));
	uint32_t n = 0, used = 0;

	CU_ASSERT_FATAL(r != NULL);
	for (uint32_t j = 0; j < P; j++)
		if (!keep[j])
			r[n++] = (struct rk){sc[j], j};
	qsort(r, n, sizeof(*r), rk_cmp);
	for (uint32_t i = 0; i < n && need; i++, used++) {
		int64_t c = r[i].j;
		for (int64_t d = 0; d <= (int64_t)s && need; d++) {
			if (c - d >= 0 && !keep[c - d]) {
				keep[c - d] = 1;
				need--;
			}
			if (d && need && c + d < (int64_t)P && !keep[c + d]) {
				keep[c + d] = 1;
				need--;
			}
		}
	}
	(void)L;
	int tie = 0;
	for (uint32_t i = 0; i + 1 < n && i < used; i++)
		if (fabs(r[i].s - r[i + 1].s) <= tol * fabs(r[i].s))
			tie = 1;
	free(r);
	return tie;
}

static void run_random(int cases, bool protect)
{
	int bad = 0, ties = 0;

	for (int c = 0; c < cases; c++) {
		struct prob pb;
		uint32_t L = 24 + (uint32_t)(rng_next() % 200),
			 D = 4 + 4 * (uint32_t)(rng_next() % 4);
		uint32_t hkv = 1 + (uint32_t)(rng_next() % 2), G = 1 + (uint32_t)(rng_next() % 3);
		prob_init(&pb, L, D, hkv * G, hkv, 1 + (uint32_t)(rng_next() % 2));
		pb.p.window = 8 + (uint32_t)(rng_next() % 8);
		pb.sh.n_q = pb.p.window;
		pb.p.capacity = pb.p.window + 1 + (uint32_t)(rng_next() % (L - pb.p.window));
		static const uint32_t kernels[4] = {1, 3, 5, 7};
		pb.p.kernel = kernels[rng_next() % 4];
		pb.p.pooling = rng_next() % 2 ? SKV_POOL_AVG : SKV_POOL_MAX;
		pb.p.gqa = rng_next() % 2 ? SKV_GQA_EXPAND : SKV_GQA_GROUP;
		pb.p.span = 1 + (uint32_t)(rng_next() % 5);
		if (rng_next() % 8 == 0)
			pb.p.policy = SKV_POLICY_H2O, pb.sh.n_q = L;
		if (protect && L > 30) {
			uint32_t b = (uint32_t)(rng_next() % (L - 20)),
				 len = 1 + (uint32_t)(rng_next() % 4);
			pb.p.protected_ranges[pb.p.n_protected++] = (struct skv_range){b, b + len};
			struct skv_plan pl;
			if (skv_plan(&pb.sh, &pb.p, &pl, NULL) < 0)
				pb.p.n_protected = 0;
		}
		prob_random(&pb, 1.2);
		prob_build(&pb);
		struct skv_error e;
		int r = prob_run(&pb, 1 + c % 3, &e);
		if (r != 0) {
			fprintf(stderr, "\n  case %d: rc %d %s\n", c, r, e.msg);
			CU_FAIL("compact failed");
			prob_free(&pb);
			continue;
		}
		const struct skv_shape *s = &pb.sh;
		uint32_t P = L - pb.p.window;
		for (uint32_t l = 0; l < pb.n_layers; l++) {
			struct ref_result rr;
			CU_ASSERT_FATAL(ref_compact(s, &pb.p, pb.q[l], pb.k[l], &rr) == 0);
			for (uint32_t h = 0; h < rr.h_store; h++) {
				char *keep = calloc(L, 1);
				CU_ASSERT_FATAL(keep != NULL);
				uint32_t forced = 0;
				for (uint32_t j = P; j < L; j++)
					keep[j] = 1;
				for (uint32_t i = 0; i < pb.p.n_protected; i++)
					for (uint32_t j = pb.p.protected_ranges[i].begin;
					     j < pb.p.protected_ranges[i].end; j++)
						keep[j] = 1;
				for (uint32_t j = 0; j < L; j++)
					forced += (uint32_t)keep[j];
				uint32_t C = L < pb.p.capacity ? L : pb.p.capacity;
				int tie = L < pb.p.capacity
					      ? (memset(keep, 1, L), 0)
					      : walk(rr.score + (size_t)h * L, keep, L, P,
						     C - forced, pb.p.span, 1e-5);
				const int32_t *got =
				    pb.out[l].positions + (size_t)h * pb.out[l].pos_stride;
				uint32_t n = 0, mismatch = 0;
				for (uint32_t j = 0; j < L; j++)
					if (keep[j]) {
						mismatch |= n >= rr.kept || got[n] != (int32_t)j;
						n++;
					}
				mismatch |= n != rr.kept;
				if (mismatch && tie) {
					ties++;
				} else if (mismatch) {
					fprintf(
					    stderr,
					    "\n  case %d layer %u head %u: L %u D %u hq %u hkv %u "
					    "W %u C %u k %u pool %d gqa %d span %u np %u\n",
					    c, l, h, L, D, s->h_q, s->h_kv, pb.p.window,
					    pb.p.capacity, pb.p.kernel, pb.p.pooling, pb.p.gqa,
					    pb.p.span, pb.p.n_protected);
					bad++;
				}
				free(keep);
			}
			ref_result_free(&rr);
		}
		prob_free(&pb);
	}
	CU_ASSERT_EQUAL(bad, 0);
	/* near-ties must stay rare, or the comparison proves nothing */
	CU_ASSERT(ties <= cases / 10);
}

static void test_random(void)
{
	run_random(300, false);
}

static void test_random_protected(void)
{
	run_random(100, true);
}

/* ------------------------------------------------------------ refusals */

static void test_invalid(void)
{
	struct skv_shape sh = {.prompt_len = 64, .head_dim = 8, .h_q = 2, .h_kv = 1, .n_q = 8};
	struct skv_params p;
	struct skv_plan pl;
	struct skv_error e;

	skv_params_init(&p);
	p.window = 8;
	p.capacity = 20;
	p.span = SKV_MAX_SPAN;
	CU_ASSERT_EQUAL(skv_plan(&sh, &p, &pl, &e), 0);
	p.span = SKV_MAX_SPAN + 1;
	CU_ASSERT_EQUAL(skv_plan(&sh, &p, &pl, &e), -EINVAL);
	CU_ASSERT(strstr(e.msg, "span") != NULL);
	/* heads and the mass modes pick otherwise: refused, naming the mode */
	static const char *modes[3] = {"heads", "mass:0.9", "mass-heads:0.9"};
	for (int i = 0; i < 3; i++) {
		skv_params_init(&p);
		p.window = 8;
		p.capacity = 20;
		CU_ASSERT_EQUAL_FATAL(skv_budget_parse(modes[i], &p, &e), 0);
		skv_budget_defaults(&p);
		p.span = 3;
		CU_ASSERT_EQUAL(skv_plan(&sh, &p, &pl, &e), -EINVAL);
		CU_ASSERT(strstr(e.msg, "span") != NULL);
		p.span = 0;
		CU_ASSERT_EQUAL(skv_plan(&sh, &p, &pl, &e), 0);
	}
	/* layers takes it */
	skv_params_init(&p);
	p.window = 8;
	p.capacity = 20;
	CU_ASSERT_EQUAL_FATAL(skv_budget_parse("pyramid:2", &p, &e), 0);
	p.span = 3;
	CU_ASSERT_EQUAL(skv_plan(&sh, &p, &pl, &e), 0);
}

/* A caller built before span (params_size SKV_PARAMS_SIZE_V3) gets top-k,
 * whatever lies where span is now. */
static void test_old_params(void)
{
	float keys[32];
	int32_t got[40];
	uint32_t kept = 0;
	const uint32_t top[] = {10, 20, 30};
	struct prob pb;
	struct skv_error e;

	keys_ranked(keys, 32, top, 3);
	prob_init(&pb, 40, 1, 1, 1, 1);
	pb.sh.n_q = 8;
	pb.p.window = 8;
	pb.p.capacity = 16;
	pb.p.kernel = 1;
	pb.p.span = 3;
	pb.p.params_size = SKV_PARAMS_SIZE_V3;
	pb.q[0] = track(&pb, calloc(9, sizeof(float)));
	pb.k[0] = track(&pb, calloc(40, sizeof(float)));
	pb.v[0] = track(&pb, calloc(40, sizeof(float)));
	for (uint32_t i = 0; i < 8; i++)
		pb.q[0][i] = 1.0f;
	memcpy(pb.k[0], keys, sizeof(keys));
	prob_build(&pb);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 1, &e), 0);
	kept = 16;
	memcpy(got, pb.out[0].positions, kept * sizeof(int32_t));
	const int32_t want[] = {10, 20, 26, 27, 28, 29, 30, 31, WIN};
	expect(got, kept, want, 16);
	prob_free(&pb);
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	CU_pSuite s = CU_add_suite("kernels_span", NULL, NULL);
	CU_add_test(s, "worked cases by hand", test_worked);
	CU_add_test(s, "random vs the rule's walk of the reference ranking", test_random);
	CU_add_test(s, "random with protected ranges", test_random_protected);
	CU_add_test(s, "invalid spans and modes: -EINVAL naming span", test_invalid);
	CU_add_test(s, "params from before span: top-k", test_old_params);
	return t_run();
}
