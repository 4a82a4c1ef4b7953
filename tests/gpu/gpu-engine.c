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
 *   gpu-engine SOCKET --grow-paged  GROW of GPU-arena caches (HND, NHD:
 *                                decode rows, two GROWs, == the host arena
 *                                and the reference; -EINVAL, -E2BIG, -EDQUOT,
 *                                -ENOSPC leave it intact) and paged K/V in a
 *                                memfd and a VMM buffer (== the strided
 *                                reference; bad block tables refused, pool
 *                                at baseline). Daemon: --pool-bytes 64M,
 *                                tenant_quota_bytes 40M.
 *   gpu-engine SOCKET --grow-fail  a GROW whose device copy fails (emulator,
 *                                SKV_EMU_FAIL_COPY2D in the daemon): -EIO,
 *                                the cache intact and usable, pool at its
 *                                baseline.
 *   ... --device N               the engine's memory on CUDA device N (a
 *                                daemon with several devices imports and
 *                                compacts it there)
 *   ... --quick                  the compactions only (no prefill waits)
 *   ... --group KEY              then a mass-mode compaction in decision
 *                                group KEY of 2 (the other member: another
 *                                engine, e.g. on another device); its data
 *                                seeded by --device, so the members' own C*
 *                                may differ; prints the group's C*
 *   ... --mixed M                the query window on device M, the K/V on
 *                                --device: the compaction must be refused
 *                                (-EXDEV, "must all be on one device")
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

#include "snapkv.h"
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

/* How long the engine holds its prefill back: long enough that a compaction
 * run too early would have finished (3 plain ones), at most 3 s so that the
 * wait bound below (the daemon's default prefill_wait_max_ms, 10 s) is never
 * what ends it, however loaded the machine. */
#define HOLD_BOUND_MS 10000u
static double hold_s(double t_plain)
{
	double h = 0.1 + 3 * t_plain;

	return h > 3.0 ? 3.0 : h;
}

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
	if (skv_compact_desc_wait_event(d, &e->handle, timeout_ms) < 0)
		abort(); /* desc_size is sizeof: cannot fail */
}

/*
 * CompactRequest.prefill_wait with the engine's IPC event: recorded after an
 * async upload (no sync before submitting); completed only well after the
 * submission (the result not before, equal to the host after); never
 * completed (-ETIME at the bound, nothing held back after); a handle that is
 * no event -EINVAL; then the daemon serves on with its pool at the baseline.
 */
/* After refused and timed-out waits: the next plain request is served and
 * equals the host result, and pool and arena are back where they were.
 * Returns the pool bytes for the caller's summary line. */
static uint64_t still_serving(struct skv_client *c, const struct skv_compact_desc *d0,
			      const struct skv_stats *st0, const struct skv_plan *pl,
			      const float *ok, const float *ov, const float *om, const int32_t *op,
			      const char *after)
{
	struct skv_compact_desc d = *d0;
	struct skv_cache *k = NULL;
	struct skv_stats st1;
	int r;

	r = skv_client_compact(c, &d, &k);
	EXPECT(r == 0, "compaction after %s: %d (%s)", after, r, skv_client_error(c));
	if (r == 0) {
		EXPECT(check_cache(k, NULL, pl, ok, ov, om, op) == 0, "after %s", after);
		skv_cache_release(k);
	}
	memset(&st1, 0, sizeof(st1));
	EXPECT(skv_client_stats(c, &st1) == 0, "stats");
	EXPECT(st1.pool_used == st0->pool_used && st1.arena_used == st0->arena_used,
	       "pool %llu -> %llu bytes, arena %llu -> %llu", (unsigned long long)st0->pool_used,
	       (unsigned long long)st1.pool_used, (unsigned long long)st0->arena_used,
	       (unsigned long long)st1.arena_used);
	return st1.pool_used;
}

