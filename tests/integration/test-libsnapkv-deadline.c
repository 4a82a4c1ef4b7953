// SPDX-License-Identifier: MIT
/*
 * test-libsnapkv-deadline.c - libsnapkv's deadlines against fake daemons that
 * are alive but do not answer: one that never accepts, one that accepts and
 * stays silent, one that sends stray frames but never the reply, one that
 * answers half a frame, and one that completes the handshake (a real ring)
 * and then goes silent. Each call must return -ETIMEDOUT, not before its
 * deadline and before a hang guard (HANG_MS: far above any scheduling delay
 * of a loaded machine, far below the 30 s default a call that ignored its
 * deadline would wait; the times are printed), leak no fds, and leave
 * the client failing with -ENOTCONN where a late reply could desynchronise
 * the socket. A submit that only the caller's own waits could make room
 * for fails at once instead of waiting out the deadline, and params sized
 * before the budget modes but given a mode are refused before anything is
 * sent. Also the deadline helpers of proto/skv-io.h on a socketpair, and
 * snapkvctl --timeout.
 *
 * Each fake runs in a forked child (so the test's own fd count is the
 * client's alone) and is killed at the end of its test.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/skv-frame.h"
#include "proto/skv-ring.h"
#include "proto/snapkv.pb-c.h"
#include "skv-io.h"
#include "snapkv.h"

/* deadlines under test, and the bound every call must meet */
#define DL_MS	   200u
#define HANG_MS	   10000u
#define STRAY_MS   50 /* the stray fake sends a frame this often: < DL_MS */
#define ARENA_SIZE (1u << 20)

enum fake_mode {
	FAKE_NOACCEPT, /* listens (backlog full), never accepts */
	FAKE_SILENT,   /* accepts, reads nothing, answers nothing */
	FAKE_STRAY,    /* answers only frames of another type, every STRAY_MS */
	FAKE_HALF,     /* answers the Hello with a frame header and no payload */
	FAKE_WELCOME,  /* a real handshake (ring, arena, eventfds), then silence */
};

struct fake {
	char dir[64];
	char sock[108];
	pid_t pid;
	int filler; /* FAKE_NOACCEPT: the connection that fills the backlog */
};

