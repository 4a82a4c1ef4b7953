/* SPDX-License-Identifier: MIT */
/*
 * gpu-ipc.c - two processes, as engine and daemon: the engine allocates K/V
 * as exportable VMM memory (cuMemCreate, POSIX fd) and the Q window with
 * cudaMalloc (legacy cudaIpcGetMemHandle), passes fd and handle over a unix
 * socket; the daemon imports both (once, refcounted, keyed by tenant and
 * generation), creates a tenant arena, exports it as an fd, and compacts
 * into it on its own stream, ordered after the engine's upload
 *   round 1: by a device memory flag the engine sets (cuStreamWaitValue32):
 *            the daemon queues the compaction BEFORE the engine uploads;
 *   round 2: by an interprocess CUDA event the engine records after an async
 *            upload of new data (polled from the host with
 *            skv_cuda_event_query(), as snapkvd does, then waited on).
 * The engine maps the arena and checks the compact cache against libskv's
 * host result on the same data: positions equal, K/V rows bit-equal (f32).
 */
#include <errno.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu-common.h"
#include "kernels/cuda/skv-cuda.h"

#define N_LAYERS 4
#define HQ	 8
#define HKV	 2
#define HD	 128
#define LEN	 4096
#define WIN	 32
#define CAP	 1024

enum { MSG_BUFFERS = 1, MSG_ARENA, MSG_ROUND2, MSG_DONE, MSG_BYE };

struct msg {
	uint32_t type;
	int32_t status;
	uint64_t size;
	unsigned char mem_handle[64];
	unsigned char event_handle[64];
	char text[256];
};

static int send_msg(int s, const struct msg *m, int fd)
{
	struct iovec iov = {.iov_base = (void *)m, .iov_len = sizeof(*m)};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(s, &mh, 0) == (ssize_t)sizeof(*m) ? 0 : -1;
}

static int recv_msg(int s, struct msg *m, int *ret_fd)
{
	struct iovec iov = {.iov_base = m, .iov_len = sizeof(*m)};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf)};
	if (recvmsg(s, &mh, MSG_CMSG_CLOEXEC) != (ssize_t)sizeof(*m))
		return -1;
	if (ret_fd) {
		*ret_fd = -1;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		if (c && c->cmsg_type == SCM_RIGHTS)
			memcpy(ret_fd, CMSG_DATA(c), sizeof(int));
	}
	return 0;
}

/* Shared layout of the engine's K/V buffer and of the daemon's arena. */
#define FLAG_BYTES 256
static const size_t KV_ELEMS = (size_t)N_LAYERS * HKV * LEN * HD; /* K or V, all layers */
static const size_t Q_ELEMS = (size_t)N_LAYERS * HQ * WIN * HD;

static void plan_of(struct skv_shape *sh, struct skv_params *p, struct skv_plan *pl)
{
	*sh = (struct skv_shape){
	    .prompt_len = LEN, .head_dim = HD, .h_q = HQ, .h_kv = HKV, .n_q = WIN};
	skv_params_init(p);
	p->window = WIN;
	p->capacity = CAP;
	struct skv_error e;
	skv_plan(sh, p, pl, &e);
}

struct out_layout {
	size_t k, v, pos, mass, bytes, per_layer; /* offsets in the arena */
};

static struct out_layout out_layout(const struct skv_plan *pl)
{
	struct out_layout o;
	o.per_layer = (size_t)pl->h_store * pl->kept * HD;
	o.k = 0;
	o.v = o.k + N_LAYERS * o.per_layer * 4;
	o.pos = o.v + N_LAYERS * o.per_layer * 4;
	o.mass = o.pos + (size_t)N_LAYERS * pl->h_store * pl->kept * 4;
	o.bytes = o.mass + (size_t)N_LAYERS * pl->h_store * 4;
	return o;
}