static void event_waits(struct skv_client *c, const struct skv_compact_desc *d0,
			struct skv_cuda_dev *dev, char *dkv, size_t kv_bytes, const float *hkv,
			const struct skv_plan *pl, const float *ok, const float *ov,
			const float *om, const int32_t *op)
{
	struct skv_compact_desc d = *d0;
	struct skv_request *rq = NULL;
	struct skv_cache *k = NULL;
	struct engine_event e;
	struct skv_stats st0;
	uint64_t pool;
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
	/* the bound must outlast the hold below on a loaded machine too */
	desc_wait_event(&d, &e, HOLD_BOUND_MS);
	r = skv_compact_submit(c, &d, &rq);
	EXPECT(r == 0, "submit with an event wait: %d (%s)", r, skv_client_error(c));
	if (r == 0) {
		t0 = now_s();
		usleep((useconds_t)(hold_s(t_plain) * 1e6));
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
	pool = still_serving(c, d0, &st0, pl, ok, ov, om, op, "the event timeout");
	printf("engine: event wait: -EINVAL, -E2BIG refused; served after the timeout; pool "
	       "%llu bytes as before: %s\n",
	       (unsigned long long)pool, fails ? "FAILED" : "ok");
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
	struct skv_stats st0;
	uint64_t pool;
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
	double t_plain = now_s() - t0, hold = hold_s(t_plain);
	/* 1: the engine signals 100 ms (+ 3 plain compactions) after submitting */
	EXPECT(skv_compact_desc_wait_flag(&d, bkv, flag_off, 1, HOLD_BOUND_MS) == 0, "wait_flag");
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
	EXPECT(skv_compact_desc_wait_event(&d, NULL, 200) == -EINVAL, "event NULL handle (lib)");
	EXPECT(skv_compact_desc_wait_event(NULL, d.wait_ipc_event, 200) == -EINVAL,
	       "event NULL desc (lib)");
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
	pool = still_serving(c, d0, &st0, pl, ok, ov, om, op, "the timeout");
	printf("engine: prefill wait: -ERANGE, -ENOENT, -E2BIG refused; served after the "
	       "timeout; pool %llu bytes as before: %s\n",
	       (unsigned long long)pool, fails ? "FAILED" : "ok");
}

/* ------------------------------------------------ GROW and paged layouts */

/*
 * --grow-paged expects a daemon with --pool-bytes 64M and tenant_quota_bytes
 * 40M: a GROW to about 52 MB is over the quota, one to about 100 MB over the
 * pool.
 */
enum { GP_RESERVE = 2, GP_BS = 16, GP_NB = LEN / GP_BS };

/* The compact cache a GROW must preserve: the host reference of the kept
 * slots ([layer][head][kept]) and g decode rows the engine wrote. */
struct gp_expect {
	const struct skv_plan *pl;
	const float *ok, *ov;
	const int32_t *op;
	uint32_t g;
};

/* K (v = 0) or V row element x of decode token t: distinct everywhere */
static float dec_val(uint32_t t, uint32_t l, uint32_t h, uint32_t x, int v)
{
	return 1000.0f * (float)(t + 1) + 100.0f * (float)l + 10.0f * (float)h + 0.01f * (float)x +
	       (v ? 0.5f : 0.0f);
}

/* Row `slot` of (l, h): K (v = 0) or V; gbase: the cache is in the GPU arena
 * mapped there. to_dev: write row, else read it. */
static int gp_row(struct skv_cache *k, char *gbase, uint32_t l, uint32_t h, uint32_t slot, int v,
		  float *row, bool to_dev)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	size_t off = (size_t)slot * ci->token_stride * 4, n = HD * 4;

	if (ci->layout == SKV_LAYOUT_PAGED) { /* the engine's block format */
		int64_t b =
		    skv_cache_block_offset(k, l, v ? SKV_KV_V : SKV_KV_K, slot / ci->block_size);
		char *hp = v ? skv_cache_v_slot(k, l, h, slot) : skv_cache_k_slot(k, l, h, slot);

		if (gbase && b >= 0) {
			char *p =
			    gbase + b +
			    ((slot % ci->block_size) * ci->token_stride + h * ci->head_stride) * 4;
			cudaError_t e = to_dev ? cudaMemcpy(p, row, n, cudaMemcpyHostToDevice)
					       : cudaMemcpy(row, p, n, cudaMemcpyDeviceToHost);
			return e == cudaSuccess ? 0 : -EIO;
		}
		if (gbase || !hp)
			return -EINVAL;
		if (to_dev)
			memcpy(hp, row, n);
		else
			memcpy(row, hp, n);
		return 0;
	}
	if (gbase) {
		char *p =
		    gbase + (v ? skv_cache_v_offset(k, l, h) : skv_cache_k_offset(k, l, h)) + off;
		cudaError_t e = to_dev ? cudaMemcpy(p, row, n, cudaMemcpyHostToDevice)
				       : cudaMemcpy(row, p, n, cudaMemcpyDeviceToHost);
		return e == cudaSuccess ? 0 : -EIO;
	}
	char *p = (char *)(v ? skv_cache_v(k, l, h) : skv_cache_k(k, l, h));
	if (!p)
		return -EINVAL;
	if (to_dev)
		memcpy(p + off, row, n);
	else
		memcpy(row, p + off, n);
	return 0;
}

/* Write decode tokens [t0, t1) at their slots and APPEND them. */
static int gp_decode(struct skv_cache *k, char *gbase, uint32_t t0, uint32_t t1)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	float row[HD];

	for (uint32_t t = t0; t < t1; t++)
		for (uint32_t l = 0; l < ci->layers; l++)
			for (uint32_t h = 0; h < ci->h_store; h++)
				for (int v = 0; v < 2; v++) {
					for (uint32_t x = 0; x < HD; x++)
						row[x] = dec_val(t, l, h, x, v);
					if (gp_row(k, gbase, l, h, ci->kept + t, v, row, true) < 0)
						return -EIO;
				}
	/* the rows must have landed before the daemon copies them */
	if (gbase && cudaDeviceSynchronize() != cudaSuccess)
		return -EIO;
	return skv_cache_append(k, t1 - t0);
}

/* Mismatches of a cache against e: capacity, g, positions (kept, L + i,
 * then -1) and every filled K/V row. */
static unsigned gp_check(struct skv_cache *k, char *gbase, uint32_t capacity,
			 const struct gp_expect *e)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	const struct skv_plan *pl = e->pl;
	unsigned bad = 0;
	float row[HD];

	EXPECT(ci->capacity == capacity && ci->appended == e->g && ci->kept == pl->kept,
	       "capacity %u/%u appended %u/%u kept %u/%u", ci->capacity, capacity, ci->appended,
	       e->g, ci->kept, pl->kept);
	if (ci->capacity != capacity || ci->appended != e->g)
		return 1;
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < pl->h_store; h++) {
			const int32_t *pos = skv_cache_positions(k, l, h);
			const size_t ref = ((size_t)l * pl->h_store + h) * pl->kept;

			for (uint32_t i = 0; i < capacity; i++) {
				int32_t want = -1; /* headroom */

				if (i < pl->kept)
					want = e->op[ref + i];
				else if (i < pl->kept + e->g)
					want = (int32_t)(LEN + i - pl->kept);
				bad += pos[i] != want;
			}
			for (uint32_t i = 0; i < pl->kept + e->g; i++)
				for (int v = 0; v < 2; v++) {
					const float *rr = v ? e->ov : e->ok;

					if (gp_row(k, gbase, l, h, i, v, row, false) < 0)
						return bad + 1;
					for (uint32_t x = 0; x < HD; x++) {
						float want = i < pl->kept ? rr[(ref + i) * HD + x]
									  : dec_val(i - pl->kept, l,
										    h, x, v);
						bad += memcmp(&row[x], &want, 4) != 0;
					}
				}
		}
	return bad;
}

