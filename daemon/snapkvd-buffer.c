// SPDX-License-Identifier: MIT
/* snapkvd-buffer.c - engine buffers: memfds and CUDA imports; see snapkvd-buffer.h. */
#include "snapkvd-buffer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/snapkv.pb-c.h"
#include "snapkvd-log.h"
#include "snapkvd-pool.h"
#include "snapkvd-device.h"

#define IPC_HANDLE_BYTES 64

struct snapkvd_buffer *snapkvd_buffer_find(struct snapkvd_buffer *list, uint64_t id)
{
	for (struct snapkvd_buffer *b = list; b; b = b->next)
		if (b->id == id)
			return b;
	return NULL;
}

struct snapkvd_buffer *snapkvd_buffer_by_generation(struct snapkvd_buffer *list, uint64_t gen)
{
	for (struct snapkvd_buffer *b = list; gen && b; b = b->next)
		if (b->generation == gen)
			return b;
	return NULL;
}

int snapkvd_buffer_memfd_check(int fd, uint64_t *size, uint64_t max_bytes, dev_t *ret_dev,
			       ino_t *ret_ino, const char **why)
{
	struct stat st;
	int seals;

	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		*why = "not a memfd";
		return -EINVAL;
	}
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		*why = "not a memfd (no seals)";
		return -EINVAL;
	}
	if (!(seals & F_SEAL_SHRINK)) {
		*why = "memfd must carry F_SEAL_SHRINK";
		return -EPERM;
	}
	if (!*size)
		*size = (uint64_t)st.st_size;
	if (*size > (uint64_t)st.st_size || *size == 0) {
		*why = "size is 0 or larger than the memfd";
		return -ERANGE;
	}
	if (*size > max_bytes) {
		*why = "buffer larger than max_buffer_bytes";
		return -E2BIG;
	}
	*ret_dev = st.st_dev;
	*ret_ino = st.st_ino;
	return 0;
}

int snapkvd_buffer_memfd_check_writable(int fd, const char **why)
{
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0) {
		*why = "not a memfd (no seals)";
		return -EINVAL;
	}
	if (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) {
		*why = "a writable buffer's memfd must not carry F_SEAL_WRITE or "
		       "F_SEAL_FUTURE_WRITE";
		return -EPERM;
	}
	return 0;
}

int snapkvd_buffer_memfd_new(int fd, uint64_t size, uint64_t gen, dev_t dev, ino_t ino,
			     struct snapkvd_buffer **ret)
{
	return snapkvd_buffer_memfd_map(fd, size, gen, dev, ino, false, ret);
}

