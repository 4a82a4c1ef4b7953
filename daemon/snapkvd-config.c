// SPDX-License-Identifier: MIT
/* Configuration parsing with limits; see snapkvd-config.h. */
#include "snapkvd-config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snapkvd-log.h"
#include "snapkvd-metrics.h"

void snapkvd_config_defaults(struct snapkvd_config *c)
{
	const char *rt = getenv("RUNTIME_DIRECTORY");

	memset(c, 0, sizeof(*c));
	if (!rt)
		rt = getenv("XDG_RUNTIME_DIR");
	if (rt && strlen(rt) + sizeof("/snapkvd.sock") <= sizeof(c->socket_path))
		snprintf(c->socket_path, sizeof(c->socket_path), "%s/snapkvd.sock", rt);
	else
		snprintf(c->socket_path, sizeof(c->socket_path), "/run/snapkvd/snapkvd.sock");
	snprintf(c->backend, sizeof(c->backend), "host");
	c->pool_bytes = 4ull << 30;
	c->session_arena_bytes = 1ull << 30;
	/* released regions whose pages are kept for the next compaction:
	 * about one whole-model cache (Llama-3-8B at C 2048: 1 GiB expand
	 * bf16, 512 MiB group f32), a quarter of the default pool */
	c->arena_cache_bytes = 1ull << 30;
	c->tenant_quota_bytes = 0;
	c->max_buffer_bytes = 64ull << 30;
	c->max_scratch_bytes = 0; /* 512 MiB per compaction thread */
	c->threads = 0;
	c->workers = 0; /* min(4, max(1, threads / 8)): snapkvd_compactor_new */
	c->max_sessions = 256;
	/* hardening limits (issue 11): what one client or tenant may claim */
	c->max_sessions_per_tenant = 64;
	c->max_admin_sessions = 16;
	c->max_handshakes = 64;
	c->hello_timeout_ms = 2000;
	c->max_tenant_buffers = 1024;
	/* decision groups (issue 13) */
	c->max_group_size = 64;
	/* partial window (SPEC.md): fewest query rows a request may vote with */
	c->min_window = 8;
	c->group_timeout_ms = 10000;
	c->max_group_timeout_ms = 600000;
	c->max_tenant_groups = 64;
	c->max_tenant_mapped_bytes = 1ull << 40;
	c->max_mapped_bytes = 16ull << 40;
	c->max_request_macs = 1ull << 44;
	c->max_request_bytes = 256ull << 30;
	c->max_session_pools = 16;
	c->max_block_table = 1u << 22; /* 4M entries: a 4M-token page-size-1 prompt */
	/* 16M ranges: 640 MiB at most while one writeback is checked */
	c->max_writeback_ranges = 1u << 24;
	/* admin answers (issue 20): a ledger page in slices of 32 caches, and
	 * what one poller may ask (a full page is 512 caches) */
	c->admin_slice_caches = 32;
	c->admin_session_rate = 20;
	c->admin_session_burst = 40;
	c->admin_tenant_rate = 20;
	c->admin_tenant_burst = 40;
	c->admin_root_rate = 100;
	c->admin_root_burst = 200;
	c->max_buffers = 256;
	c->max_caches = 4096;
	c->max_layers = 1024;
	c->max_heads = 1024;
	c->max_head_dim = 1024;
	c->max_prompt_len = 1u << 21;
	c->max_reserve = 1u << 20;
	c->max_decode = 1u << 20;
	c->sq_entries = 64;
	c->slot_bytes = 64 * 1024;
	c->poll_idle_us = 50;
	c->watchdog_ms = 250;
	c->prefill_wait_max_ms = 10000;
	c->log_level = SNAPKVD_LOG_INFO;
	snapkvd_policy_config_init(&c->policy);
	/* the daemon rate-limits pressure transitions (issue 11); the pressure
	 * object alone (unit tests) does not */
	c->policy.pressure.min_dwell_ms = 1000;
	c->http.max_request = 8192;
	c->http.max_connections = 16;
	c->http.timeout_ms = 10000;
	c->http.cache_ms = 1000;
	c->http.tenants = SNAPKVD_METRICS_TENANTS_AGGREGATE;
}

