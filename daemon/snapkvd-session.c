// SPDX-License-Identifier: MIT
/*
 * snapkvd-session.c - one engine (or snapkvctl) connection; see
 * snapkvd-session.h. The request dispatcher is shared by ring and socket:
 * COMPACT and GROW are validated (snapkvd-request.c), admitted
 * (snapkvd-admission.c) and queued (snapkvd-compactor.c); their completions
 * come back through snapkvd_session_job_done() on the loop thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/snapkv.pb-c.h"
#include "snapkvd-admin.h"
#include "snapkvd-admission.h"
#include "snapkvd-arena.h"
#include "snapkvd-buffer.h"
#include "snapkvd-cache.h"
#include "snapkvd-clock.h"
#include "snapkvd-compactor.h"
#include "snapkvd-config.h"
#include "snapkvd-job.h"
#include "snapkvd-log.h"
#include "snapkvd-policy.h"
#include "snapkvd-pool.h"
#include "snapkvd-request.h"
#include "snapkvd-runner.h"
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
static void on_doorbell(void *data, int res);
static void complete(struct snapkvd_session *s, const struct snapkvd_origin *o, int status,
		     const char *err, Snapkv__V1__Response *resp);
static void on_request(struct snapkvd_session *s, const struct snapkvd_origin *o,
		       const uint8_t *buf, size_t len);

static int arm_recv(struct snapkvd_session *s)
{
	s->riov = (struct iovec){.iov_base = s->rbuf, .iov_len = s->rbuf_cap};
	memset(&s->rmsg, 0, sizeof(s->rmsg));
	s->rmsg.msg_iov = &s->riov;
	s->rmsg.msg_iovlen = 1;
	/* Cleared each time: a recvmsg that fails (ECONNRESET when the engine
	 * left with replies unread) does not rewrite msg_controllen, and the
	 * previous frame's fds, closed since, must not be closed again. */
	memset(&s->rctl, 0, sizeof(s->rctl));
	s->rmsg.msg_control = s->rctl.buf;
	s->rmsg.msg_controllen = sizeof(s->rctl.buf);
	if (snapkvd_loop_recvmsg(s->srv->loop, s->fd, &s->rmsg, MSG_CMSG_CLOEXEC, &s->ev_recv) < 0)
		return -EBUSY;
	s->refs++;
	return 0;
}

static int arm_doorbell(struct snapkvd_session *s)
{
	int r = snapkvd_loop_read(s->srv->loop, s->sq_efd, &s->doorbell_val,
				  sizeof(s->doorbell_val), &s->ev_doorbell);

	if (r == 0)
		s->refs++;
	return r;
}

static void send_error(struct snapkvd_session *s, int status, const char *msg)
{
	Snapkv__V1__ErrorNotice e = SNAPKV__V1__ERROR_NOTICE__INIT;
	uint8_t buf[512];
	size_t n;

	if (s->fd < 0)
		return;
	e.status = status;
	e.error = (char *)msg;
	if (snapkv__v1__error_notice__get_packed_size(&e) > sizeof(buf))
		e.error = "";
	n = snapkv__v1__error_notice__pack(&e, buf);
	(void)skv_frame_send(s->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR, buf, n, NULL, 0,
			     MSG_DONTWAIT);
}

/* A connection we cannot keep: say why, then close it (never a silent hang). */
static void refuse_fd(int fd, int status, const char *msg)
{
	Snapkv__V1__ErrorNotice e = SNAPKV__V1__ERROR_NOTICE__INIT;
	uint8_t buf[256];
	size_t n;

	e.status = status;
	e.error = (char *)msg;
	n = snapkv__v1__error_notice__pack(&e, buf);
	(void)skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR, buf, n, NULL, 0,
			     MSG_DONTWAIT);
	close(fd);
}

/* Replies (a ledger, a long CacheInfo) up to the 1 MiB frame limit. */
static void size_sockbufs(int fd)
{
	static bool told;
	size_t max = 0;

	if (skv_frame_size_socket(fd, &max) < 0 && !told) {
		told = true;
		log_notice("socket buffers capped at %zu bytes (no CAP_NET_ADMIN and "
			   "net.core.wmem_max/rmem_max lower): frames above that fail",
			   max);
	}
}

/* The oldest connection still in its handshake, or NULL. */
static struct snapkvd_session *oldest_handshake(struct snapkvd_server *srv)
{
	struct snapkvd_session *old = NULL;

	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		if (x->handshake && !x->closing)
			old = x; /* the list is newest first */
	return old;
}

/*
 * A connection in its handshake holds no session slot: only max_handshakes
 * of them exist at once (the oldest gives way to a new one) and each has
 * hello_timeout_ms to say HELLO. Slots are taken at HELLO (hello_slot()).
 */
static void make_room_for_handshake(struct snapkvd_server *srv)
{
	struct snapkvd_session *old;

	if (srv->n_handshakes < srv->cfg.max_handshakes || !(old = oldest_handshake(srv)))
		return;
	log_debug("session %llu: no HELLO yet, gives way to a new connection (max_handshakes %u)",
		  (unsigned long long)old->id, srv->cfg.max_handshakes);
	send_error(old, -ETIMEDOUT,
		   "no HELLO before max_handshakes newer connections arrived (max_handshakes)");
	snapkvd_session_close(old, 0);
}

int snapkvd_session_new(struct snapkvd_server *srv, int fd, struct snapkvd_session **ret)
{
	struct snapkvd_session *s;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int r;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		r = -errno;
		refuse_fd(fd, r, "snapkvd could not read the peer's credentials");
		return r;
	}
	s = calloc(1, sizeof(*s));
	if (s) {
		s->rbuf_cap = SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD;
		s->rbuf = malloc(s->rbuf_cap);
	}
	if (!s || !s->rbuf) {
		if (s)
			free(s);
		refuse_fd(fd, -ENOMEM, "snapkvd is out of memory; try again later");
		return -ENOMEM;
	}
	size_sockbufs(fd);
	make_room_for_handshake(srv);
	s->srv = srv;
	s->fd = fd;
	s->ring_fd = s->sq_efd = s->cq_efd = -1;
	s->pid = cred.pid;
	s->uid = cred.uid;
	s->gid = cred.gid;
	s->id = ++srv->next_session_id;
	s->refs = 1;
	s->created_ns = snapkvd_now_ns();
	s->ev_recv = (struct snapkvd_loop_ev){.fn = on_recv, .data = s};
	s->ev_doorbell = (struct snapkvd_loop_ev){.fn = on_doorbell, .data = s};
	snprintf(s->name, sizeof(s->name), "pid%d", (int)cred.pid);
	s->next = srv->sessions;
	srv->sessions = s;
	s->handshake = true;
	srv->n_handshakes++;
	srv->sessions_total++;
	/* Refusals are answered at HELLO, once the client's message has been
	 * read: closing a socket with unread data would turn our reason into a
	 * bare ECONNRESET on the client's side. */
	if (!snapkvd_config_allows(&srv->cfg, cred.uid, cred.gid)) {
		log_notice("session %llu: uid %u gid %u not allowed", (unsigned long long)s->id,
			   (unsigned)cred.uid, (unsigned)cred.gid);
		s->refused = -EACCES;
	} else if (srv->draining) {
		s->refused = -ESHUTDOWN;
	}
	r = arm_recv(s);
	if (r < 0) {
		snapkvd_session_close(s, r);
		return r;
	}
	*ret = s;
	return 0;
}

static void free_cache_memory(struct snapkvd_session *s, struct snapkvd_cache *c)
{
	snapkvd_arena_release(s->arena, c->region_off, c->region_bytes);
	snapkvd_pool_give_back(s->srv->pool, s->tenant, c->region_bytes);
	snapkvd_pool_cache_count(s->srv->pool, s->tenant, -1);
	if (!c->lingering) /* a lingering cache stopped counting when released */
		s->n_caches--;
	snapkvd_cache_free(c);
}

void snapkvd_session_drop_cache(struct snapkvd_session *s, struct snapkvd_cache *c)
{
	for (struct snapkvd_cache **pp = &s->caches; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			free_cache_memory(s, c);
			return;
		}
	}
}

