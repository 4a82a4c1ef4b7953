/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-log.h - the daemon's log: stderr, one line per event, with a level.
 * Under journald (JOURNAL_STREAM set) lines carry <N> priority prefixes.
 * Daemon code logs once, where it decides; library code never logs.
 */
#ifndef SNAPKVD_LOG_H
#define SNAPKVD_LOG_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

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
/*
 * Repeated events of one cause (connections closed before they held a
 * session, refused HELLOs, bad frames: one each per connection, so a flood
 * of connections would be a flood of lines) are summarised: at most one line
 * per cause per SNAPKVD_LOG_CAUSE_INTERVAL_S. An event when no line of its
 * cause was written in the last interval is logged as is, followed by how
 * many of the cause it stands for; the ones after it are counted, and the
 * next line (a later event past the interval, or snapkvd_log_cause_flush
 * from the housekeeping timer or at shutdown) says how many there were and
 * shows the last. Loop thread only.
 */
#define SNAPKVD_LOG_CAUSE_INTERVAL_S 10

struct snapkvd_log_cause {
	const char *what; /* "connections closed before they held a session" */
	int level;
	uint64_t next_ns; /* no line of this cause before then */
	uint64_t count;	  /* events since the last line */
	uint64_t since_ns;
	char last[256]; /* the last event counted */
};

void snapkvd_log_cause(struct snapkvd_log_cause *c, uint64_t now_ns, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The summary of the events counted since the last line, once the
 * interval has passed (force: now, e.g. at shutdown). */
void snapkvd_log_cause_flush(struct snapkvd_log_cause *c, uint64_t now_ns, bool force);

/* Log with strerror(-r) appended; evaluates to r. */
#define log_error_errno(r, ...)	  snapkvd_log_errno(SNAPKVD_LOG_ERR, (r), __VA_ARGS__)
#define log_warning_errno(r, ...) snapkvd_log_errno(SNAPKVD_LOG_WARNING, (r), __VA_ARGS__)

#endif
