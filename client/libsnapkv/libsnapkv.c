// SPDX-License-Identifier: MIT
/*
 * libsnapkv.c - the engine side of snapkvd: handshake and registration over
 * the control socket, requests over the session's shared-memory ring.
 *
 * Ring requests carry a snapkv.v1.Request in the argument slot that belongs
 * to the SQ entry; the daemon answers in the same slot. Slot i is ours from
 * submit until its CQE has been reaped, so slots double as request tags.
 */
#include "snapkv.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "proto/skv-frame.h"
#include "proto/skv-ring.h"
#include "proto/snapkv.pb-c.h"
#include "proto/skv-err.h"
#include "proto/skv-io.h"
#include "proto/skv-socket.h"

#define SKV_EXPORT __attribute__((visibility("default")))

enum slot_state { SLOT_FREE = 0, SLOT_PENDING, SLOT_DONE };

struct slot {
	enum slot_state state;
	int res;
	uint64_t user_data;
	Snapkv__V1__Response *resp;
	bool orphan; /* its request handle is gone: free on completion */
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
	uint64_t seq;
	uint64_t generation;
	struct skv_buffer *buffers;
	struct old_map *old_maps;
	uint8_t *rbuf;
	char err[256];
	struct skv_pressure pressure; /* latest PRESSURE event */
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
	int sync_res;
	Snapkv__V1__Response *sync_resp;
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
};

static int fail(struct skv_client *c, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct skv_client *c, int r, const char *fmt, ...)
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

SKV_EXPORT uint64_t skv_client_session_id(const struct skv_client *c)
{
	return c ? c->session_id : 0;
}

SKV_EXPORT void skv_client_params_init(struct skv_params *p)
{
	/* static: its padding is zero too, as memset left it before */
	static const struct skv_params d = SKV_PARAMS_DEFAULTS;

	/* Only the fields before the budget modes: a program built before them
	 * passes a struct that ends there (params_size says so). */
	memcpy(p, &d, SKV_PARAMS_SIZE_V1);
	p->params_size = SKV_PARAMS_SIZE_V1;
}

/*
 * Descriptions laid out before the budget modes grew struct skv_params: their
 * fields after `params` start at the old end of params, 8-aligned. Such a
 * description is shorter than where `layer` lies now (desc_size says so).
 */
#define DESC_TAIL offsetof(struct skv_compact_desc, layer)
#define DESC_V1_TAIL                                                                               \
	((offsetof(struct skv_compact_desc, params) + SKV_PARAMS_SIZE_V1 + 7) & ~(size_t)7)
#define DESC_V1_SHIFT (DESC_TAIL - DESC_V1_TAIL)

static bool desc_is_v1(const struct skv_compact_desc *d)
{
	return d->desc_size < DESC_TAIL;
}

/* A caller's description in the current layout: d itself, or *tmp filled
 * from an old-layout one (its params take the budget defaults). */
static const struct skv_compact_desc *desc_current(const struct skv_compact_desc *d,
						   struct skv_compact_desc *tmp)
{
	static const struct skv_params dp = SKV_PARAMS_DEFAULTS;

	if (!desc_is_v1(d))
		return d;
	memset(tmp, 0, sizeof(*tmp));
	memcpy(tmp, d, offsetof(struct skv_compact_desc, params) + SKV_PARAMS_SIZE_V1);
	memcpy((char *)&tmp->params + SKV_PARAMS_SIZE_V1, (const char *)&dp + SKV_PARAMS_SIZE_V1,
	       sizeof(dp) - SKV_PARAMS_SIZE_V1);
	if (d->desc_size > DESC_V1_TAIL) {
		size_t n = d->desc_size - DESC_V1_TAIL;
		if (n > sizeof(*tmp) - DESC_TAIL)
			n = sizeof(*tmp) - DESC_TAIL;
		memcpy((char *)tmp + DESC_TAIL, (const char *)d + DESC_V1_TAIL, n);
	}
	tmp->desc_size = d->desc_size > DESC_V1_TAIL ? d->desc_size + (uint32_t)DESC_V1_SHIFT
						     : (uint32_t)DESC_TAIL;
	return tmp;
}

/* Write back what the wait helpers set into an old-layout description. */
static void desc_store_v1(struct skv_compact_desc *d, const struct skv_compact_desc *cur)
{
	if (d->desc_size > DESC_V1_TAIL)
		memcpy((char *)d + DESC_V1_TAIL, (const char *)cur + DESC_TAIL,
		       d->desc_size - DESC_V1_TAIL);
}

/* Today's single C: params from before the budget modes, or uniform with
 * no fallback (sent without the budget fields, as before). */
static bool desc_budget_plain(const struct skv_compact_desc *d)
{
	return d->params.params_size != sizeof(d->params) ||
	       (d->params.budget_mode == SKV_BUDGET_UNIFORM && d->params.fallback_below == 0.0f);
}

/* The budget mode's fields of a CompactRequest (120-129). */
static void budget_msg(const struct skv_params *p, Snapkv__V1__CompactRequest *cr)
{
	cr->budget_mode = (Snapkv__V1__BudgetMode)(p->budget_mode + 1);
	cr->n_layer_caps = p->n_layer_caps <= SKV_MAX_LAYER_CAPS ? p->n_layer_caps : 0;
	cr->layer_caps = (uint32_t *)p->layer_caps;
	cr->pyramid_r = p->pyramid_r;
	cr->head_floor = p->head_floor;
	cr->head_floor_given = true;
	cr->tau = p->tau;
	cr->c_min = p->c_min;
	cr->c_max = p->c_max;
	cr->c_step = p->c_step;
	cr->fallback_below = p->fallback_below;
}

static void mark_dead(struct skv_client *c, int r)
{
	if (!c->dead)
		c->dead = r == -EPIPE ? -ECONNRESET : r;
}

static uint32_t timeout_of(const struct skv_client *c)
{
	return __atomic_load_n(&c->timeout_ms, __ATOMIC_RELAXED);
}

/* The deadline of a call starting now (0: none). */
static uint64_t call_deadline(const struct skv_client *c)
{
	return skv_io_deadline(timeout_of(c));
}

/*
 * The daemon did not answer on the socket in time. A reply may still come,
 * and the next call would read it as its own: the connection is unusable,
 * so every later call fails with -ENOTCONN until skv_client_reconnect().
 */
static int socket_timeout(struct skv_client *c, const char *what)
{
	mark_dead(c, -ENOTCONN);
	return fail(c, -ETIMEDOUT, "snapkvd did not %s within %u ms (connection dropped)", what,
		    timeout_of(c));
}

SKV_EXPORT int skv_client_set_timeout(struct skv_client *c, uint32_t timeout_ms)
{
	if (!c)
		return -EINVAL;
	if (timeout_ms > SKV_IO_MAX_TIMEOUT_MS)
		return fail(c, -EINVAL, "timeout of %u ms is too long", timeout_ms);
	__atomic_store_n(&c->timeout_ms, timeout_ms, __ATOMIC_RELAXED);
	return 0;
}

SKV_EXPORT uint32_t skv_client_timeout(const struct skv_client *c)
{
	return c ? timeout_of(c) : 0;
}

/* ------------------------------------------------------------ socket RPCs */

/* One request and its reply over the socket, both by deadline dl (0: none).
 * Locked. */
static int rpc(struct skv_client *c, uint16_t type, const ProtobufCMessage *m, const int *fds,
	       unsigned n_fds, uint16_t want, ProtobufCMessage **ret, int *ret_fds,
	       unsigned *n_ret_fds, uint64_t dl)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *buf;
	struct skv_frame_hdr h;
	int r;

	if (c->dead)
		return fail(c, c->dead, "not connected to snapkvd");
	if (n > SKV_FRAME_MAX_PAYLOAD)
		return fail(c, -EMSGSIZE, "message of %zu bytes is too large", n);
	buf = malloc(n ? n : 1);
	if (!buf)
		return fail(c, -ENOMEM, "out of memory");
	protobuf_c_message_pack(m, buf);
	r = skv_io_send(c->fd, type, buf, n, fds, n_fds, dl);
	free(buf);
	if (r == -ETIMEDOUT)
		return socket_timeout(c, "take a request");
	if (r == -EMSGSIZE) /* nothing was sent: the session is fine */
		return fail(c, r,
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
				fail(c, r, "snapkvd: %s", e->error ? e->error : "error");
				snapkv__v1__error_notice__free_unpacked(e, NULL);
				mark_dead(c, r);
				return r;
			}
			if (e)
				snapkv__v1__error_notice__free_unpacked(e, NULL);
		}
		mark_dead(c, r);
		return fail(c, c->dead, "send to snapkvd: %s", strerror(-r));
	}
	for (;;) {
		unsigned nf = n_ret_fds ? *n_ret_fds : 0;

		/* one deadline for the whole reply: stray frames do not extend it */
		r = skv_io_recv(c->fd, c->rbuf, SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD, &h,
				ret_fds, &nf, dl);
		if (r == -ETIMEDOUT)
			return socket_timeout(c, "answer");
		if (r < 0) {
			mark_dead(c, r == -ECONNRESET ? -ECONNRESET : r);
			return fail(c, c->dead, "receive from snapkvd: %s", strerror(-r));
		}
		if (h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR) {
			Snapkv__V1__ErrorNotice *e =
			    snapkv__v1__error_notice__unpack(NULL, h.length, c->rbuf + 16);
			int st = e && e->status < 0 ? e->status : -EPROTO;

			fail(c, st, "snapkvd: %s", e && e->error ? e->error : "error");
			if (e)
				snapkv__v1__error_notice__free_unpacked(e, NULL);
			for (unsigned i = 0; i < nf; i++)
				close(ret_fds[i]);
			if (st != -EOPNOTSUPP)
				mark_dead(c, st);
			return st;
		}
		if (h.type != want) {
			for (unsigned i = 0; i < nf; i++)
				close(ret_fds[i]);
			continue; /* not ours: stray event */
		}
		if (n_ret_fds)
			*n_ret_fds = nf;
		break;
	}
	switch (want) {
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME:
		*ret =
		    (ProtobufCMessage *)snapkv__v1__welcome__unpack(NULL, h.length, c->rbuf + 16);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY:
		*ret = (ProtobufCMessage *)snapkv__v1__register_reply__unpack(NULL, h.length,
									      c->rbuf + 16);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY:
		*ret = (ProtobufCMessage *)snapkv__v1__unregister_reply__unpack(NULL, h.length,
										c->rbuf + 16);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE:
		*ret =
		    (ProtobufCMessage *)snapkv__v1__response__unpack(NULL, h.length, c->rbuf + 16);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY:
		*ret = (ProtobufCMessage *)snapkv__v1__cuda_arena__unpack(NULL, h.length,
									  c->rbuf + 16);
		break;
	default:
		*ret = NULL;
	}
	if (!*ret) {
		if (n_ret_fds)
			for (unsigned i = 0; i < *n_ret_fds; i++)
				close(ret_fds[i]);
		return fail(c, -EBADMSG, "malformed reply from snapkvd");
	}
	return 0;
}

