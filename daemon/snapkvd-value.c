// SPDX-License-Identifier: MIT
/* snapkvd-value.c - config values; see snapkvd-value.h. */
#include "snapkvd-value.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
		       const char **why)
{
	char host[SNAPKVD_HTTP_LISTEN_MAX];
	const char *port_s, *colon;
	bool v6 = *v == '[';
	uint16_t port;

	*why = "expected PORT, IPV4:PORT, [IPV6]:PORT or localhost:PORT (port 1..65535)";
	if (strlen(v) >= sizeof(host))
		return -EINVAL;
	if (v6) {
		const char *rb = strchr(v, ']');

		if (!rb || rb[1] != ':')
			return -EINVAL;
		snprintf(host, sizeof(host), "%.*s", (int)(rb - v - 1), v + 1);
		port_s = rb + 2;
	} else if ((colon = strrchr(v, ':'))) {
		if (memchr(v, ':', colon - v)) {
			*why = "an IPv6 address goes in brackets: [::1]:9464";
			return -EINVAL;
		}
		snprintf(host, sizeof(host), "%.*s", (int)(colon - v), v);
		port_s = colon + 1;
	} else {
		snprintf(host, sizeof(host), "127.0.0.1"); /* a port alone: loopback */
		port_s = v;
	}
	if (parse_port(port_s, &port) < 0)
		return -EINVAL;
	if (!v6 && !strcmp(host, "localhost"))
		snprintf(host, sizeof(host), "127.0.0.1");
	memset(ss, 0, sizeof(*ss));
	if (!v6) {
		struct sockaddr_in *in4 = (struct sockaddr_in *)ss;

		if (inet_pton(AF_INET, host, &in4->sin_addr) != 1) {
			*why = "not a numeric IPv4 address (names are not resolved)";
			return -EINVAL;
		}
		in4->sin_family = AF_INET;
		in4->sin_port = htons(port);
		*ret_len = sizeof(*in4);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

		if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1) {
			*why = "not a numeric IPv6 address in brackets";
			return -EINVAL;
		}
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
int snapkvd_value_listen(struct snapkvd_http_config *h, const char *value, const char **why)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int r;

	if (!*value || !strcmp(value, "off")) {
		h->listen[0] = 0;
		return 0;
	}
	r = to_sockaddr(value, &ss, &len, why);
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
