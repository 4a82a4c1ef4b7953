// SPDX-License-Identifier: MIT
/*
 * test-arena: a session's arena (daemon/snapkvd-arena.c): a sealed memfd,
 * first-fit regions whose released pages read as zero, holes merged back,
 * sizes it cannot hold refused, and the set of arenas that keeps released
 * pages for reuse within its limit, punching them under pressure.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/snapkvd-arena.c"
#include "tests/test-skip.h"

static void test_arena(void)
{
	struct snapkvd_arena *a = NULL;
	uint64_t o1, o2, o3, o4;

	CU_ASSERT_EQUAL_FATAL(snapkvd_arena_new(64 * 4096, "test-arena", &a), 0);
	/* sealed: nobody (the engine holds this fd too) can resize it */
	CU_ASSERT_EQUAL(ftruncate(a->fd, 4096), -1);
	CU_ASSERT_EQUAL(errno, EPERM);
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(a, 1, &o1), 0);
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(a, 4097, &o2), 0);
	CU_ASSERT_EQUAL(o2, 4096);
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(a, 4096, &o3), 0);
	CU_ASSERT_EQUAL(o3, 3 * 4096);
	CU_ASSERT_EQUAL(a->used, 4 * 4096);
	memset(a->base + o2, 0xab, 8192);
	snapkvd_arena_release(a, o2, 4097);
	/* pages really go back: they read as zero */
	CU_ASSERT_EQUAL(a->base[o2], 0);
	CU_ASSERT_EQUAL(a->base[o2 + 8191], 0);
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(a, 8192, &o4), 0);
	CU_ASSERT_EQUAL(o4, o2); /* first fit reuses the hole */
	snapkvd_arena_release(a, o4, 8192);
	snapkvd_arena_release(a, o1, 4096);
	snapkvd_arena_release(a, o3, 4096);
	/* everything merged back into one extent */
	CU_ASSERT_EQUAL(a->n_free, 1);
	CU_ASSERT_EQUAL(a->used, 0);
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(a, 64 * 4096, &o1), 0);
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(a, 1, &o2), -ENOSPC);
	snapkvd_arena_release(a, o1, 64 * 4096);
	/* many holes grow the extent table */
	uint64_t offs[64];
	for (int i = 0; i < 64; i++)
		CU_ASSERT_EQUAL(snapkvd_arena_alloc(a, 4096, &offs[i]), 0);
	for (int i = 0; i < 64; i += 2)
		snapkvd_arena_release(a, offs[i], 4096);
	CU_ASSERT_EQUAL(a->n_free, 32);
	for (int i = 1; i < 64; i += 2)
		snapkvd_arena_release(a, offs[i], 4096);
	CU_ASSERT_EQUAL(a->n_free, 1);
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(a, UINT64_MAX, &o1), -EINVAL);
	snapkvd_arena_release(a, a->size, 4096); /* out of range: ignored */
	CU_ASSERT_EQUAL(a->used, 0);
	snapkvd_arena_free(a);
	snapkvd_arena_free(NULL);
}

/* Bytes of the memfd's pages that exist (populated or kept). */
static uint64_t populated(const struct snapkvd_arena *a)
{
	struct stat st;

	return fstat(a->fd, &st) == 0 ? (uint64_t)st.st_blocks * 512 : UINT64_MAX;
}

/* The byte at off, read through the fd: a hole stays a hole (a load
 * through the mapping would populate it). */
static uint8_t at(const struct snapkvd_arena *a, uint64_t off)
{
	uint8_t v = 0x77;

	return pread(a->fd, &v, 1, (off_t)off) == 1 ? v : 0x77;
}

/* Released regions are reused with their pages; the set's limit and
 * pressure punch them. */
