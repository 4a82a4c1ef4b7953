// SPDX-License-Identifier: MIT
/*
 * libsnapkv-buffer.c - engine buffers: memfds libsnapkv allocates, fds and
 * CUDA handles the engine registers, each REGISTERed by generation and kept
 * on the client's list so that a reconnect registers it again.
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* UNREGISTER buffer `id`: 0 or -errno. Locked. */
static int unregister_id(struct skv_client *c, uint64_t id, uint64_t dl)
{
	Snapkv__V1__Unregister m = SNAPKV__V1__UNREGISTER__INIT;
	Snapkv__V1__UnregisterReply *rr = NULL;
	int r;

	m.buffer_id = id;
	r = skv__rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER, &m.base, NULL, 0,
		     SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY, (ProtobufCMessage **)&rr,
		     NULL, NULL, dl);
	if (r == 0) {
		r = rr->status;
		snapkv__v1__unregister_reply__free_unpacked(rr, NULL);
	}
	return r;
}

int skv__buffer_register(struct skv_client *c, struct skv_buffer *b, uint64_t dl)
{
	Snapkv__V1__RegisterBuffer m = SNAPKV__V1__REGISTER_BUFFER__INIT;
	Snapkv__V1__RegisterReply *rr = NULL;
	int r;

	m.generation = ++c->generation;
	m.size = b->size;
	m.kind = (Snapkv__V1__BufferKind)b->kind;
	if (b->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC) {
		m.ipc_handle.data = b->ipc_handle;
		m.ipc_handle.len = sizeof(b->ipc_handle);
		m.offset = b->offset;
	}
	m.device = b->device;
	m.writable = (b->flags & SKV_BUFFER_WRITABLE) != 0;
	r = skv__rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER, &m.base, &b->fd,
		     b->fd >= 0 ? 1 : 0, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY,
		     (ProtobufCMessage **)&rr, NULL, NULL, dl);
	if (r < 0)
		return r;
	r = rr->status;
	if (r < 0)
		skv__fail(c, r, "register: %s", rr->error ? rr->error : "failed");
	else if (m.writable && !rr->writable) {
		/* a daemon older than writable buffers ignores the flag */
		unregister_id(c, rr->buffer_id, dl);
		r = skv__fail(c, -EOPNOTSUPP,
			      "register: this snapkvd does not take writable buffers");
	} else {
		b->id = rr->buffer_id;
		snprintf(b->transport, sizeof(b->transport), "%s",
			 rr->transport && rr->transport[0] ? rr->transport : "memfd");
	}
	snapkv__v1__register_reply__free_unpacked(rr, NULL);
	return r;
}

static int buffer_add_kind(struct skv_client *c, int fd, void *data, size_t size, bool own,
			   const struct skv_buffer *proto, struct skv_buffer **ret)
{
	struct skv_buffer *b = calloc(1, sizeof(*b));
	int r;

	if (!b)
		return skv__fail(c, -ENOMEM, "out of memory");
	if (proto)
		*b = *proto;
	b->c = c;
	b->fd = fd;
	b->data = data;
	b->size = size;
	b->own = own;
	pthread_mutex_lock(&c->mu);
	r = skv__buffer_register(c, b, skv__call_deadline(c));
	if (r == 0) {
		b->next = c->buffers;
		c->buffers = b;
	}
	pthread_mutex_unlock(&c->mu);
	if (r < 0) {
		free(b);
		return r;
	}
	*ret = b;
	return 0;
}

static int check_flags(struct skv_client *c, uint32_t flags)
{
	if (flags & ~SKV_BUFFER_WRITABLE)
		return skv__fail(c, -EINVAL, "unknown buffer flags 0x%x",
				 flags & ~SKV_BUFFER_WRITABLE);
	return 0;
}

SKV_EXPORT int skv_buffer_alloc(struct skv_client *c, size_t size, struct skv_buffer **ret_buf)
{
	return skv_buffer_alloc_flags(c, size, 0, ret_buf);
}

SKV_EXPORT int skv_buffer_alloc_flags(struct skv_client *c, size_t size, uint32_t flags,
				      struct skv_buffer **ret_buf)
{
	struct skv_buffer k = {.flags = flags};
	void *p;
	int fd, r;

	if (!c || !size || !ret_buf)
		return skv__fail(c, -EINVAL, "buffer size must be > 0");
	if ((r = check_flags(c, flags)))
		return r;
	fd = memfd_create("skv-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return skv__fail(c, -errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		r = -errno;
		close(fd);
		return skv__fail(c, r, "memfd: %s", strerror(-r));
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		close(fd);
		return skv__fail(c, r, "mmap: %s", strerror(-r));
	}
	r = buffer_add_kind(c, fd, p, size, true, &k, ret_buf);
	if (r < 0) {
		munmap(p, size);
		close(fd);
	}
	return r;
}

SKV_EXPORT int skv_buffer_register_fd(struct skv_client *c, int memfd, size_t size,
				      struct skv_buffer **ret_buf)
{
	return skv_buffer_register_fd_flags(c, memfd, size, 0, ret_buf);
}

