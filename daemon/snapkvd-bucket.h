/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-bucket.h - a token bucket: `rate` tokens a second, at most
 * `burst` kept, one taken per admitted request. The admin rate limits
 * (snapkvd-adminq.h) keep one per admin session and one per uid. Integer
 * arithmetic in billionths of a token; no clock of its own (the caller
 * passes the time, so tests drive it).
 */
#ifndef SNAPKVD_BUCKET_H
#define SNAPKVD_BUCKET_H

#include <stdbool.h>
#include <stdint.h>

struct snapkvd_bucket {
	uint64_t nano;	  /* tokens x 1e9 */
	uint64_t last_ns; /* when nano was last brought up to date */
	bool primed;	  /* a new bucket starts full */
};

/* Bring b up to now_ns: rate tokens a second, capped at burst. rate 0 (no
 * limit) leaves it full. */
void snapkvd_bucket_refill(struct snapkvd_bucket *b, uint32_t rate, uint32_t burst,
			   uint64_t now_ns);
/* After a refill: 0 when a token is there, else the nanoseconds until one
 * is (rate > 0). */
uint64_t snapkvd_bucket_wait_ns(const struct snapkvd_bucket *b, uint32_t rate);
/* Take the token snapkvd_bucket_wait_ns said was there (rate 0: nothing). */
void snapkvd_bucket_take(struct snapkvd_bucket *b, uint32_t rate);
/* Whether b is full after a refill to now (an idle bucket that can go). */
bool snapkvd_bucket_full(const struct snapkvd_bucket *b, uint32_t burst);

#endif
