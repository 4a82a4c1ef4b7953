// SPDX-License-Identifier: MIT
/*
 * snapkvd-ledger.c - per-cache ledger lines computed by the kernels'
 * skv_ledger_compute, so the daemon, snapkvctl --offline and the kernels'
 * tests agree on one formula; their sums, the admin reply's ledger and its
 * JSON form.
 */
#include "snapkvd-ledger.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/skv-ledger-json.h"
#include "snapkvd-cache.h"
#include "snapkvd-pool.h"
#include "snapkvd-server.h"
#include "snapkvd-session.h"
#include "snapkvd-tally.h"

static void ledger_bytes(Snapkv__V1__LedgerBytes *b, const struct snapkvd_ledger_total *t)
{
	snapkv__v1__ledger_bytes__init(b);
	b->native_full = t->native_full;
	b->compact = t->compact;
	b->index = t->index;
	b->reserved = t->reserved;
	b->allocated = t->allocated;
	b->real = t->real;
	b->padding = t->padding;
	b->engine_held = t->engine_held;
}

static void fill_tenant(const struct snapkvd_tally *tally, const struct snapkvd_tenant_stats *ts,
			Snapkv__V1__TenantInfo *ti, Snapkv__V1__LedgerBytes *tb)
{
	struct snapkvd_ledger_total lt;

	snapkv__v1__tenant_info__init(ti);
	ti->name = (char *)ts->name;
	ti->uid = ts->uid;
	ti->used_bytes = ts->used_bytes;
	ti->caches = ts->caches;
	ti->sessions = ts->sessions;
	ti->quota_bytes = ts->quota_bytes;
	/* the tally's running sums (read here, not called: the tally calls
	 * this file for a cache's share) */
	memset(&lt, 0, sizeof(lt));
	for (size_t i = 0; i < tally->n_tenants; i++)
		if (tally->tenants[i].tenant == ts->tenant)
			lt = tally->tenants[i].total;
	ledger_bytes(tb, &lt);
	ti->bytes = tb;
	ti->lingering_caches = lt.lingering;
}

/* Budget mode, its outcome, and per layer the rows kept and the retained
 * mass (min, mean) of every cache; the mode's fields only when set. */
static void fill_cache_budget(const struct snapkvd_cache *c, Snapkv__V1__CacheLedger *cl)
{
	size_t nk = (size_t)c->layers * c->h_store;
	uint64_t tot = 0;
	uint32_t mn = UINT32_MAX;

	cl->n_layer_kept = cl->n_layer_mass_min = cl->n_layer_mass_mean = c->layers;
	cl->layer_kept = c->layer_kept;
	cl->layer_mass_min = c->layer_mass;
	cl->layer_mass_mean = c->layer_mass + c->layers;
	if (c->group_size) {
		cl->group_key = (char *)c->group_key;
		cl->group_size = c->group_size;
	}
	if (!c->budgeted)
		return;
	for (size_t i = 0; i < nk; i++) {
		tot += c->hkept[i];
		mn = c->hkept[i] < mn ? c->hkept[i] : mn;
	}
	cl->budget_mode = (Snapkv__V1__BudgetMode)(c->budget_mode + 1);
	cl->c_star = c->c_star;
	cl->fallback = c->fallback;
	cl->ragged = c->ragged;
	cl->kept_mean = nk ? (float)((double)tot / (double)nk) : 0.0f;
	cl->kept_min = nk ? mn : 0;
}

