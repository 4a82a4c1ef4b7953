// SPDX-License-Identifier: MIT
/*
 * test-chaos - engines looping compact / append / grow / release through
 * libsnapkv while a driver SIGKILLs engines and the daemon (restarting it),
 * bounded in time and in kills, then checks what is left.
 *
 * Engines are forked children of this process (libsnapkv is used only in
 * them). Each owns one input of its own shape, a gen-layer dump, whose
 * offline result `snapkvctl compact --offline` wrote before the run: every
 * compaction that completes is compared byte for byte with it (K, V,
 * positions, retained mass of every stored head), again after each GROW
 * (which moves the cache); only an engine killed between the two misses
 * its check. Counters live in a shared mapping, so a killed
 * engine's work still counts.
 *
 * Checks: no compaction differs from the offline result; no request fails
 * for a reason other than the daemon going away (connection reset or
 * refused, socket missing while it restarts); every daemon incarnation
 * serves compactions; at each quiet point (all engines killed, every
 * session gone) the daemon holds as many fds as when it started, its pool
 * is empty and its ledger lists no cache; the last daemon exits 0 on
 * SIGTERM.
 *
 * Environment: CHAOS_SECONDS (default 30), CHAOS_ENGINES (4), CHAOS_SEED
 * (1), CHAOS_MAX_KILLS (bound on kills of either kind, default 400).
 * BUILD names the tree (snapkvd, snapkvctl, gen-layer).
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "daemon-harness.h"
#include "skv-safetensors.h"
#include "snapkv.h"

#define MAX_ENGINES 16
#define N_SHAPES    3
/* A daemon incarnation that served no compaction in this long (ms) is one
 * the engines could not get back to: a hang guard, far above what a loaded
 * machine or a sanitizer needs, and below the engines' 60 s past the end. */
#define IDLE_MS 45000

/* One input and its offline result. */
struct shape {
	const char *gqa;
	uint32_t layers, h_q, h_kv, d, L, rows, W, C;
	const char *dtype;
	char in[128], ref[128];
};

static struct shape shapes[N_SHAPES] = {
    {"group", 2, 8, 2, 32, 384, 16, 16, 64, "f32", "", ""},
    {"expand", 2, 4, 2, 16, 256, 8, 8, 48, "f16", "", ""},
    {"group", 1, 6, 3, 32, 200, 16, 16, 96, "bf16", "", ""},
};

/* Written by engines, read by the driver: survives a SIGKILL. */
struct counters {
	_Atomic uint64_t requests, compactions, verified, mismatches, appends, grows, releases,
	    lingers, connects, gone_errors, other_errors;
};

/* [MAX_ENGINES] per engine, then one more whose `requests` is the driver's
 * clock at the latest daemon (re)start and `connects` that daemon's pid:
 * an unexpected error says how long after a restart it came */
