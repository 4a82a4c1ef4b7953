// SPDX-License-Identifier: MIT
/*
 * skv-safetensors.c - safetensors reader and atomic, deterministic writer.
 * See skv-safetensors.h for the format and the guarantees.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "skv-safetensors.h"
#include "proto/skv-err.h"
#include "skv-st-internal.h"

#define META_KEY "__metadata__"

struct skv_st_file {
	void *map; /* NULL when the caller owns the bytes */
	size_t map_len;
	const uint8_t *data;
	uint64_t data_size;
	json_t *root; /* owns the name and metadata strings */
	struct skv_st_tensor *tensors;
	size_t n;
	struct skv_st_meta *meta;
	size_t n_meta;
};

static const struct {
	const char *name;
	size_t size;
	enum skv_dtype skv;
} dtypes[] = {
    [SKV_ST_F32] = {"F32", 4, SKV_DTYPE_F32},
    [SKV_ST_F16] = {"F16", 2, SKV_DTYPE_F16},
    [SKV_ST_BF16] = {"BF16", 2, SKV_DTYPE_BF16},
    [SKV_ST_I32] = {"I32", 4, SKV_DTYPE_UNSPECIFIED},
    [SKV_ST_F8_E4M3] = {"F8_E4M3", 1, SKV_DTYPE_F8E4M3FN},
    [SKV_ST_F8_E5M2] = {"F8_E5M2", 1, SKV_DTYPE_F8E5M2},
};

#define N_DTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

const char *skv_st_dtype_name(enum skv_st_dtype dt)
{
	return (unsigned)dt < N_DTYPES ? dtypes[dt].name : NULL;
}

size_t skv_st_dtype_size(enum skv_st_dtype dt)
{
	return (unsigned)dt < N_DTYPES ? dtypes[dt].size : 0;
}

enum skv_dtype skv_st_to_skv_dtype(enum skv_st_dtype dt)
{
	return (unsigned)dt < N_DTYPES ? dtypes[dt].skv : SKV_DTYPE_UNSPECIFIED;
}

static int dtype_parse(const char *s, enum skv_st_dtype *ret)
{
	for (unsigned i = 0; i < N_DTYPES; i++)
		if (strcmp(s, dtypes[i].name) == 0) {
			*ret = (enum skv_st_dtype)i;
			return 0;
		}
	return -ENOTSUP;
}

int skv_st__fail(struct skv_st_error *err, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	r = skv_vfail(err ? err->msg : NULL, sizeof(err->msg), r, fmt, ap);
	va_end(ap);
	return r;
}

/*
 * Names come from the file: make them safe to print on one line (no control
 * bytes, bounded length) before they go into a message.
 */
#define SAFE_LEN 72
static const char *safe(const char *s, char buf[SAFE_LEN])
{
	size_t i = 0;
	for (; s[i] && i < SAFE_LEN - 4; i++) {
		unsigned char c = (unsigned char)s[i];
		buf[i] = (c < 0x20 || c >= 0x7f) ? '?' : (char)c;
	}
	if (s[i]) {
		memcpy(buf + i, "...", 3);
		i += 3;
	}
	buf[i] = '\0';
	return buf;
}

static bool mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *ret)
{
	return __builtin_mul_overflow(a, b, ret);
}

/* ---- reader ------------------------------------------------------------ */

void skv_st_close(struct skv_st_file *f)
{
	if (!f)
		return;
	if (f->map)
		munmap(f->map, f->map_len);
	json_decref(f->root);
	free(f->tensors);
	free(f->meta);
	free(f);
}

/* A JSON integer that must be >= 0. */
static int get_uint(json_t *j, uint64_t *ret)
{
	if (!json_is_integer(j))
		return -EBADMSG;
	json_int_t v = json_integer_value(j);
	if (v < 0)
		return -ERANGE;
	*ret = (uint64_t)v;
	return 0;
}

static int parse_tensor(struct skv_st_file *f, const char *name, json_t *val,
			struct skv_st_tensor *t, struct skv_st_error *err)
{
	char sn[SAFE_LEN];
	json_t *jdt = NULL, *jshape = NULL, *joff = NULL;
	const char *key;
	json_t *v;
	int r;