static void fill_cache(const struct snapkvd_session *x, const struct snapkvd_cache *c,
		       Snapkv__V1__CacheLedger *cl, Snapkv__V1__LedgerBytes *lb)
{
	struct snapkvd_ledger_total l = {0};
	float mn = 0, sum = 0;
	size_t nm = (size_t)c->layers * c->h_store;

	snapkv__v1__cache_ledger__init(cl);
	snapkvd_tally_add_cache(&l, c);
	cl->id = c->id;
	cl->tenant = (char *)snapkvd_tenant_name(x->tenant);
	cl->layers = c->layers;
	cl->h_q = c->h_q;
	cl->h_kv = c->h_kv;
	cl->head_dim = c->head_dim;
	cl->dtype_bytes = c->dtype_bytes;
	cl->prompt_len = c->prompt_len;
	cl->capacity = c->budget;
	cl->appended = c->appended;
	cl->gqa = (Snapkv__V1__Gqa)c->gqa;
	cl->session_id = x->id;
	cl->engine = (char *)x->name;
	cl->kept = c->kept;
	cl->slots = c->slots;
	for (size_t k = 0; k < nm; k++) {
		if (k == 0 || c->mass[k] < mn)
			mn = c->mass[k];
		sum += c->mass[k];
	}
	cl->lingering = c->lingering;
	cl->requested_budget = c->requested_budget;
	cl->transport = (char *)c->transport;
	cl->arena_transport = c->writeback ? "engine" : c->gpu_kv ? "cuda-vmm" : "host-memfd";
	cl->engine_held = c->writeback;
	cl->device = c->device_ordinal;
	cl->max_decode = c->max_decode;
	cl->layout = c->layout == SNAPKVD_LAYOUT_PAGED ? SNAPKV__V1__LAYOUT__LAYOUT_PAGED
		     : c->layout == SNAPKVD_LAYOUT_NHD ? SNAPKV__V1__LAYOUT__LAYOUT_NHD
						       : SNAPKV__V1__LAYOUT__LAYOUT_HND;
	cl->block_size = c->block_size;
	cl->mass_min = mn;
	cl->mass_mean = nm ? sum / nm : 0;
	fill_cache_budget(c, cl);
	ledger_bytes(lb, &l);
	cl->bytes = lb;
}

struct ledger_pick {
	const struct snapkvd_session *x;
	const struct snapkvd_cache *c;
};

/*
 * The caches v may see with an id above v->after, the page_size smallest,
 * from the tally's index by id (a binary search and the page, whatever the
 * number of caches): into b->pick. *ret_n picked, *ret_visible all it may
 * see, *ret_next the cursor of the next page (0: none). A caller that is not
 * `all` sees the caches of its uid (its tenant).
 */
static int pick_caches(struct snapkvd_server *srv, const struct snapkvd_ledger_view *v,
		       struct snapkvd_ledger_buf *b, size_t *ret_n, uint64_t *ret_visible,
		       uint64_t *ret_next)
{
	size_t page = v ? (v->page ? v->page : SNAPKVD_LEDGER_PAGE) : SIZE_MAX, n;
	const struct snapkvd_tally *ta = &srv->tally;
	struct snapkvd_cache **cs;
	bool more = false;

	if (page > ta->by_id.n)
		page = ta->by_id.n;
	cs = calloc(page ? page : 1, sizeof(*cs));
	b->pick = calloc(page ? page : 1, sizeof(*b->pick));
	if (!cs || !b->pick) {
		free(cs);
		return -ENOMEM;
	}
	n = snapkvd_tally_page(ta, !v || v->all, v ? v->uid : 0, v ? v->after : 0, page, cs, &more,
			       ret_visible);
	for (size_t i = 0; i < n; i++)
		b->pick[i] = (struct ledger_pick){cs[i]->tally_session, cs[i]};
	*ret_next = more && n ? cs[n - 1]->id : 0;
	*ret_n = n;
	free(cs);
	return 0;
}

/* The reply's tenants (those v may see) and pool lines; arrays in *b. */
static int fill_header(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r,
		       struct snapkvd_ledger_buf *b, const struct snapkvd_ledger_view *v)
{
	struct snapkvd_pool_stats ps;
	const struct snapkvd_ledger_total *pt = &srv->tally.pool;
	size_t nt = 0, k = 0;