static struct counters *ctr;
#define DAEMON_INFO (&ctr[MAX_ENGINES])
static char tmpdir[64];
static const char *build;

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Run a program, quietly; its exit status. */
static int run(const char *const *argv)
{
	pid_t p = fork();
	int st;

	if (p == 0) {
		int fd = open("/dev/null", O_WRONLY);

		dup2(fd, 1);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	if (p < 0 || waitpid(p, &st, 0) != p)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ------------------------------------------------------------- the engine */

/* The daemon went away or is restarting: expected while it is being killed. */
static bool gone(int r)
{
	return r == -ENOTCONN || r == -ECONNRESET || r == -EPIPE || r == -ECONNREFUSED ||
	       r == -ENOENT || r == -ESHUTDOWN;
}

static void count_err(struct counters *c, int r, const char *what, struct skv_client *cl)
{
	if (gone(r)) {
		atomic_fetch_add(&c->gone_errors, 1);
		return;
	}
	atomic_fetch_add(&c->other_errors, 1);
	fprintf(stderr, "chaos engine %d: %s: %s (%s), %llu ms after snapkvd %llu started\n",
		(int)getpid(), what, strerror(-r), cl ? skv_client_error(cl) : "",
		(unsigned long long)(now_ms() - atomic_load(&DAEMON_INFO->requests)),
		(unsigned long long)atomic_load(&DAEMON_INFO->connects));
}

/* The cache against the offline file: K, V, positions, mass of the compacted slots. */
static bool same_as_offline(const struct skv_cache *k, const struct skv_st_file *ref, size_t es)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	char nm[64];

	for (uint32_t l = 0; l < ci->layers; l++) {
		const struct skv_st_tensor *rk, *rv, *ri, *rm;

		snprintf(nm, sizeof(nm), "layers.%u.k", l);
		rk = skv_st_find(ref, nm);
		snprintf(nm, sizeof(nm), "layers.%u.v", l);
		rv = skv_st_find(ref, nm);
		snprintf(nm, sizeof(nm), "layers.%u.indices", l);
		ri = skv_st_find(ref, nm);
		snprintf(nm, sizeof(nm), "layers.%u.retained_mass", l);
		rm = skv_st_find(ref, nm);
		if (!rk || !rv || !ri || !rm || rk->rank != 3 || rk->shape[0] != ci->h_store ||
		    rk->shape[1] != ci->kept || rk->shape[2] != ci->head_dim)
			return false;
		for (uint32_t h = 0; h < ci->h_store; h++) {
			const uint8_t *K = skv_cache_k(k, l, h), *V = skv_cache_v(k, l, h);
			const int32_t *P = skv_cache_positions(k, l, h);
			float m = skv_cache_retained_mass(k, l, h);
			size_t row = (size_t)ci->head_dim * es;

			if (!K || !V || !P)
				return false;
			for (uint32_t i = 0; i < ci->kept; i++) {
				size_t at = ((size_t)h * ci->kept + i) * row;

				if (memcmp(K + (size_t)i * ci->token_stride * es,
					   (const uint8_t *)rk->data + at, row) ||
				    memcmp(V + (size_t)i * ci->token_stride * es,
					   (const uint8_t *)rv->data + at, row))
					return false;
			}
			if (memcmp(P, (const int32_t *)ri->data + (size_t)h * ci->kept,
				   (size_t)ci->kept * 4) ||
			    memcmp(&m, (const float *)rm->data + h, 4))
				return false;
		}
	}
	return true;
}

struct prefill {
	struct skv_st_file *in;
	size_t bytes, es;
	struct skv_layer_ref lr[4];
	enum skv_dtype dtype;
};

/* Copy the dump's Q/K/V bytes into a registered buffer; describe them. */
static int load_buffer(struct skv_client *cl, const struct shape *sh, struct prefill *pf,
		       struct skv_buffer **ret)
{
	struct skv_buffer *b;
	uint8_t *p;
	uint64_t off = 0;
	int r;

	r = skv_buffer_alloc(cl, pf->bytes, &b);
	if (r < 0)
		return r;
	p = skv_buffer_data(b);
	for (uint32_t l = 0; l < sh->layers; l++) {
		const struct skv_st_tensor *t[3];
		const char *kinds = "qkv";
		char nm[64];

		for (int j = 0; j < 3; j++) {
			snprintf(nm, sizeof(nm), "layers.%u.%c", l, kinds[j]);
			t[j] = skv_st_find(pf->in, nm);
			memcpy(p + off, t[j]->data, t[j]->n_bytes);
			struct skv_tensor_ref tr = {
			    .buf = b,
			    .offset = off,
			    .dtype = pf->dtype,
			    .head_stride = (int64_t)t[j]->shape[1] * sh->d,
			    .token_stride = sh->d,
			};
			/* Q: the last W of the dump's rows, as snapkvctl takes them */
			if (j == 0)
				tr.offset += (uint64_t)(sh->rows - sh->W) * sh->d * pf->es;
			if (j == 0)
				pf->lr[l].q = tr;
			else if (j == 1)
				pf->lr[l].k = tr;
			else
				pf->lr[l].v = tr;
			off += (t[j]->n_bytes + 63) & ~63ull;
		}
	}
	*ret = b;
	return 0;
}

/* Write one decode token into every stored head at the next slot. */
static void write_token(struct skv_cache *k, size_t es, uint64_t *seed)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	uint32_t slot = skv_cache_next_slot(k);

	for (uint32_t l = 0; l < ci->layers; l++)
		for (uint32_t h = 0; h < ci->h_store; h++) {
			uint8_t *K = skv_cache_k(k, l, h), *V = skv_cache_v(k, l, h);

			for (size_t x = 0; x < ci->head_dim * es; x++) {
				K[(size_t)slot * ci->token_stride * es + x] = (uint8_t)rnd(seed);
				V[(size_t)slot * ci->token_stride * es + x] = (uint8_t)rnd(seed);
			}
		}
}

