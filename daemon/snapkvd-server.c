// SPDX-License-Identifier: MIT
/*
 * snapkvd-server.c - the daemon as a whole; see snapkvd-server.h.
 *
 * Each loop round polls every session's SQ, reaps finished jobs (their
 * completions are posted here, on the loop thread), lets the pressure
 * policy look at the pool and signals engines sleeping on their CQ. After
 * poll_idle_us without work it sets NEED_WAKEUP on every SQ, re-checks
 * (W1 in skv-ring.h), and only then blocks; an engine that sees the flag
 * writes the session's doorbell eventfd.
 */
#include "snapkvd-server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "snapkvd-admin.h"
#include "snapkvd-adminq.h"
#include "snapkvd-arena.h"
#include "snapkvd-cache.h"
#include "snapkvd-clock.h"
#include "snapkvd-compactor.h"
#include "snapkvd-control.h"
#include "snapkvd-device.h"
#include "snapkvd-dispatch.h"
#include "snapkvd-http.h"
#include "snapkvd-group.h"
#include "snapkvd-job.h"
#include "snapkvd-ledger.h"
#include "snapkvd-listener.h"
#include "snapkvd-log.h"
#include "snapkvd-pool.h"
#include "snapkvd-runner.h"
#include "snapkvd-session.h"

#define RING_BUDGET 64 /* SQEs taken from one session per round */

/* ------------------------------------------------------------ loop hooks */

static void reap_jobs(struct snapkvd_server *srv)
{
	struct snapkvd_job *j = snapkvd_compactor_reap(srv->compactor);

	while (j) {
		struct snapkvd_job *n = j->next;

		snapkvd_dispatch_job_done(j);
		j = n;
	}
}

static unsigned on_round(void *data, bool *ret_spin)
{
	struct snapkvd_server *srv = data;
	unsigned work = 0;
	bool rings = false;

	for (struct snapkvd_session *s = srv->sessions, *n; s; s = n) {
		n = s->next;
		if (s->closing || !s->ring)
			continue;
		rings = true;
		work += snapkvd_dispatch_poll_ring(s, RING_BUDGET);
	}
	reap_jobs(srv);
	/* one slice of a ledger page being built: between two slices, the
	 * rings and completions above */
	work += snapkvd_adminq_run(srv->adminq, srv);
	/* pool changes of this round (commits, frees, closed sessions) */
	snapkvd_policy_pool_changed(&srv->policy, snapkvd_pool_used(srv->pool),
				    snapkvd_pool_total(srv->pool));
	for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
		snapkvd_session_flush_cq(s);
	if (srv->draining && snapkvd_compactor_pending(srv->compactor) == 0)
		snapkvd_loop_stop(srv->loop);
	*ret_spin = rings;
	return work;
}

static bool before_sleep(void *data)
{
	struct snapkvd_server *srv = data;
	bool arrived = false;

	for (struct snapkvd_session *s = srv->sessions, *n; s; s = n) {
		n = s->next;
		if (snapkvd_session_prepare_sleep(s))
			arrived = true;
	}
	return arrived;
}

static void after_sleep(void *data)
{
	struct snapkvd_server *srv = data;

	for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
		snapkvd_session_wake(s);
}

static void set_hooks(struct snapkvd_server *srv)
{
	const struct snapkvd_loop_hooks h = {
	    .data = srv,
	    .round = on_round,
	    .before_sleep = before_sleep,
	    .after_sleep = after_sleep,
	};

	snapkvd_loop_set_hooks(srv->loop, &h, (uint64_t)srv->cfg.poll_idle_us * 1000);
}

static void on_connection(void *data, int fd)
{
	struct snapkvd_session *s;

	if (snapkvd_session_new(data, fd, &s) < 0 || snapkvd_control_start(s) < 0)
		log_debug("connection refused");
}

