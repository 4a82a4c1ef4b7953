// SPDX-License-Identifier: MIT
/* Logging to stderr with levels; see snapkvd-log.h. */
#include "snapkvd-log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int snapkvd_log_max = SNAPKVD_LOG_INFO;
static int journal;

static const char *const names[] = {
    [SNAPKVD_LOG_ERR] = "error", [SNAPKVD_LOG_WARNING] = "warning", [SNAPKVD_LOG_NOTICE] = "notice",
    [SNAPKVD_LOG_INFO] = "info", [SNAPKVD_LOG_DEBUG] = "debug",
};

int snapkvd_log_parse_level(const char *s)
{
	for (int i = SNAPKVD_LOG_ERR; i <= SNAPKVD_LOG_DEBUG; i++)
		if (!strcmp(s, names[i]))
			return i;
	if (!strcmp(s, "err"))
		return SNAPKVD_LOG_ERR;
	return -EINVAL;
}

void snapkvd_log_init(void)
{
	journal = getenv("JOURNAL_STREAM") != NULL;
}

static void vlog(int level, int err, const char *fmt, va_list ap)
{
	char buf[1024];
	int n;

	if (level > snapkvd_log_max)
		return;
	if (journal)
		n = snprintf(buf, sizeof(buf), "<%d>", level);
	else
		n = snprintf(buf, sizeof(buf), "snapkvd[%d]: %s: ", (int)getpid(),
			     level >= SNAPKVD_LOG_ERR && level <= SNAPKVD_LOG_DEBUG ? names[level]
										    : "error");
	n += vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	if (err)
		n += snprintf(buf + n, sizeof(buf) - n, ": %s", strerror(err < 0 ? -err : err));
	if (n > (int)sizeof(buf) - 2)
		n = sizeof(buf) - 2;
	buf[n++] = '\n';
	/* one write per line so concurrent threads never interleave */
	(void)!write(STDERR_FILENO, buf, n);
}

void snapkvd_log(int level, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, err, fmt, ap);
	va_end(ap);
}

int snapkvd_log_errno(int level, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, err, fmt, ap);
	va_end(ap);
	return err;
}

#define CAUSE_INTERVAL_NS ((uint64_t)SNAPKVD_LOG_CAUSE_INTERVAL_S * 1000000000u)

static void cause_summary(struct snapkvd_log_cause *c, uint64_t now_ns)
{
	snapkvd_log(c->level, 0, "%llu more %s in the last %llu s; the last: %s",
		    (unsigned long long)c->count, c->what ? c->what : "events",
		    (unsigned long long)((now_ns - c->since_ns + 999999999u) / 1000000000u),
		    c->last);
	c->count = 0;
	c->since_ns = now_ns;
	c->next_ns = now_ns + CAUSE_INTERVAL_NS;
}

void snapkvd_log_cause(struct snapkvd_log_cause *c, uint64_t now_ns, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->last, sizeof(c->last), fmt, ap);
	va_end(ap);
	if (c->level > snapkvd_log_max)
		return;
	if (now_ns < c->next_ns) {
		c->count++;
		return;
	}
	if (c->count) { /* the ones of the last interval, then this one */
		c->count++;
		cause_summary(c, now_ns);
		return;
	}
	snapkvd_log(c->level, 0, "%s (more %s are summarised, at most one line per %u s)", c->last,
		    c->what ? c->what : "events", SNAPKVD_LOG_CAUSE_INTERVAL_S);
	c->since_ns = now_ns;
	c->next_ns = now_ns + CAUSE_INTERVAL_NS;
}

void snapkvd_log_cause_flush(struct snapkvd_log_cause *c, uint64_t now_ns, bool force)
{
	if (c->count && (force || now_ns >= c->next_ns))
		cause_summary(c, now_ns);
}