/* retained masses off the reference's by more than 1e-4 */
static unsigned gp_mass(const struct skv_cache *k, const struct skv_plan *pl, const float *om)
{
	unsigned bad = 0;

	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < pl->h_store; h++)
			bad += !(fabsf(skv_cache_retained_mass(k, l, h) -
				       om[l * pl->h_store + h]) <= 1e-4f);
	return bad;
}

/* the host reference of d's compaction (HND, [layer][head][kept]) */
static int gp_reference(const struct skv_compact_desc *d, const float *hkv, const float *hq,
			struct skv_plan *pl, float **ok, float **ov, float **om, int32_t **op)
{
	const size_t kv_elems = (size_t)LAYERS * HKV * LEN * HD;
	struct skv_layer_in in[LAYERS];
	struct skv_layer_out out[LAYERS];
	struct skv_error err = {0};
	struct skv_ctx *ctx = NULL;
	int r;

	if (skv_plan(&d->shape, &d->params, pl, &err) < 0 || skv_ctx_new(1, &ctx) < 0)
		return -EINVAL;
	const size_t per = (size_t)pl->h_store * pl->kept * HD;
	*ok = calloc(LAYERS * per, 4), *ov = calloc(LAYERS * per, 4);
	*om = calloc((size_t)LAYERS * pl->h_store, 4);
	*op = calloc((size_t)LAYERS * pl->h_store * pl->kept, 4);
	for (int l = 0; l < LAYERS; l++) {
		size_t ko = (size_t)l * HKV * LEN * HD, qo = (size_t)l * HQ * WIN * HD;
		struct skv_tensor t = {.dtype = SKV_DTYPE_F32,
				       .head_stride = (int64_t)pl->kept * HD,
				       .token_stride = HD};
		in[l].k = (struct skv_tensor){.data = (float *)hkv + ko,
					      .dtype = SKV_DTYPE_F32,
					      .head_stride = LEN * HD,
					      .token_stride = HD};
		in[l].v = in[l].k, in[l].v.data = (float *)hkv + kv_elems + ko;
		in[l].q = (struct skv_tensor){.data = (float *)hq + qo,
					      .dtype = SKV_DTYPE_F32,
					      .head_stride = WIN * HD,
					      .token_stride = HD};
		out[l].k = t, out[l].k.data = *ok + l * per;
		out[l].v = t, out[l].v.data = *ov + l * per;
		out[l].positions = *op + (size_t)l * pl->h_store * pl->kept;
		out[l].pos_stride = pl->kept;
		out[l].retained_mass = *om + (size_t)l * pl->h_store;
	}
	r = skv_compact(ctx, &d->shape, &d->params, LAYERS, in, out, &err);
	skv_ctx_free(ctx);
	return r;
}

/*
 * GROW of caches whose K/V are in the GPU arena (device-to-device copy in
 * the daemon), in both layouts, beside the same caches in the host arena
 * (host copy): decode rows written and APPENDed, GROWn twice, every position
 * and K/V row equal to the reference; the GROW errors leave the cache as it
 * was; the pool back at its baseline after the release.
 */