/* ------------------------------------------------------------- connection */

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

static int do_register(struct skv_client *c, struct skv_buffer *b, uint64_t dl);

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
		return fail(c, -errno, "socket: %s", strerror(errno));
	/* frames up to the protocol's 1 MiB both ways, as far as the kernel lets */
	(void)skv_frame_size_socket(c->fd, NULL);
	strcpy(sa.sun_path, c->path);
	r = skv_io_connect(c->fd, &sa, dl);
	if (r == -ETIMEDOUT) {
		close(c->fd);
		c->fd = -1;
		c->dead = -ENOTCONN;
		return fail(c, r, "connect %s: snapkvd did not accept within %u ms", c->path,
			    timeout_of(c));
	}
	if (r < 0) {
		close(c->fd);
		c->fd = -1;
		c->dead = r == -ENOENT || r == -ECONNREFUSED ? -ENOTCONN : r;
		return fail(c, c->dead, "connect %s: %s", c->path, strerror(-r));
	}
	h.client_version = SKV_PROTO_VERSION;
	h.name = c->name;
	h.sq_entries = c->want_sq;
	r = rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, &h.base, NULL, 0,
		SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME, (ProtobufCMessage **)&w, fds, &nf, dl);
	if (r < 0)
		goto fail;
	if (nf != 4 || w->ring_bytes < sizeof(struct skv_ring_layout) || !w->arena_bytes) {
		r = fail(c, -EPROTO, "handshake: expected ring, arena and two eventfds");
		goto fail;
	}
	c->session_id = w->session_id;
	c->ring_bytes = w->ring_bytes;
	c->arena_bytes = w->arena_bytes;
	c->ring = mmap(NULL, c->ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (c->ring == MAP_FAILED) {
		c->ring = NULL;
		r = fail(c, -errno, "mmap ring: %s", strerror(errno));
		goto fail;
	}
	close(fds[0]);
	fds[0] = -1;
	memcpy(&c->layout, c->ring, sizeof(c->layout));
	r = skv_ring_layout_check(&c->layout, c->ring_bytes);
	if (r < 0) {
		fail(c, r, "ring layout from snapkvd is invalid");
		goto fail;
	}
	c->arena = mmap(NULL, c->arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	if (c->arena == MAP_FAILED) {
		c->arena = NULL;
		r = fail(c, -errno, "mmap arena: %s", strerror(errno));
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
		r = fail(c, -ENOMEM, "out of memory");
		goto fail;
	}
	snapkv__v1__welcome__free_unpacked(w, NULL);
	/* buffers the engine still holds are registered again */
	for (struct skv_buffer *b = c->buffers; b; b = b->next) {
		r = do_register(c, b, dl);
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
	return session_open(c, call_deadline(c));
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
	session_drop(c);
	r = session_open(c, call_deadline(c));
	pthread_mutex_unlock(&c->mu);
	return r;
}

/* ---------------------------------------------------------------- buffers */

/* UNREGISTER buffer `id`: 0 or -errno. Locked. */
static int unregister_id(struct skv_client *c, uint64_t id, uint64_t dl)
{
	Snapkv__V1__Unregister m = SNAPKV__V1__UNREGISTER__INIT;
	Snapkv__V1__UnregisterReply *rr = NULL;
	int r;

	m.buffer_id = id;
	r = rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER, &m.base, NULL, 0,
		SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY, (ProtobufCMessage **)&rr, NULL,
		NULL, dl);
	if (r == 0) {
		r = rr->status;
		snapkv__v1__unregister_reply__free_unpacked(rr, NULL);
	}
	return r;
}

static int do_register(struct skv_client *c, struct skv_buffer *b, uint64_t dl)
{
	Snapkv__V1__RegisterBuffer m = SNAPKV__V1__REGISTER_BUFFER__INIT;
	Snapkv__V1__RegisterReply *rr = NULL;
	int r;

	m.generation = ++c->generation;
	m.size = b->size;
	m.kind = (Snapkv__V1__BufferKind)b->kind;
	if (b->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC) {
		m.ipc_handle.data = b->ipc_handle;
		m.ipc_handle.len = sizeof(b->ipc_handle);
		m.offset = b->offset;
	}
	m.device = b->device;
	m.writable = (b->flags & SKV_BUFFER_WRITABLE) != 0;
	r = rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, &m.base, &b->fd, b->fd >= 0 ? 1 : 0,
		SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY, (ProtobufCMessage **)&rr, NULL, NULL,
		dl);
	if (r < 0)
		return r;
	r = rr->status;
	if (r < 0)
		fail(c, r, "register: %s", rr->error ? rr->error : "failed");
	else if (m.writable && !rr->writable) {
		/* a daemon older than writable buffers ignores the flag */
		unregister_id(c, rr->buffer_id, dl);
		r = fail(c, -EOPNOTSUPP, "register: this snapkvd does not take writable buffers");
	} else {
		b->id = rr->buffer_id;
		snprintf(b->transport, sizeof(b->transport), "%s",
			 rr->transport && rr->transport[0] ? rr->transport : "memfd");
	}
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	return r;
}

static int buffer_add_kind(struct skv_client *c, int fd, void *data, size_t size, bool own,
			   const struct skv_buffer *proto, struct skv_buffer **ret)
{
	struct skv_buffer *b = calloc(1, sizeof(*b));
	int r;

	if (!b)
		return fail(c, -ENOMEM, "out of memory");
	if (proto)
		*b = *proto;
	b->c = c;
	b->fd = fd;
	b->data = data;
	b->size = size;
	b->own = own;
	pthread_mutex_lock(&c->mu);
	r = do_register(c, b, call_deadline(c));
	if (r == 0) {
		b->next = c->buffers;
		c->buffers = b;
	}
	pthread_mutex_unlock(&c->mu);
	if (r < 0) {
		free(b);
		return r;
	}
	*ret = b;
	return 0;
}

static int check_flags(struct skv_client *c, uint32_t flags)
{
	if (flags & ~SKV_BUFFER_WRITABLE)
		return fail(c, -EINVAL, "unknown buffer flags 0x%x", flags & ~SKV_BUFFER_WRITABLE);
	return 0;
}

SKV_EXPORT int skv_buffer_alloc(struct skv_client *c, size_t size, struct skv_buffer **ret_buf)
{
	return skv_buffer_alloc_flags(c, size, 0, ret_buf);
}

SKV_EXPORT int skv_buffer_alloc_flags(struct skv_client *c, size_t size, uint32_t flags,
				      struct skv_buffer **ret_buf)
{
	struct skv_buffer k = {.flags = flags};
	void *p;
	int fd, r;

	if (!c || !size || !ret_buf)
		return fail(c, -EINVAL, "buffer size must be > 0");
	if ((r = check_flags(c, flags)))
		return r;
	fd = memfd_create("skv-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return fail(c, -errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		r = -errno;
		close(fd);
		return fail(c, r, "memfd: %s", strerror(-r));
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		close(fd);
		return fail(c, r, "mmap: %s", strerror(-r));
	}
	r = buffer_add_kind(c, fd, p, size, true, &k, ret_buf);
	if (r < 0) {
		munmap(p, size);
		close(fd);
	}
	return r;
}

SKV_EXPORT int skv_buffer_register_fd(struct skv_client *c, int memfd, size_t size,
				      struct skv_buffer **ret_buf)
{
	return skv_buffer_register_fd_flags(c, memfd, size, 0, ret_buf);
}

