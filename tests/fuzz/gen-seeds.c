// SPDX-License-Identifier: MIT
/*
 * gen-seeds - writes the fuzzers' seed corpora: small valid inputs of each
 * kind, one a file, under DIR/<target>/:
 *   frame/        real frames of every message type (header + protobuf), as
 *                 libsnapkv, snapkvctl and the daemon send them, with fds
 *   ring/         ring layouts the daemon computes, with honest and lying
 *                 indices and SQEs naming argument slots
 *   request/      COMPACT requests (the Request message alone, as in a ring
 *                 slot) small enough for fuzz-request's limits: strided HND
 *                 and NHD, paged, every policy, f32/f16/bf16, protected ranges
 *   compact-diff/ fuzz-compact-diff's own encoding of a request: ordinary
 *                 ones of each policy and budget mode, and the two zero-width
 *                 mass ranking requests that once killed snapkvd (issue 24)
 *   safetensors/  tiny files from libskvst's own writer (a prefill dump, metadata)
 *   gguf/         tiny GGUF v3 files (Llama keys, a vocabulary, F32 tensors)
 * The config seeds are the sample systemd/snapkvd.conf and a variant with
 * every key set (tests/fuzz/build.mk copies them). Deterministic output:
 * `make fuzz-seeds` regenerates the committed corpus byte for byte.
 *
 *   gen-seeds DIR
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "proto/skv-frame.h"
#include "proto/skv-ring.h"
#include "proto/snapkv.pb-c.h"
#include "skv-safetensors.h"

static const char *out_dir;

static int put(const char *target, const char *name, const void *p, size_t n)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", out_dir, target);
	if (mkdir(path, 0755) < 0 && errno != EEXIST)
		return -errno;
	snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
	f = fopen(path, "wb");
	if (!f)
		return -errno;
	if (n && fwrite(p, 1, n, f) != n) {
		fclose(f);
		return -EIO;
	}
	return fclose(f) ? -errno : 0;
}

/* ---- frames: byte 0 says how many fds ride along, then header + payload */

static int frame(const char *name, uint16_t type, const ProtobufCMessage *m, unsigned fds)
{
	static uint8_t buf[1 + SKV_FRAME_HDR_SIZE + 65536];
	struct skv_frame_hdr h = {SKV_FRAME_MAGIC, SKV_PROTO_VERSION, type, 0, 0};
	size_t n = protobuf_c_message_get_packed_size(m);

	if (n > sizeof(buf) - 1 - SKV_FRAME_HDR_SIZE)
		return -EMSGSIZE;
	protobuf_c_message_pack(m, buf + 1 + SKV_FRAME_HDR_SIZE);
	h.length = (uint32_t)n;
	skv_frame_hdr_encode(&h, buf + 1);
	/* fds sent (bits 0-2), room the receiver has (bits 3-5) */
	buf[0] = (uint8_t)(fds | (fds ? 4u : 0u) << 3);
	return put("frame", name, buf, 1 + SKV_FRAME_HDR_SIZE + n);
}

