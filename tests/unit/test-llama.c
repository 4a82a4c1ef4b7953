// SPDX-License-Identifier: MIT
/*
 * test-llama: the tiny-llama engine on a real trained model: GGUF parsing
 * (every metadata type, and corrupted files get errors, not crashes), the
 * tokenizer, greedy output against the model README's known text, and
 * decoding from caches compacted by libskv: bypass is bit-identical to the
 * full cache, positions continue at L + g, and a real compaction matches an
 * independent masked-attention reference, in expand and group mode.
 *
 * The model is $SHARED/models/stories260K.gguf (SHARED defaults to
 * ../shared); tests that need it are skipped (tests/test-skip.h) without it.
 */
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl-compact.h"
#include "tl-gguf.h"
#include "tl-model.h"
#include "tl-quant.h"
#include "tl-tok.h"
#include "tests/test-skip.h"

static char model_path[4096];
static uint8_t *model_buf;
static size_t model_len;
static struct tl_model *model;

static const char known_text[] = "Once upon a time, there was a little girl named Lily. She loved "
				 "to play outside in the park.";

/* main() registers the tests that need the model as skipped without it */
#define NEED_MODEL() CU_ASSERT_FATAL(model != NULL)

/* ---- a tiny GGUF writer, for synthetic files ---- */

struct wbuf {
	uint8_t *p;
	size_t n, cap;
};

static void w_bytes(struct wbuf *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		CU_ASSERT_FATAL(b->p != NULL);
	}
	memcpy(b->p + b->n, src, n);
	b->n += n;
}
static void w_u32(struct wbuf *b, uint32_t v)
{
	w_bytes(b, &v, 4);
}
static void w_u64(struct wbuf *b, uint64_t v)
{
	w_bytes(b, &v, 8);
}
static void w_str(struct wbuf *b, const char *s)
{
	w_u64(b, strlen(s));
	w_bytes(b, s, strlen(s));
}
static void w_key(struct wbuf *b, const char *k, uint32_t type)
{
	w_str(b, k);
	w_u32(b, type);
}

/*
 * A file with one key of every type, arrays of numbers, strings and arrays,
 * general.alignment 64 and two F32 tensors. *ret_tensor_off gets the file
 * offset of the second tensor's data-offset field, *ret_str_off that of the
 * first string length inside the string array.
 */
static void build_synthetic(struct wbuf *b, size_t *ret_tensor_off, size_t *ret_str_off)
{
	memset(b, 0, sizeof(*b));
	w_u32(b, TL_GGUF_MAGIC);
	w_u32(b, 3);
	w_u64(b, 2);  /* tensors */
	w_u64(b, 16); /* kv */
	uint8_t u8 = 200;
	int8_t i8 = -100;
	uint16_t u16 = 60000;
	int16_t i16 = -30000;
	int32_t i32 = -2000000000;
	float f32 = 1.5f;
	uint8_t bo = 1;
	uint64_t u64 = 1ull << 40;
	int64_t i64 = -(1ll << 40);
	double f64 = -2.25;
	w_key(b, "t.u8", TL_GGUF_UINT8), w_bytes(b, &u8, 1);
	w_key(b, "t.i8", TL_GGUF_INT8), w_bytes(b, &i8, 1);
	w_key(b, "t.u16", TL_GGUF_UINT16), w_bytes(b, &u16, 2);
	w_key(b, "t.i16", TL_GGUF_INT16), w_bytes(b, &i16, 2);
	w_key(b, "t.u32", TL_GGUF_UINT32), w_u32(b, 4000000000u);
	w_key(b, "t.i32", TL_GGUF_INT32), w_bytes(b, &i32, 4);
	w_key(b, "t.f32", TL_GGUF_FLOAT32), w_bytes(b, &f32, 4);
	w_key(b, "t.bool", TL_GGUF_BOOL), w_bytes(b, &bo, 1);
	w_key(b, "t.str", TL_GGUF_STRING), w_str(b, "hello");
	w_key(b, "t.u64", TL_GGUF_UINT64), w_bytes(b, &u64, 8);
	w_key(b, "t.i64", TL_GGUF_INT64), w_bytes(b, &i64, 8);
	w_key(b, "t.f64", TL_GGUF_FLOAT64), w_bytes(b, &f64, 8);
	w_key(b, "t.arr_u32", TL_GGUF_ARRAY), w_u32(b, TL_GGUF_UINT32), w_u64(b, 3);
	w_u32(b, 7), w_u32(b, 8), w_u32(b, 9);
	w_key(b, "t.arr_str", TL_GGUF_ARRAY), w_u32(b, TL_GGUF_STRING), w_u64(b, 2);
	*ret_str_off = b->n;
	w_str(b, "ab"), w_str(b, "");
	w_key(b, "t.arr_arr", TL_GGUF_ARRAY), w_u32(b, TL_GGUF_ARRAY), w_u64(b, 2);
	w_u32(b, TL_GGUF_INT16), w_u64(b, 1), w_bytes(b, &i16, 2);
	w_u32(b, TL_GGUF_STRING), w_u64(b, 1), w_str(b, "x");
	w_key(b, "general.alignment", TL_GGUF_UINT32), w_u32(b, 64);
	/* tensors: a [3] at 0, b [2, 2] at 64 */
	w_str(b, "a"), w_u32(b, 1), w_u64(b, 3), w_u32(b, TL_GGML_F32), w_u64(b, 0);
	w_str(b, "b"), w_u32(b, 2), w_u64(b, 2), w_u64(b, 2), w_u32(b, TL_GGML_F32);
	*ret_tensor_off = b->n;
	w_u64(b, 64);
	while (b->n % 64)
		w_bytes(b, "\0", 1);
	float a[16] = {1, 2, 3};
	float bt[4] = {4, 5, 6, 7};
	w_bytes(b, a, sizeof(a)); /* 64 bytes: tensor a, then padding */
	w_bytes(b, bt, sizeof(bt));
}

static void test_gguf_all_types(void)
{
	struct wbuf b;
	size_t toff, soff;
	struct tl_gguf *g = NULL;
	struct tl_err err = {{0}};
	build_synthetic(&b, &toff, &soff);

	int r = tl_gguf_open_mem(b.p, b.n, &g, &err);
	if (r < 0)
		printf("\n    %s\n", err.msg);
	CU_ASSERT_FATAL(r == 0);
	CU_ASSERT(g->n_kv == 16 && g->n_tensors == 2 && g->alignment == 64);
	CU_ASSERT(tl_gguf_find_kv(g, "t.u8")->val.u == 200);
	CU_ASSERT(tl_gguf_find_kv(g, "t.i8")->val.i == -100);
	CU_ASSERT(tl_gguf_find_kv(g, "t.u16")->val.u == 60000);
	CU_ASSERT(tl_gguf_find_kv(g, "t.i16")->val.i == -30000);
	CU_ASSERT(tl_gguf_find_kv(g, "t.u32")->val.u == 4000000000u);
	CU_ASSERT(tl_gguf_find_kv(g, "t.i32")->val.i == -2000000000);
	CU_ASSERT(tl_gguf_find_kv(g, "t.f32")->val.f == 1.5);
	CU_ASSERT(tl_gguf_find_kv(g, "t.bool")->val.u == 1);
	CU_ASSERT(tl_str_eq(tl_gguf_find_kv(g, "t.str")->val.s, "hello"));
	CU_ASSERT(tl_gguf_find_kv(g, "t.u64")->val.u == 1ull << 40);
	CU_ASSERT(tl_gguf_find_kv(g, "t.i64")->val.i == -(1ll << 40));
	CU_ASSERT(tl_gguf_find_kv(g, "t.f64")->val.f == -2.25);
	const struct tl_gguf_value *v = &tl_gguf_find_kv(g, "t.arr_u32")->val;
	CU_ASSERT(v->type == TL_GGUF_ARRAY && v->arr.type == TL_GGUF_UINT32 && v->arr.n == 3);
	uint32_t third;
	memcpy(&third, v->arr.data + 8, 4);
	CU_ASSERT(third == 9);
	v = &tl_gguf_find_kv(g, "t.arr_str")->val;
	CU_ASSERT(v->arr.n == 2 && tl_str_eq(v->arr.strs[0], "ab") && v->arr.strs[1].n == 0);
	v = &tl_gguf_find_kv(g, "t.arr_arr")->val;
	CU_ASSERT(v->arr.type == TL_GGUF_ARRAY && v->arr.n == 2);
	uint32_t u;
	CU_ASSERT(tl_gguf_get_u32(g, "t.u32", &u, &err) == 0 && u == 4000000000u);
	CU_ASSERT(tl_gguf_get_u32(g, "t.i8", &u, &err) == -EBADMSG); /* negative */
	CU_ASSERT(tl_gguf_get_u32(g, "t.str", &u, &err) == -EBADMSG);
	CU_ASSERT(tl_gguf_get_u32(g, "nope", &u, &err) == -ENOENT);
	const struct tl_gguf_tensor *t = tl_gguf_find_tensor(g, "b");
	CU_ASSERT_FATAL(t != NULL);
	CU_ASSERT(t->n_dims == 2 && t->ne[0] == 2 && t->ne[1] == 2 && t->n_elems == 4);
	CU_ASSERT(((const float *)t->data)[3] == 7.0f);
	CU_ASSERT(((const float *)tl_gguf_find_tensor(g, "a")->data)[2] == 3.0f);
	tl_gguf_free(g);
	free(b.p);
}

