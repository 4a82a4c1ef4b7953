// SPDX-License-Identifier: MIT
/*
 * test-daemon-badinput: bad input never takes snapkvd down. Malformed frames,
 * wrong magic/version, truncated protobuf, unknown types, out-of-range
 * offsets and strides, unknown or released ids, absurd shapes, NaN logits,
 * a corrupt ring tail and a client that stops reading completions each get a
 * specific error or close that one session; a bystander engine keeps working
 * and the daemon's fds and pool bytes return to their baseline.
 */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdbool.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include "daemon-harness.h"
#include "proto/skv-ring.h"
#include "snapkv.h"

static struct harness H;
static struct skv_client *bystander;
static int base_fds;

static int suite_init(void)
{
	if (h_start(&H, NULL) < 0)
		return -1;
	if (skv_client_connect(H.sock, NULL, &bystander) < 0)
		return -1;
	/* the bystander's session (socket, doorbells, arena) is in the baseline */
	h_sleep_ms(50);
	base_fds = h_count_fds(H.pid);
	return 0;
}

static int suite_clean(void)
{
	int st;

	skv_client_close(bystander);
	st = h_stop(&H);
	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

static void bystander_ok(void)
{
	CU_ASSERT_EQUAL(skv_client_nop(bystander), 0);
	CU_ASSERT(h_alive(&H));
}

struct raw {
	int fd, fds[4];
	uint8_t buf[SKV_FRAME_HDR_SIZE + 65536];
};

static int raw_connect(struct raw *r)
{
	memset(r->fds, -1, sizeof(r->fds));
	r->fd = h_connect_raw(H.sock);
	return r->fd < 0 ? r->fd : 0;
}

static int raw_hello(struct raw *r)
{
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	struct skv_frame_hdr h;
	unsigned nf = 4;
	size_t n;

	hello.client_version = SKV_PROTO_VERSION;
	n = snapkv__v1__hello__pack(&hello, r->buf);
	if (skv_frame_send(r->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, r->buf, n, NULL, 0, 0) < 0)
		return -EIO;
	if (skv_frame_recv(r->fd, r->buf, sizeof(r->buf), &h, r->fds, &nf, 0) < 0)
		return -EIO;
	return h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME && nf == 4 ? 0 : -EPROTO;
}

static void raw_close(struct raw *r)
{
	for (int i = 0; i < 4; i++)
		if (r->fds[i] >= 0)
			close(r->fds[i]);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

/* Next frame from the daemon: its type, with an ERROR's status in *st. 0 on EOF. */
static int raw_next(struct raw *r, int *st)
{
	struct skv_frame_hdr h;
	int n = skv_frame_recv(r->fd, r->buf, sizeof(r->buf), &h, NULL, NULL, 0);

	if (n < 0)
		return 0;
	if (h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR && st) {
		Snapkv__V1__ErrorNotice *e =
		    snapkv__v1__error_notice__unpack(NULL, h.length, r->buf + SKV_FRAME_HDR_SIZE);
		*st = e ? e->status : 0;
		if (e)
			snapkv__v1__error_notice__free_unpacked(e, NULL);
	}
	if (h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE && st) {
		Snapkv__V1__Response *e =
		    snapkv__v1__response__unpack(NULL, h.length, r->buf + SKV_FRAME_HDR_SIZE);
		*st = e ? e->status : 1;
		if (e)
			snapkv__v1__response__free_unpacked(e, NULL);
	}
	return h.type;
}

/* The session was closed by the daemon with status want (ERROR then EOF). */
static void expect_closed(struct raw *r, int want)
{
	int st = 0, t = raw_next(r, &st);

	CU_ASSERT_EQUAL(t, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR);
	CU_ASSERT_EQUAL(st, want);
	CU_ASSERT_EQUAL(raw_next(r, NULL), 0);
}

static void send_raw_hdr(int fd, uint32_t magic, uint16_t ver, uint16_t type, uint32_t len,
			 size_t body)
{
	uint8_t b[64] = {0};
	struct skv_frame_hdr h = {magic, ver, type, 0, len};

	skv_frame_hdr_encode(&h, b);
	CU_ASSERT_EQUAL(send(fd, b, SKV_FRAME_HDR_SIZE + body, 0),
			(ssize_t)(SKV_FRAME_HDR_SIZE + body));
}

static void test_frames(void)
{
	struct raw r;

	/* garbage instead of a frame */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	CU_ASSERT_EQUAL(send(r.fd, "GET / HTTP/1.1\r\n\r\n", 18, 0), 18);
	expect_closed(&r, -EBADMSG);
	raw_close(&r);
	bystander_ok();
	/* wrong magic */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	send_raw_hdr(r.fd, 0x12345678, SKV_PROTO_VERSION, 1, 0, 0);
	expect_closed(&r, -EBADMSG);
	raw_close(&r);
	/* wrong version */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	send_raw_hdr(r.fd, SKV_FRAME_MAGIC, 7, 1, 0, 0);
	expect_closed(&r, -EPROTONOSUPPORT);
	raw_close(&r);
	/* a length beyond the limit, and one that lies about the datagram */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	send_raw_hdr(r.fd, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 1, 0x7fffffff, 0);
	expect_closed(&r, -EMSGSIZE);
	raw_close(&r);
	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	send_raw_hdr(r.fd, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 1, 40, 8);
	expect_closed(&r, -EBADMSG);
	raw_close(&r);
	/* a request before HELLO */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	send_raw_hdr(r.fd, SKV_FRAME_MAGIC, SKV_PROTO_VERSION,
		     SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, 0, 0);
	expect_closed(&r, -EPROTO);
	raw_close(&r);
	/* a HELLO that is not protobuf */
	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	CU_ASSERT_EQUAL(skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, "\xff\xff\xff",
				       3, NULL, 0, 0),
			0);
	expect_closed(&r, -EBADMSG);
	raw_close(&r);
	bystander_ok();
}

static void test_messages(void)
{
	struct raw r;
	int st = 0, p[2];
	uint8_t trunc[] = {0x12, 0x20, 0x08, 0x01}; /* compact: length 32, 2 bytes follow */

	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	CU_ASSERT_EQUAL_FATAL(raw_hello(&r), 0);
	/* unknown message type: an error, the session stays */
	CU_ASSERT_EQUAL(skv_frame_send(r.fd, 77, "x", 1, NULL, 0, 0), 0);
	CU_ASSERT_EQUAL(raw_next(&r, &st), SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR);
	CU_ASSERT_EQUAL(st, -EOPNOTSUPP);
	/* truncated protobuf: -EBADMSG for that request */
	CU_ASSERT_EQUAL(skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, trunc,
				       sizeof(trunc), NULL, 0, 0),
			0);
	CU_ASSERT_EQUAL(raw_next(&r, &st), SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE);
	CU_ASSERT_EQUAL(st, -EBADMSG);
	/* fds nobody asked for are closed, not kept */
	CU_ASSERT_EQUAL_FATAL(pipe(p), 0);
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__NopRequest nop = SNAPKV__V1__NOP_REQUEST__INIT;
	req.op_case = SNAPKV__V1__REQUEST__OP_NOP;
	req.nop = &nop;
	size_t n = snapkv__v1__request__pack(&req, r.buf);
	CU_ASSERT_EQUAL(
	    skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, r.buf, n, p, 2, 0), 0);
	CU_ASSERT_EQUAL(raw_next(&r, &st), SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE);
	CU_ASSERT_EQUAL(st, 0);
	close(p[0]);
	close(p[1]);
	/* a REGISTER without its fd */
	Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
	rb.size = 4096;
	n = snapkv__v1__register_buffer__pack(&rb, r.buf);
	CU_ASSERT_EQUAL(
	    skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, r.buf, n, NULL, 0, 0), 0);
	CU_ASSERT_EQUAL(raw_next(&r, NULL), SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY);
	/* a registered, then unregistered buffer is unknown afterwards */
	{
		int mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		Snapkv__V1__RegisterReply *rr;
		Snapkv__V1__Unregister un = SNAPKV__V1__UNREGISTER__INIT;
		struct skv_frame_hdr hh;
		uint64_t id;

		CU_ASSERT_EQUAL(ftruncate(mfd, 1 << 16), 0);
		CU_ASSERT_EQUAL(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
		n = snapkv__v1__register_buffer__pack(&rb, r.buf);
		CU_ASSERT_EQUAL(skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, r.buf,
					       n, &mfd, 1, 0),
				0);
		close(mfd);
		CU_ASSERT_FATAL(skv_frame_recv(r.fd, r.buf, sizeof(r.buf), &hh, NULL, NULL, 0) >=
				0);
		rr =
		    snapkv__v1__register_reply__unpack(NULL, hh.length, r.buf + SKV_FRAME_HDR_SIZE);
		CU_ASSERT_PTR_NOT_NULL_FATAL(rr);
		CU_ASSERT_EQUAL(rr->status, 0);
		id = rr->buffer_id;
		snapkv__v1__register_reply__free_unpacked(rr, NULL);
		for (int i = 0; i < 2; i++) {
			Snapkv__V1__UnregisterReply *ur;

			un.buffer_id = id;
			n = snapkv__v1__unregister__pack(&un, r.buf);
			CU_ASSERT_EQUAL(skv_frame_send(r.fd,
						       SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER,
						       r.buf, n, NULL, 0, 0),
					0);
			CU_ASSERT_FATAL(
			    skv_frame_recv(r.fd, r.buf, sizeof(r.buf), &hh, NULL, NULL, 0) >= 0);
			ur = snapkv__v1__unregister_reply__unpack(NULL, hh.length,
								  r.buf + SKV_FRAME_HDR_SIZE);
			CU_ASSERT_PTR_NOT_NULL_FATAL(ur);
			CU_ASSERT_EQUAL(ur->status, i == 0 ? 0 : -ENOENT);
			snapkv__v1__unregister_reply__free_unpacked(ur, NULL);
		}
		struct h_compact c;

		h_compact_init(&c, id, 1, 64, 16, 8, 0, 8, 24);
		n = snapkv__v1__request__pack(&c.req, r.buf);
		CU_ASSERT_EQUAL(skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, r.buf,
					       n, NULL, 0, 0),
				0);
		CU_ASSERT_EQUAL(raw_next(&r, &st), SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE);
		CU_ASSERT_EQUAL(st, -ENOENT);
	}
	/* a second HELLO is a protocol error: closed */
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	hello.client_version = SKV_PROTO_VERSION;
	n = snapkv__v1__hello__pack(&hello, r.buf);
	CU_ASSERT_EQUAL(
	    skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, r.buf, n, NULL, 0, 0), 0);
	expect_closed(&r, -EPROTO);
	raw_close(&r);
	bystander_ok();
}

