// SPDX-License-Identifier: MIT
/* snapkvd-value.c - config values; see snapkvd-value.h. */
#include "snapkvd-value.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-log.h"
#include "snapkvd-pressure.h"

int snapkvd_value_fail(struct skv_error *err, const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return -EINVAL;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	err->layer = -1;
	err->head = -1;
	return -EINVAL;
}

int snapkvd_parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -ERANGE;
	switch (*end) {
	case 'K':
	case 'k':
		shift = 10;
		end++;
		break;
	case 'M':
	case 'm':
		shift = 20;
		end++;
		break;
	case 'G':
	case 'g':
		shift = 30;
		end++;
		break;
	case 'T':
	case 't':
		shift = 40;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' && shift)
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*ret = (uint64_t)v << shift;
	return 0;
}

int snapkvd_value_uint(const char *s, unsigned lo, unsigned hi, unsigned *ret)
{
	char *end;
	unsigned long v;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return -ERANGE;
	*ret = (unsigned)v;
	return 0;
}

int snapkvd_value_idlist(const char *s, unsigned *n, uint32_t *ids)
{
	char tmp[SNAPKVD_VALUE_MAX], *save = NULL, *tok;

	snprintf(tmp, sizeof(tmp), "%s", s);
	*n = 0;
	for (tok = strtok_r(tmp, " ,\t", &save); tok; tok = strtok_r(NULL, " ,\t", &save)) {
		unsigned v;

		if (*n >= SNAPKVD_VALUE_MAX_IDS)
			return -E2BIG;
		if (snapkvd_value_uint(tok, 0, INT_MAX, &v) < 0)
			return -EINVAL;
		ids[(*n)++] = v;
	}
	return 0;
}

/* ------------------------------------------- metrics_listen's address */

static int parse_port(const char *s, uint16_t *ret)
{
	unsigned long v;
	char *end;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v < 1 || v > 65535)
		return -EINVAL;
	*ret = (uint16_t)v;
	return 0;
}

static int to_sockaddr(const char *v, struct sockaddr_storage *ss, socklen_t *ret_len,
		       struct skv_error *err)
{
	char host[SNAPKVD_HTTP_LISTEN_MAX];
	const char *port_s, *colon;
	bool v6 = *v == '[';
	uint16_t port;

	static const char expect[] =
	    "expected PORT, IPV4:PORT, [IPV6]:PORT or localhost:PORT (port 1..65535)";

	if (strlen(v) >= sizeof(host))
		return snapkvd_value_fail(err, "%s", expect);
	if (v6) {
		const char *rb = strchr(v, ']');

		if (!rb || rb[1] != ':')
			return snapkvd_value_fail(err, "%s", expect);
		snprintf(host, sizeof(host), "%.*s", (int)(rb - v - 1), v + 1);
		port_s = rb + 2;
	} else if ((colon = strrchr(v, ':'))) {
		if (memchr(v, ':', colon - v))
			return snapkvd_value_fail(err,
						  "an IPv6 address goes in brackets: [::1]:9464");
		snprintf(host, sizeof(host), "%.*s", (int)(colon - v), v);
		port_s = colon + 1;
	} else {
		snprintf(host, sizeof(host), "127.0.0.1"); /* a port alone: loopback */
		port_s = v;
	}
	if (parse_port(port_s, &port) < 0)
		return snapkvd_value_fail(err, "%s", expect);
	if (!v6 && !strcmp(host, "localhost"))
		snprintf(host, sizeof(host), "127.0.0.1");
	memset(ss, 0, sizeof(*ss));
	if (!v6) {
		struct sockaddr_in *in4 = (struct sockaddr_in *)ss;

		if (inet_pton(AF_INET, host, &in4->sin_addr) != 1)
			return snapkvd_value_fail(
			    err, "not a numeric IPv4 address (names are not resolved)");
		in4->sin_family = AF_INET;
		in4->sin_port = htons(port);
		*ret_len = sizeof(*in4);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

		if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1)
			return snapkvd_value_fail(err, "not a numeric IPv6 address in brackets");
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(port);
		*ret_len = sizeof(*in6);
	}
	return 0;
}

