/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda.h - the CUDA backend of libskv (libskv-cuda.so): SnapKV compaction
 * on the GPU with the contract of skv.h, plus GPU arenas and imports of
 * engine buffers over CUDA IPC.
 *
 * The library links the CUDA runtime statically and reaches the driver API
 * through cudaGetDriverEntryPointByVersion(), so it has no link-time
 * dependency on libcuda: it loads on any machine, and skv_cuda_dev_open()
 * fails with -ENODEV and a readable reason where no driver or device is.
 * A daemon dlopen()s it through skv-backend.h; tests may link it directly.
 *
 * Every pointer inside the skv_layer_in / skv_layer_out structs given to
 * skv_cuda_compact() is a device pointer (tensors, block tables, positions,
 * retained_mass) valid on the device the context was opened on. Every
 * fallible call returns 0 or a negative errno and fills *err when given.
 */
#ifndef SKV_CUDA_H
#define SKV_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "skv.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SKV_CUDA_ABI 1

/* One CUDA device: driver entry points, the import table, arenas. Thread-safe. */
struct skv_cuda_dev;
/* One stream and its scratch: one compaction in flight at a time. Not thread-safe. */
struct skv_cuda_ctx;
/* An engine buffer imported into this process (refcounted). */
struct skv_cuda_import;
/* A tenant arena: VMM memory exportable as a POSIX fd. */
struct skv_cuda_arena;

struct skv_cuda_info {
	char name[256];
	int device;
	int cc_major, cc_minor;
	int sm_count;
	uint64_t total_mem;	/* bytes                                        */
	double hbm_bytes_per_s; /* peak: 2 * memory clock * bus width / 8       */
	int vmm_posix_fd;	/* 1: cuMemCreate + POSIX fd export supported   */
	int driver_version;	/* cudaDriverGetVersion()                        */
	int runtime_version;	/* cudaRuntimeGetVersion()                       */
};

/*
 * Open device `device` (-1: the current/first one). -ENODEV when there is no
 * driver or no such device, -ENOSYS when a driver entry point is missing.
 */
int skv_cuda_dev_open(int device, struct skv_cuda_dev **ret_dev, struct skv_error *err);
/* The CUDA devices this process sees: 0, or -ENODEV (no driver or none). */
int skv_cuda_dev_count(int *ret_n, struct skv_error *err);
/*
 * The device (ordinal in this process) an engine's memory lives on: a VMM
 * POSIX fd (fd >= 0; not consumed) or the 64 bytes of a cudaIpcMemHandle_t
 * (opened on dev and closed again to ask). The engine's own ordinal may
 * differ (CUDA_VISIBLE_DEVICES): this one names the same GPU in this
 * process. 0, -EINVAL (not a valid fd or handle), -EIO.
 */
int skv_cuda_locate(struct skv_cuda_dev *dev, int fd, const void *handle64, int *ret_device,
		    struct skv_error *err);
/* Frees everything still imported or allocated on it. NULL is fine. */
void skv_cuda_dev_close(struct skv_cuda_dev *dev);
int skv_cuda_dev_info(const struct skv_cuda_dev *dev, struct skv_cuda_info *ret_info);

/* A context owns a non-blocking CUDA stream. 0, -ENOMEM, -EIO. */
int skv_cuda_ctx_new(struct skv_cuda_dev *dev, struct skv_cuda_ctx **ret_ctx,
		     struct skv_error *err);
void skv_cuda_ctx_free(struct skv_cuda_ctx *ctx);
/* The context's cudaStream_t, for callers that enqueue their own work. */
void *skv_cuda_ctx_stream(struct skv_cuda_ctx *ctx);

/*
 * Order the next compaction after the engine's prefill, without blocking the
 * host: wait on an interprocess event (the 64 bytes of a cudaIpcEventHandle_t
 * from cudaIpcGetEventHandle), or until the 32-bit word at device address
 * `flag` is >= value (cuStreamWaitValue32; the word usually lives in an
 * imported buffer the engine writes).
 */
int skv_cuda_ctx_wait_ipc_event(struct skv_cuda_ctx *ctx, const void *handle64,
				struct skv_error *err);
int skv_cuda_ctx_wait_value(struct skv_cuda_ctx *ctx, const void *flag, uint32_t value,
			    struct skv_error *err);
/*
 * Store `value` into the 32-bit word at device address `flag` from the host
 * (a synchronous copy, ordered after no stream of this library): releases a
 * stream left in skv_cuda_ctx_wait_value() by an engine that never signals.
 * Safe to call from any thread. 0, -EINVAL (unaligned), -EIO.
 */
int skv_cuda_signal_value(struct skv_cuda_dev *dev, void *flag, uint32_t value,
			  struct skv_error *err);

/*
 * Read the 32-bit word at device address `flag` from the host (a synchronous
 * copy, ordered after no stream of this library): whether an engine has
 * reached a prefill flag while a context's stream is still queued behind it.
 * Safe to call from any thread. 0, -EINVAL (unaligned), -EIO.
 */
int skv_cuda_read_value(struct skv_cuda_dev *dev, const void *flag, uint32_t *ret_value,
			struct skv_error *err);

