// SPDX-License-Identifier: MIT
/*
 * test-daemon-fuzz: seeded random and mutated input against a live snapkvd:
 * garbage datagrams, valid headers over random payloads of every message
 * type, byte-flipped COMPACT requests over the socket and the ring, random
 * SQEs. Afterwards the daemon is alive, a bystander engine still compacts,
 * and its fds and pool bytes are back to their baseline. Deterministic.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include "daemon-harness.h"
#include "proto/skv-ring.h"
#include "snapkv.h"

static struct harness H;
static uint64_t seed = 20261129;

static uint32_t rnd(void)
{
	seed = seed * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(seed >> 33);
}

/* Read and drop whatever the daemon sent; close passed fds. */
static void drain(int fd)
{
	uint8_t buf[4096];
	union {
		char b[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr a;
	} ctl;

	for (;;) {
		struct iovec iov = {buf, sizeof(buf)};
		struct msghdr m = {.msg_iov = &iov,
				   .msg_iovlen = 1,
				   .msg_control = ctl.b,
				   .msg_controllen = sizeof(ctl.b)};
		ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (n <= 0)
			return;
		skv_frame_close_fds(&m);
	}
}

/* A valid COMPACT request naming buffer 1, packed. */
static size_t valid_compact(uint8_t *out)
{
	struct h_compact c;
	int32_t bt[2] = {1, 0};

	h_compact_init(&c, 1, 1, 64, 16, 8, 4096, 8, 24);
	c.cr.decode_reserve = 4;
	c.cr.n_block_table = 2;
	c.cr.block_table = bt;
	return snapkv__v1__request__pack(&c.req, out);
}

static int hello(int fd, int *fds)
{
	Snapkv__V1__Hello h = SNAPKV__V1__HELLO__INIT;
	uint8_t buf[256];
	struct skv_frame_hdr hdr;
	unsigned nf = 4;
	size_t n;

	h.client_version = SKV_PROTO_VERSION;
	n = snapkv__v1__hello__pack(&h, buf);
	if (skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf, n, NULL, 0, 0) < 0)
		return -1;
	return skv_frame_recv(fd, buf, sizeof(buf), &hdr, fds, &nf, 0) >= 0 && nf == 4 ? 0 : -1;
}

/* A sealed memfd registered as buffer 1, filled with small floats. */
static void register_buffer(int fd)
{
	Snapkv__V1__RegisterBuffer rb = SNAPKV__V1__REGISTER_BUFFER__INIT;
	uint8_t buf[512];
	struct skv_frame_hdr hdr;
	int m = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	float *f;
	size_t n;

	(void)!ftruncate(m, 16384);
	f = mmap(NULL, 16384, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0);
	for (int i = 0; i < 4096; i++)
		f[i] = (float)(rnd() % 1000) / 500.0f - 1.0f;
	munmap(f, 16384);
	fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK);
	n = snapkv__v1__register_buffer__pack(&rb, buf);
	skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, buf, n, &m, 1, 0);
	close(m);
	skv_frame_recv(fd, buf, sizeof(buf), &hdr, NULL, NULL, 0);
}

static void test_pre_hello(void)
{
	uint8_t buf[512];

	for (int i = 0; i < 300; i++) {
		int fd = h_connect_raw(H.sock);
		size_t len = rnd() % sizeof(buf);

		CU_ASSERT_FATAL(fd >= 0);
		for (size_t j = 0; j < len; j++)
			buf[j] = rnd();
		if (rnd() % 2 && len >= SKV_FRAME_HDR_SIZE) {
			struct skv_frame_hdr h = {SKV_FRAME_MAGIC, SKV_PROTO_VERSION,
						  (uint16_t)(rnd() % 14), 0,
						  (uint32_t)(len - SKV_FRAME_HDR_SIZE)};
			if (rnd() % 4 == 0)
				h.length = rnd();
			skv_frame_hdr_encode(&h, buf);
		}
		(void)!send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		drain(fd);
		close(fd);
	}
}

