// SPDX-License-Identifier: MIT
#include "tl-tok.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE_MARK     "\xe2\x96\x81" /* U+2581 '▁' */
#define SPACE_MARK_LEN 3

void tl_tok_free(struct tl_tok *t)
{
	if (!t)
		return;
	if (t->pieces)
		for (uint32_t i = 0; i < t->n_vocab; i++)
			free(t->pieces[i]);
	free(t->pieces);
	free(t->piece_len);
	free(t->scores);
	free(t->types);
	free(t->sorted);
	free(t);
}

static const struct tl_tok *sort_ctx;

static int cmp_piece(const char *a, size_t na, const char *b, size_t nb)
{
	int c = memcmp(a, b, na < nb ? na : nb);
	if (c)
		return c;
	return na < nb ? -1 : na > nb;
}

static int cmp_ids(const void *pa, const void *pb)
{
	uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
	int c = cmp_piece(sort_ctx->pieces[a], sort_ctx->piece_len[a], sort_ctx->pieces[b],
			  sort_ctx->piece_len[b]);
	/* Duplicate pieces: the lower id wins the lookup. */
	return c ? c : (a > b) - (a < b);
}

int32_t tl_tok_lookup(const struct tl_tok *t, const char *s, size_t n)
{
	size_t lo = 0, hi = t->n_vocab;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint32_t id = t->sorted[mid];
		if (cmp_piece(t->pieces[id], t->piece_len[id], s, n) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < t->n_vocab) {
		uint32_t id = t->sorted[lo];
		if (!cmp_piece(t->pieces[id], t->piece_len[id], s, n))
			return (int32_t)id;
	}
	return -1;
}

static int get_arr(const struct tl_gguf *g, const char *key, enum tl_gguf_type et,
		   const struct tl_gguf_value **ret, struct tl_err *err)
{
	const struct tl_gguf_kv *kv = tl_gguf_find_kv(g, key);
	if (!kv)
		return tl_fail(err, -EBADMSG, "tokenizer: '%s' missing", key);
	if (kv->val.type != TL_GGUF_ARRAY || kv->val.arr.type != et)
		return tl_fail(err, -EBADMSG, "tokenizer: '%s' is not an array of %s", key,
			       tl_gguf_type_name(et));
	*ret = &kv->val;
	return 0;
}

int tl_tok_load(const struct tl_gguf *g, struct tl_tok **ret_tok, struct tl_err *err)
{
	const struct tl_gguf_value *toks, *scores, *types = NULL;
	struct tl_tok *t;
	int r;

	if ((r = get_arr(g, "tokenizer.ggml.tokens", TL_GGUF_STRING, &toks, err)) < 0 ||
	    (r = get_arr(g, "tokenizer.ggml.scores", TL_GGUF_FLOAT32, &scores, err)) < 0)
		return r;
	if (tl_gguf_find_kv(g, "tokenizer.ggml.token_type") &&
	    (r = get_arr(g, "tokenizer.ggml.token_type", TL_GGUF_INT32, &types, err)) < 0)
		return r;
	if (toks->arr.n == 0 || toks->arr.n > TL_TOK_MAX_VOCAB)
		return tl_fail(err, -EBADMSG,
			       "tokenizer: vocabulary of %llu tokens (1..%u allowed)",
			       (unsigned long long)toks->arr.n, TL_TOK_MAX_VOCAB);
	if (scores->arr.n != toks->arr.n || (types && types->arr.n != toks->arr.n))
		return tl_fail(err, -EBADMSG, "tokenizer: %llu tokens but %llu scores / %llu types",
			       (unsigned long long)toks->arr.n, (unsigned long long)scores->arr.n,
			       types ? (unsigned long long)types->arr.n : 0ull);

	t = calloc(1, sizeof(*t));
	if (!t)
		return tl_fail(err, -ENOMEM, "tokenizer: out of memory");
	t->n_vocab = (uint32_t)toks->arr.n;
	t->pieces = calloc(t->n_vocab, sizeof(*t->pieces));
	t->piece_len = calloc(t->n_vocab, sizeof(*t->piece_len));
	t->scores = calloc(t->n_vocab, sizeof(*t->scores));
	t->types = calloc(t->n_vocab, sizeof(*t->types));
	t->sorted = calloc(t->n_vocab, sizeof(*t->sorted));
	if (!t->pieces || !t->piece_len || !t->scores || !t->types || !t->sorted) {
		r = tl_fail(err, -ENOMEM, "tokenizer: out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < t->n_vocab; i++) {
		struct tl_str s = toks->arr.strs[i];
		if (s.n > TL_TOK_MAX_PIECE) {
			r = tl_fail(err, -EBADMSG, "tokenizer: token %u is %llu bytes long", i,
				    (unsigned long long)s.n);
			goto fail;
		}
		t->pieces[i] = malloc(s.n + 1);
		if (!t->pieces[i]) {
			r = tl_fail(err, -ENOMEM, "tokenizer: out of memory");
			goto fail;
		}
		memcpy(t->pieces[i], s.p, s.n);
		t->pieces[i][s.n] = 0;
		t->piece_len[i] = (uint32_t)s.n;
		if (s.n > t->max_piece_len)
			t->max_piece_len = (uint32_t)s.n;
		memcpy(&t->scores[i], scores->arr.data + 4 * (size_t)i, 4);
		if (types)
			memcpy(&t->types[i], types->arr.data + 4 * (size_t)i, 4);
		else
			t->types[i] = TL_TOK_NORMAL;
		t->sorted[i] = i;
	}
	sort_ctx = t;
	qsort(t->sorted, t->n_vocab, sizeof(*t->sorted), cmp_ids);
	sort_ctx = NULL;

	for (int b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof(name), "<0x%02X>", b);
		t->byte_tok[b] = tl_tok_lookup(t, name, 6);
	}
	t->unk = 0;
	t->bos = 1;
	t->eos = 2;
	if (tl_gguf_find_kv(g, "tokenizer.ggml.unknown_token_id") &&
	    (r = tl_gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &t->unk, err)) < 0)
		goto fail;
	if (tl_gguf_find_kv(g, "tokenizer.ggml.bos_token_id") &&
	    (r = tl_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &t->bos, err)) < 0)
		goto fail;
	if (tl_gguf_find_kv(g, "tokenizer.ggml.eos_token_id") &&
	    (r = tl_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &t->eos, err)) < 0)
		goto fail;
	if (t->unk >= t->n_vocab || t->bos >= t->n_vocab || t->eos >= t->n_vocab) {
		r = tl_fail(err, -EBADMSG, "tokenizer: special token id out of vocabulary");
		goto fail;
	}
	*ret_tok = t;
	return 0;
