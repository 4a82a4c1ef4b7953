// SPDX-License-Identifier: MIT
/*
 * bench-daemon - compaction as an engine sees it, through a live snapkvd.
 *
 * An engine (libsnapkv) registers its K/V once (one memfd buffer per prompt
 * length) and submits Llama-3-8B-shaped requests over the ring: the whole
 * model in one request, and the same layers as one request each. Beside
 * them, in the same run and interleaved with them, OpenBLAS sgemm computes
 * the grouped score products of one layer with the same thread count, and
 * the daemon's minor page faults are read from /proc/PID/stat around every
 * request. A measured FMA peak of the machine and the ring's no-op round
 * trip next to a bare cache-line ping-pong between two cores are printed too.
 *
 *   bench-daemon [--threads N] [--reps N] [--lens L1,L2] [--layers N]
 *                [--layers-long N] [--no-ring] [--no-compact] [--budget SPEC]
 *   --budget adds a third row, expand with that budget mode (snapkvctl's
 *   spelling: mass:0.9, mass-heads:0.9, heads, pyramid:1.5, ...), run
 *   interleaved with the uniform rows, and its time against expand's.
 *   BENCH_QUICK=1: L 8192 only, 4 layers, 1 repetition, short ring run.
 *   Defaults: L 8192 (32 layers) and 32768 (--layers-long, 12 layers: 3 GiB
 *   of f32 K/V, what fits beside other work on a 24 GiB machine), median of
 *   3, threads = all cores. Starts its own snapkvd from $BUILD (build/).
 */
#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-fma.h"
#include "bench-host.h"
#include "snapkv.h"

void openblas_set_num_threads(int n);
char *openblas_get_config(void);

enum { HQ = 32, HKV = 8, D = 128, W = 32, C = 2048, MAXREP = 64, MAXLAYERS = 64 };

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static int cmp_u(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
	double s[MAXREP];

	memcpy(s, v, (size_t)n * sizeof(*v));
	qsort(s, (size_t)n, sizeof(*s), cmp_d);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static float frand(uint64_t *s)
{
	*s = *s * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*s >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

/* Minor page faults of the whole process pid (all threads): field 10. */
static long minflt(pid_t pid)
{
	char path[64], buf[1024], *p;
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) &&
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %ld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

static void pin(int cpu)
{
	cpu_set_t s;

	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
}

/* ------------------------------------------------- compaction requests */

struct run {
	struct skv_client *c;
	pid_t dpid;
	unsigned layers;
	uint32_t L;
	struct skv_layer_ref lr[MAXLAYERS];
};

static void layer_refs(struct run *r, struct skv_buffer *b, enum skv_dtype dt)
{
	size_t es = dt == SKV_DTYPE_F32 ? 4 : 2;
	size_t qb = (size_t)HQ * W * D * es, kvb = (size_t)HKV * r->L * D * es;

	for (unsigned l = 0; l < r->layers; l++) {
		uint64_t base = l * (qb + 2 * kvb);

		r->lr[l].q = (struct skv_tensor_ref){b, base, dt, (int64_t)W * D, D, 0, 0};
		r->lr[l].k = (struct skv_tensor_ref){b, base + qb, dt, (int64_t)r->L * D, D, 0, 0};
		r->lr[l].v = r->lr[l].k;
		r->lr[l].v.offset += kvb;
	}
}

/* --budget: the mode's fields over the uniform parameters (NULL: none). */
static const struct skv_params *budget_mode;
static const char *budget_spec;

static void desc_init(struct skv_compact_desc *d, uint32_t L, enum skv_gqa gqa, bool budget)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = HQ, .h_kv = HKV, .n_q = W};
	skv_client_params_init(&d->params);
	d->params.window = W;
	d->params.capacity = C;
	d->params.gqa = gqa;
	if (budget && budget_mode) {
		const struct skv_params *b = budget_mode;

		/* skv_client_params_init() gives the size before the budget
		 * modes, which the daemon reads as uniform */
		d->params.params_size = sizeof(d->params);
		d->params.budget_mode = b->budget_mode;
		d->params.n_layer_caps = b->n_layer_caps;
		memcpy(d->params.layer_caps, b->layer_caps, sizeof(b->layer_caps));
		d->params.pyramid_r = b->pyramid_r;
		d->params.head_floor = b->head_floor;
		d->params.tau = b->tau;
		d->params.c_min = b->c_min;
		d->params.c_max = b->c_max;
		d->params.c_step = b->c_step;
	}
	d->out_layout = SKV_LAYOUT_HND;
}