SKV_EXPORT int skv_buffer_register_fd_flags(struct skv_client *c, int memfd, size_t size,
					    uint32_t flags, struct skv_buffer **ret_buf)
{
	struct skv_buffer k = {.flags = flags};
	int fd, r;

	if (!c || memfd < 0 || !ret_buf)
		return fail(c, -EINVAL, "bad arguments");
	if ((r = check_flags(c, flags)))
		return r;
	fd = fcntl(memfd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return fail(c, -errno, "dup: %s", strerror(errno));
	r = buffer_add_kind(c, fd, NULL, size, false, &k, ret_buf);
	if (r < 0)
		close(fd);
	return r;
}

SKV_EXPORT int skv_buffer_register_cuda_fd(struct skv_client *c, int vmm_fd, size_t size,
					   int device, struct skv_buffer **ret_buf)
{
	return skv_buffer_register_cuda_fd_flags(c, vmm_fd, size, device, 0, ret_buf);
}

SKV_EXPORT int skv_buffer_register_cuda_fd_flags(struct skv_client *c, int vmm_fd, size_t size,
						 int device, uint32_t flags,
						 struct skv_buffer **ret_buf)
{
	struct skv_buffer k = {.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD,
			       .device = device,
			       .flags = flags};
	int fd, r;

	if (!c || vmm_fd < 0 || !size || !ret_buf)
		return fail(c, -EINVAL, "bad arguments");
	if ((r = check_flags(c, flags)))
		return r;
	fd = fcntl(vmm_fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return fail(c, -errno, "dup: %s", strerror(errno));
	r = buffer_add_kind(c, fd, NULL, size, false, &k, ret_buf);
	if (r < 0)
		close(fd);
	return r;
}

SKV_EXPORT int skv_buffer_register_cuda_ipc(struct skv_client *c, const void *ipc_handle64,
					    size_t offset, size_t size, int device,
					    struct skv_buffer **ret_buf)
{
	return skv_buffer_register_cuda_ipc_flags(c, ipc_handle64, offset, size, device, 0,
						  ret_buf);
}

SKV_EXPORT int skv_buffer_register_cuda_ipc_flags(struct skv_client *c, const void *ipc_handle64,
						  size_t offset, size_t size, int device,
						  uint32_t flags, struct skv_buffer **ret_buf)
{
	struct skv_buffer k = {.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC,
			       .offset = offset,
			       .device = device,
			       .flags = flags};
	int r;

	if (!c || !ipc_handle64 || !size || !ret_buf)
		return fail(c, -EINVAL, "bad arguments");
	if ((r = check_flags(c, flags)))
		return r;
	memcpy(k.ipc_handle, ipc_handle64, sizeof(k.ipc_handle));
	return buffer_add_kind(c, -1, NULL, size, false, &k, ret_buf);
}

SKV_EXPORT int skv_client_cuda_arena(struct skv_client *c, int *ret_fd, uint64_t *ret_size,
				     int *ret_device)
{
	Snapkv__V1__CudaArenaRequest m = SNAPKV__V1__CUDA_ARENA_REQUEST__INIT;
	Snapkv__V1__CudaArena *a = NULL;
	int fds[1] = {-1};
	unsigned nf = 1;
	int r;

	if (!c || !ret_fd || !ret_size)
		return fail(c, -EINVAL, "bad arguments");
	pthread_mutex_lock(&c->mu);
	r = rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA, &m.base, NULL, 0,
		SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY, (ProtobufCMessage **)&a, fds, &nf,
		call_deadline(c));
	pthread_mutex_unlock(&c->mu);
	if (r < 0)
		return r;
	r = a->status;
	if (r < 0)
		fail(c, r, "GPU arena: %s", a->error ? a->error : "failed");
	else if (nf != 1 || fds[0] < 0 || !a->size)
		r = fail(c, -EPROTO, "GPU arena: reply without an fd");
	if (r == 0) {
		*ret_fd = fds[0];
		*ret_size = a->size;
		if (ret_device)
			*ret_device = a->device;
	} else if (nf == 1 && fds[0] >= 0) {
		close(fds[0]);
	}
	snapkv__v1__cuda_arena__free_unpacked(a, NULL);
	return r;
}

SKV_EXPORT const char *skv_buffer_transport(const struct skv_buffer *b)
{
	return b && b->transport[0] ? b->transport : "";
}

SKV_EXPORT void *skv_buffer_data(const struct skv_buffer *b)
{
	return b ? b->data : NULL;
}

SKV_EXPORT size_t skv_buffer_size(const struct skv_buffer *b)
{
	return b ? b->size : 0;
}

SKV_EXPORT uint32_t skv_buffer_flags(const struct skv_buffer *b)
{
	return b ? b->flags : 0;
}

SKV_EXPORT int skv_buffer_restore(struct skv_buffer *b, uint64_t offset, uint64_t len)
{
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), mapped;
	void *p;

	if (!b || !b->own || !b->data || b->fd < 0 || !len || offset % pg)
		return -EINVAL;
	mapped = (b->size + pg - 1) / pg * pg;
	if (len > UINT64_MAX - pg)
		return -EINVAL;
	len = (len + pg - 1) / pg * pg;
	if (offset > mapped || len > mapped - offset)
		return -EINVAL;
	p = mmap((uint8_t *)b->data + offset, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
		 b->fd, (off_t)offset);
	return p == MAP_FAILED ? -errno : 0;
}

SKV_EXPORT uint64_t skv_buffer_id(const struct skv_buffer *b)
{
	return b ? b->id : 0;
}

SKV_EXPORT int skv_buffer_free(struct skv_buffer *b)
{
	struct skv_client *c;
	struct skv_buffer **pp;
	int r = 0;

	if (!b)
		return 0;
	c = b->c;
	pthread_mutex_lock(&c->mu);
	for (pp = &c->buffers; *pp; pp = &(*pp)->next)
		if (*pp == b) {
			*pp = b->next;
			break;
		}
	if (!c->dead)
		r = unregister_id(c, b->id, call_deadline(c));
	pthread_mutex_unlock(&c->mu);
	if (b->own && b->data)
		munmap(b->data, b->size);
	if (b->fd >= 0)
		close(b->fd);
	free(b);
	return r;
}

/* -------------------------------------------------------------- the ring */

/* Take every CQE; mark slots done. Locked. */
static int reap(struct skv_client *c)
{
	struct skv_cqe cqe;
	int r, n = 0;

	while ((r = skv_ring_consume(&c->cq, &cqe)) == 0) {
		uint32_t i = (uint32_t)(cqe.user_data & 0xffffffffu);
		struct slot *s;

		n++;
		if (cqe.flags & SKV_CQE_F_EVENT) {
			/* not a completion: remember the latest pressure event */
			if (cqe.user_data == SKV_EVENT_PRESSURE) {
				c->pressure.level = (uint32_t)cqe.res;
				c->pressure.suggested_capacity = cqe.slot;
				c->pressure.scale_permille = cqe.len;
				c->pressure.pool_used = cqe.reserved;
				c->pressure.events++;
			}
			continue;
		}
		if (i >= c->n_slots)
			continue;
		s = &c->slots[i];
		if (s->state != SLOT_PENDING || s->user_data != cqe.user_data)
			continue;
		s->res = cqe.res;
		if (cqe.len && cqe.len <= c->layout.arg_slot_size)
			s->resp = snapkv__v1__response__unpack(
			    NULL, cqe.len,
			    c->ring + c->layout.arg_off + (size_t)i * c->layout.arg_slot_size);
		s->state = SLOT_DONE;
		if (s->orphan) {
			if (s->resp)
				snapkv__v1__response__free_unpacked(s->resp, NULL);
			*s = (struct slot){0};
		}
	}
	if (r == -EBADMSG) {
		mark_dead(c, -EPROTO);
		return fail(c, -EPROTO, "completion ring corrupt");
	}
	/* CQ room again: a daemon that slept on our full CQ needs the doorbell
	 * if entries still wait in the SQ (W2, paired with the loop's W1). */
	if (n && skv_ring_needs_wakeup(&c->sq) &&
	    atomic_load_explicit(&c->sq.ctl->head, memory_order_acquire) != c->sq.local)
		(void)!eventfd_write(c->sq_efd, 1);
	return n;
}

/* Check the socket for a hang-up or an error notice while we wait. Locked. */
static int check_socket(struct skv_client *c, short revents)
{
	if (revents & (POLLHUP | POLLERR)) {
		mark_dead(c, -ECONNRESET);
		return fail(c, -ECONNRESET, "snapkvd closed the connection");
	}
	if (revents & POLLIN) {
		struct skv_frame_hdr h;
		unsigned nf = 0;
		int r = skv_frame_recv(c->fd, c->rbuf, SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD,
				       &h, NULL, &nf, MSG_DONTWAIT);

		if (r == -EAGAIN)
			return 0;
		if (r < 0 || h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR) {
			mark_dead(c, r < 0 ? r : -ECONNRESET);
			return fail(c, c->dead, "snapkvd closed the session");
		}
	}
	return 0;
}

/* Wait until slot i is done or deadline dl (0: none) passes (-ETIMEDOUT, the
 * slot still pending). Called locked; may drop the lock to sleep. */
static int wait_slot(struct skv_client *c, uint32_t i, uint64_t dl)
{
	uint64_t spin_end = skv_io_now_ns() + (uint64_t)c->spin_us * 1000;

	for (;;) {
		int r = reap(c);

		if (r < 0)
			return r;
		if (c->slots[i].state == SLOT_DONE)
			return 0;
		if (c->dead)
			return fail(c, c->dead, "snapkvd connection lost");
		/* one clock read per turn: this loop spins on the hot path */
		uint64_t now = skv_io_now_ns();

		if (dl && now >= dl)
			return fail(c, -ETIMEDOUT, "snapkvd did not complete the request in time");
		if (now < spin_end)
			continue;
		/* W1 on the CQ: the daemon writes cq_efd only if it sees the flag */
		r = skv_ring_prepare_sleep(&c->cq);
		if (r < 0) {
			mark_dead(c, -EPROTO);
			return fail(c, -EPROTO, "completion ring corrupt");
		}
		if (r == 0)
			continue;
		struct pollfd p[2] = {{c->cq_efd, POLLIN, 0}, {c->fd, POLLIN, 0}};
		int to = skv_io_poll_ms(dl);

		if (to < 0 || to > 1000)
			to = 1000;
		pthread_mutex_unlock(&c->mu);
		r = poll(p, 2, to);
		pthread_mutex_lock(&c->mu);
		skv_ring_clear_wakeup(&c->cq);
		if (r > 0 && (p[0].revents & POLLIN)) {
			uint64_t v;

			(void)!read(c->cq_efd, &v, sizeof(v));
		}
		if (r > 0 && p[1].revents) {
			r = check_socket(c, p[1].revents);
			if (r < 0) {
				reap(c); /* anything posted before the close still counts */
				if (c->slots[i].state == SLOT_DONE)
					return 0;
				return r;
			}
		}
		spin_end = skv_io_now_ns() + (uint64_t)c->spin_us * 1000;
	}
}

/* Nothing moved: give the daemon a moment, and notice if it is gone. Locked;
 * drops the lock while waiting. */
static int stall(struct skv_client *c)
{
	struct pollfd p = {c->fd, POLLIN, 0};
	int r;

	pthread_mutex_unlock(&c->mu);
	r = poll(&p, 1, 1);
	pthread_mutex_lock(&c->mu);
	if (c->dead)
		return fail(c, c->dead, "not connected to snapkvd");
	if (r > 0)
		return check_socket(c, p.revents);
	return 0;
}

/* The ring had no room for us until deadline dl: the daemon stopped taking
 * requests. Nothing was submitted; the ring itself is fine. */
static int ring_full_timeout(struct skv_client *c, uint64_t dl)
{
	if (!dl || skv_io_now_ns() < dl)
		return 0;
	return fail(c, -ETIMEDOUT, "snapkvd took no request within %u ms (ring full)",
		    timeout_of(c));
}

/* Take a slot and submit, waiting for room at most until dl (0: none).
 * Locked. For SKV_OP_REQUEST the Request is packed into the slot. */