/* Parse a copy of buf with one edit; must fail with a message, never crash. */
static int parse_edit(const uint8_t *buf, size_t len, size_t at, const void *val, size_t vlen,
		      int want, const char *what)
{
	uint8_t *c = malloc(len ? len : 1);
	struct tl_gguf *g = NULL;
	struct tl_err err = {{0}};
	memcpy(c, buf, len);
	if (val)
		memcpy(c + at, val, vlen);
	int r = tl_gguf_open_mem(c, len, &g, &err);
	free(c);
	if (r == 0) {
		printf("\n    %s: parsed a corrupt file\n", what);
		tl_gguf_free(g);
		return -1;
	}
	if (!err.msg[0] || (want && r != want)) {
		printf("\n    %s: r=%d msg='%s'\n", what, r, err.msg);
		return -1;
	}
	return 0;
}

static void test_gguf_corrupt_synthetic(void)
{
	struct wbuf b;
	size_t toff, soff;
	build_synthetic(&b, &toff, &soff);
	uint64_t big = 1ull << 62, past = b.n, one = 1;
	uint32_t bad = 0x12345678, v2 = 2, nine = 99, odd_align = 48;

	/* Every truncation of the file. */
	for (size_t n = 0; n < b.n; n++)
		CU_ASSERT(parse_edit(b.p, n, 0, NULL, 0, 0, "truncated") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, 0, &bad, 4, -EBADMSG, "magic") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, 4, &v2, 4, -ENOTSUP, "version") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, 8, &big, 8, -EBADMSG, "tensor count huge") == 0);
	uint64_t three = 3;
	CU_ASSERT(parse_edit(b.p, b.n, 8, &three, 8, -EBADMSG, "tensor count +1") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, 16, &big, 8, -EBADMSG, "kv count huge") == 0);
	uint64_t kv17 = 17;
	CU_ASSERT(parse_edit(b.p, b.n, 16, &kv17, 8, -EBADMSG, "kv count +1") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, 24, &big, 8, -EBADMSG, "key length") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, soff, &past, 8, -EBADMSG, "array string length") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, soff - 8, &big, 8, -EBADMSG, "array count") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, toff, &past, 8, -EBADMSG, "tensor offset past end") == 0);
	uint64_t lastfit = 128; /* aligned, but 16 bytes run past the end */
	CU_ASSERT(parse_edit(b.p, b.n, toff, &lastfit, 8, -EBADMSG, "tensor extent") == 0);
	CU_ASSERT(parse_edit(b.p, b.n, toff, &one, 8, -EBADMSG, "tensor misaligned") == 0);
	/* Type of the first key (t.u8 at 24 + 8 + 4). */
	CU_ASSERT(parse_edit(b.p, b.n, 36, &nine, 4, -EBADMSG, "value type") == 0);
	/* general.alignment not a power of two: its value is the 4 bytes before tensor a. */
	size_t align_at = toff - (8 + 1 + 4 + 8 + 4 + 8) - (8 + 1 + 4 + 8 + 8 + 4) - 4;
	CU_ASSERT(parse_edit(b.p, b.n, align_at, &odd_align, 4, -EBADMSG, "alignment") == 0);
	/* Duplicate key: rename t.i8 to t.u8. */
	CU_ASSERT(parse_edit(b.p, b.n, 24 + 8 + 4 + 4 + 1 + 8 + 2, "u", 1, -EBADMSG,
			     "duplicate key") == 0);
	free(b.p);
}

static size_t find_bytes(const uint8_t *buf, size_t len, const char *s)
{
	const uint8_t *p = memmem(buf, len, s, strlen(s));
	return p ? (size_t)(p - buf) : 0;
}

static void test_gguf_corrupt_model(void)
{
	NEED_MODEL();
	const uint8_t *b = model_buf;
	size_t n = model_len;
	uint64_t big = 1ull << 40, past = n, fsz = n;
	uint32_t v1 = 1;

	size_t cuts[] = {0, 3, 4, 7, 8, 16, 23, 24, 40, 69, 77, 5000, 14100, 14176, n / 2, n - 1};
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
		CU_ASSERT(parse_edit(b, cuts[i], 0, NULL, 0, -EBADMSG, "truncated model") == 0);
	CU_ASSERT(parse_edit(b, n, 0, "GGML", 4, -EBADMSG, "magic") == 0);
	CU_ASSERT(parse_edit(b, n, 4, &v1, 4, -ENOTSUP, "version 1") == 0);
	uint64_t nt = 49;
	CU_ASSERT(parse_edit(b, n, 8, &nt, 8, -EBADMSG, "tensor count 49") == 0);
	CU_ASSERT(parse_edit(b, n, 8, &big, 8, -EBADMSG, "tensor count 2^40") == 0);
	/* The first token of the vocabulary: its length field lies. */
	size_t tok = find_bytes(b, n, "tokenizer.ggml.tokens");
	CU_ASSERT_FATAL(tok != 0);
	size_t first_str = tok + 21 + 4 + 4 + 8;
	CU_ASSERT(parse_edit(b, n, first_str, &fsz, 8, -EBADMSG, "vocab string length") == 0);
	CU_ASSERT(parse_edit(b, n, tok - 8, &big, 8, -EBADMSG, "key length") == 0);
	/* The last tensor's data offset: name, n_dims, ne[0], type, then offset. */
	size_t last = find_bytes(b, n, "blk.4.ffn_norm.weight");
	CU_ASSERT_FATAL(last != 0);
	size_t off_at = last + 21 + 4 + 8 + 4;
	CU_ASSERT(parse_edit(b, n, off_at, &past, 8, -EBADMSG, "tensor offset past end") == 0);
	uint64_t huge_dim = 1ull << 61;
	CU_ASSERT(parse_edit(b, n, last + 21 + 4, &huge_dim, 8, -EBADMSG, "tensor dim") == 0);

	/* Random byte edits in the header: any result but a crash; no leak under ASan. */
	struct tl_rng rng;
	tl_rng_seed(&rng, 7);
	uint8_t *c = malloc(n);
	CU_ASSERT_FATAL(c != NULL);
	for (int it = 0; it < 300; it++) {
		memcpy(c, b, n);
		for (int k = 0; k < 4; k++)
			c[tl_rng_u32(&rng) % 14176] = (uint8_t)tl_rng_u32(&rng);
		struct tl_gguf *g = NULL;
		struct tl_model *m = NULL;
		struct tl_err err = {{0}};
		if (tl_gguf_open_mem(c, n, &g, &err) == 0 && tl_model_from_gguf(g, &m, &err) == 0)
			tl_model_free(m);
	}
	free(c);

	/* A well-formed file without a needed tensor: the model loader says which. */
	uint8_t *d = malloc(n);
	memcpy(d, b, n);
	memcpy(d + last, "blk.4.ffn_norm.weighX", 21);
	struct tl_gguf *g = NULL;
	struct tl_model *m = NULL;
	struct tl_err err = {{0}};
	CU_ASSERT_FATAL(tl_gguf_open_mem(d, n, &g, &err) == 0);
	CU_ASSERT(tl_model_from_gguf(g, &m, &err) == -EBADMSG);
	CU_ASSERT(strstr(err.msg, "blk.4.ffn_norm.weight") != NULL);
	free(d);
	/* A file that does not exist. */
	CU_ASSERT(tl_model_load("/nonexistent/x.gguf", &m, &err) == -ENOENT);
}

