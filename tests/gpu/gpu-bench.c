/* SPDX-License-Identifier: MIT */
/*
 * gpu-bench.c - GPU compaction time per request for a Llama-3-8B shape
 * (32 layers, H_q 32, H_kv 8, D 128, bf16, W 32, C 2048) at L = 8192 and
 * 32768, beside the roofline: the bytes that must move (K read once, the Q
 * window, kept K/V rows read and written, positions) over the HBM bandwidth
 * (peak from the memory clock and bus width, and a measured device-to-device
 * copy). Target: at most 2x the roofline.
 *
 * usage: gpu-bench [--score twopass|fused] [L ...]   (default two-pass; 8192 32768)
 * --score fused runs the fused scoring kernel (SKV_CUDA_SCORE=fused-only): a
 * shape it does not apply to prints the reason instead of a time.
 * SKV_BENCH_LAYERS, SKV_BENCH_REPS, SKV_BENCH_COPY_MIB shrink the run (to try
 * the program itself on the CPU emulator); the defaults are the benchmark.
 */
#include <errno.h>
#include <time.h>

#include "gpu-common.h"
#include "kernels/cuda/skv-cuda.h"

#define MAX_LAYERS 32
#define HQ	   32
#define HKV	   8
#define HD	   128
#define WIN	   32
#define CAP	   2048
#define MAX_REPS   20

static int LAYERS = MAX_LAYERS, REPS = MAX_REPS;
static size_t COPY_BYTES = 1ull << 30;

static int env_int(const char *name, int def, int lo, int hi)
{
	const char *v = getenv(name);
	int x = v ? atoi(v) : def;
	return x < lo || x > hi ? def : x;
}

/* Copy bandwidth (read + write bytes / s) of a 1 GiB device-to-device memcpy. */
static int measure_d2d(double *ret_bw)
{
	const size_t n = COPY_BYTES;
	void *a, *b;
	cudaEvent_t e0, e1;
	float ms = 0, best = 1e30f;

	CK(cudaMalloc(&a, n));
	CK(cudaMalloc(&b, n));
	CK(cudaMemset(a, 1, n));
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	for (int i = 0; i < 6; i++) {
		CK(cudaEventRecord(e0, 0));
		CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0));
		CK(cudaEventRecord(e1, 0));
		CK(cudaEventSynchronize(e1));
		CK(cudaEventElapsedTime(&ms, e0, e1));
		if (i && ms < best)
			best = ms;
	}
	*ret_bw = 2.0 * n / (best * 1e-3);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaFree(a);
	cudaFree(b);
	return 0;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

static const char *score_name = "twopass";