static double now_ms(void)
{
	return (double)skv_io_now_ns() / 1e6;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own fd */
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* The fake daemon's side of a real handshake: ring and arena memfds and two
 * eventfds, exactly what libsnapkv maps and checks. */
static int fake_welcome(int fd)
{
	Snapkv__V1__Welcome w = SNAPKV__V1__WELCOME__INIT;
	struct skv_ring_layout l;
	uint8_t buf[256];
	int fds[4] = {-1, -1, -1, -1}, r = -1;
	void *p;

	if (skv_ring_layout_init(&l, 8, 16, 4096) < 0)
		return -1;
	fds[0] = memfd_create("fake-ring", MFD_CLOEXEC);
	fds[1] = memfd_create("fake-arena", MFD_CLOEXEC);
	fds[2] = eventfd(0, EFD_CLOEXEC);
	fds[3] = eventfd(0, EFD_CLOEXEC);
	if (fds[0] < 0 || fds[1] < 0 || fds[2] < 0 || fds[3] < 0 ||
	    ftruncate(fds[0], (off_t)l.total_size) < 0 || ftruncate(fds[1], ARENA_SIZE) < 0)
		goto out;
	p = mmap(NULL, l.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	if (p == MAP_FAILED)
		goto out;
	memcpy(p, &l, sizeof(l));
	munmap(p, l.total_size);
	w.server_version = SKV_PROTO_VERSION;
	w.session_id = 42;
	w.ring_bytes = l.total_size;
	w.arena_bytes = ARENA_SIZE;
	w.features = SKV_RING_F_KNOWN;
	r = skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME, buf,
			   snapkv__v1__welcome__pack(&w, buf), fds, 4, 0);
out:
	for (int i = 0; i < 4; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return r;
}

/* One connection of the fake (child process). */
static void fake_serve(int fd, enum fake_mode mode)
{
	static uint8_t buf[SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD];
	struct skv_frame_hdr h;

	switch (mode) {
	case FAKE_STRAY:
		/* something arrives all the time, never the reply */
		for (;;) {
			if (skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY, NULL, 0,
					   NULL, 0, 0) < 0)
				return;
			sleep_ms(STRAY_MS);
		}
	case FAKE_HALF: {
		uint8_t hdr[SKV_FRAME_HDR_SIZE];
		struct skv_frame_hdr fh = {.magic = SKV_FRAME_MAGIC,
					   .version = SKV_PROTO_VERSION,
					   .type = SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME,
					   .length = 100};

		if (skv_frame_recv(fd, buf, sizeof(buf), &h, NULL, NULL, 0) < 0)
			return;
		skv_frame_hdr_encode(&fh, hdr);
		if (send(fd, hdr, sizeof(hdr), MSG_NOSIGNAL) < 0)
			return;
		break;
	}
	case FAKE_WELCOME:
		if (skv_frame_recv(fd, buf, sizeof(buf), &h, NULL, NULL, 0) < 0 ||
		    h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO || fake_welcome(fd) < 0)
			return;
		break;
	default:
		break;
	}
	/* hung: keep the connection open, answer nothing more */
	for (;;)
		pause();
}

static int fake_start(struct fake *f, enum fake_mode mode)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int ls;

	memset(f, 0, sizeof(*f));
	f->filler = -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/skv-deadline-XXXXXX");
	if (!mkdtemp(f->dir))
		return -errno;
	snprintf(f->sock, sizeof(f->sock), "%s/fake.sock", f->dir);
	memcpy(sa.sun_path, f->sock, strlen(f->sock) + 1);
	ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(ls, mode == FAKE_NOACCEPT ? 0 : 8) < 0) {
		if (ls >= 0)
			close(ls);
		return -errno;
	}
	if (mode == FAKE_NOACCEPT) {
		/* backlog 0 holds one pending connection: take it, so the next
		 * connect waits for room that never comes */
		f->filler = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (f->filler < 0 || connect(f->filler, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			close(ls);
			return -errno;
		}
	}
	f->pid = fork();
	if (f->pid < 0) {
		close(ls);
		return -errno;
	}
	if (f->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (mode == FAKE_NOACCEPT)
			for (;;)
				pause();
		for (;;) {
			int fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC);

			if (fd < 0)
				_exit(1);
			if (fork() == 0) {
				/* dies with the acceptor that fake_stop kills */
				prctl(PR_SET_PDEATHSIG, SIGKILL);
				close(ls);
				fake_serve(fd, mode);
				_exit(0);
			}
			close(fd);
		}
	}
	close(ls);
	return 0;
}

static void fake_stop(struct fake *f)
{
	if (f->pid > 0) {
		/* its per-connection children follow (PR_SET_PDEATHSIG) */
		kill(f->pid, SIGKILL);
		waitpid(f->pid, NULL, 0);
	}
	f->pid = 0;
	if (f->filler >= 0)
		close(f->filler);
	f->filler = -1;
	unlink(f->sock);
	rmdir(f->dir);
}

static void check_elapsed(const char *what, double t0, uint32_t dl_ms)
{
	double ms = now_ms() - t0;

	printf("\n    %s: -ETIMEDOUT after %.1f ms (deadline %u ms) ", what, ms, dl_ms);
	/* poll() never wakes early: the deadline itself was waited out */
	CU_ASSERT(ms >= dl_ms - 1);
	CU_ASSERT(ms < HANG_MS);
}

static struct skv_client_opts opts_ms(int32_t ms)
{
	return (struct skv_client_opts){
	    .opts_size = sizeof(struct skv_client_opts), .name = "deadline-test", .timeout_ms = ms};
}

/* ---------------------------------------------------------------- tests */

