// SPDX-License-Identifier: MIT
/*
 * gpu-engine: an engine process whose K/V live in GPU memory, talking to a
 * running snapkvd through libsnapkv. K and V of every layer are one VMM
 * allocation (cuMemCreate, exported as a POSIX fd: registered as
 * cuda-vmm-fd); the query window is cudaMalloc memory at an offset inside
 * its allocation (legacy cudaIpcGetMemHandle: registered as cuda-ipc). The
 * daemon imports both on its device and compacts; the compact cache (in the
 * host arena) must equal libskv's host compaction of the same tensors:
 * positions and K/V rows bit-exact, masses within 1e-4. Then the engine
 * asks for the session's GPU arena (a VMM fd of the daemon's), imports it
 * once and compacts again with the K/V going there: the rows it reads back
 * from its mapping must be the same.
 *
 *   gpu-engine SOCKET            compact and check, exit 0 when all agree;
 *                                then the prefill waits (CUDA_FLAG in the
 *                                K/V buffer): set 100 ms after submitting,
 *                                never set (-ETIME, flag written by the
 *                                daemon, pool back to its baseline), bad
 *                                offset (-ERANGE), unknown buffer (-ENOENT);
 *                                and the CUDA_IPC_EVENT waits: recorded after
 *                                an async upload, completed well after
 *                                submitting, never completed (-ETIME), a
 *                                handle of zeros (-EINVAL)
 *   gpu-engine SOCKET --enotsup  both registrations, the GPU arena and a
 *                                prefill wait must fail with -ENOTSUP (host
 *                                backend)
 *   gpu-engine SOCKET --generations  (session, generation) keying and the
 *                                registration checks over raw frames; an
 *                                event handle not of 64 bytes (-EINVAL)
 *   gpu-engine SOCKET --event-hang DIR  an event wait never completed
 *                                while the daemon gets SIGTERM: -ETIME at
 *                                its bound (DIR/submitted tells the script)
 *   ... --hold DIR               after the check, unregister the IPC buffer,
 *                                create DIR/ready and wait for DIR/go (the
 *                                script looks at snapkvctl status meanwhile);
 *                                then exit without freeing the VMM buffer, so
 *                                the session end must release it.
 *
 * Built twice: against the real CUDA runtime and plugin (tests/gpu/run.sh)
 * and against the CPU emulation (tests/gpu/emu, `make check`).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "client/snapkv.h"
#include "proto/skv-frame.h"
#include "proto/snapkv.pb-c.h"
#include "gpu-common.h"
#include "kernels/cuda/skv-cuda.h"

enum { LAYERS = 2, HQ = 4, HKV = 2, HD = 32, LEN = 96, WIN = 8, CAP = 24, Q_OFF = 256 };

static int fails;
#define EXPECT(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
			fails++;                                                                   \
		}                                                                                  \
	} while (0)

static bool exists(const char *dir, const char *name)
{
	char p[512];
	struct stat st;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return stat(p, &st) == 0;
}

/*
 * Compare a compact cache with the host reference (HND, [layer][head][kept]).
 * gpu_base: K/V are in the GPU arena mapped there (copied back to compare).
 * Returns the number of differing positions/rows.
 */
static unsigned check_cache(const struct skv_cache *cache, const char *gpu_base,
			    const struct skv_plan *pl, const float *ok, const float *ov,
			    const float *om, const int32_t *op)
{
	const struct skv_cache_info *ci = skv_cache_info(cache);
	const size_t per = (size_t)pl->h_store * pl->kept * HD;
	float *tk = calloc((size_t)pl->kept * HD, 4), *tv = calloc((size_t)pl->kept * HD, 4);
	unsigned mism = 0;

	EXPECT(ci->kept == pl->kept && ci->h_store == pl->h_store, "kept %u/%u h_store %u/%u",
	       ci->kept, pl->kept, ci->h_store, pl->h_store);
	EXPECT(ci->token_stride == HD, "HND token stride %lld", (long long)ci->token_stride);
	for (int l = 0; l < LAYERS && !fails; l++)
		for (uint32_t h = 0; h < pl->h_store; h++) {
			const int32_t *gp = skv_cache_positions(cache, l, h);
			const float *gk = skv_cache_k(cache, l, h), *gv = skv_cache_v(cache, l, h);
			if (gpu_base) {
				if (cudaMemcpy(tk, gpu_base + skv_cache_k_offset(cache, l, h),
					       (size_t)pl->kept * HD * 4,
					       cudaMemcpyDeviceToHost) != cudaSuccess ||
				    cudaMemcpy(tv, gpu_base + skv_cache_v_offset(cache, l, h),
					       (size_t)pl->kept * HD * 4,
					       cudaMemcpyDeviceToHost) != cudaSuccess) {
					EXPECT(0, "copy from the GPU arena");
					return 1;
				}
				gk = tk, gv = tv;
			}
			for (uint32_t i = 0; i < pl->kept; i++) {
				size_t hi = (size_t)l * pl->h_store * pl->kept + h * pl->kept + i;
				mism += gp[i] != op[hi];
				mism += memcmp(gk + (size_t)i * HD,
					       ok + l * per + ((size_t)h * pl->kept + i) * HD,
					       HD * 4) != 0;
				mism += memcmp(gv + (size_t)i * HD,
					       ov + l * per + ((size_t)h * pl->kept + i) * HD,
					       HD * 4) != 0;
			}
			float gm = skv_cache_retained_mass(cache, l, h),
			      hm = om[l * pl->h_store + h];
			EXPECT(gm - hm < 1e-4f && hm - gm < 1e-4f, "layer %d head %u mass %g vs %g",
			       l, h, gm, hm);
		}
	EXPECT(mism == 0, "%u positions/rows differ from the host compaction", mism);
	free(tk);
	free(tv);
	return mism;
}

/* ----------------------------------------------- raw frames (--generations) */

static uint8_t rbuf[SKV_FRAME_HDR_SIZE + 65536];

