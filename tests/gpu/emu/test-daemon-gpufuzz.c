// SPDX-License-Identifier: MIT
/*
 * test-daemon-gpufuzz: bad and random input on the CUDA-only paths of
 * snapkvd --backend cuda, on the emulated plugin (tests/gpu/emu): CUDA
 * buffer registrations (VMM fds, IPC handles), the GPU arena, COMPACT into
 * it, prefill waits, GROW of GPU-arena caches, paged block tables, and
 * byte-flipped valid CUDA requests. After each batch the daemon is alive, a
 * bystander engine's compaction equals libskv's host result, and the
 * daemon's fds, pool bytes and CUDA imports are back at their baseline.
 *
 * The emulator's GPU memory is memfds: a VMM export is a memfd fd (2 MiB
 * granules), a legacy IPC handle names (pid, fd) of a memfd called
 * "emu-malloc" through /proc, an IPC event handle names a one-page memfd
 * word "emu-event". This test makes those itself, so it needs no CUDA.
 * Deterministic: seed 20261130, or $FUZZ_SEED.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include "daemon-harness.h"
#include "proto/skv-ring.h"
#include "skv.h"
#include "snapkv.h"

#define GRAN	  (2u << 20)
#define IPC_MAGIC 0x454d5531u
#define EV_MAGIC  0x454d5545u

static struct harness H;
static uint64_t seed = 20261130;
static int base_fds;
static unsigned n_inputs; /* every fuzz input sent, for the summary */

static uint32_t rnd(void)
{
	seed = seed * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(seed >> 33);
}

static uint64_t rnd64(void)
{
	return (uint64_t)rnd() << 32 | rnd();
}

/* ------------------------------------------------------------ raw frames */

static uint8_t buf[SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD];

/* retained mass of (layer 0, head 0) in the last COMPACT/GROW answered */
static float last_mass = NAN;

/* no answer within 60 s: a hang (not an errno the daemon could send) */
#define HANG (-100000)

/* The last Welcome's fds (ring, arena, eventfds) when kept by raw_connect */
static int welcome_fds[4] = {-1, -1, -1, -1};
static bool keep_welcome;

static int raw_connect(bool admin)
{
	Snapkv__V1__Hello h = SNAPKV__V1__HELLO__INIT;
	struct skv_frame_hdr hdr;
	int fds[4] = {-1, -1, -1, -1};
	unsigned nf = 4;
	int fd = h_connect_raw(H.sock);
	size_t n;

	if (fd < 0)
		return fd;
	h.client_version = SKV_PROTO_VERSION;
	h.admin = admin;
	h.name = "gpufuzz";
	n = snapkv__v1__hello__pack(&h, buf);
	if (skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf, n, NULL, 0, 0) < 0 ||
	    skv_frame_recv(fd, buf, sizeof(buf), &hdr, fds, &nf, 0) < 0 ||
	    hdr.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME) {
		close(fd);
		return -EPROTO;
	}
	for (unsigned i = 0; i < nf; i++) {
		if (keep_welcome)
			welcome_fds[i] = fds[i];
		else
			close(fds[i]);
	}
	return fd;
}

/*
 * The next frame within 60 s (a daemon that does not answer is a hang);
 * fds it carries closed unless ret_fd. Returns the type, or -errno.
 */
static int recv_next(int fd, struct skv_frame_hdr *hdr, int *ret_fd)
{
	struct pollfd p = {fd, POLLIN, 0};
	int fds[4];
	unsigned nf = 4;
	int r;

	if (poll(&p, 1, 60000) != 1)
		return HANG;
	r = skv_frame_recv(fd, buf, sizeof(buf), hdr, fds, &nf, 0);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < nf; i++) {
		if (ret_fd && i == 0)
			*ret_fd = fds[0];
		else
			close(fds[i]);
	}
	return hdr->type;
}

/* One RegisterBuffer; status (or -EPROTO/HANG), its id in *ret_id. */
static int reg(int sk, const Snapkv__V1__RegisterBuffer *rb, const int *fds, unsigned nf,
	       uint64_t *ret_id)
{
	Snapkv__V1__RegisterReply *rr;
	struct skv_frame_hdr hdr;
	size_t n = snapkv__v1__register_buffer__pack(rb, buf);
	int st;

	n_inputs++;
	if (skv_frame_send(sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, buf, n, fds, nf, 0) < 0)
		return -EPIPE;
	if (recv_next(sk, &hdr, NULL) != SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY)
		return -EPROTO;
	rr = snapkv__v1__register_reply__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE);
	if (!rr)
		return -EBADMSG;
	st = rr->status;
	if (ret_id)
		*ret_id = rr->buffer_id;
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	return st;
}

static int unreg(int sk, uint64_t id)
{
	Snapkv__V1__Unregister u = SNAPKV__V1__UNREGISTER__INIT;
	Snapkv__V1__UnregisterReply *ur;
	struct skv_frame_hdr hdr;
	size_t n;
	int st;

	u.buffer_id = id;
	n = snapkv__v1__unregister__pack(&u, buf);
	if (skv_frame_send(sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER, buf, n, NULL, 0, 0) < 0)
		return -EPIPE;
	if (recv_next(sk, &hdr, NULL) != SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY)
		return -EPROTO;
	ur = snapkv__v1__unregister_reply__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE);
	if (!ur)
		return -EBADMSG;
	st = ur->status;
	snapkv__v1__unregister_reply__free_unpacked(ur, NULL);
	return st;
}

/* CUDA_ARENA: status; the fd (closed here) counted in *ret_nfd */
static int ask_arena(int sk, unsigned *ret_nfd)
{
	Snapkv__V1__CudaArenaRequest ar = SNAPKV__V1__CUDA_ARENA_REQUEST__INIT;
	Snapkv__V1__CudaArena *a;
	struct skv_frame_hdr hdr;
	size_t n = snapkv__v1__cuda_arena_request__pack(&ar, buf);
	int fd = -1, st;

	if (skv_frame_send(sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA, buf, n, NULL, 0, 0) < 0)
		return -EPIPE;
	if (recv_next(sk, &hdr, &fd) != SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY)
		return -EPROTO;
	*ret_nfd = fd >= 0;
	if (fd >= 0)
		close(fd);
	a = snapkv__v1__cuda_arena__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE);
	if (!a)
		return -EBADMSG;
	st = a->status;
	snapkv__v1__cuda_arena__free_unpacked(a, NULL);
	return st;
}

/*
 * Send a packed Request (payload p, n bytes) and wait for its Response:
 * status, and the cache id of a COMPACT/GROW in *ret_cache. -EPROTO when
 * the session was closed instead (a protocol error), HANG on a hang.
 */
static int request(int sk, const uint8_t *p, size_t n, uint64_t *ret_cache)
{
	struct skv_frame_hdr hdr;
	Snapkv__V1__Response *rs;
	int t, st;

	n_inputs++;
	if (skv_frame_send(sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, p, n, NULL, 0, 0) < 0)
		return -EPIPE;
	t = recv_next(sk, &hdr, NULL);
	if (t == HANG)
		return t;
	if (t != SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE)
		return -EPROTO;
	rs = snapkv__v1__response__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE);
	if (!rs)
		return -EBADMSG;
	st = rs->status;
	if (ret_cache && rs->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE)
		*ret_cache = rs->cache->cache_id;
	last_mass = NAN;
	if (rs->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE && rs->cache->n_retained_mass)
		last_mass = rs->cache->retained_mass[0];
	snapkv__v1__response__free_unpacked(rs, NULL);
	return st;
}

static int send_req(int sk, Snapkv__V1__Request *rq, uint64_t *ret_cache)
{
	static uint8_t p[65536];

	return request(sk, p, snapkv__v1__request__pack(rq, p), ret_cache);
}