/* Views of all layers over base pointers (device or host). */
static void views(char *kv, char *q, char *arena, const struct skv_plan *pl,
		  struct skv_layer_in *in, struct skv_layer_out *out)
{
	struct out_layout o = out_layout(pl);
	for (int l = 0; l < N_LAYERS; l++) {
		size_t kl = (size_t)l * HKV * LEN * HD;
		in[l].q = (struct skv_tensor){.data = q + (size_t)l * HQ * WIN * HD * 4,
					      .dtype = SKV_DTYPE_F32,
					      .head_stride = WIN * HD,
					      .token_stride = HD};
		in[l].k = (struct skv_tensor){.data = kv + FLAG_BYTES + kl * 4,
					      .dtype = SKV_DTYPE_F32,
					      .head_stride = (int64_t)LEN * HD,
					      .token_stride = HD};
		in[l].v = in[l].k;
		in[l].v.data = kv + FLAG_BYTES + (KV_ELEMS + kl) * 4;
		out[l].k = (struct skv_tensor){.data = arena + o.k + l * o.per_layer * 4,
					       .dtype = SKV_DTYPE_F32,
					       .head_stride = (int64_t)pl->kept * HD,
					       .token_stride = HD};
		out[l].v = out[l].k;
		out[l].v.data = arena + o.v + l * o.per_layer * 4;
		out[l].positions = (int32_t *)(arena + o.pos) + (size_t)l * pl->h_store * pl->kept;
		out[l].pos_stride = pl->kept;
		out[l].retained_mass = (float *)(arena + o.mass) + (size_t)l * pl->h_store;
	}
}

/* ------------------------------------------------------------ daemon */

static int daemon_round(struct skv_cuda_ctx *ctx, char *kv, char *q, char *arena, struct msg *done)
{
	struct skv_shape sh;
	struct skv_params p;
	struct skv_plan pl;
	struct skv_layer_in in[N_LAYERS];
	struct skv_layer_out out[N_LAYERS];
	struct skv_error err = {0};

	plan_of(&sh, &p, &pl);
	views(kv, q, arena, &pl, in, out);
	int r = skv_cuda_compact(ctx, &sh, &p, N_LAYERS, in, out, &err);
	if (r == 0)
		r = skv_cuda_ctx_sync(ctx, &err);
	done->type = MSG_DONE;
	done->status = r;
	snprintf(done->text, sizeof(done->text), "%s", r ? err.msg : "ok");
	return r;
}

