// SPDX-License-Identifier: MIT
/*
 * snapkvd-policy.c - the pressure policy runner: actions in order, hook bookkeeping, histograms,
 * textfile. See snapkvd-policy.h.
 */
#include "snapkvd-policy.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TEXTFILE_WARN_NS (600ull * 1000000000ull) /* a failing textfile: 10 min */

static void logf_(struct snapkvd_policy *ops, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logf_(struct snapkvd_policy *ops, int level, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;

	if (!ops->cb.log)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	ops->cb.log(ops->cb.opaque, level, buf);
}

/* Where hooks find the ledger snapshot when the config names no path. */
static void default_ledger_path(struct snapkvd_policy_config *c)
{
	const char *rt = getenv("RUNTIME_DIRECTORY");

	if (c->hook_ledger_json[0])
		return;
	if (rt && *rt == '/' && strlen(rt) + 32 < sizeof(c->hook_ledger_json))
		snprintf(c->hook_ledger_json, sizeof(c->hook_ledger_json), "%s/snapkvd-ledger.json",
			 rt);
	else
		snprintf(c->hook_ledger_json, sizeof(c->hook_ledger_json),
			 "/tmp/snapkvd-ledger-%d.json", (int)getpid());
}

int snapkvd_policy_init(struct snapkvd_policy *ops, const struct snapkvd_policy_config *cfg,
			const struct snapkvd_policy_cb *cb, snapkvd_clock_fn clock,
			void *clock_opaque)
{
	int r;

	memset(ops, 0, sizeof(*ops));
	r = snapkvd_policy_config_check(cfg, NULL);
	if (r < 0)
		return r;
	ops->cfg = *cfg;
	default_ledger_path(&ops->cfg);
	if (cb)
		ops->cb = *cb;
	r = snapkvd_pressure_new(&ops->cfg.pressure, clock, clock_opaque, &ops->pressure);
	if (r < 0)
		return r;
	pthread_mutex_init(&ops->mu, NULL);
	snapkvd_histogram_init_seconds(&ops->compaction_seconds);
	snapkvd_histogram_init_mass(&ops->retained_mass);
	for (int m = 0; m < SNAPKVD_BUDGET_MODES; m++)
		snapkvd_histogram_init_fraction(&ops->kept_fraction[m]);
	return 0;
}

void snapkvd_policy_fini(struct snapkvd_policy *ops)
{
	if (!ops->pressure)
		return;
	snapkvd_hooks_free(ops->hooks, ops->n_hooks);
	ops->hooks = NULL;
	ops->n_hooks = ops->cap_hooks = 0;
	snapkvd_pressure_free(ops->pressure);
	ops->pressure = NULL;
	pthread_mutex_destroy(&ops->mu);
}

/* snapkvd_pressure_set_config() with its reason in err. */
static int set_pressure_config(struct snapkvd_policy *ops, const struct snapkvd_pressure_config *pc,
			       struct skv_error *err)
{
	char why[sizeof(err->msg)] = "";
	int r = snapkvd_pressure_set_config(ops->pressure, pc, why, sizeof(why));

	if (r < 0)
		snapkvd_value_fail(err, "%s", why);
	return r;
}

int snapkvd_policy_reconfigure(struct snapkvd_policy *ops, const struct snapkvd_policy_config *cfg,
			       struct skv_error *err)
{
	struct snapkvd_policy_config c = *cfg;
	int r;

	default_ledger_path(&c);
	r = set_pressure_config(ops, &c.pressure, err);
	if (r < 0)
		return r;
	ops->cfg = c;
	ops->next_textfile_ns = 0;
	ops->dirty = 1;
	snapkvd_policy_pool_changed(ops, ops->used, ops->total);
	return 0;
}

int snapkvd_policy_set_pressure(struct snapkvd_policy *ops,
				const struct snapkvd_pressure_config *pc, struct skv_error *err)
{
	int r = set_pressure_config(ops, pc, err);

	if (r < 0)
		return r;
	ops->cfg.pressure = *pc;
	ops->dirty = 1;
	snapkvd_policy_pool_changed(ops, ops->used, ops->total);
	return 0;
}

static void run_hooks(struct snapkvd_policy *ops, const struct snapkvd_pressure_change *ch)
{
	struct snapkvd_hooks_config hc = ops->cfg.hooks;
	struct snapkvd_hook_event ev = {
	    .event = "pressure",
	    .level = snapkvd_pressure_level_name(ch->transition.level),
	    .prev_level = snapkvd_pressure_level_name(ch->transition.prev),
	    .pool_used_bytes = ch->transition.used_bytes,
	    .pool_total_bytes = ch->transition.total_bytes,
	    .suggested_capacity = ch->suggested_capacity,
	};
	struct snapkvd_hook **started = NULL;
	size_t failed = 0, limit;
	char *json;
	int n, r;

	if (!ops->cfg.hook_dir[0])
		return;
	hc.dir = ops->cfg.hook_dir;
	/* Hooks of earlier events still running count against the limit, so a
	 * flapping level cannot pile up processes. */
	limit = 2 * (size_t)(hc.max_hooks ? hc.max_hooks : SNAPKVD_HOOKS_MAX_DEFAULT);
	if (ops->n_hooks >= limit) {
		logf_(ops, SNAPKVD_POLICY_LOG_WARNING,
		      "pressure hooks: %zu still running, not starting more for %s -> %s",
		      ops->n_hooks, ev.prev_level, ev.level);
		return;
	}
	json = ops->cb.ledger_json ? ops->cb.ledger_json(ops->cb.opaque) : NULL;
	if (json) {
		r = snapkvd_atomic_write(ops->cfg.hook_ledger_json, json, strlen(json), 0640);
		if (r < 0)
			logf_(ops, SNAPKVD_POLICY_LOG_WARNING, "pressure hooks: writing %s: %s",
			      ops->cfg.hook_ledger_json, strerror(-r));
		else
			ev.ledger_json = ops->cfg.hook_ledger_json;
		free(json);
	}
	n = snapkvd_hooks_run(&hc, &ev, 0, &started, &failed);
	if (n < 0) {
		logf_(ops, SNAPKVD_POLICY_LOG_WARNING, "pressure hooks: listing %s: %s", hc.dir,
		      strerror(-n));
		return;
	}
	ops->hooks_failed += failed;
	if (failed)
		logf_(ops, SNAPKVD_POLICY_LOG_WARNING, "pressure hooks: %zu of %s failed to start",
		      failed, hc.dir);
	for (int i = 0; i < n; i++) {
		struct snapkvd_hook *h = started[i];

		if (ops->n_hooks == ops->cap_hooks) {
			size_t nc = ops->cap_hooks ? ops->cap_hooks * 2 : 8;
			struct snapkvd_hook **nh = realloc(ops->hooks, nc * sizeof(*nh));

			if (!nh) {
				snapkvd_hook_free(h);
				ops->hooks_failed++;
				continue;
			}
			ops->hooks = nh;
			ops->cap_hooks = nc;
		}
		if (ops->cb.watch_hook && ops->cb.watch_hook(ops->cb.opaque, h) != 0) {
			logf_(ops, SNAPKVD_POLICY_LOG_WARNING,
			      "pressure hook %s: cannot watch it, killed", snapkvd_hook_path(h));
			snapkvd_hook_free(h);
			ops->hooks_failed++;
			continue;
		}
		ops->hooks[ops->n_hooks++] = h;
		ops->hooks_started++;
		logf_(ops, SNAPKVD_POLICY_LOG_INFO, "pressure hook %s started (pid %d)",
		      snapkvd_hook_path(h), (int)snapkvd_hook_pid(h));
	}
	free(started);
}

static void do_evict(struct snapkvd_policy *ops, uint64_t need)
{
	uint64_t caches = 0, freed;

	if (!need || !ops->cb.evict)
		return;
	freed = ops->cb.evict(ops->cb.opaque, need, &caches);
	if (caches || freed) {
		ops->evictions += caches;
		ops->evicted_bytes += freed;
		logf_(ops, SNAPKVD_POLICY_LOG_NOTICE,
		      "pressure: evicted %" PRIu64 " lingering caches, %" PRIu64
		      " bytes (wanted %" PRIu64 ")",
		      caches, freed, need);
	}
}

static void run_actions(struct snapkvd_policy *ops, const struct snapkvd_pressure_change *ch)
{
	const struct snapkvd_pressure_transition *t = &ch->transition;

	logf_(ops, t->level > t->prev ? SNAPKVD_POLICY_LOG_WARNING : SNAPKVD_POLICY_LOG_NOTICE,
	      "pressure %s -> %s: pool %" PRIu64 " of %" PRIu64 " bytes (%.1f%%)",
	      snapkvd_pressure_level_name(t->prev), snapkvd_pressure_level_name(t->level),
	      t->used_bytes, t->total_bytes,
	      t->total_bytes ? 100.0 * (double)t->used_bytes / (double)t->total_bytes : 0.0);
	if (ops->cb.level) {
		uint64_t punched = ops->cb.level(ops->cb.opaque, t->level);

		if (punched)
			logf_(ops, SNAPKVD_POLICY_LOG_INFO,
			      "pressure: %" PRIu64 " cached arena bytes given back", punched);
	}
	for (unsigned i = 0; i < ch->n_actions; i++) {
		switch (ch->actions[i]) {
		case SNAPKVD_ACTION_NOTIFY:
			if (ops->cb.notify)
				ops->cb.notify(ops->cb.opaque, ch);
			break;
		case SNAPKVD_ACTION_HOOKS:
			run_hooks(ops, ch);
			break;
		case SNAPKVD_ACTION_SCALE:
			logf_(ops, SNAPKVD_POLICY_LOG_INFO,
			      "pressure: new requests get C x%.3f (default %u -> %u)",
			      ch->scale_permille / 1000.0, ops->cfg.pressure.default_capacity,
			      ch->suggested_capacity);
			break;
		case SNAPKVD_ACTION_EVICT:
			/* Recomputed: an earlier action may have changed the pool. */
			do_evict(ops,
				 snapkvd_pressure_evict_need(ops->pressure, ops->used, ops->total));
			break;
		case SNAPKVD_ACTION_REFUSE:
			logf_(ops, SNAPKVD_POLICY_LOG_WARNING,
			      "pressure critical: refusing new compactions beyond each tenant's "
			      "guaranteed share (default %.1f%%)",
			      ops->cfg.pressure.guaranteed_share * 100.0);
			break;
		default:
			break;
		}
	}
}

int snapkvd_policy_pool_changed(struct snapkvd_policy *ops, uint64_t used, uint64_t total)
{
	struct snapkvd_pressure_change ch;
	int changed = 0;

	if (!ops->in_actions && ops->evaluated && !ops->dirty && used == ops->used &&
	    total == ops->total)
		return 0;
	ops->used = used;
	ops->total = total;
	if (ops->in_actions) {
		ops->again = 1;
		return 0;
	}
	ops->evaluated = 1;
	ops->dirty = 0;
	ops->in_actions = 1;
	do {
		ops->again = 0;
		if (snapkvd_pressure_update(ops->pressure, ops->used, ops->total, &ch) == 1) {
			changed = 1;
			run_actions(ops, &ch);
		} else {
			/* Still under pressure: keep evicting what lingers (new
			 * releases with linger arrive while the level holds). */
			do_evict(ops,
				 snapkvd_pressure_evict_need(ops->pressure, ops->used, ops->total));
		}
	} while (ops->again);
	ops->in_actions = 0;
	return changed;
}

void snapkvd_policy_mark_dirty(struct snapkvd_policy *ops)
{
	ops->dirty = 1;
}

int snapkvd_policy_admit(struct snapkvd_policy *ops, uid_t uid, uint64_t tenant_used,
			 uint64_t request, char *msg, size_t msg_len)
{
	const struct snapkvd_tenant_quota *q = snapkvd_policy_config_quota(&ops->cfg, uid);
	int r = snapkvd_pressure_admit(ops->pressure, tenant_used, request, ops->total,
				       q ? q->guaranteed_share : -1.0, msg, msg_len);

	if (r < 0)
		ops->refusals++;
	return r;
}

uint32_t snapkvd_policy_scale_capacity(struct snapkvd_policy *ops, uint32_t capacity,
				       uint32_t window, int *ret_scaled)
{
	int scaled = 0;
	uint32_t c = snapkvd_pressure_scale_capacity(ops->pressure, capacity, window, &scaled);

	if (scaled)
		ops->scaled++;
	if (ret_scaled)
		*ret_scaled = scaled;
	return c;
}

void snapkvd_policy_count_scaled(struct snapkvd_policy *ops)
{
	ops->scaled++;
}

int snapkvd_policy_greeting(const struct snapkvd_policy *ops,
			    enum snapkvd_pressure_level *ret_level, uint32_t *ret_capacity,
			    uint32_t *ret_permille, uint64_t *ret_used)
{
	const struct snapkvd_pressure_config *pc = snapkvd_pressure_get_config(ops->pressure);
	enum snapkvd_pressure_level lv = snapkvd_pressure_level(ops->pressure);
	int scale = snapkvd_pressure_action_enabled(ops->pressure, SNAPKVD_ACTION_SCALE);
	double f = !scale			     ? 1.0
		   : lv == SNAPKVD_PRESSURE_CRITICAL ? pc->scale_critical
		   : lv == SNAPKVD_PRESSURE_HIGH     ? pc->scale_high
						     : 1.0;

	if (lv == SNAPKVD_PRESSURE_NORMAL ||
	    !snapkvd_pressure_action_enabled(ops->pressure, SNAPKVD_ACTION_NOTIFY))
		return 0;
	*ret_level = lv;
	*ret_capacity = snapkvd_pressure_scale_capacity(ops->pressure, pc->default_capacity,
							pc->default_window, NULL);
	*ret_permille = (uint32_t)lround(f * 1000.0);
	*ret_used = ops->used;
	return 1;
}

uint64_t snapkvd_policy_tenant_quota(const struct snapkvd_policy *ops, uid_t uid)
{
	const struct snapkvd_tenant_quota *q = snapkvd_policy_config_quota(&ops->cfg, uid);

	return q ? q->quota_bytes : 0;
}

static const char *base(const char *p)
{
	const char *s = strrchr(p, '/');

	return s ? s + 1 : p;
}

int snapkvd_policy_hook_exited(struct snapkvd_policy *ops, struct snapkvd_hook *h)
{
	struct snapkvd_hook_result res;
	size_t i;
	int r;

	for (i = 0; i < ops->n_hooks; i++)
		if (ops->hooks[i] == h)
			break;
	if (i == ops->n_hooks)
		return -ENOENT;
	r = snapkvd_hook_reap(h, &res);
	if (r < 0)
		return r;
	if (res.timed_out)
		ops->hooks_timed_out++;
	if (!res.exited || res.status != 0)
		ops->hooks_failed++;
	{
		/* One log line: output with newlines folded, already bounded. */
		char out[1024];
		size_t o = 0;

		for (size_t k = 0; k < res.output_len && o + 4 < sizeof(out); k++) {
			char c = res.output[k];

			if (c == '\n') {
				if (k + 1 == res.output_len)
					break;
				out[o++] = ' ';
				out[o++] = '|';
				out[o++] = ' ';
			} else {
				out[o++] = (c >= 32 && c < 127) ? c : '?';
			}
		}
		out[o] = '\0';
		if (res.exited)
			logf_(ops,
			      res.status ? SNAPKVD_POLICY_LOG_WARNING : SNAPKVD_POLICY_LOG_INFO,
			      "pressure hook %s exited %d after %" PRIu64 " ms%s%s%s",
			      base(snapkvd_hook_path(h)), res.status, res.duration_ns / 1000000,
			      o ? ": " : "", out, res.output_dropped ? " [output truncated]" : "");
		else
			logf_(ops, SNAPKVD_POLICY_LOG_WARNING,
			      "pressure hook %s %s by signal %d after %" PRIu64 " ms%s%s",
			      base(snapkvd_hook_path(h)),
			      res.timed_out ? "timed out, killed" : "killed", res.status,
			      res.duration_ns / 1000000, o ? ": " : "", out);
	}
	snapkvd_hook_free(h);
	ops->hooks[i] = ops->hooks[--ops->n_hooks];
	return 0;
}

/*
 * Never stop trying, but say a failure once, then at most every
 * TEXTFILE_WARN_NS while the same error repeats (with the count since), and
 * once when it works again: a textfile in a missing directory used to warn
 * every metrics_interval_s.
 */
static void textfile_result(struct snapkvd_policy *ops, int r, uint64_t now_ns)
{
	if (r < 0) {
		ops->textfile_failures++;
		if (r == ops->textfile_err && now_ns - ops->textfile_warned_ns < TEXTFILE_WARN_NS)
			return;
		logf_(ops, SNAPKVD_POLICY_LOG_WARNING,
		      "metrics textfile %s: %s (%llu failed writes; said again in %llu s if it "
		      "still fails)",
		      ops->cfg.metrics_textfile, strerror(-r),
		      (unsigned long long)ops->textfile_failures,
		      (unsigned long long)(TEXTFILE_WARN_NS / 1000000000ull));
		ops->textfile_err = r;
		ops->textfile_warned_ns = now_ns;
	} else if (ops->textfile_err) {
		logf_(ops, SNAPKVD_POLICY_LOG_NOTICE,
		      "metrics textfile %s: written again after %llu failed writes",
		      ops->cfg.metrics_textfile, (unsigned long long)ops->textfile_failures);
		ops->textfile_err = 0;
		ops->textfile_failures = 0;
	}
}

void snapkvd_policy_tick(struct snapkvd_policy *ops, uint64_t now_ns)
{
	/* a downward transition held back by the dwell is looked at again */
	if (snapkvd_pressure_level(ops->pressure) != SNAPKVD_PRESSURE_NORMAL)
		ops->dirty = 1;
	for (size_t i = 0; i < ops->n_hooks; i++) {
		struct snapkvd_hook *h = ops->hooks[i];

		snapkvd_hook_drain(h);
		if (snapkvd_hook_check_timeout(h, now_ns))
			logf_(ops, SNAPKVD_POLICY_LOG_WARNING,
			      "pressure hook %s (pid %d) ran past %u ms: killed",
			      base(snapkvd_hook_path(h)), (int)snapkvd_hook_pid(h),
			      ops->cfg.hooks.timeout_ms);
	}
	if (ops->cfg.metrics_textfile[0] && ops->cb.metrics_text &&
	    now_ns >= ops->next_textfile_ns) {
		char *text = ops->cb.metrics_text(ops->cb.opaque);
		int r =
		    text ? snapkvd_atomic_write(ops->cfg.metrics_textfile, text, strlen(text), 0644)
			 : -ENOMEM;

		textfile_result(ops, r, now_ns);
		free(text);
		ops->next_textfile_ns =
		    now_ns + (uint64_t)ops->cfg.metrics_interval_s * 1000000000ull;
	}
}

void snapkvd_policy_observe_compaction(struct snapkvd_policy *ops, double seconds,
				       const float *mass, size_t n_mass)
{
	pthread_mutex_lock(&ops->mu);
	snapkvd_histogram_observe(&ops->compaction_seconds, seconds);
	for (size_t i = 0; mass && i < n_mass; i++)
		snapkvd_histogram_observe(&ops->retained_mass, (double)mass[i]);
	ops->compactions++;
	pthread_mutex_unlock(&ops->mu);
}

void snapkvd_policy_observe_budget(struct snapkvd_policy *ops, int mode, double kept_fraction,
				   bool fallback)
{
	if (mode < 0 || mode >= SNAPKVD_BUDGET_MODES)
		return;
	pthread_mutex_lock(&ops->mu);
	snapkvd_histogram_observe(&ops->kept_fraction[mode], kept_fraction);
	if (fallback)
		ops->fallbacks++;
	pthread_mutex_unlock(&ops->mu);
}

void snapkvd_policy_count_error(struct snapkvd_policy *ops, int err)
{
	if (err < 0)
		err = -err;
	if (err > 0 && err < SNAPKVD_POLICY_MAX_ERRNO)
		ops->errors_by_errno[err]++;
}

void snapkvd_policy_fill_stats(struct snapkvd_policy *ops, struct snapkvd_stats *st,
			       struct snapkvd_policy_snapshot *snap)
{
	size_t ne = 0;

	st->pressure_level = (int)snapkvd_pressure_level(ops->pressure);
	st->pressure_transitions_total = snapkvd_pressure_transitions_total(ops->pressure);
	st->compactions_scaled_total = ops->scaled;
	st->refusals_total = ops->refusals;
	st->evictions_total = ops->evictions;
	st->evicted_bytes_total = ops->evicted_bytes;
	st->hooks_started_total = ops->hooks_started;
	st->hooks_failed_total = ops->hooks_failed;
	st->hooks_timed_out_total = ops->hooks_timed_out;
	for (int e = 1; e < SNAPKVD_POLICY_MAX_ERRNO; e++) {
		const char *name;

		if (!ops->errors_by_errno[e] || !(name = strerrorname_np(e)))
			continue;
		snap->errors[ne].code = name;
		snap->errors[ne].count = ops->errors_by_errno[e];
		ne++;
	}
	st->n_errors = ne;
	st->errors = snap->errors;
	pthread_mutex_lock(&ops->mu);
	snap->seconds = ops->compaction_seconds;
	snap->mass = ops->retained_mass;
	memcpy(snap->kept_fraction, ops->kept_fraction, sizeof(snap->kept_fraction));
	st->fallbacks_total = ops->fallbacks;
	pthread_mutex_unlock(&ops->mu);
	st->kept_fraction = snap->kept_fraction;
	st->compaction_seconds = &snap->seconds;
	st->retained_mass = &snap->mass;
}
