/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-tally.h - what the loop thread keeps running so that no event
 * walks every cache of every session: the ledger totals of the pool and of
 * each tenant (updated where a cache is committed, appended to, grown,
 * released with linger or freed), and the lingering caches - the only
 * eviction candidates - in LRU order (oldest last use first, ties to the
 * smaller id, as snapkvd_pressure_pick_evictions orders them). Loop thread
 * only; no lock.
 */
#ifndef SNAPKVD_TALLY_H
#define SNAPKVD_TALLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "snapkvd-forward.h"
#include "snapkvd-ledger.h"

/*
 * Caches by id, ascending, for the ledger's pages: a sorted array with holes
 * (cache NULL) where caches went, squeezed out once they are half of it.
 * Ids are handed out at admission and caches committed in nearly that
 * order, so an insertion lands at or near the end.
 */
struct snapkvd_tally_index {
	struct snapkvd_tally_slot {
		uint64_t id;
		struct snapkvd_cache *cache; /* NULL: a hole */
	} * slot;
	size_t n, cap, holes;
};

struct snapkvd_tally_tenant {
	const struct snapkvd_tenant *tenant;
	uid_t uid;
	struct snapkvd_ledger_total total;
	struct snapkvd_tally_index by_id;
};

struct snapkvd_tally {
	struct snapkvd_ledger_total pool;
	struct snapkvd_tally_index by_id; /* every cache */
	uint64_t lingering_bytes;	  /* region bytes of the lingering caches */
	struct snapkvd_cache *lru_head, *lru_tail;
	/* tenants holding at least one cache (few: one per uid) */
	struct snapkvd_tally_tenant *tenants;
	size_t n_tenants, cap_tenants;
};

/* SPEC.md's ledger lines of one cache (skv_ledger_compute, or the sums of
 * a budgeted cache). 0 or -errno from the kernels' check. */
int snapkvd_tally_cache_ledger(const struct snapkvd_cache *c, struct skv_ledger *ret);
/* Add cache c to *t (which the caller zeroed first). */
void snapkvd_tally_add_cache(struct snapkvd_ledger_total *t, const struct snapkvd_cache *c);

/*
 * c (of session s, tenant t) was committed or changed (appended, grown,
 * released with linger): its old share of the sums is replaced by its new
 * one, and a lingering cache joins the LRU. 0, or -ENOMEM (the sums are
 * left as they were; the caller goes on, they are a view).
 */
int snapkvd_tally_update(struct snapkvd_tally *ta, struct snapkvd_session *s,
			 const struct snapkvd_tenant *t, struct snapkvd_cache *c);
/*
 * Up to max caches with an id above `after`, ascending, of every tenant
 * (all) or of uid's, into ret (room for max); the count. *ret_more: whether
 * more follow. *ret_visible: how many such a view sees in all.
 */
size_t snapkvd_tally_page(const struct snapkvd_tally *ta, bool all, uid_t uid, uint64_t after,
			  size_t max, struct snapkvd_cache **ret, bool *ret_more,
			  uint64_t *ret_visible);
/* c is about to be freed: its share leaves the sums, it leaves the LRU. */
void snapkvd_tally_forget(struct snapkvd_tally *ta, struct snapkvd_cache *c);
/* The least recently used lingering cache and its session, or NULL. */
struct snapkvd_cache *snapkvd_tally_oldest(const struct snapkvd_tally *ta,
					   struct snapkvd_session **ret_s);
void snapkvd_tally_fini(struct snapkvd_tally *ta);

#endif
