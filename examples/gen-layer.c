// SPDX-License-Identifier: MIT
/*
 * gen-layer.c - writes a Llama-shaped K/V dump as safetensors, the input of
 * `snapkvctl compact --offline`: per layer N, layers.N.q [H_q, rows, D]
 * (the last `rows` query positions), layers.N.k and layers.N.v [H_kv, L, D].
 *
 * The attention is structured so that selection means something: every
 * query head has a direction u; its window queries point along u, and the
 * keys of a few planted spans of the prefix (plus an attention sink at
 * position 0) carry u too, over Gaussian noise everywhere else. A good
 * selection keeps the planted spans; the tool prints them for comparison.
 * Deterministic for a given seed.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv-safetensors.h"
#include "skv.h"

#define MAX_SPANS 16

struct span {
	uint32_t begin, end; /* half-open */
};

struct cfg {
	uint32_t layers, h_q, h_kv, d, len, rows, spans, show;
	uint64_t seed;
	enum skv_dtype dtype;
	bool quiet;
};

static uint64_t rng_state;

/* splitmix64: small, fast and good enough for test data. */
static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double uniform(void)
{
	return ((double)(rnd() >> 11) + 0.5) / 9007199254740992.0;
}

static float gauss(void)
{
	return (float)(sqrt(-2.0 * log(uniform())) * cos(2.0 * M_PI * uniform()));
}

static uint32_t rnd_below(uint32_t n)
{
	return (uint32_t)(rnd() % n);
}

static void store(void *dst, enum skv_dtype dt, size_t i, float v)
{
	if (dt == SKV_DTYPE_F32)
		((float *)dst)[i] = v;
	else if (dt == SKV_DTYPE_F16)
		((uint16_t *)dst)[i] = skv_f32_to_f16(v);
	else
		((uint16_t *)dst)[i] = skv_f32_to_bf16(v);
}

static int parse_u(const char *opt, const char *s, uint64_t max, uint64_t *ret)
{
	char *end;
	if (!s || !*s || *s < '0' || *s > '9') {
		fprintf(stderr, "gen-layer: %s needs a non-negative integer\n", opt);
		return -EINVAL;
	}
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (*end || errno || v > max) {
		fprintf(stderr, "gen-layer: %s: \"%s\" is not an integer in 0..%" PRIu64 "\n", opt,
			s, max);
		return -EINVAL;
	}
	*ret = v;
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: gen-layer OUT [--layers N] [--h-q H] [--h-kv H] [--head-dim D]\n"
		   "                 [--len L] [--rows R] [--spans S] [--dtype f32|f16|bf16]\n"
		   "                 [--seed X] [--show H] [--quiet]\n"
		   "defaults: 2 layers, H_q 32, H_kv 8, D 128, L 4096, rows 32, 5 spans per\n"
		   "head, bf16, seed 1; --show prints the planted positions of H heads.\n");
}

static int parse_args(int argc, char **argv, struct cfg *c, const char **out)
{
	*c = (struct cfg){.layers = 2,
			  .h_q = 32,
			  .h_kv = 8,
			  .d = 128,
			  .len = 4096,
			  .rows = 32,
			  .spans = 5,
			  .seed = 1,
			  .show = 0,
			  .dtype = SKV_DTYPE_BF16};
	*out = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t x;
		struct {
			const char *name;
			uint32_t *dst;
			uint64_t max;
		} nums[] = {
		    {"--layers", &c->layers, 1024},    {"--h-q", &c->h_q, 1024},
		    {"--h-kv", &c->h_kv, 1024},	       {"--head-dim", &c->d, 1024},
		    {"--len", &c->len, 1u << 20},      {"--rows", &c->rows, 1u << 20},
		    {"--spans", &c->spans, MAX_SPANS}, {"--show", &c->show, 1024},
		};
		bool done = false;
		for (size_t k = 0; k < sizeof(nums) / sizeof(nums[0]); k++)
			if (strcmp(a, nums[k].name) == 0) {
				if (parse_u(a, v, nums[k].max, &x) < 0)
					return -EINVAL;
				*nums[k].dst = (uint32_t)x;
				i++;
				done = true;
			}
		if (done)
			continue;
		if (strcmp(a, "--seed") == 0) {
			if (parse_u(a, v, UINT64_MAX, &c->seed) < 0)
				return -EINVAL;
			i++;
		} else if (strcmp(a, "--dtype") == 0 && v) {
			if (strcmp(v, "f32") == 0)
				c->dtype = SKV_DTYPE_F32;
			else if (strcmp(v, "f16") == 0)
				c->dtype = SKV_DTYPE_F16;
			else if (strcmp(v, "bf16") == 0)
				c->dtype = SKV_DTYPE_BF16;
			else {
				fprintf(stderr, "gen-layer: --dtype: unknown \"%s\"\n", v);
				return -EINVAL;
			}
			i++;
		} else if (strcmp(a, "--quiet") == 0) {
			c->quiet = true;
		} else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			exit(0);
		} else if (a[0] == '-' || *out) {
			fprintf(stderr, "gen-layer: unexpected argument \"%s\"\n", a);
			usage(stderr);
			return -EINVAL;
		} else {
			*out = a;
		}
	}
	if (!*out) {
		usage(stderr);
		return -EINVAL;
	}
	if (!c->layers || !c->h_q || !c->h_kv || !c->d || !c->len || c->h_q % c->h_kv ||
	    c->rows > c->len) {
		fprintf(stderr, "gen-layer: need non-zero sizes, H_q a multiple of H_kv and "
				"rows <= len\n");
		return -EINVAL;
	}
	return 0;
}

