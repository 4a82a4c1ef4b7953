// SPDX-License-Identifier: MIT
/*
 * test-safetensors.c - libskvst: round trips, exact bytes, atomic writes,
 * and every malformed header the reader must refuse with a clear message.
 */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "skv-safetensors.h"

static char tmpdir[256];

static int files_equal(const char *a, const char *b);

static int count_dir_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

/* A whole file from a header string and `data_len` bytes of data. */
static uint8_t *make_file(const char *json, size_t data_len, size_t *ret_len)
{
	size_t jl = strlen(json), len = 8 + jl + data_len;
	uint8_t *b = calloc(1, len);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)jl >> (8 * i));
	memcpy(b + 8, json, jl);
	for (size_t i = 0; i < data_len; i++)
		b[8 + jl + i] = (uint8_t)i;
	*ret_len = len;
	return b;
}

/* Parse must fail with `want_r` and a message containing `want_msg`. */
static void expect_bad(const char *json, size_t data_len, int want_r, const char *want_msg)
{
	size_t len;
	uint8_t *b = make_file(json, data_len, &len);
	struct skv_st_file *f = NULL;
	struct skv_st_error err = {{0}};
	int r = skv_st_open_buffer(b, len, &f, &err);
	if (r != want_r || !strstr(err.msg, want_msg))
		fprintf(stderr, "\n  header %s: got %d \"%s\", want %d \"%s\"\n", json, r, err.msg,
			want_r, want_msg);
	CU_ASSERT_EQUAL(r, want_r);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, want_msg));
	CU_ASSERT_PTR_NULL(f);
	CU_ASSERT_PTR_NULL(strchr(err.msg, '\n'));
	skv_st_close(f);
	free(b);
}

static void test_exact_bytes(void)
{
	/* Independent expectation: the header written out by hand. */
	const float a[2] = {1.0f, 2.0f};
	const uint16_t b[3] = {1, 2, 3};
	struct skv_st_tensor ts[] = {
	    {.name = "b", .dtype = SKV_ST_BF16, .rank = 1, .shape = {3}, .data = b},
	    {.name = "a", .dtype = SKV_ST_F32, .rank = 2, .shape = {1, 2}, .data = a},
	};
	struct skv_st_meta meta[] = {{"x", "y"}};
	const char *want = "{\"__metadata__\":{\"x\":\"y\"},"
			   "\"a\":{\"data_offsets\":[0,8],\"dtype\":\"F32\",\"shape\":[1,2]},"
			   "\"b\":{\"data_offsets\":[8,14],\"dtype\":\"BF16\",\"shape\":[3]}}";
	size_t wl = strlen(want), padded = (wl + 7) / 8 * 8;
	void *buf = NULL;
	size_t len = 0;
	struct skv_st_error err;

	CU_ASSERT_EQUAL_FATAL(skv_st_serialize(ts, 2, meta, 1, &buf, &len, &err), 0);
	CU_ASSERT_EQUAL_FATAL(len, 8 + padded + 14);
	const uint8_t *p = buf;
	uint64_t hl = 0;
	for (int i = 7; i >= 0; i--)
		hl = hl << 8 | p[i];
	CU_ASSERT_EQUAL(hl, padded);
	CU_ASSERT(memcmp(p + 8, want, wl) == 0);
	for (size_t i = wl; i < padded; i++)
		CU_ASSERT_EQUAL(p[8 + i], ' ');
	CU_ASSERT(memcmp(p + 8 + padded, a, 8) == 0);
	CU_ASSERT(memcmp(p + 8 + padded + 8, b, 6) == 0);
	free(buf);
}