/* Requests through libsnapkv with bad shapes, offsets, ids and values. */
/* Send one RegisterBuffer (with fd, or -1) and return the reply's status. */
static int raw_register(struct raw *r, const Snapkv__V1__RegisterBuffer *rb, int fd, char *ret_err,
			size_t errlen)
{
	Snapkv__V1__RegisterReply *rr;
	struct skv_frame_hdr hh;
	size_t n = snapkv__v1__register_buffer__pack(rb, r->buf);
	int st;

	if (skv_frame_send(r->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, r->buf, n, &fd,
			   fd >= 0 ? 1 : 0, 0) < 0)
		return -EIO;
	if (skv_frame_recv(r->fd, r->buf, sizeof(r->buf), &hh, NULL, NULL, 0) < 0 ||
	    hh.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY)
		return -EPROTO;
	rr = snapkv__v1__register_reply__unpack(NULL, hh.length, r->buf + SKV_FRAME_HDR_SIZE);
	if (!rr)
		return -EBADMSG;
	st = rr->status;
	snprintf(ret_err, errlen, "%s", rr->error ? rr->error : "");
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	return st;
}

/*
 * CUDA registrations reach a host-backend daemon: -ENOTSUP naming --backend
 * cuda, the fd closed (the baseline test counts them), the session alive;
 * an unknown kind is -EINVAL; the GPU arena request is -ENOTSUP too. Against
 * --backend cuda (SNAPKVD_TEST_BACKEND=cuda-emu) the same messages are bad
 * CUDA input instead: a 64 KiB memfd is no VMM allocation of a granule's
 * size, the handle's bytes name nothing, an IPC registration takes no fd
 * (all -EINVAL, the fd closed), and the arena is granted with one fd.
 */
