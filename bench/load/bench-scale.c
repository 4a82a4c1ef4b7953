// SPDX-License-Identifier: MIT
/*
 * bench-scale - issue 24's scenario: one tenant holds N small caches (S
 * sessions, at most 4096 each) in a pool at high pressure, and a bystander
 * engine compacts small prompts all along (one every 0.5 ms). Printed, per
 * phase, the bystander's compaction latency (p50, p99, max, count) and the
 * longest gap between the daemon's watchdog pings (it runs with
 * NOTIFY_SOCKET and WATCHDOG_USEC pointing here); then SIGTERM's time.
 * Phases: create (the N caches), scrape (GET /metrics in a loop), ledger
 * (`snapkvctl ledger --json`, all pages), transition (watermarks moved so
 * the level falls to normal and comes back to high: hooks run, with the
 * ledger snapshot), release (half the caches, released with linger at high
 * pressure: each is evicted at once; stopped after 10 T), then SIGTERM with
 * the rest held.
 *
 *   bench-scale [--caches N] [--seconds T] [--snapkvd PATH] [--snapkvctl PATH]
 *   (defaults: 250000 caches, 3 s per timed phase, $BUILD/snapkvd and
 *    $BUILD/snapkvctl; run it under nice, on a quiet machine if you can)
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "../bench-host.h"
#include "snapkv.h"

#define PER_SESSION 4096
#define MAX_LAT	    (1u << 22)
#define PHASES	    6

static const char *const phase_name[PHASES] = {"idle",	 "create",     "scrape",
					       "ledger", "transition", "release"};

/* Shared with the bystander: the phase now, its latencies tagged by phase. */
struct shared {
	_Atomic int phase, stop, ready, failed;
	_Atomic unsigned n;
	uint64_t lat_ns[MAX_LAT];
	unsigned char lat_phase[MAX_LAT];
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* A tiny compaction (1 layer, 1 head, D 8, L 16, W 4, C 8) from buffer b. */
static void desc(struct skv_buffer *b, struct skv_layer_ref *lr, struct skv_compact_desc *d)
{
	float *p = skv_buffer_data(b);

	for (unsigned i = 0; i < (4 + 2 * 16) * 8; i++)
		p[i] = (float)((i * 7919u) % 97) / 97.0f - 0.5f;
	lr->q = (struct skv_tensor_ref){b, 0, SKV_DTYPE_F32, 4 * 8, 8, 0, 0};
	lr->k = (struct skv_tensor_ref){b, 4 * 8 * 4, SKV_DTYPE_F32, 16 * 8, 8, 0, 0};
	lr->v = (struct skv_tensor_ref){b, (4 + 16) * 8 * 4, SKV_DTYPE_F32, 16 * 8, 8, 0, 0};
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape =
	    (struct skv_shape){.prompt_len = 16, .head_dim = 8, .h_q = 1, .h_kv = 1, .n_q = 4};
	d->layers = 1;
	skv_client_params_init(&d->params);
	d->params.window = 4;
	d->params.capacity = 8;
	d->layer = lr;
	d->out_layout = SKV_LAYOUT_HND;
}

static int bystander(const char *sock, struct shared *sh)
{
	struct skv_client_opts co = {.opts_size = sizeof(co), .name = "bystander"};
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr;
	struct skv_compact_desc d;
	int r;

	if ((r = skv_client_connect(sock, &co, &c)) < 0 || (r = skv_buffer_alloc(c, 4096, &b)) < 0)
		goto out;
	desc(b, &lr, &d);
	atomic_store(&sh->ready, 1);
	while (!atomic_load(&sh->stop)) {
		struct skv_cache *k;
		int ph = atomic_load(&sh->phase);
		uint64_t t0 = now_ns();
		unsigned i;

		if ((r = skv_client_compact(c, &d, &k)) < 0)
			goto out;
		i = atomic_fetch_add(&sh->n, 1);
		if (i < MAX_LAT) {
			sh->lat_ns[i] = now_ns() - t0;
			sh->lat_phase[i] = (unsigned char)ph;
		}
		if ((r = skv_cache_release(k)) < 0)
			goto out;
		usleep(500);
	}
out:
	if (r < 0) {
		fprintf(stderr, "bench-scale bystander: %s (%s)\n", skv_client_error(c),
			strerror(-r));
		atomic_store(&sh->failed, 1);
		atomic_store(&sh->ready, 1);
	}
	skv_buffer_free(b);
	skv_client_close(c);
	return r < 0;
}

/* The daemon's sd_notify socket: the longest gap between WATCHDOG=1 per phase. */
struct watch {
	int fd;
	struct shared *sh;
	uint64_t last, gap[PHASES];
	_Atomic int stop;
};

static void *watch_main(void *arg)
{
	struct watch *w = arg;
	char buf[512];

	while (!atomic_load(&w->stop)) {
		ssize_t n = recv(w->fd, buf, sizeof(buf) - 1, 0);
		uint64_t t = now_ns();
		int ph = atomic_load(&w->sh->phase);

		if (n <= 0)
			continue;
		buf[n] = 0;
		if (!strstr(buf, "WATCHDOG=1"))
			continue;
		if (w->last && t - w->last > w->gap[ph])
			w->gap[ph] = t - w->last;
		w->last = t;
	}
	return NULL;
}

static int http_get(int port, size_t *ret_bytes)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
	char buf[65536];
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    write(fd, req, sizeof(req) - 1) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	*ret_bytes = 0;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		*ret_bytes += (size_t)n;
	close(fd);
	return 0;
}