static int frames(void)
{
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	Snapkv__V1__Hello admin = SNAPKV__V1__HELLO__INIT;
	Snapkv__V1__RegisterBuffer reg = SNAPKV__V1__REGISTER_BUFFER__INIT;
	Snapkv__V1__RegisterBuffer ipc = SNAPKV__V1__REGISTER_BUFFER__INIT;
	Snapkv__V1__Unregister unreg = SNAPKV__V1__UNREGISTER__INIT;
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__AdminRequest aps = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__PressureSettings ps = SNAPKV__V1__PRESSURE_SETTINGS__INIT;
	Snapkv__V1__CudaArenaRequest car = SNAPKV__V1__CUDA_ARENA_REQUEST__INIT;
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__CompactRequest cr = SNAPKV__V1__COMPACT_REQUEST__INIT;
	Snapkv__V1__Params pm = SNAPKV__V1__PARAMS__INIT;
	Snapkv__V1__Range rg = SNAPKV__V1__RANGE__INIT, *rgp = &rg;
	Snapkv__V1__TensorRef tq = SNAPKV__V1__TENSOR_REF__INIT, tk = SNAPKV__V1__TENSOR_REF__INIT,
			      tv = SNAPKV__V1__TENSOR_REF__INIT;
	Snapkv__V1__LayerRef lr = SNAPKV__V1__LAYER_REF__INIT, *lrs[2] = {&lr, &lr};
	Snapkv__V1__PrefillWait pw = SNAPKV__V1__PREFILL_WAIT__INIT;
	Snapkv__V1__AppendRequest app = SNAPKV__V1__APPEND_REQUEST__INIT;
	Snapkv__V1__GrowRequest grow = SNAPKV__V1__GROW_REQUEST__INIT;
	Snapkv__V1__ReleaseRequest rel = SNAPKV__V1__RELEASE_REQUEST__INIT;
	Snapkv__V1__NopRequest nop = SNAPKV__V1__NOP_REQUEST__INIT;
	Snapkv__V1__StatsRequest sr = SNAPKV__V1__STATS_REQUEST__INIT;
	Snapkv__V1__Welcome wel = SNAPKV__V1__WELCOME__INIT;
	Snapkv__V1__RegisterReply rr = SNAPKV__V1__REGISTER_REPLY__INIT;
	Snapkv__V1__UnregisterReply ur = SNAPKV__V1__UNREGISTER_REPLY__INIT;
	Snapkv__V1__Response resp = SNAPKV__V1__RESPONSE__INIT;
	Snapkv__V1__CacheInfo ci = SNAPKV__V1__CACHE_INFO__INIT;
	Snapkv__V1__AdminReply arep = SNAPKV__V1__ADMIN_REPLY__INIT;
	Snapkv__V1__TenantInfo ti = SNAPKV__V1__TENANT_INFO__INIT, *tis = &ti;
	Snapkv__V1__CacheLedger cl = SNAPKV__V1__CACHE_LEDGER__INIT, *cls = &cl;
	Snapkv__V1__LedgerBytes lb = SNAPKV__V1__LEDGER_BYTES__INIT;
	Snapkv__V1__PressureInfo pi = SNAPKV__V1__PRESSURE_INFO__INIT;
	Snapkv__V1__PressureTransition pt = SNAPKV__V1__PRESSURE_TRANSITION__INIT, *pts = &pt;
	Snapkv__V1__ErrorNotice en = SNAPKV__V1__ERROR_NOTICE__INIT;
	Snapkv__V1__CudaArena ca = SNAPKV__V1__CUDA_ARENA__INIT;
	static uint8_t handle[64];
	int32_t table[8] = {3, 1, 4, 1, 5, 9, 2, 6};
	uint64_t offs[4] = {0, 4096, 8192, 12288};
	float mass[4] = {0.9f, 0.8f, 0.95f, 0.5f};
	int r = 0;

	hello.client_version = SKV_PROTO_VERSION;
	hello.name = "engine-a";
	hello.sq_entries = 64;
	r |= frame("hello", SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, &hello.base, 0);
	admin.client_version = SKV_PROTO_VERSION;
	admin.name = "snapkvctl";
	admin.admin = 1;
	r |= frame("hello-admin", SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, &admin.base, 0);
	reg.generation = 1;
	reg.size = 1 << 20;
	reg.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_MEMFD;
	r |= frame("register-memfd", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, &reg.base, 1);
	ipc.generation = 2;
	ipc.size = 1 << 21;
	ipc.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
	ipc.ipc_handle = (ProtobufCBinaryData){sizeof(handle), handle};
	ipc.offset = 4096;
	ipc.device = 0;
	r |= frame("register-ipc", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, &ipc.base, 0);
	unreg.buffer_id = 1;
	r |= frame("unregister", SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER, &unreg.base, 0);
	r |= frame("cuda-arena", SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA, &car.base, 0);
	for (int k = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS;
	     k <= SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE; k++) {
		char nm[32];

		ar.kind = k;
		snprintf(nm, sizeof(nm), "admin-%d", k);
		r |= frame(nm, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, &ar.base, 0);
	}
	aps.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET;
	ps.high = "60%";
	ps.high_leave = "50%";
	ps.critical = "90%";
	ps.actions = "notify,hooks,scale,evict,refuse";
	ps.scale_high = "0.5";
	aps.pressure = &ps;
	r |= frame("admin-pressure-set", SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, &aps.base, 0);

	/* a strided two-layer compaction, as libsnapkv builds it */
	tq.buffer_id = tk.buffer_id = tv.buffer_id = 1;
	tq.dtype = tk.dtype = tv.dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
	tq.head_stride = 32 * 64;
	tq.token_stride = 64;
	tk.offset = 8 * 32 * 64 * 4;
	tk.head_stride = 1024 * 64;
	tk.token_stride = 64;
	tv = tk;
	tv.offset = tk.offset + 2 * 1024 * 64 * 4;
	lr.q = &tq;
	lr.k = &tk;
	lr.v = &tv;
	pm.window = 32;
	pm.capacity = 256;
	pm.gqa = SNAPKV__V1__GQA__GQA_GROUP;
	rg.begin = 0;
	rg.end = 4;
	pm.n_protected_ranges = 1;
	pm.protected_ranges = &rgp;
	pm.explicit_fields = SKV_PARAMS_EXPLICIT_ALL;
	cr.layers = 2;
	cr.h_q = 8;
	cr.h_kv = 2;
	cr.head_dim = 64;
	cr.prompt_len = 1024;
	cr.n_q = 32;
	cr.params = &pm;
	cr.n_layer = 2;
	cr.layer = lrs;
	cr.out_layout = SNAPKV__V1__LAYOUT__LAYOUT_HND;
	cr.decode_reserve = 16;
	req.op_case = SNAPKV__V1__REQUEST__OP_COMPACT;
	req.compact = &cr;
	req.user_data = 7;
	r |= frame("request-compact", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, 0);
	/* paged: block tables, NHD out, a prefill wait */
	tk.block_size = tv.block_size = 16;
	tk.block_stride = tv.block_stride = 16 * 2 * 64;
	tk.head_stride = tv.head_stride = 64;
	tk.token_stride = tv.token_stride = 2 * 64;
	cr.prompt_len = 128;
	cr.n_block_table = 8;
	cr.block_table = table;
	cr.out_layout = SNAPKV__V1__LAYOUT__LAYOUT_NHD;
	pw.kind = SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_FLAG;
	pw.buffer_id = 2;
	pw.offset = 64;
	pw.value = 3;
	cr.prefill_wait = &pw;
	r |= frame("request-paged", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, 0);
	app.cache_id = 5;
	app.tokens = 1;
	req.op_case = SNAPKV__V1__REQUEST__OP_APPEND;
	req.append = &app;
	r |= frame("request-append", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, 0);
	grow.cache_id = 5;
	grow.extra = 16;
	req.op_case = SNAPKV__V1__REQUEST__OP_GROW;
	req.grow = &grow;
	r |= frame("request-grow", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, 0);
	rel.cache_id = 5;
	rel.linger = 1;
	req.op_case = SNAPKV__V1__REQUEST__OP_RELEASE;
	req.release = &rel;
	r |= frame("request-release", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, 0);
	req.op_case = SNAPKV__V1__REQUEST__OP_NOP;
	req.nop = &nop;
	r |= frame("request-nop", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, 0);
	req.op_case = SNAPKV__V1__REQUEST__OP_STATS;
	req.stats = &sr;
	r |= frame("request-stats", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req.base, 0);

	/* the daemon's side, as libsnapkv and snapkvctl receive it */
	wel.server_version = SKV_PROTO_VERSION;
	wel.session_id = 3;
	wel.tenant = "root";
	wel.ring_bytes = 1 << 16;
	wel.arena_bytes = 1 << 30;
	wel.features = SKV_RING_F_KNOWN;
	wel.backend = "host";
	r |= frame("welcome", SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME, &wel.base, 4);
	rr.buffer_id = 1;
	rr.generation = 1;
	rr.size = 1 << 20;
	rr.transport = "memfd";
	r |= frame("register-reply", SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY, &rr.base, 0);
	ur.status = -ENOENT;
	ur.error = "no such buffer";
	r |=
	    frame("unregister-reply", SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY, &ur.base, 0);
	ci.cache_id = 5;
	ci.layers = 2;
	ci.h_store = 2;
	ci.head_dim = 64;
	ci.dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
	ci.kept = 256;
	ci.capacity = 272;
	ci.n_k_offset = ci.n_v_offset = ci.n_pos_offset = 2;
	ci.k_offset = offs;
	ci.v_offset = offs + 1;
	ci.pos_offset = offs + 2;
	ci.n_retained_mass = 4;
	ci.retained_mass = mass;
	resp.user_data = 7;
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT_CACHE;
	resp.cache = &ci;
	r |= frame("response-cache", SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE, &resp.base, 0);
	resp.status = -EINVAL;
	resp.error = "layer 0: k: negative stride";
	resp.result_case = SNAPKV__V1__RESPONSE__RESULT__NOT_SET;
	r |= frame("response-error", SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE, &resp.base, 0);
	arep.version = "snapkvd 1.4";
	arep.backend = "host";
	arep.sessions = 2;
	arep.n_tenants = 1;
	arep.tenants = &tis;
	ti.name = "root";
	ti.bytes = &lb;
	lb.native_full = 1 << 22;
	lb.compact = 1 << 20;
	arep.n_caches = 1;
	arep.caches = &cls;
	cl.id = 5;
	cl.tenant = "root";
	cl.engine = "engine-a";
	cl.bytes = &lb;
	cl.transport = "memfd";
	arep.pool_bytes = &lb;
	pi.level = SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_HIGH;
	pi.high = "50%";
	pi.actions = "notify";
	pi.n_transitions = 1;
	pi.transitions = &pts;
	pt.level = SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_HIGH;
	pt.prev = SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_NORMAL;
	arep.pressure = &pi;
	arep.text = "snapkvd_pool_used_bytes 0\n";
	r |= frame("admin-reply", SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY, &arep.base, 0);
	en.status = -EUSERS;
	en.error = "too many sessions";
	r |= frame("error-notice", SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR, &en.base, 0);
	ca.status = -ENOTSUP;
	ca.error = "host backend";
	ca.transport = "cuda-vmm";
	r |=
	    frame("cuda-arena-reply", SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY, &ca.base, 1);
	return r;
}

