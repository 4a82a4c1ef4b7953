// SPDX-License-Identifier: MIT
/*
 * skv-ledger-json.c - the capacity ledger as JSON, from an admin LEDGER
 * reply. snapkvctl renders the reply it received; snapkvd renders the reply
 * it would send (snapkvd_admin_ledger_fill) into the hooks' snapshot, so the
 * two cannot drift apart.
 */
#include "skv-ledger-json.h"
#include "skv-frame.h"

#include <stdlib.h>
#include <string.h>

/*
 * A JSON string that always exists: a text that is not valid UTF-8 (a
 * daemon older than the HELLO check, a corrupted reply) keeps its valid
 * parts and gets U+FFFD for each bad byte, so no cache is ever dropped.
 */
static json_t *text_json(const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t n = strlen((const char *)p), o = 0;
	json_t *j = json_string((const char *)p);
	char *clean;

	if (j)
		return j;
	clean = malloc(n * 3 + 1);
	if (!clean)
		return json_string("");
	for (size_t i = 0; i < n;) {
		size_t k = skv_utf8_seq(p + i, n - i);

		if (k) {
			memcpy(clean + o, p + i, k);
			o += k;
			i += k;
		} else {
			memcpy(clean + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		}
	}
	clean[o] = 0;
	j = json_string(clean);
	free(clean);
	return j ? j : json_string("");
}

const char *skv_ledger_gqa_name(int g)
{
	return g == SNAPKV__V1__GQA__GQA_GROUP ? "group" : "expand";
}

double skv_ledger_ratio(const Snapkv__V1__LedgerBytes *b)
{
	return b && b->native_full ? (double)b->compact / (double)b->native_full : -1.0;
}

/* A float, or null for NaN (no observation rows). */
static json_t *mass_json(float m)
{
	return m == m ? json_real(m) : json_null();
}

const char *skv_ledger_budget_name(int mode)
{
	static const char *const names[] = {"uniform", "uniform", "layers",
					    "heads",   "mass",	  "mass-heads"};

	return mode >= 0 && mode <= 5 ? names[mode] : "unknown";
}

void skv_ledger_budget_json(json_t *e, const Snapkv__V1__CacheLedger *c)
{
	json_t *lk = json_array(), *lmin = json_array(), *lmean = json_array();

	json_object_set_new(e, "budget_mode", json_string(skv_ledger_budget_name(c->budget_mode)));
	if (c->budget_mode) {
		json_object_set_new(e, "c_star", json_integer(c->c_star));
		json_object_set_new(e, "fallback", json_boolean(c->fallback));
		json_object_set_new(e, "ragged", json_boolean(c->ragged));
		json_object_set_new(e, "kept_mean", json_real(c->kept_mean));
		json_object_set_new(e, "kept_min", json_integer(c->kept_min));
	}
	if (c->group_size) { /* decided in a decision group */
		json_object_set_new(e, "group_key", json_string(c->group_key ? c->group_key : ""));
		json_object_set_new(e, "group_size", json_integer(c->group_size));
	}
	for (size_t l = 0; l < c->n_layer_kept; l++)
		json_array_append_new(lk, json_integer((json_int_t)c->layer_kept[l]));
	for (size_t l = 0; l < c->n_layer_mass_min && l < c->n_layer_mass_mean; l++) {
		json_array_append_new(lmin, mass_json(c->layer_mass_min[l]));
		json_array_append_new(lmean, mass_json(c->layer_mass_mean[l]));
	}
	json_object_set_new(e, "layer_kept", lk);
	json_object_set_new(e, "layer_mass_min", lmin);
	json_object_set_new(e, "layer_mass_mean", lmean);
}

static json_t *ratio_json(const Snapkv__V1__LedgerBytes *b)
{
	double x = skv_ledger_ratio(b);

	return x < 0 ? json_null() : json_real(x);
}

/* The four SPEC.md lines first (issue 3's schema), then the arena's view. */
static json_t *bytes_json(const Snapkv__V1__LedgerBytes *b)
{
	static const Snapkv__V1__LedgerBytes zero = SNAPKV__V1__LEDGER_BYTES__INIT;

	if (!b)
		b = &zero;
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "native_full",
			 (json_int_t)b->native_full, "compact", (json_int_t)b->compact, "index",
			 (json_int_t)b->index, "reserved", (json_int_t)b->reserved, "real",
			 (json_int_t)b->real, "allocated", (json_int_t)b->allocated, "padding",
			 (json_int_t)b->padding);
}

