/* SPDX-License-Identifier: MIT */
/*
 * tl-gguf.h - a bounds-checked reader for GGUF v3 files (llama.cpp's model
 * format): metadata key/values of every GGUF type, arrays included, and the
 * tensor directory. Tensor data is handed out for F32, F16, Q4_0, Q4_1 and
 * Q8_0 (the types llama.cpp's small models ship in); tl-quant.h turns the
 * others into F32.
 *
 * The whole file is held in memory; every string, array and tensor returned
 * points into it and lives as long as the struct tl_gguf. Every offset,
 * count, string length and tensor extent is checked against the file size,
 * with overflow checks, before it is used: a malformed file gives -EBADMSG
 * (or -ENOTSUP for a well-formed file this reader does not handle) and a
 * readable reason, never an out-of-bounds read.
 */
#ifndef TL_GGUF_H
#define TL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TL_GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */

/* Limits: far above any real model, low enough that a lying count fails fast. */
#define TL_GGUF_MAX_KV	    65536u
#define TL_GGUF_MAX_TENSORS 65536u
#define TL_GGUF_MAX_KEY	    65535u
#define TL_GGUF_MAX_DIMS    4u
#define TL_GGUF_MAX_DEPTH   4u /* nesting of arrays of arrays */
#define TL_GGUF_MAX_ALIGN   65536u
#define TL_GGUF_MAX_FILE    (1ull << 34)

enum tl_gguf_type {
	TL_GGUF_UINT8 = 0,
	TL_GGUF_INT8 = 1,
	TL_GGUF_UINT16 = 2,
	TL_GGUF_INT16 = 3,
	TL_GGUF_UINT32 = 4,
	TL_GGUF_INT32 = 5,
	TL_GGUF_FLOAT32 = 6,
	TL_GGUF_BOOL = 7,
	TL_GGUF_STRING = 8,
	TL_GGUF_ARRAY = 9,
	TL_GGUF_UINT64 = 10,
	TL_GGUF_INT64 = 11,
	TL_GGUF_FLOAT64 = 12,
	TL_GGUF_TYPE_COUNT
};

/* A string inside the file: not NUL-terminated. */
struct tl_str {
	const char *p;
	uint64_t n;
};

struct tl_gguf_value {
	enum tl_gguf_type type;
	union {
		uint64_t u; /* UINT8..UINT64, BOOL */
		int64_t i;  /* INT8..INT64         */
		double f;   /* FLOAT32, FLOAT64    */
		struct tl_str s;
		struct {
			enum tl_gguf_type type; /* element type */
			uint64_t n;
			const uint8_t *data; /* first element in the file */
			uint64_t nbytes;
			/* For arrays of strings: n entries, else NULL. */
			const struct tl_str *strs;
		} arr;
	};
};

struct tl_gguf_kv {
	struct tl_str key;
	struct tl_gguf_value val;
};

enum {
	TL_GGML_F32 = 0,
	TL_GGML_F16 = 1,
	TL_GGML_Q4_0 = 2,
	TL_GGML_Q4_1 = 3,
	TL_GGML_Q8_0 = 8,
};

/*
 * Elements per block and bytes per block of a ggml type this reader sizes
 * (a row's ne[0] must be a whole number of blocks); 0 for any other type.
 */
uint32_t tl_ggml_block_elems(uint32_t type);
uint32_t tl_ggml_block_bytes(uint32_t type);

struct tl_gguf_tensor {
	struct tl_str name;
	uint32_t n_dims;
	uint64_t ne[TL_GGUF_MAX_DIMS]; /* ne[0] is the contiguous axis; unused = 1 */
	uint32_t type;		       /* ggml type; data only for the TL_GGML_* above */
	uint64_t offset;	       /* from the start of the data section */
	uint64_t n_elems;
	uint64_t nbytes;
	const void *data; /* NULL unless tl_ggml_block_elems(type) != 0 */
};

struct tl_gguf {
	uint8_t *buf; /* the whole file */
	uint64_t size;
	uint32_t version;
	uint32_t alignment;
	uint64_t data_offset;
	uint64_t n_kv;
	struct tl_gguf_kv *kv;
	uint64_t n_tensors;
	struct tl_gguf_tensor *tensors;
	struct tl_str **str_pool; /* backing store of every string array index */
	uint64_t n_str_pool;
};

/* Why a call failed, for a human. */
struct tl_err {
	char msg[256];
};

/*
 * Parse a GGUF image. open_mem copies buf; open reads path. 0, -EBADMSG
 * (malformed), -ENOTSUP (version != 3, unsupported alignment), -ENOMEM, or
 * the -errno of open/read. *ret untouched on failure.
 */
/* Writes the message into err (when not NULL) and returns code. */
int tl_fail(struct tl_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

int tl_gguf_open_mem(const void *buf, size_t len, struct tl_gguf **ret_g, struct tl_err *err);
int tl_gguf_open(const char *path, struct tl_gguf **ret_g, struct tl_err *err);
void tl_gguf_free(struct tl_gguf *g);

/* NULL when absent. */
const struct tl_gguf_kv *tl_gguf_find_kv(const struct tl_gguf *g, const char *key);
const struct tl_gguf_tensor *tl_gguf_find_tensor(const struct tl_gguf *g, const char *name);

/* Typed lookups: -ENOENT when absent, -EBADMSG when of another type or out of range. */
int tl_gguf_get_u32(const struct tl_gguf *g, const char *key, uint32_t *ret_v, struct tl_err *err);
int tl_gguf_get_f32(const struct tl_gguf *g, const char *key, float *ret_v, struct tl_err *err);

bool tl_str_eq(struct tl_str s, const char *c);
const char *tl_gguf_type_name(enum tl_gguf_type t);

#endif /* TL_GGUF_H */