static int run_daemon(int s)
{
	struct skv_cuda_dev *dev = NULL;
	struct skv_cuda_ctx *ctx = NULL;
	struct skv_cuda_import *kvi = NULL, *qi = NULL, *again = NULL;
	struct skv_cuda_arena *arena = NULL;
	struct skv_error err = {0};
	struct msg m, done;
	int fd = -1, afd = -1, r;

	if (skv_cuda_dev_open(-1, &dev, &err) < 0 || skv_cuda_ctx_new(dev, &ctx, &err) < 0) {
		fprintf(stderr, "daemon: %s\n", err.msg);
		return 1;
	}
	if (recv_msg(s, &m, &fd) < 0 || m.type != MSG_BUFFERS || fd < 0) {
		fprintf(stderr, "daemon: no buffers message\n");
		return 1;
	}
	/* tenant 7: generation 1 is the K/V buffer, generation 2 the Q window */
	r = skv_cuda_import_fd(dev, 7, 1, fd, m.size, &kvi, &err);
	close(fd);
	if (r == 0)
		r = skv_cuda_import_ipc(dev, 7, 2, m.mem_handle, &qi, &err);
	if (r == 0)
		r = skv_cuda_import_fd(dev, 7, 1, -1, 0, &again, &err); /* by key: no fd needed */
	if (r < 0) {
		fprintf(stderr, "daemon: import: %s\n", err.msg);
		return 1;
	}
	printf("daemon: imported K/V via %s (%llu bytes), Q via %s (%llu bytes); "
	       "second import of the same key %s\n",
	       skv_cuda_import_transport(kvi), (unsigned long long)skv_cuda_import_size(kvi),
	       skv_cuda_import_transport(qi), (unsigned long long)skv_cuda_import_size(qi),
	       again == kvi ? "shares the mapping" : "MAPPED AGAIN (bug)");
	int fails = again != kvi;
	skv_cuda_import_release(again);

	struct skv_shape sh;
	struct skv_params p;
	struct skv_plan pl;
	plan_of(&sh, &p, &pl);
	struct out_layout o = out_layout(&pl);
	if (skv_cuda_arena_new(dev, o.bytes, &arena, &err) < 0 ||
	    skv_cuda_arena_export_fd(arena, &afd, &err) < 0) {
		fprintf(stderr, "daemon: arena: %s\n", err.msg);
		return 1;
	}
	memset(&m, 0, sizeof(m));
	m.type = MSG_ARENA;
	m.size = skv_cuda_arena_size(arena);
	if (send_msg(s, &m, afd) < 0)
		return 1;
	close(afd);

	char *kv = skv_cuda_import_ptr(kvi), *q = skv_cuda_import_ptr(qi);
	char *ap = skv_cuda_arena_ptr(arena);
	/* round 1: queued before the engine has uploaded anything */
	if (skv_cuda_ctx_wait_value(ctx, kv, 1, &err) < 0) {
		fprintf(stderr, "daemon: wait value: %s\n", err.msg);
		return 1;
	}
	memset(&done, 0, sizeof(done));
	fails += daemon_round(ctx, kv, q, ap, &done) != 0;
	send_msg(s, &done, -1);

	/* round 2: ordered by the engine's interprocess event, polled from the
	 * host first as snapkvd does (bounded: 10 s here), then also waited on
	 * by the stream (complete by then: the wait passes at once) */
	if (recv_msg(s, &m, NULL) < 0 || m.type != MSG_ROUND2)
		return 1;
	struct skv_cuda_event *ev = NULL;
	unsigned long polls = 0;
	if (skv_cuda_event_open(dev, m.event_handle, &ev, &err) < 0) {
		fprintf(stderr, "daemon: open event: %s\n", err.msg);
		return 1;
	}
	double t0 = now_s();
	while ((r = skv_cuda_event_query(ev, &err)) == -EAGAIN && now_s() - t0 < 10) {
		polls++;
		usleep(50);
	}
	skv_cuda_event_close(ev);
	if (r < 0) {
		fprintf(stderr, "daemon: event query: %s\n",
			r == -EAGAIN ? "not complete in 10 s" : err.msg);
		return 1;
	}
	printf("daemon: round 2: the engine's event completed (%lu polls, %.2f ms)\n", polls,
	       (now_s() - t0) * 1e3);
	if (skv_cuda_ctx_wait_ipc_event(ctx, m.event_handle, &err) < 0) {
		fprintf(stderr, "daemon: wait event: %s\n", err.msg);
		return 1;
	}
	memset(&done, 0, sizeof(done));
	fails += daemon_round(ctx, kv, q, ap, &done) != 0;
	send_msg(s, &done, -1);

	if (recv_msg(s, &m, NULL) < 0 || m.type != MSG_BYE)
		fails++;
	unsigned n = skv_cuda_release_tenant(dev, 7);
	printf("daemon: session end released %u imports\n", n);
	fails += n != 2;
	skv_cuda_ctx_free(ctx);
	skv_cuda_arena_free(arena);
	skv_cuda_dev_close(dev);
	return fails ? 1 : 0;
}

/* ------------------------------------------------------------ engine */

/*
 * Host reference of the data in hkv/hq, compared with the arena read back.
 * hkv has the device buffer's layout: the flag header, then K and V.
 */
