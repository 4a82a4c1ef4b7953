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

/*
 * GROW of a writeback cache c to `slots` slots per head: the engine's new
 * blocks (GrowRequest.out_block_table, n entries) must be exactly those the
 * grown capacity needs past c's n_blocks, each inside every layer's K and V
 * pool (buffers still registered) and meeting none of c's blocks nor each
 * other. *ret_table: c's table with them appended (n_blocks + n entries).
 * Any other cache: n must be 0 (*ret_table NULL). 0, or -errno with the
 * reason in err; nothing of c changed.
 */
int snapkvd_paged_grow_blocks(const struct snapkvd_request_env *env, const struct snapkvd_cache *c,
			      uint32_t slots, const int32_t *tab, size_t n, int32_t **ret_table,
			      char *err, size_t errlen);

/* A writeback cache's GROW job j done (c placed at its new slots): c takes
 * the grown table from j, and its slots from old_slots up to kept + g get
 * their positions L + i (appended past the old rows under max_decode). */
void snapkvd_paged_grow_done(struct snapkvd_cache *c, struct snapkvd_job *j, uint8_t *host_base,
			     uint32_t old_slots);

/* Copy what the cache keeps of a checked paged request into j->cache. */
void snapkvd_paged_cache(struct snapkvd_job *j);

/* The kernels' output tensors of a placed PAGED cache (K/V at kv_base for
 * the arena; the engine's buffers for writeback). */
void snapkvd_paged_outputs(struct snapkvd_job *j, uint8_t *kv_base);

#endif
