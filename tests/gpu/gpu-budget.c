/* SPDX-License-Identifier: MIT */
/*
 * gpu-budget.c - the budget modes of SPEC.md on the CUDA backend
 * (skv_cuda_compact_budget) against the host's skv_compact_budget(), bit for
 * bit: every output byte (K/V rows, positions, retained masses, and the rows
 * beyond each head's count left alone), the kept counts, C*, fallback and
 * min_mass; and the same refusals with the same messages.
 *
 * The two backends score differently (the GPU in base 2, other summation
 * orders), so random tensors give votes that differ in their last bits.
 * These cases make the votes exact instead: K rows are A * e_c for a few
 * clusters c of 1, 2, 4 or 8 prefix positions (0 elsewhere in the cluster
 * dimensions, random in the others), every window query is A * e_c for one
 * cluster, A = 64: each row's weights are exactly 1/|c| on its cluster and 0
 * elsewhere (the others are e^-300 or less), so every vote, pooled vote and
 * mass is computed to the same bits by both, and what is compared is the
 * budget logic itself: rankings, ties (most positions tie at 0), curves,
 * ladders, floors, layer-wide picks, fallbacks. Policy snapkv (h2o's rows
 * before the window cannot be made exact this way), both GQA modes, avg and
 * max pooling, protected ranges, HND and NHD inputs, f32/f16/bf16 (a bf16 ->
 * f32 output too), bypass (L < C, L < C_l, L < C_min).
 * And the zero ranking width (R = 0: C_max = window + protected, or window +
 * protected = L) in mass and mass-heads, against SPEC.md itself.
 *
 *   gpu-budget [--cases N] [--seed S] [--score twopass|fused] [-v]
 *   N random cases per mode (default 6), 1 + N / 8 more with a NaN query; the
 *   scoring path of the CUDA context (SKV_CUDA_SCORE, default twopass).
 */
#include <errno.h>
#include <time.h>

#include "gpu-common.h"
#include "kernels/cuda/skv-backend.h"
#include "kernels/cuda/skv-cuda.h"

#define A_CODE 64.0f

struct bcase {
	struct skv_shape sh;
	struct skv_params p;
	enum skv_dtype dt, odt;
	uint32_t layers;
	int nhd;
};

static uint32_t pick(struct rng *r, uint32_t n)
{
	return (uint32_t)(rng_next(r) % n);
}

/* Inputs of one layer: clustered K, coded Q, random V (see the top). */
static void fill_layer(struct rng *r, const struct bcase *c, void *q, void *k, void *v)
{
	const uint32_t L = c->sh.prompt_len, D = c->sh.head_dim, W = c->p.window;
	const uint32_t hkv = c->sh.h_kv, G = c->sh.h_q / hkv, P = L - W;
	const uint32_t nc = D < 8 ? D : 8;
	uint8_t *used = calloc(L, 1);
	for (uint32_t kvh = 0; kvh < hkv; kvh++) {
		memset(used, 0, L);
		for (uint32_t j = 0; j < L; j++)
			for (uint32_t d = 0; d < D; d++) {
				size_t o = c->nhd ? ((size_t)j * hkv + kvh) * D + d
						  : ((size_t)kvh * L + j) * D + d;
				store_dt(k, c->dt, o, d < nc ? 0.0f : rng_normal(r));
				store_dt(v, c->dt, o, rng_normal(r));
			}
		/* every cluster gets 1, 2, 4 or 8 distinct prefix positions, as
		 * many as are free (a power of two: exact weights), maybe none */
		uint32_t free_pos = P, n_used = 0, live[8];
		for (uint32_t cl = 0; cl < nc; cl++) {
			uint32_t want = 1u << pick(r, 4);
			while (want > free_pos)
				want >>= 1;
			if (want)
				live[n_used++] = cl;
			for (uint32_t m = 0; m < want;) {
				uint32_t j = pick(r, P);
				if (used[j])
					continue;
				used[j] = 1;
				m++;
				free_pos--;
				size_t o = c->nhd ? ((size_t)j * hkv + kvh) * D + cl
						  : ((size_t)kvh * L + j) * D + cl;
				store_dt(k, c->dt, o, A_CODE);
			}
		}
		for (uint32_t g = 0; g < G; g++)
			for (uint32_t i = 0; i < c->sh.n_q; i++) {
				uint32_t cl = live[pick(r, n_used)];
				for (uint32_t d = 0; d < D; d++)
					store_dt(q, c->dt,
						 (((size_t)kvh * G + g) * c->sh.n_q + i) * D + d,
						 d == cl ? A_CODE : 0.0f);
			}
	}
	free(used);
}

