// SPDX-License-Identifier: MIT
/*
 * bench-scale - issue 24's scenario: one tenant holds N small caches (S
 * sessions, at most 4096 each) in a pool at high pressure, and a bystander
 * engine compacts small prompts all along (one every 0.5 ms). Printed, per
 * phase, the bystander's compaction latency (p50, p99, max, count) and the
 * longest gap between the daemon's watchdog pings (it runs with
 * NOTIFY_SOCKET and WATCHDOG_USEC pointing here); then SIGTERM's time.
 * The bystander also times a ring NOP after each compaction.
 * Phases: create (the N caches), held (nothing but the bystander: its idle
 * figures with N caches held), pollers (P root admin sessions each asking
 * for LEDGER pages in a loop, cursor to the end and again, for T seconds;
 * issue 20 point 9), scrape (GET /metrics in a loop), ledger
 * (`snapkvctl ledger --json`, all pages), transition (watermarks moved so
 * the level falls to normal and comes back to high: hooks run, with the
 * ledger snapshot), release (half the caches, released with linger at high
 * pressure: each is evicted at once; stopped after 10 T), then SIGTERM with
 * the rest held.
 *
 *   bench-scale [--caches N] [--seconds T] [--pollers P] [--only-pollers]
 *               [--set KEY=VALUE ...] [--snapkvd PATH] [--snapkvctl PATH]
 *   (defaults: 250000 caches, 3 s per timed phase, 2 pollers, $BUILD/snapkvd
 *    and $BUILD/snapkvctl; --only-pollers stops after the pollers phase;
 *    --set adds a line to the daemon's config, e.g. admin_root_rate=0;
 *    run it on a quiet machine if you can)
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
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
#include "proto/skv-frame.h"
#include "proto/skv-io.h"
#include "proto/snapkv.pb-c.h"
#include "snapkv.h"

#define PER_SESSION 4096
#define MAX_LAT	    (1u << 22)
#define MAX_POLLERS 16

enum { P_IDLE, P_CREATE, P_HELD, P_POLLERS, P_SCRAPE, P_LEDGER, P_TRANSITION, P_RELEASE, PHASES };
static const char *const phase_name[PHASES] = {"idle",	 "create", "held",	 "pollers",
					       "scrape", "ledger", "transition", "release"};

/* Shared with the bystander and the pollers: the phase now, the
 * bystander's compaction and ring NOP latencies tagged by phase, what the
 * pollers got. */
struct shared {
	_Atomic int phase, stop, ready, failed, pollers_stop;
	_Atomic unsigned n;
	uint64_t lat_ns[MAX_LAT], nop_ns[MAX_LAT];
	unsigned char lat_phase[MAX_LAT];
	_Atomic unsigned long pages, refused, listings;
	char refusal[256];
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
		t0 = now_ns();
		if ((r = skv_client_nop(c)) < 0)
			goto out;
		if (i < MAX_LAT)
			sh->nop_ns[i] = now_ns() - t0;
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

/* One admin round trip on an open admin session: 0 and *ret, or -errno. */
static int admin_call(int fd, uint8_t *buf, size_t cap, Snapkv__V1__AdminRequest *req,
		      Snapkv__V1__AdminReply **ret)
{
	uint64_t dl = skv_io_deadline(30000);
	struct skv_frame_hdr h;
	int r = skv_io_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, buf,
			    snapkv__v1__admin_request__pack(req, buf), NULL, 0, dl);

	if (r >= 0)
		r = skv_io_recv(fd, buf, cap, &h, NULL, NULL, dl);
	if (r < 0)
		return r;
	if (h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY)
		return -EPROTO;
	*ret = snapkv__v1__admin_reply__unpack(NULL, h.length, buf + SKV_FRAME_HDR_SIZE);
	return *ret ? 0 : -EBADMSG;
}

/*
 * A root poller: one admin session asking for LEDGER pages in a loop (the
 * whole listing by cursor, then again) until told to stop. A refused page
 * (a rate limit) is counted and asked again after the retry_after_ms the
 * daemon gave (at least 1 ms), as snapkvctl does.
 */