/* A buffer leaves the session: its mapping stops counting for the tenant
 * (a running job keeps its own reference until it is done). */
static void drop_buffer(struct snapkvd_session *s, struct snapkvd_buffer *b)
{
	s->n_buffers--;
	snapkvd_pool_unmap(s->srv->pool, s->tenant, b->size);
	snapkvd_buffer_unref(b);
}

static void session_free(struct snapkvd_session *s)
{
	struct snapkvd_session **pp;

	for (pp = &s->srv->sessions; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	if (s->slot) {
		if (s->admin)
			s->srv->n_admin_sessions--;
		else
			s->srv->n_sessions--;
	}
	if (s->ring_map)
		munmap(s->ring_map, s->ring_bytes);
	if (s->sq_efd >= 0)
		close(s->sq_efd);
	if (s->cq_efd >= 0)
		close(s->cq_efd);
	if (s->ring_fd >= 0)
		close(s->ring_fd);
	/* closed only now: the armed recvmsg held a reference until it came back */
	if (s->fd >= 0)
		close(s->fd);
	/* no job runs any more: the last one held a session reference */
	snapkvd_runner_arena_free(s->srv->runner, s->garena);
	snapkvd_arena_free(s->arena);
	free(s->scratch);
	snapkvd_pool_tenant_put(s->srv->pool, s->tenant);
	log_debug("session %llu freed", (unsigned long long)s->id);
	free(s->rbuf);
	free(s);
}

void snapkvd_session_unref(struct snapkvd_session *s)
{
	if (s && --s->refs == 0)
		session_free(s);
}

void snapkvd_session_close(struct snapkvd_session *s, int why)
{
	if (s->closing)
		return;
	s->closing = true;
	if (s->handshake) {
		s->handshake = false;
		s->srv->n_handshakes--;
	}
	/* queued jobs of this session are not run, running ones stop early */
	__atomic_store_n(&s->cancelled, true, __ATOMIC_RELEASE);
	if (why)
		send_error(s, why, strerror(-why));
	/* snapkvctl's connections at debug: `top` alone made 7,200 lines an hour */
	snapkvd_log(s->admin && !why ? SNAPKVD_LOG_DEBUG : SNAPKVD_LOG_INFO, 0,
		    "session %llu (%s, uid %u) closed%s%s", (unsigned long long)s->id, s->name,
		    (unsigned)s->uid, why ? ": " : "", why ? strerror(-why) : "");
	/* Complete the armed recvmsg and doorbell read so their refs drop. */
	if (s->fd >= 0)
		shutdown(s->fd, SHUT_RDWR);
	if (s->sq_efd >= 0)
		(void)!eventfd_write(s->sq_efd, 1);
	while (s->caches) {
		struct snapkvd_cache *c = s->caches;

		s->caches = c->next;
		free_cache_memory(s, c);
	}
	while (s->buffers) {
		struct snapkvd_buffer *b = s->buffers;

		s->buffers = b->next;
		drop_buffer(s, b);
	}
	snapkvd_session_unref(s);
}

static int send_msg(struct snapkvd_session *s, uint16_t type, const ProtobufCMessage *m,
		    const int *fds, unsigned n_fds)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t stackbuf[4096], *buf = stackbuf;
	int r;

	if (n > SKV_FRAME_MAX_PAYLOAD)
		return -EMSGSIZE;
	if (n > sizeof(stackbuf)) {
		buf = malloc(n);
		if (!buf)
			return -ENOMEM;
	}
	protobuf_c_message_pack(m, buf);
	r = skv_frame_send(s->fd, type, buf, n, fds, n_fds, MSG_DONTWAIT);
	if (buf != stackbuf)
		free(buf);
	return r;
}

/* ----------------------------------------------------------------- events */

/* Post one event CQE now: 1, -EAGAIN (no room beside the in-flight
 * requests' completions) or -EBADMSG. */
static int post_event(struct snapkvd_session *s, const struct skv_cqe *cqe)
{
	int space = skv_ring_space(&s->cq);

	if (space < 0)
		return -EBADMSG;
	/* Every in-flight request keeps its completion slot: an engine that
	 * does not read its CQ misses events, never completions. */
	if ((unsigned)space <= s->inflight)
		return -EAGAIN;
	if (skv_ring_produce(&s->cq, cqe) < 0)
		return -EBADMSG;
	s->cq_dirty = true;
	s->pev_unread = true;
	s->pev_end = s->cq.local;
	return 1;
}

/* Whether the engine has read the last PRESSURE event we posted. */
static bool pev_read(const struct snapkvd_session *s)
{
	uint32_t head = atomic_load_explicit(&s->cq.ctl->head, memory_order_acquire);

	return !s->pev_unread || (int32_t)(head - s->pev_end) >= 0;
}

int snapkvd_session_post_pressure(struct snapkvd_session *s, int level, uint32_t suggested,
				  uint32_t scale_permille, uint64_t used)
{
	const struct skv_cqe cqe = {
	    .user_data = SKV_EVENT_PRESSURE,
	    .res = (int32_t)level + 1,
	    .flags = SKV_CQE_F_EVENT,
	    .slot = suggested,
	    .len = scale_permille,
	    .reserved = used,
	};

	if (s->closing || !s->ring_map || s->admin)
		return 0;
	if (!pev_read(s)) {
		/* one unread event per ring: the newest waits for it */
		if (s->pev_waiting)
			s->events_coalesced++;
		s->pev = cqe;
		s->pev_waiting = true;
		return 1;
	}
	s->pev_waiting = false;
	return post_event(s, &cqe);
}

/* A new engine under pressure learns the current level at once. */
static void greet_pressure(struct snapkvd_session *s)
{
	enum snapkvd_pressure_level lv;
	uint32_t cap, permille;
	uint64_t used;

	if (snapkvd_policy_greeting(&s->srv->policy, &lv, &cap, &permille, &used) &&
	    snapkvd_session_post_pressure(s, (int)lv, cap, permille, used) > 0)
		snapkvd_session_flush_cq(s);
}

/* ---------------------------------------------------------------- handshake */

