// SPDX-License-Identifier: MIT
/* snapkvd-admin.c - snapkvctl's questions; see snapkvd-admin.h. */
#include "snapkvd-admin.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/skv-frame.h"
#include "proto/snapkv.pb-c.h"
#include "snapkvd-arena.h"
#include "snapkvd-buffer.h"
#include "snapkvd-cache.h"
#include "snapkvd-clock.h"
#include "snapkvd-compactor.h"
#include "snapkvd-config.h"
#include "snapkvd-ledger.h"
#include "snapkvd-log.h"
#include "snapkvd-policy.h"
#include "snapkvd-pool.h"
#include "snapkvd-device.h"
#include "snapkvd-ring.h"
#include "snapkvd-runner.h"
#include "snapkvd-group.h"
#include "snapkvd-server.h"
#include "snapkvd-session.h"

/* ----------------------------------------------------------------- metrics */

/* The fields the server, not the policy, knows. */
static void server_stats(struct snapkvd_server *srv, struct snapkvd_stats *st)
{
	/* running sums (snapkvd-tally.h): a scrape costs the same at any
	 * number of caches */
	const struct snapkvd_ledger_total *lt = &srv->tally.pool;

	for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
		if (!s->admin && !s->closing && s->greeted)
			st->sessions++;
	st->lingering_caches = lt->lingering;
	st->lingering_bytes = srv->tally.lingering_bytes;
	st->cache_bytes[SNAPKVD_CACHE_ALLOCATED] = lt->allocated;
	st->caches = lt->caches;
	st->cache_bytes[SNAPKVD_CACHE_NATIVE_FULL] = lt->native_full;
	st->cache_bytes[SNAPKVD_CACHE_COMPACT] = lt->compact;
	st->cache_bytes[SNAPKVD_CACHE_INDEX] = lt->index;
	st->cache_bytes[SNAPKVD_CACHE_RESERVED] = lt->reserved;
	st->compactions_total = srv->compactions;
	st->version = SKV_VERSION;
	st->backend = srv->cfg.backend;
	st->workers = snapkvd_compactor_workers(srv->compactor);
	st->queue_depth = srv->compactor ? snapkvd_compactor_queued(srv->compactor) : 0;
	st->requests_total = srv->requests;
	st->errors_total = srv->errors;
	st->sessions_total = srv->sessions_total;
	st->kernel_seconds_total =
	    srv->compactor ? snapkvd_compactor_busy_ns(srv->compactor) / 1e9 : 0;
	st->start_time_seconds = srv->start_realtime_s;
}

char *snapkvd_admin_metrics_text(struct snapkvd_server *srv, enum snapkvd_metrics_tenants shown)
{
	struct snapkvd_stats st = {.tenants_shown = shown};
	struct snapkvd_policy_snapshot *snap = calloc(1, sizeof(*snap));
	struct snapkvd_stats_tenant *tn = NULL;
	struct snapkvd_tenant_stats *ts = NULL;
	struct snapkvd_pool_stats ps;
	struct snapkvd_group_stats gs;
	size_t nt = 0, len;
	char *text = NULL;

	if (!snap || snapkvd_pool_snapshot(srv->pool, &ps, &ts, &nt) < 0) {
		free(snap);
		return NULL;
	}
	snapkvd_policy_fill_stats(&srv->policy, &st, snap);
	server_stats(srv, &st);
	if (srv->groups) {
		snapkvd_groups_stats(srv->groups, &gs);
		st.groups = &gs;
	}
	st.pool_total_bytes = ps.total;
	st.pool_used_bytes = ps.used;
	st.pool_reserved_bytes = ps.reserved;
	st.arena_cached_bytes = snapkvd_arena_set_cached(&srv->arenas);
	tn = calloc(nt ? nt : 1, sizeof(*tn));
	for (size_t i = 0; tn && i < nt; i++)
		tn[i] = (struct snapkvd_stats_tenant){
		    .name = ts[i].name,
		    .uid = (uint32_t)ts[i].uid,
		    .used_bytes = ts[i].used_bytes,
		    .quota_bytes = ts[i].quota_bytes,
		    .caches = ts[i].caches,
		    .compactions_total = ts[i].compactions,
		    .quota_rejections_total = ts[i].quota_rejections,
		};
	st.tenants = tn;
	st.n_tenants = tn ? nt : 0;
	struct snapkvd_stats_device dv[SNAPKVD_DEVICES_MAX];
	st.n_devices = snapkvd_device_count(srv->device);
	for (unsigned i = 0; i < st.n_devices; i++) {
		struct snapkvd_device_stats ds;

		snapkvd_device_stats(srv->device, i, &ds);
		dv[i] = (struct snapkvd_stats_device){ds.ordinal, ds.imports,	  ds.import_bytes,
						      ds.arenas,  ds.arena_bytes, ds.jobs};
	}
	st.devices = dv;
	if (tn)
		snapkvd_metrics_format(&st, &text, &len);
	free(tn);
	free(ts);
	free(snap);
	return text;
}