/* One random valid case of mode m (skv_budget_rows() accepts it). */
static void random_case(struct rng *r, enum skv_budget m, struct bcase *c)
{
	static const uint32_t heads[][2] = {{1, 1}, {2, 2}, {4, 2}, {3, 1}, {4, 1}};
	static const uint32_t dims[] = {8, 16, 64, 128};
	static const enum skv_dtype dts[] = {SKV_DTYPE_F32, SKV_DTYPE_F16, SKV_DTYPE_BF16};
	for (;;) {
		memset(c, 0, sizeof(*c));
		const uint32_t *hh = heads[pick(r, 5)];
		uint32_t W = 1 + pick(r, 12), L = W + 12 + pick(r, 140);
		c->layers = 1 + pick(r, 3);
		c->dt = dts[pick(r, 3)];
		c->odt = c->dt == SKV_DTYPE_BF16 && pick(r, 3) == 0 ? SKV_DTYPE_F32 : c->dt;
		c->nhd = (int)pick(r, 2);
		c->sh = (struct skv_shape){L, dims[pick(r, 4)], hh[0], hh[1], W};
		struct skv_params *p = &c->p;
		skv_params_init(p);
		p->window = W;
		p->kernel = 1 + 2 * pick(r, 4);
		p->pooling = pick(r, 2) ? SKV_POOL_AVG : SKV_POOL_MAX;
		p->gqa = pick(r, 2) ? SKV_GQA_EXPAND : SKV_GQA_GROUP;
		uint32_t F = W;
		if (pick(r, 3) == 0) {
			uint32_t a = pick(r, L - W - 2), b = a + 1 + pick(r, 4);
			p->protected_ranges[p->n_protected++] = (struct skv_range){a, b};
			F += (b < L - W ? b : L - W) - a;
		}
		/* uniform and layers also take the policies without scores: the
		 * query rows (none, or the last W) then only feed the mass */
		if ((m == SKV_BUDGET_UNIFORM || m == SKV_BUDGET_LAYERS) && pick(r, 3) == 0) {
			p->policy = pick(r, 2) ? SKV_POLICY_STREAMINGLLM : SKV_POLICY_WINDOW;
			p->sinks = pick(r, 6);
			c->sh.n_q = pick(r, 2) ? W : 0;
		}
		p->budget_mode = m;
		p->budget = F + 1 + pick(r, L - F + 4);
		switch (m) {
		case SKV_BUDGET_LAYERS:
			if (pick(r, 2)) {
				p->n_layer_caps = c->layers;
				for (uint32_t l = 0; l < c->layers; l++)
					p->layer_caps[l] = F + 1 + pick(r, L - F + 4);
			} else {
				static const float rs[] = {0.5f, 1.0f, 2.0f, 0.8f, 3.0f};
				p->pyramid_r = rs[pick(r, 5)];
			}
			break;
		case SKV_BUDGET_HEADS: {
			static const float as[] = {0.0f, 0.2f, 0.5f, 1.0f, 0.33f};
			p->head_floor = as[pick(r, 5)];
			break;
		}
		case SKV_BUDGET_MASS:
		case SKV_BUDGET_MASS_HEADS: {
			static const float taus[] = {0.3f, 0.5f, 0.7f, 0.9f, 0.97f, 1.0f, 0.8f};
			p->tau = taus[pick(r, 7)];
			p->c_min = F + pick(r, pick(r, 8) ? L - F + 2 : L + 20);
			p->c_min = p->c_min <= W ? W + 1 : p->c_min;
			p->c_max = p->c_min + pick(r, L);
			p->c_step = 1 + pick(r, 9);
			break;
		}
		default:
			break;
		}
		if (pick(r, 3) == 0)
			p->fallback_below = 0.2f + 0.1f * (float)pick(r, 7);
		uint32_t rows[4];
		if (skv_budget_rows(&c->sh, p, c->layers, rows, NULL) == 0)
			return;
	}
}

struct io {
	struct skv_layer_in *hin, *din;
	struct skv_layer_out *hout, *dout;
	void **host_bufs, **dev_bufs; /* per layer: q k v ok ov pos mass */
	size_t *sizes;
	uint32_t n;
};

enum { B_Q, B_K, B_V, B_OK, B_OV, B_POS, B_MASS, NB };

static void io_free(struct io *x)
{
	for (uint32_t i = 0; i < x->n * NB; i++) {
		free(x->host_bufs[i]);
		cudaFree(x->dev_bufs[i]);
	}
	free(x->host_bufs);
	free(x->dev_bufs);
	free(x->sizes);
	free(x->hin);
	free(x->din);
	free(x->hout);
	free(x->dout);
}