SKV_EXPORT int skv_buffer_register_fd_flags(struct skv_client *c, int memfd, size_t size,
					    uint32_t flags, struct skv_buffer **ret_buf)
{
	struct skv_buffer k = {.flags = flags};
	int fd, r;

	if (!c || memfd < 0 || !ret_buf)
		return skv__fail(c, -EINVAL, "bad arguments");
	if ((r = check_flags(c, flags)))
		return r;
	fd = fcntl(memfd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return skv__fail(c, -errno, "dup: %s", strerror(errno));
	r = buffer_add_kind(c, fd, NULL, size, false, &k, ret_buf);
	if (r < 0)
		close(fd);
	return r;
}

SKV_EXPORT int skv_buffer_register_cuda_fd(struct skv_client *c, int vmm_fd, size_t size,
					   int device, struct skv_buffer **ret_buf)
{
	return skv_buffer_register_cuda_fd_flags(c, vmm_fd, size, device, 0, ret_buf);
}

SKV_EXPORT int skv_buffer_register_cuda_fd_flags(struct skv_client *c, int vmm_fd, size_t size,
						 int device, uint32_t flags,
						 struct skv_buffer **ret_buf)
{
	struct skv_buffer k = {.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD,
			       .device = device,
			       .flags = flags};
	int fd, r;

	if (!c || vmm_fd < 0 || !size || !ret_buf)
		return skv__fail(c, -EINVAL, "bad arguments");
	if ((r = check_flags(c, flags)))
		return r;
	fd = fcntl(vmm_fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return skv__fail(c, -errno, "dup: %s", strerror(errno));
	r = buffer_add_kind(c, fd, NULL, size, false, &k, ret_buf);
	if (r < 0)
		close(fd);
	return r;
}

SKV_EXPORT int skv_buffer_register_cuda_ipc(struct skv_client *c, const void *ipc_handle64,
					    size_t offset, size_t size, int device,
					    struct skv_buffer **ret_buf)
{
	return skv_buffer_register_cuda_ipc_flags(c, ipc_handle64, offset, size, device, 0,
						  ret_buf);
}

SKV_EXPORT int skv_buffer_register_cuda_ipc_flags(struct skv_client *c, const void *ipc_handle64,
						  size_t offset, size_t size, int device,
						  uint32_t flags, struct skv_buffer **ret_buf)
{
	struct skv_buffer k = {.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC,
			       .offset = offset,
			       .device = device,
			       .flags = flags};
	int r;

	if (!c || !ipc_handle64 || !size || !ret_buf)
		return skv__fail(c, -EINVAL, "bad arguments");
	if ((r = check_flags(c, flags)))
		return r;
	memcpy(k.ipc_handle, ipc_handle64, sizeof(k.ipc_handle));
	return buffer_add_kind(c, -1, NULL, size, false, &k, ret_buf);
}

SKV_EXPORT int skv_client_cuda_arena(struct skv_client *c, int *ret_fd, uint64_t *ret_size,
				     int *ret_device)
{
	Snapkv__V1__CudaArenaRequest m = SNAPKV__V1__CUDA_ARENA_REQUEST__INIT;
	Snapkv__V1__CudaArena *a = NULL;
	int fds[1] = {-1};
	unsigned nf = 1;
	int r;

	if (!c || !ret_fd || !ret_size)
		return skv__fail(c, -EINVAL, "bad arguments");
	pthread_mutex_lock(&c->mu);
	r = skv__rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA, &m.base, NULL, 0,
		     SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY, (ProtobufCMessage **)&a, fds,
		     &nf, skv__call_deadline(c));
	pthread_mutex_unlock(&c->mu);
	if (r < 0)
		return r;
	r = a->status;
	if (r < 0)
		skv__fail(c, r, "GPU arena: %s", a->error ? a->error : "failed");
	else if (nf != 1 || fds[0] < 0 || !a->size)
		r = skv__fail(c, -EPROTO, "GPU arena: reply without an fd");
	if (r == 0) {
		*ret_fd = fds[0];
		*ret_size = a->size;
		if (ret_device)
			*ret_device = a->device;
	} else if (nf == 1 && fds[0] >= 0) {
		close(fds[0]);
	}
	snapkv__v1__cuda_arena__free_unpacked(a, NULL);
	return r;
}

SKV_EXPORT const char *skv_buffer_transport(const struct skv_buffer *b)
{
	return b && b->transport[0] ? b->transport : "";
}

SKV_EXPORT void *skv_buffer_data(const struct skv_buffer *b)
{
	return b ? b->data : NULL;
}

SKV_EXPORT size_t skv_buffer_size(const struct skv_buffer *b)
{
	return b ? b->size : 0;
}

SKV_EXPORT uint32_t skv_buffer_flags(const struct skv_buffer *b)
{
	return b ? b->flags : 0;
}

SKV_EXPORT int skv_buffer_restore(struct skv_buffer *b, uint64_t offset, uint64_t len)
{
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), mapped;
	void *p;

	if (!b || !b->own || !b->data || b->fd < 0 || !len || offset % pg)
		return -EINVAL;
	mapped = (b->size + pg - 1) / pg * pg;
	if (len > UINT64_MAX - pg)
		return -EINVAL;
	len = (len + pg - 1) / pg * pg;
	if (offset > mapped || len > mapped - offset)
		return -EINVAL;
	p = mmap((uint8_t *)b->data + offset, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
		 b->fd, (off_t)offset);
	return p == MAP_FAILED ? -errno : 0;
}

SKV_EXPORT uint64_t skv_buffer_id(const struct skv_buffer *b)
{
	return b ? b->id : 0;
}

SKV_EXPORT int skv_buffer_free(struct skv_buffer *b)
{
	struct skv_client *c;
	struct skv_buffer **pp;
	int r = 0;

	if (!b)
		return 0;
	c = b->c;
	pthread_mutex_lock(&c->mu);
	for (pp = &c->buffers; *pp; pp = &(*pp)->next)
		if (*pp == b) {
			*pp = b->next;
			break;
		}
	if (!c->dead)
		r = unregister_id(c, b->id, skv__call_deadline(c));
	pthread_mutex_unlock(&c->mu);
	if (b->own && b->data)
		munmap(b->data, b->size);
	if (b->fd >= 0)
		close(b->fd);
	free(b);
	return r;
}
