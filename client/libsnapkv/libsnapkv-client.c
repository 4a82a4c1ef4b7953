// SPDX-License-Identifier: MIT
/*
 * libsnapkv-client.c - the client object and its connection: connect to the
 * first socket that answers, handshake (ring memfd, arena, eventfds), map
 * both, register the engine's buffers again after a reconnect, and close.
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/skv-frame.h"
#include "proto/skv-io.h"
#include "proto/skv-socket.h"

SKV_EXPORT uint64_t skv_client_session_id(const struct skv_client *c)
{
	return c ? c->session_id : 0;
}

static void session_drop(struct skv_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	if (c->ring)
		munmap(c->ring, c->ring_bytes);
	c->ring = NULL;
	if (c->arena) {
		/* cache handles may still point here: keep the pages until close */
		struct old_map *o = malloc(sizeof(*o));

		if (o) {
			o->p = c->arena;
			o->len = c->arena_bytes;
			o->next = c->old_maps;
			c->old_maps = o;
		} else {
			munmap(c->arena, c->arena_bytes);
		}
	}
	c->arena = NULL;
	if (c->sq_efd >= 0)
		close(c->sq_efd);
	if (c->cq_efd >= 0)
		close(c->cq_efd);
	if (c->arena_fd >= 0)
		close(c->arena_fd);
	c->sq_efd = c->cq_efd = c->arena_fd = -1;
	for (uint32_t i = 0; i < c->n_slots; i++)
		if (c->slots[i].resp)
			snapkv__v1__response__free_unpacked(c->slots[i].resp, NULL);
	free(c->slots);
	c->slots = NULL;
	c->n_slots = 0;
	c->session_id = 0;
}

