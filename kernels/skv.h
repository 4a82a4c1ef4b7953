/* SPDX-License-Identifier: MIT */
/*
 * skv.h - SnapKV compaction kernels: selection and gather of one or more
 * layers, all heads, exactly as ../shared/SPEC.md defines them.
 *
 * The one public header of libskv (kernels/). Every fallible call returns 0
 * or a negative errno; where a struct skv_error is passed, a readable reason
 * is written into it on failure. Nothing here logs, allocates per call on
 * the hot path beyond what a context holds, or calls exit().
 */
#ifndef SKV_H
#define SKV_H

#include <stddef.h>
#include <stdint.h>

/*
 * Words, one meaning each in the public headers: the *budget* is C, the
 * positions kept per stored head (window included); a cache's *capacity* is
 * its slots per head (kept plus decode headroom). Fields that said capacity
 * for C are now budget; the old names stay as deprecated aliases (same
 * storage, same ABI) and warn when used, unless SKV_NO_DEPRECATION_WARNINGS
 * is defined (this tree defines it until its own code is moved over).
 */
#ifndef SKV_DEPRECATED
#if defined(__GNUC__) && !defined(SKV_NO_DEPRECATION_WARNINGS)
#define SKV_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define SKV_DEPRECATED(msg)
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

enum skv_dtype {
	SKV_DTYPE_UNSPECIFIED = 0,
	SKV_DTYPE_F32 = 1,
	SKV_DTYPE_F16 = 2,
	SKV_DTYPE_BF16 = 3,
	/* fp8 K/V (SPEC.md "Quantized K/V"), each tensor with a scale s
	 * (skv_tensor.scale): value = s * decoded byte */
	SKV_DTYPE_F8E4M3FN = 4, /* OCP E4M3, finite only: 0x7f/0xff are NaN */
	SKV_DTYPE_F8E5M2 = 5,	/* IEEE-style: inf and NaN at exponent 31    */
};

enum skv_policy {
	SKV_POLICY_UNSPECIFIED = 0,
	SKV_POLICY_SNAPKV = 1,	     /* S=0, W_obs=W, W_keep=W, pooled votes   */
	SKV_POLICY_H2O = 2,	     /* S=0, W_obs=L (all queries), W_keep=W   */
	SKV_POLICY_STREAMINGLLM = 3, /* S sinks + last C-S, no scoring         */
	SKV_POLICY_WINDOW = 4,	     /* last C positions, no scoring           */
};

enum skv_pooling {
	SKV_POOL_UNSPECIFIED = 0,
	SKV_POOL_AVG = 1, /* avg_pool1d, count_include_pad=True, divisor k */
	SKV_POOL_MAX = 2, /* max over in-range neighbours                 */
};

enum skv_gqa {
	SKV_GQA_UNSPECIFIED = 0,
	SKV_GQA_EXPAND = 1, /* store H_q heads, each query head selects      */
	SKV_GQA_GROUP = 2,  /* store H_kv heads, group votes averaged first  */
};

/* Bytes per element of a dtype; 0 for an unknown one. */
size_t skv_dtype_size(enum skv_dtype dt);
/* "f32", "f16", "bf16", "f8e4m3fn", "f8e5m2"; NULL for an unknown one. */
const char *skv_dtype_name(enum skv_dtype dt);
const char *skv_policy_name(enum skv_policy p);

/* Scalar conversions (round-to-nearest-even on the way down). */
float skv_f16_to_f32(uint16_t h);
uint16_t skv_f32_to_f16(float f);
float skv_bf16_to_f32(uint16_t b);
uint16_t skv_f32_to_bf16(float f);
/* An fp8 byte's value (unscaled), exactly; NaN/inf as the format says. */
float skv_f8e4m3fn_to_f32(uint8_t b);
float skv_f8e5m2_to_f32(uint8_t b);
/* 1 for SKV_DTYPE_F8E4M3FN and SKV_DTYPE_F8E5M2. */
int skv_dtype_is_fp8(enum skv_dtype dt);

/* A half-open range of original positions [begin, end). */
struct skv_range {
	uint32_t begin;
	uint32_t end;
};

#define SKV_MAX_PROTECTED 16
/* Entries of an explicit per-layer budget list (budget mode layers). */
#define SKV_MAX_LAYER_CAPS 256