static int submit(struct skv_client *c, uint8_t op, Snapkv__V1__Request *req, uint64_t dl,
		  uint32_t *ret_slot)
{
	struct skv_sqe sqe = {.opcode = op};
	uint32_t i;
	int r;

	if (c->dead)
		return fail(c, c->dead, "not connected to snapkvd");
	for (;;) {
		for (i = 0; i < c->n_slots; i++)
			if (c->slots[i].state == SLOT_FREE)
				break;
		if (i < c->n_slots)
			break;
		r = reap(c);
		if (r < 0)
			return r;
		if (r == 0 && ((r = ring_full_timeout(c, dl)) < 0 || (r = stall(c)) < 0))
			return r;
	}
	sqe.slot = i;
	sqe.user_data = (uint64_t)i | (++c->seq << 32);
	if (req) {
		size_t n = snapkv__v1__request__get_packed_size(req);

		if (n > c->layout.arg_slot_size)
			return fail(c, -EMSGSIZE,
				    "request of %zu bytes exceeds the %u-byte ring slot (raise "
				    "slot_bytes in snapkvd's config)",
				    n, c->layout.arg_slot_size);
		req->user_data = sqe.user_data;
		snapkv__v1__request__pack(req, c->ring + c->layout.arg_off +
						   (size_t)i * c->layout.arg_slot_size);
		sqe.len = (uint32_t)n;
	}
	c->slots[i] = (struct slot){.state = SLOT_PENDING, .user_data = sqe.user_data};
	while ((r = skv_ring_produce(&c->sq, &sqe)) == -EAGAIN) {
		/* the daemon is behind (or back-pressuring us): make room */
		if ((r = reap(c)) < 0 || (r = ring_full_timeout(c, dl)) < 0 || (r = stall(c)) < 0)
			break;
	}
	if (r < 0) {
		c->slots[i] = (struct slot){0};
		return fail(c, r == -EBADMSG ? -EPROTO : r, "submission ring unusable");
	}
	/* W2 on the SQ: ring the doorbell only when the daemon sleeps */
	if (skv_ring_needs_wakeup(&c->sq))
		(void)!eventfd_write(c->sq_efd, 1);
	*ret_slot = i;
	return 0;
}

/* A failed result r as the client's error: the daemon's message if it sent
 * one, else strerror. Returns r. */
static int result_fail(struct skv_client *c, int r, const Snapkv__V1__Response *resp)
{
	return fail(c, r, "%s", resp && resp->error && resp->error[0] ? resp->error : strerror(-r));
}

/* Take a finished slot's result; frees the slot. */
static int collect(struct skv_client *c, uint32_t i, Snapkv__V1__Response **ret_resp)
{
	struct slot *s = &c->slots[i];
	int r = s->res;

	if (r < 0)
		result_fail(c, r, s->resp);
	if (ret_resp && r == 0)
		*ret_resp = s->resp;
	else if (s->resp)
		snapkv__v1__response__free_unpacked(s->resp, NULL);
	*s = (struct slot){0};
	return r;
}

/* A wait on slot i failed (not by timeout): a late completion is dropped by
 * reap(), and one that already came is freed now. */
static void slot_give_up(struct skv_client *c, uint32_t i)
{
	c->slots[i].orphan = true;
	if (c->slots[i].state == SLOT_DONE)
		collect(c, i, NULL);
}

/* The ring did not complete a request by its deadline. The slot is left to
 * complete later (and be freed then); the ring stays usable. */
static int ring_timeout(struct skv_client *c, uint32_t i)
{
	c->slots[i].orphan = true;
	return fail(c, -ETIMEDOUT, "snapkvd did not complete the request within %u ms",
		    timeout_of(c));
}

/* Submit and wait, both by the client's deadline. Locked. */
static int call(struct skv_client *c, Snapkv__V1__Request *req, Snapkv__V1__Response **ret)
{
	uint64_t dl = call_deadline(c);
	uint32_t i;
	int r = submit(c, SKV_OP_REQUEST, req, dl, &i);

	if (r < 0)
		return r;
	r = wait_slot(c, i, dl);
	if (r == -ETIMEDOUT)
		return ring_timeout(c, i);
	if (r < 0) {
		slot_give_up(c, i);
		return r;
	}
	return collect(c, i, ret);
}

SKV_EXPORT int skv_client_nop(struct skv_client *c)
{
	uint64_t dl;
	uint32_t i;
	int r;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	dl = call_deadline(c);
	r = submit(c, SKV_OP_NOP, NULL, dl, &i);
	if (r == 0) {
		r = wait_slot(c, i, dl);
		if (r == 0)
			r = collect(c, i, NULL);
		else if (r == -ETIMEDOUT)
			r = ring_timeout(c, i);
		else
			c->slots[i].orphan = true;
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

SKV_EXPORT int skv_client_nop_socket(struct skv_client *c)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__NopRequest nop = SNAPKV__V1__NOP_REQUEST__INIT;
	Snapkv__V1__Response *resp = NULL;
	int r;

	if (!c)
		return -EINVAL;
	req.op_case = SNAPKV__V1__REQUEST__OP_NOP;
	req.nop = &nop;
	pthread_mutex_lock(&c->mu);
	r = rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, NULL, 0,
		SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE, (ProtobufCMessage **)&resp, NULL, NULL,
		call_deadline(c));
	if (r == 0) {
		r = resp->status;
		snapkv__v1__response__free_unpacked(resp, NULL);
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

SKV_EXPORT int skv_client_stats(struct skv_client *c, struct skv_stats *ret_stats)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__StatsRequest st = SNAPKV__V1__STATS_REQUEST__INIT;
	Snapkv__V1__Response *resp = NULL;
	int r;

	if (!c || !ret_stats)
		return -EINVAL;
	req.op_case = SNAPKV__V1__REQUEST__OP_STATS;
	req.stats = &st;
	pthread_mutex_lock(&c->mu);
	r = call(c, &req, &resp);
	pthread_mutex_unlock(&c->mu);
	if (r < 0)
		return r;
	if (resp->result_case != SNAPKV__V1__RESPONSE__RESULT_STATS) {
		snapkv__v1__response__free_unpacked(resp, NULL);
		return fail(c, -EPROTO, "unexpected reply");
	}
	*ret_stats = (struct skv_stats){
	    .caches = resp->stats->caches,
	    .buffers = resp->stats->buffers,
	    .arena_used = resp->stats->arena_used,
	    .arena_bytes = resp->stats->arena_bytes,
	    .requests = resp->stats->requests,
	    .errors = resp->stats->errors,
	    .pool_total = resp->stats->pool_total,
	    .pool_used = resp->stats->pool_used,
	};
	snapkv__v1__response__free_unpacked(resp, NULL);
	return 0;
}

/* ------------------------------------------------------------- compaction */

static void tensor_msg(const struct skv_tensor_ref *t, Snapkv__V1__TensorRef *m)
{
	snapkv__v1__tensor_ref__init(m);
	m->buffer_id = t->buf ? t->buf->id : 0;
	m->offset = t->offset;
	m->dtype = (Snapkv__V1__DType)t->dtype;
	m->head_stride = t->head_stride;
	m->token_stride = t->token_stride;
	m->block_size = t->block_size;
	m->block_stride = t->block_stride;
}

static int wait_flag(struct skv_compact_desc *d, const struct skv_buffer *flag_buf, uint64_t offset,
		     uint32_t value, uint32_t timeout_ms)
{
	if (!d || !flag_buf || offset % 4 ||
	    d->desc_size <
		offsetof(struct skv_compact_desc, wait_ipc_event) + sizeof(d->wait_ipc_event))
		return -EINVAL;
	d->prefill_wait = SKV_WAIT_CUDA_FLAG;
	d->wait_buffer = flag_buf;
	d->wait_offset = offset;
	d->wait_value = value;
	d->wait_timeout_ms = timeout_ms;
	return 0;
}

static int wait_event(struct skv_compact_desc *d, const void *ipc_handle, uint32_t timeout_ms)
{
	if (!d || !ipc_handle ||
	    d->desc_size <
		offsetof(struct skv_compact_desc, wait_ipc_event) + sizeof(d->wait_ipc_event))
		return -EINVAL;
	d->prefill_wait = SKV_WAIT_CUDA_IPC_EVENT;
	d->wait_buffer = NULL;
	d->wait_offset = 0;
	d->wait_value = 0;
	memcpy(d->wait_ipc_event, ipc_handle, sizeof(d->wait_ipc_event));
	d->wait_timeout_ms = timeout_ms;
	return 0;
}

/* ------------------------------------------------ decision groups (1.7) */

#define DESC_GROUP_END (offsetof(struct skv_compact_desc, group_timeout_ms) + sizeof(uint32_t))

/* The group fields of d, when desc_size covers them; else no group. */
static void desc_group(const struct skv_compact_desc *d, const char **key, uint32_t *size,
		       uint32_t *timeout_ms)
{
	bool has = d->desc_size >= DESC_GROUP_END;

	*key = has && d->group_key && d->group_key[0] ? d->group_key : NULL;
	*size = has ? d->group_size : 0;
	*timeout_ms = has ? d->group_timeout_ms : 0;
}

/* What the daemon checks first, checked here with a clear message: the
 * key's length and bytes, a size with the key and a key with the size. */
static int group_check(struct skv_client *c, const char *key, uint32_t size)
{
	size_t n;

	if (!key && !size)
		return 0;
	if (!key)
		return fail(c, -EINVAL,
			    "group_size %u without a group_key (a decision group needs both)",
			    size);
	n = strnlen(key, SKV_MAX_GROUP_KEY + 1);
	if (n > SKV_MAX_GROUP_KEY)
		return fail(c, -EINVAL, "group_key is longer than %u bytes", SKV_MAX_GROUP_KEY);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e)
			return fail(c, -EINVAL,
				    "group_key: byte %zu (0x%02x) is not printable ASCII", i,
				    (unsigned char)key[i]);
	if (!size)
		return fail(c, -EINVAL,
			    "group_size 0 with group_key \"%s\": a decision group needs its "
			    "size (1..max_group_size)",
			    key);
	return 0;
}