static int setup_ring(struct snapkvd_session *s, uint32_t want_sq)
{
	const struct snapkvd_config *cfg = &s->srv->cfg;
	uint32_t sq = cfg->sq_entries;
	int r;

	if (want_sq && want_sq <= SKV_RING_MAX_ENTRIES) {
		sq = 2;
		while (sq < want_sq)
			sq <<= 1;
	}
	r = skv_ring_layout_init(&s->layout, sq, sq * 2, cfg->slot_bytes);
	if (r < 0)
		return r;
	s->ring_bytes = s->layout.total_size;
	s->ring_fd = memfd_create("snapkvd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (s->ring_fd < 0)
		return -errno;
	if (ftruncate(s->ring_fd, (off_t)s->ring_bytes) < 0 ||
	    fcntl(s->ring_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return -errno;
	s->ring_map = mmap(NULL, s->ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->ring_fd, 0);
	if (s->ring_map == MAP_FAILED) {
		s->ring_map = NULL;
		return -errno;
	}
	memcpy(s->ring_map, &s->layout, sizeof(s->layout));
	skv_ring_q_init(&s->sq, s->ring_map, s->layout.sq_off, s->layout.sq_entries,
			sizeof(struct skv_sqe));
	skv_ring_q_init(&s->cq, s->ring_map, s->layout.cq_off, s->layout.cq_entries,
			sizeof(struct skv_cqe));
	s->sq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->cq_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->sq_efd < 0 || s->cq_efd < 0)
		return -errno;
	r = snapkvd_arena_new(cfg->session_arena_bytes, "snapkvd-arena", &s->arena);
	if (r == 0) /* its own released regions are reused, never another's */
		snapkvd_arena_join(s->arena, &s->srv->arenas);
	return r;
}

/*
 * The session slot a greeted connection takes. Engines: max_sessions in
 * all and max_sessions_per_tenant per uid. Admin sessions (snapkvctl) have
 * their own max_admin_sessions, so engines never lock the operator out,
 * and root or an admin_uids member gets one slot more beyond that. 0, or
 * -EUSERS with the limit and its key in err.
 */
static int hello_slot(struct snapkvd_session *s, bool admin, char *err, size_t errlen)
{
	struct snapkvd_server *srv = s->srv;
	const struct snapkvd_config *cfg = &srv->cfg;
	unsigned mine = 0;

	if (admin) {
		unsigned cap =
		    cfg->max_admin_sessions + (snapkvd_config_is_admin(cfg, s->uid) ? 1 : 0);

		if (srv->n_admin_sessions >= cap) {
			snprintf(err, errlen,
				 "too many admin sessions: %u open, max_admin_sessions is %u",
				 srv->n_admin_sessions, cfg->max_admin_sessions);
			return -EUSERS;
		}
		srv->n_admin_sessions++;
		s->slot = true;
		return 0;
	}
	if (srv->n_sessions >= cfg->max_sessions) {
		snprintf(err, errlen, "too many sessions: %u open, max_sessions is %u",
			 srv->n_sessions, cfg->max_sessions);
		return -EUSERS;
	}
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		if (x->slot && !x->admin && !x->closing && x->uid == s->uid)
			mine++;
	if (mine >= cfg->max_sessions_per_tenant) {
		snprintf(err, errlen,
			 "uid %u already has %u sessions: max_sessions_per_tenant is %u",
			 (unsigned)s->uid, mine, cfg->max_sessions_per_tenant);
		return -EUSERS;
	}
	srv->n_sessions++;
	s->slot = true;
	return 0;
}

/* The slot, then the tenant: 0, or the session is closed with the reason. */
static int hello_admit(struct snapkvd_session *s, bool admin)
{
	char err[160];
	int r = hello_slot(s, admin, err, sizeof(err));

	if (r < 0) {
		log_notice("session %llu (uid %u): %s", (unsigned long long)s->id, (unsigned)s->uid,
			   err);
		send_error(s, r, err);
		snapkvd_session_close(s, 0);
		return r;
	}
	r = snapkvd_pool_tenant_get(s->srv->pool, s->uid, &s->tenant);
	if (r < 0) {
		send_error(s, r, "snapkvd is out of memory; try again later");
		snapkvd_session_close(s, 0);
		return r;
	}
	snapkvd_pool_tenant_set_quota(s->srv->pool, s->tenant,
				      snapkvd_policy_tenant_quota(&s->srv->policy, s->uid));
	return 0;
}

/*
 * The engine name shows in logs, the ledger, its JSON and the metrics: it
 * must be UTF-8 without control characters, at most sizeof(name) - 1 bytes.
 * Refused at HELLO otherwise (the session is closed with the reason).
 */
static int check_name(struct snapkvd_session *s, const char *name)
{
	size_t n = strlen(name);
	char err[128];

	if (n >= sizeof(s->name))
		snprintf(err, sizeof(err), "engine name of %zu bytes: at most %zu", n,
			 sizeof(s->name) - 1);
	else if (!skv_utf8_valid(name, n))
		snprintf(err, sizeof(err),
			 "engine name is not valid UTF-8 or holds control characters");
	else {
		snprintf(s->name, sizeof(s->name), "%s", name);
		for (size_t i = 0; s->name[i]; i++) /* label- and log-safe */
			if (s->name[i] == '"' || s->name[i] == '\\')
				s->name[i] = '_';
		return 0;
	}
	log_notice("session %llu (uid %u): %s", (unsigned long long)s->id, (unsigned)s->uid, err);
	send_error(s, -EINVAL, err);
	snapkvd_session_close(s, 0);
	return -EINVAL;
}

static void on_hello(struct snapkvd_session *s, const uint8_t *p, size_t len)
{
	Snapkv__V1__Hello *h = snapkv__v1__hello__unpack(NULL, len, p);
	Snapkv__V1__Welcome w = SNAPKV__V1__WELCOME__INIT;
	int fds[4], r;

	if (!h) {
		snapkvd_session_close(s, -EBADMSG);
		return;
	}
	if (s->handshake) {
		s->handshake = false;
		s->srv->n_handshakes--;
	}
	if (s->refused) {
		snapkv__v1__hello__free_unpacked(h, NULL);
		send_error(s, s->refused,
			   s->refused == -EACCES
			       ? "uid/gid not in the daemon's allow list (allow_uids, "
				 "allow_gids)"
			       : "daemon is shutting down");
		snapkvd_session_close(s, 0);
		return;
	}
	if (h->client_version != SKV_PROTO_VERSION) {
		snapkv__v1__hello__free_unpacked(h, NULL);
		snapkvd_session_close(s, -EPROTONOSUPPORT);
		return;
	}
	if (h->name && h->name[0] && check_name(s, h->name) < 0) {
		snapkv__v1__hello__free_unpacked(h, NULL);
		return;
	}
	if (hello_admit(s, h->admin) < 0) {
		snapkv__v1__hello__free_unpacked(h, NULL);
		return;
	}
	s->admin = h->admin;
	if (!s->admin) {
		r = setup_ring(s, h->sq_entries);
		if (r < 0) {
			log_warning_errno(r, "session %llu: ring/arena setup failed",
					  (unsigned long long)s->id);
			snapkv__v1__hello__free_unpacked(h, NULL);
			snapkvd_session_close(s, r);
			return;
		}
	}
	snapkv__v1__hello__free_unpacked(h, NULL);
	w.server_version = SKV_PROTO_VERSION;
	w.session_id = s->id;
	w.tenant = (char *)snapkvd_tenant_name(s->tenant);
	w.uid = s->uid;
	w.backend = s->srv->cfg.backend;
	if (!s->admin) {
		w.ring_bytes = s->ring_bytes;
		w.arena_bytes = s->arena->size;
		w.features = SKV_RING_F_KNOWN;
		fds[0] = s->ring_fd;
		fds[1] = s->arena->fd;
		fds[2] = s->sq_efd;
		fds[3] = s->cq_efd;
	}
	r = send_msg(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME, &w.base, fds, s->admin ? 0 : 4);
	if (s->ring_fd >= 0) {
		close(s->ring_fd); /* the mapping stays; the engine has its own fd */
		s->ring_fd = -1;
	}
	if (r < 0) {
		snapkvd_session_close(s, 0);
		return;
	}
	if (!s->admin) {
		r = arm_doorbell(s);
		if (r < 0) {
			snapkvd_session_close(s, r);
			return;
		}
		greet_pressure(s);
	}
	snapkvd_log(s->admin ? SNAPKVD_LOG_DEBUG : SNAPKVD_LOG_INFO, 0,
		    "session %llu: %s (pid %d, uid %u)%s", (unsigned long long)s->id, s->name,
		    (int)s->pid, (unsigned)s->uid, s->admin ? " admin" : "");
}

/* ------------------------------------------------------------- registration */

static void reg_reply_t(struct snapkvd_session *s, int status, const char *err, uint64_t id,
			uint64_t gen, uint64_t size, const char *transport)
{
	Snapkv__V1__RegisterReply rr = SNAPKV__V1__REGISTER_REPLY__INIT;

	rr.status = status;
	rr.transport = (char *)(status ? "" : transport);
	rr.error = (char *)(err ? err : "");
	rr.buffer_id = id;
	rr.generation = gen;
	rr.size = size;
	if (status)
		s->errors++, s->srv->errors++;
	if (send_msg(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY, &rr.base, NULL, 0) < 0)
		snapkvd_session_close(s, 0);
}

static void reg_reply(struct snapkvd_session *s, int status, const char *err, uint64_t id,
		      uint64_t gen, uint64_t size)
{
	reg_reply_t(s, status, err, id, gen, size, "memfd");
}

/* Charge a buffer of `size` bytes to the session's tenant (and the daemon). */
static int charge_buffer(struct snapkvd_session *s, uint64_t size, char *err, size_t errlen)
{
	return snapkvd_pool_map(s->srv->pool, s->tenant, size, err, errlen);
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
	if (send_msg(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY, &rr.base, NULL, 0) < 0)
		snapkvd_session_close(s, 0);
}

/* A repeated registration must ask for what the first one got. */
static bool reg_same_access(struct snapkvd_session *s, const struct snapkvd_buffer *dup,
			    bool writable)
{
	char err[160];

	if (dup->writable == writable)
		return true;
	snprintf(err, sizeof(err), "generation %llu is already buffer %llu, registered %s",
		 (unsigned long long)dup->generation, (unsigned long long)dup->id,
		 dup->writable ? "writable" : "read-only");
	reg_reply(s, -EEXIST, err, 0, dup->generation, 0);
	return false;
}

/* A CUDA buffer (the runner imports it); fd (or -1) is consumed. Repeats
 * of a generation are counted on its buffer, so imports are keyed by buffer
 * id (see snapkvd-buffer.h). */
static void register_gpu(struct snapkvd_session *s, const Snapkv__V1__RegisterBuffer *m, int fd)
{
	struct snapkvd_buffer *b = NULL,
			      *dup = snapkvd_buffer_by_generation(s->buffers, m->generation);
	char err[256];
	int r;

	if (s->admin || !s->arena) {
		snprintf(err, sizeof(err), "admin sessions cannot register buffers");
		r = -EPERM;
	} else if (dup) {
		/* the same generation again: the import already made, one more
		 * registration; it must name the same kind, size and window */
		if (!dup->imp || dup->kind != (int)m->kind || dup->size != m->size ||
		    (dup->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC &&
		     dup->ipc_off != m->offset)) {
			snprintf(err, sizeof(err),
				 "generation %llu is already buffer %llu (%s, %llu bytes)",
				 (unsigned long long)m->generation, (unsigned long long)dup->id,
				 dup->transport ? dup->transport : "memfd",
				 (unsigned long long)dup->size);
			r = -EEXIST;
		} else {
			if (fd >= 0)
				close(fd);
			if (reg_same_access(s, dup, m->writable)) {
				dup->regs++;
				reg_reply_ok(s, dup);
			}
			return;
		}
	} else if (s->n_buffers >= s->srv->cfg.max_buffers) {
		snprintf(err, sizeof(err), "too many buffers in this session");
		r = -EMFILE;
	} else {
		const struct snapkvd_buffer_cuda bc = {
		    .kind = (int)m->kind,
		    .size = m->size,
		    .offset = m->offset,
		    .generation = m->generation,
		    .ipc_handle = m->ipc_handle.data,
		    .ipc_handle_len = m->ipc_handle.len,
		    .device = m->device,
		};

		r = snapkvd_buffer_cuda_new(s->srv->runner, s->id, s->next_buffer_id + 1, &bc, fd,
					    s->srv->cfg.max_buffer_bytes, &b, err, sizeof(err));
		fd = -1;
		/* validated and imported: charged to the tenant, or dropped again */
		if (r == 0 && (r = charge_buffer(s, b->size, err, sizeof(err))) < 0)
			snapkvd_buffer_unref(b);
	}
	if (fd >= 0)
		close(fd);
	if (r < 0) {
		reg_reply(s, r, err, 0, m->generation, 0);
		return;
	}
	b->id = ++s->next_buffer_id;
	b->writable = m->writable; /* device memory: the flag gates writeback */
	b->next = s->buffers;
	s->buffers = b;
	s->n_buffers++;
	reg_reply_ok(s, b);
}

/* A memfd registration of `size` (0: the whole memfd), generation gen. */
static void register_memfd(struct snapkvd_session *s, int fd, uint64_t size, uint64_t gen,
			   bool writable)
{
	struct snapkvd_buffer *b, *dup = snapkvd_buffer_by_generation(s->buffers, gen);
	const char *why = NULL;
	char err[256];
	dev_t dev;
	ino_t ino;
	int r;

	if (!dup && s->n_buffers >= s->srv->cfg.max_buffers) {
		close(fd);
		reg_reply(s, -EMFILE, "too many buffers in this session", 0, gen, 0);
		return;
	}
	r = snapkvd_buffer_memfd_check(fd, &size, s->srv->cfg.max_buffer_bytes, &dev, &ino, &why);
	if (r == 0 && writable)
		r = snapkvd_buffer_memfd_check_writable(fd, &why);
	if (r < 0) {
		close(fd);
		reg_reply(s, r, why, 0, gen, 0);
		return;
	}
	/* The same generation again: the import already made, one more ref. */
	if (dup) {
		close(fd);
		if (dup->size != size || dup->dev != dev || dup->ino != ino) {
			snprintf(err, sizeof(err),
				 "generation %llu is already buffer %llu with %s (%llu bytes)",
				 (unsigned long long)gen, (unsigned long long)dup->id,
				 dup->size != size ? "another size" : "another memfd",
				 (unsigned long long)dup->size);
			reg_reply(s, -EEXIST, err, 0, gen, 0);
			return;
		}
		if (reg_same_access(s, dup, writable)) {
			dup->regs++;
			reg_reply_ok(s, dup);
		}
		return;
	}
	/* charged to the tenant before it is mapped */
	r = charge_buffer(s, size, err, sizeof(err));
	if (r < 0) {
		close(fd);
		reg_reply(s, r, err, 0, gen, 0);
		return;
	}
	/* Mapped once, read-only unless registered writable; the fd is not
	 * needed after this. */
	r = snapkvd_buffer_memfd_map(fd, size, gen, dev, ino, writable, &b);
	close(fd);
	if (r < 0) {
		snapkvd_pool_unmap(s->srv->pool, s->tenant, size);
		reg_reply(s, r, r == -ENOMEM ? "out of memory" : "mmap failed", 0, gen, 0);
		return;
	}
	b->id = ++s->next_buffer_id; /* never reused within the session */
	b->next = s->buffers;
	s->buffers = b;
	s->n_buffers++;
	reg_reply_ok(s, b);
}

static void on_register(struct snapkvd_session *s, const uint8_t *p, size_t len,
			struct frame_fds *fds)
{
	Snapkv__V1__RegisterBuffer *m = snapkv__v1__register_buffer__unpack(NULL, len, p);
	uint64_t size, gen;
	bool writable;
	/* more than one fd: none is used; the guard closes them all */
	int fd = fds_take_one(fds);

	if (!m) {
		if (fd >= 0)
			close(fd);
		reg_reply(s, -EBADMSG, "malformed RegisterBuffer", 0, 0, 0);
		return;
	}
	if (m->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD ||
	    m->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC) {
		register_gpu(s, m, fd);
		snapkv__v1__register_buffer__free_unpacked(m, NULL);
		return;
	}
	if (m->kind != SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_UNSPECIFIED &&
	    m->kind != SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_MEMFD) {
		if (fd >= 0)
			close(fd);
		reg_reply(s, -EINVAL, "unknown buffer kind", 0, m->generation, 0);
		snapkv__v1__register_buffer__free_unpacked(m, NULL);
		return;
	}
	size = m->size;
	gen = m->generation;
	writable = m->writable;
	snapkv__v1__register_buffer__free_unpacked(m, NULL);
	if (s->admin || !s->arena) {
		if (fd >= 0)
			close(fd);
		reg_reply(s, -EPERM, "admin sessions cannot register buffers", 0, gen, 0);
		return;
	}
	if (fd < 0) {
		reg_reply(s, -EBADF, "RegisterBuffer needs exactly one fd", 0, gen, 0);
		return;
	}
	register_memfd(s, fd, size, gen, writable);
}

static void on_unregister(struct snapkvd_session *s, const uint8_t *p, size_t len)
{
	Snapkv__V1__Unregister *m = snapkv__v1__unregister__unpack(NULL, len, p);
	Snapkv__V1__UnregisterReply rr = SNAPKV__V1__UNREGISTER_REPLY__INIT;
	struct snapkvd_buffer **pp;

	rr.error = "";
	if (!m) {
		rr.status = -EBADMSG;
		rr.error = "malformed Unregister";
	} else {
		rr.status = -ENOENT;
		rr.error = "no such buffer";
		for (pp = &s->buffers; *pp; pp = &(*pp)->next) {
			if ((*pp)->id != m->buffer_id)
				continue;
			struct snapkvd_buffer *b = *pp;

			rr.status = 0;
			rr.error = "";
			if (b->regs > 1) { /* registered again under its generation */
				b->regs--;
				break;
			}
			*pp = b->next;
			drop_buffer(s, b); /* a running job keeps its own ref */
			break;
		}
		snapkv__v1__unregister__free_unpacked(m, NULL);
	}
	if (send_msg(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY, &rr.base, NULL, 0) < 0)
		snapkvd_session_close(s, 0);
}

/* The session's GPU arena, exported to the engine (created on first ask). */
static void on_cuda_arena(struct snapkvd_session *s)
{
	Snapkv__V1__CudaArena a = SNAPKV__V1__CUDA_ARENA__INIT;
	char err[256] = "";
	uint64_t size = 0;
	int fd = -1, dev = -1, r;

	if (!snapkvd_runner_device(s->srv->runner)) {
		snprintf(
		    err, sizeof(err),
		    "a GPU arena needs snapkvd --backend cuda; this daemon runs the %s backend",
		    snapkvd_runner_name(s->srv->runner));
		r = -ENOTSUP;
	} else if (s->admin || !s->arena) {
		snprintf(err, sizeof(err), "admin sessions have no arena");
		r = -EPERM;
	} else {
		r = snapkvd_runner_arena_export(s->srv->runner, &s->garena, s->arena->size, s->id,
						&fd, &size, &dev, err, sizeof(err));
	}
	a.status = r;
	a.error = err;
	a.size = size;
	a.device = dev;
	a.transport = (char *)(r ? "" : "cuda-vmm");
	if (r)
		s->errors++, s->srv->errors++;
	if (send_msg(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY, &a.base, &fd,
		     fd >= 0 ? 1 : 0) < 0)
		snapkvd_session_close(s, 0);
	if (fd >= 0)
		close(fd);
}

/* snapkvctl's questions: answered by snapkvd-admin.c, sent from here. */
static void on_admin(struct snapkvd_session *s, const uint8_t *payload, size_t len)
{
	uint8_t *buf = NULL;
	size_t n = 0;
	int r = snapkvd_admin_answer(s->srv, s, payload, len, &buf, &n);

	if (r < 0) {
		snapkvd_session_close(s, r);
		return;
	}
	r = skv_frame_send(s->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY, buf, n, NULL, 0,
			   MSG_DONTWAIT);
	free(buf);
	if (r < 0)
		snapkvd_session_close(s, 0);
}

static void on_frame(struct snapkvd_session *s, const struct skv_frame_hdr *h,
		     const uint8_t *payload, struct frame_fds *fds)
{
	bool hello = h->type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO;

	/* The first message must be HELLO, and only the first. */
	if (hello == s->greeted) {
		s->requests++;
		snapkvd_session_close(s, -EPROTO);
		return;
	}
	s->greeted = true;
	s->requests++;
	switch (h->type) {
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO:
		on_hello(s, payload, h->length);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER:
		on_register(s, payload, h->length, fds);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER:
		on_unregister(s, payload, h->length);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST: {
		struct snapkvd_origin o = {.ring = false};

		on_request(s, &o, payload, h->length);
		break;
	}
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN:
		on_admin(s, payload, h->length);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA:
		on_cuda_arena(s);
		break;
	default: {
		Snapkv__V1__ErrorNotice e = SNAPKV__V1__ERROR_NOTICE__INIT;

		/* not fatal: the peer may speak a newer minor revision */
		e.status = -EOPNOTSUPP;
		e.error = "unknown message type";
		s->errors++;
		s->srv->errors++;
		if (send_msg(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR, &e.base, NULL, 0) < 0)
			snapkvd_session_close(s, 0);
	}
	}
}

/* The armed recvmsg completed: one frame, or the end of the stream. */
static void on_recv(void *data, int res)
{
	struct snapkvd_session *s = data;
	struct skv_frame_hdr h;
	struct frame_fds fds __attribute__((cleanup(frame_fds_close))) = {.n = 0};
	int r;

	if (s->closing) {
		if (res >= 0)
			skv_frame_close_fds(&s->rmsg);
		snapkvd_session_unref(s);
		return;
	}
	fds.n = SKV_FRAME_MAX_FDS;
	r = skv_frame_parse(&s->rmsg, res, SKV_FRAME_MAX_PAYLOAD, &h, fds.fd, &fds.n);
	if (r < 0)
		fds.n = 0; /* the parser closed them */
	if (r < 0) {
		/* end of stream, or framing we cannot trust: close this one */
		if (r != -ECONNRESET)
			log_notice("session %llu: bad frame: %s", (unsigned long long)s->id,
				   strerror(-r));
		snapkvd_session_close(s, r == -ECONNRESET ? 0 : r);
	} else {
		on_frame(s, &h, s->rbuf + SKV_FRAME_HDR_SIZE, &fds);
		if (!s->closing && arm_recv(s) < 0)
			snapkvd_session_close(s, -EBUSY);
	}
	snapkvd_session_unref(s);
}

/* The engine rang: the loop polls the SQ anyway; watch for the next ring. */
static void on_doorbell(void *data, int res)
{
	struct snapkvd_session *s = data;

	(void)res;
	if (!s->closing && arm_doorbell(s) < 0)
		snapkvd_session_close(s, -EBUSY);
	snapkvd_session_unref(s);
}

void snapkvd_session_check_hello(struct snapkvd_session *s, uint64_t now_ns)
{
	char err[96];

	if (!s->handshake || s->closing ||
	    now_ns - s->created_ns <= s->srv->cfg.hello_timeout_ms * 1000000ull)
		return;
	snprintf(err, sizeof(err), "no HELLO within hello_timeout_ms (%u ms)",
		 s->srv->cfg.hello_timeout_ms);
	send_error(s, -ETIMEDOUT, err);
	snapkvd_session_close(s, 0);
}

/* ----------------------------------------------------------------- requests */

static struct snapkvd_cache *find_cache(struct snapkvd_session *s, uint64_t id)
{
	for (struct snapkvd_cache *c = s->caches; c; c = c->next)
		if (c->id == id && !c->lingering) /* released: gone for the engine */
			return c;
	return NULL;
}

/* The block format of a PAGED cache (CacheInfo fields 100-105). */
static void fill_paged_info(const struct snapkvd_cache *c, Snapkv__V1__CacheInfo *ci)
{
	ci->layout = SNAPKV__V1__LAYOUT__LAYOUT_PAGED;
	ci->block_size = c->block_size;
	ci->n_blocks = c->n_blocks;
	ci->block_stride = c->block_stride;
	ci->out_dest = c->writeback ? SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK
				    : SNAPKV__V1__OUT_DEST__OUT_DEST_ARENA;
	ci->run_bytes = c->run_bytes;
	ci->out_buffer_id = c->out_buffer_id;
}

/* The budget mode's outcome (CacheInfo 120-128): per-head counts, and for
 * a ragged cache the head starts. */
static void fill_budget_info(const struct snapkvd_cache *c, Snapkv__V1__CacheInfo *ci)
{
	size_t n = (size_t)c->layers * c->h_store;

	ci->budget_mode = (Snapkv__V1__BudgetMode)(c->budget_mode + 1);
	ci->n_head_kept = n;
	ci->head_kept = c->hkept;
	ci->ragged = c->ragged;
	if (c->ragged) {
		ci->n_head_start = n;
		ci->head_start = c->hstart;
		ci->pos_stride = 0;
	}
	ci->c_star = c->c_star;
	ci->fallback = c->fallback;
	ci->mass_min = c->mass_choice;
	ci->n_layer_mass_min = ci->n_layer_mass_mean = c->layers;
	ci->layer_mass_min = c->layer_mass;
	ci->layer_mass_mean = c->layer_mass + c->layers;
}

static void fill_cache_info(const struct snapkvd_cache *c, Snapkv__V1__CacheInfo *ci)
{
	ci->group_size = c->group_size;
	ci->group_wait_us = c->group_wait_ns / 1000;
	ci->cache_id = c->id;
	ci->kv_arena = c->gpu_kv ? SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM
				 : SNAPKV__V1__ARENA_KIND__ARENA_KIND_HOST_MEMFD;
	ci->layers = c->layers;
	ci->h_store = c->h_store;
	ci->head_dim = c->head_dim;
	ci->dtype = (Snapkv__V1__DType)c->dtype;
	ci->layout = c->layout == SNAPKVD_LAYOUT_NHD ? SNAPKV__V1__LAYOUT__LAYOUT_NHD
						     : SNAPKV__V1__LAYOUT__LAYOUT_HND;
	ci->prompt_len = c->prompt_len;
	ci->kept = c->kept;
	ci->capacity = c->slots;
	ci->appended = c->appended;
	ci->head_stride = c->head_stride;
	ci->token_stride = c->token_stride;
	ci->pos_stride = c->slots;
	ci->n_k_offset = ci->n_v_offset = ci->n_pos_offset = c->layers;
	ci->k_offset = c->k_off;
	ci->v_offset = c->v_off;
	ci->pos_offset = c->pos_off;
	ci->n_retained_mass = (size_t)c->layers * c->h_store;
	ci->retained_mass = c->mass;
	ci->region_offset = c->region_off;
	ci->region_bytes = c->region_bytes;
	ci->budget = c->budget;
	ci->requested_budget = c->requested_budget;
	ci->budget_scaled = c->budget < c->requested_budget;
	ci->pressure = (Snapkv__V1__PressureLevel)(c->pressure_level + 1);
	if (c->layout == SNAPKVD_LAYOUT_PAGED)
		fill_paged_info(c, ci);
	if (c->budgeted)
		fill_budget_info(c, ci);
}

static void complete_cache(struct snapkvd_session *s, const struct snapkvd_origin *o,
			   const struct snapkvd_cache *c)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;

	fill_cache_info(c, &ci);
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_CACHE;
	resp.cache = &ci;
	complete(s, o, 0, NULL, &resp);
}

/*
 * An upper bound of the reply describing cache c (its Response with the
 * CacheInfo): its arrays are packed as they are, every varint that a later
 * placement may widen (offsets, ids, counts) counted at its widest.
 */
static size_t cache_reply_bound(const struct snapkvd_cache *c)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;

	fill_cache_info(c, &ci);
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_CACHE;
	resp.cache = &ci;
	/* a budget mode's per-head counts are 0 before the compaction and its
	 * ragged starts absent: count every one at its widest (5 + 10 bytes) */
	return snapkv__v1__response__get_packed_size(&resp) + (size_t)c->layers * 3 * 10 + 256 +
	       (c->budgeted ? (size_t)c->layers * c->h_store * 15 + 32 : 0);
}