static void gp_grow(struct skv_client *c, struct skv_compact_desc *d, char *abase,
		    const struct gp_expect *e0)
{
	const enum skv_layout lay[2] = {SKV_LAYOUT_HND, SKV_LAYOUT_NHD};
	struct skv_stats st0, st1;
	struct gp_expect e = *e0;
	int r;

	EXPECT(skv_client_stats(c, &st0) == 0, "stats");
	for (int li = 0; li < 2; li++) {
		struct skv_cache *kc[2] = {NULL, NULL}; /* GPU arena, host arena */
		char *gb[2] = {abase, NULL};
		uint32_t kept = e.pl->kept, cap = kept + GP_RESERVE;
		unsigned bad = 0;

		d->out_layout = lay[li];
		d->decode_reserve = GP_RESERVE;
		for (int a = 0; a < 2; a++) {
			d->out_arena = a ? SKV_ARENA_HOST : SKV_ARENA_CUDA;
			r = skv_client_compact(c, d, &kc[a]);
			EXPECT(r == 0, "compact (layout %d, arena %d): %d (%s)", lay[li], a, r,
			       skv_client_error(c));
			if (r < 0)
				return;
		}
		EXPECT(skv_cache_info(kc[0])->kv_arena == SKV_ARENA_CUDA, "kv_arena");
		for (int a = 0; a < 2; a++) {
			e.g = GP_RESERVE;
			EXPECT(gp_decode(kc[a], gb[a], 0, GP_RESERVE) == 0, "decode");
			EXPECT(skv_cache_append(kc[a], 1) == -ENOSPC, "append past the headroom");
			r = skv_cache_grow(kc[a], 3);
			EXPECT(r == 0, "GROW by 3 (arena %d): %d (%s)", a, r, skv_client_error(c));
			bad += gp_check(kc[a], gb[a], cap + 3, &e);
			EXPECT(gp_decode(kc[a], gb[a], GP_RESERVE, GP_RESERVE + 3) == 0, "decode");
			e.g = GP_RESERVE + 3;
			r = skv_cache_grow(kc[a], 4);
			EXPECT(r == 0, "GROW by 4 (arena %d): %d (%s)", a, r, skv_client_error(c));
			bad += gp_check(kc[a], gb[a], cap + 7, &e);
		}
		/* errors on the GPU-arena cache: refused, the cache as it was */
		const struct skv_cache_info *ci = skv_cache_info(kc[0]);
		uint64_t slot_b = (uint64_t)ci->layers * ci->h_store * (2 * ci->head_dim * 4 + 4);
		r = skv_cache_grow(kc[0], 0);
		EXPECT(r == -EINVAL, "GROW by 0: %d", r);
		r = skv_cache_grow(kc[0], 1u << 24);
		EXPECT(r == -E2BIG, "GROW past max_reserve: %d (%s)", r, skv_client_error(c));
		r = skv_cache_grow(kc[0], (uint32_t)((52u << 20) / slot_b));
		EXPECT(r == -EDQUOT && strstr(skv_client_error(c), "quota"),
		       "GROW to 52 MB, quota 40 MB: %d (%s)", r, skv_client_error(c));
		r = skv_cache_grow(kc[0], (uint32_t)((100u << 20) / slot_b));
		EXPECT(r == -ENOSPC && strstr(skv_client_error(c), "pool exhausted"),
		       "GROW to 100 MB, pool 64 MB: %d (%s)", r, skv_client_error(c));
		bad += gp_check(kc[0], abase, cap + 7, &e);
		/* and it still serves: one more decode row in the headroom */
		EXPECT(gp_decode(kc[0], abase, e.g, e.g + 1) == 0, "decode after the errors");
		e.g++;
		bad += gp_check(kc[0], abase, cap + 7, &e);
		e.g = e0->g;
		EXPECT(bad == 0, "layout %d: %u positions/K/V elements differ", lay[li], bad);
		printf("engine: GROW %s, K/V in the GPU arena: 2 GROWs, %u decode rows, kept %u: "
		       "%s\n",
		       li ? "NHD" : "HND", GP_RESERVE + 4, kept,
		       bad ? "DIFFERENT" : "equal to the host arena and the reference");
		for (int a = 0; a < 2; a++)
			EXPECT(skv_cache_release(kc[a]) == 0, "release");
	}
	d->out_layout = SKV_LAYOUT_UNSPECIFIED;
	d->decode_reserve = 0;
	d->out_arena = SKV_ARENA_HOST;
	EXPECT(skv_client_stats(c, &st1) == 0, "stats");
	EXPECT(st1.pool_used == st0.pool_used && st1.arena_used == st0.arena_used,
	       "pool %llu -> %llu bytes, arena %llu -> %llu", (unsigned long long)st0.pool_used,
	       (unsigned long long)st1.pool_used, (unsigned long long)st0.arena_used,
	       (unsigned long long)st1.arena_used);
	printf("engine: GROW errors -EINVAL, -E2BIG, -EDQUOT, -ENOSPC left the cache intact; "
	       "pool %llu bytes as before: %s\n",
	       (unsigned long long)st1.pool_used, fails ? "FAILED" : "ok");
}

/* K/V of every layer in vLLM's paged layout [block][token][head][dim]:
 * logical token j of head h at block bt[j / BS], row j % BS */
static void gp_page(const float *hkv, const int32_t *bt, float *paged)
{
	const size_t blk = (size_t)GP_BS * HKV * HD, kv_elems = (size_t)LAYERS * HKV * LEN * HD;

	for (int kv = 0; kv < 2; kv++)
		for (int l = 0; l < LAYERS; l++)
			for (uint32_t h = 0; h < HKV; h++)
				for (uint32_t j = 0; j < LEN; j++)
					memcpy(paged + (size_t)kv * LAYERS * GP_NB * blk +
						   (size_t)l * GP_NB * blk + bt[j / GP_BS] * blk +
						   ((size_t)(j % GP_BS) * HKV + h) * HD,
					       hkv + kv * kv_elems +
						   ((size_t)l * HKV + h) * LEN * HD +
						   (size_t)j * HD,
					       HD * 4);
}

/* d's K/V paged in buffer b at byte 0, with table bt */
static void gp_paged_desc(struct skv_compact_desc *d, struct skv_layer_ref *lr,
			  const struct skv_buffer *b, const int32_t *bt)
{
	const size_t blk = (size_t)GP_BS * HKV * HD;

	for (int l = 0; l < LAYERS; l++) {
		struct skv_tensor_ref t = {.buf = b,
					   .dtype = SKV_DTYPE_F32,
					   .head_stride = HD,
					   .token_stride = HKV * HD,
					   .block_size = GP_BS,
					   .block_stride = (int64_t)blk};
		lr[l].k = t, lr[l].k.offset = (size_t)l * GP_NB * blk * 4;
		lr[l].v = t, lr[l].v.offset = ((size_t)LAYERS + l) * GP_NB * blk * 4;
	}
	d->block_table = bt;
	d->n_blocks = GP_NB;
}

