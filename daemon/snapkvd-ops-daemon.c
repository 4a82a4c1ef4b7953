// SPDX-License-Identifier: MIT
/*
 * snapkvd-ops-daemon.c - the operations runtime (snapkvd-ops.h) wired into
 * the server: PRESSURE events on every engine's completion ring, eviction
 * of lingering caches, hook pidfds on the io_uring loop, the ledger
 * snapshot for hooks, the metrics exposition and the pressure admin calls.
 * Everything here runs on the loop thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "skv-ledger-json.h"
#include "snapkvd-ledger.h"
#include "snapkvd-log.h"
#include "snapkvd-server.h"

/* ------------------------------------------------------------- callbacks */

static int post_event(struct snapkvd_session *s, const struct skv_cqe *cqe)
{
	int space;

	if (s->closing || !s->ring_map || s->admin)
		return 0;
	space = skv_ring_space(&s->cq);
	if (space < 0)
		return -EBADMSG;
	/* Every in-flight request keeps its completion slot: an engine that
	 * does not read its CQ misses events, never completions. */
	if ((unsigned)space <= s->inflight)
		return -EAGAIN;
	if (skv_ring_produce(&s->cq, cqe) < 0)
		return -EBADMSG;
	s->cq_dirty = true;
	return 1;
}

static void cb_notify(void *opaque, const struct snapkvd_pressure_change *ch)
{
	struct snapkvd_server *srv = opaque;
	struct skv_cqe cqe = {
	    .user_data = SKV_EVENT_PRESSURE,
	    .res = (int32_t)ch->transition.level + 1,
	    .flags = SKV_CQE_F_EVENT,
	    .slot = ch->suggested_capacity,
	    .len = ch->scale_permille,
	    .reserved = ch->transition.used_bytes,
	};
	unsigned sent = 0, missed = 0;

	for (struct snapkvd_session *s = srv->sessions; s; s = s->next) {
		int r = post_event(s, &cqe);

		if (r > 0) {
			sent++;
			snapkvd_session_flush_cq(s);
		} else if (r < 0) {
			missed++;
		}
	}
	log_info("pressure %s: event sent to %u engines%s",
		 snapkvd_pressure_level_name(ch->transition.level), sent,
		 missed ? " (some CQs full: missed)" : "");
}

void snapkvd_server_greet_pressure(struct snapkvd_session *s)
{
	struct snapkvd_ops *ops = &s->srv->ops;
	const struct snapkvd_pressure_config *pc = snapkvd_pressure_get_config(ops->pressure);
	enum snapkvd_pressure_level lv = snapkvd_pressure_level(ops->pressure);
	int scale = snapkvd_pressure_action_enabled(ops->pressure, SNAPKVD_ACTION_SCALE);
	double f = !scale			     ? 1.0
		   : lv == SNAPKVD_PRESSURE_CRITICAL ? pc->scale_critical
		   : lv == SNAPKVD_PRESSURE_HIGH     ? pc->scale_high
						     : 1.0;
	struct skv_cqe cqe = {
	    .user_data = SKV_EVENT_PRESSURE,
	    .res = (int32_t)lv + 1,
	    .flags = SKV_CQE_F_EVENT,
	    .slot = snapkvd_pressure_scale_capacity(ops->pressure, pc->default_capacity,
						    pc->default_window, NULL),
	    .len = (uint32_t)lround(f * 1000.0),
	    .reserved = ops->used,
	};

	if (lv == SNAPKVD_PRESSURE_NORMAL ||
	    !snapkvd_pressure_action_enabled(ops->pressure, SNAPKVD_ACTION_NOTIFY))
		return;
	if (post_event(s, &cqe) > 0)
		snapkvd_session_flush_cq(s);
}