static int release_cache(int sk, uint64_t id)
{
	Snapkv__V1__Request rq = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__ReleaseRequest rr = SNAPKV__V1__RELEASE_REQUEST__INIT;

	rr.cache_id = id;
	rq.op_case = SNAPKV__V1__REQUEST__OP_RELEASE;
	rq.release = &rr;
	return send_req(sk, &rq, NULL);
}

/* --------------------------------------------------- emulated GPU memory */

/* A memfd of `size` bytes named `name`, filled with small floats. */
static int gpu_memfd(const char *name, size_t size)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	float *f;

	if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
		abort();
	f = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (f == MAP_FAILED)
		abort();
	for (size_t i = 0; i < size / 4; i++)
		f[i] = (float)(rnd() % 1000) / 500.0f - 1.0f;
	munmap(f, size);
	return fd;
}

struct emu_ipc_handle {
	uint32_t magic, pid;
	int32_t fd;
	uint32_t pad;
	uint64_t size, offset;
};

static void ipc_handle(uint8_t h[64], int fd, uint64_t size, uint64_t offset)
{
	struct emu_ipc_handle e = {IPC_MAGIC, (uint32_t)getpid(), fd, 0, size, offset};

	memset(h, 0, 64);
	memcpy(h, &e, sizeof(e));
}

static void event_handle(uint8_t h[64], int fd)
{
	uint32_t e[3] = {EV_MAGIC, (uint32_t)getpid(), (uint32_t)fd};

	memset(h, 0, 64);
	memcpy(h, e, sizeof(e));
}

/*
 * A session with a VMM buffer (2 MiB: Q at 0, K = V at 4096, a flag word
 * at 1 MiB, set to 1), an IPC window of an "emu-malloc" memfd (256 KiB,
 * window [64 KiB, +64 KiB)), a memfd buffer and the GPU arena.
 */
struct gsess {
	int sk;
	int vmm_fd, ipc_fd, ev_fd;
	uint32_t *flag, *ev_word;
	uint64_t vmm, ipc, mem;
	uint8_t ipc_h[64], ev_h[64];
};

#define FLAG_OFF (1u << 20)

static int gsess_open(struct gsess *g)
{
	Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
	unsigned nf = 0;
	int m;

	memset(g, 0, sizeof(*g));
	g->sk = raw_connect(false);
	if (g->sk < 0)
		return -1;
	g->vmm_fd = gpu_memfd("fuzz-vmm", GRAN);
	g->flag = mmap(NULL, GRAN, PROT_READ | PROT_WRITE, MAP_SHARED, g->vmm_fd, 0);
	g->flag = (uint32_t *)((uint8_t *)g->flag + FLAG_OFF);
	*g->flag = 1;
	g->ipc_fd = gpu_memfd("emu-malloc", 256 << 10);
	g->ev_fd = memfd_create("emu-event", MFD_CLOEXEC);
	if (ftruncate(g->ev_fd, 4096) < 0)
		return -1;
	g->ev_word = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, g->ev_fd, 0);
	*g->ev_word = 1;
	ipc_handle(g->ipc_h, g->ipc_fd, 256 << 10, 0);
	event_handle(g->ev_h, g->ev_fd);
	rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
	rb.size = GRAN;
	rb.generation = 1;
	if (reg(g->sk, &rb, &g->vmm_fd, 1, &g->vmm) != 0)
		return -1;
	rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	rb.size = 64 << 10;
	rb.offset = 64 << 10;
	rb.generation = 2;
	rb.ipc_handle.data = g->ipc_h;
	rb.ipc_handle.len = 64;
	if (reg(g->sk, &rb, NULL, 0, &g->ipc) != 0)
		return -1;
	rb = (Snapkv__V1__RegisterBuffer)SNAPKV__V1__REGISTER_BUFFER__INIT;
	m = memfd_create("fuzz-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (ftruncate(m, 16384) < 0 || fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		return -1;
	rb.size = 16384;
	if (reg(g->sk, &rb, &m, 1, &g->mem) != 0)
		return -1;
	close(m);
	return ask_arena(g->sk, &nf) == 0 && nf == 1 ? 0 : -1;
}

static void gsess_close(struct gsess *g)
{
	if (g->sk >= 0)
		close(g->sk);
	munmap((uint8_t *)g->flag - FLAG_OFF, GRAN);
	munmap(g->ev_word, 4096);
	close(g->vmm_fd);
	close(g->ipc_fd);
	close(g->ev_fd);
	g->sk = -1;
}

/* ---------------------------------------------------------- the checks */

/*
 * A bystander engine on libsnapkv (a memfd buffer, the host arena): its
 * compaction equals libskv's in this process, positions and K/V bytes,
 * masses within 1e-4 (the CUDA kernels sum in another order).
 */
static void bystander_ok(void)
{
	enum { L = 64, D = 16, HQ = 2, NQ = 8, CAP = 24 };
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[1];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct skv_plan plan;
	struct skv_error err;
	struct skv_ctx *ctx = NULL;
	size_t q_off = 0, k_off = (size_t)HQ * NQ * D * 4;
	size_t bytes = k_off + (size_t)HQ * L * D * 4;

	CU_ASSERT_FATAL(h_alive(&H));
	CU_ASSERT_EQUAL_FATAL(skv_client_connect(H.sock, NULL, &c), 0);
	CU_ASSERT_EQUAL(skv_client_nop(c), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, bytes, &b), 0);
	float *f = skv_buffer_data(b);
	for (size_t i = 0; i < bytes / 4; i++)
		f[i] = (float)(rnd() % 1000) / 500.0f - 1.0f;
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = HQ, .h_kv = HQ, .n_q = NQ};
	d.layers = 1;
	skv_client_params_init(&d.params);
	d.params.window = 8;
	d.params.capacity = CAP;
	lr[0].q = (struct skv_tensor_ref){b, q_off, SKV_DTYPE_F32, NQ * D, D, 0, 0};
	lr[0].k = (struct skv_tensor_ref){b, k_off, SKV_DTYPE_F32, L * D, D, 0, 0};
	lr[0].v = lr[0].k;
	d.layer = lr;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	CU_ASSERT_EQUAL_FATAL(skv_plan(&d.shape, &d.params, &plan, &err), 0);

	uint32_t hs = plan.h_store, kept = plan.kept;
	float *ok = calloc((size_t)hs * kept * D, 4), *ov = calloc((size_t)hs * kept * D, 4);
	int32_t *op = calloc((size_t)hs * kept, 4);
	float om[HQ];
	struct skv_layer_in in = {
	    .q = {f + q_off / 4, SKV_DTYPE_F32, NQ * D, D, NULL, 0, 0, 0},
	    .k = {f + k_off / 4, SKV_DTYPE_F32, L * D, D, NULL, 0, 0, 0},
	    .v = {f + k_off / 4, SKV_DTYPE_F32, L * D, D, NULL, 0, 0, 0},
	};
	struct skv_layer_out out = {
	    .k = {ok, SKV_DTYPE_F32, (int64_t)kept * D, D, NULL, 0, 0, 0},
	    .v = {ov, SKV_DTYPE_F32, (int64_t)kept * D, D, NULL, 0, 0, 0},
	    .positions = op,
	    .pos_stride = kept,
	    .retained_mass = om,
	};
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(1, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &d.shape, &d.params, 1, &in, &out, &err), 0);
	skv_ctx_free(ctx);
	const struct skv_cache_info *ci = skv_cache_info(k);
	int diff = 0;
	CU_ASSERT_EQUAL(ci->kept, kept);
	for (uint32_t h = 0; h < hs && ci->kept == kept; h++) {
		const float *dk = skv_cache_k(k, 0, h), *dv = skv_cache_v(k, 0, h);
		const int32_t *dp = skv_cache_positions(k, 0, h);

		for (uint32_t i = 0; i < kept; i++) {
			diff += memcmp(dk + (size_t)i * ci->token_stride,
				       ok + ((size_t)h * kept + i) * D, D * 4) != 0;
			diff += memcmp(dv + (size_t)i * ci->token_stride,
				       ov + ((size_t)h * kept + i) * D, D * 4) != 0;
			diff += dp[i] != op[(size_t)h * kept + i];
		}
		diff += fabsf(skv_cache_retained_mass(k, 0, h) - om[h]) > 1e-4f;
	}
	CU_ASSERT_EQUAL(diff, 0);
	free(ok);
	free(ov);
	free(op);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	skv_buffer_free(b);
	skv_client_close(c);
}

