/* SPDX-License-Identifier: MIT */
/*
 * skv-driver.h - what the files of libskv's generic driver share (not
 * installed): limits, the error helper, tensor addressing, the thread pool
 * and the job it runs, and the per-stage entry points. Each section names the
 * file that owns it. The per-ISA kernels' interface is skv-internal.h.
 *
 * The driver, in the order a call runs through it:
 *   skv-params.c   defaults, names, skv_fail()
 *   skv-plan.c     validation and the plan (skv_plan), forced positions
 *   skv-compact.c  skv_compact / skv_scratch_bytes: job, scratch, phases
 *   skv-ctx.c      the context: thread pool, ISA choice, phase runner
 *   skv-score.c    logits, causal softmax, column sums (through the ISA)
 *   skv-select.c   pooling, top-k, retained mass
 *   skv-gather.c   tensor checks and the gather of kept rows
 *   skv-ledger.c   the capacity ledger; skv-dtype.c conversions
 */
#ifndef SKV_DRIVER_H
#define SKV_DRIVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

static inline size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* ------------------------------------------------------- skv-params.c */

/* Writes the reason into err (when set) and returns -EINVAL. */
__attribute__((format(printf, 4, 5))) int skv_fail(struct skv_error *err, int32_t layer,
						   int32_t head, const char *fmt, ...);
/* Clears err to "no error" (empty message, layer and head -1). */
void skv_error_clear(struct skv_error *err);
/* The caller's params as the current struct: a SKV_PARAMS_SIZE_V1 caller's
 * budget fields take their defaults (uniform, no fallback). -EINVAL on any
 * other params_size. */
int skv_params_resolve(const struct skv_params *p, struct skv_params *ret, struct skv_error *err);

/* --------------------------------------------------------- skv-plan.c */

bool skv_policy_scores(enum skv_policy p);
/*
 * skv_params_resolve() for one shape, with SPEC.md's partial window applied:
 * snapkv given min_window <= n_q < W rows gets window = n_q (W'), so every
 * later rule and step sees W'. -EINVAL (n_q > W, n_q below min_window).
 */
int skv_params_shaped(const struct skv_shape *sh, const struct skv_params *p,
		      struct skv_params *ret, struct skv_error *err);
/*
 * Mark the positions every stored head keeps whatever the scores say:
 * sinks, protected ranges and (scoring policies) the recent W_keep, in
 * keep[0..L). Returns their count.
 */
uint32_t skv_mark_forced(const struct skv_shape *sh, const struct skv_params *p, uint32_t sinks,
			 uint32_t w_keep, uint8_t *keep);
/* |window U protected| (scoring policies) or |sinks U protected| (others). */
uint32_t skv_forced_count(const struct skv_shape *sh, const struct skv_params *p);
/* C_l of each of n_layers layers (mass modes: C_max); -EINVAL for a list
 * of the wrong length. params resolved and checked. */
int skv_layer_caps(const struct skv_params *p, uint32_t n_layers, uint32_t *caps,
		   struct skv_error *err);
/* Rows a stored head's output needs at per-layer budget C. */
uint32_t skv_rows_at(const struct skv_shape *sh, const struct skv_params *p, uint32_t C);

/* --------------------------------------------------------- skv-dtype.c */

/* n fp8 elements of dt at src, each decoded exactly and multiplied by scale
 * in f32 (one rounding): SPEC.md's widening of a quantized key. */
void skv_fp8_to_f32(const void *src, enum skv_dtype dt, float scale, float *dst, uint32_t n);

/* ---------------------------------------------------------- skv-ctx.c */

