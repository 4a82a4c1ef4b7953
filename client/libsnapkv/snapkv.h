/* SPDX-License-Identifier: MIT */
/*
 * snapkv.h - libsnapkv: the engine side of snapkvd.
 *
 * The one public header of libsnapkv.so.1 (symbols versioned SNAPKV_1.x).
 * An engine connects, registers memfd buffers holding its prefill K/V (and
 * the window's Q), submits compactions, maps the compact cache the daemon
 * writes into the engine's own arena, appends decode tokens in place and
 * reports them, grows the decode headroom, and releases.
 *
 * Every fallible call returns 0 or a negative errno; skv_client_error()
 * gives a readable reason for the last failure on that client. A client is
 * safe to use from several threads (calls are serialised internally).
 * When the daemon dies every call returns -ENOTCONN or -ECONNRESET; mapped
 * caches stay readable; skv_client_reconnect() starts a new session (buffers
 * must be registered again, old caches are gone from the daemon).
 *
 * Deadlines (SNAPKV_1.4). A daemon that is alive but hung (stopped,
 * deadlocked) must not block an engine forever, so every call that waits
 * for the daemon is bounded by the client's deadline: 30 s by default,
 * $SNAPKV_TIMEOUT_MS (milliseconds, 0: none) when set at connect time,
 * skv_client_opts.timeout_ms, or skv_client_set_timeout(). Past it the call
 * returns -ETIMEDOUT. The deadline counts from when the call starts talking
 * to the daemon (calls of other threads on the same client go first).
 * - Socket calls (skv_client_connect and _reconnect as a whole: connect,
 *   handshake, registering buffers again; skv_buffer_alloc/_register_*,
 *   skv_buffer_free, skv_client_cuda_arena, skv_client_nop_socket, and
 *   compactions too large for a ring slot): after a timeout a late reply
 *   could be taken for the next call's, so the connection is dropped: every
 *   later call fails with -ENOTCONN until skv_client_reconnect(). Mapped
 *   caches stay readable.
 * - Ring calls (skv_client_stats, skv_client_nop, skv_cache_append/_grow/
 *   _release, and skv_compact_submit waiting for a free ring slot): the
 *   connection stays usable; the request may still take effect in the
 *   daemon later (its completion is then discarded), so after a timeout of
 *   skv_cache_append or skv_cache_grow the handle may no longer match the
 *   daemon's cache (a late GROW moves it): release the cache.
 * - Compaction waits are not bounded by it (their time grows with the
 *   prompt): skv_request_wait() takes its own timeout; skv_client_compact()
 *   waits until the daemon answers or dies.
 *
 * ABI growth. A struct the caller fills and passes in carries its size
 * (opts_size, desc_size, budget_size; skv_params' params_size) and only
 * grows at its end: a new field goes after the last one, under a comment
 * naming the SNAPKV_1.x that added it, and is read only when the size
 * covers it. No field is moved, resized or removed, and no struct that can
 * grow is embedded by value in another except as its last member (struct
 * skv_params in the middle of skv_compact_desc is the one exception left
 * from before this rule: it is why libsnapkv translates descriptions built
 * before the budget modes). A new call that takes a new struct is added
 * under a new version node, never by changing an old call's arguments.
 */
#ifndef SNAPKV_H
#define SNAPKV_H

#include <stddef.h>
#include <stdint.h>

#include "skv.h" /* dtypes, policies, skv_params, skv_shape */