static void format_addr(const struct sockaddr_storage *ss, char out[SNAPKVD_HTTP_LISTEN_MAX])
{
	char a[INET6_ADDRSTRLEN] = "";

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *in4 = (const struct sockaddr_in *)ss;

		inet_ntop(AF_INET, &in4->sin_addr, a, sizeof(a));
		snprintf(out, SNAPKVD_HTTP_LISTEN_MAX, "%s:%u", a, ntohs(in4->sin_port));
	} else {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;

		inet_ntop(AF_INET6, &in6->sin6_addr, a, sizeof(a));
		snprintf(out, SNAPKVD_HTTP_LISTEN_MAX, "[%s]:%u", a, ntohs(in6->sin6_port));
	}
}

/* "" or "off"; PORT (loopback); IPV4:PORT; [IPV6]:PORT; localhost:PORT. */
int snapkvd_value_listen(struct snapkvd_http_config *h, const char *value, struct skv_error *err)
{
	struct sockaddr_storage ss;
	socklen_t len = 0;
	int r;

	if (!*value || !strcmp(value, "off")) {
		h->listen[0] = 0;
		return 0;
	}
	r = to_sockaddr(value, &ss, &len, err);
	if (r < 0)
		return r;
	h->addr = ss;
	h->addr_len = len;
	format_addr(&ss, h->listen);
	return 0;
}

/* "0.5", "50%" -> 0.5; [0, 1]. */
int snapkvd_value_fraction(const char *v, double *ret)
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

int snapkvd_value_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *ret)
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

/* 1048576 -> "1M": the largest suffix that says it exactly. */
void snapkvd_value_fmt_size(uint64_t v, char *buf, size_t len)
{
	static const char sfx[] = "KMGT";
	int i = -1;

	while (i < 3 && v && !(v & 1023)) {
		v >>= 10;
		i++;
	}
	if (i < 0)
		snprintf(buf, len, "%llu", (unsigned long long)v);
	else
		snprintf(buf, len, "%llu%c", (unsigned long long)v, sfx[i]);
}

/* ------------------------------------------------------ the value types */

static void store(void *field, size_t size, uint64_t v)
{
	if (size == sizeof(uint32_t)) {
		uint32_t x = (uint32_t)v;

		memcpy(field, &x, sizeof(x));
	} else {
		memcpy(field, &v, sizeof(v));
	}
}

static uint64_t load(const void *field, size_t size)
{
	uint32_t x;
	uint64_t v;

	if (size == sizeof(uint32_t)) {
		memcpy(&x, field, sizeof(x));
		return x;
	}
	memcpy(&v, field, sizeof(v));
	return v;
}

static unsigned *count_of(void *field, const struct snapkvd_value_spec *s)
{
	return (unsigned *)((char *)field + s->count);
}

static unsigned count_at(const void *field, const struct snapkvd_value_spec *s)
{
	return *(const unsigned *)((const char *)field + s->count);
}

/* An integer in the row's bounds; where the row says so a power of two
 * (sq_entries: the ring's masks) or a multiple (slot_bytes: cache lines). */
static int parse_uint(const char *v, void *field, const struct snapkvd_value_spec *s,
		      struct skv_error *err)
{
	unsigned x;

	if (snapkvd_value_uint(v, (unsigned)s->lo, (unsigned)s->hi, &x) < 0)
		return snapkvd_value_fail(err, "not an integer in %u..%u", (unsigned)s->lo,
					  (unsigned)s->hi);
	if (s->pow2 && (x & (x - 1)))
		return snapkvd_value_fail(err, "not a power of two");
	if (s->multiple && x % s->multiple)
		return snapkvd_value_fail(err, "not a multiple of %u", s->multiple);
	store(field, s->size, x);
	return 0;
}

static void dump_uint(FILE *f, const char *key, const void *field,
		      const struct snapkvd_value_spec *s)
{
	fprintf(f, "%s = %u\n", key, (unsigned)load(field, s->size));
}

const struct snapkvd_value_type snapkvd_value_uint_type = {parse_uint, dump_uint};

static int parse_size(const char *v, void *field, const struct snapkvd_value_spec *s,
		      struct skv_error *err)
{
	char lo[24], hi[24];
	uint64_t x;

