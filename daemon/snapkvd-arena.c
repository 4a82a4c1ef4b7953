// SPDX-License-Identifier: MIT
/* Per-session memfd arena; see snapkvd-arena.h. */
#include "snapkvd-arena.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

uint64_t snapkvd_arena_round(uint64_t bytes)
{
	if (bytes > UINT64_MAX - (SNAPKVD_ARENA_ALIGN - 1))
		return 0;
	return (bytes + SNAPKVD_ARENA_ALIGN - 1) & ~(uint64_t)(SNAPKVD_ARENA_ALIGN - 1);
}

int snapkvd_arena_new(uint64_t size, const char *name, struct snapkvd_arena **ret)
{
	struct snapkvd_arena *a;
	int r;

	size = snapkvd_arena_round(size);
	if (!size)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->fd = -1;
	a->base = MAP_FAILED;
	a->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (a->fd < 0)
		goto fail_errno;
	if (ftruncate(a->fd, (off_t)size) < 0)
		goto fail_errno;
	/* The engine gets this fd: it must not be able to shrink the file
	 * under our mapping (SIGBUS in the daemon) nor resize it at all. */
	if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		goto fail_errno;
	a->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
	if (a->base == MAP_FAILED)
		goto fail_errno;
	a->size = size;
	a->cap_free = 16;
	a->free = malloc(sizeof(*a->free) * a->cap_free);
	if (!a->free) {
		r = -ENOMEM;
		goto fail;
	}
	a->free[0] = (struct snapkvd_extent){0, size};
	a->n_free = 1;
	*ret = a;
	return 0;
fail_errno:
	r = -errno;
fail:
	snapkvd_arena_free(a);
	return r;
}

void snapkvd_arena_free(struct snapkvd_arena *a)
{
	if (!a)
		return;
	if (a->base != MAP_FAILED && a->base)
		munmap(a->base, a->size);
	if (a->fd >= 0)
		close(a->fd);
	free(a->free);
	free(a);
}

int snapkvd_arena_alloc(struct snapkvd_arena *a, uint64_t bytes, uint64_t *ret_off)
{
	bytes = snapkvd_arena_round(bytes);
	if (!bytes)
		return -EINVAL;
	for (unsigned i = 0; i < a->n_free; i++) {
		struct snapkvd_extent *e = &a->free[i];

		if (e->len < bytes)
			continue;
		*ret_off = e->off;
		e->off += bytes;
		e->len -= bytes;
		if (!e->len) {
			memmove(e, e + 1, (a->n_free - i - 1) * sizeof(*e));
			a->n_free--;
		}
		a->used += bytes;
		return 0;
	}
	return -ENOSPC;
}

void snapkvd_arena_release(struct snapkvd_arena *a, uint64_t off, uint64_t bytes)
{
	unsigned i;

	bytes = snapkvd_arena_round(bytes);
	if (!bytes || off > a->size || bytes > a->size - off)
		return;
	/* Hand the pages back to the kernel; the engine sees zeros there. */
	if (!a->keep_pages)
		(void)fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
				(off_t)bytes);
	a->used -= bytes;
	for (i = 0; i < a->n_free && a->free[i].off < off; i++)
		;
	/* merge with the previous and/or next extent */
	if (i > 0 && a->free[i - 1].off + a->free[i - 1].len == off) {
		a->free[i - 1].len += bytes;
		if (i < a->n_free && off + bytes == a->free[i].off) {
			a->free[i - 1].len += a->free[i].len;
			memmove(&a->free[i], &a->free[i + 1],
				(a->n_free - i - 1) * sizeof(*a->free));
			a->n_free--;
		}
		return;
	}
	if (i < a->n_free && off + bytes == a->free[i].off) {
		a->free[i].off = off;
		a->free[i].len += bytes;
		return;
	}
	if (a->n_free == a->cap_free) {
		struct snapkvd_extent *n = realloc(a->free, sizeof(*n) * a->cap_free * 2);

		if (!n)
			return; /* the region is lost to this arena, never double-used */
		a->free = n;
		a->cap_free *= 2;
	}
	memmove(&a->free[i + 1], &a->free[i], (a->n_free - i) * sizeof(*a->free));
	a->free[i] = (struct snapkvd_extent){off, bytes};
	a->n_free++;
}