static void test_cuda_on_host(void)
{
	struct raw r;
	char err[256];
	uint8_t handle[64] = {1, 2, 3};
	int mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	bool cuda = h_backend_cuda();

	CU_ASSERT_FATAL(mfd >= 0);
	CU_ASSERT_EQUAL(ftruncate(mfd, 1 << 16), 0);
	CU_ASSERT_FATAL(raw_connect(&r) == 0);
	CU_ASSERT_FATAL(raw_hello(&r) == 0);
	Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
	rb.size = 1 << 16;
	rb.generation = 7;
	rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
	CU_ASSERT_EQUAL(raw_register(&r, &rb, mfd, err, sizeof(err)), cuda ? -EINVAL : -ENOTSUP);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, cuda ? "granularity" : "--backend cuda"));
	rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	rb.ipc_handle.data = handle;
	rb.ipc_handle.len = sizeof(handle);
	CU_ASSERT_EQUAL(raw_register(&r, &rb, -1, err, sizeof(err)), cuda ? -EINVAL : -ENOTSUP);
	/* an IPC registration carrying an fd: still refused, the fd closed */
	CU_ASSERT_EQUAL(raw_register(&r, &rb, mfd, err, sizeof(err)), cuda ? -EINVAL : -ENOTSUP);
	rb.kind = (Snapkv__V1__BufferKind)9;
	CU_ASSERT_EQUAL(raw_register(&r, &rb, mfd, err, sizeof(err)), -EINVAL);
	{
		Snapkv__V1__CudaArenaRequest ar = SNAPKV__V1__CUDA_ARENA_REQUEST__INIT;
		Snapkv__V1__CudaArena *a;
		struct skv_frame_hdr hh;
		int fds[1] = {-1};
		unsigned nf = 1;
		size_t n = snapkv__v1__cuda_arena_request__pack(&ar, r.buf);

		CU_ASSERT_EQUAL(skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA,
					       r.buf, n, NULL, 0, 0),
				0);
		CU_ASSERT_FATAL(skv_frame_recv(r.fd, r.buf, sizeof(r.buf), &hh, fds, &nf, 0) >= 0);
		CU_ASSERT_EQUAL(hh.type, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY);
		CU_ASSERT_EQUAL(nf, cuda ? 1u : 0u);
		if (nf == 1)
			close(fds[0]);
		a = snapkv__v1__cuda_arena__unpack(NULL, hh.length, r.buf + SKV_FRAME_HDR_SIZE);
		CU_ASSERT_PTR_NOT_NULL_FATAL(a);
		CU_ASSERT_EQUAL(a->status, cuda ? 0 : -ENOTSUP);
		snapkv__v1__cuda_arena__free_unpacked(a, NULL);
	}
	/* a REGISTER with two fds: refused, both closed (the baseline test
	 * counts the daemon's fds) */
	{
		int two[2] = {mfd, mfd};

		rb = (Snapkv__V1__RegisterBuffer)SNAPKV__V1__REGISTER_BUFFER__INIT;
		rb.size = 4096;
		size_t n = snapkv__v1__register_buffer__pack(&rb, r.buf);
		CU_ASSERT_EQUAL(skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, r.buf,
					       n, two, 2, 0),
				0);
		CU_ASSERT_EQUAL(raw_next(&r, NULL), SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY);
	}
	close(mfd);
	/* the session still works */
	rb = (Snapkv__V1__RegisterBuffer)SNAPKV__V1__REGISTER_BUFFER__INIT;
	rb.size = 4096;
	mfd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CU_ASSERT_EQUAL(ftruncate(mfd, 1 << 16), 0);
	CU_ASSERT_EQUAL(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	CU_ASSERT_EQUAL(raw_register(&r, &rb, mfd, err, sizeof(err)), 0);
	close(mfd);
	raw_close(&r);
	bystander_ok();
}