int snapkvd_buffer_memfd_map(int fd, uint64_t size, uint64_t gen, dev_t dev, ino_t ino,
			     bool writable, struct snapkvd_buffer **ret)
{
	struct snapkvd_buffer *b = calloc(1, sizeof(*b));

	if (!b)
		return -ENOMEM;
	/* PROT_WRITE only for a buffer registered writable: a bug elsewhere
	 * cannot write into an engine's read-only K/V */
	b->map = mmap(NULL, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
	if (b->map == MAP_FAILED) {
		int r = -errno;

		free(b);
		return r;
	}
	b->generation = gen;
	b->size = size;
	b->refs = 1;
	b->regs = 1;
	b->dev = dev;
	b->ino = ino;
	b->writable = writable;
	*ret = b;
	return 0;
}

/* The checks of a CUDA registration that need no device. */
static int cuda_check(const struct snapkvd_device *d, const struct snapkvd_buffer_cuda *m, int fd,
		      uint64_t max_bytes, char *err, size_t errlen)
{
	bool vmm = m->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
	uint64_t off = vmm ? 0 : m->offset;

	if (!snapkvd_device_present(d)) {
		snprintf(
		    err, errlen,
		    "CUDA buffers need snapkvd --backend cuda; this daemon runs the %s backend",
		    snapkvd_device_backend(d));
		return -ENOTSUP;
	}
	if (vmm && fd < 0) {
		snprintf(err, errlen, "a CUDA VMM buffer needs exactly one fd");
		return -EBADF;
	}
	if (!vmm && fd >= 0) {
		snprintf(err, errlen, "a CUDA IPC buffer takes no fd");
		return -EINVAL;
	}
	if (!vmm && m->ipc_handle_len != IPC_HANDLE_BYTES) {
		snprintf(err, errlen, "ipc_handle has %zu bytes, not %d", m->ipc_handle_len,
			 IPC_HANDLE_BYTES);
		return -EINVAL;
	}
	if (m->size == 0 || m->size > max_bytes) {
		snprintf(err, errlen, "size %llu: must be 1..max_buffer_bytes (%llu)",
			 (unsigned long long)m->size, (unsigned long long)max_bytes);
		return m->size ? -E2BIG : -ERANGE;
	}
	if (off > UINT64_MAX - m->size) {
		snprintf(err, errlen, "offset + size overflows");
		return -ERANGE;
	}
	return 0;
}

int snapkvd_buffer_cuda_new(struct snapkvd_device *d, uint64_t session_id, uint64_t key,
			    const struct snapkvd_buffer_cuda *m, int fd, uint64_t max_bytes,
			    struct snapkvd_buffer **ret, char *err, size_t errlen)
{
	bool vmm = m->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_VMM_FD;
	uint64_t off = vmm ? 0 : m->offset;
	struct snapkvd_import imp = {0};
	struct snapkvd_buffer *b;
	int e;

	e = cuda_check(d, m, fd, max_bytes, err, errlen);
	if (e == 0)
		e = snapkvd_device_import(d, session_id, key, vmm ? fd : -1, m->size, m->ipc_handle,
					  m->device, &imp, err, errlen);
	if (e == 0 && (off > imp.size || m->size > imp.size - off)) {
		snprintf(err, errlen, "[%llu, +%llu) is outside the allocation (%llu bytes)",
			 (unsigned long long)off, (unsigned long long)m->size,
			 (unsigned long long)imp.size);
		e = -ERANGE;
	}
	b = e == 0 ? calloc(1, sizeof(*b)) : NULL;
	if (e == 0 && !b) {
		snprintf(err, errlen, "out of memory");
		e = -ENOMEM;
	}
	if (fd >= 0)
		close(fd);
	if (e < 0) {
		if (imp.imp)
			snapkvd_device_import_release(d, &imp);
		return e;
	}
	b->map = imp.ptr + off;
	b->size = m->size;
	b->generation = m->generation;
	b->imp = imp.imp;
	b->device = d;
	b->gpu = imp.gpu;
	b->imp_size = imp.size;
	b->transport = imp.transport;
	b->refs = 1;
	b->regs = 1;
	b->kind = m->kind;
	b->ipc_off = off;
	log_info("session %llu: %s buffer, generation %llu, %llu bytes (engine device %d), "
		 "imported on device %d; %u CUDA imports live",
		 (unsigned long long)session_id, b->transport, (unsigned long long)b->generation,
		 (unsigned long long)b->size, m->device, snapkvd_device_ordinal(d, b->gpu),
		 snapkvd_device_imports(d));
	*ret = b;
	return 0;
}

void snapkvd_buffer_unref(struct snapkvd_buffer *b)
{
	if (!b || --b->refs)
		return;
	if (b->imp) {
		/* the plugin synchronises the device before the last reference unmaps */
		struct snapkvd_import imp = {.imp = b->imp, .gpu = b->gpu, .size = b->imp_size};

		snapkvd_device_import_release(b->device, &imp);
		log_info("%s buffer, generation %llu, released; %u CUDA imports live", b->transport,
			 (unsigned long long)b->generation, snapkvd_device_imports(b->device));
	} else if (b->map) {
		munmap((void *)b->map, b->size);
	}
	free(b);
}

/* ------------------------------------------------------- a session's set */

void snapkvd_buffers_init(struct snapkvd_buffers *set, struct snapkvd_pool *pool,
			  struct snapkvd_tenant *tenant, struct snapkvd_device *dev,
			  uint64_t session_id)
{
	set->pool = pool;
	set->tenant = tenant;
	set->dev = dev;
	set->session_id = session_id;
}

/* A repeated registration must ask for what the first one got: 0, or
 * -EEXIST with the reason. */
static int same_access(const struct snapkvd_buffer *dup, bool writable, char *err, size_t errlen)
{
	if (dup->writable == writable)
		return 0;
	snprintf(err, errlen, "generation %llu is already buffer %llu, registered %s",
		 (unsigned long long)dup->generation, (unsigned long long)dup->id,
		 dup->writable ? "writable" : "read-only");
	return -EEXIST;
}

/* One more registration of a live generation. */
static int add_again(struct snapkvd_buffer *dup, bool writable, struct snapkvd_buffer **ret,
		     char *err, size_t errlen)
{
	int r = same_access(dup, writable, err, errlen);

	if (r < 0)
		return r;
	dup->regs++;
	*ret = dup;
	return 0;
}

/* A new buffer joins the set under the next id (never reused). */
static void add_new(struct snapkvd_buffers *set, struct snapkvd_buffer *b)
{
	b->id = ++set->next_id;
	b->next = set->list;
	set->list = b;
	set->n++;
}

/* A memfd registration whose generation is live: the same memfd and size. */
static int memfd_again(struct snapkvd_buffer *dup, uint64_t size, dev_t dev, ino_t ino,
		       bool writable, struct snapkvd_buffer **ret, char *err, size_t errlen)
{
	if (dup->size != size || dup->dev != dev || dup->ino != ino) {
		snprintf(err, errlen, "generation %llu is already buffer %llu with %s (%llu bytes)",
			 (unsigned long long)dup->generation, (unsigned long long)dup->id,
			 dup->size != size ? "another size" : "another memfd",
			 (unsigned long long)dup->size);
		return -EEXIST;
	}
	return add_again(dup, writable, ret, err, errlen);
}

int snapkvd_buffers_add_memfd(struct snapkvd_buffers *set, unsigned max_buffers, uint64_t max_bytes,
			      int fd, uint64_t size, uint64_t gen, bool writable,
			      struct snapkvd_buffer **ret, char *err, size_t errlen)
{
	struct snapkvd_buffer *b, *dup = snapkvd_buffer_by_generation(set->list, gen);
	const char *why = NULL;
	dev_t dev;
	ino_t ino;
	int r;

	if (!dup && set->n >= max_buffers) {
		close(fd);
		snprintf(err, errlen, "too many buffers in this session");
		return -EMFILE;
	}
	r = snapkvd_buffer_memfd_check(fd, &size, max_bytes, &dev, &ino, &why);
	if (r == 0 && writable)
		r = snapkvd_buffer_memfd_check_writable(fd, &why);
	if (r < 0) {
		close(fd);
		snprintf(err, errlen, "%s", why);
		return r;
	}
	/* The same generation again: the import already made, one more ref. */
	if (dup) {
		close(fd);
		return memfd_again(dup, size, dev, ino, writable, ret, err, errlen);
	}
	/* charged to the tenant before it is mapped */
	r = snapkvd_pool_map(set->pool, set->tenant, size, err, errlen);
	if (r < 0) {
		close(fd);
		return r;
	}
	/* Mapped once, read-only unless registered writable; the fd is not
	 * needed after this. */
	r = snapkvd_buffer_memfd_map(fd, size, gen, dev, ino, writable, &b);
	close(fd);
	if (r < 0) {
		snapkvd_pool_unmap(set->pool, set->tenant, size);
		snprintf(err, errlen, "%s", r == -ENOMEM ? "out of memory" : "mmap failed");
		return r;
	}
	add_new(set, b);
	*ret = b;
	return 0;
}

/* A CUDA registration whose generation is live: the same kind, size and
 * window. */
static int cuda_again(struct snapkvd_buffer *dup, const struct snapkvd_buffer_cuda *m,
		      bool writable, struct snapkvd_buffer **ret, char *err, size_t errlen)
{
	if (!dup->imp || dup->kind != m->kind || dup->size != m->size ||
	    (dup->kind == SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC &&
	     dup->ipc_off != m->offset)) {
		snprintf(err, errlen, "generation %llu is already buffer %llu (%s, %llu bytes)",
			 (unsigned long long)m->generation, (unsigned long long)dup->id,
			 dup->transport ? dup->transport : "memfd", (unsigned long long)dup->size);
		return -EEXIST;
	}
	return add_again(dup, writable, ret, err, errlen);
}

/* Imports are keyed by the buffer id the buffer will get (see
 * snapkvd-buffer.h). */
int snapkvd_buffers_add_cuda(struct snapkvd_buffers *set, unsigned max_buffers, uint64_t max_bytes,
			     const struct snapkvd_buffer_cuda *m, bool writable, int fd,
			     struct snapkvd_buffer **ret, char *err, size_t errlen)
{
	struct snapkvd_buffer *b, *dup = snapkvd_buffer_by_generation(set->list, m->generation);
	int r;

	if (dup) {
		if (fd >= 0)
			close(fd);
		return cuda_again(dup, m, writable, ret, err, errlen);
	}
	if (set->n >= max_buffers) {
		if (fd >= 0)
			close(fd);
		snprintf(err, errlen, "too many buffers in this session");
		return -EMFILE;
	}
	r = snapkvd_buffer_cuda_new(set->dev, set->session_id, set->next_id + 1, m, fd, max_bytes,
				    &b, err, errlen);
	if (r < 0)
		return r;
	/* validated and imported: charged to the tenant, or dropped again */
	r = snapkvd_pool_map(set->pool, set->tenant, b->size, err, errlen);
	if (r < 0) {
		snapkvd_buffer_unref(b);
		return r;
	}
	b->writable = writable; /* device memory: the flag gates writeback */
	add_new(set, b);
	*ret = b;
	return 0;
}

/* A buffer leaves the set: its mapping stops counting for the tenant (a
 * running job keeps its own reference until it is done). */
static void drop(struct snapkvd_buffers *set, struct snapkvd_buffer *b)
{
	set->n--;
	snapkvd_pool_unmap(set->pool, set->tenant, b->size);
	snapkvd_buffer_unref(b);
}

int snapkvd_buffers_remove(struct snapkvd_buffers *set, uint64_t id)
{
	for (struct snapkvd_buffer **pp = &set->list; *pp; pp = &(*pp)->next) {
		struct snapkvd_buffer *b = *pp;

		if (b->id != id)
			continue;
		if (b->regs > 1) { /* registered again under its generation */
			b->regs--;
			return 0;
		}
		*pp = b->next;
		drop(set, b);
		return 0;
	}
	return -ENOENT;
}

void snapkvd_buffers_clear(struct snapkvd_buffers *set)
{
	while (set->list) {
		struct snapkvd_buffer *b = set->list;

		set->list = b->next;
		drop(set, b);
	}
}