/*
 * Paged K/V through the CUDA backend: in a memfd buffer (host-mapped for the
 * GPU) and in an engine VMM buffer (cuda-vmm-fd), the block table shuffled;
 * the compact cache must be the strided reference's. Out-of-range and
 * negative entries, and a short table, are refused before any work, the pool
 * untouched, and the next request served.
 */
static void gp_paged_out(struct skv_client *c, struct skv_cuda_dev *dev,
			 const struct skv_compact_desc *d0, const struct skv_buffer *in,
			 char *abase, const struct gp_expect *e);

static void gp_paged(struct skv_client *c, struct skv_cuda_dev *dev, struct skv_compact_desc *d0,
		     struct skv_layer_ref *lr0, const float *hkv, char *abase,
		     const struct gp_expect *e, const float *om)
{
	static const int32_t bt[GP_NB] = {4, 0, 5, 2, 1, 3};
	const size_t paged_b = 2 * (size_t)LAYERS * GP_NB * GP_BS * HKV * HD * 4;
	struct skv_layer_ref lr[LAYERS];
	struct skv_compact_desc d = *d0;
	struct skv_buffer *bm = NULL, *bv = NULL;
	struct skv_cuda_arena *vmem = NULL;
	struct skv_error err = {0};
	struct skv_stats st0, st1;
	int32_t bad_bt[GP_NB];
	float *paged = calloc(paged_b / 4, 4);
	int fd = -1, r;

	memcpy(lr, lr0, sizeof(lr));
	d.layer = lr;
	gp_page(hkv, bt, paged);
	if (skv_buffer_alloc(c, paged_b, &bm) < 0 ||
	    skv_cuda_arena_new(dev, paged_b, &vmem, &err) < 0 ||
	    skv_cuda_arena_export_fd(vmem, &fd, &err) < 0 ||
	    cudaMemcpy(skv_cuda_arena_ptr(vmem), paged, paged_b, cudaMemcpyHostToDevice) !=
		cudaSuccess ||
	    cudaDeviceSynchronize() != cudaSuccess ||
	    skv_buffer_register_cuda_fd(c, fd, skv_cuda_arena_size(vmem), 0, &bv) < 0) {
		EXPECT(0, "paged buffers: %s / %s", skv_client_error(c), err.msg);
		goto out;
	}
	memcpy(skv_buffer_data(bm), paged, paged_b);
	EXPECT(skv_client_stats(c, &st0) == 0, "stats");
	for (int b = 0; b < 2; b++) {
		const struct skv_buffer *buf = b ? bv : bm;
		const char *name = b ? "cuda-vmm-fd" : "memfd";
		unsigned bad = 0;

		gp_paged_desc(&d, lr, buf, bt);
		for (int a = 0; a < 2; a++) {
			struct skv_cache *k = NULL;

			d.out_arena = a ? SKV_ARENA_CUDA : SKV_ARENA_HOST;
			r = skv_client_compact(c, &d, &k);
			EXPECT(r == 0, "paged %s compaction: %d (%s)", name, r,
			       skv_client_error(c));
			if (r < 0)
				continue;
			bad +=
			    gp_check(k, a ? abase : NULL, e->pl->kept, e) + gp_mass(k, e->pl, om);
			skv_cache_release(k);
		}
		d.out_arena = SKV_ARENA_HOST;
		printf("engine: paged %s K/V (blocks of %d, table %d %d %d %d %d %d): %s\n", name,
		       GP_BS, bt[0], bt[1], bt[2], bt[3], bt[4], bt[5],
		       bad ? "DIFFERENT" : "equal to the host result, host and GPU arena");
		EXPECT(bad == 0, "paged %s: %u positions/K/V elements/masses differ", name, bad);
		/* refused before anything is queued */
		struct skv_cache *k = NULL;
		memcpy(bad_bt, bt, sizeof(bad_bt));
		bad_bt[3] = 1 << 20;
		gp_paged_desc(&d, lr, buf, bad_bt);
		r = skv_client_compact(c, &d, &k);
		EXPECT(r == -ERANGE && strstr(skv_client_error(c), "reaches byte"),
		       "%s: entry 1<<20: %d (%s)", name, r, skv_client_error(c));
		printf("engine: paged %s, block table entry %d: %s\n", name, bad_bt[3],
		       skv_client_error(c));
		bad_bt[3] = -2;
		r = skv_client_compact(c, &d, &k);
		EXPECT(r == -EINVAL && strstr(skv_client_error(c), "negative"),
		       "%s: entry -2: %d (%s)", name, r, skv_client_error(c));
		bad_bt[3] = bt[3];
		d.n_blocks = GP_NB - 1;
		r = skv_client_compact(c, &d, &k);
		EXPECT(r == -EINVAL && strstr(skv_client_error(c), "blocks needed"),
		       "%s: short table: %d (%s)", name, r, skv_client_error(c));
	}
	EXPECT(skv_client_stats(c, &st1) == 0, "stats");
	EXPECT(st1.pool_used == st0.pool_used && st1.arena_used == st0.arena_used,
	       "pool %llu -> %llu bytes, arena %llu -> %llu", (unsigned long long)st0.pool_used,
	       (unsigned long long)st1.pool_used, (unsigned long long)st0.arena_used,
	       (unsigned long long)st1.arena_used);
	/* and the next request is served */
	gp_paged_desc(&d, lr, bv, bt);
	{
		struct skv_cache *k = NULL;

		r = skv_client_compact(c, &d, &k);
		EXPECT(r == 0 && gp_check(k, NULL, e->pl->kept, e) + gp_mass(k, e->pl, om) == 0,
		       "paged after the refusals: %d (%s)", r, skv_client_error(c));
		if (r == 0)
			skv_cache_release(k);
	}
	printf("engine: paged: out-of-range -ERANGE, negative and short table -EINVAL; pool %llu "
	       "bytes as before; served after: %s\n",
	       (unsigned long long)st1.pool_used, fails ? "FAILED" : "ok");
	gp_paged_out(c, dev, d0, bm, abase, e);
out:
	skv_buffer_free(bv);
	skv_buffer_free(bm);
	if (fd >= 0)
		close(fd);
	skv_cuda_arena_free(vmem);
	free(paged);
}

