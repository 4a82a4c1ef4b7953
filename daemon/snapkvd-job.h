/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-job.h - one unit of work for a compaction worker: a COMPACT (the
 * kernels over the engine's buffers into a new cache region) or a GROW (a
 * cache's rows copied into a larger region).
 *
 * A job carries everything its worker needs, copied out of the request and
 * the session when it was built: a worker never reads a protobuf message,
 * a session or a cache object, so the loop thread keeps sole ownership of
 * those. The worker writes only status, err and the output memory.
 */
#ifndef SNAPKVD_JOB_H
#define SNAPKVD_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "skv.h"
#include "snapkvd-cache.h"
#include "snapkvd-forward.h"
#include "snapkvd-group.h"
#include "snapkvd-pool.h"

/* Where a request came from and where its answer goes. */
struct snapkvd_origin {
	bool ring;     /* ring: CQE + slot; else a RESPONSE frame */
	bool has_slot; /* the slot is the request's own: answer there */
	uint32_t slot;
	uint64_t user_data;
	uint32_t cqe_flags; /* SKV_CQE_F_* of its completion (cancel, written) */
};

enum snapkvd_job_kind {
	SNAPKVD_JOB_COMPACT = 1,
	SNAPKVD_JOB_GROW,
};

#define SNAPKVD_IPC_EVENT_BYTES 64 /* sizeof(cudaIpcEventHandle_t) */

struct snapkvd_job {
	enum snapkvd_job_kind kind;
	struct snapkvd_session *s; /* the loop thread's, for the completion */
	struct snapkvd_origin origin;
	uint8_t *host_base;	      /* the session's host arena */
	struct snapkvd_buffer **bufs; /* references held, n_bufs */
	unsigned n_bufs;
	/* COMPACT */
	struct skv_shape shape;
	struct skv_params params;
	uint32_t layers;
	struct skv_layer_in *in;
	struct skv_layer_out *out;
	struct snapkvd_cache *cache;	/* filled in; becomes visible on success */
	struct snapkvd_cache_geom geom; /* of its region */
	bool scaled;			/* C was scaled down for pressure */
	int pressure_level;   /* the level C was scaled at (a group's: its first member's) */
	int32_t *block_table; /* private copy, n_block_table entries */
	uint32_t n_block_table;
	/* validation: the first bt_scanned entries were checked, the largest
	 * is bt_max (snapkvd-request.c) */
	uint64_t bt_scanned, bt_max;
	/* out_layout PAGED (snapkvd-paged.c): slots per block; the output
	 * block table (arena: 0 .. n-1; writeback: the engine's, a private
	 * copy); writeback: the destination pools' addresses, [2 * layers]
	 * (K, V of each layer), their strides, and the K buffer of layer 0 */
	bool paged, writeback;
	uint32_t out_block_size;
	int32_t *out_table;
	uint32_t n_out_table;
	/* writeback: the table's first in_place entries are SKV_BLOCK_IN_PLACE
	 * (CompactRequest.out_in_place_blocks: the input's blocks, not written) */
	uint32_t in_place;
	/* writeback, for the cache (snapkvd_paged_cache takes them): the
	 * table's copy, the pools' buffer ids [2 * layers], max_decode */
	int32_t *wb_table;
	uint64_t *wb_pools;
	uint32_t max_decode;
	uint8_t **wb_base;
	int64_t wb_head_stride, wb_token_stride, wb_block_stride;
	uint64_t *wb_k_off, *wb_v_off; /* [layers]: pool offsets in their buffers */
	uint64_t wb_buffer_id;
	/* the registered KV pools the request named (pool_id, out_pool_id):
	 * each counted busy until the job is freed, so unregistering them is
	 * refused while it is in flight (snapkvd-kvpool.h) */
	struct snapkvd_kvpool *kvpool[2];
	/* CompactRequest.prefill_wait CUDA_FLAG: the stream waits until the
	 * word at device address wait_flag is >= wait_value (wait_flag NULL: no
	 * wait); past wait_ms the device's waiter thread writes the value
	 * itself. CUDA_IPC_EVENT (has_event): the handle's bytes; the worker
	 * polls the event and enqueues nothing before it has completed, failing
	 * the job at wait_ms */
	void *wait_flag;
	uint32_t wait_value, wait_ms;
	bool has_event;
	uint8_t wait_event[SNAPKVD_IPC_EVENT_BYTES];
	/* Decision group: the membership (snapkvd-group.h; key "" and size
	 * 0: none) */
	struct snapkvd_group_member gm;
	/* GROW */
	struct snapkvd_cache *target; /* the loop thread's; never read by the worker */
	struct snapkvd_grow g;
	/* both: the device it runs on (an index of the device object's; the
	 * one holding its CUDA buffers or its cache's GPU arena) */
	unsigned gpu;
	struct snapkvd_resv resv;
	int status;
	char err[256];
	uint64_t t_start; /* admission, CLOCK_MONOTONIC */
	/* set (by the loop thread, atomically) when the session ends: a queued
	 * job is not run, a running one stops at its next safe point
	 * (snapkvd_job_cancelled); the session outlives its jobs */
	const bool *cancel;
	/* SKV_OP_CANCEL named this job (set by the loop thread, read by any,
	 * atomically): it stops as when its session ends */
	bool cancel_req;
	/* set by its runner (the worker, atomically) just before the kernels
	 * may write its output: a job failed after it may have written part of
	 * an engine's writeback destination (SKV_CQE_F_WRITTEN) */
	bool writing;
	struct snapkvd_job *next;
	struct snapkvd_job *s_next; /* the session's jobs in flight (loop thread) */
};

/* Whether the job's session has ended or the engine cancelled it (any
 * thread). */
static inline bool snapkvd_job_cancelled(const struct snapkvd_job *j)
{
	return __atomic_load_n(&j->cancel_req, __ATOMIC_ACQUIRE) ||
	       (j->cancel && __atomic_load_n(j->cancel, __ATOMIC_ACQUIRE));
}

/* Why a cancelled job stopped, for its error message. */
static inline const char *snapkvd_job_cancel_reason(const struct snapkvd_job *j)
{
	return __atomic_load_n(&j->cancel_req, __ATOMIC_ACQUIRE) ? "the request was cancelled"
								 : "the session ended";
}

/* The runner is about to let the kernels write the job's output. */
static inline void snapkvd_job_mark_writing(struct snapkvd_job *j)
{
	__atomic_store_n(&j->writing, true, __ATOMIC_RELEASE);
}

/* A zeroed job of `kind` for session s. NULL: out of memory. */
struct snapkvd_job *snapkvd_job_new(enum snapkvd_job_kind kind, struct snapkvd_session *s,
				    const struct snapkvd_origin *o);
/* Drops the buffer references and frees what the job owns (its cache too,
 * unless taken). */
void snapkvd_job_free(struct snapkvd_job *j);
/* Take a reference on b for the job's lifetime (once per buffer). */
void snapkvd_job_hold(struct snapkvd_job *j, struct snapkvd_buffer *b);

#endif