/*
 * Budget modes of SPEC.md ("Budgets beyond one C"). uniform is today's one C
 * for every head and the default; the others are built from the same single
 * scoring pass.
 */
enum skv_budget {
	SKV_BUDGET_UNIFORM = 0,	   /* capacity C for every stored head          */
	SKV_BUDGET_LAYERS = 1,	   /* layer_caps[l], or pyramid r around C      */
	SKV_BUDGET_HEADS = 2,	   /* AdaKV: floor a, then a layer-wide top-k   */
	SKV_BUDGET_MASS = 3,	   /* one C* on the ladder c_min..c_max by step */
	SKV_BUDGET_MASS_HEADS = 4, /* per head the smallest k reaching tau      */
};
/* "uniform", "layers", "heads", "mass", "mass-heads"; NULL for an unknown one. */
const char *skv_budget_name(enum skv_budget b);

struct skv_params;
struct skv_error;
/*
 * A budget mode as text into p (budget_mode and its fields; the rest of p
 * untouched): uniform, layers:C0,C1,.. (one per layer), pyramid:R,
 * heads[:A], mass:TAU[:CMIN:CMAX:STEP], mass-heads:TAU[:CMIN:CMAX]. Only the
 * spelling is checked here; skv_plan() checks the ranges. 0 or -EINVAL with
 * a reason. A mass ladder left out is 0 until skv_budget_defaults().
 */
int skv_budget_parse(const char *spec, struct skv_params *p, struct skv_error *err);
/*
 * The mass ladder's defaults, once W and C are set: C_max = C, C_min =
 * W + 1 (at most C_max), step = (C - W) / 16 (at least 1); only fields left
 * 0. Other modes: nothing.
 */
void skv_budget_defaults(struct skv_params *p);

/*
 * Compaction parameters: SPEC.md's single parameterisation. Fill with
 * skv_params_init(), then override. For policy snapkv and h2o, `window` is
 * W (observation rows and recent keep); streamingllm uses `sinks`; window
 * uses only `budget`. Protected ranges are kept unconditionally and count
 * against the budget.
 */
struct skv_params {
	uint32_t params_size; /* sizeof(struct skv_params), for ABI growth */
	enum skv_policy policy;
	uint32_t window; /* W (default 32)                        */
	union {
		uint32_t budget; /* C, per stored head, window included (2048) */
		uint32_t capacity SKV_DEPRECATED("skv_params.capacity is now budget (C)");
	};
	uint32_t kernel; /* pooling width k, odd; 1 = none (5)    */
	enum skv_pooling pooling;
	enum skv_gqa gqa;
	uint32_t sinks; /* S, streamingllm only (default 4)        */
	uint32_t n_protected;
	struct skv_range protected_ranges[SKV_MAX_PROTECTED];
	/*
	 * Budget modes. A caller built before them passes params_size ==
	 * SKV_PARAMS_SIZE_V1 and gets uniform with no fallback; nothing below
	 * is read then.
	 */
	enum skv_budget budget_mode;
	uint32_t n_layer_caps;			 /* layers: list length, 0 = pyramid */
	uint32_t layer_caps[SKV_MAX_LAYER_CAPS]; /* layers: C_l of layer l          */
	float pyramid_r;			 /* layers, no list: r in (0, 64]    */
	float head_floor;			 /* heads: a in [0, 1] (0.2)         */
	float tau;				 /* mass, mass-heads: in (0, 1]      */
	uint32_t c_min, c_max, c_step;		 /* mass ladder (mass-heads: no step) */
	float fallback_below;			 /* tau_f in [0, 1]; 0 = never fall back (0) */
	/*
	 * Partial window (SPEC.md): snapkv given n_q < W query rows runs with
	 * W' = n_q in place of W everywhere, provided n_q >= min_window; 0
	 * means SKV_MIN_WINDOW_DEFAULT. A caller built before it passes
	 * SKV_PARAMS_SIZE_V2 and gets the default.
	 */
	uint32_t min_window;
	/*
	 * Span-aware selection (issue 28; the rule is under "Decisions" below):
	 * each position picked by score also keeps its neighbours up to span
	 * on either side, until the head's budget is used. 0 (the default) is
	 * SPEC.md's top-k. A caller built before it passes SKV_PARAMS_SIZE_V3
	 * and gets 0.
	 */
	uint32_t span;
};