static void test_requests(void)
{
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[2];
	struct skv_compact_desc d, g;
	struct skv_cache *k = NULL;
	const uint32_t L = 64, D = 16, W = 8, NH = 2;
	size_t kv = (size_t)NH * L * D * 4, q = (size_t)NH * W * D * 4;
	uint64_t seed = 1;

	CU_ASSERT_EQUAL_FATAL(skv_client_connect(H.sock, NULL, &c), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, q + 2 * kv, &b), 0);
	float *f = skv_buffer_data(b);
	for (size_t i = 0; i < (q + 2 * kv) / 4; i++)
		f[i] = h_rand(&seed);
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = NH, .h_kv = NH, .n_q = W};
	d.layers = 1;
	skv_client_params_init(&d.params);
	d.params.window = W;
	d.params.capacity = 24;
	lr[0].q = (struct skv_tensor_ref){b, 0, SKV_DTYPE_F32, (int64_t)W * D, D, 0, 0};
	lr[0].k = (struct skv_tensor_ref){b, q, SKV_DTYPE_F32, (int64_t)L * D, D, 0, 0};
	lr[0].v = (struct skv_tensor_ref){b, q + kv, SKV_DTYPE_F32, (int64_t)L * D, D, 0, 0};
	d.layer = lr;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	k = NULL;

	/* out of range: V one row past the end */
	lr[0].v.offset = q + kv + D * 4;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -ERANGE);
	lr[0].v.offset = q + kv;
	/* strides that overflow */
	lr[0].k.head_stride = INT64_MAX / 2;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -ERANGE);
	lr[0].k.head_stride = -1;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
	lr[0].k.head_stride = (int64_t)L * D;
	/* misaligned offset */
	lr[0].k.offset = q + 2;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
	lr[0].k.offset = q;
	/* unknown dtype */
	lr[0].k.dtype = 9;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
	lr[0].k.dtype = SKV_DTYPE_F32;
	/* paged with a short or negative block table, or a block past the end */
	int32_t bt[4] = {0, 1, 2, 3};
	g = d;
	struct skv_layer_ref pl[1] = {lr[0]};
	pl[0].k.block_size = 16;
	pl[0].k.block_stride = 16 * D;
	pl[0].k.head_stride = (int64_t)L * D;
	g.layer = pl;
	g.block_table = bt;
	g.n_blocks = 2;
	CU_ASSERT_EQUAL(skv_client_compact(c, &g, &k), -EINVAL);
	g.n_blocks = 4;
	bt[2] = -5;
	CU_ASSERT_EQUAL(skv_client_compact(c, &g, &k), -EINVAL);
	bt[2] = 1000;
	CU_ASSERT_EQUAL(skv_client_compact(c, &g, &k), -ERANGE);
	bt[2] = 2;
	/* absurd shapes and invalid parameters */
	d.shape.prompt_len = 1u << 30;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -E2BIG);
	d.shape.prompt_len = L;
	d.shape.head_dim = 0;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
	d.shape.head_dim = D;
	d.shape.h_kv = 3;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
	d.shape.h_kv = NH;
	d.params.capacity = W; /* C <= W */
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
	d.params.capacity = 24;
	d.params.kernel = 4; /* even */
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EINVAL);
	d.params.kernel = 5;
	d.decode_reserve = 1u << 30;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -E2BIG);
	d.decode_reserve = 0;
	/* within every shape limit, but G 512 at L 2^18 needs > 1 GiB of scratch
	 * per thread: over the default bound (512 MiB per thread, 2 threads
	 * here), refused before any work */
	d.shape.h_q = 1024;
	d.shape.prompt_len = 1u << 18;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -E2BIG);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "(default: 512 MiB per thread)"));
	d.shape.h_q = NH;
	d.shape.prompt_len = L;
	/* NaN logits: -EDOM for that request only */
	f[3] = NAN;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -EDOM);
	f[3] = 0.5f;
	/* a released cache is gone */
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	struct skv_cache *k2 = NULL;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k2), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k2), 0);
	CU_ASSERT_EQUAL(skv_cache_append(k, 0), 0);
	CU_ASSERT_EQUAL(skv_cache_append(k, 1), -ENOSPC);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	/* the session still works */
	CU_ASSERT_EQUAL(skv_client_nop(c), 0);
	skv_buffer_free(b);
	skv_client_close(c);
	bystander_ok();
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 5000), 0);
}

