// SPDX-License-Identifier: MIT
/* Global budget and per-tenant accounting; see snapkvd-pool.h. */
#include "snapkvd-pool.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	unsigned buffers;	   /* registered buffers, all its sessions */
	uint64_t mapped;	   /* their bytes mapped in the daemon */
	struct snapkvd_tenant *next;
};

struct snapkvd_pool {
	pthread_mutex_t mu;
	uint64_t total;
	uint64_t used;
	uint64_t reserved;
	uint64_t tenant_quota; /* 0: no per-tenant limit below the pool */
	uint64_t peak;
	uint64_t mapped; /* registered buffers' bytes mapped, all tenants */
	struct map_limits {
		unsigned max_tenant_buffers;
		uint64_t max_tenant_mapped_bytes, max_mapped_bytes;
	} map_limits;
	struct snapkvd_tenant *tenants;
};

static int snapkvd_pool_init(struct snapkvd_pool *p, uint64_t total, uint64_t tenant_quota)
{
	memset(p, 0, sizeof(*p));
	p->total = total;
	p->tenant_quota = tenant_quota;
	p->map_limits = (struct map_limits){UINT_MAX, UINT64_MAX, UINT64_MAX};
	return -pthread_mutex_init(&p->mu, NULL);
}

static void snapkvd_pool_destroy(struct snapkvd_pool *p)
{
	struct snapkvd_tenant *t, *n;

	if (!p)
		return;
	for (t = p->tenants; t; t = n) {
		n = t->next;
		free(t);
	}
	p->tenants = NULL;
	pthread_mutex_destroy(&p->mu);
}

int snapkvd_pool_new(uint64_t total, uint64_t tenant_quota, struct snapkvd_pool **ret)
{
	struct snapkvd_pool *p = malloc(sizeof(*p));
	int r;

	if (!p)
		return -ENOMEM;
	r = snapkvd_pool_init(p, total, tenant_quota);
	if (r < 0) {
		free(p);
		return r;
	}
	*ret = p;
	return 0;
}

void snapkvd_pool_free(struct snapkvd_pool *p)
{
	if (!p)
		return;
	snapkvd_pool_destroy(p);
	free(p);
}

void snapkvd_pool_set_limits(struct snapkvd_pool *p, uint64_t total, uint64_t tenant_quota)
{
	pthread_mutex_lock(&p->mu);
	p->total = total;
	p->tenant_quota = tenant_quota;
	pthread_mutex_unlock(&p->mu);
}

static void tenant_name(uid_t uid, char *buf, size_t len)
{
	struct passwd pw, *res = NULL;
	char tmp[1024];

	if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &res) == 0 && res)
		snprintf(buf, len, "%s", res->pw_name);
	else
		snprintf(buf, len, "uid%u", (unsigned)uid);
}

int snapkvd_pool_tenant_get(struct snapkvd_pool *p, uid_t uid, struct snapkvd_tenant **ret)
{
	struct snapkvd_tenant *t;

	pthread_mutex_lock(&p->mu);
	for (t = p->tenants; t; t = t->next)
		if (t->uid == uid)
			break;
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t) {
			pthread_mutex_unlock(&p->mu);
			return -ENOMEM;
		}
		t->uid = uid;
		tenant_name(uid, t->name, sizeof(t->name));
		t->next = p->tenants;
		p->tenants = t;
	}
	t->sessions++;
	pthread_mutex_unlock(&p->mu);
	*ret = t;
	return 0;
}

void snapkvd_pool_tenant_put(struct snapkvd_pool *p, struct snapkvd_tenant *t)
{
	if (!t)
		return;
	pthread_mutex_lock(&p->mu);
	if (t->sessions)
		t->sessions--;
	pthread_mutex_unlock(&p->mu);
}

int snapkvd_pool_reserve(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes,
			 struct snapkvd_resv *ret)
{
	uint64_t in_use, t_use;

	pthread_mutex_lock(&p->mu);
	in_use = p->used + p->reserved;
	t_use = t->used + t->reserved;
	if (bytes > p->total || in_use > p->total - bytes) {
		pthread_mutex_unlock(&p->mu);
		return -ENOSPC;
	}
	uint64_t quota = t->quota ? t->quota : p->tenant_quota;