fail:
	tl_tok_free(t);
	return r;
}

static size_t utf8_len(unsigned char c)
{
	if (c < 0x80)
		return 1;
	if ((c & 0xe0) == 0xc0)
		return 2;
	if ((c & 0xf0) == 0xe0)
		return 3;
	if ((c & 0xf8) == 0xf0)
		return 4;
	return 1; /* stray continuation byte: one byte on its own */
}

int tl_tok_encode(const struct tl_tok *t, const char *text, int add_bos, uint32_t *out, size_t max,
		  size_t *ret_n)
{
	size_t tlen = strlen(text);
	/* Normalised text: '▁' + text with every ' ' turned into '▁'. */
	size_t cap = SPACE_MARK_LEN * (tlen + 1) + 1;
	char *norm = malloc(cap);
	int32_t *ids = malloc(sizeof(*ids) * (cap + 1));
	char *pair = malloc(2 * (size_t)t->max_piece_len + 1);
	size_t n = 0, nl = 0;
	int r = 0;

	if (!norm || !ids || !pair) {
		r = -ENOMEM;
		goto out;
	}
	if (add_bos)
		ids[n++] = (int32_t)t->bos;
	if (tlen) {
		memcpy(norm, SPACE_MARK, SPACE_MARK_LEN);
		nl = SPACE_MARK_LEN;
		for (size_t i = 0; i < tlen; i++) {
			if (text[i] == ' ') {
				memcpy(norm + nl, SPACE_MARK, SPACE_MARK_LEN);
				nl += SPACE_MARK_LEN;
			} else {
				norm[nl++] = text[i];
			}
		}
	}
	/* One token per code point, or one byte token per byte of an unknown one. */
	for (size_t i = 0; i < nl;) {
		size_t cl = utf8_len((unsigned char)norm[i]);
		if (cl > nl - i)
			cl = nl - i;
		int32_t id = tl_tok_lookup(t, norm + i, cl);
		if (id >= 0) {
			ids[n++] = id;
		} else {
			for (size_t b = 0; b < cl; b++) {
				int32_t bt = t->byte_tok[(unsigned char)norm[i + b]];
				ids[n++] = bt >= 0 ? bt : (int32_t)t->unk;
			}
		}
		i += cl;
	}
	/* Merge the best-scoring adjacent pair (leftmost on ties) until none merges. */
	for (;;) {
		float best = 0;
		int32_t best_id = -1;
		size_t best_i = 0;
		for (size_t i = (add_bos ? 1 : 0); i + 1 < n; i++) {
			uint32_t a = (uint32_t)ids[i], b = (uint32_t)ids[i + 1];
			size_t la = t->piece_len[a], lb = t->piece_len[b];
			memcpy(pair, t->pieces[a], la);
			memcpy(pair + la, t->pieces[b], lb);
			int32_t id = tl_tok_lookup(t, pair, la + lb);
			if (id >= 0 && (best_id < 0 || t->scores[id] > best)) {
				best = t->scores[id];
				best_id = id;
				best_i = i;
			}
		}
		if (best_id < 0)
			break;
		ids[best_i] = best_id;
		memmove(&ids[best_i + 1], &ids[best_i + 2], (n - best_i - 2) * sizeof(*ids));
		n--;
	}
	if (n > max) {
		r = -ENOSPC;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		out[i] = (uint32_t)ids[i];
	*ret_n = n;
out:
	free(norm);
	free(ids);
	free(pair);
	return r;
}

size_t tl_tok_decode(const struct tl_tok *t, uint32_t prev, uint32_t tok, char *buf, size_t cap)
{
	size_t n = 0;
	if (!cap)
		return 0;
	buf[0] = 0;
	if (tok >= t->n_vocab)
		return 0;
	const char *p = t->pieces[tok];
	size_t pl = t->piece_len[tok];
	if (t->types[tok] == TL_TOK_CONTROL || t->types[tok] == TL_TOK_UNUSED)
		return 0;
	if (t->types[tok] == TL_TOK_BYTE && pl == 6 && !memcmp(p, "<0x", 3)) {
		unsigned v;
		if (sscanf(p, "<0x%02X>", &v) == 1 && cap > 1) {
			buf[0] = (char)v;
			buf[1] = 0;
			return 1;
		}
		return 0;
	}
	for (size_t i = 0; i < pl && n + 1 < cap;) {
		if (pl - i >= SPACE_MARK_LEN && !memcmp(p + i, SPACE_MARK, SPACE_MARK_LEN)) {
			if (!(n == 0 && i == 0 && prev == t->bos))
				buf[n++] = ' ';
			i += SPACE_MARK_LEN;
		} else {
			buf[n++] = p[i++];
		}
	}
	buf[n] = 0;
	return n;
}
