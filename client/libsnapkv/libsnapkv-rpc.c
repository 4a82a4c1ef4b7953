// SPDX-License-Identifier: MIT
/*
 * libsnapkv-rpc.c - the client's error message, the deadline of each call,
 * and one request with its reply over the control socket (handshake,
 * registration, GPU arena, requests too large for a ring slot).
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/skv-err.h"
#include "proto/skv-frame.h"
#include "proto/skv-io.h"

int skv__fail(struct skv_client *c, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	r = skv_vfail(c ? c->err : NULL, sizeof(c->err), r, fmt, ap);
	va_end(ap);
	return r;
}

SKV_EXPORT const char *skv_client_error(const struct skv_client *c)
{
	return c ? c->err : "no client";
}

void skv__mark_dead(struct skv_client *c, int r)
{
	if (!c->dead)
		c->dead = r == -EPIPE ? -ECONNRESET : r;
}

uint32_t skv__timeout_of(const struct skv_client *c)
{
	return __atomic_load_n(&c->timeout_ms, __ATOMIC_RELAXED);
}

/* The deadline of a call starting now (0: none). */
uint64_t skv__call_deadline(const struct skv_client *c)
{
	return skv_io_deadline(skv__timeout_of(c));
}

/*
 * The daemon did not answer on the socket in time. A reply may still come,
 * and the next call would read it as its own: the connection is unusable,
 * so every later call fails with -ENOTCONN until skv_client_reconnect().
 */
static int socket_timeout(struct skv_client *c, const char *what)
{
	skv__mark_dead(c, -ENOTCONN);
	return skv__fail(c, -ETIMEDOUT, "snapkvd did not %s within %u ms (connection dropped)",
			 what, skv__timeout_of(c));
}

SKV_EXPORT int skv_client_set_timeout(struct skv_client *c, uint32_t timeout_ms)
{
	if (!c)
		return -EINVAL;
	if (timeout_ms > SKV_IO_MAX_TIMEOUT_MS)
		return skv__fail(c, -EINVAL, "timeout of %u ms is too long", timeout_ms);
	__atomic_store_n(&c->timeout_ms, timeout_ms, __ATOMIC_RELAXED);
	return 0;
}

SKV_EXPORT uint32_t skv_client_timeout(const struct skv_client *c)
{
	return c ? skv__timeout_of(c) : 0;
}

/* An ErrorNotice the daemon sent (in c->rbuf): its status (-EPROTO when it
 * has none) with its message as the client's error. */
static int error_notice(struct skv_client *c, size_t len)
{
	Snapkv__V1__ErrorNotice *e = snapkv__v1__error_notice__unpack(NULL, len, c->rbuf + 16);
	int st = e && e->status < 0 ? e->status : -EPROTO;

	skv__fail(c, st, "snapkvd: %s", e && e->error ? e->error : "error");
	if (e)
		snapkv__v1__error_notice__free_unpacked(e, NULL);
	return st;
}

/* Pack m and send it by deadline dl. Locked. */
static int rpc_send(struct skv_client *c, uint16_t type, const ProtobufCMessage *m, const int *fds,
		    unsigned n_fds, uint64_t dl)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *buf;
	int r;

	if (n > SKV_FRAME_MAX_PAYLOAD)
		return skv__fail(c, -EMSGSIZE, "message of %zu bytes is too large", n);
	buf = malloc(n ? n : 1);
	if (!buf)
		return skv__fail(c, -ENOMEM, "out of memory");
	protobuf_c_message_pack(m, buf);
	r = skv_io_send(c->fd, type, buf, n, fds, n_fds, dl);
	free(buf);
	if (r == -ETIMEDOUT)
		return socket_timeout(c, "take a request");
	if (r == -EMSGSIZE) /* nothing was sent: the session is fine */
		return skv__fail(c, r,
				 "message of %zu bytes exceeds this socket's send buffer "
				 "(raise net.core.wmem_max to 1.1 MiB for 1 MiB frames)",
				 n);
	if (r < 0) {
		struct skv_frame_hdr eh;
		unsigned nf = 0;

		/* the daemon may have said why before closing (e.g. not allowed) */
		if (skv_frame_recv(c->fd, c->rbuf, SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD, &eh,
				   NULL, &nf, MSG_DONTWAIT) >= 0 &&
		    eh.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR) {
			Snapkv__V1__ErrorNotice *e =
			    snapkv__v1__error_notice__unpack(NULL, eh.length, c->rbuf + 16);

			if (e && e->status < 0) {
				r = e->status;
				skv__fail(c, r, "snapkvd: %s", e->error ? e->error : "error");
				snapkv__v1__error_notice__free_unpacked(e, NULL);
				skv__mark_dead(c, r);
				return r;
			}
			if (e)
				snapkv__v1__error_notice__free_unpacked(e, NULL);
		}
		skv__mark_dead(c, r);
		return skv__fail(c, c->dead, "send to snapkvd: %s", strerror(-r));
	}
	return 0;
}