/* Sessions gone, pool, CUDA imports and fds back at their baseline. */
static void baseline_ok(const char *what)
{
	int fds = -1, ok = 0;

	for (int i = 0; i < 500; i++) {
		fds = h_count_fds_cuda(H.pid);
		if (h_sessions(H.sock) == 0 && h_pool_used(H.sock) == 0 &&
		    h_cuda_imports(H.sock) == 0 && fds == base_fds) {
			ok = 1;
			break;
		}
		h_sleep_ms(10);
	}
	if (!ok) {
		char cmd[128];

		printf("\n    after %s: sessions %d, pool %lld, imports %d, fds %d (base %d) ",
		       what, h_sessions(H.sock), h_pool_used(H.sock), h_cuda_imports(H.sock), fds,
		       base_fds);
		fflush(stdout);
		snprintf(cmd, sizeof(cmd), "ls -l /proc/%d/fd | sed 1d | sed 's/^.*[0-9] //' >&2",
			 (int)H.pid);
		(void)!system(cmd);
	}
	CU_ASSERT(ok);
}

static void batch_done(const char *what)
{
	CU_ASSERT_FATAL(h_alive(&H));
	bystander_ok();
	baseline_ok(what);
}

/* --------------------------------------------------- valid CUDA requests */

/*
 * COMPACT of the session's VMM buffer (1 layer, 1 head, L 64, d 16), K/V
 * into the GPU arena, after a prefill flag that is already set: packed.
 */
struct creq {
	struct h_compact c;
	Snapkv__V1__PrefillWait w;
};

static void creq_init(struct creq *q, const struct gsess *g)
{
	h_compact_init(&q->c, g->vmm, 1, 64, 16, 8, 4096, 8, 24);
	q->c.cr.decode_reserve = 4;
	q->c.cr.out_arena = SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM;
	q->w = (Snapkv__V1__PrefillWait)SNAPKV__V1__PREFILL_WAIT__INIT;
	q->w.kind = SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_FLAG;
	q->w.buffer_id = g->vmm;
	q->w.offset = FLAG_OFF;
	q->w.value = 1;
	q->w.timeout_ms = 50;
	q->c.cr.prefill_wait = &q->w;
}

/*
 * The retained mass libskv computes for creq's problem (1 head, L 64, d 16,
 * 8 query rows at 0, K = V at 4096, window 8, capacity 24) over the first
 * bytes of memfd `fd`: which allocation a compaction really read.
 */
static float host_mass(int fd)
{
	const float *f = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
	struct skv_shape sh = {.prompt_len = 64, .head_dim = 16, .h_q = 1, .h_kv = 1, .n_q = 8};
	struct skv_params pm;
	struct skv_plan plan;
	struct skv_error err;
	struct skv_ctx *ctx = NULL;
	float m = NAN;

	if (f == MAP_FAILED)
		return NAN;
	skv_params_init(&pm);
	pm.window = 8;
	pm.capacity = 24;
	if (skv_plan(&sh, &pm, &plan, &err) == 0 && skv_ctx_new(1, &ctx) == 0) {
		float *ok = calloc((size_t)plan.kept * 16, 4),
		      *ov = calloc((size_t)plan.kept * 16, 4);
		int32_t *op = calloc(plan.kept, 4);
		struct skv_layer_in in = {
		    .q = {(void *)f, SKV_DTYPE_F32, 8 * 16, 16, NULL, 0, 0, 0},
		    .k = {(void *)(f + 1024), SKV_DTYPE_F32, 64 * 16, 16, NULL, 0, 0, 0},
		    .v = {(void *)(f + 1024), SKV_DTYPE_F32, 64 * 16, 16, NULL, 0, 0, 0},
		};
		struct skv_layer_out out = {
		    .k = {ok, SKV_DTYPE_F32, (int64_t)plan.kept * 16, 16, NULL, 0, 0, 0},
		    .v = {ov, SKV_DTYPE_F32, (int64_t)plan.kept * 16, 16, NULL, 0, 0, 0},
		    .positions = op,
		    .pos_stride = plan.kept,
		    .retained_mass = &m,
		};
		if (skv_compact(ctx, &sh, &pm, 1, &in, &out, &err) < 0)
			m = NAN;
		free(ok);
		free(ov);
		free(op);
		skv_ctx_free(ctx);
	}
	munmap((void *)f, 8192);
	return m;
}

/* Every status a bad request may get: anything else (or a hang) fails. */
static bool errno_ok(int st)
{
	static const int ok[] = {0,	  -EINVAL,  -ERANGE,  -E2BIG,	  -ENOENT, -EBADF,
				 -EEXIST, -EPERM,   -EBUSY,   -ENOSPC,	  -EDQUOT, -ETIMEDOUT,
				 -EMFILE, -ENOTSUP, -EBADMSG, -EOVERFLOW, -ENOMEM, -EIO};

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (st == ok[i])
			return true;
	return false;
}

static void expect_errno(int st, const char *what, unsigned i)
{
	if (!errno_ok(st))
		printf("\n    %s #%u: status %d ", what, i, st);
	CU_ASSERT(errno_ok(st));
}

/* ------------------------------------------------------------- batches */