/* One REGISTER over a raw session; the reply's status, id in *ret_id. */
static int raw_reg(int s, const Snapkv__V1__RegisterBuffer *m, int fd, uint64_t *ret_id)
{
	Snapkv__V1__RegisterReply *rr;
	struct skv_frame_hdr h;
	size_t n = snapkv__v1__register_buffer__pack(m, rbuf);
	int st;

	if (skv_frame_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, rbuf, n, &fd,
			   fd >= 0 ? 1 : 0, 0) < 0 ||
	    skv_frame_recv(s, rbuf, sizeof(rbuf), &h, NULL, NULL, 0) < 0 ||
	    h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY)
		return -EPROTO;
	rr = snapkv__v1__register_reply__unpack(NULL, h.length, rbuf + SKV_FRAME_HDR_SIZE);
	if (!rr)
		return -EBADMSG;
	st = rr->status;
	if (ret_id)
		*ret_id = rr->buffer_id;
	printf("engine: register kind %d generation %llu: %d %s%s\n", (int)m->kind,
	       (unsigned long long)m->generation, st, rr->error, st ? "" : rr->transport);
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	return st;
}

static int raw_unreg(int s, uint64_t id)
{
	Snapkv__V1__Unregister m = SNAPKV__V1__UNREGISTER__INIT;
	Snapkv__V1__UnregisterReply *rr;
	struct skv_frame_hdr h;
	size_t n;
	int st;

	m.buffer_id = id;
	n = snapkv__v1__unregister__pack(&m, rbuf);
	if (skv_frame_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER, rbuf, n, NULL, 0, 0) < 0 ||
	    skv_frame_recv(s, rbuf, sizeof(rbuf), &h, NULL, NULL, 0) < 0 ||
	    h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY)
		return -EPROTO;
	rr = snapkv__v1__unregister_reply__unpack(NULL, h.length, rbuf + SKV_FRAME_HDR_SIZE);
	if (!rr)
		return -EBADMSG;
	st = rr->status;
	snapkv__v1__unregister_reply__free_unpacked(rr, NULL);
	return st;
}

/*
 * A one-layer COMPACT over raw frames with a CUDA_IPC_EVENT wait whose
 * ipc_event has `len` bytes (libsnapkv always sends 64): the reply's status.
 */
static int raw_compact_event(int s, uint64_t buffer_id, size_t len)
{
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__CompactRequest cr = SNAPKV__V1__COMPACT_REQUEST__INIT;
	Snapkv__V1__TensorRef q = SNAPKV__V1__TENSOR_REF__INIT, k = SNAPKV__V1__TENSOR_REF__INIT;
	Snapkv__V1__LayerRef l0 = SNAPKV__V1__LAYER_REF__INIT, *lp = &l0;
	Snapkv__V1__Params pm = SNAPKV__V1__PARAMS__INIT;
	Snapkv__V1__PrefillWait pw = SNAPKV__V1__PREFILL_WAIT__INIT;
	Snapkv__V1__Response *resp;
	struct skv_frame_hdr h;
	uint8_t ev[80] = {0};
	size_t n;
	int st;

	q.buffer_id = k.buffer_id = buffer_id;
	q.dtype = k.dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
	q.head_stride = 4 * 8, q.token_stride = 8;
	k.offset = 1024, k.head_stride = 16 * 8, k.token_stride = 8;
	l0.q = &q, l0.k = l0.v = &k;
	cr.layers = cr.h_q = cr.h_kv = 1;
	cr.head_dim = 8, cr.prompt_len = 16, cr.n_q = 4;
	cr.n_layer = 1, cr.layer = &lp;
	pm.window = 4, pm.capacity = 8;
	cr.params = &pm;
	pw.kind = SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_IPC_EVENT;
	pw.ipc_event.data = ev;
	pw.ipc_event.len = len;
	pw.timeout_ms = 100;
	cr.prefill_wait = &pw;
	req.op_case = SNAPKV__V1__REQUEST__OP_COMPACT;
	req.compact = &cr;
	n = snapkv__v1__request__pack(&req, rbuf);
	if (skv_frame_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, rbuf, n, NULL, 0, 0) < 0 ||
	    skv_frame_recv(s, rbuf, sizeof(rbuf), &h, NULL, NULL, 0) < 0 ||
	    h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE)
		return -EPROTO;
	resp = snapkv__v1__response__unpack(NULL, h.length, rbuf + SKV_FRAME_HDR_SIZE);
	if (!resp)
		return -EBADMSG;
	st = resp->status;
	printf("engine: event handle of %zu bytes: %d %s\n", len, st, resp->error);
	EXPECT(st >= 0 || strstr(resp->error, "prefill_wait"), "error text: %s", resp->error);
	snapkv__v1__response__free_unpacked(resp, NULL);
	return st;
}

/*
 * The daemon's keying by (session, generation), and its checks, over raw
 * frames (libsnapkv never repeats a generation): the same VMM buffer under
 * the same generation is the same buffer, one more registration; another
 * size under it is -EEXIST; a VMM registration without its fd is -EBADF, an
 * IPC handle of the wrong length -EINVAL. Each registration needs its own
 * UNREGISTER; a third one is -ENOENT.
 */
