/* SPDX-License-Identifier: MIT */
/*
 * tl-tok.h - the two tokenizers a GGUF Llama ships (tokenizer.ggml.model):
 *
 * "llama": SentencePiece-BPE from tokenizer.ggml.{tokens,scores,token_type},
 * as llama2.c encodes: a leading '▁' (U+2581) is prepended, spaces become
 * '▁', text is split into UTF-8 code points, unknown ones fall back to
 * <0xNN> byte tokens, then the adjacent pair whose merge is in the
 * vocabulary with the highest score is merged until none is left.
 *
 * "gpt2": byte-level BPE from tokenizer.ggml.{tokens,merges,token_type}, as
 * Hugging Face tokenizers encodes SmolLM2 (tokenizer.ggml.pre "smollm"):
 * control tokens written in the text (<|im_start|>) are matched first and
 * become their ids; the rest is split into every digit on its own (\p{N})
 * and the GPT-2 pre-tokenizer's pieces ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|
 * ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, Unicode classes from ICU),
 * each piece's bytes are mapped to GPT-2's printable byte characters, and
 * the adjacent pair with the earliest merge rule is merged until none is
 * left. No BOS is added (tokenizer.ggml.add_bos_token false): a chat
 * prompt starts with its own <|im_start|>.
 */
#ifndef TL_TOK_H
#define TL_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "tl-gguf.h"

#define TL_TOK_MAX_VOCAB 1000000u
#define TL_TOK_MAX_PIECE 1024u

enum tl_tok_type {
	TL_TOK_NORMAL = 1,
	TL_TOK_UNKNOWN = 2,
	TL_TOK_CONTROL = 3,
	TL_TOK_USER = 4,
	TL_TOK_UNUSED = 5,
	TL_TOK_BYTE = 6,
};

enum tl_tok_kind { TL_TOK_SPM, TL_TOK_BPE };

/* One merge rule of a byte-level BPE: the pair (a, b) becomes id, rank first. */
struct tl_tok_merge {
	uint64_t pair; /* a << 32 | b */
	uint32_t rank;
	uint32_t id;
};

struct tl_tok {
	enum tl_tok_kind kind;
	int add_bos; /* tokenizer.ggml.add_bos_token, else 1 for SPM and 0 for BPE */
	uint32_t n_vocab;
	char **pieces; /* NUL-terminated copies */
	uint32_t *piece_len;
	float *scores;
	int32_t *types;
	uint32_t *sorted;      /* ids sorted by piece, for lookup */
	int32_t byte_tok[256]; /* <0xNN> token of each byte, -1 if none */
	uint32_t bos, eos, unk;
	uint32_t max_piece_len;
	/* BPE only */
	struct tl_tok_merge *merges; /* sorted by pair */
	uint32_t n_merges;
	int32_t byte_id[256]; /* the token of each byte's printable character, or -1 */
	char **raw;	      /* each token's bytes (the printable characters undone) */
	uint32_t *raw_len;
	uint32_t *special; /* control tokens matched in the text, longest first */
	uint32_t n_special;
};

/* 0, -EBADMSG (missing/inconsistent vocabulary, with reason), -ENOMEM. */
int tl_tok_load(const struct tl_gguf *g, struct tl_tok **ret_tok, struct tl_err *err);
void tl_tok_free(struct tl_tok *t);

/* -1 when the piece is not in the vocabulary. */
int32_t tl_tok_lookup(const struct tl_tok *t, const char *s, size_t n);

/*
 * Encode text. Writes at most max tokens to out; *ret_n gets the count.
 * add_bos: prepend BOS (callers pass t->add_bos for the model's own rule).
 * -ENOSPC when out is too small, -ENOMEM.
 */
int tl_tok_encode(const struct tl_tok *t, const char *text, int add_bos, uint32_t *out, size_t max,
		  size_t *ret_n);

/*
 * The text of token `tok` following token `prev`, into buf (NUL-terminated).
 * Control tokens give ""; SPM: a byte token gives its byte, '▁' becomes ' ',
 * and the leading space of the first piece after BOS is dropped; BPE: the
 * token's bytes (a character may span tokens). Returns length.
 */
size_t tl_tok_decode(const struct tl_tok *t, uint32_t prev, uint32_t tok, char *buf, size_t cap);

#endif /* TL_TOK_H */