	if (quota && (bytes > quota || t_use > quota - bytes)) {
		t->quota_rejections++;
		pthread_mutex_unlock(&p->mu);
		return -EDQUOT;
	}
	p->reserved += bytes;
	t->reserved += bytes;
	if (p->used + p->reserved > p->peak)
		p->peak = p->used + p->reserved;
	pthread_mutex_unlock(&p->mu);
	ret->tenant = t;
	ret->bytes = bytes;
	return 0;
}

void snapkvd_pool_explain(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes, int r,
			  char *buf, size_t len)
{
	uint64_t quota, t_use, in_use;

	pthread_mutex_lock(&p->mu);
	quota = t->quota ? t->quota : p->tenant_quota;
	t_use = t->used + t->reserved;
	in_use = p->used + p->reserved;
	if (r == -EDQUOT)
		snprintf(
		    buf, len,
		    "tenant %s over quota: wants %llu bytes, holds %llu of its %llu (%llu free)",
		    t->name, (unsigned long long)bytes, (unsigned long long)t_use,
		    (unsigned long long)quota,
		    (unsigned long long)(t_use < quota ? quota - t_use : 0));
	else
		snprintf(buf, len,
			 "pool exhausted: wants %llu bytes, pool holds %llu of %llu (%llu free)",
			 (unsigned long long)bytes, (unsigned long long)in_use,
			 (unsigned long long)p->total,
			 (unsigned long long)(in_use < p->total ? p->total - in_use : 0));
	pthread_mutex_unlock(&p->mu);
}

void snapkvd_pool_commit(struct snapkvd_pool *p, struct snapkvd_resv *r)
{
	if (!r->tenant)
		return;
	pthread_mutex_lock(&p->mu);
	p->reserved -= r->bytes;
	r->tenant->reserved -= r->bytes;
	p->used += r->bytes;
	r->tenant->used += r->bytes;
	pthread_mutex_unlock(&p->mu);
	r->tenant = NULL;
	r->bytes = 0;
}

void snapkvd_pool_cancel(struct snapkvd_pool *p, struct snapkvd_resv *r)
{
	if (!r->tenant)
		return;
	pthread_mutex_lock(&p->mu);
	p->reserved -= r->bytes;
	r->tenant->reserved -= r->bytes;
	pthread_mutex_unlock(&p->mu);
	r->tenant = NULL;
	r->bytes = 0;
}

void snapkvd_pool_give_back(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes)
{
	pthread_mutex_lock(&p->mu);
	p->used -= bytes < p->used ? bytes : p->used;
	t->used -= bytes < t->used ? bytes : t->used;
	pthread_mutex_unlock(&p->mu);
}

void snapkvd_pool_cache_count(struct snapkvd_pool *p, struct snapkvd_tenant *t, int delta)
{
	pthread_mutex_lock(&p->mu);
	t->caches += delta;
	pthread_mutex_unlock(&p->mu);
}

uint64_t snapkvd_pool_used(struct snapkvd_pool *p)
{
	uint64_t u;

	pthread_mutex_lock(&p->mu);
	u = p->used + p->reserved;
	pthread_mutex_unlock(&p->mu);
	return u;
}

uint64_t snapkvd_pool_total(struct snapkvd_pool *p)
{
	uint64_t v;

	pthread_mutex_lock(&p->mu);
	v = p->total;
	pthread_mutex_unlock(&p->mu);
	return v;
}

void snapkvd_pool_tenant_set_quota(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t quota)
{
	pthread_mutex_lock(&p->mu);
	t->quota = quota;
	pthread_mutex_unlock(&p->mu);
}

void snapkvd_pool_requota(struct snapkvd_pool *p, uint64_t (*quota)(void *data, uid_t uid),
			  void *data)
{
	pthread_mutex_lock(&p->mu);
	for (struct snapkvd_tenant *t = p->tenants; t; t = t->next)
		t->quota = quota(data, t->uid);
	pthread_mutex_unlock(&p->mu);
}

void snapkvd_pool_tenant_compaction(struct snapkvd_pool *p, struct snapkvd_tenant *t)
{
	pthread_mutex_lock(&p->mu);
	t->compactions++;
	pthread_mutex_unlock(&p->mu);
}

uint64_t snapkvd_pool_tenant_use(struct snapkvd_pool *p, const struct snapkvd_tenant *t)
{
	uint64_t v;

	pthread_mutex_lock(&p->mu);
	v = t->used + t->reserved;
	pthread_mutex_unlock(&p->mu);
	return v;
}