static void close_fds(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* Receive until a frame of type want (stray events skipped), by deadline dl:
 * its header in *h, its payload in c->rbuf. Locked. */
static int rpc_recv(struct skv_client *c, uint16_t want, struct skv_frame_hdr *h, int *ret_fds,
		    unsigned *n_ret_fds, uint64_t dl)
{
	for (;;) {
		unsigned nf = n_ret_fds ? *n_ret_fds : 0;
		/* one deadline for the whole reply: stray frames do not extend it */
		int r = skv_io_recv(c->fd, c->rbuf, SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD, h,
				    ret_fds, &nf, dl);

		if (r == -ETIMEDOUT)
			return socket_timeout(c, "answer");
		if (r < 0) {
			skv__mark_dead(c, r == -ECONNRESET ? -ECONNRESET : r);
			return skv__fail(c, c->dead, "receive from snapkvd: %s", strerror(-r));
		}
		if (h->type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR) {
			int st = error_notice(c, h->length);

			close_fds(ret_fds, nf);
			if (st != -EOPNOTSUPP)
				skv__mark_dead(c, st);
			return st;
		}
		if (h->type != want) {
			close_fds(ret_fds, nf);
			continue; /* not ours: stray event */
		}
		if (n_ret_fds)
			*n_ret_fds = nf;
		return 0;
	}
}

/* The reply of type want in c->rbuf, unpacked; NULL if malformed. */
static ProtobufCMessage *reply_unpack(struct skv_client *c, uint16_t want, size_t len)
{
	const uint8_t *p = c->rbuf + 16;

	switch (want) {
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME:
		return (ProtobufCMessage *)snapkv__v1__welcome__unpack(NULL, len, p);
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY:
		return (ProtobufCMessage *)snapkv__v1__register_reply__unpack(NULL, len, p);
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY:
		return (ProtobufCMessage *)snapkv__v1__unregister_reply__unpack(NULL, len, p);
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE:
		return (ProtobufCMessage *)snapkv__v1__response__unpack(NULL, len, p);
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY:
		return (ProtobufCMessage *)snapkv__v1__cuda_arena__unpack(NULL, len, p);
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL_REPLY:
		return (ProtobufCMessage *)snapkv__v1__pool_reply__unpack(NULL, len, p);
	default:
		return NULL;
	}
}

int skv__rpc(struct skv_client *c, uint16_t type, const ProtobufCMessage *m, const int *fds,
	     unsigned n_fds, uint16_t want, ProtobufCMessage **ret, int *ret_fds,
	     unsigned *n_ret_fds, uint64_t dl)
{
	struct skv_frame_hdr h;
	int r;

	if (c->dead)
		return skv__fail(c, c->dead, "not connected to snapkvd");
	r = rpc_send(c, type, m, fds, n_fds, dl);
	if (r < 0)
		return r;
	r = rpc_recv(c, want, &h, ret_fds, n_ret_fds, dl);
	if (r < 0)
		return r;
	*ret = reply_unpack(c, want, h.length);
	if (!*ret) {
		if (n_ret_fds)
			close_fds(ret_fds, *n_ret_fds);
		return skv__fail(c, -EBADMSG, "malformed reply from snapkvd");
	}
	return 0;
}
