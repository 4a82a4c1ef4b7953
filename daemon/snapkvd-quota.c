// SPDX-License-Identifier: MIT
/*
 * snapkvd-quota.c - lock-free reserve-then-commit accounting.
 *
 * Each limit is enforced by a compare-and-swap on the one counter it bounds
 * (tenant charged against its quota, then pool charged against its total),
 * so neither counter can ever exceed its limit, whatever the interleaving.
 * When the pool step fails the tenant step is undone; a racing reservation
 * may transiently see the tenant a little fuller than it ends up, which can
 * only refuse, never over-commit.
 */
#include "snapkvd-quota.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct snapkvd_quota {
	_Atomic uint64_t total;
	_Atomic uint64_t charged;
	_Atomic uint64_t reserved;
	_Atomic uint64_t rejected;
};

struct snapkvd_quota_account {
	struct snapkvd_quota *q;
	char name[64];
	_Atomic uint64_t limit;
	_Atomic uint64_t charged;
	_Atomic uint64_t reserved;
	_Atomic uint64_t rejected;
};

int snapkvd_quota_new(uint64_t total, struct snapkvd_quota **ret_q)
{
	struct snapkvd_quota *q = calloc(1, sizeof(*q));

	if (!q)
		return -ENOMEM;
	atomic_init(&q->total, total);
	*ret_q = q;
	return 0;
}

void snapkvd_quota_free(struct snapkvd_quota *q)
{
	free(q);
}

void snapkvd_quota_set_total(struct snapkvd_quota *q, uint64_t total)
{
	atomic_store(&q->total, total);
}

void snapkvd_quota_get_usage(const struct snapkvd_quota *q, struct snapkvd_quota_usage *ret)
{
	struct snapkvd_quota *m = (struct snapkvd_quota *)q;

	ret->total = atomic_load(&m->total);
	ret->charged = atomic_load(&m->charged);
	ret->reserved = atomic_load(&m->reserved);
	ret->rejected = atomic_load(&m->rejected);
}

int snapkvd_quota_account_new(struct snapkvd_quota *q, const char *name, uint64_t limit,
			      struct snapkvd_quota_account **ret_a)
{
	struct snapkvd_quota_account *a = calloc(1, sizeof(*a));

	if (!a)
		return -ENOMEM;
	a->q = q;
	snprintf(a->name, sizeof(a->name), "%s", name ? name : "?");
	atomic_init(&a->limit, limit);
	*ret_a = a;
	return 0;
}

void snapkvd_quota_account_free(struct snapkvd_quota_account *a)
{
	if (!a)
		return;
	atomic_fetch_sub(&a->q->reserved, atomic_load(&a->reserved));
	atomic_fetch_sub(&a->q->charged, atomic_load(&a->charged));
	free(a);
}

void snapkvd_quota_account_set_limit(struct snapkvd_quota_account *a, uint64_t limit)
{
	atomic_store(&a->limit, limit);
}

void snapkvd_quota_account_get_usage(const struct snapkvd_quota_account *a,
				     struct snapkvd_quota_usage *ret)
{
	struct snapkvd_quota_account *m = (struct snapkvd_quota_account *)a;

	ret->total = atomic_load(&m->limit);
	ret->charged = atomic_load(&m->charged);
	ret->reserved = atomic_load(&m->reserved);
	ret->rejected = atomic_load(&m->rejected);
}

/* charged += bytes unless that passes limit (0 = unlimited). On failure
 * *ret_seen is the charge that was observed. */
static int charge(_Atomic uint64_t *charged, uint64_t limit, uint64_t bytes, uint64_t *ret_seen)
{
	uint64_t cur = atomic_load_explicit(charged, memory_order_relaxed);

	for (;;) {
		if (cur + bytes < cur || (limit && cur + bytes > limit)) {
			*ret_seen = cur;
			return -1;
		}
		if (atomic_compare_exchange_weak_explicit(
			charged, &cur, cur + bytes, memory_order_acq_rel, memory_order_relaxed))
			return 0;
	}
}

int snapkvd_quota_reserve(struct snapkvd_quota_account *a, uint64_t bytes,
			  struct snapkvd_reservation *ret_res, char *msg, size_t msg_len)
{
	struct snapkvd_quota *q = a->q;
	uint64_t limit = atomic_load(&a->limit);
	uint64_t total = atomic_load(&q->total);
	uint64_t seen;

	if (bytes == 0)
		return -EINVAL;
	if (charge(&a->charged, limit, bytes, &seen) < 0) {
		atomic_fetch_add(&a->rejected, 1);
		atomic_fetch_add(&q->rejected, 1);
		if (msg && msg_len)
			snprintf(msg, msg_len,
				 "tenant %s over quota: request %" PRIu64 " bytes, holds %" PRIu64
				 " of its %" PRIu64 " byte quota (%" PRIu64 " free)",
				 a->name, bytes, seen, limit, seen < limit ? limit - seen : 0);
		return -EDQUOT;
	}
	/* The pool is bounded even without an explicit total of 0: 0 means
	 * an empty pool, not an unlimited one. */
	if (total == 0 || charge(&q->charged, total, bytes, &seen) < 0) {
		if (total == 0)
			seen = atomic_load(&q->charged);
		atomic_fetch_sub(&a->charged, bytes);
		atomic_fetch_add(&a->rejected, 1);
		atomic_fetch_add(&q->rejected, 1);
		if (msg && msg_len)
			snprintf(msg, msg_len,
				 "pool full: tenant %s requests %" PRIu64
				 " bytes, pool holds %" PRIu64 " of %" PRIu64 " bytes (%" PRIu64
				 " free)",
				 a->name, bytes, seen, total, seen < total ? total - seen : 0);
		return -ENOSPC;
	}
	atomic_fetch_add(&a->reserved, bytes);
	atomic_fetch_add(&q->reserved, bytes);
	ret_res->account = a;
	ret_res->bytes = bytes;
	return 0;
}

int snapkvd_quota_commit(struct snapkvd_reservation *res, uint64_t used)
{
	struct snapkvd_quota_account *a = res->account;

	if (!a || used > res->bytes)
		return -EINVAL;
	atomic_fetch_sub(&a->reserved, res->bytes);
	atomic_fetch_sub(&a->q->reserved, res->bytes);
	if (used < res->bytes) {
		atomic_fetch_sub(&a->q->charged, res->bytes - used);
		atomic_fetch_sub(&a->charged, res->bytes - used);
	}
	res->account = NULL;
	res->bytes = 0;
	return 0;
}

void snapkvd_quota_cancel(struct snapkvd_reservation *res)
{
	if (!res->account)
		return;
	snapkvd_quota_commit(res, 0);
}

uint64_t snapkvd_quota_release(struct snapkvd_quota_account *a, uint64_t bytes)
{
	uint64_t cur = atomic_load(&a->charged), take;

	do {
		take = bytes < cur ? bytes : cur;
	} while (!atomic_compare_exchange_weak(&a->charged, &cur, cur - take));
	atomic_fetch_sub(&a->q->charged, take);
	return take;
}