/*
 * An engine's interprocess event (the 64 bytes of a cudaIpcEventHandle_t
 * from cudaIpcGetEventHandle of an event created with cudaEventInterprocess |
 * cudaEventDisableTiming), opened on dev for polling from the host: a caller
 * that must bound the wait polls skv_cuda_event_query() and enqueues its
 * work once it returns 0, instead of a stream wait that nothing but the
 * engine could end. Open: 0, -EINVAL (not a valid handle: the message says
 * why), -EIO. Query never blocks: 0 once the work recorded in the event has
 * completed (also for an event never recorded), -EAGAIN while it has not,
 * -EIO on a CUDA error. Not thread-safe per event; close accepts NULL.
 */
struct skv_cuda_event;
int skv_cuda_event_open(struct skv_cuda_dev *dev, const void *handle64,
			struct skv_cuda_event **ret_ev, struct skv_error *err);
int skv_cuda_event_query(struct skv_cuda_event *ev, struct skv_error *err);
void skv_cuda_event_close(struct skv_cuda_event *ev);

/*
 * Enqueue a compaction of n_layers layers on the context's stream; returns
 * once every kernel is queued, never waiting for the GPU. Validation errors
 * (-EINVAL; -ENOTSUP for what the GPU path does not take: head_dim > 256, q
 * and k of different dtypes, K and V of different dtypes, dtypes that change
 * between layers; -EBUSY while the context's previous compaction has not been
 * synced; budget modes as skv_compact(): uniform and layers without a
 * fallback, the others need skv_cuda_compact_budget()) are returned here, before anything is
 * enqueued; -ENOMEM/-EIO when scratch or a launch fails (the context is drained and reusable).
 * Results and -EDOM (NaN/Inf logits: err names layer and query head) come from skv_cuda_ctx_sync()
 * / skv_cuda_ctx_query().
 */
int skv_cuda_compact(struct skv_cuda_ctx *ctx, const struct skv_shape *shape,
		     const struct skv_params *params, uint32_t n_layers,
		     const struct skv_layer_in *in, const struct skv_layer_out *out,
		     struct skv_error *err);
/*
 * skv_compact_budget() on the GPU: every budget mode of SPEC.md (uniform,
 * layers list or pyramid, heads, mass, mass-heads) and fallback_below, from
 * the one scoring pass, with the host's decisions bit for bit (given the same
 * votes). Inputs, outputs and checks as skv_compact_budget() (skv.h): each
 * stored head of layer l needs room for rows[l] of skv_budget_rows(); head h
 * writes its kept_h rows at (h, 0 .. kept_h - 1) and its positions at
 * h * pos_stride. `res` and res->kept are HOST memory, filled when
 * skv_cuda_ctx_sync() / skv_cuda_ctx_query() returns 0 for this compaction
 * (kept[n_layers][h_store], c_star, fallback, min_mass): keep them valid until
 * then; on an error nothing is written there. res may be NULL for uniform and
 * layers without a fallback. Uniform without a fallback runs exactly the
 * kernels of skv_cuda_compact() (the same bytes). Returns as
 * skv_cuda_compact(); -ENOTSUP also for heads with h_store x L above 2^31.
 */
int skv_cuda_compact_budget(struct skv_cuda_ctx *ctx, const struct skv_shape *shape,
			    const struct skv_params *params, uint32_t n_layers,
			    const struct skv_layer_in *in, const struct skv_layer_out *out,
			    struct skv_budget_result *res, struct skv_error *err);
/*
 * A decision-group member's outputs for the group's choice (SPEC.md
 * "Decision groups"; the host's skv_compact_end()): as
 * skv_cuda_compact_budget() with C* = c_star (mass: the group's, never below
 * this member's own; the other modes ignore it) and, when `fallback`, the
 * full prompt kept (needs fallback_below > 0). With the member's own C* and
 * fallback it writes exactly what skv_cuda_compact_budget() writes. res is
 * required; res->min_mass is the choice's, before the fallback.
 */
int skv_cuda_compact_decided(struct skv_cuda_ctx *ctx, const struct skv_shape *shape,
			     const struct skv_params *params, uint32_t n_layers,
			     const struct skv_layer_in *in, const struct skv_layer_out *out,
			     uint32_t c_star, int fallback, struct skv_budget_result *res,
			     struct skv_error *err);
/* Wait for the last compaction: 0, -EDOM, -EIO (a CUDA error, named in err). */
int skv_cuda_ctx_sync(struct skv_cuda_ctx *ctx, struct skv_error *err);
/* As sync, but -EAGAIN while it still runs. */
int skv_cuda_ctx_query(struct skv_cuda_ctx *ctx, struct skv_error *err);