static void test_round_trip(void)
{
	enum { N = 5 };
	float f32[24];
	uint16_t f16[7], bf16[12];
	int32_t i32[6];
	for (int i = 0; i < 24; i++)
		f32[i] = (float)i * 0.5f - 3.0f;
	for (int i = 0; i < 7; i++)
		f16[i] = (uint16_t)(0x3c00 + i);
	for (int i = 0; i < 12; i++)
		bf16[i] = (uint16_t)(0x4000 + 3 * i);
	for (int i = 0; i < 6; i++)
		i32[i] = -i * 1000;
	struct skv_st_tensor ts[N] = {
	    {.name = "layers.0.v", .dtype = SKV_ST_F16, .rank = 1, .shape = {7}, .data = f16},
	    {.name = "layers.0.k", .dtype = SKV_ST_F32, .rank = 3, .shape = {2, 3, 4}, .data = f32},
	    {.name = "z", .dtype = SKV_ST_BF16, .rank = 2, .shape = {3, 4}, .data = bf16},
	    {.name = "idx", .dtype = SKV_ST_I32, .rank = 2, .shape = {2, 3}, .data = i32},
	    {.name = "empty", .dtype = SKV_ST_F32, .rank = 2, .shape = {0, 5}, .data = NULL},
	};
	struct skv_st_meta meta[] = {{"k2", "v2"}, {"k1", "value with \"quotes\" and ü"}};
	char path[300];
	struct skv_st_error err = {{0}};
	struct skv_st_file *f = NULL;

	snprintf(path, sizeof(path), "%s/rt.safetensors", tmpdir);
	CU_ASSERT_EQUAL_FATAL(skv_st_write(path, ts, N, meta, 2, &err), 0);
	CU_ASSERT_EQUAL(count_dir_entries(tmpdir), 1);
	CU_ASSERT_EQUAL_FATAL(skv_st_open(path, &f, &err), 0);
	CU_ASSERT_EQUAL(skv_st_count(f), N);
	/* Sorted by name. */
	for (size_t i = 1; i < skv_st_count(f); i++)
		CU_ASSERT(strcmp(skv_st_at(f, i - 1)->name, skv_st_at(f, i)->name) < 0);
	for (int i = 0; i < N; i++) {
		const struct skv_st_tensor *t = skv_st_find(f, ts[i].name);
		CU_ASSERT_PTR_NOT_NULL_FATAL(t);
		CU_ASSERT_EQUAL(t->dtype, ts[i].dtype);
		CU_ASSERT_EQUAL(t->rank, ts[i].rank);
		uint64_t ne = 1;
		for (uint32_t d = 0; d < t->rank; d++) {
			CU_ASSERT_EQUAL(t->shape[d], ts[i].shape[d]);
			ne *= ts[i].shape[d];
		}
		CU_ASSERT_EQUAL(t->n_elems, ne);
		CU_ASSERT_EQUAL(t->n_bytes, ne * skv_st_dtype_size(ts[i].dtype));
		CU_ASSERT_EQUAL((uintptr_t)t->data % skv_st_dtype_size(t->dtype), 0);
		if (ne)
			CU_ASSERT(memcmp(t->data, ts[i].data, t->n_bytes) == 0);
	}
	CU_ASSERT_PTR_NULL(skv_st_find(f, "nope"));
	CU_ASSERT_EQUAL(skv_st_meta_count(f), 2);
	CU_ASSERT_STRING_EQUAL(skv_st_meta_at(f, 0)->key, "k1");
	CU_ASSERT_STRING_EQUAL(skv_st_meta_get(f, "k1"), "value with \"quotes\" and ü");
	CU_ASSERT_STRING_EQUAL(skv_st_meta_get(f, "k2"), "v2");
	CU_ASSERT_PTR_NULL(skv_st_meta_get(f, "k3"));
	skv_st_close(f);

	/* Deterministic: input order does not matter, file == serialize. */
	struct skv_st_tensor rev[N];
	for (int i = 0; i < N; i++)
		rev[i] = ts[N - 1 - i];
	struct skv_st_meta mrev[] = {meta[1], meta[0]};
	void *b1, *b2;
	size_t l1, l2;
	CU_ASSERT_EQUAL_FATAL(skv_st_serialize(ts, N, meta, 2, &b1, &l1, &err), 0);
	CU_ASSERT_EQUAL_FATAL(skv_st_serialize(rev, N, mrev, 2, &b2, &l2, &err), 0);
	CU_ASSERT_EQUAL(l1, l2);
	CU_ASSERT(memcmp(b1, b2, l1) == 0);
	FILE *fp = fopen(path, "rb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(fp);
	uint8_t *fb = malloc(l1 + 1);
	CU_ASSERT_EQUAL(fread(fb, 1, l1 + 1, fp), l1);
	fclose(fp);
	CU_ASSERT(memcmp(fb, b1, l1) == 0);
	free(fb);
	free(b1);
	free(b2);
	unlink(path);
}

static void test_open_errors(void)
{
	struct skv_st_file *f = NULL;
	struct skv_st_error err = {{0}};
	char path[300];

	snprintf(path, sizeof(path), "%s/missing", tmpdir);
	CU_ASSERT_EQUAL(skv_st_open(path, &f, &err), -ENOENT);
	CU_ASSERT_EQUAL(skv_st_open(tmpdir, &f, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "not a regular file"));
	/* Empty and truncated files on disk. */
	snprintf(path, sizeof(path), "%s/short", tmpdir);
	FILE *fp = fopen(path, "wb");
	fclose(fp);
	CU_ASSERT_EQUAL(skv_st_open(path, &f, &err), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "too short"));
	fp = fopen(path, "wb");
	fwrite("\x10\0\0", 1, 3, fp);
	fclose(fp);
	CU_ASSERT_EQUAL(skv_st_open(path, &f, &err), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "3 bytes, too short"));
	CU_ASSERT_PTR_NULL(f);
	unlink(path);
}