/* Registrations: every kind, fd, size, offset, handle; double ones. */
static void test_register(void)
{
	unsigned tried = 0, accepted = 0;
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	int p[2], sp[2];
	int ev = eventfd(0, EFD_CLOEXEC);
	int small = gpu_memfd("fuzz-small", 65536), big = gpu_memfd("fuzz-vmm2", 2 * GRAN);
	int ipcm = gpu_memfd("emu-malloc", 256 << 10), plain = gpu_memfd("fuzz-plain", 4096);
	int vm = gpu_memfd("fuzz-vmm", GRAN);

	CU_ASSERT_FATAL(pipe2(p, O_CLOEXEC) == 0);
	CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
	const int fdchoice[] = {vm, big, small, p[0], p[1], devnull, ev, sp[0], plain, ipcm};
	const uint64_t sizes[] = {0,	      1,	4096,	   GRAN,	   GRAN - 1,
				  GRAN + 1,   2 * GRAN, 4 * GRAN,  1ull << 40,	   ~0ull,
				  1ull << 63, 65536,	256 << 10, (256 << 10) + 1};

	/* the fixed ones first: each gets its own errno */
	{
		int sk = raw_connect(false);
		Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
		uint8_t h[100];
		uint64_t id;

		CU_ASSERT_FATAL(sk >= 0);
		rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
		rb.size = GRAN;
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -EBADF);
		CU_ASSERT_EQUAL(reg(sk, &rb, &p[0], 1, &id), -EINVAL);
		CU_ASSERT_EQUAL(reg(sk, &rb, &devnull, 1, &id), -EINVAL);
		CU_ASSERT_EQUAL(reg(sk, &rb, &ev, 1, &id), -EINVAL);
		CU_ASSERT_EQUAL(reg(sk, &rb, &small, 1, &id), -EINVAL); /* shorter than size */
		rb.size = 0;
		CU_ASSERT_EQUAL(reg(sk, &rb, &vm, 1, &id), -ERANGE);
		rb.size = ~0ull;
		CU_ASSERT_EQUAL(reg(sk, &rb, &vm, 1, &id), -E2BIG);
		rb.size = GRAN - 4096;
		CU_ASSERT_EQUAL(reg(sk, &rb, &vm, 1, &id), -EINVAL); /* not a granule multiple */
		rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
		rb.size = 4096;
		rb.ipc_handle.data = h;
		for (size_t len = 0; len <= sizeof(h); len++) {
			if (len == 64)
				continue;
			for (size_t j = 0; j < len; j++)
				h[j] = rnd();
			rb.ipc_handle.len = len;
			CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -EINVAL);
		}
		rb.ipc_handle.len = 64;
		for (int i = 0; i < 20; i++) {
			for (size_t j = 0; j < 64; j++)
				h[j] = rnd();
			CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -EINVAL);
		}
		memset(h, 0, 64);
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -EINVAL);
		ipc_handle(h, ipcm, 256 << 10, 0);
		CU_ASSERT_EQUAL(reg(sk, &rb, &plain, 1, &id), -EINVAL); /* an fd with it */
		rb.offset = ~0ull - 100;
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -ERANGE);
		rb.offset = 256 << 10;
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -ERANGE);
		rb.offset = 0;
		rb.size = (256 << 10) + 4096;
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -ERANGE);
		/* the emulator's handle itself wrong: past its memfd, offset out of it */
		rb.size = 4096;
		ipc_handle(h, ipcm, 1 << 30, 0);
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -EINVAL);
		ipc_handle(h, ipcm, 256 << 10, 1 << 20);
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -EINVAL);
		ipc_handle(h, plain, 4096, 0); /* not an emu-malloc memfd */
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -EINVAL);
		ipc_handle(h, p[0], 4096, 0);
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id), -EINVAL);
		/* double registration: same generation, same buffer, or -EEXIST */
		rb = (Snapkv__V1__RegisterBuffer)SNAPKV__V1__REGISTER_BUFFER__INIT;
		rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
		rb.size = GRAN;
		rb.generation = 9;
		uint64_t id1 = 0, id2 = 0;
		CU_ASSERT_EQUAL(reg(sk, &rb, &vm, 1, &id1), 0);
		CU_ASSERT_EQUAL(reg(sk, &rb, &vm, 1, &id2), 0);
		CU_ASSERT_EQUAL(id1, id2);
		CU_ASSERT_EQUAL(h_cuda_imports(H.sock), 1);
		rb.size = 2 * GRAN;
		CU_ASSERT_EQUAL(reg(sk, &rb, &big, 1, &id2), -EEXIST);
		rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
		rb.size = 4096;
		ipc_handle(h, ipcm, 256 << 10, 0);
		rb.ipc_handle.data = h;
		rb.ipc_handle.len = 64;
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id2), -EEXIST);
		CU_ASSERT_EQUAL(unreg(sk, id1), 0);
		CU_ASSERT_EQUAL(h_cuda_imports(H.sock), 1); /* registered twice */
		CU_ASSERT_EQUAL(unreg(sk, id1), 0);
		CU_ASSERT_EQUAL(h_cuda_imports(H.sock), 0);
		CU_ASSERT_EQUAL(unreg(sk, id1), -ENOENT);
		/* the generation free again: now as an IPC window */
		CU_ASSERT_EQUAL(reg(sk, &rb, NULL, 0, &id2), 0);
		CU_ASSERT_EQUAL(h_cuda_imports(H.sock), 1);
		close(sk);
	}
	/*
	 * generation 0 ("none") twice, two allocations: two buffers, each
	 * compaction reading its own (the import must not be shared by key)
	 */
	{
		int sk = raw_connect(false);
		Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
		int a = gpu_memfd("fuzz-vmm", GRAN), b = gpu_memfd("fuzz-vmm", GRAN);
		uint64_t ida = 0, idb = 0, cache = 0;
		struct h_compact c;

		CU_ASSERT_FATAL(sk >= 0);
		rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
		rb.size = GRAN;
		CU_ASSERT_EQUAL(reg(sk, &rb, &a, 1, &ida), 0);
		CU_ASSERT_EQUAL(reg(sk, &rb, &b, 1, &idb), 0);
		CU_ASSERT_NOT_EQUAL(ida, idb);
		CU_ASSERT_EQUAL(h_cuda_imports(H.sock), 2);
		for (int i = 0; i < 2; i++) {
			h_compact_init(&c, i ? idb : ida, 1, 64, 16, 8, 4096, 8, 24);
			CU_ASSERT_EQUAL(send_req(sk, &c.req, &cache), 0);
			float want = host_mass(i ? b : a);
			if (!(fabsf(last_mass - want) <= 1e-4f))
				printf(
				    "\n    generation 0, buffer %d: mass %g, its allocation's %g ",
				    i, last_mass, want);
			CU_ASSERT(fabsf(last_mass - want) <= 1e-4f);
			CU_ASSERT_EQUAL(release_cache(sk, cache), 0);
		}
		close(sk);
		close(a);
		close(b);
	}
	/* then random ones, sessions of 40 */
	for (int round = 0; round < 8; round++) {
		int sk = raw_connect(round == 7);
		uint64_t ids[64];
		unsigned nid = 0;

		CU_ASSERT_FATAL(sk >= 0);
		for (int i = 0; i < 40; i++) {
			Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
			uint8_t h[100];
			int fds[2];
			unsigned nf = rnd() % 8 == 0 ? 2 : rnd() % 3 ? 1 : 0;
			uint64_t id = 0;
			int st;

			rb.kind = (Snapkv__V1__BufferKind)(rnd() % 8 ? 2 + rnd() % 2 : rnd() % 6);
			rb.size =
			    rnd() % 4 ? sizes[rnd() % (sizeof(sizes) / sizeof(sizes[0]))] : rnd64();
			rb.offset = rnd() % 2 ? 0 : rnd() % 2 ? rnd() % (512 << 10) : rnd64();
			rb.generation = rnd() % 6;
			rb.device = (int32_t)rnd();
			for (unsigned j = 0; j < nf; j++)
				fds[j] = fdchoice[rnd() % (sizeof(fdchoice) / sizeof(fdchoice[0]))];
			bool valid = rnd() % 2;
			if (valid && rb.kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD) {
				/* a good one, perhaps with one thing wrong */
				nf = 1;
				fds[0] = rnd() % 2 ? vm : big;
				rb.size = fds[0] == vm ? GRAN : 2 * GRAN;
				if (rnd() % 3 == 0)
					fds[0] = fdchoice[rnd() % 10];
			} else if (valid) {
				nf = rnd() % 4 == 0;
				fds[0] = plain;
				rb.offset = rnd() % 2 ? 0 : (rnd() % 64) << 12;
				rb.size = rnd() % 3 ? 4096 : rnd() % (300 << 10);
			}
			if (valid || rnd() % 3) {
				ipc_handle(h, rnd() % 4 ? ipcm : (int)(rnd() % 64),
					   rnd() % 4 ? 256 << 10 : rnd64() >> (rnd() % 64),
					   rnd() % 4 ? 0 : rnd64() >> (rnd() % 64));
				for (int f = valid ? -1 : (int)(rnd() % 3) - 1; f >= 0; f--) {
					unsigned at = rnd() % 64;

					if (at < 4 || at >= 8) /* never another pid */
						h[at] ^= (uint8_t)(1u << (rnd() % 8));
				}
				rb.ipc_handle.len = valid || rnd() % 8 ? 64 : rnd() % 100;
			} else {
				rb.ipc_handle.len = rnd() % 100;
				for (size_t j = 0; j < rb.ipc_handle.len; j++)
					h[j] = rnd();
			}
			rb.ipc_handle.data = h;
			st = reg(sk, &rb, fds, nf, &id);
			tried++;
			expect_errno(st, "register", tried);
			if (st == -EPROTO || st == HANG)
				break;
			if (st == 0) {
				accepted++;
				if (nid < 64)
					ids[nid++] = id;
			}
			if (rnd() % 4 == 0 && nid) {
				st = unreg(sk, rnd() % 3 ? ids[rnd() % nid] : rnd64());
				CU_ASSERT(st == 0 || st == -ENOENT);
			}
		}
		close(sk);
	}
	printf("\n    %u random registrations, %u accepted ", tried, accepted);
	CU_ASSERT(accepted >= 10);
	const int all[] = {devnull, p[0], p[1], sp[0], sp[1], ev, small, big, ipcm, plain, vm};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		close(all[i]);
	batch_done("registrations");
}

