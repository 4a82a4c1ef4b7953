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

struct snapkvd_tenant {
	uid_t uid;
	char name[64];
	uint64_t used;	   /* committed bytes */
	uint64_t reserved; /* reserved, not yet committed */
	uint64_t caches;
	unsigned sessions;
	uint64_t quota;		   /* 0: the pool's tenant_quota (tenant_quota = UID:BYTES) */
	uint64_t compactions;	   /* finished, for the metrics */
	uint64_t quota_rejections; /* reservations refused with EDQUOT */
	struct snapkvd_tenant *next;
};

struct snapkvd_pool {
	pthread_mutex_t mu;
	uint64_t total;
	uint64_t used;
	uint64_t reserved;
	uint64_t tenant_quota; /* 0: no per-tenant limit below the pool */
	uint64_t peak;
	struct snapkvd_tenant *tenants;
};

/* A reservation: bytes held for one tenant until commit or cancel. */
struct snapkvd_resv {
	struct snapkvd_tenant *tenant;
	uint64_t bytes;
};

int snapkvd_pool_init(struct snapkvd_pool *p, uint64_t total, uint64_t tenant_quota);
void snapkvd_pool_destroy(struct snapkvd_pool *p);
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
void snapkvd_pool_free(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes);
void snapkvd_pool_cache_count(struct snapkvd_pool *p, struct snapkvd_tenant *t, int delta);

/* A readable reason with the numbers for a refused reservation. */
void snapkvd_pool_explain(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes, int r,
			  char *buf, size_t len);

/* used + reserved, under the lock. */
uint64_t snapkvd_pool_used(struct snapkvd_pool *p);

#endif