static void engine_main(int slot, const struct shape *sh, const char *sock, uint64_t deadline,
			uint64_t seed)
{
	struct counters *c = &ctr[slot];
	struct skv_client_opts opts = {.opts_size = sizeof(opts), .timeout_ms = 10000};
	struct skv_st_error se;
	struct skv_st_file *ref = NULL;
	struct prefill pf = {0};
	struct skv_client *cl = NULL;
	struct skv_buffer *buf = NULL;
	struct skv_compact_desc d;
	char name[32];

	if (skv_st_open(sh->in, &pf.in, &se) < 0 || skv_st_open(sh->ref, &ref, &se) < 0) {
		fprintf(stderr, "chaos engine: %s\n", se.msg);
		atomic_fetch_add(&c->other_errors, 1);
		_exit(1);
	}
	pf.dtype = !strcmp(sh->dtype, "f32")   ? SKV_DTYPE_F32
		   : !strcmp(sh->dtype, "f16") ? SKV_DTYPE_F16
					       : SKV_DTYPE_BF16;
	pf.es = pf.dtype == SKV_DTYPE_F32 ? 4 : 2;
	for (size_t i = 0; i < skv_st_count(pf.in); i++)
		pf.bytes += (skv_st_at(pf.in, i)->n_bytes + 63) & ~63ull;
	snprintf(name, sizeof(name), "chaos-%d", slot);
	opts.name = name;
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape = (struct skv_shape){
	    .prompt_len = sh->L, .head_dim = sh->d, .h_q = sh->h_q, .h_kv = sh->h_kv, .n_q = sh->W};
	d.layers = sh->layers;
	skv_client_params_init(&d.params);
	d.params.window = sh->W;
	d.params.capacity = sh->C;
	d.params.gqa = !strcmp(sh->gqa, "group") ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
	d.layer = pf.lr;
	d.out_layout = (seed & 1) ? SKV_LAYOUT_NHD : SKV_LAYOUT_HND;

	while (now_ms() < deadline) {
		struct skv_cache *k = NULL;
		int r;

		if (!cl) {
			r = skv_client_connect(sock, &opts, &cl);
			if (r < 0) {
				count_err(c, r, "connect", NULL);
				cl = NULL;
				usleep(20000);
				continue;
			}
			atomic_fetch_add(&c->connects, 1);
			r = load_buffer(cl, sh, &pf, &buf);
			atomic_fetch_add(&c->requests, 1);
			if (r < 0)
				goto broken;
		}
		d.decode_reserve = (uint32_t)(rnd(&seed) % 4);
		atomic_fetch_add(&c->requests, 1);
		r = skv_client_compact(cl, &d, &k);
		if (r < 0)
			goto broken;
		atomic_fetch_add(&c->compactions, 1);
		if (same_as_offline(k, ref, pf.es)) {
			atomic_fetch_add(&c->verified, 1);
		} else {
			atomic_fetch_add(&c->mismatches, 1);
			fprintf(stderr,
				"chaos engine %d: cache %llu differs from the offline result\n",
				slot, (unsigned long long)skv_cache_info(k)->id);
		}
		/* decode into the headroom, grow when it runs out, twice */
		for (int g = 0, grown = 0; g < 6 && grown < 2; g++) {
			if (skv_cache_next_slot(k) == skv_cache_info(k)->capacity) {
				atomic_fetch_add(&c->requests, 1);
				r = skv_cache_grow(k, 1 + (uint32_t)(rnd(&seed) % 3));
				if (r < 0)
					goto broken;
				atomic_fetch_add(&c->grows, 1);
				grown++;
				/* a GROW copies the cache: the compacted slots must survive it */
				if (!same_as_offline(k, ref, pf.es)) {
					atomic_fetch_add(&c->mismatches, 1);
					fprintf(stderr,
						"chaos engine %d: cache differs after GROW\n",
						slot);
				}
			}
			write_token(k, pf.es, &seed);
			atomic_fetch_add(&c->requests, 1);
			r = skv_cache_append(k, 1);
			if (r < 0)
				goto broken;
			atomic_fetch_add(&c->appends, 1);
		}
		atomic_fetch_add(&c->requests, 1);
		if (rnd(&seed) % 5 == 0) {
			r = skv_cache_release_linger(k);
			atomic_fetch_add(&c->lingers, 1);
		} else {
			r = skv_cache_release(k);
		}
		k = NULL;
		if (r < 0)
			goto broken;
		atomic_fetch_add(&c->releases, 1);
		/* sometimes a fresh session, so that session ends are exercised too */
		if (rnd(&seed) % 8 == 0) {
			skv_buffer_free(buf);
			buf = NULL;
			skv_client_close(cl);
			cl = NULL;
		}
		continue;
	broken:
		count_err(c, r, "request", cl);
		skv_cache_release(k);
		skv_buffer_free(buf);
		buf = NULL;
		skv_client_close(cl);
		cl = NULL;
	}
	_exit(0);
}