SKV_EXPORT int skv_compact_desc_group(struct skv_compact_desc *d, const char *key, uint32_t size,
				      uint32_t timeout_ms)
{
	if (!d || !key || !key[0] || d->desc_size < DESC_GROUP_END || group_check(NULL, key, size))
		return -EINVAL;
	d->group_key = key;
	d->group_size = size;
	d->group_timeout_ms = timeout_ms;
	return 0;
}

static void wb_free(struct skv_wb *w)
{
	if (!w)
		return;
	free(w->data);
	free(w->size);
	free(w->table);
	free(w);
}

static void request_free(struct skv_request *rq)
{
	if (!rq)
		return;
	wb_free(rq->wb);
	free(rq);
}

/* The messages paged_fields() allocates; the caller frees them. */
struct paged_msgs {
	Snapkv__V1__OutLayerRef *ol, **olp;
	Snapkv__V1__TensorRef *tr;
};

static void paged_msgs_free(struct paged_msgs *m)
{
	free(m->ol);
	free(m->olp);
	free(m->tr);
}

/* The writeback destination as the cache will need it: each pool's mapping. */
static int wb_new(const struct skv_compact_desc *d, struct skv_wb **ret)
{
	struct skv_wb *w = calloc(1, sizeof(*w));

	if (!w)
		return -ENOMEM;
	w->layers = d->layers;
	w->n_table = d->out_n_blocks;
	w->data = calloc((size_t)d->layers * 2, sizeof(*w->data));
	w->size = calloc((size_t)d->layers * 2, sizeof(*w->size));
	w->table = malloc(((size_t)d->out_n_blocks + 1) * sizeof(int32_t));
	if (!w->data || !w->size || !w->table) {
		wb_free(w);
		return -ENOMEM;
	}
	if (d->out_n_blocks)
		memcpy(w->table, d->out_block_table, d->out_n_blocks * sizeof(int32_t));
	for (uint32_t l = 0; l < d->layers; l++)
		for (unsigned t = 0; t < 2; t++) {
			const struct skv_buffer *b =
			    t ? d->out_layer[l].v.buf : d->out_layer[l].k.buf;

			w->data[2 * l + t] = b ? b->data : NULL;
			w->size[2 * l + t] = b ? b->size : 0;
		}
	*ret = w;
	return 0;
}

/*
 * The SNAPKV_1.5 fields of d into cr (when desc_size covers them): block
 * size and destination; for writeback the destination pools and table, and
 * *ret_wb for the cache. The daemon judges the values.
 */
static int paged_fields(struct skv_client *c, const struct skv_compact_desc *d,
			Snapkv__V1__CompactRequest *cr, struct paged_msgs *m,
			struct skv_wb **ret_wb)
{
	if (d->desc_size <
	    offsetof(struct skv_compact_desc, out_n_blocks) + sizeof(d->out_n_blocks))
		return 0;
	cr->out_block_size = d->out_block_size;
	if (d->out_dest == SKV_OUT_ARENA)
		return 0;
	if (d->out_dest != SKV_OUT_WRITEBACK)
		return fail(c, -EINVAL, "unknown out_dest %d", (int)d->out_dest);
	cr->out_dest = SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK;
	if (!d->out_layer || (d->out_n_blocks && !d->out_block_table))
		return fail(c, -EINVAL, "writeback needs out_layer[layers] and out_block_table");
	m->ol = calloc(d->layers, sizeof(*m->ol));
	m->olp = calloc(d->layers, sizeof(*m->olp));
	m->tr = calloc((size_t)d->layers * 2, sizeof(*m->tr));
	if (!m->ol || !m->olp || !m->tr || wb_new(d, ret_wb) < 0)
		return fail(c, -ENOMEM, "out of memory");
	for (uint32_t l = 0; l < d->layers; l++) {
		snapkv__v1__out_layer_ref__init(&m->ol[l]);
		tensor_msg(&d->out_layer[l].k, &m->tr[2 * l]);
		tensor_msg(&d->out_layer[l].v, &m->tr[2 * l + 1]);
		m->ol[l].k = &m->tr[2 * l];
		m->ol[l].v = &m->tr[2 * l + 1];
		m->olp[l] = &m->ol[l];
	}
	cr->n_out_layer = d->layers;
	cr->out_layer = m->olp;
	cr->n_out_block_table = d->out_n_blocks;
	cr->out_block_table = (int32_t *)d->out_block_table;
	return 0;
}

/* The wait helpers on a description of either layout. */
SKV_EXPORT int skv_compact_desc_wait_flag(struct skv_compact_desc *d,
					  const struct skv_buffer *flag_buf, uint64_t offset,
					  uint32_t value, uint32_t timeout_ms)
{
	struct skv_compact_desc tmp;
	int r;

	if (!d || !desc_is_v1(d))
		return wait_flag(d, flag_buf, offset, value, timeout_ms);
	r = wait_flag((struct skv_compact_desc *)desc_current(d, &tmp), flag_buf, offset, value,
		      timeout_ms);
	if (r == 0)
		desc_store_v1(d, &tmp);
	return r;
}

SKV_EXPORT int skv_compact_desc_wait_event(struct skv_compact_desc *d, const void *ipc_handle,
					   uint32_t timeout_ms)
{
	struct skv_compact_desc tmp;
	int r;

	if (!d || !desc_is_v1(d))
		return wait_event(d, ipc_handle, timeout_ms);
	r = wait_event((struct skv_compact_desc *)desc_current(d, &tmp), ipc_handle, timeout_ms);
	if (r == 0)
		desc_store_v1(d, &tmp);
	return r;
}

static int compact_submit(struct skv_client *c, const struct skv_compact_desc *d,
			  struct skv_request **ret_req);

SKV_EXPORT int skv_compact_submit(struct skv_client *c, const struct skv_compact_desc *d,
				  struct skv_request **ret_req)
{
	struct skv_compact_desc tmp;
	const char *key;
	uint32_t size, timeout_ms;

	if (!c || !d || !ret_req)
		return fail(c, -EINVAL, "compaction needs a description with layers");
	d = desc_current(d, &tmp);
	if (!desc_budget_plain(d) && d->params.n_layer_caps > SKV_MAX_LAYER_CAPS)
		return fail(c, -EINVAL, "%u per-layer budgets, at most %u", d->params.n_layer_caps,
			    SKV_MAX_LAYER_CAPS);
	/* the wire's mode is ours + 1, and its 0 means uniform: an unknown mode
	 * must not travel as one */
	if (!desc_budget_plain(d) && (unsigned)d->params.budget_mode > SKV_BUDGET_MASS_HEADS)
		return fail(c, -EINVAL, "unknown budget mode %d", (int)d->params.budget_mode);
	desc_group(d, &key, &size, &timeout_ms);
	if (group_check(c, key, size) < 0)
		return -EINVAL;
	return compact_submit(c, d, ret_req);
}

static int compact_submit(struct skv_client *c, const struct skv_compact_desc *d,
			  struct skv_request **ret_req)
{
	struct paged_msgs pgm = {0};
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__CompactRequest cr = SNAPKV__V1__COMPACT_REQUEST__INIT;
	Snapkv__V1__Params pm = SNAPKV__V1__PARAMS__INIT;
	Snapkv__V1__PrefillWait pw;
	Snapkv__V1__Range rg[SKV_MAX_PROTECTED], *rgp[SKV_MAX_PROTECTED];
	Snapkv__V1__LayerRef *lr = NULL, **lrp = NULL;
	Snapkv__V1__TensorRef *tr = NULL;
	struct skv_request *rq;
	const char *gkey;
	uint32_t slot;
	int r;

	if (!c || !d || !ret_req || !d->layer || !d->layers)
		return fail(c, -EINVAL, "compaction needs a description with layers");
	if (d->params.n_protected > SKV_MAX_PROTECTED)
		return fail(c, -EINVAL, "too many protected ranges");
	rq = calloc(1, sizeof(*rq));
	lr = calloc(d->layers, sizeof(*lr));
	lrp = calloc(d->layers, sizeof(*lrp));
	tr = calloc((size_t)d->layers * 3, sizeof(*tr));
	if (!rq || !lr || !lrp || !tr) {
		r = fail(c, -ENOMEM, "out of memory");
		goto out;
	}
	cr.layers = d->layers;
	cr.h_q = d->shape.h_q;
	cr.h_kv = d->shape.h_kv;
	cr.head_dim = d->shape.head_dim;
	cr.prompt_len = d->shape.prompt_len;
	cr.n_q = d->shape.n_q;
	pm.policy = (Snapkv__V1__Policy)d->params.policy;
	pm.window = d->params.window;
	pm.capacity = d->params.capacity;
	pm.kernel = d->params.kernel;
	pm.pooling = (Snapkv__V1__Pooling)d->params.pooling;
	pm.gqa = (Snapkv__V1__Gqa)d->params.gqa;
	pm.sinks = d->params.sinks;
	/* The caller's params are complete (skv_client_params_init): a 0 is
	 * meant, never "use the default". */
	pm.explicit_fields = SKV_PARAMS_EXPLICIT_ALL;
	pm.n_protected_ranges = d->params.n_protected;
	pm.protected_ranges = rgp;
	for (uint32_t i = 0; i < d->params.n_protected; i++) {
		snapkv__v1__range__init(&rg[i]);
		rg[i].begin = d->params.protected_ranges[i].begin;
		rg[i].end = d->params.protected_ranges[i].end;
		rgp[i] = &rg[i];
	}
	cr.params = &pm;
	if (!desc_budget_plain(d))
		budget_msg(&d->params, &cr);
	for (uint32_t l = 0; l < d->layers; l++) {
		snapkv__v1__layer_ref__init(&lr[l]);
		tensor_msg(&d->layer[l].q, &tr[3 * l]);
		tensor_msg(&d->layer[l].k, &tr[3 * l + 1]);
		tensor_msg(&d->layer[l].v, &tr[3 * l + 2]);
		lr[l].q = d->shape.n_q ? &tr[3 * l] : NULL;
		lr[l].k = &tr[3 * l + 1];
		lr[l].v = &tr[3 * l + 2];
		lrp[l] = &lr[l];
	}
	cr.n_layer = d->layers;
	cr.layer = lrp;
	cr.out_layout = (Snapkv__V1__Layout)d->out_layout;
	cr.decode_reserve = d->decode_reserve;
	cr.n_block_table = d->block_table ? d->n_blocks : 0;
	cr.block_table = (int32_t *)d->block_table;
	cr.evictable = !!d->evictable;
	if (d->desc_size >= offsetof(struct skv_compact_desc, out_arena) + sizeof(d->out_arena) &&
	    d->out_arena == SKV_ARENA_CUDA)
		cr.out_arena = SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM;
	if (d->desc_size >=
		offsetof(struct skv_compact_desc, wait_ipc_event) + sizeof(d->wait_ipc_event) &&
	    d->prefill_wait != SKV_WAIT_NONE) {
		snapkv__v1__prefill_wait__init(&pw);
		pw.kind = (Snapkv__V1__PrefillWaitKind)d->prefill_wait;
		pw.buffer_id = d->wait_buffer ? d->wait_buffer->id : 0;
		pw.offset = d->wait_offset;
		pw.value = d->wait_value;
		pw.timeout_ms = d->wait_timeout_ms;
		if (d->prefill_wait == SKV_WAIT_CUDA_IPC_EVENT) {
			pw.ipc_event.data = (uint8_t *)d->wait_ipc_event;
			pw.ipc_event.len = sizeof(d->wait_ipc_event);
		}
		cr.prefill_wait = &pw;
	}
	desc_group(d, &gkey, &cr.group_size, &cr.group_timeout_ms);
	if (gkey)
		cr.group_key = (char *)gkey;
	r = paged_fields(c, d, &cr, &pgm, &rq->wb);
	if (r < 0)
		goto out;
	req.op_case = SNAPKV__V1__REQUEST__OP_COMPACT;
	req.compact = &cr;
	pthread_mutex_lock(&c->mu);
	rq->c = c;
	if (c->ring && snapkv__v1__request__get_packed_size(&req) > c->layout.arg_slot_size) {
		/* e.g. a long block table: the socket takes up to 1 MiB. The
		 * call completes before returning; wait/poll see it done. */
		Snapkv__V1__Response *resp = NULL;

		rq->sync = true;
		r = rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, NULL, 0,
			SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE, (ProtobufCMessage **)&resp, NULL,
			NULL, call_deadline(c));
		if (r == 0) {
			rq->sync_res = resp->status;
			rq->sync_resp = resp;
			if (resp->status < 0)
				result_fail(c, resp->status, resp);
		}
	} else {
		r = submit(c, SKV_OP_REQUEST, &req, call_deadline(c), &slot);
		if (r == 0) {
			rq->slot = slot;
			rq->user_data = c->slots[slot].user_data;
		}
	}
	pthread_mutex_unlock(&c->mu);
