/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-runner.h - what runs a job: the host kernels (snapkvd-runner-host.c)
 * or the CUDA plugin (snapkvd-runner-cuda.c), behind one ops table so the
 * compactor never asks which. A runner context is one worker's: a kernel
 * thread pool, and with CUDA a stream too.
 *
 * The CUDA runner also owns what lives on the device: buffer imports and the
 * sessions' GPU arenas (loop thread), and the waiter thread that releases
 * prefill waits past their deadline.
 */
#ifndef SNAPKVD_RUNNER_H
#define SNAPKVD_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "skv.h"
#include "snapkvd-forward.h"

struct snapkvd_runner_ctx;
struct skv_cuda_arena;

/* A CUDA import as the buffer keeps it. */
struct snapkvd_import {
	void *imp;
	const uint8_t *ptr; /* device address of the allocation's start */
	uint64_t size;	    /* of the allocation */
	const char *transport;
};

struct snapkvd_runner_ops {
	/* CUDA buffers, GPU arenas and prefill waits are available */
	bool device;
	/* the most workers it can serve (0: any): CUDA host registrations are
	 * per range, and two jobs sharing a buffer on two workers would
	 * unregister it under each other */
	unsigned max_workers;
	int (*ctx_new)(struct snapkvd_runner *r, unsigned threads, struct snapkvd_runner_ctx **ret,
		       struct skv_error *err);
	void (*ctx_free)(struct snapkvd_runner_ctx *x);
	unsigned (*ctx_threads)(const struct snapkvd_runner_ctx *x);
	const char *(*ctx_isa)(const struct snapkvd_runner_ctx *x);
	/* 0 or -errno with a reason in kerr */
	int (*compact)(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr);
	int (*grow)(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr);
	/* device only (NULL on the host) */
	int (*import)(struct snapkvd_runner *r, uint64_t session_id, uint64_t key, int fd,
		      uint64_t size, const void *ipc_handle, struct snapkvd_import *ret,
		      struct skv_error *kerr);
	void (*import_release)(struct snapkvd_runner *r, void *imp);
	int (*arena_new)(struct snapkvd_runner *r, uint64_t size, struct skv_cuda_arena **ret,
			 struct skv_error *kerr);
	int (*arena_export)(struct snapkvd_runner *r, struct skv_cuda_arena *a, int *ret_fd,
			    uint64_t *ret_size, int *ret_device, struct skv_error *kerr);
	uint8_t *(*arena_base)(struct snapkvd_runner *r, struct skv_cuda_arena *a);
	void (*arena_free)(struct snapkvd_runner *r, struct skv_cuda_arena *a);
	/* the daemon is stopping: prefill waits give up */
	void (*stop)(struct snapkvd_runner *r);
	void (*free)(struct snapkvd_runner *r);
};

struct snapkvd_runner {
	const struct snapkvd_runner_ops *ops;
	char name[16];	  /* the config's backend: "host", "cuda" */
	char desc[400];	  /* status: backend, device, transport */
	unsigned imports; /* live CUDA imports (loop thread) */
	void *priv;	  /* the implementation's */
};

/* The runner of `backend` ("host" or "cuda": the plugin is dlopen()ed).
 * 0, or -errno with a reason in kerr. */
int snapkvd_runner_new(const char *backend, struct snapkvd_runner **ret, struct skv_error *kerr);
void snapkvd_runner_free(struct snapkvd_runner *r);
int snapkvd_runner_host_new(struct snapkvd_runner *r, struct skv_error *kerr);
int snapkvd_runner_cuda_new(struct snapkvd_runner *r, struct skv_error *kerr);

bool snapkvd_runner_device(const struct snapkvd_runner *r);
const char *snapkvd_runner_name(const struct snapkvd_runner *r);
unsigned snapkvd_runner_imports(const struct snapkvd_runner *r);
void snapkvd_runner_stop(struct snapkvd_runner *r);

/* -ENOTSUP with a reason in err on a host runner. */
int snapkvd_runner_import(struct snapkvd_runner *r, uint64_t session_id, uint64_t key, int fd,
			  uint64_t size, const void *ipc_handle, struct snapkvd_import *ret,
			  char *err, size_t errlen);
void snapkvd_runner_import_release(struct snapkvd_runner *r, void *imp);
/* The GPU arena *a (created on first use, as large as the host arena) and a
 * new fd for it. -ENOTSUP on a host runner; 0 or -errno with a reason. */
int snapkvd_runner_arena_export(struct snapkvd_runner *r, struct skv_cuda_arena **a,
				uint64_t host_size, uint64_t session_id, int *ret_fd,
				uint64_t *ret_size, int *ret_device, char *err, size_t errlen);
/* Device address of a GPU arena's base (NULL: none). */
uint8_t *snapkvd_runner_arena_base(struct snapkvd_runner *r, struct skv_cuda_arena *a);
void snapkvd_runner_arena_free(struct snapkvd_runner *r, struct skv_cuda_arena *a);

#endif
