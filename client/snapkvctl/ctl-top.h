/* SPDX-License-Identifier: MIT */
/*
 * ctl-top.h - the frame of `snapkvctl top` (ctl-top-frame.c).
 */
#ifndef CTL_TOP_H
#define CTL_TOP_H

#include <stdio.h>

struct ctl_prom;

/*
 * One frame of `snapkvctl top`: pool bar, per-tenant bars, compactions per
 * second (from prev when given, over dt seconds), p50/p99 compaction time,
 * retained-mass histogram. width is the terminal width (>= 40).
 */
void ctl_top_render(FILE *out, const struct ctl_prom *cur, const struct ctl_prom *prev, double dt,
		    unsigned width);

#endif /* CTL_TOP_H */
