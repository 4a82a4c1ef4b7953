/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-quota.h - reserve-then-commit byte accounting for the pool and
 * per-tenant quotas.
 *
 * A request first reserves its worst-case bytes against both its tenant's
 * quota and the pool's total; only then does the daemon allocate, and it
 * commits what it used (returning any excess) or cancels. Because the check
 * and the charge are one atomic step per counter, a capacity check can never
 * race the allocation: concurrent reservations never push a tenant past its
 * quota nor the pool past its total. Lock-free (C11 atomics); safe from the
 * loop thread and worker threads alike.
 */
#ifndef SNAPKVD_QUOTA_H
#define SNAPKVD_QUOTA_H

#include <stddef.h>
#include <stdint.h>

struct snapkvd_quota;
struct snapkvd_quota_account;

/* A reservation in flight. Plain value; commit or cancel it exactly once. */
struct snapkvd_reservation {
	struct snapkvd_quota_account *account;
	uint64_t bytes;
};

struct snapkvd_quota_usage {
	uint64_t total;	   /* pool size, or the account's quota (0: none)   */
	uint64_t charged;  /* committed + reserved                          */
	uint64_t reserved; /* reserved, not yet committed                   */
	uint64_t rejected; /* reservations refused (EDQUOT or ENOSPC)       */
};

/* 0, -ENOMEM. */
int snapkvd_quota_new(uint64_t total, struct snapkvd_quota **ret_q);
/* Accounts must have been freed first; NULL is fine. */
void snapkvd_quota_free(struct snapkvd_quota *q);
/* Resize the pool (SIGHUP). Shrinking below what is charged is allowed:
 * nothing is taken away, new reservations fail until usage drops. */
void snapkvd_quota_set_total(struct snapkvd_quota *q, uint64_t total);
void snapkvd_quota_get_usage(const struct snapkvd_quota *q, struct snapkvd_quota_usage *ret);

/* limit 0: no quota, only the pool bounds the tenant. name is copied
 * (at most 63 bytes kept) for messages. 0, -ENOMEM. */
int snapkvd_quota_account_new(struct snapkvd_quota *q, const char *name, uint64_t limit,
			      struct snapkvd_quota_account **ret_a);
/* Returns whatever the account still holds to the pool, then frees it. */
void snapkvd_quota_account_free(struct snapkvd_quota_account *a);
void snapkvd_quota_account_set_limit(struct snapkvd_quota_account *a, uint64_t limit);
void snapkvd_quota_account_get_usage(const struct snapkvd_quota_account *a,
				     struct snapkvd_quota_usage *ret);

/*
 * Reserve bytes for a tenant. 0 and *ret_res filled; -EDQUOT when the
 * tenant's quota would be exceeded, -ENOSPC when the pool would be;
 * -EINVAL for 0 bytes. msg (may be NULL) gets the numbers on failure.
 */
int snapkvd_quota_reserve(struct snapkvd_quota_account *a, uint64_t bytes,
			  struct snapkvd_reservation *ret_res, char *msg, size_t msg_len);
/* Turn a reservation into a charge of `used` bytes (<= res->bytes; the rest
 * goes back). -EINVAL when used > res->bytes (nothing changes). */
int snapkvd_quota_commit(struct snapkvd_reservation *res, uint64_t used);
/* Give a reservation back entirely. */
void snapkvd_quota_cancel(struct snapkvd_reservation *res);
/* Return committed bytes (a cache freed or shrunk). Clamped at what the
 * account holds; returns the bytes actually released. */
uint64_t snapkvd_quota_release(struct snapkvd_quota_account *a, uint64_t bytes);

#endif /* SNAPKVD_QUOTA_H */
