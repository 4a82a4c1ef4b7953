/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-pool.h - the global byte budget every arena is carved from, with
 * per-tenant accounting and quotas. Allocation is reserve-then-commit: a
 * reservation takes the bytes out of the budget at once (so two concurrent
 * checks can never both pass on the same free bytes) and is later committed
 * (the memory is in use) or cancelled. Thread-safe.
 */
#ifndef SNAPKVD_POOL_H
#define SNAPKVD_POOL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

struct snapkvd_tenant; /* one uid's accounting */
struct snapkvd_pool;   /* opaque: every access takes its lock */

/* A reservation: bytes held for one tenant until commit or cancel. */
struct snapkvd_resv {
	struct snapkvd_tenant *tenant;
	uint64_t bytes;
};

int snapkvd_pool_new(uint64_t total, uint64_t tenant_quota, struct snapkvd_pool **ret);
void snapkvd_pool_free(struct snapkvd_pool *p);
/* Change limits (SIGHUP). A total below what is in use is allowed: new
 * reservations fail until usage drops. */
void snapkvd_pool_set_limits(struct snapkvd_pool *p, uint64_t total, uint64_t tenant_quota);

/* Find or create the tenant of uid (one more session). 0 or -ENOMEM. */
int snapkvd_pool_tenant_get(struct snapkvd_pool *p, uid_t uid, struct snapkvd_tenant **ret);
/* One session less; the tenant stays listed while it holds bytes. */
void snapkvd_pool_tenant_put(struct snapkvd_pool *p, struct snapkvd_tenant *t);

/* 0; -ENOSPC when the pool is exhausted; -EDQUOT when the tenant's quota is. */
int snapkvd_pool_reserve(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes,
			 struct snapkvd_resv *ret);
void snapkvd_pool_commit(struct snapkvd_pool *p, struct snapkvd_resv *r);
void snapkvd_pool_cancel(struct snapkvd_pool *p, struct snapkvd_resv *r);
/* Give back committed bytes. */
void snapkvd_pool_give_back(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes);
void snapkvd_pool_cache_count(struct snapkvd_pool *p, struct snapkvd_tenant *t, int delta);

/* A readable reason with the numbers for a refused reservation. */
void snapkvd_pool_explain(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes, int r,
			  char *buf, size_t len);

/* used + reserved, under the lock. */
uint64_t snapkvd_pool_used(struct snapkvd_pool *p);
uint64_t snapkvd_pool_total(struct snapkvd_pool *p);

/* The tenant's own quota (0: the pool's tenant_quota). */
void snapkvd_pool_tenant_set_quota(struct snapkvd_pool *p, struct snapkvd_tenant *t,
				   uint64_t quota);
/* Every known tenant's quota anew (SIGHUP): quota(data, uid) for each. */
void snapkvd_pool_requota(struct snapkvd_pool *p, uint64_t (*quota)(void *data, uid_t uid),
			  void *data);
/* One more finished compaction of t, for the metrics. */
void snapkvd_pool_tenant_compaction(struct snapkvd_pool *p, struct snapkvd_tenant *t);
/* t's used + reserved bytes. */
uint64_t snapkvd_pool_tenant_use(struct snapkvd_pool *p, const struct snapkvd_tenant *t);
/* Set once when the tenant is created: no lock needed. */
const char *snapkvd_tenant_name(const struct snapkvd_tenant *t);

/*
 * Registered buffers are mapped whole in the daemon: their count and bytes
 * are charged to the tenant (all its sessions) and to the daemon, against
 * max_tenant_buffers, max_tenant_mapped_bytes and max_mapped_bytes (set at
 * start and on SIGHUP; none until set). 0, or -EMFILE /
 * -EDQUOT / -ENOSPC with the limit and its key in err.
 */
void snapkvd_pool_set_map_limits(struct snapkvd_pool *p, unsigned max_tenant_buffers,
				 uint64_t max_tenant_mapped_bytes, uint64_t max_mapped_bytes);
int snapkvd_pool_map(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes, char *err,
		     size_t errlen);
void snapkvd_pool_unmap(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes);
uint64_t snapkvd_pool_mapped(struct snapkvd_pool *p);

/* What the admin replies and the metrics show, copied under the lock. */
struct snapkvd_pool_stats {
	uint64_t total, used, reserved; /* used: used + reserved */
};
struct snapkvd_tenant_stats {
	const struct snapkvd_tenant *tenant;
	const char *name;
	uid_t uid;
	uint64_t used_bytes;  /* used + reserved */
	uint64_t quota_bytes; /* effective: its own, else the pool's */
	uint64_t caches, compactions, quota_rejections;
	unsigned sessions;
	unsigned buffers;      /* registered buffers */
	uint64_t mapped_bytes; /* their bytes mapped in the daemon */
};
/* *ret and a malloc'd array of every tenant (free() it). 0 or -ENOMEM. */
int snapkvd_pool_snapshot(struct snapkvd_pool *p, struct snapkvd_pool_stats *ret,
			  struct snapkvd_tenant_stats **ret_tenants, size_t *ret_n);

#endif