	if (snapkvd_pool_snapshot(srv->pool, &ps, &b->ts, &nt) < 0)
		return -ENOMEM;
	b->ti = calloc(nt ? nt : 1, sizeof(*b->ti));
	b->tip = calloc(nt ? nt : 1, sizeof(*b->tip));
	b->tb = calloc(nt ? nt : 1, sizeof(*b->tb));
	if (!b->ti || !b->tip || !b->tb)
		return -ENOMEM;
	/* a tenant sees its own line only; root and admin_uids see every one */
	for (size_t i = 0; i < nt; i++) {
		if (v && !v->all && b->ts[i].uid != v->uid)
			continue;
		fill_tenant(&srv->tally, &b->ts[i], &b->ti[k], &b->tb[k]);
		b->ti[k].buffers = b->ts[i].buffers;
		b->ti[k].mapped_bytes = b->ts[i].mapped_bytes;
		b->tip[k] = &b->ti[k];
		k++;
	}
	r->pool_total = ps.total;
	r->pool_used = ps.used;
	r->pool_reserved = ps.reserved;
	ledger_bytes(&b->pool, pt);
	r->pool_bytes = &b->pool;
	r->lingering_caches = pt->lingering;
	r->n_tenants = k;
	r->tenants = b->tip;
	r->all_tenants = !v || v->all;
	return 0;
}

int snapkvd_ledger_reply(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r,
			 struct snapkvd_ledger_buf *b, const struct snapkvd_ledger_view *v)
{
	size_t nc = 0;
	uint64_t visible = 0, next = 0;

	memset(b, 0, sizeof(*b));
	if (fill_header(srv, r, b, v) < 0 || pick_caches(srv, v, b, &nc, &visible, &next) < 0) {
		snapkvd_ledger_reply_free(b);
		return -ENOMEM;
	}
	b->cl = calloc(nc ? nc : 1, sizeof(*b->cl));
	b->clp = calloc(nc ? nc : 1, sizeof(*b->clp));
	b->lb = calloc(nc ? nc : 1, sizeof(*b->lb));
	if (!b->cl || !b->clp || !b->lb) {
		snapkvd_ledger_reply_free(b);
		return -ENOMEM;
	}
	for (size_t i = 0; i < nc; i++) {
		fill_cache(b->pick[i].x, b->pick[i].c, &b->cl[i], &b->lb[i]);
		b->clp[i] = &b->cl[i];
	}
	r->n_caches = nc;
	r->caches = b->clp;
	r->next_page_after = next;
	r->caches_visible = visible;
	return 0;
}

/* ------------------------------------------------------- sliced pages */

void snapkvd_ledger_cursor_init(struct snapkvd_ledger_cursor *cur,
				const struct snapkvd_ledger_view *v)
{
	memset(cur, 0, sizeof(*cur));
	cur->v = *v;
	cur->after = v->after;
	cur->left = v->page ? v->page : SNAPKVD_LEDGER_PAGE;
}

/* c packed as an AdminReply holding only it, appended to cur's bytes. */
static int pack_one(struct snapkvd_ledger_cursor *cur, const struct snapkvd_cache *c)
{
	Snapkv__V1__AdminReply one = SNAPKV__V1__ADMIN_REPLY__INIT;
	Snapkv__V1__CacheLedger cl, *clp = &cl;
	Snapkv__V1__LedgerBytes lb;
	size_t n;

	fill_cache(c->tally_session, c, &cl, &lb);
	one.n_caches = 1;
	one.caches = &clp;
	n = snapkv__v1__admin_reply__get_packed_size(&one);
	if (cur->len + n > cur->cap) {
		size_t nc = cur->cap ? 2 * cur->cap : 4096;
		void *p;

		while (nc < cur->len + n)
			nc *= 2;
		p = realloc(cur->bytes, nc);
		if (!p)
			return -ENOMEM;
		cur->bytes = p;
		cur->cap = nc;
	}
	cur->len += snapkv__v1__admin_reply__pack(&one, cur->bytes + cur->len);
	return 0;
}

