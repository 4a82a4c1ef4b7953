// SPDX-License-Identifier: MIT
/*
 * Per-session memfd arena; see snapkvd-arena.h.
 *
 * Free space is a sorted table of extents, each either cached (its pages
 * are populated: a released region's) or zero (never touched, or punched).
 * A region is placed in a cached extent that fits when there is one (the
 * smallest), else at the first run of touching extents, whatever their
 * kind, that holds it. Released regions are cached while the set allows;
 * over its limit the least recently cached arenas are punched first, from
 * their highest offsets (placement prefers low ones).
 */
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
	/* 2 MiB pages where /sys/kernel/mm/transparent_hugepage/shmem_enabled
	 * allows them (always, within_size, advise): 512x fewer faults on a
	 * fresh region. A refusal costs nothing. */
	a->huge = madvise(a->base, size, MADV_HUGEPAGE) == 0;
	a->size = size;
	a->cap_free = 16;
	a->free = malloc(sizeof(*a->free) * a->cap_free);
	if (!a->free) {
		r = -ENOMEM;
		goto fail;
	}
	a->free[0] = (struct snapkvd_extent){0, size, false};
	a->n_free = 1;
	*ret = a;
	return 0;
fail_errno:
	r = -errno;
fail:
	snapkvd_arena_free(a);
	return r;
}

static void set_unlink(struct snapkvd_arena *a)
{
	struct snapkvd_arena_set *set = a->set;

	if (!set)
		return;
	if (a->set_prev)
		a->set_prev->set_next = a->set_next;
	else
		set->first = a->set_next;
	if (a->set_next)
		a->set_next->set_prev = a->set_prev;
	__atomic_store_n(&set->cached, set->cached - a->cached, __ATOMIC_RELAXED);
	a->set = NULL;
	a->set_prev = a->set_next = NULL;
}

void snapkvd_arena_free(struct snapkvd_arena *a)
{
	if (!a)
		return;
	set_unlink(a);
	if (a->base != MAP_FAILED && a->base)
		munmap(a->base, a->size);
	if (a->fd >= 0)
		close(a->fd);
	free(a->free);
	free(a);
}

void snapkvd_arena_join(struct snapkvd_arena *a, struct snapkvd_arena_set *set)
{
	set_unlink(a);
	a->set = set;
	a->set_next = set->first;
	if (set->first)
		set->first->set_prev = a;
	set->first = a;
	__atomic_store_n(&set->cached, set->cached + a->cached, __ATOMIC_RELAXED);
}

/* Count cached bytes coming (+) or going (-) in a and its set. */
static void count_cached(struct snapkvd_arena *a, uint64_t bytes, bool add)
{
	a->cached = add ? a->cached + bytes : a->cached - bytes;
	if (a->set)
		__atomic_store_n(&a->set->cached,
				 add ? a->set->cached + bytes : a->set->cached - bytes,
				 __ATOMIC_RELAXED);
}

/* Merge touching extents of the same kind. */
static void coalesce(struct snapkvd_arena *a)
{
	unsigned o = 0;

	for (unsigned i = 1; i < a->n_free; i++) {
		struct snapkvd_extent *p = &a->free[o];

		if (p->off + p->len == a->free[i].off && p->cached == a->free[i].cached)
			p->len += a->free[i].len;
		else
			a->free[++o] = a->free[i];
	}
	if (a->n_free)
		a->n_free = o + 1;
}

/* Room for one more extent. 0 or -ENOMEM. */
static int grow_table(struct snapkvd_arena *a)
{
	struct snapkvd_extent *n;

	if (a->n_free < a->cap_free)
		return 0;
	n = realloc(a->free, sizeof(*n) * a->cap_free * 2);
	if (!n)
		return -ENOMEM;
	a->free = n;
	a->cap_free *= 2;
	return 0;
}

