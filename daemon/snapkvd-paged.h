/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-paged.h - a COMPACT request's paged output (out_layout PAGED, the
 * engine's block format): the block size, the destination (arena runs or
 * writeback into the engine's writable buffer), the destination block
 * table, and every check of it, all before any work. The region layout
 * itself is snapkvd-cache.c's.
 */
#ifndef SNAPKVD_PAGED_H
#define SNAPKVD_PAGED_H

#include <stdbool.h>
#include <stddef.h>

#include "proto/snapkv.pb-c.h"
#include "skv.h"
#include "snapkvd-forward.h"

struct snapkvd_request_env;
struct snapkvd_cache_geom;

/* Tokens per output block, at most (libsnapkv's SKV_MAX_OUT_BLOCK_SIZE). */
#define SNAPKVD_MAX_OUT_BLOCK_SIZE 4096u

/*
 * The paged fields of req against the plan: for a dense layout none may be
 * set; for PAGED the block size, the budget mode (uniform or mass, one
 * count for every head; a fallback alike, with room for all L), and for
 * writeback the destination. Host and CUDA runners alike. 0, or -errno with
 * the reason in err. Owns every check of CompactRequest
 * fields 100-103.
 */
int snapkvd_paged_check(const struct snapkvd_request_env *env, struct snapkvd_job *j,
			const Snapkv__V1__CompactRequest *req, const struct skv_plan *plan,
			enum skv_dtype odt, char *err, size_t errlen);

/* The region of a PAGED cache of `slots` slots per head (j->cache built). */
int snapkvd_paged_geometry(const struct snapkvd_request_env *env, const struct snapkvd_job *j,
			   uint32_t h_store, uint32_t slots, uint32_t dtype_bytes,
			   struct snapkvd_cache_geom *ret);

/* Copy what the cache keeps of a checked paged request into j->cache. */
void snapkvd_paged_cache(struct snapkvd_job *j);

/* The kernels' output tensors of a placed PAGED cache (K/V at kv_base for
 * the arena; the engine's buffers for writeback). */
void snapkvd_paged_outputs(struct snapkvd_job *j, uint8_t *kv_base);

#endif
