// SPDX-License-Identifier: MIT
/*
 * snapkvd-admin.c - snapkvctl's questions: status, caches, ledger, metrics.
 * Answers are structured (AdminReply); snapkvctl renders tables and JSON.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snapkvd-ledger.h"
#include "snapkvd-log.h"
#include "snapkvd-server.h"

#ifndef SNAPKVD_VERSION
#define SNAPKVD_VERSION "0.1.0"
#endif

char *snapkvd_admin_metrics_text(struct snapkvd_server *srv)
{
	/* one writer for snapkvctl metrics and the textfile (snapkvd-metrics.c) */
	return snapkvd_ops_metrics_text(srv);
}

static void reply(struct snapkvd_session *s, Snapkv__V1__AdminReply *r)
{
	size_t n = snapkv__v1__admin_reply__get_packed_size(r);
	uint8_t *buf;
	int e;

	if (n > SKV_FRAME_MAX_PAYLOAD) {
		Snapkv__V1__AdminReply small = SNAPKV__V1__ADMIN_REPLY__INIT;

		small.status = -EMSGSIZE;
		small.error = "reply too large";
		reply(s, &small);
		return;
	}
	buf = malloc(n ? n : 1);
	if (!buf) {
		snapkvd_session_close(s, -ENOMEM);
		return;
	}
	snapkv__v1__admin_reply__pack(r, buf);
	e = skv_frame_send(s->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY, buf, n, NULL, 0,
			   MSG_DONTWAIT);
	free(buf);
	if (e < 0)
		snapkvd_session_close(s, 0);
}

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
}

int snapkvd_admin_ledger_fill(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r,
			      struct snapkvd_admin_ledger_buf *b)
{
	struct snapkvd_ledger_total pt;
	size_t nt = 0, nc = 0, i = 0;

	memset(b, 0, sizeof(*b));
	pthread_mutex_lock(&srv->pool.mu);
	for (struct snapkvd_tenant *t = srv->pool.tenants; t; t = t->next)
		nt++;
	b->ti = calloc(nt ? nt : 1, sizeof(*b->ti));
	b->tip = calloc(nt ? nt : 1, sizeof(*b->tip));
	b->tb = calloc(nt ? nt : 1, sizeof(*b->tb));
	if (b->ti && b->tip && b->tb)
		for (struct snapkvd_tenant *t = srv->pool.tenants; t; t = t->next, i++) {
			Snapkv__V1__TenantInfo *ti = &b->ti[i];
			struct snapkvd_ledger_total lt;

			snapkv__v1__tenant_info__init(ti);
			ti->name = t->name;
			ti->uid = t->uid;
			ti->used_bytes = t->used + t->reserved;
			ti->caches = t->caches;
			ti->sessions = t->sessions;
			ti->quota_bytes = t->quota ? t->quota : srv->pool.tenant_quota;
			snapkvd_ledger_tenant(srv, t, &lt);
			ledger_bytes(&b->tb[i], &lt);
			ti->bytes = &b->tb[i];
			ti->lingering_caches = lt.lingering;
			b->tip[i] = ti;
		}
	r->pool_total = srv->pool.total;
	r->pool_used = srv->pool.used + srv->pool.reserved;
	r->pool_reserved = srv->pool.reserved;
	pthread_mutex_unlock(&srv->pool.mu);
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		for (struct snapkvd_cache *c = x->caches; c; c = c->next)
			nc++;
	b->cl = calloc(nc ? nc : 1, sizeof(*b->cl));
	b->clp = calloc(nc ? nc : 1, sizeof(*b->clp));
	b->lb = calloc(nc ? nc : 1, sizeof(*b->lb));
	if (!b->ti || !b->tip || !b->tb || !b->cl || !b->clp || !b->lb) {
		snapkvd_admin_ledger_free(b);
		return -ENOMEM;
	}
	snapkvd_ledger_totals(srv, &pt);
	ledger_bytes(&b->pool, &pt);
	r->pool_bytes = &b->pool;
	r->lingering_caches = pt.lingering;
	r->n_tenants = nt;
	r->tenants = b->tip;
	i = 0;
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		for (struct snapkvd_cache *c = x->caches; c; c = c->next, i++) {
			Snapkv__V1__CacheLedger *cl = &b->cl[i];
			struct snapkvd_ledger_total l = {0};
			float mn = 0, sum = 0;
			size_t nm = (size_t)c->layers * c->h_store;

			snapkv__v1__cache_ledger__init(cl);
			snapkvd_ledger_add(&l, c);
			cl->id = c->id;
			cl->tenant = x->tenant->name;
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
			cl->engine = x->name;
			cl->kept = c->kept;
			cl->slots = c->slots;
			for (size_t k = 0; k < nm; k++) {
				if (k == 0 || c->mass[k] < mn)
					mn = c->mass[k];
				sum += c->mass[k];
			}
			cl->lingering = c->lingering;
			cl->requested_budget = c->requested_budget;
			cl->transport = c->transport;
			cl->arena_transport = c->gpu_kv ? "cuda-vmm" : "host-memfd";
			cl->mass_min = mn;
			cl->mass_mean = nm ? sum / nm : 0;
			ledger_bytes(&b->lb[i], &l);
			cl->bytes = &b->lb[i];
			b->clp[i] = cl;
		}
	r->n_caches = nc;
	r->caches = b->clp;
	return 0;
}