	if (!json_is_object(val))
		return skv_st__fail(err, -EBADMSG, "%s: entry is not a JSON object",
				    safe(name, sn));
	json_object_foreach(val, key, v)
	{
		if (strcmp(key, "dtype") == 0)
			jdt = v;
		else if (strcmp(key, "shape") == 0)
			jshape = v;
		else if (strcmp(key, "data_offsets") == 0)
			joff = v;
		else {
			char sk[SAFE_LEN];
			return skv_st__fail(err, -EBADMSG, "%s: unknown key \"%s\"", safe(name, sn),
					    safe(key, sk));
		}
	}
	if (!jdt || !jshape || !joff)
		return skv_st__fail(err, -EBADMSG, "%s: missing \"%s\"", safe(name, sn),
				    !jdt      ? "dtype"
				    : !jshape ? "shape"
					      : "data_offsets");

	memset(t, 0, sizeof(*t));
	t->name = name;
	if (!json_is_string(jdt))
		return skv_st__fail(err, -EBADMSG, "%s: dtype is not a string", safe(name, sn));
	if (dtype_parse(json_string_value(jdt), &t->dtype) < 0) {
		char sd[SAFE_LEN];
		return skv_st__fail(err, -ENOTSUP,
				    "%s: unsupported dtype %s (supported: F32, F16, BF16, I32)",
				    safe(name, sn), safe(json_string_value(jdt), sd));
	}

	if (!json_is_array(jshape))
		return skv_st__fail(err, -EBADMSG, "%s: shape is not an array", safe(name, sn));
	size_t rank = json_array_size(jshape);
	if (rank > SKV_ST_MAX_RANK)
		return skv_st__fail(err, -EBADMSG, "%s: rank %zu exceeds the limit of %d",
				    safe(name, sn), rank, SKV_ST_MAX_RANK);
	t->rank = (uint32_t)rank;
	t->n_elems = 1;
	for (size_t i = 0; i < rank; i++) {
		r = get_uint(json_array_get(jshape, i), &t->shape[i]);
		if (r < 0)
			return skv_st__fail(err, -EBADMSG, "%s: shape[%zu] is %s", safe(name, sn),
					    i, r == -ERANGE ? "negative" : "not an integer");
		if (mul_overflow_u64(t->n_elems, t->shape[i], &t->n_elems))
			return skv_st__fail(err, -EBADMSG, "%s: shape product overflows",
					    safe(name, sn));
	}
	if (mul_overflow_u64(t->n_elems, skv_st_dtype_size(t->dtype), &t->n_bytes))
		return skv_st__fail(err, -EBADMSG, "%s: byte size overflows", safe(name, sn));

	if (!json_is_array(joff) || json_array_size(joff) != 2)
		return skv_st__fail(err, -EBADMSG,
				    "%s: data_offsets is not an array of two integers",
				    safe(name, sn));
	uint64_t b, e;
	if (get_uint(json_array_get(joff, 0), &b) < 0 || get_uint(json_array_get(joff, 1), &e) < 0)
		return skv_st__fail(err, -EBADMSG, "%s: data_offsets must be non-negative integers",
				    safe(name, sn));
	if (b > e)
		return skv_st__fail(err, -EBADMSG,
				    "%s: data_offsets [%" PRIu64 ", %" PRIu64 "] decrease",
				    safe(name, sn), b, e);
	if (e > f->data_size)
		return skv_st__fail(err, -EBADMSG,
				    "%s: data_offsets [%" PRIu64 ", %" PRIu64
				    "] past end of data (%" PRIu64 " bytes)",
				    safe(name, sn), b, e, f->data_size);
	if (e - b != t->n_bytes)
		return skv_st__fail(err, -EBADMSG,
				    "%s: data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
				    " bytes but shape and dtype need %" PRIu64,
				    safe(name, sn), b, e, e - b, t->n_bytes);
	t->offset = b;
	t->data = f->data + b;
	return 0;
}