/* CUDA_ARENA twice, by an admin session, before HELLO. */
static void test_arena(void)
{
	unsigned nf = 0;
	int sk = raw_connect(false);

	CU_ASSERT_FATAL(sk >= 0);
	{
		/* COMPACT into the GPU arena before asking for it: -EINVAL */
		Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
		int vm = gpu_memfd("fuzz-vmm", GRAN);
		uint64_t id = 0;
		struct h_compact c;

		rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
		rb.size = GRAN;
		CU_ASSERT_EQUAL(reg(sk, &rb, &vm, 1, &id), 0);
		close(vm);
		h_compact_init(&c, id, 1, 64, 16, 8, 4096, 8, 24);
		c.cr.out_arena = SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM;
		CU_ASSERT_EQUAL(send_req(sk, &c.req, NULL), -EINVAL);
	}
	for (int i = 0; i < 5; i++) {
		CU_ASSERT_EQUAL(ask_arena(sk, &nf), 0);
		CU_ASSERT_EQUAL(nf, 1);
	}
	close(sk);
	sk = raw_connect(true);
	CU_ASSERT_FATAL(sk >= 0);
	CU_ASSERT_EQUAL(ask_arena(sk, &nf), -EPERM);
	CU_ASSERT_EQUAL(nf, 0);
	close(sk);
	/* before HELLO: a protocol error, the session closed */
	sk = h_connect_raw(H.sock);
	CU_ASSERT_FATAL(sk >= 0);
	CU_ASSERT(ask_arena(sk, &nf) < 0);
	close(sk);
	/* with random payloads and fds */
	sk = raw_connect(false);
	CU_ASSERT_FATAL(sk >= 0);
	for (int i = 0; i < 30; i++) {
		uint8_t p[64];
		struct skv_frame_hdr hdr;
		int m = memfd_create("fuzz", MFD_CLOEXEC);
		size_t len = rnd() % sizeof(p);

		for (size_t j = 0; j < len; j++)
			p[j] = rnd();
		n_inputs++;
		if (skv_frame_send(sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA, p, len, &m,
				   rnd() % 2, 0) < 0)
			break;
		close(m);
		if (recv_next(sk, &hdr, NULL) < 0)
			break;
	}
	close(sk);
	batch_done("arena");
}

/* Bad geometry into the GPU arena, from every kind of buffer. */
static void test_compact_gpu_arena(void)
{
	struct gsess g;
	unsigned tried = 0, done = 0;

	CU_ASSERT_FATAL(gsess_open(&g) == 0);
	for (int i = 0; i < 150; i++) {
		struct creq q;
		uint64_t cache = 0;
		int st;

		creq_init(&q, &g);
		uint64_t bufs[] = {g.vmm, g.ipc, g.mem, 99, 0};
		q.c.q.buffer_id = bufs[rnd() % 3];
		q.c.k.buffer_id = bufs[rnd() % 5 ? rnd() % 3 : rnd() % 5];
		switch (rnd() % 8) {
		case 0:
			q.c.k.offset = rnd() % 2 ? rnd64() : rnd() % (2 * GRAN);
			break;
		case 1:
			q.c.cr.prompt_len = rnd() % 2 ? rnd() % 200 : rnd();
			break;
		case 2:
			q.c.k.head_stride = (int64_t)rnd64();
			q.c.k.token_stride = rnd() % 64 - 8;
			break;
		case 3:
			q.c.cr.h_q = q.c.cr.h_kv = rnd() % 5;
			break;
		case 4:
			q.c.cr.head_dim = rnd() % 2 ? rnd() % 300 : rnd();
			break;
		case 5:
			q.c.pm.capacity = rnd() % 2 ? rnd() % 100 : rnd();
			q.c.cr.decode_reserve = rnd() % 2 ? rnd() % 1000 : rnd();
			break;
		case 6:
			q.c.cr.out_arena = (Snapkv__V1__ArenaKind)(rnd() % 5);
			q.c.cr.out_dtype = (Snapkv__V1__DType)(rnd() % 5);
			q.c.cr.out_layout = (Snapkv__V1__Layout)(rnd() % 4);
			break;
		default:
			q.c.k.dtype = (Snapkv__V1__DType)(rnd() % 5);
			q.c.cr.n_q = rnd() % 80;
			break;
		}
		if (rnd() % 4 == 0)
			q.c.cr.prefill_wait = NULL;
		st = send_req(g.sk, &q.c.req, &cache);
		tried++;
		expect_errno(st, "compact into the GPU arena", tried);
		if (st == -EPROTO || st == HANG)
			break;
		if (st == 0) {
			done++;
			CU_ASSERT_EQUAL(release_cache(g.sk, cache), 0);
		}
	}
	printf("\n    %u requests, %u compacted ", tried, done);
	CU_ASSERT(done >= 10);
	gsess_close(&g);
	batch_done("GPU-arena compactions");
}

/* Prefill waits of every kind, offset, value, handle and timeout. */
static void test_prefill_waits(void)
{
	struct gsess g;
	unsigned tried = 0, done = 0, timed_out = 0;

	CU_ASSERT_FATAL(gsess_open(&g) == 0);
	/*
	 * The bound is on the wait, not on the kernels behind it: a flag
	 * already past its value, a 1 ms bound shorter than the (emulated)
	 * compaction: done, and the engine's flag not overwritten
	 */
	for (int i = 0; i < 3; i++) {
		struct creq q;
		uint64_t cache = 0;
		int st;

		creq_init(&q, &g);
		*g.flag = 7;
		q.w.timeout_ms = 1;
		st = send_req(g.sk, &q.c.req, &cache);
		CU_ASSERT_EQUAL(st, 0);
		CU_ASSERT_EQUAL(*g.flag, 7);
		if (st == 0)
			CU_ASSERT_EQUAL(release_cache(g.sk, cache), 0);
	}
	*g.flag = 1;
	for (int i = 0; i < 80; i++) {
		struct creq q;
		uint8_t h[100];
		uint64_t cache = 0;
		int st;

		creq_init(&q, &g);
		if (rnd() % 2)
			q.c.cr.out_arena = SNAPKV__V1__ARENA_KIND__ARENA_KIND_UNSPECIFIED;
		q.w.kind = (Snapkv__V1__PrefillWaitKind)(rnd() % 5 ? 1 + rnd() % 2 : rnd() % 6);
		uint64_t bufs[] = {g.vmm, g.ipc, g.mem, 77};
		q.w.buffer_id = bufs[rnd() % 4];
		switch (rnd() % 4) {
		case 0:
			q.w.offset = rnd64();
			break;
		case 1:
			q.w.offset = rnd() % (GRAN + 8);
			break;
		case 2:
			q.w.offset = (GRAN - 4 + rnd() % 12) & ~3ull;
			break;
		default:
			q.w.offset = FLAG_OFF;
		}
		/* flag 1: values above it wait for the bound (kept short) */
		q.w.value = rnd() % 3 ? rnd() % 2 : rnd();
		q.w.timeout_ms = rnd() % 8 == 0 ? rnd() : rnd() % 40;
		*g.ev_word = rnd() % 3 != 0;
		if (rnd() % 3) {
			event_handle(h, rnd() % 4 ? g.ev_fd : (int)(rnd() % 64));
			if (rnd() % 3 == 0) {
				unsigned at = rnd() % 64;

				if (at < 4 || at >= 8)
					h[at] ^= (uint8_t)(1u << (rnd() % 8));
			}
			q.w.ipc_event.len = rnd() % 8 ? 64 : rnd() % 100;
		} else {
			q.w.ipc_event.len = rnd() % 100;
			for (size_t j = 0; j < q.w.ipc_event.len; j++)
				h[j] = rnd();
		}
		q.w.ipc_event.data = h;
		if (q.w.timeout_ms == 0) /* the daemon's bound (tests set it to 100 ms) */
			q.w.timeout_ms = rnd() % 2 ? 0 : 30;
		st = send_req(g.sk, &q.c.req, &cache);
		tried++;
		expect_errno(st, "prefill wait", tried);
		if (st == -EPROTO || st == HANG)
			break;
		timed_out += st == -ETIMEDOUT;
		if (st == 0) {
			done++;
			CU_ASSERT_EQUAL(release_cache(g.sk, cache), 0);
		}
		/* a flag the daemon released was written: set it back */
		*g.flag = 1;
	}
	printf("\n    %u waits, %u compacted, %u timed out ", tried, done, timed_out);
	CU_ASSERT(done >= 5);
	gsess_close(&g);
	batch_done("prefill waits");
}

