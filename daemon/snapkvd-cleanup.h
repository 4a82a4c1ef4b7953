/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-cleanup.h - systemd's two idioms for building objects: a local
 * declared _cleanup_(foo_freep) is freed on every early return, and
 * `*ret = TAKE_PTR(foo)` hands it out on success (the local becomes NULL,
 * so nothing is freed). Destructors used this way accept NULL and
 * half-built objects. Macros and free() only: no object, no calls.
 */
#ifndef SNAPKVD_CLEANUP_H
#define SNAPKVD_CLEANUP_H

#include <stdlib.h>

#define _cleanup_(f) __attribute__((cleanup(f)))

static inline void snapkvd_freep(void *p)
{
	free(*(void **)p);
}
#define _cleanup_free_ _cleanup_(snapkvd_freep)

/* The pointer's value; the variable is NULL afterwards. */
#define TAKE_PTR(p)                                                                                \
	({                                                                                         \
		__typeof__(p) _taken = (p);                                                        \
		(p) = NULL;                                                                        \
		_taken;                                                                            \
	})

#endif
