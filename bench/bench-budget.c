// SPDX-License-Identifier: MIT
/*
 * bench-budget.c - what the budget modes of SPEC.md cost over uniform on
 * the host at L = 32768: N Llama-3-8B-shaped layers (H_q 32, H_kv 8, D 128,
 * W 32, k 5 avg, expand) compacted as uniform C (the baseline), layers
 * pyramid 1.5, mass and mass-heads at tau 0.9 and 0.95 (the default ladder:
 * C_min W + 1, C_max C, step (C - W) / 16) and heads a 0.2; bf16 and f32,
 * C 2048 and 1024, with the context's default thread count (the daemon's)
 * and with one thread. The modes run interleaved, their order rotated each
 * round, so that drift and other load hit them alike. Per mode: the median
 * wall time, the fastest round's and the median process CPU time, and beside
 * the medians the median over rounds of the ratio to the same round's
 * uniform run, beside the fastest the ratio of fastest rounds.
 *
 * Inputs are random (flat attention): no head reaches tau before C_max, so
 * the mass modes keep C in every head, like uniform; what they cost over it
 * is their ranking and ladder alone, their worst case.
 *
 * Layers share one K/V buffer, each at its own offset (different data, the
 * memory of one layer plus a little).
 *
 * bench-budget [--threads N] [--layers N] [--reps N] [--len L] [--cap C]
 *              [--f32 | --bf16] [--modes B1,B2,..]
 *   defaults: both thread counts (0 = the default, and 1), 4 layers, 5
 *   rounds, L 32768, C 2048 and 1024, bf16 and f32; --modes: the budget
 *   modes timed beside uniform, as snapkvctl spells them (mass:0.9,..).
 *   BENCH_QUICK=1: 1 layer, 3 rounds, bf16, C 2048.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench-host.h"
#include "skv.h"

#define HQ	    32
#define HKV	    8
#define D	    128
#define W	    32
#define MAXL	    64
#define LAYER_SHIFT 61 /* tokens between two layers' views of the K/V buffer */

#define MAXM 16

/* The modes timed, uniform first (the baseline); --modes replaces the rest. */
static const char *specs[MAXM] = {"uniform",	    "pyramid:1.5",     "mass:0.9", "mass:0.95",
				  "mass-heads:0.9", "mass-heads:0.95", "heads:0.2"};
static int NM = 7;