static void test_helpers(void)
{
	int sv[2], n = 0, r;
	uint32_t ms = 1;
	struct skv_frame_hdr h;
	uint8_t buf[64];
	double t0;

	CU_ASSERT_EQUAL(skv_io_poll_ms(0), -1);
	CU_ASSERT_EQUAL(skv_io_poll_ms(1), 0); /* long past */
	r = skv_io_poll_ms(skv_io_deadline(1500));
	CU_ASSERT(r > 1400 && r <= 1500);
	CU_ASSERT_EQUAL(skv_io_deadline(0), 0);

	unsetenv("SNAPKV_TIMEOUT_MS");
	CU_ASSERT_EQUAL(skv_io_timeout_env(&ms), 0);
	CU_ASSERT_EQUAL(ms, 30000);
	setenv("SNAPKV_TIMEOUT_MS", "0", 1);
	CU_ASSERT_EQUAL(skv_io_timeout_env(&ms), 0);
	CU_ASSERT_EQUAL(ms, 0);
	setenv("SNAPKV_TIMEOUT_MS", "2147483647", 1);
	CU_ASSERT_EQUAL(skv_io_timeout_env(&ms), 0);
	CU_ASSERT_EQUAL(ms, 2147483647u);
	ms = 7;
	const char *bad[] = {"2147483648", "-1", "1s", " 5", "99999999999999999999999", "0x10"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("SNAPKV_TIMEOUT_MS", bad[i], 1);
		CU_ASSERT_EQUAL(skv_io_timeout_env(&ms), -EINVAL);
	}
	CU_ASSERT_EQUAL(ms, 7); /* untouched on failure */
	unsetenv("SNAPKV_TIMEOUT_MS");

	CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	/* nothing to receive */
	t0 = now_ms();
	CU_ASSERT_EQUAL(
	    skv_io_recv(sv[0], buf, sizeof(buf), &h, NULL, NULL, skv_io_deadline(DL_MS)),
	    -ETIMEDOUT);
	check_elapsed("recv, nothing sent", t0, DL_MS);
	/* a peer that stopped reading: fill its queue, then a send must wait
	 * out the deadline and send nothing */
	memset(buf, 0, sizeof(buf));
	while (skv_frame_send(sv[0], 7, buf, 32, NULL, 0, MSG_DONTWAIT) == 0 && n < 100000)
		n++;
	CU_ASSERT(n > 0 && n < 100000);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_io_send(sv[0], 7, buf, 32, NULL, 0, skv_io_deadline(DL_MS)),
			-ETIMEDOUT);
	check_elapsed("send, peer's queue full", t0, DL_MS);
	/* room again: the send goes through, and the frames arrive whole */
	CU_ASSERT_EQUAL(
	    skv_io_recv(sv[1], buf, sizeof(buf), &h, NULL, NULL, skv_io_deadline(DL_MS)), 32);
	CU_ASSERT_EQUAL(h.type, 7);
	CU_ASSERT_EQUAL(skv_io_send(sv[0], 7, buf, 32, NULL, 0, skv_io_deadline(DL_MS)), 0);
	close(sv[0]);
	close(sv[1]);
}

static void test_no_accept(void)
{
	struct fake f;
	struct skv_client *c = NULL;
	struct skv_client_opts o = opts_ms((int32_t)DL_MS);
	int fds0;
	double t0;

	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_NOACCEPT), 0);
	fds0 = count_fds(); /* the filler connection included */
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_connect(f.sock, &o, &c), -ETIMEDOUT);
	check_elapsed("connect, backlog full", t0, DL_MS);
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(count_fds(), fds0);
	fake_stop(&f);
}

static void test_silent(void)
{
	struct fake f;
	struct skv_client *c = NULL;
	struct skv_client_opts o = opts_ms((int32_t)DL_MS);
	int fds0 = count_fds();
	double t0;

	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_SILENT), 0);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_connect(f.sock, &o, &c), -ETIMEDOUT);
	check_elapsed("handshake, silent daemon (opts)", t0, DL_MS);
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(count_fds(), fds0);

	/* the same deadline from the environment (opts NULL or 0) */
	setenv("SNAPKV_TIMEOUT_MS", "150", 1);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_connect(f.sock, NULL, &c), -ETIMEDOUT);
	check_elapsed("handshake, silent daemon ($SNAPKV_TIMEOUT_MS)", t0, 150);
	/* a malformed value is refused, not taken as "wait forever" */
	setenv("SNAPKV_TIMEOUT_MS", "soon", 1);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_connect(f.sock, NULL, &c), -EINVAL);
	CU_ASSERT(now_ms() - t0 < HANG_MS); /* the errno says it did not wait */
	/* opts win over the environment */
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_connect(f.sock, &o, &c), -ETIMEDOUT);
	check_elapsed("handshake, opts over a bad environment", t0, DL_MS);
	unsetenv("SNAPKV_TIMEOUT_MS");
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(count_fds(), fds0);
	fake_stop(&f);
}