static int run(const char *cmd)
{
	int st = system(cmd);

	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void report(struct shared *sh, struct watch *w, const uint64_t *took)
{
	unsigned n = atomic_load(&sh->n);
	uint64_t *v = malloc(sizeof(uint64_t) * (n ? n : 1));

	printf("  %-10s %9s %9s %9s %9s %8s %12s\n", "phase", "took s", "p50 ms", "p99 ms",
	       "max ms", "count", "watchdog gap");
	for (int p = 1; p < PHASES && v; p++) {
		size_t m = 0;

		for (unsigned i = 0; i < n && i < MAX_LAT; i++)
			if (sh->lat_phase[i] == p)
				v[m++] = sh->lat_ns[i];
		qsort(v, m, sizeof(*v), cmp);
		printf("  %-10s %9.2f %9.3f %9.3f %9.3f %8zu %10.3f s\n", phase_name[p],
		       (double)took[p] / 1e9, m ? (double)v[m / 2] / 1e6 : 0.0,
		       m ? (double)v[m * 99 / 100] / 1e6 : 0.0, m ? (double)v[m - 1] / 1e6 : 0.0, m,
		       (double)w->gap[p] / 1e9);
	}
	free(v);
}

struct opts {
	unsigned caches, seconds;
	char snapkvd[512], snapkvctl[512];
};

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {{"caches", 1, 0, 'n'},
					   {"seconds", 1, 0, 's'},
					   {"snapkvd", 1, 0, 'd'},
					   {"snapkvctl", 1, 0, 'c'},
					   {0}};
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	int ch;

	o->caches = 250000;
	o->seconds = 3;
	snprintf(o->snapkvd, sizeof(o->snapkvd), "%s/snapkvd", build);
	snprintf(o->snapkvctl, sizeof(o->snapkvctl), "%s/snapkvctl", build);
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'n':
			o->caches = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 's':
			o->seconds = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'd':
			snprintf(o->snapkvd, sizeof(o->snapkvd), "%s", optarg);
			break;
		case 'c':
			snprintf(o->snapkvctl, sizeof(o->snapkvctl), "%s", optarg);
			break;
		default:
			return -EINVAL;
		}
	}
	if (!o->caches || o->caches > 63u * PER_SESSION || !o->seconds) {
		fprintf(stderr, "bench-scale: --caches 1..%u, --seconds >= 1\n", 63u * PER_SESSION);
		return -EINVAL;
	}
	return 0;
}

