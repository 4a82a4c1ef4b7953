// SPDX-License-Identifier: MIT
/*
 * skv.c - libskv: parameters, plan, validation, the thread pool, and the
 * per-item driver (scoring through the ISA kernels, pooling, top-k,
 * gather). Semantics are ../shared/SPEC.md's; decisions SPEC leaves open
 * are written where they are made.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "skv-internal.h"

/* Limits on what one call may describe; far above any real model. */
#define SKV_MAX_L	(1u << 22)
#define SKV_MAX_D	4096u
#define SKV_MAX_HEADS	4096u
#define SKV_MAX_KERNEL	255u
#define SKV_MAX_THREADS 1024u
#define SKV_MAX_LAYERS	65536u
/* Column sums kept between the phases of split mode, at most. */
#define SKV_SPLIT_BUDGET (256u << 20)
/* Logit buffer per thread: rows per block are chosen so that it fits. */
#define SKV_ZBUF_BUDGET (16u << 20)

/* ---------------------------------------------------------------- names */

size_t skv_dtype_size(enum skv_dtype dt)
{
	switch (dt) {
	case SKV_DTYPE_F32:
		return 4;
	case SKV_DTYPE_F16:
	case SKV_DTYPE_BF16:
		return 2;
	default:
		return 0;
	}
}

const char *skv_dtype_name(enum skv_dtype dt)
{
	switch (dt) {
	case SKV_DTYPE_F32:
		return "f32";
	case SKV_DTYPE_F16:
		return "f16";
	case SKV_DTYPE_BF16:
		return "bf16";
	default:
		return NULL;
	}
}

const char *skv_policy_name(enum skv_policy p)
{
	switch (p) {
	case SKV_POLICY_SNAPKV:
		return "snapkv";
	case SKV_POLICY_H2O:
		return "h2o";
	case SKV_POLICY_STREAMINGLLM:
		return "streamingllm";
	case SKV_POLICY_WINDOW:
		return "window";
	default:
		return NULL;
	}
}

/* ---------------------------------------------------------- conversions */

static inline uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

float skv_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;

	if (exp == 0x1f)
		return u2f(sign | 0x7f800000u | (man << 13));
	if (exp == 0) {
		if (man == 0)
			return u2f(sign);
		/* subnormal: value = man * 2^-24, exact in f32 */
		float v = (float)man * (1.0f / 16777216.0f);
		return sign ? -v : v;
	}
	return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t skv_f32_to_f16(float f)
{
	uint32_t u = f2u(f);
	uint32_t sign = (u >> 16) & 0x8000;
	uint32_t a = u & 0x7fffffffu;

	if (a >= 0x7f800000u) /* inf or nan (keep nan quiet and non-zero) */
		return (uint16_t)(sign | 0x7c00 |
				  (a > 0x7f800000u ? 0x200 | ((a >> 13) & 0x3ff) : 0));
	if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
		return (uint16_t)(sign | 0x7c00);
	if (a < 0x38800000u) {	     /* below 2^-14: subnormal half or zero */
		if (a < 0x33000000u) /* below 2^-25: rounds to zero */
			return (uint16_t)sign;
		uint32_t e = a >> 23;
		uint32_t m = (a & 0x7fffff) | 0x800000;
		uint32_t shift = 126 - e; /* 14 .. 24 */
		uint32_t v = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (v & 1)))
			v++;
		return (uint16_t)(sign | v);
	}
	uint32_t v = ((a >> 13) - (112u << 10));
	uint32_t rem = a & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (v & 1)))
		v++;
	return (uint16_t)(sign | v);
}

float skv_bf16_to_f32(uint16_t b)
{
	return u2f((uint32_t)b << 16);
}

uint16_t skv_f32_to_bf16(float f)
{
	uint32_t u = f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

/* --------------------------------------------------------------- errors */

__attribute__((format(printf, 4, 5))) static int fail(struct skv_error *err, int32_t layer,
						      int32_t head, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		err->layer = layer;
		err->head = head;
	}
	return -EINVAL;
}

/* ----------------------------------------------------------- parameters */

void skv_params_init(struct skv_params *p)
{
	/* static: its padding is zero too, as memset left it before */
	static const struct skv_params d = SKV_PARAMS_DEFAULTS;

	memcpy(p, &d, sizeof(*p));
}

static bool policy_scores(enum skv_policy p)
{
	return p == SKV_POLICY_SNAPKV || p == SKV_POLICY_H2O;
}

/*
 * Mark the positions every stored head keeps whatever the scores say:
 * sinks, protected ranges and (scoring policies) the recent W_keep. For the
 * non-scoring policies the rest of the budget then goes to the most recent
 * positions not already kept, so that a protected range shortens the recent
 * window instead of making the combination invalid. Returns the count.
 */
static uint32_t mark_forced(const struct skv_shape *sh, const struct skv_params *p, uint32_t sinks,
			    uint32_t w_keep, uint8_t *keep)
{
	uint32_t L = sh->prompt_len, n = 0;

	memset(keep, 0, L);
	for (uint32_t j = 0; j < sinks && j < L; j++)
		keep[j] = 1;
	for (uint32_t j = L - w_keep; j < L; j++)
		keep[j] = 1;
	for (uint32_t i = 0; i < p->n_protected; i++)
		for (uint32_t j = p->protected_ranges[i].begin; j < p->protected_ranges[i].end; j++)
			keep[j] = 1;
	for (uint32_t j = 0; j < L; j++)
		n += keep[j];
	return n;
}

/* Count of positions in the union of sinks and protected ranges, without a buffer. */
static uint64_t union_count(const struct skv_params *p, uint32_t sinks, uint32_t tail_begin,
			    uint32_t L)
{
	/* ranges: sinks [0,S), tail [tail_begin, L), protected; sort and merge */
	struct skv_range r[SKV_MAX_PROTECTED + 2];
	uint32_t n = 0;

	if (sinks)
		r[n++] = (struct skv_range){0, sinks};
	if (tail_begin < L)
		r[n++] = (struct skv_range){tail_begin, L};
	for (uint32_t i = 0; i < p->n_protected; i++)
		r[n++] = p->protected_ranges[i];
	for (uint32_t i = 1; i < n; i++) /* insertion sort by begin */
		for (uint32_t j = i; j > 0 && r[j].begin < r[j - 1].begin; j--) {
			struct skv_range t = r[j];
			r[j] = r[j - 1];
			r[j - 1] = t;
		}
	uint64_t count = 0;
	uint32_t cb = 0, ce = 0;
	bool open = false;
	for (uint32_t i = 0; i < n; i++) {
		if (open && r[i].begin <= ce) {
			if (r[i].end > ce)
				ce = r[i].end;
			continue;
		}
		if (open)
			count += ce - cb;
		cb = r[i].begin;
		ce = r[i].end;
		open = true;
	}
	if (open)
		count += ce - cb;
	return count;
}

