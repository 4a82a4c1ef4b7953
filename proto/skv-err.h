/* SPDX-License-Identifier: MIT */
/*
 * skv-err.h - how the client libraries (libsnapkv, libskvst) leave the
 * reason of a failed call behind: one message buffer per handle, written
 * here, the -errno returned. Internal: not installed, static only.
 */
#ifndef SKV_ERR_H
#define SKV_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Format the message into buf (buf NULL: nothing) and return r. */
static inline int skv_vfail(char *buf, size_t len, int r, const char *fmt, va_list ap)
{
	if (buf && len)
		vsnprintf(buf, len, fmt, ap);
	return r;
}

#endif /* SKV_ERR_H */
