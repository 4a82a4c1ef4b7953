/* SPDX-License-Identifier: MIT */
/*
 * daemon-harness.h - shared by the daemon's multi-process tests: start and
 * stop a private snapkvd on a temporary socket, ask it admin questions
 * directly over the framing, count its fds, fill test tensors.
 */
#ifndef DAEMON_HARNESS_H
#define DAEMON_HARNESS_H

#include <CUnit/Basic.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/skv-frame.h"
#include "proto/snapkv.pb-c.h"
#include "tests/test-skip.h"

struct harness {
	char dir[64];
	char sock[100];
	pid_t pid;
};

static inline void h_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static inline int h_connect_raw(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	if (strlen(path) >= sizeof(sa.sun_path)) {
		close(fd);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -errno;
	}
	return fd;
}

static inline pid_t h_daemon_pid(const char *sock);

/* Whether the suites run against snapkvd --backend cuda (SKV_CUDA_PLUGIN set by the caller). */
static inline bool h_backend_cuda(void)
{
	const char *b = getenv("SNAPKVD_TEST_BACKEND");

	return b && !strcmp(b, "cuda-emu");
}

/*
 * Every daemon a test process starts is listed here until it is reaped, and
 * an atexit handler kills and reaps whatever is left: a suite whose init
 * failed (CUnit then skips its cleanup), a _FATAL assert that jumped past a
 * test's own h_stop, an early return. PR_SET_PDEATHSIG in the child covers
 * the test process dying outright. Only the process that started a daemon
 * touches it (forked engine children inherit the list, not the duty).
 */
#define H_MAX_LIVE 16
static struct {
	pid_t pid;
	char dir[64];
} h_live[H_MAX_LIVE];
static pid_t h_owner;

static inline void h_live_drop(pid_t pid)
{
	for (int i = 0; i < H_MAX_LIVE; i++)
		if (h_live[i].pid == pid)
			h_live[i].pid = 0;
}

static void h_reap_all(void)
{
	char p[128];

	if (getpid() != h_owner)
		return;
	for (int i = 0; i < H_MAX_LIVE; i++) {
		if (h_live[i].pid <= 0)
			continue;
		fprintf(stderr, "daemon-harness: reaping snapkvd %d left running\n",
			(int)h_live[i].pid);
		kill(h_live[i].pid, SIGKILL);
		waitpid(h_live[i].pid, NULL, 0);
		h_live[i].pid = 0;
		snprintf(p, sizeof(p), "%s/s.sock", h_live[i].dir);
		unlink(p);
		rmdir(h_live[i].dir);
	}
}

static inline void h_live_add(pid_t pid, const char *dir)
{
	if (h_owner != getpid()) {
		h_owner = getpid();
		memset(h_live, 0, sizeof(h_live));
		atexit(h_reap_all);
	}
	for (int i = 0; i < H_MAX_LIVE; i++)
		if (h_live[i].pid <= 0) {
			h_live[i].pid = pid;
			snprintf(h_live[i].dir, sizeof(h_live[i].dir), "%s", dir);
			return;
		}
}

