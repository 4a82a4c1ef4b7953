// SPDX-License-Identifier: MIT
/*
 * snapkvd-session.c - one engine (or snapkvctl) connection: lifecycle,
 * HELLO and the frames it sends; see snapkvd-session.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/snapkv.pb-c.h"
#include "snapkvd-arena.h"
#include "snapkvd-cache.h"
#include "snapkvd-cleanup.h"
#include "snapkvd-clock.h"
#include "snapkvd-config.h"
#include "snapkvd-log.h"
#include "snapkvd-policy.h"
#include "snapkvd-pool.h"
#include "snapkvd-ring.h"
#include "snapkvd-device.h"
#include "snapkvd-server.h"
#include "snapkvd-session.h"
#include "snapkvd-slots.h"
#include "snapkvd-tally.h"

/* ------------------------------------------------------------ sending */

int snapkvd_session_send(struct snapkvd_session *s, uint16_t type, const ProtobufCMessage *m,
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

void snapkvd_session_send_error(struct snapkvd_session *s, int status, const char *msg)
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

void snapkvd_session_count_error(struct snapkvd_session *s)
{
	s->errors++;
	s->srv->errors++;
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

/* ---------------------------------------------------------- lifecycle */

/* A new connection may push the oldest one still in its handshake out. */
static void make_room_for_handshake(struct snapkvd_server *srv)
{
	struct snapkvd_session *old = snapkvd_slots_handshake_victim(srv);

	if (!old)
		return;
	log_debug("session %llu: no HELLO yet, gives way to a new connection (max_handshakes %u)",
		  (unsigned long long)old->id, srv->cfg.max_handshakes);
	snapkvd_session_send_error(
	    old, -ETIMEDOUT,
	    "no HELLO before max_handshakes newer connections arrived (max_handshakes)");
	snapkvd_session_close(old, 0);
}

/* A session not linked anywhere yet (session_new's failure paths). */
static void session_unbuiltp(struct snapkvd_session **s)
{
	if (*s)
		free((*s)->recv.buf);
	free(*s);
}

/* Its state before anything is armed, and the refusal answered at HELLO. */
static void session_init(struct snapkvd_server *srv, struct snapkvd_session *s, int fd,
			 const struct ucred *cred)
{
	s->srv = srv;
	s->fd = fd;
	s->pid = cred->pid;
	s->uid = cred->uid;
	s->gid = cred->gid;
	s->id = ++srv->next_session_id;
	s->refs = 1;
	s->created_ns = snapkvd_now_ns();
	snprintf(s->name, sizeof(s->name), "pid%d", (int)cred->pid);
	/* Refusals are answered at HELLO, once the client's message has been
	 * read: closing a socket with unread data would turn our reason into a
	 * bare ECONNRESET on the client's side. */
	if (!snapkvd_config_allows(&srv->cfg, cred->uid, cred->gid)) {
		snapkvd_log_cause(&srv->floods[SNAPKVD_FLOOD_REFUSED], snapkvd_now_ns(),
				  "session %llu: uid %u gid %u not allowed",
				  (unsigned long long)s->id, (unsigned)cred->uid,
				  (unsigned)cred->gid);
		s->refused = -EACCES;
	} else if (srv->draining) {
		s->refused = -ESHUTDOWN;
	}
}

int snapkvd_session_new(struct snapkvd_server *srv, int fd, struct snapkvd_session **ret)
{
	_cleanup_(session_unbuiltp) struct snapkvd_session *s = NULL;
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
		s->recv.cap = SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD;
		s->recv.buf = malloc(s->recv.cap);
	}
	if (!s || !s->recv.buf) {
		refuse_fd(fd, -ENOMEM, "snapkvd is out of memory; try again later");
		return -ENOMEM;
	}
	size_sockbufs(fd);
	make_room_for_handshake(srv);
	session_init(srv, s, fd, &cred);
	s->next = srv->sessions;
	srv->sessions = s;
	snapkvd_slots_handshake_begin(srv, s);
	srv->sessions_total++;
	*ret = TAKE_PTR(s);
	return 0;
}

void snapkvd_session_free_cache(struct snapkvd_session *s, struct snapkvd_cache *c)
{
	snapkvd_tally_forget(&s->srv->tally, c);
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
			snapkvd_session_free_cache(s, c);
			return;
		}
	}
}

