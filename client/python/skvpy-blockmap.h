/* SPDX-License-Identifier: MIT */
/*
 * skvpy-blockmap.h - the parts of engine buffers (Mappings from
 * Client.empty()) that one Cache's arena blocks are mapped over
 * (Cache.map_blocks), so that the cache is never released while the
 * engine's pool still reads and writes its pages: explicit release() is
 * refused while any is mapped, and a cache released implicitly (garbage
 * collected, a with block, its client closed) puts the buffer's own pages
 * back first. Page-aligned address ranges [lo, hi); a range mapped over by
 * another cache, or unmapped, is subtracted.
 */
#ifndef SKVPY_BLOCKMAP_H
#define SKVPY_BLOCKMAP_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

struct skvpy_mapping;

/* Limit on the ranges of one cache mapped at once (map_blocks). */
#define SKVPY_MAX_MAPPED_RUNS 4096

struct skvpy_blockrun {
	struct skvpy_mapping *m; /* strong reference: its pages go back on restore */
	uintptr_t lo, hi;
};

struct skvpy_blockmap {
	struct skvpy_blockrun *runs;
	size_t n, cap;
};

/* Room for one more range (and a split): -1 with snapkv.Error(ENOSPC) at the limit or
 * MemoryError. Called before mapping, so that add() cannot fail after. */
int skvpy_blockmap_reserve(struct skvpy_blockmap *bm);
/* Record [lo, hi) of m as mapped (after reserve()). */
void skvpy_blockmap_add(struct skvpy_blockmap *bm, struct skvpy_mapping *m, uintptr_t lo,
			uintptr_t hi);
/* [lo, hi) no longer holds this cache's pages: subtract it (a range split
 * in two keeps both sides; without memory for that, the whole range stays). */
void skvpy_blockmap_forget(struct skvpy_blockmap *bm, uintptr_t lo, uintptr_t hi);
/* Put each buffer's own pages back over every range, and forget them all.
 * 0 or the first -errno (the ranges are forgotten either way). */
int skvpy_blockmap_restore(struct skvpy_blockmap *bm);
/* Free the list (after restore()). */
void skvpy_blockmap_free(struct skvpy_blockmap *bm);

#endif
