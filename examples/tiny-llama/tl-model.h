/* SPDX-License-Identifier: MIT */
/*
 * tl-model.h - a small Llama forward pass (F32, one token at a time) over a
 * KV cache that is an abstraction: the full cache of a plain engine, or a
 * compact cache as SnapKV compaction leaves it.
 *
 * A KV cache (struct tl_kv) is, per layer, H_store stored heads of strided
 * K and V rows (the shape of skv_layer_out in kernels/skv.h and of the
 * daemon's compact cache, HND or NHD, in memory the cache may not own),
 * an int32 table of each slot's original position, `len` filled slots of
 * `cap`, and the logical position of the next token.
 *   - full cache:     H_store = H_kv, slot i holds position i;
 *   - compact group:  H_store = H_kv, slots 0..kept-1 hold the kept positions;
 *   - compact expand: H_store = H_q (query head h reads stored head h).
 * Query head h reads stored head h / (H_q / H_store). Keys are stored after
 * RoPE and never re-rotated, so attention needs no positions: a new token
 * is rotated at next_pos (L + g after compaction, never kept + g), and its
 * K/V land at physical slot len (kept + g), with next_pos recorded.
 */
#ifndef TL_MODEL_H
#define TL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "tl-gguf.h"
#include "tl-tok.h"

struct tl_config {
	uint32_t dim;
	uint32_t n_layers;
	uint32_t n_heads;    /* H_q  */
	uint32_t n_kv_heads; /* H_kv */
	uint32_t head_dim;   /* D    */
	uint32_t hidden_dim;
	uint32_t vocab_size;
	uint32_t ctx_len; /* from metadata; the model may have been trained on less */
	float norm_eps;
	float rope_base;
};

struct tl_layer_w {
	const float *attn_norm; /* [dim]                 */
	const float *wq;	/* [H_q*D][dim]          */
	const float *wk;	/* [H_kv*D][dim]         */
	const float *wv;	/* [H_kv*D][dim]         */
	const float *wo;	/* [dim][H_q*D]          */
	const float *ffn_norm;	/* [dim]                 */
	const float *w_gate;	/* [hidden][dim]         */
	const float *w_up;	/* [hidden][dim]         */
	const float *w_down;	/* [dim][hidden]         */
};

struct tl_model {
	struct tl_config cfg;
	struct tl_gguf *gguf; /* owns the weights */
	struct tl_tok *tok;
	const float *tok_embd; /* [vocab][dim] */
	const float *out_norm; /* [dim]        */
	const float *output;   /* [vocab][dim] */
	struct tl_layer_w *layers;
	float **owned; /* dequantized copies of the tensors that are not F32 */
	uint32_t n_owned;
};

/* Limits on shapes the loader accepts. */
#define TL_MAX_DIM    16384u
#define TL_MAX_LAYERS 1024u
#define TL_MAX_HEADS  1024u

/* 0, -EBADMSG (missing/mis-shaped tensor or metadata, with reason), -ENOMEM, open errors. */
int tl_model_load(const char *path, struct tl_model **ret_m, struct tl_err *err);
/* Takes ownership of g on success and on failure. */
int tl_model_from_gguf(struct tl_gguf *g, struct tl_model **ret_m, struct tl_err *err);
void tl_model_free(struct tl_model *m);

struct tl_kv_layer {
	float *k; /* element (h, slot, d) at k[h*head_stride + slot*token_stride + d] */
	float *v;
	int64_t head_stride; /* elements */
	int64_t token_stride;
	/* pos[h*pos_stride + slot]: original position of the slot; NULL when
	 * the owner keeps the table (the daemon records L + g on APPEND). */
	int32_t *pos;
	uint32_t pos_stride;
	/* [h_store] filled slots of each stored head when they differ (the
	 * ragged budget modes of SPEC.md), owned by the caller; NULL: len for
	 * every head. tl_forward appends at head_len[h] and counts it up. */
	uint32_t *head_len;
	/* [h_store] element offset of stored head h's slot 0 from k (and v)
	 * when the heads do not sit head_stride apart (a ragged cache in the
	 * daemon's arena: one row block per layer); NULL: h * head_stride. */
	const int64_t *head_off;
};