/*
 * Replies are sized before any state changes: a COMPACT or GROW whose
 * answer could not reach the engine (larger than the ring's argument slot,
 * or than a frame) is refused up front, so no cache is ever committed, or
 * old region freed, for a reply that then cannot be sent. 0 or -EMSGSIZE.
 */
static int reply_fits(struct snapkvd_session *s, const struct snapkvd_origin *o,
		      const struct snapkvd_cache *c, char *err, size_t errlen)
{
	size_t need = cache_reply_bound(c);
	size_t room = o->ring ? (o->has_slot ? s->layout.arg_slot_size : 0) : SKV_FRAME_MAX_PAYLOAD;

	if (o->ring && !o->has_slot)
		return 0; /* a ring request without a slot gets no reply body */
	if (need <= room)
		return 0;
	snprintf(
	    err, errlen,
	    "the reply (up to %zu bytes for %u layers x %u heads) exceeds the %s of %zu "
	    "bytes%s; nothing was done",
	    need, c->layers, c->h_store, o->ring ? "ring's argument slot" : "frame limit", room,
	    o->ring ? " (slot_bytes; send this request over the socket or raise slot_bytes)" : "");
	return -EMSGSIZE;
}

static void do_append(struct snapkvd_session *s, const struct snapkvd_origin *o,
		      const Snapkv__V1__AppendRequest *a)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	struct snapkvd_cache *c = find_cache(s, a->cache_id);
	char err[128];

	if (!c) {
		complete(s, o, -ENOENT, "no such cache", NULL);
		return;
	}
	if (c->busy) {
		complete(s, o, -EBUSY, "a GROW of this cache is in progress", NULL);
		return;
	}
	if (a->tokens > c->slots - c->kept - c->appended) {
		snprintf(err, sizeof(err), "%u tokens but %u decode slots left: GROW first",
			 a->tokens, c->slots - c->kept - c->appended);
		complete(s, o, -ENOSPC, err, NULL);
		return;
	}
	/* Logical positions continue at L + g, whatever slot they sit in. */
	for (uint32_t l = 0; l < c->layers; l++) {
		int32_t *pos = (int32_t *)(s->arena->base + c->pos_off[l]);

		for (uint32_t h = 0; h < c->h_store; h++) {
			uint64_t at = snapkvd_cache_pos_index(
			    c, l, h, snapkvd_cache_head_kept(c, l, h) + c->appended);

			for (uint32_t i = 0; i < a->tokens; i++)
				pos[at + i] = (int32_t)(c->prompt_len + c->appended + i);
		}
	}
	c->appended += a->tokens;
	c->last_use_ns = snapkvd_now_ns();
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_APPENDED;
	resp.appended = c->appended;
	complete(s, o, 0, NULL, &resp);
}

