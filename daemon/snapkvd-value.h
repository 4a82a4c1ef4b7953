/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-value.h - the value parsers of the config (snapkvd-config.c):
 * each turns one value's text into a size, an integer in a range, a
 * fraction, an id list or a listening address, and formats a size back.
 * They know no key and keep no state: 0, or -EINVAL / -ERANGE / -E2BIG,
 * and a reason only where the text can be wrong in several ways
 * (snapkvd_value_listen's *why, a string constant).
 */
#ifndef SNAPKVD_VALUE_H
#define SNAPKVD_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "snapkvd-http.h"

#define SNAPKVD_VALUE_MAX     1024 /* bytes of one value (SNAPKVD_CONFIG_MAX_LINE) */
#define SNAPKVD_VALUE_MAX_IDS 64   /* ids in a list (SNAPKVD_MAX_ALLOW) */

/* "4096", "64K", "1M", "2GiB", "1T": bytes. */
int snapkvd_parse_size(const char *s, uint64_t *ret);
/* A decimal in lo..hi: -EINVAL not a number, -ERANGE out of range. */
int snapkvd_value_uint(const char *s, unsigned lo, unsigned hi, unsigned *ret);
/* The same for uint32_t, -EINVAL either way. */
int snapkvd_value_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *ret);
/* "0.5", "50%" -> 0.5; in [0, 1]. */
int snapkvd_value_fraction(const char *v, double *ret);
/* Up to SNAPKVD_VALUE_MAX_IDS ids 0..INT_MAX separated by spaces or commas. */
int snapkvd_value_idlist(const char *s, unsigned *n, uint32_t *ids);
/* metrics_listen: "" or "off"; PORT (loopback); IPV4:PORT; [IPV6]:PORT;
 * localhost:PORT, normalised into h->listen. */
int snapkvd_value_listen(struct snapkvd_http_config *h, const char *value, const char **why);
/* 1048576 -> "1M": the largest suffix that says it exactly. */
void snapkvd_value_fmt_size(uint64_t v, char *buf, size_t len);

#endif