/* Inputs on both sides (the same bytes), outputs prefilled with one pattern. */
static int io_build(struct rng *r, const struct bcase *c, const uint32_t *rows, struct io *x)
{
	const uint32_t N = c->layers, L = c->sh.prompt_len, D = c->sh.head_dim;
	const uint32_t hs = c->p.gqa == SKV_GQA_EXPAND ? c->sh.h_q : c->sh.h_kv;
	const size_t es = skv_dtype_size(c->dt), oes = skv_dtype_size(c->odt);
	memset(x, 0, sizeof(*x));
	x->n = N;
	x->host_bufs = calloc((size_t)N * NB, sizeof(void *));
	x->dev_bufs = calloc((size_t)N * NB, sizeof(void *));
	x->sizes = calloc((size_t)N * NB, sizeof(size_t));
	x->hin = calloc(N, sizeof(*x->hin));
	x->din = calloc(N, sizeof(*x->din));
	x->hout = calloc(N, sizeof(*x->hout));
	x->dout = calloc(N, sizeof(*x->dout));
	for (uint32_t l = 0; l < N; l++) {
		const uint32_t room = rows[l] + 3, ps = rows[l] + 5;
		size_t *sz = x->sizes + (size_t)l * NB;
		void **hb = x->host_bufs + (size_t)l * NB, **db = x->dev_bufs + (size_t)l * NB;
		sz[B_Q] = (size_t)c->sh.h_q * c->sh.n_q * D * es;
		sz[B_K] = sz[B_V] = (size_t)c->sh.h_kv * L * D * es;
		sz[B_OK] = sz[B_OV] = (size_t)hs * room * D * oes;
		sz[B_POS] = (size_t)hs * ps * 4;
		sz[B_MASS] = (size_t)hs * 4;
		for (int i = 0; i < NB; i++) {
			hb[i] = malloc(sz[i] + 16);
			memset(hb[i], 0xa5, sz[i] + 16);
			CK(cudaMalloc(&db[i], sz[i] + 16));
		}
		fill_layer(r, c, hb[B_Q], hb[B_K], hb[B_V]);
		for (int i = 0; i < NB; i++)
			CK(cudaMemcpy(db[i], hb[i], sz[i] + 16, cudaMemcpyHostToDevice));
		struct skv_tensor kv = {.dtype = c->dt};
		kv.head_stride = c->nhd ? D : (int64_t)L * D;
		kv.token_stride = c->nhd ? (int64_t)c->sh.h_kv * D : D;
		struct skv_layer_in in = {
		    .q = {.dtype = c->dt, .head_stride = (int64_t)c->sh.n_q * D, .token_stride = D},
		    .k = kv,
		    .v = kv};
		struct skv_layer_out out = {
		    .k = {.dtype = c->odt, .head_stride = (int64_t)room * D, .token_stride = D},
		    .pos_stride = ps};
		out.v = out.k;
		x->hin[l] = x->din[l] = in;
		x->hout[l] = x->dout[l] = out;
		x->hin[l].q.data = hb[B_Q];
		x->hin[l].k.data = hb[B_K];
		x->hin[l].v.data = hb[B_V];
		x->hout[l].k.data = hb[B_OK];
		x->hout[l].v.data = hb[B_OV];
		x->hout[l].positions = hb[B_POS];
		x->hout[l].retained_mass = hb[B_MASS];
		x->din[l].q.data = db[B_Q];
		x->din[l].k.data = db[B_K];
		x->din[l].v.data = db[B_V];
		x->dout[l].k.data = db[B_OK];
		x->dout[l].v.data = db[B_OV];
		x->dout[l].positions = db[B_POS];
		x->dout[l].retained_mass = db[B_MASS];
	}
	return 0;
}

/* Every output byte of both sides equal; returns the count of buffers that differ. */
static int io_compare(const struct io *x, char *why, size_t len)
{
	static const char *names[NB] = {
	    "q", "k", "v", "output k", "output v", "positions", "retained_mass"};
	int bad = 0;
	for (uint32_t l = 0; l < x->n; l++)
		for (int i = B_OK; i < NB; i++) {
			size_t sz = x->sizes[(size_t)l * NB + i] + 16;
			void *g = malloc(sz);
			if (cudaMemcpy(g, x->dev_bufs[(size_t)l * NB + i], sz,
				       cudaMemcpyDeviceToHost) != cudaSuccess ||
			    memcmp(g, x->host_bufs[(size_t)l * NB + i], sz)) {
				if (!bad && i == B_MASS) {
					const float *hm = x->host_bufs[(size_t)l * NB + i];
					const float *gm = g;
					snprintf(why, len,
						 "layer %u retained_mass differs: head 0 %.9g/%.9g "
						 "last %.9g/%.9g",
						 l, (double)hm[0], (double)gm[0],
						 (double)hm[x->sizes[(size_t)l * NB + i] / 4 - 1],
						 (double)gm[x->sizes[(size_t)l * NB + i] / 4 - 1]);
				} else if (!bad) {
					snprintf(why, len, "layer %u %s differs", l, names[i]);
				}
				bad++;
			}
			free(g);
		}
	return bad;
}

static const char *mode_name(enum skv_budget m)
{
	const char *n = skv_budget_name(m);
	return n ? n : "?";
}

