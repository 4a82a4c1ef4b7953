/* SPDX-License-Identifier: MIT */
/*
 * gpu-agree.c - host (libskv) and CUDA (libskv-cuda) compactions of the same
 * random tensors agree: kept sets equal in f32, >= 99% overlap in f16/bf16;
 * every gathered K/V row is the input row of the position the GPU reports;
 * retained masses match; NaN logits give -EDOM naming the same layer/head.
 * Covers every policy, both GQA modes, avg/max pooling, spans, protected ranges,
 * HND/NHD/paged inputs, strided outputs with headroom, dtype conversion in
 * the gather, more layers than one launch takes (> 96), and the bypass.
 */
#include <errno.h>
#include <time.h>

#include "gpu-common.h"
#include "kernels/cuda/skv-cuda.h"

enum layout { HND, NHD, PAGED };

struct cfg {
	const char *name;
	enum skv_dtype dt, odt;
	enum skv_policy policy;
	enum skv_gqa gqa;
	enum skv_pooling pool;
	uint32_t L, D, hq, hkv, W, C, k, S, nq, layers;
	enum layout lay;
	int protect;
	int nan;
	uint32_t span; /* span-aware selection (kernels/skv.h); 0 = top-k */
};

#define F32  SKV_DTYPE_F32
#define F16  SKV_DTYPE_F16
#define BF16 SKV_DTYPE_BF16
#define EXP  SKV_GQA_EXPAND
#define GRP  SKV_GQA_GROUP
#define AVG  SKV_POOL_AVG
#define MAX  SKV_POOL_MAX

#define SNAP SKV_POLICY_SNAPKV
#define H2O  SKV_POLICY_H2O
#define STRM SKV_POLICY_STREAMINGLLM
#define WNDW SKV_POLICY_WINDOW

