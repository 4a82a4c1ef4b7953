// SPDX-License-Identifier: MIT
/*
 * GGUF v3 reader. Layout (all little-endian):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 type, value },
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset },
 *   padding to general.alignment (default 32), tensor data.
 * A string is u64 length + bytes; an array is u32 elem type + u64 count + elems.
 * The file is read whole; a cursor walks it and every read checks that the
 * bytes it needs remain before touching them.
 */
#include "tl-gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tl_fail(struct tl_err *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
	}
	return code;
}

struct cursor {
	const uint8_t *buf;
	uint64_t size;
	uint64_t off;
	struct tl_err *err;
};

static uint64_t remaining(const struct cursor *c)
{
	return c->size - c->off;
}

static int take(struct cursor *c, uint64_t n, const uint8_t **ret_p, const char *what)
{
	if (n > remaining(c))
		return tl_fail(c->err, -EBADMSG,
			       "gguf: %s: needs %llu bytes at offset %llu, file has %llu", what,
			       (unsigned long long)n, (unsigned long long)c->off,
			       (unsigned long long)c->size);
	*ret_p = c->buf + c->off;
	c->off += n;
	return 0;
}

static int rd_u32(struct cursor *c, uint32_t *ret_v, const char *what)
{
	const uint8_t *p = NULL;
	int r = take(c, 4, &p, what);
	if (r < 0)
		return r;
	memcpy(ret_v, p, 4);
	return 0;
}

static int rd_u64(struct cursor *c, uint64_t *ret_v, const char *what)
{
	const uint8_t *p = NULL;
	int r = take(c, 8, &p, what);
	if (r < 0)
		return r;
	memcpy(ret_v, p, 8);
	return 0;
}

static int rd_str(struct cursor *c, struct tl_str *ret_s, uint64_t max, const char *what)
{
	uint64_t n;
	const uint8_t *p = NULL;
	int r = rd_u64(c, &n, what);
	if (r < 0)
		return r;
	if (n > max)
		return tl_fail(c->err, -EBADMSG, "gguf: %s: string length %llu over limit %llu",
			       what, (unsigned long long)n, (unsigned long long)max);
	if (n > remaining(c))
		return tl_fail(c->err, -EBADMSG,
			       "gguf: %s: string length %llu at offset %llu runs past end of file "
			       "(%llu bytes)",
			       what, (unsigned long long)n, (unsigned long long)c->off,
			       (unsigned long long)c->size);
	r = take(c, n, &p, what);
	if (r < 0)
		return r;
	ret_s->p = (const char *)p;
	ret_s->n = n;
	return 0;
}

static uint64_t scalar_size(enum tl_gguf_type t)
{
	switch (t) {
	case TL_GGUF_UINT8:
	case TL_GGUF_INT8:
	case TL_GGUF_BOOL:
		return 1;
	case TL_GGUF_UINT16:
	case TL_GGUF_INT16:
		return 2;
	case TL_GGUF_UINT32:
	case TL_GGUF_INT32:
	case TL_GGUF_FLOAT32:
		return 4;
	case TL_GGUF_UINT64:
	case TL_GGUF_INT64:
	case TL_GGUF_FLOAT64:
		return 8;
	default:
		return 0;
	}
}

