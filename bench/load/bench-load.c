// SPDX-License-Identifier: MIT
/*
 * bench-load - many engines compacting at once against one snapkvd: E
 * engine processes (libsnapkv, each its own session and registered buffer)
 * each run N compactions back to back, releasing each cache, all starting
 * together. Prints throughput (compactions per second of wall time, all
 * engines) and the latency of a compaction as one engine sees it
 * (skv_client_compact: submit over the ring until the cache is mapped):
 * p50, p90, p99, max, with the machine, its load average and the date.
 *
 *   bench-load [--engines E] [--compactions N] [--layers N] [--h-q H]
 *              [--h-kv H] [--head-dim D] [--prompt L] [--window W]
 *              [--capacity C] [--threads T] [--workers K]
 *   (defaults: 16 engines x 1000 compactions of 2 layers, H_q 8, H_kv 2,
 *    D 64, L 1024, W 16, C 128, group mode, f32; the daemon's --threads and
 *    --workers default to its own; starts its own snapkvd from $BUILD)
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../bench-host.h"
#include "snapkv.h"

struct opts {
	unsigned engines, n, layers, h_q, h_kv, d, L, W, C;
	const char *threads, *workers;
};

/* Shared with the engines: start flag, per-compaction latencies, failures. */
struct shared {
	_Atomic unsigned ready, go, failures;
	uint64_t lat_ns[]; /* [engines][n] */
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

static float frand(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*s >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static int engine(const struct opts *o, const char *sock, unsigned id, struct shared *sh)
{
	struct skv_client_opts co = {.opts_size = sizeof(co), .name = "bench-load"};
	size_t qb = (size_t)o->h_q * o->W * o->d * 4, kvb = (size_t)o->h_kv * o->L * o->d * 4;
	size_t per = qb + 2 * kvb;
	struct skv_layer_ref lr[64];
	struct skv_compact_desc d;
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	uint64_t seed = 1 + id;
	float *p;
	int r;

	if (o->layers > 64)
		return -EINVAL;
	if ((r = skv_client_connect(sock, &co, &c)) < 0 ||
	    (r = skv_buffer_alloc(c, per * o->layers, &b)) < 0)
		goto out;
	p = skv_buffer_data(b);
	for (size_t i = 0; i < per * o->layers / 4; i++)
		p[i] = frand(&seed);
	for (unsigned l = 0; l < o->layers; l++) {
		uint64_t base = l * per;

		lr[l].q = (struct skv_tensor_ref){
		    b, base, SKV_DTYPE_F32, (int64_t)o->W * o->d, o->d, 0, 0};
		lr[l].k = (struct skv_tensor_ref){
		    b, base + qb, SKV_DTYPE_F32, (int64_t)o->L * o->d, o->d, 0, 0};
		lr[l].v = lr[l].k;
		lr[l].v.offset += kvb;
	}
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape = (struct skv_shape){
	    .prompt_len = o->L, .head_dim = o->d, .h_q = o->h_q, .h_kv = o->h_kv, .n_q = o->W};
	d.layers = o->layers;
	skv_client_params_init(&d.params);
	d.params.window = o->W;
	d.params.capacity = o->C;
	d.params.gqa = SKV_GQA_GROUP;
	d.layer = lr;
	d.out_layout = SKV_LAYOUT_HND;
	atomic_fetch_add(&sh->ready, 1);
	while (!atomic_load(&sh->go))
		usleep(100);
	for (unsigned i = 0; i < o->n; i++) {
		struct skv_cache *k;
		uint64_t t0 = now_ns();

		r = skv_client_compact(c, &d, &k);
		sh->lat_ns[(size_t)id * o->n + i] = now_ns() - t0;
		if (r < 0)
			goto out;
		if ((r = skv_cache_release(k)) < 0)
			goto out;
	}
out:
	if (r < 0) {
		fprintf(stderr, "bench-load engine %u: %s (%s)\n", id, skv_client_error(c),
			strerror(-r));
		atomic_fetch_add(&sh->failures, 1);
		atomic_fetch_add(&sh->ready, 1);
	}
	skv_buffer_free(b);
	skv_client_close(c);
	return r < 0 ? 1 : 0;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
	    {"engines", 1, 0, 'e'}, {"compactions", 1, 0, 'n'}, {"layers", 1, 0, 'l'},
	    {"h-q", 1, 0, 'q'},	    {"h-kv", 1, 0, 'k'},	{"head-dim", 1, 0, 'd'},
	    {"prompt", 1, 0, 'L'},  {"window", 1, 0, 'w'},	{"capacity", 1, 0, 'C'},
	    {"threads", 1, 0, 't'}, {"workers", 1, 0, 'K'},	{0},
	};
	int ch;

	*o = (struct opts){16, 1000, 2, 8, 2, 64, 1024, 16, 128, NULL, NULL};
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		unsigned v = optarg ? (unsigned)strtoul(optarg, NULL, 10) : 0;

		switch (ch) {
		case 'e':
			o->engines = v;
			break;
		case 'n':
			o->n = v;
			break;
		case 'l':
			o->layers = v;
			break;
		case 'q':
			o->h_q = v;
			break;
		case 'k':
			o->h_kv = v;
			break;
		case 'd':
			o->d = v;
			break;
		case 'L':
			o->L = v;
			break;
		case 'w':
			o->W = v;
			break;
		case 'C':
			o->C = v;
			break;
		case 't':
			o->threads = optarg;
			break;
		case 'K':
			o->workers = optarg;
			break;
		default:
			return -EINVAL;
		}
	}
	if (!o->engines || o->engines > 256 || !o->n || !o->layers || o->layers > 64 || !o->h_kv ||
	    o->h_q % o->h_kv || !o->d || o->W > o->L) {
		fprintf(stderr, "bench-load: invalid options\n");
		return -EINVAL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	char dir[] = "/tmp/bench-load-XXXXXX", sock[128], bin[512], la0[64], la1[64], cpu[128];
	char when[64];
	const char *argvd[16];
	struct opts o;
	struct shared *sh;
	struct skv_client *probe = NULL;
	size_t total, shbytes;
	pid_t dpid, *pids;
	uint64_t t0, wall;
	time_t tt = time(NULL);
	int st, failed = 0, a = 0;

	if (parse(argc, argv, &o) < 0)
		return 2;
	total = (size_t)o.engines * o.n;
	shbytes = sizeof(*sh) + total * sizeof(uint64_t);
	sh = mmap(NULL, shbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pids = calloc(o.engines, sizeof(*pids));
	if (sh == MAP_FAILED || !pids || !mkdtemp(dir))
		return 1;
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	snprintf(bin, sizeof(bin), "%s/snapkvd", build);
	argvd[a++] = bin;
	argvd[a++] = "--socket";
	argvd[a++] = sock;
	argvd[a++] = "--log-level";
	argvd[a++] = "warning";
	argvd[a++] = "--pool-bytes";
	argvd[a++] = "1G";
	if (o.threads) {
		argvd[a++] = "--threads";
		argvd[a++] = o.threads;
	}
	if (o.workers) {
		argvd[a++] = "--workers";
		argvd[a++] = o.workers;
	}
	argvd[a] = NULL;
	dpid = fork();
	if (dpid == 0) {
		execv(bin, (char *const *)argvd);
		_exit(127);
	}
	for (int i = 0; i < 500 && skv_client_connect(sock, NULL, &probe) < 0; i++)
		usleep(10000);
	if (!probe) {
		fprintf(stderr, "bench-load: cannot start %s\n", bin);
		kill(dpid, SIGKILL);
		return 1;
	}
	skv_client_close(probe);
	for (unsigned i = 0; i < o.engines; i++) {
		pids[i] = fork();
		if (pids[i] == 0)
			_exit(engine(&o, sock, i, sh));
	}
	while (atomic_load(&sh->ready) < o.engines)
		usleep(1000);
	bench_loadavg(la0, sizeof(la0));
	t0 = now_ns();
	atomic_store(&sh->go, 1);
	for (unsigned i = 0; i < o.engines; i++) {
		waitpid(pids[i], &st, 0);
		failed |= !WIFEXITED(st) || WEXITSTATUS(st);
	}
	wall = now_ns() - t0;
	bench_loadavg(la1, sizeof(la1));
	kill(dpid, SIGTERM);
	waitpid(dpid, &st, 0);
	unlink(sock);
	rmdir(dir);
	if (failed || atomic_load(&sh->failures)) {
		fprintf(stderr, "bench-load: %u engines failed\n", atomic_load(&sh->failures));
		return 1;
	}
	qsort(sh->lat_ns, total, sizeof(uint64_t), cmp);
	bench_cpu_model(cpu, sizeof(cpu));
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", gmtime(&tt));
	printf("%u engines x %u compactions, each %u layers, H_q %u, H_kv %u, D %u, L %u, W %u, "
	       "C %u, group, f32 (snapkvd --threads %s --workers %s)\n",
	       o.engines, o.n, o.layers, o.h_q, o.h_kv, o.d, o.L, o.W, o.C,
	       o.threads ? o.threads : "default", o.workers ? o.workers : "default");
	printf("  machine: %s, %ld cores; load average %s before, %s after; %s\n", cpu,
	       sysconf(_SC_NPROCESSORS_ONLN), la0, la1, when);
	printf("  wall %.2f s for %zu compactions: %.1f compactions/s\n", (double)wall / 1e9, total,
	       (double)total * 1e9 / (double)wall);
	printf("  compaction latency (ms): p50 %.3f, p90 %.3f, p99 %.3f, max %.3f\n",
	       (double)sh->lat_ns[total / 2] / 1e6, (double)sh->lat_ns[total * 9 / 10] / 1e6,
	       (double)sh->lat_ns[total * 99 / 100] / 1e6, (double)sh->lat_ns[total - 1] / 1e6);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