static int parse_meta(struct skv_st_file *f, json_t *val, struct skv_st_error *err)
{
	const char *key;
	json_t *v;
	char sk[SAFE_LEN];

	if (!json_is_object(val))
		return skv_st__fail(err, -EBADMSG, "__metadata__ is not a JSON object");
	size_t n = json_object_size(val);
	if (n == 0)
		return 0;
	f->meta = calloc(n, sizeof(*f->meta));
	if (!f->meta)
		return skv_st__fail(err, -ENOMEM, "out of memory");
	json_object_foreach(val, key, v)
	{
		if (strlen(key) > SKV_ST_MAX_NAME)
			return skv_st__fail(err, -EBADMSG,
					    "__metadata__: key \"%s\" longer than %d bytes",
					    safe(key, sk), SKV_ST_MAX_NAME);
		if (!json_is_string(v))
			return skv_st__fail(err, -EBADMSG,
					    "__metadata__: value of \"%s\" is not a string",
					    safe(key, sk));
		f->meta[f->n_meta].key = key;
		f->meta[f->n_meta].value = json_string_value(v);
		f->n_meta++;
	}
	return 0;
}

static int cmp_offset(const void *a, const void *b)
{
	const struct skv_st_tensor *x = a, *y = b;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return x->n_bytes < y->n_bytes ? -1 : x->n_bytes > y->n_bytes;
}

static int cmp_name(const void *a, const void *b)
{
	const struct skv_st_tensor *x = a, *y = b;
	return strcmp(x->name, y->name);
}

static int cmp_meta(const void *a, const void *b)
{
	const struct skv_st_meta *x = a, *y = b;
	return strcmp(x->key, y->key);
}

static int parse(struct skv_st_file *f, const uint8_t *buf, size_t len, struct skv_st_error *err)
{
	uint64_t hlen = 0;
	json_error_t jerr;
	const char *key;
	json_t *val;
	char sn[SAFE_LEN];
	int r;

	if (len < 8)
		return skv_st__fail(err, -EBADMSG,
				    "file is %zu bytes, too short for the 8-byte header length",
				    len);
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | buf[i];
	if (hlen > SKV_ST_MAX_HEADER)
		return skv_st__fail(err, -EBADMSG,
				    "header length %" PRIu64 " exceeds the limit of %u bytes", hlen,
				    SKV_ST_MAX_HEADER);
	if (hlen > len - 8)
		return skv_st__fail(err, -EBADMSG,
				    "header length %" PRIu64
				    " past end of file (%zu bytes after it)",
				    hlen, len - 8);
	f->data = buf + 8 + hlen;
	f->data_size = len - 8 - hlen;

	f->root = json_loadb((const char *)buf + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!f->root)
		return skv_st__fail(err, -EBADMSG, "header is not valid JSON: %s (column %d)",
				    jerr.text, jerr.column);
	if (!json_is_object(f->root))
		return skv_st__fail(err, -EBADMSG, "header is not a JSON object");

	size_t n = json_object_size(f->root);
	if (n > SKV_ST_MAX_TENSORS)
		return skv_st__fail(err, -EBADMSG,
				    "header has %zu entries, more than the limit of %u", n,
				    SKV_ST_MAX_TENSORS);
	if (n) {
		f->tensors = calloc(n, sizeof(*f->tensors));
		if (!f->tensors)
			return skv_st__fail(err, -ENOMEM, "out of memory");
	}
	json_object_foreach(f->root, key, val)
	{
		if (strcmp(key, META_KEY) == 0) {
			r = parse_meta(f, val, err);
			if (r < 0)
				return r;
			continue;
		}
		if (key[0] == '\0')
			return skv_st__fail(err, -EBADMSG, "a tensor has an empty name");
		if (strlen(key) > SKV_ST_MAX_NAME)
			return skv_st__fail(err, -EBADMSG,
					    "tensor name \"%s\" longer than %d bytes",
					    safe(key, sn), SKV_ST_MAX_NAME);
		r = parse_tensor(f, key, val, &f->tensors[f->n], err);
		if (r < 0)
			return r;
		f->n++;
	}

	/* Two names must never alias the same bytes: a writer through one
	 * would silently change the other. Empty tensors own no bytes. */
	if (f->n > 1) {
		qsort(f->tensors, f->n, sizeof(*f->tensors), cmp_offset);
		const struct skv_st_tensor *prev = NULL;
		for (size_t i = 0; i < f->n; i++) {
			const struct skv_st_tensor *t = &f->tensors[i];
			if (t->n_bytes == 0)
				continue;
			if (prev && t->offset < prev->offset + prev->n_bytes) {
				char sp[SAFE_LEN];
				return skv_st__fail(err, -EBADMSG,
						    "%s: data_offsets [%" PRIu64 ", %" PRIu64
						    "] overlap %s [%" PRIu64 ", %" PRIu64 "]",
						    safe(t->name, sn), t->offset,
						    t->offset + t->n_bytes, safe(prev->name, sp),
						    prev->offset, prev->offset + prev->n_bytes);
			}
			prev = t;
		}
	}
	if (f->n > 1)
		qsort(f->tensors, f->n, sizeof(*f->tensors), cmp_name);
	if (f->n_meta > 1)
		qsort(f->meta, f->n_meta, sizeof(*f->meta), cmp_meta);
	return 0;
}