int skv_plan(const struct skv_shape *sh, const struct skv_params *p, struct skv_plan *ret_plan,
	     struct skv_error *err)
{
	struct skv_plan pl = {0};

	if (!sh || !p)
		return fail(err, -1, -1, "shape and params are required");
	if (p->params_size != sizeof(*p))
		return fail(err, -1, -1, "params_size is %u, expected %zu (use skv_params_init)",
			    p->params_size, sizeof(*p));
	if (!skv_policy_name(p->policy))
		return fail(err, -1, -1, "unknown policy %d", (int)p->policy);
	if (p->pooling != SKV_POOL_AVG && p->pooling != SKV_POOL_MAX)
		return fail(err, -1, -1, "unknown pooling %d", (int)p->pooling);
	if (p->gqa != SKV_GQA_EXPAND && p->gqa != SKV_GQA_GROUP)
		return fail(err, -1, -1, "unknown gqa mode %d", (int)p->gqa);
	if (p->kernel == 0 || p->kernel % 2 == 0)
		return fail(err, -1, -1, "pooling kernel %u must be odd (1 = no pooling)",
			    p->kernel);
	if (p->kernel > SKV_MAX_KERNEL)
		return fail(err, -1, -1, "pooling kernel %u exceeds %u", p->kernel, SKV_MAX_KERNEL);
	if (p->capacity == 0)
		return fail(err, -1, -1, "capacity must be at least 1");
	if (sh->prompt_len == 0)
		return fail(err, -1, -1, "prompt length L must be at least 1");
	if (sh->prompt_len > SKV_MAX_L)
		return fail(err, -1, -1, "prompt length %u exceeds %u", sh->prompt_len, SKV_MAX_L);
	if (sh->head_dim == 0)
		return fail(err, -1, -1, "head_dim D must be at least 1");
	if (sh->head_dim > SKV_MAX_D)
		return fail(err, -1, -1, "head_dim %u exceeds %u", sh->head_dim, SKV_MAX_D);
	if (sh->h_q == 0 || sh->h_kv == 0)
		return fail(err, -1, -1, "h_q and h_kv must be at least 1");
	if (sh->h_q > SKV_MAX_HEADS)
		return fail(err, -1, -1, "h_q %u exceeds %u", sh->h_q, SKV_MAX_HEADS);
	if (sh->h_q % sh->h_kv != 0)
		return fail(err, -1, -1, "h_q %u is not a multiple of h_kv %u", sh->h_q, sh->h_kv);
	if (p->n_protected > SKV_MAX_PROTECTED)
		return fail(err, -1, -1, "%u protected ranges, at most %u", p->n_protected,
			    SKV_MAX_PROTECTED);

	uint32_t L = sh->prompt_len, C = p->capacity, W = p->window;
	for (uint32_t i = 0; i < p->n_protected; i++) {
		const struct skv_range *r = &p->protected_ranges[i];
		if (r->begin >= r->end)
			return fail(err, -1, -1, "protected range %u [%u, %u) is empty", i,
				    r->begin, r->end);
		if (r->end > L)
			return fail(err, -1, -1,
				    "protected range %u [%u, %u) ends past the prompt (L = %u)", i,
				    r->begin, r->end, L);
	}

	pl.h_store = p->gqa == SKV_GQA_EXPAND ? sh->h_q : sh->h_kv;
	pl.bypass = L < C;
	pl.kept = L < C ? L : C;

	switch (p->policy) {
	case SKV_POLICY_SNAPKV:
	case SKV_POLICY_H2O:
		if (p->policy == SKV_POLICY_SNAPKV && W == 0)
			return fail(err, -1, -1, "snapkv needs an observation window W >= 1");
		if (C <= W)
			return fail(err, -1, -1, "capacity C = %u must exceed the window W = %u", C,
				    W);
		if (W > L)
			return fail(err, -1, -1, "window W = %u exceeds the prompt length L = %u",
				    W, L);
		if (p->policy == SKV_POLICY_SNAPKV && sh->n_q != W)
			return fail(err, -1, -1,
				    "snapkv needs the last W = %u query rows, n_q is %u", W,
				    sh->n_q);
		if (p->policy == SKV_POLICY_H2O && sh->n_q != L)
			return fail(err, -1, -1, "h2o needs all L = %u query rows, n_q is %u", L,
				    sh->n_q);
		if (union_count(p, 0, L - W, L) > C)
			return fail(err, -1, -1,
				    "protected ranges plus the window W = %u exceed the capacity "
				    "C = %u",
				    W, C);
		pl.sinks = 0;
		pl.w_obs = p->policy == SKV_POLICY_SNAPKV ? W : L;
		pl.w_keep = W;
		break;
	case SKV_POLICY_STREAMINGLLM:
	case SKV_POLICY_WINDOW: {
		uint32_t S = p->policy == SKV_POLICY_STREAMINGLLM ? p->sinks : 0;
		if (S > C)
			return fail(err, -1, -1, "sinks S = %u exceed the capacity C = %u", S, C);
		if (sh->n_q > L)
			return fail(err, -1, -1, "n_q = %u query rows exceed L = %u", sh->n_q, L);
		uint64_t forced = union_count(p, S < L ? S : L, L, L);
		if (forced > C)
			return fail(err, -1, -1,
				    "protected ranges plus S = %u sinks exceed the capacity C = %u",
				    S, C);
		pl.sinks = S;
		pl.w_obs = 0;
		pl.w_keep = (uint32_t)(C - forced);
		break;
	}
	default:
		return fail(err, -1, -1, "unknown policy %d", (int)p->policy);
	}
	if (pl.bypass) {
		/* Nothing is scored: every position is kept as it is. */
		pl.sinks = 0;
		pl.w_obs = 0;
		pl.w_keep = L;
	}
	*ret_plan = pl;
	return 0;
}

/* --------------------------------------------------------------- ledger */

