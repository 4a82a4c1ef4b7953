// SPDX-License-Identifier: MIT
/* snapkvd-tally.c - running ledger sums and the LRU of lingering caches;
 * see snapkvd-tally.h. */
#include "snapkvd-tally.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-cache.h"

static void total_sub(struct snapkvd_ledger_total *t, const struct snapkvd_ledger_total *x)
{
	t->native_full -= x->native_full;
	t->compact -= x->compact;
	t->index -= x->index;
	t->reserved -= x->reserved;
	t->real -= x->real;
	t->allocated -= x->allocated;
	t->padding -= x->padding;
	t->caches -= x->caches;
	t->lingering -= x->lingering;
	t->engine_held -= x->engine_held;
}

static void total_add(struct snapkvd_ledger_total *t, const struct snapkvd_ledger_total *x)
{
	t->native_full += x->native_full;
	t->compact += x->compact;
	t->index += x->index;
	t->reserved += x->reserved;
	t->real += x->real;
	t->allocated += x->allocated;
	t->padding += x->padding;
	t->caches += x->caches;
	t->lingering += x->lingering;
	t->engine_held += x->engine_held;
}

static struct snapkvd_tally_tenant *find(const struct snapkvd_tally *ta,
					 const struct snapkvd_tenant *t)
{
	for (size_t i = 0; i < ta->n_tenants; i++)
		if (ta->tenants[i].tenant == t)
			return &ta->tenants[i];
	return NULL;
}

static struct snapkvd_tally_tenant *find_or_add(struct snapkvd_tally *ta,
						const struct snapkvd_tenant *t)
{
	struct snapkvd_tally_tenant *e = find(ta, t);

	if (e)
		return e;
	if (ta->n_tenants == ta->cap_tenants) {
		size_t nc = ta->cap_tenants ? 2 * ta->cap_tenants : 8;
		void *n = realloc(ta->tenants, nc * sizeof(*ta->tenants));

		if (!n)
			return NULL;
		ta->tenants = n;
		ta->cap_tenants = nc;
	}
	e = &ta->tenants[ta->n_tenants++];
	memset(e, 0, sizeof(*e));
	e->tenant = t;
	return e;
}

/* A tenant's entry goes with its last cache, so a freed tenant's address
 * reused by a new one never finds old sums. */
static void tenant_sub(struct snapkvd_tally *ta, const struct snapkvd_tenant *t,
		       const struct snapkvd_ledger_total *x)
{
	struct snapkvd_tally_tenant *e = find(ta, t);

	if (!e)
		return;
	total_sub(&e->total, x);
	if (!e->total.caches)
		*e = ta->tenants[--ta->n_tenants];
}

static bool older(const struct snapkvd_cache *a, const struct snapkvd_cache *b)
{
	return a->last_use_ns < b->last_use_ns ||
	       (a->last_use_ns == b->last_use_ns && a->id < b->id);
}

/* From the tail: a cache lingers from now on, so it is nearly always the
 * newest and the walk stops at once. */
static void lru_insert(struct snapkvd_tally *ta, struct snapkvd_cache *c)
{
	struct snapkvd_cache *p = ta->lru_tail;

	while (p && older(c, p))
		p = p->lru_prev;
	c->lru_prev = p;
	c->lru_next = p ? p->lru_next : ta->lru_head;
	if (c->lru_next)
		c->lru_next->lru_prev = c;
	else
		ta->lru_tail = c;
	if (p)
		p->lru_next = c;
	else
		ta->lru_head = c;
	c->in_lru = true;
	ta->lingering_bytes += c->region_bytes;
}

static void lru_remove(struct snapkvd_tally *ta, struct snapkvd_cache *c)
{
	if (!c->in_lru)
		return;
	if (c->lru_prev)
		c->lru_prev->lru_next = c->lru_next;
	else
		ta->lru_head = c->lru_next;
	if (c->lru_next)
		c->lru_next->lru_prev = c->lru_prev;
	else
		ta->lru_tail = c->lru_prev;
	c->lru_prev = c->lru_next = NULL;
	c->in_lru = false;
	ta->lingering_bytes -= c->lru_bytes;
}

int snapkvd_tally_update(struct snapkvd_tally *ta, struct snapkvd_session *s,
			 const struct snapkvd_tenant *t, struct snapkvd_cache *c)
{
	struct snapkvd_ledger_total now = {0};
	struct snapkvd_tally_tenant *e;

	if (!c->tallied) {
		c->tallied = calloc(1, sizeof(*c->tallied));
		if (!c->tallied)
			return -ENOMEM;
	}
	e = find_or_add(ta, t);
	if (!e)
		return -ENOMEM;
	snapkvd_ledger_add(&now, c);
	total_sub(&ta->pool, c->tallied);
	total_sub(&e->total, c->tallied);
	total_add(&ta->pool, &now);
	total_add(&e->total, &now);
	*c->tallied = now;
	c->tally_tenant = t;
	lru_remove(ta, c);
	if (c->lingering) {
		c->lru_session = s;
		c->lru_bytes = c->region_bytes;
		lru_insert(ta, c);
	}
	return 0;
}

void snapkvd_tally_forget(struct snapkvd_tally *ta, struct snapkvd_cache *c)
{
	lru_remove(ta, c);
	if (!c->tallied)
		return;
	total_sub(&ta->pool, c->tallied);
	tenant_sub(ta, c->tally_tenant, c->tallied);
	free(c->tallied);
	c->tallied = NULL;
}

struct snapkvd_cache *snapkvd_tally_oldest(const struct snapkvd_tally *ta,
					   struct snapkvd_session **ret_s)
{
	if (ta->lru_head)
		*ret_s = ta->lru_head->lru_session;
	return ta->lru_head;
}

void snapkvd_tally_fini(struct snapkvd_tally *ta)
{
	free(ta->tenants);
	memset(ta, 0, sizeof(*ta));
}
