// SPDX-License-Identifier: MIT
/*
 * fuzz-safetensors - libFuzzer target: a whole safetensors file given to
 * libskvst's reader (skv_st_open_buffer), as snapkvctl and the engines
 * read theirs.
 *
 * Properties: the reader never reads outside the buffer (a malloc of
 * exactly the input, so ASan sees any stray byte); on success every tensor
 * lies inside the data area with n_bytes = n_elems * element size, names
 * are sorted and found again by skv_st_find, metadata likewise; and what
 * was read, written again with skv_st_serialize, reads back with the same
 * tensors and bytes (the writer and the reader agree on the format).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv-safetensors.h"

#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz-safetensors: %s:%d: %s\n", __FILE__, __LINE__,       \
				#cond);                                                            \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

static volatile uint64_t sink;

static void check_file(const struct skv_st_file *f, const uint8_t *buf, size_t len)
{
	size_t n = skv_st_count(f), nm = skv_st_meta_count(f);
	uint64_t data_size = skv_st_data_size(f);

	REQUIRE(n <= SKV_ST_MAX_TENSORS);
	REQUIRE(data_size <= len - 8);
	for (size_t i = 0; i < n; i++) {
		const struct skv_st_tensor *t = skv_st_at(f, i);
		const uint8_t *p = t->data;
		uint64_t el = 1;

		REQUIRE(t && t->name);
		REQUIRE(strlen(t->name) <= SKV_ST_MAX_NAME);
		REQUIRE(t->rank <= SKV_ST_MAX_RANK);
		REQUIRE(skv_st_dtype_size(t->dtype) != 0);
		for (uint32_t d = 0; d < t->rank; d++)
			REQUIRE(!__builtin_mul_overflow(el, t->shape[d], &el));
		REQUIRE(el == t->n_elems);
		REQUIRE(t->n_bytes == t->n_elems * skv_st_dtype_size(t->dtype));
		REQUIRE(t->offset + t->n_bytes <= data_size);
		REQUIRE(p >= buf && p + t->n_bytes <= buf + len);
		if (t->n_bytes)
			sink += p[0] + p[t->n_bytes - 1];
		if (i)
			REQUIRE(strcmp(skv_st_at(f, i - 1)->name, t->name) < 0);
		REQUIRE(skv_st_find(f, t->name) == t);
	}
	for (size_t i = 0; i < nm; i++) {
		const struct skv_st_meta *m = skv_st_meta_at(f, i);

		REQUIRE(m && m->key && m->value);
		REQUIRE(skv_st_meta_get(f, m->key) == m->value);
		if (i)
			REQUIRE(strcmp(skv_st_meta_at(f, i - 1)->key, m->key) < 0);
	}
}

/* Write what was read and read it again: same names, shapes and bytes. */
static void roundtrip(const struct skv_st_file *f)
{
	size_t n = skv_st_count(f), nm = skv_st_meta_count(f), len2;
	struct skv_st_tensor *ts = calloc(n ? n : 1, sizeof(*ts));
	struct skv_st_meta *ms = calloc(nm ? nm : 1, sizeof(*ms));
	struct skv_st_file *g = NULL;
	struct skv_st_error err;
	void *buf2 = NULL;
	int r;

	REQUIRE(ts && ms);
	for (size_t i = 0; i < n; i++)
		ts[i] = *skv_st_at(f, i);
	for (size_t i = 0; i < nm; i++)
		ms[i] = *skv_st_meta_at(f, i);
	r = skv_st_serialize(ts, n, ms, nm, &buf2, &len2, &err);
	if (r == 0) {
		r = skv_st_open_buffer(buf2, len2, &g, &err);
		if (r < 0)
			fprintf(stderr, "fuzz-safetensors: rewritten file refused: %s\n", err.msg);
		REQUIRE(r == 0);
		REQUIRE(skv_st_count(g) == n && skv_st_meta_count(g) == nm);
		for (size_t i = 0; i < n; i++) {
			const struct skv_st_tensor *a = skv_st_at(f, i), *b = skv_st_at(g, i);

			REQUIRE(!strcmp(a->name, b->name) && a->dtype == b->dtype &&
				a->rank == b->rank && a->n_bytes == b->n_bytes);
			REQUIRE(!memcmp(a->shape, b->shape, sizeof(a->shape[0]) * a->rank));
			REQUIRE(!a->n_bytes || !memcmp(a->data, b->data, a->n_bytes));
		}
		for (size_t i = 0; i < nm; i++)
			REQUIRE(!strcmp(skv_st_meta_at(f, i)->value, skv_st_meta_at(g, i)->value));
		skv_st_close(g);
		free(buf2);
	}
	free(ts);
	free(ms);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct skv_st_file *f = NULL;
	struct skv_st_error err;
	uint8_t *buf = malloc(size ? size : 1);
	int r;

	REQUIRE(buf);
	memcpy(buf, data, size);
	err.msg[0] = 'x';
	r = skv_st_open_buffer(buf, size, &f, &err);
	if (r < 0) {
		REQUIRE(memchr(err.msg, 0, sizeof(err.msg))); /* a terminated message */
		REQUIRE(!f);
	} else {
		REQUIRE(size >= 8);
		check_file(f, buf, size);
		roundtrip(f);
		skv_st_close(f);
	}
	free(buf);
	return 0;
}