int skv_ledger_compute(const struct skv_ledger_in *in, struct skv_ledger *ret)
{
	struct skv_ledger l = {0};

	if (!in || !ret)
		return -EINVAL;
	if (!in->batch || !in->layers || !in->h_q || !in->h_kv || !in->head_dim ||
	    !in->dtype_bytes || !in->prompt_len || !in->capacity)
		return -EINVAL;
	if (in->h_q % in->h_kv || in->appended > in->reserve)
		return -EINVAL;
	if (in->gqa != SKV_GQA_EXPAND && in->gqa != SKV_GQA_GROUP)
		return -EINVAL;
	l.h_store = in->gqa == SKV_GQA_EXPAND ? in->h_q : in->h_kv;
	uint64_t kept = in->prompt_len < in->capacity ? in->prompt_len : in->capacity;
	uint64_t bnh_kv, bnh_st, t, full_tok, comp_tok;
	if (__builtin_add_overflow(in->prompt_len, in->appended, &full_tok) ||
	    __builtin_add_overflow(kept, in->appended, &comp_tok) ||
	    __builtin_mul_overflow(in->batch, in->layers, &t) ||
	    __builtin_mul_overflow(t, in->h_kv, &bnh_kv) ||
	    __builtin_mul_overflow(t, l.h_store, &bnh_st))
		return -EOVERFLOW;
	uint64_t ds;
	if (__builtin_mul_overflow(in->head_dim, in->dtype_bytes, &ds))
		return -EOVERFLOW;
	/* 2 * bnh * tok * ds, each product checked */
	if (__builtin_mul_overflow(bnh_kv, full_tok, &t) || __builtin_mul_overflow(t, ds, &t) ||
	    __builtin_mul_overflow(t, 2, &l.native_full))
		return -EOVERFLOW;
	if (__builtin_mul_overflow(bnh_st, comp_tok, &t) || __builtin_mul_overflow(t, ds, &t) ||
	    __builtin_mul_overflow(t, 2, &l.compact))
		return -EOVERFLOW;
	if (__builtin_mul_overflow(bnh_st, comp_tok, &t) || __builtin_mul_overflow(t, 4, &l.index))
		return -EOVERFLOW;
	if (__builtin_mul_overflow(bnh_st, in->reserve - in->appended, &t) ||
	    __builtin_mul_overflow(t, ds, &t) || __builtin_mul_overflow(t, 2, &l.reserved))
		return -EOVERFLOW;
	*ret = l;
	return 0;
}

static inline size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* ------------------------------------------------------------- tensors */

static inline const void *elem(const struct skv_tensor *t, uint32_t h, uint32_t tok, size_t esz)
{
	int64_t off;

	if (t->block_table)
		off = (int64_t)t->block_table[tok / t->block_size] * t->block_stride +
		      (int64_t)(tok % t->block_size) * t->token_stride +
		      (int64_t)h * t->head_stride;
	else
		off = (int64_t)tok * t->token_stride + (int64_t)h * t->head_stride;
	return (const char *)t->data + off * (int64_t)esz;
}

static int check_tensor(const struct skv_tensor *t, const char *what, uint32_t layer,
			uint32_t heads, uint32_t tokens, bool out, struct skv_error *err)
{
	if (!t->data)
		return fail(err, (int32_t)layer, -1, "layer %u: %s has no data", layer, what);
	if (!skv_dtype_size(t->dtype))
		return fail(err, (int32_t)layer, -1, "layer %u: %s has unknown dtype %d", layer,
			    what, (int)t->dtype);
	if (heads > 1 && t->head_stride == 0)
		return fail(err, (int32_t)layer, -1, "layer %u: %s has head_stride 0", layer, what);
	if (tokens > 1 && t->token_stride == 0 && (!t->block_table || t->block_size > 1))
		return fail(err, (int32_t)layer, -1, "layer %u: %s has token_stride 0", layer,
			    what);
	if (!t->block_table)
		return 0;
	if (out)
		return fail(err, (int32_t)layer, -1,
			    "layer %u: %s must be strided (no block table)", layer, what);
	if (t->block_size == 0)
		return fail(err, (int32_t)layer, -1, "layer %u: %s has block_size 0", layer, what);
	uint64_t need = ((uint64_t)tokens + t->block_size - 1) / t->block_size;
	if (need > t->n_blocks)
		return fail(err, (int32_t)layer, -1,
			    "layer %u: %s needs %llu blocks for %u tokens, table has %u", layer,
			    what, (unsigned long long)need, tokens, t->n_blocks);
	for (uint64_t b = 0; b < need; b++)
		if (t->block_table[b] < 0)
			return fail(err, (int32_t)layer, -1,
				    "layer %u: %s block_table[%llu] = %d is negative", layer, what,
				    (unsigned long long)b, t->block_table[b]);
	return 0;
}

/* ----------------------------------------------------------- the pool */

struct skv_ws {
	/* scoring */
	float *qt, *kt, *z, *f, *m, *s, *rowbuf, *colsum, *vote, *pooled;
	int32_t *trow;
	uint8_t *bad, *keep;
	uint64_t *key;
	int32_t *pos;
	struct skv_seg *segs;
	size_t cap; /* bytes in mem */
	void *mem;
};

struct skv_job;

struct skv_ctx {
	unsigned threads;
	const struct skv_isa *isa;
	pthread_t *tids;
	unsigned started;
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	uint64_t gen;
	unsigned busy;
	bool stop;
	struct skv_job *job;
	struct skv_ws *ws;
	void *common; /* call-wide scratch (skv_compact) */
	size_t common_cap;
};

struct skv_item_err {
	int rc;
	int32_t head;
	int32_t kvh;
};

struct skv_job {
	const struct skv_shape *sh;
	const struct skv_params *p;
	const struct skv_plan *pl;
	const struct skv_layer_in *in;
	const struct skv_layer_out *out;
	const struct skv_isa *isa;
	uint32_t n_items;
	unsigned nth; /* threads taking part */
	atomic_uint next;
	struct skv_item_err *errs;
	/* the phase run by the pool and its unit count */
	enum { PH_ITEMS, PH_SCORE_HEADS, PH_FINISH } phase;
	uint32_t n_units;
	float *cs;		    /* split mode: [item][G][L] column sums    */
	struct skv_item_err *uerrs; /* split mode: per (item, g) scoring status */
	/* derived */
	uint32_t G, n_obs; /* rows per query head that vote (0: no scoring) */
	uint32_t P;	   /* prefix: candidates are j < P                  */
	uint32_t rb;	   /* rows per block, multiple of SKV_ROWPAD        */
	uint32_t budget;   /* positions filled by top-k                     */
	bool score, select;
	const uint8_t *base_keep; /* forced positions                      */
	const int32_t *base_pos;  /* kept positions when nothing is chosen */
	float scale;
};

/*
 * Lay out a thread's scratch for a job: with base = NULL only count the
 * bytes; else point w's fields into base. One list, so the two agree.
 * Buffers of the scoring and selection stages exist only when they run.
 */
