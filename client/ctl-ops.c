// SPDX-License-Identifier: MIT
/*
 * ctl-ops.c - `snapkvctl pressure` (levels, watermarks, last transitions;
 * `pressure set` changes them at run time) and `snapkvctl top` (a live view
 * refreshing once a second, `--once` for scripts and tests).
 *
 * Both talk to the daemon's admin interface on the control socket:
 * --socket PATH, else $SNAPKV_SOCKET, else $XDG_RUNTIME_DIR/snapkvd.sock,
 * else /run/snapkvd/snapkvd.sock.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl-daemon.h"
#include "ctl-ops.h"
#include "proto/skv-frame.h"
#include "proto/snapkv.pb-c.h"
#include "skv-io.h"
#include "snapkvctl.h"

/* One admin round trip, connect included, within one deadline (--timeout).
 * 0 and *ret (free with ..._free_unpacked) or -errno. */
static int admin_call(const char *sock, Snapkv__V1__AdminRequest *req, Snapkv__V1__AdminReply **ret,
		      char *err, size_t errlen)
{
	static uint8_t buf[SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD];
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct skv_frame_hdr hdr;
	Snapkv__V1__AdminReply *rep;
	uint64_t dl = ctl_daemon_deadline();
	size_t n;
	int fd, r;

	if (strlen(sock) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "%s: socket path too long", sock);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	r = fd < 0 ? -errno : skv_io_connect(fd, &sa, dl);
	if (r < 0) {
		if (r == -ETIMEDOUT)
			snprintf(err, errlen,
				 "cannot reach snapkvd at %s: not accepted within %u ms", sock,
				 ctl_daemon_timeout_ms());
		else
			snprintf(err, errlen, "cannot reach snapkvd at %s: %s", sock, strerror(-r));
		if (fd >= 0)
			close(fd);
		return r;
	}
	hello.client_version = SKV_PROTO_VERSION;
	hello.admin = 1;
	hello.name = "snapkvctl";
	n = snapkv__v1__hello__pack(&hello, buf);
	r = skv_io_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf, n, NULL, 0, dl);
	if (r >= 0)
		r = skv_io_recv(fd, buf, sizeof(buf), &hdr, NULL, NULL, dl);
	if (r >= 0 && hdr.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME)
		r = -EPROTO;
	if (r >= 0) {
		n = snapkv__v1__admin_request__get_packed_size(req);
		if (n > SKV_FRAME_MAX_PAYLOAD)
			r = -EMSGSIZE;
		else
			r = skv_io_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, buf,
					snapkv__v1__admin_request__pack(req, buf), NULL, 0, dl);
	}
	if (r >= 0)
		r = skv_io_recv(fd, buf, sizeof(buf), &hdr, NULL, NULL, dl);
	close(fd);
	if (r == -ETIMEDOUT) {
		snprintf(err, errlen, "snapkvd at %s did not answer within %u ms", sock,
			 ctl_daemon_timeout_ms());
		return r;
	}
	if (r < 0) {
		snprintf(err, errlen, "talking to snapkvd at %s: %s", sock, strerror(-r));
		return r;
	}
	if (hdr.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY ||
	    !(rep = snapkv__v1__admin_reply__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE))) {
		snprintf(err, errlen, "unexpected reply from snapkvd");
		return -EPROTO;
	}
	if (rep->status < 0) {
		r = rep->status;
		snprintf(err, errlen, "%s", rep->error && *rep->error ? rep->error : strerror(-r));
		snapkv__v1__admin_reply__free_unpacked(rep, NULL);
		return r;
	}
	*ret = rep;
	return 0;
}

static const char *level_name(int l)
{
	static const char *const names[] = {"?", "normal", "high", "critical"};

	return l >= 0 && l <= 3 ? names[l] : "?";
}

static void fmt_time(uint64_t ns, char *buf, size_t len)
{
	time_t t = (time_t)(ns / 1000000000ull);
	struct tm tm;

	localtime_r(&t, &tm);
	strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
	snprintf(buf + strlen(buf), len - strlen(buf), ".%03u",
		 (unsigned)(ns % 1000000000ull / 1000000));
}

