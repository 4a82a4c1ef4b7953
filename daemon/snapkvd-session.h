/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-session.h - one engine (or snapkvctl) connection: its lifecycle
 * (a connection, HELLO, close, the last reference), what it owns (its
 * ring, buffers, caches, host and GPU arenas, tenant reference) and the
 * frames it sends on its socket. Teardown gives back every fd and arena
 * byte.
 *
 * Its neighbours, each in its own file: the control socket's receiving
 * side and frame handlers (snapkvd-control.c), the ring
 * (snapkvd-ring.c), requests and their completions (snapkvd-dispatch.c),
 * the set of its buffers (snapkvd-buffer.c) and the server-wide handshake
 * and session-slot limits (snapkvd-slots.c).
 */
#ifndef SNAPKVD_SESSION_H
#define SNAPKVD_SESSION_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "proto/skv-frame.h"
#include <protobuf-c/protobuf-c.h>
#include "snapkvd-bucket.h"
#include "snapkvd-buffer.h"
#include "snapkvd-forward.h"
#include "snapkvd-kvpool.h"
#include "snapkvd-loop.h"

struct skv_cuda_arena;
struct snapkvd_ring;

/* The armed recvmsg's state (snapkvd-control.c owns it while armed). */
struct snapkvd_session_recv {
	struct snapkvd_loop_ev ev;
	uint8_t *buf;
	size_t cap;
	struct iovec iov;
	struct msghdr msg;
	union {
		char buf[CMSG_SPACE(sizeof(int) * SKV_FRAME_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
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
	bool greeted;	/* HELLO seen */
	bool handshake; /* counted in srv->n_handshakes until HELLO or close */
	bool slot;	/* holds a session slot (engine or admin) since HELLO */
	int refused;	/* -errno to answer the HELLO with, then close */
	uint64_t created_ns;
	bool closing;
	bool cancelled; /* atomic: its jobs see the session ended (snapkvd-job.h) */
	unsigned refs;	/* armed io_uring ops + jobs in flight + 1 while open */
	struct snapkvd_tenant *tenant;
	/* engines, from HELLO: the ring, and the doorbell read armed on it */
	struct snapkvd_ring *ring;
	struct snapkvd_loop_ev ev_doorbell;
	uint64_t doorbell_val;
	/* memory */
	struct snapkvd_arena *arena;
	/* --backend cuda, on request: the GPU arena (the device's), offsets
	 * shared with `arena` (a region placed there is the same in both) */
	struct skv_cuda_arena *garena;
	unsigned garena_gpu; /* the device it is on (an index of the device object's) */
	struct snapkvd_buffers buffers;
	/* registered KV pools; freed with the session (jobs name them) */
	struct snapkvd_kvpools kvpools;
	struct snapkvd_cache *caches;
	unsigned n_caches;
	struct snapkvd_job *jobs; /* in flight, by ->s_next (snapkvd-dispatch.c) */
	struct snapkvd_session_recv recv;
	/* admin sessions (snapkvd-adminq.h): the session's rate bucket, and an
	 * answer being built (its next frame is read once it is sent) */
	struct snapkvd_bucket admin_bucket;
	bool admin_pending;
	uint64_t requests, errors;
	struct snapkvd_session *next;
};

/* A new connection (fd owned by the session from here on, even on
 * failure); snapkvd_control_start() then arms its receiving. */
int snapkvd_session_new(struct snapkvd_server *srv, int fd, struct snapkvd_session **ret);
/* Close the socket, free what is not in use; the object goes when refs do. */
void snapkvd_session_close(struct snapkvd_session *s, int why);
void snapkvd_session_unref(struct snapkvd_session *s);
/* A connection that never says HELLO must not hold a session slot. */
void snapkvd_session_check_hello(struct snapkvd_session *s, uint64_t now_ns);
/* HELLO: slot, tenant, ring, arena, Welcome with the fds; or closed. */
void snapkvd_session_hello(struct snapkvd_session *s, const uint8_t *p, size_t len);

/* A frame on the session's socket (non-blocking). 0 or -errno. */
int snapkvd_session_send(struct snapkvd_session *s, uint16_t type, const ProtobufCMessage *m,
			 const int *fds, unsigned n_fds);
/* An ErrorNotice (best effort; the reason shortened to fit). */
void snapkvd_session_send_error(struct snapkvd_session *s, int status, const char *msg);
/* A failure answered to the engine counts for the session and the daemon. */
void snapkvd_session_count_error(struct snapkvd_session *s);

/* Signal the engine's CQ eventfd when it sleeps on it. */
void snapkvd_session_flush_cq(struct snapkvd_session *s);
/* The loop is about to sleep: NEED_WAKEUP on the SQ (W1 in skv-ring.h).
 * True when work it may take arrived meanwhile. */
bool snapkvd_session_prepare_sleep(struct snapkvd_session *s);
void snapkvd_session_wake(struct snapkvd_session *s);
/* A PRESSURE event on the CQ: 1 posted, 0 no ring, -EAGAIN no room left
 * beside the in-flight requests' completions, -EBADMSG a corrupt CQ. */
int snapkvd_session_post_pressure(struct snapkvd_session *s, int level, uint32_t suggested,
				  uint32_t scale_permille, uint64_t used);

/* Unlink a cache from its session and free its memory (eviction). */
void snapkvd_session_drop_cache(struct snapkvd_session *s, struct snapkvd_cache *c);
/* Free a cache's memory (arena, pool) once it is off the session's list. */
void snapkvd_session_free_cache(struct snapkvd_session *s, struct snapkvd_cache *c);

#endif