/* Insert e at its place by offset, then merge. 0 or -ENOMEM. */
static int insert(struct snapkvd_arena *a, struct snapkvd_extent e)
{
	unsigned i;

	if (grow_table(a) < 0)
		return -ENOMEM;
	for (i = 0; i < a->n_free && a->free[i].off < e.off; i++)
		;
	memmove(&a->free[i + 1], &a->free[i], (a->n_free - i) * sizeof(*a->free));
	a->free[i] = e;
	a->n_free++;
	coalesce(a);
	return 0;
}

static void punch(struct snapkvd_arena *a, uint64_t off, uint64_t len)
{
	(void)fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
}

/* Bytes of free space from extent i on while the extents touch. */
static uint64_t run_len(const struct snapkvd_arena *a, unsigned i)
{
	uint64_t n = a->free[i].len;

	for (unsigned j = i + 1;
	     j < a->n_free && a->free[j - 1].off + a->free[j - 1].len == a->free[j].off; j++)
		n += a->free[j].len;
	return n;
}

/* Take [free[i].off, + bytes) out of the run at extent i; the cached
 * bytes it covered. */
static uint64_t carve(struct snapkvd_arena *a, unsigned i, uint64_t bytes)
{
	uint64_t cached = 0;
	unsigned j = i;

	while (bytes) {
		struct snapkvd_extent *e = &a->free[j];
		uint64_t t = e->len < bytes ? e->len : bytes;

		if (e->cached)
			cached += t;
		e->off += t;
		e->len -= t;
		bytes -= t;
		if (!e->len)
			j++;
	}
	memmove(&a->free[i], &a->free[j], (a->n_free - j) * sizeof(*a->free));
	a->n_free -= j - i;
	return cached;
}

int snapkvd_arena_take(struct snapkvd_arena *a, uint64_t bytes, uint64_t *ret_off, bool *ret_dirty)
{
	unsigned best = UINT32_MAX;
	uint64_t cached;

	bytes = snapkvd_arena_round(bytes);
	if (!bytes)
		return -EINVAL;
	for (unsigned i = 0; i < a->n_free; i++) {
		const struct snapkvd_extent *e = &a->free[i];

		if (e->cached && e->len >= bytes &&
		    (best == UINT32_MAX || e->len < a->free[best].len))
			best = i;
	}
	for (unsigned i = 0; best == UINT32_MAX && i < a->n_free; i++)
		if (run_len(a, i) >= bytes)
			best = i;
	if (best == UINT32_MAX)
		return -ENOSPC;
	*ret_off = a->free[best].off;
	cached = carve(a, best, bytes);
	if (cached) {
		count_cached(a, cached, false);
		if (a->set)
			a->set->reused += cached;
	}
	if (ret_dirty)
		*ret_dirty = cached != 0;
	a->used += bytes;
	return 0;
}

int snapkvd_arena_alloc(struct snapkvd_arena *a, uint64_t bytes, uint64_t *ret_off)
{
	return snapkvd_arena_take(a, bytes, ret_off, NULL);
}

uint64_t snapkvd_arena_trim(struct snapkvd_arena *a, uint64_t bytes)
{
	uint64_t done = 0;

	for (unsigned i = a->n_free; i-- > 0 && done < bytes;) {
		struct snapkvd_extent *e = &a->free[i];
		uint64_t t = e->len < bytes - done ? e->len : bytes - done;

		if (!e->cached)
			continue;
		t = snapkvd_arena_round(t);
		/* the tail of the extent becomes zero; without room for the
		 * split, all of it does */
		if (t < e->len && grow_table(a) == 0) {
			e = &a->free[i];
			memmove(e + 2, e + 1, (a->n_free - i - 1) * sizeof(*e));
			e->len -= t;
			e[1] = (struct snapkvd_extent){e->off + e->len, t, false};
			a->n_free++;
		} else {
			t = e->len;
			e->cached = false;
		}
		punch(a, a->free[i].cached ? a->free[i + 1].off : a->free[i].off, t);
		done += t;
	}
	coalesce(a);
	count_cached(a, done, false);
	if (a->set)
		a->set->trimmed += done;
	return done;
}