/* ------------------------------------------------------------- the driver */

static struct harness H;
static pid_t engines[MAX_ENGINES];
static int n_engines;
static unsigned engine_kills, daemon_kills, quiet_points;
static int base_fds;
static uint64_t seed = 1, deadline;

static void spawn(int i)
{
	uint64_t s = seed + 7919u * (uint64_t)i + rnd(&seed);
	pid_t p = fork();

	if (p == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		engine_main(i, &shapes[i % N_SHAPES], H.sock, deadline + 60000, s);
	}
	engines[i] = p;
}

static void kill_engine(int i)
{
	if (engines[i] > 0) {
		kill(engines[i], SIGKILL);
		waitpid(engines[i], NULL, 0);
		engines[i] = 0;
	}
}

/*
 * Start (or restart) the daemon. The fd baseline is the first
 * incarnation's, taken before any engine runs: a restarted one has engines
 * reconnecting at once, and the same binary and options hold the same fds
 * when idle.
 */
static int start_daemon(void)
{
	static const char *const extra[] = {"--pool-bytes", "256M", NULL};
	int r = h_start(&H, extra);

	if (r < 0)
		return r;
	atomic_store(&DAEMON_INFO->requests, now_ms());
	atomic_store(&DAEMON_INFO->connects, (uint64_t)H.pid);
	if (base_fds == 0) {
		for (int i = 0; i < 100 && h_sessions(H.sock) != 0; i++)
			h_sleep_ms(10);
		h_sleep_ms(50);
		base_fds = h_count_fds(H.pid);
		printf("    baseline fds of the first daemon:\n");
		h_print_fds(H.pid);
	}
	return 0;
}

/* Every engine killed, every session gone: fds, pool and ledger back at zero. */
static void quiet_point(void)
{
	Snapkv__V1__AdminReply *rep;
	int fds = -1;
	long long pool = -1;

	for (int i = 0; i < n_engines; i++)
		kill_engine(i);
	for (int i = 0; i < 500 && h_sessions(H.sock) != 0; i++)
		h_sleep_ms(10);
	for (int i = 0; i < 300; i++) {
		fds = h_count_fds(H.pid);
		pool = h_pool_used(H.sock);
		if (fds == base_fds && pool == 0)
			break;
		h_sleep_ms(10);
	}
	quiet_points++;
	printf("    quiet point %u: daemon fds %d (baseline %d), pool used %lld\n", quiet_points,
	       fds, base_fds, pool);
	if (fds != base_fds)
		h_print_fds(H.pid);
	CU_ASSERT_EQUAL(fds, base_fds);
	CU_ASSERT_EQUAL(pool, 0);
	rep = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER);
	CU_ASSERT_PTR_NOT_NULL_FATAL(rep);
	CU_ASSERT_EQUAL(rep->n_caches, 0);
	CU_ASSERT_EQUAL(rep->pool_used, 0);
	CU_ASSERT_EQUAL(rep->pool_reserved, 0);
	for (size_t t = 0; t < rep->n_tenants; t++)
		CU_ASSERT_EQUAL(rep->tenants[t]->caches, 0);
	snapkv__v1__admin_reply__free_unpacked(rep, NULL);
	for (int i = 0; i < n_engines; i++)
		spawn(i);
}