/* A NaN in one query element of layer l, on both sides. */
static int poison(struct io *x, const struct bcase *c, struct rng *r, uint32_t l)
{
	void *hq = x->host_bufs[(size_t)l * NB + B_Q], *dq = x->dev_bufs[(size_t)l * NB + B_Q];
	size_t n = x->sizes[(size_t)l * NB + B_Q] / skv_dtype_size(c->dt);
	if (!n)
		return 0;
	store_dt(hq, c->dt, pick(r, (uint32_t)n), NAN);
	CK(cudaMemcpy(dq, hq, x->sizes[(size_t)l * NB + B_Q], cudaMemcpyHostToDevice));
	return 0;
}

/*
 * One case on both backends; 0 when bit-identical. nan: a NaN in the query
 * rows of one layer (both -EDOM naming the same layer and head, or both 0
 * where that layer keeps all L and is never scored).
 */
static int run_case(struct skv_ctx *hctx, struct skv_cuda_ctx *gctx, struct rng *r,
		    const struct bcase *c, int verbose, int nan, unsigned *ret_fallbacks,
		    unsigned *ret_bypass)
{
	const uint32_t N = c->layers;
	const uint32_t hs = c->p.gqa == SKV_GQA_EXPAND ? c->sh.h_q : c->sh.h_kv;
	uint32_t rows[4];
	struct io x;
	struct skv_error he = {0}, ge = {0};
	char why[640] = "";
	if (skv_budget_rows(&c->sh, &c->p, N, rows, &he) < 0 || io_build(r, c, rows, &x) < 0)
		return 1;
	if (nan && poison(&x, c, r, pick(r, N)) < 0)
		return 1;
	uint32_t *hk = calloc((size_t)N * hs, 4), *gk = calloc((size_t)N * hs, 4);
	memset(gk, 0xee, (size_t)N * hs * 4);
	struct skv_budget_result hres = {.result_size = sizeof(hres), .kept = hk};
	struct skv_budget_result gres = {.result_size = sizeof(gres), .kept = gk};
	int rh = skv_compact_budget(hctx, &c->sh, &c->p, N, x.hin, x.hout, &hres, &he);
	int rg = skv_cuda_compact_budget(gctx, &c->sh, &c->p, N, x.din, x.dout, &gres, &ge);
	if (rg == 0)
		rg = skv_cuda_ctx_sync(gctx, &ge);
	int bad = rh != rg || (rh == -EDOM && (he.layer != ge.layer || he.head != ge.head));
	if (bad)
		snprintf(why, sizeof(why), "rc host %d (%s) cuda %d (%s)", rh, he.msg, rg, ge.msg);
	if (!bad && rh == 0) {
		if (hres.c_star != gres.c_star || hres.fallback != gres.fallback ||
		    memcmp(&hres.min_mass, &gres.min_mass, 4) ||
		    memcmp(hk, gk, (size_t)N * hs * 4)) {
			bad = 1;
			snprintf(why, sizeof(why),
				 "result: C* %u/%u fallback %d/%d min_mass %.9g/%.9g kept[0] %u/%u",
				 hres.c_star, gres.c_star, hres.fallback, gres.fallback,
				 (double)hres.min_mass, (double)gres.min_mass, hk[0], gk[0]);
		} else {
			bad = io_compare(&x, why, sizeof(why)) != 0;
		}
	}
	if (rh == 0) {
		*ret_fallbacks += hres.fallback != 0;
		for (uint32_t i = 0; i < N * hs; i++)
			if (hk[i] == c->sh.prompt_len) {
				*ret_bypass += 1;
				break;
			}
	}
	if (bad || verbose) {
		printf("  %-10s %s L %u D %u hq %u hkv %u %s W %u k %u %s C %u layers %u %s%s%s "
		       "tau %.2f cmin %u cmax %u step %u a %.2f r %.1f fb %.1f: C* %u fb %d "
		       "min_mass %.6f%s%s\n",
		       mode_name(c->p.budget_mode), bad ? "FAIL" : "ok", c->sh.prompt_len,
		       c->sh.head_dim, c->sh.h_q, c->sh.h_kv,
		       c->p.gqa == SKV_GQA_EXPAND ? "exp" : "grp", c->p.window, c->p.kernel,
		       c->p.pooling == SKV_POOL_AVG ? "avg" : "max", c->p.budget, N,
		       skv_dtype_name(c->dt), c->odt != c->dt ? "->f32" : "", c->nhd ? " nhd" : "",
		       (double)c->p.tau, c->p.c_min, c->p.c_max, c->p.c_step,
		       (double)c->p.head_floor, (double)c->p.pyramid_r, (double)c->p.fallback_below,
		       hres.c_star, hres.fallback, (double)hres.min_mass, bad ? ": " : "", why);
	}
	free(hk);
	free(gk);
	io_free(&x);
	return bad;
}

