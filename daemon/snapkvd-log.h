/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-log.h - the daemon's log: stderr, one line per event, with a level.
 * Under journald (JOURNAL_STREAM set) lines carry <N> priority prefixes.
 * Daemon code logs once, where it decides; library code never logs.
 */
#ifndef SNAPKVD_LOG_H
#define SNAPKVD_LOG_H

#include <errno.h>

enum snapkvd_log_level {
	SNAPKVD_LOG_ERR = 3,
	SNAPKVD_LOG_WARNING = 4,
	SNAPKVD_LOG_NOTICE = 5,
	SNAPKVD_LOG_INFO = 6,
	SNAPKVD_LOG_DEBUG = 7,
};

extern int snapkvd_log_max;

/* "error", "warning", "notice", "info", "debug" -> level; -EINVAL otherwise. */
int snapkvd_log_parse_level(const char *s);
void snapkvd_log_init(void);
void snapkvd_log(int level, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Same, returning err, for `return log_error_errno(r, "...")`. */
int snapkvd_log_errno(int level, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_error(...)	 snapkvd_log(SNAPKVD_LOG_ERR, 0, __VA_ARGS__)
#define log_warning(...) snapkvd_log(SNAPKVD_LOG_WARNING, 0, __VA_ARGS__)
#define log_notice(...)	 snapkvd_log(SNAPKVD_LOG_NOTICE, 0, __VA_ARGS__)
#define log_info(...)	 snapkvd_log(SNAPKVD_LOG_INFO, 0, __VA_ARGS__)
#define log_debug(...)                                                                             \
	do {                                                                                       \
		if (snapkvd_log_max >= SNAPKVD_LOG_DEBUG)                                          \
			snapkvd_log(SNAPKVD_LOG_DEBUG, 0, __VA_ARGS__);                            \
	} while (0)
/* Log with strerror(-r) appended; evaluates to r. */
#define log_error_errno(r, ...)	  snapkvd_log_errno(SNAPKVD_LOG_ERR, (r), __VA_ARGS__)
#define log_warning_errno(r, ...) snapkvd_log_errno(SNAPKVD_LOG_WARNING, (r), __VA_ARGS__)

#endif