/* params_size of callers built before the budget modes. */
#define SKV_PARAMS_SIZE_V1 offsetof(struct skv_params, budget_mode)
/* params_size of callers built before the partial window (min_window). */
#define SKV_PARAMS_SIZE_V2 offsetof(struct skv_params, min_window)
/* params_size of callers built before span-aware selection (span). */
#define SKV_PARAMS_SIZE_V3 offsetof(struct skv_params, span)
/* The widest span (neighbours on either side of a picked position). */
#define SKV_MAX_SPAN 64u
/* The smallest partial window when min_window is 0 (SPEC.md: 8). */
#define SKV_MIN_WINDOW_DEFAULT 8u

/* Reference defaults: snapkv, W 32, C 2048, k 5, avg, expand, S 4. */
void skv_params_init(struct skv_params *p);
/* The same defaults as an initializer, the one place they are written down:
 * skv_params_init() and libsnapkv's skv_client_params_init() (which does not
 * link libskv) both copy them. */
#define SKV_PARAMS_DEFAULTS                                                                        \
	{                                                                                          \
		.params_size = sizeof(struct skv_params), .policy = SKV_POLICY_SNAPKV,             \
		.window = 32, .budget = 2048, .kernel = 5, .pooling = SKV_POOL_AVG,                \
		.gqa = SKV_GQA_EXPAND, .sinks = 4, .budget_mode = SKV_BUDGET_UNIFORM,              \
		.head_floor = 0.2f,                                                                \
	}

/* Problem shape of one layer; identical for every layer of a call. */
struct skv_shape {
	uint32_t prompt_len; /* L                                         */
	uint32_t head_dim;   /* D                                         */
	uint32_t h_q;	     /* query heads                               */
	uint32_t h_kv;	     /* K/V heads; h_q % h_kv == 0                */
	uint32_t n_q;	     /* query rows given: the LAST n_q positions
				L-n_q .. L-1 (W for snapkv, L for h2o, 0 is
				allowed for streamingllm and window)     */
};

/*
 * What a compaction will produce, derived from shape and params before any
 * work (skv_plan()). In budget mode uniform all stored heads of all layers
 * keep `kept`; in the other modes `kept` is the most rows one head may keep
 * (layers pyramid: 2 C, before N is known; with a fallback: L) and bypass
 * means every layer bypasses (mass modes: L < C_min); skv_budget_rows()
 * gives the per-layer room.
 */
struct skv_plan {
	uint32_t h_store; /* h_q (expand) or h_kv (group)                  */
	uint32_t kept;	  /* min(L, C) for scoring policies; see SPEC.md   */
	uint32_t sinks;	  /* effective S                                   */
	uint32_t w_obs;	  /* effective observation rows                    */
	uint32_t w_keep;  /* effective recent keep                         */
	int bypass;	  /* 1 when L < C: nothing scored, all L kept      */
};

struct skv_error {
	char msg[256];
	int32_t layer; /* -1 when not about one layer */
	int32_t head;  /* -1 when not about one head  */
};

