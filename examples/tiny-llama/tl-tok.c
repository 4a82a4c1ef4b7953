// SPDX-License-Identifier: MIT
#include "tl-tok.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unicode/uchar.h>

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
	if (t->raw)
		for (uint32_t i = 0; i < t->n_vocab; i++)
			free(t->raw[i]);
	free(t->raw);
	free(t->raw_len);
	free(t->merges);
	free(t->special);
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

/* ---- byte-level BPE ---- */

/*
 * GPT-2's printable stand-in for each byte: '!'..'~', U+00A1..U+00AC and
 * U+00AE..U+00FF stand for themselves, the other 68 bytes (0x00-0x20,
 * 0x7f-0xa0, 0xad) for U+0100 on, in byte order.
 */
static uint32_t byte_cp(unsigned b)
{
	if (b <= 0x20)
		return 0x100 + b;
	if (b >= 0x7f && b <= 0xa0)
		return 0x100 + 33 + (b - 0x7f);
	if (b == 0xad)
		return 0x100 + 33 + 34;
	return b;
}

static size_t put_utf8(uint32_t cp, char *o)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	o[0] = (char)(0xc0 | (cp >> 6));
	o[1] = (char)(0x80 | (cp & 0x3f));
	return 2; /* byte_cp() stays below U+0800 */
}

/*
 * The code point at s[0..n) and its length; a malformed sequence is its
 * first byte alone, as U+FFFD.
 */
static size_t get_utf8(const unsigned char *s, size_t n, uint32_t *ret_cp)
{
	size_t len = s[0] < 0x80	     ? 1
		     : (s[0] & 0xe0) == 0xc0 ? 2
		     : (s[0] & 0xf0) == 0xe0 ? 3
		     : (s[0] & 0xf8) == 0xf0 ? 4
					     : 0;
	uint32_t cp;

	if (len == 0 || len > n) {
		*ret_cp = 0xfffd;
		return 1;
	}
	cp = len == 1 ? s[0] : s[0] & (0x7f >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80) {
			*ret_cp = 0xfffd;
			return 1;
		}
		cp = cp << 6 | (s[i] & 0x3f);
	}
	*ret_cp = cp;
	return len;
}

static int cmp_merge(const void *pa, const void *pb)
{
	const struct tl_tok_merge *a = pa, *b = pb;
	return (a->pair > b->pair) - (a->pair < b->pair);
}

static int cmp_special(const void *pa, const void *pb)
{
	uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
	/* longest first, so that a token that prefixes another never wins */
	return sort_ctx->piece_len[a] != sort_ctx->piece_len[b]
		   ? (sort_ctx->piece_len[a] < sort_ctx->piece_len[b]) -
			 (sort_ctx->piece_len[a] > sort_ctx->piece_len[b])
		   : (a > b) - (a < b);
}