static int check_round(int round, const char *hkv, const char *hq, const char *garena)
{
	struct skv_shape sh;
	struct skv_params p;
	struct skv_plan pl;
	struct skv_layer_in in[N_LAYERS];
	struct skv_layer_out out[N_LAYERS];
	struct skv_error err = {0};
	struct skv_ctx *hctx;

	plan_of(&sh, &p, &pl);
	struct out_layout o = out_layout(&pl);
	char *harena = calloc(1, o.bytes);
	if (!harena || skv_ctx_new(0, &hctx) < 0)
		return 1;
	views((char *)hkv, (char *)hq, harena, &pl, in, out);
	int r = skv_compact(hctx, &sh, &p, N_LAYERS, in, out, &err);
	skv_ctx_free(hctx);
	if (r < 0) {
		fprintf(stderr, "engine: host compact: %s\n", err.msg);
		free(harena);
		return 1;
	}
	int bad_pos = memcmp(harena + o.pos, garena + o.pos, o.mass - o.pos) != 0;
	int bad_kv = memcmp(harena, garena, o.pos) != 0;
	double dm = 0;
	const float *hm = (const float *)(harena + o.mass), *gm = (const float *)(garena + o.mass);
	for (size_t i = 0; i < (size_t)N_LAYERS * pl.h_store; i++)
		if (fabs(hm[i] - gm[i]) > dm)
			dm = fabs(hm[i] - gm[i]);
	int ok = !bad_pos && !bad_kv && dm < 1e-4;
	printf("engine: round %d: positions %s, K/V rows %s, max |mass diff| %.2e: %s\n", round,
	       bad_pos ? "DIFFER" : "equal", bad_kv ? "DIFFER" : "bit-equal", dm,
	       ok ? "PASS" : "FAIL");
	free(harena);
	return !ok;
}

