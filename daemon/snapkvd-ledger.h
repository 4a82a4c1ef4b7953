/* SPDX-License-Identifier: MIT */
/* snapkvd-ledger.h - the capacity ledger of one cache, per SPEC.md, and its
 * sums per tenant and for the pool. */
#ifndef SNAPKVD_LEDGER_H
#define SNAPKVD_LEDGER_H

#include "snapkvd-server.h"

/*
 * Ledger bytes of one cache or a sum of caches. native_full, compact, index
 * and reserved are SPEC.md's formulas (skv_ledger_compute); real is their
 * persistent part, compact + index + reserved; allocated is what the arena
 * regions really occupy, and padding = allocated - real (64-byte and page
 * alignment, position-table rows of unused decode slots).
 */
struct snapkvd_ledger_total {
	uint64_t native_full, compact, index, reserved;
	uint64_t real, allocated, padding;
	uint64_t caches, lingering;
};

/* Add cache c to *t (which the caller zeroed first). */
void snapkvd_ledger_add(struct snapkvd_ledger_total *t, const struct snapkvd_cache *c);

/* Sum of the ledgers of every cache of the server. */
void snapkvd_ledger_totals(struct snapkvd_server *srv, struct snapkvd_ledger_total *ret);

/* Sum over the caches of one tenant (every session of its uid). */
void snapkvd_ledger_tenant(struct snapkvd_server *srv, const struct snapkvd_tenant *t,
			   struct snapkvd_ledger_total *ret);

#endif