/* The same refusal, with the same message, from both backends. */
static int refusals(struct skv_ctx *hctx, struct skv_cuda_ctx *gctx, struct rng *r)
{
	struct bcase base;
	random_case(r, SKV_BUDGET_UNIFORM, &base);
	base.layers = 2;
	base.sh = (struct skv_shape){64, 8, 2, 1, 4};
	base.p.policy = SKV_POLICY_SNAPKV;
	base.p.window = 4;
	base.p.n_protected = 0;
	base.p.budget = 16;
	base.p.fallback_below = 0;
	base.dt = base.odt = SKV_DTYPE_F32;
	static const struct {
		const char *what;
		int no_kept, bad_size;
	} cases[] = {
	    {"tau 0", 0, 0},
	    {"tau > 1", 0, 0},
	    {"C_min > C_max", 0, 0},
	    {"step 0", 0, 0},
	    {"C_min <= W", 0, 0},
	    {"list length", 0, 0},
	    {"C_l <= W", 0, 0},
	    {"pyramid r 0", 0, 0},
	    {"pyramid layer C_l <= W", 0, 0},
	    {"floor > 1", 0, 0},
	    {"fallback > 1", 0, 0},
	    {"heads with window", 0, 0},
	    {"mass without kept", 1, 0},
	    {"fallback without kept", 1, 0},
	    {"result_size", 0, 1},
	    {"unknown mode", 0, 0},
	};
	int fails = 0;
	uint32_t rows[2] = {64, 64};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct bcase c = base;
		struct skv_params *p = &c.p;
		const char *w = cases[i].what;
		if (!strcmp(w, "tau 0") || !strcmp(w, "tau > 1") || !strcmp(w, "C_min > C_max") ||
		    !strcmp(w, "step 0") || !strcmp(w, "C_min <= W") ||
		    !strcmp(w, "mass without kept")) {
			p->budget_mode = SKV_BUDGET_MASS;
			p->tau = !strcmp(w, "tau 0") ? 0.0f : !strcmp(w, "tau > 1") ? 1.5f : 0.5f;
			p->c_min = !strcmp(w, "C_min <= W") ? 3 : 10;
			p->c_max = !strcmp(w, "C_min > C_max") ? 9 : 30;
			p->c_step = !strcmp(w, "step 0") ? 0 : 2;
		} else if (!strcmp(w, "list length") || !strcmp(w, "C_l <= W")) {
			p->budget_mode = SKV_BUDGET_LAYERS;
			p->n_layer_caps = !strcmp(w, "list length") ? 3 : 2;
			p->layer_caps[0] = p->layer_caps[2] = 20;
			p->layer_caps[1] = !strcmp(w, "C_l <= W") ? 4 : 20;
		} else if (!strcmp(w, "pyramid r 0") || !strcmp(w, "pyramid layer C_l <= W")) {
			p->budget_mode = SKV_BUDGET_LAYERS;
			p->pyramid_r = !strcmp(w, "pyramid r 0") ? 0.0f : 0.1f;
			p->budget = 6;
		} else if (!strcmp(w, "floor > 1") || !strcmp(w, "heads with window")) {
			p->budget_mode = SKV_BUDGET_HEADS;
			p->head_floor = !strcmp(w, "floor > 1") ? 1.5f : 0.2f;
			if (!strcmp(w, "heads with window")) {
				p->policy = SKV_POLICY_WINDOW;
				c.sh.n_q = 0;
			}
		} else if (!strcmp(w, "fallback > 1")) {
			p->fallback_below = 2.0f;
		} else if (!strcmp(w, "fallback without kept")) {
			p->fallback_below = 0.5f;
		} else if (!strcmp(w, "unknown mode")) {
			p->budget_mode = (enum skv_budget)9;
		}
		struct io x;
		if (io_build(r, &c, rows, &x) < 0)
			return 1;
		uint32_t hk[8], gk[8];
		struct skv_budget_result hres = {.result_size = sizeof(hres), .kept = hk};
		struct skv_budget_result gres = {.result_size = sizeof(gres), .kept = gk};
		if (cases[i].no_kept)
			hres.kept = gres.kept = NULL;
		if (cases[i].bad_size)
			hres.result_size = gres.result_size = 8;
		struct skv_error he = {0}, ge = {0};
		int rh = skv_compact_budget(hctx, &c.sh, p, 2, x.hin, x.hout, &hres, &he);
		int rg = skv_cuda_compact_budget(gctx, &c.sh, p, 2, x.din, x.dout, &gres, &ge);
		if (rg == 0) /* not refused: drain it, the case fails below */
			skv_cuda_ctx_sync(gctx, NULL);
		char why[640] = "";
		int same_out = io_compare(&x, why, sizeof(why)) == 0; /* nothing written */
		int ok = rh == -EINVAL && rg == -EINVAL && !strcmp(he.msg, ge.msg) &&
			 he.layer == ge.layer && he.head == ge.head && same_out;
		printf("  refusal %-24s %s  host %d '%s'  cuda %d '%s'%s\n", w,
		       ok ? "PASS" : "FAIL", rh, he.msg, rg, ge.msg,
		       same_out ? "" : " (something written)");
		fails += !ok;
		io_free(&x);
	}
	return fails;
}

