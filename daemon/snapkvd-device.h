/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-device.h - what lives on the GPUs (--backend cuda): the CUDA
 * plugin (kernels/cuda, dlopen()ed: no CUDA library is linked into
 * snapkvd) with one context per device the config's `devices` names
 * (default: every device visible), engine buffer imports (loop thread),
 * each on the device that holds the buffer, the sessions' GPU arenas (loop
 * thread), per-device totals, and the waiter thread that releases prefill
 * flag waits past their deadline.
 *
 * A device is named two ways: its ordinal (CUDA's, in this process: what
 * the config, the logs and the metrics say) and its index among the opened
 * ones (0 .. snapkvd_device_count() - 1: what jobs, buffers and workers
 * carry).
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

/* Devices one daemon opens at most (the config's `devices` list). */
#define SNAPKVD_DEVICES_MAX 16

/* A CUDA import as the buffer keeps it. */
struct snapkvd_import {
	void *imp;
	unsigned gpu;	    /* index of the device holding it */
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
	unsigned gpu; /* index of the device whose stream waits (set before adding) */
	struct snapkvd_device_wait *next;
};

/* The device of `backend` ("cuda": the plugin is loaded on each device of
 * `devices` (n_devices ordinals; 0: every device visible) and the waiter
 * started; anything else: none). 0, or -errno with a reason in kerr (a
 * device that is not there names the key `devices`); *ret untouched on
 * failure. */
int snapkvd_device_new(const char *backend, const int *devices, unsigned n_devices,
		       struct snapkvd_device **ret, struct skv_error *kerr);
/* After every job, buffer and GPU arena is gone. Accepts NULL. */
void snapkvd_device_free(struct snapkvd_device *d);

bool snapkvd_device_present(const struct snapkvd_device *d);
/* The config's backend: "host", "cuda". */
const char *snapkvd_device_backend(const struct snapkvd_device *d);
/* "NAME sm_XY" of the GPUs ("" without one): "cuda0 NAME sm_XY, cuda1 ...". */
const char *snapkvd_device_desc(const struct snapkvd_device *d);
/* Opened devices (0 without a plugin). */
unsigned snapkvd_device_count(const struct snapkvd_device *d);
/* The CUDA ordinal of opened device `gpu`. */
int snapkvd_device_ordinal(const struct snapkvd_device *d, unsigned gpu);
/* The index of the opened device with CUDA ordinal `ordinal`, or -1. */
int snapkvd_device_index(const struct snapkvd_device *d, int ordinal);
/* The plugin's table and the handle of opened device `gpu` (present devices only). */
const struct skv_backend_ops *snapkvd_device_ops(const struct snapkvd_device *d);
struct skv_cuda_dev *snapkvd_device_dev(const struct snapkvd_device *d, unsigned gpu);

/* What one opened device holds now and has done (for status, the ledger
 * and the metrics). */
struct snapkvd_device_stats {
	int ordinal;
	const char *name; /* "NAME sm_XY" */
	unsigned imports;
	uint64_t import_bytes; /* of the imported allocations */
	unsigned arenas;       /* sessions' GPU arenas */
	uint64_t arena_bytes;
	uint64_t jobs; /* run on it, since start */
};
/* Loop thread (jobs: any thread). gpu < snapkvd_device_count(). */
void snapkvd_device_stats(const struct snapkvd_device *d, unsigned gpu,
			  struct snapkvd_device_stats *ret);
/* One more job run on opened device gpu (its worker). */
void snapkvd_device_job_ran(struct snapkvd_device *d, unsigned gpu);

/* The daemon is stopping: prefill waits give up. Any thread. */
void snapkvd_device_stop(struct snapkvd_device *d);
bool snapkvd_device_stopping(struct snapkvd_device *d);

/* Import engine memory keyed by (session_id, key): a VMM fd (consumed by
 * the plugin's import only on success: the caller closes it) or a CUDA
 * IPC handle, on the device that holds it (the fd or handle says which;
 * `engine_device`, the engine's own ordinal, only names it in messages).
 * -ENOTSUP without a device; -ENODEV for memory on a device this daemon
 * has not opened; 0 or -errno with a reason. */
int snapkvd_device_import(struct snapkvd_device *d, uint64_t session_id, uint64_t key, int fd,
			  uint64_t size, const void *ipc_handle, int engine_device,
			  struct snapkvd_import *ret, char *err, size_t errlen);
void snapkvd_device_import_release(struct snapkvd_device *d, const struct snapkvd_import *imp);
/* Live imports (loop thread). */
unsigned snapkvd_device_imports(const struct snapkvd_device *d);

/* The GPU arena *a on opened device gpu (created on first use, as large as
 * the host arena) and a new fd for it. -ENOTSUP without a device; 0 or
 * -errno with a reason. */
int snapkvd_device_arena_export(struct snapkvd_device *d, unsigned gpu, struct skv_cuda_arena **a,
				uint64_t host_size, uint64_t session_id, int *ret_fd,
				uint64_t *ret_size, int *ret_device, char *err, size_t errlen);
/* Device address of a GPU arena's base (NULL: none). */
uint8_t *snapkvd_device_arena_base(struct snapkvd_device *d, struct skv_cuda_arena *a);
void snapkvd_device_arena_free(struct snapkvd_device *d, unsigned gpu, struct skv_cuda_arena *a);

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