static int run_generations(const char *sock, struct skv_cuda_dev *dev)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	Snapkv__V1__RegisterBuffer m = SNAPKV__V1__REGISTER_BUFFER__INIT;
	struct skv_cuda_arena *mem = NULL;
	struct skv_error err = {0};
	struct skv_frame_hdr h;
	int fds[4] = {-1, -1, -1, -1}, fd = -1, s;
	unsigned nf = 4;
	uint64_t id = 0, id2 = 0;
	uint8_t shorthandle[10] = {0};
	size_t n;

	if (skv_cuda_arena_new(dev, 1 << 16, &mem, &err) < 0 ||
	    skv_cuda_arena_export_fd(mem, &fd, &err) < 0) {
		fprintf(stderr, "engine: VMM allocation: %s\n", err.msg);
		return 1;
	}
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	hello.client_version = SKV_PROTO_VERSION;
	hello.name = "gpu-engine-raw";
	n = snapkv__v1__hello__pack(&hello, rbuf);
	if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    skv_frame_send(s, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, rbuf, n, NULL, 0, 0) < 0 ||
	    skv_frame_recv(s, rbuf, sizeof(rbuf), &h, fds, &nf, 0) < 0 ||
	    h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME) {
		fprintf(stderr, "engine: raw handshake with %s failed\n", sock);
		return 1;
	}
	for (unsigned i = 0; i < nf; i++)
		close(fds[i]);
	m.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
	m.generation = 5;
	m.size = skv_cuda_arena_size(mem);
	EXPECT(raw_reg(s, &m, fd, &id) == 0, "first registration of generation 5");
	EXPECT(raw_reg(s, &m, fd, &id2) == 0 && id2 == id,
	       "generation 5 again: buffer %llu, not %llu", (unsigned long long)id2,
	       (unsigned long long)id);
	/* an event handle of any length but 64 is refused before any work */
	EXPECT(raw_compact_event(s, id, 10) == -EINVAL, "IPC event handle of 10 bytes");
	EXPECT(raw_compact_event(s, id, 80) == -EINVAL, "IPC event handle of 80 bytes");
	EXPECT(raw_compact_event(s, id, 0) == -EINVAL, "IPC event handle of 0 bytes");
	m.size *= 2;
	EXPECT(raw_reg(s, &m, fd, NULL) == -EEXIST, "generation 5 with another size");
	m.generation = 6;
	EXPECT(raw_reg(s, &m, -1, NULL) == -EBADF, "VMM registration without its fd");
	m.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	m.ipc_handle.data = shorthandle;
	m.ipc_handle.len = sizeof(shorthandle);
	m.size = 4096;
	EXPECT(raw_reg(s, &m, -1, NULL) == -EINVAL, "IPC handle of 10 bytes");
	m.kind = (Snapkv__V1__BufferKind)7;
	EXPECT(raw_reg(s, &m, fd, NULL) == -EINVAL, "unknown buffer kind");
	EXPECT(raw_unreg(s, id) == 0, "first unregister");
	EXPECT(raw_unreg(s, id) == 0, "second unregister");
	EXPECT(raw_unreg(s, id) == -ENOENT, "third unregister");
	close(s);
	close(fd);
	skv_cuda_arena_free(mem);
	printf("engine: generations: %d failures\n", fails);
	return fails ? 1 : 0;
}

/* HND everywhere: K of layer l at l*HKV*LEN*HD, V after all K; Q at q_base */
static void fill_desc(struct skv_compact_desc *d, struct skv_layer_ref *lr, struct skv_buffer *bkv,
		      struct skv_buffer *bq, size_t q_base)
{
	const size_t kv_elems = (size_t)LAYERS * HKV * LEN * HD;

	d->layers = LAYERS;
	d->shape = (struct skv_shape){
	    .prompt_len = LEN, .head_dim = HD, .h_q = HQ, .h_kv = HKV, .n_q = WIN};
	skv_client_params_init(&d->params);
	d->params.window = WIN;
	d->params.capacity = CAP;
	d->params.kernel = 3;
	d->params.sinks = 2;
	d->layer = lr;
	for (int l = 0; l < LAYERS; l++) {
		size_t ko = (size_t)l * HKV * LEN * HD, vo = kv_elems + ko,
		       qo = (size_t)l * HQ * WIN * HD;
		struct skv_tensor_ref kv = {.buf = bkv,
					    .dtype = SKV_DTYPE_F32,
					    .head_stride = LEN * HD,
					    .token_stride = HD};
		lr[l].k = kv, lr[l].k.offset = ko * 4;
		lr[l].v = kv, lr[l].v.offset = vo * 4;
		lr[l].q = (struct skv_tensor_ref){.buf = bq,
						  .offset = q_base + qo * 4,
						  .dtype = SKV_DTYPE_F32,
						  .head_stride = WIN * HD,
						  .token_stride = HD};
	}
}

static uint32_t read_flag(const char *dflag)
{
	uint32_t v = 0;

	if (cudaMemcpy(&v, dflag, 4, cudaMemcpyDeviceToHost) != cudaSuccess)
		EXPECT(0, "read the flag back");
	return v;
}

static void set_flag(char *dflag, uint32_t v)
{
	if (cudaMemcpy(dflag, &v, 4, cudaMemcpyHostToDevice) != cudaSuccess ||
	    cudaDeviceSynchronize() != cudaSuccess)
		EXPECT(0, "set the flag");
}

/*
 * tests/gpu/emu's hook: there a stream runs at once, so an event can only be
 * kept pending by asking the emulator. Absent (NULL) on a real GPU, where a
 * stream held by a flag this process sets later does it instead.
 */
extern int cuda_emu_event_hold(cudaEvent_t ev, int hold) __attribute__((weak));

/*
 * The engine's side of a CUDA_IPC_EVENT wait: an interprocess event recorded
 * after an asynchronous upload of the K/V (from pinned memory), like a
 * prefill ending. pending_upload() zeroes the K/V and starts an upload that
 * completes only at complete_upload(): on a GPU it is queued on a stream
 * waiting for a flag word of ours (the 64th byte after the K/V), on the
 * emulator it happens at completion.
 */
struct engine_event {
	struct skv_cuda_dev *dev;
	cudaEvent_t ev;
	cudaStream_t st;	   /* plain uploads */
	struct skv_cuda_ctx *gctx; /* GPU: the stream the flag holds */
	char *dkv, *gate;	   /* device K/V and the gate word */
	void *pinned;		   /* the K/V, page-locked */
	size_t kv_bytes;
	uint32_t seq;
	bool zeroed; /* complete_upload() must upload (emulator) */
	cudaIpcEventHandle_t handle;
};

