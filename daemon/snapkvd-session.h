/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-session.h - one engine (or snapkvctl) connection: its control
 * socket frames (HELLO, buffer registration, socket requests, admin, GPU
 * arena), its ring (submissions polled by the loop thread, completions
 * posted by the loop thread only, so every CQ keeps one producer), the
 * buffers and caches it owns, and teardown that gives back every fd and
 * arena byte.
 */
#ifndef SNAPKVD_SESSION_H
#define SNAPKVD_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "proto/skv-frame.h"
#include "proto/skv-ring.h"
#include "snapkvd-forward.h"
#include "snapkvd-loop.h"

struct skv_cuda_arena;

struct snapkvd_session {
	struct snapkvd_server *srv;
	uint64_t id;
	int fd;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[64];
	bool admin;
	bool greeted;	/* HELLO seen */
	bool handshake; /* counted in srv->n_handshakes until HELLO or close */
	bool slot;	/* holds a session slot (engine or admin) since HELLO */
	int refused;	/* -errno to answer the HELLO with, then close */
	uint64_t created_ns;
	bool closing;
	bool cancelled; /* atomic: its jobs see the session ended (snapkvd-job.h) */
	unsigned refs;	/* armed io_uring ops + jobs in flight + 1 while open */
	struct snapkvd_tenant *tenant;
	/* ring */
	int ring_fd, sq_efd, cq_efd;
	uint8_t *ring_map;
	uint64_t ring_bytes;
	struct skv_ring_layout layout; /* our private copy, never re-read */
	struct skv_ring_q sq, cq;
	unsigned inflight; /* SQEs consumed whose CQE is not posted yet */
	bool cq_dirty;	   /* posted CQEs since the last wakeup check */
	/* PRESSURE events coalesce per ring: while one is unread (the CQ head
	 * has not passed pev_end), a newer one waits in pev and replaces any
	 * other waiting; it is posted once the engine has read the first */
	bool pev_unread, pev_waiting;
	uint32_t pev_end;
	struct skv_cqe pev;
	uint64_t events_coalesced;
	uint8_t *scratch; /* private copy of one argument slot */
	/* memory */
	struct snapkvd_arena *arena;
	/* --backend cuda, on request: the GPU arena (the runner's), offsets
	 * shared with `arena` (a region placed there is the same in both) */
	struct skv_cuda_arena *garena;
	struct snapkvd_buffer *buffers;
	unsigned n_buffers;
	uint64_t next_buffer_id;
	struct snapkvd_cache *caches;
	unsigned n_caches;
	/* socket receive state (owned by the armed recvmsg) */
	struct snapkvd_loop_ev ev_recv, ev_doorbell;
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

/* A new connection (fd owned by the session from here on, even on failure). */
int snapkvd_session_new(struct snapkvd_server *srv, int fd, struct snapkvd_session **ret);
/* Close the socket, free what is not in use; the object goes when refs do. */
void snapkvd_session_close(struct snapkvd_session *s, int why);
void snapkvd_session_unref(struct snapkvd_session *s);
/* A connection that never says HELLO must not hold a session slot. */
void snapkvd_session_check_hello(struct snapkvd_session *s, uint64_t now_ns);

/* Poll the SQ: consume up to `budget` entries. Returns how many were handled. */
int snapkvd_session_poll_ring(struct snapkvd_session *s, unsigned budget);
/* Signal the engine's CQ eventfd when it sleeps on it. */
void snapkvd_session_flush_cq(struct snapkvd_session *s);
/* The loop is about to sleep: NEED_WAKEUP on the SQ (W1 in skv-ring.h).
 * True when work it may take arrived meanwhile. */
bool snapkvd_session_prepare_sleep(struct snapkvd_session *s);
void snapkvd_session_wake(struct snapkvd_session *s);

/* A finished job of this session (loop thread): its completion is posted. */
void snapkvd_session_job_done(struct snapkvd_job *j);

/* A PRESSURE event on the CQ: 1 posted, 0 no ring, -EAGAIN no room left
 * beside the in-flight requests' completions, -EBADMSG a corrupt CQ. */
int snapkvd_session_post_pressure(struct snapkvd_session *s, int level, uint32_t suggested,
				  uint32_t scale_permille, uint64_t used);
/* Unlink a cache from its session and free its memory (eviction). */
void snapkvd_session_drop_cache(struct snapkvd_session *s, struct snapkvd_cache *c);

#endif