#ifdef __cplusplus
extern "C" {
#endif

struct skv_client;
struct skv_buffer;
struct skv_cache;
struct skv_request;
struct skv_pool;

struct skv_client_opts {
	uint32_t opts_size;  /* sizeof(struct skv_client_opts) */
	const char *name;    /* engine name shown in the ledger  */
	uint32_t sq_entries; /* 0: the daemon's default         */
	uint32_t spin_us;    /* spin on the CQ this long before sleeping (default 50) */
	/* since SNAPKV_1.4, read when opts_size covers it: the deadline of each
	 * call in ms; 0: $SNAPKV_TIMEOUT_MS if set, else 30 s; < 0: none */
	int32_t timeout_ms;
};

/*
 * Connect to snapkvd at path (NULL: $SNAPKV_SOCKET, else the system socket
 * /run/snapkvd/snapkvd.sock if it exists, else or when that one refuses
 * $XDG_RUNTIME_DIR/snapkvd.sock), handshake and map the session's ring and
 * arena. opts may be NULL. -ENOTCONN when no snapkvd listens; -ETIMEDOUT when
 * the daemon does not accept or answer within the deadline; -EINVAL when
 * $SNAPKV_TIMEOUT_MS is needed but is not a number of milliseconds.
 */
int skv_client_connect(const char *path, const struct skv_client_opts *opts,
		       struct skv_client **ret_client);
/* Close the session: the daemon frees its caches. Cache handles must have
 * been released or are invalid after this. NULL is fine. Since SNAPKV_1.8
 * (libsnapkv 1.8.0) it first fences the session: every request still in
 * flight, abandoned ones included, is cancelled as by skv_request_cancel()
 * and waited for, within the client's deadline (see Deadlines), so that no
 * write of the session lands in the engine's buffers once it returns
 * (unless the deadline passed: then the daemon still owns what it writes).
 * skv_client_reconnect() fences the session it replaces the same way. */
void skv_client_close(struct skv_client *c);
/* The reason of the last failure, never NULL. */
const char *skv_client_error(const struct skv_client *c);
/* Drop the current session (if any) and connect again to the same path. */
int skv_client_reconnect(struct skv_client *c);
uint64_t skv_client_session_id(const struct skv_client *c);
/* Set the deadline of each later call in ms (0: none; at most INT32_MAX).
 * Never waits for a call in progress. Since SNAPKV_1.4. */
int skv_client_set_timeout(struct skv_client *c, uint32_t timeout_ms);
/* The deadline in ms, 0 for none. Since SNAPKV_1.4. */
uint32_t skv_client_timeout(const struct skv_client *c);

/* Allocate a sealed memfd buffer of `size` bytes, map it read-write and
 * register it with the daemon. */
int skv_buffer_alloc(struct skv_client *c, size_t size, struct skv_buffer **ret_buf);
/* Register an engine-owned memfd (must carry F_SEAL_SHRINK); fd is dup'ed. */
int skv_buffer_register_fd(struct skv_client *c, int memfd, size_t size,
			   struct skv_buffer **ret_buf);
/*
 * GPU-resident K/V (SNAPKV_1.2; the daemon must run --backend cuda, else
 * -ENOTSUP). libsnapkv never touches CUDA: the engine exports the memory and
 * hands over what the daemon imports, once, on its own device.
 * - cuda_fd: a VMM allocation (cuMemCreate with
 *   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, cuMemExportToShareableHandle);
 *   size is the allocation's (a granularity multiple). The fd is dup'ed.
 * - cuda_ipc: the 64 bytes of a cudaIpcMemHandle_t of a cudaMalloc
 *   allocation; the buffer is [offset, offset + size) of that allocation.
 * device: the engine's device ordinal (for the daemon's log). TensorRef
 * offsets count from the buffer start as for memfds; skv_buffer_data() is
 * NULL for these buffers. Free with skv_buffer_free() (the daemon drops its
 * import; it also does when the session ends).
 */
int skv_buffer_register_cuda_fd(struct skv_client *c, int vmm_fd, size_t size, int device,
				struct skv_buffer **ret_buf);
int skv_buffer_register_cuda_ipc(struct skv_client *c, const void *ipc_handle64, size_t offset,
				 size_t size, int device, struct skv_buffer **ret_buf);
/*
 * The session's GPU arena (SNAPKV_1.2; --backend cuda, else -ENOTSUP): a
 * cuMemCreate allocation on the daemon's device, created on the first call.
 * *ret_fd is a new VMM POSIX fd (the caller closes it) of *ret_size bytes:
 * import it once (cuMemImportFromShareableHandle, cuMemAddressReserve,
 * cuMemMap, cuMemSetAccess); caches compacted with out_arena SKV_ARENA_CUDA
 * put their K/V there, at skv_cache_k_offset()/skv_cache_v_offset().
 */
int skv_client_cuda_arena(struct skv_client *c, int *ret_fd, uint64_t *ret_size, int *ret_device);
/* How the daemon reached the buffer: "memfd", "cuda-vmm-fd", "cuda-ipc". */
const char *skv_buffer_transport(const struct skv_buffer *b);
void *skv_buffer_data(const struct skv_buffer *b); /* NULL for register_fd buffers */
size_t skv_buffer_size(const struct skv_buffer *b);
uint64_t skv_buffer_id(const struct skv_buffer *b);
/* Unregister and unmap. NULL is fine. */
int skv_buffer_free(struct skv_buffer *b);

/*
 * Writable buffers (SNAPKV_1.5). A buffer is registered read-only unless
 * flags has SKV_BUFFER_WRITABLE: only then does the daemon map a memfd with
 * PROT_WRITE (a memfd must then not carry F_SEAL_WRITE/F_SEAL_FUTURE_WRITE),
 * and only a writable buffer can be the destination of a writeback
 * compaction (SKV_OUT_WRITEBACK: the daemon writes the compact K/V into the
 * blocks the request names there, and nowhere else). Unknown flag bits are
 * -EINVAL. The _flags variants with flags 0 are the calls above.
 */
#define SKV_BUFFER_WRITABLE 0x1u
int skv_buffer_alloc_flags(struct skv_client *c, size_t size, uint32_t flags,
			   struct skv_buffer **ret_buf);
int skv_buffer_register_fd_flags(struct skv_client *c, int memfd, size_t size, uint32_t flags,
				 struct skv_buffer **ret_buf);
int skv_buffer_register_cuda_fd_flags(struct skv_client *c, int vmm_fd, size_t size, int device,
				      uint32_t flags, struct skv_buffer **ret_buf);
int skv_buffer_register_cuda_ipc_flags(struct skv_client *c, const void *ipc_handle64,
				       size_t offset, size_t size, int device, uint32_t flags,
				       struct skv_buffer **ret_buf);
/* The flags the daemon registered the buffer with (SKV_BUFFER_*). */
uint32_t skv_buffer_flags(const struct skv_buffer *b);
/*
 * Undo skv_cache_map_blocks(): map the buffer's own memfd back over
 * [offset, offset + len) of its mapping (skv_buffer_data(b) + offset, both
 * page-aligned; len is rounded up to pages), MAP_FIXED. Only for buffers
 * libsnapkv mapped (skv_buffer_alloc*); -EINVAL otherwise or out of range.
 */
int skv_buffer_restore(struct skv_buffer *b, uint64_t offset, uint64_t len);

/* Where one tensor lives in a registered buffer (strides in elements). */
struct skv_tensor_ref {
	const struct skv_buffer *buf;
	uint64_t offset; /* bytes */
	enum skv_dtype dtype;
	int64_t head_stride;
	int64_t token_stride;
	uint32_t block_size; /* 0: strided; else paged with the desc's block table */
	int64_t block_stride;
};

struct skv_layer_ref {
	struct skv_tensor_ref q; /* [h_q, n_q, D], window queries (post-RoPE) */
	struct skv_tensor_ref k; /* [h_kv, L, D] (post-RoPE)                 */
	struct skv_tensor_ref v; /* [h_kv, L, D]                             */
};

enum skv_layout {
	SKV_LAYOUT_UNSPECIFIED = 0,
	SKV_LAYOUT_HND = 1,   /* [head][slot][dim] */
	SKV_LAYOUT_NHD = 2,   /* [slot][head][dim] */
	SKV_LAYOUT_PAGED = 3, /* SNAPKV_1.5: per layer K and V pools
				 [block][block_size][H_store][D] */
};

/*
 * Paged output (SNAPKV_1.5): out_layout SKV_LAYOUT_PAGED, out_block_size
 * slots per block (1..SKV_MAX_OUT_BLOCK_SIZE). Compact slot i of every
 * stored head is in block i / out_block_size, row i % out_block_size; the
 * positions table is per (layer, head) as for HND/NHD. Only budgets with one
 * count for every head and layer: uniform and mass (one C* for the cache),
 * with or without fallback_below; layers, heads and mass-heads are refused
 * (-EINVAL). The output is sized for the most a head may keep (min(L,
 * C_max) for mass, L with a fallback); the cache's n_blocks then counts the
 * blocks its kept rows and decode slots use (writeback: the first ones of
 * the table, at most all of it; the others are never written).
 * Where the blocks go is out_dest:
 *
 * SKV_OUT_ARENA: in the cache's region of the arena (out_arena: host or
 *   CUDA). Each layer's K pool and V pool is one "run" of
 *   n_blocks = ceil(capacity / out_block_size) consecutive blocks
 *   [n_blocks][block_size][H_store][D] (block_stride = block_size * H_store
 *   * D elements, token_stride = H_store * D, head_stride = D); every run
 *   starts on a page boundary of the arena and is followed by padding up to
 *   the next page. skv_cache_block_run() gives a run's offset and length and
 *   skv_cache_map_blocks() maps it MAP_SHARED|MAP_FIXED, read-write, over
 *   the engine's own pool at a block boundary, so an unmodified paged
 *   attention reads it as blocks b .. b + n_blocks - 1 of that pool (when
 *   the block's bytes are not a page multiple the run's padding covers the
 *   start of the pool's following block(s): the engine keeps those blocks
 *   out of use while mapped). Decode tokens go into slots kept .. capacity-1
 *   of the same blocks. Before releasing or growing the cache, map the pool
 *   back (skv_buffer_restore()): the daemon reuses the region.
 *   On CUDA (SKV_ARENA_CUDA) the runs are at skv_cache_block_run() offsets
 *   of the GPU arena, page- (not VMM-granularity-) aligned.
 *
 * SKV_OUT_WRITEBACK: into the engine's own pool. out_layer[l] names layer
 *   l's K and V pools (buffer registered SKV_BUFFER_WRITABLE, offset of
 *   pool block 0, dtype: the cache's dtype, head/token/block strides in
 *   elements; block_size 0 or out_block_size), out_block_table the
 *   destination blocks (indices into every pool, shared by all layers as the
 *   input block table is): slot i goes to block out_block_table[i /
 *   out_block_size]. The table needs at least ceil(kept / out_block_size)
 *   entries (kept = min(L, C); mass: min(L, C_max); a fallback: L), at
 *   most the daemon's max_prompt_len (its
 *   config key, as for the input block table); the daemon
 *   writes the kept slots only, nothing else in the buffers. Refused with
 *   -EINVAL before any work: a buffer not writable, a block outside its
 *   buffer, two destination blocks meeting, a destination block meeting any
 *   byte the request reads (Q, K, V of every layer). The cache then holds
 *   only the index tables (positions, mass) in the arena; the ledger shows
 *   it as engine-held. skv_cache_k/v() are NULL; use skv_cache_k_slot() or
 *   skv_cache_k_block_offset(). APPEND advances g as usual (the engine
 *   writes decode K/V into blocks it manages itself, up to capacity =
 *   kept + decode_reserve slots, or max_decode below); GROW takes the
 *   engine's new blocks (skv_cache_grow_blocks(), SNAPKV_1.9; before it,
 *   -EOPNOTSUPP); RELEASE frees the index tables only.
 *
 * Writeback without copies or per-token traffic (SNAPKV_1.9, desc fields
 * out_in_place_blocks and max_decode; docs/engines.md):
 * - out_in_place_blocks n: compact slots 0 .. n * out_block_size - 1 are
 *   the input's blocks block_table[0 .. n - 1], already in place (a shared,
 *   prefix-cached prompt): never written. Those positions must be
 *   protected (params.protected_ranges from 0; streamingllm's sinks
 *   count), every layer's K and V read paged from the destination pools
 *   themselves (same buffer, offset, strides, dtype, block_size
 *   out_block_size), and n at most the input table's length; else -EINVAL
 *   before any work. out_block_table then covers the rest only: slot i >=
 *   n * out_block_size goes to out_block_table[i / out_block_size - n], so
 *   it needs ceil(kept / out_block_size) - n entries. The positions table
 *   has every slot (slot i < n * out_block_size holds position i);
 *   info->in_place_blocks says n, info->n_blocks counts them, and
 *   skv_cache_block_offset()/skv_cache_k_slot() give the input's blocks for
 *   them. Arena output refuses it.
 * - max_decode M (1 .. the daemon's max_decode; 0: none): the most tokens
 *   the engine will append. The ledger counts the cache at kept +
 *   max(decode_reserve, M) slots per head from the start; APPEND is
 *   optional up to info->decode_limit; decode slots past capacity have no
 *   position row (slot kept + i holds position L + i); GROW may take
 *   capacity - kept up to M (beyond: -E2BIG). Arena output refuses it.
 * - Without max_decode, skv_cache_release_appended() reports g once at
 *   release instead of an APPEND per step.
 */
#define SKV_MAX_OUT_BLOCK_SIZE 4096u

enum skv_out_dest {
	SKV_OUT_ARENA = 0,     /* the session's arena (out_arena says which) */
	SKV_OUT_WRITEBACK = 1, /* the engine's writable buffer                */
};

/* Destination pools of one layer for SKV_OUT_WRITEBACK. */
struct skv_layer_out_ref {
	struct skv_tensor_ref k; /* pool [block][block_size][H_store][D] or any strides */
	struct skv_tensor_ref v;
};

/* Where a compact cache's K/V go (positions are always in the host arena). */
enum skv_arena_kind {
	SKV_ARENA_HOST = 0, /* the session's host memfd arena                  */
	SKV_ARENA_CUDA = 2, /* the session's GPU arena (skv_client_cuda_arena) */
};

enum skv_prefill_wait {
	SKV_WAIT_NONE = 0,
	SKV_WAIT_CUDA_IPC_EVENT = 1,
	SKV_WAIT_CUDA_FLAG = 2,
};

struct skv_compact_desc {
	uint32_t desc_size; /* sizeof(struct skv_compact_desc) */
	struct skv_shape shape;
	uint32_t layers;
	struct skv_params params;	   /* skv_client_params_init(), then override */
	const struct skv_layer_ref *layer; /* [layers] */
	enum skv_layout out_layout;	   /* UNSPECIFIED: HND */
	uint32_t decode_reserve;	   /* decode slots per stored head */
	const int32_t *block_table;	   /* paged tensors only */
	uint32_t n_blocks;
	int evictable;
	/* since SNAPKV_1.2, read when desc_size covers it */
	enum skv_arena_kind out_arena;
	/* since SNAPKV_1.3, read when desc_size covers them (--backend cuda):
	 * run only once the engine's prefill is done, without synchronising
	 * first. SKV_WAIT_CUDA_FLAG: the daemon's stream waits until the u32 at
	 * byte wait_offset (4-aligned) of the registered CUDA buffer wait_buffer
	 * is >= wait_value; not reached within wait_timeout_ms (0: the daemon's
	 * prefill_wait_max_ms, default 10 s), the daemon writes wait_value there
	 * itself and the request fails (-ETIMEDOUT on the wire, -ETIME from
	 * skv_request_wait/skv_client_compact). Use a fresh value per
	 * request (a sequence number), since a flag at >= value releases at once.
	 * SKV_WAIT_CUDA_IPC_EVENT: wait_ipc_event holds cudaIpcGetEventHandle's
	 * 64 bytes for an event created with cudaEventInterprocess |
	 * cudaEventDisableTiming and recorded after the prefill; the daemon polls
	 * it from the host and starts only once it has completed (up to 1 ms
	 * later), with the same wait_timeout_ms bound: not complete by then, the
	 * request fails (-ETIME here) having run nothing. A handle the daemon
	 * cannot open is -EINVAL. skv_compact_desc_wait_event() (SNAPKV_1.4)
	 * fills them; wait_buffer/offset/value are not used. */
	enum skv_prefill_wait prefill_wait;
	const struct skv_buffer *wait_buffer;
	uint64_t wait_offset;
	uint32_t wait_value;
	uint32_t wait_timeout_ms;
	uint8_t wait_ipc_event[64];
	/* since SNAPKV_1.5, read when desc_size covers them: paged output
	 * (see SKV_LAYOUT_PAGED above); ignored for other layouts except that
	 * out_dest must stay SKV_OUT_ARENA */
	uint32_t out_block_size;
	enum skv_out_dest out_dest;
	const struct skv_layer_out_ref *out_layer; /* writeback: [layers] */
	const int32_t *out_block_table;		   /* writeback */
	uint32_t out_n_blocks;
	/* since SNAPKV_1.7, read when desc_size covers them: a decision group
	 * (see "Decision groups" below). group_key NULL or "" and group_size 0:
	 * no group. The string is read by skv_compact_submit() only. */
	const char *group_key;	   /* 1..SKV_MAX_GROUP_KEY bytes, printable ASCII */
	uint32_t group_size;	   /* members, 1..the daemon's max_group_size */
	uint32_t group_timeout_ms; /* 0: the daemon's group_timeout_ms */
	/* since SNAPKV_1.8, read when desc_size covers it: fp8 K/V (dtypes
	 * SKV_DTYPE_F8E4M3FN, SKV_DTYPE_F8E5M2; SPEC.md "Quantized K/V"): the
	 * scale s of each layer's K and V tensor (value = s * byte), finite and
	 * above 0. Needed when they are fp8 (the daemon refuses a missing one);
	 * not read otherwise. The compact cache holds the same bytes and dtype
	 * and carries these scales (skv_cache_kv_scale). Host backend only. */
	const float *kv_scales; /* [layers][2]: K, V; NULL: none */
	/* since SNAPKV_1.9, read when desc_size covers them: registered pools
	 * and block tables in buffers (see "Registered KV pools" below).
	 * pool: K and V of every layer are the pool's (layers, shape.h_kv and
	 * shape.head_dim 0 or the pool's; kv_scales unused: the pool's); layer
	 * is then NULL, the window's queries at q_window (layer 0's; layer
	 * l's at q_window.offset + l * q_layer_stride bytes of the same
	 * buffer), or layer[] with only q filled in. table_buf: the block
	 * table is n_blocks int32 at byte table_offset of that buffer (a host
	 * buffer of this client) instead of block_table; out_table_buf
	 * likewise for out_block_table (out_n_blocks entries). out_pool: the
	 * writeback destination pools are that pool's (out_layer NULL;
	 * out_block_size 0 or the pool's block_size). */
	const struct skv_pool *pool;
	struct skv_tensor_ref q_window;
	uint64_t q_layer_stride;
	const struct skv_buffer *table_buf;
	uint64_t table_offset;
	const struct skv_buffer *out_table_buf;
	uint64_t out_table_offset;
	const struct skv_pool *out_pool;
	/* since SNAPKV_1.9, read when desc_size covers them; writeback only
	 * (see "Writeback without copies" below):
	 * out_in_place_blocks: the first n compact blocks are the input's
	 * block_table[0 .. n - 1], already in place, never written;
	 * max_decode: the most tokens the engine will append (0: none). */
	uint32_t out_in_place_blocks;
	uint32_t max_decode;
};

/* Fill the SNAPKV_1.3 wait fields of d for a CUDA_FLAG wait (desc_size must
 * cover them). -EINVAL for a NULL desc/buffer or an unaligned offset. */
int skv_compact_desc_wait_flag(struct skv_compact_desc *d, const struct skv_buffer *flag_buf,
			       uint64_t offset, uint32_t value, uint32_t timeout_ms);
/* Fill the wait fields of d for a CUDA_IPC_EVENT wait: ipc_handle is the 64
 * bytes of cudaIpcGetEventHandle (a cudaIpcEventHandle_t; libsnapkv needs no
 * CUDA header), timeout_ms as above. -EINVAL for a NULL desc/handle or a
 * desc_size that does not cover the wait fields. Since SNAPKV_1.4. */
int skv_compact_desc_wait_event(struct skv_compact_desc *d, const void *ipc_handle,
				uint32_t timeout_ms);

/*
 * Decision groups (SNAPKV_1.7; SPEC.md "Budgets beyond one C"). Tensor-
 * parallel ranks of one engine each hold some of the heads but must keep the
 * same number of tokens: each rank submits its own compaction with the same
 * group_key and group_size, from the same tenant (uid), and snapkvd decides
 * them together: in mass mode C* is the smallest ladder C meeting tau on
 * every member (the largest of the members' own C*), and when the fallback
 * applies to one member it applies to all. Every member must agree on the
 * shape (layers, h_q, h_kv, head_dim, prompt_len, dtype) and on the budget
 * mode and all its parameters; uniform, layers and mass are allowed (with or
 * without fallback_below), heads and mass-heads are refused. The daemon
 * holds each member until all group_size have arrived, up to
 * group_timeout_ms (0: its config's group_timeout_ms; at most its
 * max_group_timeout_ms); past it every member fails and nothing is kept:
 * the daemon's -ETIMEDOUT, returned as -ETIME by skv_request_wait() and
 * skv_client_compact() as for a prefill wait. A member whose session ends
 * makes the others fail at once. Mismatches, a member too many, a size above
 * max_group_size and more than max_tenant_groups pending groups of one
 * tenant are refused with -EINVAL naming the field or limit. Each member's
 * wait is a compaction wait: skv_client_compact() blocks until the group is
 * decided, so the members must be submitted concurrently (one thread,
 * process or skv_compact_submit() per member). A member too large for a
 * ring slot (a long paged block table) goes over the socket, so
 * skv_compact_submit() itself then waits for the decision, within the
 * client's deadline (see Deadlines). skv_cache_budget() reports group_size
 * and group_wait_us.
 */
#define SKV_MAX_GROUP_KEY 64u
/* Fill the SNAPKV_1.7 group fields of d (desc_size must cover them), after
 * checking them as skv_compact_submit() does: key 1..SKV_MAX_GROUP_KEY bytes
 * of printable ASCII, size >= 1. The key is not copied: it must stay valid
 * until the request is submitted. -EINVAL otherwise. Since SNAPKV_1.7. */
int skv_compact_desc_group(struct skv_compact_desc *d, const char *key, uint32_t size,
			   uint32_t timeout_ms);

/*
 * SPEC.md reference defaults: snapkvd, W 32, C 2048, k 5, avg, expand, S 4.
 * Fills the fields before the budget modes only and sets params_size to
 * SKV_PARAMS_SIZE_V1 (programs built before them pass a struct that ends
 * there): such params are uniform with no fallback. For a budget mode fill
 * params with libskv's skv_params_init() (or SKV_PARAMS_DEFAULTS) so that
 * params_size is the full size, then set budget_mode, its fields and
 * fallback_below: since SNAPKV_1.6 they are carried to snapkvd (see
 * skv_cache_budget() below). Descriptions built against the header before
 * the budget modes (a shorter desc_size) keep working. Params whose
 * params_size ends before the budget modes but with budget_mode or
 * fallback_below set are refused by skv_compact_submit() with -EINVAL
 * (they used to be sent as uniform, dropping the mode).
 * min_window (a partial window: snapkv with n_q < window query rows runs
 * with W' = n_q when n_q >= min_window, SPEC.md) is carried when
 * params_size is sizeof(struct skv_params) (skv_params_init(),
 * SKV_PARAMS_DEFAULTS); otherwise, and when it is 0, the daemon's
 * min_window (snapkvd.conf(5), default 8) applies. A description's
 * shape.n_q may be below window (both backends).
 */
void skv_client_params_init(struct skv_params *p);

/*
 * Submit a compaction; returns at once over the shared ring. A request too
 * large for a ring slot (a long paged block table) goes over the socket
 * instead and is complete when this returns. Either way the request must be
 * waited for (skv_request_wait frees it) or abandoned. A request holds one
 * of the ring's sq_entries slots until then: when every slot holds a
 * request the calling thread submitted and has not waited for or abandoned,
 * and no other thread is waiting on this client, nothing but the caller
 * could free a slot, so this fails at once with -EDEADLK rather than
 * waiting out the deadline (a thread that hands its requests to another to
 * wait for must leave a slot free or let that thread be waiting).
 */
int skv_compact_submit(struct skv_client *c, const struct skv_compact_desc *d,
		       struct skv_request **ret_req);
/* 1 when the request has completed, 0 when not yet, -errno on failure. */
int skv_request_poll(struct skv_request *r);
/*
 * Wait (timeout_ms < 0: forever) for a compaction; on success *ret_cache is
 * the new cache. The request is freed unless -ETIMEDOUT is returned. A
 * prefill wait the engine did not signal in time, or a decision group whose
 * members did not all arrive in time (the daemon's -ETIMEDOUT), is returned
 * as -ETIME, the request freed. A request of a session that
 * skv_client_reconnect() replaced fails with -ENOTCONN (freed).
 */
int skv_request_wait(struct skv_request *r, int timeout_ms, struct skv_cache **ret_cache);
/*
 * Give up on a request without waiting (after skv_request_wait's -ETIMEDOUT,
 * or before closing the client): the handle is freed. The daemon may still
 * write its destination: to reuse the blocks, cancel instead (see
 * skv_request_cancel). If the compaction has
 * finished, its cache is released now; if it finishes later, the library
 * releases its cache when it reads the completion from the ring (during any
 * later call of the client that reads it: a submit, wait, poll, nop, stats,
 * pressure, append, grow or release), without waiting for the answer, in
 * the slot the request held; until then the daemon keeps it, counted. (Up
 * to libsnapkv 1.7.0 it was kept until the session ended, so a program
 * that abandoned many requests ran into snapkvd's max_caches.) NULL is
 * fine. Since SNAPKV_1.4.
 */
void skv_request_abandon(struct skv_request *r);
/*
 * Who owns a writeback destination (SKV_OUT_WRITEBACK), and when. From
 * skv_compact_submit() until the request's completion has been taken
 * (skv_request_wait() returned, or skv_request_poll() said 1 and the wait
 * followed) or skv_request_cancel() has returned >= 0, the destination
 * blocks belong to the daemon: the engine must neither write them nor give
 * them to another sequence. skv_request_abandon() does NOT end that: an
 * abandoned compaction may still write its blocks until skv_client_close()
 * returns. The same holds for the inputs (Q, K, V, block tables): they must
 * stay unchanged until then.
 *
 * Cancel (SNAPKV_1.8; a daemon with SKV_RING_F_CANCEL): stop a compaction
 * and return only once no write of it can land any more: it was still
 * queued and is dequeued, or its worker stopped at the next safe point (a
 * group of layers on the host; on a GPU, once its stream work is complete:
 * a compaction whose kernels were launched runs to its end), or a
 * decision-group member parked for its group fails the group (the other
 * members fail as when a member's session ends). A prefill wait in
 * progress is given up at once: an IPC event wait before anything runs
 * (UNWRITTEN); a CUDA flag wait by the daemon setting the flag itself, as
 * at its timeout, so the kernels queued behind it run on whatever the
 * buffers hold (STOPPED). timeout_ms bounds the wait as for
 * skv_request_wait() (< 0: none); on -ETIMEDOUT the request is not freed
 * and the destination is still the daemon's: cancel again or wait. On any
 * other result the request is freed. Returns:
 *   SKV_CANCEL_UNWRITTEN  it never started writing (dequeued, stopped in its
 *                         prefill wait, or refused or failed before its
 *                         kernels ran): nothing of the destination changed;
 *   SKV_CANCEL_STOPPED    it was stopped, or failed, after its kernels
 *                         began: any destination block may hold part of its
 *                         output (no cache; the blocks are the engine's again);
 *   SKV_CANCEL_COMPLETED  it finished before the cancel reached it: every
 *                         destination block holds its output and the cache
 *                         exists: *ret_cache when ret_cache is non-NULL,
 *                         else released here;
 * or -errno: -EINVAL (NULL), -ETIMEDOUT (see above), -ENOTCONN/-ECONNRESET
 * (the session ended: snapkvd closed it or died; returned only once snapkvd
 * has hung up the socket, which it does after the session's last job has
 * stopped, so nothing of it is written any more), -EPROTO. A request that went over the socket (too
 * large for a ring slot) was complete when submitted: COMPLETED, or STOPPED if it failed (a socket
 * reply does not say where it failed). With a daemon older than SKV_RING_F_CANCEL, cancel waits for
 * the completion instead (the same fence, without the early stop) and a failure counts as STOPPED.
 */
enum skv_cancel_result {
	SKV_CANCEL_UNWRITTEN = 0,
	SKV_CANCEL_STOPPED = 1,
	SKV_CANCEL_COMPLETED = 2,
};
int skv_request_cancel(struct skv_request *r, int timeout_ms, struct skv_cache **ret_cache);

/* submit + wait */
int skv_client_compact(struct skv_client *c, const struct skv_compact_desc *d,
		       struct skv_cache **ret_cache);

/*
 * Registered KV pools (SNAPKV_1.9). An engine's paged K/V pools (one K and
 * one V pool per layer, [n_blocks][block_size][H_kv][D] or any strides, in
 * buffers registered with this client: memfd, or CUDA buffers on
 * --backend cuda) are described once; snapkvd validates the description
 * (every buffer, dtype, strides, blocks 0 .. n_blocks - 1 inside their
 * buffers) and returns a pool. A compaction then names the pool
 * (skv_compact_desc.pool, .out_pool for a writeback destination) instead
 * of every layer's tensors, and its block tables may live in a registered
 * host buffer (.table_buf, .out_table_buf) instead of the message, up to
 * snapkvd's max_block_table entries each (default 4M; like every input it
 * must stay unchanged until the request completes or is cancelled: the
 * daemon copies it when it takes the request from the ring). Limits: max_session_pools pools per
 * session (-EMFILE, named). A pool belongs to the session it was registered in: after
 * skv_client_reconnect() register it again (a request naming an old one
 * fails with -ESTALE).
 */
struct skv_pool_desc {
	uint32_t desc_size; /* sizeof(struct skv_pool_desc) */
	uint32_t layers, h_kv, head_dim;
	enum skv_dtype dtype;
	uint32_t block_size; /* slots per block */
	uint64_t n_blocks;   /* blocks of each pool */
	/* [layers]: K and V pools (buffer, offset of block 0, strides in
	 * elements; block_size 0 or the pool's; dtype the pool's) */
	const struct skv_layer_out_ref *layer;
	const float *kv_scales; /* fp8 dtypes: [layers][2] (K, V); else NULL */
};
/* Register d's pool with snapkvd. 0, or -errno (the daemon's reason in
 * skv_client_error()). */
int skv_pool_register(struct skv_client *c, const struct skv_pool_desc *d,
		      struct skv_pool **ret_pool);
uint64_t skv_pool_id(const struct skv_pool *p);
/* Unregister and free the handle: 0; -EBUSY while a request naming it is
 * in flight (the pool and the handle stay). The daemon frees a session's
 * pools when it ends; skv_client_close() frees the handles left (they are
 * invalid after it). A pool of another client names nothing in this
 * session: the daemon refuses it (-ENOENT). NULL is fine. */
int skv_pool_unregister(struct skv_pool *p);
/*
 * Submit n compactions (SNAPKV_1.9): as n skv_compact_submit() calls under
 * one lock, waking the daemon at most once (one doorbell) for all of them.
 * ret_reqs[i] is the request of descs[i]. On failure (-errno) the requests
 * submitted before the failing one are in ret_reqs[0 .. *ret_n - 1] (wait
 * for or cancel them) and no later one was sent.
 */
int skv_compact_submit_many(struct skv_client *c, const struct skv_compact_desc *const *descs,
			    uint32_t n, struct skv_request **ret_reqs, uint32_t *ret_n);

struct skv_cache_info {
	uint64_t id;
	uint32_t layers, h_store, head_dim;
	enum skv_dtype dtype;
	enum skv_layout layout;
	uint32_t prompt_len;		   /* L */
	uint32_t kept;			   /* slots filled by the compaction, per head */
	uint32_t capacity;		   /* slots per head: kept + decode headroom
					    * (a capacity is slots; C is a budget) */
	uint32_t appended;		   /* g */
	uint32_t budget;		   /* C used: after pressure scaling */
	int64_t head_stride, token_stride; /* elements */
	/* since SNAPKV_1.1 (appended: the struct is only ever handed out) */
	uint32_t requested_budget; /* C the request asked for */
	int budget_scaled;	   /* budget < requested_budget: scaled under pressure */
	uint32_t pressure;	   /* pool pressure at admission: 1 normal, 2 high, 3 critical */
	/* since SNAPKV_1.2: SKV_ARENA_CUDA: K/V are in the GPU arena; use
	 * skv_cache_k_offset()/skv_cache_v_offset() there (skv_cache_k/v: NULL) */
	enum skv_arena_kind kv_arena;
	/* since SNAPKV_1.5, SKV_LAYOUT_PAGED only (else 0): slots per block,
	 * blocks per layer in each of the K and V pools (arena: the run's,
	 * ceil(capacity / block_size); writeback: the destination table's),
	 * elements between blocks, where the blocks are */
	uint32_t block_size;
	uint32_t n_blocks;
	int64_t block_stride;
	enum skv_out_dest out_dest;
	/* since SNAPKV_1.9, writeback only (else 0): the first in_place_blocks
	 * of the n_blocks are the input's blocks in place; max_decode the
	 * declared most appended tokens (0: none), decode_limit the most g may
	 * reach: max(capacity - kept, max_decode) */
	uint32_t in_place_blocks;
	uint32_t max_decode;
	uint32_t decode_limit;
};

/* Valid until the next grow/release of this cache. */
const struct skv_cache_info *skv_cache_info(const struct skv_cache *k);
/* An fp8 cache's scale of layer's K (v = 0) or V (v = 1), the request's
 * kv_scales; 1.0 for a cache of another dtype, NaN out of range. Since
 * SNAPKV_1.8. */
float skv_cache_kv_scale(const struct skv_cache *k, uint32_t layer, int v);
/* Pointers into the mapped arena; slot i of (layer, head) is at
 * base + i * token_stride elements. NULL when out of range. */
void *skv_cache_k(const struct skv_cache *k, uint32_t layer, uint32_t head);
void *skv_cache_v(const struct skv_cache *k, uint32_t layer, uint32_t head);
/* Byte offset of (layer, head)'s first K/V slot in the arena kv_arena names
 * (SNAPKV_1.2); -1 when out of range. */
int64_t skv_cache_k_offset(const struct skv_cache *k, uint32_t layer, uint32_t head);
int64_t skv_cache_v_offset(const struct skv_cache *k, uint32_t layer, uint32_t head);
/*
 * Any layout (SNAPKV_1.5): the address of slot `slot` (< capacity) of
 * (layer, head) in the host arena mapping, or for writeback in the mapping
 * of the destination buffer (skv_buffer_alloc* buffers only). NULL when out
 * of range or not mapped here (CUDA arena or buffer).
 */
void *skv_cache_k_slot(const struct skv_cache *k, uint32_t layer, uint32_t head, uint32_t slot);
void *skv_cache_v_slot(const struct skv_cache *k, uint32_t layer, uint32_t head, uint32_t slot);
/* Which pool of a layer: K or V. */
enum skv_kv {
	SKV_KV_K = 0,
	SKV_KV_V = 1,
};
/*
 * SKV_LAYOUT_PAGED (SNAPKV_1.5): byte offset of the cache's block `block`
 * (< n_blocks) of (layer, K/V): in the arena kv_arena names (SKV_OUT_ARENA),
 * or in the destination buffer (SKV_OUT_WRITEBACK: pool offset +
 * out_block_table[block] * block_stride * dtype size). -1 when out of range
 * or not paged.
 */
int64_t skv_cache_block_offset(const struct skv_cache *k, uint32_t layer, enum skv_kv kv,
			       uint32_t block);
/*
 * SKV_LAYOUT_PAGED in the arena (SNAPKV_1.5): the page-aligned run holding
 * (layer, K/V)'s n_blocks blocks: *ret_offset in the arena kv_arena names,
 * *ret_bytes its length, a page multiple (n_blocks * block bytes, then
 * padding). -EINVAL when not a paged arena cache or out of range.
 */
int skv_cache_block_run(const struct skv_cache *k, uint32_t layer, enum skv_kv kv,
			uint64_t *ret_offset, uint64_t *ret_bytes);
/*
 * Map (layer, K/V)'s run of a paged host-arena cache at addr (page-aligned:
 * typically the engine's pool + b * block bytes), MAP_SHARED|MAP_FIXED,
 * read-write: the pool's blocks b .. b + n_blocks - 1 are then the cache's,
 * and what the pool held there is hidden until skv_buffer_restore() (or
 * another mapping) replaces it. The engine must restore before releasing or
 * growing the cache. -EINVAL: not a paged host-arena cache, addr not
 * page-aligned, out of range; -errno of mmap.
 */
int skv_cache_map_blocks(const struct skv_cache *k, uint32_t layer, enum skv_kv kv, void *addr);
/* Original position of every slot; -1 for decode slots not yet appended. */
const int32_t *skv_cache_positions(const struct skv_cache *k, uint32_t layer, uint32_t head);
float skv_cache_retained_mass(const struct skv_cache *k, uint32_t layer, uint32_t head);
/* Slot index and logical position of the next appended token: kept + g, L + g
 * (ragged caches: head h's next slot is skv_cache_head_kept() + g). */
uint32_t skv_cache_next_slot(const struct skv_cache *k);
uint32_t skv_cache_next_position(const struct skv_cache *k);
/* Report `tokens` K/V rows written at the next slots. -ENOSPC: grow first. */
int skv_cache_append(struct skv_cache *k, uint32_t tokens);
/* More decode headroom: the daemon copies into a larger region; pointers move.
 * A writeback cache: skv_cache_grow_blocks() with no new blocks. */
int skv_cache_grow(struct skv_cache *k, uint32_t extra);
/*
 * GROW of a writeback cache into the engine's new destination blocks
 * (SNAPKV_1.9): capacity grows by extra slots per head (position rows in
 * the arena; nothing of the K/V is copied or written), and table[n] are the
 * engine's blocks for the slots past the cache's n_blocks: exactly
 * ceil((capacity + extra) / block_size) - n_blocks of them (0 when the last
 * block has room). Each must lie inside every layer's K and V pool and
 * meet none of the cache's blocks nor each other (-EINVAL; a pool no longer
 * registered: -ENOENT). capacity - kept may reach the cache's max_decode
 * when it declared one (beyond: -E2BIG, "GROW beyond the declared
 * maximum"), else the daemon's max_reserve. On success the blocks are the
 * cache's (skv_cache_block_offset() and skv_cache_k_slot() find them) and
 * the daemon never writes them (the engine's decode does); on any failure
 * nothing changed. Any other cache: table NULL and n 0, as skv_cache_grow().
 */
int skv_cache_grow_blocks(struct skv_cache *k, uint32_t extra, const int32_t *table, uint32_t n);
/* Free the cache in the daemon and the handle. NULL is fine. */
int skv_cache_release(struct skv_cache *k);
/* Release the handle but let the daemon keep the cache (still counted in
 * the ledger) until memory pressure evicts it, least recently used first,
 * or the session ends. Since SNAPKV_1.1. */
int skv_cache_release_linger(struct skv_cache *k);
/*
 * Release (linger != 0: as skv_cache_release_linger) reporting the engine's
 * g at that point (SNAPKV_1.9), so a writeback cache needs no APPEND per
 * decode step: the daemon counts the cache with it while it lingers. It
 * must lie from the cache's reported g (info->appended) to its decode_limit;
 * else -EINVAL, nothing released, and the handle stays valid.
 */
int skv_cache_release_appended(struct skv_cache *k, uint32_t appended, int linger);

/*
 * Budget modes (SNAPKV_1.6; SPEC.md "Budgets beyond one C"). A description
 * whose params were filled with skv_params_init() (params_size the current
 * one) carries budget_mode, its parameters and fallback_below to snapkvd;
 * uniform with no fallback is today's request. The outcome of a cache:
 */
struct skv_cache_budget {
	uint32_t budget_size; /* sizeof(struct skv_cache_budget), set by the caller */
	enum skv_budget mode; /* uniform for a cache compacted without a mode */
	uint32_t c_star;      /* mass: the chosen C*; uniform: C; otherwise 0 */
	int fallback;	      /* 1: every head kept the full prompt */
	int ragged;	      /* heads keep different counts: per layer one
			       * row block, head h at skv_cache_head_start() */
	float mass_min;	      /* the choice's smallest retained mass (before a fallback) */
	uint32_t kept_min;    /* fewest rows a (layer, head) kept */
	float kept_mean;      /* mean rows kept per (layer, head) */
	/* since SNAPKV_1.7, filled when budget_size covers them: decided in a
	 * decision group of group_size members (0: none), after group_wait_us
	 * from the group's first scored member to the decision */
	uint32_t group_size;
	uint64_t group_wait_us;
};
/* The budget outcome of k into *ret (ret->budget_size set). 0 or -EINVAL. */
int skv_cache_budget(const struct skv_cache *k, struct skv_cache_budget *ret);
/* Rows (layer, head) kept; info->kept for a cache without a mode; 0 out of range. */
uint32_t skv_cache_head_kept(const struct skv_cache *k, uint32_t layer, uint32_t head);
/* Slots of (layer, head): its kept rows + the decode headroom (capacity -
 * kept); 0 out of range. */
uint32_t skv_cache_head_capacity(const struct skv_cache *k, uint32_t layer, uint32_t head);
/* Row of (layer, head)'s slot 0 counted from the layer's K (V, positions)
 * start: the ragged start, or head * capacity in HND; -1 otherwise. */
int64_t skv_cache_head_start(const struct skv_cache *k, uint32_t layer, uint32_t head);
/* Retained mass of a layer over its heads: min and mean (NaN: none). */
float skv_cache_layer_mass_min(const struct skv_cache *k, uint32_t layer);
float skv_cache_layer_mass_mean(const struct skv_cache *k, uint32_t layer);

/* The latest PRESSURE event the daemon posted on this session's ring. */
/* Pressure levels, numbered as snapkv.v1.PressureLevel on the wire (the
 * one encoding snapkvctl uses too). */
enum skv_pressure_level {
	SKV_PRESSURE_NONE = 0, /* no PRESSURE event seen yet */
	SKV_PRESSURE_NORMAL = 1,
	SKV_PRESSURE_HIGH = 2,
	SKV_PRESSURE_CRITICAL = 3,
};

struct skv_pressure {
	uint32_t level; /* enum skv_pressure_level */
	union {
		uint32_t suggested_budget; /* C the daemon suggests for new requests */
		uint32_t suggested_capacity
		    SKV_DEPRECATED("skv_pressure.suggested_capacity is now suggested_budget (C)");
	};
	uint32_t scale_permille; /* factor applied to C of new requests, x1000 */
	uint64_t pool_used;	 /* pool bytes in use at the event */
	uint64_t events;	 /* events seen on this session */
};
/* Takes pending completions off the ring (without waiting) and returns the
 * latest pressure event. Since SNAPKV_1.1. */
int skv_client_pressure(struct skv_client *c, struct skv_pressure *ret);

struct skv_stats {
	uint64_t caches, buffers, arena_used, arena_bytes, requests, errors;
	uint64_t pool_total, pool_used;
};
int skv_client_stats(struct skv_client *c, struct skv_stats *ret_stats);

/* A no-op round trip, over the shared ring or over the socket (benchmarks,
 * liveness checks). */
int skv_client_nop(struct skv_client *c);
int skv_client_nop_socket(struct skv_client *c);

#ifdef __cplusplus
}
#endif
#endif /* SNAPKV_H */