/* Start snapkvd with extra args (NULL-terminated); wait until it accepts. */
static inline int h_start(struct harness *h, const char *const *extra)
{
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	char bin[512];
	const char *argv[32];
	int n = 0;

	if (!h->dir[0]) {
		snprintf(h->dir, sizeof(h->dir), "/tmp/snapkvd-test-XXXXXX");
		if (!mkdtemp(h->dir))
			return -errno;
	}
	snprintf(h->sock, sizeof(h->sock), "%s/s.sock", h->dir);
	snprintf(bin, sizeof(bin), "%s/snapkvd", build);
	argv[n++] = bin;
	argv[n++] = "--socket";
	argv[n++] = h->sock;
	argv[n++] = "--threads";
	argv[n++] = "2";
	argv[n++] = "--log-level";
	argv[n++] = getenv("SNAPKVD_TEST_LOG") ? getenv("SNAPKVD_TEST_LOG") : "warning";
	/* the suites run again with a worker pool (test-daemon-workers.sh) */
	if (getenv("SNAPKVD_TEST_WORKERS")) {
		argv[n++] = "--workers";
		argv[n++] = getenv("SNAPKVD_TEST_WORKERS");
	}
	/*
	 * SNAPKVD_TEST_BACKEND=cuda-emu: the same suites against --backend cuda
	 * on the emulated plugin (tests/gpu/emu/test-daemon-suites-cuda-emu.sh)
	 */
	if (h_backend_cuda()) {
		argv[n++] = "--backend";
		argv[n++] = "cuda";
	}
	for (int i = 0; extra && extra[i] && n < 30; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;
	pid_t parent = getpid();
	h->pid = fork();
	if (h->pid == 0) {
		/* a test that crashes must not leave its daemon behind; if it
		 * died before prctl took effect, do not start at all */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	if (h->pid < 0) {
		h->pid = 0;
		return -errno;
	}
	h_live_add(h->pid, h->dir);
	/* 10 s: an ASan build on a loaded 2-core machine starts slowly */
	for (int i = 0; i < 1000; i++) {
		/* ours answering, not a killed predecessor's lingering socket */
		if (h_daemon_pid(h->sock) == h->pid)
			return 0;
		if (waitpid(h->pid, NULL, WNOHANG) == h->pid) {
			h_live_drop(h->pid);
			h->pid = 0;
			return -ECHILD;
		}
		h_sleep_ms(10);
	}
	/* not answering: kill and reap it here, the caller may not clean up */
	kill(h->pid, SIGKILL);
	waitpid(h->pid, NULL, 0);
	h_live_drop(h->pid);
	h->pid = 0;
	return -ETIMEDOUT;
}

/* Start snapkvd with `config` written to snapkvd.conf in a fresh directory
 * named after `prefix` (/tmp/PREFIX-XXXXXX). 0 or -errno. */
static inline int h_start_config(struct harness *h, const char *prefix, const char *config)
{
	const char *extra[] = {"--config", NULL, NULL};
	char cfg[sizeof(h->dir) + 16];
	FILE *f;

	snprintf(h->dir, sizeof(h->dir), "/tmp/%s-XXXXXX", prefix);
	if (!mkdtemp(h->dir))
		return -errno;
	snprintf(cfg, sizeof(cfg), "%s/snapkvd.conf", h->dir);
	f = fopen(cfg, "w");
	if (!f)
		return -errno;
	fputs(config, f);
	fclose(f);
	extra[1] = cfg;
	return h_start(h, extra);
}

/*
 * Whether the daemon still runs: waitpid(WNOHANG), which a daemon that has
 * crashed answers with its status, where kill(pid, 0) succeeds on the
 * unreaped zombie. One that has exited is reaped, reported on stderr and
 * forgotten (h->pid 0), so that h_stop then fails.
 */
static inline bool h_alive(struct harness *h)
{
	int st = 0;
	pid_t r;

	if (h->pid <= 0)
		return false;
	r = waitpid(h->pid, &st, WNOHANG);
	if (r == 0)
		return true;
	if (r == h->pid) {
		if (WIFEXITED(st))
			fprintf(stderr, "daemon-harness: snapkvd %d exited with status %d\n",
				(int)h->pid, WEXITSTATUS(st));
		else
			fprintf(stderr, "daemon-harness: snapkvd %d killed by signal %d\n",
				(int)h->pid, WTERMSIG(st));
		h_live_drop(h->pid);
		h->pid = 0;
	}
	return false;
}

/* SIGTERM and wait: returns the exit status (0 expected) or -1. */
static inline int h_stop(struct harness *h)
{
	int st = 0;

	if (h->pid <= 0)
		return -1;
	kill(h->pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(h->pid, &st, WNOHANG) == h->pid) {
			h_live_drop(h->pid);
			h->pid = 0;
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		}
		h_sleep_ms(10);
	}
	kill(h->pid, SIGKILL);
	waitpid(h->pid, &st, 0);
	h_live_drop(h->pid);
	h->pid = 0;
	return -1;
}

/* A test that reaped its daemon itself (waitpid after its own signal). */
static inline void h_reaped(struct harness *h)
{
	h_live_drop(h->pid);
	h->pid = 0;
}

static inline void h_kill(struct harness *h)
{
	if (h->pid > 0) {
		kill(h->pid, SIGKILL);
		waitpid(h->pid, NULL, 0);
		h_live_drop(h->pid);
		h->pid = 0;
	}
}

static inline void h_cleanup(struct harness *h)
{
	char p[128];

	h_kill(h);
	snprintf(p, sizeof(p), "%s/s.sock", h->dir);
	unlink(p);
	rmdir(h->dir);
}

static inline int h_count_fds(pid_t pid)
{
	char p[64];
	DIR *d;
	struct dirent *e;
	int n = 0;

	snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
	d = opendir(p);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* Print each of the daemon's fds and what it points at, to show what leaked. */
static inline void h_print_fds(pid_t pid)
{
	char p[64], q[320], link[256];
	DIR *d;
	struct dirent *e;

	snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
	d = opendir(p);
	if (!d)
		return;
	while ((e = readdir(d))) {
		ssize_t k;

		if (e->d_name[0] == '.')
			continue;
		snprintf(q, sizeof(q), "%s/%s", p, e->d_name);
		k = readlink(q, link, sizeof(link) - 1);
		link[k > 0 ? k : 0] = 0;
		printf("      fd %s -> %s\n", e->d_name, link);
	}
	closedir(d);
}

/*
 * The daemon's fds as h_count_fds, less the compaction workers' upload
 * buffers on the emulated CUDA plugin: each worker keeps one device buffer
 * for block tables (grown, never shrunk, freed with the worker), and the
 * emulator backs a cudaMalloc of 64 KiB and more with a memfd named
 * "emu-malloc". At most one per worker is discounted, so a leaked import
 * (those show the same name) still counts beyond that; h_cuda_imports()
 * watches imports by number.
 */
static inline int h_count_fds_cuda(pid_t pid)
{
	const char *w = getenv("SNAPKVD_TEST_WORKERS");
	int allow = w ? atoi(w) : 1, n = 0;
	char p[64], q[320], link[256];
	DIR *d;
	struct dirent *e;

	snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
	d = opendir(p);
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		ssize_t k;

		if (e->d_name[0] == '.')
			continue;
		n++;
		snprintf(q, sizeof(q), "%s/%s", p, e->d_name);
		k = readlink(q, link, sizeof(link) - 1);
		if (k > 0 && allow > 0) {
			link[k] = 0;
			if (!strncmp(link, "/memfd:emu-malloc", 17)) {
				n--;
				allow--;
			}
		}
	}
	closedir(d);
	return n;
}

/* The daemon's fds at rest: the fewest over 300 ms (an admin connection
 * that just closed may be counted for a moment). */
static inline int h_fds_base(pid_t pid)
{
	int n = h_count_fds(pid);

	for (int i = 0; i < 30; i++) {
		int m = h_count_fds(pid);

		n = m < n ? m : n;
		h_sleep_ms(10);
	}
	return n;
}

/* The daemon's fds once they settle at want, within 5 s (an admin
 * connection just closed may still be counted for a moment). */
static inline int h_fds_settled(pid_t pid, int want)
{
	int n = h_count_fds(pid);

	for (int i = 0; i < 500 && n != want; i++) {
		h_sleep_ms(10);
		n = h_count_fds(pid);
	}
	return n;
}

/* snapkvctl SUBCOMMAND against the daemon at sock: it exits 0 and its
 * stdout contains every needle (NULL-terminated); says what is missing. */
static inline bool h_ctl_shows(const char *sock, const char *sub, const char *const *needles)
{
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	char cmd[512], *out = calloc(1, 65536);
	size_t n = 0;
	bool ok = out != NULL;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "%s/snapkvctl --socket %s %s", build, sock, sub);
	f = ok ? popen(cmd, "r") : NULL;
	if (f) {
		n = fread(out, 1, 65535, f);
		ok = pclose(f) == 0;
	}
	if (out)
		out[n] = 0;
	for (int i = 0; ok && needles[i]; i++)
		if (!strstr(out, needles[i])) {
			fprintf(stderr, "snapkvctl %s: no \"%s\" in:\n%s\n", sub, needles[i], out);
			ok = false;
		}
	free(out);
	return f && ok;
}

