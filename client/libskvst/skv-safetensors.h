/* SPDX-License-Identifier: MIT */
/*
 * skv-safetensors.h - read and write safetensors files (libskvst).
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte
 * little-endian header length N, N bytes of JSON, then the data area.
 * The JSON object maps tensor names to {"dtype", "shape", "data_offsets"}
 * (offsets relative to the data area, [begin, end)) and may hold
 * "__metadata__", a map of strings to strings.
 *
 * The reader parses the header with jansson and checks everything before
 * handing out a pointer: header length bounds, dtype (F32, F16, BF16, I32
 * only), rank, shape product overflow, offsets inside the data area, byte
 * count matching the shape, no two tensors overlapping, unknown keys. Data
 * stays in a read-only private mapping of the file.
 *
 * The writer is deterministic: the same tensors and metadata give the same
 * bytes (sorted JSON keys, data ordered by element size then name so every
 * tensor is aligned to its element size, header padded with spaces to a
 * multiple of 8). It writes a temporary file in the target's directory,
 * fsyncs and renames it over the target: a failure never leaves a partial
 * file behind.
 *
 * Every fallible call returns 0 or a negative errno and, when `err` is not
 * NULL, fills err->msg with one line naming the problem. Nothing here logs.
 */
#ifndef SKV_SAFETENSORS_H
#define SKV_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "skv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits the reader enforces (and the writer respects). */
#define SKV_ST_MAX_HEADER  (100u << 20) /* bytes of JSON header          */
#define SKV_ST_MAX_RANK	   8
#define SKV_ST_MAX_NAME	   1024 /* bytes in a tensor name or metadata key */
#define SKV_ST_MAX_TENSORS (1u << 20)

enum skv_st_dtype {
	SKV_ST_F32 = 0,
	SKV_ST_F16 = 1,
	SKV_ST_BF16 = 2,
	SKV_ST_I32 = 3,
	SKV_ST_F8_E4M3 = 4, /* fp8 K/V (SPEC.md "Quantized K/V"): e4m3fn */
	SKV_ST_F8_E5M2 = 5,
};

struct skv_st_error {
	char msg[256];
};

/*
 * One tensor. From the reader, every field is filled in and `data` points
 * into the file mapping (aligned to the element size when the file's header
 * length is a multiple of 8, as this writer makes it; check before casting).
 * For the writer, fill name, dtype, rank, shape and data; the rest is
 * computed.
 */
struct skv_st_tensor {
	const char *name;
	enum skv_st_dtype dtype;
	uint32_t rank;
	uint64_t shape[SKV_ST_MAX_RANK];
	uint64_t n_elems; /* product of shape (1 for rank 0)            */
	uint64_t n_bytes; /* n_elems * element size                      */
	uint64_t offset;  /* reader: begin of data_offsets in data area  */
	const void *data;
};

struct skv_st_meta {
	const char *key;
	const char *value;
};

/* "F32", "F16", "BF16", "I32", "F8_E4M3", "F8_E5M2"; NULL for an unknown value. */
const char *skv_st_dtype_name(enum skv_st_dtype dt);
/* Bytes per element; 0 for an unknown value. */
size_t skv_st_dtype_size(enum skv_st_dtype dt);
/* SKV_DTYPE_* for F32/F16/BF16/F8_E4M3/F8_E5M2; SKV_DTYPE_UNSPECIFIED otherwise. */
enum skv_dtype skv_st_to_skv_dtype(enum skv_st_dtype dt);

/* ---- reader ------------------------------------------------------------ */

struct skv_st_file;

/*
 * Map and validate the file at `path`. -ENOENT/-EACCES/... from open,
 * -EINVAL for a non-regular file, -EBADMSG for a malformed or lying file,
 * -ENOTSUP for a tensor dtype outside F32/F16/BF16/I32/F8_E4M3/F8_E5M2,
 * -ENOMEM.
 */
int skv_st_open(const char *path, struct skv_st_file **ret_file, struct skv_st_error *err);

