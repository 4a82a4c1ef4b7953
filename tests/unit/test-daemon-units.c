// SPDX-License-Identifier: MIT
/* test-daemon-units: snapkvd's config parser, pool accounting and arena allocator (the
 * value parsers: tests/unit/daemon/test-value.c). */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "daemon/snapkvd-arena.c"
#include "daemon/snapkvd-config.c"
#include "daemon/snapkvd-log.c"
#include "daemon/snapkvd-pool.c"

static int parse(struct snapkvd_config *c, const char *text, char *err)
{
	snapkvd_config_defaults(c);
	return snapkvd_config_parse(c, text, strlen(text), err, 256);
}

static void test_config(void)
{
	struct snapkvd_config c;
	char err[256] = "";

	CU_ASSERT_EQUAL(parse(&c,
			      "# comment\n\n ; also\npool_bytes = 2G\nthreads=3\n"
			      "allow_uids = 1000, 1001 7\nallow_gids=5\nlog_level = debug\n"
			      "socket = /tmp/x.sock\nsq_entries = 128\n",
			      err),
			0);
	CU_ASSERT_EQUAL(c.pool_bytes, 2ull << 30);
	CU_ASSERT_EQUAL(c.threads, 3);
	CU_ASSERT_EQUAL(c.n_allow_uids, 3);
	CU_ASSERT_EQUAL(c.allow_uids[2], 7);
	CU_ASSERT_EQUAL(c.log_level, SNAPKVD_LOG_DEBUG);
	CU_ASSERT_STRING_EQUAL(c.socket_path, "/tmp/x.sock");
	CU_ASSERT(snapkvd_config_allows(&c, 1001, 99));
	CU_ASSERT(snapkvd_config_allows(&c, 42, 5));
	CU_ASSERT(!snapkvd_config_allows(&c, 42, 6));
	snapkvd_config_defaults(&c);
	CU_ASSERT(snapkvd_config_allows(&c, 42, 6)); /* no lists: the socket mode decides */

	/* errors name the line; nothing is applied from a bad file */
	CU_ASSERT_EQUAL(parse(&c, "threads = 2\nthreads = -1\n", err), -EINVAL);
	CU_ASSERT(strstr(err, "line 2") != NULL);
	CU_ASSERT_EQUAL(c.threads, 0);
	CU_ASSERT_EQUAL(parse(&c, "bogus = 1\n", err), -EINVAL);
	CU_ASSERT(strstr(err, "unknown key") != NULL);
	CU_ASSERT_EQUAL(parse(&c, "just words\n", err), -EINVAL);
	CU_ASSERT_EQUAL(parse(&c, "sq_entries = 100\n", err), -EINVAL);
	CU_ASSERT_EQUAL(parse(&c, "slot_bytes = 5000\n", err), -EINVAL);
	CU_ASSERT_EQUAL(parse(&c, "pool_bytes = 1K\n", err), -EINVAL); /* below the minimum */
	CU_ASSERT_EQUAL(parse(&c, "socket = relative.sock\n", err), -EINVAL);
	CU_ASSERT_EQUAL(parse(&c, "backend = gpu\n", err), -EINVAL);
	/* cuda is a valid name; whether the plugin loads is decided at start-up */
	CU_ASSERT_EQUAL(parse(&c, "backend = cuda\n", err), 0);
	CU_ASSERT_STRING_EQUAL(c.backend, "cuda");
	CU_ASSERT_EQUAL(parse(&c, "backend = host\n", err), 0);
	/* devices: all (the default), or a list of distinct CUDA ordinals */
	CU_ASSERT_EQUAL(c.n_devices, 0);
	CU_ASSERT_EQUAL(parse(&c, "devices = 1, 3\n", err), 0);
	CU_ASSERT_EQUAL(c.n_devices, 2);
	CU_ASSERT_EQUAL(c.devices[0] * 10 + c.devices[1], 13);
	CU_ASSERT_EQUAL(parse(&c, "devices = 1,1\n", err), -EINVAL);
	CU_ASSERT(strstr(err, "devices names 1 twice") != NULL);
	CU_ASSERT_EQUAL(parse(&c, "devices = gpu0\n", err), -EINVAL);
	CU_ASSERT(strstr(err, "devices must be all or up to 16") != NULL);
	CU_ASSERT_EQUAL(parse(&c, "devices = 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n", err),
			-EINVAL);
	CU_ASSERT_EQUAL(c.n_devices, 0); /* parse() starts from the defaults */
	CU_ASSERT_EQUAL(parse(&c, "devices = all\n", err), 0);
	CU_ASSERT_EQUAL(c.n_devices, 0);
	CU_ASSERT_EQUAL(parse(&c, "max_layers = 99999999\n", err), -EINVAL);
	char ids[600] = "allow_uids =";
	for (int i = 0; i < 70; i++)
		strcat(ids, " 1");
	CU_ASSERT_EQUAL(parse(&c, ids, err), -EINVAL);
	char *line = malloc(2000);
	memset(line, 'a', 1999);
	line[1999] = 0;
	CU_ASSERT_EQUAL(parse(&c, line, err), -EINVAL);
	CU_ASSERT(strstr(err, "longer") != NULL);
	free(line);
	snapkvd_config_defaults(&c);
	CU_ASSERT_EQUAL(snapkvd_config_parse(&c, "threads = 1\0x", 14, err, 256), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_config_load(&c, "/nonexistent/snapkvd.conf", err, 256), -ENOENT);
}