/* One thread's scratch, laid out per job by skv-compact.c. */
struct skv_ws {
	/* scoring */
	float *qt, *kt, *z, *f, *m, *s, *rowbuf, *colsum, *vote, *pooled;
	uint32_t *qb; /* bf16 pairs of the query rows (isa->tile_bf16) */
	uint16_t *kb; /* bf16 key tile (isa->tile_bf16)                */
	int32_t *trow;
	uint8_t *bad, *keep;
	uint64_t *key;
	int32_t *pos;
	uint32_t *rpos; /* ranked positions, best first (mass modes) */
	uint64_t *rtmp; /* radix sort's second buffer (mass modes)   */
	struct skv_seg *segs;
	/* heads mode, one layer at a time: per stored head [H_store][L] */
	float *hpool, *hvote;
	uint8_t *hkeep;
	unsigned __int128 *hkey;
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
	int (*cancel)(void *arg); /* skv_ctx_set_cancel */
	void *cancel_arg;
};

struct skv_item_err {
	int rc;
	int32_t head;
	int32_t kvh;
};

/* One skv_compact() call, as the pool and the stages see it. */
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
	/* the phase run by the pool, its unit count and what runs one unit */
	enum { PH_ITEMS, PH_SCORE_HEADS, PH_FINISH, PH_RANK, PH_MASS, PH_LAYERS, PH_FULL } phase;
	uint32_t n_units;
	void (*run_unit)(struct skv_job *jb, struct skv_ws *w, uint32_t u);
	atomic_bool cancelled;	    /* a unit found the context's cancel set */
	float *cs;		    /* split mode: [item][G][L] column sums    */
	struct skv_item_err *uerrs; /* split mode: per (item, g) scoring status */
	/* derived */
	uint32_t G, n_obs; /* rows per query head that vote (0: no scoring) */
	uint32_t P;	   /* prefix: candidates are j < P                  */
	uint32_t rb;	   /* rows per block, multiple of SKV_ROWPAD        */
	uint32_t budget;   /* positions filled by top-k                     */
	bool score, select;
	const uint8_t *base_keep; /* forced positions                      */
	const int32_t *base_pos;  /* the forced positions, ascending       */
	const int32_t *all_pos;	  /* 0 .. L-1 (bypass, fallback)           */
	float scale;
	/* budget modes */
	enum skv_budget mode;
	const uint32_t *caps; /* [n_layers] C_l (mass modes: C_max)     */
	uint32_t forced;      /* count of base_pos                      */
	uint32_t h_store;
	uint32_t *kept_all; /* [n_layers][h_store] kept per head        */
	float *mass_all;    /* [n_layers][h_store] retained mass        */
	bool ranked;	    /* mass with scores: heads are ranked       */
	uint32_t R;	    /* mass: ranked picks held per head (>= 0)  */
	uint32_t *rank;	    /* mass: [n_layers * h_store][R] best first */
	float *rvote;	    /* mass: the votes of those positions       */
	double *fsum;	    /* mass: summed votes of the forced ones    */
	uint32_t *cneed;    /* mass: smallest ladder C reaching tau     */
	uint32_t c_star;    /* mass: the chosen C                       */

	/* mass: some head needs C_max, so C* = C_max; phase one then emits
	 * the heads it ranks and sets their fsum to -1 (skv-budget.c) */
	atomic_uint cmax_seen;
};

/* Phase one's marker in a mass head's fsum (a sum of votes, never
 * negative): the head was emitted at C_max in phase one. */
#define SKV_MASS_EMITTED (-1.0)

/* Run jb->run_unit on units 0 .. n_units-1 over the pool, the calling thread
 * included; returns when all are done. */
void skv_ctx_run(struct skv_ctx *ctx, struct skv_job *jb, int phase, uint32_t n_units);

/* -------------------------------------------------------- skv-score.c */

int skv_score_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
		   uint32_t g0, uint32_t g1, float *colsum, uint32_t *bad_g);

/* ------------------------------------------------------- skv-select.c */

/* Positions kept for one stored head into w->pos (ascending), the forced
 * ones and the k best by pooled score; returns count. */
uint32_t skv_choose(const struct skv_job *jb, struct skv_ws *w, const float *votes, uint32_t k);
/* Pooled votes of the prefix [0, P) into out. */
void skv_pool_votes(const struct skv_job *jb, const float *votes, float *out);
/*
 * Ranking key: higher is better. The score's bits, made monotonic as an
 * unsigned integer, above the complement of the position, so that equal
 * scores rank the smaller position first. One integer compare per step.
 */
