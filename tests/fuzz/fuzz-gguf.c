// SPDX-License-Identifier: MIT
/*
 * fuzz-gguf - libFuzzer target: a whole GGUF file given to tiny-llama's
 * reader (tl_gguf_open_mem), the model loader's first step.
 *
 * Properties: no read outside the image; on success every key, string,
 * array and tensor of a type it sizes (F32, F16, Q4_0, Q4_1, Q8_0) it
 * hands out lies inside the reader's copy of the file, in whole blocks of
 * each row; tensor element counts are the product of their dims; every key
 * and tensor is found again by name; the typed getters never crash
 * whatever a key's type.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl-gguf.h"

#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz-gguf: %s:%d: %s\n", __FILE__, __LINE__, #cond);      \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

static volatile uint64_t sink;

static void in_file(const struct tl_gguf *g, const void *p, uint64_t n)
{
	const uint8_t *b = p;

	if (!n)
		return;
	REQUIRE(b >= g->buf && n <= g->size && (uint64_t)(b - g->buf) <= g->size - n);
	sink += b[0] + b[n - 1];
}

/* A NUL-terminated copy of a key, for the lookups (keys may hold NULs). */
static char *cstr(struct tl_str s)
{
	char *c = malloc(s.n + 1);

	REQUIRE(c);
	memcpy(c, s.p, s.n);
	c[s.n] = 0;
	return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tl_gguf *g = NULL;
	struct tl_err err;
	uint8_t *buf = malloc(size ? size : 1);
	int r;

	REQUIRE(buf);
	memcpy(buf, data, size);
	r = tl_gguf_open_mem(buf, size, &g, &err);
	free(buf); /* open_mem copies: nothing may point here any more */
	if (r < 0) {
		REQUIRE(!g);
		REQUIRE(memchr(err.msg, 0, sizeof(err.msg)));
		return 0;
	}
	REQUIRE(g->n_kv <= TL_GGUF_MAX_KV && g->n_tensors <= TL_GGUF_MAX_TENSORS);
	for (uint64_t i = 0; i < g->n_kv; i++) {
		const struct tl_gguf_kv *kv = &g->kv[i];
		char *key = cstr(kv->key);
		uint32_t u;
		float f;

		in_file(g, kv->key.p, kv->key.n);
		if (kv->val.type == TL_GGUF_STRING) {
			in_file(g, kv->val.s.p, kv->val.s.n);
		} else if (kv->val.type == TL_GGUF_ARRAY) {
			in_file(g, kv->val.arr.data, kv->val.arr.nbytes);
			if (kv->val.arr.strs)
				for (uint64_t j = 0; j < kv->val.arr.n; j++)
					in_file(g, kv->val.arr.strs[j].p, kv->val.arr.strs[j].n);
		}
		if (strlen(key) == kv->key.n)
			REQUIRE(tl_gguf_find_kv(g, key) != NULL);
		(void)tl_gguf_get_u32(g, key, &u, &err);
		(void)tl_gguf_get_f32(g, key, &f, &err);
		free(key);
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct tl_gguf_tensor *t = &g->tensors[i];
		uint64_t n = 1;
		char *name = cstr(t->name);

		in_file(g, t->name.p, t->name.n);
		REQUIRE(t->n_dims <= TL_GGUF_MAX_DIMS);
		for (uint32_t d = 0; d < TL_GGUF_MAX_DIMS; d++)
			REQUIRE(!__builtin_mul_overflow(n, t->ne[d], &n));
		REQUIRE(n == t->n_elems);
		if (t->data) {
			/* a type the reader sizes (F32, F16, Q4_0, Q4_1, Q8_0): whole
			 * blocks of each row, nbytes from the block size */
			const uint64_t be = tl_ggml_block_elems(t->type);
			REQUIRE(be && t->ne[0] % be == 0 &&
				t->nbytes == t->n_elems / be * tl_ggml_block_bytes(t->type));
			in_file(g, t->data, t->nbytes);
		}
		if (strlen(name) == t->name.n)
			REQUIRE(tl_gguf_find_tensor(g, name) != NULL);
		free(name);
	}
	tl_gguf_free(g);
	return 0;
}