static void test_stray(void)
{
	struct fake f;
	struct skv_client *c = NULL;
	struct skv_client_opts o = opts_ms((int32_t)DL_MS);
	int fds0 = count_fds();
	double t0;

	/* frames keep coming (every STRAY_MS), none of them the reply: the
	 * deadline covers the whole reply, not each frame */
	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_STRAY), 0);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_connect(f.sock, &o, &c), -ETIMEDOUT);
	check_elapsed("handshake, stray frames only", t0, DL_MS);
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(count_fds(), fds0);
	fake_stop(&f);
}

static void test_half_frame(void)
{
	struct fake f;
	struct skv_client *c = NULL;
	struct skv_client_opts o = opts_ms(60000);
	int fds0 = count_fds();
	double t0, ms;

	/* a frame cut short is one bad datagram: refused at once, no waiting
	 * for the rest of it (there is no rest on a SEQPACKET socket) */
	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_HALF), 0);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_connect(f.sock, &o, &c), -EBADMSG);
	ms = now_ms() - t0;
	printf("\n    half a frame: -EBADMSG after %.1f ms (deadline 60000 ms) ", ms);
	CU_ASSERT(ms < HANG_MS);
	CU_ASSERT_PTR_NULL(c);
	CU_ASSERT_EQUAL(count_fds(), fds0);
	fake_stop(&f);
}

static void test_hung_session(void)
{
	struct fake f;
	struct skv_client *c = NULL;
	struct skv_client_opts o = opts_ms(0); /* default (30 s), then set */
	struct skv_buffer *b = NULL;
	struct skv_stats st;
	struct skv_pressure pr;
	int fds0 = count_fds(), afd = -1;
	uint64_t asz = 0;
	double t0;

	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_WELCOME), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_connect(f.sock, &o, &c), 0);
	CU_ASSERT_EQUAL(skv_client_session_id(c), 42);
	CU_ASSERT_EQUAL(skv_client_timeout(c), 30000);
	CU_ASSERT_EQUAL(skv_client_set_timeout(c, 2147483648u), -EINVAL);
	CU_ASSERT_EQUAL(skv_client_timeout(c), 30000);
	CU_ASSERT_EQUAL(skv_client_set_timeout(c, DL_MS), 0);
	CU_ASSERT_EQUAL(skv_client_timeout(c), DL_MS);
	CU_ASSERT_EQUAL(skv_client_set_timeout(NULL, DL_MS), -EINVAL);

	/* ring calls: bounded, and the connection stays usable */
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_stats(c, &st), -ETIMEDOUT);
	check_elapsed("stats over the ring", t0, DL_MS);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "within"));
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_nop(c), -ETIMEDOUT);
	check_elapsed("nop over the ring", t0, DL_MS);
	CU_ASSERT_EQUAL(skv_client_pressure(c, &pr), 0);

	/* a socket call (REGISTER, an fd passed along): bounded; the reply
	 * could still come, so the connection is dropped */
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_buffer_alloc(c, 4096, &b), -ETIMEDOUT);
	check_elapsed("register over the socket (fd passed)", t0, DL_MS);
	CU_ASSERT_PTR_NULL(b);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "within"));

	/* everything after it fails at once with -ENOTCONN */
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_nop_socket(c), -ENOTCONN);
	CU_ASSERT_EQUAL(skv_client_stats(c, &st), -ENOTCONN);
	CU_ASSERT_EQUAL(skv_client_nop(c), -ENOTCONN);
	CU_ASSERT_EQUAL(skv_buffer_alloc(c, 4096, &b), -ENOTCONN);
	CU_ASSERT_EQUAL(skv_client_cuda_arena(c, &afd, &asz, NULL), -ENOTCONN);
	CU_ASSERT_EQUAL(skv_client_pressure(c, &pr), -ENOTCONN);
	CU_ASSERT(now_ms() - t0 < HANG_MS); /* the errno says it did not wait */
	CU_ASSERT_EQUAL(afd, -1);

	/* reconnect: a new session, the same deadline */
	CU_ASSERT_EQUAL(skv_client_reconnect(c), 0);
	CU_ASSERT_EQUAL(skv_client_timeout(c), DL_MS);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_client_nop_socket(c), -ETIMEDOUT);
	check_elapsed("nop over the socket after reconnect", t0, DL_MS);
	CU_ASSERT_EQUAL(skv_client_nop_socket(c), -ENOTCONN);
	skv_client_close(c);
	CU_ASSERT_EQUAL(count_fds(), fds0);
	fake_stop(&f);
}

