/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-pressure.h - memory-pressure policy of the daemon's pool.
 *
 * A pure state machine: it is fed the pool's used/total bytes on every
 * change and answers with level transitions (normal/high/critical, with
 * hysteresis), the ordered policy actions to run on a transition, the
 * budget scaling rule, the admission decision at critical and the choice of
 * lingering caches to evict. It performs no I/O, never logs and takes its
 * clock from the caller, so the daemon's loop and the unit tests drive it
 * the same way. Not thread-safe: the daemon calls it from its loop thread.
 */
#ifndef SNAPKVD_PRESSURE_H
#define SNAPKVD_PRESSURE_H

#include <stddef.h>
#include <stdint.h>

enum snapkvd_pressure_level {
	SNAPKVD_PRESSURE_NORMAL = 0,
	SNAPKVD_PRESSURE_HIGH = 1,
	SNAPKVD_PRESSURE_CRITICAL = 2,
};
#define SNAPKVD_PRESSURE_N_LEVELS 3

/* Policy actions, run in the configured order on each change of level. */
enum snapkvd_pressure_action {
	SNAPKVD_ACTION_NONE = 0,
	SNAPKVD_ACTION_NOTIFY = 1, /* PRESSURE event on each engine's completion ring */
	SNAPKVD_ACTION_HOOKS = 2,  /* hook executables of the hook directory           */
	SNAPKVD_ACTION_SCALE = 3,  /* scale C of new requests                          */
	SNAPKVD_ACTION_EVICT = 4,  /* evict caches released with linger, LRU           */
	SNAPKVD_ACTION_REFUSE = 5, /* -ENOSPC for new compactions at critical          */
};
#define SNAPKVD_PRESSURE_MAX_ACTIONS 5

/*
 * A watermark: a fraction of the pool (0 < fraction <= 1) or an absolute
 * byte count (bytes != 0 wins). Fractions follow pool resizes.
 */
struct snapkvd_watermark {
	double fraction;
	uint64_t bytes;
};

struct snapkvd_pressure_config {
	/* Enter a level when used >= enter; leave it when used < leave. */
	struct snapkvd_watermark high_enter;	 /* default 80%  */
	struct snapkvd_watermark high_leave;	 /* default 75%  */
	struct snapkvd_watermark critical_enter; /* default 95%  */
	struct snapkvd_watermark critical_leave; /* default 90%  */
	enum snapkvd_pressure_action order[SNAPKVD_PRESSURE_MAX_ACTIONS];
	unsigned n_order;	   /* actions not listed are disabled       */
	double scale_high;	   /* C factor at high, (0, 1]; default 0.5  */
	double scale_critical;	   /* C factor at critical; default 0.25      */
	double guaranteed_share;   /* pool fraction each tenant keeps at
				      critical, [0, 1]; default 0           */
	uint32_t default_capacity; /* C the suggested budget is based on (2048) */
	uint32_t default_window;   /* W of that suggestion (32)              */
	uint32_t min_dwell_ms;	   /* a level is held this long before it is
				      left downwards (0 here; the daemon's
				      pressure_min_dwell_ms, default 1000) */
};

/* Defaults: 80/75, 95/90, order notify,hooks,scale,evict,refuse, 0.5, 0.25. */
void snapkvd_pressure_config_init(struct snapkvd_pressure_config *cfg);
/* -EINVAL with a reason in msg (may be NULL) for an inconsistent config. */
int snapkvd_pressure_config_check(const struct snapkvd_pressure_config *cfg, char *msg,
				  size_t msg_len);

/* "normal", "high", "critical"; "unknown" otherwise. */
const char *snapkvd_pressure_level_name(enum snapkvd_pressure_level level);
int snapkvd_pressure_level_parse(const char *s, enum snapkvd_pressure_level *ret_level);
/* "notify", "hooks", "scale", "evict", "refuse". */
const char *snapkvd_pressure_action_name(enum snapkvd_pressure_action a);
/* Comma-separated action list, e.g. "notify,hooks,evict"; no duplicates. */
int snapkvd_pressure_order_parse(const char *s, struct snapkvd_pressure_config *cfg);
/* Writes the order back as a comma-separated list; returns its length. */
int snapkvd_pressure_order_format(const struct snapkvd_pressure_config *cfg, char *buf, size_t len);
/*
 * "80%", "0.8" (fractions) or "12G", "512MiB", "1073741824" (bytes, IEC
 * suffixes K M G T with optional "i"/"iB"/"B"). -EINVAL otherwise.
 */
int snapkvd_watermark_parse(const char *s, struct snapkvd_watermark *ret_wm);
/* "80%" or "12884901888" into buf; returns the length. */
int snapkvd_watermark_format(const struct snapkvd_watermark *wm, char *buf, size_t len);
/* Bytes of a watermark for a pool of `total` bytes. */
uint64_t snapkvd_watermark_bytes(const struct snapkvd_watermark *wm, uint64_t total);

/* Time source in nanoseconds; the default is CLOCK_REALTIME. */
typedef uint64_t (*snapkvd_clock_fn)(void *opaque);

struct snapkvd_pressure_transition {
	uint64_t time_ns;
	enum snapkvd_pressure_level prev;
	enum snapkvd_pressure_level level;
	uint64_t used_bytes;
	uint64_t total_bytes;
};

