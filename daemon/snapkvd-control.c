// SPDX-License-Identifier: MIT
/* snapkvd-control.c - a session's control-socket face; see snapkvd-control.h. */
#include "snapkvd-control.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/snapkv.pb-c.h"
#include "snapkvd-adminq.h"
#include "snapkvd-arena.h"
#include "snapkvd-buffer.h"
#include "snapkvd-cleanup.h"
#include "snapkvd-clock.h"
#include "snapkvd-config.h"
#include "snapkvd-device.h"
#include "snapkvd-dispatch.h"
#include "snapkvd-job.h"
#include "snapkvd-log.h"
#include "snapkvd-server.h"
#include "snapkvd-session.h"

/*
 * The fds that came with one frame. Owned by this guard from recvmsg on:
 * a handler takes the one it keeps (fds_take), and whatever is left when
 * the frame's handling ends is closed, on every path (refused, first frame
 * not HELLO, malformed, session closing).
 */
struct frame_fds {
	int fd[SKV_FRAME_MAX_FDS];
	unsigned n;
};

static void frame_fds_close(struct frame_fds *f)
{
	for (unsigned i = 0; i < f->n; i++)
		if (f->fd[i] >= 0)
			close(f->fd[i]);
	f->n = 0;
}

/* The only fd of a frame that must carry exactly one, else -1. */
static int fds_take_one(struct frame_fds *f)
{
	int fd;

	if (f->n != 1)
		return -1;
	fd = f->fd[0];
	f->fd[0] = -1;
	return fd;
}

static void on_recv(void *data, int res);

static int arm_recv(struct snapkvd_session *s)
{
	struct snapkvd_session_recv *rv = &s->recv;

	rv->ev = (struct snapkvd_loop_ev){.fn = on_recv, .data = s};
	rv->iov = (struct iovec){.iov_base = rv->buf, .iov_len = rv->cap};
	memset(&rv->msg, 0, sizeof(rv->msg));
	rv->msg.msg_iov = &rv->iov;
	rv->msg.msg_iovlen = 1;
	/* Cleared each time: a recvmsg that fails (ECONNRESET when the engine
	 * left with replies unread) does not rewrite msg_controllen, and the
	 * previous frame's fds, closed since, must not be closed again. */
	memset(&rv->ctl, 0, sizeof(rv->ctl));
	rv->msg.msg_control = rv->ctl.buf;
	rv->msg.msg_controllen = sizeof(rv->ctl.buf);
	if (snapkvd_loop_recvmsg(s->srv->loop, s->fd, &rv->msg, MSG_CMSG_CLOEXEC, &rv->ev) < 0)
		return -EBUSY;
	s->refs++;
	return 0;
}

int snapkvd_control_start(struct snapkvd_session *s)
{
	int r = arm_recv(s);

	if (r < 0)
		snapkvd_session_close(s, r);
	return r;
}

/* ------------------------------------------------------------- registration */

static void reg_reply(struct snapkvd_session *s, int status, const char *err, uint64_t gen)
{
	Snapkv__V1__RegisterReply rr = SNAPKV__V1__REGISTER_REPLY__INIT;

	rr.status = status;
	rr.transport = "";
	rr.error = (char *)(err ? err : "");
	rr.generation = gen;
	snapkvd_session_count_error(s);
	if (snapkvd_session_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY, &rr.base, NULL,
				 0) < 0)
		snapkvd_session_close(s, 0);
}

/* A registration that succeeded: the buffer as registered, writable or not. */
static void reg_reply_ok(struct snapkvd_session *s, const struct snapkvd_buffer *b)
{
	Snapkv__V1__RegisterReply rr = SNAPKV__V1__REGISTER_REPLY__INIT;

	rr.transport = (char *)(b->transport ? b->transport : "memfd");
	rr.error = "";
	rr.buffer_id = b->id;
	rr.generation = b->generation;
	rr.size = b->size;
	rr.writable = b->writable;
	if (snapkvd_session_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY, &rr.base, NULL,
				 0) < 0)
		snapkvd_session_close(s, 0);
}