/* clang-format off */
static const struct cfg cfgs[] = {
	/* name, dtype in/out, policy, gqa, pooling, L, D, H_q, H_kv, W, C, k, S, n_q, layers,
	 * layout, protected ranges, NaN injected */
	{"snapkv-f32-expand", F32,F32,SNAP,EXP,AVG, 1000,64,8,2,32,256,5,0,32,3, HND,0,0,0},
	{"snapkv-f32-grp-max7", F32,F32,SNAP,GRP,MAX, 3000,128,8,2,32,512,7,0,32,2, NHD,1,0,0},
	{"snapkv-f32-mha-d80", F32,F32,SNAP,EXP,AVG, 777,80,4,4,16,100,3,0,16,2, HND,0,0,0},
	{"snapkv-f32-paged", F32,F32,SNAP,EXP,AVG, 2050,128,8,4,32,300,5,0,32,2, PAGED,1,0,0},
	{"snapkv-f32-14-layers", F32,F32,SNAP,GRP,AVG, 600,64,4,2,8,64,5,0,8,14, HND,0,0,0},
	{"snapkv-f32-100-layers", F32,F32,SNAP,GRP,AVG, 100,16,2,1,4,20,3,0,4,100, NHD,0,0,0},
	{"snapkv-f32-W64-G8", F32,F32,SNAP,EXP,AVG, 1500,64,16,2,64,400,5,0,64,1, HND,0,0,0},
	{"h2o-f32", F32,F32,H2O,EXP,AVG, 700,64,4,2,16,128,5,0,700,2, HND,0,0,0},
	{"streamingllm-f32", F32,F32,STRM,EXP,AVG, 1000,64,4,2,32,200,5,4,0,2, HND,1,0,0},
	{"streaming-f32-rows", F32,F32,STRM,GRP,AVG, 1000,64,4,2,32,200,5,4,16,2, NHD,0,0,0},
	{"window-f32", F32,F32,WNDW,EXP,AVG, 900,64,4,1,32,300,5,0,0,2, HND,0,0,0},
	{"bypass-f32", F32,F32,SNAP,EXP,AVG, 500,64,4,2,32,2048,5,0,32,2, HND,0,0,0},
	{"nan-f32", F32,F32,SNAP,EXP,AVG, 512,64,4,2,32,128,5,0,32,2, HND,0,1,0},
	{"snapkv-bf16-llama", BF16,BF16,SNAP,EXP,AVG, 8192,128,32,8,32,2048,5,0,32,2, HND,0,0,0},
	{"snapkv-bf16-group", BF16,BF16,SNAP,GRP,AVG, 4096,128,32,8,32,1024,5,0,32,2, NHD,1,0,0},
	{"snapkv-f16-d64-paged", F16,F16,SNAP,EXP,MAX, 3000,64,8,2,32,700,7,0,32,2, PAGED,0,0,0},
	{"snapkv-bf16-d256", BF16,BF16,SNAP,EXP,AVG, 2000,256,8,1,32,512,5,0,32,1, HND,0,0,0},
	{"snapkv-bf16-d96", BF16,BF16,SNAP,EXP,AVG, 2000,96,8,2,32,512,5,0,32,1, HND,0,0,0},
	{"snapkv-bf16-to-f32", BF16,F32,SNAP,EXP,AVG, 2000,128,8,2,32,512,5,0,32,1, HND,0,0,0},
	{"h2o-bf16", BF16,BF16,H2O,GRP,AVG, 1024,128,8,2,32,256,5,0,1024,1, HND,0,0,0},
	/* a partial window (SPEC.md): n_q < W rows vote, W' = n_q */
	{"partial-f32-grp", F32,F32,SNAP,GRP,AVG, 900,64,8,2,32,200,5,0,12,2, HND,1,0,0},
	{"partial-bf16-1k", BF16,BF16,SNAP,EXP,MAX, 1000,128,8,2,32,256,7,0,9,1, NHD,0,0,0},
	/* one row tile, L <= 1024: the fused kernel runs on the emulator's 4 resident blocks */
	{"snapkv-bf16-grp-1k", BF16,BF16,SNAP,GRP,AVG, 1000,128,8,2,32,256,5,0,32,2, NHD,1,0,0},
	{"snapkv-f16-d64-1k", F16,F16,SNAP,EXP,MAX, 1024,64,8,2,32,300,7,0,32,1, PAGED,0,0,0},
	/* span-aware selection (skv.h): the walk's set from the composite top-k */
	{"span-f32-expand", F32,F32,SNAP,EXP,AVG, 1000,64,8,2,32,256,1,0,32,2, HND,0,0,3},
	{"span-f32-grp-max-prot", F32,F32,SNAP,GRP,MAX, 900,64,8,2,16,120,5,0,16,2, NHD,1,0,2},
	{"span-bf16-h2o", BF16,BF16,H2O,EXP,AVG, 700,64,4,2,16,128,1,0,700,1, HND,0,0,1},
	{"span-f32-wide", F32,F32,SNAP,EXP,AVG, 3000,64,4,1,16,200,1,0,16,1, HND,0,0,64},
	{"span-partial-bf16", BF16,BF16,SNAP,GRP,AVG, 1000,128,8,2,32,64,3,0,9,1, HND,1,0,3},
	/* 157 sub-chunks per item: more than an H200 keeps resident, fused falls back */
	{"snapkv-bf16-40k-d64", BF16,BF16,SNAP,EXP,AVG, 40000,64,8,2,32,2048,5,0,32,1, HND,0,0,0},
};
/* clang-format on */

/* Element offset of (h, t, 0) in a host-side view, as skv.h defines it. */
static int64_t eoff(const struct skv_tensor *t, uint32_t h, uint32_t tok)
{
	if (t->block_table)
		return (int64_t)t->block_table[tok / t->block_size] * t->block_stride +
		       (int64_t)(tok % t->block_size) * t->token_stride +
		       (int64_t)h * t->head_stride;
	return (int64_t)tok * t->token_stride + (int64_t)h * t->head_stride;
}