static void on_jobs(void *data, int res)
{
	struct snapkvd_server *srv = data;

	(void)res;
	reap_jobs(srv);
	snapkvd_loop_read(srv->loop, snapkvd_compactor_fd(srv->compactor), &srv->jobsbuf, 8,
			  &srv->ev_jobs);
}

/* ------------------------------------------------------ signals, timer */

static uint64_t tenant_quota(void *data, uid_t uid)
{
	return snapkvd_policy_tenant_quota(data, uid);
}

static void reload(struct snapkvd_server *srv)
{
	struct snapkvd_config c = srv->cfg;
	struct skv_error err = {{0}, -1, -1};
	const char *kept[16];
	size_t n_kept;

	if (!srv->config_path) {
		log_info("SIGHUP: no config file to reload");
		return;
	}
	if (snapkvd_config_load(&c, srv->config_path, &err) < 0) {
		log_error("SIGHUP: keeping the old limits: %s: %s", srv->config_path, err.msg);
		return;
	}
	/* limits only: the keys that need a restart keep their running value */
	n_kept = snapkvd_config_keep_running(&c, &srv->cfg, kept, 16);
	for (size_t i = 0; i < n_kept && i < 16; i++)
		log_warning(
		    "SIGHUP: %s changed in %s: it needs a restart, the running value is kept",
		    kept[i], srv->config_path);
	srv->cfg = c;
	snapkvd_log_max = c.log_level;
	set_hooks(srv);
	snapkvd_pool_set_limits(srv->pool, c.pool_bytes, c.tenant_quota_bytes);
	snapkvd_arena_set_limit(&srv->arenas, c.arena_cache_bytes);
	snapkvd_pool_set_map_limits(srv->pool, c.max_tenant_buffers, c.max_tenant_mapped_bytes,
				    c.max_mapped_bytes);
	if (snapkvd_policy_reconfigure(&srv->policy, &c.policy, &err) < 0)
		log_error("SIGHUP: keeping the old pressure policy: %s", err.msg);
	/* per-tenant quotas (tenant_quota = UID:BYTES) of tenants already known */
	snapkvd_pool_requota(srv->pool, tenant_quota, &srv->policy);
	log_notice("SIGHUP: limits reloaded (pool %llu bytes)", (unsigned long long)c.pool_bytes);
}

static void on_signal(void *data, int res)
{
	struct snapkvd_server *srv = data;

	if (res >= (int)sizeof(struct signalfd_siginfo)) {
		const struct signalfd_siginfo *si = (const struct signalfd_siginfo *)srv->sigbuf;

		if (si->ssi_signo == SIGHUP) {
			sd_notify(0, "RELOADING=1");
			reload(srv);
			sd_notify(0, "READY=1");
		} else if (!srv->draining) {
			log_notice("%s: draining %u in-flight compactions",
				   strsignal(si->ssi_signo),
				   snapkvd_compactor_pending(srv->compactor));
			sd_notify(0, "STOPPING=1");
			srv->draining = true;
		}
	}
	snapkvd_loop_read(srv->loop, srv->signal_fd, srv->sigbuf, sizeof(srv->sigbuf),
			  &srv->ev_signal);
}

static void on_timer(void *data, int res)
{
	struct snapkvd_server *srv = data;
	uint64_t now = snapkvd_now_ns();

	(void)res;
	if (srv->watchdog)
		sd_notify(0, "WATCHDOG=1");
	for (struct snapkvd_session *s = srv->sessions, *n; s; s = n) {
		n = s->next;
		snapkvd_session_check_hello(s, now);
	}
	/* decision groups past their deadline, with a member gone, or all of
	 * them when stopping: their parked members fail */
	snapkvd_compactor_finish(srv->compactor,
				 snapkvd_groups_sweep(srv->groups, now, srv->draining));
	snapkvd_policy_tick(&srv->policy, now);
	snapkvd_http_tick(srv->http, now);
	for (int i = 0; i < SNAPKVD_FLOOD_N; i++)
		snapkvd_log_cause_flush(&srv->floods[i], now, false);
	if (now - srv->last_status_ns > 1000000000ull) {
		srv->last_status_ns = now;
		sd_notifyf(0, "STATUS=%u sessions, pool %llu/%llu bytes, %llu compactions",
			   srv->n_sessions, (unsigned long long)snapkvd_pool_used(srv->pool),
			   (unsigned long long)snapkvd_pool_total(srv->pool),
			   (unsigned long long)srv->compactions);
	}
	snapkvd_loop_read(srv->loop, srv->timer_fd, &srv->timerbuf, 8, &srv->ev_timer);
}