void snapkvd_policy_config_init(struct snapkvd_policy_config *c)
{
	memset(c, 0, sizeof(*c));
	snapkvd_pressure_config_init(&c->pressure);
	snapkvd_hooks_config_init(&c->hooks);
	c->metrics_interval_s = 15;
	c->hook_ledger_max_caches = 4096;
}

/* ------------------------------------------------------------ the table */

/*
 * Every key, the pressure policy's too, is one row: its name, its value
 * type (snapkvd-value.c: the parser and the dump), where its field is (in
 * struct snapkvd_config, or in struct snapkvd_policy_config, which
 * snapkvctl's runtime changes set on their own), the bounds and the words
 * the type checks against, and whether a SIGHUP reload applies it (RESTART:
 * the running value is kept and the reload says so,
 * snapkvd_config_keep_running()). The rows are in the order of
 * systemd/snapkvd.conf, the order --check-config prints them in.
 */
enum where { IN_DAEMON, IN_POLICY };
struct key {
	const char *name;
	const struct snapkvd_value_type *type;
	enum where in;
	size_t off;
	struct snapkvd_value_spec spec;
	bool reloadable;
};

#define RELOAD	  true
#define RESTART	  false
#define D_OFF(m)  offsetof(struct snapkvd_config, m)
#define P_OFF(m)  offsetof(struct snapkvd_policy_config, m)
#define D_SIZE(m) sizeof(((struct snapkvd_config *)0)->m)
#define P_SIZE(m) sizeof(((struct snapkvd_policy_config *)0)->m)
/* an unsigned in lo..hi, a size in lo..hi, in the daemon's struct */
#define UINT(n, l, h, rl)                                                                          \
	{                                                                                          \
#n, &snapkvd_value_uint_type, IN_DAEMON, D_OFF(n),                                 \
		    {.lo = l, .hi = h, .size = D_SIZE(n) }, rl                                     \
	}
#define SIZE(n, l, rl)                                                                             \
	{                                                                                          \
#n, &snapkvd_value_size_type, IN_DAEMON, D_OFF(n),                                 \
		    {.lo = l, .hi = UINT64_MAX, .size = D_SIZE(n) }, rl                            \
	}
