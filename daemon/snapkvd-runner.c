// SPDX-License-Identifier: MIT
/* snapkvd-runner.c - choosing a runner and the calls every runner answers;
 * see snapkvd-runner.h. */
#include "snapkvd-runner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-log.h"

int snapkvd_runner_new(const char *backend, struct snapkvd_runner **ret, struct skv_error *kerr)
{
	struct snapkvd_runner *r = calloc(1, sizeof(*r));
	int e;

	if (!r)
		return -ENOMEM;
	snprintf(r->name, sizeof(r->name), "%s", backend);
	snprintf(r->desc, sizeof(r->desc), "%s", backend);
	e = strcmp(backend, "cuda") ? snapkvd_runner_host_new(r, kerr)
				    : snapkvd_runner_cuda_new(r, kerr);
	if (e < 0) {
		free(r);
		return e;
	}
	*ret = r;
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

bool snapkvd_runner_device(const struct snapkvd_runner *r)
{
	return r->ops->device;
}

const char *snapkvd_runner_name(const struct snapkvd_runner *r)
{
	return r->name;
}

unsigned snapkvd_runner_imports(const struct snapkvd_runner *r)
{
	return r->imports;
}

void snapkvd_runner_stop(struct snapkvd_runner *r)
{
	if (r->ops->stop)
		r->ops->stop(r);
}

int snapkvd_runner_import(struct snapkvd_runner *r, uint64_t session_id, uint64_t key, int fd,
			  uint64_t size, const void *ipc_handle, struct snapkvd_import *ret,
			  char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	int e;

	if (!r->ops->import)
		return -ENOTSUP;
	e = r->ops->import(r, session_id, key, fd, size, ipc_handle, ret, &kerr);
	if (e < 0) {
		snprintf(err, errlen, "import: %s", kerr.msg[0] ? kerr.msg : strerror(-e));
		return e;
	}
	r->imports++;
	return 0;
}

void snapkvd_runner_import_release(struct snapkvd_runner *r, void *imp)
{
	r->ops->import_release(r, imp);
	r->imports--;
}

int snapkvd_runner_arena_export(struct snapkvd_runner *r, struct skv_cuda_arena **a,
				uint64_t host_size, uint64_t session_id, int *ret_fd,
				uint64_t *ret_size, int *ret_device, char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	int e;

	if (!r->ops->arena_new)
		return -ENOTSUP;
	if (!*a) {
		/* as large as the host arena: every region placed there fits here */
		e = r->ops->arena_new(r, host_size, a, &kerr);
		if (e < 0) {
			*a = NULL;
			snprintf(err, errlen, "GPU arena: %s",
				 kerr.msg[0] ? kerr.msg : strerror(-e));
			return e;
		}
		e = r->ops->arena_export(r, *a, NULL, ret_size, NULL, &kerr);
		log_info("session %llu: GPU arena of %llu bytes (cuda-vmm)",
			 (unsigned long long)session_id, (unsigned long long)*ret_size);
	}
	e = r->ops->arena_export(r, *a, ret_fd, ret_size, ret_device, &kerr);
	if (e < 0)
		snprintf(err, errlen, "GPU arena export: %s",
			 kerr.msg[0] ? kerr.msg : strerror(-e));
	return e;
}

uint8_t *snapkvd_runner_arena_base(struct snapkvd_runner *r, struct skv_cuda_arena *a)
{
	return a && r->ops->arena_base ? r->ops->arena_base(r, a) : NULL;
}

void snapkvd_runner_arena_free(struct snapkvd_runner *r, struct skv_cuda_arena *a)
{
	if (a && r->ops->arena_free)
		r->ops->arena_free(r, a);
}