static void test_malformed(void)
{
	const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	struct skv_st_file *f = NULL;
	struct skv_st_error err;
	size_t len;
	uint8_t *b;

	/* The baseline parses, so each case below fails for its own reason. */
	b = make_file(ok, 8, &len);
	CU_ASSERT_EQUAL(skv_st_open_buffer(b, len, &f, &err), 0);
	skv_st_close(f);
	f = NULL;

	/* Header length: truncated, past EOF, over the limit. */
	CU_ASSERT_EQUAL(skv_st_open_buffer(b, 7, &f, &err), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "7 bytes, too short for the 8-byte header length"));
	CU_ASSERT_EQUAL(skv_st_open_buffer(b, 0, &f, &err), -EBADMSG);
	CU_ASSERT_EQUAL(skv_st_open_buffer(b, 20, &f, &err), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "past end of file (12 bytes after it)"));
	uint8_t big[16] = {0};
	big[3] = 0x10; /* 256 MiB */
	CU_ASSERT_EQUAL(skv_st_open_buffer(big, sizeof(big), &f, &err), -EBADMSG);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "exceeds the limit"));
	memset(big, 0xff, 8);
	CU_ASSERT_EQUAL(skv_st_open_buffer(big, sizeof(big), &f, &err), -EBADMSG);
	CU_ASSERT_PTR_NULL(f);
	free(b);

	/* JSON shape of the header. */
	expect_bad("", 0, -EBADMSG, "not valid JSON");
	expect_bad("{\"a\":", 0, -EBADMSG, "not valid JSON");
	expect_bad("{\"a\":1} x", 0, -EBADMSG, "not valid JSON");
	expect_bad("[1,2]", 0, -EBADMSG, "not a JSON object");
	expect_bad("{\"a\\u0000b\":{}}", 0, -EBADMSG, "not valid JSON");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		   8, -EBADMSG, "duplicate");
	expect_bad("{\"a\":[]}", 0, -EBADMSG, "a: entry is not a JSON object");
	expect_bad("{\"\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, -EBADMSG,
		   "empty name");
	expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -EBADMSG,
		   "a: missing \"dtype\"");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, -EBADMSG,
		   "a: missing \"shape\"");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, -EBADMSG,
		   "a: missing \"data_offsets\"");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
		   -EBADMSG, "a: unknown key \"x\"");

	/* dtype. */
	expect_bad("{\"layers.0.k\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
		   -ENOTSUP, "layers.0.k: unsupported dtype F64");
	expect_bad("{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -ENOTSUP,
		   "unsupported dtype f32");
	expect_bad("{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, -EBADMSG,
		   "dtype is not a string");

	/* shape. */
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, -EBADMSG,
		   "shape is not an array");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, -EBADMSG,
		   "a: shape[0] is negative");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
		   -EBADMSG, "a: shape[0] is not an integer");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,\"2\"],\"data_offsets\":[0,8]}}", 8,
		   -EBADMSG, "a: shape[1] is not an integer");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
		   "\"data_offsets\":[0,8]}}",
		   8, -EBADMSG, "not valid JSON");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
		   "\"data_offsets\":[0,8]}}",
		   8, -EBADMSG, "a: shape product overflows");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
		   "\"data_offsets\":[0,8]}}",
		   8, -EBADMSG, "a: byte size overflows");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],"
		   "\"data_offsets\":[0,8]}}",
		   8, -EBADMSG, "a: rank 9 exceeds the limit of 8");

	/* data_offsets. */
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, -EBADMSG,
		   "a: data_offsets [0, 8] hold 8 bytes but shape and dtype need 12");
	expect_bad("{\"layers.0.k\":{\"dtype\":\"F32\",\"shape\":[1024],"
		   "\"data_offsets\":[0,4096]}}",
		   1024, -EBADMSG,
		   "layers.0.k: data_offsets [0, 4096] past end of data (1024 bytes)");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, -EBADMSG,
		   "a: data_offsets [8, 0] decrease");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, -EBADMSG,
		   "non-negative");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, -EBADMSG,
		   "array of two integers");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}", 16,
		   -EBADMSG, "array of two integers");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
		   "\"data_offsets\":[9223372036854775800,9223372036854775807]}}",
		   8, -EBADMSG, "past end of data");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		   12, -EBADMSG, "b: data_offsets [4, 12] overlap a [0, 8]");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		   8, -EBADMSG, "overlap");

	/* __metadata__. */
	expect_bad("{\"__metadata__\":[]}", 0, -EBADMSG, "__metadata__ is not a JSON object");
	expect_bad("{\"__metadata__\":{\"a\":1}}", 0, -EBADMSG,
		   "__metadata__: value of \"a\" is not a string");

	/* Names with control characters stay on one line in messages. */
	expect_bad("{\"a\\nb\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
		   -ENOTSUP, "a?b: unsupported dtype");
}