#define IDS(n)                                                                                     \
	{                                                                                          \
#n, &snapkvd_value_ids_type, IN_DAEMON, D_OFF(n),                                  \
		    {.size = D_SIZE(n), .count = D_OFF(n_##n) - D_OFF(n) }, RELOAD                 \
	}
/* the same in the pressure policy's struct, named by key and field */
#define P_UINT(k, m, l, h)                                                                         \
	{                                                                                          \
		k, &snapkvd_value_uint_type, IN_POLICY, P_OFF(m),                                  \
		    {.lo = l, .hi = h, .size = P_SIZE(m)}, RELOAD                                  \
	}
#define P_TYPE(k, t, m)                                                                            \
	{                                                                                          \
		k, &snapkvd_value_##t##_type, IN_POLICY, P_OFF(m), {.size = P_SIZE(m)}, RELOAD     \
	}

static const char *const backends[] = {"host", "cuda", NULL};
/* metrics_http_tenants, indexed by enum snapkvd_metrics_tenants */
static const char *const http_tenants[] = {"all", "aggregate", "none", NULL};

/* metrics_listen's field: listen, addr and addr_len, the first of http */
_Static_assert(offsetof(struct snapkvd_http_config, listen) == 0 &&
		   offsetof(struct snapkvd_http_config, addr_len) <
		       offsetof(struct snapkvd_http_config, max_request),
	       "metrics_listen's field is the start of struct snapkvd_http_config");

static const struct key keys[] = {
    {"socket",
     &snapkvd_value_path_type,
     IN_DAEMON,
     D_OFF(socket_path),
     {.lo = 1,
      .size = D_SIZE(socket_path),
      .expect = "socket must be an absolute path shorter than 108 bytes"},
     RESTART},
    {"backend",
     &snapkvd_value_word_type,
     IN_DAEMON,
     D_OFF(backend),
     {.size = D_SIZE(backend), .names = backends, .expect = "backend must be host or cuda"},
     RESTART},
    /* --backend cuda: the devices opened (all: every one visible) */
    {"devices",
     &snapkvd_value_devices_type,
     IN_DAEMON,
     D_OFF(devices),
     {.size = D_SIZE(devices), .count = D_OFF(n_devices) - D_OFF(devices)},
     RESTART},
    SIZE(pool_bytes, 1 << 20, RELOAD),
    SIZE(session_arena_bytes, 1 << 20, RESTART),
    SIZE(arena_cache_bytes, 0, RELOAD),
    SIZE(tenant_quota_bytes, 0, RELOAD),
    SIZE(max_buffer_bytes, 4096, RELOAD),
    SIZE(max_scratch_bytes, 0, RELOAD),
    SIZE(max_tenant_mapped_bytes, 4096, RELOAD),
    SIZE(max_mapped_bytes, 4096, RELOAD),
    SIZE(max_request_macs, 1 << 20, RELOAD),
    SIZE(max_request_bytes, 1 << 20, RELOAD),
    IDS(allow_uids),
    IDS(allow_gids),
    IDS(admin_uids),
    UINT(threads, 0, 1024, RESTART),
    UINT(max_sessions, 1, 65536, RELOAD),
    UINT(max_buffers, 1, 65536, RELOAD),
    UINT(max_caches, 1, 1u << 20, RELOAD),
    UINT(max_layers, 1, 4096, RELOAD),
    UINT(max_heads, 1, 4096, RELOAD),
    UINT(max_head_dim, 1, 4096, RELOAD),
    UINT(max_prompt_len, 1, 1u << 24, RELOAD),
    UINT(max_reserve, 0, 1u << 24, RELOAD),
    UINT(max_decode, 0, 1u << 24, RELOAD),
    /* the ring's indices are masked: a power of two */
    {"sq_entries",
     &snapkvd_value_uint_type,
     IN_DAEMON,
     D_OFF(sq_entries),
     {.lo = 2, .hi = 4096, .pow2 = true, .size = D_SIZE(sq_entries)},
     RESTART},
    /* argument slots start on cache lines */
    {"slot_bytes",
     &snapkvd_value_uint_type,
     IN_DAEMON,
     D_OFF(slot_bytes),
     {.lo = 4096, .hi = 1u << 20, .multiple = 64, .size = D_SIZE(slot_bytes)},
     RESTART},
    UINT(poll_idle_us, 0, 1000000, RELOAD),
    UINT(watchdog_ms, 10, 60000, RELOAD),
    UINT(workers, 0, 64, RESTART),
    UINT(prefill_wait_max_ms, 1, 600000, RELOAD),
    UINT(max_sessions_per_tenant, 1, 65536, RELOAD),
    UINT(max_admin_sessions, 1, 4096, RELOAD),
    UINT(max_handshakes, 1, 65536, RELOAD),
    UINT(hello_timeout_ms, 100, 60000, RELOAD),
    UINT(max_tenant_buffers, 1, 1u << 20, RELOAD),
    UINT(max_group_size, 1, 4096, RELOAD),
    UINT(min_window, 1, 1u << 22, RELOAD),
    UINT(group_timeout_ms, 1, 3600000, RELOAD),
    UINT(max_group_timeout_ms, 1, 3600000, RELOAD),
    UINT(max_tenant_groups, 1, 65536, RELOAD),
    /* registered KV pools and block tables (snapkvd-kvpool.h) */
    UINT(max_session_pools, 1, 4096, RELOAD),
    UINT(max_block_table, 1, 1u << 28, RELOAD),
    UINT(max_writeback_ranges, 1024, 1u << 30, RELOAD),
    /* admin answers: slices and rate limits (snapkvd-adminq.h) */
    UINT(admin_slice_caches, 1, 4096, RELOAD),
    UINT(admin_session_rate, 0, 1000000, RELOAD),
    UINT(admin_session_burst, 1, 1000000, RELOAD),
    UINT(admin_tenant_rate, 0, 1000000, RELOAD),
    UINT(admin_tenant_burst, 1, 1000000, RELOAD),
    UINT(admin_root_rate, 0, 1000000, RELOAD),
    UINT(admin_root_burst, 1, 1000000, RELOAD),
    {"log_level",
     &snapkvd_value_level_type,
     IN_DAEMON,
     D_OFF(log_level),
     {.size = D_SIZE(log_level)},
     RELOAD},
    /* the pressure policy */
    P_TYPE("pressure_high", watermark, pressure.high_enter),
    P_TYPE("pressure_high_leave", watermark, pressure.high_leave),
    P_TYPE("pressure_critical", watermark, pressure.critical_enter),
    P_TYPE("pressure_critical_leave", watermark, pressure.critical_leave),
    P_TYPE("pressure_actions", actions, pressure),
    P_TYPE("pressure_scale_high", fraction, pressure.scale_high),
    P_TYPE("pressure_scale_critical", fraction, pressure.scale_critical),
    P_TYPE("pressure_guaranteed_share", fraction, pressure.guaranteed_share),
    P_UINT("pressure_min_dwell_ms", pressure.min_dwell_ms, 0, 3600 * 1000),
    P_TYPE("hook_dir", path, hook_dir),
    P_UINT("hook_timeout_ms", hooks.timeout_ms, 1, 3600 * 1000),
    P_UINT("hook_max", hooks.max_hooks, 1, SNAPKVD_HOOKS_MAX_LIMIT),
    {"hook_max_output",
     &snapkvd_value_size_type,
     IN_POLICY,
     P_OFF(hooks.max_output),
     {.hi = SNAPKVD_HOOK_OUTPUT_LIMIT, .size = P_SIZE(hooks.max_output)},
     RELOAD},
    P_TYPE("hook_ledger_json", path, hook_ledger_json),
    P_UINT("hook_ledger_max_caches", hook_ledger_max_caches, 1, 1u << 20),
    {"tenant_quota",
     &snapkvd_value_quota_type,
     IN_POLICY,
     P_OFF(quotas),
     {.size = P_SIZE(quotas), .count = P_OFF(n_quotas) - P_OFF(quotas)},
     RELOAD},
    P_TYPE("metrics_textfile", path, metrics_textfile),
    P_UINT("metrics_interval_s", metrics_interval_s, 1, 86400),
    /* the Prometheus listener (snapkvd-http.h): bound at start-up */
    {"metrics_listen",
     &snapkvd_value_listen_type,
     IN_DAEMON,
     D_OFF(http),
     {.size = offsetof(struct snapkvd_http_config, max_request)},
     RESTART},
    {"metrics_http_max_request",
     &snapkvd_value_size_type,
     IN_DAEMON,
     D_OFF(http.max_request),
     {.lo = 256, .hi = 65536, .size = D_SIZE(http.max_request)},
     RESTART},
    {"metrics_http_tenants",
     &snapkvd_value_choice_type,
     IN_DAEMON,
     D_OFF(http.tenants),
     {.size = D_SIZE(http.tenants),
      .names = http_tenants,
      .expect = "metrics_http_tenants must be none, aggregate or all"},
     RESTART},
    {"metrics_http_max_connections",
     &snapkvd_value_uint_type,
     IN_DAEMON,
     D_OFF(http.max_connections),
     {.lo = 1, .hi = 1024, .size = D_SIZE(http.max_connections)},
     RESTART},
    {"metrics_http_timeout_ms",
     &snapkvd_value_uint_type,
     IN_DAEMON,
     D_OFF(http.timeout_ms),
     {.lo = 100, .hi = 600000, .size = D_SIZE(http.timeout_ms)},
     RESTART},
    {"metrics_http_cache_ms",
     &snapkvd_value_uint_type,
     IN_DAEMON,
     D_OFF(http.cache_ms),
     {.hi = 60000, .size = D_SIZE(http.cache_ms)},
     RESTART},
};
#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

static const struct key *find_key(const char *name)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (!strcmp(name, keys[i].name))
			return &keys[i];
	return NULL;
}

static void *field_of(const struct key *k, struct snapkvd_config *c)
{
	return (k->in == IN_POLICY ? (char *)&c->policy : (char *)c) + k->off;
}

static const void *cfield_of(const struct key *k, const struct snapkvd_config *c)
{
	return (k->in == IN_POLICY ? (const char *)&c->policy : (const char *)c) + k->off;
}

/* The reason in err (may be NULL), with "prefix: " before it; -EINVAL. */
static int prefixed(struct skv_error *err, const char *prefix)
{
	char why[sizeof(err->msg)];

	if (!err)
		return -EINVAL;
	snprintf(why, sizeof(why), "%s", err->msg);
	return snapkvd_value_fail(err, "%s: %s", prefix, why);
}

static int set_key(struct snapkvd_config *c, const char *name, const char *v, struct skv_error *err)
{
	const struct key *k = find_key(name);

	if (!k)
		return snapkvd_value_fail(err, "unknown key");
	/* a file's lines are bounded already; an option's value is not */
	if (strlen(v) > SNAPKVD_VALUE_MAX)
		return snapkvd_value_fail(err, "value longer than %d bytes", SNAPKVD_VALUE_MAX);
	return k->type->parse(v, field_of(k, c), &k->spec, err);
}

int snapkvd_policy_config_set(struct snapkvd_policy_config *c, const char *key, const char *value,
			      struct skv_error *err)
{
	const struct key *k;
	int r;

	if (!key || !value)
		return snapkvd_value_fail(err, "no key or no value");
	k = find_key(key);
	if (!k || k->in != IN_POLICY)
		return -ENOENT;
	r = strlen(value) > SNAPKVD_VALUE_MAX
		? snapkvd_value_fail(err, "value longer than %d bytes", SNAPKVD_VALUE_MAX)
		: k->type->parse(value, (char *)c + k->off, &k->spec, err);
	if (r < 0)
		prefixed(err, key);
	return r;
}

int snapkvd_policy_config_check(const struct snapkvd_policy_config *c, struct skv_error *err)
{
	char why[sizeof(err->msg)] = "";
	int r = snapkvd_pressure_config_check(&c->pressure, why, sizeof(why));

	if (r < 0)
		snapkvd_value_fail(err, "%s", why);
	return r;
}

const struct snapkvd_tenant_quota *
snapkvd_policy_config_quota(const struct snapkvd_policy_config *c, uid_t uid)
{
	for (unsigned i = 0; i < c->n_quotas; i++)
		if (c->quotas[i].uid == uid)
			return &c->quotas[i];
	return NULL;
}

/* ------------------------------------------------------ the file format */

static char *trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = 0;
	return s;
}