static size_t ws_layout(struct skv_ws *w, const struct skv_job *j, char *base)
{
	const size_t L = j->sh->prompt_len, D = j->sh->head_dim, rb = j->rb, G = j->G;
	const size_t nt = (L + SKV_TILE - 1) / SKV_TILE;
	const size_t sc = j->score ? 1 : 0, se = j->select ? 1 : 0;
	size_t n = 0;

#define T(field, type, count)                                                                      \
	do {                                                                                       \
		if (base)                                                                          \
			w->field = (type *)(base + n);                                             \
		n += ((size_t)(count) * sizeof(type) + 63) & ~(size_t)63;                          \
	} while (0)
	T(qt, float, (sc * D * rb));		  /* packed query rows, [D][rb]    */
	T(kt, float, (sc * SKV_TILE * D));	  /* key tile, f32                 */
	T(z, float, (sc * L * rb));		  /* exp(z - m_tile), [L][rb]      */
	T(f, float, (sc * nt * rb));		  /* tile maxima, then factors     */
	T(m, float, (sc * rb));			  /* running max per row           */
	T(s, float, (sc * rb));			  /* running sum per row           */
	T(rowbuf, float, (D));			  /* one converted row             */
	T(colsum, float, (sc * G * L));		  /* column sums per query head    */
	T(vote, float, (sc * L));		  /* group votes                   */
	T(pooled, float, (se * L));		  /* pooled votes                  */
	T(trow, int32_t, (sc * rb));		  /* last visible key per row      */
	T(bad, uint8_t, (sc * rb));		  /* NaN/Inf seen per row          */
	T(keep, uint8_t, (se * L));		  /* kept flags                    */
	T(key, uint64_t, (se * L));		  /* ranking keys                  */
	T(pos, int32_t, (se * L));		  /* kept positions                */
	T(segs, struct skv_seg, (sc * (G + rb))); /* rows of each head         */
#undef T
	return n;
}

static int ws_reserve(struct skv_ws *w, const struct skv_job *j)
{
	size_t need = ws_layout(w, j, NULL);

	if (need > w->cap) {
		void *m = NULL;
		if (posix_memalign(&m, 64, need))
			return -ENOMEM;
		free(w->mem);
		w->mem = m;
		w->cap = need;
	}
	ws_layout(w, j, w->mem);
	return 0;
}

static void run_items(struct skv_ctx *ctx, unsigned tid);

static void *worker(void *arg)
{
	struct skv_ctx *ctx = ((void **)arg)[0];
	unsigned tid = (unsigned)(uintptr_t)((void **)arg)[1];
	uint64_t seen = 0;

	free(arg);
	pthread_mutex_lock(&ctx->mu);
	for (;;) {
		while (!ctx->stop && ctx->gen == seen)
			pthread_cond_wait(&ctx->go, &ctx->mu);
		if (ctx->stop)
			break;
		seen = ctx->gen;
		pthread_mutex_unlock(&ctx->mu);
		run_items(ctx, tid);
		pthread_mutex_lock(&ctx->mu);
		if (--ctx->busy == 0)
			pthread_cond_signal(&ctx->done);
	}
	pthread_mutex_unlock(&ctx->mu);
	return NULL;
}

static const struct skv_isa *pick_isa(void)
{
	const char *force = getenv("SKV_ISA");

	__builtin_cpu_init();
	bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
		      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
	bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
		    __builtin_cpu_supports("f16c");
	/* SKV_ISA may only lower the choice (tests compare the paths). */
	if (force && !strcmp(force, "scalar"))
		return &skv_isa_scalar;
	if (force && !strcmp(force, "avx2"))
		return has2 ? &skv_isa_avx2 : &skv_isa_scalar;
	if (force && !strcmp(force, "avx512"))
		return has512 ? &skv_isa_avx512 : has2 ? &skv_isa_avx2 : &skv_isa_scalar;
	if (has512)
		return &skv_isa_avx512;
	if (has2)
		return &skv_isa_avx2;
	return &skv_isa_scalar;
}

void skv_ctx_free(struct skv_ctx *ctx)
{
	if (!ctx)
		return;
	if (ctx->started) {
		pthread_mutex_lock(&ctx->mu);
		ctx->stop = true;
		pthread_cond_broadcast(&ctx->go);
		pthread_mutex_unlock(&ctx->mu);
		for (unsigned i = 0; i < ctx->started; i++)
			pthread_join(ctx->tids[i], NULL);
	}
	pthread_mutex_destroy(&ctx->mu);
	pthread_cond_destroy(&ctx->go);
	pthread_cond_destroy(&ctx->done);
	if (ctx->ws)
		for (unsigned i = 0; i < ctx->threads; i++)
			free(ctx->ws[i].mem);
	free(ctx->ws);
	free(ctx->tids);
	free(ctx->common);
	free(ctx);
}

int skv_ctx_new(unsigned threads, struct skv_ctx **ret_ctx)
{
	struct skv_ctx *ctx;

	if (!ret_ctx)
		return -EINVAL;
	if (threads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		threads = n > 0 ? (unsigned)n : 1;
	}
	if (threads > SKV_MAX_THREADS)
		threads = SKV_MAX_THREADS;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	pthread_mutex_init(&ctx->mu, NULL);
	pthread_cond_init(&ctx->go, NULL);
	pthread_cond_init(&ctx->done, NULL);
	ctx->threads = threads;
	ctx->isa = pick_isa();
	ctx->ws = calloc(threads, sizeof(*ctx->ws));
	ctx->tids = calloc(threads, sizeof(*ctx->tids));
	if (!ctx->ws || !ctx->tids) {
		skv_ctx_free(ctx);
		return -ENOMEM;
	}
	for (unsigned i = 1; i < threads; i++) {
		void **arg = malloc(2 * sizeof(void *));
		if (!arg) {
			skv_ctx_free(ctx);
			return -ENOMEM;
		}
		arg[0] = ctx;
		arg[1] = (void *)(uintptr_t)i;
		int r = pthread_create(&ctx->tids[ctx->started], NULL, worker, arg);
		if (r) {
			free(arg);
			skv_ctx_free(ctx);
			return -r;
		}
		ctx->started++;
	}
	*ret_ctx = ctx;
	return 0;
}

unsigned skv_ctx_threads(const struct skv_ctx *ctx)
{
	return ctx ? ctx->threads : 0;
}

const char *skv_ctx_isa(const struct skv_ctx *ctx)
{
	return ctx ? ctx->isa->name : NULL;
}

/* ------------------------------------------------------------- scoring */

/*
 * Logits, full causal softmax and per-column sums of the attention weights
 * for the n_obs rows of query heads g0 .. g1-1 of K/V head kvh:
 * colsum[(g - g0) * L + j] = sum over rows t of a[t][j]. Row i of head g is
 * at position t = L - n_obs + i. Returns 0 or -EDOM with *bad_g the first
 * query head (within the group) with a NaN/Inf logit.
 *
 * Rows go through in blocks of at most jb->rb: whole heads while they fit,
 * else chunks of one head. Every row's arithmetic is independent of the
 * other rows of its block, and each head's rows are cut into the same
 * chunks whatever g0 and g1 are, so scoring heads one at a time (split mode)
 * gives the same bits as scoring the whole group at once.
 */