/*
 * The scratch a compaction needs grows with G * L (column sums per query
 * head), not with the buffer: a 256 KiB K with G = 256, L = 2^16 needs about
 * 3 * 64 MiB. A daemon with max_scratch_bytes = 32M must refuse it before
 * any work with -E2BIG naming the numbers, and still serve a small one.
 */
static void test_scratch_limit(void)
{
	struct harness h2 = {.pid = 0};
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[1];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	const uint32_t L = 1u << 16, D = 1, W = 8, G = 256;
	size_t kv = (size_t)L * D * 4, q = (size_t)G * W * D * 4;
	const char *extra[] = {"--config", NULL, NULL};
	char cfg[128];
	uint64_t seed = 3;
	FILE *fp;

	snprintf(h2.dir, sizeof(h2.dir), "/tmp/snapkvd-test-XXXXXX");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(h2.dir));
	snprintf(cfg, sizeof(cfg), "%s/snapkvd.conf", h2.dir);
	fp = fopen(cfg, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(fp);
	fprintf(fp, "max_scratch_bytes = 32M\n");
	fclose(fp);
	extra[1] = cfg;
	if (h_start(&h2, extra) < 0) {
		CU_FAIL("second snapkvd did not start");
		unlink(cfg);
		h_cleanup(&h2);
		return;
	}
	/* no _FATAL from here on: the second daemon is stopped on every path */
	CU_ASSERT_EQUAL(skv_client_connect(h2.sock, NULL, &c), 0);
	if (c)
		CU_ASSERT_EQUAL(skv_buffer_alloc(c, q + 2 * kv, &b), 0);
	if (!b)
		goto out;
	float *f = skv_buffer_data(b);
	for (size_t i = 0; i < (q + 2 * kv) / 4; i++)
		f[i] = h_rand(&seed);
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape = (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = G, .h_kv = 1, .n_q = W};
	d.layers = 1;
	skv_client_params_init(&d.params);
	d.params.window = W;
	d.params.capacity = 64;
	lr[0].q = (struct skv_tensor_ref){b, 0, SKV_DTYPE_F32, (int64_t)W * D, D, 0, 0};
	lr[0].k = (struct skv_tensor_ref){b, q, SKV_DTYPE_F32, (int64_t)L * D, D, 0, 0};
	lr[0].v = (struct skv_tensor_ref){b, q + kv, SKV_DTYPE_F32, (int64_t)L * D, D, 0, 0};
	d.layer = lr;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), -E2BIG);
	printf("\n    refused: %s\n    ", skv_client_error(c));
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "max_scratch_bytes 33554432"));
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "G 256, L 65536"));
	CU_ASSERT_PTR_NULL(k);
	/* nothing was reserved for it; a small request in the same session works */
	CU_ASSERT_EQUAL(h_pool_used(h2.sock), 0);
	d.shape.h_q = 4;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	skv_buffer_free(b);
out:
	skv_client_close(c);
	CU_ASSERT_EQUAL(h_stop(&h2), 0);
	unlink(cfg);
	h_cleanup(&h2);
	bystander_ok();
}

struct rring {
	uint8_t *map;
	size_t size;
	struct skv_ring_layout l;
	struct skv_ring_q sq, cq;
};

static int rring_map(struct raw *r, struct rring *x)
{
	x->size = 0;
	off_t sz = lseek(r->fds[0], 0, SEEK_END);
	if (sz <= 0)
		return -EINVAL;
	x->size = sz;
	x->map = mmap(NULL, x->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fds[0], 0);
	if (x->map == MAP_FAILED)
		return -errno;
	memcpy(&x->l, x->map, sizeof(x->l));
	if (skv_ring_layout_check(&x->l, x->size) < 0)
		return -EBADMSG;
	skv_ring_q_init(&x->sq, x->map, x->l.sq_off, x->l.sq_entries, sizeof(struct skv_sqe));
	skv_ring_q_init(&x->cq, x->map, x->l.cq_off, x->l.cq_entries, sizeof(struct skv_cqe));
	return 0;
}

static void rring_push(struct raw *r, struct rring *x, const struct skv_sqe *e)
{
	CU_ASSERT_EQUAL(skv_ring_produce(&x->sq, e), 0);
	if (skv_ring_needs_wakeup(&x->sq))
		eventfd_write(r->fds[2], 1);
}

static int rring_pop(struct rring *x, struct skv_cqe *e, int ms)
{
	for (int i = 0; i < ms * 10; i++) {
		if (skv_ring_consume(&x->cq, e) == 0)
			return 0;
		usleep(100);
	}
	return -ETIMEDOUT;
}