static int free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &l) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* The config, a hook that does nothing, the notify socket; the daemon. */
static pid_t start_daemon(const struct opts *o, const char *dir, int port, struct watch *w)
{
	char path[600], nsock[100], wd[32];

	struct sockaddr_un un = {.sun_family = AF_UNIX};
	uint64_t pool = (uint64_t)o->caches * 4096 * 100 / 85 + (64ull << 20);
	FILE *f;
	pid_t pid;

	snprintf(path, sizeof(path), "%s/hooks", dir);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/hooks/10-noop", dir);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fputs("#!/bin/sh\nexit 0\n", f);
	fclose(f);
	chmod(path, 0755);
	snprintf(path, sizeof(path), "%s/snapkvd.conf", dir);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fprintf(f,
		"pool_bytes = %llu\npressure_high = 5%%\npressure_high_leave = 4%%\n"
		"pressure_critical = 99%%\npressure_critical_leave = 98%%\n"
		"hook_dir = %s/hooks\nhook_ledger_json = %s/ledger.json\n"
		"metrics_listen = 127.0.0.1:%d\nlog_level = warning\n",
		(unsigned long long)pool, dir, dir, port);
	fclose(f);
	snprintf(nsock, sizeof(nsock), "%s/notify", dir);
	snprintf(un.sun_path, sizeof(un.sun_path), "%s", nsock);
	w->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (w->fd < 0 || bind(w->fd, (struct sockaddr *)&un, sizeof(un)) < 0)
		return -1;
	setsockopt(w->fd, SOL_SOCKET, SO_RCVTIMEO, &(struct timeval){0, 200000},
		   sizeof(struct timeval));
	snprintf(wd, sizeof(wd), "%u", 30u * 1000000u);
	pid = fork();
	if (pid == 0) {
		char sock[600];

		snprintf(sock, sizeof(sock), "%s/s.sock", dir);
		setenv("NOTIFY_SOCKET", nsock, 1);
		setenv("WATCHDOG_USEC", wd, 1);
		unsetenv("WATCHDOG_PID");
		execl(o->snapkvd, o->snapkvd, "--config", path, "--socket", sock, (char *)NULL);
		_exit(127);
	}
	return pid;
}

struct holder {
	struct skv_client **c;
	struct skv_buffer **b;
	struct skv_cache **k;
	unsigned sessions, n;
};

