/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-cache.h - one compact cache in a session's arena, and the one
 * place that knows how a cache region is laid out and how large it is.
 *
 * Per layer: K [h_store][slots][head_dim] (HND; NHD swaps heads and slots),
 * V the same, positions [h_store][slots] int32, each 64-byte aligned; the
 * whole region rounded to the arena's granularity.
 *
 * PAGED (the engine's block format): per layer a K run and a V run of
 * n_blocks = ceil(slots / block_size) blocks [block][block_size][h_store]
 * [head_dim], each run page-aligned and a page multiple (so an engine can
 * mmap it MAP_FIXED into its pool at a block boundary), every run first,
 * then the positions of every layer. Writeback: no runs (the K/V are in the
 * engine's buffers), the region holds the positions only.
 */
#ifndef SNAPKVD_CACHE_H
#define SNAPKVD_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "skv.h"

struct snapkvd_ledger_total;
struct snapkvd_tenant;
struct snapkvd_session;

/* How the cache's K/V are laid out (the wire's Layout is converted where a
 * request is read and where a CacheInfo is written). */
enum snapkvd_layout {
	SNAPKVD_LAYOUT_HND = 0, /* [head][slot][dim] */
	SNAPKVD_LAYOUT_NHD,	/* [slot][head][dim] */
	SNAPKVD_LAYOUT_PAGED,	/* [block][row][head][dim] per (layer, K/V) */
};

struct snapkvd_cache {
	uint64_t id;
	uint32_t layers, h_q, h_kv, h_store, head_dim, dtype_bytes;
	enum skv_dtype dtype;
	enum snapkvd_layout layout;
	enum skv_gqa gqa;
	enum skv_policy policy;
	uint32_t prompt_len, kept, slots, appended, budget;
	int64_t head_stride, token_stride;
	uint64_t region_off, region_bytes;
	/* the region held this session's released caches (not zero): what the
	 * compaction does not write is zeroed (snapkvd_cache_zero_unwritten) */
	bool region_dirty;
	uint64_t *k_off, *v_off, *pos_off; /* [layers] */
	float *mass;			   /* [layers * h_store] */
	float *kv_scale;		   /* fp8: [layers][K, V] the inputs' scales */
	bool evictable;
	/* released with linger: kept (and counted) until pressure evicts it;
	 * no longer visible to its engine */
	bool lingering;
	bool busy;		   /* a GROW is copying it: APPEND/GROW/RELEASE wait (-EBUSY) */
	uint64_t last_use_ns;	   /* CLOCK_MONOTONIC: eviction is LRU */
	uint32_t requested_budget; /* C asked for; budget is after pressure scaling */
	int pressure_level;	   /* snapkvd_pressure_level at admission */
	char transport[48];	   /* of its inputs: "memfd", "cuda-vmm-fd+cuda-ipc", ... */
	bool gpu_kv;		   /* K/V in the session's GPU arena (positions stay on host) */
	unsigned gpu;		   /* --backend cuda: the device its compaction ran on (index) */
	int device_ordinal;	   /* and its CUDA ordinal (-1: host backend), for the ledger */
	/* PAGED: slots per block, blocks per (layer, K/V) (arena: the run's;
	 * writeback: the destination table's), elements between blocks, bytes of
	 * each arena run. writeback: K/V in the engine's buffer (k_off/v_off are
	 * offsets there), the region holds the index tables only, engine_bytes
	 * of K/V are engine-held */
	uint32_t block_size, n_blocks;
	int64_t block_stride;
	uint64_t run_bytes;
	bool writeback;
	uint64_t out_buffer_id;
	/* writeback: the first in_place_blocks of its n_blocks are the input's
	 * blocks in place (never written by the daemon); wb_table the n_blocks
	 * entries (SKV_BLOCK_IN_PLACE for those), wb_pools the buffer ids of
	 * each layer's K and V pool [2 * layers] (a GROW's new blocks are
	 * checked against them); max_decode the declared most appended tokens
	 * (0: none), see snapkvd_cache_decode_limit() */
	uint32_t in_place_blocks;
	int32_t *wb_table;
	uint64_t *wb_pools;
	uint32_t max_decode;
	/* Budget modes (SPEC.md "Budgets beyond one C"). budgeted: the request
	 * named a mode other than uniform or a fallback; then hkept holds the
	 * rows each (layer, head) kept, [layers * h_store], c_star the mass
	 * mode's C* (uniform: C; else 0), fallback whether the full prompt was
	 * kept and mass_choice the choice's smallest mass. ragged (layers,
	 * heads, mass-heads without a fallback, HND only): per layer one block
	 * of sum_h cap_h rows, head h at rows hstart[l * h_store + h], cap_h =
	 * hkept + slots - kept (kept: the largest hkept); head_stride 0.
	 * Otherwise every head keeps `kept` in the layout above. */
	bool budgeted, ragged, fallback;
	enum skv_budget budget_mode;
	uint32_t c_star;
	float mass_choice;
	uint32_t *hkept;
	uint64_t *hstart;
	/* decided in a decision group of group_size members ("" / 0: none),
	 * after waiting group_wait_ns for the others */
	char group_key[65];
	uint32_t group_size;
	uint64_t group_wait_ns;
	/* per layer (snapkvd_cache_summarise): retained mass min over heads
	 * ([0, layers)) then mean ([layers, 2 layers)), NaN heads skipped;
	 * rows kept summed over heads */
	float *layer_mass;
	uint64_t *layer_kept;
	struct snapkvd_cache *next;
	/* the loop's running sums (snapkvd-tally.h): this cache's share of
	 * them, its tenant, and while it lingers its place in the LRU of
	 * eviction candidates (its session, the bytes it was counted with) */
	struct snapkvd_ledger_total *tallied;
	const struct snapkvd_tenant *tally_tenant;
	struct snapkvd_cache *lru_prev, *lru_next;
	struct snapkvd_session *tally_session;
	uint64_t lru_bytes;
	bool in_lru;
};

/* The byte sizes of a region: per layer K (= V) and positions, and the whole. */
struct snapkvd_cache_geom {
	uint64_t kv_bytes, pos_bytes, region;
	/* PAGED: every layer's K/V runs first (kv_bytes: one run, a page
	 * multiple; 0 for writeback), then the positions; n_blocks per run */
	bool kv_first;
	uint32_t n_blocks;
};

/*
 * Sizes of a region of `layers` x h_store x slots x head_dim elements of
 * dtype_bytes. 0, or -E2BIG when any product overflows or the region is
 * larger than max_region (the arena's size).
 */
int snapkvd_cache_geometry(uint32_t layers, uint32_t h_store, uint32_t slots, uint32_t head_dim,
			   uint32_t dtype_bytes, uint64_t max_region,
			   struct snapkvd_cache_geom *ret);

/*
 * Sizes of a PAGED region (see the top of this file): runs of
 * ceil(slots / block_size) blocks of block_size x h_store x head_dim
 * elements, or none for writeback. 0, or -E2BIG as above.
 */
int snapkvd_cache_geometry_paged(uint32_t layers, uint32_t h_store, uint32_t slots,
				 uint32_t head_dim, uint32_t dtype_bytes, uint32_t block_size,
				 bool writeback, uint64_t max_region,
				 struct snapkvd_cache_geom *ret);

/*
 * Where layer l of a region at `off` keeps its K, V and positions. Host
 * arena: K, V and positions of each layer in turn. GPU arena (whose offsets
 * are the host arena's): the K/V of every layer first, then the positions
 * of every layer in the host arena, so that a job page-locks only that tail
 * and the host pages under the K/V are never touched.
 */
void snapkvd_region_layer(uint64_t off, uint32_t layers, uint32_t l,
			  const struct snapkvd_cache_geom *g, bool gpu_kv, uint64_t *ret_k,
			  uint64_t *ret_v, uint64_t *ret_pos);

/* GROW: the old and the new place of a cache's rows. gpu: the K/V are in
 * the session's GPU arena at kv_base (copied device to device on the
 * worker's stream), the positions in the host arena. */
struct snapkvd_grow {
	struct snapkvd_cache_geom geom; /* of the new region */
	uint64_t off;			/* of the new region */
	uint32_t slots, old_slots, used, layers, h_store, row;
	bool hnd, gpu;
	bool paged;	  /* PAGED: each old run is copied whole to the new run */
	uint64_t old_run; /* PAGED: bytes of an old run */
	bool dirty;	  /* the new region is not zero: zero what is not copied */
	uint8_t *kv_base;
	uint64_t *old_k, *old_v, *old_pos; /* [layers] */
	/* ragged: the heads' kept rows (the job's copy, [layers * h_store]),
	 * g appended rows each, decode reserve old_res then res */
	const uint32_t *hkept;
	uint32_t appended, old_res, res;
};

struct skv_cuda_copy;
/* GROW in the host arena at host_base: copy the filled slots of every
 * (layer, head), then the positions. */
void snapkvd_grow_host(const struct snapkvd_grow *g, uint8_t *host_base);
/* GROW: the positions of every (layer, head) into the new region (host
 * arena; a ragged cache's at each head's new start), decode slots -1. */
void snapkvd_grow_positions(const struct snapkvd_grow *g, uint8_t *host_base);
/* GROW: how many copies snapkvd_grow_copies() gives per layer at most. */
static inline uint32_t snapkvd_grow_n_copies(const struct snapkvd_grow *g)
{
	return g->hkept ? 2 * g->h_store : 2;
}
/* GROW: the filled K/V rows of layer l, old region to new, addresses
 * relative to base, into ret (snapkvd_grow_n_copies() of room): one 2-D
 * copy per tensor, K then V, or for a ragged cache one per (head, tensor),
 * each head's kept and appended rows to its new start. The count. */
uint32_t snapkvd_grow_copies(const struct snapkvd_grow *g, uint32_t l, uint8_t *base,
			     struct skv_cuda_copy *ret);

/*
 * c was compacted into a dirty region (at host_base; geometry g): zero every
 * byte of it that the compaction did not write - the K/V rows past kept of
 * every head (decode headroom), padding, the region's tail - so it reads as
 * a cache in fresh pages does. K/V in the GPU arena or in the engine's
 * buffer (writeback) are not in the region and are left alone (ragged or
 * not).
 */
void snapkvd_cache_zero_unwritten(const struct snapkvd_cache *c, const struct snapkvd_cache_geom *g,
				  uint8_t *host_base);

/* A cache of `layers` layers, h_store heads: offset and mass arrays
 * allocated, everything else zero. 0 or -ENOMEM. */
int snapkvd_cache_new(uint32_t layers, uint32_t h_store, struct snapkvd_cache **ret);
void snapkvd_cache_free(struct snapkvd_cache *c);
/* For _cleanup_(snapkvd_cache_freep): a cache being built. */
void snapkvd_cache_freep(struct snapkvd_cache **c);

/* Fill layer_mass and layer_kept from mass and the kept counts. */
void snapkvd_cache_summarise(struct snapkvd_cache *c);

/*
 * The most tokens c may have appended (g): its decode slots (slots - kept),
 * or for a writeback cache the declared max_decode when larger. The ledger
 * counts the cache at kept + this many slots per head; a writeback cache's
 * decode slots past `slots` have no position rows (slot kept + i holds
 * position L + i).
 */
static inline uint32_t snapkvd_cache_decode_limit(const struct snapkvd_cache *c)
{
	uint32_t r = c->slots - c->kept;

	return c->writeback && c->max_decode > r ? c->max_decode : r;
}

/* Rows (layer l, head h) kept: hkept for a budgeted cache, else kept. */
uint32_t snapkvd_cache_head_kept(const struct snapkvd_cache *c, uint32_t l, uint32_t h);

/* The per-head arrays of a budgeted cache (hkept, hstart). 0 or -ENOMEM. */
int snapkvd_cache_budget_arrays(struct snapkvd_cache *c);

/*
 * After a budget-mode compaction into c's region: the kernels wrote head h
 * of layer l at rows h * c->slots with c->hkept rows each; settle packs the
 * heads (at kept + reserve slots each, or ragged, see above), fills the
 * decode slots' positions with -1 and sets kept, slots, strides and
 * hstart; a PAGED cache (uniform or mass, every head alike: its rows are in
 * place) gets the blocks it uses, n_blocks and run_bytes. The region and
 * the layers' offsets stay. Positions at host_base.
 * K/V at kv_base: moves NULL, their rows are moved here (HND); else (K/V
 * in the GPU arena) they are not touched, and each row block's move is
 * written to moves instead (room for 2 * layers * h_store): K and V of
 * each head in ascending order, to be run in that order by a copy that
 * allows its source and destination to overlap (a head moves down its
 * layer; no move writes where a later one reads). Returns the count of
 * moves (0 without moves, or for NHD, whose rows stay).
 */
uint32_t snapkvd_cache_settle(struct snapkvd_cache *c, uint8_t *kv_base, uint8_t *host_base,
			      struct skv_cuda_copy *moves);

/*
 * A budgeted cache packed at fewer slots than its region was sized for (a
 * mass C* below C_max): its layers move down to the layout of its settled
 * slot count, *g becomes that layout (g->region smaller) and the region's
 * tail [g->region, region_bytes) holds nothing of it; the loop thread gives
 * the tail back (region_bytes is its to change). Host-arena K/V, HND or NHD,
 * not ragged, not paged; otherwise nothing. Whether it shrank (worker).
 */
bool snapkvd_cache_shrink(struct snapkvd_cache *c, uint8_t *host_base,
			  struct snapkvd_cache_geom *g);
/*
 * A budget mode's outcome res (its kept array is c->hkept) into c: C*,
 * fallback, the choice's smallest mass, whether heads are stored ragged;
 * then settle (see there for kv_base, host_base and moves; the count of
 * moves is returned). Either backend's runner, once its kernels are done.
 */
uint32_t snapkvd_cache_budget_done(struct snapkvd_cache *c, const struct skv_budget_result *res,
				   uint8_t *kv_base, uint8_t *host_base,
				   struct skv_cuda_copy *moves);

/* Index of slot i of (layer l, head h) in layer l's positions: h * slots
 * + i, or hstart + i for a ragged cache (whose K/V rows are the same). */
uint64_t snapkvd_cache_pos_index(const struct snapkvd_cache *c, uint32_t l, uint32_t h, uint32_t i);

/* Put c (layout, h_store, head_dim, layers set) at `off` with `slots`
 * slots: region, strides and every layer's offsets (and a ragged cache's
 * head starts for its decode reserve slots - kept). */
void snapkvd_cache_place(struct snapkvd_cache *c, uint64_t off, uint32_t slots,
			 const struct snapkvd_cache_geom *g);

#endif
