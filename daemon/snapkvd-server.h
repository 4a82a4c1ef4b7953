/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-server.h - the daemon's objects: server, session, buffer, cache,
 * compaction job. One object per file (session, compactor, loop, admin,
 * ledger, pool, arena, config); this header ties them together.
 *
 * Threads: the loop thread owns every object here. A compaction worker only
 * touches a job (its private request copy, the buffers it holds references
 * on, the arena region reserved for it) and hands it back through a queue;
 * the loop thread posts its completion, so every CQ keeps one producer.
 */
#ifndef SNAPKVD_SERVER_H
#define SNAPKVD_SERVER_H

#include <liburing.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/skv-frame.h"
#include "proto/skv-ring.h"
#include "proto/snapkv.pb-c.h"
#include "skv.h"
#include "snapkvd-arena.h"
#include "snapkvd-config.h"
#include "snapkvd-ops.h"
#include "snapkvd-pool.h"

struct snapkvd_server;
struct snapkvd_session;

/* What an io_uring completion is about: user_data points at one of these. */
enum snapkvd_ev_kind {
	SNAPKVD_EV_ACCEPT = 1,
	SNAPKVD_EV_RECV,
	SNAPKVD_EV_DOORBELL,
	SNAPKVD_EV_SIGNAL,
	SNAPKVD_EV_TIMER,
	SNAPKVD_EV_JOBS,
	SNAPKVD_EV_HOOK, /* a pressure hook's pidfd polled readable */
};

struct snapkvd_ev {
	enum snapkvd_ev_kind kind;
	struct snapkvd_session *s; /* RECV, DOORBELL */
	struct snapkvd_hook *hook; /* HOOK */
};

struct skv_cuda_import;

struct snapkvd_buffer {
	uint64_t id;
	uint64_t generation;
	uint64_t size; /* mapped bytes */
	/* memfd: our read-only mapping; CUDA: the device address of the buffer
	 * (import base + offset), valid on the daemon's device only */
	const uint8_t *map;
	unsigned refs; /* the session's + one per job using it */
	unsigned regs; /* registrations of this generation not yet unregistered */
	dev_t dev;     /* the memfd registered first: a repeat must name it */
	ino_t ino;
	/* CUDA buffers (snapkvd-gpu.c): the plugin's import, keyed by (session,
	 * generation), dropped with the last reference */
	struct skv_cuda_import *imp;
	struct snapkvd_server *srv; /* imp != NULL */
	const char *transport;	    /* "memfd", "cuda-vmm-fd", "cuda-ipc" */
	int kind;		    /* Snapkv__V1__BufferKind of a CUDA buffer */
	uint64_t ipc_off;	    /* CUDA_IPC: offset in the allocation */
	struct snapkvd_buffer *next;
};

struct snapkvd_cache {
	uint64_t id;
	uint32_t layers, h_q, h_kv, h_store, head_dim, dtype_bytes;
	enum skv_dtype dtype;
	int layout; /* Snapkv__V1__Layout */
	enum skv_gqa gqa;
	enum skv_policy policy;
	uint32_t prompt_len, kept, slots, appended, budget;
	int64_t head_stride, token_stride;
	uint64_t region_off, region_bytes;
	uint64_t *k_off, *v_off, *pos_off; /* [layers] */
	float *mass;			   /* [layers * h_store] */
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
	struct snapkvd_cache *next;
};

/*
 * Where layer l of a cache region at `off` keeps its K, V and positions.
 * Host arena: K, V and positions of each layer in turn. GPU arena (whose
 * offsets are the host arena's): the K/V of every layer first, then the
 * positions of every layer in the host arena, so that a job page-locks only
 * that tail and the host pages under the K/V are never touched.
 */
static inline void snapkvd_region_layer(uint64_t off, uint32_t layers, uint32_t l,
					uint64_t kv_bytes, uint64_t pos_bytes, bool gpu_kv,
					uint64_t *ret_k, uint64_t *ret_v, uint64_t *ret_pos)
{
	if (gpu_kv) {
		*ret_k = off + (uint64_t)l * 2 * kv_bytes;
		*ret_pos = off + (uint64_t)layers * 2 * kv_bytes + (uint64_t)l * pos_bytes;
	} else {
		*ret_k = off + (uint64_t)l * (2 * kv_bytes + pos_bytes);
		*ret_pos = *ret_k + 2 * kv_bytes;
	}
	*ret_v = *ret_k + kv_bytes;
}