/* GROW of GPU-arena caches with random extras and ids. */
static void test_grow(void)
{
	struct gsess g;
	unsigned tried = 0, grown = 0;

	CU_ASSERT_FATAL(gsess_open(&g) == 0);
	for (int round = 0; round < 6; round++) {
		struct creq q;
		uint64_t cache = 0;

		creq_init(&q, &g);
		q.c.cr.prefill_wait = NULL;
		q.c.k.buffer_id = round % 2 ? g.vmm : g.mem;
		q.c.q.buffer_id = q.c.k.buffer_id;
		q.c.cr.out_layout = (Snapkv__V1__Layout)(round % 3);
		CU_ASSERT_EQUAL_FATAL(send_req(g.sk, &q.c.req, &cache), 0);
		for (int i = 0; i < 12; i++) {
			Snapkv__V1__Request rq = SNAPKV__V1__REQUEST__INIT;
			Snapkv__V1__GrowRequest gr = SNAPKV__V1__GROW_REQUEST__INIT;
			Snapkv__V1__AppendRequest ap = SNAPKV__V1__APPEND_REQUEST__INIT;
			uint64_t nc = 0;
			int st;

			if (rnd() % 4 == 0) {
				ap.cache_id = rnd() % 6 ? cache : rnd64();
				ap.tokens = rnd() % 3 ? rnd() % 8 : rnd();
				rq.op_case = SNAPKV__V1__REQUEST__OP_APPEND;
				rq.append = &ap;
			} else {
				static const uint32_t ex[] = {0, 1, 7, 64, 1000, 100000, ~0u};
				gr.cache_id = rnd() % 6 ? cache : rnd64();
				gr.extra = rnd() % 3 ? ex[rnd() % 7] : rnd();
				rq.op_case = SNAPKV__V1__REQUEST__OP_GROW;
				rq.grow = &gr;
			}
			st = send_req(g.sk, &rq, &nc);
			tried++;
			expect_errno(st, "grow", tried);
			if (st == -EPROTO || st == HANG)
				break;
			if (st == 0 && rq.op_case == SNAPKV__V1__REQUEST__OP_GROW) {
				grown++;
				CU_ASSERT_EQUAL(nc, cache);
			}
		}
		CU_ASSERT_EQUAL(release_cache(g.sk, cache), 0);
	}
	printf("\n    %u GROW/APPEND, %u grown ", tried, grown);
	CU_ASSERT(grown >= 5);
	gsess_close(&g);
	batch_done("GROW");
}

/* Paged K/V in the VMM, IPC and memfd buffers with random block tables. */
static void test_paged(void)
{
	struct gsess g;
	unsigned tried = 0, done = 0;

	CU_ASSERT_FATAL(gsess_open(&g) == 0);
	for (int i = 0; i < 100; i++) {
		struct creq q;
		int32_t bt[80];
		uint64_t cache = 0;
		int st;

		creq_init(&q, &g);
		if (rnd() % 2)
			q.c.cr.prefill_wait = NULL;
		uint64_t bufs[] = {g.vmm, g.ipc, g.mem};
		q.c.k.buffer_id = q.c.q.buffer_id = bufs[rnd() % 3];
		/* blocks of 16 tokens, 16 x 16 floats each: a valid table is 4 blocks */
		q.c.k.block_size = rnd() % 6 ? 16 : rnd() % 2 ? rnd() % 70 : rnd();
		q.c.k.block_stride = rnd() % 4 ? 16 * 16 * 4 : (int64_t)rnd64() >> (rnd() % 64);
		q.c.k.head_stride = rnd() % 4 ? 16 : (int64_t)(rnd() % 4096);
		q.c.k.token_stride = 16;
		q.c.cr.n_block_table = rnd() % 4 ? 4 : rnd() % 80;
		for (size_t j = 0; j < q.c.cr.n_block_table; j++)
			bt[j] = rnd() % 4 ? (int32_t)(rnd() % 12) : (int32_t)rnd();
		q.c.cr.block_table = bt;
		st = send_req(g.sk, &q.c.req, &cache);
		tried++;
		expect_errno(st, "paged", tried);
		if (st == -EPROTO || st == HANG)
			break;
		if (st == 0) {
			done++;
			CU_ASSERT_EQUAL(release_cache(g.sk, cache), 0);
		}
	}
	printf("\n    %u paged requests, %u compacted ", tried, done);
	CU_ASSERT(done >= 5);
	gsess_close(&g);
	batch_done("paged");
}