/*
 * Paged output (SNAPKV_1.5) through the CUDA backend, from the paged memfd
 * input: blocks of 4 in the host arena and in the GPU arena, and written
 * back into a writable engine VMM buffer at blocks the engine names; every
 * row and position the strided reference's.
 */
static void gp_paged_out(struct skv_client *c, struct skv_cuda_dev *dev,
			 const struct skv_compact_desc *d0, const struct skv_buffer *in,
			 char *abase, const struct gp_expect *e)
{
	static const int32_t bt[GP_NB] = {4, 0, 5, 2, 1, 3};
	enum { OBS = 4, ONB = 16 };
	const size_t oblk = (size_t)OBS * e->pl->h_store * HD * 4;
	struct skv_layer_ref lr[LAYERS];
	struct skv_layer_out_ref ol[LAYERS];
	struct skv_compact_desc d = *d0;
	struct skv_cuda_arena *wmem = NULL;
	struct skv_buffer *wb = NULL;
	struct skv_error err = {0};
	int32_t otab[ONB];
	unsigned bad = 0;
	int fd = -1, r;

	memcpy(lr, d0->layer, sizeof(lr)); /* the window queries */
	gp_paged_desc(&d, lr, in, bt);
	d.layer = lr;
	d.out_layout = SKV_LAYOUT_PAGED;
	d.out_block_size = OBS;
	for (int a = 0; a < 2; a++) {
		struct skv_cache *k = NULL;

		d.out_arena = a ? SKV_ARENA_CUDA : SKV_ARENA_HOST;
		r = skv_client_compact(c, &d, &k);
		EXPECT(r == 0, "paged output, %s arena: %d (%s)", a ? "GPU" : "host", r,
		       skv_client_error(c));
		if (r == 0) {
			bad += gp_check(k, a ? abase : NULL, e->pl->kept, e);
			skv_cache_release(k);
		}
	}
	if (skv_cuda_arena_new(dev, 2 * LAYERS * ONB * oblk, &wmem, &err) < 0 ||
	    skv_cuda_arena_export_fd(wmem, &fd, &err) < 0 ||
	    skv_buffer_register_cuda_fd_flags(c, fd, skv_cuda_arena_size(wmem), 0,
					      SKV_BUFFER_WRITABLE, &wb) < 0) {
		EXPECT(0, "writeback buffer: %s / %s", skv_client_error(c), err.msg);
		goto out;
	}
	for (int i = 0; i < ONB; i++)
		otab[i] = (i * 5 + 3) % ONB;
	for (int l = 0; l < LAYERS; l++) {
		struct skv_tensor_ref t = {.buf = wb,
					   .dtype = SKV_DTYPE_F32,
					   .head_stride = HD,
					   .token_stride = (int64_t)e->pl->h_store * HD,
					   .block_stride = (int64_t)oblk / 4};
		ol[l].k = t, ol[l].k.offset = (size_t)(2 * l) * ONB * oblk;
		ol[l].v = t, ol[l].v.offset = (size_t)(2 * l + 1) * ONB * oblk;
	}
	d.out_arena = SKV_ARENA_HOST;
	d.out_dest = SKV_OUT_WRITEBACK;
	d.out_layer = ol;
	d.out_block_table = otab;
	d.out_n_blocks = (e->pl->kept + OBS - 1) / OBS;
	{
		struct skv_cache *k = NULL;

		r = skv_client_compact(c, &d, &k);
		EXPECT(r == 0, "paged writeback into a VMM buffer: %d (%s)", r,
		       skv_client_error(c));
		if (r == 0) {
			bad += gp_check(k, skv_cuda_arena_ptr(wmem), e->pl->kept, e);
			/* GROW of a writeback cache past its blocks needs the
			 * engine's new blocks (skv_cache_grow_blocks): refused
			 * without them, the cache unchanged */
			EXPECT(skv_cache_grow(k, (uint32_t)(ONB * OBS)) == -EINVAL &&
				   strstr(skv_client_error(c), "new destination blocks"),
			       "GROW of a writeback cache without blocks: %s", skv_client_error(c));
			skv_cache_release(k);
		}
	}
	printf("engine: paged output (blocks of %d) in the host arena, the GPU arena and written "
	       "back into an engine VMM buffer: %s\n",
	       OBS, bad ? "DIFFERENT" : "equal to the host result");
	EXPECT(bad == 0, "paged output: %u positions/K/V elements differ", bad);
out:
	skv_buffer_free(wb);
	if (fd >= 0)
		close(fd);
	skv_cuda_arena_free(wmem);
}

/*
 * --grow-fail (emulator with SKV_EMU_FAIL_COPY2D set in the daemon: every
 * 2-D device copy fails): a GROW of an HND cache in the GPU arena fails with
 * -EIO, the cache as it was (capacity, positions, rows), still usable, and
 * the pool back at its baseline after the release.
 */