	snapkvd_value_fmt_size(s->lo, lo, sizeof(lo));
	snapkvd_value_fmt_size(s->hi, hi, sizeof(hi));
	if (snapkvd_parse_size(v, &x) < 0)
		return snapkvd_value_fail(err, "not a size (4096, 64K, 1M, 2G; at least %s)", lo);
	if (x < s->lo || x > s->hi) {
		if (s->hi == UINT64_MAX)
			return snapkvd_value_fail(err, "%.64s is below the minimum %s (%llu bytes)",
						  v, lo, (unsigned long long)s->lo);
		return snapkvd_value_fail(err, "%.64s is outside %s..%s (%llu..%llu bytes)", v, lo,
					  hi, (unsigned long long)s->lo, (unsigned long long)s->hi);
	}
	store(field, s->size, x);
	return 0;
}

static void dump_size(FILE *f, const char *key, const void *field,
		      const struct snapkvd_value_spec *s)
{
	char b[24];

	snapkvd_value_fmt_size(load(field, s->size), b, sizeof(b));
	fprintf(f, "%s = %s\n", key, b);
}

const struct snapkvd_value_type snapkvd_value_size_type = {parse_size, dump_size};

/* The shortest of %.15g and %.17g that reads back as the same double. */
static const char *fmt_double(double d, char b[40])
{
	snprintf(b, 40, "%.15g", d);
	if (strtod(b, NULL) != d)
		snprintf(b, 40, "%.17g", d);
	return b;
}

static int parse_fraction(const char *v, void *field, const struct snapkvd_value_spec *s,
			  struct skv_error *err)
{
	(void)s;
	if (snapkvd_value_fraction(v, field) < 0)
		return snapkvd_value_fail(err, "expected 0..1 or 0%%..100%%");
	return 0;
}

static void dump_fraction(FILE *f, const char *key, const void *field,
			  const struct snapkvd_value_spec *s)
{
	char b[40];

	(void)s;
	fprintf(f, "%s = %s\n", key, fmt_double(*(const double *)field, b));
}

const struct snapkvd_value_type snapkvd_value_fraction_type = {parse_fraction, dump_fraction};

static int parse_ids(const char *v, void *field, const struct snapkvd_value_spec *s,
		     struct skv_error *err)
{
	uint32_t ids[SNAPKVD_VALUE_MAX_IDS];
	unsigned n;

	if (snapkvd_value_idlist(v, &n, ids) < 0)
		return snapkvd_value_fail(err,
					  "expected up to %d numeric ids separated by spaces "
					  "or commas",
					  SNAPKVD_VALUE_MAX_IDS);
	memcpy(field, ids, n * sizeof(ids[0]));
	*count_of(field, s) = n;
	return 0;
}

static void dump_ids(FILE *f, const char *key, const void *field,
		     const struct snapkvd_value_spec *s)
{
	const uint32_t *ids = field;

	fprintf(f, "%s =", key);
	for (unsigned i = 0; i < count_at(field, s); i++)
		fprintf(f, " %u", ids[i]);
	fputc('\n', f);
}

const struct snapkvd_value_type snapkvd_value_ids_type = {parse_ids, dump_ids};

/* devices: "all" (count 0) or distinct CUDA ordinals, as many as the int
 * field holds */
static int parse_devices(const char *v, void *field, const struct snapkvd_value_spec *s,
			 struct skv_error *err)
{
	uint32_t ids[SNAPKVD_VALUE_MAX_IDS];
	const unsigned most = (unsigned)(s->size / sizeof(int));
	unsigned n = 0;

	if (!strcmp(v, "all")) {
		*count_of(field, s) = 0;
		return 0;
	}
	if (snapkvd_value_idlist(v, &n, ids) < 0 || n == 0 || n > most)
		return snapkvd_value_fail(err,
					  "devices must be all or up to %u CUDA device ordinals "
					  "separated by spaces or commas",
					  most);
	for (unsigned i = 0; i < n; i++)
		for (unsigned k = 0; k < i; k++)
			if (ids[k] == ids[i])
				return snapkvd_value_fail(err, "devices names %u twice", ids[i]);
	for (unsigned i = 0; i < n; i++)
		((int *)field)[i] = (int)ids[i];
	*count_of(field, s) = n;
	return 0;
}