/* One line (NUL-terminated, trimmed or not) into c. */
static int parse_line(struct snapkvd_config *c, char *line, unsigned lineno, struct skv_error *err)
{
	char *l = trim(line), *eq, *k;

	if (!*l || *l == '#' || *l == ';')
		return 0;
	eq = strchr(l, '=');
	if (!eq)
		return snapkvd_value_fail(err, "line %u: expected key = value", lineno);
	*eq = 0;
	k = trim(l);
	if (set_key(c, k, trim(eq + 1), err) < 0) {
		char where[64 + 24];

		snprintf(where, sizeof(where), "line %u: %.64s", lineno, k);
		return prefixed(err, where);
	}
	return 0;
}

int snapkvd_config_parse(struct snapkvd_config *c, const char *text, size_t len,
			 struct skv_error *err)
{
	struct snapkvd_config tmp = *c;
	char line[SNAPKVD_CONFIG_MAX_LINE + 1];
	size_t pos = 0;
	unsigned lineno = 0;
	int r;

	if (len > SNAPKVD_CONFIG_MAX_BYTES) {
		snapkvd_value_fail(err, "config larger than %u bytes", SNAPKVD_CONFIG_MAX_BYTES);
		return -EFBIG;
	}
	while (pos < len) {
		size_t end = pos, n;

		while (end < len && text[end] != '\n')
			end++;
		n = end - pos;
		lineno++;
		if (n > SNAPKVD_CONFIG_MAX_LINE)
			return snapkvd_value_fail(err, "line %u: longer than %u bytes", lineno,
						  SNAPKVD_CONFIG_MAX_LINE);
		memcpy(line, text + pos, n);
		line[n] = 0;
		pos = end + 1;
		if (memchr(line, 0, n))
			return snapkvd_value_fail(err, "line %u: NUL byte", lineno);
		r = parse_line(&tmp, line, lineno, err);
		if (r < 0)
			return r;
	}
	r = snapkvd_policy_config_check(&tmp.policy, err);
	if (r < 0)
		return prefixed(err, "pressure");
	*c = tmp;
	return 0;
}

