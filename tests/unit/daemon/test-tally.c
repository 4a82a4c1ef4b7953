// SPDX-License-Identifier: MIT
/*
 * test-tally: the loop's running ledger sums and the LRU of lingering
 * caches (daemon/snapkvd-tally.c): after any sequence of commits, appends,
 * lingers and frees the sums equal a walk over the caches, per tenant and
 * for the pool, and the LRU holds exactly the lingering caches, oldest
 * first (ties to the smaller id); and pages by id, of every tenant or of
 * one uid, list each cache once in order.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-tally.c"
#include "tests/test-skip.h"

#define N 64

static struct snapkvd_cache *cache(uint64_t id)
{
	struct snapkvd_cache *c = NULL;

	CU_ASSERT_EQUAL_FATAL(snapkvd_cache_new(2, 2, &c), 0);
	c->id = id;
	c->h_q = c->h_kv = 2;
	c->head_dim = 8;
	c->dtype_bytes = 4;
	c->dtype = SKV_DTYPE_F32;
	c->gqa = SKV_GQA_GROUP;
	c->prompt_len = 100;
	c->budget = 20;
	c->kept = 20;
	c->slots = 24;
	c->region_bytes = 4096 * (1 + id % 3);
	return c;
}

/* what a walk over the live caches of tenant t (NULL: all) sums to */
static void walk(struct snapkvd_cache **cs, const struct snapkvd_tenant **owner,
		 const struct snapkvd_tenant *t, struct snapkvd_ledger_total *ret)
{
	memset(ret, 0, sizeof(*ret));
	for (int i = 0; i < N; i++)
		if (cs[i] && (!t || owner[i] == t))
			snapkvd_tally_add_cache(ret, cs[i]);
}

static int by_id(const void *a, const void *b)
{
	uint64_t x = (*(struct snapkvd_cache *const *)a)->id,
		 y = (*(struct snapkvd_cache *const *)b)->id;

	return x < y ? -1 : x > y;
}

/* Pages of 5 from the start: every visible cache once, by id ascending,
 * the cursor the last id, "more" until the end. owner NULL: every tenant;
 * else uid 1000's (tenant 0x1000's sessions). */
static void check_pages(struct snapkvd_tally *ta, struct snapkvd_cache **cs,
			const struct snapkvd_tenant **owner)
{
	struct snapkvd_cache *want[N], *got[5];
	size_t nw = 0, at = 0, n;
	uint64_t after = 0, visible;
	bool more = true;

	for (int i = 0; i < N; i++)
		if (cs[i] && (!owner || owner[i] == (void *)0x1000))
			want[nw++] = cs[i];
	qsort(want, nw, sizeof(*want), by_id);
	while (more) {
		n = snapkvd_tally_page(ta, !owner, 1000, after, 5, got, &more, &visible);
		CU_ASSERT_EQUAL(visible, nw);
		CU_ASSERT_TRUE(n == 5 || !more);
		for (size_t k = 0; k < n && at < nw; k++)
			CU_ASSERT_PTR_EQUAL(got[k], want[at++]);
		if (n)
			after = got[n - 1]->id;
		if (!n)
			break;
	}
	CU_ASSERT_EQUAL(at, nw);
}

static void check(struct snapkvd_tally *ta, struct snapkvd_cache **cs,
		  const struct snapkvd_tenant **owner, const struct snapkvd_tenant *const *ts)
{
	struct snapkvd_ledger_total w;
	uint64_t lingering = 0, bytes = 0, last = 0, last_id = 0;
	size_t in_lru = 0;

	walk(cs, owner, NULL, &w);
	CU_ASSERT_EQUAL(memcmp(&w, &ta->pool, sizeof(w)), 0);
	for (int k = 0; k < 2; k++) {
		struct snapkvd_ledger_total z = {0}, *got = &z;

		walk(cs, owner, ts[k], &w);
		for (size_t i = 0; i < ta->n_tenants; i++)
			if (ta->tenants[i].tenant == ts[k])
				got = &ta->tenants[i].total;
		CU_ASSERT_EQUAL(memcmp(&w, got, sizeof(w)), 0);
	}
	for (int i = 0; i < N; i++)
		if (cs[i] && cs[i]->lingering) {
			lingering++;
			bytes += cs[i]->region_bytes;
		}
	for (struct snapkvd_cache *c = ta->lru_head; c; c = c->lru_next) {
		CU_ASSERT_TRUE(c->lingering);
		CU_ASSERT_TRUE(c->last_use_ns > last ||
			       (c->last_use_ns == last && c->id > last_id));
		last = c->last_use_ns;
		last_id = c->id;
		in_lru++;
	}
	CU_ASSERT_EQUAL(in_lru, lingering);
	check_pages(ta, cs, NULL);
	check_pages(ta, cs, owner);
	CU_ASSERT_EQUAL(ta->pool.lingering, lingering);
	CU_ASSERT_EQUAL(ta->lingering_bytes, bytes);
}