void snapkvd_server_signals(sigset_t *ret)
{
	sigemptyset(ret);
	sigaddset(ret, SIGTERM);
	sigaddset(ret, SIGINT);
	sigaddset(ret, SIGHUP);
}

/* signalfd (the signals were blocked by main before any thread existed),
 * the housekeeping timer (faster when the watchdog needs it) and the
 * compactor's eventfd, each read by the loop. */
static int arm_fds(struct snapkvd_server *srv)
{
	unsigned period_ms = srv->cfg.watchdog_ms;
	uint64_t wd_usec = 0;
	struct itimerspec its;
	sigset_t mask;

	snapkvd_server_signals(&mask);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	srv->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC);
	srv->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
	if (srv->signal_fd < 0 || srv->timer_fd < 0)
		return log_error_errno(-errno, "Failed to create signalfd/timerfd/eventfd");
	if (sd_watchdog_enabled(0, &wd_usec) > 0) {
		srv->watchdog = true;
		if (wd_usec / 2000 < period_ms)
			period_ms = wd_usec / 2000 ? wd_usec / 2000 : 1;
	}
	its.it_interval.tv_sec = period_ms / 1000;
	its.it_interval.tv_nsec = (period_ms % 1000) * 1000000L;
	its.it_value = its.it_interval;
	timerfd_settime(srv->timer_fd, 0, &its, NULL);
	srv->ev_signal = (struct snapkvd_loop_ev){.fn = on_signal, .data = srv};
	srv->ev_timer = (struct snapkvd_loop_ev){.fn = on_timer, .data = srv};
	srv->ev_jobs = (struct snapkvd_loop_ev){.fn = on_jobs, .data = srv};
	if (snapkvd_loop_read(srv->loop, srv->signal_fd, srv->sigbuf, sizeof(srv->sigbuf),
			      &srv->ev_signal) ||
	    snapkvd_loop_read(srv->loop, srv->timer_fd, &srv->timerbuf, 8, &srv->ev_timer) ||
	    snapkvd_loop_read(srv->loop, snapkvd_compactor_fd(srv->compactor), &srv->jobsbuf, 8,
			      &srv->ev_jobs))
		return -EBUSY;
	return 0;
}

/* ------------------------------------------------- pressure policy actions */