static void test_accepts(void)
{
	/* Things the format allows: no tensors, empty tensors, gaps, trailing
	 * whitespace, an unaligned header length. */
	const char *cases[] = {
	    "{}",
	    "{\"__metadata__\":{}}   ",
	    "{\"e\":{\"dtype\":\"I32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
	    "\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[6,8]}}",
	    "{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[2,8]}}",
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t len;
		uint8_t *b = make_file(cases[i], 8, &len);
		struct skv_st_file *f = NULL;
		struct skv_st_error err = {{0}};
		int r = skv_st_open_buffer(b, len, &f, &err);
		if (r)
			fprintf(stderr, "\n  %s: %s\n", cases[i], err.msg);
		CU_ASSERT_EQUAL(r, 0);
		skv_st_close(f);
		free(b);
	}
	size_t len;
	uint8_t *b =
	    make_file("{\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[6,8]}}", 8, &len);
	struct skv_st_file *f = NULL;
	CU_ASSERT_EQUAL_FATAL(skv_st_open_buffer(b, len, &f, NULL), 0);
	const struct skv_st_tensor *t = skv_st_find(f, "s");
	CU_ASSERT_EQUAL(t->rank, 0);
	CU_ASSERT_EQUAL(t->n_elems, 1);
	CU_ASSERT_EQUAL(t->offset, 6);
	CU_ASSERT_EQUAL(skv_st_data_size(f), 8);
	skv_st_close(f);
	free(b);
}

/* Every truncation and many byte flips of a valid file: errors, never a crash. */
static void test_truncations_and_flips(void)
{
	float d[16] = {0};
	uint16_t h[8] = {0};
	struct skv_st_tensor ts[] = {
	    {.name = "layers.0.k", .dtype = SKV_ST_F32, .rank = 2, .shape = {4, 4}, .data = d},
	    {.name = "layers.0.v", .dtype = SKV_ST_BF16, .rank = 1, .shape = {8}, .data = h},
	};
	struct skv_st_meta meta[] = {{"policy", "snapkv"}};
	void *buf;
	size_t len;
	struct skv_st_error err;
	CU_ASSERT_EQUAL_FATAL(skv_st_serialize(ts, 2, meta, 1, &buf, &len, &err), 0);
	for (size_t l = 0; l < len; l++) {
		struct skv_st_file *f = NULL;
		int r = skv_st_open_buffer(buf, l, &f, &err);
		CU_ASSERT(r < 0);
		CU_ASSERT(r < 0 && err.msg[0]);
		skv_st_close(f);
	}
	uint8_t *c = malloc(len);
	unsigned seed = 12345;
	int n_ok = 0;
	for (int it = 0; it < 3000; it++) {
		memcpy(c, buf, len);
		size_t pos = (size_t)(rand_r(&seed) % (int)(len < 200 ? len : 200));
		c[pos] = (uint8_t)rand_r(&seed);
		struct skv_st_file *f = NULL;
		int r = skv_st_open_buffer(c, len, &f, &err);
		if (r == 0) {
			n_ok++;
			/* Whatever parsed must lie within the buffer. */
			for (size_t i = 0; i < skv_st_count(f); i++) {
				const struct skv_st_tensor *t = skv_st_at(f, i);
				CU_ASSERT((const uint8_t *)t->data >= c &&
					  (const uint8_t *)t->data + t->n_bytes <= c + len);
			}
		}
		skv_st_close(f);
	}
	CU_ASSERT(n_ok > 0);
	free(c);
	free(buf);
}

