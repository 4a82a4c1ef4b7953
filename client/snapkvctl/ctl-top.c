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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
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

static volatile sig_atomic_t top_stop, top_resized;

static void on_signal(int sig)
{
	if (sig == SIGWINCH)
		top_resized = 1;
	else
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

/*
 * The terminal while top runs: keys one at a time and unechoed (so q quits
 * without Enter; Ctrl-C still signals), the alternate screen and no cursor,
 * all put back by term_leave.
 */
struct term {
	bool raw;
	struct termios saved;
};

static void term_enter(struct term *t)
{
	struct termios raw;

	if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &t->saved) < 0)
		return;
	raw = t->saved;
	raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
	raw.c_cc[VMIN] = 1;
	raw.c_cc[VTIME] = 0;
	if (tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw) < 0)
		return;
	t->raw = true;
	fputs("\033[?1049h\033[?25l", stdout);
}

static void term_leave(struct term *t)
{
	if (!t->raw)
		return;
	fputs("\033[?25h\033[?1049l", stdout);
	fflush(stdout);
	tcsetattr(STDIN_FILENO, TCSAFLUSH, &t->saved);
	t->raw = false;
}

/* The last two samples and the time between them: what a frame shows, kept
 * so that a resize redraws at once without asking the daemon again. */
struct top_view {
	struct ctl_prom last, before;
	bool have_before;
	double dt;
};

static void draw(const struct top_view *v, bool tty)
{
	const struct ctl_prom *before = v->have_before ? &v->before : NULL;
	unsigned cols = 80, rows = 24;
	struct winsize ws;
	char *buf = NULL;
	size_t len = 0;
	FILE *m;

	if (!tty) {
		ctl_top_render(stdout, &v->last, before, v->dt, 80);
		fflush(stdout);
		return;
	}
	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row) {
		cols = ws.ws_col;
		rows = ws.ws_row;
	}
	/* the frame is drawn at least 40 wide, then clipped to the terminal */
	m = open_memstream(&buf, &len);
	if (!m)
		return;
	ctl_top_render(m, &v->last, before, v->dt, cols < 40 ? 40 : cols);
	if (fclose(m) == 0) {
		fputs("\033[H", stdout);
		ctl_top_clip(stdout, buf, len, cols, rows);
		fputs("\033[J", stdout);
		fflush(stdout);
	}
	free(buf);
}

/* Wait up to ms for the next refresh, redrawing on resize. 1 when q was
 * pressed or a signal asked to stop, else 0. */
static int top_wait(const struct top_view *v, bool tty, bool keys, uint32_t ms)
{
	double end = mono_s() + ms / 1000.0;

	while (!top_stop) {
		struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
		double left = end - mono_s();
		int pr;
		char ch;

		if (top_resized) {
			top_resized = 0;
			draw(v, tty);
		}
		if (left <= 0)
			return 0;
		pr = poll(&pfd, keys ? 1 : 0, (int)(left * 1000.0) + 1);
		if (pr == 0)
			return 0;
		if (pr < 0) {
			if (errno == EINTR)
				continue;
			return 0;
		}
		if (read(STDIN_FILENO, &ch, 1) != 1) {
			keys = false; /* end of input: keep refreshing */
			continue;
		}
		if (ch == 'q' || ch == 'Q')
			return 1;
	}
	return 1;
}

int ctl_top(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"socket", required_argument, NULL, 's'},	{"once", no_argument, NULL, '1'},
	    {"interval", required_argument, NULL, 'i'}, {"count", required_argument, NULL, 'n'},
	    {"help", no_argument, NULL, 'h'},		{0},
	};
	struct top_view v = {0};
	struct term term = {0};
	struct sigaction sa = {.sa_handler = on_signal};
	char err[900];
	const char *sock = NULL;
	uint32_t interval_ms = 1000, count = 0;
	int once = 0, c, r, rc = CTL_EXIT_OK;
	bool tty, have_last = false;
	double t_last = 0;

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
	/* no SA_RESTART: a signal must wake the poll in top_wait */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGWINCH, &sa, NULL);
	if (tty)
		term_enter(&term);
	for (uint32_t frame = 0; !top_stop && (!count || frame < count); frame++) {
		struct ctl_prom cur = {0};
		double now;

		r = fetch_metrics(sock, &cur, err, sizeof(err));
		if (r < 0) {
			term_leave(&term);
			ctl_err("top", "%s", err);
			rc = CTL_EXIT_FAIL;
			break;
		}
		now = mono_s();
		ctl_prom_free(&v.before);
		v.before = v.last;
		v.have_before = have_last;
		v.last = cur;
		v.dt = now - t_last;
		have_last = true;
		t_last = now;
		draw(&v, tty);
		if (count && frame + 1 >= count)
			break;
		if (top_wait(&v, tty, term.raw || isatty(STDIN_FILENO), interval_ms))
			break;
	}
	term_leave(&term);
	ctl_prom_free(&v.before);
	ctl_prom_free(&v.last);
	return rc;
}