/*
 * Decisions of the host implementation where SPEC.md leaves room (the CUDA
 * backend should match them):
 * - snapkv needs n_q == W, or a partial window min_window <= n_q < W
 *   (SPEC.md): then W' = n_q replaces W in every rule and step (C > W',
 *   W' <= L, |window U protected| <= C, the kept window, the votes); a
 *   full window (n_q == W) is never held to min_window, n_q > W is
 *   rejected, and the rules are the same whether or not L < C bypasses.
 *   W' > L is rejected even when L < C would bypass (SPEC's list); a
 *   prompt shorter than W is compacted when its caller passes fewer rows
 *   (a partial window), and refused at n_q == W.
 *   h2o needs n_q == L (its window is W_keep only, no partial window).
 *   streamingllm/window accept any n_q <= L.
 * - h2o: W_obs = L, W_keep = window, no pooling whatever kernel/pooling say
 *   (they are still validated). sinks only apply to streamingllm.
 * - Protected ranges: non-empty, end <= L, may overlap (their union counts).
 *   Scoring policies: |window U protected| <= C. streamingllm/window: sinks
 *   and protected ranges are kept, the rest of C goes to the most recent
 *   other positions (plan.w_keep = C - |sinks U protected|); S > C or
 *   |sinks U protected| > C is rejected.
 * - In-place output blocks (SKV_BLOCK_IN_PLACE, issue 20 point 5; SPEC.md
 *   is silent on where slots live): only the prefix [0, skv_kept_prefix())
 *   may be left in place, since only there is slot i position i in every
 *   head whatever the scores; the window and a bypass (L < C) are not
 *   counted even where they would reach position 0, so the rule never
 *   depends on the scores or on the budget mode. The positions table still
 *   lists every slot, in-place ones included (slot i: position i), so a
 *   cache's positions are the same with or without in-place blocks.
 * - Bypass (L < C), any policy: all L kept, nothing read from q, retained
 *   mass 1; plan.sinks = plan.w_obs = 0, plan.w_keep = L.
 * - Retained mass: (1/W_obs) * sum over rows of the weights of kept keys;
 *   group mode averages the G heads. streamingllm/window with n_q > 0 score
 *   those rows for the mass only (and can return -EDOM); n_q == 0 gives NaN.
 * - Weights below exp(-87.3) of a row's maximum count as 0.
 * - -EDOM: err->head is the QUERY head (kv_head * G + g) of the lowest
 *   failing (layer, head); that item writes nothing, others may have.
 * - params_size must equal sizeof(struct skv_params), SKV_PARAMS_SIZE_V3
 *   (a caller built before span: 0), SKV_PARAMS_SIZE_V2 (a caller built
 *   before min_window: the default 8) or SKV_PARAMS_SIZE_V1 (a caller
 *   built before the budget modes: uniform, no fallback).
 * - Span-aware selection (span s, 1..SKV_MAX_SPAN; 0 = off, SPEC.md's
 *   top-k; SPEC.md is silent, this is the project's rule until SPEC.md has
 *   it). It replaces only the pick of the k = C_l - F prefix positions of
 *   one stored head (F = |window U protected|, C_l the head's budget) in
 *   budget modes uniform and layers, for snapkv and h2o; heads, mass and
 *   mass-heads with span > 0 are rejected (-EINVAL), streamingllm and
 *   window ignore it (as they do kernel). The rule: rank the prefix
 *   positions [0, L - W) that are not forced (window, protected) by their
 *   pooled vote, highest first, ties to the smaller position (the key of
 *   top-k). Walk the ranking; each position c in turn is a centre (whether
 *   or not an earlier centre already kept it) and visits c, c - 1, c + 1,
 *   c - 2, c + 2, .., c - s, c + s, skipping those outside [0, L - W) and
 *   those already kept (forced or picked); each visited position is kept,
 *   and the walk stops the moment k are kept (so the last span may be cut
 *   short, nearest the centre first). Memory is exactly that of top-k (k
 *   picks); with k >= the candidates everything is kept, as top-k does.
 *   Pooling (kernel) applies before the ranking, as for top-k; the
 *   retained mass is computed over the kept set as usual.
 * - Output dtype may differ from the input's (converted, round to nearest
 *   even); rows are otherwise copied bit for bit.
 * - fp8 K/V (SPEC.md "Quantized K/V"): K and V may each be f8e4m3fn or
 *   f8e5m2 with a finite scale s > 0 (else -EINVAL); q may not (-EINVAL).
 *   Scoring widens each key byte exactly to f32 and multiplies by s in
 *   f32 (one rounding), on every SIMD path (the widening is the driver's,
 *   in C; the f32 tile kernels then run as for f32 keys), so the logits are
 *   those of the f32 keys s * byte. An fp8 input's output must have its
 *   dtype (the gather copies the bytes; no conversion to or from fp8);
 *   the output carries the input's scale. A key byte that decodes to NaN
 *   or inf (or s * byte overflowing to inf) fails the item with -EDOM as
 *   a non-finite f32 key does; V bytes are copied unread.
 * - Limits: L <= 2^22, D <= 4096, h_q <= 4096, kernel <= 255, span <= 64.
 * - The environment variable SKV_ISA=scalar|avx2|avx512 lowers the SIMD
 *   path a new context picks (for tests); SKV_ISA=avx512bf16 takes the
 *   vdpbf16ps path for bf16 x bf16 logits where the CPU has AVX512-BF16:
 *   0.54-0.72x the time of a bf16 compaction, but each logit adds its
 *   products in pair order (q[d+1]k[d+1], then q[d]k[d]), so it differs by
 *   rounding from the default path and from the CUDA backend. Off by
 *   default: uniform output stays byte-identical to earlier releases.
 */