int snapkvd_config_load(struct snapkvd_config *c, const char *path, struct skv_error *err)
{
	char *buf;
	ssize_t n;
	size_t have = 0;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		snapkvd_value_fail(err, "%s", strerror(-r));
		return r;
	}
	buf = malloc(SNAPKVD_CONFIG_MAX_BYTES + 1);
	if (!buf) {
		close(fd);
		snapkvd_value_fail(err, "%s", strerror(ENOMEM));
		return -ENOMEM;
	}
	while ((n = read(fd, buf + have, SNAPKVD_CONFIG_MAX_BYTES + 1 - have)) > 0) {
		have += n;
		if (have > SNAPKVD_CONFIG_MAX_BYTES)
			break;
	}
	r = n < 0 ? -errno : 0;
	close(fd);
	if (r == 0)
		r = snapkvd_config_parse(c, buf, have, err);
	else
		snapkvd_value_fail(err, "read: %s", strerror(-r));
	free(buf);
	return r;
}

int snapkvd_config_set(struct snapkvd_config *c, const char *key, const char *value,
		       struct skv_error *err)
{
	struct snapkvd_config tmp = *c;
	int r;

	r = set_key(&tmp, key, value, err);
	if (r < 0)
		return r;
	r = snapkvd_policy_config_check(&tmp.policy, err);
	if (r < 0)
		return prefixed(err, "pressure");
	*c = tmp;
	return 0;
}