/* ---- ring: layout, the peer's 4 indices, SQEs */

static int ring(const char *name, uint32_t sq, uint32_t cq, uint32_t slot, const uint32_t idx[4],
		unsigned n_sqe, uint32_t bad_slot)
{
	uint8_t buf[sizeof(struct skv_ring_layout) + 16 + 8 * sizeof(struct skv_sqe)];
	struct skv_ring_layout l;
	size_t n = 0;

	if (skv_ring_layout_init(&l, sq, cq, slot) < 0)
		return -EINVAL;
	memcpy(buf, &l, sizeof(l));
	n += sizeof(l);
	memcpy(buf + n, idx, 16);
	n += 16;
	for (unsigned i = 0; i < n_sqe && i < 8; i++) {
		struct skv_sqe e = {.opcode = i % 3 ? SKV_OP_REQUEST : SKV_OP_NOP,
				    .slot = i == 1 ? bad_slot : i,
				    .len = i == 2 ? slot + 1 : slot / 2,
				    .user_data = 100 + i};
		memcpy(buf + n, &e, sizeof(e));
		n += sizeof(e);
	}
	return put("ring", name, buf, n);
}

static int rings(void)
{
	const uint32_t honest[4] = {4, 0, 0, 0}, full[4] = {8, 0, 0, 8},
		       lie_tail[4] = {1000, 0, 0, 0}, lie_head[4] = {2, 5, 0xfffffff0u, 0},
		       wrap[4] = {2, 0xfffffffeu, 0xffffffffu, 0xffffffffu};
	int r = 0;

	r |= ring("honest", 8, 16, 256, honest, 4, 9);
	r |= ring("full-cq", 8, 8, 64, full, 8, 3);
	r |= ring("lying-tail", 8, 8, 128, lie_tail, 8, 0xffffffffu);
	r |= ring("lying-head", 4, 4, 64, lie_head, 2, 4);
	r |= ring("wrapped", 16, 16, 64, wrap, 2, 16);
	return r;
}

