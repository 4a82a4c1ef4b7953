// SPDX-License-Identifier: MIT
/*
 * snapkvd-pressure.c - pressure levels with hysteresis and the policy
 * decisions that hang off them. See snapkvd-pressure.h.
 */
#include "snapkvd-pressure.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

struct snapkvd_pressure {
	struct snapkvd_pressure_config cfg;
	snapkvd_clock_fn clock;
	void *clock_opaque;
	enum snapkvd_pressure_level level;
	/* Ring of the last transitions; head is the next slot to write. */
	struct snapkvd_pressure_transition hist[SNAPKVD_PRESSURE_HISTORY];
	size_t hist_head;
	size_t hist_len;
	uint64_t transitions_total;
	uint64_t since_ns; /* when the level was entered (clock) */
	uint64_t held;	   /* downward transitions held back by the dwell */
};

static const char *const level_names[SNAPKVD_PRESSURE_N_LEVELS] = {"normal", "high", "critical"};
static const char *const action_names[] = {"none", "notify", "hooks", "scale", "evict", "refuse"};

static void setmsg(char *msg, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void setmsg(char *msg, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!msg || len == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, len, fmt, ap);
	va_end(ap);
}

void snapkvd_pressure_config_init(struct snapkvd_pressure_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->high_enter.fraction = 0.80;
	cfg->high_leave.fraction = 0.75;
	cfg->critical_enter.fraction = 0.95;
	cfg->critical_leave.fraction = 0.90;
	cfg->order[0] = SNAPKVD_ACTION_NOTIFY;
	cfg->order[1] = SNAPKVD_ACTION_HOOKS;
	cfg->order[2] = SNAPKVD_ACTION_SCALE;
	cfg->order[3] = SNAPKVD_ACTION_EVICT;
	cfg->order[4] = SNAPKVD_ACTION_REFUSE;
	cfg->n_order = 5;
	cfg->scale_high = 0.5;
	cfg->scale_critical = 0.25;
	cfg->guaranteed_share = 0.0;
	cfg->default_capacity = 2048;
	cfg->default_window = 32;
}

const char *snapkvd_pressure_level_name(enum snapkvd_pressure_level level)
{
	if ((unsigned)level >= SNAPKVD_PRESSURE_N_LEVELS)
		return "unknown";
	return level_names[level];
}

int snapkvd_pressure_level_parse(const char *s, enum snapkvd_pressure_level *ret_level)
{
	for (unsigned i = 0; i < SNAPKVD_PRESSURE_N_LEVELS; i++) {
		if (s && strcasecmp(s, level_names[i]) == 0) {
			*ret_level = (enum snapkvd_pressure_level)i;
			return 0;
		}
	}
	return -EINVAL;
}

const char *snapkvd_pressure_action_name(enum snapkvd_pressure_action a)
{
	if ((unsigned)a > SNAPKVD_ACTION_REFUSE)
		return "unknown";
	return action_names[a];
}

int snapkvd_pressure_order_parse(const char *s, struct snapkvd_pressure_config *cfg)
{
	enum snapkvd_pressure_action order[SNAPKVD_PRESSURE_MAX_ACTIONS];
	unsigned n = 0;
	const char *p = s;

	if (!s)
		return -EINVAL;
	while (*p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		enum snapkvd_pressure_action a = SNAPKVD_ACTION_NONE;

		while (len > 0 && (*p == ' ' || *p == '\t')) {
			p++;
			len--;
		}
		while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		for (unsigned i = SNAPKVD_ACTION_NOTIFY; i <= SNAPKVD_ACTION_REFUSE; i++) {
			if (strlen(action_names[i]) == len &&
			    strncasecmp(p, action_names[i], len) == 0)
				a = (enum snapkvd_pressure_action)i;
		}
		if (a == SNAPKVD_ACTION_NONE)
			return -EINVAL;
		for (unsigned i = 0; i < n; i++)
			if (order[i] == a)
				return -EINVAL;
		if (n == SNAPKVD_PRESSURE_MAX_ACTIONS)
			return -EINVAL;
		order[n++] = a;
		if (!end)
			break;
		p = end + 1;
		if (!*p)
			return -EINVAL; /* trailing comma */
	}
	memcpy(cfg->order, order, n * sizeof(order[0]));
	for (unsigned i = n; i < SNAPKVD_PRESSURE_MAX_ACTIONS; i++)
		cfg->order[i] = SNAPKVD_ACTION_NONE;
	cfg->n_order = n;
	return 0;
}