static void print_pressure(FILE *o, const Snapkv__V1__PressureInfo *p)
{
	char a[32], b[32], t[64];

	ctl_fmt_iec(p->pool_used, a, sizeof(a));
	ctl_fmt_iec(p->pool_total, b, sizeof(b));
	fprintf(o, "level             %s\n", level_name(p->level));
	fprintf(o, "pool              %s / %s (%.1f%%)\n", a, b,
		p->pool_total ? 100.0 * (double)p->pool_used / (double)p->pool_total : 0.0);
	fprintf(o, "high              enter %s (%llu B), leave %s (%llu B)\n", p->high,
		(unsigned long long)p->high_bytes, p->high_leave,
		(unsigned long long)p->high_leave_bytes);
	fprintf(o, "critical          enter %s (%llu B), leave %s (%llu B)\n", p->critical,
		(unsigned long long)p->critical_bytes, p->critical_leave,
		(unsigned long long)p->critical_leave_bytes);
	fprintf(o, "actions           %s\n", *p->actions ? p->actions : "(none)");
	fprintf(o, "budget scaling    x%g at high, x%g at critical; suggested C now %u\n",
		p->scale_high, p->scale_critical, p->suggested_capacity);
	fprintf(o, "guaranteed share  %g%%\n", p->guaranteed_share * 100.0);
	fprintf(o, "hooks             %s (%u running)\n", *p->hook_dir ? p->hook_dir : "(none)",
		p->hooks_running);
	ctl_fmt_iec(p->lingering_bytes, a, sizeof(a));
	fprintf(o, "lingering caches  %llu (%s); evictions %llu; refusals %llu\n",
		(unsigned long long)p->lingering_caches, a, (unsigned long long)p->evictions,
		(unsigned long long)p->refusals);
	fprintf(o, "transitions       %llu in all%s\n", (unsigned long long)p->transitions_total,
		p->n_transitions ? "; latest first:" : "");
	for (size_t i = 0; i < p->n_transitions; i++) {
		const Snapkv__V1__PressureTransition *tr = p->transitions[i];

		fmt_time(tr->time_ns, t, sizeof(t));
		fprintf(o, "  %s  %-8s -> %-8s  %llu / %llu B (%.1f%%)\n", t, level_name(tr->prev),
			level_name(tr->level), (unsigned long long)tr->used_bytes,
			(unsigned long long)tr->total_bytes,
			tr->total_bytes ? 100.0 * (double)tr->used_bytes / (double)tr->total_bytes
					: 0.0);
	}
}

static void print_pressure_json(FILE *o, const Snapkv__V1__PressureInfo *p)
{
	fprintf(o,
		"{\"level\":\"%s\",\"pool\":{\"used_bytes\":%llu,\"total_bytes\":%llu},"
		"\"watermarks\":{\"high\":{\"enter\":\"%s\",\"enter_bytes\":%llu,\"leave\":\"%s\","
		"\"leave_bytes\":%llu},\"critical\":{\"enter\":\"%s\",\"enter_bytes\":%llu,"
		"\"leave\":\"%s\",\"leave_bytes\":%llu}},\"actions\":\"%s\",\"scale_high\":%g,"
		"\"scale_critical\":%g,\"guaranteed_share\":%g,\"suggested_capacity\":%u,"
		"\"hooks_running\":%u,\"lingering_caches\":%llu,\"lingering_bytes\":%llu,"
		"\"evictions\":%llu,\"refusals\":%llu,\"transitions_total\":%llu,\"transitions\":[",
		level_name(p->level), (unsigned long long)p->pool_used,
		(unsigned long long)p->pool_total, p->high, (unsigned long long)p->high_bytes,
		p->high_leave, (unsigned long long)p->high_leave_bytes, p->critical,
		(unsigned long long)p->critical_bytes, p->critical_leave,
		(unsigned long long)p->critical_leave_bytes, p->actions, p->scale_high,
		p->scale_critical, p->guaranteed_share, p->suggested_capacity, p->hooks_running,
		(unsigned long long)p->lingering_caches, (unsigned long long)p->lingering_bytes,
		(unsigned long long)p->evictions, (unsigned long long)p->refusals,
		(unsigned long long)p->transitions_total);
	for (size_t i = 0; i < p->n_transitions; i++) {
		const Snapkv__V1__PressureTransition *t = p->transitions[i];

		fprintf(o,
			"%s{\"time_ns\":%llu,\"prev\":\"%s\",\"level\":\"%s\",\"used_bytes\":%llu,"
			"\"total_bytes\":%llu}",
			i ? "," : "", (unsigned long long)t->time_ns, level_name(t->prev),
			level_name(t->level), (unsigned long long)t->used_bytes,
			(unsigned long long)t->total_bytes);
	}
	fprintf(o, "]}\n");
}

