// SPDX-License-Identifier: MIT
/*
 * snapkvd-gpu.c - engine K/V buffers that live in GPU memory.
 *
 * With --backend cuda an engine registers a CUDA buffer instead of a memfd:
 * a VMM allocation exported as a POSIX fd (cuMemExportToShareableHandle,
 * passed over SCM_RIGHTS) or a legacy cudaIpcMemHandle_t (64 bytes in the
 * message). The plugin imports it once on the daemon's own device, keyed by
 * (session id, buffer id): a repeated registration of a live generation is
 * counted on its buffer (snapkvd-session.c), so every buffer object holds
 * exactly one import reference and drops it with its last user (unregister,
 * session end, or the last job that still reads it). The buffer's `map` is then a device address:
 * jobs pass it to the kernels as is, it is never dereferenced on the host.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cuda/skv-backend.h"
#include "kernels/cuda/skv-cuda.h" /* struct skv_cuda_info */
#include "snapkvd-log.h"
#include "snapkvd-server.h"

#define IPC_HANDLE_BYTES 64

int snapkvd_gpu_buffer_new(struct snapkvd_session *s, const Snapkv__V1__RegisterBuffer *m, int fd,
			   struct snapkvd_buffer **ret, char *err, size_t errlen)
{
	struct snapkvd_server *srv = s->srv;
	bool vmm = m->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
	struct skv_error kerr = {{0}, -1, -1};
	struct skv_cuda_import *imp = NULL;
	struct snapkvd_buffer *b;
	uint64_t off = vmm ? 0 : m->offset, isz;
	int r;