/* Punch the least recently cached arenas until the set is within limit. */
static void enforce(struct snapkvd_arena_set *set)
{
	while (set->cached > (set->pressure ? 0 : set->limit)) {
		struct snapkvd_arena *old = NULL;

		for (struct snapkvd_arena *a = set->first; a; a = a->set_next)
			if (a->cached && (!old || a->stamp < old->stamp))
				old = a;
		if (!old ||
		    !snapkvd_arena_trim(old, set->cached - (set->pressure ? 0 : set->limit)))
			break;
	}
}

/*
 * Keep [off, off + bytes) as free extents: the parts with pages (SEEK_DATA)
 * cached, the holes (never written: the K/V of a GPU cache, unused decode
 * headroom) zero. Returns the cached bytes; on -ENOMEM the rest is punched
 * and lost to the arena, never double-used.
 */
static uint64_t keep(struct snapkvd_arena *a, uint64_t off, uint64_t bytes)
{
	uint64_t p = off, end = off + bytes, cached = 0;

	while (p < end) {
		off_t d = lseek(a->fd, (off_t)p, SEEK_DATA), h;

		if (d < 0 || (uint64_t)d >= end)
			d = (off_t)end;
		h = d < (off_t)end ? lseek(a->fd, d, SEEK_HOLE) : (off_t)end;
		if (h < d || (uint64_t)h > end)
			h = (off_t)end;
		if ((uint64_t)d > p &&
		    insert(a, (struct snapkvd_extent){p, (uint64_t)d - p, false}) < 0)
			break;
		if (h > d &&
		    insert(a, (struct snapkvd_extent){(uint64_t)d, (uint64_t)(h - d), true}) < 0) {
			p = (uint64_t)d;
			break;
		}
		cached += (uint64_t)(h - d);
		p = (uint64_t)h;
	}
	if (p < end)
		punch(a, p, end - p);
	return cached;
}

void snapkvd_arena_release(struct snapkvd_arena *a, uint64_t off, uint64_t bytes)
{
	uint64_t cached;

	bytes = snapkvd_arena_round(bytes);
	if (!bytes || off > a->size || bytes > a->size - off)
		return;
	a->used -= bytes;
	/* The daemon is exiting and the arena goes with its session: the pages
	 * stay (see keep_pages) and nothing will be carved from it again, so no
	 * free extents are kept. keep()'s SEEK_HOLE runs to the end of the
	 * region's run of pages, which in a full arena is the whole arena: the
	 * caches of a session freed one by one at exit were quadratic (125,000
	 * caches over 62 sessions: 17.7 s of SIGTERM). */
	if (a->keep_pages)
		return;
	/* Not cached: hand the pages back to the kernel; the engine sees zeros. */
	if (!a->keep_pages && !(a->set && !a->set->pressure && a->set->limit)) {
		punch(a, off, bytes);
		/* on -ENOMEM the region is lost to this arena, never double-used */
		(void)insert(a, (struct snapkvd_extent){off, bytes, false});
		return;
	}
	cached = keep(a, off, bytes);
	count_cached(a, cached, true);
	if (a->set && !a->keep_pages && cached) {
		a->stamp = ++a->set->clock;
		enforce(a->set);
	}
}

void snapkvd_arena_set_limit(struct snapkvd_arena_set *set, uint64_t limit)
{
	set->limit = limit;
	enforce(set);
}

void snapkvd_arena_set_pressure(struct snapkvd_arena_set *set, bool on)
{
	set->pressure = on;
	enforce(set);
}

uint64_t snapkvd_arena_set_cached(const struct snapkvd_arena_set *set)
{
	return __atomic_load_n(&set->cached, __ATOMIC_RELAXED);
}