static void test_random(void)
{
	static const struct snapkvd_tenant *const ts[2] = {(void *)0x1000, (void *)0x2000};
	static struct snapkvd_session sess_obj[2] = {{.uid = 1000}, {.uid = 2000}};
	struct snapkvd_cache *cs[N] = {0};
	const struct snapkvd_tenant *owner[N] = {0};
	struct snapkvd_tally ta = {0};
	uint64_t seed = 42, next_id = 1;

	for (int step = 0; step < 4000; step++) {
		int i;

		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		i = (int)((seed >> 33) % N);
		switch ((seed >> 50) % 4) {
		case 0: /* commit a new cache, or free one */
			if (!cs[i]) {
				cs[i] = cache(next_id++);
				owner[i] = ts[(seed >> 20) & 1];
				CU_ASSERT_EQUAL(snapkvd_tally_update(&ta,
								     &sess_obj[owner[i] != ts[0]],
								     owner[i], cs[i]),
						0);
			} else {
				snapkvd_tally_forget(&ta, cs[i]);
				snapkvd_cache_free(cs[i]);
				cs[i] = NULL;
			}
			break;
		case 1: /* append */
			if (cs[i] && !cs[i]->lingering && cs[i]->appended < 4) {
				cs[i]->appended++;
				CU_ASSERT_EQUAL(snapkvd_tally_update(&ta,
								     &sess_obj[owner[i] != ts[0]],
								     owner[i], cs[i]),
						0);
			}
			break;
		case 2: /* linger; a few share one instant (ties: smaller id first) */
			if (cs[i] && !cs[i]->lingering) {
				cs[i]->lingering = true;
				cs[i]->last_use_ns = (uint64_t)step / 3;
				CU_ASSERT_EQUAL(snapkvd_tally_update(&ta,
								     &sess_obj[owner[i] != ts[0]],
								     owner[i], cs[i]),
						0);
			}
			break;
		default: /* evict the oldest */
		{
			struct snapkvd_session *s = NULL;
			struct snapkvd_cache *c = snapkvd_tally_oldest(&ta, &s);

			if (!c)
				break;
			CU_ASSERT_PTR_EQUAL(s, c->tally_session);
			for (int k = 0; k < N; k++)
				if (cs[k] && cs[k] != c && cs[k]->lingering)
					CU_ASSERT_TRUE(cs[k]->last_use_ns > c->last_use_ns ||
						       (cs[k]->last_use_ns == c->last_use_ns &&
							cs[k]->id > c->id));
			for (int k = 0; k < N; k++)
				if (cs[k] == c)
					cs[k] = NULL;
			snapkvd_tally_forget(&ta, c);
			snapkvd_cache_free(c);
		}
		}
		check(&ta, cs, owner, ts);
	}
	for (int i = 0; i < N; i++)
		if (cs[i]) {
			snapkvd_tally_forget(&ta, cs[i]);
			snapkvd_cache_free(cs[i]);
			cs[i] = NULL;
		}
	/* everything gone: zero sums, no tenant entry, an empty LRU */
	check(&ta, cs, owner, ts);
	CU_ASSERT_EQUAL(ta.n_tenants, 0);
	CU_ASSERT_PTR_NULL(ta.lru_head);
	CU_ASSERT_PTR_NULL(ta.lru_tail);
	snapkvd_tally_fini(&ta);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("tally", NULL, NULL);
	CU_add_test(s,
		    "random commits, appends, lingers, evictions: sums = a walk, LRU order, pages",
		    test_random);
	return t_run();
}
