/* SPDX-License-Identifier: MIT */
/*
 * libsnapkv-internal.h - shared by the files of libsnapkv; not part of its
 * interface (snapkv.h is). The library in files by concern, each calling
 * only the ones listed after it:
 *
 *   libsnapkv-request.c  poll, wait and abandon a submitted compaction
 *   libsnapkv-compact.c  a description into a CompactRequest, submitted
 *   libsnapkv-client.c   connect, handshake, reconnect, close
 *   libsnapkv-buffer.c   engine buffers: allocate, register, free
 *   libsnapkv-cache.c    adopting a CacheInfo; APPEND, GROW, RELEASE
 *   libsnapkv-layout.c   where a cache's slots, blocks and counts are
 *   libsnapkv-desc.c     params and descriptions: ABI sizes, groups, waits
 *   libsnapkv-ring.c     the SQ/CQ: slots, submit, reap, wait
 *   libsnapkv-rpc.c      the client's error, deadlines, socket RPCs
 *
 * Every function here is hidden (-fvisibility=hidden); exported ones carry
 * SKV_EXPORT and are listed in libsnapkv.map.
 *
 * Ring requests carry a snapkv.v1.Request in the argument slot that belongs
 * to the SQ entry; the daemon answers in the same slot. Slot i is ours from
 * submit until its CQE has been reaped, so slots double as request tags.
 */
#ifndef LIBSNAPKV_INTERNAL_H
#define LIBSNAPKV_INTERNAL_H

#include "snapkv.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/skv-ring.h"
#include "proto/snapkv.pb-c.h"

#define SKV_EXPORT __attribute__((visibility("default")))

enum slot_state { SLOT_FREE = 0, SLOT_PENDING, SLOT_DONE };

struct slot {
	enum slot_state state;
	int res;
	uint64_t user_data;
	Snapkv__V1__Response *resp;
	bool orphan;	 /* its request handle is gone: free on completion */
	pthread_t owner; /* the thread that submitted it */
	bool release;	 /* an abandoned compaction: release its cache when it completes */
	uint32_t flags;	 /* its CQE's flags (SKV_CQE_F_CANCELLED, _WRITTEN) */
};

struct old_map {
	void *p;
	size_t len;
	struct old_map *next;
};

struct skv_client {
	pthread_mutex_t mu;
	char path[108];
	char name[64];
	uint32_t want_sq, spin_us;
	/* deadline of one call in ms, 0: none; atomic so that setting it never
	 * waits for a call in progress (__atomic builtins) */
	uint32_t timeout_ms;
	int fd;
	int dead; /* 0, or the -errno every call returns */
	uint64_t session_id;
	uint8_t *ring;
	size_t ring_bytes;
	struct skv_ring_layout layout;
	struct skv_ring_q sq, cq;
	int sq_efd, cq_efd, arena_fd;
	uint8_t *arena;
	size_t arena_bytes;
	struct slot *slots;
	uint32_t n_slots;
	uint32_t waiters; /* threads in skv__wait_slot: they may free slots */
	uint64_t seq;
	uint64_t generation;
	struct skv_buffer *buffers;
	struct old_map *old_maps;
	uint8_t *rbuf;
	char err[256];
	struct skv_pressure pressure; /* latest PRESSURE event */
	/* skv_compact_submit_many (SNAPKV_1.9): skv__submit leaves the
	 * doorbell to the caller, which rings it once if owed */
	bool defer_doorbell, doorbell_owed;
	struct skv_pool *pools; /* handles not yet unregistered */
};

struct skv_buffer {
	struct skv_client *c;
	int fd;
	void *data;
	size_t size;
	uint64_t id;
	bool own; /* allocated here: unmap on free */
	/* CUDA buffers (SNAPKV_1.2): the kind and what re-registration needs */
	int kind; /* Snapkv__V1__BufferKind */
	uint8_t ipc_handle[64];
	uint64_t offset;
	int device;
	char transport[16]; /* the daemon's answer */
	uint32_t flags;	    /* SKV_BUFFER_* asked for (SNAPKV_1.5) */
	struct skv_buffer *next;
};

/*
 * Where a writeback compaction's blocks are (SNAPKV_1.5), copied from the
 * description so the cache can name its slots: the mapping and size of the
 * buffer of each layer's K and V pool (NULL: not mapped by libsnapkv), and
 * the destination block table.
 */
struct skv_wb {
	uint32_t layers, n_table;
	uint8_t **data; /* [2 * layers]: K then V of each layer */
	uint64_t *size; /* [2 * layers] */
	int32_t *table; /* [n_table] */
};

struct skv_request {
	struct skv_client *c;
	struct skv_wb *wb; /* writeback: handed to the cache */
	uint32_t slot;
	uint64_t user_data;
	/* a request too large for a ring slot went over the socket and is
	 * already complete: its result waits here */
	bool sync;
	bool cancel_sent; /* SKV_OP_CANCEL sent (a cancel timed out; again: wait) */
	int sync_res;
	Snapkv__V1__Response *sync_resp;
};

/* A registered KV pool (SNAPKV_1.9): its id in session session_id and a
 * copy of its description (the writeback destination's mappings). */
struct skv_pool {
	struct skv_client *c;
	uint64_t id, session_id;
	uint32_t layers, h_kv, head_dim, block_size;
	uint64_t n_blocks;
	struct skv_layer_out_ref *layer; /* [layers] */
	struct skv_pool *next;		 /* the client's, c->pools */
};