/* Connect, handshake and register the buffers again, all by deadline dl. */
static int session_open(struct skv_client *c, uint64_t dl)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	Snapkv__V1__Hello h = SNAPKV__V1__HELLO__INIT;
	Snapkv__V1__Welcome *w = NULL;
	int fds[4] = {-1, -1, -1, -1};
	unsigned nf = 4;
	int r;

	c->dead = 0;
	c->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (c->fd < 0)
		return skv__fail(c, -errno, "socket: %s", strerror(errno));
	/* frames up to the protocol's 1 MiB both ways, as far as the kernel lets */
	(void)skv_frame_size_socket(c->fd, NULL);
	strcpy(sa.sun_path, c->path);
	r = skv_io_connect(c->fd, &sa, dl);
	if (r == -ETIMEDOUT) {
		close(c->fd);
		c->fd = -1;
		c->dead = -ENOTCONN;
		return skv__fail(c, r, "connect %s: snapkvd did not accept within %u ms", c->path,
				 skv__timeout_of(c));
	}
	if (r < 0) {
		close(c->fd);
		c->fd = -1;
		c->dead = r == -ENOENT || r == -ECONNREFUSED ? -ENOTCONN : r;
		return skv__fail(c, c->dead, "connect %s: %s", c->path, strerror(-r));
	}
	h.client_version = SKV_PROTO_VERSION;
	h.name = c->name;
	h.sq_entries = c->want_sq;
	r = skv__rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, &h.base, NULL, 0,
		     SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME, (ProtobufCMessage **)&w, fds, &nf, dl);
	if (r < 0)
		goto fail;
	if (nf != 4 || w->ring_bytes < sizeof(struct skv_ring_layout) || !w->arena_bytes) {
		r = skv__fail(c, -EPROTO, "handshake: expected ring, arena and two eventfds");
		goto fail;
	}
	c->session_id = w->session_id;
	c->ring_bytes = w->ring_bytes;
	c->arena_bytes = w->arena_bytes;
	c->ring = mmap(NULL, c->ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (c->ring == MAP_FAILED) {
		c->ring = NULL;
		r = skv__fail(c, -errno, "mmap ring: %s", strerror(errno));
		goto fail;
	}
	close(fds[0]);
	fds[0] = -1;
	memcpy(&c->layout, c->ring, sizeof(c->layout));
	r = skv_ring_layout_check(&c->layout, c->ring_bytes);
	if (r < 0) {
		skv__fail(c, r, "ring layout from snapkvd is invalid");
		goto fail;
	}
	c->arena = mmap(NULL, c->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	if (c->arena == MAP_FAILED) {
		c->arena = NULL;
		r = skv__fail(c, -errno, "mmap arena: %s", strerror(errno));
		goto fail;
	}
	c->arena_fd = fds[1];
	c->sq_efd = fds[2];
	c->cq_efd = fds[3];
	fds[1] = fds[2] = fds[3] = -1;
	skv_ring_q_init(&c->sq, c->ring, c->layout.sq_off, c->layout.sq_entries,
			sizeof(struct skv_sqe));
	skv_ring_q_init(&c->cq, c->ring, c->layout.cq_off, c->layout.cq_entries,
			sizeof(struct skv_cqe));
	c->n_slots = c->layout.sq_entries;
	c->slots = calloc(c->n_slots, sizeof(*c->slots));
	if (!c->slots) {
		r = skv__fail(c, -ENOMEM, "out of memory");
		goto fail;
	}
	snapkv__v1__welcome__free_unpacked(w, NULL);
	/* buffers the engine still holds are registered again */
	for (struct skv_buffer *b = c->buffers; b; b = b->next) {
		r = skv__buffer_register(c, b, dl);
		if (r < 0)
			return r;
	}
	return 0;
fail:
	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (w)
		snapkv__v1__welcome__free_unpacked(w, NULL);
	session_drop(c);
	if (!c->dead)
		c->dead = r;
	return r;
}

/* skv_socket_search_run's try: one connect and handshake at path. */
static int connect_at(const char *path, void *arg)
{
	struct skv_client *c = arg;

	snprintf(c->path, sizeof(c->path), "%s", path);
	return session_open(c, skv__call_deadline(c));
}

SKV_EXPORT int skv_client_connect(const char *path, const struct skv_client_opts *opts,
				  struct skv_client **ret_client)
{
	struct skv_socket_search search;
	struct skv_client *c;
	uint32_t timeout_ms;
	int r;

	if (!ret_client)
		return -EINVAL;
	if (opts && opts->opts_size >= offsetof(struct skv_client_opts, timeout_ms) + 4 &&
	    opts->timeout_ms) {
		timeout_ms = opts->timeout_ms < 0 ? 0 : (uint32_t)opts->timeout_ms;
	} else {
		r = skv_io_timeout_env(&timeout_ms);
		if (r < 0)
			return r;
	}
	r = skv_socket_search_init(&search, path, NULL);
	if (r < 0)
		return r;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	c->fd = c->sq_efd = c->cq_efd = c->arena_fd = -1;
	snprintf(c->name, sizeof(c->name), "%s",
		 opts && opts->name ? opts->name : program_invocation_short_name);
	c->want_sq = opts ? opts->sq_entries : 0;
	c->spin_us = opts && opts->opts_size >= offsetof(struct skv_client_opts, spin_us) + 4 &&
			     opts->spin_us
			 ? opts->spin_us
			 : 50;
	c->timeout_ms = timeout_ms;
	c->rbuf = malloc(SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD);
	if (!c->rbuf) {
		skv_client_close(c);
		return -ENOMEM;
	}
	/* reconnect goes back to the path that answered */
	r = skv_socket_search_run(&search, connect_at, c, NULL);
	if (r < 0) {
		skv_client_close(c);
		return r;
	}
	*ret_client = c;
	return 0;
}

SKV_EXPORT void skv_client_close(struct skv_client *c)
{
	if (!c)
		return;
	/* nothing of this session may be written once we return */
	pthread_mutex_lock(&c->mu);
	(void)skv__fence(c, skv__call_deadline(c));
	pthread_mutex_unlock(&c->mu);
	session_drop(c);
	while (c->buffers) {
		struct skv_buffer *b = c->buffers;

		c->buffers = b->next;
		if (b->own && b->data)
			munmap(b->data, b->size);
		if (b->fd >= 0)
			close(b->fd);
		free(b);
	}
	while (c->old_maps) {
		struct old_map *o = c->old_maps;

		c->old_maps = o->next;
		munmap(o->p, o->len);
		free(o);
	}
	skv__pools_free(c);
	free(c->rbuf);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

SKV_EXPORT int skv_client_reconnect(struct skv_client *c)
{
	int r;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	(void)skv__fence(c, skv__call_deadline(c)); /* a live session's writes first */
	session_drop(c);
	r = session_open(c, skv__call_deadline(c));
	pthread_mutex_unlock(&c->mu);
	return r;
}