	if (!srv->gpu) {
		snprintf(
		    err, errlen,
		    "CUDA buffers need snapkvd --backend cuda; this daemon runs the %s backend",
		    srv->cfg.backend);
		r = -ENOTSUP;
		goto fail;
	}
	if (vmm && fd < 0) {
		snprintf(err, errlen, "a CUDA VMM buffer needs exactly one fd");
		r = -EBADF;
		goto fail;
	}
	if (!vmm && fd >= 0) {
		snprintf(err, errlen, "a CUDA IPC buffer takes no fd");
		r = -EINVAL;
		goto fail;
	}
	if (!vmm && m->ipc_handle.len != IPC_HANDLE_BYTES) {
		snprintf(err, errlen, "ipc_handle has %zu bytes, not %d", m->ipc_handle.len,
			 IPC_HANDLE_BYTES);
		r = -EINVAL;
		goto fail;
	}
	if (m->size == 0 || m->size > srv->cfg.max_buffer_bytes) {
		snprintf(err, errlen, "size %llu: must be 1..max_buffer_bytes (%llu)",
			 (unsigned long long)m->size,
			 (unsigned long long)srv->cfg.max_buffer_bytes);
		r = m->size ? -E2BIG : -ERANGE;
		goto fail;
	}
	if (off > UINT64_MAX - m->size) {
		snprintf(err, errlen, "offset + size overflows");
		r = -ERANGE;
		goto fail;
	}
	/*
	 * The plugin shares the import of a repeated (tenant, key). A repeated
	 * generation of a live buffer never gets here (register_gpu counts it
	 * on that buffer), so a match in the plugin could only be generation 0
	 * ("none") again or a generation unregistered while a job still holds
	 * its import: both name another allocation, which must not be read
	 * through the old mapping. The key is therefore the buffer id this
	 * buffer will get, never reused within the session.
	 */
	uint64_t key = s->next_buffer_id + 1;
	if (vmm)
		r = srv->gpu->ops->import_fd(srv->gpu->dev, s->id, key, fd, m->size, &imp, &kerr);
	else
		r = srv->gpu->ops->import_ipc(srv->gpu->dev, s->id, key, m->ipc_handle.data, &imp,
					      &kerr);
	if (r < 0) {
		snprintf(err, errlen, "import: %s", kerr.msg[0] ? kerr.msg : strerror(-r));
		goto fail;
	}
	isz = srv->gpu->ops->import_size(imp);
	if (off > isz || m->size > isz - off) {
		snprintf(err, errlen, "[%llu, +%llu) is outside the allocation (%llu bytes)",
			 (unsigned long long)off, (unsigned long long)m->size,
			 (unsigned long long)isz);
		r = -ERANGE;
		goto fail;
	}
	b = calloc(1, sizeof(*b));
	if (!b) {
		snprintf(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	if (fd >= 0)
		close(fd);
	b->map = (const uint8_t *)srv->gpu->ops->import_ptr(imp) + off;
	b->size = m->size;
	b->generation = m->generation;
	b->imp = imp;
	b->srv = srv;
	b->transport = srv->gpu->ops->import_transport(imp);
	b->refs = 1;
	b->regs = 1;
	b->kind = (int)m->kind;
	b->ipc_off = off;
	srv->cuda_imports++;
	log_info("session %llu: %s buffer, generation %llu, %llu bytes (engine device %d), "
		 "imported; %u CUDA imports live",
		 (unsigned long long)s->id, b->transport, (unsigned long long)b->generation,
		 (unsigned long long)b->size, m->device, srv->cuda_imports);
	*ret = b;
	return 0;
fail:
	if (imp)
		srv->gpu->ops->import_release(imp);
	if (fd >= 0)
		close(fd);
	return r;
}

void snapkvd_gpu_buffer_release(struct snapkvd_buffer *b)
{
	struct snapkvd_server *srv = b->srv;

	/* the plugin synchronises the device before the last reference unmaps */
	srv->gpu->ops->import_release(b->imp);
	b->imp = NULL;
	srv->cuda_imports--;
	log_info("%s buffer, generation %llu, released; %u CUDA imports live", b->transport,
		 (unsigned long long)b->generation, srv->cuda_imports);
}

int snapkvd_gpu_arena_export(struct snapkvd_session *s, int *ret_fd, uint64_t *ret_size,
			     int *ret_device, char *err, size_t errlen)
{
	struct snapkvd_server *srv = s->srv;
	struct skv_error kerr = {{0}, -1, -1};
	struct skv_cuda_info info;
	int r, fd;

	if (!srv->gpu) {
		snprintf(
		    err, errlen,
		    "a GPU arena needs snapkvd --backend cuda; this daemon runs the %s backend",
		    srv->cfg.backend);
		return -ENOTSUP;
	}
	if (s->admin || !s->arena) {
		snprintf(err, errlen, "admin sessions have no arena");
		return -EPERM;
	}
	if (!s->garena) {
		/* as large as the host arena: every region placed there fits here */
		r = srv->gpu->ops->arena_new(srv->gpu->dev, s->arena->size, &s->garena, &kerr);
		if (r < 0) {
			s->garena = NULL;
			snprintf(err, errlen, "GPU arena: %s",
				 kerr.msg[0] ? kerr.msg : strerror(-r));
			return r;
		}
		log_info("session %llu: GPU arena of %llu bytes (cuda-vmm)",
			 (unsigned long long)s->id,
			 (unsigned long long)srv->gpu->ops->arena_size(s->garena));
	}
	r = srv->gpu->ops->arena_export_fd(s->garena, &fd, &kerr);
	if (r < 0) {
		snprintf(err, errlen, "GPU arena export: %s",
			 kerr.msg[0] ? kerr.msg : strerror(-r));
		return r;
	}
	srv->gpu->ops->dev_info(srv->gpu->dev, &info);
	*ret_fd = fd;
	*ret_size = srv->gpu->ops->arena_size(s->garena);
	*ret_device = info.device;
	return 0;
}

uint8_t *snapkvd_gpu_arena_base(struct snapkvd_session *s)
{
	return s->garena ? s->srv->gpu->ops->arena_ptr(s->garena) : NULL;
}

void snapkvd_gpu_arena_free(struct snapkvd_session *s)
{
	if (s->garena)
		s->srv->gpu->ops->arena_free(s->garena);
	s->garena = NULL;
}