static struct snapkvd_request_env request_env(struct snapkvd_session *s)
{
	struct snapkvd_server *srv = s->srv;

	return (struct snapkvd_request_env){
	    .cfg = &srv->cfg,
	    .buffers = s->buffers,
	    .arena_bytes = s->arena ? s->arena->size : 0,
	    .has_garena = s->garena != NULL,
	    .runner = srv->runner,
	    .threads = snapkvd_compactor_threads(srv->compactor),
	    .ops = &srv->policy,
	    .groups = srv->groups,
	    .uid = s->uid,
	};
}

/* The GROW job of cache c: everything the copy needs, so the worker never
 * touches the cache object. 0 or -ENOMEM. */
static int grow_job(struct snapkvd_session *s, const struct snapkvd_origin *o,
		    struct snapkvd_cache *c, uint32_t slots, const struct snapkvd_cache_geom *geom,
		    uint8_t *kv_base, struct snapkvd_job **ret)
{
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_GROW, s, o);
	size_t nk = c->ragged ? (size_t)c->layers * c->h_store : 0;

	if (j) {
		j->g.old_k = malloc(c->layers * sizeof(uint64_t));
		j->g.old_v = malloc(c->layers * sizeof(uint64_t));
		/* a ragged cache's counts ride after the positions' offsets, so
		 * they are freed with them */
		j->g.old_pos = malloc(c->layers * sizeof(uint64_t) + nk * sizeof(uint32_t));
	}
	if (!j || !j->g.old_k || !j->g.old_v || !j->g.old_pos) {
		snapkvd_job_free(j);
		return -ENOMEM;
	}
	j->target = c;
	j->g.geom = *geom;
	j->g.gpu = c->gpu_kv;
	j->g.kv_base = kv_base;
	j->g.slots = slots;
	j->g.old_slots = c->slots;
	j->g.used = c->kept + c->appended;
	j->g.layers = c->layers;
	j->g.h_store = c->h_store;
	j->g.row = c->head_dim * c->dtype_bytes;
	j->g.hnd = c->layout == SNAPKVD_LAYOUT_HND;
	j->g.paged = c->layout == SNAPKVD_LAYOUT_PAGED;
	j->g.old_run = c->run_bytes;
	memcpy(j->g.old_k, c->k_off, c->layers * sizeof(uint64_t));
	memcpy(j->g.old_v, c->v_off, c->layers * sizeof(uint64_t));
	memcpy(j->g.old_pos, c->pos_off, c->layers * sizeof(uint64_t));
	if (nk) {
		uint32_t *hk = (uint32_t *)(j->g.old_pos + c->layers);

		memcpy(hk, c->hkept, nk * sizeof(uint32_t));
		j->g.hkept = hk;
		j->g.appended = c->appended;
		j->g.old_res = c->slots - c->kept;
		j->g.res = slots - c->kept;
	}
	*ret = j;
	return 0;
}

