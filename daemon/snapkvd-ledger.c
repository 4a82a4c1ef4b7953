// SPDX-License-Identifier: MIT
/*
 * snapkvd-ledger.c - per-cache ledger lines (SPEC.md "Capacity ledger")
 * computed by the kernels' skv_ledger_compute, so the daemon, snapkvctl
 * --offline and the kernels' tests agree on one formula.
 */
#include "snapkvd-ledger.h"

#include <string.h>

int snapkvd_ledger_cache(const struct snapkvd_cache *c, struct skv_ledger *ret)
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
	    .reserve = c->slots - c->kept,
	    .gqa = c->gqa,
	};

	return skv_ledger_compute(&in, ret);
}

void snapkvd_ledger_add(struct snapkvd_ledger_total *t, const struct snapkvd_cache *c)
{
	struct skv_ledger l;
	uint64_t real = 0;

	t->caches++;
	if (c->lingering)
		t->lingering++;
	t->allocated += c->region_bytes;
	if (snapkvd_ledger_cache(c, &l) == 0) {
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

void snapkvd_ledger_totals(struct snapkvd_server *srv, struct snapkvd_ledger_total *ret)
{
	memset(ret, 0, sizeof(*ret));
	for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
		for (struct snapkvd_cache *c = s->caches; c; c = c->next)
			snapkvd_ledger_add(ret, c);
}

void snapkvd_ledger_tenant(struct snapkvd_server *srv, const struct snapkvd_tenant *t,
			   struct snapkvd_ledger_total *ret)
{
	memset(ret, 0, sizeof(*ret));
	for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
		if (s->tenant == t)
			for (struct snapkvd_cache *c = s->caches; c; c = c->next)
				snapkvd_ledger_add(ret, c);
}