/* --------------------------------------------------------------- pressure */

struct pressure_buf {
	char err[256];
	char strings[512];
	Snapkv__V1__PressureInfo info;
	Snapkv__V1__PressureTransition tr[SNAPKVD_PRESSURE_HISTORY];
	Snapkv__V1__PressureTransition *trp[SNAPKVD_PRESSURE_HISTORY];
};

static Snapkv__V1__PressureLevel level_pb(enum snapkvd_pressure_level l)
{
	return (Snapkv__V1__PressureLevel)((int)l + 1);
}

/* Apply non-empty settings on top of the current config. */
static int apply_settings(struct snapkvd_server *srv, const Snapkv__V1__PressureSettings *ps,
			  char *err, size_t errlen)
{
	struct snapkvd_policy_config oc = srv->policy.cfg;
	struct skv_error kerr = {{0}, -1, -1};
	const struct {
		const char *key, *val;
	} kv[] = {
	    {"pressure_high", ps->high},
	    {"pressure_high_leave", ps->high_leave},
	    {"pressure_critical", ps->critical},
	    {"pressure_critical_leave", ps->critical_leave},
	    {"pressure_actions", ps->actions},
	    {"pressure_scale_high", ps->scale_high},
	    {"pressure_scale_critical", ps->scale_critical},
	    {"pressure_guaranteed_share", ps->guaranteed_share},
	};
	int r = 0;

	for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++) {
		if (!kv[i].val || !*kv[i].val)
			continue;
		if (strlen(kv[i].val) > 64) {
			snprintf(err, errlen, "%s: too long", kv[i].key);
			return -EINVAL;
		}
		/* "none" clears the action list (every action disabled). */
		r = snapkvd_policy_config_set(&oc, kv[i].key,
					      !strcmp(kv[i].key, "pressure_actions") &&
						      !strcmp(kv[i].val, "none")
						  ? ""
						  : kv[i].val,
					      &kerr);
		if (r < 0)
			break;
	}
	if (r >= 0)
		r = snapkvd_policy_config_check(&oc, &kerr);
	if (r >= 0)
		r = snapkvd_policy_set_pressure(&srv->policy, &oc.pressure, &kerr);
	if (r < 0) {
		snprintf(err, errlen, "%s", kerr.msg);
		return r;
	}
	/* a SIGHUP reload rereads the file; until then the change holds */
	srv->cfg.policy.pressure = oc.pressure;
	return 0;
}