static void test_writer_errors(void)
{
	float d[2] = {0};
	struct skv_st_tensor ts[] = {
	    {.name = "a", .dtype = SKV_ST_F32, .rank = 1, .shape = {2}, .data = d},
	    {.name = "a", .dtype = SKV_ST_F32, .rank = 1, .shape = {2}, .data = d},
	};
	struct skv_st_error err = {{0}};
	char path[300];

	snprintf(path, sizeof(path), "%s/w.safetensors", tmpdir);
	CU_ASSERT_EQUAL(skv_st_write(path, ts, 2, NULL, 0, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "a: duplicate tensor name"));
	struct skv_st_tensor bad = ts[0];
	bad.name = "__metadata__";
	CU_ASSERT_EQUAL(skv_st_write(path, &bad, 1, NULL, 0, &err), -EINVAL);
	bad = ts[0];
	bad.dtype = (enum skv_st_dtype)9;
	CU_ASSERT_EQUAL(skv_st_write(path, &bad, 1, NULL, 0, &err), -EINVAL);
	bad = ts[0];
	bad.data = NULL;
	CU_ASSERT_EQUAL(skv_st_write(path, &bad, 1, NULL, 0, &err), -EINVAL);
	struct skv_st_meta dm[] = {{"k", "1"}, {"k", "2"}};
	CU_ASSERT_EQUAL(skv_st_write(path, ts, 1, dm, 2, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "duplicate key"));
	struct skv_st_meta bm[] = {{"k", "\xff\xfe"}};
	CU_ASSERT_EQUAL(skv_st_write(path, ts, 1, bm, 1, &err), -EINVAL);
	CU_ASSERT_EQUAL(count_dir_entries(tmpdir), 0);

	/* Missing directory; target is a directory: no temp file left. */
	snprintf(path, sizeof(path), "%s/nodir/w.safetensors", tmpdir);
	CU_ASSERT_EQUAL(skv_st_write(path, ts, 1, NULL, 0, &err), -ENOENT);
	snprintf(path, sizeof(path), "%s/adir", tmpdir);
	CU_ASSERT_EQUAL_FATAL(mkdir(path, 0755), 0);
	CU_ASSERT(skv_st_write(path, ts, 1, NULL, 0, &err) < 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "rename"));
	CU_ASSERT_EQUAL(count_dir_entries(tmpdir), 1);
	rmdir(path);

	/* An existing file is replaced whole. */
	snprintf(path, sizeof(path), "%s/w.safetensors", tmpdir);
	FILE *fp = fopen(path, "wb");
	fputs("old contents that are longer than the new file will be, by a good margin "
	      "............................................................................",
	      fp);
	fclose(fp);
	CU_ASSERT_EQUAL(skv_st_write(path, ts, 1, NULL, 0, &err), 0);
	struct skv_st_file *f = NULL;
	CU_ASSERT_EQUAL(skv_st_open(path, &f, &err), 0);
	skv_st_close(f);
	struct stat st;
	CU_ASSERT_EQUAL(stat(path, &st), 0);
	CU_ASSERT_EQUAL(st.st_mode & 0777, 0644);
	unlink(path);
	CU_ASSERT_EQUAL(count_dir_entries(tmpdir), 0);
}