/*
 * One whole-model request (per_layer 0) or the same layers as one request
 * each, all caches kept until the last is done and then released, as an
 * engine would. Returns seconds of compaction (submit until mapped, summed
 * over the requests); *faults gets the daemon's minor faults over it all.
 */
static double compact(struct run *r, enum skv_gqa gqa, bool budget, int per_layer, long *faults)
{
	struct skv_cache *k[MAXLAYERS];
	struct skv_compact_desc d;
	unsigned n = per_layer ? r->layers : 1;
	long f0 = minflt(r->dpid);
	double t = 0;
	int e = 0;

	desc_init(&d, r->L, gqa, budget);
	d.layers = per_layer ? 1 : r->layers;
	for (unsigned i = 0; i < n && !e; i++) {
		double t0 = now();

		d.layer = &r->lr[i];
		e = skv_client_compact(r->c, &d, &k[i]);
		t += now() - t0;
		if (e < 0) {
			fprintf(stderr, "bench-daemon: compact: %s (%s)\n", skv_client_error(r->c),
				strerror(-e));
			n = i;
		}
	}
	for (unsigned i = 0; i < n; i++)
		skv_cache_release(k[i]);
	*faults = minflt(r->dpid) - f0;
	return e < 0 ? -1 : t;
}

static void to_bf16(void *buf, size_t n)
{
	const uint32_t *s = buf;
	uint16_t *o = buf;

	/* in place, front to back: element i's 2 bytes never reach an unread f32 */
	for (size_t i = 0; i < n; i++) {
		uint32_t u = s[i];

		o[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
	}
}

/* sgemm of one layer's grouped score products: H_kv x (G*W x D) . (D x L). */
static double sgemm_layer(const float *q, const float *kk, float *cc, uint32_t L)
{
	double t0 = now();

	for (int h = 0; h < HKV; h++)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, HQ / HKV * W, (int)L, D, 1.0f,
			    q + (size_t)h * HQ / HKV * W * D, D, kk + (size_t)h * L * D, D, 0.0f,
			    cc, (int)L);
	return now() - t0;
}

static double peak; /* measured FMA peak, GFLOP/s */

