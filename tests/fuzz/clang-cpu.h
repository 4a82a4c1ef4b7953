/* SPDX-License-Identifier: MIT */
/*
 * clang-cpu.h - forced into libskv's fuzz build (clang 14): clang does not
 * know __builtin_cpu_supports("f16c"), which libskv's ISA choice
 * (skv-ctx.c) asks, so in that build the builtin becomes a run-time CPUID check of the
 * features skv-ctx.c names (with the OS's XSAVE state for AVX and AVX-512).
 */
#ifndef SKV_FUZZ_CLANG_CPU_H
#define SKV_FUZZ_CLANG_CPU_H

#include <cpuid.h>
#include <string.h>

static inline int skv_fuzz_cpu_supports(const char *f)
{
	unsigned a, b, c, d, b7 = 0, c7, d7, lo = 0, hi = 0;

	if (!__get_cpuid(1, &a, &b, &c, &d))
		return 0;
	if (c & bit_OSXSAVE)
		__asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	int avx_os = (lo & 0x6) == 0x6, avx512_os = (lo & 0xe6) == 0xe6;
	if (__get_cpuid_max(0, NULL) >= 7)
		__cpuid_count(7, 0, a, b7, c7, d7);
	(void)hi;
	if (!strcmp(f, "f16c"))
		return avx_os && (c & bit_F16C);
	if (!strcmp(f, "fma"))
		return avx_os && (c & bit_FMA);
	if (!strcmp(f, "avx2"))
		return avx_os && (b7 & bit_AVX2);
	if (!strcmp(f, "avx512f"))
		return avx512_os && (b7 & bit_AVX512F);
	if (!strcmp(f, "avx512dq"))
		return avx512_os && (b7 & bit_AVX512DQ);
	if (!strcmp(f, "avx512bw"))
		return avx512_os && (b7 & bit_AVX512BW);
	if (!strcmp(f, "avx512vl"))
		return avx512_os && (b7 & bit_AVX512VL);
	return 0;
}
#define __builtin_cpu_supports(f) skv_fuzz_cpu_supports(f)

#endif