static int event_setup(struct engine_event *e, struct skv_cuda_dev *dev, char *dkv, size_t kv_bytes,
		       const void *hkv)
{
	struct skv_error err = {0};

	memset(e, 0, sizeof(*e));
	e->dev = dev;
	e->dkv = dkv;
	e->gate = dkv + kv_bytes + 64;
	e->kv_bytes = kv_bytes;
	CK(cudaStreamCreateWithFlags(&e->st, cudaStreamNonBlocking));
	CK(cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming | cudaEventInterprocess));
	CK(cudaIpcGetEventHandle(&e->handle, e->ev));
	CK(cudaMallocHost(&e->pinned, kv_bytes));
	memcpy(e->pinned, hkv, kv_bytes);
	CK(cudaMemset(e->gate, 0, 4));
	CK(cudaDeviceSynchronize());
	if (!cuda_emu_event_hold && skv_cuda_ctx_new(dev, &e->gctx, &err) < 0) {
		fprintf(stderr, "engine: gate stream: %s\n", err.msg);
		return -1;
	}
	return 0;
}

static void event_teardown(struct engine_event *e)
{
	skv_cuda_ctx_free(e->gctx);
	if (e->ev)
		cudaEventDestroy(e->ev);
	if (e->st)
		cudaStreamDestroy(e->st);
	cudaFreeHost(e->pinned);
}

/* A prefill that ends at once: async upload, then the record, no sync. */
static int plain_upload(struct engine_event *e)
{
	CK(cudaMemsetAsync(e->dkv, 0, e->kv_bytes, e->st));
	CK(cudaMemcpyAsync(e->dkv, e->pinned, e->kv_bytes, cudaMemcpyHostToDevice, e->st));
	CK(cudaEventRecord(e->ev, e->st));
	return 0;
}

/* A prefill still running: the event stays pending until complete_upload(). */
static int pending_upload(struct engine_event *e, bool zero)
{
	struct skv_error err = {0};

	if (zero) {
		CK(cudaMemset(e->dkv, 0, e->kv_bytes));
		CK(cudaDeviceSynchronize());
	}
	if (cuda_emu_event_hold) {
		e->zeroed = zero;
		cuda_emu_event_hold(e->ev, 1);
		CK(cudaEventRecord(e->ev, e->st));
		return 0;
	}
	void *gs = skv_cuda_ctx_stream(e->gctx);
	if (skv_cuda_ctx_wait_value(e->gctx, e->gate, ++e->seq, &err) < 0) {
		fprintf(stderr, "engine: gate: %s\n", err.msg);
		return -1;
	}
	CK(cudaMemcpyAsync(e->dkv, e->pinned, e->kv_bytes, cudaMemcpyHostToDevice,
			   (cudaStream_t)gs));
	CK(cudaEventRecord(e->ev, (cudaStream_t)gs));
	return 0;
}

static int complete_upload(struct engine_event *e)
{
	if (cuda_emu_event_hold) {
		if (e->zeroed)
			CK(cudaMemcpy(e->dkv, e->pinned, e->kv_bytes, cudaMemcpyHostToDevice));
		cuda_emu_event_hold(e->ev, 0);
		return 0;
	}
	/* the legacy stream does not wait for the held one: the word lands */
	CK(cudaMemcpy(e->gate, &e->seq, 4, cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());
	return 0;
}

static void desc_wait_event(struct skv_compact_desc *d, const struct engine_event *e,
			    uint32_t timeout_ms)
{
	d->prefill_wait = SKV_WAIT_CUDA_IPC_EVENT;
	memcpy(d->wait_ipc_event, &e->handle, sizeof(d->wait_ipc_event));
	d->wait_timeout_ms = timeout_ms;
}

/*
 * CompactRequest.prefill_wait with the engine's IPC event: recorded after an
 * async upload (no sync before submitting); completed only well after the
 * submission (the result not before, equal to the host after); never
 * completed (-ETIME at the bound, nothing held back after); a handle that is
 * no event -EINVAL; then the daemon serves on with its pool at the baseline.
 */
static void event_waits(struct skv_client *c, const struct skv_compact_desc *d0,
			struct skv_cuda_dev *dev, char *dkv, size_t kv_bytes, const float *hkv,
			const struct skv_plan *pl, const float *ok, const float *ov,
			const float *om, const int32_t *op)
{
	struct skv_compact_desc d = *d0;
	struct skv_request *rq = NULL;
	struct skv_cache *k = NULL;
	struct engine_event e;
	struct skv_stats st0, st1;
	double t0, t_set, t_plain;
	unsigned mism;
	int r;

	if (event_setup(&e, dev, dkv, kv_bytes, hkv) < 0) {
		EXPECT(0, "event setup");
		return;
	}
	EXPECT(skv_client_stats(c, &st0) == 0, "stats");
	/* 1: recorded after an async upload; submitted without synchronising */
	EXPECT(plain_upload(&e) == 0, "async upload");
	desc_wait_event(&d, &e, 5000);
	t0 = now_s();
	r = skv_client_compact(c, &d, &k);
	t_plain = now_s() - t0;
	EXPECT(r == 0, "event wait after an async upload: %d (%s)", r, skv_client_error(c));
	if (r == 0) {
		mism = check_cache(k, NULL, pl, ok, ov, om, op);
		printf("engine: event wait: recorded after an async upload: %s\n",
		       mism ? "DIFFERENT" : "equal to the host result");
		skv_cache_release(k);
		k = NULL;
	}
	if (cudaStreamSynchronize(e.st) != cudaSuccess)
		EXPECT(0, "synchronise the upload stream");
	/* 2: the prefill ends 100 ms + 3 compaction times after submitting; the
	 * K/V are zero until then, so running early shows in the result too */
	EXPECT(pending_upload(&e, true) == 0, "pending upload");
	r = skv_compact_submit(c, &d, &rq);
	EXPECT(r == 0, "submit with an event wait: %d (%s)", r, skv_client_error(c));
	if (r == 0) {
		t0 = now_s();
		usleep((useconds_t)((0.1 + 3 * t_plain) * 1e6));
		r = skv_request_poll(rq);
		EXPECT(r == 0, "completed before the event: poll %d", r);
		t_set = now_s();
		EXPECT(complete_upload(&e) == 0, "complete the upload");
		r = skv_request_wait(rq, 20000, &k);
		EXPECT(r == 0, "event wait: %d (%s)", r, skv_client_error(c));
		if (r == 0) {
			mism = check_cache(k, NULL, pl, ok, ov, om, op);
			printf("engine: event wait: completed after %.0f ms (a compaction takes "
			       "%.0f ms), compaction after it: %s\n",
			       (t_set - t0) * 1e3, t_plain * 1e3,
			       mism ? "DIFFERENT" : "equal to the host result");
			skv_cache_release(k);
			k = NULL;
		}
	} else {
		complete_upload(&e);
	}
	/* 3: never completed in time: -ETIMEDOUT from the daemon (-ETIME here) */
	EXPECT(pending_upload(&e, false) == 0, "pending event");
	desc_wait_event(&d, &e, 200);
	t0 = now_s();
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == -ETIME, "event never completed: %d (%s)", r, skv_client_error(c));
	EXPECT(strstr(skv_client_error(c), "prefill_wait"), "error text: %s", skv_client_error(c));
	printf("engine: event wait: never completed, timeout 200 ms: %s after %.0f ms (%s)\n",
	       r == -ETIME ? "-ETIMEDOUT (-ETIME from libsnapkv)" : "WRONG", (now_s() - t0) * 1e3,
	       skv_client_error(c));
	if (r == 0)
		skv_cache_release(k);
	k = NULL;
	EXPECT(complete_upload(&e) == 0, "complete the upload");
	/* 4: 64 bytes that name no event: the open fails, clearly */
	desc_wait_event(&d, &e, 200);
	memset(d.wait_ipc_event, 0, sizeof(d.wait_ipc_event));
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == -EINVAL && strstr(skv_client_error(c), "cudaIpcOpenEventHandle"),
	       "a handle that is no event: %d (%s)", r, skv_client_error(c));
	printf("engine: event wait: a handle of zeros: %s\n", skv_client_error(c));
	desc_wait_event(&d, &e, 3600u * 1000);
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == -E2BIG, "event timeout over prefill_wait_max_ms: %d (%s)", r,
	       skv_client_error(c));
	/* 5: still serving, and nothing held back */
	d = *d0;
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == 0, "compaction after the event timeout: %d (%s)", r, skv_client_error(c));
	if (r == 0) {
		EXPECT(check_cache(k, NULL, pl, ok, ov, om, op) == 0, "after the event timeout");
		skv_cache_release(k);
	}
	EXPECT(skv_client_stats(c, &st1) == 0, "stats");
	EXPECT(st1.pool_used == st0.pool_used && st1.arena_used == st0.arena_used,
	       "pool %llu -> %llu bytes, arena %llu -> %llu", (unsigned long long)st0.pool_used,
	       (unsigned long long)st1.pool_used, (unsigned long long)st0.arena_used,
	       (unsigned long long)st1.arena_used);
	printf("engine: event wait: -EINVAL, -E2BIG refused; served after the timeout; pool "
	       "%llu bytes as before: %s\n",
	       (unsigned long long)st1.pool_used, fails ? "FAILED" : "ok");
	event_teardown(&e);
}