/* Where a request came from and where its answer goes. */
struct snapkvd_origin {
	bool ring;     /* ring: CQE + slot; else a RESPONSE frame */
	bool has_slot; /* the slot is the request's own: answer there */
	uint32_t slot;
	uint64_t user_data;
};

struct snapkvd_job {
	struct snapkvd_session *s;
	struct snapkvd_origin origin;
	Snapkv__V1__CompactRequest *req; /* private copy, decoded */
	struct snapkvd_buffer **bufs;	 /* references held, n_bufs */
	unsigned n_bufs;
	struct skv_shape shape;
	struct skv_params params;
	struct skv_layer_in *in;
	struct skv_layer_out *out;
	struct snapkvd_cache *cache; /* filled in; becomes visible on success */
	struct snapkvd_resv resv;
	int32_t *block_table;
	/* CompactRequest.prefill_wait CUDA_FLAG: the stream waits until the
	 * word at device address wait_flag is >= wait_value (wait_flag NULL: no
	 * wait); past wait_ms the compactor's waiter thread writes the value
	 * itself. CUDA_IPC_EVENT: wait_event is the handle's 64 bytes (inside
	 * req); the worker polls the event and enqueues nothing before it has
	 * completed, failing the job at wait_ms */
	void *wait_flag;
	const uint8_t *wait_event;
	uint32_t wait_value, wait_ms;
	int status;
	char err[256];
	uint64_t t_start; /* admission, CLOCK_MONOTONIC */
	/* GROW: the worker copies `target` into a larger region; everything it
	 * needs is copied here, so the cache object is never touched off-loop.
	 * gpu: the K/V are in the session's GPU arena at kv_base (copied device
	 * to device on the worker's stream), the positions on the host. */
	bool grow;
	struct snapkvd_cache *target;
	struct {
		uint64_t off, region, kv_bytes, pos_bytes;
		uint32_t slots, old_slots, used, layers, h_store, row;
		bool hnd, gpu;
		uint8_t *kv_base;
		uint64_t *old_k, *old_v, *old_pos; /* [layers] */
	} g;
	struct snapkvd_job *next;
};

struct snapkvd_session {
	struct snapkvd_server *srv;
	uint64_t id;
	int fd;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[64];
	bool admin;
	bool greeted; /* HELLO seen */
	int refused;  /* -errno to answer the HELLO with, then close */
	uint64_t created_ns;
	bool closing;
	unsigned refs; /* armed io_uring ops + jobs in flight + 1 while open */
	struct snapkvd_tenant *tenant;
	/* ring */
	int ring_fd, sq_efd, cq_efd;
	uint8_t *ring_map;
	uint64_t ring_bytes;
	struct skv_ring_layout layout; /* our private copy, never re-read */
	struct skv_ring_q sq, cq;
	unsigned inflight; /* SQEs consumed whose CQE is not posted yet */
	bool cq_dirty;	   /* posted CQEs since the last wakeup check */
	uint8_t *scratch;  /* private copy of one argument slot */
	/* memory */
	struct snapkvd_arena *arena;
	/* --backend cuda, on request: the GPU arena (snapkvd-gpu.c), offsets
	 * shared with `arena` (a region placed there is the same in both) */
	struct skv_cuda_arena *garena;
	struct snapkvd_buffer *buffers;
	unsigned n_buffers;
	uint64_t next_buffer_id;
	struct snapkvd_cache *caches;
	unsigned n_caches;
	/* socket receive state (owned by the armed recvmsg) */
	struct snapkvd_ev ev_recv, ev_doorbell;
	uint64_t doorbell_val;
	uint8_t *rbuf;
	size_t rbuf_cap;
	struct iovec riov;
	struct msghdr rmsg;
	union {
		char buf[CMSG_SPACE(sizeof(int) * SKV_FRAME_MAX_FDS)];
		struct cmsghdr align;
	} rctl;
	uint64_t requests, errors;
	struct snapkvd_session *next;
};

struct snapkvd_compactor;
struct skv_backend; /* kernels/cuda/skv-backend.h */

