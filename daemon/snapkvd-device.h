/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-device.h - what lives on the GPU (--backend cuda): the CUDA
 * plugin (kernels/cuda, dlopen()ed: no CUDA library is linked into
 * snapkvd), engine buffer imports (loop thread), the sessions' GPU arenas
 * (loop thread), and the waiter thread that releases prefill flag waits
 * past their deadline.
 *
 * It sits below the buffers, the sessions and the CUDA runner, which only
 * runs jobs on it, and calls none of them. On the host backend there is
 * a device object without a plugin: snapkvd_device_present() is false and
 * imports and GPU arenas answer -ENOTSUP.
 */
#ifndef SNAPKVD_DEVICE_H
#define SNAPKVD_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "skv.h"

struct snapkvd_device;
struct skv_backend_ops;
struct skv_cuda_dev;
struct skv_cuda_arena;

/* A CUDA import as the buffer keeps it. */
struct snapkvd_import {
	void *imp;
	const uint8_t *ptr; /* device address of the allocation's start */
	uint64_t size;	    /* of the allocation */
	const char *transport;
};

/*
 * A prefill flag wait of one worker context: armed before its stream
 * waits; the waiter thread releases it at `deadline` by writing `value`
 * into `flag`, unless the flag holds it by then (`met`: the kernels behind
 * it may still run). Fields under the device's lock.
 */
struct snapkvd_device_wait {
	void *flag; /* NULL: not armed */
	uint32_t value;
	uint64_t deadline; /* CLOCK_MONOTONIC ns */
	bool fired, met;
	/* set by its owner before arming (NULL: none): true releases the wait
	 * before its deadline (its job was cancelled); read by the waiter when
	 * snapkvd_device_wait_poke() wakes it */
	bool (*stop)(const void *arg);
	const void *stop_arg;
	bool stopped; /* released by stop() */
	struct snapkvd_device_wait *next;
};

/* The device of `backend` ("cuda": the plugin is loaded and the waiter
 * started; anything else: none). 0, or -errno with a reason in kerr;
 * *ret untouched on failure. */
int snapkvd_device_new(const char *backend, struct snapkvd_device **ret, struct skv_error *kerr);
/* After every job, buffer and GPU arena is gone. Accepts NULL. */
void snapkvd_device_free(struct snapkvd_device *d);

bool snapkvd_device_present(const struct snapkvd_device *d);
/* The config's backend: "host", "cuda". */
const char *snapkvd_device_backend(const struct snapkvd_device *d);
/* "NAME sm_XY" of the GPU ("" without one). */
const char *snapkvd_device_desc(const struct snapkvd_device *d);
/* The plugin's table and device handle (present devices only). */
const struct skv_backend_ops *snapkvd_device_ops(const struct snapkvd_device *d);
struct skv_cuda_dev *snapkvd_device_dev(const struct snapkvd_device *d);

/* The daemon is stopping: prefill waits give up. Any thread. */
void snapkvd_device_stop(struct snapkvd_device *d);
bool snapkvd_device_stopping(struct snapkvd_device *d);

/* Import engine memory keyed by (session_id, key): a VMM fd (consumed by
 * the plugin's import only on success: the caller closes it) or a CUDA
 * IPC handle. -ENOTSUP without a device; 0 or -errno with a reason. */
int snapkvd_device_import(struct snapkvd_device *d, uint64_t session_id, uint64_t key, int fd,
			  uint64_t size, const void *ipc_handle, struct snapkvd_import *ret,
			  char *err, size_t errlen);
void snapkvd_device_import_release(struct snapkvd_device *d, void *imp);
/* Live imports (loop thread). */
unsigned snapkvd_device_imports(const struct snapkvd_device *d);

/* The GPU arena *a (created on first use, as large as the host arena) and a
 * new fd for it. -ENOTSUP without a device; 0 or -errno with a reason. */
int snapkvd_device_arena_export(struct snapkvd_device *d, struct skv_cuda_arena **a,
				uint64_t host_size, uint64_t session_id, int *ret_fd,
				uint64_t *ret_size, int *ret_device, char *err, size_t errlen);
/* Device address of a GPU arena's base (NULL: none). */
uint8_t *snapkvd_device_arena_base(struct snapkvd_device *d, struct skv_cuda_arena *a);
void snapkvd_device_arena_free(struct snapkvd_device *d, struct skv_cuda_arena *a);

/* A worker context's wait joins (leaves) the waiter's list. */
void snapkvd_device_wait_add(struct snapkvd_device *d, struct snapkvd_device_wait *w);
void snapkvd_device_wait_remove(struct snapkvd_device *d, struct snapkvd_device_wait *w);
/* Arm w before the stream waits on flag >= value, until deadline. */
void snapkvd_device_wait_arm(struct snapkvd_device *d, struct snapkvd_device_wait *w, void *flag,
			     uint32_t value, uint64_t deadline);
/* Something a wait's stop() reads has changed: the waiter looks again. Any
 * thread. */
void snapkvd_device_wait_poke(struct snapkvd_device *d);
/* The wait is over: whether the waiter had to release it. */
bool snapkvd_device_wait_disarm(struct snapkvd_device *d, struct snapkvd_device_wait *w);

#endif
