// SPDX-License-Identifier: MIT
/*
 * test-control: a session's control-socket face (daemon/snapkvd-control.c)
 * over a socketpair whose other end plays the engine, with the real
 * session, ring and buffer set below it and fakes for the dispatcher and
 * snapkvctl's answers: the first frame must be HELLO, a frame's fds are
 * closed unless a handler keeps one, REGISTER and UNREGISTER answered from
 * the buffer set, an unknown message type answered without closing,
 * CUDA_ARENA refused on the host backend, REQUEST handed to the
 * dispatcher, ADMIN passed through, and a bad frame closing the session.
 */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/snapkvd-control.c"
#include "tests/test-skip.h"

/* ------------------------------------------------------------- the fakes */

static unsigned armed, requests;
static bool recv_armed; /* a recvmsg is armed: it holds a session reference */
static struct msghdr *armed_msg;

int snapkvd_loop_recvmsg(struct snapkvd_loop *l, int fd, struct msghdr *m, unsigned flags,
			 struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd, (void)flags, (void)ev;
	armed++;
	armed_msg = m;
	recv_armed = true;
	return 0;
}

int snapkvd_loop_read(struct snapkvd_loop *l, int fd, void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd, (void)buf, (void)len, (void)ev;
	return 0;
}

void snapkvd_dispatch_request(struct snapkvd_session *s, const struct snapkvd_origin *o,
			      const uint8_t *buf, size_t len)
{
	(void)s, (void)buf, (void)len;
	CU_ASSERT_FALSE(o->ring);
	requests++;
}

/* 'x': cannot be answered; 'p': queued (its done kept in queued_done);
 * else answered at once with "ok!" */
static snapkvd_adminq_done_fn *queued_done;

int snapkvd_adminq_request(struct snapkvd_adminq *q, struct snapkvd_server *srv,
			   struct snapkvd_session *s, const uint8_t *payload, size_t len,
			   snapkvd_adminq_done_fn *done, uint8_t **ret_buf, size_t *ret_len)
{
	(void)q, (void)srv;
	*ret_buf = NULL;
	if (len && payload[0] == 'x')
		return -ENOMEM;
	if (len && payload[0] == 'p') {
		queued_done = done;
		s->admin_pending = true;
		return 1;
	}
	*ret_buf = malloc(3);
	memcpy(*ret_buf, "ok!", 3);
	*ret_len = 3;
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
static struct snapkvd_session *s;
static int peer = -1;

static unsigned open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	unsigned n = 0;

	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n;
}

static void open_session(void)
{
	struct skv_error kerr = {{0}, -1, -1};
	int sv[2];

	memset(&srv, 0, sizeof(srv));
	snapkvd_config_defaults(&srv.cfg);
	srv.cfg.session_arena_bytes = 1 << 20;
	srv.cfg.max_buffers = 4;
	/* the log causes as snapkvd_server_init sets them */
	for (int i = 0; i < SNAPKVD_FLOOD_N; i++)
		srv.floods[i] =
		    (struct snapkvd_log_cause){.what = "test events", .level = SNAPKVD_LOG_NOTICE};
	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_new(1 << 30, 0, &srv.pool), 0);
	snapkvd_pool_set_map_limits(srv.pool, 64, 1ull << 30, 1ull << 30);
	CU_ASSERT_EQUAL_FATAL(snapkvd_device_new("host", NULL, 0, &srv.device, &kerr), 0);
	CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	peer = sv[1];
	CU_ASSERT_EQUAL_FATAL(snapkvd_session_new(&srv, sv[0], &s), 0);
	armed = 0;
	CU_ASSERT_EQUAL_FATAL(snapkvd_control_start(s), 0);
	CU_ASSERT_EQUAL(armed, 1);
	CU_ASSERT_PTR_EQUAL(armed_msg, &s->recv.msg);
	s->refs++; /* kept after a close, to look at */
}

static void close_session(void)
{
	if (!s->closing)
		snapkvd_session_close(s, 0);
	if (recv_armed)
		on_recv(s, -ECANCELED); /* the armed recvmsg completes */
	recv_armed = false;
	if (s->ring)
		s->refs--; /* the doorbell read, never completed here */
	snapkvd_session_unref(s);
	CU_ASSERT_PTR_NULL(srv.sessions);
	close(peer);
	snapkvd_device_free(srv.device);
	snapkvd_pool_free(srv.pool);
}

/* The engine sends a frame; the armed recvmsg completes with it. */
static void deliver(uint16_t type, const void *payload, size_t len, const int *fds, unsigned n)
{
	ssize_t got;

	CU_ASSERT_EQUAL_FATAL(skv_frame_send(peer, type, payload, len, fds, n, 0), 0);
	got = recvmsg(s->fd, &s->recv.msg, MSG_CMSG_CLOEXEC);
	CU_ASSERT_FATAL(got > 0);
	recv_armed = false;
	on_recv(s, (int)got);
}