/* Valid CUDA requests (and registrations) with bits flipped. */
static void test_flipped(void)
{
	unsigned tried = 0, sessions = 0;

	for (int round = 0; round < 6; round++) {
		struct gsess g;
		uint8_t good[1024], b2[1024];
		size_t glen;
		struct creq q;
		int32_t bt[4] = {3, 0, 2, 1};

		CU_ASSERT_FATAL(gsess_open(&g) == 0);
		sessions++;
		creq_init(&q, &g);
		if (round % 2) {
			q.c.k.block_size = 16;
			q.c.k.block_stride = 16 * 16 * 4;
			q.c.k.head_stride = 16;
			q.c.cr.n_block_table = 4;
			q.c.cr.block_table = bt;
		}
		q.w.timeout_ms = 30;
		glen = snapkv__v1__request__pack(&q.c.req, good);
		for (int i = 0; i < 40; i++) {
			uint64_t cache = 0;
			int st;

			memcpy(b2, good, glen);
			for (int f = rnd() % 3; f >= 0; f--)
				b2[rnd() % glen] ^= (uint8_t)(1u << (rnd() % 8));
			st = request(g.sk, b2, glen, &cache);
			tried++;
			if (st == -EPROTO) /* a flip that broke the framing: closed */
				break;
			expect_errno(st, "flipped compact", tried);
			if (st == HANG)
				break;
			if (st == 0)
				(void)release_cache(g.sk, cache);
			*g.flag = 1;
		}
		/* flipped registrations: an IPC window and a VMM fd */
		for (int i = 0; i < 20 && g.sk >= 0; i++) {
			Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
			Snapkv__V1__RegisterReply *rr;
			struct skv_frame_hdr hdr;
			int vm = i % 2 ? g.vmm_fd : -1;
			size_t n;

			rb.kind = i % 2 ? SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD
					: SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
			rb.size = i % 2 ? GRAN : 4096;
			rb.offset = i % 2 ? 0 : 8192;
			rb.generation = 10 + i;
			rb.ipc_handle.data = g.ipc_h;
			rb.ipc_handle.len = i % 2 ? 0 : 64;
			n = snapkv__v1__register_buffer__pack(&rb, b2);
			for (int f = rnd() % 3; f >= 0; f--) {
				size_t at = rnd() % n;

				/* the handle's pid (bytes 4..7 of it) is never another process's */
				if (i % 2 || at < n - 60 || at >= n - 56)
					b2[at] ^= (uint8_t)(1u << (rnd() % 8));
			}
			tried++;
			n_inputs++;
			if (skv_frame_send(g.sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, b2, n,
					   &vm, vm >= 0, 0) < 0)
				break;
			if (recv_next(g.sk, &hdr, NULL) !=
			    SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY)
				break;
			rr = snapkv__v1__register_reply__unpack(NULL, hdr.length,
								buf + SKV_FRAME_HDR_SIZE);
			CU_ASSERT_PTR_NOT_NULL_FATAL(rr);
			expect_errno(rr->status, "flipped register", tried);
			snapkv__v1__register_reply__free_unpacked(rr, NULL);
		}
		gsess_close(&g);
	}
	printf("\n    %u sessions, %u flipped messages ", sessions, tried);
	batch_done("flipped requests");
}

/*
 * CUDA requests over the ring: valid ones (GPU arena, flags set and not,
 * paged) with bits flipped, four in flight at a time, through the same
 * parser and completion path as the socket's but posted as CQEs.
 */
static void test_ring(void)
{
	unsigned sqes = 0, cqes = 0, ok = 0;

	for (int round = 0; round < 2; round++) {
		struct gsess g;
		struct skv_ring_layout l;
		struct skv_ring_q sq, cq;
		uint8_t good[1024];
		size_t glen;
		struct creq q;
		int32_t bt[4] = {2, 3, 0, 1};

		keep_welcome = true;
		int r = gsess_open(&g);
		keep_welcome = false;
		CU_ASSERT_FATAL(r == 0);
		off_t sz = lseek(welcome_fds[0], 0, SEEK_END);
		uint8_t *map =
		    mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, welcome_fds[0], 0);
		CU_ASSERT_FATAL(map != MAP_FAILED);
		memcpy(&l, map, sizeof(l));
		CU_ASSERT_FATAL(skv_ring_layout_check(&l, sz) == 0);
		skv_ring_q_init(&sq, map, l.sq_off, l.sq_entries, sizeof(struct skv_sqe));
		skv_ring_q_init(&cq, map, l.cq_off, l.cq_entries, sizeof(struct skv_cqe));
		creq_init(&q, &g);
		q.w.timeout_ms = 20;
		if (round) {
			q.c.k.block_size = 16;
			q.c.k.block_stride = 16 * 16 * 4;
			q.c.k.head_stride = 16;
			q.c.cr.n_block_table = 4;
			q.c.cr.block_table = bt;
		}
		glen = snapkv__v1__request__pack(&q.c.req, good);
		for (int batch = 0; batch < 20; batch++) {
			unsigned sent = 0, got = 0;
			struct skv_cqe c;

			*g.flag = rnd() % 4 != 0;
			for (uint32_t i = 0; i < 4 && i < l.arg_slots; i++) {
				uint8_t *slot = map + l.arg_off + (size_t)i * l.arg_slot_size;
				struct skv_sqe e = {.opcode = SKV_OP_REQUEST,
						    .slot = i,
						    .len = (uint32_t)glen,
						    .user_data = (uint64_t)batch << 8 | i};

				memcpy(slot, good, glen);
				for (int f = rnd() % 3 - 1; f >= 0; f--)
					slot[rnd() % glen] ^= (uint8_t)(1u << (rnd() % 8));
				if (skv_ring_produce(&sq, &e) < 0)
					break;
				sent++;
				n_inputs++;
			}
			eventfd_write(welcome_fds[2], 1);
			/* every flag wait here ends within 100 ms, but a flipped prompt_len can
			 * ask for a long (emulated, sanitized) compaction: 60 s is a hang */
			for (int w = 0; w < 60000 && got < sent; w++) {
				while (got < sent && skv_ring_consume(&cq, &c) == 0) {
					got++;
					ok += c.res == 0;
					expect_errno(c.res, "ring CQE", cqes + got);
				}
				if (got < sent)
					h_sleep_ms(1);
			}
			sqes += sent;
			cqes += got;
			CU_ASSERT_EQUAL(got, sent);
			if (got < sent)
				break;
		}
		munmap(map, sz);
		for (int i = 0; i < 4; i++) {
			close(welcome_fds[i]);
			welcome_fds[i] = -1;
		}
		gsess_close(&g);
	}
	printf("\n    %u SQEs, %u CQEs, %u compacted ", sqes, cqes, ok);
	CU_ASSERT(ok >= 10);
	batch_done("ring");
}

/* The next frame is a Response with status want; its mass in last_mass. */
static void expect_response(int sk, int want)
{
	struct skv_frame_hdr hdr;
	int t = recv_next(sk, &hdr, NULL);

	CU_ASSERT_EQUAL(t, SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE);
	if (t != SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE)
		return;
	Snapkv__V1__Response *rs =
	    snapkv__v1__response__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE);
	CU_ASSERT_PTR_NOT_NULL_FATAL(rs);
	CU_ASSERT_EQUAL(rs->status, want);
	last_mass = NAN;
	if (rs->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE && rs->cache->n_retained_mass)
		last_mass = rs->cache->retained_mass[0];
	snapkv__v1__response__free_unpacked(rs, NULL);
}

/*
 * Buffers unregistered, sessions closed while a job still waits on them, or
 * while a compaction into the GPU arena or a GROW in it is in flight:
 * the job holds the import; it ends (done, reading the unregistered
 * buffer's own memory, or -ETIMEDOUT at its bound), then the import goes.
 * The generation of a buffer whose import a job still holds, registered
 * again for another allocation, names the new allocation.
 */
