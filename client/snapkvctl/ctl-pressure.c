// SPDX-License-Identifier: MIT
/*
 * ctl-pressure.c - `snapkvctl pressure` (levels, watermarks, last
 * transitions; `pressure set` changes them at run time), asked of the
 * daemon's admin interface on the control socket (ctl-admin.c).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl-admin.h"
#include "ctl-daemon.h"
#include "ctl-prom.h"
#include "snapkvctl.h"

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
	fprintf(o, "level             %s\n", ctl_pressure_name(p->level));
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
		fprintf(o, "  %s  %-8s -> %-8s  %llu / %llu B (%.1f%%)\n", t,
			ctl_pressure_name(tr->prev), ctl_pressure_name(tr->level),
			(unsigned long long)tr->used_bytes, (unsigned long long)tr->total_bytes,
			tr->total_bytes ? 100.0 * (double)tr->used_bytes / (double)tr->total_bytes
					: 0.0);
	}
}

static json_t *pressure_json(const Snapkv__V1__PressureInfo *p)
{
	json_t *o, *tr = json_array();

	for (size_t i = 0; tr && i < p->n_transitions; i++) {
		const Snapkv__V1__PressureTransition *t = p->transitions[i];

		if (json_array_append_new(tr, json_pack("{s:I, s:s, s:s, s:I, s:I}", "time_ns",
							(json_int_t)t->time_ns, "prev",
							ctl_pressure_name(t->prev), "level",
							ctl_pressure_name(t->level), "used_bytes",
							(json_int_t)t->used_bytes, "total_bytes",
							(json_int_t)t->total_bytes)) < 0) {
			json_decref(tr);
			return NULL;
		}
	}
	/* s? and o?: NULL becomes null; o steals each reference, tr included */
	o = json_pack(
	    "{s:s, s:{s:I, s:I}, s:{s:{s:o, s:I, s:o, s:I}, s:{s:o, s:I, s:o, s:I}}, "
	    "s:o, s:o, s:o, s:o, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:o?}",
	    "level", ctl_pressure_name(p->level), "pool", "used_bytes", (json_int_t)p->pool_used,
	    "total_bytes", (json_int_t)p->pool_total, "watermarks", "high", "enter",
	    ctl_json_str(p->high), "enter_bytes", (json_int_t)p->high_bytes, "leave",
	    ctl_json_str(p->high_leave), "leave_bytes", (json_int_t)p->high_leave_bytes, "critical",
	    "enter", ctl_json_str(p->critical), "enter_bytes", (json_int_t)p->critical_bytes,
	    "leave", ctl_json_str(p->critical_leave), "leave_bytes",
	    (json_int_t)p->critical_leave_bytes, "actions", ctl_json_str(p->actions), "scale_high",
	    ctl_json_real(p->scale_high), "scale_critical", ctl_json_real(p->scale_critical),
	    "guaranteed_share", ctl_json_real(p->guaranteed_share), "suggested_capacity",
	    (int)p->suggested_capacity, "hooks_running", (int)p->hooks_running, "lingering_caches",
	    (json_int_t)p->lingering_caches, "lingering_bytes", (json_int_t)p->lingering_bytes,
	    "evictions", (json_int_t)p->evictions, "refusals", (json_int_t)p->refusals,
	    "transitions_total", (json_int_t)p->transitions_total, "transitions", tr);
	return o;
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
	char err[900];
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
	req.kind = set ? SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET
		       : SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE;
	if (set)
		req.pressure = &ps;
	r = ctl_admin_call(sock, &req, &rep, NULL, err, sizeof(err));
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
		r = ctl_json_print("pressure", pressure_json(rep->pressure));
	else
		print_pressure(stdout, rep->pressure);
	snapkv__v1__admin_reply__free_unpacked(rep, NULL);
	return json ? r : CTL_EXIT_OK;
}