/*
 * Validate params against a shape and compute the plan. -EINVAL with a
 * reason for every invalid combination of SPEC.md (protected + S + W_keep >
 * C, W > L, C <= W, even k, unknown policy/pooling/gqa/dtype, H_q not a
 * multiple of H_kv, D = 0, n_q not what the policy needs, ...).
 */
int skv_plan(const struct skv_shape *shape, const struct skv_params *params,
	     struct skv_plan *ret_plan, struct skv_error *err);

/*
 * A strided or paged tensor view. Element (head h, token t, dim d) is at
 *   data + (blk(t) * block_stride + (t % block_size) * token_stride
 *           + h * head_stride + d) * dtype_size
 * where blk(t) = block_table[t / block_size] when block_table is set
 * (paged, vLLM/SGLang style) and blk(t) = 0, block_size = infinity when it
 * is NULL (strided: HND has head_stride = T*D, token_stride = D; NHD has
 * token_stride = H*D, head_stride = D). Strides count elements, not bytes.
 * The dim axis is always contiguous.
 */
struct skv_tensor {
	void *data;
	enum skv_dtype dtype;
	int64_t head_stride;
	int64_t token_stride;
	const int32_t *block_table; /* NULL: strided                */
	uint32_t block_size;	    /* tokens per block when paged  */
	uint32_t n_blocks;	    /* entries in block_table       */
	int64_t block_stride;	    /* elements between blocks      */
	/* fp8 dtypes: the tensor's scale s (finite, > 0); read only for an
	 * fp8 input, never written: an output carries its input's s, which the
	 * caller keeps with it. Other dtypes: not read. */
	float scale;
};

/* A paged output block table entry: the block is already in place, not
 * written (see struct skv_layer_out). */
#define SKV_BLOCK_IN_PLACE (-1)
/*
 * The longest prefix [0, P) of positions every stored head keeps whatever
 * the scores say, in slots 0 .. P - 1: covered by the protected ranges
 * (and, for streamingllm, the sinks), at most L. In-place output blocks
 * must lie in it.
 */
uint32_t skv_kept_prefix(const struct skv_shape *sh, const struct skv_params *p);

/* Inputs of one layer. q rows are positions L-n_q .. L-1, token index 0..n_q-1. */
struct skv_layer_in {
	struct skv_tensor q; /* [H_q, n_q, D]  */
	struct skv_tensor k; /* [H_kv, L, D]   */
	struct skv_tensor v; /* [H_kv, L, D]   */
};

/*
 * Outputs of one layer. k and v hold plan.kept slots per stored head, either
 * strided (any strides, so a caller can write straight into a cache with
 * decode headroom) or paged in the engine's block format: a block table
 * (per layer K and V pools [block][block_size][H_store][D] or any strides
 * that keep slots apart), compact slot i of every head in block
 * block_table[i / block_size], row i % block_size. A paged output is
 * validated before any work (-EINVAL): n_blocks covers the kept slots, every
 * entry in [0, pool_blocks), strides non-negative with no two (row, head)
 * slots of a block meeting, and no two blocks written by the call (K and V,
 * all layers) overlapping. positions[h * pos_stride + i] receives the i-th
 * kept original position of stored head h, ascending.
 *
 * In-place blocks (paged outputs): the table may start with entries
 * SKV_BLOCK_IN_PLACE (-1), the same number for K and V; those blocks are not
 * written at all (neither checked against the pool nor against other
 * blocks), the slots they stand for are [0, n * block_size) and their
 * positions are still written (slot i holds position i). Allowed only when
 * every position of [0, n * block_size) is kept by every head whatever the
 * scores, i.e. lies in the union of the protected ranges (and, for
 * streamingllm, the sinks) counted from position 0; else -EINVAL before
 * any work. What those slots hold is then the input's rows 0 .. n *
 * block_size - 1 unchanged: a caller whose input is paged in the same pool
 * (a shared, prefix-cached system prompt) leaves those blocks where they are
 * and points the compact sequence's first n blocks at them. Any other
 * negative entry, or -1 after a non-negative one, is -EINVAL. The CUDA
 * backend does not read the table on the host: it skips the same leading
 * entries and leaves the check to its caller (the daemon makes it).
 *
 * retained_mass may be
 * NULL; otherwise [h_store] floats (NaN when no rows vote and none were
 * given).
 */