static int score_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
		      uint32_t g0, uint32_t g1, float *colsum, uint32_t *bad_g)
{
	const struct skv_shape *sh = jb->sh;
	const struct skv_layer_in *in = &jb->in[layer];
	const struct skv_isa *isa = jb->isa;
	const uint32_t L = sh->prompt_len, D = sh->head_dim, G = jb->G, n_obs = jb->n_obs;
	const uint32_t rb = jb->rb;
	const size_t qes = skv_dtype_size(in->q.dtype), kes = skv_dtype_size(in->k.dtype);
	uint32_t gb = g0, i0 = 0;

	memset(colsum, 0, (size_t)(g1 - g0) * L * sizeof(float));
	while (gb < g1) {
		/* this block: heads [gb, ge), rows [ib, ie) of each */
		uint32_t ge, ib, ie;
		if (n_obs <= rb) {
			ge = gb + rb / n_obs < g1 ? gb + rb / n_obs : g1;
			ib = 0;
			ie = n_obs;
		} else {
			ge = gb + 1;
			ib = i0;
			ie = n_obs - i0 < rb ? n_obs : i0 + rb;
		}
		const uint32_t per = ie - ib, rows = (ge - gb) * per;
		uint32_t rbp = (rows + SKV_ROWPAD - 1) / SKV_ROWPAD * SKV_ROWPAD;
		uint32_t ext = 0, n_segs = 0;

		/* pack the block's query rows, transposed, zero padding rows */
		for (uint32_t r = 0; r < rbp; r++) {
			if (r >= rows) {
				for (uint32_t d = 0; d < D; d++)
					w->qt[(size_t)d * rbp + r] = 0.0f;
				w->trow[r] = INT32_MAX;
				continue;
			}
			uint32_t g = gb + r / per, i = ib + r % per;
			uint32_t t = L - n_obs + i;
			const void *qrow = elem(&in->q, kvh * G + g, sh->n_q - n_obs + i, qes);
			isa->to_f32(qrow, in->q.dtype, w->rowbuf, D);
			for (uint32_t d = 0; d < D; d++)
				w->qt[(size_t)d * rbp + r] = w->rowbuf[d];
			w->trow[r] = (int32_t)t;
			if (t + 1 > ext)
				ext = t + 1;
			if (n_segs && w->segs[n_segs - 1].g == g - g0)
				w->segs[n_segs - 1].end = r + 1;
			else
				w->segs[n_segs++] = (struct skv_seg){g - g0, r, r + 1};
			w->bad[r] = 0;
		}
		for (uint32_t r = rows; r < rbp; r++)
			w->bad[r] = 0;
		int32_t trow_min = INT32_MAX;
		for (uint32_t r = 0; r < rbp; r++) {
			w->m[r] = -INFINITY;
			w->s[r] = 0.0f;
			trow_min = w->trow[r] < trow_min ? w->trow[r] : trow_min;
		}

		uint32_t nt = 0;
		for (uint32_t j0 = 0; j0 < ext; j0 += SKV_TILE, nt++) {
			uint32_t nk = ext - j0 < SKV_TILE ? ext - j0 : SKV_TILE;
			/* Copy/convert the tile into L1 even for f32: the micro-kernel
			 * reads its keys with a broadcast pattern the prefetchers do not
			 * follow from DRAM, a plain sequential copy they do (measured). */
			const float *kt = w->kt;
			for (uint32_t j = 0; j < nk; j++)
				isa->to_f32(elem(&in->k, kvh, j0 + j, kes), in->k.dtype,
					    w->kt + (size_t)j * D, D);
			struct skv_tile_args ta = {
			    .qt = w->qt,
			    .kt = kt,
			    .z = w->z + (size_t)j0 * rbp,
			    .m = w->m,
			    .s = w->s,
			    .tmax = w->f + (size_t)nt * rbp,
			    .bad = w->bad,
			    .trow = w->trow,
			    .rbp = rbp,
			    .d = D,
			    .nk = nk,
			    .j0 = j0,
			    .scale = jb->scale,
			    .trow_min = trow_min,
			};
			isa->tile(&ta);
		}
		for (uint32_t r = 0; r < rows; r++)
			if (w->bad[r]) {
				*bad_g = gb + r / per;
				return -EDOM;
			}
		isa->factors(w->f, w->m, w->s, nt, rbp);
		struct skv_votes_args va = {
		    .e = w->z,
		    .f = w->f,
		    .colsum = colsum,
		    .segs = w->segs,
		    .n_segs = n_segs,
		    .rbp = rbp,
		    .ext = ext,
		    .colsum_stride = L,
		};
		isa->votes(&va);
		if (n_obs <= rb) {
			gb = ge;
		} else if ((i0 = ie) == n_obs) {
			gb++;
			i0 = 0;
		}
	}
	return 0;
}

/* ----------------------------------------------------------- selection */

static void pool(const struct skv_params *p, uint32_t kernel, const float *v, float *out,
		 uint32_t P)
{
	const uint32_t h = kernel / 2;

	if (kernel == 1) {
		memcpy(out, v, (size_t)P * sizeof(float));
		return;
	}
	/* edges: only in-range neighbours (avg counts the padding as 0) */
	for (uint32_t j = 0; j < P; j++) {
		if (j == h && P > 2 * h) {
			j = P - h - 1; /* interior done below */
			continue;
		}
		uint32_t a = j < h ? 0 : j - h, b = j + h >= P ? P - 1 : j + h;
		float acc = v[a], mx = v[a];
		for (uint32_t i = a + 1; i <= b; i++) {
			acc += v[i];
			mx = v[i] > mx ? v[i] : mx;
		}
		out[j] = p->pooling == SKV_POOL_AVG ? acc / (float)kernel : mx;
	}
	if (P <= 2 * h)
		return;
	/* interior [h, P - h): the same left-to-right order, as vectorisable loops */
	const uint32_t n = P - 2 * h;
	float *o = out + h;
	memcpy(o, v, (size_t)n * sizeof(float));
	if (p->pooling == SKV_POOL_AVG) {
		for (uint32_t i = 1; i < kernel; i++)
			for (uint32_t j = 0; j < n; j++)
				o[j] += v[j + i];
		const float k = (float)kernel;
		for (uint32_t j = 0; j < n; j++)
			o[j] /= k;
	} else {
		for (uint32_t i = 1; i < kernel; i++)
			for (uint32_t j = 0; j < n; j++)
				o[j] = v[j + i] > o[j] ? v[j + i] : o[j];
	}
}

/*
 * Ranking keys: higher is better. The score's bits, made monotonic as an
 * unsigned integer, above the complement of the position, so that equal
 * scores rank the smaller position first. One integer compare per step.
 */
static inline uint64_t rank_key(float score, uint32_t pos)
{
	uint32_t u;
	memcpy(&u, &score, 4);
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return (uint64_t)u << 32 | (uint32_t)~pos;
}

