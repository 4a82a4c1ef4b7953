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

void snapkvd_admin(struct snapkvd_session *s, const uint8_t *payload, size_t len)
{
	struct snapkvd_server *srv = s->srv;
	Snapkv__V1__AdminRequest *req = snapkv__v1__admin_request__unpack(NULL, len, payload);
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	Snapkv__V1__TenantInfo *ti = NULL, **tip = NULL;
	Snapkv__V1__CacheLedger *cl = NULL, **clp = NULL;
	Snapkv__V1__LedgerBytes *lb = NULL, *tb = NULL, pool_lb;
	struct snapkvd_ledger_total pt;
	size_t nt = 0, nc = 0;
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
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER: {
		size_t i = 0;

		pthread_mutex_lock(&srv->pool.mu);
		for (struct snapkvd_tenant *t = srv->pool.tenants; t; t = t->next)
			nt++;
		ti = calloc(nt ? nt : 1, sizeof(*ti));
		tip = calloc(nt ? nt : 1, sizeof(*tip));
		tb = calloc(nt ? nt : 1, sizeof(*tb));
		if (ti && tip && tb)
			for (struct snapkvd_tenant *t = srv->pool.tenants; t; t = t->next, i++) {
				struct snapkvd_ledger_total lt;

				snapkv__v1__tenant_info__init(&ti[i]);
				ti[i].name = t->name;
				ti[i].uid = t->uid;
				ti[i].used_bytes = t->used + t->reserved;
				ti[i].caches = t->caches;
				ti[i].sessions = t->sessions;
				ti[i].quota_bytes = t->quota ? t->quota : srv->pool.tenant_quota;
				snapkvd_ledger_tenant(srv, t, &lt);
				ledger_bytes(&tb[i], &lt);
				ti[i].bytes = &tb[i];
				ti[i].lingering_caches = lt.lingering;
				tip[i] = &ti[i];
			}
		r.pool_reserved = srv->pool.reserved;
		pthread_mutex_unlock(&srv->pool.mu);
		snapkvd_ledger_totals(srv, &pt);
		ledger_bytes(&pool_lb, &pt);
		r.pool_bytes = &pool_lb;
		r.lingering_caches = pt.lingering;
		for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
			for (struct snapkvd_cache *c = x->caches; c; c = c->next)
				nc++;
		cl = calloc(nc ? nc : 1, sizeof(*cl));
		clp = calloc(nc ? nc : 1, sizeof(*clp));
		lb = calloc(nc ? nc : 1, sizeof(*lb));
		if (!ti || !tip || !tb || !cl || !clp || !lb) {
			r.status = -ENOMEM;
			r.error = "out of memory";
			break;
		}
		r.n_tenants = nt;
		r.tenants = tip;
		i = 0;
		for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
			for (struct snapkvd_cache *c = x->caches; c; c = c->next, i++) {
				struct snapkvd_ledger_total l = {0};
				float mn = 0, sum = 0;
				size_t nm = (size_t)c->layers * c->h_store;

				snapkv__v1__cache_ledger__init(&cl[i]);
				snapkvd_ledger_add(&l, c);
				cl[i].id = c->id;
				cl[i].tenant = x->tenant->name;
				cl[i].layers = c->layers;
				cl[i].h_q = c->h_q;
				cl[i].h_kv = c->h_kv;
				cl[i].head_dim = c->head_dim;
				cl[i].dtype_bytes = c->dtype_bytes;
				cl[i].prompt_len = c->prompt_len;
				cl[i].capacity = c->budget;
				cl[i].appended = c->appended;
				cl[i].gqa = (Snapkv__V1__Gqa)c->gqa;
				cl[i].session_id = x->id;
				cl[i].engine = x->name;
				cl[i].kept = c->kept;
				cl[i].slots = c->slots;
				for (size_t k = 0; k < nm; k++) {
					if (k == 0 || c->mass[k] < mn)
						mn = c->mass[k];
					sum += c->mass[k];
				}
				cl[i].lingering = c->lingering;
				cl[i].requested_budget = c->requested_budget;
				cl[i].transport = c->transport;
				cl[i].arena_transport = c->gpu_kv ? "cuda-vmm" : "host-memfd";
				cl[i].mass_min = mn;
				cl[i].mass_mean = nm ? sum / nm : 0;
				ledger_bytes(&lb[i], &l);
				cl[i].bytes = &lb[i];
				clp[i] = &cl[i];
			}
		r.n_caches = nc;
		r.caches = clp;
		break;
	}
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
	free(ti);
	free(tip);
	free(cl);
	free(clp);
	free(lb);
	free(tb);
	free(text);
	free(pb);
}