static void do_grow(struct snapkvd_session *s, const struct snapkvd_origin *o,
		    const Snapkv__V1__GrowRequest *g)
{
	struct snapkvd_cache *c = find_cache(s, g->cache_id);
	struct snapkvd_request_env env = request_env(s);
	struct snapkvd_cache_geom geom;
	struct snapkvd_job *j;
	const char *why = NULL;
	char err[256];
	uint8_t *kv_base = NULL;
	uint32_t slots;
	int r;

	if (!c) {
		complete(s, o, -ENOENT, "no such cache", NULL);
		return;
	}
	if (c->busy) {
		complete(s, o, -EBUSY, "a GROW of this cache is in progress", NULL);
		return;
	}
	r = snapkvd_request_grow(&env, c, g->extra, &slots, &geom, &why);
	if (r < 0) {
		complete(s, o, r, why, NULL);
		return;
	}
	r = reply_fits(s, o, c, err, sizeof(err));
	if (r < 0) {
		complete(s, o, r, err, NULL);
		return;
	}
	/* K/V in the GPU arena: the same offsets there, copied on the device */
	if (c->gpu_kv && !(kv_base = snapkvd_runner_arena_base(s->srv->runner, s->garena))) {
		complete(s, o, -EIO, "the session's GPU arena is gone", NULL);
		return;
	}
	if (grow_job(s, o, c, slots, &geom, kv_base, &j) < 0) {
		complete(s, o, -ENOMEM, "out of memory", NULL);
		return;
	}
	r = snapkvd_admission_grow(s->srv, s, j, err, sizeof(err));
	if (r < 0) {
		snapkvd_job_free(j);
		complete(s, o, r, err, NULL);
		return;
	}
	/* The copy can be large (GBs): the worker does it, the loop moves on. */
	j->cancel = &s->cancelled;
	c->busy = true;
	s->refs++;
	snapkvd_compactor_submit(s->srv->compactor, j);
}