static void test_write_compact(void)
{
	/* 2 layers, h_store 2, kept 3, D 2, bf16. */
	uint16_t k[2][12], v[2][12];
	int32_t pos[2][6] = {{0, 2, 3, 1, 2, 3}, {1, 2, 3, 0, 1, 3}};
	float mass[2][2] = {{0.5f, 0.75f}, {1.0f, 0.25f}};
	for (int l = 0; l < 2; l++)
		for (int i = 0; i < 12; i++) {
			k[l][i] = (uint16_t)(l * 100 + i);
			v[l][i] = (uint16_t)(l * 100 + i + 50);
		}
	struct skv_st_compact_desc d = {0};
	/* Filled by hand: libskvst must not need libskv. */
	d.params.params_size = sizeof(d.params);
	d.params.policy = SKV_POLICY_SNAPKV;
	d.params.pooling = SKV_POOL_AVG;
	d.params.gqa = SKV_GQA_EXPAND;
	d.params.sinks = 4;
	d.params.window = 1;
	d.params.capacity = 3;
	d.params.kernel = 1;
	d.params.n_protected = 2;
	d.params.protected_ranges[0] = (struct skv_range){0, 1};
	d.params.protected_ranges[1] = (struct skv_range){2, 3};
	d.shape = (struct skv_shape){.prompt_len = 4, .head_dim = 2, .h_q = 2, .h_kv = 1, .n_q = 1};
	d.plan = (struct skv_plan){.h_store = 2, .kept = 3, .w_obs = 1, .w_keep = 1};
	d.dtype = SKV_DTYPE_BF16;
	d.n_layers = 2;
	/* SPEC.md's formulas by hand: B 1, N 2, H_kv 1, H_store 2, L 4, C 3, D 2, s 2. */
	d.ledger = (struct skv_ledger){.native_full = 2 * 2 * 1 * 4 * 2 * 2,
				       .compact = 2 * 2 * 2 * 3 * 2 * 2,
				       .index = 4 * 2 * 2 * 3,
				       .reserved = 0,
				       .h_store = 2};
	struct skv_st_layer_result res[2];
	for (int l = 0; l < 2; l++)
		res[l] = (struct skv_st_layer_result){
		    .k = k[l], .v = v[l], .positions = pos[l], .retained_mass = mass[l]};
	res[1].retained_mass = NULL;
	char path[300];
	struct skv_st_error err = {{0}};
	struct skv_st_file *f = NULL;
	snprintf(path, sizeof(path), "%s/c.safetensors", tmpdir);
	CU_ASSERT_EQUAL_FATAL(skv_st_write_compact(path, &d, res, &err), 0);
	CU_ASSERT_EQUAL_FATAL(skv_st_open(path, &f, &err), 0);
	CU_ASSERT_EQUAL(skv_st_count(f), 8);
	const struct skv_st_tensor *t = skv_st_find(f, "layers.1.k");
	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	CU_ASSERT_EQUAL(t->dtype, SKV_ST_BF16);
	CU_ASSERT_EQUAL(t->rank, 3);
	CU_ASSERT(t->shape[0] == 2 && t->shape[1] == 3 && t->shape[2] == 2);
	CU_ASSERT(memcmp(t->data, k[1], sizeof(k[1])) == 0);
	t = skv_st_find(f, "layers.0.v");
	CU_ASSERT(memcmp(t->data, v[0], sizeof(v[0])) == 0);
	t = skv_st_find(f, "layers.1.indices");
	CU_ASSERT_EQUAL(t->dtype, SKV_ST_I32);
	CU_ASSERT(t->rank == 2 && t->shape[0] == 2 && t->shape[1] == 3);
	CU_ASSERT(memcmp(t->data, pos[1], sizeof(pos[1])) == 0);
	t = skv_st_find(f, "layers.0.retained_mass");
	CU_ASSERT(t->dtype == SKV_ST_F32 && t->rank == 1 && t->shape[0] == 2);
	CU_ASSERT(memcmp(t->data, mass[0], sizeof(mass[0])) == 0);
	t = skv_st_find(f, "layers.1.retained_mass");
	CU_ASSERT(isnan(((const float *)t->data)[0]));
	const struct {
		const char *k, *v;
	} want[] = {
	    {"format", "snapkv-compact"},
	    {"policy", "snapkv"},
	    {"window", "1"},
	    {"capacity", "3"},
	    {"kernel", "1"},
	    {"pooling", "avg"},
	    {"gqa", "expand"},
	    {"protected", "0:1,2:3"},
	    {"L", "4"},
	    {"layers", "2"},
	    {"h_q", "2"},
	    {"h_kv", "1"},
	    {"head_dim", "2"},
	    {"dtype", "bf16"},
	    {"kept", "3"},
	    {"h_store", "2"},
	    {"ledger.native_full", "64"},
	    {"ledger.compact", "96"},
	    {"ledger.index", "48"},
	    {"ledger.reserved", "0"},
	    {"ledger.ratio", "1.500000"},
	    {"ledger.ratio_exact", "3/2"},
	};
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		const char *got = skv_st_meta_get(f, want[i].k);
		CU_ASSERT_PTR_NOT_NULL(got);
		if (got && strcmp(got, want[i].v))
			fprintf(stderr, "\n  %s = %s, want %s\n", want[i].k, got, want[i].v);
		CU_ASSERT(got && strcmp(got, want[i].v) == 0);
	}
	skv_st_close(f);

	/* Same inputs, same bytes. */
	char path2[300];
	snprintf(path2, sizeof(path2), "%s/c2.safetensors", tmpdir);
	CU_ASSERT_EQUAL_FATAL(skv_st_write_compact(path2, &d, res, &err), 0);
	CU_ASSERT(files_equal(path, path2));
	unlink(path);
	unlink(path2);

	d.params.policy = (enum skv_policy)42;
	CU_ASSERT_EQUAL(skv_st_write_compact(path, &d, res, &err), -EINVAL);
	CU_ASSERT_EQUAL(count_dir_entries(tmpdir), 0);
}

