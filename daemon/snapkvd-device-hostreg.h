/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-device-hostreg.h - host memory made visible to the GPUs for the
 * jobs that use it, shared by the workers of every device.
 *
 * CUDA registers host memory per page (cudaHostRegister, portable: every
 * device sees it), and a page registered twice is refused (-EEXIST). Jobs
 * running at once on two devices may use the same pages (one engine's
 * memfd, one session's host arena, mass arrays on one heap page), so a
 * page must stay registered while any job holds it: each job holds its
 * ranges; a page not yet registered is registered with the first hold
 * over it (in runs of such pages), and a registered run goes once no hold
 * overlaps it (the plugin drains the device first). Any thread.
 */
#ifndef SNAPKVD_DEVICE_HOSTREG_H
#define SNAPKVD_DEVICE_HOSTREG_H

#include <stdint.h>

#include "skv.h"

struct skv_backend_ops;
struct skv_cuda_dev;
struct snapkvd_hostreg;
struct snapkvd_hostreg_hold;

int snapkvd_hostreg_new(const struct skv_backend_ops *ops, struct snapkvd_hostreg **ret);
/* After every hold is released. Accepts NULL. */
void snapkvd_hostreg_free(struct snapkvd_hostreg *h);

/* Hold [p, p + n) registered, registering through dev what is not yet:
 * 0 (*ret the hold), -ENOTSUP when the GPU does not see host memory at its
 * host address, or the plugin's -errno, with a reason in kerr. */
int snapkvd_hostreg_hold(struct snapkvd_hostreg *h, struct skv_cuda_dev *dev, void *p, uint64_t n,
			 struct snapkvd_hostreg_hold **ret, struct skv_error *kerr);
/* The hold ends; runs no hold overlaps any more are unregistered through dev. */
void snapkvd_hostreg_release(struct snapkvd_hostreg *h, struct skv_cuda_dev *dev,
			     struct snapkvd_hostreg_hold *hold);

#endif
