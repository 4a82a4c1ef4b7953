/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-loader.c - dlopen() of the CUDA backend plugin (skv-backend.h).
 *
 * The plugin is loaded first, so a missing plugin reads as -ENOENT whatever
 * the machine; then the driver is probed by its soname, so a machine without
 * the NVIDIA driver gets dlerror()'s own words instead of a CUDA runtime
 * error code; then the plugin opens the device ("no CUDA device").
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "skv-backend.h"

static int fail(struct skv_error *err, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct skv_error *err, int r, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		err->layer = -1;
		err->head = -1;
	}
	return r;
}

/*
 * The plugin next to the running program (an in-tree build/snapkvd finds
 * build/libskv-cuda.so), or NULL when there is none.
 */
static const char *beside_exe(char *buf, size_t len)
{
	ssize_t n = readlink("/proc/self/exe", buf, len - 1);
	if (n <= 0)
		return NULL;
	buf[n] = 0;
	char *slash = strrchr(buf, '/');
	if (!slash || (size_t)(slash - buf) + 1 + sizeof(SKV_CUDA_PLUGIN) > len)
		return NULL;
	memcpy(slash + 1, SKV_CUDA_PLUGIN, sizeof(SKV_CUDA_PLUGIN));
	return access(buf, R_OK) == 0 ? buf : NULL;
}

void skv_backend_unload(struct skv_backend *be)
{
	if (!be)
		return;
	if (be->dev && be->ops)
		be->ops->dev_close(be->dev);
	/*
	 * The plugin carries a static CUDA runtime that registers exit-time
	 * handlers; unloading it while the process lives on would leave them
	 * dangling, so the handles stay open (RTLD_NODELETE semantics).
	 */
	free(be);
}

int skv_backend_load(const char *path, int device, struct skv_backend **ret_be,
		     struct skv_error *err)
{
	struct skv_backend *be;
	char exe_dir[512];
	const char *why;
	int r;

	if (!ret_be)
		return fail(err, -EINVAL, "ret_be is required");
	if (!path || !*path)
		path = getenv("SKV_CUDA_PLUGIN");
	if (!path || !*path)
		path = beside_exe(exe_dir, sizeof(exe_dir));
	if (!path || !*path)
		path = SKV_CUDA_PLUGIN;
	be = calloc(1, sizeof(*be));
	if (!be)
		return fail(err, -ENOMEM, "out of memory");
	snprintf(be->path, sizeof(be->path), "%s", path);

	be->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!be->dl) {
		why = dlerror();
		r = fail(err, -ENOENT, "CUDA backend not available: %s",
			 why ? why : "dlopen failed");
		goto fail;
	}
	dlerror();
	const struct skv_backend_ops *(*get)(void) =
	    (const struct skv_backend_ops *(*)(void))dlsym(be->dl, SKV_BACKEND_SYMBOL);
	be->ops = get ? get() : NULL;
	if (!be->ops) {
		r = fail(err, -ENOENT, "%s has no %s: not a snapkvd CUDA backend", path,
			 SKV_BACKEND_SYMBOL);
		goto fail;
	}
	/* ops are only ever appended (the copy ones last): a shorter table
	 * is a plugin older than this daemon, which would miss some of them */
	if (be->ops->abi != 1 || be->ops->size < sizeof(struct skv_backend_ops)) {
		r = fail(err, -ENOENT,
			 "%s: backend ABI %u (table %u bytes), expected 1 (%zu): a plugin of "
			 "another snapkvd version; rebuild it",
			 path, be->ops->abi, be->ops->size, sizeof(struct skv_backend_ops));
		be->ops = NULL;
		goto fail;
	}

	/* the CPU emulation of tests/gpu/emu is the one plugin that needs no driver */
	if (!be->ops->emulated)
		be->libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (!be->ops->emulated && !be->libcuda) {
		why = dlerror();
		r = fail(err, -ENODEV, "no CUDA driver found: %s",
			 why ? why : "libcuda.so.1 cannot be loaded");
		goto fail;
	}
	r = be->ops->dev_open(device, &be->dev, err);
	if (r < 0)
		goto fail;
	*ret_be = be;
	return 0;
fail:
	be->dev = NULL;
	skv_backend_unload(be);
	return r;
}
