// SPDX-License-Identifier: MIT
/* test-proto-frame: frame header validation, fd passing and protobuf limits. */
#include <CUnit/Basic.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/skv-frame.h"
#include "proto/snapkv.pb-c.h"

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the DIR's own fd */
}

static void mkhdr(uint8_t *buf, uint32_t magic, uint16_t ver, uint16_t type, uint32_t flags,
		  uint32_t len)
{
	struct skv_frame_hdr h = {magic, ver, type, flags, len};

	skv_frame_hdr_encode(&h, buf);
}

static void test_hdr_roundtrip(void)
{
	uint8_t buf[SKV_FRAME_HDR_SIZE + 8];
	struct skv_frame_hdr h;

	mkhdr(buf, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 7, 0, 8);
	/* little-endian on the wire whatever the host */
	CU_ASSERT_EQUAL(buf[0], 'S');
	CU_ASSERT_EQUAL(buf[1], 'K');
	CU_ASSERT_EQUAL(buf[2], 'V');
	CU_ASSERT_EQUAL(buf[3], '1');
	CU_ASSERT_EQUAL(buf[12], 8);
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, sizeof(buf), 1024, &h), 0);
	CU_ASSERT_EQUAL(h.type, 7);
	CU_ASSERT_EQUAL(h.length, 8);
}

static void test_hdr_bad(void)
{
	uint8_t buf[SKV_FRAME_HDR_SIZE + 8];
	struct skv_frame_hdr h = {0};

	mkhdr(buf, 0xdeadbeef, SKV_PROTO_VERSION, 7, 0, 8);
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, sizeof(buf), 1024, &h), -EBADMSG);
	mkhdr(buf, SKV_FRAME_MAGIC, 2, 7, 0, 8);
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, sizeof(buf), 1024, &h), -EPROTONOSUPPORT);
	mkhdr(buf, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 7, 1, 8);
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, sizeof(buf), 1024, &h), -EBADMSG);
	mkhdr(buf, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 0, 0, 8);
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, sizeof(buf), 1024, &h), -EBADMSG);
	/* truncated: header says 8, 4 arrived */
	mkhdr(buf, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 7, 0, 8);
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, SKV_FRAME_HDR_SIZE + 4, 1024, &h), -EBADMSG);
	/* short header */
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, 10, 1024, &h), -EBADMSG);
	/* oversized */
	mkhdr(buf, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 7, 0, 0x7fffffff);
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, sizeof(buf), 1024, &h), -EMSGSIZE);
	mkhdr(buf, SKV_FRAME_MAGIC, SKV_PROTO_VERSION, 7, 0, 8);
	CU_ASSERT_EQUAL(skv_frame_hdr_decode(buf, sizeof(buf), 4, &h), -EMSGSIZE);
	CU_ASSERT_EQUAL(h.type, 0); /* untouched on failure */
}

static void test_send_recv_fds(void)
{
	int sv[2], fds[SKV_FRAME_MAX_FDS], p[2];
	uint8_t buf[256];
	struct skv_frame_hdr h;
	unsigned n = 2;
	int base = count_fds();

	CU_ASSERT_FATAL(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0);
	CU_ASSERT_FATAL(pipe(p) == 0);
	base += 4;
	CU_ASSERT_EQUAL(skv_frame_send(sv[0], 3, "hello", 5, p, 2, 0), 0);
	CU_ASSERT_EQUAL(skv_frame_recv(sv[1], buf, sizeof(buf), &h, fds, &n, 0), 5);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_EQUAL(h.type, 3);
	CU_ASSERT_EQUAL(memcmp(buf + SKV_FRAME_HDR_SIZE, "hello", 5), 0);
	CU_ASSERT(fcntl(fds[0], F_GETFD) & FD_CLOEXEC);
	close(fds[0]);
	close(fds[1]);
	CU_ASSERT_EQUAL(count_fds(), base);

	/* unexpected fds are closed, not leaked */
	n = 0;
	CU_ASSERT_EQUAL(skv_frame_send(sv[0], 3, "x", 1, p, 2, 0), 0);
	CU_ASSERT_EQUAL(skv_frame_recv(sv[1], buf, sizeof(buf), &h, NULL, &n, 0), 1);
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_EQUAL(count_fds(), base);

	/* a datagram bigger than the buffer: MSG_TRUNC -> -EMSGSIZE, fds closed */
	n = 2;
	CU_ASSERT_EQUAL(skv_frame_send(sv[0], 3, buf, 200, p, 2, 0), 0);
	CU_ASSERT_EQUAL(skv_frame_recv(sv[1], buf, 64, &h, fds, &n, 0), -EMSGSIZE);
	CU_ASSERT_EQUAL(count_fds(), base);

	/* raw garbage on the socket */
	CU_ASSERT_EQUAL(send(sv[0], "garbage-garbage-garbage", 23, 0), 23);
	CU_ASSERT_EQUAL(skv_frame_recv(sv[1], buf, sizeof(buf), &h, fds, &n, 0), -EBADMSG);

	/* too many fds refused by the sender */
	CU_ASSERT_EQUAL(skv_frame_send(sv[0], 3, "x", 1, p, SKV_FRAME_MAX_FDS + 1, 0), -EMSGSIZE);
	CU_ASSERT_EQUAL(skv_frame_send(sv[0], 3, buf, SKV_FRAME_MAX_PAYLOAD + 1, NULL, 0, 0),
			-EMSGSIZE);

	/* end of stream */
	close(sv[0]);
	CU_ASSERT_EQUAL(skv_frame_recv(sv[1], buf, sizeof(buf), &h, fds, &n, 0), -ECONNRESET);
	close(sv[1]);
	close(p[0]);
	close(p[1]);
	CU_ASSERT_EQUAL(count_fds(), base - 4);
}

static void test_protobuf_limits(void)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__AppendRequest ap = SNAPKV__V1__APPEND_REQUEST__INIT;
	uint8_t buf[64];
	size_t n;
	Snapkv__V1__Request *r;

	ap.cache_id = 12345678;
	ap.tokens = 9;
	req.op_case = SNAPKV__V1__REQUEST__OP_APPEND;
	req.append = &ap;
	req.user_data = 77;
	n = snapkv__v1__request__pack(&req, buf);
	CU_ASSERT(n > 4 && n < sizeof(buf));
	r = snapkv__v1__request__unpack(NULL, n, buf);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL(r->op_case, SNAPKV__V1__REQUEST__OP_APPEND);
	CU_ASSERT_EQUAL(r->append->cache_id, 12345678);
	snapkv__v1__request__free_unpacked(r, NULL);
	/* every truncation either fails or decodes to something smaller */
	for (size_t i = 1; i < n; i++) {
		r = snapkv__v1__request__unpack(NULL, i, buf);
		if (r) {
			CU_ASSERT(!(r->op_case == SNAPKV__V1__REQUEST__OP_APPEND &&
				    r->append->cache_id == 12345678 && r->user_data == 77));
			snapkv__v1__request__free_unpacked(r, NULL);
		}
	}
	/* a length prefix that promises more than there is */
	uint8_t bad[] = {0x12, 0x7f, 0x08};
	r = snapkv__v1__request__unpack(NULL, sizeof(bad), bad);
	CU_ASSERT_PTR_NULL(r);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("proto-frame", NULL, NULL);
	CU_add_test(s, "header roundtrip", test_hdr_roundtrip);
	CU_add_test(s, "bad headers", test_hdr_bad);
	CU_add_test(s, "send/recv with fds", test_send_recv_fds);
	CU_add_test(s, "protobuf truncation", test_protobuf_limits);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
