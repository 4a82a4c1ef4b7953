/* SPDX-License-Identifier: MIT */
/* snapkvd-clock.h - the daemon's clocks (a unit test may define its own). */
#ifndef SNAPKVD_CLOCK_H
#define SNAPKVD_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in ns: timeouts, idle spin, LRU, latencies. */
uint64_t snapkvd_now_ns(void);
/* CLOCK_REALTIME in ns: timestamps shown to people. */
uint64_t snapkvd_realtime_ns(void);

#endif