struct skv_layer_out {
	struct skv_tensor k; /* [H_store, >= kept, D] */
	struct skv_tensor v; /* [H_store, >= kept, D] */
	int32_t *positions;  /* [H_store][pos_stride] */
	uint32_t pos_stride;
	float *retained_mass; /* [H_store] or NULL     */
	uint32_t pool_blocks; /* paged k/v: blocks in each of the K and V
				 pools; every table entry is below it */
};

/* A compaction context: a thread pool and scratch. Not thread-safe: one
 * compaction at a time per context. */
struct skv_ctx;

/* threads = 0: one per online core. 0 or -errno (-ENOMEM, -EAGAIN). */
int skv_ctx_new(unsigned threads, struct skv_ctx **ret_ctx);
void skv_ctx_free(struct skv_ctx *ctx);
unsigned skv_ctx_threads(const struct skv_ctx *ctx);
/* Name of the SIMD path chosen at run time: "avx512bf16", "avx512", "avx2", "scalar". */
const char *skv_ctx_isa(const struct skv_ctx *ctx);
/*
 * A compaction on ctx stops early when cancelled(arg) returns non-zero: it is
 * asked before each unit of work ((layer, head) items), from any of the
 * context's threads, so it must be thread-safe and cheap. The call then
 * returns -ECANCELED and its outputs are unspecified. NULL: never (the
 * default). Stays set for later calls until changed.
 */
void skv_ctx_set_cancel(struct skv_ctx *ctx, int (*cancelled)(void *arg), void *arg);

/*
 * Select and gather n_layers layers, all heads. Work is spread over
 * (layer, head) items; results are bit-identical whatever the thread count.
 * Returns 0; -EINVAL (bad params/shape/tensor, nothing written); -EDOM when
 * a head's logits hold NaN/Inf (err names layer and head; outputs of other
 * items may have been written); -ENOMEM.
 */
int skv_compact(struct skv_ctx *ctx, const struct skv_shape *shape, const struct skv_params *params,
		uint32_t n_layers, const struct skv_layer_in *in, const struct skv_layer_out *out,
		struct skv_error *err);

/*
 * Bytes of scratch skv_compact() will hold for this call on a context of
 * `threads` threads (0: one per online core), call-wide and per thread
 * together, computed before any work so a caller can refuse a request whose
 * working set is too large. It grows with G * L (per-query-head column sums)
 * whatever the input's size. 0 or -EINVAL (the reasons of skv_plan()).
 */
int skv_scratch_bytes(const struct skv_shape *shape, const struct skv_params *params,
		      uint32_t n_layers, unsigned threads, uint64_t *ret_bytes,
		      struct skv_error *err);