static int bpe_load(const struct tl_gguf *g, struct tl_tok *t, struct tl_err *err)
{
	const struct tl_gguf_value *merges;
	int r;

	if ((r = get_arr(g, "tokenizer.ggml.merges", TL_GGUF_STRING, &merges, err)) < 0)
		return r;
	if (merges->arr.n > TL_TOK_MAX_VOCAB)
		return tl_fail(err, -EBADMSG, "tokenizer: %llu merges",
			       (unsigned long long)merges->arr.n);
	/* SmolLM2's vocabulary has no token for most control bytes (0x00-0x1f
	 * less \t \n \r, 0x7f): -1, and they are dropped, as Hugging Face's BPE
	 * without an unknown token drops them */
	for (unsigned b = 0; b < 256; b++) {
		char c[2];
		size_t n = put_utf8(byte_cp(b), c);
		t->byte_id[b] = tl_tok_lookup(t, c, n);
	}
	t->merges = calloc(merges->arr.n + 1, sizeof(*t->merges));
	t->raw = calloc(t->n_vocab, sizeof(*t->raw));
	t->raw_len = calloc(t->n_vocab, sizeof(*t->raw_len));
	t->special = calloc(t->n_vocab, sizeof(*t->special));
	if (!t->merges || !t->raw || !t->raw_len || !t->special)
		return tl_fail(err, -ENOMEM, "tokenizer: out of memory");
	/* "a b": the pieces of both sides (pieces hold no ' ': spaces are 'Ġ') */
	for (uint64_t i = 0; i < merges->arr.n; i++) {
		struct tl_str m = merges->arr.strs[i];
		const char *sp = memchr(m.p, ' ', m.n);
		char buf[2 * TL_TOK_MAX_PIECE];
		if (!sp || m.n - 1 > sizeof(buf))
			return tl_fail(err, -EBADMSG, "tokenizer: merge %llu is not 'a b'",
				       (unsigned long long)i);
		size_t la = (size_t)(sp - m.p), lb = m.n - la - 1;
		int32_t a = tl_tok_lookup(t, m.p, la), b = tl_tok_lookup(t, sp + 1, lb), ab;
		memcpy(buf, m.p, la);
		memcpy(buf + la, sp + 1, lb);
		ab = tl_tok_lookup(t, buf, la + lb);
		if (a < 0 || b < 0 || ab < 0)
			return tl_fail(err, -EBADMSG,
				       "tokenizer: merge %llu '%.*s' names a piece not in the "
				       "vocabulary",
				       (unsigned long long)i, (int)(m.n > 64 ? 64 : m.n), m.p);
		t->merges[t->n_merges++] =
		    (struct tl_tok_merge){.pair = (uint64_t)a << 32 | (uint32_t)b,
					  .rank = (uint32_t)i,
					  .id = (uint32_t)ab};
	}
	qsort(t->merges, t->n_merges, sizeof(*t->merges), cmp_merge);
	/* a pair listed twice: the earlier rule is the one that applies */
	for (uint32_t i = 1, o = 1; i <= t->n_merges; i++) {
		if (i == t->n_merges) {
			t->n_merges = t->n_merges ? o : 0;
			break;
		}
		if (t->merges[i].pair == t->merges[o - 1].pair) {
			if (t->merges[i].rank < t->merges[o - 1].rank)
				t->merges[o - 1] = t->merges[i];
		} else {
			t->merges[o++] = t->merges[i];
		}
	}
	int16_t rev[512];
	memset(rev, 0xff, sizeof(rev));
	for (unsigned b = 0; b < 256; b++)
		rev[byte_cp(b)] = (int16_t)b;
	for (uint32_t i = 0; i < t->n_vocab; i++) {
		const unsigned char *p = (const unsigned char *)t->pieces[i];
		size_t n = t->piece_len[i], o = 0;
		if (!(t->raw[i] = malloc(n + 1)))
			return tl_fail(err, -ENOMEM, "tokenizer: out of memory");
		if (t->types[i] == TL_TOK_CONTROL || t->types[i] == TL_TOK_USER) {
			if (n)
				t->special[t->n_special++] = i;
			if (t->types[i] == TL_TOK_CONTROL) {
				t->raw_len[i] = 0;
				continue;
			}
		}
		for (size_t k = 0; k < n;) {
			uint32_t cp;
			size_t cl = get_utf8(p + k, n - k, &cp);
			int b = cp < 512 ? rev[cp] : -1;
			if (b >= 0) {
				t->raw[i][o++] = (char)b;
			} else { /* not a byte character: the piece's own bytes */
				memcpy(t->raw[i] + o, p + k, cl);
				o += cl;
			}
			k += cl;
		}
		t->raw_len[i] = (uint32_t)o;
	}
	sort_ctx = t;
	qsort(t->special, t->n_special, sizeof(*t->special), cmp_special);
	sort_ctx = NULL;
	return 0;
}