int snapkvd_ledger_slice(struct snapkvd_server *srv, struct snapkvd_ledger_cursor *cur, size_t max)
{
	struct snapkvd_cache *cs[64];
	size_t want = max < cur->left ? max : cur->left, got, done = 0;
	size_t len0 = cur->len;
	uint64_t visible;
	bool more = false;

	while (!cur->done && done < want) {
		size_t k = want - done < 64 ? want - done : 64;

		got = snapkvd_tally_page(&srv->tally, cur->v.all, cur->v.uid, cur->after, k, cs,
					 &more, &visible);
		for (size_t i = 0; i < got; i++)
			if (pack_one(cur, cs[i]) < 0) {
				cur->len = len0; /* as it was: the caller may retry */
				return -ENOMEM;
			}
		if (got)
			cur->after = cs[got - 1]->id;
		cur->n += got;
		cur->left -= got;
		done += got;
		cur->done = !more || !cur->left;
	}
	return (int)done;
}

int snapkvd_ledger_finish(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r,
			  struct snapkvd_ledger_buf *b, const struct snapkvd_ledger_cursor *cur)
{
	struct snapkvd_cache *none[1];
	uint64_t visible = 0;
	bool more = false;

	memset(b, 0, sizeof(*b));
	if (fill_header(srv, r, b, &cur->v) < 0) {
		snapkvd_ledger_reply_free(b);
		return -ENOMEM;
	}
	snapkvd_tally_page(&srv->tally, cur->v.all, cur->v.uid, cur->after, 0, none, &more,
			   &visible);
	r->next_page_after = more && cur->n ? cur->after : 0;
	r->caches_visible = visible;
	return 0;
}

void snapkvd_ledger_cursor_fini(struct snapkvd_ledger_cursor *cur)
{
	free(cur->bytes);
	memset(cur, 0, sizeof(*cur));
}

void snapkvd_ledger_reply_free(struct snapkvd_ledger_buf *b)
{
	free(b->ti);
	free(b->tip);
	free(b->cl);
	free(b->clp);
	free(b->lb);
	free(b->tb);
	free(b->ts);
	free(b->pick);
	memset(b, 0, sizeof(*b));
}

/*
 * Rendered by the very builder of `snapkvctl ledger --json`
 * (proto/skv-ledger-json.c): same keys, same values as snapkvctl would print now.
 */
char *snapkvd_ledger_json(struct snapkvd_server *srv, const char *level_name, uint32_t max_caches)
{
	const struct snapkvd_ledger_view v = {.all = true, .page = max_caches ? max_caches : 1};
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	struct snapkvd_ledger_buf b;
	json_t *j = NULL;
	char *text = NULL;

	if (snapkvd_ledger_reply(srv, &r, &b, &v) < 0)
		return NULL;
	j = skv_ledger_json(&r);
	/* pool.caches counts every cache, listed or not */
	if (j && r.n_caches < r.caches_visible &&
	    (json_object_set_new(json_object_get(j, "pool"), "caches",
				 json_integer((json_int_t)r.caches_visible)) < 0 ||
	     json_object_set_new(j, "caches_listed", json_integer((json_int_t)r.n_caches)) < 0 ||
	     json_object_set_new(j, "caches_total", json_integer((json_int_t)r.caches_visible)) <
		 0)) {
		json_decref(j);
		j = NULL;
	}
	if (j && json_object_set_new(j, "pressure", json_pack("{s:s}", "level", level_name)) == 0)
		text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(j);
	if (text) { /* a text file, ending in a newline like snapkvctl's output */
		size_t n = strlen(text);
		char *t = realloc(text, n + 2);

		if (t) {
			t[n] = '\n';
			t[n + 1] = '\0';
			text = t;
		}
	}
	snapkvd_ledger_reply_free(&b);
	return text;
}