void snapkvd_admin_ledger_free(struct snapkvd_admin_ledger_buf *b)
{
	free(b->ti);
	free(b->tip);
	free(b->cl);
	free(b->clp);
	free(b->lb);
	free(b->tb);
	memset(b, 0, sizeof(*b));
}

void snapkvd_admin(struct snapkvd_session *s, const uint8_t *payload, size_t len)
{
	struct snapkvd_server *srv = s->srv;
	Snapkv__V1__AdminRequest *req = snapkv__v1__admin_request__unpack(NULL, len, payload);
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	struct snapkvd_admin_ledger_buf lbuf = {0};
	char *text = NULL;
	struct snapkvd_admin_pressure_buf *pb = NULL;

	r.error = "";
	r.version = SNAPKVD_VERSION;
	r.backend = srv->gpu ? srv->backend_desc : srv->cfg.backend;
	r.pid = (uint32_t)getpid();
	if (!req) {
		r.status = -EBADMSG;
		r.error = "malformed AdminRequest";
		reply(s, &r);
		return;
	}
	r.uptime_ms = (snapkvd_now_ns() - srv->start_ns) / 1000000;
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		if (!x->admin && !x->closing && x->greeted)
			r.sessions++;
	r.threads = srv->cfg.threads;
	r.workers = snapkvd_compactor_workers(srv->compactor);
	r.threads_per_worker = snapkvd_compactor_threads(srv->compactor);
	r.pool_total = srv->pool.total;
	r.pool_used = snapkvd_pool_used(&srv->pool);
	r.requests = srv->requests;
	r.errors = srv->errors;
	/* the transports actually used (snapkvd-gpu.c) */
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		for (struct snapkvd_buffer *b = x->buffers; b; b = b->next) {
			if (!b->imp)
				r.buffers_memfd++;
			else if (!strcmp(b->transport, "cuda-ipc"))
				r.buffers_cuda_ipc++;
			else
				r.buffers_cuda_vmm_fd++;
		}
	r.cuda_imports = srv->cuda_imports;
	r.arena_transport = "host-memfd";
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		if (x->garena)
			r.arena_transport = "host-memfd+cuda-vmm";
	switch (req->kind) {
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS:
		break;
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_CACHES:
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER:
		if (snapkvd_admin_ledger_fill(srv, &r, &lbuf) < 0) {
			r.status = -ENOMEM;
			r.error = "out of memory";
		}
		break;
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS:
		text = snapkvd_admin_metrics_text(srv);
		if (!text) {
			r.status = -ENOMEM;
			r.error = "out of memory";
		}
		r.text = text ? text : "";
		break;
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE:
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET:
		pb = calloc(1, sizeof(*pb));
		if (!pb) {
			r.status = -ENOMEM;
			r.error = "out of memory";
			break;
		}
		snapkvd_admin_pressure(s, req, &r, pb);
		break;
	default:
		r.status = -EOPNOTSUPP;
		r.error = "unknown admin request";
		break;
	}
	reply(s, &r);
	snapkv__v1__admin_request__free_unpacked(req, NULL);
	snapkvd_admin_ledger_free(&lbuf);
	free(text);
	free(pb);
}
