/* SPDX-License-Identifier: MIT */
/*
 * skv-backend.h - loading the CUDA backend at run time.
 *
 * The daemon never links CUDA: for `--backend cuda` it calls
 * skv_backend_load(), which dlopen()s libskv-cuda.so and takes its function
 * table. On a machine without a GPU this fails cleanly, with -ENOENT when the
 * plugin is not there (not built, wrong path) and -ENODEV when there is no
 * driver ("no CUDA driver found: libcuda.so.1: cannot open shared object
 * file ...") or no device; the host backend is untouched either way. The
 * loader itself is plain C (libskv-backend.a) and needs only libc.
 *
 * The ops mirror skv-cuda.h one for one; see there for what each does.
 */
#ifndef SKV_BACKEND_H
#define SKV_BACKEND_H

#include <stdint.h>

#include "skv.h"

#ifdef __cplusplus
extern "C" {
#endif

struct skv_cuda_dev;
struct skv_cuda_ctx;
struct skv_cuda_import;
struct skv_cuda_arena;
struct skv_cuda_info;
struct skv_cuda_event;
struct skv_cuda_copy;

struct skv_backend_ops {
	uint32_t abi;  /* SKV_CUDA_ABI of the plugin                        */
	uint32_t size; /* sizeof(struct skv_backend_ops) the plugin was built with */
	const char *name;
	int (*dev_open)(int device, struct skv_cuda_dev **ret_dev, struct skv_error *err);
	void (*dev_close)(struct skv_cuda_dev *dev);
	int (*dev_info)(const struct skv_cuda_dev *dev, struct skv_cuda_info *ret_info);
	int (*ctx_new)(struct skv_cuda_dev *dev, struct skv_cuda_ctx **ret_ctx,
		       struct skv_error *err);
	void (*ctx_free)(struct skv_cuda_ctx *ctx);
	void *(*ctx_stream)(struct skv_cuda_ctx *ctx);
	int (*ctx_wait_ipc_event)(struct skv_cuda_ctx *ctx, const void *handle64,
				  struct skv_error *err);
	int (*ctx_wait_value)(struct skv_cuda_ctx *ctx, const void *flag, uint32_t value,
			      struct skv_error *err);
	int (*compact)(struct skv_cuda_ctx *ctx, const struct skv_shape *shape,
		       const struct skv_params *params, uint32_t n_layers,
		       const struct skv_layer_in *in, const struct skv_layer_out *out,
		       struct skv_error *err);
	int (*ctx_sync)(struct skv_cuda_ctx *ctx, struct skv_error *err);
	int (*ctx_query)(struct skv_cuda_ctx *ctx, struct skv_error *err);
	int (*import_fd)(struct skv_cuda_dev *dev, uint64_t tenant, uint64_t generation, int fd,
			 uint64_t size, struct skv_cuda_import **ret_imp, struct skv_error *err);
	int (*import_ipc)(struct skv_cuda_dev *dev, uint64_t tenant, uint64_t generation,
			  const void *handle64, struct skv_cuda_import **ret_imp,
			  struct skv_error *err);
	void *(*import_ptr)(const struct skv_cuda_import *imp);
	uint64_t (*import_size)(const struct skv_cuda_import *imp);
	const char *(*import_transport)(const struct skv_cuda_import *imp);
	void (*import_release)(struct skv_cuda_import *imp);
	unsigned (*release_tenant)(struct skv_cuda_dev *dev, uint64_t tenant);
	int (*arena_new)(struct skv_cuda_dev *dev, uint64_t size, struct skv_cuda_arena **ret_arena,
			 struct skv_error *err);
	int (*arena_export_fd)(struct skv_cuda_arena *arena, int *ret_fd, struct skv_error *err);
	void *(*arena_ptr)(const struct skv_cuda_arena *arena);
	uint64_t (*arena_size)(const struct skv_cuda_arena *arena);
	void (*arena_free)(struct skv_cuda_arena *arena);
	int (*host_register)(struct skv_cuda_dev *dev, void *ptr, uint64_t size, void **ret_dev,
			     struct skv_error *err);
	void (*host_unregister)(struct skv_cuda_dev *dev, void *ptr);
	/* 1: a CPU emulation (tests/gpu/emu), which needs no driver */
	int emulated;
	int (*signal_value)(struct skv_cuda_dev *dev, void *flag, uint32_t value,
			    struct skv_error *err);
	/* CUDA_IPC_EVENT prefill waits: an engine's interprocess event, opened
	 * once per request and polled from the host (never waited on by a
	 * stream, so no wait can outlive its deadline) */
	int (*event_open)(struct skv_cuda_dev *dev, const void *handle64,
			  struct skv_cuda_event **ret_ev, struct skv_error *err);
	int (*event_query)(struct skv_cuda_event *ev, struct skv_error *err);
	void (*event_close)(struct skv_cuda_event *ev);
	/* copies on a context's stream: GROW of a cache in a GPU arena (device
	 * to device), a budget mode's heads settled there (overlapping moves,
	 * staged), and a paged layout's block table put in device memory */
	int (*ctx_copy)(struct skv_cuda_ctx *ctx, const struct skv_cuda_copy *copies, uint32_t n,
			struct skv_error *err);
	int (*ctx_upload)(struct skv_cuda_ctx *ctx, const void *host, uint64_t bytes,
			  void **ret_dev, struct skv_error *err);
	/* a prefill flag's current value: at the deadline, whether the engine
	 * reached it (the kernels behind the wait may still run) */
	int (*read_value)(struct skv_cuda_dev *dev, const void *flag, uint32_t *ret_value,
			  struct skv_error *err);
	/* every budget mode of SPEC.md (skv_compact_budget() on the GPU); res
	 * is host memory, filled when ctx_sync()/ctx_query() returns 0 */
	int (*compact_budget)(struct skv_cuda_ctx *ctx, const struct skv_shape *shape,
			      const struct skv_params *params, uint32_t n_layers,
			      const struct skv_layer_in *in, const struct skv_layer_out *out,
			      struct skv_budget_result *res, struct skv_error *err);
	/* several devices: how many there are, and which one an engine's
	 * memory lives on (one context per device, each import on its own) */
	int (*dev_count)(int *ret_n, struct skv_error *err);
	int (*locate)(struct skv_cuda_dev *dev, int fd, const void *handle64, int *ret_device,
		      struct skv_error *err);
	/* decision groups: a member's outputs for the group's C* and fallback */
	int (*compact_decided)(struct skv_cuda_ctx *ctx, const struct skv_shape *shape,
			       const struct skv_params *params, uint32_t n_layers,
			       const struct skv_layer_in *in, const struct skv_layer_out *out,
			       uint32_t c_star, int fallback, struct skv_budget_result *res,
			       struct skv_error *err);
};

/* The one symbol the loader looks up in the plugin. */
#define SKV_BACKEND_SYMBOL "skv_cuda_backend_ops"
const struct skv_backend_ops *skv_cuda_backend_ops(void);

/* A loaded plugin with one opened device. */
struct skv_backend {
	void *dl;      /* dlopen() handle of the plugin   */
	void *libcuda; /* dlopen() handle of the driver    */
	const struct skv_backend_ops *ops;
	struct skv_cuda_dev *dev;
	char path[512]; /* the plugin actually loaded      */
};

/* Plugin file name searched when no path is given (dlopen's search rules). */
#define SKV_CUDA_PLUGIN "libskv-cuda.so"

/*
 * Load the plugin at `path` (NULL: $SKV_CUDA_PLUGIN, else libskv-cuda.so in
 * the running program's directory if there is one, else SKV_CUDA_PLUGIN
 * through the dynamic linker's search path) and open `device` (-1: the first).
 * 0; -ENOENT (plugin missing or not loadable, or its table absent/too old);
 * -ENODEV (no CUDA driver, no device); -EINVAL; -ENOMEM. err says which.
 */
int skv_backend_load(const char *path, int device, struct skv_backend **ret_be,
		     struct skv_error *err);
/* Close the device and unload. NULL is fine. */
void skv_backend_unload(struct skv_backend *be);

#ifdef __cplusplus
}
#endif
#endif /* SKV_BACKEND_H */