static int create(struct holder *h, const char *sock, unsigned n)
{
	struct skv_client_opts co = {.opts_size = sizeof(co), .name = "holder"};
	struct skv_layer_ref lr;
	struct skv_compact_desc d;
	int r;

	h->sessions = (n + PER_SESSION - 1) / PER_SESSION;
	h->c = calloc(h->sessions, sizeof(*h->c));
	h->b = calloc(h->sessions, sizeof(*h->b));
	h->k = calloc(n, sizeof(*h->k));
	if (!h->c || !h->b || !h->k)
		return -ENOMEM;
	for (unsigned s = 0; s < h->sessions; s++) {
		if ((r = skv_client_connect(sock, &co, &h->c[s])) < 0 ||
		    (r = skv_buffer_alloc(h->c[s], 4096, &h->b[s])) < 0)
			return r;
		desc(h->b[s], &lr, &d);
		for (unsigned i = s * PER_SESSION; i < n && i < (s + 1) * PER_SESSION; i++) {
			if ((r = skv_client_compact(h->c[s], &d, &h->k[i])) < 0) {
				fprintf(stderr, "bench-scale: cache %u: %s\n", i,
					skv_client_error(h->c[s]));
				return r;
			}
			h->n = i + 1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/bench-scale-XXXXXX", sock[128], cmd[4096], la0[64], la1[64], cpu[128];
	char when[64];
	struct opts o;
	struct shared *sh;
	struct watch w = {0};
	struct holder h = {0};
	struct skv_client *probe = NULL;
	uint64_t took[PHASES] = {0}, t0, term_ns;
	pthread_t wt;
	pid_t dpid, bpid;
	time_t tt = time(NULL);
	size_t bytes = 0;
	unsigned released = 0;
	int st, port, r;

	if (parse(argc, argv, &o) < 0)
		return 2;
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED || !mkdtemp(dir) || (port = free_port()) < 0)
		return 1;
	chmod(dir, 0755);
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	w.sh = sh;
	dpid = start_daemon(&o, dir, port, &w);
	if (dpid < 0 || pthread_create(&wt, NULL, watch_main, &w) != 0)
		return 1;
	for (int i = 0; i < 500 && skv_client_connect(sock, NULL, &probe) < 0; i++)
		usleep(10000);
	if (!probe) {
		fprintf(stderr, "bench-scale: cannot start %s\n", o.snapkvd);
		kill(dpid, SIGKILL);
		return 1;
	}
	skv_client_close(probe);
	chmod(sock, 0666);
	bench_loadavg(la0, sizeof(la0));
	bpid = fork();
	if (bpid == 0) {
		/* another tenant: uid 65534 when we are root */
		if (getuid() == 0 && (setgid(65534) < 0 || setuid(65534) < 0))
			_exit(1);
		_exit(bystander(sock, sh));
	}
	while (!atomic_load(&sh->ready))
		usleep(1000);
	if (atomic_load(&sh->failed))
		goto fail;

	atomic_store(&sh->phase, 1);
	t0 = now_ns();
	r = create(&h, sock, o.caches);
	took[1] = now_ns() - t0;
	if (r < 0)
		goto fail;

	atomic_store(&sh->phase, 2);
	t0 = now_ns();
	for (unsigned i = 0; now_ns() - t0 < o.seconds * 1000000000ull; i++)
		if (http_get(port, &bytes) < 0)
			goto fail;
	took[2] = now_ns() - t0;

	atomic_store(&sh->phase, 3);
	snprintf(cmd, sizeof(cmd), "%s --socket %s ledger --json > %s/ledger.out", o.snapkvctl,
		 sock, dir);
	t0 = now_ns();
	if (run(cmd) != 0)
		goto fail;
	took[3] = now_ns() - t0;

	atomic_store(&sh->phase, 4);
	t0 = now_ns();
	snprintf(
	    cmd, sizeof(cmd),
	    "%s --socket %s pressure set --high 99%% --high-leave 98%% >/dev/null && sleep 1.5 "
	    "&& %s --socket %s pressure set --high 5%% --high-leave 4%% >/dev/null",
	    o.snapkvctl, sock, o.snapkvctl, sock);
	if (run(cmd) != 0)
		goto fail;
	usleep(o.seconds * 1000000u);
	took[4] = now_ns() - t0;

	/* at most 10 T: on a daemon where each release walks every cache
	 * this phase alone could take many minutes */
	atomic_store(&sh->phase, 5);
	t0 = now_ns();
	for (released = 0; released < h.n / 2; released++)
		if (now_ns() - t0 > o.seconds * 10000000000ull)
			break;
		else if (skv_cache_release_linger(h.k[released]) < 0)
			goto fail;
	took[5] = now_ns() - t0;

	atomic_store(&sh->stop, 1);
	waitpid(bpid, &st, 0);
	t0 = now_ns();
	kill(dpid, SIGTERM);
	waitpid(dpid, &st, 0);
	term_ns = now_ns() - t0;
	atomic_store(&w.stop, 1);
	pthread_join(wt, NULL);
	bench_loadavg(la1, sizeof(la1));
	bench_cpu_model(cpu, sizeof(cpu));
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", gmtime(&tt));
	printf("bench-scale: %s, one tenant holding %u caches (%u sessions), pressure high, a "
	       "bystander (uid %s) compacting every 0.5 ms\n",
	       o.snapkvd, h.n, h.sessions, getuid() == 0 ? "65534" : "same");
	printf("  machine: %s, %ld cores; load average %s before, %s after; %s\n", cpu,
	       sysconf(_SC_NPROCESSORS_ONLN), la0, la1, when);
	report(sh, &w, took);
	printf("  release: %u caches released with linger (evicted at once) in %.2f s\n", released,
	       (double)took[5] / 1e9);
	printf("  last /metrics %zu bytes; SIGTERM with %u caches held: %.2f s (exit %d)\n", bytes,
	       h.n - released, (double)term_ns / 1e9, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	run(cmd);
	return 0;
fail:
	fprintf(stderr, "bench-scale: failed (phase %s)\n", phase_name[atomic_load(&sh->phase)]);
	atomic_store(&sh->stop, 1);
	kill(bpid, SIGKILL);
	kill(dpid, SIGKILL);
	return 1;
}