struct skv_cache {
	struct skv_client *c;
	uint64_t session_id;
	struct skv_cache_info info;
	uint8_t *arena;
	uint64_t *k_off, *v_off, *pos_off;
	float *mass;
	uint64_t run_bytes; /* SKV_LAYOUT_PAGED in the arena: of each (layer, K/V) run */
	struct skv_wb *wb;  /* SKV_OUT_WRITEBACK */
	/* budget modes (SNAPKV_1.6): the outcome; hkept [layers * h_store]
	 * (NULL without a mode), hstart the same when ragged; lmass per layer
	 * min then mean */
	struct skv_cache_budget budget;
	uint32_t *hkept;
	uint64_t *hstart;
	float *lmass;
	float *kv_scale; /* fp8 (SNAPKV_1.8): [layers][K, V]; NULL otherwise */
};

/* ---- libsnapkv-rpc.c */

/* Format the message into c's error (c may be NULL) and return r. */
int skv__fail(struct skv_client *c, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The session is unusable: every later call returns r (-EPIPE as
 * -ECONNRESET). The first reason stays. */
void skv__mark_dead(struct skv_client *c, int r);
uint32_t skv__timeout_of(const struct skv_client *c);
/* The deadline of a call starting now (0: none). */
uint64_t skv__call_deadline(const struct skv_client *c);
/* One request and its reply over the socket, both by deadline dl (0: none).
 * 0 or -errno. Locked. */
int skv__rpc(struct skv_client *c, uint16_t type, const ProtobufCMessage *m, const int *fds,
	     unsigned n_fds, uint16_t want, ProtobufCMessage **ret, int *ret_fds,
	     unsigned *n_ret_fds, uint64_t dl);

/* ---- libsnapkv-ring.c */

/* Take every CQE; mark slots done. The number taken or -errno. Locked. */
int skv__reap(struct skv_client *c);
/* Wait until slot i is done or deadline dl (0: none) passes (-ETIMEDOUT, the
 * slot still pending). 0 or -errno. Called locked; may drop the lock. */
int skv__wait_slot(struct skv_client *c, uint32_t i, uint64_t dl);
/* SKV_OP_CANCEL of the request with user_data ud, waiting for SQ room at
 * most until dl. 0 or -errno. Locked. */
int skv__send_cancel(struct skv_client *c, uint64_t ud, uint64_t dl);
/* The session is dead: end it on our side (SHUT_WR) and wait until
 * snapkvd has closed its end of the socket (it does once the session's last
 * job is done) or dl (0: none) passes. 0 or -ETIMEDOUT. Locked; drops the
 * lock while waiting. */
int skv__wait_hangup(struct skv_client *c, uint64_t dl);
/* The fence of a session: every request in flight cancelled (SKV_OP_CANCEL,
 * when the daemon has it), then waited for until none is pending, by dl
 * (0: none). 0 or -errno. Locked. */
int skv__fence(struct skv_client *c, uint64_t dl);
/* Take a slot and submit, waiting for room at most until dl (0: none).
 * For SKV_OP_REQUEST the Request is packed into the slot. Locked. */
int skv__submit(struct skv_client *c, uint8_t op, Snapkv__V1__Request *req, uint64_t dl,
		uint32_t *ret_slot);
/* A failed result r as the client's error: the daemon's message if it sent
 * one, else strerror. Returns r. */
int skv__result_fail(struct skv_client *c, int r, const Snapkv__V1__Response *resp);
/* Take a finished slot's result (*ret_resp when 0); frees the slot. */
int skv__collect(struct skv_client *c, uint32_t i, Snapkv__V1__Response **ret_resp);
/* A wait on slot i failed (not by timeout): a late completion is dropped by
 * skv__reap(), and one that already came is freed now. */
void skv__slot_give_up(struct skv_client *c, uint32_t i);
/* Submit and wait, both by the client's deadline. Locked. */
int skv__call(struct skv_client *c, Snapkv__V1__Request *req, Snapkv__V1__Response **ret);

/* ---- libsnapkv-buffer.c */

/* REGISTER b (again, after a reconnect) by deadline dl. Locked. */
int skv__buffer_register(struct skv_client *c, struct skv_buffer *b, uint64_t dl);

/* ---- libsnapkv-pool.c */

/* skv_client_close: the pool handles left are freed (the daemon frees the
 * pools with the session). */
void skv__pools_free(struct skv_client *c);

/* ---- libsnapkv-desc.c */

/* A caller's description in the current layout: d itself, or *tmp filled
 * from an old-layout one (its params take the budget defaults). */
const struct skv_compact_desc *skv__desc_current(const struct skv_compact_desc *d,
						 struct skv_compact_desc *tmp);
/* Today's single C: params from before the budget modes, or uniform with
 * no fallback (sent without the budget fields, as before). */
bool skv__desc_budget_plain(const struct skv_compact_desc *d);
/* The checks of a current-layout description before anything is built:
 * 0 or -EINVAL with the client's error saying why. */
int skv__desc_check(struct skv_client *c, const struct skv_compact_desc *d);
/* The budget mode's fields of a CompactRequest (120-129). */
void skv__budget_msg(const struct skv_params *p, Snapkv__V1__CompactRequest *cr);
/* The group fields of d, when desc_size covers them; else no group. */
void skv__desc_group(const struct skv_compact_desc *d, const char **key, uint32_t *size,
		     uint32_t *timeout_ms);

/* ---- libsnapkv-cache.c */

void skv__wb_free(struct skv_wb *w);
void skv__cache_free(struct skv_cache *k);
/* Adopt a CacheInfo into k: every offset checked against the arena we
 * mapped. 0 or -errno (k then holds what it held or nothing new). Locked. */
int skv__cache_from_info(struct skv_client *c, const Snapkv__V1__CacheInfo *ci,
			 struct skv_cache *k);

/* ---- libsnapkv-compact.c */

void skv__request_free(struct skv_request *rq);

#endif /* LIBSNAPKV_INTERNAL_H */
