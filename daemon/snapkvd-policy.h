/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-policy.h - the pressure policy runner: it owns the pressure
 * state machine, the running hooks, the compaction histograms and the
 * operations counters, and runs the policy actions of a level change in
 * their configured order through callbacks into the daemon.
 *
 * The daemon calls, from its loop thread:
 *   snapkvd_policy_pool_changed() after every pool change (reserve, commit,
 *                               cancel, free, resize);
 *   snapkvd_policy_admit() and snapkvd_policy_scale_capacity() for each new
 *                               compaction;
 *   snapkvd_policy_hook_exited()   when a hook's pidfd polls readable;
 *   snapkvd_policy_tick()          from its housekeeping timer (hook output,
 *                               hook timeouts, metrics textfile);
 * and from any thread snapkvd_policy_observe_compaction().
 * Everything daemon-specific (posting events to rings, freeing caches,
 * building the ledger JSON and the metrics) is a callback, so the ordering
 * and bookkeeping are unit-tested without a daemon.
 */
#ifndef SNAPKVD_POLICY_H
#define SNAPKVD_POLICY_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "snapkvd-hooks.h"
#include "snapkvd-metrics.h"
#include "snapkvd-config.h"
#include "snapkvd-pressure.h"

enum snapkvd_policy_log {
	SNAPKVD_POLICY_LOG_ERR = 3,
	SNAPKVD_POLICY_LOG_WARNING = 4,
	SNAPKVD_POLICY_LOG_NOTICE = 5,
	SNAPKVD_POLICY_LOG_INFO = 6,
	SNAPKVD_POLICY_LOG_DEBUG = 7,
};

struct snapkvd_policy_cb {
	void *opaque;
	/* NOTIFY: post a PRESSURE event (level, suggested C) to every engine. */
	void (*notify)(void *opaque, const struct snapkvd_pressure_change *ch);
	/* EVICT: free caches released with linger, LRU first, until at least
	 * `need` bytes are freed or none is left. Returns the bytes freed and
	 * the count in *ret_caches. May call snapkvd_policy_pool_changed(). */
	uint64_t (*evict)(void *opaque, uint64_t need, uint64_t *ret_caches);
	/* The level changed (called before the actions): at high and critical
	 * the daemon punches the arena pages it keeps for reuse and caches no
	 * more until normal. Returns the bytes punched. May be NULL. */
	uint64_t (*level)(void *opaque, enum snapkvd_pressure_level level);
	/* HOOKS: the ledger as JSON (malloc'd, NUL-terminated) or NULL. */
	char *(*ledger_json)(void *opaque);
	/* A hook was started: watch its pidfd. Non-zero: the hook is killed. */
	int (*watch_hook)(void *opaque, struct snapkvd_hook *h);
	/* The metrics exposition for the textfile (malloc'd) or NULL. */
	char *(*metrics_text)(void *opaque);
	/* One log line (the daemon's logger); may be NULL. */
	void (*log)(void *opaque, int level, const char *msg);
};

#define SNAPKVD_POLICY_MAX_ERRNO 160

/* Storage the stats of snapkvd_policy_fill_stats() point into. */
struct snapkvd_policy_snapshot {
	struct snapkvd_histogram seconds, mass, kept_fraction[SNAPKVD_BUDGET_MODES];
	struct snapkvd_stats_error errors[SNAPKVD_POLICY_MAX_ERRNO];
};

struct snapkvd_policy {
	struct snapkvd_policy_config cfg;
	struct snapkvd_policy_cb cb;
	struct snapkvd_pressure *pressure;
	uint64_t used, total; /* last pool state seen */
	int in_actions;	      /* re-entrancy guard: evict frees pool bytes */
	int again;	      /* a pool change arrived while in_actions */
	int evaluated;	      /* used/total above have been looked at */
	int dirty;	      /* re-evaluate even if used/total did not move */
	/* running hooks */
	struct snapkvd_hook **hooks;
	size_t n_hooks, cap_hooks;
	uint64_t next_textfile_ns;
	/* a failing textfile: the last error, when it was last said, how often since */
	int textfile_err;
	uint64_t textfile_warned_ns, textfile_failures;
	/* counters (loop thread) */
	uint64_t hooks_started, hooks_failed, hooks_timed_out;
	uint64_t evictions, evicted_bytes, refusals, scaled;
	uint64_t errors_by_errno[SNAPKVD_POLICY_MAX_ERRNO];
	/* histograms (any thread, under mu) */
	pthread_mutex_t mu;
	struct snapkvd_histogram compaction_seconds, retained_mass;
	struct snapkvd_histogram kept_fraction[SNAPKVD_BUDGET_MODES];
	uint64_t compactions, fallbacks;
};