json_t *skv_ledger_json(const Snapkv__V1__AdminReply *r)
{
	json_t *tenants = json_array(), *caches = json_array();
	uint64_t free_b = r->pool_total > r->pool_used ? r->pool_total - r->pool_used : 0;

	for (size_t i = 0; i < r->n_tenants; i++) {
		const Snapkv__V1__TenantInfo *t = r->tenants[i];
		json_t *e = json_pack(
		    "{s:o, s:I, s:I, s:I, s:I, s:o, s:I, s:o, s:o}", "name", text_json(t->name),
		    "uid", (json_int_t)t->uid, "used_bytes", (json_int_t)t->used_bytes, "caches",
		    (json_int_t)t->caches, "sessions", (json_int_t)t->sessions, "quota_bytes",
		    t->quota_bytes ? json_integer((json_int_t)t->quota_bytes) : json_null(),
		    "lingering_caches", (json_int_t)t->lingering_caches, "bytes",
		    bytes_json(t->bytes), "ratio", ratio_json(t->bytes));

		if (!e)
			continue;
		/* registered buffers and their bytes mapped in the daemon */
		json_object_set_new(e, "buffers", json_integer((json_int_t)t->buffers));
		json_object_set_new(e, "mapped_bytes", json_integer((json_int_t)t->mapped_bytes));
		json_array_append_new(tenants, e);
	}
	for (size_t i = 0; i < r->n_caches; i++) {
		const Snapkv__V1__CacheLedger *c = r->caches[i];
		/* every string through text_json: json_pack cannot fail on one,
		 * and the transports go onto this very object, never by index */
		json_t *e = json_pack(
		    "{s:I, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:o, s:o, "
		    "s:o, s:I, s:I, s:I, s:I, s:I, s:b}",
		    "id", (json_int_t)c->id, "tenant", text_json(c->tenant), "layers",
		    (json_int_t)c->layers, "h_q", (json_int_t)c->h_q, "h_kv", (json_int_t)c->h_kv,
		    "head_dim", (json_int_t)c->head_dim, "dtype_bytes", (json_int_t)c->dtype_bytes,
		    "prompt_len", (json_int_t)c->prompt_len, "capacity", (json_int_t)c->capacity,
		    "appended", (json_int_t)c->appended, "gqa", skv_ledger_gqa_name(c->gqa),
		    "bytes", bytes_json(c->bytes), "ratio", ratio_json(c->bytes), "engine",
		    text_json(c->engine), "session_id", (json_int_t)c->session_id, "h_store",
		    (json_int_t)(c->gqa == SNAPKV__V1__GQA__GQA_GROUP ? c->h_kv : c->h_q), "kept",
		    (json_int_t)c->kept, "slots", (json_int_t)c->slots, "requested_capacity",
		    (json_int_t)c->requested_budget, "lingering", (int)c->lingering);

		if (!e) /* out of memory: the cache is still listed, by id */
			e = json_pack("{s:I}", "id", (json_int_t)c->id);
		if (!e)
			continue;
		/* per cache: the transports its inputs and its arena really used */
		json_object_set_new(e, "transport", text_json(c->transport));
		json_object_set_new(e, "arena_transport", text_json(c->arena_transport));
		/* paged output: the block format, and writeback's engine-held
		 * K/V (not in the pool: bytes counts the index tables only) */
		json_object_set_new(
		    e, "layout",
		    json_string(c->layout == SNAPKV__V1__LAYOUT__LAYOUT_PAGED ? "paged"
				: c->layout == SNAPKV__V1__LAYOUT__LAYOUT_NHD ? "nhd"
									      : "hnd"));
		if (c->layout == SNAPKV__V1__LAYOUT__LAYOUT_PAGED)
			json_object_set_new(e, "block_size", json_integer(c->block_size));
		skv_ledger_budget_json(e, c);
		json_object_set_new(e, "engine_held", json_boolean(c->engine_held));
		json_object_set_new(e, "engine_held_bytes",
				    json_integer(c->bytes ? (json_int_t)c->bytes->engine_held : 0));
		json_object_set_new(e, "max_decode", json_integer((json_int_t)c->max_decode));
		json_array_append_new(caches, e);
	}
	json_t *out = json_pack(
	    "{s:{s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o}, s:o, s:o}", "pool", "total_bytes",
	    (json_int_t)r->pool_total, "used_bytes", (json_int_t)r->pool_used, "reserved_bytes",
	    (json_int_t)r->pool_reserved, "free_bytes", (json_int_t)free_b, "caches",
	    (json_int_t)r->n_caches, "lingering_caches", (json_int_t)r->lingering_caches, "bytes",
	    bytes_json(r->pool_bytes), "ratio", ratio_json(r->pool_bytes), "tenants", tenants,
	    "caches", caches);
	if (out)
		json_object_set_new(
		    json_object_get(out, "pool"), "engine_held_bytes",
		    json_integer(r->pool_bytes ? (json_int_t)r->pool_bytes->engine_held : 0));
	return out;
}