static void test_ring(void)
{
	struct raw r;
	struct rring x;
	struct skv_sqe e = {0};
	struct skv_cqe c;

	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	CU_ASSERT_EQUAL_FATAL(raw_hello(&r), 0);
	CU_ASSERT_EQUAL_FATAL(rring_map(&r, &x), 0);
	/* bad slot, oversized length, unknown opcode, garbage payload */
	e.opcode = SKV_OP_REQUEST;
	e.slot = x.l.arg_slots + 5;
	e.user_data = 1;
	rring_push(&r, &x, &e);
	CU_ASSERT_EQUAL_FATAL(rring_pop(&x, &c, 5000), 0);
	CU_ASSERT_EQUAL(c.user_data, 1);
	CU_ASSERT_EQUAL(c.res, -EINVAL);
	e.slot = 0;
	e.len = x.l.arg_slot_size + 1;
	e.user_data = 2;
	rring_push(&r, &x, &e);
	CU_ASSERT_EQUAL_FATAL(rring_pop(&x, &c, 5000), 0);
	CU_ASSERT_EQUAL(c.res, -EINVAL);
	e.opcode = 200;
	e.user_data = 3;
	rring_push(&r, &x, &e);
	CU_ASSERT_EQUAL_FATAL(rring_pop(&x, &c, 5000), 0);
	CU_ASSERT_EQUAL(c.res, -EOPNOTSUPP);
	e.opcode = SKV_OP_REQUEST;
	e.len = 16;
	memset(x.map + x.l.arg_off, 0xff, 16);
	e.user_data = 4;
	rring_push(&r, &x, &e);
	CU_ASSERT_EQUAL_FATAL(rring_pop(&x, &c, 5000), 0);
	CU_ASSERT_EQUAL(c.res, -EBADMSG);
	/* a corrupt SQ tail closes this session only */
	atomic_store(&x.sq.ctl->tail, x.sq.local + 1000);
	eventfd_write(r.fds[2], 1);
	expect_closed(&r, -EBADMSG);
	munmap(x.map, x.size);
	raw_close(&r);
	bystander_ok();
}

/* Pack a Request into ring slot i and write its SQE; publish = make it (and
 * every SQE written before) visible at once, with one tail store. */
static void rring_request(struct raw *r, struct rring *x, uint32_t i, Snapkv__V1__Request *req,
			  bool publish)
{
	struct skv_sqe e = {.opcode = SKV_OP_REQUEST, .slot = i, .user_data = 100 + i};
	static uint32_t pending;

	e.len = (uint32_t)snapkv__v1__request__pack(req, x->map + x->l.arg_off +
							     (size_t)i * x->l.arg_slot_size);
	memcpy(x->sq.entries + (size_t)((x->sq.local + pending) & x->sq.mask) * x->sq.esize, &e,
	       sizeof(e));
	pending++;
	if (!publish)
		return;
	x->sq.local += pending;
	pending = 0;
	atomic_store_explicit(&x->sq.ctl->tail, x->sq.local, memory_order_release);
	if (skv_ring_needs_wakeup(&x->sq))
		eventfd_write(r->fds[2], 1);
}

/* GROW copies in the worker: the cache is busy until it is done, and an
 * APPEND or RELEASE queued right behind it is refused with -EBUSY. */