const char *tl_gguf_type_name(enum tl_gguf_type t)
{
	static const char *const names[] = {"uint8",  "int8",	 "uint16", "int16",  "uint32",
					    "int32",  "float32", "bool",   "string", "array",
					    "uint64", "int64",	 "float64"};
	return (unsigned)t < TL_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

bool tl_str_eq(struct tl_str s, const char *c)
{
	size_t n = strlen(c);
	return s.n == n && memcmp(s.p, c, n) == 0;
}

static int rd_scalar(struct cursor *c, enum tl_gguf_type t, struct tl_gguf_value *v)
{
	const uint8_t *p = NULL;
	uint64_t sz = scalar_size(t);
	int r = take(c, sz, &p, "metadata value");
	if (r < 0)
		return r;
	v->type = t;
	switch (t) {
	case TL_GGUF_UINT8:
		v->u = p[0];
		break;
	case TL_GGUF_INT8:
		v->i = (int8_t)p[0];
		break;
	case TL_GGUF_BOOL:
		if (p[0] > 1)
			return tl_fail(c->err, -EBADMSG, "gguf: bool value %u is neither 0 nor 1",
				       p[0]);
		v->u = p[0];
		break;
	case TL_GGUF_UINT16: {
		uint16_t x;
		memcpy(&x, p, 2);
		v->u = x;
		break;
	}
	case TL_GGUF_INT16: {
		int16_t x;
		memcpy(&x, p, 2);
		v->i = x;
		break;
	}
	case TL_GGUF_UINT32: {
		uint32_t x;
		memcpy(&x, p, 4);
		v->u = x;
		break;
	}
	case TL_GGUF_INT32: {
		int32_t x;
		memcpy(&x, p, 4);
		v->i = x;
		break;
	}
	case TL_GGUF_FLOAT32: {
		float x;
		memcpy(&x, p, 4);
		v->f = x;
		break;
	}
	case TL_GGUF_UINT64:
		memcpy(&v->u, p, 8);
		break;
	case TL_GGUF_INT64:
		memcpy(&v->i, p, 8);
		break;
	case TL_GGUF_FLOAT64:
		memcpy(&v->f, p, 8);
		break;
	default:
		return tl_fail(c->err, -EBADMSG, "gguf: bad scalar type %u", (unsigned)t);
	}
	return 0;
}

/* Walk (and so validate) an array body without keeping it: arrays of arrays. */
static int skip_array(struct cursor *c, unsigned depth)
{
	uint32_t et;
	uint64_t n;
	int r;

	if (depth > TL_GGUF_MAX_DEPTH)
		return tl_fail(c->err, -EBADMSG, "gguf: arrays nested deeper than %u",
			       TL_GGUF_MAX_DEPTH);
	if ((r = rd_u32(c, &et, "array type")) < 0 || (r = rd_u64(c, &n, "array count")) < 0)
		return r;
	if (et >= TL_GGUF_TYPE_COUNT)
		return tl_fail(c->err, -EBADMSG, "gguf: array element type %u unknown", et);
	if (et == TL_GGUF_STRING || et == TL_GGUF_ARRAY) {
		/* Each element needs at least 8 (string) or 12 (array) bytes. */
		uint64_t min = et == TL_GGUF_STRING ? 8 : 12;
		if (n > remaining(c) / min)
			return tl_fail(c->err, -EBADMSG,
				       "gguf: array count %llu cannot fit in the %llu bytes left",
				       (unsigned long long)n, (unsigned long long)remaining(c));
		for (uint64_t i = 0; i < n; i++) {
			struct tl_str s;
			r = et == TL_GGUF_STRING ? rd_str(c, &s, UINT64_MAX, "array string")
						 : skip_array(c, depth + 1);
			if (r < 0)
				return r;
		}
		return 0;
	}
	const uint8_t *p = NULL;
	uint64_t sz = scalar_size(et);
	if (n > remaining(c) / sz)
		return tl_fail(c->err, -EBADMSG, "gguf: array of %llu %s runs past end of file",
			       (unsigned long long)n, tl_gguf_type_name(et));
	return take(c, n * sz, &p, "array data");
}

static int rd_value(struct tl_gguf *g, struct cursor *c, uint32_t type, struct tl_gguf_value *v)
{
	int r;

	if (type >= TL_GGUF_TYPE_COUNT)
		return tl_fail(c->err, -EBADMSG, "gguf: metadata value type %u unknown", type);
	if (type == TL_GGUF_STRING) {
		v->type = TL_GGUF_STRING;
		return rd_str(c, &v->s, UINT64_MAX, "metadata string");
	}
	if (type != TL_GGUF_ARRAY)
		return rd_scalar(c, type, v);

	uint32_t et;
	uint64_t n;
	uint64_t start;
	if ((r = rd_u32(c, &et, "array type")) < 0 || (r = rd_u64(c, &n, "array count")) < 0)
		return r;
	if (et >= TL_GGUF_TYPE_COUNT)
		return tl_fail(c->err, -EBADMSG, "gguf: array element type %u unknown", et);
	v->type = TL_GGUF_ARRAY;
	v->arr.type = et;
	v->arr.n = n;
	v->arr.strs = NULL;
	start = c->off;
	if (et == TL_GGUF_STRING) {
		if (n > remaining(c) / 8)
			return tl_fail(
			    c->err, -EBADMSG,
			    "gguf: string array count %llu cannot fit in the %llu bytes left",
			    (unsigned long long)n, (unsigned long long)remaining(c));
		struct tl_str *strs = calloc(n ? n : 1, sizeof(*strs));
		if (!strs)
			return tl_fail(c->err, -ENOMEM, "gguf: out of memory for %llu strings",
				       (unsigned long long)n);
		for (uint64_t i = 0; i < n; i++) {
			r = rd_str(c, &strs[i], UINT64_MAX, "array string");
			if (r < 0) {
				free(strs);
				return r;
			}
		}
		/* n_kv bounds how many string arrays there can be. */
		g->str_pool[g->n_str_pool++] = strs;
		v->arr.strs = strs;
	} else if (et == TL_GGUF_ARRAY) {
		if (n > remaining(c) / 12)
			return tl_fail(c->err, -EBADMSG,
				       "gguf: array count %llu cannot fit in the %llu bytes left",
				       (unsigned long long)n, (unsigned long long)remaining(c));
		for (uint64_t i = 0; i < n; i++)
			if ((r = skip_array(c, 2)) < 0)
				return r;
	} else {
		const uint8_t *p = NULL;
		uint64_t sz = scalar_size(et);
		if (n > remaining(c) / sz)
			return tl_fail(
			    c->err, -EBADMSG,
			    "gguf: array of %llu %s at offset %llu runs past end of file",
			    (unsigned long long)n, tl_gguf_type_name(et),
			    (unsigned long long)c->off);
		if ((r = take(c, n * sz, &p, "array data")) < 0)
			return r;
	}
	v->arr.data = c->buf + start;
	v->arr.nbytes = c->off - start;
	return 0;
}

void tl_gguf_free(struct tl_gguf *g)
{
	if (!g)
		return;
	for (uint64_t i = 0; i < g->n_str_pool; i++)
		free(g->str_pool[i]);
	free(g->str_pool);
	free(g->kv);
	free(g->tensors);
	free(g->buf);
	free(g);
}

uint32_t tl_ggml_block_elems(uint32_t type)
{
	switch (type) {
	case TL_GGML_F32:
	case TL_GGML_F16:
		return 1;
	case TL_GGML_Q4_0:
	case TL_GGML_Q4_1:
	case TL_GGML_Q8_0:
		return 32;
	default:
		return 0;
	}
}

/* ggml's block layouts: Q4_0 {f16 d; u8 qs[16]}, Q4_1 {f16 d, m; u8 qs[16]},
 * Q8_0 {f16 d; i8 qs[32]}. */
uint32_t tl_ggml_block_bytes(uint32_t type)
{
	switch (type) {
	case TL_GGML_F32:
		return 4;
	case TL_GGML_F16:
		return 2;
	case TL_GGML_Q4_0:
		return 18;
	case TL_GGML_Q4_1:
		return 20;
	case TL_GGML_Q8_0:
		return 34;
	default:
		return 0;
	}
}

static int parse(struct tl_gguf *g, struct tl_err *err)
{
	struct cursor c = {.buf = g->buf, .size = g->size, .off = 0, .err = err};
	uint32_t magic;
	int r;

	if ((r = rd_u32(&c, &magic, "magic")) < 0)
		return r;
	if (magic != TL_GGUF_MAGIC)
		return tl_fail(err, -EBADMSG, "gguf: bad magic 0x%08x (not a GGUF file)", magic);
	if ((r = rd_u32(&c, &g->version, "version")) < 0)
		return r;
	if (g->version != 3)
		return tl_fail(err, -ENOTSUP, "gguf: version %u not supported (only 3)",
			       g->version);
	if ((r = rd_u64(&c, &g->n_tensors, "tensor count")) < 0 ||
	    (r = rd_u64(&c, &g->n_kv, "metadata count")) < 0)
		return r;
	/* A key/value takes at least 8 + 4 + 1 bytes, a tensor info at least 8 + 4 + 4 + 8. */
	if (g->n_kv > TL_GGUF_MAX_KV || g->n_kv > remaining(&c) / 13)
		return tl_fail(err, -EBADMSG,
			       "gguf: metadata count %llu impossible for a %llu-byte file",
			       (unsigned long long)g->n_kv, (unsigned long long)g->size);
	if (g->n_tensors > TL_GGUF_MAX_TENSORS || g->n_tensors > remaining(&c) / 24)
		return tl_fail(err, -EBADMSG,
			       "gguf: tensor count %llu impossible for a %llu-byte file",
			       (unsigned long long)g->n_tensors, (unsigned long long)g->size);

	g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
	g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
	g->str_pool = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->str_pool));
	if (!g->kv || !g->tensors || !g->str_pool)
		return tl_fail(err, -ENOMEM, "gguf: out of memory");

	g->alignment = 32;
	for (uint64_t i = 0; i < g->n_kv; i++) {
		struct tl_gguf_kv *kv = &g->kv[i];
		uint32_t type;
		if ((r = rd_str(&c, &kv->key, TL_GGUF_MAX_KEY, "metadata key")) < 0)
			return r;
		if (kv->key.n == 0)
			return tl_fail(err, -EBADMSG, "gguf: metadata key %llu is empty",
				       (unsigned long long)i);
		for (uint64_t j = 0; j < i; j++)
			if (g->kv[j].key.n == kv->key.n &&
			    !memcmp(g->kv[j].key.p, kv->key.p, kv->key.n))
				return tl_fail(err, -EBADMSG, "gguf: duplicate metadata key '%.*s'",
					       (int)kv->key.n, kv->key.p);
		if ((r = rd_u32(&c, &type, "metadata type")) < 0)
			return r;
		if ((r = rd_value(g, &c, type, &kv->val)) < 0) {
			if (err) {
				size_t used = strnlen(err->msg, sizeof(err->msg) - 1);
				snprintf(err->msg + used, sizeof(err->msg) - used, " (key '%.*s')",
					 (int)(kv->key.n > 64 ? 64 : kv->key.n), kv->key.p);
			}
			return r;
		}
		if (tl_str_eq(kv->key, "general.alignment")) {
			if (kv->val.type != TL_GGUF_UINT32)
				return tl_fail(err, -EBADMSG,
					       "gguf: general.alignment is %s, not uint32",
					       tl_gguf_type_name(kv->val.type));
			uint64_t a = kv->val.u;
			if (a == 0 || (a & (a - 1)) || a > TL_GGUF_MAX_ALIGN)
				return tl_fail(
				    err, -EBADMSG,
				    "gguf: general.alignment %llu is not a power of two <= %u",
				    (unsigned long long)a, TL_GGUF_MAX_ALIGN);
			g->alignment = (uint32_t)a;
		}
	}

	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct tl_gguf_tensor *t = &g->tensors[i];
		if ((r = rd_str(&c, &t->name, 64 * 1024, "tensor name")) < 0)
			return r;
		if ((r = rd_u32(&c, &t->n_dims, "tensor dims")) < 0)
			return r;
		if (t->n_dims == 0 || t->n_dims > TL_GGUF_MAX_DIMS)
			return tl_fail(err, -EBADMSG,
				       "gguf: tensor '%.*s' has %u dims (1..%u allowed)",
				       (int)t->name.n, t->name.p, t->n_dims, TL_GGUF_MAX_DIMS);
		t->n_elems = 1;
		for (uint32_t d = 0; d < TL_GGUF_MAX_DIMS; d++) {
			t->ne[d] = 1;
			if (d >= t->n_dims)
				continue;
			if ((r = rd_u64(&c, &t->ne[d], "tensor shape")) < 0)
				return r;
			if (t->ne[d] == 0 || t->ne[d] > INT64_MAX ||
			    t->n_elems > UINT64_MAX / t->ne[d])
				return tl_fail(
				    err, -EBADMSG, "gguf: tensor '%.*s' dim %u = %llu invalid",
				    (int)t->name.n, t->name.p, d, (unsigned long long)t->ne[d]);
			t->n_elems *= t->ne[d];
		}
		if ((r = rd_u32(&c, &t->type, "tensor type")) < 0 ||
		    (r = rd_u64(&c, &t->offset, "tensor offset")) < 0)
			return r;
		for (uint64_t j = 0; j < i; j++)
			if (g->tensors[j].name.n == t->name.n &&
			    !memcmp(g->tensors[j].name.p, t->name.p, t->name.n))
				return tl_fail(err, -EBADMSG, "gguf: duplicate tensor '%.*s'",
					       (int)t->name.n, t->name.p);
	}

	/* The data section starts at the next multiple of the alignment. */
	uint64_t a = g->alignment;
	g->data_offset = (c.off + a - 1) / a * a;
	if (g->data_offset > g->size)
		return tl_fail(err, -EBADMSG,
			       "gguf: data section at %llu starts past end of file (%llu)",
			       (unsigned long long)g->data_offset, (unsigned long long)g->size);
	uint64_t data_size = g->size - g->data_offset;

	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct tl_gguf_tensor *t = &g->tensors[i];
		if (t->offset % a)
			return tl_fail(err, -EBADMSG,
				       "gguf: tensor '%.*s' offset %llu not aligned to %llu",
				       (int)t->name.n, t->name.p, (unsigned long long)t->offset,
				       (unsigned long long)a);
		const uint64_t be = tl_ggml_block_elems(t->type), bb = tl_ggml_block_bytes(t->type);
		if (!be) {
			/* Size unknown to this reader: only the start is checked. */
			if (t->offset > data_size)
				return tl_fail(
				    err, -EBADMSG,
				    "gguf: tensor '%.*s' offset %llu past end of data (%llu)",
				    (int)t->name.n, t->name.p, (unsigned long long)t->offset,
				    (unsigned long long)data_size);
			continue;
		}
		if (t->ne[0] % be)
			return tl_fail(
			    err, -EBADMSG,
			    "gguf: tensor '%.*s' rows of %llu are not whole blocks of %llu",
			    (int)t->name.n, t->name.p, (unsigned long long)t->ne[0],
			    (unsigned long long)be);
		if (t->n_elems / be > UINT64_MAX / bb)
			return tl_fail(err, -EBADMSG, "gguf: tensor '%.*s' size overflows",
				       (int)t->name.n, t->name.p);
		t->nbytes = t->n_elems / be * bb;
		if (t->offset > data_size || t->nbytes > data_size - t->offset)
			return tl_fail(
			    err, -EBADMSG,
			    "gguf: tensor '%.*s' [%llu, +%llu) runs past end of data (%llu "
			    "bytes)",
			    (int)t->name.n, t->name.p, (unsigned long long)t->offset,
			    (unsigned long long)t->nbytes, (unsigned long long)data_size);
		if ((g->data_offset + t->offset) % 4)
			return tl_fail(
			    err, -ENOTSUP,
			    "gguf: tensor '%.*s' data not 4-byte aligned (alignment %llu)",
			    (int)t->name.n, t->name.p, (unsigned long long)a);
		t->data = g->buf + g->data_offset + t->offset;
	}
	return 0;
}

