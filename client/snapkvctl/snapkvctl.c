// SPDX-License-Identifier: MIT
/*
 * snapkvctl.c - entry point of the snapkvctl CLI: global options and the
 * subcommand table. Each subcommand lives in its own ctl-*.c.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ctl-daemon.h"
#include "proto/skv-io.h"
#include "skv-safetensors.h"
#include "snapkvctl.h"

static const struct ctl_cmd cmds[] = {
    {"compact", "compact a safetensors K/V dump (in snapkvd, or --offline here)", ctl_compact},
    {"inspect", "tensors, metadata and kept positions of a safetensors file", ctl_inspect},
    {"status", "the daemon's version, pool, sessions and request counts", ctl_status},
    {"caches", "compact caches the daemon holds", ctl_caches},
    {"ledger", "capacity ledger per cache, tenant and pool", ctl_ledger},
    {"metrics", "Prometheus text exposition of the daemon's metrics", ctl_metrics},
    {"pressure", "memory pressure: level, watermarks, transitions; `set` changes them",
     ctl_pressure},
    {"top", "live view: pool, tenants, compactions/s, p50/p99, retained mass", ctl_top},
};

#define N_CMDS (sizeof(cmds) / sizeof(cmds[0]))

void ctl_err(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "snapkvctl%s%s: ", cmd ? " " : "", cmd ? cmd : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int ctl_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
	uint64_t v = 0;

	if (!s || !*s)
		return -EINVAL;
	for (const char *p = s; *p; p++) {
		if (!isdigit((unsigned char)*p))
			return -EINVAL;
		if (__builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
			return -ERANGE;
	}
	if (v < min || v > max)
		return -ERANGE;
	*ret = v;
	return 0;
}

int ctl_parse_u32(const char *s, uint32_t min, uint32_t max, uint32_t *ret)
{
	uint64_t v;
	int r = ctl_parse_u64(s, min, max, &v);
	if (r < 0)
		return r;
	*ret = (uint32_t)v;
	return 0;
}

int ctl_parse_choice(const char *s, const char *const *names)
{
	for (int i = 0; names[i]; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	return -EINVAL;
}

void ctl_print_ranges(FILE *f, const int32_t *pos, uint32_t n, uint32_t max_ranges)
{
	uint32_t shown = 0, i = 0;

	while (i < n) {
		uint32_t e = i;
		while (e + 1 < n && (int64_t)pos[e + 1] == (int64_t)pos[e] + 1)
			e++;
		if (shown == max_ranges) {
			uint32_t rest = 0;
			for (uint32_t k = i; k < n; k++)
				rest += (k == i || (int64_t)pos[k] != (int64_t)pos[k - 1] + 1);
			fprintf(f, " ... (%" PRIu32 " more ranges)", rest);
			break;
		}
		if (e == i)
			fprintf(f, "%s%" PRId32, shown ? ", " : "", pos[i]);
		else
			fprintf(f, "%s%" PRId32 "-%" PRId32, shown ? ", " : "", pos[i], pos[e]);
		shown++;
		i = e + 1;
	}
	fputc('\n', f);
}

void ctl_fmt_shape(const struct skv_st_tensor *t, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "[");
	for (uint32_t i = 0; i < t->rank && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
	if (o < len)
		snprintf(buf + o, len - o, "]");
}

static void usage(FILE *f)
{
	fprintf(f, "usage: snapkvctl [--help] [--version] [--socket PATH] <command> [options]\n\n"
		   "commands:\n");
	for (size_t i = 0; i < N_CMDS; i++)
		fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f, "\n--socket PATH (before or after the command) names the daemon's socket;\n"
		   "without it: $SNAPKV_SOCKET, else /run/snapkvd/snapkvd.sock if it exists,\n"
		   "else $XDG_RUNTIME_DIR/snapkvd.sock.\n"
		   "--timeout MS (before or after the command; else $SNAPKV_TIMEOUT_MS, else\n"
		   "30000) bounds each exchange with the daemon; 0 waits forever.\n"
		   "Every command that reads from the daemon takes --json.\n"
		   "`snapkvctl <command> --help` describes a command's options.\n"
		   "Exit status: 0 success, 1 run-time failure, 2 bad usage or bad input.\n");
}

/*
 * --timeout MS / --timeout=MS anywhere before a "--" (no subcommand has an
 * option of that name): checked, passed on as $SNAPKV_TIMEOUT_MS, which
 * libsnapkv and the admin calls read, and taken out of argv. 0, or the exit
 * code.
 */