int skv_st_open_buffer(const void *buf, size_t len, struct skv_st_file **ret_file,
		       struct skv_st_error *err)
{
	struct skv_st_file *f;
	int r;

	if (!buf && len)
		return skv_st__fail(err, -EINVAL, "no buffer");
	f = calloc(1, sizeof(*f));
	if (!f)
		return skv_st__fail(err, -ENOMEM, "out of memory");
	r = parse(f, buf, len, err);
	if (r < 0) {
		skv_st_close(f);
		return r;
	}
	*ret_file = f;
	return 0;
}

int skv_st_open(const char *path, struct skv_st_file **ret_file, struct skv_st_error *err)
{
	struct skv_st_file *f = NULL;
	struct stat st;
	void *map = NULL;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return skv_st__fail(err, -errno, "cannot open: %s", strerror(errno));
	if (fstat(fd, &st) < 0) {
		r = skv_st__fail(err, -errno, "cannot stat: %s", strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = skv_st__fail(err, -EINVAL, "not a regular file");
		goto out;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		r = skv_st__fail(err, -EFBIG, "file too large to map");
		goto out;
	}
	/* mmap of 0 bytes fails; an empty file is reported by the parser. */
	if (st.st_size > 0) {
		map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			map = NULL;
			r = skv_st__fail(err, -errno, "cannot map: %s", strerror(errno));
			goto out;
		}
	}
	r = skv_st_open_buffer(map ? map : "", (size_t)st.st_size, &f, err);
	if (r < 0)
		goto out;
	f->map = map;
	f->map_len = (size_t)st.st_size;
	map = NULL;
	*ret_file = f;
	r = 0;
out:
	if (map)
		munmap(map, (size_t)st.st_size);
	close(fd);
	return r;
}

size_t skv_st_count(const struct skv_st_file *f)
{
	return f->n;
}

const struct skv_st_tensor *skv_st_at(const struct skv_st_file *f, size_t i)
{
	return i < f->n ? &f->tensors[i] : NULL;
}

const struct skv_st_tensor *skv_st_find(const struct skv_st_file *f, const char *name)
{
	struct skv_st_tensor key = {.name = name};
	if (!f->n)
		return NULL;
	return bsearch(&key, f->tensors, f->n, sizeof(key), cmp_name);
}

size_t skv_st_meta_count(const struct skv_st_file *f)
{
	return f->n_meta;
}

const struct skv_st_meta *skv_st_meta_at(const struct skv_st_file *f, size_t i)
{
	return i < f->n_meta ? &f->meta[i] : NULL;
}

const char *skv_st_meta_get(const struct skv_st_file *f, const char *key)
{
	struct skv_st_meta k = {.key = key};
	const struct skv_st_meta *m;
	if (!f->n_meta)
		return NULL;
	m = bsearch(&k, f->meta, f->n_meta, sizeof(k), cmp_meta);
	return m ? m->value : NULL;
}

uint64_t skv_st_data_size(const struct skv_st_file *f)
{
	return f->data_size;
}

/* ---- writer ------------------------------------------------------------ */

struct layout {
	char *header; /* JSON padded with spaces; header_len bytes   */
	size_t header_len;
	size_t *order; /* tensors in data order                      */
	uint64_t data_size;
};

static void layout_free(struct layout *l)
{
	free(l->header);
	free(l->order);
}