/*
 * Validate `len` bytes at `buf` as a whole safetensors file, without
 * copying: the buffer must outlive the returned object. Same errors as
 * skv_st_open().
 */
int skv_st_open_buffer(const void *buf, size_t len, struct skv_st_file **ret_file,
		       struct skv_st_error *err);

/* Unmaps and frees; accepts NULL. */
void skv_st_close(struct skv_st_file *file);

/* Tensors, sorted by name (strcmp order). */
size_t skv_st_count(const struct skv_st_file *file);
const struct skv_st_tensor *skv_st_at(const struct skv_st_file *file, size_t i);
/* NULL when no tensor has that name. */
const struct skv_st_tensor *skv_st_find(const struct skv_st_file *file, const char *name);

/* "__metadata__" entries, sorted by key. */
size_t skv_st_meta_count(const struct skv_st_file *file);
const struct skv_st_meta *skv_st_meta_at(const struct skv_st_file *file, size_t i);
/* NULL when absent. */
const char *skv_st_meta_get(const struct skv_st_file *file, const char *key);

/* Size of the data area in bytes (file size - 8 - header length). */
uint64_t skv_st_data_size(const struct skv_st_file *file);

/* ---- writer ------------------------------------------------------------ */

/*
 * Write `n` tensors and `n_meta` metadata entries to `path` atomically
 * (temporary file in the same directory, fsync, rename). Names must be
 * unique, non-empty, not "__metadata__" and at most SKV_ST_MAX_NAME bytes;
 * metadata keys unique. Errors: -EINVAL (bad argument, message says which),
 * -EOVERFLOW, -ENOMEM, or the errno of a failed open/write/fsync/rename;
 * in every case no file at `path` was created or changed and no temporary
 * file is left.
 */
int skv_st_write(const char *path, const struct skv_st_tensor *tensors, size_t n,
		 const struct skv_st_meta *meta, size_t n_meta, struct skv_st_error *err);

/*
 * The same, serialised to memory: *ret_buf (malloc'd, caller frees) holds
 * the exact bytes skv_st_write() would write.
 */
int skv_st_serialize(const struct skv_st_tensor *tensors, size_t n, const struct skv_st_meta *meta,
		     size_t n_meta, void **ret_buf, size_t *ret_len, struct skv_st_error *err);

/* ---- compaction results (offline CLI and daemon share this) ------------- */

/*
 * What one compaction produced for one layer: k, v [h_store, kept,
 * head_dim] in `dtype`, positions [h_store, kept] ascending per head,
 * retained_mass [h_store] (NULL: written as NaN).
 *
 * Strides are in elements and 0 means contiguous, so a zero-initialised
 * struct describes packed buffers. A cache with decode headroom or an NHD
 * layout is described as it lies in memory; the file is the same bytes:
 *   k/v element (h, i, d) at  h * head_stride + i * token_stride + d
 *     (defaults: head_stride = kept * head_dim, token_stride = head_dim)
 *   positions of head h at  h * pos_stride  (default kept)
 */
struct skv_st_layer_result {
	const void *k;
	const void *v;
	const int32_t *positions;
	const float *retained_mass;
	int64_t head_stride;
	int64_t token_stride;
	uint32_t pos_stride;
	/* [h_store] rows head h holds (rows 0 .. kept[h]-1 at the strides
	 * above); NULL: desc.plan.kept for every head. Equal counts in a layer
	 * of a non-ragged mode are written [h_store, kept, D] */
	const uint32_t *kept;
};

/* Everything the OUT file's __metadata__ records; fill with
 * skv_st_compact_desc_init() so that every path records the same. */