/* The watermarks and actions as configured, as text in buf (512 bytes). */
static void fill_marks(const struct snapkvd_pressure_config *pc, uint64_t total,
		       Snapkv__V1__PressureInfo *pi, char *buf)
{
	snapkvd_watermark_format(&pc->high_enter, buf, 64);
	snapkvd_watermark_format(&pc->high_leave, buf + 64, 64);
	snapkvd_watermark_format(&pc->critical_enter, buf + 128, 64);
	snapkvd_watermark_format(&pc->critical_leave, buf + 192, 64);
	snapkvd_pressure_order_format(pc, buf + 256, 128);
	pi->high = buf;
	pi->high_leave = buf + 64;
	pi->critical = buf + 128;
	pi->critical_leave = buf + 192;
	pi->actions = buf + 256;
	pi->high_bytes = snapkvd_watermark_bytes(&pc->high_enter, total);
	pi->high_leave_bytes = snapkvd_watermark_bytes(&pc->high_leave, total);
	pi->critical_bytes = snapkvd_watermark_bytes(&pc->critical_enter, total);
	pi->critical_leave_bytes = snapkvd_watermark_bytes(&pc->critical_leave, total);
	pi->scale_high = pc->scale_high;
	pi->scale_critical = pc->scale_critical;
	pi->guaranteed_share = pc->guaranteed_share;
}

static void fill_history(const struct snapkvd_pressure *p, struct pressure_buf *b)
{
	size_t n = snapkvd_pressure_history_len(p);

	for (size_t i = 0; i < n; i++) {
		struct snapkvd_pressure_transition t;

		snapkvd_pressure_history_get(p, i, &t);
		snapkv__v1__pressure_transition__init(&b->tr[i]);
		b->tr[i].time_ns = t.time_ns;
		b->tr[i].prev = level_pb(t.prev);
		b->tr[i].level = level_pb(t.level);
		b->tr[i].used_bytes = t.used_bytes;
		b->tr[i].total_bytes = t.total_bytes;
		b->trp[i] = &b->tr[i];
	}
	b->info.n_transitions = n;
	b->info.transitions = b->trp;
}

static void fill_pressure(struct snapkvd_server *srv, struct pressure_buf *b)
{
	const struct snapkvd_pressure_config *pc =
	    snapkvd_pressure_get_config(srv->policy.pressure);
	Snapkv__V1__PressureInfo *pi = &b->info;
	uint64_t total = snapkvd_pool_total(srv->pool);

	snapkv__v1__pressure_info__init(pi);
	pi->level = level_pb(snapkvd_pressure_level(srv->policy.pressure));
	fill_marks(pc, total, pi, b->strings);
	pi->suggested_capacity = snapkvd_pressure_scale_capacity(
	    srv->policy.pressure, pc->default_capacity, pc->default_window, NULL);
	pi->transitions_total = snapkvd_pressure_transitions_total(srv->policy.pressure);
	pi->hooks_running = (uint32_t)srv->policy.n_hooks;
	pi->hook_dir = srv->policy.cfg.hook_dir;
	pi->pool_used = snapkvd_pool_used(srv->pool);
	pi->pool_total = total;
	pi->refusals = srv->policy.refusals;
	pi->evictions = srv->policy.evictions;
	pi->lingering_caches = srv->tally.pool.lingering;
	pi->lingering_bytes = srv->tally.lingering_bytes;
	fill_history(srv->policy.pressure, b);
}

/* ADMIN_KIND_PRESSURE(_SET): fills r->pressure from b, or r's error. */
static void answer_pressure(struct snapkvd_server *srv, const struct snapkvd_session *s,
			    const Snapkv__V1__AdminRequest *req, Snapkv__V1__AdminReply *r,
			    struct pressure_buf *b)
{
	int e = 0;

	if (req->kind == SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET) {
		/* Changing the policy is for the operator, not for any engine that
		 * can reach the socket. */
		if (s->uid != 0 && s->uid != geteuid()) {
			snprintf(b->err, sizeof(b->err),
				 "only root or the daemon's user may change pressure settings");
			e = -EPERM;
		} else if (!req->pressure) {
			snprintf(b->err, sizeof(b->err), "no settings given");
			e = -EINVAL;
		} else {
			e = apply_settings(srv, req->pressure, b->err, sizeof(b->err));
		}
		if (e < 0) {
			r->status = e;
			r->error = b->err;
			return;
		}
		log_notice("pressure settings changed by uid %u", (unsigned)s->uid);
	}
	fill_pressure(srv, b);
	r->pressure = &b->info;
}