struct layer_bufs {
	void *hq, *hk, *hv;   /* host inputs                   */
	void *dq, *dk, *dv;   /* device inputs                 */
	int32_t *htab, *dtab; /* block tables (paged)          */
	void *hok, *hov;      /* host outputs                  */
	void *dok, *dov;      /* device outputs                */
	int32_t *hpos, *dpos;
	float *hmass, *dmass;
	void *gok, *gov; /* device outputs copied back    */
	int32_t *gpos;
	float *gmass;
	void *sok, *sov; /* the first path's, kept       */
	int32_t *spos;
	float *smass;
};

static void free_layer(struct layer_bufs *b)
{
	free(b->hq);
	free(b->hk);
	free(b->hv);
	free(b->htab);
	free(b->hok);
	free(b->hov);
	free(b->hpos);
	free(b->hmass);
	free(b->gok);
	free(b->gov);
	free(b->gpos);
	free(b->gmass);
	free(b->sok);
	free(b->sov);
	free(b->spos);
	free(b->smass);
	cudaFree(b->dq);
	cudaFree(b->dk);
	cudaFree(b->dv);
	cudaFree(b->dtab);
	cudaFree(b->dok);
	cudaFree(b->dov);
	cudaFree(b->dpos);
	cudaFree(b->dmass);
}

static int upload(void **d, const void *h, size_t bytes)
{
	CK(cudaMalloc(d, bytes ? bytes : 16));
	if (bytes)
		CK(cudaMemcpy(*d, h, bytes, cudaMemcpyHostToDevice));
	return 0;
}

/* A CUDA context per scoring path (SKV_CUDA_SCORE is read when a context is made). */
struct path {
	const char *name;
	struct skv_cuda_ctx *ctx;      /* fused: SKV_CUDA_SCORE=fused-only (-ENOTSUP: n/a)  */
	struct skv_cuda_ctx *fallback; /* fused: SKV_CUDA_SCORE=fused (two-pass where n/a) */
};

/* The compaction parameters a case asks for (run_cfg and random_cfg's validity check). */
static void cfg_params(const struct cfg *c, struct skv_params *p)
{
	skv_params_init(p);
	p->policy = c->policy;
	p->window = c->W;
	p->capacity = c->C;
	p->kernel = c->k;
	p->pooling = c->pool;
	p->gqa = c->gqa;
	p->sinks = c->S;
	p->span = c->span;
	if (c->protect) {
		p->n_protected = 2;
		p->protected_ranges[0] = (struct skv_range){c->L / 4, c->L / 4 + 8};
		p->protected_ranges[1] = (struct skv_range){c->L / 2 - 3, c->L / 2 + 2};
	}
}