static void test_grow_busy(void)
{
	struct raw r;
	struct rring x;
	struct skv_cqe c[3];
	struct skv_frame_hdr hh;
	Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	struct h_compact hc;
	Snapkv__V1__GrowRequest gr = SNAPKV__V1__GROW_REQUEST__INIT;
	Snapkv__V1__AppendRequest ap = SNAPKV__V1__APPEND_REQUEST__INIT;
	Snapkv__V1__ReleaseRequest rl = SNAPKV__V1__RELEASE_REQUEST__INIT;
	Snapkv__V1__RegisterReply *rr;
	Snapkv__V1__Response *resp;
	int mfd = memfd_create("g", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint64_t id, cache;
	size_t n;

	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	CU_ASSERT_EQUAL_FATAL(raw_hello(&r), 0);
	CU_ASSERT_EQUAL_FATAL(rring_map(&r, &x), 0);
	/* a buffer of small values, registered by hand */
	CU_ASSERT_EQUAL(ftruncate(mfd, 1 << 20), 0);
	float *f = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	for (int i = 0; i < (1 << 18); i++)
		f[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
	munmap(f, 1 << 20);
	CU_ASSERT_EQUAL(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	n = snapkv__v1__register_buffer__pack(&rb, r.buf);
	CU_ASSERT_EQUAL(
	    skv_frame_send(r.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, r.buf, n, &mfd, 1, 0), 0);
	close(mfd);
	CU_ASSERT_FATAL(skv_frame_recv(r.fd, r.buf, sizeof(r.buf), &hh, NULL, NULL, 0) >= 0);
	rr = snapkv__v1__register_reply__unpack(NULL, hh.length, r.buf + SKV_FRAME_HDR_SIZE);
	CU_ASSERT_PTR_NOT_NULL_FATAL(rr);
	id = rr->buffer_id;
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	/* compact over the ring: 4 heads x 1024 tokens x 32 dims, C 512 */
	h_compact_init(&hc, id, 4, 1024, 32, 16, 65536, 16, 512);
	hc.cr.decode_reserve = 1;
	rring_request(&r, &x, 0, &hc.req, true);
	CU_ASSERT_EQUAL_FATAL(rring_pop(&x, &c[0], 5000), 0);
	CU_ASSERT_EQUAL_FATAL(c[0].res, 0);
	resp = snapkv__v1__response__unpack(NULL, c[0].len, x.map + x.l.arg_off);
	CU_ASSERT_PTR_NOT_NULL_FATAL(resp);
	cache = resp->cache->cache_id;
	snapkv__v1__response__free_unpacked(resp, NULL);
	/* GROW, then APPEND and RELEASE right behind it, in one go */
	gr.cache_id = cache;
	gr.extra = 4096;
	req.op_case = SNAPKV__V1__REQUEST__OP_GROW;
	req.grow = &gr;
	rring_request(&r, &x, 0, &req, false);
	ap.cache_id = cache;
	ap.tokens = 1;
	req.op_case = SNAPKV__V1__REQUEST__OP_APPEND;
	req.append = &ap;
	rring_request(&r, &x, 1, &req, false);
	rl.cache_id = cache;
	req.op_case = SNAPKV__V1__REQUEST__OP_RELEASE;
	req.release = &rl;
	rring_request(&r, &x, 2, &req, true); /* all three visible at once */
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL_FATAL(rring_pop(&x, &c[i], 5000), 0);
	/* the two refusals come first: the copy completes later */
	CU_ASSERT_EQUAL(c[0].user_data, 101);
	CU_ASSERT_EQUAL(c[0].res, -EBUSY);
	CU_ASSERT_EQUAL(c[1].user_data, 102);
	CU_ASSERT_EQUAL(c[1].res, -EBUSY);
	CU_ASSERT_EQUAL(c[2].user_data, 100);
	CU_ASSERT_EQUAL_FATAL(c[2].res, 0);
	resp = snapkv__v1__response__unpack(NULL, c[2].len, x.map + x.l.arg_off);
	CU_ASSERT_PTR_NOT_NULL_FATAL(resp);
	CU_ASSERT_PTR_NOT_NULL_FATAL(resp->cache);
	CU_ASSERT_EQUAL(resp->cache->capacity, 512 + 1 + 4096);
	snapkv__v1__response__free_unpacked(resp, NULL);
	/* afterwards both work */
	req.op_case = SNAPKV__V1__REQUEST__OP_APPEND;
	rring_request(&r, &x, 1, &req, true);
	CU_ASSERT_EQUAL_FATAL(rring_pop(&x, &c[0], 5000), 0);
	CU_ASSERT_EQUAL(c[0].res, 0);
	req.op_case = SNAPKV__V1__REQUEST__OP_RELEASE;
	rring_request(&r, &x, 2, &req, true);
	CU_ASSERT_EQUAL_FATAL(rring_pop(&x, &c[0], 5000), 0);
	CU_ASSERT_EQUAL(c[0].res, 0);
	munmap(x.map, x.size);
	raw_close(&r);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 5000), 0);
}

/* utime + stime of a process, in clock ticks. */
static long cpu_ticks(pid_t pid)
{
	char p[64], buf[1024], *q;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	f = fopen(p, "r");
	if (!f)
		return -1;
	if (!fgets(buf, sizeof(buf), f)) {
		fclose(f);
		return -1;
	}
	fclose(f);
	q = strrchr(buf, ')');
	/* after the comm: state, then utime and stime are the 12th and 13th */
	if (!q ||
	    sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (long)(ut + st);
}

/* A client that stops reading completions is back-pressured, never dropped. */
static void test_cq_full(void)
{
	struct raw r;
	struct rring x;
	struct skv_sqe e = {.opcode = SKV_OP_NOP};
	struct skv_cqe c;
	uint32_t pushed = 0, got = 0, sqn, cqn;

	CU_ASSERT_EQUAL_FATAL(raw_connect(&r), 0);
	CU_ASSERT_EQUAL_FATAL(raw_hello(&r), 0);
	CU_ASSERT_EQUAL_FATAL(rring_map(&r, &x), 0);
	sqn = x.l.sq_entries;
	cqn = x.l.cq_entries;
	/* fill: the daemon takes entries until the CQ is full, then stops
	 * (polled until then; the 30 s bound is only a hang guard) */
	for (int i = 0; i < 6000 && (pushed < cqn + sqn || skv_ring_ready(&x.cq) < (int)cqn); i++) {
		while (pushed < cqn + sqn && skv_ring_space(&x.sq) > 0) {
			e.user_data = pushed++;
			rring_push(&r, &x, &e);
		}
		h_sleep_ms(5);
	}
	CU_ASSERT_EQUAL(pushed, cqn + sqn);
	CU_ASSERT_EQUAL(skv_ring_ready(&x.cq), (int)cqn); /* full, nothing overwritten */
	CU_ASSERT_EQUAL(skv_ring_space(&x.sq), 0);	  /* the rest waits in the SQ */
	bystander_ok();					  /* the loop is not blocked */
	/*
	 * ...and not spinning on the SQEs it may not take: it sleeps. A spinning
	 * loop burns a whole core (~100% of the wall time), a sleeping one ~0.
	 * Measured against the wall time that really passed, with a 50% bar, so
	 * that a slow or loaded machine cannot fail it; the value is printed.
	 */
	struct timespec w0, w1;
	long hz = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;
	clock_gettime(CLOCK_MONOTONIC, &w0);
	long t0 = cpu_ticks(H.pid);
	h_sleep_ms(400);
	long used = cpu_ticks(H.pid) - t0;
	clock_gettime(CLOCK_MONOTONIC, &w1);
	double wall_ms =
	    (double)(w1.tv_sec - w0.tv_sec) * 1e3 + (double)(w1.tv_nsec - w0.tv_nsec) / 1e6;
	double cpu_ms = (double)used * 1e3 / (double)hz;
	printf("\n    daemon CPU while the CQ was full: %.0f ms in %.0f ms\n    ", cpu_ms, wall_ms);
	CU_ASSERT(t0 >= 0 && used >= 0);
	CU_ASSERT(cpu_ms < 0.5 * wall_ms);
	/* read everything: the daemon resumes and loses nothing */
	int bad = 0;
	while (got < pushed && rring_pop(&x, &c, 5000) == 0) {
		bad += c.user_data != got || c.res != 0;
		got++;
		if (got % 16 == 0)
			eventfd_write(r.fds[2], 1); /* it may have gone to sleep */
	}
	CU_ASSERT_EQUAL(got, pushed);
	CU_ASSERT_EQUAL(bad, 0);
	munmap(x.map, x.size);
	raw_close(&r);
	bystander_ok();
}

/*
 * A session that ends while its last frame carried an fd (a REGISTER's
 * memfd, closed by the daemon once mapped) must not close that fd number
 * again: by then it belongs to someone else, here the next connection's
 * socket. The engine leaves with a reply unread (recvmsg: ECONNRESET) or
 * plainly (EOF); either way the other session must still be served.
 */
static void test_end_after_fd(void)
{
	for (int round = 0; round < 8; round++) {
		Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
		struct raw a, b;
		char err[128];
		int mfd = memfd_create("badinput-reg", MFD_CLOEXEC | MFD_ALLOW_SEALING), st = 0;

		CU_ASSERT_FATAL(mfd >= 0);
		CU_ASSERT_EQUAL(ftruncate(mfd, 65536), 0);
		CU_ASSERT_EQUAL(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
		CU_ASSERT_EQUAL_FATAL(raw_connect(&a), 0);
		CU_ASSERT_EQUAL_FATAL(raw_hello(&a), 0);
		rb.size = 65536;
		rb.generation = 1;
		CU_ASSERT_EQUAL(raw_register(&a, &rb, mfd, err, sizeof(err)), 0);
		close(mfd);
		/* the daemon's lowest free fd is now the memfd's old number */
		CU_ASSERT_EQUAL_FATAL(raw_connect(&b), 0);
		CU_ASSERT_EQUAL_FATAL(raw_hello(&b), 0);
		if (round & 1) { /* its answer waits unread: the daemon reads ECONNRESET */
			struct pollfd pf = {.fd = a.fd, .events = POLLIN};

			send_raw_hdr(a.fd, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 999, 0, 0);
			CU_ASSERT_EQUAL(poll(&pf, 1, 5000), 1);
		}
		raw_close(&a);
		for (int i = 0; i < 500 && h_sessions(H.sock) != 2; i++)
			h_sleep_ms(10);
		send_raw_hdr(b.fd, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 999, 0, 0);
		CU_ASSERT_EQUAL(raw_next(&b, &st), SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR);
		CU_ASSERT_EQUAL(st, -EOPNOTSUPP);
		raw_close(&b);
	}
	bystander_ok();
}

static void test_baseline(void)
{
	int fds = -1;

	/* sessions closed above are torn down asynchronously: give it a moment */
	for (int i = 0; i < 500; i++) {
		fds = h_count_fds(H.pid);
		if (fds == base_fds)
			break;
		h_sleep_ms(10);
	}
	CU_ASSERT_EQUAL(fds, base_fds);
	CU_ASSERT_EQUAL(h_pool_used(H.sock), 0);
	CU_ASSERT_EQUAL(h_sessions(H.sock), 1);
}

int main(void)
{
	CU_pSuite s;

	signal(SIGPIPE, SIG_IGN);
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("daemon-badinput", suite_init, suite_clean);
	CU_add_test(s, "malformed frames", test_frames);
	CU_add_test(s, "bad messages", test_messages);
	CU_add_test(s, "bad requests", test_requests);
	CU_add_test(s,
		    h_backend_cuda() ? "CUDA registrations, bad ones on the cuda backend"
				     : "CUDA registrations on the host backend",
		    test_cuda_on_host);
	CU_add_test(s, "scratch over max_scratch_bytes: -E2BIG before work", test_scratch_limit);
	CU_add_test(s, "bad ring entries, corrupt tail", test_ring);
	CU_add_test(s, "GROW in the worker: busy meanwhile", test_grow_busy);
	CU_add_test(s, "CQ full: back-pressure", test_cq_full);
	CU_add_test(s, "a session's end closes no other's fd", test_end_after_fd);
	CU_add_test(s, "fds and pool back to baseline", test_baseline);
	return h_run_tests();
}