static int bench_len(struct run *r, int reps)
{
	size_t qe = (size_t)HQ * W * D, kve = (size_t)HKV * r->L * D;
	size_t per = qe + 2 * kve, total = per * r->layers;
	double flop = 2.0 * HQ * W * (double)r->L * D;
	/* rows: expand, group, and with --budget expand in that mode */
	const int rows = budget_mode ? 3 : 2;
	double ts[MAXREP], tw[2][3][MAXREP], tp[2][3][MAXREP], ratio[2][MAXREP];
	long fw[2][3] = {{0}}, fp[2][3] = {{0}};
	struct skv_buffer *b = NULL;
	uint64_t seed = 42;
	float *p, *cc;
	int e;

	if ((e = skv_buffer_alloc(r->c, total * 4, &b)) < 0) {
		fprintf(stderr, "bench-daemon: buffer of %zu MiB: %s (%s)\n", total * 4 >> 20,
			skv_client_error(r->c), strerror(-e));
		return -1;
	}
	p = skv_buffer_data(b);
	for (size_t i = 0; i < total; i++)
		p[i] = frand(&seed);
	cc = malloc((size_t)HQ / HKV * W * r->L * 4);
	if (!cc)
		return -1;
	for (int di = 0; di < 2; di++) {
		enum skv_dtype dt = di ? SKV_DTYPE_BF16 : SKV_DTYPE_F32;

		if (di) /* sgemm stays on layer 0's f32 copy taken before this */
			to_bf16(p, total);
		layer_refs(r, b, dt);
		/* rep -1 warms up (arena, daemon threads, OpenBLAS). Each rep runs the
		 * sgemm, waits for OpenBLAS's spinning workers to stop, then the four
		 * daemon runs, so all see the same load. */
		for (int rep = -1; rep < reps; rep++) {
			if (!di) {
				double t = sgemm_layer(p, p + qe, cc, r->L);

				if (rep >= 0)
					ts[rep] = t;
				usleep(200000);
			}
			for (int g = 0; g < rows; g++) {
				enum skv_gqa gqa = g == 1 ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
				long f1, f2;
				double a = compact(r, gqa, g == 2, 0, &f1),
				       bb = compact(r, gqa, g == 2, 1, &f2);

				if (a < 0 || bb < 0)
					return -1;
				if (rep < 0)
					continue;
				tw[di][g][rep] = a;
				tp[di][g][rep] = bb;
				fw[di][g] += f1;
				fp[di][g] += f2;
				if (g == 2) /* paired with this rep's expand */
					ratio[di][rep] = a / tw[di][0][rep];
			}
		}
	}
	double sg = median(ts, reps);

	printf("\n  L %u, %u layers per request; sgemm %.2f ms/layer (%.1f GFLOP/s)\n", r->L,
	       r->layers, sg * 1e3, flop / sg * 1e-9);
	printf("  %5s %6s | %10s %9s %7s %7s %9s | %10s %9s %7s | %6s\n", "dtype", "gqa",
	       "request ms", "ms/layer", "GF/s", "x sgemm", "faults/rq", "1-layer ms", "x sgemm",
	       "faults", "whole/");
	printf("  %5s %6s | %10s %9s %7s %7s %9s | %10s %9s %7s | %6s\n", "", "", "(whole)", "", "",
	       "", "", "(per rq)", "", "per rq", "layers");
	for (int di = 0; di < 2; di++)
		for (int g = 0; g < rows; g++) {
			double w = median(tw[di][g], reps), pl = median(tp[di][g], reps);
			double wl = w / r->layers, pll = pl / r->layers;

			printf("  %5s %6s | %10.1f %9.2f %7.1f %5.1f %7.2f %9.0f | %10.2f %9.2f "
			       "%7.0f | "
			       "%6.2f\n",
			       di ? "bf16" : "f32",
			       g == 2	? "budget"
			       : g == 1 ? "group"
					: "expand",
			       w * 1e3, wl * 1e3, flop / wl * 1e-9, 100 * flop / wl * 1e-9 / peak,
			       wl / sg, (double)fw[di][g] / reps, pll * 1e3, pll / sg,
			       (double)fp[di][g] / reps / r->layers, w / pl);
		}
	for (int di = 0; rows == 3 && di < 2; di++)
		printf("  %s: budget %s / expand uniform, whole request, median of the paired "
		       "ratios: %.3f\n",
		       di ? "bf16" : "f32", budget_spec, median(ratio[di], reps));
	fflush(stdout);
	free(cc);
	skv_buffer_free(b);
	return 0;
}

/* --------------------------------------------------------- ring vs limit */

static _Atomic uint64_t line __attribute__((aligned(64)));
static _Atomic int pp_stop;

static void *pong(void *arg)
{
	uint64_t seen = 0;

	pin(*(int *)arg);
	while (!atomic_load_explicit(&pp_stop, memory_order_relaxed)) {
		uint64_t v = atomic_load_explicit(&line, memory_order_acquire);

		if (v != seen && (v & 1)) {
			seen = v + 1;
			atomic_store_explicit(&line, seen, memory_order_release);
		}
	}
	return NULL;
}

/* n round trips of one cache line between this thread (CPU 0) and CPU 1. */
static void pingpong(uint64_t *t, int n)
{
	static uint64_t v;

	for (int i = 0; i < n; i++) {
		uint64_t t0 = now_ns();

		atomic_store_explicit(&line, ++v, memory_order_release);
		while (atomic_load_explicit(&line, memory_order_acquire) != v + 1)
			;
		v++;
		t[i] = now_ns() - t0;
	}
}

/* Every thread of process pid onto one CPU (the ring runs between the same
 * two cores as the ping-pong: the daemon on CPU 1, the engine on CPU 0). */
