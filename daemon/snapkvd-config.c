// SPDX-License-Identifier: MIT
/* Configuration parsing with limits; see snapkvd-config.h. */
#include "snapkvd-config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
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
	c->max_buffers = 256;
	c->max_caches = 4096;
	c->max_layers = 1024;
	c->max_heads = 1024;
	c->max_head_dim = 1024;
	c->max_prompt_len = 1u << 21;
	c->max_reserve = 1u << 20;
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
	c->http.tenants = SNAPKVD_METRICS_TENANTS_AGGREGATE;
}

/* ------------------------------------------- the pressure policy's keys */

static int bad(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

void snapkvd_policy_config_init(struct snapkvd_policy_config *c)
{
	memset(c, 0, sizeof(*c));
	snapkvd_pressure_config_init(&c->pressure);
	snapkvd_hooks_config_init(&c->hooks);
	c->metrics_interval_s = 15;
	c->hook_ledger_max_caches = 4096;
}

static int set_path(char *dst, size_t cap, const char *v, const char *key, char *err, size_t errlen)
{
	if (strlen(v) >= cap)
		return bad(err, errlen, "%s: path too long", key);
	if (*v && *v != '/')
		return bad(err, errlen, "%s: must be an absolute path", key);
	snprintf(dst, cap, "%s", v);
	return 0;
}

/* UID:BYTES[:SHARE] */
static int parse_quota(struct snapkvd_policy_config *c, const char *v, char *err, size_t errlen)
{
	char buf[128], *uid_s, *bytes_s, *share_s, *save = NULL;
	struct snapkvd_tenant_quota q = {.guaranteed_share = -1.0};
	uint32_t uid;

	if (strlen(v) >= sizeof(buf))
		return bad(err, errlen, "tenant_quota: too long");
	snprintf(buf, sizeof(buf), "%s", v);
	uid_s = strtok_r(buf, ":", &save);
	bytes_s = strtok_r(NULL, ":", &save);
	share_s = strtok_r(NULL, ":", &save);
	if (!uid_s || !bytes_s || strtok_r(NULL, ":", &save))
		return bad(err, errlen, "tenant_quota: expected UID:BYTES[:SHARE], got '%s'", v);
	if (snapkvd_value_u32(uid_s, 0, UINT32_MAX - 1, &uid) < 0)
		return bad(err, errlen, "tenant_quota: bad uid '%s'", uid_s);
	if (snapkvd_parse_size(bytes_s, &q.quota_bytes) < 0)
		return bad(err, errlen, "tenant_quota: bad size '%s'", bytes_s);
	if (share_s && snapkvd_value_fraction(share_s, &q.guaranteed_share) < 0)
		return bad(err, errlen, "tenant_quota: bad share '%s' (0..1 or 0%%..100%%)",
			   share_s);
	q.uid = (uid_t)uid;
	for (unsigned i = 0; i < c->n_quotas; i++) {
		if (c->quotas[i].uid == q.uid) {
			c->quotas[i] = q; /* a later line wins, as for every key */
			return 0;
		}
	}
	if (c->n_quotas == SNAPKVD_POLICY_MAX_TENANT_QUOTAS)
		return bad(err, errlen, "tenant_quota: at most %d tenants",
			   SNAPKVD_POLICY_MAX_TENANT_QUOTAS);
	c->quotas[c->n_quotas++] = q;
	return 0;
}

int snapkvd_policy_config_set(struct snapkvd_policy_config *c, const char *key, const char *value,
			      char *err, size_t errlen)
{
	struct snapkvd_pressure_config *p = &c->pressure;
	struct snapkvd_watermark *wm = NULL;
	double *frac = NULL;
	uint32_t u;
	uint64_t b;

	if (!key || !value)
		return -EINVAL;
	if (strcmp(key, "pressure_high") == 0)
		wm = &p->high_enter;
	else if (strcmp(key, "pressure_high_leave") == 0)
		wm = &p->high_leave;
	else if (strcmp(key, "pressure_critical") == 0)
		wm = &p->critical_enter;
	else if (strcmp(key, "pressure_critical_leave") == 0)
		wm = &p->critical_leave;
	if (wm) {
		if (snapkvd_watermark_parse(value, wm) < 0)
			return bad(err, errlen, "%s: expected a percentage, a fraction or bytes",
				   key);
		return 0;
	}
	if (strcmp(key, "pressure_actions") == 0) {
		if (snapkvd_pressure_order_parse(value, p) < 0)
			return bad(
			    err, errlen,
			    "%s: comma-separated notify, hooks, scale, evict, refuse; each once",
			    key);
		return 0;
	}
	if (strcmp(key, "pressure_scale_high") == 0)
		frac = &p->scale_high;
	else if (strcmp(key, "pressure_scale_critical") == 0)
		frac = &p->scale_critical;
	else if (strcmp(key, "pressure_guaranteed_share") == 0)
		frac = &p->guaranteed_share;
	if (frac) {
		if (snapkvd_value_fraction(value, frac) < 0)
			return bad(err, errlen, "%s: expected 0..1 or 0%%..100%%", key);
		return 0;
	}
	if (strcmp(key, "hook_dir") == 0)
		return set_path(c->hook_dir, sizeof(c->hook_dir), value, key, err, errlen);
	if (strcmp(key, "hook_ledger_json") == 0)
		return set_path(c->hook_ledger_json, sizeof(c->hook_ledger_json), value, key, err,
				errlen);
	if (strcmp(key, "hook_ledger_max_caches") == 0) {
		if (snapkvd_value_u32(value, 1, 1u << 20, &u) < 0)
			return bad(err, errlen, "%s: 1..1048576", key);
		c->hook_ledger_max_caches = u;
		return 0;
	}
	if (strcmp(key, "metrics_textfile") == 0)
		return set_path(c->metrics_textfile, sizeof(c->metrics_textfile), value, key, err,
				errlen);
	if (strcmp(key, "pressure_min_dwell_ms") == 0) {
		if (snapkvd_value_u32(value, 0, 3600 * 1000, &u) < 0)
			return bad(err, errlen, "%s: 0..3600000", key);
		p->min_dwell_ms = u;
		return 0;
	}
	if (strcmp(key, "hook_timeout_ms") == 0) {
		if (snapkvd_value_u32(value, 1, 3600 * 1000, &u) < 0)
			return bad(err, errlen, "%s: 1..3600000", key);
		c->hooks.timeout_ms = u;
		return 0;
	}
	if (strcmp(key, "hook_max") == 0) {
		if (snapkvd_value_u32(value, 1, SNAPKVD_HOOKS_MAX_LIMIT, &u) < 0)
			return bad(err, errlen, "%s: 1..%d", key, SNAPKVD_HOOKS_MAX_LIMIT);
		c->hooks.max_hooks = u;
		return 0;
	}
	if (strcmp(key, "hook_max_output") == 0) {
		if (snapkvd_parse_size(value, &b) < 0 || b > SNAPKVD_HOOK_OUTPUT_LIMIT)
			return bad(err, errlen, "%s: 0..%d bytes", key, SNAPKVD_HOOK_OUTPUT_LIMIT);
		c->hooks.max_output = (uint32_t)b;
		return 0;
	}
	if (strcmp(key, "metrics_interval_s") == 0) {
		if (snapkvd_value_u32(value, 1, 86400, &u) < 0)
			return bad(err, errlen, "%s: 1..86400", key);
		c->metrics_interval_s = u;
		return 0;
	}
	if (strcmp(key, "tenant_quota") == 0)
		return parse_quota(c, value, err, errlen);
	return -ENOENT;
}

int snapkvd_policy_config_check(const struct snapkvd_policy_config *c, char *err, size_t errlen)
{
	return snapkvd_pressure_config_check(&c->pressure, err, errlen);
}

const struct snapkvd_tenant_quota *
snapkvd_policy_config_quota(const struct snapkvd_policy_config *c, uid_t uid)
{
	for (unsigned i = 0; i < c->n_quotas; i++)
		if (c->quotas[i].uid == uid)
			return &c->quotas[i];
	return NULL;
}

/* ------------------------------------------------------ the daemon's keys */

/*
 * One table of every daemon key: its name, the parser that sets it (into
 * the field at `off`, its count at `n_off` for a list), the bounds the
 * parser checks, and which part of --check-config's dump it belongs to.
 * The pressure policy's keys (pressure_*, hook_*, metrics_textfile,
 * metrics_interval_s, tenant_quota) are snapkvd_policy_config_set()'s, as
 * snapkvctl's runtime changes set them on their own.
 */
struct key;
typedef int key_set_fn(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
		       size_t whylen);
enum key_dump { DUMP_UINT, DUMP_SIZE, DUMP_HTTP_UINT, DUMP_OWN };
struct key {
	const char *name;
	key_set_fn *set;
	size_t off, n_off;
	uint64_t lo, hi;
	enum key_dump dump;
};

/* An integer in the key's bounds, and for sq_entries (the ring's masks) a
 * power of two, for slot_bytes (cache-line aligned slots) a multiple of 64. */
static int set_uint(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
		    size_t whylen)
{
	unsigned x;

	if (snapkvd_value_uint(v, (unsigned)k->lo, (unsigned)k->hi, &x) < 0) {
		snprintf(why, whylen, "not an integer in %u..%u", (unsigned)k->lo, (unsigned)k->hi);
		return -EINVAL;
	}
	if (k->off == offsetof(struct snapkvd_config, sq_entries) && (x & (x - 1))) {
		snprintf(why, whylen, "not a power of two");
		return -EINVAL;
	}
	if (k->off == offsetof(struct snapkvd_config, slot_bytes) && x % 64) {
		snprintf(why, whylen, "not a multiple of 64");
		return -EINVAL;
	}
	*(unsigned *)((char *)c + k->off) = x;
	return 0;
}

static int set_size(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
		    size_t whylen)
{
	char lo[24], hi[24];
	uint64_t x;

	snapkvd_value_fmt_size(k->lo, lo, sizeof(lo));
	snapkvd_value_fmt_size(k->hi, hi, sizeof(hi));
	if (snapkvd_parse_size(v, &x) < 0) {
		snprintf(why, whylen, "not a size (4096, 64K, 1M, 2G; at least %s)", lo);
		return -EINVAL;
	}
	if (x < k->lo || x > k->hi) {
		if (k->hi == UINT64_MAX)
			snprintf(why, whylen, "%s is below the minimum %s (%llu bytes)", v, lo,
				 (unsigned long long)k->lo);
		else
			snprintf(why, whylen, "%s is outside %s..%s (%llu..%llu bytes)", v, lo, hi,
				 (unsigned long long)k->lo, (unsigned long long)k->hi);
		return -EINVAL;
	}
	*(uint64_t *)((char *)c + k->off) = x;
	return 0;
}

static int set_listen(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
		      size_t whylen)
{
	const char *w = "";
	int r = snapkvd_value_listen(&c->http, v, &w);

	(void)k;
	if (r < 0)
		snprintf(why, whylen, "%s", w);
	return r;
}

static int set_socket(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
		      size_t whylen)
{
	(void)k;
	if (*v != '/' || strlen(v) >= sizeof(c->socket_path)) {
		snprintf(why, whylen, "socket must be an absolute path shorter than 108 bytes");
		return -EINVAL;
	}
	snprintf(c->socket_path, sizeof(c->socket_path), "%s", v);
	return 0;
}

static int set_backend(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
		       size_t whylen)
{
	(void)k;
	if (strcmp(v, "host") && strcmp(v, "cuda")) {
		snprintf(why, whylen, "backend must be host or cuda");
		return -EINVAL;
	}
	snprintf(c->backend, sizeof(c->backend), "%s", v);
	return 0;
}

/* "all", or up to SNAPKVD_CONFIG_MAX_DEVICES distinct CUDA ordinals separated
 * by spaces or commas */
static int set_devices(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
		       size_t whylen)
{
	uint32_t ids[SNAPKVD_VALUE_MAX_IDS];
	unsigned n = 0;

	(void)k;
	if (!strcmp(v, "all"))
		return c->n_devices = 0, 0;
	if (snapkvd_value_idlist(v, &n, ids) < 0 || n == 0 || n > SNAPKVD_CONFIG_MAX_DEVICES) {
		snprintf(why, whylen,
			 "devices must be all or up to %d CUDA device ordinals separated by "
			 "spaces or commas",
			 SNAPKVD_CONFIG_MAX_DEVICES);
		return -EINVAL;
	}
	for (unsigned i = 0; i < n; i++) {
		for (unsigned k2 = 0; k2 < i; k2++)
			if (ids[k2] == ids[i])
				return snprintf(why, whylen, "devices names %u twice", ids[i]),
				       -EINVAL;
		c->devices[i] = (int)ids[i];
	}
	c->n_devices = n;
	return 0;
}

static int set_log_level(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
			 size_t whylen)
{
	int r = snapkvd_log_parse_level(v);

	(void)k;
	if (r < 0) {
		snprintf(why, whylen, "log_level must be error, warning, notice, info or debug");
		return r;
	}
	c->log_level = r;
	return 0;
}

/* metrics_http_tenants, indexed by enum snapkvd_metrics_tenants */
static const char *const http_tenants[] = {"all", "aggregate", "none"};

static int set_http_tenants(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
			    size_t whylen)
{
	(void)k;
	for (int i = 0; i < (int)(sizeof(http_tenants) / sizeof(http_tenants[0])); i++)
		if (!strcmp(v, http_tenants[i])) {
			c->http.tenants = i;
			return 0;
		}
	snprintf(why, whylen, "metrics_http_tenants must be none, aggregate or all");
	return -EINVAL;
}

static int set_ids(struct snapkvd_config *c, const struct key *k, const char *v, char *why,
		   size_t whylen)
{
	if (snapkvd_value_idlist(v, (unsigned *)((char *)c + k->n_off),
				 (uint32_t *)((char *)c + k->off)) < 0) {
		snprintf(why, whylen,
			 "expected up to 64 numeric ids separated by spaces or commas");
		return -EINVAL;
	}
	return 0;
}

#define OFF(n) offsetof(struct snapkvd_config, n)
#define U(n, lo, hi)                                                                               \
	{                                                                                          \
#n, set_uint, OFF(n), 0, lo, hi, DUMP_UINT                                         \
	}
#define S(n, lo)                                                                                   \
	{                                                                                          \
#n, set_size, OFF(n), 0, lo, UINT64_MAX, DUMP_SIZE                                 \
	}
#define IDS(n)                                                                                     \
	{                                                                                          \
#n, set_ids, OFF(n), OFF(n_##n), 0, 0, DUMP_OWN                                    \
	}
#define OWN(n, fn)                                                                                 \
	{                                                                                          \
#n, fn, 0, 0, 0, 0, DUMP_OWN                                                       \
	}
static const struct key keys[] = {
    U(threads, 0, 1024),
    U(max_sessions, 1, 65536),
    U(max_buffers, 1, 65536),
    U(max_caches, 1, 1u << 20),
    U(max_layers, 1, 4096),
    U(max_heads, 1, 4096),
    U(max_head_dim, 1, 4096),
    U(max_prompt_len, 1, 1u << 24),
    U(max_reserve, 0, 1u << 24),
    U(sq_entries, 2, 4096),
    U(slot_bytes, 4096, 1u << 20),
    U(poll_idle_us, 0, 1000000),
    U(watchdog_ms, 10, 60000),
    U(workers, 0, 64),
    U(prefill_wait_max_ms, 1, 600000),
    U(max_sessions_per_tenant, 1, 65536),
    U(max_admin_sessions, 1, 4096),
    U(max_handshakes, 1, 65536),
    U(hello_timeout_ms, 100, 60000),
    U(max_tenant_buffers, 1, 1u << 20),
    U(max_group_size, 1, 4096),
    U(min_window, 1, 1u << 22),
    U(group_timeout_ms, 1, 3600000),
    U(max_group_timeout_ms, 1, 3600000),
    U(max_tenant_groups, 1, 65536),
    /* the Prometheus listener's limits (snapkvd-http.h) */
    {"metrics_http_max_connections", set_uint, OFF(http.max_connections), 0, 1, 1024,
     DUMP_HTTP_UINT},
    {"metrics_http_timeout_ms", set_uint, OFF(http.timeout_ms), 0, 100, 600000, DUMP_HTTP_UINT},
    S(pool_bytes, 1 << 20),
    S(session_arena_bytes, 1 << 20),
    S(arena_cache_bytes, 0),
    S(tenant_quota_bytes, 0),
    S(max_buffer_bytes, 4096),
    S(max_scratch_bytes, 0),
    S(max_tenant_mapped_bytes, 4096),
    S(max_mapped_bytes, 4096),
    S(max_request_macs, 1 << 20),
    S(max_request_bytes, 1 << 20),
    {"metrics_http_max_request", set_size, OFF(http.max_request), 0, 256, 65536, DUMP_OWN},
    OWN(metrics_listen, set_listen),
    OWN(metrics_http_tenants, set_http_tenants),
    OWN(socket, set_socket),
    OWN(backend, set_backend),
    OWN(devices, set_devices),
    OWN(log_level, set_log_level),
    IDS(admin_uids),
    IDS(allow_uids),
    IDS(allow_gids),
};
#define N_KEYS (sizeof(keys) / sizeof(keys[0]))

static int set_key(struct snapkvd_config *c, const char *name, const char *v, char *why,
		   size_t whylen)
{
	int r;

	for (size_t i = 0; i < N_KEYS; i++)
		if (!strcmp(name, keys[i].name))
			return keys[i].set(c, &keys[i], v, why, whylen);
	/* the operations keys (pressure_*, hook_*, metrics_*, tenant_quota) */
	r = snapkvd_policy_config_set(&c->policy, name, v, why, whylen);
	if (r != -ENOENT)
		return r;
	snprintf(why, whylen, "unknown key");
	return -EINVAL;
}

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

int snapkvd_config_parse(struct snapkvd_config *c, const char *text, size_t len, char *err,
			 size_t errlen)
{
	struct snapkvd_config tmp = *c;
	char line[SNAPKVD_CONFIG_MAX_LINE + 1];
	size_t pos = 0;
	unsigned lineno = 0;

	if (len > SNAPKVD_CONFIG_MAX_BYTES) {
		snprintf(err, errlen, "config larger than %u bytes", SNAPKVD_CONFIG_MAX_BYTES);
		return -EFBIG;
	}
	while (pos < len) {
		size_t end = pos, n;
		char *l, *eq, *k, *v;
		char why[256] = "";
		int r;

		while (end < len && text[end] != '\n')
			end++;
		n = end - pos;
		lineno++;
		if (n > SNAPKVD_CONFIG_MAX_LINE) {
			snprintf(err, errlen, "line %u: longer than %u bytes", lineno,
				 SNAPKVD_CONFIG_MAX_LINE);
			return -EINVAL;
		}
		memcpy(line, text + pos, n);
		line[n] = 0;
		pos = end + 1;
		if (memchr(line, 0, n)) {
			snprintf(err, errlen, "line %u: NUL byte", lineno);
			return -EINVAL;
		}
		l = trim(line);
		if (!*l || *l == '#' || *l == ';')
			continue;
		eq = strchr(l, '=');
		if (!eq) {
			snprintf(err, errlen, "line %u: expected key = value", lineno);
			return -EINVAL;
		}
		*eq = 0;
		k = trim(l);
		v = trim(eq + 1);
		r = set_key(&tmp, k, v, why, sizeof(why));
		if (r < 0) {
			snprintf(err, errlen, "line %u: %s: %s", lineno, k, why);
			return -EINVAL;
		}
	}
	if (snapkvd_policy_config_check(&tmp.policy, line, sizeof(line)) < 0) {
		snprintf(err, errlen, "pressure: %s", line);
		return -EINVAL;
	}
	*c = tmp;
	return 0;
}

int snapkvd_config_load(struct snapkvd_config *c, const char *path, char *err, size_t errlen)
{
	char *buf;
	ssize_t n;
	size_t have = 0;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return r;
	}
	buf = malloc(SNAPKVD_CONFIG_MAX_BYTES + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	while ((n = read(fd, buf + have, SNAPKVD_CONFIG_MAX_BYTES + 1 - have)) > 0) {
		have += n;
		if (have > SNAPKVD_CONFIG_MAX_BYTES)
			break;
	}
	r = n < 0 ? -errno : 0;
	close(fd);
	if (r == 0) {
		char why[SNAPKVD_CONFIG_MAX_LINE + 64] = "";

		r = snapkvd_config_parse(c, buf, have, why, sizeof(why));
		if (r < 0)
			snprintf(err, errlen, "%s: %s", path, why);
	} else {
		snprintf(err, errlen, "%s: read: %s", path, strerror(-r));
	}
	free(buf);
	return r;
}

int snapkvd_config_set(struct snapkvd_config *c, const char *key, const char *value, char *err,
		       size_t errlen)
{
	struct snapkvd_config tmp = *c;
	char why[256] = "";
	char msg[256];

	if (set_key(&tmp, key, value, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "%s", why);
		return -EINVAL;
	}
	if (snapkvd_policy_config_check(&tmp.policy, msg, sizeof(msg)) < 0) {
		snprintf(err, errlen, "pressure: %s", msg);
		return -EINVAL;
	}
	*c = tmp;
	return 0;
}

/* ------------------------------------------------- the effective config */

static void dump_size(FILE *f, const char *key, uint64_t v)
{
	char b[24];

	snapkvd_value_fmt_size(v, b, sizeof(b));
	fprintf(f, "%s = %s\n", key, b);
}

static void dump_uints(FILE *f, const struct snapkvd_config *c, enum key_dump which)
{
	for (size_t i = 0; i < N_KEYS; i++)
		if (keys[i].dump == which)
			fprintf(f, "%s = %u\n", keys[i].name,
				*(const unsigned *)((const char *)c + keys[i].off));
}

static void dump_ids(FILE *f, const char *key, const uint32_t *ids, unsigned n)
{
	fprintf(f, "%s =", key);
	for (unsigned i = 0; i < n; i++)
		fprintf(f, " %u", ids[i]);
	fputc('\n', f);
}

/* The shortest of %.15g and %.17g that reads back as the same double. */
static const char *fmt_double(double d, char b[40])
{
	snprintf(b, 40, "%.15g", d);
	if (strtod(b, NULL) != d)
		snprintf(b, 40, "%.17g", d);
	return b;
}

static void dump_double(FILE *f, const char *key, double d)
{
	char b[40];

	fprintf(f, "%s = %s\n", key, fmt_double(d, b));
}

static void dump_policy(FILE *f, const struct snapkvd_policy_config *p)
{
	const struct {
		const char *key;
		const struct snapkvd_watermark *wm;
	} wms[] = {
	    {"pressure_high", &p->pressure.high_enter},
	    {"pressure_high_leave", &p->pressure.high_leave},
	    {"pressure_critical", &p->pressure.critical_enter},
	    {"pressure_critical_leave", &p->pressure.critical_leave},
	};
	char b[128];

	for (size_t i = 0; i < sizeof(wms) / sizeof(wms[0]); i++) {
		snapkvd_watermark_format(wms[i].wm, b, sizeof(b));
		fprintf(f, "%s = %s\n", wms[i].key, b);
	}
	snapkvd_pressure_order_format(&p->pressure, b, sizeof(b));
	fprintf(f, "pressure_actions = %s\n", b);
	dump_double(f, "pressure_scale_high", p->pressure.scale_high);
	dump_double(f, "pressure_scale_critical", p->pressure.scale_critical);
	dump_double(f, "pressure_guaranteed_share", p->pressure.guaranteed_share);
	fprintf(f, "pressure_min_dwell_ms = %u\n", p->pressure.min_dwell_ms);
	fprintf(f, "hook_dir = %s\n", p->hook_dir);
	fprintf(f, "hook_timeout_ms = %u\n", p->hooks.timeout_ms);
	fprintf(f, "hook_max = %u\n", p->hooks.max_hooks);
	dump_size(f, "hook_max_output", p->hooks.max_output);
	fprintf(f, "hook_ledger_json = %s\n", p->hook_ledger_json);
	fprintf(f, "hook_ledger_max_caches = %u\n", p->hook_ledger_max_caches);
	if (!p->n_quotas)
		fprintf(f, "# tenant_quota: none\n");
	for (unsigned i = 0; i < p->n_quotas; i++) {
		snapkvd_value_fmt_size(p->quotas[i].quota_bytes, b, sizeof(b));
		fprintf(f, "tenant_quota = %u:%s", (unsigned)p->quotas[i].uid, b);
		if (p->quotas[i].guaranteed_share >= 0)
			fprintf(f, ":%s", fmt_double(p->quotas[i].guaranteed_share, b));
		fputc('\n', f);
	}
	fprintf(f, "metrics_textfile = %s\n", p->metrics_textfile);
	fprintf(f, "metrics_interval_s = %u\n", p->metrics_interval_s);
}

int snapkvd_config_dump(const struct snapkvd_config *c, char **ret)
{
	static const char *const levels[] = {"error", "warning", "notice", "info", "debug"};
	const char *level = "info";
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return -ENOMEM;
	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
		if (snapkvd_log_parse_level(levels[i]) == c->log_level)
			level = levels[i];
	fprintf(f, "socket = %s\nbackend = %s\n", c->socket_path, c->backend);
	fprintf(f, "devices = ");
	for (unsigned i = 0; i < c->n_devices; i++)
		fprintf(f, "%s%d", i ? "," : "", c->devices[i]);
	fprintf(f, "%s\n", c->n_devices ? "" : "all");
	for (size_t i = 0; i < N_KEYS; i++)
		if (keys[i].dump == DUMP_SIZE)
			dump_size(f, keys[i].name,
				  *(const uint64_t *)((const char *)c + keys[i].off));
	dump_ids(f, "allow_uids", (const uint32_t *)c->allow_uids, c->n_allow_uids);
	dump_ids(f, "allow_gids", (const uint32_t *)c->allow_gids, c->n_allow_gids);
	dump_ids(f, "admin_uids", (const uint32_t *)c->admin_uids, c->n_admin_uids);
	dump_uints(f, c, DUMP_UINT);
	fprintf(f, "log_level = %s\n", level);
	dump_policy(f, &c->policy);
	fprintf(f, "metrics_listen = %s\n", c->http.listen);
	dump_size(f, "metrics_http_max_request", c->http.max_request);
	fprintf(f, "metrics_http_tenants = %s\n", http_tenants[c->http.tenants]);
	dump_uints(f, c, DUMP_HTTP_UINT);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		return -ENOMEM;
	}
	*ret = buf;
	return 0;
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
