/* SPDX-License-Identifier: MIT */
/*
 * test-emu-errors - the emulator reports what a GPU reports: a launch with
 * too many threads per block, an empty grid or more dynamic shared memory
 * than sm_90 allows runs no block, and cudaGetLastError returns its error
 * once (then cudaSuccess); a good launch runs and leaves no error. The
 * kernels' error paths (return cudaGetLastError() after a launch) are
 * exercised only if this holds. A copy whose kind does not match where its
 * pointers live aborts (a child process tries each wrong kind), a matching
 * one and cudaMemcpyDefault copy. Exit 0 when every check passed.
 */
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_runtime.h"

static __global__ void mark(int *p, unsigned width)
{
	p[blockIdx.x * width + threadIdx.x] = 1;
}

static int fails;

static void check(bool ok, const char *what)
{
	printf("  %s %s\n", ok ? "ok  " : "FAIL", what);
	fails += !ok;
}

/* the copy in a child: true if it was aborted */
static bool aborts(void *dst, const void *src, enum cudaMemcpyKind k)
{
	int st = 0;
	pid_t p = fork();

	if (p == 0) {
		if (!freopen("/dev/null", "w", stderr))
			_exit(2);
		cudaMemcpy(dst, src, 16, k);
		_exit(0);
	}
	if (p < 0 || waitpid(p, &st, 0) != p)
		return false;
	return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void copy_kinds(int *d)
{
	int h[4] = {1, 2, 3, 4}, back[4] = {0};

	check(aborts(d, h, cudaMemcpyDeviceToHost), "H->D copied as DeviceToHost: aborted");
	check(aborts(h, d, cudaMemcpyHostToDevice), "D->H copied as HostToDevice: aborted");
	check(aborts(d, h, cudaMemcpyHostToHost), "host to device as HostToHost: aborted");
	check(aborts(d, h, cudaMemcpyDeviceToDevice), "host to device as DeviceToDevice: aborted");
	check(cudaMemcpy(d, h, sizeof(h), cudaMemcpyHostToDevice) == cudaSuccess &&
		  cudaMemcpy(back, d, sizeof(back), cudaMemcpyDeviceToHost) == cudaSuccess &&
		  back[3] == 4,
	      "matching kinds copy");
	check(cudaMemcpy(back, h, sizeof(h), cudaMemcpyDefault) == cudaSuccess,
	      "cudaMemcpyDefault takes host to host");
}

int main(void)
{
	int *d = NULL, sum = 0;

	check(cudaMalloc((void **)&d, 4096 * sizeof(int)) == cudaSuccess, "cudaMalloc");
	cudaMemset(d, 0, 4096 * sizeof(int));
	SKV_LAUNCH(mark, 1, 2048, 0, 0, d, 2048u);
	check(cudaGetLastError() == cudaErrorInvalidConfiguration,
	      "2048 threads per block: cudaErrorInvalidConfiguration");
	check(cudaGetLastError() == cudaSuccess, "read once, then cleared");
	SKV_LAUNCH(mark, 0, 64, 0, 0, d, 64u);
	check(cudaGetLastError() == cudaErrorInvalidConfiguration,
	      "an empty grid: cudaErrorInvalidConfiguration");
	SKV_LAUNCH(mark, 1, 64, 228 * 1024, 0, d, 64u);
	check(cudaGetLastError() == cudaErrorInvalidValue,
	      "228 KiB of dynamic shared memory: cudaErrorInvalidValue");
	for (int i = 0; i < 4096; i++)
		sum += d[i];
	check(sum == 0, "the refused launches wrote nothing");
	SKV_LAUNCH(mark, 2, 64, 0, 0, d, 64u);
	check(cudaGetLastError() == cudaSuccess, "2 x 64 threads: cudaSuccess");
	for (int i = 0; i < 4096; i++)
		sum += d[i];
	check(sum == 128, "and every thread ran");
	copy_kinds(d);
	cudaFree(d);
	printf("test-emu-errors: %s\n", fails ? "FAILED" : "passed");
	return fails ? 1 : 0;
}