/* clock: for transition timestamps (NULL: CLOCK_REALTIME). 0, -EINVAL, -ENOMEM. */
int snapkvd_policy_init(struct snapkvd_policy *ops, const struct snapkvd_policy_config *cfg,
			const struct snapkvd_policy_cb *cb, snapkvd_clock_fn clock,
			void *clock_opaque);
/* Kills and reaps running hooks, frees everything. Safe on a zeroed struct. */
void snapkvd_policy_fini(struct snapkvd_policy *ops);

/* SIGHUP: new config (the level is kept, re-evaluated against the new
 * marks at once). 0 or -EINVAL with a reason in err (may be NULL; the old
 * config kept). */
int snapkvd_policy_reconfigure(struct snapkvd_policy *ops, const struct snapkvd_policy_config *cfg,
			       struct skv_error *err);
/* `snapkvctl pressure set`: replace only the pressure part; the same. */
int snapkvd_policy_set_pressure(struct snapkvd_policy *ops,
				const struct snapkvd_pressure_config *pc, struct skv_error *err);

/* Evaluate pressure; on a change run the actions in order. Returns 1 when
 * the level changed, 0 otherwise. Cheap when nothing moved since the last
 * call (the loop may call it every round): it returns at once unless used,
 * total or snapkvd_policy_mark_dirty() say otherwise. */
int snapkvd_policy_pool_changed(struct snapkvd_policy *ops, uint64_t used, uint64_t total);
/* Something eviction cares about changed without a pool change (a cache
 * started lingering): the next snapkvd_policy_pool_changed() looks again. */
void snapkvd_policy_mark_dirty(struct snapkvd_policy *ops);

/* Admission of a new compaction (see snapkvd_pressure_admit); the
 * tenant's guaranteed share comes from its tenant_quota line. */
int snapkvd_policy_admit(struct snapkvd_policy *ops, uid_t uid, uint64_t tenant_used,
			 uint64_t request, char *msg, size_t msg_len);
/* C for a new request at the current level (see snapkvd_pressure_scale_capacity). */
uint32_t snapkvd_policy_scale_capacity(struct snapkvd_policy *ops, uint32_t capacity,
				       uint32_t window, int *ret_scaled);
/* A request's C was scaled down (counted once it is admitted). */
void snapkvd_policy_count_scaled(struct snapkvd_policy *ops);
/* What a new engine learns at HELLO under pressure: 1 with the level, the
 * suggested C, the scale (per mille) and the pool bytes in use when the
 * level is above normal and NOTIFY is an action, else 0. */
int snapkvd_policy_greeting(const struct snapkvd_policy *ops,
			    enum snapkvd_pressure_level *ret_level, uint32_t *ret_capacity,
			    uint32_t *ret_permille, uint64_t *ret_used);
/* Quota of a tenant from the config (0: none). */
uint64_t snapkvd_policy_tenant_quota(const struct snapkvd_policy *ops, uid_t uid);

/* A hook's pidfd is readable: reap, log, forget it. 0, or -EAGAIN when it
 * had not exited after all (watch it again). */
int snapkvd_policy_hook_exited(struct snapkvd_policy *ops, struct snapkvd_hook *h);
/* Housekeeping at CLOCK_MONOTONIC now_ns: drain hook output, kill hooks
 * past their timeout, rewrite the metrics textfile when due. */
void snapkvd_policy_tick(struct snapkvd_policy *ops, uint64_t now_ns);

/* One finished compaction (any thread): wall seconds and the retained
 * mass of every stored head of every layer (NaN entries ignored). */
void snapkvd_policy_observe_compaction(struct snapkvd_policy *ops, double seconds,
				       const float *mass, size_t n_mass);
/* The budget of one finished compaction (any thread): its mode (enum
 * skv_budget), the kept fraction of the prompt, whether it fell back. */
void snapkvd_policy_observe_budget(struct snapkvd_policy *ops, int mode, double kept_fraction,
				   bool fallback);
/* A request was answered with -err (loop thread): errors by code. */
void snapkvd_policy_count_error(struct snapkvd_policy *ops, int err);
/* Fill the fields of st that the policy owns (pressure, hooks,
 * evictions, refusals, errors by code, histograms); they point into snap. */
void snapkvd_policy_fill_stats(struct snapkvd_policy *ops, struct snapkvd_stats *st,
			       struct snapkvd_policy_snapshot *snap);

#endif /* SNAPKVD_POLICY_H */