static inline uint64_t skv_rank_key(float score, uint32_t pos)
{
	uint32_t u;
	__builtin_memcpy(&u, &score, 4);
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return (uint64_t)u << 32 | (uint32_t)~pos;
}
/* The R best non-forced prefix positions of one head, best first, in
 * w->key[0..n) (position = ~(uint32_t)key); returns n = min(R, candidates). */
uint32_t skv_rank(const struct skv_job *jb, struct skv_ws *w, const float *votes, uint32_t R);
/* Forced positions plus the first `picks` of ranked[] into w->pos, ascending. */
uint32_t skv_keep_ranked(const struct skv_job *jb, struct skv_ws *w, const uint32_t *ranked,
			 uint32_t picks);
/* Sum in double of votes over the forced positions, ascending. */
double skv_forced_sum(const struct skv_job *jb, const float *votes);
/* The mass-curve value of SPEC.md's budget modes: min(1, (float)(acc / rows)). */
float skv_curve(double acc, uint32_t rows);
/* The min(k, n) largest of key[0..n) into its front (unordered); returns it. */
uint32_t skv_top_keys(uint64_t *key, uint32_t n, uint32_t k);
/* Quickselect of the k largest 128-bit keys into key[0..k). */
void skv_select_top128(unsigned __int128 *key, size_t n, size_t k);
/* Retained mass of the kept positions pos[0..cnt) given column sums. */
float skv_mass_of(const float *colsum, const int32_t *pos, uint32_t cnt, uint32_t rows);
/* Group votes into w->vote: the G heads' column sums averaged, in a fixed order. */
void skv_group_votes(const struct skv_job *jb, struct skv_ws *w, const float *colsum);

/* ------------------------------------------------------- skv-budget.c */

/* mass-heads: one stored head h (votes v) ranked, its k chosen and written. */
void skv_mass_heads_head(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
			 uint32_t h, const float *v);
/* mass, phase one: rankings and per-head smallest ladder C held in the job. */
int skv_mass_rank_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh,
		       const float *colsum);
/* mass, phase two: every stored head of the item keeps min(L, C*). */
void skv_mass_finish_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh);
/* Fallback: all L positions for every stored head of the item. */
void skv_full_item(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh);
/* heads: one layer scored, decided and written; -EDOM names item and head. */
int skv_heads_layer(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t *ret_item,
		    int32_t *ret_head);

/* ------------------------------------------------------- skv-gather.c */

static inline const void *skv_elem(const struct skv_tensor *t, uint32_t h, uint32_t tok, size_t esz)
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

/* Leading SKV_BLOCK_IN_PLACE entries among the first `need` of a paged
 * output's table. */
static inline uint64_t skv_in_place_blocks(const struct skv_tensor *t, uint64_t need)
{
	uint64_t b = 0;

	while (b < need && t->block_table[b] == SKV_BLOCK_IN_PLACE)
		b++;
	return b;
}
/*
 * One tensor of one layer: data, dtype, strides, and its block table when
 * paged (length, entries >= 0; for a tensor of output `out` (NULL for an
 * input) entries below out->pool_blocks and a block geometry in which no two
 * slots meet). D is the head dim.
 */
int skv_check_tensor(const struct skv_tensor *t, const char *what, uint32_t layer, uint32_t heads,
		     uint32_t tokens, uint32_t D, const struct skv_layer_out *out,
		     struct skv_error *err);
/*
 * The blocks every paged output of a call writes (rows[l] slots per head of
 * layer l), K and V of all layers: -EINVAL when two of them overlap, with the
 * layers named; -ENOMEM.
 */
int skv_check_paged_disjoint(uint32_t n_layers, const struct skv_layer_out *out,
			     const uint32_t *rows, uint32_t heads, uint32_t D,
			     struct skv_error *err);

/* Write the kept rows, positions and mass of stored head h of one layer. */
void skv_emit(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh, uint32_t h,
	      const int32_t *pos, uint32_t cnt, float mass);

#endif /* SKV_DRIVER_H */