int tl_gguf_open_mem(const void *buf, size_t len, struct tl_gguf **ret_g, struct tl_err *err)
{
	struct tl_gguf *g;
	int r;

	if (!buf && len)
		return tl_fail(err, -EINVAL, "gguf: NULL buffer");
	if (len > TL_GGUF_MAX_FILE)
		return tl_fail(err, -EFBIG, "gguf: file of %zu bytes over limit", len);
	g = calloc(1, sizeof(*g));
	if (!g)
		return tl_fail(err, -ENOMEM, "gguf: out of memory");
	/* 64-byte aligned copy: tensor data then sits where the file's alignment puts it. */
	g->buf = aligned_alloc(64, (len + 64) / 64 * 64);
	if (!g->buf) {
		free(g);
		return tl_fail(err, -ENOMEM, "gguf: out of memory for %zu bytes", len);
	}
	if (len)
		memcpy(g->buf, buf, len);
	g->size = len;
	r = parse(g, err);
	if (r < 0) {
		tl_gguf_free(g);
		return r;
	}
	*ret_g = g;
	return 0;
}

int tl_gguf_open(const char *path, struct tl_gguf **ret_g, struct tl_err *err)
{
	struct stat st;
	uint8_t *buf = NULL;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return tl_fail(err, -errno, "gguf: cannot open %s: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		r = tl_fail(err, -errno, "gguf: cannot stat %s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > TL_GGUF_MAX_FILE) {
		r = tl_fail(err, -EBADMSG, "gguf: %s is not a regular file of sane size", path);
		goto out;
	}
	buf = malloc(st.st_size ? st.st_size : 1);
	if (!buf) {
		r = tl_fail(err, -ENOMEM, "gguf: out of memory");
		goto out;
	}
	for (size_t got = 0; got < (size_t)st.st_size;) {
		ssize_t n = read(fd, buf + got, st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = tl_fail(err, n < 0 ? -errno : -EIO, "gguf: short read of %s", path);
			goto out;
		}
		got += n;
	}
	r = tl_gguf_open_mem(buf, st.st_size, ret_g, err);
out:
	free(buf);
	close(fd);
	return r;
}

