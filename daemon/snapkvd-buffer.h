/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-buffer.h - an engine buffer the daemon reads K/V from: a sealed
 * memfd mapped read-only, or (--backend cuda) a CUDA allocation imported on
 * the daemon's device, whose `map` is then a device address, passed to the
 * kernels as is and never dereferenced on the host.
 *
 * Imports are keyed by buffer id (never reused within a session): a
 * repeated registration of a live generation is counted on its buffer
 * (regs), so every buffer object holds exactly one import and drops it with
 * its last reference (unregister, session end, or the last job reading it).
 */
#ifndef SNAPKVD_BUFFER_H
#define SNAPKVD_BUFFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "snapkvd-forward.h"

struct snapkvd_device;

struct snapkvd_buffer {
	uint64_t id;
	uint64_t generation;
	uint64_t size; /* mapped bytes */
	/* memfd: our read-only mapping; CUDA: the device address of the buffer
	 * (import base + offset), valid on the daemon's device only */
	const uint8_t *map;
	unsigned refs; /* the session's + one per job using it */
	unsigned regs; /* registrations of this generation not yet unregistered */
	dev_t dev;     /* the memfd registered first: a repeat must name it */
	ino_t ino;
	/* CUDA buffers: the device's import, dropped with the last reference */
	void *imp;
	struct snapkvd_device *device; /* imp != NULL */
	unsigned gpu;		       /* imp != NULL: index of the device holding it */
	uint64_t imp_size;	       /* imp != NULL: the imported allocation's bytes */
	const char *transport;	       /* "memfd", "cuda-vmm-fd", "cuda-ipc" */
	int kind;		       /* Snapkv__V1__BufferKind of a CUDA buffer */
	uint64_t ipc_off;	       /* CUDA_IPC: offset in the allocation */
	/* registered writable (RegisterBuffer.writable): a writeback
	 * destination; a memfd is then mapped PROT_READ | PROT_WRITE */
	bool writable;
	struct snapkvd_buffer *next;
};

/* The buffer with this id in a session's list, or NULL. */
struct snapkvd_buffer *snapkvd_buffer_find(struct snapkvd_buffer *list, uint64_t id);
/* The live buffer of generation gen (0, "none", never matches), or NULL. */
struct snapkvd_buffer *snapkvd_buffer_by_generation(struct snapkvd_buffer *list, uint64_t gen);

/*
 * Checks of a memfd offered for registration: a regular file, sealed
 * against shrinking (one that can shrink under our mapping would SIGBUS
 * the daemon), *size (0: the whole file) within it and within max_bytes.
 * 0, or -errno with the reason in *why. fd stays open either way.
 */
int snapkvd_buffer_memfd_check(int fd, uint64_t *size, uint64_t max_bytes, dev_t *ret_dev,
			       ino_t *ret_ino, const char **why);
/* Map a checked memfd once, read-only (fd stays open). 0 or -errno. */
int snapkvd_buffer_memfd_new(int fd, uint64_t size, uint64_t gen, dev_t dev, ino_t ino,
			     struct snapkvd_buffer **ret);
/*
 * Writable registrations (writeback destinations): the memfd must not be
 * sealed against writes (F_SEAL_WRITE, F_SEAL_FUTURE_WRITE): 0, or -EPERM
 * with the reason in *why. Then snapkvd_buffer_memfd_map() with writable
 * maps it PROT_READ | PROT_WRITE (and marks the buffer writable); without,
 * it is snapkvd_buffer_memfd_new().
 */
int snapkvd_buffer_memfd_check_writable(int fd, const char **why);
int snapkvd_buffer_memfd_map(int fd, uint64_t size, uint64_t gen, dev_t dev, ino_t ino,
			     bool writable, struct snapkvd_buffer **ret);

/* A CUDA registration's fields (RegisterBuffer). */
struct snapkvd_buffer_cuda {
	int kind; /* Snapkv__V1__BufferKind: CUDA_VMM_FD or CUDA_IPC */
	uint64_t size, offset, generation;
	const void *ipc_handle;
	size_t ipc_handle_len;
	int device; /* the engine's ordinal, for messages (the import asks the memory) */
};
/*
 * Import a CUDA buffer on the device, keyed by (session_id, key); fd (or
 * -1) is consumed. 0, or -errno with a reason in err (-ENOTSUP without a
 * device: the host backend).
 */
int snapkvd_buffer_cuda_new(struct snapkvd_device *d, uint64_t session_id, uint64_t key,
			    const struct snapkvd_buffer_cuda *m, int fd, uint64_t max_bytes,
			    struct snapkvd_buffer **ret, char *err, size_t errlen);

void snapkvd_buffer_unref(struct snapkvd_buffer *b);

/*
 * The set of one session's buffers: registration with generation dedupe
 * (a repeat of a live generation must name the same memory and access and
 * is counted on its buffer), the per-session limit (max_buffers), the
 * charge of each buffer's bytes to the tenant and the daemon (the pool's
 * mapped bytes, before anything is mapped), and ids never reused within
 * the session. Loop thread.
 */
struct snapkvd_buffers {
	struct snapkvd_buffer *list;
	unsigned n;
	uint64_t next_id;
	/* set at HELLO (snapkvd_buffers_init) */
	struct snapkvd_pool *pool;
	struct snapkvd_tenant *tenant;
	struct snapkvd_device *dev;
	uint64_t session_id;
};

void snapkvd_buffers_init(struct snapkvd_buffers *set, struct snapkvd_pool *pool,
			  struct snapkvd_tenant *tenant, struct snapkvd_device *dev,
			  uint64_t session_id);
/*
 * Register a memfd of `size` bytes (0: the whole memfd) of generation gen,
 * within max_buffers buffers in the set and max_bytes (max_buffer_bytes)
 * each; fd is consumed. 0 with *ret the buffer (new, or the live one of gen
 * counted once more), or -errno with the reason in err; nothing changed
 * then, *ret untouched.
 */
int snapkvd_buffers_add_memfd(struct snapkvd_buffers *set, unsigned max_buffers, uint64_t max_bytes,
			      int fd, uint64_t size, uint64_t gen, bool writable,
			      struct snapkvd_buffer **ret, char *err, size_t errlen);
/* The same for a CUDA buffer (fd, or -1 for CUDA_IPC, is consumed). */
int snapkvd_buffers_add_cuda(struct snapkvd_buffers *set, unsigned max_buffers, uint64_t max_bytes,
			     const struct snapkvd_buffer_cuda *m, bool writable, int fd,
			     struct snapkvd_buffer **ret, char *err, size_t errlen);
/* One registration of buffer id undone; the buffer leaves the set with
 * its last (a running job keeps its own reference). 0 or -ENOENT. */
int snapkvd_buffers_remove(struct snapkvd_buffers *set, uint64_t id);
/* Every buffer leaves the set (the session ends). */
void snapkvd_buffers_clear(struct snapkvd_buffers *set);

#endif