static int run_cfg(const struct cfg *c, struct skv_ctx *hctx, const struct path *paths, int npaths,
		   uint64_t seed)
{
	struct skv_shape sh = {
	    .prompt_len = c->L, .head_dim = c->D, .h_q = c->hq, .h_kv = c->hkv, .n_q = c->nq};
	struct skv_params p;
	cfg_params(c, &p);
	struct skv_plan pl;
	struct skv_error err = {0};
	if (skv_plan(&sh, &p, &pl, &err) < 0) {
		printf("%-26s FAIL plan: %s\n", c->name, err.msg);
		return 1;
	}
	const uint32_t N = c->layers, L = c->L, D = c->D, kept = pl.kept, hs = pl.h_store;
	const uint32_t G = c->hq / c->hkv, bs = 16, nb = (L + bs - 1) / bs, pb = nb + 3;
	const size_t es = skv_dtype_size(c->dt), oes = skv_dtype_size(c->odt);
	const uint32_t dpos_stride = kept + 3, dhead = kept + 5;
	struct rng r = {seed};
	struct layer_bufs *b = calloc(N, sizeof(*b));
	struct skv_layer_in *hin = calloc(N, sizeof(*hin)), *din = calloc(N, sizeof(*din));
	struct skv_layer_out *hout = calloc(N, sizeof(*hout)), *dout = calloc(N, sizeof(*dout));
	int fails = 0;

	for (uint32_t l = 0; l < N; l++) {
		struct layer_bufs *x = &b[l];
		size_t nq = (size_t)c->hq * c->nq * D;
		size_t nkv =
		    c->lay == PAGED ? (size_t)pb * bs * c->hkv * D : (size_t)c->hkv * L * D;
		x->hq = rand_tensor(&r, c->dt, nq ? nq : 1, 1.6f);
		x->hk = rand_tensor(&r, c->dt, nkv, 1.0f);
		x->hv = rand_tensor(&r, c->dt, nkv, 1.0f);
		if (c->nan && l == 1)
			store_dt(x->hq, c->dt, nq - D, NAN);
		struct skv_tensor q = {
		    .dtype = c->dt, .head_stride = (int64_t)c->nq * D, .token_stride = D};
		struct skv_tensor kv = {.dtype = c->dt};
		if (c->lay == HND) {
			kv.head_stride = (int64_t)L * D;
			kv.token_stride = D;
		} else {
			kv.head_stride = D;
			kv.token_stride = (int64_t)c->hkv * D;
		}
		if (c->lay == PAGED) {
			/* a shuffled table over more physical blocks than needed */
			x->htab = malloc(pb * sizeof(int32_t));
			for (uint32_t i = 0; i < pb; i++)
				x->htab[i] = (int32_t)i;
			for (uint32_t i = pb - 1; i > 0; i--) {
				uint32_t j = (uint32_t)(rng_next(&r) % (i + 1));
				int32_t t = x->htab[i];
				x->htab[i] = x->htab[j];
				x->htab[j] = t;
			}
			kv.block_size = bs;
			kv.n_blocks = nb;
			kv.block_stride = (int64_t)bs * c->hkv * D;
			if (upload((void **)&x->dtab, x->htab, pb * sizeof(int32_t)) < 0)
				return 1;
		}
		if (upload(&x->dq, x->hq, nq * es) < 0 || upload(&x->dk, x->hk, nkv * es) < 0 ||
		    upload(&x->dv, x->hv, nkv * es) < 0)
			return 1;
		hin[l].q = q;
		hin[l].q.data = x->hq;
		hin[l].k = kv;
		hin[l].k.data = x->hk;
		hin[l].k.block_table = x->htab;
		hin[l].v = hin[l].k;
		hin[l].v.data = x->hv;
		din[l] = hin[l];
		din[l].q.data = x->dq;
		din[l].k.data = x->dk;
		din[l].k.block_table = x->dtab;
		din[l].v.data = x->dv;
		din[l].v.block_table = x->dtab;

		size_t on = (size_t)hs * kept * D, don = (size_t)hs * dhead * D;
		x->hok = calloc(on + 1, oes);
		x->hov = calloc(on + 1, oes);
		x->hpos = calloc((size_t)hs * kept + 1, 4);
		x->hmass = calloc(hs, 4);
		x->gok = calloc(don + 1, oes);
		x->gov = calloc(don + 1, oes);
		x->gpos = calloc((size_t)hs * dpos_stride + 1, 4);
		x->gmass = calloc(hs, 4);
		x->sok = calloc(don + 1, oes);
		x->sov = calloc(don + 1, oes);
		x->spos = calloc((size_t)hs * dpos_stride + 1, 4);
		x->smass = calloc(hs, 4);
		CK(cudaMalloc(&x->dok, don * oes + 16));
		CK(cudaMalloc(&x->dov, don * oes + 16));
		CK(cudaMalloc((void **)&x->dpos, (size_t)hs * dpos_stride * 4 + 4));
		CK(cudaMalloc((void **)&x->dmass, hs * 4));
		CK(cudaMemset(x->dpos, 0xff, (size_t)hs * dpos_stride * 4 + 4));
		hout[l].k = (struct skv_tensor){.data = x->hok,
						.dtype = c->odt,
						.head_stride = (int64_t)kept * D,
						.token_stride = D};
		hout[l].v = hout[l].k;
		hout[l].v.data = x->hov;
		hout[l].positions = x->hpos;
		hout[l].pos_stride = kept;
		hout[l].retained_mass = x->hmass;
		dout[l].k = (struct skv_tensor){.data = x->dok,
						.dtype = c->odt,
						.head_stride = (int64_t)dhead * D,
						.token_stride = D};
		dout[l].v = dout[l].k;
		dout[l].v.data = x->dov;
		dout[l].positions = x->dpos;
		dout[l].pos_stride = dpos_stride;
		dout[l].retained_mass = x->dmass;
	}

	struct skv_error herr = {0};
	double t0 = now_s();
	int rh = skv_compact(hctx, &sh, &p, N, hin, hout, &herr);
	double host_ms = (now_s() - t0) * 1e3;
	/*
	 * The scoring paths compute the same votes in the same order, so their
	 * outputs are bit-identical where votes are plain stores (one row tile of
	 * RT rows per K/V head; more take float atomics, in any order).
	 */
	const uint32_t w_obs = c->policy == SNAP ? c->W : c->policy == H2O ? L : c->nq;
	const int tc = c->dt != F32 && (D == 64 || D == 128 || D == 256);
	const int exact_paths = (uint64_t)G * w_obs <= (tc ? 128u : 64u);

	for (int pi = 0; pi < npaths; pi++) {
		struct skv_error gerr = {0};
		char label[200], note[200] = "";
		for (uint32_t l = 0; l < N; l++) {
			struct layer_bufs *x = &b[l];
			size_t don = (size_t)hs * dhead * D;
			CK(cudaMemset(x->dok, 0xff, don * oes));
			CK(cudaMemset(x->dov, 0xff, don * oes));
			CK(cudaMemset(x->dpos, 0xff, (size_t)hs * dpos_stride * 4 + 4));
			CK(cudaMemset(x->dmass, 0xff, hs * 4));
		}
		snprintf(label, sizeof(label), "%s [%s]", c->name, paths[pi].name);
		double t1 = now_s();
		int rg = skv_cuda_compact(paths[pi].ctx, &sh, &p, N, din, dout, &gerr);
		if (rg == 0)
			rg = skv_cuda_ctx_sync(paths[pi].ctx, &gerr);
		if (rg == -ENOTSUP && paths[pi].fallback) {
			/* fused-only declined: the reason, then the fallback context's result */
			const char *why = strstr(gerr.msg, "): ");
			snprintf(note, sizeof(note), "  (%.150s: two-pass fallback)",
				 why ? why + 3 : gerr.msg);
			snprintf(label, sizeof(label), "%s [%s>twopass]", c->name, paths[pi].name);
			memset(&gerr, 0, sizeof(gerr));
			t1 = now_s();
			rg = skv_cuda_compact(paths[pi].fallback, &sh, &p, N, din, dout, &gerr);
			if (rg == 0)
				rg = skv_cuda_ctx_sync(paths[pi].fallback, &gerr);
		}
		double cuda_ms = (now_s() - t1) * 1e3;

		if (c->nan) {
			int ok = rh == -EDOM && rg == -EDOM && herr.layer == gerr.layer &&
				 herr.head == gerr.head;
			printf("%-36s %s  host %d (layer %d head %d)  cuda %d (layer %d head %d: "
			       "%s)%s\n",
			       label, ok ? "PASS" : "FAIL", rh, herr.layer, herr.head, rg,
			       gerr.layer, gerr.head, gerr.msg, note);
			fails += !ok;
			continue;
		}
		if (rh < 0 || rg < 0) {
			printf("%-36s FAIL host %d (%s) cuda %d (%s)\n", label, rh, herr.msg, rg,
			       gerr.msg);
			fails++;
			continue;
		}

		uint64_t inter = 0, total = 0, bad_rows = 0, bad_order = 0, heads_differ = 0;
		uint64_t path_diff = 0;
		double max_dm = 0;
		uint8_t *mark = calloc(L, 1);
		for (uint32_t l = 0; l < N; l++) {
			struct layer_bufs *x = &b[l];
			size_t don = (size_t)hs * dhead * D;
			CK(cudaMemcpy(x->gok, x->dok, don * oes, cudaMemcpyDeviceToHost));
			CK(cudaMemcpy(x->gov, x->dov, don * oes, cudaMemcpyDeviceToHost));
			CK(cudaMemcpy(x->gpos, x->dpos, (size_t)hs * dpos_stride * 4,
				      cudaMemcpyDeviceToHost));
			CK(cudaMemcpy(x->gmass, x->dmass, hs * 4, cudaMemcpyDeviceToHost));
			if (pi == 0) {
				memcpy(x->sok, x->gok, don * oes);
				memcpy(x->sov, x->gov, don * oes);
				memcpy(x->spos, x->gpos, (size_t)hs * dpos_stride * 4);
				memcpy(x->smass, x->gmass, hs * 4);
			} else {
				/* against the first path: positions, K/V and masses, bit for bit */
				for (uint32_t h = 0; h < hs; h++) {
					size_t po = (size_t)h * dpos_stride,
					       ko = (size_t)h * dhead * D;
					path_diff += memcmp(x->gpos + po, x->spos + po, kept * 4) ||
						     memcmp((char *)x->gok + ko * oes,
							    (char *)x->sok + ko * oes,
							    (size_t)kept * D * oes) ||
						     memcmp((char *)x->gov + ko * oes,
							    (char *)x->sov + ko * oes,
							    (size_t)kept * D * oes) ||
						     memcmp(&x->gmass[h], &x->smass[h], 4);
				}
			}
			for (uint32_t h = 0; h < hs; h++) {
				const int32_t *gp = x->gpos + (size_t)h * dpos_stride;
				const int32_t *hp = x->hpos + (size_t)h * kept;
				uint32_t same = 0;
				memset(mark, 0, L);
				for (uint32_t i = 0; i < kept; i++)
					mark[hp[i]] = 1;
				for (uint32_t i = 0; i < kept; i++) {
					if (gp[i] < 0 || (uint32_t)gp[i] >= L ||
					    (i && gp[i] <= gp[i - 1])) {
						bad_order++;
						continue;
					}
					same += mark[gp[i]];
				}
				inter += same;
				total += kept;
				heads_differ += same != kept;
				/* each gathered row is the input row at the reported position */
				uint32_t kvh = c->gqa == EXP ? h / G : h;
				for (uint32_t i = 0; i < kept; i++) {
					if (gp[i] < 0 || (uint32_t)gp[i] >= L)
						continue;
					int64_t so = eoff(&hin[l].k, kvh, (uint32_t)gp[i]);
					size_t dof = ((size_t)h * dhead + i) * D;
					for (uint32_t d = 0; d < D; d++) {
						unsigned char ek[4], ev[4];
						store_dt(ek, c->odt, 0,
							 load_dt(x->hk, c->dt, so + d));
						store_dt(ev, c->odt, 0,
							 load_dt(x->hv, c->dt, so + d));
						if (memcmp(ek, (char *)x->gok + (dof + d) * oes,
							   oes) ||
						    memcmp(ev, (char *)x->gov + (dof + d) * oes,
							   oes)) {
							bad_rows++;
							break;
						}
					}
				}
				float hm = x->hmass[h], gm = x->gmass[h];
				if (isnan(hm) != isnan(gm))
					max_dm = INFINITY;
				else if (!isnan(hm) && fabs(hm - gm) > max_dm)
					max_dm = fabs(hm - gm);
			}
		}
		free(mark);
		/* f32 must select exactly the host's sets; 16-bit storage >= 99% overlap */
		const double min_overlap = c->dt == F32 ? 1.0 : 0.99;
		double overlap = total ? (double)inter / (double)total : 1.0;
		double mass_tol = c->dt == F32 ? 1e-4 : 2e-2;
		int ok = bad_rows == 0 && bad_order == 0 && overlap >= min_overlap &&
			 max_dm <= mass_tol && (min_overlap < 1.0 || heads_differ == 0) &&
			 (!exact_paths || path_diff == 0);
		char vs[96] = "";
		if (pi > 0 && !path_diff)
			snprintf(vs, sizeof(vs), "  vs %s: bit-identical", paths[0].name);
		if (pi > 0 && path_diff)
			snprintf(vs, sizeof(vs), "  vs %s: %llu heads differ%s", paths[0].name,
				 (unsigned long long)path_diff,
				 exact_paths ? " (must be bit-identical)" : " (float atomics)");
		printf("%-36s %s  kept %u x %u heads x %u layers  overlap %.5f  heads differing "
		       "%llu  row errors %llu  order errors %llu  max |mass diff| %.2e  host %.1f "
		       "ms  cuda %.1f ms%s%s\n",
		       label, ok ? "PASS" : "FAIL", kept, hs, N, overlap,
		       (unsigned long long)heads_differ, (unsigned long long)bad_rows,
		       (unsigned long long)bad_order, max_dm, host_ms, cuda_ms, vs, note);
		fails += !ok;
	}
	for (uint32_t l = 0; l < N; l++)
		free_layer(&b[l]);
	free(b);
	free(hin);
	free(din);
	free(hout);
	free(dout);
	return fails;
}