struct snapkvd_server {
	struct snapkvd_config cfg;
	const char *config_path;
	struct snapkvd_pool pool;
	struct io_uring ring;
	int listen_fd;
	bool listen_owned; /* we created (and unlink) the socket path */
	int signal_fd, timer_fd, jobs_efd;
	struct snapkvd_ev ev_accept, ev_signal, ev_timer, ev_jobs;
	uint8_t sigbuf[128];
	uint64_t timerbuf, jobsbuf;
	struct snapkvd_session *sessions;
	unsigned n_sessions;
	uint64_t next_session_id;
	struct snapkvd_compactor *compactor;
	struct skv_backend *gpu; /* --backend cuda: the loaded plugin and its device */
	char backend_desc[400];	 /* status: backend, device and transport actually used */
	unsigned cuda_imports;	 /* live CUDA buffer imports (loop thread) */
	bool draining, stop;
	int exit_code;
	uint64_t start_ns;
	uint64_t requests, errors, compactions, compact_ns, sessions_total;
	uint64_t next_cache_id;
	struct snapkvd_ops ops; /* pressure policy, hooks, metrics */
	double start_realtime_s;
	bool watchdog;
	uint64_t last_status_ns;
};

uint64_t snapkvd_now_ns(void);

/* session.c */
int snapkvd_session_new(struct snapkvd_server *srv, int fd, struct snapkvd_session **ret);
/* Close the socket, free what is not in use; the object goes when refs do. */
void snapkvd_session_close(struct snapkvd_session *s, int why);
void snapkvd_session_unref(struct snapkvd_session *s);
/* A frame arrived (payload, fds owned by the callee). */
void snapkvd_session_on_frame(struct snapkvd_session *s, const struct skv_frame_hdr *h,
			      const uint8_t *payload, int *fds, unsigned n_fds);
/* Poll the SQ: consume up to `budget` entries. Returns how many were handled. */
int snapkvd_session_poll_ring(struct snapkvd_session *s, unsigned budget);
/* Handle one encoded Request; the answer goes to origin now or later. */
void snapkvd_session_request(struct snapkvd_session *s, const struct snapkvd_origin *o,
			     const uint8_t *buf, size_t len);
void snapkvd_session_complete(struct snapkvd_session *s, const struct snapkvd_origin *o, int status,
			      const char *err, Snapkv__V1__Response *resp);
void snapkvd_session_job_done(struct snapkvd_job *j);
/* Signal the engine's CQ eventfd when it sleeps on it. */
void snapkvd_session_flush_cq(struct snapkvd_session *s);
struct snapkvd_cache *snapkvd_session_find_cache(struct snapkvd_session *s, uint64_t id);
void snapkvd_cache_free(struct snapkvd_cache *c);

/* compactor.c */
/* `threads` (0: one per core) split among `workers` (0: auto), each at
 * least one thread (more workers than threads: one each); --backend cuda
 * runs one worker. On failure err->msg says why where the CUDA plugin
 * gave a reason (e.g. a bad SKV_CUDA_SCORE), else it is left empty. */
int snapkvd_compactor_new(struct snapkvd_server *srv, unsigned threads, unsigned workers,
			  struct skv_error *err, struct snapkvd_compactor **ret);
void snapkvd_compactor_free(struct snapkvd_compactor *c);
void snapkvd_compactor_submit(struct snapkvd_compactor *c, struct snapkvd_job *j);
/* Take every finished job (loop thread). */
struct snapkvd_job *snapkvd_compactor_reap(struct snapkvd_compactor *c);
unsigned snapkvd_compactor_pending(struct snapkvd_compactor *c);
unsigned snapkvd_compactor_queued(struct snapkvd_compactor *c); /* not started yet */
unsigned snapkvd_compactor_workers(struct snapkvd_compactor *c);
unsigned snapkvd_compactor_threads(struct snapkvd_compactor *c); /* of the largest worker */
const char *snapkvd_compactor_isa(struct snapkvd_compactor *c);
/* Validate a CompactRequest against the session and limits and build a job
 * (buffer references taken, region reserved and placed). 0 or -errno with a
 * reason in err. */
int snapkvd_job_prepare(struct snapkvd_session *s, const struct snapkvd_origin *o,
			Snapkv__V1__CompactRequest *req, struct snapkvd_job **ret, char *err,
			size_t errlen);
void snapkvd_job_free(struct snapkvd_job *j);
void snapkvd_buffer_unref(struct snapkvd_buffer *b);

/* gpu.c: CUDA buffer registration (--backend cuda). Imports the VMM fd or
 * IPC handle of `m` on the daemon's device, keyed by (session id,
 * generation); fd (or -1) is closed. -ENOTSUP on a host-backend daemon. */
