// SPDX-License-Identifier: MIT
/*
 * bench-compact: the time of one compact call (skv_client_compact + release)
 * from C, for the request client/python/bench_compact.py makes from Python:
 * 2 layers, H_q 4, H_kv 2, L 128, D 32, W 16, C 32, f32, HND, group. Prints
 * the median and 10th/90th percentiles of N calls (argv[1], default 2000)
 * to $SNAPKV_SOCKET.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "snapkv.h"

enum { LAYERS = 2, HQ = 4, HKV = 2, L = 128, D = 32, W = 16, C = 32 };

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 2000;
	struct skv_client *c = NULL;
	struct skv_buffer *buf = NULL;
	struct skv_layer_ref refs[LAYERS];
	size_t kv = (size_t)HKV * L * D, q = (size_t)HQ * W * D;
	size_t per = (2 * kv + q) * sizeof(float);
	double *t = calloc(n > 0 ? n : 1, sizeof(double));
	int r;

	if (n < 10 || !t)
		return 2;
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = "bench-compact-c"};
	if ((r = skv_client_connect(NULL, &o, &c)) < 0 ||
	    (r = skv_buffer_alloc(c, per * LAYERS, &buf)) < 0) {
		fprintf(stderr, "bench-compact: %s\n", c ? skv_client_error(c) : strerror(-r));
		return 1;
	}
	float *p = skv_buffer_data(buf);
	srand(1);
	for (size_t i = 0; i < per * LAYERS / sizeof(float); i++)
		p[i] = (float)rand() / RAND_MAX - 0.5f;
	for (int l = 0; l < LAYERS; l++) {
		uint64_t base = (uint64_t)l * per;
		struct skv_tensor_ref k = {.buf = buf,
					   .offset = base,
					   .dtype = SKV_DTYPE_F32,
					   .head_stride = (int64_t)L * D,
					   .token_stride = D};
		refs[l].k = k;
		refs[l].v = k;
		refs[l].v.offset = base + kv * sizeof(float);
		refs[l].q = k;
		refs[l].q.offset = base + 2 * kv * sizeof(float);
		refs[l].q.head_stride = (int64_t)W * D;
	}
	struct skv_compact_desc d = {
	    .desc_size = sizeof(d),
	    .shape = {.prompt_len = L, .head_dim = D, .h_q = HQ, .h_kv = HKV, .n_q = W},
	    .layers = LAYERS,
	    .layer = refs,
	    .out_layout = SKV_LAYOUT_HND};
	skv_client_params_init(&d.params);
	d.params.window = W;
	d.params.capacity = C;
	d.params.gqa = SKV_GQA_GROUP;
	for (int i = -n / 10; i < n; i++) {
		struct skv_cache *k;
		double t0 = now_us();
		if ((r = skv_client_compact(c, &d, &k)) < 0) {
			fprintf(stderr, "bench-compact: %s\n", skv_client_error(c));
			return 1;
		}
		double t1 = now_us();
		skv_cache_release(k);
		if (i >= 0)
			t[i] = t1 - t0;
	}
	qsort(t, n, sizeof(*t), cmp);
	printf("C compact: median %.1f us (p10 %.1f, p90 %.1f) over %d calls\n", t[n / 2],
	       t[n / 10], t[n * 9 / 10], n);
	skv_buffer_free(buf);
	skv_client_close(c);
	free(t);
	return 0;
}
