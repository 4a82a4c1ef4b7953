// SPDX-License-Identifier: MIT
/*
 * test-session: a session's lifecycle and HELLO (daemon/snapkvd-session.c)
 * with the server-wide slots of snapkvd-slots.c, a real ring, arena and
 * pool, over a socketpair whose other end plays the engine: the Welcome
 * with its four fds, a refused HELLO answered with its reason (allow
 * list, protocol version, engine name, max_sessions,
 * max_sessions_per_tenant, max_admin_sessions), the oldest handshake
 * giving way past max_handshakes, hello_timeout_ms, and close giving every
 * slot and byte back.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/snapkvd-session.c"
#include "tests/test-skip.h"

/* ------------------------------------------------------------- the fakes */

static unsigned doorbells;

int snapkvd_loop_read(struct snapkvd_loop *l, int fd, void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd, (void)buf, (void)len, (void)ev;
	doorbells++;
	return 0;
}

uint64_t snapkvd_policy_tenant_quota(const struct snapkvd_policy *ops, uid_t uid)
{
	(void)ops, (void)uid;
	return 0;
}

int snapkvd_policy_greeting(const struct snapkvd_policy *ops, enum snapkvd_pressure_level *lv,
			    uint32_t *cap, uint32_t *permille, uint64_t *used)
{
	(void)ops, (void)lv, (void)cap, (void)permille, (void)used;
	return 0;
}

/* --------------------------------------------------------------- helpers */

static struct snapkvd_server srv;

static void open_server(void)
{
	struct skv_error kerr = {{0}, -1, -1};

	memset(&srv, 0, sizeof(srv));
	snapkvd_config_defaults(&srv.cfg);
	srv.cfg.session_arena_bytes = 1 << 20;
	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_new(1 << 30, 0, &srv.pool), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_device_new("host", NULL, 0, &srv.device, &kerr), 0);
	doorbells = 0;
}

static void close_server(void)
{
	CU_ASSERT_PTR_NULL(srv.sessions);
	CU_ASSERT_EQUAL(srv.n_sessions, 0);
	CU_ASSERT_EQUAL(srv.n_admin_sessions, 0);
	CU_ASSERT_EQUAL(srv.n_handshakes, 0);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	snapkvd_device_free(srv.device);
	snapkvd_pool_free(srv.pool);
}

/* A connection: the session's end and the engine's. */
static struct snapkvd_session *connect_one(int *ret_peer)
{
	struct snapkvd_session *s = NULL;
	int sv[2];

	CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_session_new(&srv, sv[0], &s), 0);
	s->refs++; /* as the armed recvmsg of snapkvd_control_start holds one */
	*ret_peer = sv[1];
	return s;
}

/* The connection is done: closed, and the recvmsg's reference dropped. */
static void done(struct snapkvd_session *s)
{
	if (s->ring && !s->closing)
		s->refs--; /* the armed doorbell read, which never completes here */
	if (!s->closing)
		snapkvd_session_close(s, 0);
	snapkvd_session_unref(s);
}

static void hello(struct snapkvd_session *s, bool admin, const char *name, uint32_t version)
{
	Snapkv__V1__Hello h = SNAPKV__V1__HELLO__INIT;
	uint8_t buf[256];
	size_t n;

	h.client_version = version;
	h.admin = admin;
	h.name = (char *)name;
	h.sq_entries = 8;
	n = snapkv__v1__hello__pack(&h, buf);
	snapkvd_session_hello(s, buf, n);
}

/* The frame the engine gets next: its type, its fds (closed), and an
 * ErrorNotice's status and text. */
static uint16_t reply(int peer, unsigned *ret_fds, int *ret_status, char *text, size_t len)
{
	static uint8_t buf[SKV_FRAME_HDR_SIZE + 65536];
	struct skv_frame_hdr h;
	int fds[SKV_FRAME_MAX_FDS];
	unsigned n = SKV_FRAME_MAX_FDS;
	int r = skv_frame_recv(peer, buf, sizeof(buf), &h, fds, &n, MSG_DONTWAIT);

	CU_ASSERT_FATAL(r >= 0);
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
	if (ret_fds)
		*ret_fds = n;
	if (h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR) {
		Snapkv__V1__ErrorNotice *e =
		    snapkv__v1__error_notice__unpack(NULL, (size_t)r, buf + SKV_FRAME_HDR_SIZE);

		CU_ASSERT_PTR_NOT_NULL_FATAL(e);
		if (ret_status)
			*ret_status = e->status;
		if (text)
			snprintf(text, len, "%s", e->error);
		snapkv__v1__error_notice__free_unpacked(e, NULL);
	}
	return h.type;
}