static void test_unregister_busy(void)
{
	struct gsess g;

	for (int round = 0; round < 4; round++) {
		struct creq q;
		uint8_t p[1024];
		size_t n;

		CU_ASSERT_FATAL(gsess_open(&g) == 0);
		creq_init(&q, &g);
		*g.flag = 0;
		q.w.timeout_ms = 100;
		n = snapkv__v1__request__pack(&q.c.req, p);
		n_inputs++;
		CU_ASSERT_EQUAL(
		    skv_frame_send(g.sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, p, n, NULL, 0, 0),
		    0);
		h_sleep_ms(20);
		CU_ASSERT_EQUAL(unreg(g.sk, g.vmm), 0);
		if (round == 0) {
			expect_response(g.sk, -ETIMEDOUT); /* never released */
		} else if (round == 1) {
			/* the same generation, another allocation, the old one held */
			Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
			int other = gpu_memfd("fuzz-vmm", GRAN);
			uint64_t id = 0, cache = 0;
			struct h_compact c;

			rb.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
			rb.size = GRAN;
			rb.generation = 1;
			CU_ASSERT_EQUAL(reg(g.sk, &rb, &other, 1, &id), 0);
			*g.flag = 1;
			expect_response(g.sk, 0);
			CU_ASSERT(fabsf(last_mass - host_mass(g.vmm_fd)) <= 1e-4f);
			h_compact_init(&c, id, 1, 64, 16, 8, 4096, 8, 24);
			CU_ASSERT_EQUAL(send_req(g.sk, &c.req, &cache), 0);
			float want = host_mass(other);
			if (!(fabsf(last_mass - want) <= 1e-4f))
				printf("\n    generation reused: mass %g, its allocation's %g ",
				       last_mass, want);
			CU_ASSERT(fabsf(last_mass - want) <= 1e-4f);
			CU_ASSERT_EQUAL(release_cache(g.sk, cache), 0);
			close(other);
		} else if (round == 3) {
			*g.flag = 1; /* released: the job runs on the unregistered buffer */
			expect_response(g.sk, 0);
			CU_ASSERT(fabsf(last_mass - host_mass(g.vmm_fd)) <= 1e-4f);
		}
		/* round 2: the session goes with its job pending */
		gsess_close(&g);
	}
	/*
	 * The session goes while a compaction into its GPU arena, or a GROW
	 * copying device to device in it, is queued or running: the arena is
	 * freed after the last job, nothing is left behind
	 */
	for (int round = 0; round < 4; round++) {
		struct creq q;
		uint8_t p[1024];
		uint64_t cache = 0;
		size_t n;

		CU_ASSERT_FATAL(gsess_open(&g) == 0);
		creq_init(&q, &g);
		if (round % 2) {
			Snapkv__V1__Request rq = SNAPKV__V1__REQUEST__INIT;
			Snapkv__V1__GrowRequest gr = SNAPKV__V1__GROW_REQUEST__INIT;

			CU_ASSERT_EQUAL(send_req(g.sk, &q.c.req, &cache), 0);
			gr.cache_id = cache;
			gr.extra = 64;
			rq.op_case = SNAPKV__V1__REQUEST__OP_GROW;
			rq.grow = &gr;
			n = snapkv__v1__request__pack(&rq, p);
		} else {
			n = snapkv__v1__request__pack(&q.c.req, p);
		}
		for (int i = 0; i < 1 + round / 2; i++) {
			n_inputs++;
			CU_ASSERT_EQUAL(skv_frame_send(g.sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST,
						       p, n, NULL, 0, 0),
					0);
		}
		if (round >= 2)
			h_sleep_ms(5);
		gsess_close(&g);
	}
	batch_done("unregister while busy");
}

/*
 * SIGTERM with prefill waits pending on several sessions (flags never set,
 * events never completed) and a compaction queued behind them: the drain
 * ends each at its bound, every engine gets its answer, exit 0. Last: it
 * stops the suite's daemon.
 */
static void test_sigterm(void)
{
	struct gsess g[2];
	int st = -1, answered = 0, sent = 0;

	for (int i = 0; i < 2; i++) {
		CU_ASSERT_FATAL(gsess_open(&g[i]) == 0);
		*g[i].flag = 0;
		*g[i].ev_word = 0;
	}
	for (int i = 0; i < 2; i++)
		for (int k = 0; k < 3; k++) {
			struct creq q;
			uint8_t p[1024];
			size_t n;

			creq_init(&q, &g[i]);
			q.w.timeout_ms = 100;
			if (k == 1) {
				q.w.kind =
				    SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_IPC_EVENT;
				q.w.ipc_event.data = g[i].ev_h;
				q.w.ipc_event.len = 64;
			}
			if (k == 2)
				q.c.cr.prefill_wait = NULL;
			n = snapkv__v1__request__pack(&q.c.req, p);
			n_inputs++;
			sent += skv_frame_send(g[i].sk, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, p,
					       n, NULL, 0, 0) == 0;
		}
	h_sleep_ms(20);
	kill(H.pid, SIGTERM);
	/* 6 jobs on one worker, each waiting 100 ms at most: well within 10 s */
	bool exited = false;
	for (int i = 0; i < 1000 && !exited; i++) {
		exited = waitpid(H.pid, &st, WNOHANG) == H.pid;
		if (!exited)
			h_sleep_ms(10);
	}
	CU_ASSERT(exited && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (exited)
		h_reaped(&H);
	else
		h_kill(&H);
	for (int i = 0; i < 2; i++) {
		struct skv_frame_hdr hdr;

		while (recv_next(g[i].sk, &hdr, NULL) == SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE)
			answered++;
		gsess_close(&g[i]);
	}
	printf("\n    %d of %d requests answered during the drain ", answered, sent);
	CU_ASSERT_EQUAL(answered, sent);
}

static int suite_init(void)
{
	static const char *extra[] = {"--pool-bytes", "64M", "--config", NULL, NULL};
	static char conf[128];
	char plugin[512];
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	FILE *f;

	setenv("SNAPKVD_TEST_BACKEND", "cuda-emu", 1);
	if (!getenv("SKV_CUDA_PLUGIN")) {
		snprintf(plugin, sizeof(plugin), "%s/tests/gpu/emu/libskv-cuda-emu.so", build);
		char *abs = realpath(plugin, NULL);
		if (!abs)
			return -1;
		setenv("SKV_CUDA_PLUGIN", abs, 1);
		free(abs);
	}
	/* a short bound for waits with timeout_ms 0 */
	snprintf(H.dir, sizeof(H.dir), "/tmp/snapkvd-gpufuzz-XXXXXX");
	if (!mkdtemp(H.dir))
		return -1;
	snprintf(conf, sizeof(conf), "%s/d.conf", H.dir);
	f = fopen(conf, "w");
	if (!f)
		return -1;
	fprintf(f, "prefill_wait_max_ms = 100\n");
	fclose(f);
	extra[3] = conf;
	return h_start(&H, extra) < 0 ? -1 : 0;
}

/* A first job (the workers' upload buffers exist from here), then the fd baseline. */
static void test_warmup(void)
{
	bystander_ok();
	h_sleep_ms(20);
	base_fds = h_count_fds_cuda(H.pid);
	CU_ASSERT(base_fds > 0);
}

static int suite_clean(void)
{
	char conf[128];
	int st = H.pid > 0 ? h_stop(&H) : 0; /* test_sigterm stopped it */

	snprintf(conf, sizeof(conf), "%s/d.conf", H.dir);
	unlink(conf);
	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

int main(void)
{
	CU_pSuite s;
	int rc;
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	char plugin[512];

	signal(SIGPIPE, SIG_IGN);
	snprintf(plugin, sizeof(plugin), "%s/tests/gpu/emu/libskv-cuda-emu.so", build);
	if (!getenv("SKV_CUDA_PLUGIN") && access(plugin, R_OK) != 0)
		return t_skip_program("cuda", "%s not built", plugin);
	if (getenv("FUZZ_SEED")) /* explore beyond the default, deterministic run */
		seed = strtoull(getenv("FUZZ_SEED"), NULL, 0);
	printf("seed %llu\n", (unsigned long long)seed);
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("daemon-gpufuzz", suite_init, suite_clean);
	CU_add_test(s, "bystander equal to the host, fd baseline", test_warmup);
	CU_add_test(s, "CUDA registrations", test_register);
	CU_add_test(s, "GPU arena requests", test_arena);
	CU_add_test(s, "COMPACT into the GPU arena, bad geometry", test_compact_gpu_arena);
	CU_add_test(s, "prefill waits", test_prefill_waits);
	CU_add_test(s, "GROW of GPU-arena caches", test_grow);
	CU_add_test(s, "paged block tables", test_paged);
	CU_add_test(s, "byte-flipped CUDA requests", test_flipped);
	CU_add_test(s, "unregister and close while a job waits", test_unregister_busy);
	CU_add_test(s, "CUDA requests over the ring, flipped", test_ring);
	CU_add_test(s, "SIGTERM with prefill waits pending", test_sigterm);
	rc = h_run_tests();
	printf("\n%u inputs\n", n_inputs);
	return rc;
}