/* Rearrange key[0..n) so that its first k entries are the k largest (quickselect). */
static void select_top(uint64_t *key, uint32_t n, uint32_t k)
{
	uint32_t lo = 0, hi = n; /* [0, lo) best, [hi, n) worst, k in [lo, hi] */

	while (hi - lo > 1) {
		/* median of three as pivot, moved to the end (deterministic) */
		uint32_t ia = lo, ib = lo + (hi - lo) / 2, ic = hi - 1, ip;
		uint64_t a = key[ia], b = key[ib], c = key[ic], t;
		if (a > b)
			ip = b > c ? ib : (a > c ? ic : ia);
		else
			ip = a > c ? ia : (b > c ? ic : ib);
		t = key[ip];
		key[ip] = key[hi - 1];
		key[hi - 1] = t;
		uint64_t pv = t;
		uint32_t st = lo;
		/* branchless Lomuto: [lo, st) better, [st, i) not */
		for (uint32_t i = lo; i < hi - 1; i++) {
			uint64_t x = key[i];
			key[i] = key[st];
			key[st] = x;
			st += x > pv;
		}
		key[hi - 1] = key[st];
		key[st] = pv;
		/* [lo, st) better than the pivot at st, (st, hi) worse */
		if (k == st || k == st + 1)
			return;
		if (k < st)
			hi = st;
		else
			lo = st + 1;
	}
}

/* Positions kept for one stored head into w->pos (ascending); returns count. */
static uint32_t choose(const struct skv_job *jb, struct skv_ws *w, const float *votes)
{
	const uint32_t L = jb->sh->prompt_len, P = jb->P;
	uint32_t kernel = jb->p->policy == SKV_POLICY_H2O ? 1 : jb->p->kernel;
	uint32_t n = 0, cnt = 0;

	memcpy(w->keep, jb->base_keep, L);
	pool(jb->p, kernel, votes, w->pooled, P);
	uint32_t k = jb->budget;
	if (k >= P) { /* everything left fits (L == C) */
		memset(w->keep, 1, P);
	} else {
		for (uint32_t j = 0; j < P; j++)
			if (!w->keep[j])
				w->key[n++] = rank_key(w->pooled[j], j);
		if (k > n)
			k = n;
		if (k < n)
			select_top(w->key, n, k);
		for (uint32_t i = 0; i < k; i++)
			w->keep[~(uint32_t)w->key[i]] = 1;
	}
	for (uint32_t j = 0; j < L; j++)
		if (w->keep[j])
			w->pos[cnt++] = (int32_t)j;
	return cnt;
}

/* ---------------------------------------------------------------- gather */

static void copy_row(const struct skv_isa *isa, float *tmp, const void *src, enum skv_dtype sdt,
		     void *dst, enum skv_dtype ddt, uint32_t D)
{
	if (sdt == ddt) {
		isa->copy(dst, src, (size_t)D * skv_dtype_size(sdt));
		return;
	}
	isa->to_f32(src, sdt, tmp, D);
	if (ddt == SKV_DTYPE_F32) {
		memcpy(dst, tmp, (size_t)D * 4);
	} else if (ddt == SKV_DTYPE_F16) {
		uint16_t *o = dst;
		for (uint32_t d = 0; d < D; d++)
			o[d] = skv_f32_to_f16(tmp[d]);
	} else {
		uint16_t *o = dst;
		for (uint32_t d = 0; d < D; d++)
			o[d] = skv_f32_to_bf16(tmp[d]);
	}
}

static void emit(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
		 uint32_t h, const int32_t *pos, uint32_t cnt, float mass)
{
	const struct skv_layer_in *in = &jb->in[layer];
	const struct skv_layer_out *out = &jb->out[layer];
	const uint32_t D = jb->sh->head_dim;
	size_t kes = skv_dtype_size(in->k.dtype), ves = skv_dtype_size(in->v.dtype);
	size_t oks = skv_dtype_size(out->k.dtype), ovs = skv_dtype_size(out->v.dtype);

	for (uint32_t i = 0; i < cnt; i++) {
		uint32_t t = (uint32_t)pos[i];
		out->positions[(size_t)h * out->pos_stride + i] = pos[i];
		copy_row(jb->isa, w->rowbuf, elem(&in->k, kvh, t, kes), in->k.dtype,
			 (void *)elem(&out->k, h, i, oks), out->k.dtype, D);
		copy_row(jb->isa, w->rowbuf, elem(&in->v, kvh, t, ves), in->v.dtype,
			 (void *)elem(&out->v, h, i, ovs), out->v.dtype, D);
	}
	if (out->retained_mass)
		out->retained_mass[h] = mass;
}

static float mass_of(const float *colsum, const int32_t *pos, uint32_t cnt, uint32_t rows)
{
	double acc = 0.0;

	for (uint32_t i = 0; i < cnt; i++)
		acc += colsum[pos[i]];
	return (float)(acc / rows);
}

/* group votes: the G heads' column sums averaged, in a fixed order */
static void group_votes(const struct skv_job *jb, struct skv_ws *w, const float *colsum)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len;

	for (uint32_t j = 0; j < L; j++) {
		float acc = 0.0f;
		for (uint32_t q = 0; q < G; q++)
			acc += colsum[(size_t)q * L + j];
		w->vote[j] = acc / (float)G;
	}
}

/*
 * Selection, gather and retained mass for the stored heads of one item,
 * given the column sums of its G query heads ([G][L], unused when nothing
 * was scored). gq: one query head only (expand mode), or -1 for all.
 */
static void finish_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
			const float *colsum, int gq)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len;
	const bool expand = jb->p->gqa == SKV_GQA_EXPAND;
	const uint32_t kept = jb->pl->kept;
	const uint32_t ga = gq < 0 ? 0 : (uint32_t)gq;
	const uint32_t gz = gq < 0 ? (expand ? G : 1) : (uint32_t)gq + 1;

	if (!jb->score || !jb->select) {
		/* the same positions for every head: bypass or no scoring */
		for (uint32_t g = ga; g < gz; g++) {
			uint32_t h = expand ? kvh * G + g : kvh;
			float mass;
			if (jb->pl->bypass) {
				mass = 1.0f;
			} else if (!jb->score) {
				mass = NAN;
			} else if (expand) {
				mass =
				    mass_of(colsum + (size_t)g * L, jb->base_pos, kept, jb->n_obs);
			} else {
				group_votes(jb, w, colsum);
				mass = mass_of(w->vote, jb->base_pos, kept, jb->n_obs);
			}
			emit(jb, w, layer, kvh, h, jb->base_pos, kept, mass);
		}
		return;
	}
	if (expand) {
		for (uint32_t g = ga; g < gz; g++) {
			const float *v = colsum + (size_t)g * L;
			uint32_t cnt = choose(jb, w, v);
			emit(jb, w, layer, kvh, kvh * G + g, w->pos, cnt,
			     mass_of(v, w->pos, cnt, jb->n_obs));
		}
	} else {
		/* group: the G heads' votes are averaged before pooling */
		group_votes(jb, w, colsum);
		uint32_t cnt = choose(jb, w, w->vote);
		emit(jb, w, layer, kvh, kvh, w->pos, cnt, mass_of(w->vote, w->pos, cnt, jb->n_obs));
	}
}