/* Non-overlapping spans of 24..40 tokens (shorter for short prompts) in
 * 1 .. len - rows - 1, sorted. */
static uint32_t plant(const struct cfg *c, struct span *sp)
{
	uint32_t prefix = c->len > c->rows ? c->len - c->rows : 0, n = 0;
	uint32_t maxlen = prefix / (4 * (c->spans ? c->spans : 1));
	if (maxlen > 40)
		maxlen = 40;
	if (maxlen < 1 || prefix < 3)
		return 0;
	for (uint32_t tries = 0; n < c->spans && tries < 1000; tries++) {
		uint32_t l = maxlen > 24 ? 24 + rnd_below(maxlen - 24 + 1) : maxlen;
		if (l + 1 >= prefix)
			break;
		uint32_t b = 1 + rnd_below(prefix - l - 1);
		bool clash = false;
		for (uint32_t k = 0; k < n; k++)
			clash |= b < sp[k].end + 2 && sp[k].begin < b + l + 2;
		if (clash)
			continue;
		sp[n++] = (struct span){b, b + l};
	}
	for (uint32_t i = 1; i < n; i++)
		for (uint32_t k = i; k > 0 && sp[k - 1].begin > sp[k].begin; k--) {
			struct span t = sp[k];
			sp[k] = sp[k - 1];
			sp[k - 1] = t;
		}
	return n;
}

