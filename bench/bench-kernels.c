// SPDX-License-Identifier: MIT
/*
 * bench-kernels.c - one Llama-3-8B-shaped layer (H_q 32, H_kv 8, D 128,
 * W 32, C 2048, k 5, avg, expand) compacted by libskv at several prompt
 * lengths, f32 and bf16, next to OpenBLAS sgemm computing only the grouped
 * score products Q_group . K^T (8 sgemms of (4*32) x 128 x L, f32), with
 * the same thread count. Prints the median of several repetitions, the
 * fraction of the measured FMA peak of the machine, and the scoring kernel
 * alone (key staging, logits, online softmax of one K/V head's 128 rows).
 *
 * bench-kernels [--threads N] [--reps N] [--lens L1,L2,...] [--layers N]
 *               [--no-sgemm] [--f32 | --bf16] [--cpu]
 */
#include <cblas.h>
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench-fma.h"
#include "bench-host.h"
#include "skv-internal.h" /* the ISA kernels, for timing them alone */
#include "skv.h"

void openblas_set_num_threads(int n);
char *openblas_get_config(void);

#define HQ  32
#define HKV 8
#define D   128
#define W   32
#define C   2048

/* --cpu: process CPU time instead of wall time (A/B tests on a loaded box) */
static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
	struct timespec ts;
	clock_gettime(clock_id, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, n, sizeof(double), cmpd);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t rs = 88172645463325252ull;