/* ----------------------------------------------------------------- tests */

static void test_welcome(void)
{
	struct snapkvd_session *s;
	unsigned nfds = 0;
	int peer;

	open_server();
	s = connect_one(&peer);
	CU_ASSERT_TRUE(s->handshake);
	CU_ASSERT_EQUAL(srv.n_handshakes, 1);
	hello(s, false, "engine-a", SKV_PROTO_VERSION);
	CU_ASSERT_FALSE(s->closing);
	CU_ASSERT_FALSE(s->handshake);
	CU_ASSERT_EQUAL(srv.n_handshakes, 0);
	CU_ASSERT_EQUAL(srv.n_sessions, 1);
	CU_ASSERT_STRING_EQUAL(s->name, "engine-a");
	CU_ASSERT_PTR_NOT_NULL_FATAL(s->ring);
	CU_ASSERT_EQUAL(s->ring->layout.sq_entries, 8);
	CU_ASSERT_EQUAL(s->ring->fd, -1); /* sent: ours is closed */
	CU_ASSERT_PTR_NOT_NULL(s->arena);
	CU_ASSERT_EQUAL(doorbells, 1);
	CU_ASSERT_EQUAL(reply(peer, &nfds, NULL, NULL, 0), SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME);
	CU_ASSERT_EQUAL(nfds, 4); /* ring, arena, SQ and CQ eventfds */
	/* an admin session: a slot of its own, no ring, no fds */
	{
		int p2;
		struct snapkvd_session *a = connect_one(&p2);

		hello(a, true, "", SKV_PROTO_VERSION);
		CU_ASSERT_EQUAL(srv.n_admin_sessions, 1);
		CU_ASSERT_PTR_NULL(a->ring);
		CU_ASSERT_EQUAL(reply(p2, &nfds, NULL, NULL, 0),
				SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME);
		CU_ASSERT_EQUAL(nfds, 0);
		done(a);
		CU_ASSERT_EQUAL(srv.n_admin_sessions, 0);
		close(p2);
	}
	done(s);
	CU_ASSERT_PTR_NULL(srv.sessions);
	CU_ASSERT_EQUAL(srv.n_sessions, 0);
	close(peer);
	close_server();
}

