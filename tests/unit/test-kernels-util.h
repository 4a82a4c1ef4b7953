/* SPDX-License-Identifier: MIT */
/*
 * test-kernels-util.h - building tensors of any dtype and layout from f32
 * master values, running libskv and checking it against ref-snapkv.c.
 * Included by the kernel test programs (static functions only).
 */
#ifndef TEST_KERNELS_UTIL_H
#define TEST_KERNELS_UTIL_H

#include <CUnit/Basic.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"
#include "ref-snapkv.h"

enum layout { LAY_HND, LAY_NHD, LAY_PAGED };

struct prob {
	struct skv_shape sh;
	struct skv_params p;
	uint32_t n_layers;
	enum skv_dtype dq, dk, dv, dout;
	enum layout lin, lout;
	uint32_t block_size; /* paged */
	float sk, sv;	     /* fp8 K and V: their scales (1 otherwise) */
	/* master values per layer, already representable in their dtype */
	float **q, **k, **v;
	/* built tensors */
	struct skv_layer_in *in;
	struct skv_layer_out *out;
	void **bufs; /* everything to free */
	uint32_t n_bufs, cap_bufs;
	uint32_t out_cap; /* tokens of room per stored head in outputs */
	size_t out_k_bytes, out_v_bytes, pos_count;
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static inline uint64_t rng_next(void)
{
	uint64_t x = rng_state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static inline double rng_unif(void)
{
	return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0);
}

static inline double rng_normal(void)
{
	double u = rng_unif(), v = rng_unif();
	if (u < 1e-300)
		u = 1e-300;
	return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static inline bool is_fp8(enum skv_dtype dt)
{
	return dt == SKV_DTYPE_F8E4M3FN || dt == SKV_DTYPE_F8E5M2;
}

/* ref_fp8_dequant of every byte at (dt, s), the last pair asked for */
static inline const float *fp8_table(enum skv_dtype dt, float s)
{
	static float tab[256], ts;
	static enum skv_dtype tdt;
	if (tdt != dt || memcmp(&ts, &s, 4)) {
		for (int b = 0; b < 256; b++)
			tab[b] = ref_fp8_dequant(dt, (uint8_t)b, s);
		tdt = dt;
		ts = s;
	}
	return tab;
}

/* The finite fp8 byte nearest to x / s (the first of two as near). */
static inline uint8_t fp8_nearest(enum skv_dtype dt, double x, float s)
{
	const float *tab = fp8_table(dt, s);
	uint8_t best = 0;
	double bd = INFINITY;
	for (int b = 0; b < 256; b++) {
		float y = tab[b];
		if (isfinite(y) && fabs(y - x) < bd) {
			bd = fabs(y - x);
			best = (uint8_t)b;
		}
	}
	return best;
}

/* The byte whose dequantized value is exactly x (masters are such values). */
static inline uint8_t fp8_byte(enum skv_dtype dt, float x, float s)
{
	const float *tab = fp8_table(dt, s);
	for (int b = 0; b < 256; b++) {
		float y = tab[b];
		if (!memcmp(&x, &y, 4))
			return (uint8_t)b;
	}
	fprintf(stderr, "no fp8 byte for %g at scale %g\n", x, s);
	abort();
}

static inline float round_to(enum skv_dtype dt, float x)
{
	if (dt == SKV_DTYPE_F16)
		return skv_f16_to_f32(skv_f32_to_f16(x));
	if (dt == SKV_DTYPE_BF16)
		return skv_bf16_to_f32(skv_f32_to_bf16(x));
	return x;
}

static inline void *track(struct prob *pb, void *p)
{
	if (pb->n_bufs == pb->cap_bufs) {
		pb->cap_bufs = pb->cap_bufs ? 2 * pb->cap_bufs : 64;
		pb->bufs = realloc(pb->bufs, pb->cap_bufs * sizeof(void *));
	}
	pb->bufs[pb->n_bufs++] = p;
	return p;
}

static inline void store(enum skv_dtype dt, void *base, int64_t idx, float x)
{
	if (dt == SKV_DTYPE_F32)
		((float *)base)[idx] = x;
	else if (dt == SKV_DTYPE_F16)
		((uint16_t *)base)[idx] = skv_f32_to_f16(x);
	else
		((uint16_t *)base)[idx] = skv_f32_to_bf16(x);
}

static inline float load(enum skv_dtype dt, const void *base, int64_t idx)
{
	if (dt == SKV_DTYPE_F32)
		return ((const float *)base)[idx];
	if (dt == SKV_DTYPE_F16)
		return skv_f16_to_f32(((const uint16_t *)base)[idx]);
	return skv_bf16_to_f32(((const uint16_t *)base)[idx]);
}

/* an element of a tensor as a float: fp8 dequantized at the tensor's scale */
static inline float load_t(const struct skv_tensor *t, int64_t idx)
{
	if (is_fp8(t->dtype))
		return ref_fp8_dequant(t->dtype, ((const uint8_t *)t->data)[idx], t->scale);
	return load(t->dtype, t->data, idx);
}

/* element offset of (h, t, d) in a tensor */
static inline int64_t toff(const struct skv_tensor *t, uint32_t h, uint32_t tok, uint32_t d)
{
	int64_t blk = 0, in = tok;
	if (t->block_table) {
		blk = t->block_table[tok / t->block_size];
		in = tok % t->block_size;
	}
	return blk * t->block_stride + in * t->token_stride + (int64_t)h * t->head_stride + d;
}

/* a tensor of H heads x T tokens x D holding master[h][t][d] */
static inline struct skv_tensor make_tensor(struct prob *pb, enum skv_dtype dt, enum layout lay,
					    uint32_t H, uint32_t T, uint32_t D, const float *master,
					    float scale)
{
	struct skv_tensor t = {.dtype = dt, .scale = scale};
	size_t es = skv_dtype_size(dt);
	size_t n;

	if (lay == LAY_PAGED) {
		uint32_t bs = pb->block_size ? pb->block_size : 5;
		uint32_t nb = (T + bs - 1) / bs, nphys = nb + 3;
		int32_t *tab = track(pb, malloc(sizeof(int32_t) * (nb + 1)));
		/* a shuffled table over a larger pool: blocks out of order */
		int32_t *perm = malloc(sizeof(int32_t) * nphys);
		for (uint32_t i = 0; i < nphys; i++)
			perm[i] = (int32_t)i;
		for (uint32_t i = nphys - 1; i > 0; i--) {
			uint32_t j = (uint32_t)(rng_next() % (i + 1));
			int32_t x = perm[i];
			perm[i] = perm[j];
			perm[j] = x;
		}
		memcpy(tab, perm, sizeof(int32_t) * nb);
		free(perm);
		t.block_table = tab;
		t.block_size = bs;
		t.n_blocks = nb;
		t.token_stride = (int64_t)H * D;
		t.head_stride = D;
		t.block_stride = (int64_t)bs * H * D;
		n = (size_t)nphys * bs * H * D;
	} else if (lay == LAY_NHD) {
		t.token_stride = (int64_t)H * D;
		t.head_stride = D;
		n = (size_t)T * H * D;
	} else {
		t.head_stride = (int64_t)T * D;
		t.token_stride = D;
		n = (size_t)T * H * D;
	}
	t.data = track(pb, malloc(n * es + 1));
	memset(t.data, 0x7f, n * es); /* garbage (NaN-ish) where nothing lives */
	for (uint32_t h = 0; h < H && master; h++)
		for (uint32_t tok = 0; tok < T; tok++)
			for (uint32_t d = 0; d < D; d++)
				if (is_fp8(dt))
					((uint8_t *)t.data)[toff(&t, h, tok, d)] = fp8_byte(
					    dt, master[((size_t)h * T + tok) * D + d], scale);
				else
					store(dt, t.data, toff(&t, h, tok, d),
					      master[((size_t)h * T + tok) * D + d]);
	return t;
}

/* fp8: values s * byte, the byte nearest a normal sample (scale s) */
static inline float *master_random_s(struct prob *pb, enum skv_dtype dt, size_t n, double sd,
				     float s)
{
	float *m = track(pb, malloc(n * sizeof(float) + 4));
	for (size_t i = 0; i < n; i++)
		m[i] = is_fp8(dt) ? ref_fp8_dequant(dt, fp8_nearest(dt, rng_normal() * sd, s), s)
				  : round_to(dt, (float)(rng_normal() * sd));
	return m;
}

static inline float *master_random(struct prob *pb, enum skv_dtype dt, size_t n, double sd)
{
	return master_random_s(pb, dt, n, sd, 1.0f);
}

static inline void prob_init(struct prob *pb, uint32_t L, uint32_t D, uint32_t hq, uint32_t hkv,
			     uint32_t n_layers)
{
	memset(pb, 0, sizeof(*pb));
	skv_params_init(&pb->p);
	pb->sh = (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = hq, .h_kv = hkv};
	pb->n_layers = n_layers;
	pb->dq = pb->dk = pb->dv = pb->dout = SKV_DTYPE_F32;
	pb->sk = pb->sv = 1.0f;
	pb->q = track(pb, calloc(n_layers, sizeof(float *)));
	pb->k = track(pb, calloc(n_layers, sizeof(float *)));
	pb->v = track(pb, calloc(n_layers, sizeof(float *)));
}

/* random masters; n_q from the policy. sd: spread of q and k */
static inline void prob_random(struct prob *pb, double sd)
{
	const struct skv_shape *s = &pb->sh;
	for (uint32_t l = 0; l < pb->n_layers; l++) {
		pb->q[l] =
		    master_random(pb, pb->dq, (size_t)s->h_q * (s->n_q + 1) * s->head_dim, sd);
		pb->k[l] = master_random_s(
		    pb, pb->dk, (size_t)s->h_kv * s->prompt_len * s->head_dim, sd, pb->sk);
		pb->v[l] = master_random_s(
		    pb, pb->dv, (size_t)s->h_kv * s->prompt_len * s->head_dim, 1.0, pb->sv);
	}
}

/* build in/out tensors; outputs filled with a 0xA5 canary */
static inline void prob_build(struct prob *pb)
{
	const struct skv_shape *s = &pb->sh;
	struct skv_plan pl;
	struct skv_error e;
	uint32_t hs = pb->p.gqa == SKV_GQA_GROUP ? s->h_kv : s->h_q;
	uint32_t kept = s->prompt_len < pb->p.capacity ? s->prompt_len : pb->p.capacity;

	if (skv_plan(s, &pb->p, &pl, &e) == 0)
		kept = pl.kept;
	pb->out_cap = kept + 3;
	pb->in = track(pb, calloc(pb->n_layers, sizeof(*pb->in)));
	pb->out = track(pb, calloc(pb->n_layers, sizeof(*pb->out)));
	for (uint32_t l = 0; l < pb->n_layers; l++) {
		enum layout lq = pb->lin == LAY_PAGED ? LAY_HND : pb->lin;
		pb->in[l].q =
		    make_tensor(pb, pb->dq, lq, s->h_q, s->n_q, s->head_dim, pb->q[l], 1.0f);
		pb->in[l].k = make_tensor(pb, pb->dk, pb->lin, s->h_kv, s->prompt_len, s->head_dim,
					  pb->k[l], pb->sk);
		pb->in[l].v = make_tensor(pb, pb->dv, pb->lin, s->h_kv, s->prompt_len, s->head_dim,
					  pb->v[l], pb->sv);
		struct skv_layer_out *o = &pb->out[l];
		/* an fp8 output carries its input's scale (libskv does not read it) */
		o->k =
		    make_tensor(pb, pb->dout, pb->lout, hs, pb->out_cap, s->head_dim, NULL, pb->sk);
		o->v =
		    make_tensor(pb, pb->dout, pb->lout, hs, pb->out_cap, s->head_dim, NULL, pb->sv);
		pb->out_k_bytes = (size_t)hs * pb->out_cap * s->head_dim * skv_dtype_size(pb->dout);
		pb->out_v_bytes = pb->out_k_bytes;
		memset(o->k.data, 0xa5, pb->out_k_bytes);
		memset(o->v.data, 0xa5, pb->out_v_bytes);
		o->pos_stride = kept + 2;
		pb->pos_count = (size_t)hs * o->pos_stride;
		o->positions = track(pb, malloc(pb->pos_count * sizeof(int32_t)));
		memset(o->positions, 0xa5, pb->pos_count * sizeof(int32_t));
		if (o->k.block_table) { /* make_tensor's pool: the table's blocks + 3 */
			uint32_t bs = pb->block_size ? pb->block_size : 5;
			o->pool_blocks = (pb->out_cap + bs - 1) / bs + 3;
		}
		o->retained_mass = track(pb, malloc(hs * sizeof(float)));
		memset(o->retained_mass, 0xa5, hs * sizeof(float));
	}
}

static inline bool canary_intact(const struct prob *pb)
{
	uint32_t hs = pb->p.gqa == SKV_GQA_GROUP ? pb->sh.h_kv : pb->sh.h_q;
	for (uint32_t l = 0; l < pb->n_layers; l++) {
		const struct skv_layer_out *o = &pb->out[l];
		const uint8_t *a = o->k.data, *b = o->v.data, *c = (const uint8_t *)o->positions,
			      *d = (const uint8_t *)o->retained_mass;
		for (size_t i = 0; i < pb->out_k_bytes; i++)
			if (a[i] != 0xa5 || b[i] != 0xa5)
				return false;
		for (size_t i = 0; c && i < pb->pos_count * 4; i++)
			if (c[i] != 0xa5)
				return false;
		for (size_t i = 0; i < hs * 4; i++)
			if (d[i] != 0xa5)
				return false;
	}
	return true;
}

static inline void prob_free(struct prob *pb)
{
	for (uint32_t i = 0; i < pb->n_bufs; i++)
		free(pb->bufs[i]);
	free(pb->bufs);
	memset(pb, 0, sizeof(*pb));
}

static inline int prob_run(struct prob *pb, unsigned threads, struct skv_error *err)
{
	struct skv_ctx *ctx;
	struct skv_error e0;
	int r = skv_ctx_new(threads, &ctx);
	if (r)
		return r;
	r = skv_compact(ctx, &pb->sh, &pb->p, pb->n_layers, pb->in, pb->out, err ? err : &e0);
	skv_ctx_free(ctx);
	return r;
}

/*
 * Compare one run against the reference. Kept sets must be equal except
 * where the reference scores of the differing positions are within tol
 * (relative) of the top-k threshold; returns the number of such tolerated
 * swaps, or -1 on a real mismatch (CU asserts say where).
 */
static inline int prob_check(struct prob *pb, double tol, int *ret_tolerated)
{
	const struct skv_shape *s = &pb->sh;
	uint32_t G = s->h_q / s->h_kv;
	bool expand = pb->p.gqa == SKV_GQA_EXPAND;
	int tolerated = 0, bad = 0;

	for (uint32_t l = 0; l < pb->n_layers; l++) {
		struct ref_result rr;
		CU_ASSERT_FATAL(ref_compact(s, &pb->p, pb->q[l], pb->k[l], &rr) == 0);
		const struct skv_layer_out *o = &pb->out[l];
		for (uint32_t h = 0; h < rr.h_store; h++) {
			const int32_t *got = o->positions + (size_t)h * o->pos_stride;
			const int32_t *want = rr.pos + (size_t)h * rr.kept;
			uint32_t kvh = expand ? h / G : h;
			/* ascending, in range */
			for (uint32_t i = 0; i < rr.kept; i++) {
				if (got[i] < 0 || got[i] >= (int32_t)s->prompt_len ||
				    (i && got[i] <= got[i - 1])) {
					CU_FAIL("positions not ascending / out of range");
					bad++;
					break;
				}
			}
			if (memcmp(got, want, rr.kept * sizeof(int32_t))) {
				/* tolerate swaps at the top-k boundary only */
				const double *sc = rr.score + (size_t)h * s->prompt_len;
				double th = rr.thresh[h];
				uint32_t i = 0, j = 0;
				while (i < rr.kept || j < rr.kept) {
					int32_t a = i < rr.kept ? got[i] : INT32_MAX;
					int32_t b = j < rr.kept ? want[j] : INT32_MAX;
					int32_t x;
					if (a == b) {
						i++;
						j++;
						continue;
					}
					x = a < b ? a : b;
					if (a < b)
						i++;
					else
						j++;
					if (x >= (int32_t)s->prompt_len || sc[x] < 0 ||
					    fabs(sc[x] - th) > tol * fabs(th)) {
						fprintf(stderr,
							"\n  layer %u head %u: position %d differs "
							"(score %.9g, threshold %.9g)\n",
							l, h, x,
							x < (int32_t)s->prompt_len ? sc[x] : -1,
							th);
						bad++;
						break;
					}
					tolerated++;
				}
			}
			/* K/V rows come with their positions */
			for (uint32_t i = 0; i < rr.kept && !bad; i++) {
				uint32_t t = (uint32_t)got[i];
				for (uint32_t d = 0; d < s->head_dim; d++) {
					float ek = round_to(
					    pb->dout, pb->k[l][((size_t)kvh * s->prompt_len + t) *
								   s->head_dim +
							       d]);
					float ev = round_to(
					    pb->dout, pb->v[l][((size_t)kvh * s->prompt_len + t) *
								   s->head_dim +
							       d]);
					float gk = load_t(&o->k, toff(&o->k, h, i, d));
					float gv = load_t(&o->v, toff(&o->v, h, i, d));
					if (memcmp(&ek, &gk, 4) || memcmp(&ev, &gv, 4)) {
						fprintf(stderr,
							"\n  layer %u head %u slot %u dim %u: K/V "
							"%g/%g, want %g/%g\n",
							l, h, i, d, gk, gv, ek, ev);
						bad++;
						break;
					}
				}
			}
			double m = o->retained_mass[h], wm = rr.mass[h];
			if (isnan(wm)) {
				if (!isnan(m)) {
					fprintf(stderr, "\n  mass %g, want NaN\n", m);
					bad++;
				}
			} else if (!(fabs(m - wm) <= 1e-4 * fabs(wm) + 1e-5)) {
				fprintf(stderr, "\n  layer %u head %u: mass %.7g want %.7g\n", l, h,
					m, wm);
				bad++;
			}
		}
		ref_result_free(&rr);
	}
	if (ret_tolerated)
		*ret_tolerated = tolerated;
	return bad ? -1 : 0;
}

#endif
