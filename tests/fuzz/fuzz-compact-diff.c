// SPDX-License-Identifier: MIT
/*
 * fuzz-compact-diff - libFuzzer target, differential: each input decodes to
 * one random COMPACT request (shape, policy, window, budget, every budget
 * mode and its parameters with NaN, infinities and out-of-range values,
 * protected ranges, fallback, f32 or bf16 K/V, the V1 params size) that is
 * sent to a real snapkvd through libsnapkv and run here, in process, by
 * libskv's skv_compact_budget() on the same bytes.
 *
 * The properties: the daemon never dies (one request must not take down
 * every tenant, issue 24); it accepts exactly what libskv accepts; and what
 * it keeps (kept counts, positions, retained mass, every K/V row, C*,
 * fallback) is bit for bit libskv's. A violation aborts, so libFuzzer keeps
 * the input.
 *
 * The daemon is $BUILD/snapkvd (BUILD defaults to build; SNAPKVD_BIN
 * overrides), started once on a socket in a fresh directory and killed at
 * exit. The K/V values are k/32 for integers |k| < 128, exact in f32 and
 * bf16, so both dtypes read the same numbers.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "skv.h"
#include "snapkv.h"

#define MAX_LAYERS 3u
#define MAX_L	   160u
#define MAX_HQ	   6u
#define MAX_HKV	   2u
#define MAX_D	   16u
#define MAX_NQ	   MAX_L
/* per layer: Q [h_q][n_q][D], K and V [h_kv][L][D], 4-byte elements at most */
#define LAYER_BYTES ((size_t)(MAX_HQ * MAX_NQ + 2 * MAX_HKV * MAX_L) * MAX_D * 4)
/* two copies of the layers: f32, then bf16 */
#define BUF_BYTES (2 * MAX_LAYERS * LAYER_BYTES)

#define FAIL(...)                                                                                  \
	do {                                                                                       \
		fprintf(stderr, "fuzz-compact-diff: " __VA_ARGS__);                                \
		fputc('\n', stderr);                                                               \
		abort();                                                                           \
	} while (0)

static char dir[64], sock[96];
static pid_t daemon_pid;
static struct skv_client *cl;
static struct skv_buffer *buf;
static struct skv_ctx *ctx;

/* ------------------------------------------------------ the input, read */

struct cursor {
	const uint8_t *p;
	size_t n;
};

static uint32_t take(struct cursor *c, unsigned bytes)
{
	uint32_t v = 0;

	for (unsigned i = 0; i < bytes; i++) {
		v = v << 8 | (c->n ? *c->p : 0);
		if (c->n)
			c->p++, c->n--;
	}
	return v;
}

/* Small values most of the time, any value sometimes. */
static uint32_t take_count(struct cursor *c, uint32_t small)
{
	uint32_t sel = take(c, 1);

	if (sel < 240)
		return take(c, 2) % (small + 1);
	return take(c, 4);
}

static float take_float(struct cursor *c)
{
	static const float table[] = {0.0f,  0.2f, 0.5f,  0.8f,	 0.9f,	 0.97f, 1.0f,  2.0f,
				      64.0f, 65.f, -0.5f, 1e-8f, 0.999f, 0.3f,	0.01f, 1.5f};
	uint32_t sel = take(c, 1);

	if (sel < 200)
		return table[sel % 16];
	if (sel < 220)
		return sel & 1 ? NAN : (sel & 2 ? INFINITY : -INFINITY);
	uint32_t bits = take(c, 4);
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

/* An enum from 1 (0 is "unspecified", which libsnapkv sends as the
 * default and libskv refuses) to past its last value. */
static uint32_t take_enum(struct cursor *c, uint32_t last)
{
	uint32_t v = take_count(c, last);

	return v ? v : 1;
}

/* ------------------------------------------------------ the daemon */

static void stop_daemon(void)
{
	if (daemon_pid > 0) {
		kill(daemon_pid, SIGKILL);
		waitpid(daemon_pid, NULL, 0);
		daemon_pid = 0;
	}
	if (dir[0]) {
		unlink(sock);
		rmdir(dir);
	}
}

/* Dies with the reason when snapkvd has exited. */
static void check_alive(const char *after)
{
	int st;

	if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid) {
		daemon_pid = 0;
		if (WIFSIGNALED(st))
			FAIL("snapkvd died of signal %d after %s", WTERMSIG(st), after);
		FAIL("snapkvd exited with status %d after %s", WEXITSTATUS(st), after);
	}
}