int snapkvd_pressure_order_format(const struct snapkvd_pressure_config *cfg, char *buf, size_t len)
{
	size_t off = 0;

	if (len)
		buf[0] = '\0';
	for (unsigned i = 0; i < cfg->n_order && i < SNAPKVD_PRESSURE_MAX_ACTIONS; i++) {
		int r = snprintf(buf + off, off < len ? len - off : 0, "%s%s", i ? "," : "",
				 snapkvd_pressure_action_name(cfg->order[i]));
		if (r > 0)
			off += (size_t)r;
	}
	return (int)off;
}

int snapkvd_watermark_parse(const char *s, struct snapkvd_watermark *ret_wm)
{
	struct snapkvd_watermark wm = {0};
	char *end;

	if (!s || !*s || strlen(s) > 64)
		return -EINVAL;
	if (strchr(s, '%')) {
		double v;

		errno = 0;
		v = strtod(s, &end);
		if (errno || end == s || strcmp(end, "%") != 0 || !(v > 0.0) || v > 100.0)
			return -EINVAL;
		wm.fraction = v / 100.0;
	} else if (strchr(s, '.')) {
		double v;

		errno = 0;
		v = strtod(s, &end);
		if (errno || end == s || *end || !(v > 0.0) || v > 1.0)
			return -EINVAL;
		wm.fraction = v;
	} else {
		unsigned long long v;
		uint64_t mul = 1;

		if (*s < '0' || *s > '9')
			return -EINVAL;
		errno = 0;
		v = strtoull(s, &end, 10);
		if (errno || end == s)
			return -EINVAL;
		switch (*end) {
		case 'K':
		case 'k':
			mul = 1ull << 10;
			end++;
			break;
		case 'M':
			mul = 1ull << 20;
			end++;
			break;
		case 'G':
			mul = 1ull << 30;
			end++;
			break;
		case 'T':
			mul = 1ull << 40;
			end++;
			break;
		default:
			break;
		}
		if (mul > 1 && *end == 'i')
			end++;
		if (*end == 'B')
			end++;
		if (*end || v == 0 || v > UINT64_MAX / mul)
			return -EINVAL;
		wm.bytes = v * mul;
	}
	*ret_wm = wm;
	return 0;
}

int snapkvd_watermark_format(const struct snapkvd_watermark *wm, char *buf, size_t len)
{
	if (wm->bytes)
		return snprintf(buf, len, "%" PRIu64, wm->bytes);
	return snprintf(buf, len, "%g%%", wm->fraction * 100.0);
}

uint64_t snapkvd_watermark_bytes(const struct snapkvd_watermark *wm, uint64_t total)
{
	long double b;

	if (wm->bytes)
		return wm->bytes;
	/* Round up so that "80%" of 1000 bytes is 800, not 799.99... -> 799. */
	b = ceill((long double)total * (long double)wm->fraction - 1e-6L);
	if (b <= 0)
		return 0;
	if (b >= (long double)UINT64_MAX)
		return UINT64_MAX;
	return (uint64_t)b;
}

static int wm_valid(const struct snapkvd_watermark *wm)
{
	return wm->bytes != 0 || (wm->fraction > 0.0 && wm->fraction <= 1.0);
}

/* Compare two watermarks when both are the same kind; mixed kinds are
 * checked against the pool at evaluation time only. */
static int wm_le(const struct snapkvd_watermark *a, const struct snapkvd_watermark *b)
{
	if (a->bytes && b->bytes)
		return a->bytes <= b->bytes;
	if (!a->bytes && !b->bytes)
		return a->fraction <= b->fraction;
	return 1;
}