static int take_timeout(int *argc, char **argv)
{
	const char *val = NULL;
	int out = 1;
	uint32_t ms;

	for (int a = 1; a < *argc; a++) {
		if (strcmp(argv[a], "--") == 0) {
			while (a < *argc)
				argv[out++] = argv[a++];
			break;
		}
		if (strcmp(argv[a], "--timeout") == 0) {
			if (a + 1 >= *argc) {
				ctl_err(NULL, "--timeout needs a number of milliseconds");
				return CTL_EXIT_USAGE;
			}
			val = argv[++a];
		} else if (strncmp(argv[a], "--timeout=", 10) == 0) {
			val = argv[a] + 10;
		} else {
			argv[out++] = argv[a];
			continue;
		}
		if (!*val || setenv("SNAPKV_TIMEOUT_MS", val, 1) < 0 ||
		    skv_io_timeout_env(&ms) < 0) {
			ctl_err(NULL, "--timeout \"%s\": expected milliseconds, 0 to %u", val,
				SKV_IO_MAX_TIMEOUT_MS);
			return CTL_EXIT_USAGE;
		}
	}
	argv[out] = NULL;
	*argc = out;
	return 0;
}

int main(int argc, char **argv)
{
	uint32_t ms;
	int a = 1, r;

	r = take_timeout(&argc, argv);
	if (r)
		return r;

	/* Global options before the command. --socket there means the same as
	 * after it: it goes on as $SNAPKV_SOCKET, which every command that
	 * talks to the daemon reads, and a --socket after the command still
	 * wins. */
	while (a < argc && argv[a][0] == '-') {
		const char *sock = NULL;

		if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
			usage(stdout);
			return CTL_EXIT_OK;
		}
		if (strcmp(argv[a], "--version") == 0) {
			printf("snapkvctl %s\n", SKV_VERSION);
			return CTL_EXIT_OK;
		}
		if (strcmp(argv[a], "--socket") == 0) {
			if (a + 1 >= argc || !argv[a + 1][0]) {
				ctl_err(NULL, "--socket needs a PATH");
				return CTL_EXIT_USAGE;
			}
			sock = argv[++a];
		} else if (strncmp(argv[a], "--socket=", 9) == 0 && argv[a][9]) {
			sock = argv[a] + 9;
		} else {
			ctl_err(NULL,
				"unknown option \"%s\" before the command (see snapkvctl --help)",
				argv[a]);
			return CTL_EXIT_USAGE;
		}
		if (setenv("SNAPKV_SOCKET", sock, 1) < 0) {
			ctl_err(NULL, "setenv: %s", strerror(errno));
			return CTL_EXIT_FAIL;
		}
		a++;
	}
	if (a >= argc) {
		usage(stderr);
		return CTL_EXIT_USAGE;
	}
	/* from the environment too: a typo must not mean "wait forever" */
	if (skv_io_timeout_env(&ms) < 0) {
		ctl_err(NULL, "SNAPKV_TIMEOUT_MS=\"%s\": expected milliseconds, 0 to %u",
			getenv("SNAPKV_TIMEOUT_MS"), SKV_IO_MAX_TIMEOUT_MS);
		return CTL_EXIT_USAGE;
	}
	for (size_t i = 0; i < N_CMDS; i++)
		if (strcmp(argv[a], cmds[i].name) == 0)
			return cmds[i].run(argc - a, argv + a);
	ctl_err(NULL, "unknown command \"%s\" (see snapkvctl --help)", argv[a]);
	return CTL_EXIT_USAGE;
}
