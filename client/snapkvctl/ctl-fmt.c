// SPDX-License-Identifier: MIT
/*
 * ctl-fmt.c - how snapkvctl prints sizes, durations and pressure levels for
 * people.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "snapkv.h"
#include "snapkvctl.h"

/* v bytes as a value and an IEC unit index: v < 1024 past B. */
static unsigned iec_scale(uint64_t bytes, double *v)
{
	unsigned i = 0;

	*v = (double)bytes;
	while (*v >= 1024.0 && i < 6) {
		*v /= 1024.0;
		i++;
	}
	return i;
}

static const char *const iec_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};

void ctl_fmt_iec(uint64_t bytes, char *buf, size_t len)
{
	double v;
	unsigned i = iec_scale(bytes, &v);

	if (i == 0)
		snprintf(buf, len, "%" PRIu64 " B", bytes);
	else if (v >= 100)
		snprintf(buf, len, "%.0f %s", v, iec_units[i]);
	else if (v >= 10)
		snprintf(buf, len, "%.1f %s", v, iec_units[i]);
	else
		snprintf(buf, len, "%.2f %s", v, iec_units[i]);
}

const char *ctl_fmt_iec_fixed(uint64_t bytes, char *buf, size_t len)
{
	double v;
	unsigned i = iec_scale(bytes, &v);

	if (i == 0)
		snprintf(buf, len, "%" PRIu64 " B", bytes);
	else
		snprintf(buf, len, "%.2f %s", v, iec_units[i]);
	return buf;
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

const char *ctl_pressure_name(int level)
{
	switch (level) {
	case SKV_PRESSURE_NORMAL:
		return "normal";
	case SKV_PRESSURE_HIGH:
		return "high";
	case SKV_PRESSURE_CRITICAL:
		return "critical";
	default:
		return "?";
	}
}

int ctl_pressure_from_metric(double v)
{
	/* snapkvd_pressure_level is numbered as the wire is: checked only */
	if (isnan(v) || v < SKV_PRESSURE_NORMAL || v > SKV_PRESSURE_CRITICAL)
		return SKV_PRESSURE_NONE;
	return (int)v;
}