/*
 * Mass, per (layer, head), of the window rows' full causal softmax on the
 * forced positions (those are all that is kept below): the definition, in
 * double, from the f32 inputs (HND). Group mode: the mean over the group.
 */
static double forced_mass(const struct bcase *c, const struct io *x, uint32_t l, uint32_t h,
			  const uint8_t *forced)
{
	const uint32_t L = c->sh.prompt_len, D = c->sh.head_dim, W = c->p.window;
	const uint32_t G = c->sh.h_q / c->sh.h_kv;
	const int group = c->p.gqa == SKV_GQA_GROUP;
	const uint32_t kvh = group ? h : h / G, q0 = group ? h * G : h, nq = group ? G : 1;
	const float *q = x->host_bufs[(size_t)l * NB + B_Q];
	const float *k = x->host_bufs[(size_t)l * NB + B_K];
	double sum = 0.0;
	for (uint32_t qh = q0; qh < q0 + nq; qh++)
		for (uint32_t i = 0; i < W; i++) {
			const uint32_t t = L - W + i;
			double z[256], mx = -INFINITY, den = 0.0, num = 0.0;
			for (uint32_t j = 0; j <= t; j++) {
				double d = 0.0;
				for (uint32_t e = 0; e < D; e++)
					d += (double)q[((size_t)qh * W + i) * D + e] *
					     k[((size_t)kvh * L + j) * D + e];
				z[j] = d / sqrt((double)D);
				mx = z[j] > mx ? z[j] : mx;
			}
			for (uint32_t j = 0; j <= t; j++) {
				den += exp(z[j] - mx);
				num += forced[j] ? exp(z[j] - mx) : 0.0;
			}
			sum += num / den;
		}
	return sum / ((double)W * nq);
}

/* One zero-width case (see zero_width()). */
struct zcase {
	const char *what;
	uint32_t L, W, pb, pe, c_min, c_max, step, c_star;
};

/* The CUDA outputs of one layer against the forced set; why[] says what differs. */
static void zero_check_layer(const struct bcase *c, const struct io *x, uint32_t l,
			     uint32_t row_count, const uint32_t *kept, const uint8_t *forced,
			     uint32_t F, double *worst, char *why, size_t len)
{
	const uint32_t L = c->sh.prompt_len, D = c->sh.head_dim, G = c->sh.h_q / c->sh.h_kv;
	const int group = c->p.gqa == SKV_GQA_GROUP;
	const uint32_t hs = group ? c->sh.h_kv : c->sh.h_q;
	const size_t ps = row_count + 5, room = row_count + 3;
	int32_t *pos = malloc((size_t)hs * ps * 4);
	float *ok = malloc((size_t)hs * room * D * 4), mass[8];
	const float *k = x->host_bufs[(size_t)l * NB + B_K];
	cudaMemcpy(pos, x->dev_bufs[(size_t)l * NB + B_POS], (size_t)hs * ps * 4,
		   cudaMemcpyDeviceToHost);
	cudaMemcpy(ok, x->dev_bufs[(size_t)l * NB + B_OK], (size_t)hs * room * D * 4,
		   cudaMemcpyDeviceToHost);
	cudaMemcpy(mass, x->dev_bufs[(size_t)l * NB + B_MASS], hs * 4, cudaMemcpyDeviceToHost);
	for (uint32_t h = 0; h < hs && !why[0]; h++) {
		const uint32_t kvh = group ? h : h / G;
		if (kept[l * hs + h] != F)
			snprintf(why, len, "layer %u head %u keeps %u, not %u", l, h,
				 kept[l * hs + h], F);
		for (uint32_t j = 0, s = 0; j < L && !why[0]; j++) {
			if (!forced[j])
				continue;
			if (pos[h * ps + s] != (int32_t)j ||
			    memcmp(ok + ((size_t)h * room + s) * D, k + ((size_t)kvh * L + j) * D,
				   (size_t)D * 4))
				snprintf(why, len,
					 "layer %u head %u slot %u: position %d or its K row "
					 "(want %u)",
					 l, h, s, pos[h * ps + s], j);
			s++;
		}
		const double want = F == L ? 1.0 : forced_mass(c, x, l, h, forced);
		const double d = fabs(mass[h] - want);
		*worst = d > *worst ? d : *worst;
		if (!why[0] && !(d <= 1e-5))
			snprintf(why, len, "layer %u head %u mass %.9g, want %.9g", l, h,
				 (double)mass[h], want);
	}
	free(pos);
	free(ok);
}

