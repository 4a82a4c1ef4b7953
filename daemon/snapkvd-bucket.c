// SPDX-License-Identifier: MIT
/* snapkvd-bucket.c - a token bucket; see snapkvd-bucket.h. */
#include "snapkvd-bucket.h"

#define NANO 1000000000ull

void snapkvd_bucket_refill(struct snapkvd_bucket *b, uint32_t rate, uint32_t burst, uint64_t now_ns)
{
	uint64_t cap = (uint64_t)burst * NANO, dt;

	if (!b->primed || !rate) {
		b->primed = true;
		b->nano = cap;
		b->last_ns = now_ns;
		return;
	}
	dt = now_ns > b->last_ns ? now_ns - b->last_ns : 0;
	b->last_ns = now_ns;
	if (b->nano >= cap) {
		b->nano = cap; /* burst lowered by a reload */
		return;
	}
	/* dt * rate overflows only past the cap: compare first */
	if (dt >= (cap - b->nano + rate - 1) / rate)
		b->nano = cap;
	else
		b->nano += dt * rate;
}

uint64_t snapkvd_bucket_wait_ns(const struct snapkvd_bucket *b, uint32_t rate)
{
	if (!rate || b->nano >= NANO)
		return 0;
	return (NANO - b->nano + rate - 1) / rate;
}

void snapkvd_bucket_take(struct snapkvd_bucket *b, uint32_t rate)
{
	if (rate && b->nano >= NANO)
		b->nano -= NANO;
}

bool snapkvd_bucket_full(const struct snapkvd_bucket *b, uint32_t burst)
{
	return b->nano >= (uint64_t)burst * NANO;
}