static int bench_one(struct skv_cuda_ctx *ctx, uint32_t L, enum skv_gqa gqa, double bw_peak,
		     double bw_meas)
{
	struct skv_shape sh = {.prompt_len = L, .head_dim = HD, .h_q = HQ, .h_kv = HKV, .n_q = WIN};
	struct skv_params p;
	struct skv_plan pl;
	struct skv_error err = {0};
	const size_t es = 2;

	skv_params_init(&p);
	p.window = WIN;
	p.capacity = CAP;
	p.gqa = gqa;
	if (skv_plan(&sh, &p, &pl, &err) < 0) {
		fprintf(stderr, "plan: %s\n", err.msg);
		return -1;
	}
	const size_t kv_layer = (size_t)HKV * L * HD, q_layer = (size_t)HQ * WIN * HD;
	const size_t out_layer = (size_t)pl.h_store * pl.kept * HD;
	char *dk, *dv, *dq, *dok, *dov;
	int32_t *dpos;
	float *dmass;
	CK(cudaMalloc((void **)&dk, LAYERS * kv_layer * es));
	CK(cudaMalloc((void **)&dv, LAYERS * kv_layer * es));
	CK(cudaMalloc((void **)&dq, LAYERS * q_layer * es));
	CK(cudaMalloc((void **)&dok, LAYERS * out_layer * es));
	CK(cudaMalloc((void **)&dov, LAYERS * out_layer * es));
	CK(cudaMalloc((void **)&dpos, (size_t)LAYERS * pl.h_store * pl.kept * 4));
	CK(cudaMalloc((void **)&dmass, (size_t)LAYERS * pl.h_store * 4));

	/* random bf16 data: one 64 MiB host block, copied over every layer */
	const size_t blk = 32u << 20; /* elements */
	struct rng r = {42 + L};
	void *h = rand_tensor(&r, SKV_DTYPE_BF16, blk, 1.0f);
	if (!h)
		return -1;
	for (size_t off = 0; off < LAYERS * kv_layer; off += blk) {
		size_t n = LAYERS * kv_layer - off < blk ? LAYERS * kv_layer - off : blk;
		CK(cudaMemcpy(dk + off * es, h, n * es, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dv + off * es, h, n * es, cudaMemcpyHostToDevice));
	}
	for (size_t i = 0; i < LAYERS * q_layer; i++)
		store_dt(h, SKV_DTYPE_BF16, i, 1.6f * rng_normal(&r));
	CK(cudaMemcpy(dq, h, LAYERS * q_layer * es, cudaMemcpyHostToDevice));
	free(h);

	struct skv_layer_in in[MAX_LAYERS];
	struct skv_layer_out out[MAX_LAYERS];
	for (int l = 0; l < LAYERS; l++) {
		in[l].q = (struct skv_tensor){.data = dq + l * q_layer * es,
					      .dtype = SKV_DTYPE_BF16,
					      .head_stride = WIN * HD,
					      .token_stride = HD};
		in[l].k = (struct skv_tensor){.data = dk + l * kv_layer * es,
					      .dtype = SKV_DTYPE_BF16,
					      .head_stride = (int64_t)L * HD,
					      .token_stride = HD};
		in[l].v = in[l].k;
		in[l].v.data = dv + l * kv_layer * es;
		out[l].k = (struct skv_tensor){.data = dok + l * out_layer * es,
					       .dtype = SKV_DTYPE_BF16,
					       .head_stride = (int64_t)pl.kept * HD,
					       .token_stride = HD};
		out[l].v = out[l].k;
		out[l].v.data = dov + l * out_layer * es;
		out[l].positions = dpos + (size_t)l * pl.h_store * pl.kept;
		out[l].pos_stride = pl.kept;
		out[l].retained_mass = dmass + (size_t)l * pl.h_store;
	}

	cudaStream_t s = (cudaStream_t)skv_cuda_ctx_stream(ctx);
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	float ms[MAX_REPS];
	double enqueue_max = 0;
	int na = 0;
	for (int i = -3; i < REPS; i++) {
		CK(cudaEventRecord(e0, s));
		double t0 = now_s();
		int rc = skv_cuda_compact(ctx, &sh, &p, LAYERS, in, out, &err);
		double t1 = now_s();
		CK(cudaEventRecord(e1, s));
		if (rc == 0)
			rc = skv_cuda_ctx_sync(ctx, &err);
		if (rc == -ENOTSUP && !strcmp(score_name, "fused")) {
			printf("L=%-6u gqa=%-6s score=%-7s n/a: %s\n", L,
			       gqa == SKV_GQA_EXPAND ? "expand" : "group", score_name, err.msg);
			na = 1;
			break;
		}
		if (rc < 0) {
			fprintf(stderr, "compact: %d %s\n", rc, err.msg);
			return -1;
		}
		if (i < 0)
			continue;
		CK(cudaEventElapsedTime(&ms[i], e0, e1));
		if (t1 - t0 > enqueue_max)
			enqueue_max = t1 - t0;
	}
	if (na)
		goto out;
	qsort(ms, REPS, sizeof(float), cmp_float);

	/* bytes that must move */
	double kbytes = (double)LAYERS * kv_layer * es;
	double qbytes = (double)LAYERS * q_layer * es;
	double gbytes = 2.0 * 2.0 * LAYERS * out_layer * es; /* K and V, read + write */
	double pbytes = (double)LAYERS * pl.h_store * pl.kept * 4;
	double bytes = kbytes + qbytes + gbytes + pbytes;
	double roof_peak = bytes / bw_peak * 1e3, roof_meas = bytes / bw_meas * 1e3;
	double med = ms[REPS / 2];
	printf(
	    "L=%-6u gqa=%-6s score=%-7s kept=%u h_store=%u  median %.3f ms (min %.3f, max %.3f)  "
	    "enqueue <= %.3f ms  bytes %.1f MiB  roofline %.3f ms (peak) / %.3f ms "
	    "(measured copy)  ratio %.2fx / %.2fx  %s\n",
	    L, gqa == SKV_GQA_EXPAND ? "expand" : "group", score_name, pl.kept, pl.h_store, med,
	    ms[0], ms[REPS - 1], enqueue_max * 1e3, bytes / 1048576.0, roof_peak, roof_meas,
	    med / roof_peak, med / roof_meas, med <= 2 * roof_meas ? "OK (<= 2x)" : "OVER 2x");
out:
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	cudaFree(dk);
	cudaFree(dv);
	cudaFree(dq);
	cudaFree(dok);
	cudaFree(dov);
	cudaFree(dpos);
	cudaFree(dmass);
	return 0;
}