/* ----------------------------------------------------------------- status */

/* Every opened CUDA device and what it holds: into ds[], pointed to by r. */
static void fill_devices(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r,
			 Snapkv__V1__DeviceStatus *ds, Snapkv__V1__DeviceStatus **dp)
{
	r->n_devices = snapkvd_device_count(srv->device);
	r->devices = dp;
	for (unsigned i = 0; i < r->n_devices; i++) {
		struct snapkvd_device_stats st;

		snapkvd_device_stats(srv->device, i, &st);
		snapkv__v1__device_status__init(&ds[i]);
		ds[i].ordinal = st.ordinal;
		ds[i].name = (char *)st.name;
		ds[i].imports = st.imports;
		ds[i].import_bytes = st.import_bytes;
		ds[i].arenas = st.arenas;
		ds[i].arena_bytes = st.arena_bytes;
		ds[i].compactions = st.jobs;
		dp[i] = &ds[i];
	}
}

static void fill_status(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r)
{
	r->uptime_ms = (snapkvd_now_ns() - srv->start_ns) / 1000000;
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		if (!x->admin && !x->closing && x->greeted)
			r->sessions++;
	r->threads = srv->cfg.threads;
	r->workers = snapkvd_compactor_workers(srv->compactor);
	r->threads_per_worker = snapkvd_compactor_threads(srv->compactor);
	r->pool_total = snapkvd_pool_total(srv->pool);
	r->pool_used = snapkvd_pool_used(srv->pool);
	r->requests = srv->requests;
	r->errors = srv->errors;
	/* the transports actually used */
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		for (struct snapkvd_buffer *b = x->buffers.list; b; b = b->next) {
			if (!b->imp)
				r->buffers_memfd++;
			else if (!strcmp(b->transport, "cuda-ipc"))
				r->buffers_cuda_ipc++;
			else
				r->buffers_cuda_vmm_fd++;
		}
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		r->kv_pools += x->kvpools.n;
	r->cuda_imports = snapkvd_device_imports(srv->device);
	r->mapped_bytes = snapkvd_pool_mapped(srv->pool);
	r->max_mapped_bytes = srv->cfg.max_mapped_bytes;
	r->max_tenant_mapped_bytes = srv->cfg.max_tenant_mapped_bytes;
	r->max_tenant_buffers = srv->cfg.max_tenant_buffers;
	r->max_sessions = srv->cfg.max_sessions;
	r->max_sessions_per_tenant = srv->cfg.max_sessions_per_tenant;
	r->max_admin_sessions = srv->cfg.max_admin_sessions;
	r->handshakes = srv->n_handshakes;
	r->max_request_macs = srv->cfg.max_request_macs;
	r->max_request_bytes = srv->cfg.max_request_bytes;
	r->jobs_cancelled = srv->jobs_cancelled;
	r->pressure_held = snapkvd_pressure_held(srv->policy.pressure);
	r->pressure_transitions = snapkvd_pressure_transitions_total(srv->policy.pressure);
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		r->events_coalesced += x->ring ? x->ring->events_coalesced : 0;
	r->admin_slices = srv->admin_slices;
	r->admin_refused = srv->admin_refused;
	r->admin_pending = srv->admin_pending;
	r->arena_transport = "host-memfd";
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		if (x->garena)
			r->arena_transport = "host-memfd+cuda-vmm";
}

/*
 * Metrics for a caller that sees its own tenant only: every sample labelled
 * with another tenant goes (in place); the daemon-wide ones stay.
 */
