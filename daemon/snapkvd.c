// SPDX-License-Identifier: MIT
/*
 * snapkvd - SnapKV compaction daemon. Runs in the foreground (systemd
 * Type=notify, or by hand); see snapkvd --help and systemd/snapkvd.conf.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "kernels/cuda/skv-backend.h"
#include "snapkvd-log.h"
#include "snapkvd-server.h"

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

static void usage(FILE *f)
{
	fprintf(f, "Usage: snapkvd [--config FILE] [--socket PATH] [--backend host|cuda]\n"
		   "               [--pool-bytes SIZE] [--threads N] [--workers N]\n"
		   "               [--log-level LEVEL]\n"
		   "Runs in the foreground. SIGTERM drains in-flight work and exits 0;\n"
		   "SIGHUP reloads the limits of the config file.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"config", required_argument, NULL, 'c'},
	    {"socket", required_argument, NULL, 's'},
	    {"backend", required_argument, NULL, 'b'},
	    {"pool-bytes", required_argument, NULL, 'p'},
	    {"threads", required_argument, NULL, 't'},
	    {"workers", required_argument, NULL, 'w'},
	    {"log-level", required_argument, NULL, 'l'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {0},
	};
	static struct snapkvd_server srv;
	const char *socket_path = NULL, *backend = NULL, *pool = NULL, *threads = NULL,
		   *workers = NULL, *level = NULL;
	char err[256];
	int c, r;

	while ((c = getopt_long(argc, argv, "c:s:b:p:t:w:l:hV", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			srv.config_path = optarg;
			break;
		case 's':
			socket_path = optarg;
			break;
		case 'b':
			backend = optarg;
			break;
		case 'p':
			pool = optarg;
			break;
		case 't':
			threads = optarg;
			break;
		case 'w':
			workers = optarg;
			break;
		case 'l':
			level = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			puts("snapkvd 0.1.0");
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	/* Before any thread exists, so every thread inherits the mask and the
	 * signals only ever arrive through the loop's signalfd. */
	{
		sigset_t mask;
		struct sigaction sa = {.sa_handler = forward_signal, .sa_flags = SA_RESTART};

		main_thread = pthread_self();
		sigemptyset(&sa.sa_mask);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGHUP, &sa, NULL);
		sigemptyset(&mask);
		sigaddset(&mask, SIGTERM);
		sigaddset(&mask, SIGINT);
		sigaddset(&mask, SIGHUP);
		pthread_sigmask(SIG_BLOCK, &mask, NULL);
		signal(SIGPIPE, SIG_IGN);
	}
	snapkvd_log_init();
	snapkvd_config_defaults(&srv.cfg);
	if (srv.config_path &&
	    snapkvd_config_load(&srv.cfg, srv.config_path, err, sizeof(err)) < 0) {
		log_error("config: %s", err);
		return 1;
	}
	/* the command line wins over the file; apply it through the same parser */
	{
		char line[512];
		struct {
			const char *key, *val;
		} ov[] = {{"socket", socket_path}, {"backend", backend}, {"pool_bytes", pool},
			  {"threads", threads},	   {"workers", workers}, {"log_level", level}};
		for (size_t i = 0; i < sizeof(ov) / sizeof(ov[0]); i++) {
			if (!ov[i].val)
				continue;
			int n = snprintf(line, sizeof(line), "%s = %s\n", ov[i].key, ov[i].val);
			if (n >= (int)sizeof(line) ||
			    snapkvd_config_parse(&srv.cfg, line, n, err, sizeof(err)) < 0) {
				log_error("--%s: %s", ov[i].key,
					  n >= (int)sizeof(line) ? "too long" : err + 8);
				return 2;
			}
		}
	}
	snapkvd_log_max = srv.cfg.log_level;
	srv.start_ns = snapkvd_now_ns();
	r = snapkvd_pool_init(&srv.pool, srv.cfg.pool_bytes, srv.cfg.tenant_quota_bytes);
	if (r < 0)
		return log_error_errno(r, "Failed to set up the pool"), 1;
	if (!strcmp(srv.cfg.backend, "cuda")) {
		/* the plugin is dlopen()ed: no CUDA library is linked into snapkvd */
		struct skv_error kerr = {.msg = "", .layer = -1, .head = -1};

		r = skv_backend_load(NULL, -1, &srv.gpu, &kerr);
		if (r < 0) {
			log_error("backend cuda: %s", kerr.msg);
			return 1;
		}
	}
	{
		struct skv_error kerr = {.msg = "", .layer = -1, .head = -1};

		r = snapkvd_compactor_new(&srv, srv.cfg.threads, srv.cfg.workers, &kerr,
					  &srv.compactor);
		if (r < 0 && kerr.msg[0])
			return log_error_errno(r, "Failed to start the compactor: %s", kerr.msg), 1;
		if (r < 0)
			return log_error_errno(r, "Failed to start the compactor"), 1;
	}
	r = snapkvd_loop_init(&srv);
	if (r < 0) {
		snapkvd_loop_fini(&srv);
		snapkvd_compactor_free(srv.compactor);
		return 1;
	}
	snprintf(srv.backend_desc, sizeof(srv.backend_desc), "%s", srv.cfg.backend);
	if (srv.gpu)
		snprintf(srv.backend_desc, sizeof(srv.backend_desc), "cuda: %s",
			 snapkvd_compactor_isa(srv.compactor));
	log_info("backend %s (%s), %u workers x %u threads, pool %llu bytes, ring %u entries x "
		 "%u-byte slots",
		 srv.cfg.backend, snapkvd_compactor_isa(srv.compactor),
		 snapkvd_compactor_workers(srv.compactor), snapkvd_compactor_threads(srv.compactor),
		 (unsigned long long)srv.cfg.pool_bytes, srv.cfg.sq_entries, srv.cfg.slot_bytes);
	r = snapkvd_loop_run(&srv);
	sd_notify(0, "STOPPING=1");
	snapkvd_compactor_free(srv.compactor);
	/* sessions still open drop their CUDA imports and GPU arenas here:
	 * before the plugin goes */
	snapkvd_loop_fini(&srv);
	skv_backend_unload(srv.gpu);
	snapkvd_pool_destroy(&srv.pool);
	log_info("stopped");
	return r < 0 ? 1 : 0;
}
