// SPDX-License-Identifier: MIT
#include "skvpy-blockmap.h"

#include <errno.h>

#include "skvpy-error.h"
#include "skvpy-mapping.h"

int skvpy_blockmap_reserve(struct skvpy_blockmap *bm)
{
	/* two: the new range, and the second half of the one range it may split
	 * (the ranges are disjoint, so at most one contains another) */
	if (bm->n + 2 <= bm->cap)
		return 0;
	if (bm->n >= SKVPY_MAX_MAPPED_RUNS)
		return skvpy_error_int(ENOSPC,
				       "map_blocks: %d ranges of this cache are mapped (the "
				       "limit): unmap_blocks() some first",
				       SKVPY_MAX_MAPPED_RUNS);
	size_t cap = bm->cap ? bm->cap * 2 : 4;
	struct skvpy_blockrun *r = PyMem_Realloc(bm->runs, cap * sizeof(*r));

	if (!r) {
		PyErr_NoMemory();
		return -1;
	}
	bm->runs = r;
	bm->cap = cap;
	return 0;
}

void skvpy_blockmap_add(struct skvpy_blockmap *bm, struct skvpy_mapping *m, uintptr_t lo,
			uintptr_t hi)
{
	Py_INCREF(m);
	bm->runs[bm->n++] = (struct skvpy_blockrun){m, lo, hi};
}

static void drop(struct skvpy_blockmap *bm, size_t i)
{
	Py_DECREF(bm->runs[i].m);
	bm->runs[i] = bm->runs[--bm->n];
}

void skvpy_blockmap_forget(struct skvpy_blockmap *bm, uintptr_t lo, uintptr_t hi)
{
	for (size_t i = 0; i < bm->n;) {
		struct skvpy_blockrun *r = &bm->runs[i];

		if (r->hi <= lo || r->lo >= hi) {
			i++;
		} else if (r->lo >= lo && r->hi <= hi) {
			drop(bm, i);
		} else if (r->lo < lo && r->hi > hi) {
			/* the middle goes: two ranges remain */
			if (bm->n + 2 > bm->cap && skvpy_blockmap_reserve(bm) < 0) {
				PyErr_Clear(); /* keep the whole range: restored later */
				i++;
				continue;
			}
			r = &bm->runs[i];
			skvpy_blockmap_add(bm, r->m, hi, r->hi);
			r->hi = lo;
			i++;
		} else {
			if (r->lo < lo)
				r->hi = lo;
			else
				r->lo = hi;
			i++;
		}
	}
}

int skvpy_blockmap_restore(struct skvpy_blockmap *bm)
{
	int ret = 0;

	while (bm->n) {
		struct skvpy_blockrun *r = &bm->runs[bm->n - 1];
		int e = skvpy_mapping_restore(r->m, r->lo - (uintptr_t)r->m->data, r->hi - r->lo);

		if (e < 0 && !ret)
			ret = e;
		drop(bm, bm->n - 1);
	}
	return ret;
}

void skvpy_blockmap_free(struct skvpy_blockmap *bm)
{
	while (bm->n)
		drop(bm, bm->n - 1);
	PyMem_Free(bm->runs);
	bm->runs = NULL;
	bm->cap = 0;
}