/* One zero-width case in mode m and GQA mode gqa (1: group); 0 when it passes. */
static int zero_case(struct skv_cuda_ctx *gctx, struct rng *r, const struct zcase *z,
		     enum skv_budget m, int gqa)
{
	struct bcase c = {.layers = 2, .dt = SKV_DTYPE_F32, .odt = SKV_DTYPE_F32};
	struct skv_params *p = &c.p;
	c.sh = (struct skv_shape){z->L, 16, 4, 2, z->W};
	skv_params_init(p);
	p->window = z->W;
	p->kernel = 3;
	p->gqa = gqa ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
	p->protected_ranges[p->n_protected++] = (struct skv_range){z->pb, z->pe};
	p->budget_mode = m;
	p->tau = 0.9f;
	p->c_min = z->c_min;
	p->c_max = z->c_max;
	p->c_step = z->step;
	uint32_t rows[2], kept[8], F = 0;
	uint8_t forced[64] = {0};
	for (uint32_t j = 0; j < z->L; j++) {
		forced[j] = j >= z->L - z->W || (j >= z->pb && j < z->pe);
		F += forced[j];
	}
	struct io x;
	struct skv_error e = {0};
	char why[400] = "";
	int rc = skv_budget_rows(&c.sh, p, c.layers, rows, &e);
	if (rc == 0)
		rc = io_build(r, &c, rows, &x);
	if (rc < 0) {
		printf("  zero width %s: setup failed %d (%s)\n", z->what, rc, e.msg);
		return 1;
	}
	memset(kept, 0xee, sizeof(kept));
	struct skv_budget_result res = {.result_size = sizeof(res), .kept = kept};
	rc = skv_cuda_compact_budget(gctx, &c.sh, p, c.layers, x.din, x.dout, &res, &e);
	if (rc == 0)
		rc = skv_cuda_ctx_sync(gctx, &e);
	const uint32_t want_cs = m == SKV_BUDGET_MASS ? z->c_star : 0;
	if (rc < 0)
		snprintf(why, sizeof(why), "cuda %d (%s)", rc, e.msg);
	else if (res.c_star != want_cs || res.fallback)
		snprintf(why, sizeof(why), "C* %u (want %u), fallback %d", res.c_star, want_cs,
			 res.fallback);
	double worst = 0.0;
	for (uint32_t l = 0; l < c.layers && !why[0]; l++)
		zero_check_layer(&c, &x, l, rows[l], kept, forced, F, &worst, why, sizeof(why));
	printf("  zero width %-9s %-22s %-6s %s  C* %u, every head keeps the %u forced "
	       "positions, max |mass diff| %.1e%s%s\n",
	       mode_name(m), z->what, gqa ? "group" : "expand", why[0] ? "FAIL" : "PASS",
	       res.c_star, F, worst, why[0] ? ": " : "", why);
	io_free(&x);
	return why[0] != 0;
}

/*
 * Zero ranking width (R = 0): mass and mass-heads where C_max equals the
 * forced count (window + protected), and where window + protected cover all
 * of L. Checked against SPEC.md directly, not against the host: every head
 * keeps exactly the forced positions, ascending, with their K/V rows; C* is
 * the ladder's answer (mass), 0 (mass-heads); masses are the forced
 * positions' (1 where they are all of L); no fallback.
 */
static int zero_width(struct skv_cuda_ctx *gctx, struct rng *r)
{
	static const struct zcase zc[] = {
	    {"C_max = W + protected", 40, 8, 0, 4, 12, 12, 1, 12},
	    {"W + protected = L", 16, 8, 0, 8, 16, 32, 4, 16},
	};
	int fails = 0;
	for (size_t i = 0; i < sizeof(zc) / sizeof(zc[0]); i++)
		for (int gqa = 0; gqa < 2; gqa++) {
			fails += zero_case(gctx, r, &zc[i], SKV_BUDGET_MASS, gqa);
			fails += zero_case(gctx, r, &zc[i], SKV_BUDGET_MASS_HEADS, gqa);
		}
	return fails;
}