static int run_engine(int s)
{
	struct skv_cuda_dev *dev = NULL;
	struct skv_cuda_arena *kvbuf = NULL;
	struct skv_cuda_import *ai = NULL;
	struct skv_error err = {0};
	struct msg m;
	int fd = -1, afd = -1, fails = 0;
	char *dq = NULL;

	if (skv_cuda_dev_open(-1, &dev, &err) < 0) {
		fprintf(stderr, "engine: %s\n", err.msg);
		return 1;
	}
	struct skv_cuda_info info;
	skv_cuda_dev_info(dev, &info);
	printf("engine: device %s\n", info.name);
	/* K/V: exportable VMM memory, zeroed: the daemon must not see data before the flag */
	const size_t kv_bytes = FLAG_BYTES + 2 * KV_ELEMS * 4, q_bytes = Q_ELEMS * 4;
	if (skv_cuda_arena_new(dev, kv_bytes, &kvbuf, &err) < 0 ||
	    skv_cuda_arena_export_fd(kvbuf, &fd, &err) < 0) {
		fprintf(stderr, "engine: K/V buffer: %s\n", err.msg);
		return 1;
	}
	char *dkv = skv_cuda_arena_ptr(kvbuf);
	CK(cudaMemset(dkv, 0, skv_cuda_arena_size(kvbuf)));
	CK(cudaMalloc((void **)&dq, q_bytes));
	CK(cudaMemset(dq, 0, q_bytes));
	cudaIpcMemHandle_t mh;
	CK(cudaIpcGetMemHandle(&mh, dq));
	CK(cudaDeviceSynchronize());
	memset(&m, 0, sizeof(m));
	m.type = MSG_BUFFERS;
	m.size = skv_cuda_arena_size(kvbuf);
	memcpy(m.mem_handle, &mh, sizeof(mh));
	if (send_msg(s, &m, fd) < 0)
		return 1;
	close(fd);
	if (recv_msg(s, &m, &afd) < 0 || m.type != MSG_ARENA || afd < 0)
		return 1;
	if (skv_cuda_import_fd(dev, 0, 0, afd, m.size, &ai, &err) < 0) {
		fprintf(stderr, "engine: arena import: %s\n", err.msg);
		return 1;
	}
	close(afd);
	struct skv_shape sh;
	struct skv_params p;
	struct skv_plan pl;
	plan_of(&sh, &p, &pl);
	struct out_layout o = out_layout(&pl);
	char *garena = malloc(o.bytes);
	char *hkv = NULL, *hq = NULL;
	CK(cudaMallocHost((void **)&hkv, FLAG_BYTES + 2 * KV_ELEMS * 4));
	CK(cudaMallocHost((void **)&hq, q_bytes));

	cudaStream_t st = NULL;
	cudaEvent_t ev = NULL;
	for (int round = 1; round <= 2; round++) {
		struct rng r = {77 + round};
		for (size_t i = 0; i < 2 * KV_ELEMS; i++)
			((float *)(hkv + FLAG_BYTES))[i] = rng_normal(&r);
		for (size_t i = 0; i < Q_ELEMS; i++)
			((float *)hq)[i] = 1.6f * rng_normal(&r);
		if (round == 1) {
			/* the daemon's compaction is already queued behind the flag */
			struct timespec ts = {0, 300 * 1000 * 1000};
			nanosleep(&ts, NULL);
			CK(cudaMemcpy(dkv + FLAG_BYTES, hkv + FLAG_BYTES, 2 * KV_ELEMS * 4,
				      cudaMemcpyHostToDevice));
			CK(cudaMemcpy(dq, hq, q_bytes, cudaMemcpyHostToDevice));
			uint32_t one = 1;
			CK(cudaMemcpy(dkv, &one, 4, cudaMemcpyHostToDevice));
		} else {
			cudaIpcEventHandle_t eh;
			CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
			CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming |
							     cudaEventInterprocess));
			CK(cudaMemcpyAsync(dkv + FLAG_BYTES, hkv + FLAG_BYTES, 2 * KV_ELEMS * 4,
					   cudaMemcpyHostToDevice, st));
			CK(cudaMemcpyAsync(dq, hq, q_bytes, cudaMemcpyHostToDevice, st));
			CK(cudaEventRecord(ev, st));
			CK(cudaIpcGetEventHandle(&eh, ev));
			memset(&m, 0, sizeof(m));
			m.type = MSG_ROUND2;
			memcpy(m.event_handle, &eh, sizeof(eh));
			if (send_msg(s, &m, -1) < 0)
				return 1;
			CK(cudaStreamSynchronize(st));
		}
		if (recv_msg(s, &m, NULL) < 0 || m.type != MSG_DONE)
			return 1;
		if (m.status != 0) {
			printf("engine: round %d: daemon compaction failed: %d %s\n", round,
			       m.status, m.text);
			fails++;
			continue;
		}
		CK(cudaMemcpy(garena, skv_cuda_import_ptr(ai), o.bytes, cudaMemcpyDeviceToHost));
		fails += check_round(round, hkv, hq, garena);
	}
	/* the daemon is done with the event once it reported round 2 */
	if (ev)
		cudaEventDestroy(ev);
	if (st)
		cudaStreamDestroy(st);
	memset(&m, 0, sizeof(m));
	m.type = MSG_BYE;
	send_msg(s, &m, -1);
	skv_cuda_import_release(ai);
	cudaFreeHost(hkv);
	cudaFreeHost(hq);
	free(garena);
	cudaFree(dq);
	skv_cuda_dev_close(dev);
	return fails ? 1 : 0;
}

int main(void)
{
	int sv[2];

	/* fork before any CUDA call: a CUDA context does not survive fork() */
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		perror("socketpair");
		return 1;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		close(sv[0]);
		int rc = run_daemon(sv[1]);
		fflush(stdout);
		_exit(rc);
	}
	close(sv[1]);
	int rc = run_engine(sv[0]);
	close(sv[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	int drc = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
	printf("gpu-ipc: engine %s, daemon %s\n", rc ? "FAIL" : "ok", drc ? "FAIL" : "ok");
	return rc || drc;
}