/* What a change of level asks the daemon to do, in order. */
struct snapkvd_pressure_change {
	struct snapkvd_pressure_transition transition;
	enum snapkvd_pressure_action actions[SNAPKVD_PRESSURE_MAX_ACTIONS];
	unsigned n_actions;
	uint32_t suggested_capacity; /* scaled default C for the PRESSURE event   */
	uint32_t scale_permille;     /* factor in effect at the new level, x1000  */
	uint64_t evict_bytes;	     /* bytes to evict to get below high's leave  */
};

#define SNAPKVD_PRESSURE_HISTORY 16

struct snapkvd_pressure;

/* clock may be NULL (CLOCK_REALTIME). 0, -EINVAL (bad config), -ENOMEM. */
int snapkvd_pressure_new(const struct snapkvd_pressure_config *cfg, snapkvd_clock_fn clock,
			 void *clock_opaque, struct snapkvd_pressure **ret_p);
void snapkvd_pressure_free(struct snapkvd_pressure *p);

/*
 * Replace the configuration at run time (e.g. `snapkvctl pressure set`).
 * The level is not re-evaluated here; the next update does it.
 * 0 or -EINVAL (msg says why; the old config stays).
 */
int snapkvd_pressure_set_config(struct snapkvd_pressure *p,
				const struct snapkvd_pressure_config *cfg, char *msg,
				size_t msg_len);
const struct snapkvd_pressure_config *snapkvd_pressure_get_config(const struct snapkvd_pressure *p);

/*
 * Feed the pool's state after a change. Returns 1 and fills *ret_change
 * (may be NULL) when the level changed, 0 when it did not.
 */
int snapkvd_pressure_update(struct snapkvd_pressure *p, uint64_t used, uint64_t total,
			    struct snapkvd_pressure_change *ret_change);

enum snapkvd_pressure_level snapkvd_pressure_level(const struct snapkvd_pressure *p);
/* Downward transitions held back by min_dwell_ms so far. */
uint64_t snapkvd_pressure_held(const struct snapkvd_pressure *p);
/* Whether the configured order contains the action at all. */
int snapkvd_pressure_action_enabled(const struct snapkvd_pressure *p,
				    enum snapkvd_pressure_action a);

/* Number of transitions kept (<= SNAPKVD_PRESSURE_HISTORY); i = 0 is the newest. */
size_t snapkvd_pressure_history_len(const struct snapkvd_pressure *p);
int snapkvd_pressure_history_get(const struct snapkvd_pressure *p, size_t i,
				 struct snapkvd_pressure_transition *ret_t);
uint64_t snapkvd_pressure_transitions_total(const struct snapkvd_pressure *p);

/*
 * Budget scaling of a new request at the current level: when scaling is
 * enabled and the level is high or critical, C becomes floor(C * factor),
 * never below W + 1 and never above C. Returns the capacity to use;
 * *ret_scaled (may be NULL) says whether it differs from C.
 */
uint32_t snapkvd_pressure_scale_capacity(const struct snapkvd_pressure *p, uint32_t capacity,
					 uint32_t window, int *ret_scaled);
/* The same at a given level rather than the current one: the members of a
 * decision group are all scaled at the level its first member saw. */
uint32_t snapkvd_pressure_scale_capacity_at(const struct snapkvd_pressure *p,
					    enum snapkvd_pressure_level level, uint32_t capacity,
					    uint32_t window, int *ret_scaled);

/*
 * Admission of a new compaction needing `request` bytes for a tenant that
 * holds `tenant_used` bytes. Refused with -ENOSPC only at critical with
 * refusal enabled, unless the tenant stays within its guaranteed share of
 * the pool after the request (guaranteed_share < 0: the config's share).
 * msg (may be NULL) receives the numbers on refusal.
 */
int snapkvd_pressure_admit(const struct snapkvd_pressure *p, uint64_t tenant_used, uint64_t request,
			   uint64_t total, double guaranteed_share, char *msg, size_t msg_len);

/*
 * Bytes eviction should free now: when eviction is enabled and the level is
 * high or critical, what takes `used` strictly below high's leave mark;
 * 0 otherwise.
 */
uint64_t snapkvd_pressure_evict_need(const struct snapkvd_pressure *p, uint64_t used,
				     uint64_t total);

/* A cache the eviction policy may look at. */
struct snapkvd_evict_candidate {
	uint64_t id;
	uint64_t bytes;
	uint64_t last_use_ns; /* last compaction, append, grow or release */
	int lingering;	      /* released by its owner with linger        */
	int held;	      /* still mapped/held by an engine: never evicted */
};

/*
 * LRU choice: among lingering, not-held candidates, oldest last use first
 * (ties: smaller id), until at least `need` bytes are chosen. Writes up to
 * max indices into ret_idx, the count into *ret_n and the bytes chosen
 * into *ret_bytes (may be NULL). 0, or -EINVAL on NULL arrays with n > 0.
 * Choosing fewer bytes than needed is not an error: the caller compares.
 */
int snapkvd_pressure_pick_evictions(const struct snapkvd_evict_candidate *c, size_t n,
				    uint64_t need, size_t *ret_idx, size_t max, size_t *ret_n,
				    uint64_t *ret_bytes);

#endif /* SNAPKVD_PRESSURE_H */