static void deliver_msg(uint16_t type, const ProtobufCMessage *m, const int *fds, unsigned n)
{
	uint8_t buf[1024];
	size_t len = protobuf_c_message_pack(m, buf);

	deliver(type, buf, len, fds, n);
}

static void do_hello(void)
{
	Snapkv__V1__Hello h = SNAPKV__V1__HELLO__INIT;
	uint8_t buf[SKV_FRAME_HDR_SIZE + 65536];
	struct skv_frame_hdr hdr;
	int fds[SKV_FRAME_MAX_FDS];
	unsigned n = SKV_FRAME_MAX_FDS;

	h.client_version = SKV_PROTO_VERSION;
	deliver_msg(SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, &h.base, NULL, 0);
	CU_ASSERT_FALSE_FATAL(s->closing);
	CU_ASSERT(skv_frame_recv(peer, buf, sizeof(buf), &hdr, fds, &n, MSG_DONTWAIT) >= 0);
	CU_ASSERT_EQUAL(hdr.type, SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME);
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* The next frame's type and payload (into buf, its length returned). */
static int next_frame(uint16_t *type, uint8_t *buf, size_t cap)
{
	struct skv_frame_hdr hdr;
	int r = skv_frame_recv(peer, buf, cap, &hdr, NULL, NULL, MSG_DONTWAIT);

	*type = hdr.type;
	return r;
}

static Snapkv__V1__RegisterReply *reg_reply_of(void)
{
	static uint8_t buf[SKV_FRAME_HDR_SIZE + 4096];
	uint16_t type = 0;
	int n = next_frame(&type, buf, sizeof(buf));

	CU_ASSERT_FATAL(n >= 0);
	CU_ASSERT_EQUAL(type, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY);
	return snapkv__v1__register_reply__unpack(NULL, (size_t)n, buf + SKV_FRAME_HDR_SIZE);
}

static int sealed_memfd(size_t n)
{
	int fd = memfd_create("test-control", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(ftruncate(fd, (off_t)n), 0);
	CU_ASSERT_EQUAL(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	return fd;
}

/* ----------------------------------------------------------------- tests */

static void test_hello_first(void)
{
	Snapkv__V1__Unregister u = SNAPKV__V1__UNREGISTER__INIT;

	open_session();
	deliver_msg(SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER, &u.base, NULL, 0);
	CU_ASSERT_TRUE(s->closing);
	close_session();
	/* and only the first */
	open_session();
	do_hello();
	CU_ASSERT_EQUAL(armed, 2); /* re-armed after the frame */
	{
		Snapkv__V1__Hello h = SNAPKV__V1__HELLO__INIT;

		h.client_version = SKV_PROTO_VERSION;
		deliver_msg(SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, &h.base, NULL, 0);
	}
	CU_ASSERT_TRUE(s->closing);
	close_session();
}

static void test_register(void)
{
	Snapkv__V1__RegisterBuffer m = SNAPKV__V1__REGISTER_BUFFER__INIT;
	Snapkv__V1__Unregister u = SNAPKV__V1__UNREGISTER__INIT;
	Snapkv__V1__RegisterReply *rr;
	uint8_t buf[256];
	uint16_t type;
	int fds[2], n;
	unsigned before;

	open_session();
	do_hello();
	before = open_fds();
	/* two fds: none is used, the guard closes both */
	fds[0] = sealed_memfd(4096);
	fds[1] = sealed_memfd(4096);
	m.generation = 1;
	deliver_msg(SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, &m.base, fds, 2);
	rr = reg_reply_of();
	CU_ASSERT_EQUAL(rr->status, -EBADF);
	CU_ASSERT_STRING_EQUAL(rr->error, "RegisterBuffer needs exactly one fd");
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	close(fds[0]);
	close(fds[1]);
	CU_ASSERT_EQUAL(open_fds(), before); /* ours closed, and the daemon's copies */
	/* one memfd: registered, charged, buffer 1 */
	fds[0] = sealed_memfd(8192);
	deliver_msg(SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, &m.base, fds, 1);
	close(fds[0]);
	rr = reg_reply_of();
	CU_ASSERT_EQUAL(rr->status, 0);
	CU_ASSERT_EQUAL(rr->buffer_id, 1);
	CU_ASSERT_EQUAL(rr->size, 8192);
	CU_ASSERT_STRING_EQUAL(rr->transport, "memfd");
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	CU_ASSERT_EQUAL(s->buffers.n, 1);
	/* unknown kind */
	m.kind = 77;
	deliver_msg(SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, &m.base, NULL, 0);
	rr = reg_reply_of();
	CU_ASSERT_EQUAL(rr->status, -EINVAL);
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	/* unregister: once, then no such buffer */
	u.buffer_id = 1;
	for (int i = 0; i < 2; i++) {
		Snapkv__V1__UnregisterReply *ur;

		deliver_msg(SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER, &u.base, NULL, 0);
		n = next_frame(&type, buf, sizeof(buf));
		CU_ASSERT_EQUAL(type, SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY);
		ur =
		    snapkv__v1__unregister_reply__unpack(NULL, (size_t)n, buf + SKV_FRAME_HDR_SIZE);
		CU_ASSERT_PTR_NOT_NULL_FATAL(ur);
		CU_ASSERT_EQUAL(ur->status, i ? -ENOENT : 0);
		snapkv__v1__unregister_reply__free_unpacked(ur, NULL);
	}
	CU_ASSERT_EQUAL(s->buffers.n, 0);
	CU_ASSERT_EQUAL(s->errors, 2);
	close_session();
}

static void test_routing(void)
{
	uint8_t buf[512];
	uint16_t type = 0;
	int n;

	open_session();
	do_hello();
	/* unknown type: answered, kept open */
	deliver(999, "", 0, NULL, 0);
	CU_ASSERT_FALSE(s->closing);
	n = next_frame(&type, buf, sizeof(buf));
	CU_ASSERT_EQUAL(type, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR);
	{
		Snapkv__V1__ErrorNotice *e =
		    snapkv__v1__error_notice__unpack(NULL, (size_t)n, buf + SKV_FRAME_HDR_SIZE);

		CU_ASSERT_EQUAL(e->status, -EOPNOTSUPP);
		snapkv__v1__error_notice__free_unpacked(e, NULL);
	}
	/* a GPU arena on the host backend */
	deliver(SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA, "", 0, NULL, 0);
	n = next_frame(&type, buf, sizeof(buf));
	CU_ASSERT_EQUAL(type, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY);
	{
		Snapkv__V1__CudaArena *a =
		    snapkv__v1__cuda_arena__unpack(NULL, (size_t)n, buf + SKV_FRAME_HDR_SIZE);

		CU_ASSERT_EQUAL(a->status, -ENOTSUP);
		CU_ASSERT(strstr(a->error, "--backend cuda") != NULL);
		snapkv__v1__cuda_arena__free_unpacked(a, NULL);
	}
	/* a socket request: to the dispatcher */
	requests = 0;
	deliver(SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, "", 0, NULL, 0);
	CU_ASSERT_EQUAL(requests, 1);
	/* ADMIN passed through as it is answered */
	deliver(SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, "q", 1, NULL, 0);
	n = next_frame(&type, buf, sizeof(buf));
	CU_ASSERT_EQUAL(type, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY);
	CU_ASSERT_EQUAL(n, 3);
	CU_ASSERT_EQUAL(memcmp(buf + SKV_FRAME_HDR_SIZE, "ok!", 3), 0);
	/* an answer built in slices: the next frame is not read until it is
	 * sent, then it is */
	armed = 0;
	deliver(SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, "p", 1, NULL, 0);
	CU_ASSERT_FALSE(s->closing);
	CU_ASSERT_EQUAL(armed, 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(queued_done);
	s->admin_pending = false;
	queued_done(s, (const uint8_t *)"pg!", 3);
	CU_ASSERT_EQUAL(armed, 1);
	n = next_frame(&type, buf, sizeof(buf));
	CU_ASSERT_EQUAL(type, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY);
	CU_ASSERT_EQUAL(n, 3);
	CU_ASSERT_EQUAL(memcmp(buf + SKV_FRAME_HDR_SIZE, "pg!", 3), 0);
	/* an admin request it cannot answer closes the session */
	deliver(SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, "x", 1, NULL, 0);
	CU_ASSERT_TRUE(s->closing);
	close_session();
}

/* Framing we cannot trust closes the session. */
static void test_bad_frame(void)
{
	uint8_t junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	ssize_t got;

	open_session();
	CU_ASSERT_EQUAL(send(peer, junk, sizeof(junk), 0), (ssize_t)sizeof(junk));
	got = recvmsg(s->fd, &s->recv.msg, MSG_CMSG_CLOEXEC);
	recv_armed = false;
	on_recv(s, (int)got);
	CU_ASSERT_TRUE(s->closing);
	close_session();
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	snapkvd_log_max = SNAPKVD_LOG_ERR - 1; /* quiet */
	su = CU_add_suite("control", NULL, NULL);
	CU_add_test(su, "HELLO first, and only first", test_hello_first);
	CU_add_test(su, "REGISTER/UNREGISTER and the fd guard", test_register);
	CU_add_test(su, "unknown, CUDA_ARENA, REQUEST, ADMIN", test_routing);
	CU_add_test(su, "a bad frame closes the session", test_bad_frame);
	return t_run();
}
