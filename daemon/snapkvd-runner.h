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
	/* the daemon is stopping: prefill waits give up */
	void (*stop)(struct snapkvd_runner *r);
	void (*free)(struct snapkvd_runner *r);
};

struct snapkvd_runner {
	const struct snapkvd_runner_ops *ops;
	struct snapkvd_device *dev; /* what it runs jobs on (not owned) */
	char desc[400];		    /* status: backend, device, transport */
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