/* ---- request: tiny compactions over fuzz-request's buffers 1 (64 KiB) and 2 (4 KiB) */

struct tiny {
	const char *name;
	uint32_t layers, h_q, h_kv, d, L, n_q, W, C;
	int policy, gqa, nhd, paged, dtype, protect;
	/* budget mode (wire value, 0 = none), tau, the ladder; protect_end
	 * replaces protect's [2, 6) by [0, protect_end) */
	int budget;
	float tau;
	uint32_t c_min, c_max, c_step, protect_end;
};

static int request(const struct tiny *t)
{
	static uint8_t buf[4096];
	Snapkv__V1__Request req = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__CompactRequest cr = SNAPKV__V1__COMPACT_REQUEST__INIT;
	Snapkv__V1__Params pm = SNAPKV__V1__PARAMS__INIT;
	Snapkv__V1__Range rg = SNAPKV__V1__RANGE__INIT, *rgp = &rg;
	Snapkv__V1__TensorRef tq[2], tk[2], tv[2];
	Snapkv__V1__LayerRef lr[2], *lrs[2] = {&lr[0], &lr[1]};
	int32_t table[16];
	uint32_t es = t->dtype == SNAPKV__V1__DTYPE__D_TYPE_F32 ? 4 : 2, blk = 8;
	uint64_t off = 0;

	for (unsigned i = 0; i < 16; i++)
		table[i] = (int32_t)((i * 5) % 16);
	for (uint32_t l = 0; l < t->layers; l++) {
		snapkv__v1__tensor_ref__init(&tq[l]);
		snapkv__v1__tensor_ref__init(&tk[l]);
		snapkv__v1__tensor_ref__init(&tv[l]);
		snapkv__v1__layer_ref__init(&lr[l]);
		tq[l].buffer_id = tk[l].buffer_id = tv[l].buffer_id = 1;
		tq[l].dtype = tk[l].dtype = tv[l].dtype = t->dtype;
		tq[l].offset = off;
		tq[l].head_stride = (int64_t)t->n_q * t->d;
		tq[l].token_stride = t->d;
		off += (uint64_t)t->h_q * t->n_q * t->d * es;
		tk[l].offset = off;
		if (t->paged) {
			/* 16 blocks of [8 tokens][h_kv][D] */
			tk[l].block_size = blk;
			tk[l].block_stride = (int64_t)blk * t->h_kv * t->d;
			tk[l].token_stride = (int64_t)t->h_kv * t->d;
			tk[l].head_stride = t->d;
			off += 16ull * blk * t->h_kv * t->d * es;
		} else if (t->nhd) {
			tk[l].token_stride = (int64_t)t->h_kv * t->d;
			tk[l].head_stride = t->d;
			off += (uint64_t)t->h_kv * t->L * t->d * es;
		} else {
			tk[l].head_stride = (int64_t)t->L * t->d;
			tk[l].token_stride = t->d;
			off += (uint64_t)t->h_kv * t->L * t->d * es;
		}
		tv[l] = tk[l];
		tv[l].offset = off;
		off += tv[l].offset - tk[l].offset;
		lr[l].q = &tq[l];
		lr[l].k = &tk[l];
		lr[l].v = &tv[l];
	}
	pm.policy = t->policy;
	pm.window = t->W;
	pm.capacity = t->C;
	pm.gqa = t->gqa;
	pm.kernel = t->policy == 2 ? 1 : 5;
	pm.sinks = 2;
	pm.explicit_fields = SKV_PARAMS_EXPLICIT_ALL;
	if (t->protect) {
		rg.begin = t->protect_end ? 0 : 2;
		rg.end = t->protect_end ? t->protect_end : 6;
		pm.n_protected_ranges = 1;
		pm.protected_ranges = &rgp;
	}
	if (t->budget) {
		cr.budget_mode = (Snapkv__V1__BudgetMode)t->budget;
		cr.tau = t->tau;
		cr.c_min = t->c_min;
		cr.c_max = t->c_max;
		cr.c_step = t->c_step;
	}
	cr.layers = t->layers;
	cr.h_q = t->h_q;
	cr.h_kv = t->h_kv;
	cr.head_dim = t->d;
	cr.prompt_len = t->L;
	cr.n_q = t->n_q;
	cr.params = &pm;
	cr.n_layer = t->layers;
	cr.layer = lrs;
	cr.decode_reserve = 2;
	if (t->paged) {
		cr.n_block_table = 16;
		cr.block_table = table;
	}
	req.op_case = SNAPKV__V1__REQUEST__OP_COMPACT;
	req.compact = &cr;
	if (off > (64u << 10) || snapkv__v1__request__get_packed_size(&req) > sizeof(buf))
		return -EINVAL;
	return put("request", t->name, buf, snapkv__v1__request__pack(&req, buf));
}

