// SPDX-License-Identifier: MIT
/* snapkvd-runner.c - choosing a runner and the calls every runner answers;
 * see snapkvd-runner.h. */
#include "snapkvd-runner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-cleanup.h"
#include "snapkvd-device.h"

int snapkvd_runner_new(struct snapkvd_device *dev, struct snapkvd_runner **ret,
		       struct skv_error *kerr)
{
	_cleanup_free_ struct snapkvd_runner *r = calloc(1, sizeof(*r));
	int e;

	if (!r)
		return -ENOMEM;
	r->dev = dev;
	snprintf(r->desc, sizeof(r->desc), "%s", snapkvd_device_backend(dev));
	e = snapkvd_device_present(dev) ? snapkvd_runner_cuda_new(r, kerr)
					: snapkvd_runner_host_new(r, kerr);
	if (e < 0)
		return e;
	*ret = TAKE_PTR(r);
	return 0;
}

void snapkvd_runner_free(struct snapkvd_runner *r)
{
	if (!r)
		return;
	if (r->ops && r->ops->free)
		r->ops->free(r);
	free(r);
}

void snapkvd_runner_stop(struct snapkvd_runner *r)
{
	if (r->ops->stop)
		r->ops->stop(r);
}