/* Uniform through the budget entry: the same bytes as skv_cuda_compact(). */
static int uniform_same(struct skv_cuda_ctx *gctx, struct rng *r, int n)
{
	int fails = 0;
	for (int i = 0; i < n; i++) {
		struct bcase c;
		random_case(r, SKV_BUDGET_UNIFORM, &c);
		c.p.fallback_below = 0;
		uint32_t rows[4];
		struct io a, b;
		struct skv_error e = {0};
		skv_budget_rows(&c.sh, &c.p, c.layers, rows, NULL);
		struct rng r2 = *r;
		if (io_build(r, &c, rows, &a) < 0 || io_build(&r2, &c, rows, &b) < 0)
			return 1;
		uint32_t kept[16];
		struct skv_budget_result res = {.result_size = sizeof(res), .kept = kept};
		int r1 = skv_cuda_compact(gctx, &c.sh, &c.p, c.layers, a.din, a.dout, &e);
		if (r1 == 0)
			r1 = skv_cuda_ctx_sync(gctx, &e);
		int rb =
		    skv_cuda_compact_budget(gctx, &c.sh, &c.p, c.layers, b.din, b.dout, &res, &e);
		if (rb == 0)
			rb = skv_cuda_ctx_sync(gctx, &e);
		int diff = r1 != 0 || rb != 0;
		for (uint32_t l = 0; l < c.layers && !diff; l++)
			for (int k = B_OK; k < NB && !diff; k++) {
				size_t sz = a.sizes[(size_t)l * NB + k] + 16;
				char *ga = malloc(sz), *gb = malloc(sz);
				cudaMemcpy(ga, a.dev_bufs[(size_t)l * NB + k], sz,
					   cudaMemcpyDeviceToHost);
				cudaMemcpy(gb, b.dev_bufs[(size_t)l * NB + k], sz,
					   cudaMemcpyDeviceToHost);
				diff = memcmp(ga, gb, sz) != 0;
				free(ga);
				free(gb);
			}
		fails += diff;
		io_free(&a);
		io_free(&b);
	}
	printf("uniform: skv_cuda_compact_budget == skv_cuda_compact, %d cases: %s\n", n,
	       fails ? "FAIL" : "PASS");
	return fails;
}

int main(int argc, char **argv)
{
	int cases = 6, verbose = 0;
	const char *score = "twopass";
	uint64_t seed = 20261202;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--cases") && i + 1 < argc)
			cases = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--score") && i + 1 < argc)
			score = argv[++i];
		else if (!strcmp(argv[i], "-v"))
			verbose = 1;
		else {
			fprintf(stderr,
				"usage: gpu-budget [--cases N] [--seed S] [--score twopass|fused] "
				"[-v]\n");
			return 2;
		}
	}
	struct skv_cuda_dev *dev = NULL;
	struct skv_cuda_ctx *gctx = NULL;
	struct skv_ctx *hctx = NULL;
	struct skv_error err = {0};
	if (skv_cuda_dev_open(-1, &dev, &err) < 0) {
		fprintf(stderr, "gpu-budget: %s\n", err.msg);
		return 2;
	}
	setenv("SKV_CUDA_SCORE", score, 1);
	printf("gpu-budget: scoring %s, %d random cases per mode, seed %llu\n", score, cases,
	       (unsigned long long)seed);
	if (skv_cuda_ctx_new(dev, &gctx, &err) < 0 || skv_ctx_new(2, &hctx) < 0) {
		fprintf(stderr, "gpu-budget: contexts: %s\n", err.msg);
		return 2;
	}
	int fails = 0;
	if (skv_cuda_backend_ops()->compact_budget != skv_cuda_compact_budget) {
		printf("FAIL: the backend table has no compact_budget\n");
		fails++;
	}
	struct rng r = {seed};
	static const enum skv_budget modes[] = {SKV_BUDGET_UNIFORM, SKV_BUDGET_LAYERS,
						SKV_BUDGET_HEADS, SKV_BUDGET_MASS,
						SKV_BUDGET_MASS_HEADS};
	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		int bad = 0;
		unsigned fb = 0, byp = 0;
		double t0 = now_s();
		for (int i = 0; i < cases; i++) {
			struct bcase c;
			random_case(&r, modes[m], &c);
			bad += run_case(hctx, gctx, &r, &c, verbose, 0, &fb, &byp);
		}
		/* NaN logits: -EDOM naming the same layer and head */
		int nan_bad = 0;
		const int n_nan = 1 + cases / 8;
		for (int i = 0; i < n_nan; i++) {
			struct bcase c;
			random_case(&r, modes[m], &c);
			nan_bad += run_case(hctx, gctx, &r, &c, verbose, 1, &fb, &byp);
		}
		printf("%-10s %d case(s) with a NaN query: %s\n", mode_name(modes[m]), n_nan,
		       nan_bad ? "FAIL" : "PASS");
		bad += nan_bad;
		printf(
		    "%-10s %d random cases: %d bit-identical, %d differ (%u fell back, %u with a "
		    "head keeping all L) %.1f s\n",
		    mode_name(modes[m]), cases, cases - bad, bad, fb, byp, now_s() - t0);
		fails += bad;
	}
	fails += refusals(hctx, gctx, &r);
	struct rng zr = {seed ^ 0x2e60};
	fails += zero_width(gctx, &zr); /* its own stream: the cases above unchanged */
	fails += uniform_same(gctx, &r, 3);
	printf("gpu-budget: %d failed\n", fails);
	skv_ctx_free(hctx);
	skv_cuda_ctx_free(gctx);
	skv_cuda_dev_close(dev);
	return fails ? 1 : 0;
}