int main(int argc, char **argv)
{
	struct cfg c;
	const char *out;
	struct skv_st_error err;
	int r;

	if (parse_args(argc, argv, &c, &out) < 0)
		return 2;
	rng_state = c.seed;

	const uint32_t G = c.h_q / c.h_kv, D = c.d, L = c.len, R = c.rows;
	const size_t es = skv_dtype_size(c.dtype);
	const size_t nq = (size_t)c.h_q * R * D, nkv = (size_t)c.h_kv * L * D;
	/* Logit scale: a planted key scores about qa*ka/sqrt(D) above noise. */
	const float qa = 8.0f, ka = 8.0f, sink = 1.5f;
	struct skv_st_tensor *ts = calloc((size_t)c.layers * 3, sizeof(*ts));
	char(*names)[32] = calloc((size_t)c.layers * 3, sizeof(*names));
	void **bufs = calloc((size_t)c.layers * 3, sizeof(*bufs));
	float *u = malloc((size_t)c.h_q * D * sizeof(float));
	float *acc = malloc((size_t)L * D * sizeof(float));
	struct span(*spans)[MAX_SPANS] = calloc(c.h_q, sizeof(*spans));
	uint32_t *n_spans = calloc(c.h_q, sizeof(*n_spans));
	if (!ts || !names || !bufs || !u || !acc || !spans || !n_spans) {
		fprintf(stderr, "gen-layer: out of memory\n");
		return 1;
	}

	for (uint32_t l = 0; l < c.layers; l++) {
		void *q = malloc(nq * es), *k = malloc(nkv * es), *v = malloc(nkv * es);
		bufs[l * 3] = q;
		bufs[l * 3 + 1] = k;
		bufs[l * 3 + 2] = v;
		if (!q || !k || !v) {
			fprintf(stderr, "gen-layer: out of memory\n");
			return 1;
		}
		/* Unit directions per query head. */
		for (uint32_t h = 0; h < c.h_q; h++) {
			double norm = 0;
			for (uint32_t d = 0; d < D; d++) {
				float x = gauss();
				u[(size_t)h * D + d] = x;
				norm += (double)x * x;
			}
			for (uint32_t d = 0; d < D; d++)
				u[(size_t)h * D + d] /= (float)sqrt(norm);
			n_spans[h] = plant(&c, spans[h]);
		}
		for (uint32_t h = 0; h < c.h_q; h++)
			for (uint32_t t = 0; t < R; t++)
				for (uint32_t d = 0; d < D; d++)
					store(q, c.dtype, ((size_t)h * R + t) * D + d,
					      qa * u[(size_t)h * D + d] + 0.5f * gauss());
		for (uint32_t g = 0; g < c.h_kv; g++) {
			for (size_t i = 0; i < (size_t)L * D; i++)
				acc[i] = gauss();
			for (uint32_t hh = 0; hh < G; hh++) {
				uint32_t h = g * G + hh;
				const float *uh = u + (size_t)h * D;
				for (uint32_t d = 0; d < D; d++)
					acc[d] += sink * ka * uh[d];
				for (uint32_t s = 0; s < n_spans[h]; s++)
					for (uint32_t j = spans[h][s].begin; j < spans[h][s].end;
					     j++)
						for (uint32_t d = 0; d < D; d++)
							acc[(size_t)j * D + d] += ka * uh[d];
			}
			for (size_t i = 0; i < (size_t)L * D; i++) {
				store(k, c.dtype, (size_t)g * L * D + i, acc[i]);
				store(v, c.dtype, (size_t)g * L * D + i, gauss());
			}
		}
		const char *kinds = "qkv";
		for (int x = 0; x < 3; x++) {
			struct skv_st_tensor *t = &ts[l * 3 + x];
			snprintf(names[l * 3 + x], 32, "layers.%" PRIu32 ".%c", l, kinds[x]);
			t->name = names[l * 3 + x];
			t->dtype = c.dtype == SKV_DTYPE_F32   ? SKV_ST_F32
				   : c.dtype == SKV_DTYPE_F16 ? SKV_ST_F16
							      : SKV_ST_BF16;
			t->rank = 3;
			t->shape[0] = x ? c.h_kv : c.h_q;
			t->shape[1] = x ? L : R;
			t->shape[2] = D;
			t->data = bufs[l * 3 + x];
		}
		if (l == 0 && !c.quiet)
			for (uint32_t h = 0; h < c.h_q && h < c.show; h++) {
				printf("  layer 0 head %" PRIu32 " planted: 0 (sink)", h);
				for (uint32_t s = 0; s < n_spans[h]; s++)
					printf(", %" PRIu32 "-%" PRIu32, spans[h][s].begin,
					       spans[h][s].end - 1);
				printf(", window %" PRIu32 "-%" PRIu32 "\n", L - R, L - 1);
			}
	}
	char seed[32];
	snprintf(seed, sizeof(seed), "%" PRIu64, c.seed);
	struct skv_st_meta meta[] = {{"generator", "snapkvd examples/gen-layer"}, {"seed", seed}};
	r = skv_st_write(out, ts, (size_t)c.layers * 3, meta, 2, &err);
	if (r < 0) {
		fprintf(stderr, "gen-layer: %s: %s\n", out, err.msg);
		return 1;
	}
	if (!c.quiet)
		printf("gen-layer: wrote %s: %" PRIu32 " layers, L %" PRIu32 ", H_q %" PRIu32
		       ", H_kv %" PRIu32 ", D %" PRIu32 ", %s, q rows %" PRIu32 " (%.1f MiB)\n",
		       out, c.layers, L, c.h_q, c.h_kv, D, skv_dtype_name(c.dtype), R,
		       (double)c.layers * (double)(nq + 2 * nkv) * (double)es / (1 << 20));
	for (size_t i = 0; i < (size_t)c.layers * 3; i++)
		free(bufs[i]);
	free(bufs);
	free(ts);
	free(names);
	free(u);
	free(acc);
	free(spans);
	free(n_spans);
	return 0;
}