struct skv_st_compact_desc {
	struct skv_params params; /* as given to skv_compact()              */
	struct skv_shape shape;	  /* as given to skv_compact() (n_q too)    */
	struct skv_plan plan;	  /* skv_plan(shape, params)                */
	enum skv_dtype dtype;	  /* of k/v in and out                      */
	uint32_t n_layers;
	struct skv_ledger ledger; /* skv_ledger_compute() with B = 1, g = 0,
				     reserve = 0, N = n_layers, C = capacity;
				     skv_st_compact_desc_budget(): summed */
	/* 0: k/v [h_store, kept, D]; else paged output with this many slots
	 * per block: k/v [ceil(kept / N), N, h_store, D], packed, rows past
	 * kept zero; metadata out_layout=paged, block_size=N. 0 from
	 * skv_st_compact_desc_init(). */
	uint32_t out_block_size;
	/* the budget's outcome (skv_st_compact_desc_budget); uniform: C, 0 */
	uint32_t c_star; /* mass: C*; uniform: C; other modes 0 (none) */
	int32_t fallback;
	/* fp8 K/V: [n_layers][K, V] scales, written as layers.N.k_scale and
	 * layers.N.v_scale F32 [1]; NULL (0 from skv_st_compact_desc_init())
	 * for other dtypes */
	const float *kv_scales;
};

/* Budget modes whose file layers are ragged: heads, mass-heads. */
static inline int skv_st_budget_ragged(enum skv_budget b)
{
	return b == SKV_BUDGET_HEADS || b == SKV_BUDGET_MASS_HEADS;
}

/*
 * Fill *ret_desc for a compaction of n_layers layers of `shape` with
 * `params` and K/V in `dtype`: runs skv_plan() and skv_ledger_compute().
 * -EINVAL (invalid combination, reason in err->msg) or -EOVERFLOW. Needs
 * libskv.
 */
int skv_st_compact_desc_init(struct skv_st_compact_desc *ret_desc, const struct skv_params *params,
			     const struct skv_shape *shape, enum skv_dtype dtype, uint32_t n_layers,
			     struct skv_error *err);

/*
 * Record a compaction's budget outcome in *desc: C*, fallback, and the
 * ledger summed over kept[n_layers * h_store] (SPEC.md). -EINVAL, -EOVERFLOW.
 */
int skv_st_compact_desc_budget(struct skv_st_compact_desc *desc, const uint32_t *kept,
			       uint32_t c_star, int fallback);

/*
 * Write the compact-cache file of a compaction: for each layer N tensors
 * layers.N.k, layers.N.v [h_store, kept, D] (dtype), layers.N.indices I32
 * [h_store, kept], layers.N.retained_mass F32 [h_store], and __metadata__
 * with format=snapkv-compact, version=1, the parameters (policy, window,
 * capacity, kernel, pooling, gqa, sinks, protected), the shape (L, layers,
 * h_q, h_kv, head_dim, dtype, n_q), the plan (h_store, kept, plan.sinks,
 * plan.w_obs, plan.w_keep, bypass) and the ledger (ledger.batch,
 * ledger.appended, ledger.native_full, ledger.compact, ledger.index,
 * ledger.reserved, ledger.ratio, ledger.ratio_exact), and the budget (budget,
 * budget.c_star ("none" when the mode picks no one C), budget.fallback,
 * budget.fallback_below, and the mode's parameters: budget.layers (list),
 * budget.pyramid_r, budget.floor, budget.tau, budget.c_min, budget.c_max,
 * budget.step). In a ragged mode (heads, mass-heads) layer N is instead
 * layers.N.k/.v [sum_h kept_h, D] head after head, layers.N.indices I32
 * [sum_h kept_h] (each head ascending), layers.N.kept I32 [h_store] and
 * layers.N.retained_mass F32 [h_store]. Byte-identical for
 * identical inputs, whichever path produced the results. Atomic as
 * skv_st_write().
 */
int skv_st_write_compact(const char *path, const struct skv_st_compact_desc *desc,
			 const struct skv_st_layer_result *layers, struct skv_st_error *err);

/* Lower-case option spellings used in metadata and by snapkvctl. */
const char *skv_st_policy_name(enum skv_policy p);
const char *skv_st_pooling_name(enum skv_pooling p);
const char *skv_st_gqa_name(enum skv_gqa g);

#ifdef __cplusplus
}
#endif
#endif /* SKV_SAFETENSORS_H */