/* ------------------------------------------------- the effective config */

int snapkvd_config_dump(const struct snapkvd_config *c, char **ret)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return -ENOMEM;
	for (size_t i = 0; i < N_KEYS; i++)
		keys[i].type->dump(f, keys[i].name, cfield_of(&keys[i], c), &keys[i].spec);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		return -ENOMEM;
	}
	*ret = buf;
	return 0;
}

/* A key's line(s) as --check-config prints them; NULL without memory. */
static char *key_text(const struct key *k, const struct snapkvd_config *c)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return NULL;
	k->type->dump(f, k->name, cfield_of(k, c), &k->spec);
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

size_t snapkvd_config_keep_running(struct snapkvd_config *next, const struct snapkvd_config *cur,
				   const char **ret_kept, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < N_KEYS; i++) {
		const struct key *k = &keys[i];
		char *a, *b;
		bool same;

		if (k->reloadable)
			continue;
		a = key_text(k, next);
		b = key_text(k, cur);
		same = a && b && !strcmp(a, b);
		free(a);
		free(b);
		memcpy(field_of(k, next), cfield_of(k, cur), k->spec.size);
		if (k->spec.count)
			memcpy((char *)field_of(k, next) + k->spec.count,
			       (const char *)cfield_of(k, cur) + k->spec.count, sizeof(unsigned));
		if (!same && n++ < max)
			ret_kept[n - 1] = k->name;
	}
	return n;
}

int snapkvd_config_allows(const struct snapkvd_config *c, uid_t uid, gid_t gid)
{
	if (!c->n_allow_uids && !c->n_allow_gids)
		return 1;
	for (unsigned i = 0; i < c->n_allow_uids; i++)
		if (c->allow_uids[i] == uid)
			return 1;
	for (unsigned i = 0; i < c->n_allow_gids; i++)
		if (c->allow_gids[i] == gid)
			return 1;
	return 0;
}

int snapkvd_config_is_admin(const struct snapkvd_config *c, uid_t uid)
{
	if (uid == 0 || uid == geteuid())
		return 1;
	for (unsigned i = 0; i < c->n_admin_uids; i++)
		if (c->admin_uids[i] == uid)
			return 1;
	return 0;
}