int main(int argc, char **argv)
{
	struct skv_cuda_dev *dev = NULL;
	struct skv_cuda_ctx *ctx = NULL;
	struct skv_error err = {0};
	struct skv_cuda_info info;
	uint32_t Ls[8] = {8192, 32768};
	int nL = 2;
	double bw_meas = 0;

	LAYERS = env_int("SKV_BENCH_LAYERS", MAX_LAYERS, 1, MAX_LAYERS);
	REPS = env_int("SKV_BENCH_REPS", MAX_REPS, 1, MAX_REPS);
	COPY_BYTES = (size_t)env_int("SKV_BENCH_COPY_MIB", 1024, 1, 1 << 16) << 20;
	if (argc > 2 && !strcmp(argv[1], "--score")) {
		if (strcmp(argv[2], "twopass") && strcmp(argv[2], "fused")) {
			fprintf(stderr, "gpu-bench: --score twopass or fused\n");
			return 2;
		}
		score_name = argv[2];
		argv += 2;
		argc -= 2;
	}
	/* read by skv_cuda_ctx_new() */
	setenv("SKV_CUDA_SCORE", !strcmp(score_name, "fused") ? "fused-only" : "twopass", 1);
	if (argc > 1) {
		nL = 0;
		for (int i = 1; i < argc && nL < 8; i++)
			Ls[nL++] = (uint32_t)strtoul(argv[i], NULL, 10);
	}
	if (skv_cuda_dev_open(-1, &dev, &err) < 0) {
		fprintf(stderr, "gpu-bench: %s\n", err.msg);
		return 2;
	}
	skv_cuda_dev_info(dev, &info);
	if (measure_d2d(&bw_meas) < 0 || skv_cuda_ctx_new(dev, &ctx, &err) < 0)
		return 2;
	printf("device: %s (sm_%d%d, %d SMs, %.1f GiB), driver %d, runtime %d\n", info.name,
	       info.cc_major, info.cc_minor, info.sm_count, info.total_mem / 1073741824.0,
	       info.driver_version, info.runtime_version);
	printf("HBM: peak %.0f GB/s (memory clock x bus width), measured copy %.0f GB/s\n",
	       info.hbm_bytes_per_s / 1e9, bw_meas / 1e9);
	printf("shape: %d layers, H_q %d, H_kv %d, D %d, bf16, W %d, C %d, snapkv avg k=5; "
	       "%d timed runs after 3 warm-ups (GPU time between stream events); scoring %s\n",
	       LAYERS, HQ, HKV, HD, WIN, CAP, REPS, score_name);
	int rc = 0;
	for (int i = 0; i < nL; i++) {
		rc |= bench_one(ctx, Ls[i], SKV_GQA_EXPAND, info.hbm_bytes_per_s, bw_meas) < 0;
		rc |= bench_one(ctx, Ls[i], SKV_GQA_GROUP, info.hbm_bytes_per_s, bw_meas) < 0;
	}
	skv_cuda_ctx_free(ctx);
	skv_cuda_dev_close(dev);
	return rc;
}