static int run_item(const struct skv_job *jb, struct skv_ws *w, uint32_t item, int32_t *ret_head)
{
	const uint32_t layer = item / jb->sh->h_kv, kvh = item % jb->sh->h_kv;

	if (jb->score) {
		uint32_t bad_g = 0;
		int r = score_item(jb, w, layer, kvh, 0, jb->G, w->colsum, &bad_g);
		if (r < 0) {
			*ret_head = (int32_t)(kvh * jb->G + bad_g);
			return r;
		}
	}
	finish_item(jb, w, layer, kvh, w->colsum, -1);
	return 0;
}

static void run_unit(struct skv_job *jb, struct skv_ws *w, uint32_t u)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len, h_kv = jb->sh->h_kv;

	switch (jb->phase) {
	case PH_ITEMS: {
		int32_t head = -1;
		jb->errs[u].rc = run_item(jb, w, u, &head);
		jb->errs[u].head = head;
		break;
	}
	case PH_SCORE_HEADS: { /* split mode: unit = (item, g) */
		uint32_t item = u / G, g = u % G, bad_g = 0;
		jb->uerrs[u].rc = score_item(jb, w, item / h_kv, item % h_kv, g, g + 1,
					     jb->cs + (size_t)u * L, &bad_g);
		break;
	}
	case PH_FINISH: { /* split mode: unit = (item, g) in expand, item in group */
		bool expand = jb->p->gqa == SKV_GQA_EXPAND;
		uint32_t item = expand ? u / G : u;
		if (jb->errs[item].rc < 0)
			break;
		finish_item(jb, w, item / h_kv, item % h_kv, jb->cs + (size_t)item * G * L,
			    expand ? (int)(u % G) : -1);
		break;
	}
	}
}

static void run_items(struct skv_ctx *ctx, unsigned tid)
{
	struct skv_job *jb = ctx->job;

	if (tid >= jb->nth) /* its scratch was not sized for this job */
		return;
	for (;;) {
		uint32_t u = atomic_fetch_add_explicit(&jb->next, 1, memory_order_relaxed);
		if (u >= jb->n_units)
			break;
		run_unit(jb, &ctx->ws[tid], u);
	}
	jb->isa->fence(); /* streamed output stores are visible before we return */
}

/* Run one phase of the job on the pool, the calling thread included. */
static void run_phase(struct skv_ctx *ctx, struct skv_job *jb, int phase, uint32_t n_units)
{
	jb->phase = phase;
	jb->n_units = n_units;
	atomic_store(&jb->next, 0);
	ctx->job = jb;
	if (jb->nth > 1) {
		pthread_mutex_lock(&ctx->mu);
		ctx->gen++;
		/* every worker wakes; those at or past nth return at once */
		ctx->busy = ctx->started;
		pthread_cond_broadcast(&ctx->go);
		pthread_mutex_unlock(&ctx->mu);
	}
	run_items(ctx, 0);
	if (jb->nth > 1) {
		pthread_mutex_lock(&ctx->mu);
		while (ctx->busy)
			pthread_cond_wait(&ctx->done, &ctx->mu);
		pthread_mutex_unlock(&ctx->mu);
	}
	ctx->job = NULL;
}

/* --------------------------------------------------------------- compact */

/* How a call is laid out: derived from shape, params and plan alone, so that
 * skv_scratch_bytes() and skv_compact() cannot disagree. */
struct skv_sizing {
	bool split;   /* score query heads as separate units          */
	unsigned nth; /* threads taking part, each with its scratch   */
	size_t o_pos, o_errs, o_cs, o_uerrs;
	size_t common; /* call-wide scratch bytes                      */
};

static void job_derive(const struct skv_shape *sh, const struct skv_params *p,
		       const struct skv_plan *pl, uint32_t n_layers, unsigned threads,
		       struct skv_job *jb, struct skv_sizing *sz)
{
	const uint32_t L = sh->prompt_len, G = sh->h_q / sh->h_kv;

	*jb = (struct skv_job){
	    .sh = sh,
	    .p = p,
	    .pl = pl,
	    .n_items = n_layers * sh->h_kv,
	    .G = G,
	    .scale = (float)(1.0 / __builtin_sqrt((double)sh->head_dim)),
	};
	jb->score = !pl->bypass && (policy_scores(p->policy) || sh->n_q > 0);
	jb->select = !pl->bypass && policy_scores(p->policy);
	jb->n_obs = !jb->score			     ? 0
		    : p->policy == SKV_POLICY_SNAPKV ? p->window
		    : p->policy == SKV_POLICY_H2O    ? L
						     : sh->n_q;

	/*
	 * Fewer items than threads (one layer on a big machine): score the query
	 * heads of each item as separate units, then select. Same bits as the
	 * item-at-a-time path (score_item), G times the key traffic.
	 */
	sz->split = jb->score && G > 1 && jb->n_items < threads &&
		    (uint64_t)jb->n_items * G * L * 4 <= SKV_SPLIT_BUDGET;

	/* call-wide scratch, held by the context: forced positions, the full list
	 * when nothing is chosen, per-item status, split mode's column sums */
	sz->o_pos = align64(L);
	sz->o_errs = sz->o_pos + align64((size_t)L * 4);
	sz->o_cs = sz->o_errs + align64((size_t)jb->n_items * sizeof(struct skv_item_err));
	sz->o_uerrs = sz->o_cs + (sz->split ? align64((size_t)jb->n_items * G * L * 4) : 0);
	sz->common =
	    sz->o_uerrs + (sz->split ? (size_t)jb->n_items * G * sizeof(struct skv_item_err) : 0);

	/* rows per block: as many as keep the logit buffer in budget */
	if (jb->score) {
		uint64_t M = (uint64_t)G * jb->n_obs;
		uint64_t rb = SKV_ZBUF_BUDGET / ((uint64_t)L * 4);
		rb = rb / SKV_ROWPAD * SKV_ROWPAD;
		if (rb < SKV_ROWPAD)
			rb = SKV_ROWPAD;
		uint64_t mp = (M + SKV_ROWPAD - 1) / SKV_ROWPAD * SKV_ROWPAD;
		jb->rb = (uint32_t)(rb < mp ? rb : mp);
	} else {
		jb->rb = SKV_ROWPAD;
	}
	uint32_t max_units = sz->split ? jb->n_items * G : jb->n_items;
	sz->nth = threads < max_units ? threads : max_units;
}