static void pressure_usage(FILE *f)
{
	fprintf(f, "usage: snapkvctl pressure [--socket PATH] [--json]\n"
		   "       snapkvctl pressure set [--socket PATH] [--high W] [--high-leave W]\n"
		   "                 [--critical W] [--critical-leave W] [--actions LIST|none]\n"
		   "                 [--scale-high F] [--scale-critical F] [--guaranteed-share F]\n"
		   "Shows the pool's pressure level, watermarks and last transitions, or changes\n"
		   "them until the next reload (root or the daemon's user). W: 80%%, 0.8 or bytes\n"
		   "(12G); LIST: notify,hooks,scale,evict,refuse in the order to run them; F: 0.5\n"
		   "or 50%%.\n");
}

int ctl_pressure(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"socket", required_argument, NULL, 's'},
	    {"json", no_argument, NULL, 'j'},
	    {"high", required_argument, NULL, 'H'},
	    {"high-leave", required_argument, NULL, 'h'},
	    {"critical", required_argument, NULL, 'C'},
	    {"critical-leave", required_argument, NULL, 'c'},
	    {"actions", required_argument, NULL, 'a'},
	    {"scale-high", required_argument, NULL, 'x'},
	    {"scale-critical", required_argument, NULL, 'y'},
	    {"guaranteed-share", required_argument, NULL, 'g'},
	    {"help", no_argument, NULL, '?' + 256},
	    {0},
	};
	Snapkv__V1__AdminRequest req = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__PressureSettings ps = SNAPKV__V1__PRESSURE_SETTINGS__INIT;
	Snapkv__V1__AdminReply *rep = NULL;
	char err[300];
	const char *sock = NULL;
	int json = 0, set = 0, nset = 0, c, r;

	if (argc > 1 && strcmp(argv[1], "set") == 0) {
		set = 1;
		argv++;
		argc--;
	}
	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			sock = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'H':
			ps.high = optarg;
			nset++;
			break;
		case 'h':
			ps.high_leave = optarg;
			nset++;
			break;
		case 'C':
			ps.critical = optarg;
			nset++;
			break;
		case 'c':
			ps.critical_leave = optarg;
			nset++;
			break;
		case 'a':
			ps.actions = optarg;
			nset++;
			break;
		case 'x':
			ps.scale_high = optarg;
			nset++;
			break;
		case 'y':
			ps.scale_critical = optarg;
			nset++;
			break;
		case 'g':
			ps.guaranteed_share = optarg;
			nset++;
			break;
		case '?' + 256:
			pressure_usage(stdout);
			return CTL_EXIT_OK;
		default:
			pressure_usage(stderr);
			return CTL_EXIT_USAGE;
		}
	}
	if (optind < argc || (nset && !set) || (set && !nset)) {
		ctl_err("pressure",
			set ? "set: nothing to change" : "settings need `pressure set`");
		pressure_usage(stderr);
		return CTL_EXIT_USAGE;
	}
	sock = ctl_daemon_socket(sock);
	req.kind = set ? SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET
		       : SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE;
	if (set)
		req.pressure = &ps;
	r = admin_call(sock, &req, &rep, err, sizeof(err));
	if (r < 0) {
		ctl_err("pressure", "%s", err);
		return r == -EINVAL ? CTL_EXIT_USAGE : CTL_EXIT_FAIL;
	}
	if (!rep->pressure) {
		ctl_err("pressure", "this snapkvd does not report pressure");
		snapkv__v1__admin_reply__free_unpacked(rep, NULL);
		return CTL_EXIT_FAIL;
	}
	if (json)
		print_pressure_json(stdout, rep->pressure);
	else
		print_pressure(stdout, rep->pressure);
	snapkv__v1__admin_reply__free_unpacked(rep, NULL);
	return CTL_EXIT_OK;
}

/* ------------------------------------------------------------------- top */

static int fetch_metrics(const char *sock, struct ctl_prom *ret, char *err, size_t errlen)
{
	Snapkv__V1__AdminRequest req = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__AdminReply *rep = NULL;
	size_t line = 0;
	int r;

	req.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS;
	r = admin_call(sock, &req, &rep, err, errlen);
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
	char err[300];
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
	sock = ctl_daemon_socket(sock);
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