static float frand(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (float)((double)(rs >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void *xmalloc(size_t n)
{
	void *p = NULL;
	if (posix_memalign(&p, 64, n ? n : 1)) {
		fprintf(stderr, "bench-kernels: out of memory (%zu bytes)\n", n);
		exit(1);
	}
	return p;
}

static void fill(void *buf, enum skv_dtype dt, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float x = frand() * 1.7f;
		if (dt == SKV_DTYPE_F32)
			((float *)buf)[i] = x;
		else
			((uint16_t *)buf)[i] = skv_f32_to_bf16(x);
	}
}

/* inputs and outputs of n layers in one dtype, HND, output dtype = input */
struct layer_set {
	struct skv_layer_in in[64];
	struct skv_layer_out out[64];
};

static void set_alloc(struct layer_set *s, enum skv_dtype dt, uint32_t L, int n_layers)
{
	size_t es = skv_dtype_size(dt);

	for (int l = 0; l < n_layers; l++) {
		void *q = xmalloc((size_t)HQ * W * D * es);
		void *k = xmalloc((size_t)HKV * L * D * es);
		void *v = xmalloc((size_t)HKV * L * D * es);
		fill(q, dt, (size_t)HQ * W * D);
		fill(k, dt, (size_t)HKV * L * D);
		fill(v, dt, (size_t)HKV * L * D);
		s->in[l] = (struct skv_layer_in){
		    .q = {.data = q, .dtype = dt, .head_stride = W * D, .token_stride = D},
		    .k = {.data = k, .dtype = dt, .head_stride = (int64_t)L * D, .token_stride = D},
		    .v = {.data = v, .dtype = dt, .head_stride = (int64_t)L * D, .token_stride = D},
		};
		s->out[l] = (struct skv_layer_out){
		    .k = {.data = xmalloc((size_t)HQ * C * D * es),
			  .dtype = dt,
			  .head_stride = C * D,
			  .token_stride = D},
		    .v = {.data = xmalloc((size_t)HQ * C * D * es),
			  .dtype = dt,
			  .head_stride = C * D,
			  .token_stride = D},
		    .positions = xmalloc((size_t)HQ * C * 4),
		    .pos_stride = C,
		    .retained_mass = xmalloc(HQ * 4),
		};
	}
}

static void set_free(struct layer_set *s, int n_layers)
{
	for (int l = 0; l < n_layers; l++) {
		free(s->in[l].q.data);
		free(s->in[l].k.data);
		free(s->in[l].v.data);
		free(s->out[l].k.data);
		free(s->out[l].v.data);
		free(s->out[l].positions);
		free(s->out[l].retained_mass);
	}
}

/* ------------------------------------------------- the kernel alone */

static double thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const struct skv_isa *isa_named(const char *name)
{
	static const struct skv_isa *all[] = {&skv_isa_avx512bf16, &skv_isa_avx512, &skv_isa_avx2,
					      &skv_isa_scalar};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (!strcmp(all[i]->name, name))
			return all[i];
	return &skv_isa_scalar;
}

/*
 * What skv_score_item does per tile for one K/V head of the layer (its
 * G W = 128 rows, keys 0 .. L-1 from DRAM): stage the tile (f32 copy, or
 * the raw bf16 keys for tile_bf16), logits, online softmax step. One
 * thread, its CPU time, best of reps; returns GFLOP/s of the logits.
 */
static double kernel_alone(const struct skv_isa *isa, int bf, uint32_t L, int reps)
{
	const uint32_t rbp = 4 * W, T = SKV_TILE, nt = (L + T - 1) / T;
	float *qt = xmalloc((size_t)D * rbp * 4), *kt = xmalloc((size_t)T * D * 4);
	float *z = xmalloc((size_t)L * rbp * 4), *f = xmalloc((size_t)nt * rbp * 4);
	float *m = xmalloc(rbp * 4), *s = xmalloc(rbp * 4);
	int32_t *trow = xmalloc(rbp * 4);
	uint8_t *bad = xmalloc(rbp);
	void *k = xmalloc((size_t)L * D * (bf ? 2 : 4));
	double best = 1e30;

	fill(qt, bf ? SKV_DTYPE_BF16 : SKV_DTYPE_F32, (size_t)D * rbp); /* bf: pairs */
	fill(k, bf ? SKV_DTYPE_BF16 : SKV_DTYPE_F32, (size_t)L * D);
	for (uint32_t r = 0; r < rbp; r++)
		trow[r] = (int32_t)(L - W + r % W);
	for (int rep = 0; rep < reps; rep++) {
		for (uint32_t r = 0; r < rbp; r++) {
			m[r] = -INFINITY;
			s[r] = 0;
		}
		double t0 = thread_cpu();
		for (uint32_t j0 = 0, t = 0; j0 < L; j0 += T, t++) {
			uint32_t nk = L - j0 < T ? L - j0 : T;
			const void *pf[SKV_TILE];
			uint32_t pf_n = L - j0 - nk < T ? L - j0 - nk : T;
			for (uint32_t j = 0; j < pf_n; j++)
				pf[j] = (const char *)k + (size_t)(j0 + nk + j) * D * (bf ? 2 : 4);
			if (bf)
				isa->stage_bf16((uint16_t *)kt,
						(const uint16_t *)k + (size_t)j0 * D, nk * D);
			else
				memcpy(kt, (const float *)k + (size_t)j0 * D, (size_t)nk * D * 4);
			struct skv_tile_args a = {
			    .qt = qt,
			    .kt = kt,
			    .z = z + (size_t)j0 * rbp,
			    .m = m,
			    .s = s,
			    .tmax = f + (size_t)t * rbp,
			    .bad = bad,
			    .trow = trow,
			    .rbp = rbp,
			    .d = D,
			    .nk = nk,
			    .j0 = j0,
			    .scale = 0.08838834764831845f,
			    .trow_min = (int32_t)(L - W),
			    .pf = pf,
			    .pf_n = pf_n,
			    .pf_bytes = D * (bf ? 2 : 4),
			};
			(bf ? isa->tile_bf16 : isa->tile)(&a);
		}
		double dt = thread_cpu() - t0;
		best = dt < best ? dt : best;
	}
	free(qt);
	free(kt);
	free(z);
	free(f);
	free(m);
	free(s);
	free(trow);
	free(bad);
	free(k);
	return 2.0 * rbp * D * L / best * 1e-9;
}

int main(int argc, char **argv)
{
	unsigned threads = 0;
	int reps = 5, n_layers = 1;
	uint32_t span = 0; /* --span S: span-aware selection (kernels/skv.h) */
	uint32_t lens[8] = {4096, 16384, 32768};
	int n_lens = 3;
	int do_sgemm = 1, only_dt = -1; /* for profiling the kernels alone */

	/* before parsing: strtok edits argv */
	bench_openblas_avx512(argv);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--span") && i + 1 < argc)
			span = (uint32_t)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--cpu"))
			clock_id = CLOCK_PROCESS_CPUTIME_ID;
		else if (!strcmp(argv[i], "--no-sgemm"))
			do_sgemm = 0;
		else if (!strcmp(argv[i], "--f32"))
			only_dt = 0;
		else if (!strcmp(argv[i], "--bf16"))
			only_dt = 1;
		else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
			n_layers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--lens") && i + 1 < argc) {
			n_lens = 0;
			for (char *s = strtok(argv[++i], ","); s && n_lens < 8;
			     s = strtok(NULL, ","))
				lens[n_lens++] = (uint32_t)atoi(s);
		} else {
			fprintf(stderr,
				"usage: %s [--threads N] [--reps N] [--lens L1,L2] [--layers N] "
				"[--no-sgemm] [--f32 | --bf16] [--cpu] [--span S]\n",
				argv[0]);
			return 2;
		}
	}
	if (reps < 1 || reps > 1000 || n_layers < 1 || n_layers > 64) {
		fprintf(stderr, "bench-kernels: bad --reps or --layers\n");
		return 2;
	}

	struct skv_ctx *ctx;
	int r = skv_ctx_new(threads, &ctx);
	if (r) {
		fprintf(stderr, "bench-kernels: skv_ctx_new: %s\n", strerror(-r));
		return 1;
	}
	threads = skv_ctx_threads(ctx);
	openblas_set_num_threads((int)threads);
	double la[3] = {0, 0, 0};
	FILE *f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3)
			la[0] = -1;
		fclose(f);
	}
	printf("bench-kernels: Llama-3-8B layer (H_q %d, H_kv %d, D %d, W %d, C %d, k 5, avg, "
	       "expand)\n",
	       HQ, HKV, D, W, C);
	printf("  libskv isa %s, threads %u (sgemm: same count), %d layer(s) per call, median "
	       "of %d\n",
	       skv_ctx_isa(ctx), threads, n_layers, reps);
	printf("  OpenBLAS: %s\n", openblas_get_config());
	printf("  load average before: %.2f %.2f %.2f\n", la[0], la[1], la[2]);
	const double peak = bench_fma_peak(threads);
	printf("  measured FMA peak, %u threads, f32: %.1f GFLOP/s (%s; per CPU-second of each "
	       "pinned thread)\n",
	       threads, peak, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2");
	printf("\n  %6s %5s %12s %10s %6s %12s %10s %6s %8s\n", "L", "dtype", "ms/layer", "GFLOP/s",
	       "%peak", "sgemm ms", "sgemm GF/s", "%peak", "ratio");

	for (int li = 0; li < n_lens; li++) {
		uint32_t L = lens[li];
		double flop = 2.0 * HQ * W * (double)L * D; /* scoring products per layer */
		/* sgemm baseline, f32: 8 x (128 x 128) . (128 x L) */
		float *kk = NULL, *qq = NULL, *cc = NULL;
		if (do_sgemm) {
			kk = xmalloc((size_t)HKV * L * D * 4);
			qq = xmalloc((size_t)HQ * W * D * 4);
			cc = xmalloc((size_t)4 * W * L * 4);
			fill(kk, SKV_DTYPE_F32, (size_t)HKV * L * D);
			fill(qq, SKV_DTYPE_F32, (size_t)HQ * W * D);
		}
		struct layer_set sets[2];
		for (int di = 0; di < 2; di++)
			if (only_dt < 0 || di == only_dt)
				set_alloc(&sets[di], di ? SKV_DTYPE_BF16 : SKV_DTYPE_F32, L,
					  n_layers);
		struct skv_shape sh = {
		    .prompt_len = L, .head_dim = D, .h_q = HQ, .h_kv = HKV, .n_q = W};
		struct skv_params p;
		skv_params_init(&p);
		p.span = span;
		double ts[3][1000];
		/*
		 * Repetitions interleave sgemm, f32 and bf16 so that all three see the
		 * same load on a shared machine; rep -1 warms up. OpenBLAS workers spin
		 * (sched_yield) for ~0.1 s after a call: wait that out before timing
		 * libskv on the same cores.
		 */
		for (int rep = -1; rep < reps; rep++) {
			if (do_sgemm) {
				double t0 = now();
				for (int h = 0; h < HKV; h++)
					cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 4 * W,
						    (int)L, D, 1.0f, qq + (size_t)h * 4 * W * D, D,
						    kk + (size_t)h * L * D, D, 0.0f, cc, (int)L);
				if (rep >= 0)
					ts[2][rep] = now() - t0;
				usleep(200000);
			}
			for (int di = 0; di < 2; di++) {
				if (only_dt >= 0 && di != only_dt)
					continue;
				struct skv_error e;
				double t0 = now();
				r = skv_compact(ctx, &sh, &p, (uint32_t)n_layers, sets[di].in,
						sets[di].out, &e);
				if (r) {
					fprintf(stderr, "bench-kernels: skv_compact: %d %s\n", r,
						e.msg);
					return 1;
				}
				if (rep >= 0)
					ts[di][rep] = (now() - t0) / n_layers;
			}
		}
		double sg = do_sgemm ? median(ts[2], reps) : 0;
		for (int di = 0; di < 2; di++) {
			if (only_dt >= 0 && di != only_dt)
				continue;
			double t = median(ts[di], reps);
			const char *name = skv_dtype_name(di ? SKV_DTYPE_BF16 : SKV_DTYPE_F32);
			if (do_sgemm)
				printf("  %6u %5s %12.2f %10.1f %6.1f %12.2f %10.1f %6.1f %8.2f\n",
				       L, name, t * 1e3, flop / t * 1e-9,
				       100 * flop / t * 1e-9 / peak, sg * 1e3, flop / sg * 1e-9,
				       100 * flop / sg * 1e-9 / peak, t / sg);
			else
				printf("  %6u %5s %12.2f %10.1f %6.1f %12s %10s %6s %8s\n", L, name,
				       t * 1e3, flop / t * 1e-9, 100 * flop / t * 1e-9 / peak, "-",
				       "-", "-", "-");
			fflush(stdout);
			set_free(&sets[di], n_layers);
		}
		free(kk);
		free(qq);
		free(cc);
	}
	/* the scoring kernel alone, one thread, against one CPU's share of the peak */
	const struct skv_isa *isa = isa_named(skv_ctx_isa(ctx));
	printf("\n  scoring kernel alone (%s; 1 thread, CPU time, best of %d; %%peak of one CPU "
	       "= %.1f GFLOP/s):\n",
	       isa->name, reps, peak / threads);
	for (int li = 0; li < n_lens; li++)
		for (int bf = 0; bf < (isa->tile_bf16 ? 2 : 1); bf++) {
			double g = kernel_alone(isa, bf, lens[li], reps);
			printf("  %6u %5s %10.1f GFLOP/s %6.1f %%peak (%s)\n", lens[li],
			       bf ? "bf16" : "f32", g, 100 * g / (peak / threads),
			       bf ? "vdpbf16ps" : "FMA");
		}
	f = fopen("/proc/loadavg", "r");
	if (f) {
		if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) == 3)
			printf("\n  load average after: %.2f %.2f %.2f\n", la[0], la[1], la[2]);
		fclose(f);
	}
	skv_ctx_free(ctx);
	return 0;
}