/* One admin request on a fresh connection as client `name`; caller frees the reply. */
static inline Snapkv__V1__AdminReply *h_admin_once(const char *sock, const char *name,
						   const Snapkv__V1__AdminRequest *ar)
{
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	static uint8_t buf[SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD];
	struct skv_frame_hdr hdr;
	Snapkv__V1__AdminReply *rep = NULL;
	int fd = h_connect_raw(sock), r;
	size_t n;

	if (fd < 0)
		return NULL;
	hello.client_version = SKV_PROTO_VERSION;
	hello.admin = 1;
	hello.name = (char *)name;
	n = snapkv__v1__hello__pack(&hello, buf);
	if (skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf, n, NULL, 0, 0) < 0)
		goto out;
	r = skv_frame_recv(fd, buf, sizeof(buf), &hdr, NULL, NULL, 0);
	if (r < 0 || hdr.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME)
		goto out;
	n = snapkv__v1__admin_request__pack(ar, buf);
	if (skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, buf, n, NULL, 0, 0) < 0)
		goto out;
	r = skv_frame_recv(fd, buf, sizeof(buf), &hdr, NULL, NULL, 0);
	if (r >= 0 && hdr.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY)
		rep = snapkv__v1__admin_reply__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE);
out:
	close(fd);
	return rep;
}

/* h_admin_once, asked again after the wait the daemon gives when one of its
 * admin rate limits refuses it (as snapkvctl does): tests that poll the
 * status in a loop are not the rate limits' tests. */