static uint64_t cb_evict(void *opaque, uint64_t need, uint64_t *ret_caches)
{
	struct snapkvd_server *srv = opaque;
	struct snapkvd_evict_candidate *cand = NULL;
	struct snapkvd_cache **cc = NULL;
	struct snapkvd_session **cs = NULL;
	size_t n = 0, cap = 0, n_pick = 0, *pick = NULL;
	uint64_t chosen = 0, freed = 0;

	*ret_caches = 0;
	for (struct snapkvd_session *s = srv->sessions; s; s = s->next) {
		if (s->closing)
			continue;
		for (struct snapkvd_cache *c = s->caches; c; c = c->next) {
			if (n == cap) {
				size_t nc = cap ? 2 * cap : 64;
				void *a = realloc(cand, nc * sizeof(*cand));
				void *b = a ? realloc(cc, nc * sizeof(*cc)) : NULL;
				void *d = b ? realloc(cs, nc * sizeof(*cs)) : NULL;

				if (a)
					cand = a;
				if (b)
					cc = b;
				if (!d)
					goto out;
				cs = d;
				cap = nc;
			}
			cand[n] = (struct snapkvd_evict_candidate){
			    .id = c->id,
			    .bytes = c->region_bytes,
			    .last_use_ns = c->last_use_ns,
			    .lingering = c->lingering,
			    .held = !c->lingering,
			};
			cc[n] = c;
			cs[n] = s;
			n++;
		}
	}
	if (!n)
		goto out;
	pick = calloc(n, sizeof(*pick));
	if (!pick || snapkvd_pressure_pick_evictions(cand, n, need, pick, n, &n_pick, &chosen) < 0)
		goto out;
	for (size_t i = 0; i < n_pick; i++) {
		struct snapkvd_cache *c = cc[pick[i]];

		log_info("evicting lingering cache %llu of session %llu (%llu bytes, idle %.1f s)",
			 (unsigned long long)c->id, (unsigned long long)cs[pick[i]]->id,
			 (unsigned long long)c->region_bytes,
			 (double)(snapkvd_now_ns() - c->last_use_ns) / 1e9);
		freed += c->region_bytes;
		snapkvd_session_drop_cache(cs[pick[i]], c);
		(*ret_caches)++;
	}
out:
	free(pick);
	free(cand);
	free(cc);
	free(cs);
	if (freed)
		snapkvd_ops_pool_changed(&srv->ops, snapkvd_pool_used(&srv->pool), srv->pool.total);
	return freed;
}

/*
 * The hooks' ledger snapshot: the admin LEDGER reply rendered by the very
 * builder of `snapkvctl ledger --json` (client/ctl-ledger-json.c), plus
 * "pressure". Same keys, same values as snapkvctl would print now.
 */
char *snapkvd_ops_ledger_json(struct snapkvd_server *srv)
{
	Snapkv__V1__AdminReply r = SNAPKV__V1__ADMIN_REPLY__INIT;
	struct snapkvd_admin_ledger_buf b;
	json_t *j = NULL;
	char *text = NULL;

	if (snapkvd_admin_ledger_fill(srv, &r, &b) < 0)
		return NULL;
	j = skv_ledger_json(&r);
	if (j && json_object_set_new(j, "pressure",
				     json_pack("{s:s}", "level",
					       snapkvd_pressure_level_name(snapkvd_pressure_level(
						   srv->ops.pressure)))) == 0)
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
	snapkvd_admin_ledger_free(&b);
	return text;
}

static char *cb_ledger_json(void *opaque)
{
	return snapkvd_ops_ledger_json(opaque);
}

static int cb_watch_hook(void *opaque, struct snapkvd_hook *h)
{
	struct snapkvd_server *srv = opaque;
	struct snapkvd_ev *ev = calloc(1, sizeof(*ev));
	int r;

	if (!ev)
		return -ENOMEM;
	ev->kind = SNAPKVD_EV_HOOK;
	ev->hook = h;
	r = snapkvd_loop_arm_poll(srv, snapkvd_hook_pidfd(h), ev);
	if (r < 0) {
		free(ev);
		return r;
	}
	snapkvd_hook_set_user(h, ev);
	return 0;
}

static char *cb_metrics_text(void *opaque)
{
	return snapkvd_ops_metrics_text(opaque);
}

static void cb_log(void *opaque, int level, const char *msg)
{
	(void)opaque;
	if (level <= snapkvd_log_max)
		snapkvd_log(level, 0, "%s", msg);
}