/* A CUDA buffer (the device imports it); fd (or -1) is consumed. */
static void register_gpu(struct snapkvd_session *s, const Snapkv__V1__RegisterBuffer *m, int fd)
{
	const struct snapkvd_config *cfg = &s->srv->cfg;
	const struct snapkvd_buffer_cuda bc = {
	    .kind = (int)m->kind,
	    .size = m->size,
	    .offset = m->offset,
	    .generation = m->generation,
	    .ipc_handle = m->ipc_handle.data,
	    .ipc_handle_len = m->ipc_handle.len,
	    .device = m->device,
	};
	struct snapkvd_buffer *b;
	char err[256];
	int r;

	if (s->admin || !s->arena) {
		if (fd >= 0)
			close(fd);
		reg_reply(s, -EPERM, "admin sessions cannot register buffers", m->generation);
		return;
	}
	r = snapkvd_buffers_add_cuda(&s->buffers, cfg->max_buffers, cfg->max_buffer_bytes, &bc,
				     m->writable, fd, &b, err, sizeof(err));
	if (r < 0)
		reg_reply(s, r, err, m->generation);
	else
		reg_reply_ok(s, b);
}

/* A memfd registration of `size` (0: the whole memfd), generation gen. */
static void register_memfd(struct snapkvd_session *s, int fd, uint64_t size, uint64_t gen,
			   bool writable)
{
	const struct snapkvd_config *cfg = &s->srv->cfg;
	struct snapkvd_buffer *b;
	char err[256];
	int r;

	if (s->admin || !s->arena) {
		if (fd >= 0)
			close(fd);
		reg_reply(s, -EPERM, "admin sessions cannot register buffers", gen);
		return;
	}
	if (fd < 0) {
		reg_reply(s, -EBADF, "RegisterBuffer needs exactly one fd", gen);
		return;
	}
	r = snapkvd_buffers_add_memfd(&s->buffers, cfg->max_buffers, cfg->max_buffer_bytes, fd,
				      size, gen, writable, &b, err, sizeof(err));
	if (r < 0)
		reg_reply(s, r, err, gen);
	else
		reg_reply_ok(s, b);
}

static void register_freep(Snapkv__V1__RegisterBuffer **m)
{
	if (*m)
		snapkv__v1__register_buffer__free_unpacked(*m, NULL);
}

static void on_register(struct snapkvd_session *s, const uint8_t *p, size_t len,
			struct frame_fds *fds)
{
	_cleanup_(register_freep) Snapkv__V1__RegisterBuffer *m =
	    snapkv__v1__register_buffer__unpack(NULL, len, p);
	/* more than one fd: none is used; the guard closes them all */
	int fd = fds_take_one(fds);

	if (!m) {
		if (fd >= 0)
			close(fd);
		reg_reply(s, -EBADMSG, "malformed RegisterBuffer", 0);
		return;
	}
	switch (m->kind) {
	case SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD:
	case SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC:
		register_gpu(s, m, fd);
		break;
	case SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_UNSPECIFIED:
	case SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_MEMFD:
		register_memfd(s, fd, m->size, m->generation, m->writable);
		break;
	default:
		if (fd >= 0)
			close(fd);
		reg_reply(s, -EINVAL, "unknown buffer kind", m->generation);
		break;
	}
}

static void on_unregister(struct snapkvd_session *s, const uint8_t *p, size_t len)
{
	Snapkv__V1__Unregister *m = snapkv__v1__unregister__unpack(NULL, len, p);
	Snapkv__V1__UnregisterReply rr = SNAPKV__V1__UNREGISTER_REPLY__INIT;

	rr.error = "";
	if (!m) {
		rr.status = -EBADMSG;
		rr.error = "malformed Unregister";
	} else {
		/* a running job keeps its own reference */
		rr.status = snapkvd_buffers_remove(&s->buffers, m->buffer_id);
		if (rr.status < 0)
			rr.error = "no such buffer";
		snapkv__v1__unregister__free_unpacked(m, NULL);
	}
	if (snapkvd_session_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY, &rr.base, NULL,
				 0) < 0)
		snapkvd_session_close(s, 0);
}