static inline Snapkv__V1__AdminReply *h_admin_req(const char *sock, const char *name,
						  const Snapkv__V1__AdminRequest *ar)
{
	for (int tries = 0;; tries++) {
		Snapkv__V1__AdminReply *rep = h_admin_once(sock, name, ar);

		if (!rep || rep->status != -EAGAIN || !rep->retry_after_ms || tries == 1000)
			return rep;
		usleep(rep->retry_after_ms * 1000u);
		snapkv__v1__admin_reply__free_unpacked(rep, NULL);
	}
}

/* One admin question; caller frees the reply. */
static inline Snapkv__V1__AdminReply *h_admin(const char *sock, Snapkv__V1__AdminKind kind)
{
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;

	ar.kind = kind;
	return h_admin_req(sock, "test-admin", &ar);
}

/* One field of an admin STATUS reply as a long long, or -1 when the daemon does not answer. */
#define H_STATUS_FIELD(sock, field)                                                                \
	({                                                                                         \
		Snapkv__V1__AdminReply *r_ =                                                       \
		    h_admin((sock), SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS);                    \
		long long v_ = -1;                                                                 \
                                                                                                   \
		if (r_) {                                                                          \
			v_ = (long long)r_->field;                                                 \
			snapkv__v1__admin_reply__free_unpacked(r_, NULL);                          \
		}                                                                                  \
		v_;                                                                                \
	})

/* Pool bytes in use, or -1. */
static inline long long h_pool_used(const char *sock)
{
	return H_STATUS_FIELD(sock, pool_used);
}

static inline pid_t h_daemon_pid(const char *sock)
{
	return (pid_t)H_STATUS_FIELD(sock, pid);
}

/* CUDA imports live (admin STATUS), or -1. */
static inline int h_cuda_imports(const char *sock)
{
	return (int)H_STATUS_FIELD(sock, cuda_imports);
}

static inline int h_sessions(const char *sock)
{
	return (int)H_STATUS_FIELD(sock, sessions);
}

/* Wait up to ms for pool used == want. */
static inline int h_wait_pool(const char *sock, long long want, int ms)
{
	for (int i = 0; i <= ms / 10; i++) {
		if (h_pool_used(sock) == want)
			return 0;
		h_sleep_ms(10);
	}
	return -1;
}

/*
 * Run the registered suites with the verbose summary scripts/run-tests.sh
 * reads, then free the registry: main's exit status, 1 when a test or a
 * suite's init or cleanup failed.
 */
static inline int h_run_tests(void)
{
	return t_run();
}

/*
 * A one-layer f32 COMPACT request as raw protobuf, for tests that speak the
 * wire protocol themselves: `heads` heads (H_q = H_kv), Q rows at offset 0
 * ([heads, n_q, d]), K = V at k_offset ([heads, L, d]), both HND, in buffer
 * buffer_id. The struct points into itself: build it where it is used.
 */
struct h_compact {
	Snapkv__V1__Request req;
	Snapkv__V1__CompactRequest cr;
	Snapkv__V1__TensorRef q, k;
	Snapkv__V1__LayerRef l0, *lp;
	Snapkv__V1__Params pm;
};

static inline void h_compact_init(struct h_compact *c, uint64_t buffer_id, uint32_t heads,
				  uint32_t L, uint32_t d, uint32_t n_q, uint64_t k_offset,
				  uint32_t window, uint32_t capacity)
{
	*c = (struct h_compact){
	    .req = SNAPKV__V1__REQUEST__INIT,
	    .cr = SNAPKV__V1__COMPACT_REQUEST__INIT,
	    .q = SNAPKV__V1__TENSOR_REF__INIT,
	    .k = SNAPKV__V1__TENSOR_REF__INIT,
	    .l0 = SNAPKV__V1__LAYER_REF__INIT,
	    .pm = SNAPKV__V1__PARAMS__INIT,
	};
	c->q.buffer_id = c->k.buffer_id = buffer_id;
	c->q.dtype = c->k.dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
	c->q.head_stride = (int64_t)n_q * d;
	c->q.token_stride = d;
	c->k.offset = k_offset;
	c->k.head_stride = (int64_t)L * d;
	c->k.token_stride = d;
	c->l0.q = &c->q;
	c->l0.k = c->l0.v = &c->k;
	c->lp = &c->l0;
	c->cr.layers = 1;
	c->cr.h_q = c->cr.h_kv = heads;
	c->cr.head_dim = d;
	c->cr.prompt_len = L;
	c->cr.n_q = n_q;
	c->cr.n_layer = 1;
	c->cr.layer = &c->lp;
	c->pm.window = window;
	c->pm.capacity = capacity;
	c->cr.params = &c->pm;
	c->req.op_case = SNAPKV__V1__REQUEST__OP_COMPACT;
	c->req.compact = &c->cr;
}

/* Deterministic pseudo-random floats in [-1, 1). */
static inline float h_rand(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*s >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

#endif
