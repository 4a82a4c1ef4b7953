// SPDX-License-Identifier: MIT
/*
 * snapkvd - SnapKV compaction daemon. Runs in the foreground (systemd
 * Type=notify, or by hand); see snapkvd --help and systemd/snapkvd.conf.
 * This file is the command line: options, the config file, the overrides;
 * snapkvd-server.c is the daemon.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-config.h"
#include "snapkvd-log.h"
#include "snapkvd-server.h"

struct args {
	const char *config_path;
	/* command-line overrides of config keys, by key */
	const char *socket, *backend, *pool, *threads, *workers, *level;
	bool check_config; /* --check-config: validate, print, exit */
};

static pthread_t main_thread;

/*
 * A thread we did not create (a sanitizer's, a library's constructor's) may
 * not block our signals and would take them with the default action. Such a
 * thread hands them on to the main thread, which blocks them, so they stay
 * pending for the loop's signalfd. pthread_kill is async-signal-safe.
 */
static void forward_signal(int sig)
{
	if (!pthread_equal(pthread_self(), main_thread))
		pthread_kill(main_thread, sig);
}

/* Before any thread exists, so every thread inherits the mask and the
 * signals only ever arrive through the loop's signalfd. */
static void block_signals(void)
{
	struct sigaction sa = {.sa_handler = forward_signal, .sa_flags = SA_RESTART};
	sigset_t mask;

	main_thread = pthread_self();
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	snapkvd_server_signals(&mask);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: snapkvd [--config FILE] [--socket PATH] [--backend host|cuda]\n"
		   "               [--pool-bytes SIZE] [--threads N] [--workers N]\n"
		   "               [--log-level LEVEL] [--check-config]\n"
		   "Runs in the foreground. SIGTERM drains in-flight work and exits 0;\n"
		   "SIGHUP reloads the limits of the config file. --check-config prints\n"
		   "the effective configuration (file and options) and exits: 0 when\n"
		   "valid, 1 on a configuration error, as the daemon would.\n");
}

/* -1: go on; else the exit code (0 after --help/--version, 2 on misuse:
 * an unknown option; a bad value is a configuration error, load_config's). */
static int parse_args(int argc, char **argv, struct args *a)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"socket", required_argument, NULL, 's'},
	    {"backend", required_argument, NULL, 'b'},
	    {"pool-bytes", required_argument, NULL, 'p'},
	    {"threads", required_argument, NULL, 't'},
	    {"workers", required_argument, NULL, 'w'},
	    {"log-level", required_argument, NULL, 'l'},
	    {"check-config", no_argument, NULL, 'C'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {0},
	};
	const char **slot[128] = {
	    ['c'] = &a->config_path, ['s'] = &a->socket,  ['b'] = &a->backend, ['p'] = &a->pool,
	    ['t'] = &a->threads,     ['w'] = &a->workers, ['l'] = &a->level,
	};
	int c;

	while ((c = getopt_long(argc, argv, "c:s:b:p:t:w:l:hV", opts, NULL)) != -1) {
		if (c > 0 && c < 128 && slot[c]) {
			*slot[c] = optarg;
		} else if (c == 'h') {
			usage(stdout);
			return 0;
		} else if (c == 'C') {
			a->check_config = true;
		} else if (c == 'V') {
			printf("snapkvd %s\n", SKV_VERSION);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	return -1;
}

/* Defaults, the file, then the command line through the same checks.
 * 0, or 1 for a configuration error, whether from the file (named with the
 * line) or from an option (named as it was given). */
static int load_config(const struct args *a, struct snapkvd_config *cfg)
{
	const struct {
		const char *opt, *key, *val;
	} ov[] = {{"socket", "socket", a->socket},	 {"backend", "backend", a->backend},
		  {"pool-bytes", "pool_bytes", a->pool}, {"threads", "threads", a->threads},
		  {"workers", "workers", a->workers},	 {"log-level", "log_level", a->level}};
	struct skv_error err = {{0}, -1, -1};

	snapkvd_config_defaults(cfg);
	if (a->config_path && snapkvd_config_load(cfg, a->config_path, &err) < 0) {
		log_error("config: %s: %s", a->config_path, err.msg);
		return 1;
	}
	for (size_t i = 0; i < sizeof(ov) / sizeof(ov[0]); i++) {
		if (ov[i].val && snapkvd_config_set(cfg, ov[i].key, ov[i].val, &err) < 0) {
			log_error("--%s %s: %s", ov[i].opt, ov[i].val, err.msg);
			return 1;
		}
	}
	return 0;
}

/* --check-config: the effective configuration on stdout, as a file. */
static int check_config(const struct snapkvd_config *cfg, const char *path)
{
	char *text = NULL;

	if (snapkvd_config_dump(cfg, &text) < 0) {
		log_error("--check-config: out of memory");
		return 1;
	}
	printf("# snapkvd %s: the effective configuration (%s, then the options): valid\n%s",
	       SKV_VERSION, path ? path : "the defaults", text);
	free(text);
	return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	static struct snapkvd_config cfg;
	struct snapkvd_server *srv = NULL;
	struct args a = {0};
	int r = parse_args(argc, argv, &a);

	if (r >= 0)
		return r;
	block_signals();
	snapkvd_log_init();
	r = load_config(&a, &cfg);
	if (r || a.check_config)
		return r ? r : check_config(&cfg, a.config_path);
	r = snapkvd_server_new(&cfg, a.config_path, &srv);
	if (r < 0)
		return 1;
	r = snapkvd_server_run(srv);
	snapkvd_server_free(srv);
	log_info("stopped");
	return r < 0 ? 1 : 0;
}