static int poller(const char *sock, struct shared *sh)
{
	static uint8_t buf[SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD];
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	uint64_t dl = skv_io_deadline(30000), after = 0;
	struct skv_frame_hdr h;
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), r;

	if (strlen(sock) >= sizeof(sa.sun_path))
		return 1;
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	hello.client_version = SKV_PROTO_VERSION;
	hello.admin = 1;
	hello.name = "poller";
	r = fd < 0 ? -errno : skv_io_connect(fd, &sa, dl);
	if (r >= 0)
		r = skv_io_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf,
				snapkv__v1__hello__pack(&hello, buf), NULL, 0, dl);
	if (r >= 0)
		r = skv_io_recv(fd, buf, sizeof(buf), &h, NULL, NULL, dl);
	if (r >= 0 && h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME)
		r = -EPROTO;
	while (r >= 0 && !atomic_load(&sh->pollers_stop)) {
		Snapkv__V1__AdminRequest req = SNAPKV__V1__ADMIN_REQUEST__INIT;
		Snapkv__V1__AdminReply *rep = NULL;

		req.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER;
		req.page_after = after;
		r = admin_call(fd, buf, sizeof(buf), &req, &rep);
		if (r < 0)
			break;
		if (rep->status < 0) {
			if (!atomic_fetch_add(&sh->refused, 1))
				snprintf(sh->refusal, sizeof(sh->refusal), "%s", rep->error);
			usleep(rep->retry_after_ms ? rep->retry_after_ms * 1000u : 1000u);
		} else {
			atomic_fetch_add(&sh->pages, 1);
			after = rep->next_page_after;
			if (!after)
				atomic_fetch_add(&sh->listings, 1);
		}
		snapkv__v1__admin_reply__free_unpacked(rep, NULL);
	}
	if (r < 0)
		fprintf(stderr, "bench-scale poller: %s\n", strerror(-r));
	if (fd >= 0)
		close(fd);
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

	uint64_t *u = malloc(sizeof(uint64_t) * (n ? n : 1));

	printf("  %-10s %7s | %-29s | %-23s | %s\n", "", "", "bystander compaction",
	       "bystander ring NOP", "");
	printf("  %-10s %7s | %7s %7s %7s %6s | %7s %7s %7s | %s\n", "phase", "took s", "p50 ms",
	       "p99 ms", "max ms", "count", "p50 ms", "p99 ms", "max ms", "watchdog gap");
	for (int p = 1; p < PHASES && v && u; p++) {
		size_t m = 0;

		if (!took[p])
			continue;
		for (unsigned i = 0; i < n && i < MAX_LAT; i++)
			if (sh->lat_phase[i] == p) {
				u[m] = sh->nop_ns[i];
				v[m++] = sh->lat_ns[i];
			}
		qsort(v, m, sizeof(*v), cmp);
		qsort(u, m, sizeof(*u), cmp);
		printf("  %-10s %7.2f | %7.3f %7.3f %7.3f %6zu | %7.3f %7.3f %7.3f | %7.3f s\n",
		       phase_name[p], (double)took[p] / 1e9, m ? (double)v[m / 2] / 1e6 : 0.0,
		       m ? (double)v[m * 99 / 100] / 1e6 : 0.0, m ? (double)v[m - 1] / 1e6 : 0.0, m,
		       m ? (double)u[m / 2] / 1e6 : 0.0, m ? (double)u[m * 99 / 100] / 1e6 : 0.0,
		       m ? (double)u[m - 1] / 1e6 : 0.0, (double)w->gap[p] / 1e9);
	}
	free(v);
	free(u);
}

struct opts {
	unsigned caches, seconds, pollers;
	bool only_pollers;
	char extra[1024]; /* --set KEY=VALUE lines for the config */
	char snapkvd[512], snapkvctl[512];
};

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {{"caches", 1, 0, 'n'},  {"seconds", 1, 0, 's'},
					   {"snapkvd", 1, 0, 'd'}, {"snapkvctl", 1, 0, 'c'},
					   {"pollers", 1, 0, 'p'}, {"only-pollers", 0, 0, 'o'},
					   {"set", 1, 0, 'x'},	   {0}};
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	int ch;

	o->caches = 250000;
	o->seconds = 3;
	o->pollers = 2;
	o->only_pollers = false;
	o->extra[0] = 0;
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
		case 'p':
			o->pollers = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'o':
			o->only_pollers = true;
			break;
		case 'x': {
			size_t n = strlen(o->extra);
			const char *eq = strchr(optarg, '=');

			if (!eq || n + strlen(optarg) + 4 >= sizeof(o->extra))
				return -EINVAL;
			snprintf(o->extra + n, sizeof(o->extra) - n, "%.*s = %s\n",
				 (int)(eq - optarg), optarg, eq + 1);
			break;
		}
		default:
			return -EINVAL;
		}
	}
	if (!o->caches || o->caches > 63u * PER_SESSION || !o->seconds ||
	    o->pollers > MAX_POLLERS) {
		fprintf(stderr, "bench-scale: --caches 1..%u, --seconds >= 1, --pollers 0..%d\n",
			63u * PER_SESSION, MAX_POLLERS);
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
		"metrics_listen = 127.0.0.1:%d\nlog_level = warning\n%s",
		(unsigned long long)pool, dir, dir, port, o->extra);
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