static void dump_devices(FILE *f, const char *key, const void *field,
			 const struct snapkvd_value_spec *s)
{
	fprintf(f, "%s = ", key);
	for (unsigned i = 0; i < count_at(field, s); i++)
		fprintf(f, "%s%d", i ? "," : "", ((const int *)field)[i]);
	fprintf(f, "%s\n", count_at(field, s) ? "" : "all");
}

const struct snapkvd_value_type snapkvd_value_devices_type = {parse_devices, dump_devices};

static int parse_listen(const char *v, void *field, const struct snapkvd_value_spec *s,
			struct skv_error *err)
{
	(void)s;
	return snapkvd_value_listen(field, v, err);
}

static void dump_listen(FILE *f, const char *key, const void *field,
			const struct snapkvd_value_spec *s)
{
	(void)s;
	fprintf(f, "%s = %s\n", key, ((const struct snapkvd_http_config *)field)->listen);
}

const struct snapkvd_value_type snapkvd_value_listen_type = {parse_listen, dump_listen};

static int parse_path(const char *v, void *field, const struct snapkvd_value_spec *s,
		      struct skv_error *err)
{
	if (strlen(v) >= s->size)
		return snapkvd_value_fail(err, "%s", s->expect ? s->expect : "path too long");
	if ((s->lo && !*v) || (*v && *v != '/'))
		return snapkvd_value_fail(err, "%s",
					  s->expect ? s->expect : "must be an absolute path");
	snprintf(field, s->size, "%s", v);
	return 0;
}

static void dump_text(FILE *f, const char *key, const void *field,
		      const struct snapkvd_value_spec *s)
{
	(void)s;
	fprintf(f, "%s = %s\n", key, (const char *)field);
}

const struct snapkvd_value_type snapkvd_value_path_type = {parse_path, dump_text};

static int name_index(const char *v, const struct snapkvd_value_spec *s)
{
	for (int i = 0; s->names[i]; i++)
		if (!strcmp(v, s->names[i]))
			return i;
	return -1;
}

static int parse_word(const char *v, void *field, const struct snapkvd_value_spec *s,
		      struct skv_error *err)
{
	if (name_index(v, s) < 0 || strlen(v) >= s->size)
		return snapkvd_value_fail(err, "%s", s->expect);
	snprintf(field, s->size, "%s", v);
	return 0;
}

const struct snapkvd_value_type snapkvd_value_word_type = {parse_word, dump_text};

static int parse_choice(const char *v, void *field, const struct snapkvd_value_spec *s,
			struct skv_error *err)
{
	int i = name_index(v, s);

	if (i < 0)
		return snapkvd_value_fail(err, "%s", s->expect);
	*(int *)field = i;
	return 0;
}

static void dump_choice(FILE *f, const char *key, const void *field,
			const struct snapkvd_value_spec *s)
{
	int i = *(const int *)field, n = 0;

	while (s->names[n])
		n++;
	fprintf(f, "%s = %s\n", key, i >= 0 && i < n ? s->names[i] : "");
}

const struct snapkvd_value_type snapkvd_value_choice_type = {parse_choice, dump_choice};

static int parse_level(const char *v, void *field, const struct snapkvd_value_spec *s,
		       struct skv_error *err)
{
	int r = snapkvd_log_parse_level(v);

	(void)s;
	if (r < 0)
		return snapkvd_value_fail(
		    err, "log_level must be error, warning, notice, info or debug");
	*(int *)field = r;
	return 0;
}

static void dump_level(FILE *f, const char *key, const void *field,
		       const struct snapkvd_value_spec *s)
{
	static const char *const levels[] = {"error", "warning", "notice", "info", "debug"};
	const char *level = "info";

	(void)s;
	for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
		if (snapkvd_log_parse_level(levels[i]) == *(const int *)field)
			level = levels[i];
	fprintf(f, "%s = %s\n", key, level);
}

const struct snapkvd_value_type snapkvd_value_level_type = {parse_level, dump_level};