int tl_tok_load(const struct tl_gguf *g, struct tl_tok **ret_tok, struct tl_err *err)
{
	const struct tl_gguf_value *toks, *scores, *types = NULL;
	struct tl_tok *t;
	int r;

	const struct tl_gguf_kv *model = tl_gguf_find_kv(g, "tokenizer.ggml.model");
	enum tl_tok_kind kind = TL_TOK_SPM;

	if (model && model->val.type == TL_GGUF_STRING && tl_str_eq(model->val.s, "gpt2"))
		kind = TL_TOK_BPE;
	else if (model && !(model->val.type == TL_GGUF_STRING && tl_str_eq(model->val.s, "llama")))
		return tl_fail(err, -EBADMSG,
			       "tokenizer: tokenizer.ggml.model is not llama or gpt2");
	if ((r = get_arr(g, "tokenizer.ggml.tokens", TL_GGUF_STRING, &toks, err)) < 0)
		return r;
	if (kind == TL_TOK_SPM &&
	    (r = get_arr(g, "tokenizer.ggml.scores", TL_GGUF_FLOAT32, &scores, err)) < 0)
		return r;
	if (kind == TL_TOK_BPE)
		scores = NULL;
	if (tl_gguf_find_kv(g, "tokenizer.ggml.token_type") &&
	    (r = get_arr(g, "tokenizer.ggml.token_type", TL_GGUF_INT32, &types, err)) < 0)
		return r;
	if (toks->arr.n == 0 || toks->arr.n > TL_TOK_MAX_VOCAB)
		return tl_fail(err, -EBADMSG,
			       "tokenizer: vocabulary of %llu tokens (1..%u allowed)",
			       (unsigned long long)toks->arr.n, TL_TOK_MAX_VOCAB);
	if ((scores && scores->arr.n != toks->arr.n) || (types && types->arr.n != toks->arr.n))
		return tl_fail(err, -EBADMSG, "tokenizer: %llu tokens but %llu scores / %llu types",
			       (unsigned long long)toks->arr.n,
			       scores ? (unsigned long long)scores->arr.n : 0ull,
			       types ? (unsigned long long)types->arr.n : 0ull);

	t = calloc(1, sizeof(*t));
	if (!t)
		return tl_fail(err, -ENOMEM, "tokenizer: out of memory");
	t->kind = kind;
	t->add_bos = kind == TL_TOK_SPM;
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
		if (scores)
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
	const struct tl_gguf_kv *ab = tl_gguf_find_kv(g, "tokenizer.ggml.add_bos_token");
	if (ab && ab->val.type == TL_GGUF_BOOL)
		t->add_bos = (int)ab->val.u;
	if (kind == TL_TOK_BPE && (r = bpe_load(g, t, err)) < 0)
		goto fail;
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

/* ---- byte-level BPE encoding ---- */

enum { CL_OTHER, CL_LETTER, CL_NUMBER, CL_SPACE };

static int cp_class(uint32_t cp)
{
	if (u_isUWhiteSpace((UChar32)cp))
		return CL_SPACE;
	switch (u_charType((UChar32)cp)) {
	case U_UPPERCASE_LETTER:
	case U_LOWERCASE_LETTER:
	case U_TITLECASE_LETTER:
	case U_MODIFIER_LETTER:
	case U_OTHER_LETTER:
		return CL_LETTER;
	case U_DECIMAL_DIGIT_NUMBER:
	case U_LETTER_NUMBER:
	case U_OTHER_NUMBER:
		return CL_NUMBER;
	default:
		return CL_OTHER;
	}
}

/*
 * End of the GPT-2 pre-tokenizer's match at code point i of a string that
 * ends at e and holds no digit:
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 */
static size_t gpt2_match(const uint32_t *cp, const uint8_t *cl, size_t i, size_t e)
{
	size_t j = i, k;

	if (cp[i] == '\'' && i + 1 < e) {
		uint32_t a = cp[i + 1], b = i + 2 < e ? cp[i + 2] : 0;
		if (a == 's' || a == 't' || a == 'm' || a == 'd')
			return i + 2;
		if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
			return i + 3;
	}
	if (cp[i] == ' ' && i + 1 < e && cl[i + 1] != CL_SPACE)
		j = i + 1;
	if (cl[j] == CL_LETTER || cl[j] == CL_OTHER) {
		for (k = j; k < e && cl[k] == cl[j]; k++)
			;
		return k;
	}
	for (k = i; k < e && cl[k] == CL_SPACE; k++)
		;
	/* \s+(?!\S) leaves the run's last space to the word after it */
	return k < e && k - i >= 2 ? k - 1 : k;
}

static const struct tl_tok_merge *find_merge(const struct tl_tok *t, uint32_t a, uint32_t b)
{
	struct tl_tok_merge key = {.pair = (uint64_t)a << 32 | b};
	return bsearch(&key, t->merges, t->n_merges, sizeof(key), cmp_merge);
}

/* The bytes s[0..n) of one piece, merged, appended to ids[*n_ids]. */
static void bpe_piece(const struct tl_tok *t, const unsigned char *s, size_t n, int32_t *ids,
		      size_t *n_ids)
{
	int32_t *sym = ids + *n_ids;
	size_t m = n;

	m = 0;
	for (size_t i = 0; i < n; i++)
		if (t->byte_id[s[i]] >= 0)
			sym[m++] = t->byte_id[s[i]];
	/* the earliest rule first, the leftmost pair on a tie */
	while (m > 1) {
		const struct tl_tok_merge *best = NULL;
		size_t at = 0;
		for (size_t i = 0; i + 1 < m; i++) {
			const struct tl_tok_merge *mg =
			    find_merge(t, (uint32_t)sym[i], (uint32_t)sym[i + 1]);
			if (mg && (!best || mg->rank < best->rank)) {
				best = mg;
				at = i;
			}
		}
		if (!best)
			break;
		sym[at] = (int32_t)best->id;
		memmove(&sym[at + 1], &sym[at + 2], (m - at - 2) * sizeof(*sym));
		m--;
	}
	*n_ids += m;
}

/* Text without control tokens: digits alone, GPT-2 pieces between them. */
static int bpe_plain(const struct tl_tok *t, const char *text, size_t len, int32_t *ids,
		     size_t *n_ids)
{
	uint32_t *cp = malloc(sizeof(*cp) * (len + 1));
	size_t *off = malloc(sizeof(*off) * (len + 1));
	uint8_t *cl = malloc(len + 1);
	size_t n = 0;

	if (!cp || !off || !cl) {
		free(cp);
		free(off);
		free(cl);
		return -ENOMEM;
	}
	for (size_t b = 0; b < len; n++) {
		off[n] = b;
		b += get_utf8((const unsigned char *)text + b, len - b, &cp[n]);
		cl[n] = (uint8_t)cp_class(cp[n]);
	}
	off[n] = len;
	for (size_t i = 0; i < n;) {
		size_t j = i + 1;
		if (cl[i] != CL_NUMBER) {
			size_t e = i;
			while (e < n && cl[e] != CL_NUMBER)
				e++;
			j = gpt2_match(cp, cl, i, e);
		}
		bpe_piece(t, (const unsigned char *)text + off[i], off[j] - off[i], ids, n_ids);
		i = j;
	}
	free(cp);
	free(off);
	free(cl);
	return 0;
}

/* The control token written at text[0..], longest first; -1 when none. */
static int32_t special_at(const struct tl_tok *t, const char *text, size_t left)
{
	for (uint32_t i = 0; i < t->n_special; i++) {
		uint32_t id = t->special[i];
		if (t->piece_len[id] <= left && text[0] == t->pieces[id][0] &&
		    !memcmp(text, t->pieces[id], t->piece_len[id]))
			return (int32_t)id;
	}
	return -1;
}

static int bpe_encode(const struct tl_tok *t, const char *text, int add_bos, uint32_t *out,
		      size_t max, size_t *ret_n)
{
	size_t len = strlen(text), n = 0, seg = 0;
	int32_t *ids = malloc(sizeof(*ids) * (len + 2));
	int r = 0;

	if (!ids)
		return -ENOMEM;
	if (add_bos)
		ids[n++] = (int32_t)t->bos;
	for (size_t i = 0; i <= len; i++) {
		int32_t sp = i < len ? special_at(t, text + i, len - i) : -1;
		if (sp < 0 && i < len)
			continue;
		if (i > seg && (r = bpe_plain(t, text + seg, i - seg, ids, &n)) < 0)
			goto out;
		if (sp >= 0) {
			ids[n++] = sp;
			i += t->piece_len[sp] - 1;
		}
		seg = i + 1;
	}
	if (n > max) {
		r = -ENOSPC;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		out[i] = (uint32_t)ids[i];
	*ret_n = n;
out:
	free(ids);
	return r;
}

int tl_tok_encode(const struct tl_tok *t, const char *text, int add_bos, uint32_t *out, size_t max,
		  size_t *ret_n)
{
	if (t->kind == TL_TOK_BPE)
		return bpe_encode(t, text, add_bos, out, max, ret_n);
	size_t tlen = strlen(text);
	/* Normalised text: '▁' + text with every ' ' turned into '▁'. */
	size_t cap = SPACE_MARK_LEN * (tlen + 1) + 1;
	char *norm = malloc(cap);
	int32_t *ids = malloc(sizeof(*ids) * (cap + 1));
	char *pair;
	size_t n = 0, nl = 0;
	int r = 0;

	pair = malloc(2 * (size_t)t->max_piece_len + 1);

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
	if (t->kind == TL_TOK_BPE) {
		n = t->raw_len[tok] < cap - 1 ? t->raw_len[tok] : cap - 1;
		memcpy(buf, t->raw[tok], n);
		buf[n] = 0;
		return n;
	}
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
