/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-value.h - the value types of the config (snapkvd-config.c): each
 * turns one value's text into a field (a size, an integer in a range, a
 * fraction, an id list, a listening address, a path, a word, a watermark,
 * an action order, a tenant quota) and writes the field back as the config
 * file line(s) that give it. They know no key and keep no state; bounds and
 * the text of a refusal come in a struct snapkvd_value_spec (a row of the
 * config table). A parser is all or nothing: on failure the field is left
 * as it was, and the reason goes into a struct skv_error (the channel the
 * kernels and the request path use), through snapkvd_value_fail().
 */
#ifndef SNAPKVD_VALUE_H
#define SNAPKVD_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "skv.h"
#include "snapkvd-http.h"

#define SNAPKVD_VALUE_MAX		 1024 /* bytes of one value (SNAPKVD_CONFIG_MAX_LINE) */
#define SNAPKVD_VALUE_MAX_IDS		 64   /* ids in a list (SNAPKVD_MAX_ALLOW) */
#define SNAPKVD_POLICY_MAX_TENANT_QUOTAS 64

/* One tenant_quota = UID:BYTES[:SHARE] line. */
struct snapkvd_tenant_quota {
	uid_t uid;
	uint64_t quota_bytes;	 /* 0: none                          */
	double guaranteed_share; /* < 0: the pressure config's share */
};

/* What a row of the config table says about its field. */
struct snapkvd_value_spec {
	uint64_t lo, hi;	  /* numbers: the bounds; paths: lo 1 = not empty */
	unsigned multiple;	  /* integers: a multiple of this (0: any)       */
	bool pow2;		  /* integers: a power of two                    */
	size_t size;		  /* bytes of the field (text: its capacity)     */
	ptrdiff_t count;	  /* lists: the unsigned count, from the field   */
	const char *const *names; /* words and choices: NULL-terminated         */
	const char *expect;	  /* the reason for a refusal, where one says it */
};

/* Text -> the field. 0, or -EINVAL with the reason in err (may be NULL). */
typedef int snapkvd_value_parse_fn(const char *text, void *field,
				   const struct snapkvd_value_spec *spec, struct skv_error *err);
/* The field -> "key = value" line(s) on f, read back by the parser. */
typedef void snapkvd_value_dump_fn(FILE *f, const char *key, const void *field,
				   const struct snapkvd_value_spec *spec);

struct snapkvd_value_type {
	snapkvd_value_parse_fn *parse;
	snapkvd_value_dump_fn *dump;
};

/* Fields: unsigned (or uint32_t); spec lo..hi, multiple, pow2. */
extern const struct snapkvd_value_type snapkvd_value_uint_type;
/* Fields: uint64_t or uint32_t (spec size); "4096", "64K", "1M", "2GiB" in lo..hi. */
extern const struct snapkvd_value_type snapkvd_value_size_type;
/* double in [0, 1]: "0.5", "50%". */
extern const struct snapkvd_value_type snapkvd_value_fraction_type;
/* uint32_t[SNAPKVD_VALUE_MAX_IDS], its count at spec count: "1 2,3". */
extern const struct snapkvd_value_type snapkvd_value_ids_type;
/* Fields: int[] (spec size) with an unsigned count (spec count): "all"
 * (count 0) or distinct CUDA device ordinals (the config's devices). */
extern const struct snapkvd_value_type snapkvd_value_devices_type;
/* struct snapkvd_http_config (listen, addr, addr_len): metrics_listen. */
extern const struct snapkvd_value_type snapkvd_value_listen_type;
/* char[spec size]: "" (spec lo 0) or an absolute path. */
extern const struct snapkvd_value_type snapkvd_value_path_type;
/* char[spec size]: one of spec names, kept as text. */
extern const struct snapkvd_value_type snapkvd_value_word_type;
/* int: the index of one of spec names. */
extern const struct snapkvd_value_type snapkvd_value_choice_type;
/* int: a log level by name (snapkvd_log_parse_level). */
extern const struct snapkvd_value_type snapkvd_value_level_type;
/* struct snapkvd_watermark: "80%", "0.8", "12G" (snapkvd_watermark_parse). */
extern const struct snapkvd_value_type snapkvd_value_watermark_type;
/* struct snapkvd_pressure_config's order: "notify,hooks" (each once). */
extern const struct snapkvd_value_type snapkvd_value_actions_type;
/* struct snapkvd_tenant_quota[SNAPKVD_POLICY_MAX_TENANT_QUOTAS], count at
 * spec count: UID:BYTES[:SHARE], a later line for a uid replacing it. */
extern const struct snapkvd_value_type snapkvd_value_quota_type;

/* The reason into err (may be NULL; layer and head -1); returns -EINVAL. */
__attribute__((format(printf, 2, 3))) int snapkvd_value_fail(struct skv_error *err, const char *fmt,
							     ...);

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
 * localhost:PORT, normalised into h->listen (h unchanged on failure).
 * -EINVAL with the reason in err (may be NULL). */
int snapkvd_value_listen(struct snapkvd_http_config *h, const char *value, struct skv_error *err);
/* 1048576 -> "1M": the largest suffix that says it exactly. */
void snapkvd_value_fmt_size(uint64_t v, char *buf, size_t len);

#endif