/*
 * --event-hang DIR: submit with an event wait (1500 ms) that this process
 * never completes, create DIR/submitted (the script sends SIGTERM then) and
 * wait: the draining daemon must fail it at the bound (-ETIME here) and exit.
 */
static int event_hang(struct skv_client *c, struct skv_compact_desc *d, struct skv_cuda_dev *dev,
		      char *dkv, size_t kv_bytes, const float *hkv, const char *dir)
{
	struct skv_request *rq = NULL;
	struct skv_cache *k = NULL;
	struct engine_event e;
	char p[512];
	FILE *f;
	int r;

	if (event_setup(&e, dev, dkv, kv_bytes, hkv) < 0 || pending_upload(&e, false) < 0)
		return 1;
	desc_wait_event(d, &e, 1500);
	r = skv_compact_submit(c, d, &rq);
	EXPECT(r == 0, "submit: %d (%s)", r, skv_client_error(c));
	if (r < 0)
		return 1;
	double t0 = now_s();
	snprintf(p, sizeof(p), "%s/submitted", dir);
	f = fopen(p, "w");
	if (f)
		fclose(f);
	r = skv_request_wait(rq, 30000, &k);
	EXPECT(r == -ETIME, "event never completed, daemon stopping: %d (%s)", r,
	       skv_client_error(c));
	printf("engine: event wait across SIGTERM: %s after %.0f ms (%s)\n",
	       r == -ETIME ? "-ETIME" : "WRONG", (now_s() - t0) * 1e3, skv_client_error(c));
	if (r == 0)
		skv_cache_release(k);
	complete_upload(&e);
	event_teardown(&e);
	fflush(stdout);
	return fails ? 1 : 0;
}

/*
 * CompactRequest.prefill_wait with a CUDA_FLAG at byte flag_off of bkv
 * (device address dflag here): the daemon must not finish before the flag
 * is set, must time out (and write the flag itself) when it never is, keep
 * serving afterwards with its pool back where it was, and refuse a bad
 * offset or an unknown buffer.
 */