static uint64_t total(size_t off)
{
	uint64_t n = 0;

	for (int i = 0; i < n_engines; i++)
		n += atomic_load((_Atomic uint64_t *)((char *)&ctr[i] + off));
	return n;
}
#define TOTAL(f) total(offsetof(struct counters, f))

static void test_chaos(void)
{
	const char *e;
	unsigned secs = 30, max_kills = 400;
	uint64_t next_quiet, compactions_at_restart = 0, restart_ms = now_ms();
	unsigned idle_incarnations = 0;

	if ((e = getenv("CHAOS_SECONDS")))
		secs = (unsigned)atoi(e);
	if ((e = getenv("CHAOS_ENGINES")))
		n_engines = atoi(e);
	if (n_engines <= 0 || n_engines > MAX_ENGINES)
		n_engines = 4;
	if ((e = getenv("CHAOS_SEED")))
		seed = strtoull(e, NULL, 10) | 1;
	if ((e = getenv("CHAOS_MAX_KILLS")))
		max_kills = (unsigned)atoi(e);
	printf("\n    %u s, %d engines, seed %llu, at most %u kills\n", secs, n_engines,
	       (unsigned long long)seed, max_kills);
	CU_ASSERT_EQUAL_FATAL(start_daemon(), 0);
	deadline = now_ms() + secs * 1000ull;
	next_quiet = now_ms() + secs * 1000ull / 3;
	for (int i = 0; i < n_engines; i++)
		spawn(i);
	while (now_ms() < deadline && engine_kills + daemon_kills < max_kills) {
		uint64_t a;

		h_sleep_ms(50 + (int)(rnd(&seed) % 250));
		a = rnd(&seed) % 100;
		if (a < 70) {
			int i = (int)(rnd(&seed) % (uint64_t)n_engines);

			kill_engine(i);
			engine_kills++;
			spawn(i);
		} else if (a < 76) {
			/* the daemon dies mid-work; engines must see it and reconnect.
			 * Each incarnation lives until the engines got a compaction out
			 * of it (so every restart is shown to be recovered from); one
			 * that serves none in IDLE_MS is one they could not get back
			 * to, and the run ends there. */
			uint64_t done = TOTAL(compactions);

			if (done == compactions_at_restart) {
				if (now_ms() - restart_ms < IDLE_MS)
					continue;
				idle_incarnations++;
				break;
			}
			compactions_at_restart = done;
			h_kill(&H);
			daemon_kills++;
			h_sleep_ms((int)(rnd(&seed) % 200));
			if (start_daemon() < 0) {
				CU_FAIL("daemon did not restart");
				break;
			}
			restart_ms = now_ms();
		}
		if (now_ms() >= next_quiet) {
			quiet_point();
			next_quiet = now_ms() + secs * 1000ull / 3;
		}
	}
	/* the last one too must serve: waited for (IDLE_MS is the hang guard) */
	while (!idle_incarnations && TOTAL(compactions) == compactions_at_restart &&
	       now_ms() - restart_ms < IDLE_MS)
		h_sleep_ms(50);
	if (!idle_incarnations && TOTAL(compactions) == compactions_at_restart)
		idle_incarnations++;
	quiet_point();
	for (int i = 0; i < n_engines; i++)
		kill_engine(i);
	printf("    engine kills %u, daemon kills %u, quiet points %u\n", engine_kills,
	       daemon_kills, quiet_points);
	printf("    requests %llu, compactions %llu (%llu identical to offline, %llu differ), "
	       "appends %llu, grows %llu, releases %llu (%llu linger), connects %llu\n",
	       (unsigned long long)TOTAL(requests), (unsigned long long)TOTAL(compactions),
	       (unsigned long long)TOTAL(verified), (unsigned long long)TOTAL(mismatches),
	       (unsigned long long)TOTAL(appends), (unsigned long long)TOTAL(grows),
	       (unsigned long long)TOTAL(releases), (unsigned long long)TOTAL(lingers),
	       (unsigned long long)TOTAL(connects));
	printf("    errors: %llu from the daemon going away, %llu others; daemon incarnations "
	       "without a compaction: %u\n",
	       (unsigned long long)TOTAL(gone_errors), (unsigned long long)TOTAL(other_errors),
	       idle_incarnations);
	CU_ASSERT(TOTAL(compactions) > 0);
	CU_ASSERT_EQUAL(TOTAL(mismatches), 0);
	/* a SIGKILL between completion and check leaves a few unchecked */
	CU_ASSERT(TOTAL(verified) + engine_kills + (uint64_t)quiet_points * n_engines >=
		  TOTAL(compactions));
	CU_ASSERT_EQUAL(TOTAL(other_errors), 0);
	CU_ASSERT(TOTAL(grows) > 0);
	CU_ASSERT(engine_kills > 0);
	CU_ASSERT_EQUAL(idle_incarnations, 0);
	CU_ASSERT_EQUAL(h_stop(&H), 0);
}