static void cb_notify(void *opaque, const struct snapkvd_pressure_change *ch)
{
	struct snapkvd_server *srv = opaque;
	unsigned sent = 0, missed = 0;

	for (struct snapkvd_session *s = srv->sessions; s; s = s->next) {
		int r = snapkvd_session_post_pressure(s, (int)ch->transition.level,
						      ch->suggested_capacity, ch->scale_permille,
						      ch->transition.used_bytes);

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

/*
 * Lingering caches, oldest first, until `need` bytes are freed: the tally's
 * LRU holds only them, so an eviction costs what it frees, never a walk
 * over every cache (which every pool change under pressure paid before).
 */
static uint64_t cb_evict(void *opaque, uint64_t need, uint64_t *ret_caches)
{
	struct snapkvd_server *srv = opaque;
	struct snapkvd_session *s = NULL;
	struct snapkvd_cache *c;
	uint64_t freed = 0, now = snapkvd_now_ns();

	*ret_caches = 0;
	while (freed < need && (c = snapkvd_tally_oldest(&srv->tally, &s))) {
		log_info("evicting lingering cache %llu of session %llu (%llu bytes, idle %.1f s)",
			 (unsigned long long)c->id, (unsigned long long)s->id,
			 (unsigned long long)c->region_bytes, (double)(now - c->last_use_ns) / 1e9);
		freed += c->region_bytes;
		snapkvd_session_drop_cache(s, c);
		(*ret_caches)++;
	}
	if (freed)
		snapkvd_policy_pool_changed(&srv->policy, snapkvd_pool_used(srv->pool),
					    snapkvd_pool_total(srv->pool));
	return freed;
}

static char *cb_ledger_json(void *opaque)
{
	struct snapkvd_server *srv = opaque;

	return snapkvd_ledger_json(
	    srv, snapkvd_pressure_level_name(snapkvd_pressure_level(srv->policy.pressure)),
	    srv->policy.cfg.hook_ledger_max_caches);
}

/* A running hook's pidfd, polled by the loop. */
struct hook_watch {
	struct snapkvd_loop_ev ev;
	struct snapkvd_server *srv;
	struct snapkvd_hook *hook;
};

static void on_hook(void *data, int res)
{
	struct hook_watch *w = data;
	int r;

	(void)res;
	r = snapkvd_policy_hook_exited(&w->srv->policy, w->hook);
	if (r == -EAGAIN) {
		if (snapkvd_loop_poll(w->srv->loop, snapkvd_hook_pidfd(w->hook), &w->ev) == 0)
			return;
		/* cannot watch it any more: the timer's timeout check kills it
		 * and snapkvd_policy_fini() reaps it */
		log_warning("pressure hook %s: lost its pidfd watch", snapkvd_hook_path(w->hook));
		snapkvd_hook_set_user(w->hook, NULL);
	}
	free(w);
}

static int cb_watch_hook(void *opaque, struct snapkvd_hook *h)
{
	struct snapkvd_server *srv = opaque;
	struct hook_watch *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return -ENOMEM;
	*w = (struct hook_watch){.ev = {.fn = on_hook, .data = w}, .srv = srv, .hook = h};
	r = snapkvd_loop_poll(srv->loop, snapkvd_hook_pidfd(h), &w->ev);
	if (r < 0) {
		free(w);
		return r;
	}
	snapkvd_hook_set_user(h, w);
	return 0;
}

static char *cb_metrics_text(void *opaque)
{
	return snapkvd_admin_metrics_text(opaque, SNAPKVD_METRICS_TENANTS_ALL);
}

/* The HTTP listener asks for no credentials: per-tenant series only as
 * metrics_http_tenants allows. */
static char *cb_http_metrics_text(void *opaque)
{
	struct snapkvd_server *srv = opaque;

	return snapkvd_admin_metrics_text(srv, (enum snapkvd_metrics_tenants)srv->cfg.http.tenants);
}

static void cb_log(void *opaque, int level, const char *msg)
{
	(void)opaque;
	if (level <= snapkvd_log_max)
		snapkvd_log(level, 0, "%s", msg);
}

static uint64_t realtime_ns(void *opaque)
{
	(void)opaque;
	return snapkvd_realtime_ns();
}

static bool cb_healthy(void *opaque)
{
	return !((struct snapkvd_server *)opaque)->draining;
}

/* The Prometheus listener, when metrics_listen is set: the same text. */
static int http_init(struct snapkvd_server *srv)
{
	const struct snapkvd_http_cb cb = {
	    .data = srv, .metrics = cb_http_metrics_text, .healthy = cb_healthy};

	if (!srv->cfg.http.listen[0])
		return 0;
	return snapkvd_http_new(srv->loop, &srv->cfg.http, &cb, &srv->http);
}

/* Pressure at high or critical: no arena pages kept for reuse. */
static uint64_t cb_level(void *opaque, enum snapkvd_pressure_level level)
{
	struct snapkvd_arena_set *set = &((struct snapkvd_server *)opaque)->arenas;
	uint64_t before = set->trimmed;

	snapkvd_arena_set_pressure(set, level >= SNAPKVD_PRESSURE_HIGH);
	return set->trimmed - before;
}

static int policy_init(struct snapkvd_server *srv)
{
	const struct snapkvd_policy_cb cb = {
	    .opaque = srv,
	    .notify = cb_notify,
	    .evict = cb_evict,
	    .level = cb_level,
	    .ledger_json = cb_ledger_json,
	    .watch_hook = cb_watch_hook,
	    .metrics_text = cb_metrics_text,
	    .log = cb_log,
	};
	int r = snapkvd_policy_init(&srv->policy, &srv->cfg.policy, &cb, realtime_ns, NULL);

	if (r < 0)
		return log_error_errno(r, "Failed to set up the pressure policy");
	if (srv->cfg.policy.hook_dir[0])
		log_info("pressure hooks from %s (timeout %u ms)", srv->cfg.policy.hook_dir,
			 srv->cfg.policy.hooks.timeout_ms);
	if (srv->cfg.policy.metrics_textfile[0])
		log_info("metrics textfile %s every %u s", srv->cfg.policy.metrics_textfile,
			 srv->cfg.policy.metrics_interval_s);
	return 0;
}

/* The loop is gone by now: the hooks' poll records can go with them. */
static void policy_fini(struct snapkvd_server *srv)
{
	for (size_t i = 0; i < srv->policy.n_hooks; i++)
		free(snapkvd_hook_user(srv->policy.hooks[i]));
	snapkvd_policy_fini(&srv->policy);
}

/* ---------------------------------------------------------- construction */

static int start_workers(struct snapkvd_server *srv)
{
	struct skv_error kerr = {.msg = "", .layer = -1, .head = -1};
	int r = snapkvd_device_new(srv->cfg.backend, srv->cfg.devices, srv->cfg.n_devices,
				   &srv->device, &kerr);

	if (r == 0)
		r = snapkvd_runner_new(srv->device, &srv->runner, &kerr);
	if (r < 0) {
		log_error("%s", kerr.msg[0] ? kerr.msg : "Failed to set up the backend");
		return r;
	}
	r = snapkvd_groups_new(&srv->groups);
	if (r < 0)
		return log_error_errno(r, "Failed to start");
	r = snapkvd_compactor_new(srv->runner, srv->cfg.threads, srv->cfg.workers, &kerr,
				  &srv->compactor);
	if (r < 0 && kerr.msg[0])
		return log_error_errno(r, "Failed to start the compactor: %s", kerr.msg);
	if (r < 0)
		return log_error_errno(r, "Failed to start the compactor");
	snapkvd_compactor_set_groups(srv->compactor, srv->groups);
	return 0;
}

int snapkvd_server_new(const struct snapkvd_config *cfg, const char *config_path,
		       struct snapkvd_server **ret)
{
	struct snapkvd_server *srv = calloc(1, sizeof(*srv));
	int r;

	if (!srv)
		return log_error_errno(-ENOMEM, "Failed to start");
	srv->cfg = *cfg;
	srv->config_path = config_path;
	srv->signal_fd = srv->timer_fd = -1;
	srv->start_ns = snapkvd_now_ns();
	srv->arenas.limit = cfg->arena_cache_bytes;
	snapkvd_log_max = cfg->log_level;
	srv->floods[SNAPKVD_FLOOD_NO_SESSION] = (struct snapkvd_log_cause){
	    .what = "connections closed before they held a session", .level = SNAPKVD_LOG_INFO};
	srv->floods[SNAPKVD_FLOOD_REFUSED] =
	    (struct snapkvd_log_cause){.what = "HELLOs refused", .level = SNAPKVD_LOG_NOTICE};
	srv->floods[SNAPKVD_FLOOD_BAD_FRAME] = (struct snapkvd_log_cause){
	    .what = "sessions closed for a bad frame", .level = SNAPKVD_LOG_NOTICE};
	r = snapkvd_pool_new(cfg->pool_bytes, cfg->tenant_quota_bytes, &srv->pool);
	if (r < 0) {
		log_error_errno(r, "Failed to set up the pool");
		goto fail;
	}
	snapkvd_pool_set_map_limits(srv->pool, cfg->max_tenant_buffers,
				    cfg->max_tenant_mapped_bytes, cfg->max_mapped_bytes);
	if ((r = start_workers(srv)) < 0)
		goto fail;
	if ((r = snapkvd_adminq_new(&srv->adminq)) < 0) {
		log_error_errno(r, "Failed to start");
		goto fail;
	}
	r = snapkvd_loop_new(512, &srv->loop);
	if (r < 0) {
		log_error_errno(r, "Failed to set up io_uring");
		goto fail;
	}
	set_hooks(srv);
	if ((r = snapkvd_listener_new(srv->loop, cfg->socket_path, on_connection, srv,
				      &srv->listener)) < 0 ||
	    (r = http_init(srv)) < 0 || (r = arm_fds(srv)) < 0)
		goto fail;
	srv->start_realtime_s = (double)time(NULL);
	if ((r = policy_init(srv)) < 0)
		goto fail;
	log_info("backend %s (%s), %u workers x %u threads, pool %llu bytes, ring %u entries x "
		 "%u-byte slots",
		 cfg->backend, snapkvd_compactor_isa(srv->compactor),
		 snapkvd_compactor_workers(srv->compactor),
		 snapkvd_compactor_threads(srv->compactor), (unsigned long long)cfg->pool_bytes,
		 cfg->sq_entries, cfg->slot_bytes);
	*ret = srv;
	return 0;
fail:
	snapkvd_server_free(srv);
	return r;
}

int snapkvd_server_run(struct snapkvd_server *srv)
{
	int r;

	sd_notifyf(0, "READY=1\nSTATUS=listening\nMAINPID=%d", (int)getpid());
	r = snapkvd_loop_run(srv->loop);
	if (r < 0)
		log_error_errno(r, "io_uring wait failed");
	sd_notify(0, "STOPPING=1");
	return r;
}

/* Every session closed and freed. Engines may still be reading caches they
 * were answered for during the drain: exiting must not zero them. */
static void free_sessions(struct snapkvd_server *srv)
{
	struct snapkvd_session *s, *n;

	for (s = srv->sessions; s; s = s->next) {
		if (s->arena)
			s->arena->keep_pages = true;
		if (!s->closing)
			snapkvd_session_close(s, 0);
	}
	for (s = srv->sessions; s; s = n) {
		n = s->next;
		s->refs = 1;
		snapkvd_session_unref(s);
	}
}

/*
 * The order matters: the workers stop first (every job done), then the
 * io_uring goes (no armed op can complete into freed memory), the policy
 * (its hooks' poll records), the sessions (which drop their CUDA imports
 * and GPU arenas: before the plugin goes), the listening sockets (metrics
 * connections too) and the fds, the runner, the device (the plugin), the
 * pool last.
 */
void snapkvd_server_free(struct snapkvd_server *srv)
{
	if (!srv)
		return;
	snapkvd_compactor_free(srv->compactor);
	snapkvd_loop_free(srv->loop);
	policy_fini(srv);
	snapkvd_adminq_free(srv->adminq); /* before the sessions its answers name */
	free_sessions(srv);
	snapkvd_groups_free(srv->groups);
	snapkvd_listener_free(srv->listener);
	snapkvd_http_free(srv->http);
	if (srv->signal_fd >= 0)
		close(srv->signal_fd);
	if (srv->timer_fd >= 0)
		close(srv->timer_fd);
	snapkvd_runner_free(srv->runner);
	snapkvd_device_free(srv->device);
	snapkvd_tally_fini(&srv->tally);
	snapkvd_pool_free(srv->pool);
	/* what the last interval counted, sessions closed at shutdown too */
	for (int i = 0; i < SNAPKVD_FLOOD_N; i++)
		snapkvd_log_cause_flush(&srv->floods[i], snapkvd_now_ns(), true);
	free(srv);
}