/* One strided layer of a tiny shape in no buffer: the fake never looks. */
static struct skv_request *submit_one(struct skv_client *c)
{
	static struct skv_layer_ref lr;
	struct skv_compact_desc d = {.desc_size = sizeof(d)};
	struct skv_request *rq = NULL;

	d.shape =
	    (struct skv_shape){.h_q = 1, .h_kv = 1, .head_dim = 8, .prompt_len = 64, .n_q = 8};
	d.layers = 1;
	skv_client_params_init(&d.params);
	d.params.window = 8;
	d.params.capacity = 16;
	lr.k = lr.v = lr.q = (struct skv_tensor_ref){.dtype = SKV_DTYPE_F32, .token_stride = 8};
	d.layer = &lr;
	CU_ASSERT_EQUAL(skv_compact_submit(c, &d, &rq), 0);
	return rq;
}

static void test_stale_request(void)
{
	struct fake f;
	struct skv_client *c = NULL;
	struct skv_client_opts o = opts_ms((int32_t)DL_MS);
	struct skv_request *rq;
	struct skv_cache *k = NULL;
	int fds0 = count_fds();
	double t0;

	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_WELCOME), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_connect(f.sock, &o, &c), 0);
	/* a compaction the hung daemon never finishes: the wait times out and
	 * the request stays the caller's */
	rq = submit_one(c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(rq);
	CU_ASSERT_EQUAL(skv_request_wait(rq, 50, &k), -ETIMEDOUT);
	CU_ASSERT_EQUAL(skv_request_poll(rq), 0);
	/* given up on: freed at once (LeakSanitizer in check-sanitize sees it) */
	skv_request_abandon(submit_one(c));
	skv_request_abandon(NULL);
	/* a new session: the old request can never complete, and its slot
	 * index now belongs to the new ring (here: to a new request) */
	CU_ASSERT_EQUAL(skv_client_reconnect(c), 0);
	struct skv_request *fresh = submit_one(c);
	CU_ASSERT_EQUAL(skv_request_poll(rq), -ENOTCONN);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_request_wait(rq, 5000, &k), -ENOTCONN); /* and freed */
	CU_ASSERT(now_ms() - t0 < HANG_MS); /* not -ETIMEDOUT: it did not wait */
	CU_ASSERT_PTR_NULL(k);
	CU_ASSERT_EQUAL(skv_request_poll(fresh), 0); /* still its own */
	/* the daemon gone and reconnecting failed: no ring at all any more */
	fake_stop(&f);
	CU_ASSERT(skv_client_reconnect(c) < 0);
	CU_ASSERT(skv_request_poll(fresh) < 0);
	CU_ASSERT(skv_request_wait(fresh, 5000, &k) < 0);
	CU_ASSERT_PTR_NULL(k);
	skv_client_close(c);
	CU_ASSERT_EQUAL(count_fds(), fds0);
}

/* The fake's ring has 8 slots and the fake never takes a request. */
#define FAKE_SLOTS 8

struct waiter {
	struct skv_request *rq;
	int r;
};

static void *wait_thread(void *arg)
{
	struct waiter *w = arg;
	struct skv_cache *k = NULL;

	w->r = skv_request_wait(w->rq, 2000, &k);
	return NULL;
}