struct tl_kv {
	uint32_t n_layers;
	uint32_t h_store;
	uint32_t head_dim;
	uint32_t len;	   /* filled slots, the same for every stored head   */
	uint32_t cap;	   /* slots available per stored head                */
	uint32_t next_pos; /* logical position of the next token             */
	struct tl_kv_layer *layers;
	void *mem; /* K, V and positions when the cache owns them, else NULL */
	/* [n_layers][h_store] behind layers[].head_len when the cache owns
	 * them (tl_compact_budget()), else NULL; freed with the cache */
	uint32_t *head_lens;
	int64_t *head_offs; /* likewise behind layers[].head_off */
};

/*
 * A cache with its own memory, HND: h_store of H_kv (full or group) or H_q
 * (expand), cap slots per head, empty (len 0, next_pos 0). -EINVAL, -ENOMEM.
 */
int tl_kv_new(const struct tl_config *c, uint32_t h_store, uint32_t cap, struct tl_kv **ret_kv);
/*
 * A cache over memory owned elsewhere (e.g. a daemon arena): layers[] is
 * filled by the caller afterwards; len and next_pos too.
 */
int tl_kv_new_view(const struct tl_config *c, uint32_t h_store, uint32_t cap,
		   struct tl_kv **ret_kv);
/* Bytes of an HND cache as tl_kv_place() lays it out. */
uint64_t tl_kv_bytes(const struct tl_config *c, uint32_t h_store, uint32_t cap);
/*
 * Point a view's layers at mem (HND; per layer K [h][cap][D], V, then int32
 * positions [h][cap]), e.g. a memfd registered with the daemon. -EINVAL when
 * bytes is too small or mem not 4-byte aligned.
 */
int tl_kv_place(struct tl_kv *kv, void *mem, uint64_t bytes);
/* Grow an owning cache to new_cap slots (contents kept). -EINVAL for a view. */
int tl_kv_grow(struct tl_kv *kv, uint32_t new_cap);
void tl_kv_free(struct tl_kv *kv);

/*
 * Where to copy post-RoPE queries during a prefill: for layer l, the query of
 * position p in [first, first + n) and head h goes to
 * q + ((l * H_q + h) * n + (p - first)) * D, i.e. [layers][H_q][n][D].
 */
struct tl_qcap {
	float *q;
	uint32_t first;
	uint32_t n;
};

/* Per-sequence scratch. */
struct tl_state;
int tl_state_new(const struct tl_model *m, struct tl_state **ret_s);
void tl_state_free(struct tl_state *s);
/* The logits of the last forward ([vocab]). */
const float *tl_state_logits(const struct tl_state *s);

/*
 * Run one token: rotate at kv->next_pos, append K/V at slot kv->len (with
 * next_pos in the position table), attend over every filled slot, and
 * leave logits in the state. -ENOSPC when the cache is full (nothing
 * changed), -EINVAL on a bad token or a cache of another shape.
 */
int tl_forward(const struct tl_model *m, struct tl_state *s, struct tl_kv *kv, uint32_t token,
	       const struct tl_qcap *qcap);
/* tl_forward over n tokens; qcap may be NULL. */
int tl_prefill(const struct tl_model *m, struct tl_state *s, struct tl_kv *kv,
	       const uint32_t *tokens, uint32_t n, const struct tl_qcap *qcap);

/* Seeded RNG (xorshift64*), as llama2.c samples. */
struct tl_rng {
	uint64_t s;
};
void tl_rng_seed(struct tl_rng *r, uint64_t seed);
uint32_t tl_rng_u32(struct tl_rng *r);
float tl_rng_f32(struct tl_rng *r); /* [0, 1) */

/* Index of the largest logit, the lowest index on ties. */
uint32_t tl_argmax(const float *logits, uint32_t n);
/*
 * temp <= 0: argmax. Otherwise sample from softmax(logits / temp); probs is
 * n floats of scratch.
 */
uint32_t tl_sample(const float *logits, uint32_t n, float temp, struct tl_rng *rng, float *probs);

#endif /* TL_MODEL_H */