out:
	paged_msgs_free(&pgm);
	free(lr);
	free(lrp);
	free(tr);
	if (r < 0) {
		request_free(rq);
		return r;
	}
	*ret_req = rq;
	return 0;
}

/*
 * The request's slot, or NULL when the session it was submitted on is gone
 * (skv_client_reconnect after a timeout or the daemon's death): it can never
 * complete, and its slot index may belong to a request of the new session
 * (user_data, unique across sessions, tells them apart) or to no ring at all.
 * Locked.
 */
static struct slot *request_slot(struct skv_client *c, const struct skv_request *rq)
{
	if (!c->slots || rq->slot >= c->n_slots || c->slots[rq->slot].user_data != rq->user_data)
		return NULL;
	return &c->slots[rq->slot];
}

SKV_EXPORT int skv_request_poll(struct skv_request *rq)
{
	struct skv_client *c;
	int r;

	if (!rq)
		return -EINVAL;
	c = rq->c;
	if (rq->sync)
		return rq->sync_res < 0 ? rq->sync_res : 1;
	pthread_mutex_lock(&c->mu);
	if (!request_slot(c, rq)) {
		r = fail(c, c->dead ? c->dead : -ENOTCONN, "the request's session is gone");
	} else {
		r = reap(c);
		if (r >= 0)
			r = c->slots[rq->slot].state == SLOT_DONE ? 1 : (c->dead ? c->dead : 0);
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

static void cache_free(struct skv_cache *k)
{
	if (!k)
		return;
	wb_free(k->wb);
	free(k->k_off);
	free(k->v_off);
	free(k->pos_off);
	free(k->mass);
	free(k->hkept);
	free(k->hstart);
	free(k->lmass);
	free(k);
}

/*
 * The bytes of one layer's K (= V) that must lie in the arena: the dense
 * tensor, a paged arena cache's run (which must hold its blocks), 0 for
 * writeback (the engine's buffers). -EPROTO for a paged description that
 * does not add up.
 */
static int cache_kv_bytes(struct skv_client *c, const Snapkv__V1__CacheInfo *ci, uint64_t es,
			  uint64_t *ret)
{
	uint64_t blocks;

	if (ci->layout != SNAPKV__V1__LAYOUT__LAYOUT_PAGED) {
		*ret = (uint64_t)ci->h_store * ci->capacity * ci->head_dim * es;
		return 0;
	}
	if (!ci->block_size || ci->block_size > SKV_MAX_OUT_BLOCK_SIZE || ci->block_stride < 0)
		return fail(c, -EPROTO, "malformed paged cache description");
	if (ci->out_dest == SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK) {
		*ret = 0;
		return 0;
	}
	if ((uint64_t)ci->n_blocks * ci->block_size < ci->capacity ||
	    __builtin_mul_overflow((uint64_t)ci->n_blocks, (uint64_t)ci->block_stride, &blocks) ||
	    __builtin_mul_overflow(blocks, es, &blocks) || blocks > ci->run_bytes)
		return fail(c, -EPROTO, "paged cache: its blocks do not fit its runs");
	*ret = ci->run_bytes;
	return 0;
}

/*
 * The budget outcome of a CacheInfo (120-128): the per-head counts, and a
 * ragged cache's head blocks, each inside its layer's K/V (h_store x
 * capacity rows, checked against the arena by the caller).
 */
static int cache_budget_from_info(struct skv_client *c, const Snapkv__V1__CacheInfo *ci,
				  struct skv_cache *k)
{
	size_t nm = (size_t)ci->layers * ci->h_store;
	uint64_t rows = (uint64_t)ci->h_store * ci->capacity, tot = 0;
	uint32_t mn = UINT32_MAX;

	if (!ci->budget_mode)
		return 0;
	if (ci->n_head_kept != nm || ci->n_layer_mass_min != ci->layers ||
	    ci->n_layer_mass_mean != ci->layers || (ci->ragged && ci->n_head_start != nm) ||
	    ci->budget_mode > SNAPKV__V1__BUDGET_MODE__BUDGET_MODE_MASS_HEADS)
		return fail(c, -EPROTO, "malformed budget description");
	for (size_t i = 0; i < nm; i++) {
		uint64_t cap = (uint64_t)ci->head_kept[i] + ci->capacity - ci->kept;

		if (ci->head_kept[i] > ci->kept ||
		    (ci->ragged && (ci->head_start[i] > rows || cap > rows - ci->head_start[i])))
			return fail(c, -EPROTO, "budget description: a head outside its layer");
		tot += ci->head_kept[i];
		mn = ci->head_kept[i] < mn ? ci->head_kept[i] : mn;
	}
	k->hkept = malloc(nm * sizeof(*k->hkept));
	k->hstart = ci->ragged ? malloc(nm * sizeof(*k->hstart)) : NULL;
	k->lmass = malloc((size_t)ci->layers * 2 * sizeof(float));
	if (!k->hkept || (ci->ragged && !k->hstart) || !k->lmass)
		return fail(c, -ENOMEM, "out of memory");
	memcpy(k->hkept, ci->head_kept, nm * sizeof(*k->hkept));
	if (ci->ragged)
		memcpy(k->hstart, ci->head_start, nm * sizeof(*k->hstart));
	memcpy(k->lmass, ci->layer_mass_min, ci->layers * sizeof(float));
	memcpy(k->lmass + ci->layers, ci->layer_mass_mean, ci->layers * sizeof(float));
	k->budget = (struct skv_cache_budget){
	    .budget_size = sizeof(k->budget),
	    .mode = (enum skv_budget)(ci->budget_mode - 1),
	    .c_star = ci->c_star,
	    .fallback = ci->fallback,
	    .ragged = ci->ragged,
	    .mass_min = ci->mass_min,
	    .kept_min = nm ? mn : 0,
	    .kept_mean = nm ? (float)((double)tot / (double)nm) : 0.0f,
	};
	return 0;
}

/* Adopt a CacheInfo: every offset checked against the arena we mapped. */
static int cache_from_info(struct skv_client *c, const Snapkv__V1__CacheInfo *ci,
			   struct skv_cache *k)
{
	uint64_t es = ci->dtype == SNAPKV__V1__DTYPE__D_TYPE_F32 ? 4 : 2;
	uint64_t kv = 0;
	uint64_t pos = (uint64_t)ci->h_store * ci->capacity * 4;
	size_t nm = (size_t)ci->layers * ci->h_store;
	bool wb = ci->layout == SNAPKV__V1__LAYOUT__LAYOUT_PAGED &&
		  ci->out_dest == SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK;
	int r;

	if (!ci->layers || ci->n_k_offset != ci->layers || ci->n_v_offset != ci->layers ||
	    ci->n_pos_offset != ci->layers || ci->n_retained_mass != nm)
		return fail(c, -EPROTO, "malformed cache description");
	if ((r = cache_kv_bytes(c, ci, es, &kv)) < 0)
		return r;
	for (uint32_t l = 0; l < ci->layers; l++)
		if ((!wb &&
		     (ci->k_offset[l] > c->arena_bytes || kv > c->arena_bytes - ci->k_offset[l] ||
		      ci->v_offset[l] > c->arena_bytes || kv > c->arena_bytes - ci->v_offset[l])) ||
		    ci->pos_offset[l] > c->arena_bytes || pos > c->arena_bytes - ci->pos_offset[l])
			return fail(c, -EPROTO, "cache outside the arena");
	free(k->k_off);
	free(k->v_off);
	free(k->pos_off);
	free(k->mass);
	free(k->hkept);
	free(k->hstart);
	free(k->lmass);
	k->hkept = NULL;
	k->hstart = NULL;
	k->lmass = NULL;
	k->budget = (struct skv_cache_budget){
	    .budget_size = sizeof(k->budget), .mode = SKV_BUDGET_UNIFORM, .c_star = ci->budget};
	k->k_off = malloc(ci->layers * sizeof(uint64_t));
	k->v_off = malloc(ci->layers * sizeof(uint64_t));
	k->pos_off = malloc(ci->layers * sizeof(uint64_t));
	k->mass = malloc(nm * sizeof(float));
	if (!k->k_off || !k->v_off || !k->pos_off || !k->mass)
		return fail(c, -ENOMEM, "out of memory");
	memcpy(k->k_off, ci->k_offset, ci->layers * sizeof(uint64_t));
	memcpy(k->v_off, ci->v_offset, ci->layers * sizeof(uint64_t));
	memcpy(k->pos_off, ci->pos_offset, ci->layers * sizeof(uint64_t));
	memcpy(k->mass, ci->retained_mass, nm * sizeof(float));
	k->c = c;
	k->session_id = c->session_id;
	k->arena = c->arena;
	k->info = (struct skv_cache_info){
	    .id = ci->cache_id,
	    .layers = ci->layers,
	    .h_store = ci->h_store,
	    .head_dim = ci->head_dim,
	    .dtype = (enum skv_dtype)ci->dtype,
	    .layout = (enum skv_layout)ci->layout,
	    .prompt_len = ci->prompt_len,
	    .kept = ci->kept,
	    .capacity = ci->capacity,
	    .appended = ci->appended,
	    .budget = ci->budget,
	    .head_stride = ci->head_stride,
	    .token_stride = ci->token_stride,
	    .requested_budget = ci->requested_budget ? ci->requested_budget : ci->budget,
	    .budget_scaled = ci->budget_scaled,
	    .pressure = ci->pressure,
	    .kv_arena = ci->kv_arena == SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM
			    ? SKV_ARENA_CUDA
			    : SKV_ARENA_HOST,
	};
	if ((r = cache_budget_from_info(c, ci, k)) < 0)
		return r;
	k->budget.group_size = ci->group_size;
	k->budget.group_wait_us = ci->group_wait_us;
	if (ci->layout == SNAPKV__V1__LAYOUT__LAYOUT_PAGED) {
		k->info.block_size = ci->block_size;
		k->info.n_blocks = ci->n_blocks;
		k->info.block_stride = ci->block_stride;
		k->info.out_dest = wb ? SKV_OUT_WRITEBACK : SKV_OUT_ARENA;
		k->run_bytes = wb ? 0 : ci->run_bytes;
	}
	return 0;
}

SKV_EXPORT int skv_request_wait(struct skv_request *rq, int timeout_ms,
				struct skv_cache **ret_cache)
{
	struct skv_client *c;
	Snapkv__V1__Response *resp = NULL;
	struct skv_cache *k = NULL;
	int r;

	if (!rq)
		return -EINVAL;
	c = rq->c;
	pthread_mutex_lock(&c->mu);
	if (rq->sync) {
		resp = rq->sync_resp;
		r = rq->sync_res;
		if (r < 0)
			result_fail(c, r, resp);
		goto result;
	}
	if (!request_slot(c, rq)) {
		r = fail(c, c->dead ? c->dead : -ENOTCONN, "the request's session is gone");
		goto out;
	}
	r = wait_slot(c, rq->slot,
		      timeout_ms < 0 ? 0 : skv_io_now_ns() + (uint64_t)timeout_ms * 1000000u);
	if (r == -ETIMEDOUT) {
		pthread_mutex_unlock(&c->mu);
		return r;
	}
	if (r < 0) {
		slot_give_up(c, rq->slot);
		goto out;
	}
	r = collect(c, rq->slot, &resp);
result:
	/* the daemon's -ETIMEDOUT (a prefill wait not signalled in time, a
	 * decision group not complete in time) is
	 * -ETIME here: -ETIMEDOUT from this call means "not freed, wait again" */
	if (r == -ETIMEDOUT)
		r = -ETIME;
	if (r < 0)
		goto out;
	if (resp->result_case != SNAPKV__V1__RESPONSE__RESULT_CACHE) {
		r = fail(c, -EPROTO, "unexpected reply to COMPACT");
		goto out;
	}
	k = calloc(1, sizeof(*k));
	if (!k) {
		r = fail(c, -ENOMEM, "out of memory");
		goto out;
	}
	r = cache_from_info(c, resp->cache, k);
	if (r == 0 && k->info.out_dest == SKV_OUT_WRITEBACK) {
		if (!rq->wb || rq->wb->layers != k->info.layers) {
			r = fail(c, -EPROTO, "a writeback cache for a request that asked none");
		} else {
			k->wb = rq->wb;
			rq->wb = NULL;
		}
	}
out:
	if (resp)
		snapkv__v1__response__free_unpacked(resp, NULL);
	pthread_mutex_unlock(&c->mu);
	request_free(rq);
	if (r < 0) {
		cache_free(k);
		return r;
	}
	if (ret_cache)
		*ret_cache = k;
	else
		skv_cache_release(k);
	return 0;
}

SKV_EXPORT void skv_request_abandon(struct skv_request *rq)
{
	Snapkv__V1__Response *resp = NULL;
	struct skv_cache *k = NULL;
	struct skv_client *c;
	struct slot *s;

	if (!rq)
		return;
	c = rq->c;
	pthread_mutex_lock(&c->mu);
	if (rq->sync) {
		if (rq->sync_res == 0)
			resp = rq->sync_resp;
		else if (rq->sync_resp)
			snapkv__v1__response__free_unpacked(rq->sync_resp, NULL);
	} else if ((s = request_slot(c, rq))) {
		(void)reap(c);
		if (s->state == SLOT_DONE) {
			if (collect(c, rq->slot, &resp) < 0)
				resp = NULL;
		} else {
			s->orphan = true; /* reap() drops its completion */
		}
	}
	/* finished already: give its cache back now rather than at session end */
	if (resp && resp->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE) {
		k = calloc(1, sizeof(*k));
		if (k && cache_from_info(c, resp->cache, k) < 0) {
			cache_free(k);
			k = NULL;
		}
	}
	if (resp)
		snapkv__v1__response__free_unpacked(resp, NULL);
	pthread_mutex_unlock(&c->mu);
	request_free(rq);
	if (k)
		(void)skv_cache_release(k);
}

SKV_EXPORT int skv_client_compact(struct skv_client *c, const struct skv_compact_desc *d,
				  struct skv_cache **ret_cache)
{
	struct skv_request *rq;
	int r = skv_compact_submit(c, d, &rq);

	if (r < 0)
		return r;
	return skv_request_wait(rq, -1, ret_cache);
}

/* ----------------------------------------------------------------- caches */

SKV_EXPORT const struct skv_cache_info *skv_cache_info(const struct skv_cache *k)
{
	return k ? &k->info : NULL;
}

/* Elements from a layer's K/V start to (layer, head)'s slot 0: a ragged
 * head's start row, else head * head_stride. */
static int64_t head_elems(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	if (k->hstart)
		return (int64_t)k->hstart[(size_t)layer * k->info.h_store + head] *
		       k->info.token_stride;
	return (int64_t)head * k->info.head_stride;
}

static uint8_t *cache_ptr(const struct skv_cache *k, const uint64_t *offs, uint32_t layer,
			  uint32_t head)
{
	size_t es = k->info.dtype == SKV_DTYPE_F32 ? 4 : 2;

	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return NULL;
	return k->arena + offs[layer] + (size_t)head_elems(k, layer, head) * es;
}

SKV_EXPORT void *skv_cache_k(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	return k && k->info.kv_arena == SKV_ARENA_HOST && k->info.out_dest != SKV_OUT_WRITEBACK
		   ? cache_ptr(k, k->k_off, layer, head)
		   : NULL;
}

SKV_EXPORT void *skv_cache_v(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	return k && k->info.kv_arena == SKV_ARENA_HOST && k->info.out_dest != SKV_OUT_WRITEBACK
		   ? cache_ptr(k, k->v_off, layer, head)
		   : NULL;
}

static int64_t cache_off(const struct skv_cache *k, const uint64_t *offs, uint32_t layer,
			 uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return -1;
	return (int64_t)(offs[layer] + (uint64_t)head_elems(k, layer, head) *
					   (k->info.dtype == SKV_DTYPE_F32 ? 4 : 2));
}

SKV_EXPORT int64_t skv_cache_k_offset(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	return k ? cache_off(k, k->k_off, layer, head) : -1;
}

SKV_EXPORT int64_t skv_cache_v_offset(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	return k ? cache_off(k, k->v_off, layer, head) : -1;
}

/* ------------------------------------------- any layout, paged (1.5) */

static size_t cache_es(const struct skv_cache *k)
{
	return k->info.dtype == SKV_DTYPE_F32 ? 4 : 2;
}

/* Element offset of slot `slot` of head h within a (paged) pool or dense tensor. */
static int64_t slot_elems(const struct skv_cache *k, uint32_t h, uint32_t slot, int64_t block)
{
	const struct skv_cache_info *i = &k->info;

	if (i->layout != SKV_LAYOUT_PAGED)
		return (int64_t)slot * i->token_stride; /* + head_elems() */
	return block * i->block_stride + (int64_t)(slot % i->block_size) * i->token_stride +
	       (int64_t)h * i->head_stride;
}

static void *cache_slot(const struct skv_cache *k, enum skv_kv kv, uint32_t layer, uint32_t head,
			uint32_t slot)
{
	const struct skv_cache_info *i;
	const uint64_t *offs;
	size_t es, row;

	if (!k || layer >= k->info.layers || head >= k->info.h_store ||
	    slot >= skv_cache_head_capacity(k, layer, head))
		return NULL;
	i = &k->info;
	es = cache_es(k);
	row = (size_t)i->head_dim * es;
	offs = kv == SKV_KV_V ? k->v_off : k->k_off;
	if (i->layout == SKV_LAYOUT_PAGED && i->out_dest == SKV_OUT_WRITEBACK) {
		uint32_t j = slot / i->block_size;
		size_t t = 2 * (size_t)layer + (kv == SKV_KV_V);
		uint64_t at;

		if (!k->wb || j >= k->wb->n_table || !k->wb->data[t])
			return NULL;
		at = offs[layer] + (uint64_t)slot_elems(k, head, slot, k->wb->table[j]) * es;
		if (at > k->wb->size[t] || row > k->wb->size[t] - at)
			return NULL;
		return k->wb->data[t] + at;
	}
	if (i->kv_arena != SKV_ARENA_HOST)
		return NULL;
	if (i->layout != SKV_LAYOUT_PAGED)
		return k->arena + offs[layer] +
		       (uint64_t)(head_elems(k, layer, head) + slot_elems(k, head, slot, 0)) * es;
	return k->arena + offs[layer] +
	       (uint64_t)slot_elems(k, head, slot, (int64_t)(slot / i->block_size)) * es;
}

SKV_EXPORT void *skv_cache_k_slot(const struct skv_cache *k, uint32_t layer, uint32_t head,
				  uint32_t slot)
{
	return cache_slot(k, SKV_KV_K, layer, head, slot);
}

SKV_EXPORT void *skv_cache_v_slot(const struct skv_cache *k, uint32_t layer, uint32_t head,
				  uint32_t slot)
{
	return cache_slot(k, SKV_KV_V, layer, head, slot);
}

SKV_EXPORT int64_t skv_cache_block_offset(const struct skv_cache *k, uint32_t layer, enum skv_kv kv,
					  uint32_t block)
{
	const uint64_t *offs;
	int64_t b;

	if (!k || k->info.layout != SKV_LAYOUT_PAGED || layer >= k->info.layers ||
	    (kv != SKV_KV_K && kv != SKV_KV_V))
		return -1;
	offs = kv == SKV_KV_V ? k->v_off : k->k_off;
	if (k->info.out_dest == SKV_OUT_WRITEBACK) {
		if (!k->wb || block >= k->wb->n_table)
			return -1;
		b = k->wb->table[block];
	} else {
		if (block >= k->info.n_blocks)
			return -1;
		b = block;
	}
	return (int64_t)offs[layer] + b * k->info.block_stride * (int64_t)cache_es(k);
}

SKV_EXPORT int skv_cache_block_run(const struct skv_cache *k, uint32_t layer, enum skv_kv kv,
				   uint64_t *ret_offset, uint64_t *ret_bytes)
{
	if (!k || k->info.layout != SKV_LAYOUT_PAGED || k->info.out_dest != SKV_OUT_ARENA ||
	    layer >= k->info.layers || (kv != SKV_KV_K && kv != SKV_KV_V) || !ret_offset ||
	    !ret_bytes)
		return -EINVAL;
	*ret_offset = kv == SKV_KV_V ? k->v_off[layer] : k->k_off[layer];
	*ret_bytes = k->run_bytes;
	return 0;
}

SKV_EXPORT int skv_cache_map_blocks(const struct skv_cache *k, uint32_t layer, enum skv_kv kv,
				    void *addr)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t off, len;
	struct skv_client *c;
	void *p;
	int r;

	if (!k || k->info.kv_arena != SKV_ARENA_HOST ||
	    skv_cache_block_run(k, layer, kv, &off, &len) < 0 || !addr ||
	    (uintptr_t)addr % (uintptr_t)pg || off % (uint64_t)pg || len % (uint64_t)pg)
		return -EINVAL;
	c = k->c;
	pthread_mutex_lock(&c->mu);
	if (c->session_id != k->session_id || c->arena_fd < 0) {
		r = fail(c, -ENOTCONN, "the cache's session is gone");
	} else {
		p = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, c->arena_fd,
			 (off_t)off);
		r = p == MAP_FAILED
			? fail(c, -errno, "mmap of the cache's blocks: %s", strerror(errno))
			: 0;
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

SKV_EXPORT const int32_t *skv_cache_positions(const struct skv_cache *k, uint32_t layer,
					      uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return NULL;
	return (const int32_t *)(k->arena + k->pos_off[layer]) +
	       (k->hstart ? k->hstart[(size_t)layer * k->info.h_store + head]
			  : (size_t)head * k->info.capacity);
}

/* ------------------------------------------------ budget modes (1.6) */

SKV_EXPORT int skv_cache_budget(const struct skv_cache *k, struct skv_cache_budget *ret)
{
	uint32_t n;

	if (!k || !ret || ret->budget_size < offsetof(struct skv_cache_budget, kept_min))
		return -EINVAL;
	n = ret->budget_size < sizeof(*ret) ? ret->budget_size : (uint32_t)sizeof(*ret);
	memcpy(ret, &k->budget, n);
	ret->budget_size = n;
	if (!k->hkept) {
		ret->kept_min = k->info.kept;
		ret->kept_mean = (float)k->info.kept;
	}
	return 0;
}

SKV_EXPORT uint32_t skv_cache_head_kept(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return 0;
	return k->hkept ? k->hkept[(size_t)layer * k->info.h_store + head] : k->info.kept;
}

SKV_EXPORT uint32_t skv_cache_head_capacity(const struct skv_cache *k, uint32_t layer,
					    uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return 0;
	return skv_cache_head_kept(k, layer, head) + (k->info.capacity - k->info.kept);
}

SKV_EXPORT int64_t skv_cache_head_start(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return -1;
	if (k->hstart)
		return (int64_t)k->hstart[(size_t)layer * k->info.h_store + head];
	return k->info.layout == SKV_LAYOUT_HND ? (int64_t)head * k->info.capacity : -1;
}

/* Min (which 0) or mean (1) over a layer's heads, NaN heads skipped. */
static float layer_mass(const struct skv_cache *k, uint32_t layer, int which)
{
	float mn = 0.0f / 0.0f, sum = 0;
	uint32_t n = 0;

	if (!k || layer >= k->info.layers)
		return 0.0f / 0.0f;
	if (k->lmass)
		return k->lmass[(size_t)which * k->info.layers + layer];
	for (uint32_t h = 0; h < k->info.h_store; h++) {
		float m = k->mass[(size_t)layer * k->info.h_store + h];

		if (m != m)
			continue;
		mn = n == 0 || m < mn ? m : mn;
		sum += m;
		n++;
	}
	return which ? (n ? sum / (float)n : 0.0f / 0.0f) : mn;
}

SKV_EXPORT float skv_cache_layer_mass_min(const struct skv_cache *k, uint32_t layer)
{
	return layer_mass(k, layer, 0);
}

SKV_EXPORT float skv_cache_layer_mass_mean(const struct skv_cache *k, uint32_t layer)
{
	return layer_mass(k, layer, 1);
}

SKV_EXPORT float skv_cache_retained_mass(const struct skv_cache *k, uint32_t layer, uint32_t head)
{
	if (!k || layer >= k->info.layers || head >= k->info.h_store)
		return 0.0f / 0.0f;
	return k->mass[(size_t)layer * k->info.h_store + head];
}

SKV_EXPORT uint32_t skv_cache_next_slot(const struct skv_cache *k)
{
	return k ? k->info.kept + k->info.appended : 0;
}

SKV_EXPORT uint32_t skv_cache_next_position(const struct skv_cache *k)
{
	return k ? k->info.prompt_len + k->info.appended : 0;
}

static int cache_check(struct skv_cache *k)
{
	if (!k)
		return -EINVAL;
	if (k->session_id != k->c->session_id)
		return fail(k->c, -ENOENT, "cache belongs to a previous session");
	return 0;
}

SKV_EXPORT int skv_cache_append(struct skv_cache *k, uint32_t tokens)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__AppendRequest a = SNAPKV__V1__APPEND_REQUEST__INIT;
	Snapkv__V1__Response *resp = NULL;
	int r = cache_check(k);

	if (r < 0)
		return r;
	a.cache_id = k->info.id;
	a.tokens = tokens;
	req.op_case = SNAPKV__V1__REQUEST__OP_APPEND;
	req.append = &a;
	pthread_mutex_lock(&k->c->mu);
	r = call(k->c, &req, &resp);
	if (r == 0) {
		if (resp->result_case == SNAPKV__V1__RESPONSE__RESULT_APPENDED)
			k->info.appended = resp->appended;
		else
			r = fail(k->c, -EPROTO, "unexpected reply to APPEND");
		snapkv__v1__response__free_unpacked(resp, NULL);
	}
	pthread_mutex_unlock(&k->c->mu);
	return r;
}

SKV_EXPORT int skv_cache_grow(struct skv_cache *k, uint32_t extra)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__GrowRequest g = SNAPKV__V1__GROW_REQUEST__INIT;
	Snapkv__V1__Response *resp = NULL;
	int r = cache_check(k);

	if (r < 0)
		return r;
	g.cache_id = k->info.id;
	g.extra = extra;
	req.op_case = SNAPKV__V1__REQUEST__OP_GROW;
	req.grow = &g;
	pthread_mutex_lock(&k->c->mu);
	r = call(k->c, &req, &resp);
	if (r == 0) {
		if (resp->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE)
			r = cache_from_info(k->c, resp->cache, k);
		else
			r = fail(k->c, -EPROTO, "unexpected reply to GROW");
		snapkv__v1__response__free_unpacked(resp, NULL);
	}
	pthread_mutex_unlock(&k->c->mu);
	return r;
}

static int release(struct skv_cache *k, bool linger)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__ReleaseRequest rl = SNAPKV__V1__RELEASE_REQUEST__INIT;
	int r;

	if (!k)
		return 0;
	r = cache_check(k);
	if (r == 0 && !k->c->dead) {
		rl.cache_id = k->info.id;
		rl.linger = linger;
		req.op_case = SNAPKV__V1__REQUEST__OP_RELEASE;
		req.release = &rl;
		pthread_mutex_lock(&k->c->mu);
		r = call(k->c, &req, NULL);
		pthread_mutex_unlock(&k->c->mu);
	} else if (r == 0) {
		r = k->c->dead;
	}
	cache_free(k);
	return r;
}

SKV_EXPORT int skv_cache_release(struct skv_cache *k)
{
	return release(k, false);
}

SKV_EXPORT int skv_cache_release_linger(struct skv_cache *k)
{
	return release(k, true);
}

SKV_EXPORT int skv_client_pressure(struct skv_client *c, struct skv_pressure *ret)
{
	int r;

	if (!c || !ret)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	r = c->dead;
	if (!r && c->ring)
		r = reap(c);
	if (r >= 0) {
		*ret = c->pressure;
		r = 0;
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}