static void test_arena_reuse(void)
{
	struct snapkvd_arena_set set = {.limit = 64 * 4096};
	struct snapkvd_arena *a = NULL, *b = NULL;
	uint64_t o1, o2, o3, p0;
	bool dirty = true;

	CU_ASSERT_EQUAL_FATAL(snapkvd_arena_new(64 * 4096, "test-reuse", &a), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_arena_new(64 * 4096, "test-reuse-b", &b), 0);
	snapkvd_arena_join(a, &set);
	snapkvd_arena_join(b, &set);
	CU_ASSERT_EQUAL(snapkvd_arena_take(a, 8 * 4096, &o1, &dirty), 0);
	CU_ASSERT_FALSE(dirty); /* fresh pages read as zero */
	memset(a->base + o1, 0xab, 8 * 4096);
	p0 = populated(a);
	CU_ASSERT(p0 >= 8 * 4096);
	snapkvd_arena_release(a, o1, 8 * 4096);
	/* kept: the pages are still there, counted as cached, not used */
	CU_ASSERT_EQUAL(a->used, 0);
	CU_ASSERT_EQUAL(a->cached, 8 * 4096);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&set), 8 * 4096);
	CU_ASSERT_EQUAL(at(a, o1 + 5), 0xab);
	CU_ASSERT_EQUAL(populated(a), p0);
	/* the same size again: the same pages, nothing new populated */
	CU_ASSERT_EQUAL(snapkvd_arena_take(a, 8 * 4096, &o2, &dirty), 0);
	CU_ASSERT_EQUAL(o2, o1);
	CU_ASSERT_TRUE(dirty);
	CU_ASSERT_EQUAL(a->cached, 0);
	CU_ASSERT_EQUAL(set.reused, 8 * 4096);
	memset(a->base + o2, 0xcd, 8 * 4096);
	CU_ASSERT_EQUAL(populated(a), p0);
	/* a smaller region takes the smallest cached extent that fits */
	CU_ASSERT_EQUAL(snapkvd_arena_take(a, 2 * 4096, &o3, NULL), 0);
	a->base[o3 + 4096] = 1; /* one page of two written */
	snapkvd_arena_release(a, o2, 8 * 4096);
	snapkvd_arena_release(a, o3, 2 * 4096);
	/* only pages that exist count: the hole at o3 stays zero */
	CU_ASSERT_EQUAL(a->cached, 9 * 4096);
	CU_ASSERT_EQUAL(a->n_free, 4); /* pages 0-7 cached, 8 zero, 9 cached, 10- zero */
	CU_ASSERT_EQUAL(snapkvd_arena_take(a, 2 * 4096, &o3, &dirty), 0);
	CU_ASSERT_TRUE(dirty);
	CU_ASSERT_EQUAL(o3, o1);
	/* a region larger than any cached extent spans cached and zero ones */
	CU_ASSERT_EQUAL(snapkvd_arena_take(a, 16 * 4096, &o2, &dirty), 0);
	CU_ASSERT_TRUE(dirty);
	CU_ASSERT_EQUAL(o2, o1 + 2 * 4096);
	CU_ASSERT_EQUAL(a->cached, 0);
	snapkvd_arena_release(a, o3, 2 * 4096);
	snapkvd_arena_release(a, o2, 16 * 4096);
	CU_ASSERT_EQUAL(a->cached, 9 * 4096);

	/* over the limit: the arena that cached least recently goes first */
	memset(b->base, 0x11, 60 * 4096);
	CU_ASSERT_EQUAL(snapkvd_arena_take(b, 60 * 4096, &o1, NULL), 0);
	snapkvd_arena_release(b, o1, 60 * 4096);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&set), 64 * 4096);
	CU_ASSERT_EQUAL(b->cached, 60 * 4096);
	CU_ASSERT_EQUAL(a->cached, 4 * 4096); /* a's highest offsets punched */
	CU_ASSERT_EQUAL(set.trimmed, 5 * 4096);
	CU_ASSERT_EQUAL(at(a, o2 + 15 * 4096), 0);
	CU_ASSERT_EQUAL(at(a, o1), 0xcd);
	/* a lower limit (SIGHUP) punches what is over it */
	snapkvd_arena_set_limit(&set, 16 * 4096);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&set), 16 * 4096);
	CU_ASSERT_EQUAL(a->cached, 0);
	snapkvd_arena_set_limit(&set, 64 * 4096);

	/* pressure: every cached page goes back, and none is kept meanwhile */
	snapkvd_arena_set_pressure(&set, true);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&set), 0);
	CU_ASSERT_EQUAL(populated(a), 0);
	CU_ASSERT_EQUAL(populated(b), 0);
	CU_ASSERT_EQUAL(at(b, o1), 0);
	CU_ASSERT_EQUAL(snapkvd_arena_take(a, 4 * 4096, &o1, &dirty), 0);
	CU_ASSERT_FALSE(dirty);
	memset(a->base + o1, 0x22, 4 * 4096);
	snapkvd_arena_release(a, o1, 4 * 4096);
	CU_ASSERT_EQUAL(a->cached, 0);
	CU_ASSERT_EQUAL(at(a, o1), 0);
	CU_ASSERT_EQUAL(a->n_free, 1);
	snapkvd_arena_set_pressure(&set, false);
	CU_ASSERT_EQUAL(snapkvd_arena_take(a, 4 * 4096, &o1, NULL), 0);
	memset(a->base + o1, 0x33, 4 * 4096);
	snapkvd_arena_release(a, o1, 4 * 4096);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&set), 4 * 4096);
	/* limit 0: punched at release, as an arena without a set */
	snapkvd_arena_set_limit(&set, 0);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&set), 0);
	snapkvd_arena_set_limit(&set, 64 * 4096);
	CU_ASSERT_EQUAL(snapkvd_arena_take(b, 4 * 4096, &o1, NULL), 0);
	memset(b->base + o1, 0x44, 4 * 4096);
	snapkvd_arena_release(b, o1, 4 * 4096);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&set), 4 * 4096);
	/* an arena that goes takes its cached bytes out of the set */
	snapkvd_arena_free(b);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&set), 0);
	CU_ASSERT_PTR_EQUAL(set.first, a);
	snapkvd_arena_free(a);
	CU_ASSERT_PTR_NULL(set.first);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("arena", NULL, NULL);
	CU_add_test(su, "regions, holes, refusals", test_arena);
	CU_add_test(su, "released regions reused, limit and pressure", test_arena_reuse);
	return t_run();
}
