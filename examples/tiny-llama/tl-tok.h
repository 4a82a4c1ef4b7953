/* SPDX-License-Identifier: MIT */
/*
 * tl-tok.h - SentencePiece-BPE tokenizer built from a GGUF vocabulary
 * (tokenizer.ggml.tokens, .scores, .token_type), as llama2.c encodes:
 * a leading '▁' (U+2581) is prepended, spaces become '▁', text is split into
 * UTF-8 code points, unknown ones fall back to <0xNN> byte tokens, then the
 * adjacent pair whose merge is in the vocabulary with the highest score is
 * merged until none is left.
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

struct tl_tok {
	uint32_t n_vocab;
	char **pieces; /* NUL-terminated copies */
	uint32_t *piece_len;
	float *scores;
	int32_t *types;
	uint32_t *sorted;      /* ids sorted by piece, for lookup */
	int32_t byte_tok[256]; /* <0xNN> token of each byte, -1 if none */
	uint32_t bos, eos, unk;
	uint32_t max_piece_len;
};

/* 0, -EBADMSG (missing/inconsistent vocabulary, with reason), -ENOMEM. */
int tl_tok_load(const struct tl_gguf *g, struct tl_tok **ret_tok, struct tl_err *err);
void tl_tok_free(struct tl_tok *t);

/* -1 when the piece is not in the vocabulary. */
int32_t tl_tok_lookup(const struct tl_tok *t, const char *s, size_t n);

/*
 * Encode text. Writes at most max tokens to out; *ret_n gets the count.
 * -ENOSPC when out is too small, -ENOMEM.
 */
int tl_tok_encode(const struct tl_tok *t, const char *text, int add_bos, uint32_t *out, size_t max,
		  size_t *ret_n);

/*
 * The text of token `tok` following token `prev`, into buf (NUL-terminated).
 * Control tokens give ""; a byte token gives its byte; '▁' becomes ' ', and
 * the leading space of the first piece after BOS is dropped. Returns length.
 */
size_t tl_tok_decode(const struct tl_tok *t, uint32_t prev, uint32_t tok, char *buf, size_t cap);

#endif /* TL_TOK_H */