static double clock_s(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median of v[0..n), v left as it was (n <= 1000). */
static double median(const double *v, unsigned n)
{
	double c[1000];
	memcpy(c, v, n * sizeof(double));
	qsort(c, n, sizeof(double), cmp_d);
	return n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n);
	if (!p) {
		fprintf(stderr, "bench-budget: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	return p;
}

static void fill(void *buf, enum skv_dtype dt, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++) {
		float x = scale * frand();
		if (dt == SKV_DTYPE_F32)
			((float *)buf)[i] = x;
		else
			((uint16_t *)buf)[i] = skv_f32_to_bf16(x);
	}
}

struct setup {
	uint32_t L, C, n_layers, reps;
	enum skv_dtype dt;
};

/* The modes' parameters at C; the most rows any layer's head needs. */
static int make_params(const struct setup *s, struct skv_params *p, uint32_t *room)
{
	struct skv_shape sh = {.prompt_len = s->L, .head_dim = D, .h_q = HQ, .h_kv = HKV, .n_q = W};
	uint32_t rows[MAXL];
	struct skv_error e;

	*room = 0;
	for (int m = 0; m < NM; m++) {
		skv_params_init(&p[m]);
		p[m].window = W;
		p[m].budget = s->C;
		int r = skv_budget_parse(specs[m], &p[m], &e);
		if (!r) {
			skv_budget_defaults(&p[m]);
			r = skv_budget_rows(&sh, &p[m], s->n_layers, rows, &e);
		}
		if (r < 0) {
			fprintf(stderr, "bench-budget: %s: %s\n", specs[m], e.msg);
			return -1;
		}
		for (uint32_t l = 0; l < s->n_layers; l++)
			*room = rows[l] > *room ? rows[l] : *room;
	}
	return 0;
}

static void view(struct skv_tensor *t, void *data, enum skv_dtype dt, uint32_t rows)
{
	*t = (struct skv_tensor){
	    .data = data, .dtype = dt, .head_stride = (int64_t)rows * D, .token_stride = D};
}

/* One table: every mode at one setup and thread count. */
static int run_table(const struct setup *s, unsigned threads)
{
	const size_t es = skv_dtype_size(s->dt);
	const uint32_t L = s->L, N = s->n_layers;
	struct skv_params p[MAXM];
	uint32_t room;

	if (make_params(s, p, &room) < 0)
		return -1;
	struct skv_shape sh = {.prompt_len = L, .head_dim = D, .h_q = HQ, .h_kv = HKV, .n_q = W};
	size_t kvn = ((size_t)HKV * L + (size_t)N * LAYER_SHIFT) * D, qn = (size_t)HQ * W * D;
	size_t on = (size_t)HQ * room * D;
	char *k = xmalloc(kvn * es), *v = xmalloc(kvn * es), *q = xmalloc(N * qn * es);
	fill(k, s->dt, kvn, 1.0f);
	fill(v, s->dt, kvn, 1.0f);
	fill(q, s->dt, N * qn, 2.0f);
	struct skv_layer_in in[MAXL];
	struct skv_layer_out out[MAXL];
	char *ok[MAXL], *ov[MAXL];
	int32_t *pos[MAXL];
	float *mass = xmalloc((size_t)N * HQ * 4);
	uint32_t *kept = xmalloc((size_t)N * HQ * 4);
	for (uint32_t l = 0; l < N; l++) {
		size_t sh_el = (size_t)l * LAYER_SHIFT * D * es;
		view(&in[l].q, q + l * qn * es, s->dt, W);
		view(&in[l].k, k + sh_el, s->dt, L);
		view(&in[l].v, v + sh_el, s->dt, L);
		ok[l] = xmalloc(on * es);
		ov[l] = xmalloc(on * es);
		pos[l] = xmalloc((size_t)HQ * room * 4);
		memset(ok[l], 0, on * es); /* fault the pages in before timing */
		memset(ov[l], 0, on * es);
		out[l] = (struct skv_layer_out){.positions = pos[l],
						.pos_stride = room,
						.retained_mass = mass + (size_t)l * HQ};
		view(&out[l].k, ok[l], s->dt, room);
		view(&out[l].v, ov[l], s->dt, room);
	}
	struct skv_ctx *ctx;
	if (skv_ctx_new(threads, &ctx) < 0)
		return -1;
	double *tw = calloc((size_t)NM * s->reps, sizeof(double));
	double *tc = calloc((size_t)NM * s->reps, sizeof(double));
	double kept_mean[MAXM] = {0};
	for (unsigned r = 0; r <= s->reps; r++)
		for (int mi = 0; mi < NM; mi++) {
			int m = (int)((mi + r) % NM); /* each mode in every place of the round */
			struct skv_budget_result res = {.result_size = sizeof(res), .kept = kept};
			struct skv_error e;
			double w0 = clock_s(CLOCK_MONOTONIC),
			       c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
			if (skv_compact_budget(ctx, &sh, &p[m], N, in, out, &res, &e) < 0) {
				fprintf(stderr, "bench-budget: %s: %s\n", specs[m], e.msg);
				return -1;
			}
			double dw = clock_s(CLOCK_MONOTONIC) - w0;
			double dc = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
			if (r == 0) { /* warm-up: scratch, page faults */
				double sum = 0;
				for (uint32_t i = 0; i < N * HQ; i++)
					sum += kept[i];
				kept_mean[m] = sum / (N * HQ);
				continue;
			}
			tw[(size_t)m * s->reps + r - 1] = dw;
			tc[(size_t)m * s->reps + r - 1] = dc;
		}
	char cpu[128], load[64];
	bench_cpu_model(cpu, sizeof(cpu));
	bench_loadavg(load, sizeof(load));
	printf("\n%u layer(s), L %u, H_q %d, H_kv %d, D %d, W %d, C %u, %s, %u thread(s), %s, "
	       "%s, load %s; median of %u rounds\n\n"
	       "| mode | ms | vs uniform | min ms | vs uniform | CPU ms | vs uniform | mean kept "
	       "per head |\n|---|---|---|---|---|---|---|---|\n",
	       N, L, HQ, HKV, D, W, s->C, skv_dtype_name(s->dt), skv_ctx_threads(ctx),
	       skv_ctx_isa(ctx), cpu, load, s->reps);
	/* vs uniform: the median over rounds of each round's ratio to the
	 * uniform run of the same round (drift cancels within a round); beside
	 * it the fastest round of each (other load only adds time) */
	double *rw = calloc(s->reps, sizeof(double)), *rc = calloc(s->reps, sizeof(double));
	for (int m = 0; m < NM; m++) {
		for (unsigned r = 0; r < s->reps; r++) {
			rw[r] = tw[(size_t)m * s->reps + r] / tw[r];
			rc[r] = tc[(size_t)m * s->reps + r] / tc[r];
		}
		double qw = median(rw, s->reps), qc = median(rc, s->reps);
		double mw = median(tw + (size_t)m * s->reps, s->reps);
		double mc = median(tc + (size_t)m * s->reps, s->reps);
		double lo = tw[(size_t)m * s->reps], lo0 = tw[0];
		for (unsigned r = 1; r < s->reps; r++) {
			lo = tw[(size_t)m * s->reps + r] < lo ? tw[(size_t)m * s->reps + r] : lo;
			lo0 = tw[r] < lo0 ? tw[r] : lo0;
		}
		printf("| %s | %.1f | %+.1f%% | %.1f | %+.1f%% | %.1f | %+.1f%% | %.0f |\n",
		       specs[m], mw * 1e3, 100.0 * (qw - 1.0), lo * 1e3, 100.0 * (lo / lo0 - 1.0),
		       mc * 1e3, 100.0 * (qc - 1.0), kept_mean[m]);
	}
	free(rw);
	free(rc);
	fflush(stdout);
	skv_ctx_free(ctx);
	free(tw);
	free(tc);
	for (uint32_t l = 0; l < N; l++) {
		free(ok[l]);
		free(ov[l]);
		free(pos[l]);
	}
	free(k);
	free(v);
	free(q);
	free(mass);
	free(kept);
	return 0;
}

int main(int argc, char **argv)
{
	const int quick = getenv("BENCH_QUICK") && *getenv("BENCH_QUICK") == '1';
	int threads = -1, dtype = -1;
	uint32_t cap = 0;
	struct setup s = {.L = 32768, .n_layers = quick ? 1 : 4, .reps = quick ? 3 : 5};

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
			s.n_layers = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			s.reps = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--len") && i + 1 < argc)
			s.L = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--cap") && i + 1 < argc)
			cap = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--modes") && i + 1 < argc) {
			static char list[1024];
			snprintf(list, sizeof(list), "%s", argv[++i]);
			NM = 1;
			for (char *t = strtok(list, ","); t && NM < MAXM; t = strtok(NULL, ","))
				specs[NM++] = t;
		} else if (!strcmp(argv[i], "--f32"))
			dtype = SKV_DTYPE_F32;
		else if (!strcmp(argv[i], "--bf16"))
			dtype = SKV_DTYPE_BF16;
		else {
			fprintf(stderr,
				"usage: bench-budget [--threads N] [--layers N] [--reps N] "
				"[--len L] [--cap C] [--f32 | --bf16] [--modes B1,B2,..]\n");
			return 2;
		}
	}
	if (s.n_layers < 1 || s.n_layers > MAXL || s.reps < 1 || s.reps > 1000 || threads > 256 ||
	    s.L < 2 * W || s.L > (1u << 22)) {
		fprintf(stderr,
			"bench-budget: need 1 <= layers <= %d, 1 <= reps <= 1000, "
			"threads <= 256, %d <= L <= %u\n",
			MAXL, 2 * W, 1u << 22);
		return 2;
	}
	static const uint32_t caps[] = {2048, 1024};
	static const enum skv_dtype dts[] = {SKV_DTYPE_BF16, SKV_DTYPE_F32};
	printf("bench-budget: budget modes vs uniform%s\n", quick ? " (BENCH_QUICK)" : "");
	for (int di = 0; di < 2; di++)
		for (int ci = 0; ci < 2; ci++)
			for (int ti = 0; ti < 2; ti++) {
				s.dt = dts[di];
				s.C = cap ? cap : caps[ci];
				unsigned th = threads >= 0 ? (unsigned)threads : ti == 0 ? 0 : 1;
				if ((dtype >= 0 && (int)s.dt != dtype) || (cap && ci) ||
				    (threads >= 0 && ti) || (quick && (di || ci || ti)))
					continue;
				if (s.L <= s.C) {
					fprintf(stderr, "bench-budget: need L > C %u\n", s.C);
					return 2;
				}
				if (run_table(&s, th) < 0)
					return 1;
			}
	return 0;
}