static void gp_grow_fail(struct skv_client *c, struct skv_compact_desc *d, char *abase,
			 const struct gp_expect *e0)
{
	struct gp_expect e = *e0;
	struct skv_cache *k = NULL;
	struct skv_stats st0, st1;
	unsigned bad = 0;
	int r;

	EXPECT(skv_client_stats(c, &st0) == 0, "stats");
	d->out_layout = SKV_LAYOUT_HND;
	d->decode_reserve = GP_RESERVE;
	d->out_arena = SKV_ARENA_CUDA;
	r = skv_client_compact(c, d, &k);
	EXPECT(r == 0, "compact: %d (%s)", r, skv_client_error(c));
	if (r < 0)
		return;
	EXPECT(gp_decode(k, abase, 0, 1) == 0, "decode");
	e.g = 1;
	r = skv_cache_grow(k, 8);
	EXPECT(r == -EIO && strstr(skv_client_error(c), "GROW in the GPU arena"),
	       "GROW with a failing copy: %d (%s)", r, skv_client_error(c));
	printf("engine: GROW with a failing device copy: %d (%s)\n", r, skv_client_error(c));
	bad += gp_check(k, abase, e.pl->kept + GP_RESERVE, &e);
	EXPECT(gp_decode(k, abase, 1, GP_RESERVE) == 0, "decode after the failed GROW");
	e.g = GP_RESERVE;
	bad += gp_check(k, abase, e.pl->kept + GP_RESERVE, &e);
	EXPECT(bad == 0, "%u positions/K/V elements differ after the failed GROW", bad);
	EXPECT(skv_cache_release(k) == 0, "release");
	EXPECT(skv_client_stats(c, &st1) == 0, "stats");
	EXPECT(st1.pool_used == st0.pool_used && st1.arena_used == st0.arena_used,
	       "pool %llu -> %llu bytes, arena %llu -> %llu", (unsigned long long)st0.pool_used,
	       (unsigned long long)st1.pool_used, (unsigned long long)st0.arena_used,
	       (unsigned long long)st1.arena_used);
	printf("engine: failed GROW: the cache as it was and usable, pool %llu bytes as before: "
	       "%s\n",
	       (unsigned long long)st1.pool_used, fails ? "FAILED" : "ok");
}

static int run_grow_paged(const char *sock, struct skv_cuda_dev *dev, bool fail_copy)
{
	const size_t kv_elems = (size_t)LAYERS * HKV * LEN * HD,
		     q_elems = (size_t)LAYERS * HQ * WIN * HD;
	const size_t kv_bytes = 2 * kv_elems * 4, q_bytes = q_elems * 4;
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[LAYERS];
	struct skv_compact_desc d = {.desc_size = sizeof(d)};
	struct skv_cuda_import *ai = NULL;
	struct skv_error err = {0};
	struct skv_plan pl;
	struct rng rg = {777};
	float *ok = NULL, *ov = NULL, *om = NULL;
	int32_t *op = NULL;
	int afd = -1, r;
	uint64_t asz = 0;

	r = skv_client_connect(sock, NULL, &c);
	if (r < 0) {
		fprintf(stderr, "engine: connect %s: %s\n", sock, strerror(-r));
		return 1;
	}
	/* strided K/V then Q in one memfd buffer */
	float *hkv = rand_tensor(&rg, SKV_DTYPE_F32, 2 * kv_elems, 1.0f);
	float *hq = rand_tensor(&rg, SKV_DTYPE_F32, q_elems, 1.0f);
	if (skv_buffer_alloc(c, kv_bytes + q_bytes, &b) < 0) {
		fprintf(stderr, "engine: memfd buffer: %s\n", skv_client_error(c));
		return 1;
	}
	memcpy(skv_buffer_data(b), hkv, kv_bytes);
	memcpy((char *)skv_buffer_data(b) + kv_bytes, hq, q_bytes);
	fill_desc(&d, lr, b, b, kv_bytes);
	if (gp_reference(&d, hkv, hq, &pl, &ok, &ov, &om, &op) < 0) {
		fprintf(stderr, "engine: host reference failed\n");
		return 1;
	}
	r = skv_client_cuda_arena(c, &afd, &asz, NULL);
	if (r < 0 || skv_cuda_import_fd(dev, 1, 1, afd, asz, &ai, &err) < 0) {
		fprintf(stderr, "engine: GPU arena: %s %s\n", skv_client_error(c), err.msg);
		return 1;
	}
	close(afd);
	struct gp_expect e = {.pl = &pl, .ok = ok, .ov = ov, .op = op, .g = 0};
	if (fail_copy) {
		gp_grow_fail(c, &d, skv_cuda_import_ptr(ai), &e);
	} else {
		gp_grow(c, &d, skv_cuda_import_ptr(ai), &e);
		gp_paged(c, dev, &d, lr, hkv, skv_cuda_import_ptr(ai), &e, om);
	}
	skv_cuda_import_release(ai);
	skv_buffer_free(b);
	skv_client_close(c);
	free(ok), free(ov), free(om), free(op), free(hkv), free(hq);
	printf("engine: grow/paged: %d failures\n", fails);
	return fails ? 1 : 0;
}

/* A mass-mode compaction in decision group `key` of 2: both members report
 * the group's C* (the larger of their own), on whichever device each is. */