const struct tl_gguf_kv *tl_gguf_find_kv(const struct tl_gguf *g, const char *key)
{
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (tl_str_eq(g->kv[i].key, key))
			return &g->kv[i];
	return NULL;
}

const struct tl_gguf_tensor *tl_gguf_find_tensor(const struct tl_gguf *g, const char *name)
{
	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (tl_str_eq(g->tensors[i].name, name))
			return &g->tensors[i];
	return NULL;
}

int tl_gguf_get_u32(const struct tl_gguf *g, const char *key, uint32_t *ret_v, struct tl_err *err)
{
	const struct tl_gguf_kv *kv = tl_gguf_find_kv(g, key);
	if (!kv)
		return tl_fail(err, -ENOENT, "gguf: metadata '%s' missing", key);
	switch (kv->val.type) {
	case TL_GGUF_UINT8:
	case TL_GGUF_UINT16:
	case TL_GGUF_UINT32:
	case TL_GGUF_UINT64:
		if (kv->val.u > UINT32_MAX)
			break;
		*ret_v = (uint32_t)kv->val.u;
		return 0;
	case TL_GGUF_INT8:
	case TL_GGUF_INT16:
	case TL_GGUF_INT32:
	case TL_GGUF_INT64:
		if (kv->val.i < 0 || kv->val.i > UINT32_MAX)
			break;
		*ret_v = (uint32_t)kv->val.i;
		return 0;
	default:
		return tl_fail(err, -EBADMSG, "gguf: metadata '%s' is %s, not an integer", key,
			       tl_gguf_type_name(kv->val.type));
	}
	return tl_fail(err, -EBADMSG, "gguf: metadata '%s' out of range", key);
}

int tl_gguf_get_f32(const struct tl_gguf *g, const char *key, float *ret_v, struct tl_err *err)
{
	const struct tl_gguf_kv *kv = tl_gguf_find_kv(g, key);
	if (!kv)
		return tl_fail(err, -ENOENT, "gguf: metadata '%s' missing", key);
	if (kv->val.type != TL_GGUF_FLOAT32 && kv->val.type != TL_GGUF_FLOAT64)
		return tl_fail(err, -EBADMSG, "gguf: metadata '%s' is %s, not a float", key,
			       tl_gguf_type_name(kv->val.type));
	*ret_v = (float)kv->val.f;
	return 0;
}