/* A GROW copy finished: switch the cache to its new region. */
static void grow_done(struct snapkvd_job *j)
{
	struct snapkvd_session *s = j->s;
	struct snapkvd_pool *pool = s->srv->pool;
	struct snapkvd_cache *c = NULL;

	if (!s->closing)
		for (c = s->caches; c && c != j->target; c = c->next)
			;
	if (!c || j->status < 0) {
		/* the session went (and freed the cache) meanwhile, or the copy
		 * failed (GPU arena): the cache stays as it was */
		snapkvd_arena_release(s->arena, j->g.off, j->g.geom.region);
		snapkvd_pool_cancel(pool, &j->resv);
		if (c) {
			c->busy = false;
			complete(s, &j->origin, j->status, j->err, NULL);
		}
		return;
	}
	snapkvd_arena_release(s->arena, c->region_off, c->region_bytes);
	snapkvd_pool_give_back(pool, s->tenant, c->region_bytes);
	snapkvd_pool_commit(pool, &j->resv);
	snapkvd_cache_place(c, j->g.off, j->g.slots, &j->g.geom);
	c->busy = false;
	c->last_use_ns = snapkvd_now_ns();
	complete_cache(s, &j->origin, c);
}

static void do_release(struct snapkvd_session *s, const struct snapkvd_origin *o, uint64_t id,
		       bool linger)
{
	struct snapkvd_cache **pp;

	for (pp = &s->caches; *pp; pp = &(*pp)->next) {
		if ((*pp)->id != id || (*pp)->lingering)
			continue;
		struct snapkvd_cache *c = *pp;

		if (c->busy) {
			complete(s, o, -EBUSY, "a GROW of this cache is in progress", NULL);
			return;
		}
		if (linger || c->evictable) {
			/* Kept and counted until pressure evicts it (LRU) or the
			 * session ends; the engine's handle is gone either way. */
			c->lingering = true;
			c->last_use_ns = snapkvd_now_ns();
			s->n_caches--;
			snapkvd_policy_mark_dirty(&s->srv->policy);
			complete(s, o, 0, NULL, NULL);
			return;
		}
		*pp = c->next;
		free_cache_memory(s, c);
		complete(s, o, 0, NULL, NULL);
		return;
	}
	complete(s, o, -ENOENT, "no such cache", NULL);
}

/* COMPACT: validated, then admitted, then queued; refused at either step,
 * it has changed nothing. */
static void do_compact(struct snapkvd_session *s, const struct snapkvd_origin *o,
		       const Snapkv__V1__CompactRequest *req)
{
	struct snapkvd_request_env env = request_env(s);
	struct snapkvd_job *j = NULL;
	char err[256] = "";
	int r;

	if (s->srv->draining) {
		complete(s, o, -ESHUTDOWN, "daemon is shutting down", NULL);
		return;
	}
	if (s->n_caches >= s->srv->cfg.max_caches) {
		complete(s, o, -EMFILE, "too many caches", NULL);
		return;
	}
	r = snapkvd_request_compact(&env, s, o, req, &j, err, sizeof(err));
	if (r == 0 && (r = reply_fits(s, o, j->cache, err, sizeof(err))) < 0)
		snapkvd_job_free(j);
	if (r == 0) {
		r = snapkvd_admission_compact(s->srv, s, j, err, sizeof(err));
		if (r < 0)
			snapkvd_job_free(j);
	}
	if (r < 0) {
		complete(s, o, r, err, NULL);
		return;
	}
	j->cancel = &s->cancelled;
	s->refs++;
	s->n_caches++; /* counts against max_caches while running */
	snapkvd_compactor_submit(s->srv->compactor, j);
}

static void do_stats(struct snapkvd_session *s, const struct snapkvd_origin *o)
{
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	Snapkv__V1__Stats st = SNAPKV__V1__STATS__INIT;

	st.caches = s->n_caches;
	st.buffers = s->n_buffers;
	st.arena_used = s->arena ? s->arena->used : 0;
	st.arena_bytes = s->arena ? s->arena->size : 0;
	st.requests = s->requests;
	st.errors = s->errors;
	st.pool_total = snapkvd_pool_total(s->srv->pool);
	st.pool_used = snapkvd_pool_used(s->srv->pool);
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_STATS;
	resp.stats = &st;
	complete(s, o, 0, NULL, &resp);
}

static void on_request(struct snapkvd_session *s, const struct snapkvd_origin *o0,
		       const uint8_t *buf, size_t len)
{
	Snapkv__V1__Request *req = snapkv__v1__request__unpack(NULL, len, buf);
	struct snapkvd_origin o = *o0;

	s->srv->requests++;
	if (!req) {
		complete(s, &o, -EBADMSG, "malformed Request", NULL);
		return;
	}
	if (!o.ring)
		o.user_data = req->user_data;
	if (s->admin && req->op_case != SNAPKV__V1__REQUEST__OP_NOP &&
	    req->op_case != SNAPKV__V1__REQUEST__OP_STATS) {
		complete(s, &o, -EPERM, "admin sessions have no arena", NULL);
		goto out;
	}
	switch (req->op_case) {
	case SNAPKV__V1__REQUEST__OP_NOP:
		complete(s, &o, 0, NULL, NULL);
		break;
	case SNAPKV__V1__REQUEST__OP_COMPACT:
		do_compact(s, &o, req->compact);
		break;
	case SNAPKV__V1__REQUEST__OP_APPEND:
		do_append(s, &o, req->append);
		break;
	case SNAPKV__V1__REQUEST__OP_GROW:
		do_grow(s, &o, req->grow);
		break;
	case SNAPKV__V1__REQUEST__OP_RELEASE:
		do_release(s, &o, req->release->cache_id, req->release->linger);
		break;
	case SNAPKV__V1__REQUEST__OP_STATS:
		do_stats(s, &o);
		break;
	default:
		complete(s, &o, -EOPNOTSUPP, "unknown request", NULL);
		break;
	}
out:
	snapkv__v1__request__free_unpacked(req, NULL);
}

/* The metrics of a cache's budget: its mode, kept fraction, fallback. */
static void observe_budget(struct snapkvd_session *s, const struct snapkvd_cache *c)
{
	uint64_t kept = 0, n = (uint64_t)c->layers * c->h_store;

	for (uint32_t l = 0; l < c->layers; l++)
		kept += c->layer_kept[l];
	if (n && c->prompt_len)
		snapkvd_policy_observe_budget(&s->srv->policy, (int)c->budget_mode,
					      (double)kept / ((double)n * c->prompt_len),
					      c->fallback);
}