int snapkvd_pressure_config_check(const struct snapkvd_pressure_config *cfg, char *msg,
				  size_t msg_len)
{
	if (!wm_valid(&cfg->high_enter) || !wm_valid(&cfg->high_leave) ||
	    !wm_valid(&cfg->critical_enter) || !wm_valid(&cfg->critical_leave)) {
		setmsg(msg, msg_len, "watermarks must be fractions in (0, 1] or non-zero bytes");
		return -EINVAL;
	}
	if (!wm_le(&cfg->high_leave, &cfg->high_enter) ||
	    !wm_le(&cfg->critical_leave, &cfg->critical_enter)) {
		setmsg(msg, msg_len, "a leave watermark must not exceed its enter watermark");
		return -EINVAL;
	}
	if (!wm_le(&cfg->high_enter, &cfg->critical_enter) ||
	    !wm_le(&cfg->high_leave, &cfg->critical_leave)) {
		setmsg(msg, msg_len, "high watermarks must not exceed critical ones");
		return -EINVAL;
	}
	if (cfg->n_order > SNAPKVD_PRESSURE_MAX_ACTIONS) {
		setmsg(msg, msg_len, "at most %d actions", SNAPKVD_PRESSURE_MAX_ACTIONS);
		return -EINVAL;
	}
	for (unsigned i = 0; i < cfg->n_order; i++) {
		if (cfg->order[i] < SNAPKVD_ACTION_NOTIFY ||
		    cfg->order[i] > SNAPKVD_ACTION_REFUSE) {
			setmsg(msg, msg_len, "unknown action %d", (int)cfg->order[i]);
			return -EINVAL;
		}
		for (unsigned j = 0; j < i; j++) {
			if (cfg->order[j] == cfg->order[i]) {
				setmsg(msg, msg_len, "action %s listed twice",
				       snapkvd_pressure_action_name(cfg->order[i]));
				return -EINVAL;
			}
		}
	}
	if (!(cfg->scale_high > 0.0 && cfg->scale_high <= 1.0) ||
	    !(cfg->scale_critical > 0.0 && cfg->scale_critical <= 1.0)) {
		setmsg(msg, msg_len, "scale factors must be in (0, 1]");
		return -EINVAL;
	}
	if (!(cfg->guaranteed_share >= 0.0 && cfg->guaranteed_share <= 1.0)) {
		setmsg(msg, msg_len, "guaranteed share must be in [0, 1]");
		return -EINVAL;
	}
	if (cfg->default_capacity <= cfg->default_window) {
		setmsg(msg, msg_len, "default capacity %u must exceed the window %u",
		       cfg->default_capacity, cfg->default_window);
		return -EINVAL;
	}
	return 0;
}