static void prefill_waits(struct skv_client *c, const struct skv_compact_desc *d0,
			  struct skv_buffer *bkv, uint64_t flag_off, char *dflag,
			  const struct skv_plan *pl, const float *ok, const float *ov,
			  const float *om, const int32_t *op)
{
	struct skv_compact_desc d = *d0;
	struct skv_request *rq = NULL;
	struct skv_cache *k = NULL;
	struct skv_stats st0, st1;
	double t0, t_set;
	int r;

	set_flag(dflag, 0);
	EXPECT(skv_client_stats(c, &st0) == 0, "stats");
	/* how long one compaction takes without a wait (the emulator is slow):
	 * the flag is set well after that, so an ignored wait shows */
	t0 = now_s();
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == 0, "compaction without a wait: %d (%s)", r, skv_client_error(c));
	if (r == 0)
		skv_cache_release(k);
	k = NULL;
	double t_plain = now_s() - t0, hold = 0.1 + 3 * t_plain;
	/* 1: the engine signals 100 ms (+ 3 plain compactions) after submitting */
	EXPECT(skv_compact_desc_wait_flag(&d, bkv, flag_off, 1, 5000) == 0, "wait_flag");
	r = skv_compact_submit(c, &d, &rq);
	EXPECT(r == 0, "submit with a flag wait: %d (%s)", r, skv_client_error(c));
	if (r < 0)
		return;
	t0 = now_s();
	usleep((useconds_t)(hold * 1e6));
	r = skv_request_poll(rq);
	EXPECT(r == 0, "completed before the flag was set: poll %d", r);
	t_set = now_s();
	set_flag(dflag, 1);
	r = skv_request_wait(rq, 20000, &k);
	EXPECT(r == 0, "flag wait: %d (%s)", r, skv_client_error(c));
	if (r == 0) {
		unsigned mism = check_cache(k, NULL, pl, ok, ov, om, op);
		printf("engine: prefill wait: flag set after %.0f ms (a compaction takes %.0f ms), "
		       "completed after it: %s\n",
		       (t_set - t0) * 1e3, t_plain * 1e3,
		       mism ? "DIFFERENT" : "equal to the host result");
		skv_cache_release(k);
		k = NULL;
	}
	/* 2: never set: the daemon times out, releases its stream by writing
	 * the value itself, and fails the request */
	t0 = now_s();
	EXPECT(skv_compact_desc_wait_flag(&d, bkv, flag_off, 2, 200) == 0, "wait_flag");
	r = skv_client_compact(c, &d, &k);
	/* the daemon answers -ETIMEDOUT; libsnapkv reports it as -ETIME */
	EXPECT(r == -ETIME, "flag never set: %d (%s)", r, skv_client_error(c));
	EXPECT(strstr(skv_client_error(c), "prefill_wait"), "error text: %s", skv_client_error(c));
	EXPECT(read_flag(dflag) == 2, "the daemon wrote the flag: %u", read_flag(dflag));
	printf("engine: prefill wait: never set, timeout 200 ms: %s after %.0f ms (%s)\n",
	       r == -ETIME ? "-ETIMEDOUT (-ETIME from libsnapkv)" : "WRONG", (now_s() - t0) * 1e3,
	       skv_client_error(c));
	if (r == 0)
		skv_cache_release(k);
	k = NULL;
	/* 3: bad offsets and an unknown buffer are refused before any work */
	EXPECT(skv_compact_desc_wait_flag(&d, bkv, skv_buffer_size(bkv), 1, 200) == 0, "wf");
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == -ERANGE, "flag past the buffer: %d (%s)", r, skv_client_error(c));
	d.wait_offset = 2; /* unaligned: the library refuses it, the daemon too */
	EXPECT(skv_compact_desc_wait_flag(&d, bkv, 2, 1, 200) == -EINVAL, "unaligned (lib)");
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == -ERANGE, "unaligned flag: %d (%s)", r, skv_client_error(c));
	d.wait_offset = flag_off;
	d.wait_buffer = NULL; /* buffer id 0: never registered */
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == -ENOENT, "flag in an unknown buffer: %d (%s)", r, skv_client_error(c));
	d.wait_buffer = bkv;
	d.wait_timeout_ms = 3600u * 1000;
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == -E2BIG, "timeout over prefill_wait_max_ms: %d (%s)", r, skv_client_error(c));
	/* 4: still serving, and nothing held back */
	d = *d0;
	r = skv_client_compact(c, &d, &k);
	EXPECT(r == 0, "compaction after the timeout: %d (%s)", r, skv_client_error(c));
	if (r == 0) {
		EXPECT(check_cache(k, NULL, pl, ok, ov, om, op) == 0, "after the timeout");
		skv_cache_release(k);
	}
	EXPECT(skv_client_stats(c, &st1) == 0, "stats");
	EXPECT(st1.pool_used == st0.pool_used && st1.arena_used == st0.arena_used,
	       "pool %llu -> %llu bytes, arena %llu -> %llu", (unsigned long long)st0.pool_used,
	       (unsigned long long)st1.pool_used, (unsigned long long)st0.arena_used,
	       (unsigned long long)st1.arena_used);
	printf("engine: prefill wait: -ERANGE, -ENOENT, -E2BIG refused; served after the "
	       "timeout; pool %llu bytes as before: %s\n",
	       (unsigned long long)st1.pool_used, fails ? "FAILED" : "ok");
}