static void own_tenant_lines(char *text, const char *own)
{
	char *out = text, *line = text;
	char mine[96];

	snprintf(mine, sizeof(mine), "tenant=\"%s\"", own);
	while (*line) {
		char *nl = strchr(line, '\n');
		size_t n = nl ? (size_t)(nl - line) + 1 : strlen(line);
		char *t = memmem(line, n, "tenant=\"", 8);
		bool keep = !t || ((size_t)(line + n - t) >= strlen(mine) &&
				   !strncmp(t, mine, strlen(mine)));

		if (keep) {
			memmove(out, line, n);
			out += n;
		}
		line += n;
	}
	*out = 0;
}

static int pack(const Snapkv__V1__AdminReply *r, uint8_t **ret_buf, size_t *ret_len)
{
	size_t n = snapkv__v1__admin_reply__get_packed_size(r);
	uint8_t *buf;

	if (n > SKV_FRAME_MAX_PAYLOAD) {
		Snapkv__V1__AdminReply small = SNAPKV__V1__ADMIN_REPLY__INIT;

		small.status = -EMSGSIZE;
		small.error = "reply too large";
		return pack(&small, ret_buf, ret_len);
	}
	buf = malloc(n ? n : 1);
	if (!buf)
		return -ENOMEM;
	snapkv__v1__admin_reply__pack(r, buf);
	*ret_buf = buf;
	*ret_len = n;
	return 0;
}

/* The fields every answer carries. */
static void reply_init(struct snapkvd_server *srv, Snapkv__V1__AdminReply *r)
{
	r->error = "";
	r->version = SKV_VERSION;
	r->backend = srv->runner->desc;
	r->pid = (uint32_t)getpid();
}

struct snapkvd_admin_answer {
	struct snapkvd_ledger_cursor cur;
};

/* The caller's view of the ledger: every tenant for root and admin_uids;
 * every page fits a frame, whatever was asked. */
static struct snapkvd_ledger_view ledger_view(struct snapkvd_server *srv,
					      const struct snapkvd_session *s,
					      const Snapkv__V1__AdminRequest *req)
{
	return (struct snapkvd_ledger_view){
	    .all = snapkvd_config_is_admin(&srv->cfg, s->uid),
	    .uid = s->uid,
	    .after = req->page_after,
	    .page = req->page_size && req->page_size < SNAPKVD_LEDGER_PAGE ? req->page_size
									   : SNAPKVD_LEDGER_PAGE,
	};
}

/* METRICS: the caller's own tenant lines unless it sees all; r->text set
 * (the caller frees *ret_text). */
static void answer_metrics(struct snapkvd_server *srv, const struct snapkvd_session *s,
			   Snapkv__V1__AdminReply *r, char **ret_text)
{
	char *text = snapkvd_admin_metrics_text(srv, SNAPKVD_METRICS_TENANTS_ALL);

	if (text && !snapkvd_config_is_admin(&srv->cfg, s->uid))
		own_tenant_lines(text, s->tenant ? snapkvd_tenant_name(s->tenant) : "");
	if (!text) {
		r->status = -ENOMEM;
		r->error = "out of memory";
	}
	r->text = text ? text : "";
	*ret_text = text;
}

int snapkvd_admin_start(struct snapkvd_server *srv, const struct snapkvd_session *s,
			const uint8_t *payload, size_t len, uint8_t **ret_buf, size_t *ret_len,
			struct snapkvd_admin_answer **ret_a)
{
	Snapkv__V1__AdminRequest *req = snapkv__v1__admin_request__unpack(NULL, len, payload);
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	struct pressure_buf *pb = NULL;
	char *text = NULL;
	int e;