const char *snapkvd_tenant_name(const struct snapkvd_tenant *t)
{
	return t->name;
}

int snapkvd_pool_snapshot(struct snapkvd_pool *p, struct snapkvd_pool_stats *ret,
			  struct snapkvd_tenant_stats **ret_tenants, size_t *ret_n)
{
	struct snapkvd_tenant_stats *ts;
	size_t n = 0, i = 0;

	pthread_mutex_lock(&p->mu);
	for (struct snapkvd_tenant *t = p->tenants; t; t = t->next)
		n++;
	ts = calloc(n ? n : 1, sizeof(*ts));
	if (!ts) {
		pthread_mutex_unlock(&p->mu);
		return -ENOMEM;
	}
	for (struct snapkvd_tenant *t = p->tenants; t; t = t->next, i++)
		ts[i] = (struct snapkvd_tenant_stats){
		    .tenant = t,
		    .name = t->name,
		    .uid = t->uid,
		    .used_bytes = t->used + t->reserved,
		    .quota_bytes = t->quota ? t->quota : p->tenant_quota,
		    .caches = t->caches,
		    .compactions = t->compactions,
		    .quota_rejections = t->quota_rejections,
		    .sessions = t->sessions,
		    .buffers = t->buffers,
		    .mapped_bytes = t->mapped,
		};
	*ret = (struct snapkvd_pool_stats){
	    .total = p->total, .used = p->used + p->reserved, .reserved = p->reserved};
	pthread_mutex_unlock(&p->mu);
	*ret_tenants = ts;
	*ret_n = n;
	return 0;
}

void snapkvd_pool_set_map_limits(struct snapkvd_pool *p, unsigned max_tenant_buffers,
				 uint64_t max_tenant_mapped_bytes, uint64_t max_mapped_bytes)
{
	pthread_mutex_lock(&p->mu);
	p->map_limits = (struct map_limits){
	    .max_tenant_buffers = max_tenant_buffers,
	    .max_tenant_mapped_bytes = max_tenant_mapped_bytes,
	    .max_mapped_bytes = max_mapped_bytes,
	};
	pthread_mutex_unlock(&p->mu);
}

int snapkvd_pool_map(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes, char *err,
		     size_t errlen)
{
	const struct map_limits *lim = &p->map_limits;
	int r = 0;

	pthread_mutex_lock(&p->mu);
	if (t->buffers >= lim->max_tenant_buffers) {
		snprintf(err, errlen,
			 "uid %u already has %u buffers registered: max_tenant_buffers is %u",
			 (unsigned)t->uid, t->buffers, lim->max_tenant_buffers);
		r = -EMFILE;
	} else if (bytes > lim->max_tenant_mapped_bytes ||
		   t->mapped > lim->max_tenant_mapped_bytes - bytes) {
		snprintf(err, errlen,
			 "uid %u has %llu bytes of buffers mapped, %llu more would pass "
			 "max_tenant_mapped_bytes %llu",
			 (unsigned)t->uid, (unsigned long long)t->mapped, (unsigned long long)bytes,
			 (unsigned long long)lim->max_tenant_mapped_bytes);
		r = -EDQUOT;
	} else if (bytes > lim->max_mapped_bytes || p->mapped > lim->max_mapped_bytes - bytes) {
		snprintf(err, errlen,
			 "the daemon has %llu bytes of buffers mapped, %llu more would pass "
			 "max_mapped_bytes %llu",
			 (unsigned long long)p->mapped, (unsigned long long)bytes,
			 (unsigned long long)lim->max_mapped_bytes);
		r = -ENOSPC;
	} else {
		t->buffers++;
		t->mapped += bytes;
		p->mapped += bytes;
	}
	pthread_mutex_unlock(&p->mu);
	return r;
}

void snapkvd_pool_unmap(struct snapkvd_pool *p, struct snapkvd_tenant *t, uint64_t bytes)
{
	pthread_mutex_lock(&p->mu);
	if (t->buffers)
		t->buffers--;
	t->mapped -= bytes < t->mapped ? bytes : t->mapped;
	p->mapped -= bytes < p->mapped ? bytes : p->mapped;
	pthread_mutex_unlock(&p->mu);
}

uint64_t snapkvd_pool_mapped(struct snapkvd_pool *p)
{
	uint64_t m;

	pthread_mutex_lock(&p->mu);
	m = p->mapped;
	pthread_mutex_unlock(&p->mu);
	return m;
}
