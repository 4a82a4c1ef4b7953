// SPDX-License-Identifier: MIT
/*
 * ctl-fmt.c - how snapkvctl prints sizes and durations for people.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "snapkvctl.h"

void ctl_fmt_iec(uint64_t bytes, char *buf, size_t len)
{
	static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	double v = (double)bytes;
	unsigned i = 0;

	while (v >= 1024.0 && i < 6) {
		v /= 1024.0;
		i++;
	}
	if (i == 0)
		snprintf(buf, len, "%" PRIu64 " B", bytes);
	else if (v >= 100)
		snprintf(buf, len, "%.0f %s", v, u[i]);
	else if (v >= 10)
		snprintf(buf, len, "%.1f %s", v, u[i]);
	else
		snprintf(buf, len, "%.2f %s", v, u[i]);
}

void ctl_fmt_seconds(double s, char *buf, size_t len)
{
	if (isnan(s))
		snprintf(buf, len, "-");
	else if (s < 1e-3)
		snprintf(buf, len, "%.0f us", s * 1e6);
	else if (s < 1)
		snprintf(buf, len, "%.1f ms", s * 1e3);
	else
		snprintf(buf, len, "%.2f s", s);
}