/* A random small valid case (for `gpu-agree --random N [SEED]`, a bug hunt). */
static void random_cfg(struct rng *r, struct cfg *c, char *name, size_t len)
{
	static const enum skv_policy pol[] = {SNAP, SNAP, SNAP, H2O, STRM, WNDW};
	static const uint32_t dims[] = {8, 16, 24, 64, 80, 128};
	static const uint32_t groups[] = {1, 2, 4, 8};
	for (;;) {
		memset(c, 0, sizeof(*c));
		c->dt = c->odt = F32;
		c->policy = pol[rng_next(r) % 6];
		c->gqa = rng_next(r) % 2 ? EXP : GRP;
		c->pool = rng_next(r) % 2 ? AVG : MAX;
		c->L = 8 + (uint32_t)(rng_next(r) % 900);
		c->D = dims[rng_next(r) % 6];
		c->hkv = 1 + (uint32_t)(rng_next(r) % 3);
		c->hq = c->hkv * groups[rng_next(r) % 4];
		c->W = 1 + (uint32_t)(rng_next(r) % 48);
		c->C = 2 + (uint32_t)(rng_next(r) % (c->L + 40));
		c->k = 1 + 2 * (uint32_t)(rng_next(r) % 5);
		c->S = (uint32_t)(rng_next(r) % 6);
		c->layers = 1 + (uint32_t)(rng_next(r) % 3);
		c->lay = (enum layout)(rng_next(r) % 3);
		c->protect = rng_next(r) % 3 == 0 && c->L >= 16;
		c->nq = c->policy == SNAP ? c->W
			: c->policy == H2O
			    ? c->L
			    : (rng_next(r) % 2 ? 0 : 1 + (uint32_t)(rng_next(r) % 8));
		if (c->nq > c->L)
			continue;
		struct skv_shape sh = {c->L, c->D, c->hq, c->hkv, c->nq};
		struct skv_params p;
		struct skv_plan pl;
		struct skv_error e;
		cfg_params(c, &p);
		if (skv_plan(&sh, &p, &pl, &e) == 0)
			break;
	}
	snprintf(name, len, "rand L%u D%u hq%u hkv%u W%u C%u k%u %s %s %s%s", c->L, c->D, c->hq,
		 c->hkv, c->W, c->C, c->k, skv_policy_name(c->policy),
		 c->gqa == EXP ? "exp" : "grp",
		 c->lay == HND	 ? "hnd"
		 : c->lay == NHD ? "nhd"
				 : "paged",
		 c->protect ? " prot" : "");
	c->name = name;
}