static void test_pool(void)
{
	struct snapkvd_pool p;
	struct snapkvd_tenant *a, *b, *a2;
	struct snapkvd_resv r1, r2, r3;

	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_init(&p, 1000, 600), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(&p, 1000, &a), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(&p, 1001, &b), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_tenant_get(&p, 1000, &a2), 0);
	CU_ASSERT_PTR_EQUAL(a, a2);
	CU_ASSERT_EQUAL(a->sessions, 2);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 500, &r1), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_used(&p), 500); /* a reservation counts at once */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 200, &r2), -EDQUOT); /* a's quota */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 501, &r2), -ENOSPC); /* the pool */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 500, &r2), 0);
	snapkvd_pool_commit(&p, &r1);
	CU_ASSERT_EQUAL(a->used, 500);
	CU_ASSERT_EQUAL(a->reserved, 0);
	snapkvd_pool_cancel(&p, &r2);
	CU_ASSERT_EQUAL(snapkvd_pool_used(&p), 500);
	snapkvd_pool_cancel(&p, &r2); /* twice is harmless */
	CU_ASSERT_EQUAL(snapkvd_pool_used(&p), 500);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, UINT64_MAX, &r3), -ENOSPC);
	snapkvd_pool_give_back(&p, a, 500);
	CU_ASSERT_EQUAL(snapkvd_pool_used(&p), 0);
	/* a lower limit while in use: allowed, new work refused until it drains */
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, b, 400, &r3), 0);
	snapkvd_pool_commit(&p, &r3);
	snapkvd_pool_set_limits(&p, 100, 0);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 1, &r1), -ENOSPC);
	snapkvd_pool_give_back(&p, b, 400);
	CU_ASSERT_EQUAL(snapkvd_pool_reserve(&p, a, 100, &r1), 0);
	snapkvd_pool_cancel(&p, &r1);
	snapkvd_pool_tenant_put(&p, a);
	snapkvd_pool_tenant_put(&p, a);
	CU_ASSERT_EQUAL(a->sessions, 0);
	snapkvd_pool_destroy(&p);
}

static struct snapkvd_pool race_pool;
static struct snapkvd_tenant *race_tenant;
static int race_ok[4];

static void *racer(void *arg)
{
	int id = (int)(intptr_t)arg;

	for (int i = 0; i < 10000; i++) {
		struct snapkvd_resv r;

		if (snapkvd_pool_reserve(&race_pool, race_tenant, 7, &r) == 0) {
			race_ok[id]++;
			snapkvd_pool_commit(&race_pool, &r);
		}
	}
	return NULL;
}

static void test_pool_race(void)
{
	pthread_t t[4];
	int total = 0;

	snapkvd_pool_init(&race_pool, 7 * 1000, 0);
	snapkvd_pool_tenant_get(&race_pool, 1, &race_tenant);
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, racer, (void *)(intptr_t)i);
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		total += race_ok[i];
	}
	/* reserve-then-commit: exactly the budget, never more */
	CU_ASSERT_EQUAL(total, 1000);
	CU_ASSERT_EQUAL(snapkvd_pool_used(&race_pool), 7000);
	snapkvd_pool_destroy(&race_pool);
}

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
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("daemon-units", NULL, NULL);
	CU_add_test(s, "config", test_config);
	CU_add_test(s, "pool", test_pool);
	CU_add_test(s, "pool reserve race", test_pool_race);
	CU_add_test(s, "arena", test_arena);
	CU_add_test(s, "arena: released regions reused, limit and pressure", test_arena_reuse);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