static uint64_t realtime_ns(void *opaque)
{
	struct timespec ts;

	(void)opaque;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int snapkvd_server_ops_init(struct snapkvd_server *srv)
{
	const struct snapkvd_ops_cb cb = {
	    .opaque = srv,
	    .notify = cb_notify,
	    .evict = cb_evict,
	    .ledger_json = cb_ledger_json,
	    .watch_hook = cb_watch_hook,
	    .metrics_text = cb_metrics_text,
	    .log = cb_log,
	};
	int r = snapkvd_ops_init(&srv->ops, &srv->cfg.ops, &cb, realtime_ns, NULL);

	if (r < 0)
		return log_error_errno(r, "Failed to set up the pressure policy");
	if (srv->cfg.ops.hook_dir[0])
		log_info("pressure hooks from %s (timeout %u ms)", srv->cfg.ops.hook_dir,
			 srv->cfg.ops.hooks.timeout_ms);
	if (srv->cfg.ops.metrics_textfile[0])
		log_info("metrics textfile %s every %u s", srv->cfg.ops.metrics_textfile,
			 srv->cfg.ops.metrics_interval_s);
	return 0;
}

void snapkvd_server_ops_fini(struct snapkvd_server *srv)
{
	/* The ring is gone by now: the hooks' poll records can go with them. */
	for (size_t i = 0; i < srv->ops.n_hooks; i++)
		free(snapkvd_hook_user(srv->ops.hooks[i]));
	snapkvd_ops_fini(&srv->ops);
}

void snapkvd_server_hook_event(struct snapkvd_server *srv, struct snapkvd_ev *ev, int res)
{
	int r = -EAGAIN;

	(void)res;
	r = snapkvd_ops_hook_exited(&srv->ops, ev->hook);
	if (r == -EAGAIN) {
		if (snapkvd_loop_arm_poll(srv, snapkvd_hook_pidfd(ev->hook), ev) == 0)
			return;
		/* cannot watch it any more: the timer's timeout check kills it
		 * and snapkvd_server_ops_fini() reaps it */
		log_warning("pressure hook %s: lost its pidfd watch", snapkvd_hook_path(ev->hook));
		snapkvd_hook_set_user(ev->hook, NULL);
	}
	free(ev);
}

void snapkvd_server_pool_changed(struct snapkvd_server *srv)
{
	snapkvd_ops_pool_changed(&srv->ops, snapkvd_pool_used(&srv->pool), srv->pool.total);
}

/* ----------------------------------------------------------------- metrics */

char *snapkvd_ops_metrics_text(struct snapkvd_server *srv)
{
	struct snapkvd_stats st = {0};
	struct snapkvd_ops_snapshot *snap = calloc(1, sizeof(*snap));
	struct snapkvd_stats_tenant *tn = NULL;
	struct snapkvd_ledger_total lt;
	size_t nt = 0, i = 0;
	char *text = NULL;
	size_t len;

	if (!snap)
		return NULL;
	snapkvd_ledger_totals(srv, &lt);
	snapkvd_ops_fill_stats(&srv->ops, &st, snap);
	for (struct snapkvd_session *s = srv->sessions; s; s = s->next) {
		if (!s->admin && !s->closing && s->greeted)
			st.sessions++;
		for (struct snapkvd_cache *c = s->caches; c; c = c->next)
			if (c->lingering) {
				st.lingering_caches++;
				st.lingering_bytes += c->region_bytes;
			}
	}
	st.caches = lt.caches;
	st.cache_bytes[SNAPKVD_CACHE_NATIVE_FULL] = lt.native_full;
	st.cache_bytes[SNAPKVD_CACHE_COMPACT] = lt.compact;
	st.cache_bytes[SNAPKVD_CACHE_INDEX] = lt.index;
	st.cache_bytes[SNAPKVD_CACHE_RESERVED] = lt.reserved;
	for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
		for (struct snapkvd_cache *c = s->caches; c; c = c->next)
			st.cache_bytes[SNAPKVD_CACHE_ALLOCATED] += c->region_bytes;
	st.compactions_total = srv->compactions;
	st.workers = snapkvd_compactor_workers(srv->compactor);
	st.queue_depth = srv->compactor ? snapkvd_compactor_queued(srv->compactor) : 0;
	st.requests_total = srv->requests;
	st.errors_total = srv->errors;
	st.sessions_total = srv->sessions_total;
	st.kernel_seconds_total = __atomic_load_n(&srv->compact_ns, __ATOMIC_RELAXED) / 1e9;
	st.start_time_seconds = srv->start_realtime_s;
	pthread_mutex_lock(&srv->pool.mu);
	st.pool_total_bytes = srv->pool.total;
	st.pool_used_bytes = srv->pool.used + srv->pool.reserved;
	st.pool_reserved_bytes = srv->pool.reserved;
	for (struct snapkvd_tenant *t = srv->pool.tenants; t; t = t->next)
		nt++;
	tn = calloc(nt ? nt : 1, sizeof(*tn));
	if (tn)
		for (struct snapkvd_tenant *t = srv->pool.tenants; t; t = t->next, i++)
			tn[i] = (struct snapkvd_stats_tenant){
			    .name = t->name,
			    .uid = (uint32_t)t->uid,
			    .used_bytes = t->used + t->reserved,
			    .quota_bytes = t->quota ? t->quota : srv->pool.tenant_quota,
			    .caches = t->caches,
			    .compactions_total = t->compactions,
			    .quota_rejections_total = t->quota_rejections,
			};
	st.tenants = tn;
	st.n_tenants = tn ? nt : 0;
	if (tn)
		snapkvd_metrics_format(&st, &text, &len);
	pthread_mutex_unlock(&srv->pool.mu);
	free(tn);
	free(snap);
	return text;
}

/* --------------------------------------------------------- admin: pressure */

static Snapkv__V1__PressureLevel level_pb(enum snapkvd_pressure_level l)
{
	return (Snapkv__V1__PressureLevel)((int)l + 1);
}

/* Apply non-empty settings on top of the current config. */
static int apply_settings(struct snapkvd_server *srv, const Snapkv__V1__PressureSettings *ps,
			  char *err, size_t errlen)
{
	struct snapkvd_ops_config oc = srv->ops.cfg;
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
	int r;

	for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++) {
		if (!kv[i].val || !*kv[i].val)
			continue;
		if (strlen(kv[i].val) > 64) {
			snprintf(err, errlen, "%s: too long", kv[i].key);
			return -EINVAL;
		}
		/* "none" clears the action list (every action disabled). */
		r = snapkvd_ops_config_set(&oc, kv[i].key,
					   !strcmp(kv[i].key, "pressure_actions") &&
						   !strcmp(kv[i].val, "none")
					       ? ""
					       : kv[i].val,
					   err, errlen);
		if (r < 0)
			return r;
	}
	r = snapkvd_ops_config_check(&oc, err, errlen);
	if (r < 0)
		return r;
	r = snapkvd_ops_set_pressure(&srv->ops, &oc.pressure, err, errlen);
	if (r < 0)
		return r;
	/* a SIGHUP reload rereads the file; until then the change holds */
	srv->cfg.ops.pressure = oc.pressure;
	return 0;
}