/* Largest elements first so that every tensor stays aligned to its element
 * size in a contiguous data area (the order the reference library uses). */
static int cmp_data_order(const void *a, const void *b, void *arg)
{
	const struct skv_st_tensor *base = arg;
	const struct skv_st_tensor *x = &base[*(const size_t *)a];
	const struct skv_st_tensor *y = &base[*(const size_t *)b];
	size_t sx = skv_st_dtype_size(x->dtype), sy = skv_st_dtype_size(y->dtype);
	if (sx != sy)
		return sx > sy ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int set_uint_array(json_t *obj, const char *key, const uint64_t *v, size_t n)
{
	json_t *a = json_array();
	if (!a)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		if (v[i] > INT64_MAX || json_array_append_new(a, json_integer((json_int_t)v[i]))) {
			json_decref(a);
			return v[i] > INT64_MAX ? -EOVERFLOW : -ENOMEM;
		}
	if (json_object_set_new(obj, key, a))
		return -ENOMEM;
	return 0;
}

/* Tensor i's name, dtype, rank and byte size (*ret_bytes) checked. */
static int check_tensor(const struct skv_st_tensor *t, size_t i, uint64_t *ret_bytes,
			struct skv_st_error *err)
{
	char sn[SAFE_LEN];
	uint64_t ne = 1;

	if (!t->name || !t->name[0] || strlen(t->name) > SKV_ST_MAX_NAME ||
	    strcmp(t->name, META_KEY) == 0)
		return skv_st__fail(err, -EINVAL, "tensor %zu: invalid name \"%s\"", i,
				    t->name ? safe(t->name, sn) : "(null)");
	if (!skv_st_dtype_size(t->dtype) || t->rank > SKV_ST_MAX_RANK)
		return skv_st__fail(err, -EINVAL, "%s: invalid dtype or rank", safe(t->name, sn));
	for (uint32_t d = 0; d < t->rank; d++)
		if (mul_overflow_u64(ne, t->shape[d], &ne))
			return skv_st__fail(err, -EOVERFLOW, "%s: shape product overflows",
					    safe(t->name, sn));
	if (mul_overflow_u64(ne, skv_st_dtype_size(t->dtype), ret_bytes))
		return skv_st__fail(err, -EOVERFLOW, "%s: byte size overflows", safe(t->name, sn));
	if (*ret_bytes && !t->data)
		return skv_st__fail(err, -EINVAL, "%s: no data", safe(t->name, sn));
	return 0;
}

/* Each tensor's header entry in data order (l->order), its offsets from
 * l->data_size on. */
static int header_tensors(json_t *root, const struct skv_st_tensor *ts, size_t n,
			  const uint64_t *nbytes, struct layout *l, struct skv_st_error *err)
{
	char sn[SAFE_LEN];
	int r;

	for (size_t k = 0; k < n; k++) {
		size_t i = l->order[k];
		const struct skv_st_tensor *t = &ts[i];
		uint64_t off[2] = {l->data_size, 0};
		json_t *jt = json_object();
		if (__builtin_add_overflow(l->data_size, nbytes[i], &off[1])) {
			json_decref(jt);
			return skv_st__fail(err, -EOVERFLOW, "data size overflows");
		}
		l->data_size = off[1];
		if (json_object_get(root, t->name)) {
			json_decref(jt);
			return skv_st__fail(err, -EINVAL, "%s: duplicate tensor name",
					    safe(t->name, sn));
		}
		if (!jt || json_object_set_new(root, t->name, jt))
			return skv_st__fail(err, jt ? -EINVAL : -ENOMEM,
					    "%s: name is not valid UTF-8", safe(t->name, sn));
		r = 0;
		if (json_object_set_new(jt, "dtype", json_string(skv_st_dtype_name(t->dtype))) ||
		    (r = set_uint_array(jt, "shape", t->shape, t->rank)) < 0 ||
		    (r = set_uint_array(jt, "data_offsets", off, 2)) < 0)
			return skv_st__fail(err, r == -EOVERFLOW ? r : -ENOMEM,
					    "%s: cannot encode header", safe(t->name, sn));
	}
	return 0;
}

/* The metadata object of the header (none when n_meta is 0). */
static int header_meta(json_t *root, const struct skv_st_meta *meta, size_t n_meta,
		       struct skv_st_error *err)
{
	char sn[SAFE_LEN];
	json_t *jm;

	if (!n_meta)
		return 0;
	jm = json_object();
	if (!jm || json_object_set_new(root, META_KEY, jm))
		return skv_st__fail(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n_meta; i++) {
		const char *k = meta[i].key, *v = meta[i].value;
		if (!k || !v || strlen(k) > SKV_ST_MAX_NAME)
			return skv_st__fail(err, -EINVAL,
					    "metadata entry %zu: invalid key or value", i);
		if (json_object_get(jm, k))
			return skv_st__fail(err, -EINVAL, "metadata: duplicate key \"%s\"",
					    safe(k, sn));
		json_t *js_v = json_string(v);
		if (!js_v || json_object_set_new(jm, k, js_v))
			return skv_st__fail(err, -EINVAL, "metadata \"%s\": not valid UTF-8",
					    safe(k, sn));
	}
	return 0;
}

/* The header's JSON, padded with spaces to a multiple of 8, into l. */
static int header_text(json_t *root, struct layout *l, struct skv_st_error *err)
{
	char *js = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	int r = 0;

	if (!js)
		return skv_st__fail(err, -ENOMEM, "out of memory");
	size_t jl = strlen(js);
	size_t padded = (jl + 7) & ~(size_t)7;
	if (padded > SKV_ST_MAX_HEADER) {
		r = skv_st__fail(err, -EOVERFLOW, "header of %zu bytes exceeds the limit of %u",
				 padded, SKV_ST_MAX_HEADER);
		goto out;
	}
	l->header = malloc(padded);
	if (!l->header) {
		r = skv_st__fail(err, -ENOMEM, "out of memory");
		goto out;
	}
	memcpy(l->header, js, jl);
	memset(l->header + jl, ' ', padded - jl);
	l->header_len = padded;
out:
	free(js);
	return r;
}

static int build_layout(const struct skv_st_tensor *ts, size_t n, const struct skv_st_meta *meta,
			size_t n_meta, struct layout *l, struct skv_st_error *err)
{
	json_t *root = NULL;
	uint64_t *nbytes = NULL;
	int r;

	memset(l, 0, sizeof(*l));
	if ((n && !ts) || (n_meta && !meta))
		return skv_st__fail(err, -EINVAL, "no tensors or metadata array");
	if (n > SKV_ST_MAX_TENSORS)
		return skv_st__fail(err, -EINVAL, "%zu tensors, more than the limit of %u", n,
				    SKV_ST_MAX_TENSORS);
	root = json_object();
	l->order = calloc(n ? n : 1, sizeof(*l->order));
	nbytes = calloc(n ? n : 1, sizeof(*nbytes));
	if (!root || !l->order || !nbytes) {
		r = skv_st__fail(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		r = check_tensor(&ts[i], i, &nbytes[i], err);
		if (r < 0)
			goto out;
		l->order[i] = i;
	}
	qsort_r(l->order, n, sizeof(*l->order), cmp_data_order, (void *)ts);
	r = header_tensors(root, ts, n, nbytes, l, err);
	if (r == 0)
		r = header_meta(root, meta, n_meta, err);
	if (r == 0)
		r = header_text(root, l, err);
out:
	free(nbytes);
	json_decref(root);
	if (r < 0)
		layout_free(l);
	return r;
}

static void put_le64(uint8_t out[8], uint64_t v)
{
	for (int i = 0; i < 8; i++)
		out[i] = (uint8_t)(v >> (8 * i));
}

int skv_st_serialize(const struct skv_st_tensor *ts, size_t n, const struct skv_st_meta *meta,
		     size_t n_meta, void **ret_buf, size_t *ret_len, struct skv_st_error *err)
{
	struct layout l;
	uint64_t total;
	uint8_t *buf, *p;
	int r;

	r = build_layout(ts, n, meta, n_meta, &l, err);
	if (r < 0)
		return r;
	total = 8 + (uint64_t)l.header_len + l.data_size;
	if (total > SIZE_MAX || !(buf = malloc(total))) {
		layout_free(&l);
		return skv_st__fail(err, -ENOMEM, "out of memory for %" PRIu64 " bytes", total);
	}
	put_le64(buf, l.header_len);
	memcpy(buf + 8, l.header, l.header_len);
	p = buf + 8 + l.header_len;
	for (size_t k = 0; k < n; k++) {
		const struct skv_st_tensor *t = &ts[l.order[k]];
		uint64_t nb = 0;
		/* Recomputed: validated without overflow in build_layout(). */
		nb = skv_st_dtype_size(t->dtype);
		for (uint32_t d = 0; d < t->rank; d++)
			nb *= t->shape[d];
		if (nb)
			memcpy(p, t->data, nb);
		p += nb;
	}
	layout_free(&l);
	*ret_buf = buf;
	*ret_len = total;
	return 0;
}

static int write_all(int fd, const void *buf, uint64_t len)
{
	const uint8_t *p = buf;
	while (len) {
		size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
		ssize_t w = write(fd, p, chunk);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		p += w;
		len -= (uint64_t)w;
	}
	return 0;
}

int skv_st_write(const char *path, const struct skv_st_tensor *ts, size_t n,
		 const struct skv_st_meta *meta, size_t n_meta, struct skv_st_error *err)
{
	struct layout l;
	char *tmp = NULL;
	const char *slash, *base;
	uint8_t len8[8];
	int fd = -1, r;

	if (!path || !path[0])
		return skv_st__fail(err, -EINVAL, "no output path");
	r = build_layout(ts, n, meta, n_meta, &l, err);
	if (r < 0)
		return r;

	/* Same directory as the target, so rename() is atomic; a dot name so
	 * globs do not pick it up half-written. */
	slash = strrchr(path, '/');
	base = slash ? slash + 1 : path;
	if (!base[0]) {
		r = skv_st__fail(err, -EISDIR, "output path ends in '/'");
		goto out;
	}
	if (asprintf(&tmp, "%.*s.%s.tmp-XXXXXX", slash ? (int)(slash - path + 1) : 0, path, base) <
	    0) {
		tmp = NULL;
		r = skv_st__fail(err, -ENOMEM, "out of memory");
		goto out;
	}
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		r = skv_st__fail(err, -errno,
				 "cannot create a temporary file next to the output: %s",
				 strerror(errno));
		free(tmp);
		tmp = NULL;
		goto out;
	}
	if (fchmod(fd, 0644) < 0) {
		r = skv_st__fail(err, -errno, "cannot set mode of temporary file: %s",
				 strerror(errno));
		goto out;
	}
	put_le64(len8, l.header_len);
	r = write_all(fd, len8, 8);
	if (r == 0)
		r = write_all(fd, l.header, l.header_len);
	for (size_t k = 0; k < n && r == 0; k++) {
		const struct skv_st_tensor *t = &ts[l.order[k]];
		uint64_t nb = skv_st_dtype_size(t->dtype);
		for (uint32_t d = 0; d < t->rank; d++)
			nb *= t->shape[d];
		if (nb)
			r = write_all(fd, t->data, nb);
	}
	if (r < 0) {
		skv_st__fail(err, r, "cannot write output: %s", strerror(-r));
		goto out;
	}
	if (fsync(fd) < 0) {
		r = skv_st__fail(err, -errno, "cannot sync output: %s", strerror(errno));
		goto out;
	}
	r = close(fd);
	fd = -1;
	if (r < 0) {
		r = skv_st__fail(err, -errno, "cannot close output: %s", strerror(errno));
		goto out;
	}
	if (rename(tmp, path) < 0) {
		r = skv_st__fail(err, -errno, "cannot rename output into place: %s",
				 strerror(errno));
		goto out;
	}
	free(tmp);
	tmp = NULL;

	/* Make the rename durable. The file is already in place whatever
	 * happens here, so a failure is not reported as one. */
	{
		char *dir = strndup(path, slash ? (size_t)(slash - path) : 0);
		if (dir) {
			int dfd = open(dir[0] ? dir : (slash ? "/" : "."),
				       O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (dfd >= 0) {
				(void)fsync(dfd);
				close(dfd);
			}
			free(dir);
		}
	}
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	if (tmp) {
		unlink(tmp);
		free(tmp);
	}
	layout_free(&l);
	return r;
}