static void pin_process(pid_t pid, int cpu)
{
	char path[64];
	struct dirent *de;
	cpu_set_t s;
	DIR *d;

	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	while (d && (de = readdir(d)))
		if (de->d_name[0] != '.')
			sched_setaffinity(atoi(de->d_name), sizeof(s), &s);
	if (d)
		closedir(d);
}

static int bench_ring(struct skv_client *c, pid_t dpid, int n)
{
	int blocks = 10, per = n / blocks, cpu1 = 1, n_sleep = n / 40 > 50 ? n / 40 : 50;
	uint64_t *tn = calloc((size_t)n, 8), *tp = calloc((size_t)n, 8);
	uint64_t *ts = calloc((size_t)n_sleep, 8);
	pthread_t th;
	int e = 0;

	if (!tn || !tp || !ts || sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return -1;
	pin_process(dpid, 1);
	for (int i = 0; i < 2000 && !e; i++)
		e = skv_client_nop(c);
	/* interleaved blocks: a ping-pong (this thread on CPU 0, the other on
	 * CPU 1, stopped before the ring runs so that it does not hold a core),
	 * then ring no-ops between the same two cores (this thread on CPU 0, the
	 * daemon's threads on CPU 1); both see the same load. Unpinned, the
	 * daemon's loop and the engine can land on one core while other work
	 * holds the other, and each round trip then costs a context switch. The first block of each
	 * warms up. */
	for (int bl = -1; bl < blocks && !e; bl++) {
		int k = bl < 0 ? 0 : bl;

		atomic_store(&pp_stop, 0);
		pin(0);
		pthread_create(&th, NULL, pong, &cpu1);
		pingpong(tp + k * per, per);
		atomic_store(&pp_stop, 1);
		pthread_join(th, NULL);
		for (int i = 0; i < per && !e; i++) {
			uint64_t t0 = now_ns();

			e = skv_client_nop(c);
			tn[k * per + i] = now_ns() - t0;
		}
	}
	for (int i = 0; i < n_sleep && !e; i++) {
		uint64_t t0;

		usleep(2000);
		t0 = now_ns();
		e = skv_client_nop(c);
		ts[i] = now_ns() - t0;
	}
	if (e < 0) {
		fprintf(stderr, "bench-daemon: nop: %s\n", strerror(-e));
		return -1;
	}
	n = per * blocks;
	qsort(tn, (size_t)n, 8, cmp_u);
	qsort(tp, (size_t)n, 8, cmp_u);
	qsort(ts, (size_t)n_sleep, 8, cmp_u);
	printf("\n  ring no-op round trip (engine CPU 0, daemon CPU 1) vs a cache-line ping-pong "
	       "(CPU 0 <-> 1), ns; "
	       "%d each, interleaved in %d blocks; %d asleep\n",
	       n, blocks, n_sleep);
	printf("  %-30s %10s %10s\n", "path", "p50", "p99");
	printf("  %-30s %10lu %10lu\n", "cache-line ping-pong", tp[n / 2], tp[n * 99 / 100]);
	printf("  %-30s %10lu %10lu\n", "ring, daemon polling", tn[n / 2], tn[n * 99 / 100]);
	printf("  %-30s %10lu %10lu\n", "ring, daemon asleep", ts[n_sleep / 2],
	       ts[n_sleep * 99 / 100]);
	printf("  polling ring p50 = %.2fx the ping-pong p50 (issue 15 target <= 1.5x); "
	       "asleep = %.0fx\n",
	       (double)tn[n / 2] / (double)tp[n / 2], (double)ts[n_sleep / 2] / (double)tp[n / 2]);
	free(tn);
	free(tp);
	free(ts);
	return 0;
}

/* ------------------------------------------------- huge pages of the arena */

/*
 * Whether the daemon's arenas got transparent huge pages: the kernel's
 * shmem setting (the daemon asks with MADV_HUGEPAGE, which only "advise",
 * "within_size" and "always" honour) and the arena mappings' ShmemPmdMapped
 * and Rss in /proc/PID/smaps, read while the arena holds its cached pages.
 */
static void arena_pages(pid_t pid)
{
	char path[64], line[256], mode[160] = "?", *a, *b;
	unsigned long long pmd = 0, rss = 0, v;
	int in_arena = 0;
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");

	if (f && fgets(mode, sizeof(mode), f) && (a = strchr(mode, '[')) && (b = strchr(a, ']'))) {
		*b = '\0';
		memmove(mode, a + 1, strlen(a + 1) + 1);
	}
	if (f)
		fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f)) {
		/* a mapping's first line starts with its address (lower-case
		 * hex), its fields with a capital */
		if ((line[0] >= '0' && line[0] <= '9') || (line[0] >= 'a' && line[0] <= 'f'))
			in_arena = strstr(line, "snapkvd-arena") != NULL;
		else if (in_arena && sscanf(line, "ShmemPmdMapped: %llu", &v) == 1)
			pmd += v;
		else if (in_arena && sscanf(line, "Rss: %llu", &v) == 1)
			rss += v;
	}
	if (f)
		fclose(f);
	printf("  arena pages: shmem_enabled [%s]; daemon's arena Rss %llu MiB, of it in huge "
	       "pages (ShmemPmdMapped) %llu MiB\n",
	       mode, rss >> 10, pmd >> 10);
}

