/* SPDX-License-Identifier: MIT */
/*
 * bench-host.h - what every benchmark prints about the machine it ran on
 * (CPU model, load average) and the OpenBLAS kernel choice the sgemm
 * baselines need. Static inline: each benchmark is one program.
 */
#ifndef SKV_BENCH_HOST_H
#define SKV_BENCH_HOST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "1.00 0.50 0.25" from /proc/loadavg, or "?". */
static inline void bench_loadavg(char *out, size_t n)
{
	FILE *f = fopen("/proc/loadavg", "r");
	double a = 0, b = 0, c = 0;

	if (f && fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3)
		snprintf(out, n, "%.2f %.2f %.2f", a, b, c);
	else
		snprintf(out, n, "?");
	if (f)
		fclose(f);
}

/* The first "model name" of /proc/cpuinfo, or "?". */
static inline void bench_cpu_model(char *out, size_t n)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];

	snprintf(out, n, "?");
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
			snprintf(out, n, "%s", strchr(line, ':') + 2);
			out[strcspn(out, "\n")] = 0;
			break;
		}
	if (f)
		fclose(f);
}

/*
 * Debian's DYNAMIC_ARCH OpenBLAS 0.3.21 does not recognise every AVX-512
 * CPU (under KVM it may fall back to its Prescott SSE3 kernels), which
 * would make an sgemm baseline unfairly slow. Unless the caller chose a
 * core type, rerun this program (call it before parsing argv) with the
 * SkylakeX (AVX-512) kernels. Returns only when no rerun is needed or
 * execv failed.
 */
static inline void bench_openblas_avx512(char **argv)
{
	__builtin_cpu_init();
	if (!getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx512f")) {
		setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
		execv("/proc/self/exe", argv);
	}
}

#endif