int skv_scratch_bytes(const struct skv_shape *sh, const struct skv_params *p, uint32_t n_layers,
		      unsigned threads, uint64_t *ret_bytes, struct skv_error *err)
{
	struct skv_plan pl;
	struct skv_job jb;
	struct skv_sizing sz;
	struct skv_ws w;
	int r;

	if (err) {
		err->msg[0] = 0;
		err->layer = -1;
		err->head = -1;
	}
	r = skv_plan(sh, p, &pl, err);
	if (r < 0)
		return r;
	if (n_layers > SKV_MAX_LAYERS)
		return fail(err, -1, -1, "%u layers exceed %u", n_layers, SKV_MAX_LAYERS);
	if (!ret_bytes)
		return fail(err, -1, -1, "no result pointer");
	if (threads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		threads = n > 0 ? (unsigned)n : 1;
	}
	if (n_layers == 0) {
		*ret_bytes = 0;
		return 0;
	}
	job_derive(sh, p, &pl, n_layers, threads, &jb, &sz);
	*ret_bytes = (uint64_t)sz.common + (uint64_t)sz.nth * ws_layout(&w, &jb, NULL);
	return 0;
}

int skv_compact(struct skv_ctx *ctx, const struct skv_shape *sh, const struct skv_params *p,
		uint32_t n_layers, const struct skv_layer_in *in, const struct skv_layer_out *out,
		struct skv_error *err)
{
	struct skv_plan pl;
	int r;

	if (err) {
		err->msg[0] = 0;
		err->layer = -1;
		err->head = -1;
	}
	if (!ctx)
		return fail(err, -1, -1, "no context");
	r = skv_plan(sh, p, &pl, err);
	if (r < 0)
		return r;
	if (n_layers == 0)
		return 0;
	if (n_layers > SKV_MAX_LAYERS)
		return fail(err, -1, -1, "%u layers exceed %u", n_layers, SKV_MAX_LAYERS);
	if (!in || !out)
		return fail(err, -1, -1, "layer inputs and outputs are required");

	const uint32_t L = sh->prompt_len, G = sh->h_q / sh->h_kv;
	struct skv_job jb;
	struct skv_sizing sz;

	job_derive(sh, p, &pl, n_layers, ctx->threads, &jb, &sz);
	jb.in = in;
	jb.out = out;
	jb.isa = ctx->isa;

	for (uint32_t l = 0; l < n_layers; l++) {
		const struct skv_layer_out *o = &out[l];
		if (jb.score) {
			r = check_tensor(&in[l].q, "q", l, sh->h_q, sh->n_q, false, err);
			if (r < 0)
				return r;
		}
		r = check_tensor(&in[l].k, "k", l, sh->h_kv, L, false, err);
		if (!r)
			r = check_tensor(&in[l].v, "v", l, sh->h_kv, L, false, err);
		if (!r)
			r = check_tensor(&o->k, "output k", l, pl.h_store, pl.kept, true, err);
		if (!r)
			r = check_tensor(&o->v, "output v", l, pl.h_store, pl.kept, true, err);
		if (r < 0)
			return r;
		if (!o->positions)
			return fail(err, (int32_t)l, -1, "layer %u: no positions output", l);
		if (o->pos_stride < pl.kept && pl.h_store > 1)
			return fail(err, (int32_t)l, -1,
				    "layer %u: pos_stride %u is below the kept count %u", l,
				    o->pos_stride, pl.kept);
	}

	/*
	 * Fewer items than threads (one layer on a big machine): score the query
	 * heads of each item as separate units, then select. Same bits as the
	 * item-at-a-time path (score_item), G times the key traffic.
	 */
	const bool split = sz.split;
	size_t o_pos = sz.o_pos, o_errs = sz.o_errs, o_cs = sz.o_cs, o_uerrs = sz.o_uerrs;
	size_t total = sz.common;
	if (total > ctx->common_cap) {
		void *m = NULL;
		if (posix_memalign(&m, 64, total))
			return fail(err, -1, -1, "out of memory for scratch"), -ENOMEM;
		free(ctx->common);
		ctx->common = m;
		ctx->common_cap = total;
	}
	char *cm = ctx->common;
	uint8_t *base_keep = (uint8_t *)cm;
	int32_t *base_pos = (int32_t *)(cm + o_pos);
	struct skv_item_err *errs = (struct skv_item_err *)(cm + o_errs);
	memset(errs, 0, (size_t)jb.n_items * sizeof(*errs));
	if (split) {
		jb.cs = (float *)(cm + o_cs);
		jb.uerrs = (struct skv_item_err *)(cm + o_uerrs);
		memset(jb.uerrs, 0, (size_t)jb.n_items * G * sizeof(*jb.uerrs));
	}
	if (pl.bypass) {
		memset(base_keep, 1, L);
	} else if (jb.select) {
		jb.P = L - pl.w_keep;
		uint32_t forced = mark_forced(sh, p, 0, pl.w_keep, base_keep);
		jb.budget = pl.kept - forced;
	} else {
		uint32_t forced = mark_forced(sh, p, pl.sinks, 0, base_keep);
		uint32_t fill = pl.kept - forced;
		for (uint32_t j = L; j-- > 0 && fill;)
			if (!base_keep[j]) {
				base_keep[j] = 1;
				fill--;
			}
	}
	for (uint32_t j = 0, n = 0; j < L; j++)
		if (base_keep[j])
			base_pos[n++] = (int32_t)j;
	jb.base_keep = base_keep;
	jb.base_pos = base_pos;

	unsigned nth = sz.nth;
	for (unsigned t = 0; t < nth; t++)
		if (ws_reserve(&ctx->ws[t], &jb) < 0)
			return fail(err, -1, -1, "out of memory for scratch"), -ENOMEM;
	jb.errs = errs;
	jb.nth = nth;
	if (!split) {
		run_phase(ctx, &jb, PH_ITEMS, jb.n_items);
	} else {
		run_phase(ctx, &jb, PH_SCORE_HEADS, jb.n_items * G);
		for (uint32_t i = 0; i < jb.n_items; i++)
			for (uint32_t g = 0; g < G; g++)
				if (jb.uerrs[(size_t)i * G + g].rc < 0) {
					errs[i].rc = jb.uerrs[(size_t)i * G + g].rc;
					errs[i].head = (int32_t)((i % sh->h_kv) * G + g);
					break;
				}
		run_phase(ctx, &jb, PH_FINISH,
			  p->gqa == SKV_GQA_EXPAND ? jb.n_items * G : jb.n_items);
	}
	r = 0;
	for (uint32_t i = 0; i < jb.n_items; i++)
		if (errs[i].rc < 0) {
			uint32_t layer = i / sh->h_kv;
			r = errs[i].rc;
			if (err) {
				snprintf(err->msg, sizeof(err->msg),
					 "layer %u query head %d (kv head %u): NaN or Inf in the "
					 "attention logits",
					 layer, errs[i].head, i % sh->h_kv);
				err->layer = (int32_t)layer;
				err->head = errs[i].head;
			}
			break;
		}
	return r;
}
