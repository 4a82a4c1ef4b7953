// SPDX-License-Identifier: MIT
/* Configuration keys of the operations modules; see snapkvd-ops-config.h. */
#include "snapkvd-ops-config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void snapkvd_ops_config_init(struct snapkvd_ops_config *c)
{
	memset(c, 0, sizeof(*c));
	snapkvd_pressure_config_init(&c->pressure);
	snapkvd_hooks_config_init(&c->hooks);
	c->metrics_interval_s = 15;
}

/* Bytes only: "16K", "2GiB", "4096". */
static int parse_bytes(const char *v, uint64_t *ret)
{
	struct snapkvd_watermark wm;

	if (strchr(v, '%') || strchr(v, '.'))
		return -EINVAL;
	if (strcmp(v, "0") == 0) {
		*ret = 0;
		return 0;
	}
	if (snapkvd_watermark_parse(v, &wm) < 0)
		return -EINVAL;
	*ret = wm.bytes;
	return 0;
}

/* "0.5", "50%" -> 0.5; [0, 1]. */
static int parse_fraction(const char *v, double *ret)
{
	char *end;
	double d;

	if (!*v)
		return -EINVAL;
	errno = 0;
	d = strtod(v, &end);
	if (errno || end == v)
		return -EINVAL;
	if (*end == '%') {
		d /= 100.0;
		end++;
	}
	if (*end || !(d >= 0.0 && d <= 1.0))
		return -EINVAL;
	*ret = d;
	return 0;
}

static int parse_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *ret)
{
	char *end;
	unsigned long long x;

	if (*v < '0' || *v > '9')
		return -EINVAL;
	errno = 0;
	x = strtoull(v, &end, 10);
	if (errno || *end || x < lo || x > hi)
		return -EINVAL;
	*ret = (uint32_t)x;
	return 0;
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
static int parse_quota(struct snapkvd_ops_config *c, const char *v, char *err, size_t errlen)
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
	if (parse_u32(uid_s, 0, UINT32_MAX - 1, &uid) < 0)
		return bad(err, errlen, "tenant_quota: bad uid '%s'", uid_s);
	if (parse_bytes(bytes_s, &q.quota_bytes) < 0)
		return bad(err, errlen, "tenant_quota: bad size '%s'", bytes_s);
	if (share_s && parse_fraction(share_s, &q.guaranteed_share) < 0)
		return bad(err, errlen, "tenant_quota: bad share '%s' (0..1 or 0%%..100%%)",
			   share_s);
	q.uid = (uid_t)uid;
	for (unsigned i = 0; i < c->n_quotas; i++) {
		if (c->quotas[i].uid == q.uid) {
			c->quotas[i] = q; /* a later line wins, as for every key */
			return 0;
		}
	}
	if (c->n_quotas == SNAPKVD_OPS_MAX_TENANT_QUOTAS)
		return bad(err, errlen, "tenant_quota: at most %d tenants",
			   SNAPKVD_OPS_MAX_TENANT_QUOTAS);
	c->quotas[c->n_quotas++] = q;
	return 0;
}

int snapkvd_ops_config_set(struct snapkvd_ops_config *c, const char *key, const char *value,
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
		if (parse_fraction(value, frac) < 0)
			return bad(err, errlen, "%s: expected 0..1 or 0%%..100%%", key);
		return 0;
	}
	if (strcmp(key, "hook_dir") == 0)
		return set_path(c->hook_dir, sizeof(c->hook_dir), value, key, err, errlen);
	if (strcmp(key, "hook_ledger_json") == 0)
		return set_path(c->hook_ledger_json, sizeof(c->hook_ledger_json), value, key, err,
				errlen);
	if (strcmp(key, "metrics_textfile") == 0)
		return set_path(c->metrics_textfile, sizeof(c->metrics_textfile), value, key, err,
				errlen);
	if (strcmp(key, "hook_timeout_ms") == 0) {
		if (parse_u32(value, 1, 3600 * 1000, &u) < 0)
			return bad(err, errlen, "%s: 1..3600000", key);
		c->hooks.timeout_ms = u;
		return 0;
	}
	if (strcmp(key, "hook_max") == 0) {
		if (parse_u32(value, 1, SNAPKVD_HOOKS_MAX_LIMIT, &u) < 0)
			return bad(err, errlen, "%s: 1..%d", key, SNAPKVD_HOOKS_MAX_LIMIT);
		c->hooks.max_hooks = u;
		return 0;
	}
	if (strcmp(key, "hook_max_output") == 0) {
		if (parse_bytes(value, &b) < 0 || b > SNAPKVD_HOOK_OUTPUT_LIMIT)
			return bad(err, errlen, "%s: 0..%d bytes", key, SNAPKVD_HOOK_OUTPUT_LIMIT);
		c->hooks.max_output = (uint32_t)b;
		return 0;
	}
	if (strcmp(key, "metrics_interval_s") == 0) {
		if (parse_u32(value, 1, 86400, &u) < 0)
			return bad(err, errlen, "%s: 1..86400", key);
		c->metrics_interval_s = u;
		return 0;
	}
	if (strcmp(key, "tenant_quota") == 0)
		return parse_quota(c, value, err, errlen);
	return -ENOENT;
}

int snapkvd_ops_config_check(const struct snapkvd_ops_config *c, char *err, size_t errlen)
{
	return snapkvd_pressure_config_check(&c->pressure, err, errlen);
}

const struct snapkvd_tenant_quota *snapkvd_ops_config_quota(const struct snapkvd_ops_config *c,
							    uid_t uid)
{
	for (unsigned i = 0; i < c->n_quotas; i++)
		if (c->quotas[i].uid == uid)
			return &c->quotas[i];
	return NULL;
}
