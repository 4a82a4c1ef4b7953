/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-arena.h - one session's arena: a sealed memfd the daemon maps
 * read-write and the engine maps too. Regions are carved first-fit at page
 * granularity; freed regions are merged and their pages punched out so the
 * memory really goes back. Bytes count against the pool through the caller
 * (reserve, alloc, commit); the arena only places them. Not thread-safe:
 * the loop thread owns it.
 */
#ifndef SNAPKVD_ARENA_H
#define SNAPKVD_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SNAPKVD_ARENA_ALIGN 4096u

struct snapkvd_extent {
	uint64_t off, len;
};

struct snapkvd_arena {
	int fd;
	uint8_t *base;
	uint64_t size;
	uint64_t used;
	unsigned n_free, cap_free;
	struct snapkvd_extent *free; /* sorted by offset, never adjacent */
	/* Set when the daemon exits: released regions keep their pages, so an
	 * engine still copying a cache it was just answered for reads it whole;
	 * the memory goes when the engine unmaps the memfd. */
	bool keep_pages;
};

/* Create a sealed memfd of `size` bytes and map it. 0 or -errno. */
int snapkvd_arena_new(uint64_t size, const char *name, struct snapkvd_arena **ret);
void snapkvd_arena_free(struct snapkvd_arena *a);
/* Round up to the arena's granularity; 0 on overflow. */
uint64_t snapkvd_arena_round(uint64_t bytes);
/* First fit. 0 or -ENOSPC (no room in this arena), -ENOMEM. */
int snapkvd_arena_alloc(struct snapkvd_arena *a, uint64_t bytes, uint64_t *ret_off);
/* Give back a region; its pages are punched (read back as zero) unless
 * keep_pages. */
void snapkvd_arena_release(struct snapkvd_arena *a, uint64_t off, uint64_t bytes);

#endif
