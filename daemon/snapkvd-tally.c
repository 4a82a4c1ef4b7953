// SPDX-License-Identifier: MIT
/* snapkvd-tally.c - running ledger sums and the LRU of lingering caches;
 * see snapkvd-tally.h. */
#include "snapkvd-tally.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-cache.h"
#include "snapkvd-session.h"

int snapkvd_tally_cache_ledger(const struct snapkvd_cache *c, struct skv_ledger *ret)
{
	struct skv_ledger_in in = {
	    .batch = 1,
	    .layers = c->layers,
	    .h_q = c->h_q,
	    .h_kv = c->h_kv,
	    .head_dim = c->head_dim,
	    .dtype_bytes = c->dtype_bytes,
	    .prompt_len = c->prompt_len,
	    .capacity = c->budget,
	    .appended = c->appended,
	    .reserve = snapkvd_cache_decode_limit(c),
	    .gqa = c->gqa,
	};

	/* budget modes: SPEC's sums over (layer, head) */
	if (c->hkept)
		return skv_ledger_sum(&in, c->hkept, (uint64_t)c->layers * c->h_store, ret);
	return skv_ledger_compute(&in, ret);
}

void snapkvd_tally_add_cache(struct snapkvd_ledger_total *t, const struct snapkvd_cache *c)
{
	struct skv_ledger l;
	uint64_t real = 0;

	t->caches++;
	if (c->lingering)
		t->lingering++;
	t->allocated += c->region_bytes;
	if (snapkvd_tally_cache_ledger(c, &l) == 0 && c->writeback) {
		/* engine-held: only the index tables are the pool's */
		t->native_full += l.native_full;
		t->index += l.index;
		t->engine_held += l.compact + l.reserved;
		real = l.index;
		t->real += real;
	} else if (snapkvd_tally_cache_ledger(c, &l) == 0) {
		t->native_full += l.native_full;
		t->compact += l.compact;
		t->index += l.index;
		t->reserved += l.reserved;
		real = l.compact + l.index + l.reserved;
		t->real += real;
	}
	/* a region always holds its formula bytes; never report negative padding */
	t->padding += c->region_bytes > real ? c->region_bytes - real : 0;
}

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
	if (!e->total.caches) {
		free(e->by_id.slot);
		*e = ta->tenants[--ta->n_tenants];
	}
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

/* ------------------------------------------------------------ by id */

/* The first slot whose id is >= id. */
static size_t lower_bound(const struct snapkvd_tally_index *x, uint64_t id)
{
	size_t lo = 0, hi = x->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (x->slot[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int index_add(struct snapkvd_tally_index *x, struct snapkvd_cache *c)
{
	size_t at;

	if (x->n == x->cap) {
		size_t nc = x->cap ? 2 * x->cap : 64;
		void *n = realloc(x->slot, nc * sizeof(*x->slot));

		if (!n)
			return -ENOMEM;
		x->slot = n;
		x->cap = nc;
	}
	at = lower_bound(x, c->id);
	memmove(&x->slot[at + 1], &x->slot[at], (x->n - at) * sizeof(*x->slot));
	x->slot[at] = (struct snapkvd_tally_slot){c->id, c};
	x->n++;
	return 0;
}

/* A hole where c was; the holes go once they are half the slots (each
 * squeeze is paid for by as many removals). */
static void index_del(struct snapkvd_tally_index *x, const struct snapkvd_cache *c)
{
	size_t at = lower_bound(x, c->id), k = 0;

	if (at == x->n || x->slot[at].cache != c)
		return;
	x->slot[at].cache = NULL;
	if (++x->holes <= x->n / 2)
		return;
	for (size_t i = 0; i < x->n; i++)
		if (x->slot[i].cache)
			x->slot[k++] = x->slot[i];
	x->n = k;
	x->holes = 0;
}

size_t snapkvd_tally_page(const struct snapkvd_tally *ta, bool all, uid_t uid, uint64_t after,
			  size_t max, struct snapkvd_cache **ret, bool *ret_more,
			  uint64_t *ret_visible)
{
	const struct snapkvd_tally_index *x = all ? &ta->by_id : NULL;
	size_t i, got = 0;

	*ret_more = false;
	*ret_visible = 0;
	for (size_t t = 0; !x && t < ta->n_tenants; t++)
		if (ta->tenants[t].uid == uid)
			x = &ta->tenants[t].by_id;
	if (!x)
		return 0;
	*ret_visible = x->n - x->holes;
	if (after == UINT64_MAX)
		return 0;
	for (i = lower_bound(x, after + 1); i < x->n && got < max; i++)
		if (x->slot[i].cache)
			ret[got++] = x->slot[i].cache;
	for (; i < x->n && !*ret_more; i++)
		*ret_more = x->slot[i].cache != NULL;
	return got;
}

/* ----------------------------------------------------------- the sums */

int snapkvd_tally_update(struct snapkvd_tally *ta, struct snapkvd_session *s,
			 const struct snapkvd_tenant *t, struct snapkvd_cache *c)
{
	struct snapkvd_ledger_total now = {0};
	struct snapkvd_tally_tenant *e;

	e = find_or_add(ta, t);
	if (!e)
		return -ENOMEM;
	if (!c->tallied) {
		/* new: into both indexes by id */
		c->tallied = calloc(1, sizeof(*c->tallied));
		if (!c->tallied || index_add(&ta->by_id, c) < 0) {
			free(c->tallied);
			c->tallied = NULL;
			return -ENOMEM;
		}
		if (index_add(&e->by_id, c) < 0) {
			index_del(&ta->by_id, c);
			free(c->tallied);
			c->tallied = NULL;
			return -ENOMEM;
		}
		e->uid = s->uid;
	}
	snapkvd_tally_add_cache(&now, c);
	total_sub(&ta->pool, c->tallied);
	total_sub(&e->total, c->tallied);
	total_add(&ta->pool, &now);
	total_add(&e->total, &now);
	*c->tallied = now;
	c->tally_tenant = t;
	lru_remove(ta, c);
	c->tally_session = s;
	if (c->lingering) {
		c->lru_bytes = c->region_bytes;
		lru_insert(ta, c);
	}
	return 0;
}

void snapkvd_tally_forget(struct snapkvd_tally *ta, struct snapkvd_cache *c)
{
	struct snapkvd_tally_tenant *e = find(ta, c->tally_tenant);

	lru_remove(ta, c);
	if (!c->tallied)
		return;
	index_del(&ta->by_id, c);
	if (e)
		index_del(&e->by_id, c);
	total_sub(&ta->pool, c->tallied);
	tenant_sub(ta, c->tally_tenant, c->tallied);
	free(c->tallied);
	c->tallied = NULL;
}

struct snapkvd_cache *snapkvd_tally_oldest(const struct snapkvd_tally *ta,
					   struct snapkvd_session **ret_s)
{
	if (ta->lru_head)
		*ret_s = ta->lru_head->tally_session;
	return ta->lru_head;
}

void snapkvd_tally_fini(struct snapkvd_tally *ta)
{
	for (size_t i = 0; i < ta->n_tenants; i++)
		free(ta->tenants[i].by_id.slot);
	free(ta->by_id.slot);
	free(ta->tenants);
	memset(ta, 0, sizeof(*ta));
}