/* One 2-D copy: `height` rows of `width` bytes, rows `spitch`/`dpitch` apart. */
struct skv_cuda_copy {
	void *dst;
	const void *src;
	uint64_t width;	 /* bytes per row                              */
	uint64_t height; /* rows (1: one plain copy of width bytes)    */
	uint64_t dpitch; /* bytes from one row to the next (>= width)  */
	uint64_t spitch;
};
/*
 * Enqueue n copies on the context's stream as one operation that
 * skv_cuda_ctx_sync()/query() wait for, like a compaction (device memory,
 * imports, arenas or registered host memory: the direction is taken from the
 * addresses). Returns once queued. The copies run in their order, each as
 * if through a buffer (memmove): one whose source and destination overlap
 * (a budget mode's head moved down its layer in a GPU arena) is staged
 * through device memory the context keeps, as large as the largest such
 * copy. A copy with no bytes, or of a range onto itself, is skipped. 0;
 * -EINVAL (a NULL address, a pitch below its width); -EBUSY while the
 * context's previous operation has not been synced; -ENOMEM (no device
 * memory for the staging: nothing queued); -EIO (the context is drained and
 * reusable).
 */
int skv_cuda_ctx_copy(struct skv_cuda_ctx *ctx, const struct skv_cuda_copy *copies, uint32_t n,
		      struct skv_error *err);
/*
 * Copy `bytes` of host memory into device memory the context owns, on its
 * stream, so that the next compaction reads them from there (a paged
 * layout's block table, which the kernels read once per token). Call it
 * before any stream wait: a copy from pageable memory waits for the stream.
 * The host memory may be reused on return; *ret_dev stays valid until the
 * next upload or skv_cuda_ctx_free(). 0, -EINVAL, -EBUSY (previous operation
 * not synced), -ENOMEM, -EIO.
 */
int skv_cuda_ctx_upload(struct skv_cuda_ctx *ctx, const void *host, uint64_t bytes, void **ret_dev,
			struct skv_error *err);

/*
 * Import an engine buffer, keyed by (tenant, generation): a second import
 * with the same key returns the same object with its refcount raised (the fd
 * or handle of that call is not used). The fd is not consumed; the caller
 * closes it. size must be the exported allocation's size (a multiple of the
 * allocation granularity). -EINVAL for a bad fd/handle or size, -ENOTSUP
 * where the device cannot import VMM fds, -EXDEV for memory of another
 * device (import it on that device: skv_cuda_locate() says which; peer
 * access is never used, so every read stays on the device holding the
 * memory), -ENOMEM.
 */
int skv_cuda_import_fd(struct skv_cuda_dev *dev, uint64_t tenant, uint64_t generation, int fd,
		       uint64_t size, struct skv_cuda_import **ret_imp, struct skv_error *err);
/* Legacy path: the 64 bytes of a cudaIpcMemHandle_t (cudaIpcGetMemHandle). */
int skv_cuda_import_ipc(struct skv_cuda_dev *dev, uint64_t tenant, uint64_t generation,
			const void *handle64, struct skv_cuda_import **ret_imp,
			struct skv_error *err);
void *skv_cuda_import_ptr(const struct skv_cuda_import *imp);
uint64_t skv_cuda_import_size(const struct skv_cuda_import *imp);
/* "cuda-vmm-fd" or "cuda-ipc": the transport actually used, for ledgers and status. */
const char *skv_cuda_import_transport(const struct skv_cuda_import *imp);
/*
 * Drop one reference; the mapping goes with the last (after a device-wide
 * synchronisation, so that no queued kernel still reads it). NULL is fine.
 */
void skv_cuda_import_release(struct skv_cuda_import *imp);
/*
 * Drop every import of a tenant whatever its refcount (its session ended),
 * after a device-wide synchronisation. The tenant's import pointers are dead
 * afterwards: do not release them again. Returns the count.
 */
unsigned skv_cuda_release_tenant(struct skv_cuda_dev *dev, uint64_t tenant);

/*
 * Host memory (e.g. a memfd mapping) made readable and writable by the
 * kernels in place (page-locked, mapped; zero-copy over the bus). On return
 * *ret_dev is the address kernels use for `ptr` (the same address under
 * unified addressing). The range is rounded out to whole pages; a read-only
 * mapping is registered read-only; a range already registered is -EEXIST.
 * Unregister before unmapping.
 */
int skv_cuda_host_register(struct skv_cuda_dev *dev, void *ptr, uint64_t size, void **ret_dev,
			   struct skv_error *err);
void skv_cuda_host_unregister(struct skv_cuda_dev *dev, void *ptr);

/*
 * A tenant arena: cuMemCreate (POSIX fd handle type) of at least `size`
 * bytes, rounded up to the granularity, mapped read-write on the device.
 */
int skv_cuda_arena_new(struct skv_cuda_dev *dev, uint64_t size, struct skv_cuda_arena **ret_arena,
		       struct skv_error *err);
/* A new fd for the arena (to pass over SCM_RIGHTS); the caller closes it. */
int skv_cuda_arena_export_fd(struct skv_cuda_arena *arena, int *ret_fd, struct skv_error *err);
void *skv_cuda_arena_ptr(const struct skv_cuda_arena *arena);
uint64_t skv_cuda_arena_size(const struct skv_cuda_arena *arena);
void skv_cuda_arena_free(struct skv_cuda_arena *arena);

#ifdef __cplusplus
}
#endif
#endif /* SKV_CUDA_H */