/* A COMPACT job succeeded: its cache becomes the session's. */
static void compact_done(struct snapkvd_session *s, struct snapkvd_job *j)
{
	struct snapkvd_pool *pool = s->srv->pool;
	struct snapkvd_cache *c = j->cache;
	uint64_t now = snapkvd_now_ns();

	j->cache = NULL;
	c->last_use_ns = now;
	if (j->group_size) {
		snprintf(c->group_key, sizeof(c->group_key), "%s", j->group_key);
		c->group_size = j->group_size;
		c->group_wait_ns = j->group_wait_ns;
	}
	snapkvd_cache_summarise(c);
	observe_budget(s, c);
	snapkvd_policy_observe_compaction(&s->srv->policy, (double)(now - j->t_start) / 1e9,
					  c->mass, (size_t)c->layers * c->h_store);
	if (j->geom.region < c->region_bytes) { /* shrunk (snapkvd_cache_shrink) */
		uint64_t cut = c->region_bytes - j->geom.region;
		struct snapkvd_resv tail = {.tenant = j->resv.tenant, .bytes = cut};

		snapkvd_arena_release(s->arena, c->region_off + j->geom.region, cut);
		snapkvd_pool_cancel(pool, &tail);
		j->resv.bytes -= cut;
		c->region_bytes = j->geom.region;
	}
	snapkvd_pool_tenant_compaction(pool, s->tenant);
	snapkvd_pool_commit(pool, &j->resv);
	snapkvd_pool_cache_count(pool, s->tenant, 1);
	c->next = s->caches;
	s->caches = c;
	s->n_caches++;
	complete_cache(s, &j->origin, c);
}

void snapkvd_session_job_done(struct snapkvd_job *j)
{
	struct snapkvd_session *s = j->s;

	if (j->status == -ECANCELED)
		s->srv->jobs_cancelled++;
	if (j->kind == SNAPKVD_JOB_GROW) {
		grow_done(j);
	} else {
		s->n_caches--;
		s->srv->compactions++;
		if (s->closing || j->status < 0) {
			/* failed, or the engine is gone: give back what the job held */
			snapkvd_arena_release(s->arena, j->cache->region_off,
					      j->cache->region_bytes);
			snapkvd_pool_cancel(s->srv->pool, &j->resv);
			if (!s->closing)
				complete(s, &j->origin, j->status, j->err, NULL);
		} else {
			compact_done(s, j);
		}
	}
	snapkvd_job_free(j);
	snapkvd_session_unref(s);
}

/* -------------------------------------------------------------- completions */

static void complete(struct snapkvd_session *s, const struct snapkvd_origin *o, int status,
		     const char *err, Snapkv__V1__Response *resp)
{
	Snapkv__V1__Response local = SNAPKV__V1__RESPONSE__INIT;
	int r;

	if (!resp)
		resp = &local;
	resp->status = status;
	resp->error = (char *)(err ? err : "");
	resp->user_data = o->user_data;
	if (status < 0) {
		s->errors++;
		s->srv->errors++;
		snapkvd_policy_count_error(&s->srv->policy, status);
		log_debug("session %llu: request failed: %s: %s", (unsigned long long)s->id,
			  strerror(-status), err ? err : "");
	}
	if (s->closing)
		return;
	if (o->ring) {
		struct skv_cqe cqe = {.user_data = o->user_data, .res = status, .slot = o->slot};
		size_t n = 0;

		s->inflight--;
		if (o->has_slot && (resp != &local || status < 0)) {
			n = snapkv__v1__response__get_packed_size(resp);
			if (n > s->layout.arg_slot_size) {
				cqe.res = -EMSGSIZE;
				n = 0;
			} else {
				snapkv__v1__response__pack(resp, s->ring_map + s->layout.arg_off +
								     (size_t)o->slot *
									 s->layout.arg_slot_size);
			}
		}
		cqe.len = (uint32_t)n;
		r = skv_ring_produce(&s->cq, &cqe);
		if (r < 0) {
			/* cannot happen with honest accounting: the head is corrupt */
			snapkvd_session_close(s, -EBADMSG);
			return;
		}
		s->cq_dirty = true;
		return;
	}
	r = send_msg(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE, &resp->base, NULL, 0);
	if (r < 0)
		snapkvd_session_close(s, 0);
}

void snapkvd_session_flush_cq(struct snapkvd_session *s)
{
	if (s->pev_waiting && !s->closing && s->ring_map && pev_read(s) &&
	    post_event(s, &s->pev) != -EAGAIN)
		s->pev_waiting = false;
	if (!s->cq_dirty || s->closing)
		return;
	s->cq_dirty = false;
	/* W2 on the CQ: the engine set NEED_WAKEUP before sleeping on cq_efd. */
	if (skv_ring_needs_wakeup(&s->cq))
		(void)!eventfd_write(s->cq_efd, 1);
}

int snapkvd_session_poll_ring(struct snapkvd_session *s, unsigned budget)
{
	int done = 0;

	if (s->closing || !s->ring_map)
		return 0;
	while ((unsigned)done < budget) {
		struct skv_sqe sqe;
		int space = skv_ring_space(&s->cq);
		int r;

		if (space < 0) {
			snapkvd_session_close(s, -EBADMSG);
			break;
		}
		/* Back-pressure: every consumed SQE must find a CQ slot later.
		 * A client that stops reading completions stops being served;
		 * nothing is dropped and the loop never blocks on it. */
		if ((unsigned)space <= s->inflight)
			break;
		r = skv_ring_consume(&s->sq, &sqe);
		if (r == -EAGAIN)
			break;
		if (r < 0) {
			log_notice("session %llu: corrupt SQ tail", (unsigned long long)s->id);
			snapkvd_session_close(s, -EBADMSG);
			break;
		}
		done++;
		s->inflight++;
		s->requests++;
		struct snapkvd_origin o = {
		    .ring = true, .slot = sqe.slot, .user_data = sqe.user_data};
		switch (sqe.opcode) {
		case SKV_OP_NOP:
			s->srv->requests++;
			complete(s, &o, 0, NULL, NULL);
			break;
		case SKV_OP_REQUEST:
			if (sqe.slot >= s->layout.arg_slots || sqe.len > s->layout.arg_slot_size) {
				complete(s, &o, -EINVAL, "bad argument slot", NULL);
				break;
			}
			o.has_slot = true;
			if (!s->scratch && !(s->scratch = malloc(s->layout.arg_slot_size))) {
				complete(s, &o, -ENOMEM, "out of memory", NULL);
				break;
			}
			/* copy first: the engine may rewrite the slot while we parse */
			memcpy(s->scratch,
			       s->ring_map + s->layout.arg_off +
				   (size_t)sqe.slot * s->layout.arg_slot_size,
			       sqe.len);
			on_request(s, &o, s->scratch, sqe.len);
			break;
		default:
			complete(s, &o, -EOPNOTSUPP, "unknown opcode", NULL);
			break;
		}
		if (s->closing)
			break;
	}
	return done;
}

bool snapkvd_session_prepare_sleep(struct snapkvd_session *s)
{
	int ready, space;

	if (s->closing || !s->ring_map)
		return false;
	/* W1, extended: a session whose CQ is full (it stopped reading
	 * completions) has SQEs we may not take yet; they must not keep us
	 * spinning. libsnapkv rings the doorbell after reaping CQEs when it
	 * sees the flag and an SQ we have not drained. */
	atomic_fetch_or_explicit(&s->sq.ctl->flags, SKV_RING_NEED_WAKEUP, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	ready = skv_ring_ready(&s->sq);
	space = skv_ring_space(&s->cq);
	if (ready < 0 || space < 0) {
		snapkvd_session_close(s, -EBADMSG);
	} else if (ready > 0 && (unsigned)space > s->inflight) {
		skv_ring_clear_wakeup(&s->sq);
		return true;
	}
	return false;
}

void snapkvd_session_wake(struct snapkvd_session *s)
{
	if (!s->closing && s->ring_map)
		skv_ring_clear_wakeup(&s->sq);
}