static void start_daemon(void)
{
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	char bin[512];

	if (getenv("SNAPKVD_BIN"))
		snprintf(bin, sizeof(bin), "%s", getenv("SNAPKVD_BIN"));
	else
		snprintf(bin, sizeof(bin), "%s/snapkvd", build);
	snprintf(dir, sizeof(dir), "/tmp/fuzz-compact-diff-XXXXXX");
	if (!mkdtemp(dir))
		FAIL("mkdtemp: %s", strerror(errno));
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	pid_t parent = getpid();
	daemon_pid = fork();
	if (daemon_pid < 0)
		FAIL("fork: %s", strerror(errno));
	if (daemon_pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		execl(bin, bin, "--socket", sock, "--threads", "2", "--log-level", "error",
		      (char *)NULL);
		_exit(127);
	}
	atexit(stop_daemon);
	for (int i = 0; i < 1000; i++) {
		check_alive("start");
		if (access(sock, F_OK) == 0 && skv_client_connect(sock, NULL, &cl) == 0)
			return;
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	FAIL("%s did not come up on %s", bin, sock);
}

/* k/32 for |k| < 128: the same number in f32 and in bf16 (its high half). */
static void fill_buffer(void)
{
	uint8_t *base = skv_buffer_data(buf);
	const size_t n = MAX_LAYERS * LAYER_BYTES / 4;
	float *f32 = (float *)base;
	uint16_t *b16 = (uint16_t *)(base + MAX_LAYERS * LAYER_BYTES);
	uint64_t s = 0x9e3779b97f4a7c15ull;

	for (size_t i = 0; i < n; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		int k = (int)((s >> 33) % 255) - 127;
		/* a few large keys, so that heads and positions differ in mass */
		float v = (float)(i % 13 == 0 ? k : k / 4) / 32.0f;
		uint32_t bits;
		f32[i] = v;
		memcpy(&bits, &v, 4);
		b16[i] = (uint16_t)(bits >> 16);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	start_daemon();
	if (skv_buffer_alloc(cl, BUF_BYTES, &buf) < 0)
		FAIL("skv_buffer_alloc: %s", skv_client_error(cl));
	if (skv_ctx_new(2, &ctx) < 0)
		FAIL("skv_ctx_new");
	fill_buffer();
	return 0;
}

/* ------------------------------------------------------ one request */

struct req {
	struct skv_shape sh;
	struct skv_params p;
	uint32_t layers, reserve, es;
	enum skv_dtype dt;
	uint64_t off_q[MAX_LAYERS], off_k[MAX_LAYERS], off_v[MAX_LAYERS];
};

static void decode_params(struct cursor *c, struct skv_params *p, uint32_t L)
{
	skv_params_init(p);
	p->policy = (enum skv_policy)take_enum(c, 5);
	p->window = take_count(c, 24);
	p->budget = take_count(c, L + 16);
	p->kernel = take_count(c, 9);
	p->pooling = (enum skv_pooling)take_enum(c, 3);
	p->gqa = (enum skv_gqa)take_enum(c, 3);
	p->sinks = take_count(c, 12);
	p->n_protected = take_count(c, 3);
	for (uint32_t i = 0; i < SKV_MAX_PROTECTED && i < p->n_protected; i++) {
		uint32_t b = take_count(c, L + 4);
		p->protected_ranges[i] = (struct skv_range){b, b + take_count(c, L / 2 + 2)};
	}
	p->budget_mode = (enum skv_budget)take_count(c, 5);
	/* past the array only with the mode that reads it: libsnapkv copies
	 * the list whatever the mode, and refuses one longer than the array */
	p->n_layer_caps = take_count(c, MAX_LAYERS + 1);
	if (p->n_layer_caps > SKV_MAX_LAYER_CAPS && p->budget_mode != SKV_BUDGET_LAYERS)
		p->n_layer_caps = 0;
	for (uint32_t l = 0; l < SKV_MAX_LAYER_CAPS && l < p->n_layer_caps; l++)
		p->layer_caps[l] = take_count(c, L + 16);
	p->pyramid_r = take_float(c);
	p->head_floor = take_float(c);
	p->tau = take_float(c);
	p->c_min = take_count(c, L + 16);
	p->c_max = p->c_min + take_count(c, L);
	p->c_step = take_count(c, 8);
	p->fallback_below = take(c, 1) < 200 ? 0.0f : take_float(c);
	if (take(c, 1) >= 240) {
		/* a caller from before the budget modes: nothing past V1 */
		memset(&p->budget_mode, 0, sizeof(*p) - SKV_PARAMS_SIZE_V1);
		p->params_size = SKV_PARAMS_SIZE_V1;
	}
}

static void decode(const uint8_t *data, size_t size, struct req *r)
{
	static const uint32_t heads[][2] = {{1, 1}, {2, 1}, {2, 2}, {4, 2}, {4, 1}, {3, 1}, {6, 2}};
	struct cursor c = {data, size};
	const uint32_t *hh = heads[take(&c, 1) % 7];

	memset(r, 0, sizeof(*r));
	r->layers = 1 + take(&c, 1) % MAX_LAYERS;
	r->sh.h_q = hh[0];
	r->sh.h_kv = hh[1];
	r->sh.head_dim = 4u << (take(&c, 1) % 3);
	r->sh.prompt_len = 1 + take(&c, 1) % MAX_L;
	decode_params(&c, &r->p, r->sh.prompt_len);
	/* n_q: the window (snapkv), all of L (h2o), or anything up to L */
	uint32_t sel = take(&c, 1) % 8;
	r->sh.n_q = sel < 5   ? (r->p.policy == SKV_POLICY_H2O ? r->sh.prompt_len : r->p.window)
		    : sel < 7 ? take(&c, 1) % (r->sh.prompt_len + 1)
			      : 0;
	if (r->sh.n_q > MAX_NQ)
		r->sh.n_q = MAX_NQ;
	r->dt = take(&c, 1) & 1 ? SKV_DTYPE_BF16 : SKV_DTYPE_F32;
	r->es = r->dt == SKV_DTYPE_F32 ? 4 : 2;
	r->reserve = take(&c, 1) % 4;
	/* layers one after another in the dtype's copy of the buffer */
	uint64_t at = r->dt == SKV_DTYPE_F32 ? 0 : MAX_LAYERS * LAYER_BYTES;
	const uint64_t D = r->sh.head_dim, L = r->sh.prompt_len;
	for (uint32_t l = 0; l < r->layers; l++) {
		r->off_q[l] = at;
		at += (uint64_t)r->sh.h_q * r->sh.n_q * D * r->es;
		r->off_k[l] = at;
		at += (uint64_t)r->sh.h_kv * L * D * r->es;
		r->off_v[l] = at;
		at += (uint64_t)r->sh.h_kv * L * D * r->es;
	}
}

/* libskv here: rc, and the outputs at room rows per stored head. */
struct local {
	uint32_t room, hs;
	uint8_t *k, *v;
	int32_t *pos;
	float *mass;
	uint32_t kept[MAX_LAYERS * MAX_HQ];
	struct skv_budget_result res;
	struct skv_error err;
};

static int run_local(const struct req *r, struct local *o)
{
	struct skv_layer_in in[MAX_LAYERS];
	struct skv_layer_out out[MAX_LAYERS];
	uint32_t rows[MAX_LAYERS];
	uint8_t *base = skv_buffer_data(buf);
	const uint32_t D = r->sh.head_dim, L = r->sh.prompt_len;

	memset(o, 0, sizeof(*o));
	int rc = skv_budget_rows(&r->sh, &r->p, r->layers, rows, &o->err);
	if (rc < 0)
		return rc;
	for (uint32_t l = 0; l < r->layers; l++)
		o->room = rows[l] > o->room ? rows[l] : o->room;
	o->hs = r->p.gqa == SKV_GQA_GROUP ? r->sh.h_kv : r->sh.h_q;
	const size_t per = (size_t)o->hs * (o->room ? o->room : 1);
	o->k = calloc(r->layers * per * D, r->es);
	o->v = calloc(r->layers * per * D, r->es);
	o->pos = calloc(r->layers * per, 4);
	o->mass = calloc(r->layers * o->hs, 4);
	if (!o->k || !o->v || !o->pos || !o->mass)
		FAIL("out of memory");
	for (uint32_t l = 0; l < r->layers; l++) {
		in[l].q = (struct skv_tensor){.data = base + r->off_q[l],
					      .dtype = r->dt,
					      .head_stride = (int64_t)r->sh.n_q * D,
					      .token_stride = D};
		in[l].k = (struct skv_tensor){.data = base + r->off_k[l],
					      .dtype = r->dt,
					      .head_stride = (int64_t)L * D,
					      .token_stride = D};
		in[l].v = (struct skv_tensor){.data = base + r->off_v[l],
					      .dtype = r->dt,
					      .head_stride = (int64_t)L * D,
					      .token_stride = D};
		out[l] = (struct skv_layer_out){
		    .k = {.data = o->k + l * per * D * r->es,
			  .dtype = r->dt,
			  .head_stride = (int64_t)o->room * D,
			  .token_stride = D},
		    .v = {.data = o->v + l * per * D * r->es,
			  .dtype = r->dt,
			  .head_stride = (int64_t)o->room * D,
			  .token_stride = D},
		    .positions = o->pos + l * per,
		    .pos_stride = o->room,
		    .retained_mass = o->mass + l * o->hs,
		};
	}
	o->res = (struct skv_budget_result){.result_size = sizeof(o->res), .kept = o->kept};
	return skv_compact_budget(ctx, &r->sh, &r->p, r->layers, in, out, &o->res, &o->err);
}

static void local_free(struct local *o)
{
	free(o->k);
	free(o->v);
	free(o->pos);
	free(o->mass);
}

static int run_daemon(const struct req *r, struct skv_cache **ret)
{
	struct skv_layer_ref refs[MAX_LAYERS];
	struct skv_compact_desc d;
	const int64_t D = r->sh.head_dim, L = r->sh.prompt_len;

	for (uint32_t l = 0; l < r->layers; l++) {
		refs[l].q =
		    (struct skv_tensor_ref){buf, r->off_q[l], r->dt, r->sh.n_q * D, D, 0, 0};
		refs[l].k = (struct skv_tensor_ref){buf, r->off_k[l], r->dt, L * D, D, 0, 0};
		refs[l].v = (struct skv_tensor_ref){buf, r->off_v[l], r->dt, L * D, D, 0, 0};
	}
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape = r->sh;
	d.layers = r->layers;
	d.params = r->p;
	d.layer = refs;
	d.decode_reserve = r->reserve;
	return skv_client_compact(cl, &d, ret);
}

/* The daemon's cache equals libskv's output, head by head, bit for bit. */
static void compare(const struct req *r, const struct local *o, struct skv_cache *k)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	struct skv_cache_budget cb = {.budget_size = sizeof(cb)};
	const size_t row = (size_t)r->sh.head_dim * r->es;

	if (ci->h_store != o->hs)
		FAIL("stored heads %u, libskv %u", ci->h_store, o->hs);
	if (skv_cache_budget(k, &cb) < 0)
		FAIL("skv_cache_budget failed");
	if (cb.fallback != o->res.fallback)
		FAIL("fallback %d, libskv %d", cb.fallback, o->res.fallback);
	if (cb.c_star != o->res.c_star)
		FAIL("C* %u, libskv %u", cb.c_star, o->res.c_star);
	for (uint32_t l = 0; l < r->layers; l++)
		for (uint32_t h = 0; h < o->hs; h++) {
			const uint32_t kh = o->kept[l * o->hs + h];
			const size_t at = ((size_t)l * o->hs + h) * o->room;
			float m = skv_cache_retained_mass(k, l, h), rm = o->mass[l * o->hs + h];
			if (skv_cache_head_kept(k, l, h) != kh)
				FAIL("layer %u head %u kept %u, libskv %u", l, h,
				     skv_cache_head_kept(k, l, h), kh);
			if (memcmp(skv_cache_positions(k, l, h), o->pos + at, (size_t)kh * 4))
				FAIL("layer %u head %u: positions differ", l, h);
			if (memcmp(&m, &rm, 4) && !(isnan(m) && isnan(rm)))
				FAIL("layer %u head %u: mass %g, libskv %g", l, h, (double)m,
				     (double)rm);
			for (uint32_t i = 0; i < kh; i++)
				if (memcmp(skv_cache_k_slot(k, l, h, i), o->k + (at + i) * row,
					   row) ||
				    memcmp(skv_cache_v_slot(k, l, h, i), o->v + (at + i) * row,
					   row))
					FAIL("layer %u head %u row %u: K/V differ", l, h, i);
		}
}

/* FUZZ_COMPACT_DIFF_SHOW=1: what an input decodes to, for a crash's report */
static void show(const struct req *r)
{
	const struct skv_params *p = &r->p;

	fprintf(stderr,
		"request: layers %u L %u D %u h_q %u h_kv %u n_q %u %s reserve %u | policy %d W %u "
		"C %u k %u pool %d gqa %d S %u protected %u",
		r->layers, r->sh.prompt_len, r->sh.head_dim, r->sh.h_q, r->sh.h_kv, r->sh.n_q,
		r->dt == SKV_DTYPE_F32 ? "f32" : "bf16", r->reserve, p->policy, p->window,
		p->budget, p->kernel, p->pooling, p->gqa, p->sinks, p->n_protected);
	for (uint32_t i = 0; i < p->n_protected && i < SKV_MAX_PROTECTED; i++)
		fprintf(stderr, " [%u,%u)", p->protected_ranges[i].begin,
			p->protected_ranges[i].end);
	if (p->params_size == SKV_PARAMS_SIZE_V1) {
		fprintf(stderr, " | V1 params\n");
		return;
	}
	fprintf(stderr, " | mode %d caps %u r %g a %g tau %g ladder %u..%u step %u fallback %g\n",
		p->budget_mode, p->n_layer_caps, (double)p->pyramid_r, (double)p->head_floor,
		(double)p->tau, p->c_min, p->c_max, p->c_step, (double)p->fallback_below);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct req r;
	struct local o;
	struct skv_cache *k = NULL;

	decode(data, size, &r);
	if (getenv("FUZZ_COMPACT_DIFF_SHOW"))
		show(&r);
	/* the daemon first: a request that kills it is reported as such */
	int rd = run_daemon(&r, &k);
	check_alive("a COMPACT request");
	int rl = run_local(&r, &o);
	if ((rl == 0) != (rd == 0))
		FAIL("libskv %s (%d: %s), snapkvd %s (%d: %s)", rl ? "refused" : "accepted", rl,
		     rl ? o.err.msg : "", rd ? "refused" : "accepted", rd,
		     rd ? skv_client_error(cl) : "");
	if (rd == 0) {
		compare(&r, &o, k);
		if (skv_cache_release(k) < 0)
			FAIL("release: %s", skv_client_error(cl));
	}
	local_free(&o);
	return 0;
}
