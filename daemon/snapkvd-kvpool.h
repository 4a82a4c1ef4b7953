/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-kvpool.h - a session's registered KV pools (MSG_TYPE_POOL): an
 * engine's paged K and V pools of every layer, described and validated once,
 * then named by id in COMPACT requests (CompactRequest.pool_id,
 * out_pool_id), and block tables read from registered buffers
 * (CompactRequest.block_table_ref, out_block_table_ref).
 *
 * Owns: the pools of one session (ids, the limit max_session_pools, how
 * many jobs use each), their validation at registration, and the view of a
 * request that names a pool or a table in a buffer: an ordinary
 * CompactRequest whose layers and tables are filled in from the pool and
 * from private copies of the tables, so validation (snapkvd-request.c)
 * judges it exactly as an inline request. Loop thread only.
 */
#ifndef SNAPKVD_KVPOOL_H
#define SNAPKVD_KVPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/snapkv.pb-c.h"
#include "snapkvd-forward.h"

struct snapkvd_kvpool {
	uint64_t id;
	uint32_t layers, h_kv, head_dim, block_size;
	uint64_t n_blocks;
	int dtype; /* Snapkv__V1__DType */
	/* K and V of each layer as a request would name them: tr[2l], tr[2l+1] */
	Snapkv__V1__TensorRef *tr;
	Snapkv__V1__OutLayerRef *ol, **olp; /* [layers], for out_pool_id */
	unsigned busy;			    /* jobs that name it (snapkvd-job.c drops theirs) */
	struct snapkvd_kvpool *next;
};

struct snapkvd_kvpools {
	struct snapkvd_kvpool *list;
	unsigned n;
};

/* What registering or using a pool reads of the daemon. */
struct snapkvd_kvpool_limits {
	unsigned max_session_pools, max_layers, max_heads, max_head_dim;
	uint64_t max_block_table; /* entries of one table, inline or in a buffer */
};

/*
 * Register the pool m describes (every buffer one of `buffers`, each
 * layer's K and V of the pool's dtype and block size, blocks 0 ..
 * n_blocks - 1 inside their buffers). 0 with *ret_id, or -errno with the
 * reason in err (-EMFILE past max_session_pools, named).
 */
int snapkvd_kvpools_add(struct snapkvd_kvpools *set, const struct snapkvd_kvpool_limits *lim,
			struct snapkvd_buffer *buffers, const Snapkv__V1__PoolRequest *m,
			uint64_t *ret_id, char *err, size_t errlen);
/* Unregister pool id: -ENOENT (not this session's), -EBUSY (a request in
 * flight names it; nothing changes). */
int snapkvd_kvpools_remove(struct snapkvd_kvpools *set, uint64_t id, const char **why);
/* Free every pool (the session ends: its jobs are done). */
void snapkvd_kvpools_clear(struct snapkvd_kvpools *set);
struct snapkvd_kvpool *snapkvd_kvpools_find(const struct snapkvd_kvpools *set, uint64_t id);

/* A request with its pools and tables filled in; see snapkvd_kvpool_view. */
struct snapkvd_kvpool_view {
	Snapkv__V1__CompactRequest req;
	Snapkv__V1__LayerRef *lr, **lrp;
	Snapkv__V1__TensorRef *q;
	int32_t *table, *out_table;
	struct snapkvd_kvpool *pool, *out_pool; /* named by the request, or NULL */
};

/*
 * req as an ordinary CompactRequest in v->req: pool_id's K/V for every
 * layer with the window's queries (q_window and q_layer_stride, or q-only
 * LayerRefs), out_pool_id's pools as out_layer, and each table given by
 * reference copied out of its buffer (the engine may change the buffer:
 * only the copy is judged and used). Both tables, inline or not, at most
 * lim->max_block_table entries. v->req points into v and req: use it
 * before freeing either. 0, or -errno with the reason in err (v is then
 * freed).
 */
int snapkvd_kvpool_view(const struct snapkvd_kvpools *set, const struct snapkvd_kvpool_limits *lim,
			struct snapkvd_buffer *buffers, const Snapkv__V1__CompactRequest *req,
			struct snapkvd_kvpool_view *v, char *err, size_t errlen);
void snapkvd_kvpool_view_free(struct snapkvd_kvpool_view *v);

#endif