/* ------------------------------------------------------ registered KV pools */

/* MSG_TYPE_POOL: register a KV pool of the session's buffers, or
 * unregister one (EBUSY while a request in flight names it). */
static void on_pool(struct snapkvd_session *s, const uint8_t *p, size_t len)
{
	const struct snapkvd_config *cfg = &s->srv->cfg;
	const struct snapkvd_kvpool_limits lim = {
	    .max_session_pools = cfg->max_session_pools,
	    .max_layers = cfg->max_layers,
	    .max_heads = cfg->max_heads,
	    .max_head_dim = cfg->max_head_dim,
	    .max_block_table = cfg->max_block_table,
	};
	Snapkv__V1__PoolRequest *m = snapkv__v1__pool_request__unpack(NULL, len, p);
	Snapkv__V1__PoolReply rr = SNAPKV__V1__POOL_REPLY__INIT;
	const char *why = "";
	char err[256] = "";

	rr.error = err;
	if (!m) {
		rr.status = -EBADMSG;
		snprintf(err, sizeof(err), "malformed PoolRequest");
	} else if (s->admin || !s->arena) {
		rr.status = -EPERM;
		snprintf(err, sizeof(err), "admin sessions cannot register pools");
	} else if (m->unregister) {
		rr.status = snapkvd_kvpools_remove(&s->kvpools, m->pool_id, &why);
		rr.pool_id = m->pool_id;
		if (rr.status < 0)
			snprintf(err, sizeof(err), "pool %llu: %s", (unsigned long long)m->pool_id,
				 why);
	} else {
		rr.status = snapkvd_kvpools_add(&s->kvpools, &lim, s->buffers.list, m, &rr.pool_id,
						err, sizeof(err));
	}
	if (m)
		snapkv__v1__pool_request__free_unpacked(m, NULL);
	if (rr.status < 0)
		snapkvd_session_count_error(s);
	if (snapkvd_session_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL_REPLY, &rr.base, NULL, 0) <
	    0)
		snapkvd_session_close(s, 0);
}

/* ------------------------------------------------- GPU arena, admin, frames */

/*
 * The device of a session's GPU arena, chosen when it is created: the one
 * holding the session's CUDA buffers (an engine rank's device), else the
 * first the daemon opened. Compactions into it run there, so a session
 * whose buffers are on another device cannot use it (refused by name).
 */
static unsigned arena_gpu(const struct snapkvd_session *s)
{
	for (const struct snapkvd_buffer *b = s->buffers.list; b; b = b->next)
		if (b->imp)
			return b->gpu;
	return 0;
}

/* The session's GPU arena, exported to the engine (created on first ask). */
static void on_cuda_arena(struct snapkvd_session *s)
{
	Snapkv__V1__CudaArena a = SNAPKV__V1__CUDA_ARENA__INIT;
	char err[256] = "";
	uint64_t size = 0;
	int fd = -1, dev = -1, r;

	if (!snapkvd_device_present(s->srv->device)) {
		snprintf(
		    err, sizeof(err),
		    "a GPU arena needs snapkvd --backend cuda; this daemon runs the %s backend",
		    snapkvd_device_backend(s->srv->device));
		r = -ENOTSUP;
	} else if (s->admin || !s->arena) {
		snprintf(err, sizeof(err), "admin sessions have no arena");
		r = -EPERM;
	} else {
		if (!s->garena)
			s->garena_gpu = arena_gpu(s);
		r = snapkvd_device_arena_export(s->srv->device, s->garena_gpu, &s->garena,
						s->arena->size, s->id, &fd, &size, &dev, err,
						sizeof(err));
	}
	a.status = r;
	a.error = err;
	a.size = size;
	a.device = dev;
	a.transport = (char *)(r ? "" : "cuda-vmm");
	if (r)
		snapkvd_session_count_error(s);
	if (snapkvd_session_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY, &a.base, &fd,
				 fd >= 0 ? 1 : 0) < 0)
		snapkvd_session_close(s, 0);
	if (fd >= 0)
		close(fd);
}