static int parse_watermark(const char *v, void *field, const struct snapkvd_value_spec *s,
			   struct skv_error *err)
{
	(void)s;
	if (snapkvd_watermark_parse(v, field) < 0)
		return snapkvd_value_fail(err, "expected a percentage, a fraction or bytes");
	return 0;
}

static void dump_watermark(FILE *f, const char *key, const void *field,
			   const struct snapkvd_value_spec *s)
{
	char b[128];

	(void)s;
	snapkvd_watermark_format(field, b, sizeof(b));
	fprintf(f, "%s = %s\n", key, b);
}

const struct snapkvd_value_type snapkvd_value_watermark_type = {parse_watermark, dump_watermark};

static int parse_actions(const char *v, void *field, const struct snapkvd_value_spec *s,
			 struct skv_error *err)
{
	(void)s;
	if (snapkvd_pressure_order_parse(v, field) < 0)
		return snapkvd_value_fail(
		    err, "comma-separated notify, hooks, scale, evict, refuse; each once");
	return 0;
}

static void dump_actions(FILE *f, const char *key, const void *field,
			 const struct snapkvd_value_spec *s)
{
	char b[128];

	(void)s;
	snapkvd_pressure_order_format(field, b, sizeof(b));
	fprintf(f, "%s = %s\n", key, b);
}

const struct snapkvd_value_type snapkvd_value_actions_type = {parse_actions, dump_actions};

/* UID:BYTES[:SHARE] */
static int parse_quota(const char *v, void *field, const struct snapkvd_value_spec *s,
		       struct skv_error *err)
{
	struct snapkvd_tenant_quota q = {.guaranteed_share = -1.0}, *list = field;
	char buf[128], *uid_s, *bytes_s, *share_s, *save = NULL;
	unsigned *n = count_of(field, s);
	uint32_t uid;

	if (strlen(v) >= sizeof(buf))
		return snapkvd_value_fail(err, "too long");
	snprintf(buf, sizeof(buf), "%s", v);
	uid_s = strtok_r(buf, ":", &save);
	bytes_s = strtok_r(NULL, ":", &save);
	share_s = strtok_r(NULL, ":", &save);
	if (!uid_s || !bytes_s || strtok_r(NULL, ":", &save))
		return snapkvd_value_fail(err, "expected UID:BYTES[:SHARE], got '%s'", v);
	if (snapkvd_value_u32(uid_s, 0, UINT32_MAX - 1, &uid) < 0)
		return snapkvd_value_fail(err, "bad uid '%s'", uid_s);
	if (snapkvd_parse_size(bytes_s, &q.quota_bytes) < 0)
		return snapkvd_value_fail(err, "bad size '%s'", bytes_s);
	if (share_s && snapkvd_value_fraction(share_s, &q.guaranteed_share) < 0)
		return snapkvd_value_fail(err, "bad share '%s' (0..1 or 0%%..100%%)", share_s);
	q.uid = (uid_t)uid;
	for (unsigned i = 0; i < *n; i++) {
		if (list[i].uid == q.uid) {
			list[i] = q; /* a later line wins, as for every key */
			return 0;
		}
	}
	if (*n == SNAPKVD_POLICY_MAX_TENANT_QUOTAS)
		return snapkvd_value_fail(err,
					  "at most %d tenants (SNAPKVD_POLICY_MAX_TENANT_QUOTAS)",
					  SNAPKVD_POLICY_MAX_TENANT_QUOTAS);
	list[(*n)++] = q;
	return 0;
}

static void dump_quota(FILE *f, const char *key, const void *field,
		       const struct snapkvd_value_spec *s)
{
	const struct snapkvd_tenant_quota *list = field;
	unsigned n = count_at(field, s);
	char b[40];

	if (!n)
		fprintf(f, "# %s: none\n", key);
	for (unsigned i = 0; i < n; i++) {
		snapkvd_value_fmt_size(list[i].quota_bytes, b, sizeof(b));
		fprintf(f, "%s = %u:%s", key, (unsigned)list[i].uid, b);
		if (list[i].guaranteed_share >= 0)
			fprintf(f, ":%s", fmt_double(list[i].guaranteed_share, b));
		fputc('\n', f);
	}
}

const struct snapkvd_value_type snapkvd_value_quota_type = {parse_quota, dump_quota};