static void session_free(struct snapkvd_session *s)
{
	struct snapkvd_session **pp;

	for (pp = &s->srv->sessions; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	snapkvd_slots_put(s->srv, s);
	snapkvd_ring_free(s->ring);
	/* closed only now: the armed recvmsg held a reference until it came back */
	if (s->fd >= 0)
		close(s->fd);
	/* no job runs any more: the last one held a session reference */
	snapkvd_kvpools_clear(&s->kvpools);
	snapkvd_device_arena_free(s->srv->device, s->garena_gpu, s->garena);
	snapkvd_arena_free(s->arena);
	snapkvd_pool_tenant_put(s->srv->pool, s->tenant);
	log_debug("session %llu freed", (unsigned long long)s->id);
	free(s->recv.buf);
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
	snapkvd_slots_handshake_end(s->srv, s);
	/* queued jobs of this session are not run, running ones stop early */
	__atomic_store_n(&s->cancelled, true, __ATOMIC_RELEASE);
	if (why)
		snapkvd_session_send_error(s, why, strerror(-why));
	/* snapkvctl's connections at debug: `top` alone made 7,200 lines an hour;
	 * connections that never held a session summarised: a flood of them
	 * was a line each */
	if (!s->slot)
		snapkvd_log_cause(&s->srv->floods[SNAPKVD_FLOOD_NO_SESSION], snapkvd_now_ns(),
				  "session %llu (%s, uid %u) closed before it held a session%s%s",
				  (unsigned long long)s->id, s->name, (unsigned)s->uid,
				  why ? ": " : "", why ? strerror(-why) : "");
	else
		snapkvd_log(s->admin && !why ? SNAPKVD_LOG_DEBUG : SNAPKVD_LOG_INFO, 0,
			    "session %llu (%s, uid %u) closed%s%s", (unsigned long long)s->id,
			    s->name, (unsigned)s->uid, why ? ": " : "", why ? strerror(-why) : "");
	/* Complete the armed recvmsg and doorbell read so their refs drop. With
	 * jobs still in flight the engine's end stays open (no hang-up) until
	 * the last of them is done and the session freed: a client that sees
	 * its session end knows that nothing of it can be written any more. */
	if (s->fd >= 0)
		shutdown(s->fd, s->jobs ? SHUT_RD : SHUT_RDWR);
	if (s->ring)
		(void)!eventfd_write(s->ring->sq_efd, 1);
	while (s->caches) {
		struct snapkvd_cache *c = s->caches;

		s->caches = c->next;
		snapkvd_session_free_cache(s, c);
	}
	snapkvd_buffers_clear(&s->buffers);
	snapkvd_session_unref(s);
}

void snapkvd_session_check_hello(struct snapkvd_session *s, uint64_t now_ns)
{
	char err[96];

	if (!snapkvd_slots_hello_late(s->srv, s, now_ns, err, sizeof(err)))
		return;
	snapkvd_session_send_error(s, -ETIMEDOUT, err);
	snapkvd_session_close(s, 0);
}

/* ----------------------------------------------------------- the ring */

static void on_doorbell(void *data, int res);

static int arm_doorbell(struct snapkvd_session *s)
{
	int r;

	s->ev_doorbell = (struct snapkvd_loop_ev){.fn = on_doorbell, .data = s};
	r = snapkvd_loop_read(s->srv->loop, s->ring->sq_efd, &s->doorbell_val,
			      sizeof(s->doorbell_val), &s->ev_doorbell);
	if (r == 0)
		s->refs++;
	return r;
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

int snapkvd_session_post_pressure(struct snapkvd_session *s, int level, uint32_t suggested,
				  uint32_t scale_permille, uint64_t used)
{
	if (s->closing || !s->ring || s->admin)
		return 0;
	return snapkvd_ring_post_pressure(s->ring, level, suggested, scale_permille, used);
}

void snapkvd_session_flush_cq(struct snapkvd_session *s)
{
	if (!s->closing && s->ring)
		snapkvd_ring_flush(s->ring);
}

bool snapkvd_session_prepare_sleep(struct snapkvd_session *s)
{
	int r;

	if (s->closing || !s->ring)
		return false;
	r = snapkvd_ring_prepare_sleep(s->ring);
	if (r < 0)
		snapkvd_session_close(s, r);
	return r > 0;
}

void snapkvd_session_wake(struct snapkvd_session *s)
{
	if (!s->closing && s->ring)
		snapkvd_ring_wake(s->ring);
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

/* -------------------------------------------------------------- HELLO */

/* An engine's ring and host arena (its own released regions are reused,
 * never another's). */
static int setup_engine(struct snapkvd_session *s, uint32_t want_sq)
{
	const struct snapkvd_config *cfg = &s->srv->cfg;
	int r = snapkvd_ring_new(want_sq, cfg->sq_entries, cfg->slot_bytes, &s->ring);

	if (r == 0)
		r = snapkvd_arena_new(cfg->session_arena_bytes, "snapkvd-arena", &s->arena);
	if (r == 0)
		snapkvd_arena_join(s->arena, &s->srv->arenas);
	return r;
}

/* The slot, then the tenant: 0, or the session is closed with the reason. */
static int hello_admit(struct snapkvd_session *s, bool admin)
{
	char err[160];
	int r = snapkvd_slots_take(s->srv, s, admin, err, sizeof(err));

	if (r < 0) {
		snapkvd_log_cause(&s->srv->floods[SNAPKVD_FLOOD_REFUSED], snapkvd_now_ns(),
				  "session %llu (uid %u): %s", (unsigned long long)s->id,
				  (unsigned)s->uid, err);
		snapkvd_session_send_error(s, r, err);
		snapkvd_session_close(s, 0);
		return r;
	}
	r = snapkvd_pool_tenant_get(s->srv->pool, s->uid, &s->tenant);
	if (r < 0) {
		snapkvd_session_send_error(s, r, "snapkvd is out of memory; try again later");
		snapkvd_session_close(s, 0);
		return r;
	}
	snapkvd_pool_tenant_set_quota(s->srv->pool, s->tenant,
				      snapkvd_policy_tenant_quota(&s->srv->policy, s->uid));
	snapkvd_buffers_init(&s->buffers, s->srv->pool, s->tenant, s->srv->device, s->id);
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
	snapkvd_log_cause(&s->srv->floods[SNAPKVD_FLOOD_REFUSED], snapkvd_now_ns(),
			  "session %llu (uid %u): %s", (unsigned long long)s->id, (unsigned)s->uid,
			  err);
	snapkvd_session_send_error(s, -EINVAL, err);
	snapkvd_session_close(s, 0);
	return -EINVAL;
}

/* A HELLO we do not serve: closed with the reason. 0: it may go on. */
static int hello_check(struct snapkvd_session *s, const Snapkv__V1__Hello *h)
{
	int refused = s->refused;

	if (refused) {
		snapkvd_session_send_error(
		    s, refused,
		    refused == -EACCES ? "uid/gid not in the daemon's allow list (allow_uids, "
					 "allow_gids)"
				       : "daemon is shutting down");
		snapkvd_session_close(s, 0); /* s may be gone if the caller held no ref */
		return refused;
	}
	if (h->client_version != SKV_PROTO_VERSION) {
		snapkvd_session_close(s, -EPROTONOSUPPORT);
		return -EPROTONOSUPPORT;
	}
	if (h->name && h->name[0] && check_name(s, h->name) < 0)
		return -EINVAL;
	return hello_admit(s, h->admin);
}

/* The Welcome, with the ring, arena and eventfds for an engine. */
static int send_welcome(struct snapkvd_session *s)
{
	Snapkv__V1__Welcome w = SNAPKV__V1__WELCOME__INIT;
	int fds[4];
	int r;

	w.server_version = SKV_PROTO_VERSION;
	w.session_id = s->id;
	w.tenant = (char *)snapkvd_tenant_name(s->tenant);
	w.uid = s->uid;
	w.backend = s->srv->cfg.backend;
	if (!s->admin) {
		w.ring_bytes = s->ring->bytes;
		w.arena_bytes = s->arena->size;
		w.features = SKV_RING_F_KNOWN;
		fds[0] = s->ring->fd;
		fds[1] = s->arena->fd;
		fds[2] = s->ring->sq_efd;
		fds[3] = s->ring->cq_efd;
	}
	r = snapkvd_session_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME, &w.base, fds,
				 s->admin ? 0 : 4);
	if (s->ring) /* the mapping stays; the engine has its own fd */
		snapkvd_ring_memfd_sent(s->ring);
	return r;
}

static void hello_freep(Snapkv__V1__Hello **h)
{
	if (*h)
		snapkv__v1__hello__free_unpacked(*h, NULL);
}

void snapkvd_session_hello(struct snapkvd_session *s, const uint8_t *p, size_t len)
{
	_cleanup_(hello_freep) Snapkv__V1__Hello *h = snapkv__v1__hello__unpack(NULL, len, p);
	int r;

	if (!h) {
		snapkvd_session_close(s, -EBADMSG);
		return;
	}
	snapkvd_slots_handshake_end(s->srv, s);
	if (hello_check(s, h) < 0)
		return;
	s->admin = h->admin;
	if (!s->admin && (r = setup_engine(s, h->sq_entries)) < 0) {
		log_warning_errno(r, "session %llu: ring/arena setup failed",
				  (unsigned long long)s->id);
		snapkvd_session_close(s, r);
		return;
	}
	if (send_welcome(s) < 0) {
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