static void test_desc_init(void)
{
	/* SPEC.md's ledger example at g = 0, by hand: B 1, N 32, H_q 32, H_kv 8,
	 * D 128, s 2, L 16384, C 1024. */
	struct skv_params p;
	struct skv_st_compact_desc d;
	struct skv_error err = {.layer = -1, .head = -1};
	skv_params_init(&p);
	p.capacity = 1024;
	struct skv_shape sh = {
	    .prompt_len = 16384, .head_dim = 128, .h_q = 32, .h_kv = 8, .n_q = 32};
	CU_ASSERT_EQUAL_FATAL(skv_st_compact_desc_init(&d, &p, &sh, SKV_DTYPE_BF16, 32, &err), 0);
	CU_ASSERT_EQUAL(d.ledger.native_full, 2ull * 32 * 8 * 16384 * 128 * 2);
	CU_ASSERT_EQUAL(d.ledger.compact, 2ull * 32 * 32 * 1024 * 128 * 2);
	CU_ASSERT_EQUAL(d.ledger.index, 4ull * 32 * 32 * 1024);
	CU_ASSERT_EQUAL(d.ledger.reserved, 0);
	CU_ASSERT_EQUAL(d.plan.kept, 1024);
	CU_ASSERT_EQUAL(d.plan.h_store, 32);
	CU_ASSERT_EQUAL(d.n_layers, 32);
	p.gqa = SKV_GQA_GROUP;
	CU_ASSERT_EQUAL_FATAL(skv_st_compact_desc_init(&d, &p, &sh, SKV_DTYPE_BF16, 32, &err), 0);
	CU_ASSERT_EQUAL(d.ledger.compact, 2ull * 32 * 8 * 1024 * 128 * 2);
	CU_ASSERT_EQUAL(d.plan.h_store, 8);
	/* Invalid parameters: -EINVAL with libskv's reason. */
	p.kernel = 4;
	err.msg[0] = '\0';
	CU_ASSERT_EQUAL(skv_st_compact_desc_init(&d, &p, &sh, SKV_DTYPE_BF16, 32, &err), -EINVAL);
	CU_ASSERT(err.msg[0] != '\0');
	p.kernel = 5;
	CU_ASSERT_EQUAL(skv_st_compact_desc_init(&d, &p, &sh, SKV_DTYPE_UNSPECIFIED, 32, &err),
			-EINVAL);
	CU_ASSERT_EQUAL(skv_st_compact_desc_init(&d, &p, &sh, SKV_DTYPE_F32, 0, &err), -EINVAL);
}

static int files_equal(const char *a, const char *b)
{
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "cmp -s '%s' '%s'", a, b);
	return system(cmd) == 0;
}

/*
 * The daemon writes into a cache with decode headroom, possibly NHD; the
 * offline CLI into packed buffers. Both must give the same file: run one
 * real compaction into both layouts and compare the bytes.
 */