/* Fills *pi; strings point into buf (at least 512 bytes). */
static void fill_pressure(struct snapkvd_server *srv, Snapkv__V1__PressureInfo *pi,
			  Snapkv__V1__PressureTransition *tr, Snapkv__V1__PressureTransition **trp,
			  char *buf)
{
	const struct snapkvd_pressure_config *pc = snapkvd_pressure_get_config(srv->ops.pressure);
	uint64_t total = srv->pool.total;
	size_t n = snapkvd_pressure_history_len(srv->ops.pressure);

	snapkv__v1__pressure_info__init(pi);
	pi->level = level_pb(snapkvd_pressure_level(srv->ops.pressure));
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
	pi->suggested_capacity = snapkvd_pressure_scale_capacity(
	    srv->ops.pressure, pc->default_capacity, pc->default_window, NULL);
	pi->transitions_total = snapkvd_pressure_transitions_total(srv->ops.pressure);
	pi->hooks_running = (uint32_t)srv->ops.n_hooks;
	pi->hook_dir = srv->ops.cfg.hook_dir;
	pi->pool_used = snapkvd_pool_used(&srv->pool);
	pi->pool_total = total;
	pi->refusals = srv->ops.refusals;
	pi->evictions = srv->ops.evictions;
	for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
		for (struct snapkvd_cache *c = s->caches; c; c = c->next)
			if (c->lingering) {
				pi->lingering_caches++;
				pi->lingering_bytes += c->region_bytes;
			}
	for (size_t i = 0; i < n; i++) {
		struct snapkvd_pressure_transition t;

		snapkvd_pressure_history_get(srv->ops.pressure, i, &t);
		snapkv__v1__pressure_transition__init(&tr[i]);
		tr[i].time_ns = t.time_ns;
		tr[i].prev = level_pb(t.prev);
		tr[i].level = level_pb(t.level);
		tr[i].used_bytes = t.used_bytes;
		tr[i].total_bytes = t.total_bytes;
		trp[i] = &tr[i];
	}
	pi->n_transitions = n;
	pi->transitions = trp;
}

int snapkvd_admin_pressure(struct snapkvd_session *s, const Snapkv__V1__AdminRequest *req,
			   Snapkv__V1__AdminReply *r, struct snapkvd_admin_pressure_buf *b)
{
	struct snapkvd_server *srv = s->srv;

	if (req->kind == SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET) {
		int e;

		/* Changing the policy is for the operator, not for any engine that
		 * can reach the socket. */
		if (s->uid != 0 && s->uid != geteuid()) {
			snprintf(b->err, sizeof(b->err),
				 "only root or the daemon's user may change pressure settings");
			r->status = -EPERM;
			r->error = b->err;
			return -EPERM;
		}
		if (!req->pressure) {
			snprintf(b->err, sizeof(b->err), "no settings given");
			r->status = -EINVAL;
			r->error = b->err;
			return -EINVAL;
		}
		e = apply_settings(srv, req->pressure, b->err, sizeof(b->err));
		if (e < 0) {
			r->status = e;
			r->error = b->err;
			return e;
		}
		log_notice("pressure settings changed by uid %u", (unsigned)s->uid);
	}
	fill_pressure(srv, &b->info, b->tr, b->trp, b->strings);
	r->pressure = &b->info;
	return 0;
}