static int requests(void)
{
	static const struct tiny t[] = {
	    {"hnd-group-f32", 2, 4, 2, 16, 64, 8, 8, 24, 1, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
	    {"hnd-expand-f16", 1, 4, 1, 8, 48, 4, 4, 16, 1, 1, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0},
	    {"nhd-group-bf16", 2, 2, 2, 16, 96, 16, 16, 32, 1, 2, 1, 0, 3, 0, 0, 0, 0, 0, 0, 0},
	    {"paged-group-f32", 1, 4, 2, 8, 96, 8, 8, 40, 1, 2, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0},
	    {"h2o-expand", 1, 2, 1, 8, 32, 32, 4, 12, 2, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
	    {"streamingllm", 1, 2, 2, 8, 40, 0, 4, 12, 3, 2, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0},
	    {"window-bypass", 1, 2, 1, 4, 10, 0, 4, 32, 4, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0},
	    /* zero ranking width (issue 24): forced fill C_max, or all of L */
	    {"mass-zero-width-cmax",
	     2,
	     4,
	     2,
	     8,
	     40,
	     8,
	     8,
	     12,
	     1,
	     1,
	     0,
	     0,
	     1,
	     1,
	     SNAPKV__V1__BUDGET_MODE__BUDGET_MODE_MASS,
	     0.9f,
	     12,
	     12,
	     1,
	     4},
	    {"mass-zero-width-all",
	     1,
	     4,
	     2,
	     8,
	     16,
	     8,
	     8,
	     16,
	     1,
	     2,
	     0,
	     0,
	     1,
	     1,
	     SNAPKV__V1__BUDGET_MODE__BUDGET_MODE_MASS,
	     0.9f,
	     16,
	     32,
	     4,
	     8},
	};
	int r = 0;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		r |= request(&t[i]);
	return r;
}

/* ---- compact-diff: the byte encoding fuzz-compact-diff.c decodes */

struct cd {
	uint8_t b[128];
	size_t n;
};

static void cd_byte(struct cd *c, unsigned v)
{
	c->b[c->n++] = (uint8_t)v;
}

/* take_count()'s small form: a selector below 240, then the value */
static void cd_count(struct cd *c, unsigned v)
{
	cd_byte(c, 0);
	cd_byte(c, v >> 8);
	cd_byte(c, v & 0xff);
}

struct cd_req {
	const char *name;
	unsigned heads, layers, dsel, L; /* heads: index of fuzz-compact-diff's table */
	unsigned policy, W, C, kernel, pool, gqa, sinks, prot_b, prot_len;
	unsigned mode, tau_idx, c_min, c_max_add, c_step, bf16;
};

static int compact_diff_one(const struct cd_req *q)
{
	struct cd c = {.n = 0};

	cd_byte(&c, q->heads);
	cd_byte(&c, q->layers - 1);
	cd_byte(&c, q->dsel);
	cd_byte(&c, q->L - 1);
	cd_count(&c, q->policy);
	cd_count(&c, q->W);
	cd_count(&c, q->C);
	cd_count(&c, q->kernel);
	cd_count(&c, q->pool);
	cd_count(&c, q->gqa);
	cd_count(&c, q->sinks);
	cd_count(&c, q->prot_len ? 1 : 0);
	if (q->prot_len) {
		cd_count(&c, q->prot_b);
		cd_count(&c, q->prot_len);
	}
	cd_count(&c, q->mode);
	cd_count(&c, 0);	 /* no layer list */
	cd_byte(&c, 2);		 /* pyramid r 0.5 */
	cd_byte(&c, 1);		 /* head floor 0.2 */
	cd_byte(&c, q->tau_idx); /* tau from the table */
	cd_count(&c, q->c_min);
	cd_count(&c, q->c_max_add);
	cd_count(&c, q->c_step);
	cd_byte(&c, 0); /* no fallback */
	cd_byte(&c, 0); /* full params size */
	cd_byte(&c, 0); /* n_q = W (h2o: L) */
	cd_byte(&c, q->bf16);
	cd_byte(&c, 2); /* decode reserve */
	return put("compact-diff", q->name, c.b, c.n);
}

static int compact_diffs(void)
{
	/* tau index 4 is 0.9 in the target's table */
	static const struct cd_req t[] = {
	    {"uniform-expand", 3, 2, 1, 64, 1, 8, 24, 5, 1, 1, 0, 0, 0, 0, 4, 0, 0, 0, 0},
	    {"uniform-group-bf16", 6, 1, 2, 96, 1, 16, 40, 3, 2, 2, 0, 2, 4, 0, 4, 0, 0, 0, 1},
	    {"h2o", 1, 1, 0, 32, 2, 4, 12, 1, 1, 1, 0, 0, 0, 0, 4, 0, 0, 0, 0},
	    {"streamingllm", 2, 1, 1, 40, 3, 4, 12, 1, 1, 2, 2, 0, 0, 0, 4, 0, 0, 0, 0},
	    {"pyramid", 3, 3, 1, 80, 1, 8, 24, 5, 1, 1, 0, 0, 0, 1, 4, 0, 0, 0, 0},
	    {"heads", 3, 2, 1, 80, 1, 8, 24, 5, 1, 1, 0, 0, 0, 2, 4, 0, 0, 0, 0},
	    {"mass", 3, 2, 1, 120, 1, 8, 48, 5, 1, 1, 0, 0, 0, 3, 4, 12, 60, 4, 0},
	    {"mass-heads-group", 3, 2, 1, 120, 1, 8, 48, 5, 2, 2, 0, 0, 0, 4, 3, 10, 60, 0, 0},
	    /* zero ranking width (issue 24): SIGSEGV in snapkvd before the fix */
	    {"mass-zero-width-cmax", 3, 2, 1, 40, 1, 8, 12, 3, 1, 1, 0, 0, 4, 3, 4, 12, 0, 1, 0},
	    {"mass-zero-width-all", 3, 1, 1, 16, 1, 8, 16, 3, 1, 2, 0, 0, 8, 3, 4, 16, 16, 4, 0},
	};
	int r = 0;

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		r |= compact_diff_one(&t[i]);
	return r;
}

/* ---- safetensors, through libskvst's writer */

static int safetensors(void)
{
	float q[2 * 2 * 4], k[2 * 8 * 4], v[2 * 8 * 4];
	uint16_t h[6] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000, 0x3555};
	int32_t idx[4] = {0, 3, 5, 7};
	struct skv_st_tensor t[6] = {
	    {.name = "layers.0.q", .dtype = SKV_ST_F32, .rank = 3, .shape = {2, 2, 4}, .data = q},
	    {.name = "layers.0.k", .dtype = SKV_ST_F32, .rank = 3, .shape = {2, 8, 4}, .data = k},
	    {.name = "layers.0.v", .dtype = SKV_ST_F32, .rank = 3, .shape = {2, 8, 4}, .data = v},
	    {.name = "half", .dtype = SKV_ST_F16, .rank = 2, .shape = {2, 3}, .data = h},
	    {.name = "brain", .dtype = SKV_ST_BF16, .rank = 1, .shape = {6}, .data = h},
	    {.name = "layers.0.indices", .dtype = SKV_ST_I32, .rank = 1, .shape = {4}, .data = idx},
	};
	struct skv_st_meta m[2] = {{"format", "snapkv-compact"}, {"version", "1"}};
	struct skv_st_error err;
	void *buf;
	size_t n;
	int r = 0;

	for (unsigned i = 0; i < sizeof(q) / 4; i++)
		q[i] = (float)i / 8.0f - 1.0f;
	for (unsigned i = 0; i < sizeof(k) / 4; i++) {
		k[i] = (float)(i % 7) - 3.0f;
		v[i] = (float)i * 0.25f;
	}
	if (skv_st_serialize(t, 3, NULL, 0, &buf, &n, &err) < 0)
		return -EINVAL;
	r |= put("safetensors", "prefill", buf, n);
	free(buf);
	if (skv_st_serialize(t, 6, m, 2, &buf, &n, &err) < 0)
		return -EINVAL;
	r |= put("safetensors", "all-dtypes-meta", buf, n);
	free(buf);
	/* a rank-0 scalar and an empty tensor */
	struct skv_st_tensor e[2] = {
	    {.name = "empty", .dtype = SKV_ST_F32, .rank = 2, .shape = {0, 4}, .data = q},
	    {.name = "scalar", .dtype = SKV_ST_I32, .rank = 0, .data = idx},
	};
	if (skv_st_serialize(e, 2, NULL, 0, &buf, &n, &err) < 0)
		return -EINVAL;
	r |= put("safetensors", "scalar-empty", buf, n);
	free(buf);
	return r;
}

/* ---- GGUF v3, little-endian: a header, key/values, tensor infos, data */

struct gbuf {
	uint8_t p[8192];
	size_t n;
};

static void g_raw(struct gbuf *g, const void *src, size_t n)
{
	if (g->n + n <= sizeof(g->p)) {
		memcpy(g->p + g->n, src, n);
		g->n += n;
	}
}

static void g_u32(struct gbuf *g, uint32_t v)
{
	g_raw(g, &v, 4);
}

static void g_u64(struct gbuf *g, uint64_t v)
{
	g_raw(g, &v, 8);
}

static void g_str(struct gbuf *g, const char *s)
{
	g_u64(g, strlen(s));
	g_raw(g, s, strlen(s));
}

/* GGUF value type numbers (gguf spec): UINT32 4, FLOAT32 6, STRING 8, ARRAY 9 */
static void g_kv_u32(struct gbuf *g, const char *k, uint32_t v)
{
	g_str(g, k);
	g_u32(g, 4);
	g_u32(g, v);
}

static void g_kv_f32(struct gbuf *g, const char *k, float v)
{
	g_str(g, k);
	g_u32(g, 6);
	g_raw(g, &v, 4);
}

static int gguf(const char *name, uint32_t align, int with_vocab)
{
	static const char *const vocab[] = {"<unk>", "<s>", "</s>", "a", "b", " ", "ab"};
	const char *tnames[2] = {"token_embd.weight", "output_norm.weight"};
	const uint64_t dims[2][2] = {{8, 7}, {8, 1}};
	struct gbuf g = {.n = 0};
	uint64_t off = 0;

	g_u32(&g, 0x46554747u); /* "GGUF" */
	g_u32(&g, 3);
	g_u64(&g, 2);			   /* tensors */
	g_u64(&g, with_vocab ? 8 : 5);	   /* key/values */
	g_str(&g, "general.architecture"); /* a string */
	g_u32(&g, 8);
	g_str(&g, "llama");
	g_kv_u32(&g, "general.alignment", align);
	g_kv_u32(&g, "llama.embedding_length", 8);
	g_kv_u32(&g, "llama.block_count", 0);
	g_kv_f32(&g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
	if (with_vocab) {
		float scores[7] = {0, 0, 0, -1, -2, -3, -4};
		g_str(&g, "tokenizer.ggml.tokens"); /* array of strings */
		g_u32(&g, 9);
		g_u32(&g, 8);
		g_u64(&g, 7);
		for (unsigned i = 0; i < 7; i++)
			g_str(&g, vocab[i]);
		g_str(&g, "tokenizer.ggml.scores"); /* array of float32 */
		g_u32(&g, 9);
		g_u32(&g, 6);
		g_u64(&g, 7);
		g_raw(&g, scores, sizeof(scores));
		g_kv_u32(&g, "tokenizer.ggml.bos_token_id", 1);
	}
	for (unsigned t = 0; t < 2; t++) {
		unsigned nd = dims[t][1] == 1 ? 1 : 2;
		g_str(&g, tnames[t]);
		g_u32(&g, nd);
		for (unsigned d = 0; d < nd; d++)
			g_u64(&g, dims[t][d]);
		g_u32(&g, 0); /* F32 */
		g_u64(&g, off);
		off += dims[t][0] * dims[t][1] * 4;
		off = (off + align - 1) / align * align;
	}
	while (g.n % align)
		g_raw(&g, "", 1);
	for (uint64_t i = 0; i < off / 4; i++) {
		float f = (float)i / 16.0f;
		g_raw(&g, &f, 4);
	}
	return put("gguf", name, g.p, g.n);
}

int main(int argc, char **argv)
{
	int r;

	if (argc != 2) {
		fprintf(stderr, "usage: gen-seeds DIR\n");
		return 2;
	}
	out_dir = argv[1];
	if (mkdir(out_dir, 0755) < 0 && errno != EEXIST) {
		perror(out_dir);
		return 1;
	}
	r = frames();
	r |= rings();
	r |= requests();
	r |= compact_diffs();
	r |= safetensors();
	r |= gguf("llama-vocab", 32, 1);
	r |= gguf("bare-align8", 8, 0);
	if (r) {
		fprintf(stderr, "gen-seeds: could not write every seed\n");
		return 1;
	}
	return 0;
}
