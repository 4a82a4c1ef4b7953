/* SPDX-License-Identifier: MIT */
/*
 * bench-fma.h - the machine's measured FMA peak, the denominator of every
 * "% of peak" column (bench-kernels, bench-daemon): one pinned thread per
 * CPU, all at once, each running 12 independent chains of fused
 * multiply-adds held in registers (AVX-512, else AVX2), its rate over its
 * own CPU time, so it is the cores' peak, not this run's share of them;
 * the sum over threads, best of 3. Static inline: each benchmark is one
 * program.
 */
#ifndef SKV_BENCH_FMA_H
#define SKV_BENCH_FMA_H

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

enum { BENCH_FMA_ITERS = 20000000 };

/* 12 accumulator chains of FMAs; returns FLOPs. */
__attribute__((target("avx512f"))) static inline double bench_fma_avx512(float *sink)
{
	__m512 a[12], m = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-6f);

	for (int i = 0; i < 12; i++)
		a[i] = _mm512_set1_ps((float)i);
	for (long n = 0; n < BENCH_FMA_ITERS; n++)
#pragma GCC unroll 12 /* kept in registers, not in a[] on the stack */
		for (int i = 0; i < 12; i++)
			a[i] = _mm512_fmadd_ps(a[i], m, c);
	for (int i = 1; i < 12; i++)
		a[0] = _mm512_add_ps(a[0], a[i]);
	*sink = _mm512_reduce_add_ps(a[0]);
	return 2.0 * 16 * 12 * BENCH_FMA_ITERS;
}

__attribute__((target("avx2,fma"))) static inline double bench_fma_avx2(float *sink)
{
	__m256 a[12], m = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-6f);
	float o[8];

	for (int i = 0; i < 12; i++)
		a[i] = _mm256_set1_ps((float)i);
	for (long n = 0; n < BENCH_FMA_ITERS; n++)
#pragma GCC unroll 12
		for (int i = 0; i < 12; i++)
			a[i] = _mm256_fmadd_ps(a[i], m, c);
	for (int i = 1; i < 12; i++)
		a[0] = _mm256_add_ps(a[0], a[i]);
	_mm256_storeu_ps(o, a[0]);
	*sink = o[0];
	return 2.0 * 8 * 12 * BENCH_FMA_ITERS;
}

struct bench_fma_arg {
	int cpu;
	double rate; /* FLOP per CPU-second of the thread */
	float sink;
};

static inline void *bench_fma_thread(void *p)
{
	struct bench_fma_arg *a = p;
	struct timespec t0, t1;
	cpu_set_t cs;
	double flop;

	CPU_ZERO(&cs);
	CPU_SET(a->cpu, &cs);
	pthread_setaffinity_np(pthread_self(), sizeof(cs), &cs);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
	flop = __builtin_cpu_supports("avx512f") ? bench_fma_avx512(&a->sink)
						 : bench_fma_avx2(&a->sink);
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
	a->rate =
	    flop / ((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
	return NULL;
}

/* GFLOP/s of `threads` (at most 64) pinned threads, f32. */
static inline double bench_fma_peak(unsigned threads)
{
	pthread_t t[64];
	struct bench_fma_arg a[64];
	double best = 0;

	threads = threads > 64 ? 64 : threads;
	for (int rep = 0; rep < 3; rep++) {
		double rate = 0;

		for (unsigned i = 0; i < threads; i++) {
			a[i] = (struct bench_fma_arg){.cpu = (int)i};
			pthread_create(&t[i], NULL, bench_fma_thread, &a[i]);
		}
		for (unsigned i = 0; i < threads; i++) {
			pthread_join(t[i], NULL);
			rate += a[i].rate;
		}
		best = rate > best ? rate : best;
	}
	return best * 1e-9;
}

#endif /* SKV_BENCH_FMA_H */
