// SPDX-License-Identifier: MIT
/* snapkvd-clock.c - see snapkvd-clock.h. */
#include "snapkvd-clock.h"

#include <time.h>

uint64_t snapkvd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

uint64_t snapkvd_realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
