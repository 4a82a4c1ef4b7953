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

#include <stddef.h>
#include <stdint.h>

#include "snapkvd-forward.h"
#include "snapkvd-ledger.h"

struct snapkvd_tally_tenant {
	const struct snapkvd_tenant *tenant;
	struct snapkvd_ledger_total total;
};

struct snapkvd_tally {
	struct snapkvd_ledger_total pool;
	uint64_t lingering_bytes; /* region bytes of the lingering caches */
	struct snapkvd_cache *lru_head, *lru_tail;
	/* tenants holding at least one cache (few: one per uid) */
	struct snapkvd_tally_tenant *tenants;
	size_t n_tenants, cap_tenants;
};

/*
 * c (of session s, tenant t) was committed or changed (appended, grown,
 * released with linger): its old share of the sums is replaced by its new
 * one, and a lingering cache joins the LRU. 0, or -ENOMEM (the sums are
 * left as they were; the caller goes on, they are a view).
 */
int snapkvd_tally_update(struct snapkvd_tally *ta, struct snapkvd_session *s,
			 const struct snapkvd_tenant *t, struct snapkvd_cache *c);
/* c is about to be freed: its share leaves the sums, it leaves the LRU. */
void snapkvd_tally_forget(struct snapkvd_tally *ta, struct snapkvd_cache *c);
/* The least recently used lingering cache and its session, or NULL. */
struct snapkvd_cache *snapkvd_tally_oldest(const struct snapkvd_tally *ta,
					   struct snapkvd_session **ret_s);
void snapkvd_tally_fini(struct snapkvd_tally *ta);

#endif