/* ----------------------------------------------------------------- main */

/* snapkvd with an arena big enough for every layer's expand output kept at
 * once, a pool 4x that so that no budget is scaled under pressure, and as
 * much kept for reuse as the arena holds. */
static pid_t start_daemon(const char *dir, const char *sock, unsigned threads, uint64_t arena)
{
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	char bin[512], th[16], conf[160];
	FILE *f;
	pid_t pid;

	snprintf(bin, sizeof(bin), "%s/snapkvd", build);
	snprintf(th, sizeof(th), "%u", threads);
	snprintf(conf, sizeof(conf), "%s/snapkvd.conf", dir);
	f = fopen(conf, "w");
	if (!f)
		return -1;
	/* arena_cache_bytes: every released region stays populated for the
	 * next request, as in an engine's steady state (the default, 1G, is
	 * less than 32 layers of expand output) */
	fprintf(f, "session_arena_bytes = %lluM\npool_bytes = %lluM\narena_cache_bytes = %lluM\n",
		(unsigned long long)(arena >> 20), (unsigned long long)(4 * arena >> 20),
		(unsigned long long)(arena >> 20));
	fclose(f);
	pid = fork();
	if (pid == 0) {
		execl(bin, bin, "--config", conf, "--socket", sock, "--threads", th, "--log-level",
		      "warning", (char *)NULL);
		_exit(127);
	}
	return pid;
}