/*
 * Budget modes (SPEC.md "Budgets beyond one C"). skv_compact() takes any
 * mode whose counts are fixed before any work (uniform, layers, no
 * fallback); the others need skv_compact_budget() and a kept array.
 *
 * Outputs keep the layout of struct skv_layer_out: stored head h of layer l
 * writes its kept_h rows at (h, 0 .. kept_h - 1) and its positions at
 * h * pos_stride; each head needs room for rows[l] of skv_budget_rows()
 * (exactly C_l for uniform and layers; the most a head may keep otherwise;
 * L when fallback_below > 0). Ragged storage (one block of sum_h cap_h rows
 * per layer) is the caller's packing of these rows, head after head.
 *
 * Decisions of the host implementation where SPEC.md leaves room (the CUDA
 * backend must match them):
 * - F = |window U protected| (scoring) or |sinks U protected|; P(C) = C - F
 *   prefix picks. Rules involving C are checked at every C_l of a list, at
 *   every pyramid C_l once N is known, and at C_min for the mass modes (the
 *   same message, prefixed with the layer or "C_min").
 * - Mass curve m_h(k) (mass, mass-heads): the votes of the forced positions
 *   summed in double in ascending order, then the ranked picks added in rank
 *   order (pooled score descending, ties to the smaller position), divided
 *   by W_obs, rounded to float and capped at 1; exactly 1 when all L
 *   positions are kept. It is non-decreasing in k by construction. These
 *   modes report m_h(kept_h) as the retained mass (uniform, layers and heads
 *   report the ascending-order sum of the kept set, as before).
 * - mass ladder: C_min, C_min + step, .. while below C_max, then C_max (so
 *   C_max is always a candidate). A ladder C >= L keeps all L (mass 1). When
 *   L < C_min nothing is scored: every head keeps L, C* = C_min, mass 1.
 * - mass-heads: k runs over [C_min, C_max]; kept_h = min(L, k).
 * - Zero ranking width (mass, mass-heads): when the forced positions already
 *   fill C_max (C_max = |window U protected|, which the rules allow) or
 *   cover all of L, no prefix position can be picked. This is computed, not
 *   refused: the curve is flat at the forced positions' mass (1 when they
 *   are all of L), so every head keeps exactly the forced positions, C* is
 *   the first ladder C whose flat mass meets tau or else C_max, and the
 *   fallback applies as usual. Decision-group members take the same path.
 * - heads: f = floor(a * P(C)) in double; a head's floor picks are its own
 *   best by pooled score; the rest are chosen among all remaining (head,
 *   prefix position) pairs of the layer by pooled score, ties to the smaller
 *   stored head, then the smaller position. Bypass when L < C.
 * - layers pyramid: skv_layer_caps() in skv-plan.c (double arithmetic, the
 *   remainder to layers 0, 1, ..). The list must have n_layers entries.
 *   Per-layer bypass when L < C_l.
 * - Fallback: checked after the choice over every (layer, stored head): a
 *   mass below fallback_below (NaN never) makes every head of every layer
 *   keep all L positions in order with mass 1; the result says fallback and
 *   min_mass is the choice's, before the fallback.
 * - heads, mass, mass-heads need a scoring policy (snapkv, h2o).
 */
struct skv_budget_result {
	uint32_t result_size; /* sizeof(struct skv_budget_result)           */
	uint32_t *kept;	      /* [n_layers][h_store] in: array, out: kept_h  */
	uint32_t c_star;      /* out: mass: C*; uniform: C; otherwise 0      */
	int32_t fallback;     /* out: 1 when the full prompt was kept        */
	float min_mass;	      /* out: smallest m_h of the choice             */
	uint32_t reserved[3];
};

/*
 * Rows each stored head of layer l's outputs must have room for, into
 * ret_rows[n_layers]; validates the mode against n_layers (list length,
 * every pyramid C_l). 0 or -EINVAL with a reason.
 */
int skv_budget_rows(const struct skv_shape *shape, const struct skv_params *params,
		    uint32_t n_layers, uint32_t *ret_rows, struct skv_error *err);

/* skv_compact() for every budget mode; res may be NULL for uniform and
 * layers without a fallback. Same returns as skv_compact(). */
int skv_compact_budget(struct skv_ctx *ctx, const struct skv_shape *shape,
		       const struct skv_params *params, uint32_t n_layers,
		       const struct skv_layer_in *in, const struct skv_layer_out *out,
		       struct skv_budget_result *res, struct skv_error *err);

/*
 * Decision groups (SPEC.md): one compaction in two steps, so that the
 * members of a group (tensor-parallel ranks, each with its own inputs and
 * context) can be decided together from one scoring pass each.
 *
 * skv_compact_begin() runs everything that does not depend on the group's
 * choice: for mass the scoring pass and the ranking of every head, for
 * uniform and layers the whole compaction (outputs written). It returns a
 * pending compaction that owns that state, and the context is free for other
 * calls at once. The caller then decides:
 * - C* = the largest skv_pending_c_star() of the members (mass; the smallest
 *   ladder C that meets tau on every member, since every curve is
 *   non-decreasing in C);
 * - fallback when fallback_below > 0 and some member's
 *   skv_pending_min_mass(C*) is below it (NaN masses never count);
 * and skv_compact_end() writes the outputs for that decision, on any
 * context, and frees the pending compaction. The result equals
 * skv_compact_budget() bit for bit when C* is the member's own and the
 * fallback its own. in and out must stay valid until skv_compact_end() or
 * skv_pending_free().
 *
 * heads and mass-heads are refused (-EINVAL): their counts differ per head,
 * so no group can share them.
 *
 * The CUDA backend (snapkvd's CUDA runner; issue 20) has no pending state:
 * a member's first step is a whole compaction for its own choice, which
 * gives its C* and its smallest mass there (res->c_star, res->min_mass);
 * the decision is the same host arithmetic on those, and the second step
 * (skv_cuda_compact_decided()) reruns only a member whose own choice is not
 * the group's. A member knows its mass at its own C* only. SPEC.md is
 * silent on what a backend may refuse here; the choice made: where the
 * group's C* is above a member's own (mass mode), that member met tau at its
 * own C* and its curves are non-decreasing, so its mass at C* is >= tau,
 * which decides "below fallback_below" exactly when fallback_below <= tau;
 * a mass-mode group with fallback_below > tau is refused on the CUDA
 * backend (-EOPNOTSUPP, naming both), never decided on a guess.
 */