/* pollers: P root admin sessions asking for ledger pages for T seconds. */
static int phase_pollers(const struct opts *o, const char *sock, struct shared *sh)
{
	pid_t pid[MAX_POLLERS];
	int st, bad = 0;

	atomic_store(&sh->pollers_stop, 0);
	for (unsigned p = 0; p < o->pollers; p++) {
		pid[p] = fork();
		if (pid[p] == 0)
			_exit(poller(sock, sh));
		if (pid[p] < 0)
			return -1;
	}
	usleep(o->seconds * 1000000u);
	atomic_store(&sh->pollers_stop, 1);
	for (unsigned p = 0; p < o->pollers; p++)
		if (waitpid(pid[p], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			bad = 1;
	return bad ? -1 : 0;
}

/* The phases after create that stop nothing: one after the other, each
 * timed into took[]. 0, or -1 (the phase failed: sh->phase says which). */
static int run_phases(const struct opts *o, const char *dir, const char *sock, int port,
		      struct shared *sh, struct holder *h, uint64_t *took, unsigned *released,
		      size_t *bytes)
{
	char cmd[4096];
	uint64_t t0;

	atomic_store(&sh->phase, P_HELD);
	t0 = now_ns();
	usleep(o->seconds * 1000000u);
	took[P_HELD] = now_ns() - t0;

	atomic_store(&sh->phase, P_POLLERS);
	t0 = now_ns();
	if (o->pollers && phase_pollers(o, sock, sh) < 0)
		return -1;
	took[P_POLLERS] = o->pollers ? now_ns() - t0 : 0;
	if (o->only_pollers)
		return 0;

	atomic_store(&sh->phase, P_SCRAPE);
	t0 = now_ns();
	while (now_ns() - t0 < o->seconds * 1000000000ull)
		if (http_get(port, bytes) < 0)
			return -1;
	took[P_SCRAPE] = now_ns() - t0;

	atomic_store(&sh->phase, P_LEDGER);
	snprintf(cmd, sizeof(cmd), "%s --socket %s ledger --json > %s/ledger.out", o->snapkvctl,
		 sock, dir);
	t0 = now_ns();
	if (run(cmd) != 0)
		return -1;
	took[P_LEDGER] = now_ns() - t0;

	atomic_store(&sh->phase, P_TRANSITION);
	t0 = now_ns();
	snprintf(
	    cmd, sizeof(cmd),
	    "%s --socket %s pressure set --high 99%% --high-leave 98%% >/dev/null && sleep 1.5 "
	    "&& %s --socket %s pressure set --high 5%% --high-leave 4%% >/dev/null",
	    o->snapkvctl, sock, o->snapkvctl, sock);
	if (run(cmd) != 0)
		return -1;
	usleep(o->seconds * 1000000u);
	took[P_TRANSITION] = now_ns() - t0;

	/* at most 10 T: on a daemon where each release walks every cache
	 * this phase alone could take many minutes */
	atomic_store(&sh->phase, P_RELEASE);
	t0 = now_ns();
	for (*released = 0; *released < h->n / 2; (*released)++)
		if (now_ns() - t0 > o->seconds * 10000000000ull)
			break;
		else if (skv_cache_release_linger(h->k[*released]) < 0)
			return -1;
	took[P_RELEASE] = now_ns() - t0;
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
	unsigned released = 0;
	size_t bytes = 0;
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

	atomic_store(&sh->phase, P_CREATE);
	t0 = now_ns();
	r = create(&h, sock, o.caches);
	took[P_CREATE] = now_ns() - t0;
	if (r < 0 || run_phases(&o, dir, sock, port, sh, &h, took, &released, &bytes) < 0)
		goto fail;

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
	if (o.pollers)
		printf("  pollers: %u root sessions, %lu ledger pages (%lu full listings), %lu "
		       "refused%s%s\n",
		       o.pollers, atomic_load(&sh->pages), atomic_load(&sh->listings),
		       atomic_load(&sh->refused), sh->refused ? ": " : "", sh->refusal);
	if (took[P_SCRAPE])
		printf("  last /metrics %zu bytes\n", bytes);
	if (took[P_RELEASE])
		printf("  release: %u caches released with linger (evicted at once) in %.2f s\n",
		       released, (double)took[P_RELEASE] / 1e9);
	printf("  SIGTERM with %u caches held: %.2f s (exit %d)\n", h.n - released,
	       (double)term_ns / 1e9, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
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