/* Inputs of each shape and their offline results, before any daemon runs. */
static int suite_init(void)
{
	char gen[256], ctl[256], L[16], rows[16], W[16], C[16], nl[16], hq[16], hkv[16], d[16];

	build = getenv("BUILD") ? getenv("BUILD") : "build";
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/snapkv-chaos-XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	snprintf(gen, sizeof(gen), "%s/examples/gen-layer", build);
	snprintf(ctl, sizeof(ctl), "%s/snapkvctl", build);
	for (int s = 0; s < N_SHAPES; s++) {
		struct shape *sh = &shapes[s];

		snprintf(sh->in, sizeof(sh->in), "%s/in%d.safetensors", tmpdir, s);
		snprintf(sh->ref, sizeof(sh->ref), "%s/ref%d.safetensors", tmpdir, s);
		snprintf(nl, sizeof(nl), "%u", sh->layers);
		snprintf(hq, sizeof(hq), "%u", sh->h_q);
		snprintf(hkv, sizeof(hkv), "%u", sh->h_kv);
		snprintf(d, sizeof(d), "%u", sh->d);
		snprintf(L, sizeof(L), "%u", sh->L);
		snprintf(rows, sizeof(rows), "%u", sh->rows);
		snprintf(W, sizeof(W), "%u", sh->W);
		snprintf(C, sizeof(C), "%u", sh->C);
		const char *g[] = {gen,	      sh->in,	"--layers", nl,		  "--h-q",
				   hq,	      "--h-kv", hkv,	    "--head-dim", d,
				   "--len",   L,	"--rows",   rows,	  "--dtype",
				   sh->dtype, "--seed", nl,	    "--quiet",	  NULL};
		const char *o[] = {ctl,	       "compact", "--offline",	sh->in, sh->ref,
				   "--window", W,	  "--capacity", C,	"--gqa",
				   sh->gqa,    "--quiet", NULL};
		if (run(g) != 0 || run(o) != 0) {
			fprintf(stderr, "test-chaos: cannot make input %d (%s, %s)\n", s, gen, ctl);
			return -1;
		}
	}
	ctr = mmap(NULL, sizeof(*ctr) * (MAX_ENGINES + 1), PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	return ctr == MAP_FAILED ? -1 : 0;
}

static int suite_clean(void)
{
	for (int s = 0; s < N_SHAPES; s++) {
		unlink(shapes[s].in);
		unlink(shapes[s].ref);
	}
	h_cleanup(&H);
	rmdir(tmpdir);
	return 0;
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("chaos", suite_init, suite_clean);
	CU_add_test(s, "engines and daemon SIGKILLed while compacting", test_chaos);
	return h_run_tests();
}