struct skv_pending;
int skv_compact_begin(struct skv_ctx *ctx, const struct skv_shape *shape,
		      const struct skv_params *params, uint32_t n_layers,
		      const struct skv_layer_in *in, const struct skv_layer_out *out,
		      struct skv_pending **ret, struct skv_error *err);
/* The member's own choice: mass: its C* (C_min when L < C_min); uniform: C;
 * layers: 0. */
uint32_t skv_pending_c_star(const struct skv_pending *pd);
/* The smallest retained mass over every (layer, stored head) if the member
 * kept ladder C c (mass; c from its own C* to C_max); the other modes: of what they
 * kept, c ignored. +inf when no head has a mass (nothing voted). */
float skv_pending_min_mass(const struct skv_pending *pd, uint32_t c);
/* Outputs for the group's decision: c_star (mass: from its own C* to C_max, else
 * ignored), fallback (needs fallback_below > 0: the outputs have room for
 * L). res as skv_compact_budget(); res->fallback is the decision. Frees pd,
 * also on failure. 0, -EINVAL. */
int skv_compact_end(struct skv_ctx *ctx, struct skv_pending *pd, uint32_t c_star, int fallback,
		    struct skv_budget_result *res, struct skv_error *err);
void skv_pending_free(struct skv_pending *pd);

/* Capacity ledger of SPEC.md for one cache. */
struct skv_ledger_in {
	uint64_t batch;	 /* B                          */
	uint64_t layers; /* N                          */
	uint64_t h_q;
	uint64_t h_kv;
	uint64_t head_dim;    /* D                          */
	uint64_t dtype_bytes; /* s                          */
	uint64_t prompt_len;  /* L                          */
	union {
		uint64_t budget; /* C                          */
		uint64_t capacity SKV_DEPRECATED("skv_ledger_in.capacity is now budget (C)");
	};
	uint64_t appended; /* g                          */
	uint64_t reserve;  /* decode slots allocated per stored head (>= g) */
	enum skv_gqa gqa;
};

struct skv_ledger {
	uint64_t native_full; /* 2*B*N*H_kv*(L+g)*D*s                   */
	uint64_t compact;     /* 2*B*N*H_store*(min(L,C)+g)*D*s         */
	uint64_t index;	      /* 4*B*N*H_store*(min(L,C)+g)             */
	uint64_t reserved;    /* allocated-but-unused decode headroom:
				 2*B*N*H_store*(reserve-g)*D*s           */
	uint64_t h_store;
};

/* -EINVAL on zero sizes or g > reserve; -EOVERFLOW when a product overflows. */
int skv_ledger_compute(const struct skv_ledger_in *in, struct skv_ledger *ret);

/*
 * The summed ledger of SPEC.md's budget modes: kept[n_kept] per (layer,
 * stored head), n_kept = N * H_store; compact 2*B*s*D*sum(kept + g), index
 * 4*B*sum(kept + g); native_full and reserved as skv_ledger_compute() (which
 * it equals for equal counts). capacity is not read. -EINVAL, -EOVERFLOW.
 */
int skv_ledger_sum(const struct skv_ledger_in *in, const uint32_t *kept, uint64_t n_kept,
		   struct skv_ledger *ret);

#ifdef __cplusplus
}
#endif
#endif /* SKV_H */