static void test_own_slots(void)
{
	struct fake f;
	struct skv_client *c = NULL;
	struct skv_client_opts o = opts_ms(3000);
	struct skv_request *rq[FAKE_SLOTS], *extra = NULL;
	struct skv_compact_desc d = {.desc_size = sizeof(d)};
	struct skv_layer_ref lr;
	struct waiter w;
	pthread_t t;
	double t0;

	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_WELCOME), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_connect(f.sock, &o, &c), 0);
	for (int i = 0; i < FAKE_SLOTS; i++) {
		rq[i] = submit_one(c);
		CU_ASSERT_PTR_NOT_NULL_FATAL(rq[i]);
	}
	/* every slot is this thread's and none was waited for: only this
	 * thread could make room, so the next submit fails at once */
	d.shape =
	    (struct skv_shape){.h_q = 1, .h_kv = 1, .head_dim = 8, .prompt_len = 64, .n_q = 8};
	d.layers = 1;
	skv_client_params_init(&d.params);
	d.params.window = 8;
	d.params.capacity = 16;
	lr.k = lr.v = lr.q = (struct skv_tensor_ref){.dtype = SKV_DTYPE_F32, .token_stride = 8};
	d.layer = &lr;
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_compact_submit(c, &d, &extra), -EDEADLK);
	CU_ASSERT(now_ms() - t0 < 1000);
	printf("\n  submit with %d own unreaped requests: %.1f ms (%s)\n", FAKE_SLOTS,
	       now_ms() - t0, skv_client_error(c));
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "ring slots"));
	CU_ASSERT_PTR_NULL(extra);
	CU_ASSERT_EQUAL(skv_client_nop(c), -EDEADLK);

	/* another thread waiting on one of them may free a slot: the submit
	 * waits while it does (here it times out, and then nothing can) */
	w.rq = rq[0];
	CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, wait_thread, &w), 0);
	sleep_ms(300);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_compact_submit(c, &d, &extra), -EDEADLK);
	CU_ASSERT(now_ms() - t0 > 1000);
	pthread_join(t, NULL);
	CU_ASSERT_EQUAL(w.r, -ETIMEDOUT);

	/* one given up on: its completion would free its slot, so the submit
	 * waits for it, up to the deadline */
	skv_request_abandon(rq[FAKE_SLOTS - 1]);
	CU_ASSERT_EQUAL(skv_client_set_timeout(c, DL_MS), 0);
	t0 = now_ms();
	CU_ASSERT_EQUAL(skv_compact_submit(c, &d, &extra), -ETIMEDOUT);
	check_elapsed("submit with an abandoned request in the ring", t0, DL_MS);
	for (int i = 0; i < FAKE_SLOTS - 1; i++)
		skv_request_abandon(rq[i]);
	skv_client_close(c);
	fake_stop(&f);
}

static void test_params_size(void)
{
	struct fake f;
	struct skv_client *c = NULL;
	struct skv_client_opts o = opts_ms((int32_t)DL_MS);
	struct skv_layer_ref lr = {.k = {.dtype = SKV_DTYPE_F32, .token_stride = 8},
				   .v = {.dtype = SKV_DTYPE_F32, .token_stride = 8}};
	struct skv_compact_desc d = {.desc_size = sizeof(d)};
	struct skv_request *rq = NULL;

	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_WELCOME), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_connect(f.sock, &o, &c), 0);
	d.shape =
	    (struct skv_shape){.h_q = 1, .h_kv = 1, .head_dim = 8, .prompt_len = 64, .n_q = 0};
	d.layers = 1;
	d.layer = &lr;
	skv_client_params_init(&d.params); /* params_size: before the modes */
	CU_ASSERT_EQUAL(d.params.params_size, SKV_PARAMS_SIZE_V1);
	d.params.budget_mode = SKV_BUDGET_MASS;
	d.params.tau = 0.9f;
	CU_ASSERT_EQUAL(skv_compact_submit(c, &d, &rq), -EINVAL);
	CU_ASSERT_PTR_NULL(rq);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "params_size"));
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(c), "skv_params_init"));
	d.params.budget_mode = SKV_BUDGET_UNIFORM;
	d.params.fallback_below = 0.5f;
	CU_ASSERT_EQUAL(skv_compact_submit(c, &d, &rq), -EINVAL);
	CU_ASSERT_PTR_NULL(rq);
	/* a later field that uniform never reads is no request for a mode */
	d.params.fallback_below = 0.0f;
	CU_ASSERT_EQUAL(skv_compact_submit(c, &d, &rq), 0);
	skv_request_abandon(rq);
	rq = NULL;
	/* the full size carries the mode */
	d.params.params_size = sizeof(d.params);
	d.params.budget_mode = SKV_BUDGET_MASS;
	CU_ASSERT_EQUAL(skv_compact_submit(c, &d, &rq), 0);
	skv_request_abandon(rq);
	skv_client_close(c);
	fake_stop(&f);
}

