/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-ledger.h - the capacity ledger (SPEC.md "Capacity ledger"): of
 * one cache, its sums per tenant and for the pool, the ledger part of an
 * admin reply, and its JSON form for the pressure hooks.
 */
#ifndef SNAPKVD_LEDGER_H
#define SNAPKVD_LEDGER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/snapkv.pb-c.h"
#include "skv.h"
#include "snapkvd-forward.h"

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
	/* writeback caches: compact + reserved K/V bytes in engines' own
	 * blocks (not in compact, reserved, real or the pool) */
	uint64_t engine_held;
};

/*
 * The ledger part of an admin CACHES/LEDGER reply (pool, tenants, caches),
 * filled into *r with its arrays in *b; free them with
 * snapkvd_ledger_reply_free() once *r is no longer used. 0 or -ENOMEM (then
 * *r holds no pointer into *b).
 */
struct ledger_pick;
struct snapkvd_ledger_buf {
	struct ledger_pick *pick; /* the caches of the reply, by id */
	Snapkv__V1__TenantInfo *ti, **tip;
	Snapkv__V1__CacheLedger *cl, **clp;
	Snapkv__V1__LedgerBytes *lb, *tb, pool;
	struct snapkvd_tenant_stats *ts;
};
/*
 * Who asks, and which page. A caller that is not root, the daemon's user or
 * in admin_uids (all = false) sees its own tenant and the caches of its own
 * uid's sessions only. Caches come by id, those above `after`, at most
 * `page` (0: SNAPKVD_LEDGER_PAGE) of them: every page fits a frame whatever
 * one tenant holds, and the reply's next_page_after continues.
 */
/* 512 entries of at most ~260 bytes: below the default net.core.wmem_max
 * (208 KiB), so a page goes out even where SO_SNDBUFFORCE is not allowed */
#define SNAPKVD_LEDGER_PAGE 512
struct snapkvd_ledger_view {
	bool all;
	uid_t uid;
	uint64_t after;
	uint32_t page;
};
/* v NULL: everything, unpaged (the hooks' snapshot). */
int snapkvd_ledger_reply(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r,
			 struct snapkvd_ledger_buf *b, const struct snapkvd_ledger_view *v);
void snapkvd_ledger_reply_free(struct snapkvd_ledger_buf *b);

/*
 * A page built in slices over several loop rounds (snapkvd-adminq.h): each
 * slice packs the next caches by id after the last one packed, each as an
 * AdminReply holding only that cache, so that the packed slices,
 * concatenated after the rest of the reply, parse as its repeated `caches`
 * field. Caches released between two slices are simply not reached; a
 * cache is never packed twice (ids only grow along the page); one that
 * lives through the whole listing is packed exactly once.
 */
struct snapkvd_ledger_cursor {
	struct snapkvd_ledger_view v;
	uint64_t after; /* the last id packed (v.after before the first) */
	size_t left;	/* caches the page may still take */
	bool done;	/* the page is full, or no visible cache follows */
	uint8_t *bytes; /* the packed caches */
	size_t len, cap, n;
};
void snapkvd_ledger_cursor_init(struct snapkvd_ledger_cursor *cur,
				const struct snapkvd_ledger_view *v);
/* Up to max more caches packed into cur: how many, or -ENOMEM (cur as it
 * was). Sets cur->done. */
int snapkvd_ledger_slice(struct snapkvd_server *srv, struct snapkvd_ledger_cursor *cur, size_t max);
/* The rest of the page's reply as things are now: pool, tenants, totals,
 * caches_visible and next_page_after (n_caches 0: the caches are cur's
 * bytes). Arrays in *b as for snapkvd_ledger_reply. 0 or -ENOMEM. */
int snapkvd_ledger_finish(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r,
			  struct snapkvd_ledger_buf *b, const struct snapkvd_ledger_cursor *cur);
void snapkvd_ledger_cursor_fini(struct snapkvd_ledger_cursor *cur);

/* The hooks' ledger snapshot: the LEDGER reply as `snapkvctl ledger --json`
 * prints it (every tenant, the pool and tenant totals over every cache),
 * listing the max_caches caches of lowest id, plus "pressure" (level_name)
 * and, when caches were left out, "caches_listed" and "caches_total".
 * Bounded by max_caches whatever the daemon holds. Malloc'd text or NULL. */
char *snapkvd_ledger_json(struct snapkvd_server *srv, const char *level_name, uint32_t max_caches);

#endif