static uint64_t realtime_ns(void *opaque)
{
	struct timespec ts;

	(void)opaque;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int snapkvd_pressure_new(const struct snapkvd_pressure_config *cfg, snapkvd_clock_fn clock,
			 void *clock_opaque, struct snapkvd_pressure **ret_p)
{
	struct snapkvd_pressure *p;
	int r;

	r = snapkvd_pressure_config_check(cfg, NULL, 0);
	if (r < 0)
		return r;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->cfg = *cfg;
	p->clock = clock ? clock : realtime_ns;
	p->clock_opaque = clock ? clock_opaque : NULL;
	p->level = SNAPKVD_PRESSURE_NORMAL;
	*ret_p = p;
	return 0;
}

void snapkvd_pressure_free(struct snapkvd_pressure *p)
{
	free(p);
}

int snapkvd_pressure_set_config(struct snapkvd_pressure *p,
				const struct snapkvd_pressure_config *cfg, char *msg,
				size_t msg_len)
{
	int r = snapkvd_pressure_config_check(cfg, msg, msg_len);

	if (r < 0)
		return r;
	p->cfg = *cfg;
	return 0;
}

const struct snapkvd_pressure_config *snapkvd_pressure_get_config(const struct snapkvd_pressure *p)
{
	return &p->cfg;
}

enum snapkvd_pressure_level snapkvd_pressure_level(const struct snapkvd_pressure *p)
{
	return p->level;
}

int snapkvd_pressure_action_enabled(const struct snapkvd_pressure *p,
				    enum snapkvd_pressure_action a)
{
	for (unsigned i = 0; i < p->cfg.n_order; i++)
		if (p->cfg.order[i] == a)
			return 1;
	return 0;
}

/*
 * Level for `used` given the current one: go up to the highest level whose
 * enter mark is reached; otherwise step down while below the current
 * level's leave mark. With leave <= enter this is the usual hysteresis band.
 */
static enum snapkvd_pressure_level next_level(const struct snapkvd_pressure_config *cfg,
					      enum snapkvd_pressure_level cur, uint64_t used,
					      uint64_t total)
{
	uint64_t enter[SNAPKVD_PRESSURE_N_LEVELS], leave[SNAPKVD_PRESSURE_N_LEVELS];
	int l;

	if (total == 0)
		return SNAPKVD_PRESSURE_NORMAL;
	enter[0] = leave[0] = 0;
	enter[1] = snapkvd_watermark_bytes(&cfg->high_enter, total);
	leave[1] = snapkvd_watermark_bytes(&cfg->high_leave, total);
	enter[2] = snapkvd_watermark_bytes(&cfg->critical_enter, total);
	leave[2] = snapkvd_watermark_bytes(&cfg->critical_leave, total);
	/* Mixed byte/fraction marks can cross on a small pool; keep the bands sane. */
	if (leave[1] > enter[1])
		leave[1] = enter[1];
	if (enter[2] < enter[1])
		enter[2] = enter[1];
	if (leave[2] > enter[2])
		leave[2] = enter[2];
	for (l = SNAPKVD_PRESSURE_N_LEVELS - 1; l > (int)cur; l--)
		if (used >= enter[l])
			return (enum snapkvd_pressure_level)l;
	l = (int)cur;
	while (l > 0 && used < leave[l])
		l--;
	return (enum snapkvd_pressure_level)l;
}

static double level_scale(const struct snapkvd_pressure_config *cfg,
			  enum snapkvd_pressure_level level)
{
	switch (level) {
	case SNAPKVD_PRESSURE_HIGH:
		return cfg->scale_high;
	case SNAPKVD_PRESSURE_CRITICAL:
		return cfg->scale_critical;
	default:
		return 1.0;
	}
}

static uint32_t scale_cap(double factor, uint32_t capacity, uint32_t window)
{
	uint64_t c = (uint64_t)floor((double)capacity * factor);

	if (c < (uint64_t)window + 1)
		c = (uint64_t)window + 1;
	if (c > capacity)
		c = capacity; /* never grow, e.g. when C <= W + 1 already */
	return (uint32_t)c;
}

uint64_t snapkvd_pressure_evict_need(const struct snapkvd_pressure *p, uint64_t used,
				     uint64_t total)
{
	uint64_t leave;

	if (p->level == SNAPKVD_PRESSURE_NORMAL ||
	    !snapkvd_pressure_action_enabled(p, SNAPKVD_ACTION_EVICT))
		return 0;
	leave = snapkvd_watermark_bytes(&p->cfg.high_leave, total);
	return used >= leave ? used - leave + 1 : 0;
}

int snapkvd_pressure_update(struct snapkvd_pressure *p, uint64_t used, uint64_t total,
			    struct snapkvd_pressure_change *ret_change)
{
	enum snapkvd_pressure_level prev = p->level;
	enum snapkvd_pressure_level next = next_level(&p->cfg, prev, used, total);
	struct snapkvd_pressure_transition t;
	struct snapkvd_pressure_change ch;

	if (next == prev)
		return 0;
	t.time_ns = p->clock(p->clock_opaque);
	/* Rate limit: a level is left downwards only after min_dwell_ms (up is
	 * at once: eviction and refusal must not wait), so one engine crossing
	 * a watermark back and forth makes at most two transitions (and their
	 * hooks and events) per dwell. The caller re-evaluates later. */
	if (next < prev && p->cfg.min_dwell_ms && t.time_ns >= p->since_ns &&
	    t.time_ns - p->since_ns < (uint64_t)p->cfg.min_dwell_ms * 1000000ull) {
		p->held++;
		return 0;
	}
	p->since_ns = t.time_ns;
	t.prev = prev;
	t.level = next;
	t.used_bytes = used;
	t.total_bytes = total;
	p->level = next;
	p->hist[p->hist_head] = t;
	p->hist_head = (p->hist_head + 1) % SNAPKVD_PRESSURE_HISTORY;
	if (p->hist_len < SNAPKVD_PRESSURE_HISTORY)
		p->hist_len++;
	p->transitions_total++;
	if (!ret_change)
		return 1;

	memset(&ch, 0, sizeof(ch));
	ch.transition = t;
	for (unsigned i = 0; i < p->cfg.n_order; i++) {
		enum snapkvd_pressure_action a = p->cfg.order[i];
		int applies;

		switch (a) {
		case SNAPKVD_ACTION_NOTIFY:
		case SNAPKVD_ACTION_HOOKS:
		case SNAPKVD_ACTION_SCALE: /* also on the way down: scaling ends */
			applies = 1;
			break;
		case SNAPKVD_ACTION_EVICT:
			applies = next >= SNAPKVD_PRESSURE_HIGH;
			break;
		case SNAPKVD_ACTION_REFUSE:
			applies = next == SNAPKVD_PRESSURE_CRITICAL;
			break;
		default:
			applies = 0;
		}
		if (applies)
			ch.actions[ch.n_actions++] = a;
	}
	if (snapkvd_pressure_action_enabled(p, SNAPKVD_ACTION_SCALE)) {
		double f = level_scale(&p->cfg, next);

		ch.scale_permille = (uint32_t)lround(f * 1000.0);
		ch.suggested_capacity =
		    scale_cap(f, p->cfg.default_capacity, p->cfg.default_window);
	} else {
		ch.scale_permille = 1000;
		ch.suggested_capacity = p->cfg.default_capacity;
	}
	ch.evict_bytes = snapkvd_pressure_evict_need(p, used, total);
	*ret_change = ch;
	return 1;
}

size_t snapkvd_pressure_history_len(const struct snapkvd_pressure *p)
{
	return p->hist_len;
}

int snapkvd_pressure_history_get(const struct snapkvd_pressure *p, size_t i,
				 struct snapkvd_pressure_transition *ret_t)
{
	if (i >= p->hist_len)
		return -ENOENT;
	*ret_t =
	    p->hist[(p->hist_head + SNAPKVD_PRESSURE_HISTORY - 1 - i) % SNAPKVD_PRESSURE_HISTORY];
	return 0;
}

uint64_t snapkvd_pressure_transitions_total(const struct snapkvd_pressure *p)
{
	return p->transitions_total;
}

uint32_t snapkvd_pressure_scale_capacity_at(const struct snapkvd_pressure *p,
					    enum snapkvd_pressure_level level, uint32_t capacity,
					    uint32_t window, int *ret_scaled)
{
	uint32_t c = capacity;

	if (level != SNAPKVD_PRESSURE_NORMAL &&
	    snapkvd_pressure_action_enabled(p, SNAPKVD_ACTION_SCALE))
		c = scale_cap(level_scale(&p->cfg, level), capacity, window);
	if (ret_scaled)
		*ret_scaled = c != capacity;
	return c;
}

uint32_t snapkvd_pressure_scale_capacity(const struct snapkvd_pressure *p, uint32_t capacity,
					 uint32_t window, int *ret_scaled)
{
	return snapkvd_pressure_scale_capacity_at(p, p->level, capacity, window, ret_scaled);
}

int snapkvd_pressure_admit(const struct snapkvd_pressure *p, uint64_t tenant_used, uint64_t request,
			   uint64_t total, double guaranteed_share, char *msg, size_t msg_len)
{
	struct snapkvd_watermark share;
	uint64_t guarantee, after;

	if (p->level != SNAPKVD_PRESSURE_CRITICAL ||
	    !snapkvd_pressure_action_enabled(p, SNAPKVD_ACTION_REFUSE))
		return 0;
	if (guaranteed_share < 0.0 || guaranteed_share > 1.0)
		guaranteed_share = p->cfg.guaranteed_share;
	share = (struct snapkvd_watermark){.fraction = guaranteed_share};
	guarantee = guaranteed_share > 0.0 ? snapkvd_watermark_bytes(&share, total) : 0;
	after = tenant_used + request < tenant_used ? UINT64_MAX : tenant_used + request;
	if (guarantee > 0 && after <= guarantee)
		return 0;
	setmsg(msg, msg_len,
	       "pool pressure critical: refusing %" PRIu64 " bytes; tenant holds %" PRIu64
	       " of its guaranteed %" PRIu64 " bytes (%.1f%% of %" PRIu64 ")",
	       request, tenant_used, guarantee, guaranteed_share * 100.0, total);
	return -ENOSPC;
}

struct pick {
	size_t idx;
	uint64_t last_use;
	uint64_t id;
};

static int pick_cmp(const void *a, const void *b)
{
	const struct pick *x = a, *y = b;

	if (x->last_use != y->last_use)
		return x->last_use < y->last_use ? -1 : 1;
	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return 0;
}

int snapkvd_pressure_pick_evictions(const struct snapkvd_evict_candidate *c, size_t n,
				    uint64_t need, size_t *ret_idx, size_t max, size_t *ret_n,
				    uint64_t *ret_bytes)
{
	struct pick *v;
	size_t m = 0, out = 0;
	uint64_t bytes = 0;

	if (n > 0 && (!c || (max > 0 && !ret_idx)))
		return -EINVAL;
	if (n == 0 || need == 0 || max == 0) {
		*ret_n = 0;
		if (ret_bytes)
			*ret_bytes = 0;
		return 0;
	}
	v = calloc(n, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (!c[i].lingering || c[i].held)
			continue;
		v[m++] = (struct pick){.idx = i, .last_use = c[i].last_use_ns, .id = c[i].id};
	}
	qsort(v, m, sizeof(*v), pick_cmp);
	for (size_t i = 0; i < m && out < max && bytes < need; i++) {
		ret_idx[out++] = v[i].idx;
		bytes += c[v[i].idx].bytes;
	}
	free(v);
	*ret_n = out;
	if (ret_bytes)
		*ret_bytes = bytes;
	return 0;
}

uint64_t snapkvd_pressure_held(const struct snapkvd_pressure *p)
{
	return p->held;
}