static void test_strided_results_same_bytes(void)
{
	enum { L = 40, D = 8, HQ = 4, HKV = 2, W = 4, C = 12, NL = 2, RES = 5 };
	struct skv_params p;
	skv_params_init(&p);
	p.window = W;
	p.capacity = C;
	p.kernel = 3;
	struct skv_shape sh = {.prompt_len = L, .head_dim = D, .h_q = HQ, .h_kv = HKV, .n_q = W};
	struct skv_st_compact_desc desc;
	struct skv_error kerr;
	CU_ASSERT_EQUAL_FATAL(skv_st_compact_desc_init(&desc, &p, &sh, SKV_DTYPE_F16, NL, &kerr),
			      0);
	const uint32_t hs = desc.plan.h_store, kept = desc.plan.kept, cap = kept + RES;
	CU_ASSERT_EQUAL_FATAL(kept, C);

	static uint16_t q[NL][HQ * W * D], k[NL][HKV * L * D], v[NL][HKV * L * D];
	unsigned seed = 7;
	for (int l = 0; l < NL; l++) {
		for (int i = 0; i < HQ * W * D; i++)
			q[l][i] = skv_f32_to_f16((float)(rand_r(&seed) % 2001 - 1000) / 300.0f);
		for (int i = 0; i < HKV * L * D; i++) {
			k[l][i] = skv_f32_to_f16((float)(rand_r(&seed) % 2001 - 1000) / 300.0f);
			v[l][i] = skv_f32_to_f16((float)(rand_r(&seed) % 2001 - 1000) / 300.0f);
		}
	}
	/* Packed [hs, kept, D] outputs and NHD outputs with headroom. */
	static uint16_t pk[NL][HQ * C * D], pv[NL][HQ * C * D];
	static uint16_t nk[NL][(C + RES) * HQ * D], nv[NL][(C + RES) * HQ * D];
	static int32_t ppos[NL][HQ * C], npos[NL][HQ * (C + RES)];
	static float pm[NL][HQ], nm[NL][HQ];
	struct skv_layer_in in[NL];
	struct skv_layer_out po[NL], no[NL];
	struct skv_st_layer_result pr[NL], nr[NL];
	for (int l = 0; l < NL; l++) {
		in[l].q = (struct skv_tensor){
		    .data = q[l], .dtype = SKV_DTYPE_F16, .head_stride = W * D, .token_stride = D};
		in[l].k = (struct skv_tensor){
		    .data = k[l], .dtype = SKV_DTYPE_F16, .head_stride = L * D, .token_stride = D};
		in[l].v = in[l].k;
		in[l].v.data = v[l];
		po[l].k = (struct skv_tensor){.data = pk[l],
					      .dtype = SKV_DTYPE_F16,
					      .head_stride = (int64_t)kept * D,
					      .token_stride = D};
		po[l].v = po[l].k;
		po[l].v.data = pv[l];
		po[l].positions = ppos[l];
		po[l].pos_stride = kept;
		po[l].retained_mass = pm[l];
		no[l].k = (struct skv_tensor){.data = nk[l],
					      .dtype = SKV_DTYPE_F16,
					      .head_stride = D,
					      .token_stride = (int64_t)hs * D};
		no[l].v = no[l].k;
		no[l].v.data = nv[l];
		no[l].positions = npos[l];
		no[l].pos_stride = cap;
		no[l].retained_mass = nm[l];
		pr[l] = (struct skv_st_layer_result){
		    .k = pk[l], .v = pv[l], .positions = ppos[l], .retained_mass = pm[l]};
		nr[l] = (struct skv_st_layer_result){.k = nk[l],
						     .v = nv[l],
						     .positions = npos[l],
						     .retained_mass = nm[l],
						     .head_stride = D,
						     .token_stride = (int64_t)hs * D,
						     .pos_stride = cap};
	}
	struct skv_ctx *ctx;
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &sh, &p, NL, in, po, &kerr), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &sh, &p, NL, in, no, &kerr), 0);
	skv_ctx_free(ctx);

	char a[300], b[300];
	struct skv_st_error err;
	snprintf(a, sizeof(a), "%s/packed.st", tmpdir);
	snprintf(b, sizeof(b), "%s/nhd.st", tmpdir);
	CU_ASSERT_EQUAL_FATAL(skv_st_write_compact(a, &desc, pr, &err), 0);
	CU_ASSERT_EQUAL_FATAL(skv_st_write_compact(b, &desc, nr, &err), 0);
	CU_ASSERT(files_equal(a, b));

	/* And the file holds the input rows at the kept positions. */
	struct skv_st_file *f = NULL;
	CU_ASSERT_EQUAL_FATAL(skv_st_open(b, &f, &err), 0);
	const struct skv_st_tensor *tk = skv_st_find(f, "layers.1.k");
	const struct skv_st_tensor *ti = skv_st_find(f, "layers.1.indices");
	CU_ASSERT_PTR_NOT_NULL_FATAL(tk);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ti);
	const uint16_t *fk = tk->data;
	const int32_t *fi = ti->data;
	for (uint32_t h = 0; h < hs; h++)
		for (uint32_t i = 0; i < kept; i++) {
			int32_t j = fi[h * kept + i];
			CU_ASSERT(j >= 0 && j < L);
			CU_ASSERT(i == 0 || j > fi[h * kept + i - 1]);
			uint32_t kvh = h / (HQ / HKV);
			CU_ASSERT(memcmp(fk + ((size_t)h * kept + i) * D,
					 k[1] + ((size_t)kvh * L + (uint32_t)j) * D, D * 2) == 0);
		}
	skv_st_close(f);
	unlink(a);
	unlink(b);
}

int main(void)
{
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof(tmpdir), "%s/test-st-XXXXXX", base ? base : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	CU_pSuite s = CU_add_suite("safetensors", NULL, NULL);
	CU_add_test(s, "exact bytes of a small file", test_exact_bytes);
	CU_add_test(s, "round trip, all dtypes, deterministic", test_round_trip);
	CU_add_test(s, "open: missing, directory, short file", test_open_errors);
	CU_add_test(s, "malformed headers are refused by name", test_malformed);
	CU_add_test(s, "legal corner cases are accepted", test_accepts);
	CU_add_test(s, "truncations and byte flips never crash", test_truncations_and_flips);
	CU_add_test(s, "writer errors leave nothing behind", test_writer_errors);
	CU_add_test(s, "compact-cache file contents and metadata", test_write_compact);
	CU_add_test(s, "desc_init: plan and SPEC.md ledger", test_desc_init);
	CU_add_test(s, "strided (daemon) and packed (CLI) results give the same file",
		    test_strided_results_same_bytes);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned failures = CU_get_number_of_failures();
	CU_cleanup_registry();
	rmdir(tmpdir);
	return failures ? 1 : 0;
}