static void test_post_hello(void)
{
	uint8_t good[512], buf[512];
	size_t glen = valid_compact(good);
	unsigned sessions = 0, frames = 0, sqes = 0, cqes = 0;

	for (int round = 0; round < 40; round++) {
		int fd = h_connect_raw(H.sock), fds[4] = {-1, -1, -1, -1};

		CU_ASSERT_FATAL(fd >= 0);
		if (hello(fd, fds) < 0) {
			close(fd);
			continue;
		}
		sessions++;
		register_buffer(fd);
		for (int i = 0; i < 50; i++) {
			uint16_t type;
			size_t len;

			if (rnd() % 3) {
				/* a valid request with a few bytes flipped */
				memcpy(buf, good, glen);
				len = glen;
				for (int f = rnd() % 4; f >= 0; f--)
					buf[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
				type = SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST;
			} else {
				len = rnd() % 200;
				for (size_t j = 0; j < len; j++)
					buf[j] = rnd();
				type = (uint16_t)(1 + rnd() % 13);
				if (type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO)
					type = SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN;
			}
			if (skv_frame_send(fd, type, buf, len, NULL, 0, MSG_DONTWAIT) < 0)
				break;
			frames++;
			if (i % 8 == 0)
				drain(fd);
		}
		/* the ring: random SQEs over mutated requests */
		struct skv_ring_layout l;
		off_t sz = lseek(fds[0], 0, SEEK_END);
		uint8_t *map = sz > 0
				   ? mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0)
				   : MAP_FAILED;
		if (map != MAP_FAILED) {
			struct skv_ring_q sq, cq;
			struct skv_cqe c;

			memcpy(&l, map, sizeof(l));
			if (skv_ring_layout_check(&l, sz) == 0) {
				skv_ring_q_init(&sq, map, l.sq_off, l.sq_entries,
						sizeof(struct skv_sqe));
				skv_ring_q_init(&cq, map, l.cq_off, l.cq_entries,
						sizeof(struct skv_cqe));
				for (int i = 0; i < 100; i++) {
					struct skv_sqe e = {.opcode = (uint8_t)(rnd() % 4),
							    .slot = rnd() % (l.arg_slots + 2),
							    .len =
								rnd() % 2 ? (uint32_t)glen : rnd(),
							    .user_data = i};
					if (e.slot < l.arg_slots) {
						uint8_t *slot = map + l.arg_off +
								(size_t)e.slot * l.arg_slot_size;
						memcpy(slot, good, glen);
						slot[rnd() % glen] ^= (uint8_t)(1u << (rnd() % 8));
					}
					if (skv_ring_produce(&sq, &e) < 0)
						break;
					sqes++;
					eventfd_write(fds[2], 1);
					for (int w = 0; w < 200 && skv_ring_ready(&cq) == 0; w++)
						usleep(50);
					while (skv_ring_consume(&cq, &c) == 0)
						cqes++;
				}
				if (round % 10 == 9) /* and now and then, a corrupt tail */
					atomic_store(&sq.ctl->tail, sq.local + 12345);
				eventfd_write(fds[2], 1);
			}
			munmap(map, sz);
		}
		drain(fd);
		for (int i = 0; i < 4; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		close(fd);
	}
	printf("\n    %u sessions, %u frames, %u SQEs, %u CQEs ", sessions, frames, sqes, cqes);
	/* the fuzz must really reach the daemon */
	CU_ASSERT(sessions >= 20);
	CU_ASSERT(frames >= 200);
	CU_ASSERT(sqes >= 500);
	CU_ASSERT(cqes >= sqes / 2);
}

static void test_still_serving(void)
{
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[1];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;

	CU_ASSERT_FATAL(h_alive(&H));
	CU_ASSERT_EQUAL_FATAL(skv_client_connect(H.sock, NULL, &c), 0);
	CU_ASSERT_EQUAL(skv_client_nop(c), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, 16384, &b), 0);
	float *f = skv_buffer_data(b);
	for (int i = 0; i < 4096; i++)
		f[i] = (float)(rnd() % 1000) / 500.0f - 1.0f;
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape =
	    (struct skv_shape){.prompt_len = 64, .head_dim = 16, .h_q = 1, .h_kv = 1, .n_q = 8};
	d.layers = 1;
	skv_client_params_init(&d.params);
	d.params.window = 8;
	d.params.capacity = 24;
	lr[0].q = (struct skv_tensor_ref){b, 0, SKV_DTYPE_F32, 8 * 16, 16, 0, 0};
	lr[0].k = (struct skv_tensor_ref){b, 4096, SKV_DTYPE_F32, 64 * 16, 16, 0, 0};
	lr[0].v = lr[0].k;
	d.layer = lr;
	CU_ASSERT_EQUAL(skv_client_compact(c, &d, &k), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	skv_buffer_free(b);
	skv_client_close(c);
}

static void test_baseline(void)
{
	for (int i = 0; i < 200 && (h_sessions(H.sock) != 0 || h_pool_used(H.sock) != 0); i++)
		h_sleep_ms(10);
	CU_ASSERT_EQUAL(h_sessions(H.sock), 0);
	CU_ASSERT_EQUAL(h_pool_used(H.sock), 0);
	CU_ASSERT_EQUAL(h_cuda_imports(H.sock), 0);
}

static int base_fds;

static int suite_init(void)
{
	if (h_start(&H, NULL) < 0)
		return -1;
	h_sleep_ms(20);
	base_fds = h_count_fds(H.pid);
	return 0;
}

static int suite_clean(void)
{
	int st = h_stop(&H);

	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

static void test_fds(void)
{
	int fds = -1;

	for (int i = 0; i < 200; i++) {
		/* cuda: less the workers' upload buffers (daemon-harness.h) */
		fds = h_backend_cuda() ? h_count_fds_cuda(H.pid) : h_count_fds(H.pid);
		if (fds == base_fds)
			break;
		h_sleep_ms(10);
	}
	CU_ASSERT_EQUAL(fds, base_fds);
}

int main(void)
{
	CU_pSuite s;

	signal(SIGPIPE, SIG_IGN);
	if (getenv("FUZZ_SEED")) /* explore beyond the default, deterministic run */
		seed = strtoull(getenv("FUZZ_SEED"), NULL, 0);
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("daemon-fuzz", suite_init, suite_clean);
	CU_add_test(s, "garbage before HELLO", test_pre_hello);
	CU_add_test(s, "mutated messages and ring entries", test_post_hello);
	CU_add_test(s, "still serving", test_still_serving);
	CU_add_test(s, "sessions and pool back to zero", test_baseline);
	CU_add_test(s, "fds back to baseline", test_fds);
	return h_run_tests();
}