/* ---- quantized tensors ---- */

/*
 * ggml's blocks decoded by hand: Q4_1 d = 0.5, m = -1 with nibbles j and
 * 15 - j; Q8_0 d = 0.25 with -128..127 spread; F16 with a subnormal, a
 * negative, an infinity. In a GGUF, sizes come from the block layout, and a
 * row that is not whole blocks or runs past the data is refused.
 */
static void test_quant_blocks(void)
{
	uint8_t q41[20], q80[34];
	float out[32];
	uint16_t h_half = 0x3800, h_mone = 0xbc00, h_quarter = 0x3400;

	memcpy(q41, &h_half, 2);
	memcpy(q41 + 2, &h_mone, 2);
	for (int j = 0; j < 16; j++)
		q41[4 + j] = (uint8_t)(j | (15 - j) << 4);
	CU_ASSERT_FATAL(tl_dequant(TL_GGML_Q4_1, q41, 32, out) == 0);
	for (int j = 0; j < 16; j++) {
		CU_ASSERT(out[j] == 0.5f * j - 1.0f);
		CU_ASSERT(out[16 + j] == 0.5f * (15 - j) - 1.0f);
	}
	memcpy(q80, &h_quarter, 2);
	for (int j = 0; j < 32; j++)
		q80[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
	CU_ASSERT_FATAL(tl_dequant(TL_GGML_Q8_0, q80, 32, out) == 0);
	for (int j = 0; j < 32; j++)
		CU_ASSERT(out[j] == 0.25f * (float)(j * 8 - 128));
	uint16_t f16[4] = {0x0001, 0xc500, 0x7c00, 0x3c00};
	CU_ASSERT_FATAL(tl_dequant(TL_GGML_F16, f16, 4, out) == 0);
	CU_ASSERT(out[0] == 0x1p-24f && out[1] == -5.0f && isinf(out[2]) && out[3] == 1.0f);
	CU_ASSERT(tl_dequant(TL_GGML_Q4_1, q41, 31, out) == -EINVAL);
	CU_ASSERT(tl_dequant(99, q41, 32, out) == -EINVAL);

	/* a GGUF holding both blocks: Q4_1 [32] at 0, Q8_0 [32] at 32 */
	struct wbuf b = {0};
	struct tl_gguf *g = NULL;
	struct tl_err err = {{0}};
	w_u32(&b, TL_GGUF_MAGIC), w_u32(&b, 3), w_u64(&b, 2), w_u64(&b, 0);
	w_str(&b, "q41"), w_u32(&b, 1), w_u64(&b, 32), w_u32(&b, TL_GGML_Q4_1), w_u64(&b, 0);
	w_str(&b, "q80"), w_u32(&b, 1), w_u64(&b, 32), w_u32(&b, TL_GGML_Q8_0);
	size_t off80 = b.n;
	w_u64(&b, 32);
	while (b.n % 32)
		w_bytes(&b, "\0", 1);
	w_bytes(&b, q41, 20), w_bytes(&b, "\0\0\0\0\0\0\0\0\0\0\0\0", 12), w_bytes(&b, q80, 34);
	CU_ASSERT_FATAL(tl_gguf_open_mem(b.p, b.n, &g, &err) == 0);
	const struct tl_gguf_tensor *t = tl_gguf_find_tensor(g, "q41");
	CU_ASSERT(t && t->data && t->nbytes == 20);
	t = tl_gguf_find_tensor(g, "q80");
	CU_ASSERT_FATAL(t && t->data && t->nbytes == 34);
	CU_ASSERT(tl_dequant(t->type, t->data, t->n_elems, out) == 0 && out[31] == 0.25f * 120);
	tl_gguf_free(g);
	/* one byte short of the Q8_0 block */
	CU_ASSERT(tl_gguf_open_mem(b.p, b.n - 1, &g, &err) == -EBADMSG);
	/* a Q8_0 row of 20 elements is not whole blocks */
	uint64_t twenty = 20;
	memcpy(b.p + off80 - 4 - 8, &twenty, 8);
	CU_ASSERT(tl_gguf_open_mem(b.p, b.n, &g, &err) == -EBADMSG);
	CU_ASSERT(strstr(err.msg, "whole blocks") != NULL);
	free(b.p);
}

/* ---- byte-level BPE on a synthetic vocabulary ---- */

/*
 * A gpt2 tokenizer of 20 tokens: control <|endoftext|> <|im_start|>
 * <|im_end|>, the byte characters of a b c 1 2 ' s space (Ġ) and newline
 * (Ċ), and merges ranked "Ġ Ġ", "a b", "Ġ 1", "ab c", "Ġ a", "Ġ ab".
 */
static struct tl_tok *bpe_vocab(struct tl_gguf **ret_g)
{
	static const char *const toks[] = {"<|endoftext|>",
					   "<|im_start|>",
					   "<|im_end|>",
					   "a",
					   "b",
					   "c",
					   "1",
					   "2",
					   "'",
					   "s",
					   "\xc4\xa0",
					   "\xc4\x8a",
					   "\xc4\xa0\xc4\xa0",
					   "ab",
					   "\xc4\xa0"
					   "1",
					   "abc",
					   "\xc4\xa0"
					   "a",
					   "\xc4\xa0"
					   "ab",
					   "!",
					   "x"};
	static const char *const merges[] = {
	    "\xc4\xa0 \xc4\xa0", "a b", "\xc4\xa0 1", "ab c", "\xc4\xa0 a", "\xc4\xa0 ab"};
	const uint32_t n = sizeof(toks) / sizeof(toks[0]), nm = sizeof(merges) / sizeof(merges[0]);
	struct wbuf b = {0};
	struct tl_err err = {{0}};
	struct tl_tok *t = NULL;

	w_u32(&b, TL_GGUF_MAGIC), w_u32(&b, 3), w_u64(&b, 0), w_u64(&b, 4);
	w_key(&b, "tokenizer.ggml.model", TL_GGUF_STRING), w_str(&b, "gpt2");
	w_key(&b, "tokenizer.ggml.tokens", TL_GGUF_ARRAY), w_u32(&b, TL_GGUF_STRING), w_u64(&b, n);
	for (uint32_t i = 0; i < n; i++)
		w_str(&b, toks[i]);
	w_key(&b, "tokenizer.ggml.token_type", TL_GGUF_ARRAY), w_u32(&b, TL_GGUF_INT32);
	w_u64(&b, n);
	for (uint32_t i = 0; i < n; i++)
		w_u32(&b, i < 3 ? TL_TOK_CONTROL : TL_TOK_NORMAL);
	w_key(&b, "tokenizer.ggml.merges", TL_GGUF_ARRAY), w_u32(&b, TL_GGUF_STRING), w_u64(&b, nm);
	for (uint32_t i = 0; i < nm; i++)
		w_str(&b, merges[i]);
	while (b.n % 32) /* an empty data section starts at the alignment */
		w_bytes(&b, "\0", 1);
	CU_ASSERT_FATAL(tl_gguf_open_mem(b.p, b.n, ret_g, &err) == 0);
	free(b.p);
	CU_ASSERT_FATAL(tl_tok_load(*ret_g, &t, &err) == 0);
	return t;
}

/* Encode text and compare with the expected ids (n of them). */
static int bpe_is(const struct tl_tok *t, const char *text, const uint32_t *want, size_t n)
{
	uint32_t got[64];
	size_t ng = 0;
	if (tl_tok_encode(t, text, 0, got, 64, &ng) < 0 || ng != n)
		return 0;
	return !memcmp(got, want, n * sizeof(*want));
}

static void test_bpe_synthetic(void)
{
	struct tl_gguf *g;
	struct tl_tok *t = bpe_vocab(&g);
	enum { A = 3, B, C, ONE, TWO, APOS, S, SP, NL, SPSP, AB, SP1, ABC, SPA, SPAB, BANG };

	CU_ASSERT(t->kind == TL_TOK_BPE && t->add_bos == 0 && t->n_merges == 6);
	/* merges by rank: a b, then ab c */
	CU_ASSERT(bpe_is(t, "abc", (uint32_t[]){ABC}, 1));
	/* a word takes its space: Ġ a b -> a b first (rank 1), then Ġ ab (rank 5) */
	CU_ASSERT(bpe_is(t, "ab ab", (uint32_t[]){AB, SPAB}, 2));
	/* every digit alone, its space apart, though "Ġ 1" is a merge */
	CU_ASSERT(bpe_is(t, "a 12", (uint32_t[]){A, SP, ONE, TWO}, 4));
	/* a run of spaces leaves its last to the word after it, though "Ġ Ġ" ranks first */
	CU_ASSERT(bpe_is(t, "  a", (uint32_t[]){SP, SPA}, 2));
	/* ... and keeps them all at the end, or before a digit (the digit split ends the piece) */
	CU_ASSERT(bpe_is(t, "a  ", (uint32_t[]){A, SPSP}, 2));
	CU_ASSERT(bpe_is(t, "  1", (uint32_t[]){SPSP, ONE}, 2));
	/* a newline is whitespace of its own; 's is a piece */
	CU_ASSERT(bpe_is(t, "a\nb's", (uint32_t[]){A, NL, B, APOS, S}, 5));
	/* punctuation takes its space; control tokens in the text are their ids */
	CU_ASSERT(bpe_is(t, "<|im_start|>ab !<|im_end|>", (uint32_t[]){1, AB, SP, BANG, 2}, 5));
	/* half a control token is text: the letters with tokens, s and a */
	CU_ASSERT(bpe_is(t, "<|im_start", (uint32_t[]){S, A}, 2));
	/* a byte without a token (a control character, a piece of its own) is dropped */
	CU_ASSERT(bpe_is(t,
			 "a\x01"
			 "b",
			 (uint32_t[]){A, B}, 2));
	CU_ASSERT(bpe_is(t, "\x01", (uint32_t[]){0}, 0));
	CU_ASSERT(bpe_is(t, "", (uint32_t[]){}, 0));
	uint32_t out[4];
	size_t n;
	CU_ASSERT(tl_tok_encode(t, "abab ab", 0, out, 2, &n) == -ENOSPC);
	char buf[16];
	CU_ASSERT(tl_tok_decode(t, A, SPAB, buf, sizeof(buf)) == 3 && !strcmp(buf, " ab"));
	CU_ASSERT(tl_tok_decode(t, A, NL, buf, sizeof(buf)) == 1 && !strcmp(buf, "\n"));
	CU_ASSERT(tl_tok_decode(t, A, 2, buf, sizeof(buf)) == 0 && !strcmp(buf, ""));
	tl_tok_free(t);
	tl_gguf_free(g);
}

/* ---- model ---- */

static void test_model_shape(void)
{
	NEED_MODEL();
	const struct tl_config *c = &model->cfg;
	CU_ASSERT(c->dim == 64 && c->n_layers == 5 && c->n_heads == 8 && c->n_kv_heads == 4);
	CU_ASSERT(c->head_dim == 8 && c->hidden_dim == 172 && c->vocab_size == 512);
	CU_ASSERT(fabsf(c->norm_eps - 1e-5f) < 1e-9f);
	CU_ASSERT(model->tok->bos == 1 && model->tok->eos == 2 && model->tok->unk == 0);
}

/* Greedy from BOS for n steps; text into buf, ids into ids. */
static int greedy_text(uint32_t n, char *buf, size_t cap, uint32_t *ids)
{
	struct tl_state *s;
	struct tl_kv *kv;
	size_t len = 0;
	CU_ASSERT_FATAL(tl_state_new(model, &s) == 0);
	CU_ASSERT_FATAL(tl_kv_new(&model->cfg, model->cfg.n_kv_heads, n + 1, &kv) == 0);
	uint32_t t = model->tok->bos, prev = t, i;
	buf[0] = 0;
	for (i = 0; i < n; i++) {
		CU_ASSERT_FATAL(tl_forward(model, s, kv, t, NULL) == 0);
		uint32_t nx = tl_argmax(tl_state_logits(s), model->cfg.vocab_size);
		if (nx == model->tok->bos || nx == model->tok->eos)
			break;
		len += tl_tok_decode(model->tok, prev, nx, buf + len, cap - len);
		ids[i] = nx;
		prev = t = nx;
	}
	tl_state_free(s);
	tl_kv_free(kv);
	return (int)i;
}

static void test_greedy_known_text(void)
{
	NEED_MODEL();
	char buf[4096];
	uint32_t ids[64];
	greedy_text(40, buf, sizeof(buf), ids);
	CU_ASSERT(strncmp(buf, known_text, strlen(known_text)) == 0);
	if (strncmp(buf, known_text, strlen(known_text)))
		printf("\n    got: %s\n", buf);
}

static void test_tokenizer(void)
{
	NEED_MODEL();
	const struct tl_tok *tk = model->tok;
	uint32_t toks[256], gen[64];
	size_t n;
	char buf[4096];

	/* The model's own greedy tokens spell the known text: the tokenizer must agree. */
	int ng = greedy_text(40, buf, sizeof(buf), gen);
	CU_ASSERT_FATAL(tl_tok_encode(tk, known_text, 1, toks, 256, &n) == 0);
	CU_ASSERT(toks[0] == 1);
	CU_ASSERT_FATAL((int)n - 1 <= ng);
	CU_ASSERT(memcmp(toks + 1, gen, (n - 1) * sizeof(uint32_t)) == 0);
	/* Round trip, with the leading space after BOS dropped. */
	size_t len = 0;
	for (size_t i = 1; i < n; i++)
		len += tl_tok_decode(tk, toks[i - 1], toks[i], buf + len, sizeof(buf) - len);
	CU_ASSERT(strcmp(buf, known_text) == 0);
	/* Byte fallback: U+4E2D (E4 B8 AD) and a control byte are not pieces of this vocabulary. */
	CU_ASSERT(tl_tok_lookup(tk, "\xe4\xb8\xad", 3) < 0);
	CU_ASSERT_FATAL(tl_tok_encode(tk, "\xe4\xb8\xad\x01", 0, toks, 256, &n) == 0);
	int32_t sp = tl_tok_lookup(tk, "\xe2\x96\x81", 3);
	CU_ASSERT_FATAL(sp >= 0);
	CU_ASSERT_FATAL(n == 5);
	CU_ASSERT(toks[0] == (uint32_t)sp && toks[1] == (uint32_t)tk->byte_tok[0xe4]);
	CU_ASSERT(toks[2] == (uint32_t)tk->byte_tok[0xb8] &&
		  toks[3] == (uint32_t)tk->byte_tok[0xad]);
	CU_ASSERT(toks[4] == (uint32_t)tk->byte_tok[0x01]);
	CU_ASSERT(tk->byte_tok[0xe4] == 3 + 0xe4);
	len = 0;
	for (size_t i = 1; i < n; i++)
		len += tl_tok_decode(tk, toks[i - 1], toks[i], buf + len, sizeof(buf) - len);
	CU_ASSERT(strcmp(buf, "\xe4\xb8\xad\x01") == 0);
	/* Empty text: just BOS; too small an output: -ENOSPC. */
	CU_ASSERT(tl_tok_encode(tk, "", 1, toks, 256, &n) == 0 && n == 1);
	CU_ASSERT(tl_tok_encode(tk, known_text, 1, toks, 3, &n) == -ENOSPC);
}

static void test_cache_full_and_grow(void)
{
	NEED_MODEL();
	struct tl_state *s;
	struct tl_kv *a, *b;
	CU_ASSERT_FATAL(tl_state_new(model, &s) == 0);
	CU_ASSERT_FATAL(tl_kv_new(&model->cfg, 4, 3, &a) == 0);
	CU_ASSERT_FATAL(tl_kv_new(&model->cfg, 4, 12, &b) == 0);
	uint32_t toks[10] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
	CU_ASSERT(tl_prefill(model, s, a, toks, 3, NULL) == 0);
	CU_ASSERT(tl_forward(model, s, a, toks[3], NULL) == -ENOSPC);
	CU_ASSERT(a->len == 3 && a->next_pos == 3);
	CU_ASSERT(tl_forward(model, s, a, 9999, NULL) == -EINVAL);
	CU_ASSERT(tl_kv_grow(a, 10) == 0 && a->cap == 10 && a->len == 3);
	CU_ASSERT(tl_prefill(model, s, a, toks + 3, 7, NULL) == 0);
	float la[512];
	memcpy(la, tl_state_logits(s), sizeof(la));
	/* the same blocks into a cache that never grew: the grow changed nothing */
	CU_ASSERT(tl_prefill(model, s, b, toks, 3, NULL) == 0);
	CU_ASSERT(tl_prefill(model, s, b, toks + 3, 7, NULL) == 0);
	CU_ASSERT(memcmp(la, tl_state_logits(s), sizeof(la)) == 0);
	CU_ASSERT(a->layers[2].pos[3 * a->layers[2].pos_stride + 9] == 9);
	tl_kv_free(a);
	tl_kv_free(b);
	tl_state_free(s);
}

/*
 * The blocked prefill (matrix products over blocks of 64 tokens, causal
 * [block][slots] scores) against one tl_forward per token: the same K/V,
 * positions, captured queries and logits within float rounding, across a
 * block boundary, and the same first greedy token.
 */
static void test_prefill_blocked_equals_forward(void)
{
	NEED_MODEL();
	const struct tl_config *c = &model->cfg;
	enum { N = 150 };
	uint32_t toks[N];
	struct tl_state *s1, *s2;
	struct tl_kv *a, *b;
	const size_t qn = (size_t)c->n_layers * c->n_heads * 80 * c->head_dim;
	float *qa = calloc(qn, sizeof(float)), *qb = calloc(qn, sizeof(float));
	struct tl_qcap ca = {.q = qa, .first = N - 80, .n = 80},
		       cb = {.q = qb, .first = N - 80, .n = 80};

	CU_ASSERT_FATAL(qa && qb);
	toks[0] = model->tok->bos;
	for (uint32_t i = 1; i < N; i++)
		toks[i] = 3 + (i * 37) % (c->vocab_size - 3);
	CU_ASSERT_FATAL(tl_state_new(model, &s1) == 0 && tl_state_new(model, &s2) == 0);
	CU_ASSERT_FATAL(tl_kv_new(c, c->n_kv_heads, N + 1, &a) == 0);
	CU_ASSERT_FATAL(tl_kv_new(c, c->n_kv_heads, N + 1, &b) == 0);
	CU_ASSERT_FATAL(tl_prefill(model, s1, a, toks, N, &ca) == 0);
	for (uint32_t i = 0; i < N; i++)
		CU_ASSERT_FATAL(tl_forward(model, s2, b, toks[i], &cb) == 0);
	CU_ASSERT(a->len == N && a->next_pos == N && b->len == N);
	float dk = 0, dq = 0, dl = 0;
	for (uint32_t l = 0; l < c->n_layers; l++)
		for (size_t i = 0; i < (size_t)c->n_kv_heads * (N + 1) * c->head_dim; i++) {
			dk = fmaxf(dk, fabsf(a->layers[l].k[i] - b->layers[l].k[i]));
			dk = fmaxf(dk, fabsf(a->layers[l].v[i] - b->layers[l].v[i]));
		}
	for (uint32_t l = 0; l < c->n_layers; l++)
		CU_ASSERT(!memcmp(a->layers[l].pos, b->layers[l].pos,
				  sizeof(int32_t) * c->n_kv_heads * (N + 1)));
	for (size_t i = 0; i < qn; i++)
		dq = fmaxf(dq, fabsf(qa[i] - qb[i]));
	for (uint32_t v = 0; v < c->vocab_size; v++)
		dl = fmaxf(dl, fabsf(tl_state_logits(s1)[v] - tl_state_logits(s2)[v]));
	CU_ASSERT(dk < 1e-4f && dq < 1e-4f && dl < 1e-3f);
	CU_ASSERT(tl_argmax(tl_state_logits(s1), c->vocab_size) ==
		  tl_argmax(tl_state_logits(s2), c->vocab_size));
	/* too long for the cache: nothing changes */
	CU_ASSERT(tl_prefill(model, s1, a, toks, 2, NULL) == -ENOSPC && a->len == N);
	tl_kv_free(a);
	tl_kv_free(b);
	tl_state_free(s1);
	tl_state_free(s2);
	free(qa);
	free(qb);
}

/* ---- compacted decode ---- */

#define PROMPT_TEXT                                                                                \
	"Once upon a time, there was a little boy named Tim. Tim had a big red ball. He liked "    \
	"to play with it in the garden with his dog."
#define GEN 24

struct prompt_run {
	uint32_t toks[256];
	uint32_t L;
	struct tl_kv *full; /* prefilled, cap L + GEN + 1 */
	float *q;	    /* all L queries: [layers][H_q][L][D] */
	float logits0[512];
};

static void prefill_prompt(struct prompt_run *p)
{
	const struct tl_config *c = &model->cfg;
	struct tl_state *s;
	size_t n;
	CU_ASSERT_FATAL(tl_tok_encode(model->tok, PROMPT_TEXT, 1, p->toks, 256, &n) == 0);
	p->L = (uint32_t)n;
	CU_ASSERT_FATAL(p->L > 30);
	p->q = calloc((size_t)c->n_layers * c->n_heads * p->L * c->head_dim, sizeof(float));
	CU_ASSERT_FATAL(p->q != NULL);
	CU_ASSERT_FATAL(tl_kv_new(c, c->n_kv_heads, p->L + GEN + 1, &p->full) == 0);
	CU_ASSERT_FATAL(tl_state_new(model, &s) == 0);
	struct tl_qcap qc = {.q = p->q, .first = 0, .n = p->L};
	CU_ASSERT_FATAL(tl_prefill(model, s, p->full, p->toks, p->L, &qc) == 0);
	memcpy(p->logits0, tl_state_logits(s), sizeof(p->logits0));
	tl_state_free(s);
}

static void free_prompt(struct prompt_run *p)
{
	tl_kv_free(p->full);
	free(p->q);
}

/* Greedy decode of GEN tokens from kv (first from logits0); every step's logits kept. */
static void decode_greedy(const float *logits0, struct tl_kv *kv, uint32_t *toks, float *logits)
{
	struct tl_state *s;
	CU_ASSERT_FATAL(tl_state_new(model, &s) == 0);
	uint32_t t = tl_argmax(logits0, 512);
	for (int i = 0; i < GEN; i++) {
		toks[i] = t;
		CU_ASSERT_FATAL(tl_forward(model, s, kv, t, NULL) == 0);
		memcpy(logits + (size_t)i * 512, tl_state_logits(s), 512 * sizeof(float));
		t = tl_argmax(tl_state_logits(s), 512);
	}
	tl_state_free(s);
}

static struct tl_kv *copy_full(const struct tl_kv *f)
{
	struct tl_kv *k;
	CU_ASSERT_FATAL(tl_kv_new(&model->cfg, f->h_store, f->cap, &k) == 0);
	for (uint32_t l = 0; l < f->n_layers; l++) {
		size_t n = (size_t)f->h_store * f->cap;
		memcpy(k->layers[l].k, f->layers[l].k, n * f->head_dim * sizeof(float));
		memcpy(k->layers[l].v, f->layers[l].v, n * f->head_dim * sizeof(float));
		memcpy(k->layers[l].pos, f->layers[l].pos, n * sizeof(int32_t));
	}
	k->len = f->len;
	k->next_pos = f->next_pos;
	return k;
}

static struct skv_ctx *ctx;

static struct tl_kv *compact(struct prompt_run *p, enum skv_policy pol, enum skv_gqa gqa,
			     uint32_t C, uint32_t W, uint32_t reserve, struct skv_plan *plan)
{
	struct skv_params prm;
	struct skv_error err = {0};
	struct tl_kv *kv = NULL;
	skv_params_init(&prm);
	prm.policy = pol;
	prm.gqa = gqa;
	prm.capacity = C;
	prm.window = W;
	prm.sinks = 4;
	int r = tl_compact(ctx, model, p->full, p->q, 0, p->L, &prm, reserve, &kv, plan, &err);
	if (r < 0)
		printf("\n    tl_compact: %d %s\n", r, err.msg);
	CU_ASSERT_FATAL(r == 0);
	return kv;
}

/* With C >= L every policy keeps everything: decode is bit-identical to the full cache. */
static void test_bypass_identical(void)
{
	NEED_MODEL();
	struct prompt_run p;
	prefill_prompt(&p);
	uint32_t ref_t[GEN], t[GEN];
	float *ref_l = malloc(GEN * 512 * sizeof(float)), *lg = malloc(GEN * 512 * sizeof(float));
	struct tl_kv *f = copy_full(p.full);
	decode_greedy(p.logits0, f, ref_t, ref_l);
	tl_kv_free(f);

	const enum skv_policy pols[] = {SKV_POLICY_SNAPKV, SKV_POLICY_H2O, SKV_POLICY_STREAMINGLLM,
					SKV_POLICY_WINDOW};
	const enum skv_gqa modes[] = {SKV_GQA_EXPAND, SKV_GQA_GROUP};
	/* C = L + 7 so that C + g and L + g differ; C = L scores but keeps all. */
	const uint32_t caps[] = {p.L + 7, p.L};
	for (int pi = 0; pi < 4; pi++)
		for (int mi = 0; mi < 2; mi++)
			for (int ci = 0; ci < 2; ci++) {
				struct skv_plan plan;
				struct tl_kv *kv =
				    compact(&p, pols[pi], modes[mi], caps[ci], 8, GEN, &plan);
				CU_ASSERT(plan.kept == p.L && kv->len == p.L &&
					  kv->next_pos == p.L);
				CU_ASSERT(kv->h_store == (modes[mi] == SKV_GQA_EXPAND ? 8u : 4u));
				CU_ASSERT(kv->cap == p.L + GEN);
				decode_greedy(p.logits0, kv, t, lg);
				CU_ASSERT(memcmp(t, ref_t, sizeof(t)) == 0);
				CU_ASSERT(memcmp(lg, ref_l, GEN * 512 * sizeof(float)) == 0);
				/* Appended slots kept + g carry logical positions L + g. */
				for (uint32_t l = 0; l < kv->n_layers; l++)
					for (uint32_t h = 0; h < kv->h_store; h++)
						for (uint32_t g = 0; g < GEN; g++)
							CU_ASSERT(
							    kv->layers[l]
								.pos[h * kv->layers[l].pos_stride +
								     p.L + g] ==
							    (int32_t)(p.L + g));
				tl_kv_free(kv);
			}
	free(ref_l);
	free(lg);
	free_prompt(&p);
}

/*
 * An independent reference for a compacted decode: the plain causal forward
 * over prompt + generated tokens, each decode query attending only to the
 * kept prompt positions of its stored head (from the compact cache's
 * position table) and to the generated tokens, every token rotated at its
 * true position. Written separately from tl-model.c on purpose.
 */
static void ref_forward(const uint32_t *seq, uint32_t L, uint32_t n, const struct tl_kv *ckv,
			float *out_logits /* [n - L][512] */)
{
	const struct tl_config *c = &model->cfg;
	const uint32_t D = c->head_dim, HQ = c->n_heads, HKV = c->n_kv_heads, dim = c->dim;
	float *K = calloc((size_t)c->n_layers * n * HKV * D, sizeof(float));
	float *V = calloc((size_t)c->n_layers * n * HKV * D, sizeof(float));
	uint8_t *keep = calloc((size_t)c->n_layers * HQ * L, 1);
	CU_ASSERT_FATAL(K && V && keep);
	for (uint32_t l = 0; l < c->n_layers; l++)
		for (uint32_t h = 0; h < HQ; h++) {
			uint32_t sh = h / (HQ / ckv->h_store);
			const int32_t *pos = ckv->layers[l].pos + sh * ckv->layers[l].pos_stride;
			/* ragged budget modes: each head its own count */
			const uint32_t n_sh =
			    ckv->layers[l].head_len ? ckv->layers[l].head_len[sh] : ckv->len;
			for (uint32_t i = 0; i < n_sh; i++)
				if (pos[i] >= 0 && (uint32_t)pos[i] < L)
					keep[((size_t)l * HQ + h) * L + pos[i]] = 1;
		}
	for (uint32_t p = 0; p < n; p++) {
		double x[64], xb[64], q[64], att_o[64], h1[172], h2[172];
		for (uint32_t i = 0; i < dim; i++)
			x[i] = model->tok_embd[(size_t)seq[p] * dim + i];
		for (uint32_t l = 0; l < c->n_layers; l++) {
			const struct tl_layer_w *w = &model->layers[l];
			double ss = 0;
			for (uint32_t i = 0; i < dim; i++)
				ss += x[i] * x[i];
			ss = 1.0 / sqrt(ss / dim + c->norm_eps);
			for (uint32_t i = 0; i < dim; i++)
				xb[i] = w->attn_norm[i] * ss * x[i];
			float *kr = K + (((size_t)l * n + p) * HKV) * D;
			float *vr = V + (((size_t)l * n + p) * HKV) * D;
			for (uint32_t o = 0; o < HQ * D; o++) {
				double a = 0;
				for (uint32_t i = 0; i < dim; i++)
					a += w->wq[(size_t)o * dim + i] * xb[i];
				q[o] = a;
			}
			for (uint32_t o = 0; o < HKV * D; o++) {
				double a = 0, b = 0;
				for (uint32_t i = 0; i < dim; i++) {
					a += w->wk[(size_t)o * dim + i] * xb[i];
					b += w->wv[(size_t)o * dim + i] * xb[i];
				}
				kr[o] = (float)a;
				vr[o] = (float)b;
			}
			for (uint32_t o = 0; o < HQ * D; o += 2) {
				double th = p * pow(10000.0, -(double)(o % D) / D);
				double a = q[o], b = q[o + 1];
				q[o] = a * cos(th) - b * sin(th);
				q[o + 1] = a * sin(th) + b * cos(th);
				if (o < HKV * D) {
					a = kr[o], b = kr[o + 1];
					kr[o] = (float)(a * cos(th) - b * sin(th));
					kr[o + 1] = (float)(a * sin(th) + b * cos(th));
				}
			}
			for (uint32_t h = 0; h < HQ; h++) {
				uint32_t kh = h / (HQ / HKV);
				double sc[512], mx = -1e300, sum = 0;
				for (uint32_t t = 0; t <= p; t++) {
					int vis =
					    p < L || t >= L || keep[((size_t)l * HQ + h) * L + t];
					sc[t] = -INFINITY;
					if (!vis)
						continue;
					const float *kt = K + (((size_t)l * n + t) * HKV + kh) * D;
					double a = 0;
					for (uint32_t d = 0; d < D; d++)
						a += q[h * D + d] * kt[d];
					sc[t] = a / sqrt((double)D);
					if (sc[t] > mx)
						mx = sc[t];
				}
				for (uint32_t d = 0; d < D; d++)
					att_o[h * D + d] = 0;
				for (uint32_t t = 0; t <= p; t++)
					if (sc[t] != -INFINITY)
						sum += exp(sc[t] - mx);
				for (uint32_t t = 0; t <= p; t++) {
					if (sc[t] == -INFINITY)
						continue;
					double a = exp(sc[t] - mx) / sum;
					const float *vt = V + (((size_t)l * n + t) * HKV + kh) * D;
					for (uint32_t d = 0; d < D; d++)
						att_o[h * D + d] += a * vt[d];
				}
			}
			for (uint32_t o = 0; o < dim; o++) {
				double a = 0;
				for (uint32_t i = 0; i < HQ * D; i++)
					a += w->wo[(size_t)o * HQ * D + i] * att_o[i];
				x[o] += a;
			}
			ss = 0;
			for (uint32_t i = 0; i < dim; i++)
				ss += x[i] * x[i];
			ss = 1.0 / sqrt(ss / dim + c->norm_eps);
			for (uint32_t i = 0; i < dim; i++)
				xb[i] = w->ffn_norm[i] * ss * x[i];
			for (uint32_t o = 0; o < c->hidden_dim; o++) {
				double a = 0, b = 0;
				for (uint32_t i = 0; i < dim; i++) {
					a += w->w_gate[(size_t)o * dim + i] * xb[i];
					b += w->w_up[(size_t)o * dim + i] * xb[i];
				}
				h1[o] = a / (1 + exp(-a));
				h2[o] = b;
			}
			for (uint32_t o = 0; o < dim; o++) {
				double a = 0;
				for (uint32_t i = 0; i < c->hidden_dim; i++)
					a += w->w_down[(size_t)o * c->hidden_dim + i] * h1[i] *
					     h2[i];
				x[o] += a;
			}
		}
		if (p < L)
			continue;
		double ss = 0;
		for (uint32_t i = 0; i < dim; i++)
			ss += x[i] * x[i];
		ss = 1.0 / sqrt(ss / dim + c->norm_eps);
		for (uint32_t o = 0; o < c->vocab_size; o++) {
			double a = 0;
			for (uint32_t i = 0; i < dim; i++)
				a += model->output[(size_t)o * dim + i] * model->out_norm[i] * ss *
				     x[i];
			out_logits[(size_t)(p - L) * 512 + o] = (float)a;
		}
	}
	free(K);
	free(V);
	free(keep);
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
	float m = 0;
	for (size_t i = 0; i < n; i++)
		if (fabsf(a[i] - b[i]) > m)
			m = fabsf(a[i] - b[i]);
	return m;
}

/*
 * A real compaction (C < L, reserve smaller than the decode so the cache
 * grows): the decode matches the masked reference at true positions L + g.
 * Rotating at kept + g (or C + g) instead changes the logits far beyond the
 * tolerance; the test checks that too, so it can fail.
 */
static void test_compacted_positions_reference(void)
{
	NEED_MODEL();
	struct prompt_run p;
	prefill_prompt(&p);
	const enum skv_gqa modes[] = {SKV_GQA_EXPAND, SKV_GQA_GROUP};
	const enum skv_policy pols[] = {SKV_POLICY_SNAPKV, SKV_POLICY_H2O};
	float *lg = malloc(GEN * 512 * sizeof(float)), *rl = malloc(GEN * 512 * sizeof(float));
	float *wrong = malloc(GEN * 512 * sizeof(float));
	uint32_t t[GEN], seq[512], tw[GEN];
	for (int pi = 0; pi < 2; pi++)
		for (int mi = 0; mi < 2; mi++) {
			struct skv_plan plan;
			struct tl_kv *kv = compact(&p, pols[pi], modes[mi], 16, 8, 4, &plan);
			CU_ASSERT(!plan.bypass && plan.kept == 16 && kv->len == 16);
			CU_ASSERT(kv->next_pos == p.L);
			/* Heads differ in what they keep (a real selection happened). */
			int differ = 0;
			for (uint32_t h = 1; h < kv->h_store; h++)
				differ |= memcmp(kv->layers[0].pos,
						 kv->layers[0].pos + h * kv->layers[0].pos_stride,
						 16 * 4) != 0;
			CU_ASSERT(differ);
			/* Decode with growth: reserve 4, GEN tokens. */
			struct tl_state *s;
			CU_ASSERT_FATAL(tl_state_new(model, &s) == 0);
			uint32_t tok = tl_argmax(p.logits0, 512);
			for (int i = 0; i < GEN; i++) {
				t[i] = tok;
				if (kv->len == kv->cap)
					CU_ASSERT_FATAL(tl_kv_grow(kv, kv->cap + 4) == 0);
				CU_ASSERT_FATAL(tl_forward(model, s, kv, tok, NULL) == 0);
				memcpy(lg + (size_t)i * 512, tl_state_logits(s),
				       512 * sizeof(float));
				tok = tl_argmax(tl_state_logits(s), 512);
			}
			tl_state_free(s);
			CU_ASSERT(kv->next_pos == p.L + GEN && kv->len == 16 + GEN);
			memcpy(seq, p.toks, p.L * sizeof(uint32_t));
			memcpy(seq + p.L, t, GEN * sizeof(uint32_t));
			ref_forward(seq, p.L, p.L + GEN, kv, rl);
			float diff = max_abs_diff(lg, rl, GEN * 512);
			CU_ASSERT(diff < 2e-3f);
			if (!(diff < 2e-3f))
				printf("\n    policy %d mode %d: max |logit diff| %g\n", pols[pi],
				       modes[mi], diff);

			/* The same cache decoded as if the next position were kept (= C) + g. */
			struct tl_kv *w = compact(&p, pols[pi], modes[mi], 16, 8, GEN, &plan);
			w->next_pos = w->len;
			decode_greedy(p.logits0, w, tw, wrong);
			CU_ASSERT(max_abs_diff(wrong, rl, GEN * 512) > 100 * 2e-3f);
			tl_kv_free(w);
			tl_kv_free(kv);
		}
	free(lg);
	free(rl);
	free(wrong);
	free_prompt(&p);
}

/*
 * Budget modes in process (tl_compact_budget, as tiny-llama --local
 * --budget runs them): mass-heads keeps a different count per head, and the
 * decode (growing the cache) matches the masked reference per head; a
 * fallback keeps the whole prompt and decodes bit-identically to the full
 * cache; mass keeps one C* for every head.
 */
static void test_budget_modes_decode(void)
{
	NEED_MODEL();
	struct prompt_run p;
	prefill_prompt(&p);
	float *lg = malloc(GEN * 512 * sizeof(float)), *rl = malloc(GEN * 512 * sizeof(float));
	uint32_t t[GEN], seq[512], ref_t[GEN];
	struct skv_params prm;
	struct skv_error err = {0};
	struct tl_budget b;
	struct tl_kv *kv = NULL;

	skv_params_init(&prm);
	prm.window = 8;
	prm.budget = 32;
	CU_ASSERT_FATAL(skv_budget_parse("mass-heads:0.9:9:32", &prm, &err) == 0);
	CU_ASSERT_FATAL(
	    tl_compact_budget(ctx, model, p.full, p.q, 0, p.L, &prm, 2, &kv, &b, &err) == 0);
	CU_ASSERT(b.kept_min < b.kept_max && b.kept_max <= 32 && b.kept_min >= 9);
	CU_ASSERT(!b.fallback && kv->len == b.kept_max && kv->next_pos == p.L);
	CU_ASSERT_PTR_NOT_NULL(kv->layers[0].head_len);
	struct tl_state *s;
	CU_ASSERT_FATAL(tl_state_new(model, &s) == 0);
	uint32_t tok = tl_argmax(p.logits0, 512);
	for (int i = 0; i < GEN; i++) {
		t[i] = tok;
		if (kv->len == kv->cap)
			CU_ASSERT_FATAL(tl_kv_grow(kv, kv->cap + 2) == 0);
		CU_ASSERT_FATAL(tl_forward(model, s, kv, tok, NULL) == 0);
		memcpy(lg + (size_t)i * 512, tl_state_logits(s), 512 * sizeof(float));
		tok = tl_argmax(tl_state_logits(s), 512);
	}
	tl_state_free(s);
	memcpy(seq, p.toks, p.L * sizeof(uint32_t));
	memcpy(seq + p.L, t, GEN * sizeof(uint32_t));
	ref_forward(seq, p.L, p.L + GEN, kv, rl);
	CU_ASSERT(max_abs_diff(lg, rl, GEN * 512) < 2e-3f);
	tl_kv_free(kv);

	/* the same choice with a fallback above its smallest mass: the full prompt */
	prm.fallback_below = b.min_mass + (1.0f - b.min_mass) / 2;
	CU_ASSERT_FATAL(
	    tl_compact_budget(ctx, model, p.full, p.q, 0, p.L, &prm, GEN, &kv, &b, &err) == 0);
	CU_ASSERT(b.fallback && b.kept_min == p.L && b.kept_max == p.L && kv->len == p.L);
	struct tl_kv *f = copy_full(p.full);
	decode_greedy(p.logits0, f, ref_t, rl);
	tl_kv_free(f);
	decode_greedy(p.logits0, kv, t, lg);
	CU_ASSERT(memcmp(t, ref_t, sizeof(t)) == 0);
	CU_ASSERT(memcmp(lg, rl, GEN * 512 * sizeof(float)) == 0);
	tl_kv_free(kv);

	/* mass: one C* on the ladder for every head */
	prm.fallback_below = 0;
	CU_ASSERT_FATAL(skv_budget_parse("mass:0.8:12:40:4", &prm, &err) == 0);
	CU_ASSERT_FATAL(
	    tl_compact_budget(ctx, model, p.full, p.q, 0, p.L, &prm, 0, &kv, &b, &err) == 0);
	CU_ASSERT(b.c_star >= 12 && b.c_star <= 40 && ((b.c_star - 12) % 4 == 0 || b.c_star == 40));
	CU_ASSERT(b.kept_min == b.kept_max && kv->layers[0].head_len == NULL);
	CU_ASSERT(b.min_mass >= 0.8f || b.c_star == 40);
	tl_kv_free(kv);
	free(lg);
	free(rl);
	free_prompt(&p);
}

/*
 * The daemon writes compact caches HND or NHD into its arena; the engine
 * reads any strides. Compact straight into an NHD view with libskv and
 * decode: bit-identical to the HND cache of tl_compact().
 */
static void test_nhd_view_identical(void)
{
	NEED_MODEL();
	const struct tl_config *c = &model->cfg;
	struct prompt_run p;
	prefill_prompt(&p);
	const enum skv_gqa modes[] = {SKV_GQA_EXPAND, SKV_GQA_GROUP};
	float *a = malloc(GEN * 512 * sizeof(float)), *b = malloc(GEN * 512 * sizeof(float));
	uint32_t ta[GEN], tb[GEN];
	for (int mi = 0; mi < 2; mi++) {
		struct skv_plan plan;
		struct tl_kv *hnd = compact(&p, SKV_POLICY_SNAPKV, modes[mi], 16, 8, GEN, &plan);
		decode_greedy(p.logits0, hnd, ta, a);

		const uint32_t H = plan.h_store, D = c->head_dim, cap = plan.kept + GEN;
		const size_t per_layer = (size_t)cap * H * D;
		float *kmem = calloc(c->n_layers * per_layer, sizeof(float));
		float *vmem = calloc(c->n_layers * per_layer, sizeof(float));
		int32_t *pmem = calloc((size_t)c->n_layers * H * cap, sizeof(int32_t));
		struct tl_kv *nhd;
		CU_ASSERT_FATAL(kmem && vmem && pmem);
		CU_ASSERT_FATAL(tl_kv_new_view(c, H, cap, &nhd) == 0);
		struct skv_layer_in in[8];
		struct skv_layer_out out[8];
		for (uint32_t l = 0; l < c->n_layers; l++) {
			struct tl_kv_layer *L = &nhd->layers[l];
			L->k = kmem + l * per_layer;
			L->v = vmem + l * per_layer;
			L->head_stride = D;
			L->token_stride = (int64_t)H * D;
			L->pos = pmem + (size_t)l * H * cap;
			L->pos_stride = cap;
			in[l].q = (struct skv_tensor){
			    .data = p.q + ((size_t)l * c->n_heads * p.L + (p.L - 8)) * D,
			    .dtype = SKV_DTYPE_F32,
			    .head_stride = (int64_t)p.L * D,
			    .token_stride = D};
			in[l].k = tl_kv_tensor(p.full, l, 0);
			in[l].v = tl_kv_tensor(p.full, l, 1);
			out[l] = (struct skv_layer_out){.k = tl_kv_tensor(nhd, l, 0),
							.v = tl_kv_tensor(nhd, l, 1),
							.positions = L->pos,
							.pos_stride = cap};
		}
		struct skv_shape shape = {.prompt_len = p.L,
					  .head_dim = D,
					  .h_q = c->n_heads,
					  .h_kv = c->n_kv_heads,
					  .n_q = 8};
		struct skv_params prm;
		struct skv_error err;
		skv_params_init(&prm);
		prm.gqa = modes[mi];
		prm.capacity = 16;
		prm.window = 8;
		CU_ASSERT_FATAL(skv_compact(ctx, &shape, &prm, c->n_layers, in, out, &err) == 0);
		nhd->len = plan.kept;
		nhd->next_pos = p.L;
		decode_greedy(p.logits0, nhd, tb, b);
		CU_ASSERT(memcmp(ta, tb, sizeof(ta)) == 0);
		CU_ASSERT(memcmp(a, b, GEN * 512 * sizeof(float)) == 0);
		CU_ASSERT(pmem[3 * cap + plan.kept + 5] == (int32_t)(p.L + 5));
		tl_kv_free(nhd);
		tl_kv_free(hnd);
		free(kmem);
		free(vmem);
		free(pmem);
	}
	free(a);
	free(b);
	free_prompt(&p);
}

/* Seeded sampling is reproducible and follows softmax(logits / temp). */
static void test_sampling(void)
{
	float logits[4] = {0.0f, 1.0f, 2.0f, -50.0f}, probs[4];
	struct tl_rng r1, r2;
	unsigned cnt[4] = {0};
	tl_rng_seed(&r1, 99);
	tl_rng_seed(&r2, 99);
	for (int i = 0; i < 20000; i++) {
		uint32_t a = tl_sample(logits, 4, 0.5f, &r1, probs);
		uint32_t b = tl_sample(logits, 4, 0.5f, &r2, probs);
		CU_ASSERT_FATAL(a == b && a < 4);
		cnt[a]++;
	}
	/* softmax([0, 2, 4, -100]) = [0.0159, 0.1173, 0.8668, ~0] */
	CU_ASSERT(fabs(cnt[0] / 20000.0 - 0.0159) < 0.005);
	CU_ASSERT(fabs(cnt[1] / 20000.0 - 0.1173) < 0.01);
	CU_ASSERT(fabs(cnt[2] / 20000.0 - 0.8668) < 0.01);
	CU_ASSERT(cnt[3] == 0);
	CU_ASSERT(tl_sample(logits, 4, 0.0f, &r1, probs) == 2);
	float tie[3] = {1, 3, 3};
	CU_ASSERT(tl_argmax(tie, 3) == 1);
}

static int load_model(void)
{
	const char *shared = getenv("SHARED");
	snprintf(model_path, sizeof(model_path), "%s/models/stories260K.gguf",
		 shared && *shared ? shared : "../shared");
	FILE *f = fopen(model_path, "rb");
	if (!f) {
		printf("test-llama: model %s not found: the tests that need it are skipped\n",
		       model_path);
		return 0;
	}
	fseek(f, 0, SEEK_END);
	model_len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	model_buf = malloc(model_len);
	if (!model_buf || fread(model_buf, 1, model_len, f) != model_len) {
		fclose(f);
		return -1;
	}
	fclose(f);
	struct tl_gguf *g;
	struct tl_err err = {{0}};
	if (tl_gguf_open_mem(model_buf, model_len, &g, &err) < 0 ||
	    tl_model_from_gguf(g, &model, &err) < 0) {
		printf("test-llama: cannot load %s: %s\n", model_path, err.msg);
		return -1;
	}
	return 0;
}

int main(void)
{
	if (load_model() < 0)
		return 1;
	if (skv_ctx_new(1, &ctx) < 0)
		return 1;
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	static const struct {
		const char *name;
		CU_TestFunc fn;
		bool needs_model;
	} tests[] = {
	    {"gguf_all_types", test_gguf_all_types, false},
	    {"gguf_corrupt_synthetic", test_gguf_corrupt_synthetic, false},
	    {"gguf_corrupt_model", test_gguf_corrupt_model, true},
	    {"quant_blocks", test_quant_blocks, false},
	    {"bpe_synthetic", test_bpe_synthetic, false},
	    {"model_shape", test_model_shape, true},
	    {"greedy_known_text", test_greedy_known_text, true},
	    {"tokenizer", test_tokenizer, true},
	    {"cache_full_and_grow", test_cache_full_and_grow, true},
	    {"prefill_blocked_equals_forward", test_prefill_blocked_equals_forward, true},
	    {"bypass_identical", test_bypass_identical, true},
	    {"compacted_positions_reference", test_compacted_positions_reference, true},
	    {"nhd_view_identical", test_nhd_view_identical, true},
	    {"budget_modes_decode", test_budget_modes_decode, true},
	    {"sampling", test_sampling, false},
	};
	CU_pSuite s = CU_add_suite("tiny-llama", NULL, NULL);
	if (!s) {
		CU_cleanup_registry();
		return 1;
	}
	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		CU_pTest t = CU_add_test(s, tests[i].name, tests[i].fn);
		if (!t) {
			CU_cleanup_registry();
			return 1;
		}
		if (tests[i].needs_model && !model)
			t_skip(s, t, "model", "%s not found (set SHARED)", model_path);
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	skv_ctx_free(ctx);
	tl_model_free(model);
	free(model_buf);
	return t_exit(fails);
}
