/* SPDX-License-Identifier: MIT */
/*
 * ctl-top.h - the frame of `snapkvctl top` (ctl-top-frame.c).
 */
#ifndef CTL_TOP_H
#define CTL_TOP_H

#include <stddef.h>
#include <stdio.h>

struct ctl_prom;

/*
 * One frame of `snapkvctl top`: pool bar, per-tenant bars, compactions per
 * second (from prev when given, over dt seconds), p50/p99 compaction time,
 * retained-mass histogram. width is the terminal width (>= 40).
 */
void ctl_top_render(FILE *out, const struct ctl_prom *cur, const struct ctl_prom *prev, double dt,
		    unsigned width);

/*
 * A rendered frame (len bytes of lines) onto a terminal of cols x rows: each
 * line cut to cols columns (UTF-8 sequences kept whole) and cleared to its
 * end, the lines past rows dropped, no newline after the last row so the
 * screen never scrolls. Lines end in "\r\n" (the terminal may be raw).
 */
void ctl_top_clip(FILE *out, const char *frame, size_t len, unsigned cols, unsigned rows);

#endif /* CTL_TOP_H */