int main(int argc, char **argv)
{
	const char *sock = argc > 1 ? argv[1] : NULL, *hold = NULL;
	const char *hang = NULL;
	bool enotsup = false, generations = false;
	struct skv_cuda_dev *dev = NULL;
	struct skv_cuda_arena *kvmem = NULL;
	struct skv_error err = {0};
	struct skv_client *c = NULL;
	struct skv_buffer *bkv = NULL, *bq = NULL;
	int fd = -1, r;

	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--enotsup"))
			enotsup = true;
		else if (!strcmp(argv[i], "--generations"))
			generations = true;
		else if (!strcmp(argv[i], "--hold") && i + 1 < argc)
			hold = argv[++i];
		else if (!strcmp(argv[i], "--event-hang") && i + 1 < argc)
			hang = argv[++i];
		else
			sock = NULL;
	}
	if (!sock) {
		fprintf(stderr,
			"usage: gpu-engine SOCKET [--enotsup | --generations | --event-hang DIR] "
			"[--hold DIR]\n");
		return 2;
	}
	/* the engine's own device memory, through the plugin's VMM allocator */
	if (skv_cuda_dev_open(-1, &dev, &err) < 0) {
		fprintf(stderr, "engine: %s\n", err.msg);
		return 1;
	}
	if (generations)
		return run_generations(sock, dev);
	const size_t kv_elems = (size_t)LAYERS * HKV * LEN * HD,
		     q_elems = (size_t)LAYERS * HQ * WIN * HD;
	const size_t kv_bytes = 2 * kv_elems * 4, q_bytes = q_elems * 4;
	if (skv_cuda_arena_new(dev, kv_bytes, &kvmem, &err) < 0 ||
	    skv_cuda_arena_export_fd(kvmem, &fd, &err) < 0) {
		fprintf(stderr, "engine: VMM allocation: %s\n", err.msg);
		return 1;
	}
	char *dkv = skv_cuda_arena_ptr(kvmem), *dq = NULL;
	/* 64 KiB at least: the emulator exports only memfd-backed allocations */
	CK(cudaMalloc((void **)&dq, Q_OFF + q_bytes < (64u << 10) ? (64u << 10) : Q_OFF + q_bytes));
	cudaIpcMemHandle_t mh;
	CK(cudaIpcGetMemHandle(&mh, dq));

	struct rng rg = {4242};
	float *hkv = rand_tensor(&rg, SKV_DTYPE_F32, 2 * kv_elems, 1.0f);
	float *hq = rand_tensor(&rg, SKV_DTYPE_F32, q_elems, 1.0f);
	CK(cudaMemcpy(dkv, hkv, kv_bytes, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dq + Q_OFF, hq, q_bytes, cudaMemcpyHostToDevice));
	CK(cudaDeviceSynchronize());

	r = skv_client_connect(sock, NULL, &c);
	if (r < 0) {
		fprintf(stderr, "engine: connect %s: %s\n", sock, strerror(-r));
		return 1;
	}
	r = skv_buffer_register_cuda_fd(c, fd, skv_cuda_arena_size(kvmem), 0, &bkv);
	if (enotsup) {
		EXPECT(r == -ENOTSUP, "VMM registration on the host backend: %d (%s)", r,
		       skv_client_error(c));
		EXPECT(strstr(skv_client_error(c), "--backend cuda"), "error text: %s",
		       skv_client_error(c));
		printf("engine: VMM fd on the host backend: %s\n", skv_client_error(c));
		r = skv_buffer_register_cuda_ipc(c, &mh, Q_OFF, q_bytes, 0, &bq);
		EXPECT(r == -ENOTSUP, "IPC registration on the host backend: %d (%s)", r,
		       skv_client_error(c));
		printf("engine: IPC handle on the host backend: %s\n", skv_client_error(c));
		int afd = -1;
		uint64_t asz = 0;
		r = skv_client_cuda_arena(c, &afd, &asz, NULL);
		EXPECT(r == -ENOTSUP, "GPU arena on the host backend: %d (%s)", r,
		       skv_client_error(c));
		printf("engine: GPU arena on the host backend: %s\n", skv_client_error(c));
		/* a prefill wait: valid memfd tensors, so only the wait is refused */
		struct skv_buffer *hb = NULL;
		if (skv_buffer_alloc(c, kv_bytes + q_bytes, &hb) < 0) {
			fprintf(stderr, "engine: memfd buffer: %s\n", skv_client_error(c));
			return 1;
		}
		struct skv_layer_ref hlr[LAYERS];
		struct skv_compact_desc hd = {.desc_size = sizeof(hd)};
		struct skv_cache *hk = NULL;
		fill_desc(&hd, hlr, hb, hb, kv_bytes);
		EXPECT(skv_compact_desc_wait_flag(&hd, hb, 0, 1, 100) == 0, "wait_flag");
		r = skv_client_compact(c, &hd, &hk);
		EXPECT(r == -ENOTSUP, "prefill wait on the host backend: %d (%s)", r,
		       skv_client_error(c));
		EXPECT(strstr(skv_client_error(c), "--backend cuda"), "error text: %s",
		       skv_client_error(c));
		printf("engine: prefill wait on the host backend: %s\n", skv_client_error(c));
		hd.prefill_wait = SKV_WAIT_NONE; /* and the same request without it runs */
		r = skv_client_compact(c, &hd, &hk);
		EXPECT(r == 0, "the same request without the wait: %d (%s)", r,
		       skv_client_error(c));
		if (r == 0)
			skv_cache_release(hk);
		skv_buffer_free(hb);
		goto out;
	}
	if (r < 0) {
		fprintf(stderr, "engine: register VMM fd: %s\n", skv_client_error(c));
		return 1;
	}
	/* an IPC window reaching past its allocation is refused, and one larger
	 * than max_buffer_bytes before any import (before the good registration:
	 * each import opens the handle, and it is closed again on refusal) */
	struct skv_buffer *bad = NULL;
	r = skv_buffer_register_cuda_ipc(c, &mh, Q_OFF, (size_t)256 << 20, 0, &bad);
	EXPECT(r == -ERANGE, "IPC window past its allocation: %d (%s)", r, skv_client_error(c));
	r = skv_buffer_register_cuda_ipc(c, &mh, 0, (size_t)1 << 40, 0, &bad);
	EXPECT(r == -E2BIG, "IPC window over max_buffer_bytes: %d (%s)", r, skv_client_error(c));
	r = skv_buffer_register_cuda_ipc(c, &mh, Q_OFF, q_bytes, 0, &bq);
	if (r < 0) {
		fprintf(stderr, "engine: register IPC handle: %s\n", skv_client_error(c));
		return 1;
	}
	EXPECT(!strcmp(skv_buffer_transport(bkv), "cuda-vmm-fd"), "transport %s",
	       skv_buffer_transport(bkv));
	EXPECT(!strcmp(skv_buffer_transport(bq), "cuda-ipc"), "transport %s",
	       skv_buffer_transport(bq));

	/* HND everywhere: K of layer l at l*HKV*LEN*HD, V after all K */
	struct skv_layer_ref lr[LAYERS];
	struct skv_layer_in in[LAYERS];
	struct skv_compact_desc d = {.desc_size = sizeof(d)};
	fill_desc(&d, lr, bkv, bq, 0);
	if (hang)
		return event_hang(c, &d, dev, dkv, kv_bytes, hkv, hang);
	for (int l = 0; l < LAYERS; l++) {
		size_t ko = (size_t)l * HKV * LEN * HD, vo = kv_elems + ko,
		       qo = (size_t)l * HQ * WIN * HD;
		in[l].k = (struct skv_tensor){.data = hkv + ko,
					      .dtype = SKV_DTYPE_F32,
					      .head_stride = LEN * HD,
					      .token_stride = HD};
		in[l].v = in[l].k, in[l].v.data = hkv + vo;
		in[l].q = (struct skv_tensor){.data = hq + qo,
					      .dtype = SKV_DTYPE_F32,
					      .head_stride = WIN * HD,
					      .token_stride = HD};
	}
	struct skv_cache *cache = NULL;
	unsigned mism;
	r = skv_client_compact(c, &d, &cache);
	if (r < 0) {
		fprintf(stderr, "engine: compact: %s\n", skv_client_error(c));
		return 1;
	}

	/* the host reference, independently computed by libskv */
	struct skv_plan pl;
	struct skv_ctx *ctx = NULL;
	if (skv_plan(&d.shape, &d.params, &pl, &err) < 0 || skv_ctx_new(1, &ctx) < 0) {
		fprintf(stderr, "engine: host plan: %s\n", err.msg);
		return 1;
	}
	const size_t per = (size_t)pl.h_store * pl.kept * HD;
	float *ok = calloc(LAYERS * per, 4), *ov = calloc(LAYERS * per, 4);
	float *om = calloc((size_t)LAYERS * pl.h_store, 4);
	int32_t *op = calloc((size_t)LAYERS * pl.h_store * pl.kept, 4);
	struct skv_layer_out out[LAYERS];
	for (int l = 0; l < LAYERS; l++) {
		struct skv_tensor t = {.dtype = SKV_DTYPE_F32,
				       .head_stride = (int64_t)pl.kept * HD,
				       .token_stride = HD};
		out[l].k = t, out[l].k.data = ok + l * per;
		out[l].v = t, out[l].v.data = ov + l * per;
		out[l].positions = op + (size_t)l * pl.h_store * pl.kept;
		out[l].pos_stride = pl.kept;
		out[l].retained_mass = om + (size_t)l * pl.h_store;
	}
	if (skv_compact(ctx, &d.shape, &d.params, LAYERS, in, out, &err) < 0) {
		fprintf(stderr, "engine: host compaction: %s\n", err.msg);
		return 1;
	}
	mism = check_cache(cache, NULL, &pl, ok, ov, om, op);
	printf("engine: host arena: %u layers x %u heads, kept %u of %u: %s\n", LAYERS, pl.h_store,
	       pl.kept, LEN, mism ? "DIFFERENT" : "equal to the host result");
	/* the flag: the first word after the K/V, inside the registered VMM buffer */
	prefill_waits(c, &d, bkv, kv_bytes, dkv + kv_bytes, &pl, ok, ov, om, op);
	event_waits(c, &d, dev, dkv, kv_bytes, hkv, &pl, ok, ov, om, op);

	/* again with the K/V in the daemon's GPU arena, imported here once */
	int afd = -1, adev = -1;
	uint64_t asz = 0;
	struct skv_cuda_import *ai = NULL;
	struct skv_cache *gcache = NULL;
	r = skv_client_cuda_arena(c, &afd, &asz, &adev);
	if (r < 0) {
		fprintf(stderr, "engine: GPU arena: %s\n", skv_client_error(c));
		return 1;
	}
	if (skv_cuda_import_fd(dev, 1, 1, afd, asz, &ai, &err) < 0) {
		fprintf(stderr, "engine: GPU arena import: %s\n", err.msg);
		return 1;
	}
	close(afd);
	d.out_arena = SKV_ARENA_CUDA;
	r = skv_client_compact(c, &d, &gcache);
	if (r < 0) {
		fprintf(stderr, "engine: compact into the GPU arena: %s\n", skv_client_error(c));
		return 1;
	}
	EXPECT(skv_cache_info(gcache)->kv_arena == SKV_ARENA_CUDA, "kv_arena %d",
	       (int)skv_cache_info(gcache)->kv_arena);
	EXPECT(skv_cache_k(gcache, 0, 0) == NULL, "skv_cache_k of a GPU-arena cache");
	mism = check_cache(gcache, skv_cuda_import_ptr(ai), &pl, ok, ov, om, op);
	printf("engine: GPU arena (%llu bytes, device %d): kept %u of %u: %s\n",
	       (unsigned long long)asz, adev, pl.kept, LEN,
	       mism ? "DIFFERENT" : "equal to the host result");
	EXPECT(skv_cache_grow(gcache, 4) == -ENOTSUP, "GROW of a GPU-arena cache");

	if (hold) {
		char p[512];
		FILE *f;

		/* unregister drops the IPC import; the VMM one goes with the session */
		EXPECT(skv_buffer_free(bq) == 0, "unregister the IPC buffer");
		bq = NULL;
		fflush(stdout);
		snprintf(p, sizeof(p), "%s/ready", hold);
		f = fopen(p, "w");
		if (f)
			fclose(f);
		for (int i = 0; i < 600 && !exists(hold, "go"); i++)
			usleep(50000);
		/* exit with the VMM buffer still registered: the session end releases it */
		printf("engine: %d failures\n", fails);
		fflush(stdout);
		_exit(fails ? 1 : 0);
	}
	skv_cache_release(cache);
	skv_cache_release(gcache);
	skv_cuda_import_release(ai);
	skv_ctx_free(ctx);
	free(ok), free(ov), free(om), free(op);
out:
	skv_buffer_free(bq);
	skv_buffer_free(bkv);
	skv_client_close(c);
	close(fd);
	cudaFree(dq);
	skv_cuda_arena_free(kvmem);
	skv_cuda_dev_close(dev);
	free(hkv), free(hq);
	printf("engine: %d failures\n", fails);
	return fails ? 1 : 0;
}
