// SPDX-License-Identifier: MIT
/*
 * ctl-top.c - `snapkvctl top`: a live view of the daemon's metrics,
 * refreshing once a second (`--once` for scripts and tests). Each frame is
 * drawn by ctl_top_render() (ctl-top-frame.c) from the parsed exposition.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "ctl-admin.h"
#include "ctl-daemon.h"
#include "ctl-prom.h"
#include "ctl-top.h"
#include "snapkvctl.h"

static int fetch_metrics(const char *sock, struct ctl_prom *ret, char *err, size_t errlen)
{
	Snapkv__V1__AdminRequest req = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__AdminReply *rep = NULL;
	size_t line = 0;
	int r;

	req.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS;
	r = ctl_admin_call(sock, &req, &rep, NULL, err, errlen);
	if (r < 0)
		return r;
	r = ctl_prom_parse(rep->text ? rep->text : "", rep->text ? strlen(rep->text) : 0, ret,
			   &line);
	if (r < 0)
		snprintf(err, errlen, "metrics from snapkvd do not parse (line %zu)", line);
	snapkv__v1__admin_reply__free_unpacked(rep, NULL);
	return r;
}

static volatile sig_atomic_t top_stop;

static void on_sigint(int sig)
{
	(void)sig;
	top_stop = 1;
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void top_usage(FILE *f)
{
	fprintf(f, "usage: snapkvctl top [--socket PATH] [--once] [--interval MS] [--count N]\n"
		   "A live view of the daemon, refreshed every second (q or Ctrl-C quits):\n"
		   "pool and per-tenant bars, compactions per second, p50/p99 compaction time,\n"
		   "retained-mass histogram. --once prints one frame and exits.\n");
}

int ctl_top(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"socket", required_argument, NULL, 's'},	{"once", no_argument, NULL, '1'},
	    {"interval", required_argument, NULL, 'i'}, {"count", required_argument, NULL, 'n'},
	    {"help", no_argument, NULL, 'h'},		{0},
	};
	struct ctl_prom prev = {0}, cur = {0};
	char err[900];
	const char *sock = NULL;
	uint32_t interval_ms = 1000, count = 0;
	int once = 0, tty, c, r, have_prev = 0;
	double t_prev = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			sock = optarg;
			break;
		case '1':
			once = 1;
			break;
		case 'i':
			if (ctl_parse_u32(optarg, 100, 3600000, &interval_ms) < 0) {
				ctl_err("top", "--interval: 100..3600000 ms");
				return CTL_EXIT_USAGE;
			}
			break;
		case 'n':
			if (ctl_parse_u32(optarg, 1, UINT32_MAX, &count) < 0) {
				ctl_err("top", "--count: a positive number");
				return CTL_EXIT_USAGE;
			}
			break;
		case 'h':
			top_usage(stdout);
			return CTL_EXIT_OK;
		default:
			top_usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	if (optind < argc) {
		top_usage(stderr);
		return CTL_EXIT_USAGE;
	}
	if (once)
		count = 1;
	tty = isatty(STDOUT_FILENO) && !once;
	signal(SIGINT, on_sigint);
	signal(SIGTERM, on_sigint);
	for (uint32_t frame = 0; !top_stop && (!count || frame < count); frame++) {
		struct winsize ws;
		unsigned width = 80;
		double now;

		r = fetch_metrics(sock, &cur, err, sizeof(err));
		if (r < 0) {
			ctl_err("top", "%s", err);
			ctl_prom_free(&prev);
			return CTL_EXIT_FAIL;
		}
		now = mono_s();
		if (tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
			width = ws.ws_col;
		if (tty)
			fputs("\033[H\033[2J", stdout);
		ctl_top_render(stdout, &cur, have_prev ? &prev : NULL, now - t_prev, width);
		fflush(stdout);
		ctl_prom_free(&prev);
		prev = cur;
		cur = (struct ctl_prom){0};
		have_prev = 1;
		t_prev = now;
		if (count && frame + 1 >= count)
			break;
		/* Sleep, but quit at once on q from a terminal. */
		{
			struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
			int pr = poll(&pfd, isatty(STDIN_FILENO) ? 1 : 0, (int)interval_ms);
			char ch;

			if (pr > 0 && read(STDIN_FILENO, &ch, 1) == 1 && (ch == 'q' || ch == 'Q'))
				break;
		}
	}
	ctl_prom_free(&prev);
	return CTL_EXIT_OK;
}
