/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-runner.h - what runs a job: the host kernels (snapkvd-runner-host.c)
 * or the CUDA plugin (snapkvd-runner-cuda.c), behind one ops table so the
 * compactor never asks which. A runner context is one worker's: a kernel
 * thread pool, and with CUDA a stream too.
 *
 * A runner only runs jobs: what lives on the GPU (the plugin, buffer
 * imports, GPU arenas, the prefill waiter) is the device's
 * (snapkvd-device.h), which the CUDA runner runs its jobs on.
 */
#ifndef SNAPKVD_RUNNER_H
#define SNAPKVD_RUNNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "skv.h"
#include "snapkvd-forward.h"

struct snapkvd_runner_ctx;
struct snapkvd_device;

struct snapkvd_runner_ops {
	/* the most workers it can serve per device (0: any): one CUDA stream
	 * per device, each worker the only one taking that device's jobs */
	unsigned max_workers;
	/* a worker's context on opened device `gpu` (CUDA: its stream
	 * there; the host ignores it) */
	int (*ctx_new)(struct snapkvd_runner *r, unsigned threads, unsigned gpu,
		       struct snapkvd_runner_ctx **ret, struct skv_error *err);
	void (*ctx_free)(struct snapkvd_runner_ctx *x);
	unsigned (*ctx_threads)(const struct snapkvd_runner_ctx *x);
	const char *(*ctx_isa)(const struct snapkvd_runner_ctx *x);
	/* 0 or -errno with a reason in kerr */
	int (*compact)(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr);
	int (*grow)(struct snapkvd_runner_ctx *x, struct snapkvd_job *j, struct skv_error *kerr);
	/* the daemon is stopping: prefill waits give up */
	void (*stop)(struct snapkvd_runner *r);
	void (*free)(struct snapkvd_runner *r);
};

struct snapkvd_runner {
	const struct snapkvd_runner_ops *ops;
	struct snapkvd_device *dev; /* what it runs jobs on (not owned) */
	char desc[1200];	    /* status: backend, devices, transport */
	void *priv;		    /* the implementation's */
};

/* The runner for device dev: the CUDA plugin's when the device is
 * present, else the host kernels. 0, or -errno with a reason in kerr. */
int snapkvd_runner_new(struct snapkvd_device *dev, struct snapkvd_runner **ret,
		       struct skv_error *kerr);
void snapkvd_runner_free(struct snapkvd_runner *r);
int snapkvd_runner_host_new(struct snapkvd_runner *r, struct skv_error *kerr);
int snapkvd_runner_cuda_new(struct snapkvd_runner *r, struct skv_error *kerr);

void snapkvd_runner_stop(struct snapkvd_runner *r);

#endif
