// SPDX-License-Identifier: MIT
/*
 * bench-budget.c - what the budget modes of SPEC.md cost over uniform on
 * the host: one Llama-3-8B-shaped layer (H_q 32, H_kv 8, D 128, W 32, k 5
 * avg, expand, f32) at L tokens, compacted as uniform C 2048 and as mass,
 * mass-heads and heads (ladder C_min 64 .. C_max 2048 by 64), the modes
 * interleaved run by run, their order rotated each round, so that drift and
 * cache state hit them alike. Prints the median
 * of each and its ratio to uniform.
 *
 * bench-budget [--threads N] [--reps N] [--len L] [--cpu]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "skv.h"

#define HQ  32
#define HKV 8
#define D   128
#define W   32
#define C   2048

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
	struct timespec ts;
	clock_gettime(clock_id, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

int main(int argc, char **argv)
{
	unsigned threads = 1, reps = 5;
	uint32_t L = 32768;
	static const char *names[] = {"uniform C 2048", "mass tau 0.9", "mass-heads tau 0.9",
				      "heads a 0.2"};
	enum { NM = 4 };

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--len") && i + 1 < argc)
			L = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--cpu"))
			clock_id = CLOCK_PROCESS_CPUTIME_ID;
		else {
			fprintf(stderr, "usage: bench-budget [--threads N] [--reps N] [--len L] "
					"[--cpu]\n");
			return 2;
		}
	}
	if (L <= C || reps == 0 || reps > 1000) {
		fprintf(stderr, "bench-budget: need L > %d and 1 <= reps <= 1000\n", C);
		return 2;
	}
	size_t kvn = (size_t)HKV * L * D, qn = (size_t)HQ * W * D;
	float *k = malloc(kvn * 4), *v = malloc(kvn * 4), *q = malloc(qn * 4);
	/* room for the most a head may keep in any mode (heads: more than C) */
	struct skv_shape sh = {.prompt_len = L, .head_dim = D, .h_q = HQ, .h_kv = HKV, .n_q = W};
	struct skv_params p[NM];
	uint32_t room = 0;
	for (int m = 0; m < NM; m++) {
		skv_params_init(&p[m]);
		p[m].window = W;
		p[m].capacity = C;
		p[m].budget_mode = m == 0   ? SKV_BUDGET_UNIFORM
			      : m == 1 ? SKV_BUDGET_MASS
			      : m == 2 ? SKV_BUDGET_MASS_HEADS
				       : SKV_BUDGET_HEADS;
		p[m].tau = 0.9f;
		p[m].c_min = 64;
		p[m].c_max = C;
		p[m].c_step = 64;
		uint32_t rows;
		struct skv_error e;
		if (skv_budget_rows(&sh, &p[m], 1, &rows, &e) < 0) {
			fprintf(stderr, "bench-budget: %s\n", e.msg);
			return 1;
		}
		room = rows > room ? rows : room;
	}
	size_t on = (size_t)HQ * room * D;
	float *ok = malloc(on * 4), *ov = malloc(on * 4), *mass = malloc(HQ * 4);
	int32_t *pos = malloc((size_t)HQ * room * 4);
	uint32_t kept[HQ];
	if (!k || !v || !q || !ok || !ov || !pos || !mass)
		return 1;
	for (size_t i = 0; i < kvn; i++) {
		k[i] = frand();
		v[i] = frand();
	}
	for (size_t i = 0; i < qn; i++)
		q[i] = 2.0f * frand();
	struct skv_layer_in in = {
	    .q = {.data = q,
		  .dtype = SKV_DTYPE_F32,
		  .head_stride = (int64_t)W * D,
		  .token_stride = D},
	    .k = {.data = k,
		  .dtype = SKV_DTYPE_F32,
		  .head_stride = (int64_t)L * D,
		  .token_stride = D},
	    .v = {.data = v,
		  .dtype = SKV_DTYPE_F32,
		  .head_stride = (int64_t)L * D,
		  .token_stride = D},
	};
	struct skv_layer_out out = {
	    .k = {.data = ok,
		  .dtype = SKV_DTYPE_F32,
		  .head_stride = (int64_t)room * D,
		  .token_stride = D},
	    .v = {.data = ov,
		  .dtype = SKV_DTYPE_F32,
		  .head_stride = (int64_t)room * D,
		  .token_stride = D},
	    .positions = pos,
	    .pos_stride = room,
	    .retained_mass = mass,
	};
	struct skv_ctx *ctx;
	if (skv_ctx_new(threads, &ctx) < 0)
		return 1;
	double *t = calloc((size_t)NM * reps, sizeof(double));
	double kept_mean[NM] = {0};
	for (unsigned r = 0; r <= reps; r++)
		for (int mi = 0; mi < NM; mi++) {
			int m = (int)((mi + r) % NM); /* each mode in every place of the round */
			struct skv_budget_result res = {.result_size = sizeof(res), .kept = kept};
			struct skv_error e;
			double t0 = now();
			if (skv_compact_budget(ctx, &sh, &p[m], 1, &in, &out, &res, &e) < 0) {
				fprintf(stderr, "bench-budget: %s: %s\n", names[m], e.msg);
				return 1;
			}
			double dt = now() - t0;
			if (r == 0) { /* warm-up */
				double s = 0;
				for (int h = 0; h < HQ; h++)
					s += kept[h];
				kept_mean[m] = s / HQ;
				continue;
			}
			t[(size_t)m * reps + r - 1] = dt;
		}
	printf("one layer, L %u, H_q %d, H_kv %d, D %d, W %d, f32, %u thread(s), %s, %s; median "
	       "of %u\n\n| mode | ms | vs uniform | mean kept per head |\n|---|---|---|---|\n",
	       L, HQ, HKV, D, W, skv_ctx_threads(ctx), skv_ctx_isa(ctx),
	       clock_id == CLOCK_MONOTONIC ? "wall time" : "CPU time", reps);
	double base = 0;
	for (int m = 0; m < NM; m++) {
		qsort(t + (size_t)m * reps, reps, sizeof(double), cmp_d);
		double med = t[(size_t)m * reps + reps / 2];
		if (m == 0)
			base = med;
		printf("| %s | %.1f | %+.1f%% | %.0f |\n", names[m], med * 1e3,
		       100.0 * (med / base - 1.0), kept_mean[m]);
	}
	skv_ctx_free(ctx);
	free(t);
	free(k);
	free(v);
	free(q);
	free(ok);
	free(ov);
	free(pos);
	free(mass);
	return 0;
}