static int new_ctx(struct skv_cuda_dev *dev, const char *score, struct skv_cuda_ctx **ret_ctx)
{
	struct skv_error err = {0};
	setenv("SKV_CUDA_SCORE", score, 1);
	int r = skv_cuda_ctx_new(dev, ret_ctx, &err);
	if (r < 0)
		fprintf(stderr, "gpu-agree: context (SKV_CUDA_SCORE=%s): %s\n", score, err.msg);
	return r;
}

/*
 * usage: gpu-agree [--paths twopass|fused|twopass,fused] [--random N [SEED] | NAME ...]
 * Every case runs on each path (default both): two-pass, then fused (where
 * the fused kernel does not apply, the reason and the two-pass fallback).
 */
int main(int argc, char **argv)
{
	struct skv_cuda_dev *dev = NULL;
	struct skv_cuda_ctx *two = NULL, *fonly = NULL, *fused = NULL;
	struct skv_ctx *hctx = NULL;
	struct skv_error err = {0};
	struct skv_cuda_info info;
	struct path paths[2];
	const char *want = "twopass,fused";
	int fails = 0, npaths = 0, r;

	if (argc > 2 && !strcmp(argv[1], "--paths")) {
		want = argv[2];
		argv[2] = argv[0];
		argv += 2;
		argc -= 2;
	}
	if (strcmp(want, "twopass") && strcmp(want, "fused") && strcmp(want, "twopass,fused")) {
		fprintf(stderr, "gpu-agree: --paths twopass, fused or twopass,fused\n");
		return 2;
	}
	r = skv_cuda_dev_open(-1, &dev, &err);
	if (r < 0) {
		fprintf(stderr, "gpu-agree: %s\n", err.msg);
		return 2;
	}
	skv_cuda_dev_info(dev, &info);
	printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", info.name, info.cc_major, info.cc_minor,
	       info.sm_count, info.total_mem / 1073741824.0);
	if (new_ctx(dev, "twopass", &two) < 0 || new_ctx(dev, "fused-only", &fonly) < 0 ||
	    new_ctx(dev, "fused", &fused) < 0 || skv_ctx_new(0, &hctx) < 0) {
		fprintf(stderr, "gpu-agree: contexts failed\n");
		return 2;
	}
	if (strstr(want, "twopass"))
		paths[npaths++] = (struct path){"twopass", two, NULL};
	if (strstr(want, "fused"))
		paths[npaths++] = (struct path){"fused", fonly, fused};
	printf("host backend: %u threads, %s; paths: %s\n", skv_ctx_threads(hctx),
	       skv_ctx_isa(hctx), want);
	if (argc > 2 && !strcmp(argv[1], "--random")) {
		int n = atoi(argv[2]);
		struct rng rr = {argc > 3 ? strtoull(argv[3], NULL, 0) : 1};
		for (int i = 0; i < n; i++) {
			struct cfg c;
			char name[160];
			random_cfg(&rr, &c, name, sizeof(name));
			r = run_cfg(&c, hctx, paths, npaths, rng_next(&rr));
			fails += r < 0 ? 1 : r;
		}
		argc = 0; /* no named cases */
	}
	for (size_t i = 0; argc != 0 && i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		/* arguments: run only the cases whose name contains one of them */
		int pick = argc < 2;
		for (int a = 1; a < argc && !pick; a++)
			pick = strstr(cfgs[i].name, argv[a]) != NULL;
		if (!pick)
			continue;
		r = run_cfg(&cfgs[i], hctx, paths, npaths, 1000 + i);
		fails += r < 0 ? 1 : r;
	}
	printf("gpu-agree: %d failed\n", fails);
	skv_ctx_free(hctx);
	skv_cuda_ctx_free(two);
	skv_cuda_ctx_free(fonly);
	skv_cuda_ctx_free(fused);
	skv_cuda_dev_close(dev);
	return fails ? 1 : 0;
}