static void engine_group(struct skv_client *c, const struct skv_compact_desc *d, const char *key)
{
	struct skv_compact_desc gd = *d;
	struct skv_cache_budget cb = {.budget_size = sizeof(cb)};
	struct skv_cache *gk = NULL;
	int r;

	skv_params_init(&gd.params); /* the budget modes' size */
	gd.params.window = d->params.window;
	gd.params.kernel = d->params.kernel;
	gd.params.budget_mode = SKV_BUDGET_MASS;
	gd.params.tau = 0.6f;
	gd.params.c_min = 16;
	gd.params.c_max = 64;
	gd.params.c_step = 8;
	gd.group_key = key;
	gd.group_size = 2;
	gd.group_timeout_ms = 120000; /* the emulated GPU takes seconds */
	r = skv_client_compact(c, &gd, &gk);
	EXPECT(r == 0, "group %s: %d (%s)", key, r, skv_client_error(c));
	if (r < 0)
		return;
	EXPECT(skv_cache_budget(gk, &cb) == 0 && cb.group_size == 2, "group %s: group_size %u", key,
	       cb.group_size);
	printf("engine: group %s: C* %u, fallback %d, group of %u\n", key, cb.c_star, cb.fallback,
	       cb.group_size);
	skv_cache_release(gk);
}

int main(int argc, char **argv)
{
	const char *sock = argc > 1 ? argv[1] : NULL, *hold = NULL;
	const char *hang = NULL;
	bool enotsup = false, generations = false, grow_paged = false, grow_fail = false;
	bool quick = false;
	int device = -1, mixed = -1;
	const char *group = NULL;
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
		else if (!strcmp(argv[i], "--grow-paged"))
			grow_paged = true;
		else if (!strcmp(argv[i], "--grow-fail"))
			grow_fail = true;
		else if (!strcmp(argv[i], "--hold") && i + 1 < argc)
			hold = argv[++i];
		else if (!strcmp(argv[i], "--event-hang") && i + 1 < argc)
			hang = argv[++i];
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--mixed") && i + 1 < argc)
			mixed = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--quick"))
			quick = true;
		else if (!strcmp(argv[i], "--group") && i + 1 < argc)
			group = argv[++i];
		else
			sock = NULL;
	}
	if (!sock) {
		fprintf(stderr,
			"usage: gpu-engine SOCKET [--enotsup | --generations | --grow-paged | "
			"--grow-fail | --event-hang DIR] [--device N] [--quick] [--mixed M] "
			"[--group KEY] "
			"[--hold DIR]\n");
		return 2;
	}
	/* the engine's own device memory, through the plugin's VMM allocator */
	if (skv_cuda_dev_open(device, &dev, &err) < 0) {
		fprintf(stderr, "engine: %s\n", err.msg);
		return 1;
	}
	if (generations)
		return run_generations(sock, dev);
	if (grow_paged || grow_fail)
		return run_grow_paged(sock, dev, grow_fail);
	const size_t kv_elems = (size_t)LAYERS * HKV * LEN * HD,
		     q_elems = (size_t)LAYERS * HQ * WIN * HD;
	const size_t kv_bytes = 2 * kv_elems * 4, q_bytes = q_elems * 4;
	if (skv_cuda_arena_new(dev, kv_bytes, &kvmem, &err) < 0 ||
	    skv_cuda_arena_export_fd(kvmem, &fd, &err) < 0) {
		fprintf(stderr, "engine: VMM allocation: %s\n", err.msg);
		return 1;
	}
	char *dkv = skv_cuda_arena_ptr(kvmem), *dq = NULL;
	struct skv_cuda_info info;
	skv_cuda_dev_info(dev, &info);
	device = info.device;
	/* --mixed: the window on another device than the K/V */
	CK(cudaSetDevice(mixed >= 0 ? mixed : device));
	/* 64 KiB at least: the emulator exports only memfd-backed allocations */
	CK(cudaMalloc((void **)&dq, Q_OFF + q_bytes < (64u << 10) ? (64u << 10) : Q_OFF + q_bytes));
	CK(cudaSetDevice(device));
	cudaIpcMemHandle_t mh;
	CK(cudaIpcGetMemHandle(&mh, dq));

	/* a group member's data differs with its device (its own C* too) */
	struct rng rg = {4242 + (group && device > 0 ? (uint64_t)device : 0)};
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
	r = skv_buffer_register_cuda_fd(c, fd, skv_cuda_arena_size(kvmem), device, &bkv);
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
	r = skv_buffer_register_cuda_ipc(c, &mh, Q_OFF, q_bytes, mixed >= 0 ? mixed : device, &bq);
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
	if (mixed >= 0) {
		struct skv_cache *mc = NULL;

		r = skv_client_compact(c, &d, &mc);
		EXPECT(r == -EXDEV && strstr(skv_client_error(c), "must all be on one device"),
		       "K/V on device %d, window on device %d: %d (%s)", device, mixed, r,
		       skv_client_error(c));
		printf("engine: K/V on device %d, window on device %d: %s\n", device, mixed,
		       skv_client_error(c));
		goto out;
	}
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
	if (group)
		engine_group(c, &d, group);
	/* the flag: the first word after the K/V, inside the registered VMM buffer */
	if (!quick) {
		prefill_waits(c, &d, bkv, kv_bytes, dkv + kv_bytes, &pl, ok, ov, om, op);
		event_waits(c, &d, dev, dkv, kv_bytes, hkv, &pl, ok, ov, om, op);
	}

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
	r = skv_cache_grow(gcache, 4);
	EXPECT(r == 0, "GROW of a GPU-arena cache: %d (%s)", r, skv_client_error(c));

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