static void test_snapkvctl(void)
{
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	struct fake f;
	char cmd[512];
	double t0, ms;
	int st;

	CU_ASSERT_EQUAL_FATAL(fake_start(&f, FAKE_SILENT), 0);
	/* before the command */
	snprintf(cmd, sizeof(cmd), "%s/snapkvctl --timeout %u --socket %s status 2>/dev/null",
		 build, DL_MS, f.sock);
	t0 = now_ms();
	st = system(cmd);
	ms = now_ms() - t0;
	printf("\n    snapkvctl --timeout %u status: exit %d after %.1f ms ", DL_MS,
	       WIFEXITED(st) ? WEXITSTATUS(st) : -1, ms);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 1);
	CU_ASSERT(ms >= DL_MS - 1 && ms < HANG_MS);
	/* after the command, and through the admin path of `pressure` */
	snprintf(cmd, sizeof(cmd), "%s/snapkvctl pressure --socket %s --timeout=%u 2>/dev/null",
		 build, f.sock, DL_MS);
	t0 = now_ms();
	st = system(cmd);
	ms = now_ms() - t0;
	printf("\n    snapkvctl pressure --timeout=%u: exit %d after %.1f ms ", DL_MS,
	       WIFEXITED(st) ? WEXITSTATUS(st) : -1, ms);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 1);
	CU_ASSERT(ms >= DL_MS - 1 && ms < HANG_MS);
	/* the message says what happened */
	snprintf(cmd, sizeof(cmd),
		 "%s/snapkvctl ledger --socket %s --timeout %u 2>&1 | grep -q 'within %u ms'",
		 build, f.sock, DL_MS, DL_MS);
	st = system(cmd);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* bad values are usage errors, also from the environment */
	snprintf(cmd, sizeof(cmd), "%s/snapkvctl --timeout 5x status 2>/dev/null", build);
	st = system(cmd);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	snprintf(cmd, sizeof(cmd), "%s/snapkvctl status --timeout 2>/dev/null", build);
	st = system(cmd);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	snprintf(cmd, sizeof(cmd),
		 "SNAPKV_TIMEOUT_MS=-3 %s/snapkvctl status --socket %s 2>/dev/null", build, f.sock);
	st = system(cmd);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	fake_stop(&f);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	signal(SIGPIPE, SIG_IGN);
	unsetenv("SNAPKV_TIMEOUT_MS");
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("libsnapkv-deadline", NULL, NULL);
	CU_add_test(s, "skv-io.h: deadlines, env, recv and send on a socketpair", test_helpers);
	CU_add_test(s, "connect: a daemon that never accepts", test_no_accept);
	CU_add_test(s, "handshake: a daemon that never answers", test_silent);
	CU_add_test(s, "handshake: stray frames do not extend the deadline", test_stray);
	CU_add_test(s, "handshake: half a frame is an error, not a wait", test_half_frame);
	CU_add_test(s, "a session that hangs: ring and socket calls, then -ENOTCONN",
		    test_hung_session);
	CU_add_test(s, "a request of a session replaced by reconnect", test_stale_request);
	CU_add_test(s, "a submit only the caller's own waits could make room for", test_own_slots);
	CU_add_test(s, "params sized before the budget modes, given a mode", test_params_size);
	CU_add_test(s, "snapkvctl --timeout", test_snapkvctl);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