/* Each refusal answered with its reason, then closed. */
static void test_refusals(void)
{
	struct snapkvd_session *s, *t;
	char text[256];
	int peer, p2, st = 0;

	open_server();
	/* protocol version */
	s = connect_one(&peer);
	hello(s, false, "", SKV_PROTO_VERSION + 1);
	CU_ASSERT_TRUE(s->closing);
	CU_ASSERT_EQUAL(reply(peer, NULL, &st, NULL, 0), SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR);
	CU_ASSERT_EQUAL(st, -EPROTONOSUPPORT);
	done(s);
	close(peer);
	/* an engine name with a control character */
	s = connect_one(&peer);
	hello(s, false, "bad\tname", SKV_PROTO_VERSION);
	CU_ASSERT_TRUE(s->closing);
	reply(peer, NULL, &st, text, sizeof(text));
	CU_ASSERT_EQUAL(st, -EINVAL);
	CU_ASSERT_STRING_EQUAL(text, "engine name is not valid UTF-8 or holds control characters");
	done(s);
	close(peer);
	/* not in allow_uids: answered at HELLO */
	srv.cfg.n_allow_uids = 1;
	srv.cfg.allow_uids[0] = getuid() + 1;
	s = connect_one(&peer);
	CU_ASSERT_EQUAL(s->refused, -EACCES);
	hello(s, false, "", SKV_PROTO_VERSION);
	reply(peer, NULL, &st, text, sizeof(text));
	CU_ASSERT_EQUAL(st, -EACCES);
	CU_ASSERT(strstr(text, "allow_uids") != NULL);
	done(s);
	close(peer);
	srv.cfg.n_allow_uids = 0;
	/* max_sessions_per_tenant, then max_sessions */
	srv.cfg.max_sessions_per_tenant = 1;
	s = connect_one(&peer);
	hello(s, false, "", SKV_PROTO_VERSION);
	CU_ASSERT_EQUAL(srv.n_sessions, 1);
	t = connect_one(&p2);
	hello(t, false, "", SKV_PROTO_VERSION);
	CU_ASSERT_TRUE(t->closing);
	reply(p2, NULL, &st, text, sizeof(text));
	CU_ASSERT_EQUAL(st, -EUSERS);
	CU_ASSERT(strstr(text, "max_sessions_per_tenant is 1") != NULL);
	done(t);
	close(p2);
	srv.cfg.max_sessions = 1;
	srv.cfg.max_sessions_per_tenant = 4;
	t = connect_one(&p2);
	hello(t, false, "", SKV_PROTO_VERSION);
	reply(p2, NULL, &st, text, sizeof(text));
	CU_ASSERT_STRING_EQUAL(text, "too many sessions: 1 open, max_sessions is 1");
	done(t);
	close(p2);
	CU_ASSERT_EQUAL(srv.n_sessions, 1);
	done(s);
	close(peer);
	/* max_admin_sessions: root or the daemon's own uid gets one more */
	srv.cfg.max_admin_sessions = 1;
	s = connect_one(&peer);
	hello(s, true, "", SKV_PROTO_VERSION);
	t = connect_one(&p2);
	hello(t, true, "", SKV_PROTO_VERSION); /* our uid is the daemon's: one more */
	CU_ASSERT_FALSE(t->closing);
	CU_ASSERT_EQUAL(srv.n_admin_sessions, 2);
	done(t);
	close(p2);
	t = connect_one(&p2);
	done(s); /* the first leaves: its slot is free */
	hello(t, true, "", SKV_PROTO_VERSION);
	CU_ASSERT_FALSE(t->closing);
	done(t);
	close(p2);
	close(peer);
	close_server();
}

/* Connections in their handshake hold no slot, only max_handshakes of
 * them exist, and each has hello_timeout_ms. */
static void test_handshakes(void)
{
	struct snapkvd_session *a, *b, *c;
	char text[256];
	int pa, pb, pc, st = 0;

	open_server();
	srv.cfg.max_handshakes = 2;
	a = connect_one(&pa);
	b = connect_one(&pb);
	CU_ASSERT_EQUAL(srv.n_handshakes, 2);
	c = connect_one(&pc); /* the oldest (a) gives way */
	CU_ASSERT_TRUE(a->closing);
	CU_ASSERT_FALSE(b->closing);
	CU_ASSERT_EQUAL(srv.n_handshakes, 2);
	reply(pa, NULL, &st, text, sizeof(text));
	CU_ASSERT_EQUAL(st, -ETIMEDOUT);
	CU_ASSERT(strstr(text, "(max_handshakes)") != NULL);
	/* past hello_timeout_ms: told and closed; before it: kept */
	snapkvd_session_check_hello(b, b->created_ns + 1);
	CU_ASSERT_FALSE(b->closing);
	snapkvd_session_check_hello(b, b->created_ns + srv.cfg.hello_timeout_ms * 1000000ull + 1);
	CU_ASSERT_TRUE(b->closing);
	reply(pb, NULL, &st, text, sizeof(text));
	CU_ASSERT_EQUAL(st, -ETIMEDOUT);
	CU_ASSERT(strstr(text, "hello_timeout_ms") != NULL);
	CU_ASSERT_EQUAL(srv.n_handshakes, 1);
	done(c);
	CU_ASSERT_EQUAL(srv.n_handshakes, 0);
	done(a);
	done(b);
	close(pa);
	close(pb);
	close(pc);
	close_server();
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	snapkvd_log_max = SNAPKVD_LOG_ERR - 1; /* quiet */
	su = CU_add_suite("session", NULL, NULL);
	CU_add_test(su, "HELLO: a Welcome with the ring's fds; admin without", test_welcome);
	CU_add_test(su, "refused HELLOs, each with its reason", test_refusals);
	CU_add_test(su, "handshakes: max_handshakes, hello_timeout_ms", test_handshakes);
	return t_run();
}