int snapkvd_gpu_buffer_new(struct snapkvd_session *s, const Snapkv__V1__RegisterBuffer *m, int fd,
			   struct snapkvd_buffer **ret, char *err, size_t errlen);
/* Drop the import of a CUDA buffer (its last reference went). */
void snapkvd_gpu_buffer_release(struct snapkvd_buffer *b);
/* The session's GPU arena, created on first use (as large as its host
 * arena); a new fd for it in *ret_fd. -ENOTSUP on the host backend. */
int snapkvd_gpu_arena_export(struct snapkvd_session *s, int *ret_fd, uint64_t *ret_size,
			     int *ret_device, char *err, size_t errlen);
/* Device address of the GPU arena's base (NULL: none yet). */
uint8_t *snapkvd_gpu_arena_base(struct snapkvd_session *s);
void snapkvd_gpu_arena_free(struct snapkvd_session *s);

/* ledger.c */
int snapkvd_ledger_cache(const struct snapkvd_cache *c, struct skv_ledger *ret);

/* admin.c */
void snapkvd_admin(struct snapkvd_session *s, const uint8_t *payload, size_t len);
/* Prometheus text exposition of the server; caller frees. */
char *snapkvd_admin_metrics_text(struct snapkvd_server *srv);
/*
 * The ledger part of an admin CACHES/LEDGER reply (pool, tenants, caches),
 * filled into *r with its arrays in *b; free them with
 * snapkvd_admin_ledger_free() once *r is no longer used. Also what the hooks'
 * ledger snapshot is rendered from (snapkvd_ops_ledger_json). 0 or -ENOMEM
 * (then *r holds no pointer into *b).
 */
struct snapkvd_admin_ledger_buf {
	Snapkv__V1__TenantInfo *ti, **tip;
	Snapkv__V1__CacheLedger *cl, **clp;
	Snapkv__V1__LedgerBytes *lb, *tb, pool;
};
int snapkvd_admin_ledger_fill(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r,
			      struct snapkvd_admin_ledger_buf *b);
void snapkvd_admin_ledger_free(struct snapkvd_admin_ledger_buf *b);

/* ops-daemon.c: the operations runtime wired to the server */
int snapkvd_server_ops_init(struct snapkvd_server *srv);
void snapkvd_server_ops_fini(struct snapkvd_server *srv);
/* Re-evaluate pressure after pool changes (runs the policy actions). */
void snapkvd_server_pool_changed(struct snapkvd_server *srv);
void snapkvd_server_hook_event(struct snapkvd_server *srv, struct snapkvd_ev *ev, int res);
/* A new engine under pressure learns the current level at once. */
void snapkvd_server_greet_pressure(struct snapkvd_session *s);
char *snapkvd_ops_metrics_text(struct snapkvd_server *srv);
char *snapkvd_ops_ledger_json(struct snapkvd_server *srv);
struct snapkvd_admin_pressure_buf {
	char err[256];
	char strings[512];
	Snapkv__V1__PressureInfo info;
	Snapkv__V1__PressureTransition tr[SNAPKVD_PRESSURE_HISTORY];
	Snapkv__V1__PressureTransition *trp[SNAPKVD_PRESSURE_HISTORY];
};
/* ADMIN_KIND_PRESSURE(_SET): fills r->pressure from b. 0 or -errno (in r). */
int snapkvd_admin_pressure(struct snapkvd_session *s, const Snapkv__V1__AdminRequest *req,
			   Snapkv__V1__AdminReply *r, struct snapkvd_admin_pressure_buf *b);
/* session.c: unlink a cache from its session and free its memory. */
void snapkvd_session_drop_cache(struct snapkvd_session *s, struct snapkvd_cache *c);

/* loop.c */
int snapkvd_loop_init(struct snapkvd_server *srv);
int snapkvd_loop_run(struct snapkvd_server *srv);
void snapkvd_loop_fini(struct snapkvd_server *srv);
/* Arm a recvmsg / doorbell read for a session (takes a ref). */
int snapkvd_loop_arm_recv(struct snapkvd_session *s);
int snapkvd_loop_arm_doorbell(struct snapkvd_session *s);
/* POLLIN on fd, completing with user_data ev. */
int snapkvd_loop_arm_poll(struct snapkvd_server *srv, int fd, struct snapkvd_ev *ev);

#endif
