/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-arena.h - one session's arena: a sealed memfd the daemon maps
 * read-write and the engine maps too. Regions are carved at page
 * granularity. A released region keeps its pages ("cached": populated but
 * free) and is handed to the next compaction of the same session that fits,
 * so the hot path writes into pages that are already there instead of
 * faulting in fresh ones; cached pages are punched out (given back to the
 * kernel, reading as zero) when the daemon's arenas together cache more
 * than their set's limit (arena_cache_bytes), under memory pressure, or
 * when the arena has no set. Bytes count against the pool through the
 * caller (reserve, alloc, commit); the arena only places them, and cached
 * bytes are free in the pool. Not thread-safe: the loop thread owns every
 * arena and the set.
 */
#ifndef SNAPKVD_ARENA_H
#define SNAPKVD_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SNAPKVD_ARENA_ALIGN 4096u

struct snapkvd_extent {
	uint64_t off, len;
	bool cached; /* its pages are populated (a released region's), else zero */
};

struct snapkvd_arena;

/*
 * What every arena of a daemon shares: the cached bytes of all of them and
 * their limit. Over the limit, the arenas that cached least recently are
 * punched first; under pressure nothing is cached. Zeroed is valid (limit 0:
 * every released region is punched at once).
 */
struct snapkvd_arena_set {
	uint64_t limit;	  /* arena_cache_bytes */
	bool pressure;	  /* high or critical: cache nothing */
	uint64_t cached;  /* populated free bytes, all arenas (read by the metrics) */
	uint64_t reused;  /* bytes handed out populated, ever */
	uint64_t trimmed; /* cached bytes punched (limit, pressure), ever */
	uint64_t clock;	  /* stamps of releases, for the order of trimming */
	struct snapkvd_arena *first;
};

struct snapkvd_arena {
	int fd;
	uint8_t *base;
	uint64_t size;
	uint64_t used;
	uint64_t cached; /* bytes of cached free extents */
	unsigned n_free, cap_free;
	/* sorted by offset; neighbours always differ in `cached` (a cached and
	 * a zero extent may touch; a region may span both) */
	struct snapkvd_extent *free;
	/* Set when the daemon exits: released regions keep their pages, so an
	 * engine still copying a cache it was just answered for reads it whole;
	 * the memory goes when the engine unmaps the memfd. */
	bool keep_pages;
	bool huge;		       /* MADV_HUGEPAGE was accepted for the mapping */
	struct snapkvd_arena_set *set; /* NULL: nothing is cached */
	struct snapkvd_arena *set_prev, *set_next;
	uint64_t stamp; /* set->clock at the last region cached here */
};

/* Create a sealed memfd of `size` bytes and map it (transparent huge pages
 * asked for; the kernel's shmem_enabled decides). 0 or -errno. */
int snapkvd_arena_new(uint64_t size, const char *name, struct snapkvd_arena **ret);
/* Punches nothing; leaves the set. */
void snapkvd_arena_free(struct snapkvd_arena *a);
/* Join set (cache released regions up to its limit). */
void snapkvd_arena_join(struct snapkvd_arena *a, struct snapkvd_arena_set *set);
/* Round up to the arena's granularity; 0 on overflow. */
uint64_t snapkvd_arena_round(uint64_t bytes);
/*
 * Place `bytes`: a cached extent that fits (the smallest) first, else the
 * first run of free extents that does. *ret_dirty (may be NULL): some of the
 * region's pages held earlier regions of this arena (data of this session's
 * released caches) and must be overwritten; false: it reads as zero. 0 or
 * -ENOSPC (no room in this arena), -EINVAL.
 */
int snapkvd_arena_take(struct snapkvd_arena *a, uint64_t bytes, uint64_t *ret_off, bool *ret_dirty);
/* snapkvd_arena_take() without the dirty flag. */
int snapkvd_arena_alloc(struct snapkvd_arena *a, uint64_t bytes, uint64_t *ret_off);
/* Give back a region: while its set allows, the parts that have pages are
 * kept as cached and the holes stay zero; punched otherwise. */
void snapkvd_arena_release(struct snapkvd_arena *a, uint64_t off, uint64_t bytes);
/* Punch cached extents of a, at least `bytes` of them (from its highest
 * offsets); UINT64_MAX: all. Returns the bytes punched. */
uint64_t snapkvd_arena_trim(struct snapkvd_arena *a, uint64_t bytes);

/* A new limit (SIGHUP); punches what is over it. */
void snapkvd_arena_set_limit(struct snapkvd_arena_set *set, uint64_t limit);
/* Pressure at high or critical: punch every cached page and cache nothing
 * until it is off again. */
void snapkvd_arena_set_pressure(struct snapkvd_arena_set *set, bool on);
/* The cached bytes of every arena (atomic read: any thread). */
uint64_t snapkvd_arena_set_cached(const struct snapkvd_arena_set *set);

#endif