int main(int argc, char **argv)
{
	int quick = getenv("BENCH_QUICK") && *getenv("BENCH_QUICK") == '1';
	unsigned threads = (unsigned)sysconf(_SC_NPROCESSORS_ONLN);
	unsigned layers = quick ? 4 : 32, layers_long = 12;
	uint32_t lens[8] = {8192, 32768};
	int n_lens = quick ? 1 : 2, reps = quick ? 1 : 3, ring = 1, comp = 1;
	char dir[] = "/tmp/bench-daemon-XXXXXX", sock[128], la0[64], la1[64], cpu[128], when[64];
	struct skv_client_opts co = {
	    .opts_size = sizeof(co), .name = "bench-daemon", .spin_us = 200};
	struct run r = {0};
	uint64_t arena = 0;
	time_t tt = time(NULL);
	int st, rc = 0;

	bench_openblas_avx512(argv);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
			layers = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--layers-long") && i + 1 < argc)
			layers_long = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--no-ring"))
			ring = 0;
		else if (!strcmp(argv[i], "--no-compact"))
			comp = 0;
		else if (!strcmp(argv[i], "--budget") && i + 1 < argc) {
			static struct skv_params bp;
			struct skv_error e = {{0}, -1, -1};

			skv_params_init(&bp);
			bp.window = W;
			bp.capacity = C;
			budget_spec = argv[++i];
			if (skv_budget_parse(budget_spec, &bp, &e) < 0) {
				fprintf(stderr, "bench-daemon: --budget %s: %s\n", budget_spec,
					e.msg);
				return 2;
			}
			skv_budget_defaults(&bp);
			budget_mode = &bp;
		} else if (!strcmp(argv[i], "--lens") && i + 1 < argc) {
			n_lens = 0;
			for (char *s = strtok(argv[++i], ","); s && n_lens < 8;
			     s = strtok(NULL, ","))
				lens[n_lens++] = (uint32_t)atoi(s);
		} else {
			fprintf(stderr,
				"usage: %s [--threads N] [--reps N] [--lens L1,L2] [--layers N] "
				"[--layers-long N] [--no-ring] [--no-compact] [--budget SPEC]\n",
				argv[0]);
			return 2;
		}
	}
	if (reps < 1 || reps > MAXREP || !layers || layers > MAXLAYERS || !layers_long ||
	    layers_long > MAXLAYERS || !threads || n_lens < 1) {
		fprintf(stderr, "bench-daemon: bad --reps, --layers, --layers-long or --threads\n");
		return 2;
	}
	for (int i = 0; i < n_lens; i++) {
		unsigned nl = lens[i] > 8192 ? layers_long : layers;
		/* expand f32 output, every layer's request kept: 2 x H_q x C x D x 4 */
		uint64_t out = (uint64_t)nl * 2 * HQ * C * D * 4 + (64u << 20);

		if (lens[i] < W || lens[i] > (1u << 20))
			return 2;
		arena = out > arena ? out : arena;
	}
	if (!mkdtemp(dir))
		return 1;
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	r.dpid = start_daemon(dir, sock, threads, arena);
	for (int i = 0; i < 500 && skv_client_connect(sock, &co, &r.c) < 0; i++)
		usleep(10000);
	if (!r.c) {
		fprintf(stderr, "bench-daemon: cannot start snapkvd\n");
		kill(r.dpid, SIGKILL);
		return 1;
	}
	openblas_set_num_threads((int)threads);
	bench_loadavg(la0, sizeof(la0));
	bench_cpu_model(cpu, sizeof(cpu));
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", gmtime(&tt));
	printf("bench-daemon: Llama-3-8B (H_q %d, H_kv %d, D %d, W %d, C %d, k 5, avg) through "
	       "snapkvd --threads %u; sgemm: same threads; median of %d%s\n",
	       HQ, HKV, D, W, C, threads, reps, quick ? " (BENCH_QUICK)" : "");
	printf("  machine: %s, %ld cores; %s; load average before %s\n", cpu,
	       sysconf(_SC_NPROCESSORS_ONLN), when, la0);
	printf("  OpenBLAS: %s (OPENBLAS_CORETYPE %s)\n", openblas_get_config(),
	       getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "auto");
	peak = bench_fma_peak(threads);
	printf("  measured FMA peak, %u threads, f32: %.1f GFLOP/s (%s; per CPU-second of each "
	       "thread)\n",
	       threads, peak, __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2");
	if (comp)
		printf("  columns: whole = one request of all layers (ms; ms/layer; GFLOP/s of "
		       "the score products and %% of the FMA peak; per layer / sgemm layer; daemon "
		       "minor faults per "
		       "request), then the same layers one request each (ms per request, / "
		       "sgemm, faults per request), whole / sum of 1-layer\n");
	for (int i = 0; i < n_lens && comp && !rc; i++) {
		r.L = lens[i];
		r.layers = r.L > 8192 ? layers_long : layers;
		rc = bench_len(&r, reps);
	}
	if (comp && !rc)
		arena_pages(r.dpid);
	if (ring && !rc)
		rc = bench_ring(r.c, r.dpid, quick ? 4000 : 20000);
	bench_loadavg(la1, sizeof(la1));
	printf("  load average after %s\n", la1);
	skv_client_close(r.c);
	kill(r.dpid, SIGTERM);
	waitpid(r.dpid, &st, 0);
	unlink(sock);
	snprintf(sock, sizeof(sock), "%s/snapkvd.conf", dir);
	unlink(sock);
	rmdir(dir);
	return rc || !WIFEXITED(st) || WEXITSTATUS(st) ? 1 : 0;
}