	*ret_buf = NULL;
	*ret_a = NULL;
	reply_init(srv, &r);
	if (!req) {
		r.status = -EBADMSG;
		r.error = "malformed AdminRequest";
		return pack(&r, ret_buf, ret_len);
	}
	switch (req->kind) {
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS:
		break;
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_CACHES:
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER: {
		/* built in slices (snapkvd_admin_step), the status at the end */
		struct snapkvd_ledger_view v = ledger_view(srv, s, req);

		snapkv__v1__admin_request__free_unpacked(req, NULL);
		*ret_a = calloc(1, sizeof(**ret_a));
		if (!*ret_a)
			return -ENOMEM;
		snapkvd_ledger_cursor_init(&(*ret_a)->cur, &v);
		return 0;
	}
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS:
		answer_metrics(srv, s, &r, &text);
		break;
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE:
	case SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET:
		pb = calloc(1, sizeof(*pb));
		if (pb) {
			answer_pressure(srv, s, req, &r, pb);
		} else {
			r.status = -ENOMEM;
			r.error = "out of memory";
		}
		break;
	default:
		r.status = -EOPNOTSUPP;
		r.error = "unknown admin request";
		break;
	}
	fill_status(srv, &r);
	Snapkv__V1__DeviceStatus ds[SNAPKVD_DEVICES_MAX], *dp[SNAPKVD_DEVICES_MAX];
	fill_devices(srv, &r, ds, dp);
	e = pack(&r, ret_buf, ret_len);
	snapkv__v1__admin_request__free_unpacked(req, NULL);
	free(text);
	free(pb);
	return e;
}

/* The rest of the reply packed, the slices' caches after it. */
static int pack_page(struct snapkvd_server *srv, struct snapkvd_admin_answer *a, uint8_t **ret_buf,
		     size_t *ret_len)
{
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	struct snapkvd_ledger_buf lbuf;
	size_t n;
	uint8_t *buf;

	Snapkv__V1__DeviceStatus ds[SNAPKVD_DEVICES_MAX], *dp[SNAPKVD_DEVICES_MAX];

	reply_init(srv, &r);
	fill_status(srv, &r);
	fill_devices(srv, &r, ds, dp); /* per-device totals with every ledger page */
	if (snapkvd_ledger_finish(srv, &r, &lbuf, &a->cur) < 0)
		return -ENOMEM;
	n = snapkv__v1__admin_reply__get_packed_size(&r);
	if (n + a->cur.len > SKV_FRAME_MAX_PAYLOAD) {
		snapkvd_ledger_reply_free(&lbuf);
		memset(&r, 0, sizeof(r));
		snapkv__v1__admin_reply__init(&r);
		r.status = -EMSGSIZE;
		r.error = "reply too large";
		return pack(&r, ret_buf, ret_len);
	}
	buf = malloc(n + a->cur.len ? n + a->cur.len : 1);
	if (buf) {
		snapkv__v1__admin_reply__pack(&r, buf);
		if (a->cur.len)
			memcpy(buf + n, a->cur.bytes, a->cur.len);
	}
	snapkvd_ledger_reply_free(&lbuf);
	if (!buf)
		return -ENOMEM;
	*ret_buf = buf;
	*ret_len = n + a->cur.len;
	return 0;
}

int snapkvd_admin_step(struct snapkvd_server *srv, struct snapkvd_admin_answer *a, unsigned max,
		       unsigned *ret_built, uint8_t **ret_buf, size_t *ret_len)
{
	int n = snapkvd_ledger_slice(srv, &a->cur, max);

	*ret_built = n > 0 ? (unsigned)n : 0;
	if (n < 0)
		return n;
	if (!a->cur.done)
		return 0;
	n = pack_page(srv, a, ret_buf, ret_len);
	return n < 0 ? n : 1;
}

void snapkvd_admin_answer_free(struct snapkvd_admin_answer *a)
{
	if (!a)
		return;
	snapkvd_ledger_cursor_fini(&a->cur);
	free(a);
}

int snapkvd_admin_refusal(struct snapkvd_server *srv, int status, const char *err,
			  uint32_t retry_ms, uint8_t **ret_buf, size_t *ret_len)
{
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;

	reply_init(srv, &r);
	r.status = status;
	r.error = (char *)err;
	r.retry_after_ms = retry_ms;
	return pack(&r, ret_buf, ret_len);
}