/* An admin answer on the socket; false: the session is closed. */
static bool admin_send(struct snapkvd_session *s, const uint8_t *buf, size_t len)
{
	if (skv_frame_send(s->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY, buf, len, NULL, 0,
			   MSG_DONTWAIT) < 0) {
		snapkvd_session_close(s, 0);
		return false;
	}
	return true;
}

/* A sliced answer is built (snapkvd-adminq.h): sent, then the session's
 * next frame read (on_recv left it unarmed meanwhile). */
static void admin_done(struct snapkvd_session *s, const uint8_t *buf, size_t len)
{
	if (!s->closing && admin_send(s, buf, len) && arm_recv(s) < 0)
		snapkvd_session_close(s, -EBUSY);
}

/* snapkvctl's questions: rate-limited and answered through
 * snapkvd-adminq.c, at once or by admin_done. */
static void on_admin(struct snapkvd_session *s, const uint8_t *payload, size_t len)
{
	uint8_t *buf = NULL;
	size_t n = 0;
	int r =
	    snapkvd_adminq_request(s->srv->adminq, s->srv, s, payload, len, admin_done, &buf, &n);

	if (r < 0)
		snapkvd_session_close(s, r);
	else if (r == 0)
		admin_send(s, buf, n);
	free(buf);
}

/* not fatal: the peer may speak a newer minor revision */
static void on_unknown(struct snapkvd_session *s)
{
	Snapkv__V1__ErrorNotice e = SNAPKV__V1__ERROR_NOTICE__INIT;

	e.status = -EOPNOTSUPP;
	e.error = "unknown message type";
	snapkvd_session_count_error(s);
	if (snapkvd_session_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR, &e.base, NULL, 0) < 0)
		snapkvd_session_close(s, 0);
}

static void on_frame(struct snapkvd_session *s, const struct skv_frame_hdr *h,
		     const uint8_t *payload, struct frame_fds *fds)
{
	const struct snapkvd_origin socket = {.ring = false};
	bool hello = h->type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO;

	s->requests++;
	/* The first message must be HELLO, and only the first. */
	if (hello == s->greeted) {
		snapkvd_session_close(s, -EPROTO);
		return;
	}
	s->greeted = true;
	switch (h->type) {
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO:
		snapkvd_session_hello(s, payload, h->length);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER:
		on_register(s, payload, h->length, fds);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER:
		on_unregister(s, payload, h->length);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST:
		snapkvd_dispatch_request(s, &socket, payload, h->length);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN:
		on_admin(s, payload, h->length);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA:
		on_cuda_arena(s);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL:
		on_pool(s, payload, h->length);
		break;
	default:
		on_unknown(s);
		break;
	}
}

/* The armed recvmsg completed: one frame, or the end of the stream. */
static void on_recv(void *data, int res)
{
	struct snapkvd_session *s = data;
	struct skv_frame_hdr h;
	_cleanup_(frame_fds_close) struct frame_fds fds = {.n = 0};
	int r;

	if (s->closing) {
		if (res >= 0)
			skv_frame_close_fds(&s->recv.msg);
		snapkvd_session_unref(s);
		return;
	}
	fds.n = SKV_FRAME_MAX_FDS;
	r = skv_frame_parse(&s->recv.msg, res, SKV_FRAME_MAX_PAYLOAD, &h, fds.fd, &fds.n);
	if (r < 0) {
		fds.n = 0; /* the parser closed them */
		/* end of stream, or framing we cannot trust: close this one */
		if (r != -ECONNRESET)
			snapkvd_log_cause(&s->srv->floods[SNAPKVD_FLOOD_BAD_FRAME],
					  snapkvd_now_ns(), "session %llu: bad frame: %s",
					  (unsigned long long)s->id, strerror(-r));
		snapkvd_session_close(s, r == -ECONNRESET ? 0 : r);
	} else {
		on_frame(s, &h, s->recv.buf + SKV_FRAME_HDR_SIZE, &fds);
		/* an admin answer being built: read on once it is sent */
		if (!s->closing && !s->admin_pending && arm_recv(s) < 0)
			snapkvd_session_close(s, -EBUSY);
	}
	snapkvd_session_unref(s);
}
