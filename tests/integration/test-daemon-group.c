// SPDX-License-Identifier: MIT
/*
 * test-daemon-group: decision groups (SPEC.md "Budgets beyond one C")
 * through snapkvd, with engines in processes of their own as tensor-parallel
 * ranks are. Each member holds its own random K/V (the same shape, other
 * data, so its own C* differs); every member must report the group's C*,
 * the largest of the members' own (computed here with libskv's
 * skv_compact_budget on the same data), and hold exactly libskv's output at
 * that C* (mass with C_min = C_max = C*). A member whose data would fall
 * back makes every member fall back (full prompt). A group missing a member
 * times out: every member fails, nothing kept, the pool back where it was;
 * a member whose session ends makes the others fail at once. Bad groups are
 * refused before any work with a message naming the field or limit, nothing
 * left behind. No timing assertion but generous upper bounds.
 * With SNAPKVD_TEST_BACKEND=cuda-emu (test-daemon-suites-cuda-emu.sh) all of
 * it runs on --backend cuda: each member's first step a whole compaction on
 * the GPU for its own choice, the group's choice (a larger C*, a fallback)
 * then rerun there (masses within 1e-4 of libskv's: the GPU's scores are
 * the host's within rounding); a mass fallback above tau is refused there.
 */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon-harness.h"
#include "skv.h"
#include "snapkv.h"

#define LAYERS 2
#define H_Q    4
#define H_KV   2
#define D      16
#define L      160
#define W      8
#define C      32

/* snapkvd.conf of the suite: small limits the bad-input test reaches */
#define MAX_GROUP_SIZE	     8
#define MAX_GROUP_TIMEOUT_MS 120000
#define MAX_TENANT_GROUPS    3
/* a member's wait: longer than any group here decides in */
#define CHILD_ALARM_S 150

/* buffer: per layer Q [H_Q][W][D], K [H_KV][L][D], V the same, f32 */
#define Q_EL	 ((size_t)H_Q * W * D)
#define KV_EL	 ((size_t)H_KV * L * D)
#define LAYER_EL (Q_EL + 2 * KV_EL)
#define BUF_SIZE (LAYERS * LAYER_EL * sizeof(float))

static struct harness H;
static int base_fds;
static long long base_pool;

/* ----------------------------------------------------------- inputs */

/*
 * Member data: seeded random K/V/Q, peaked by `peak` (every 7th element
 * scaled), so the heads' mass curves, and the members' own C*, differ.
 * flat: Q all zero, so every window row weighs the prefix evenly (low
 * retained mass at any C: the member that falls back).
 */
struct data {
	uint64_t seed;
	float peak;
	bool flat;
};

static void fill(float *x, const struct data *dt)
{
	uint64_t s = dt->seed;

	for (size_t i = 0; i < LAYERS * LAYER_EL; i++)
		x[i] = h_rand(&s) * (i % 7 == 0 ? dt->peak : 1.0f);
	if (dt->flat)
		for (uint32_t l = 0; l < LAYERS; l++)
			memset(x + l * LAYER_EL, 0, Q_EL * sizeof(float));
}

static void refs_of(struct skv_buffer *b, struct skv_layer_ref *refs)
{
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t o = (uint64_t)l * LAYER_EL * sizeof(float);

		refs[l].q = (struct skv_tensor_ref){b, o, SKV_DTYPE_F32, W * D, D, 0, 0};
		refs[l].k = (struct skv_tensor_ref){b, o + Q_EL * 4, SKV_DTYPE_F32, L * D, D, 0, 0};
		refs[l].v = (struct skv_tensor_ref){
		    b, o + (Q_EL + KV_EL) * 4, SKV_DTYPE_F32, L * D, D, 0, 0};
	}
}

/* mass tau on the ladder 12..96 by 4 (below L: C* is a real choice); TAU
 * puts the members' own C* inside the ladder, each its own */
#define TAU 0.6f

static void params_mass(struct skv_params *p, float tau, float fallback_below)
{
	skv_params_init(p);
	p->window = W;
	p->budget = C;
	p->gqa = SKV_GQA_EXPAND;
	p->budget_mode = SKV_BUDGET_MASS;
	p->tau = tau;
	p->c_min = 12;
	p->c_max = 96;
	p->c_step = 4;
	p->fallback_below = fallback_below;
}

static void desc_init(struct skv_compact_desc *d, const struct skv_params *p,
		      const struct skv_layer_ref *refs, const char *key, uint32_t size,
		      uint32_t timeout_ms)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	d->layers = LAYERS;
	d->params = *p;
	d->layer = refs;
	d->decode_reserve = 2;
	d->group_key = key;
	d->group_size = size;
	d->group_timeout_ms = timeout_ms;
}

/* ------------------------------------------------------ the reference */

/* What libskv keeps for data x: each head at rows h * room of its layer. */
struct ref {
	uint32_t room;
	float *k, *v, *mass;
	int32_t *pos;
	uint32_t kept[LAYERS * H_Q];
	struct skv_budget_result res;
};

static void ref_free(struct ref *r)
{
	free(r->k);
	free(r->v);
	free(r->mass);
	free(r->pos);
}

static int reference(const float *x, const struct skv_params *p, struct ref *r)
{
	struct skv_shape sh = {.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	struct skv_error err = {{0}, -1, -1};
	struct skv_layer_in in[LAYERS];
	struct skv_layer_out out[LAYERS];
	struct skv_ctx *ctx = NULL;
	uint32_t rows[LAYERS];
	size_t per;
	int rc;

	memset(r, 0, sizeof(*r));
	if (skv_budget_rows(&sh, p, LAYERS, rows, &err) < 0)
		return -1;
	for (uint32_t l = 0; l < LAYERS; l++)
		r->room = rows[l] > r->room ? rows[l] : r->room;
	per = (size_t)H_Q * r->room;
	r->k = calloc(LAYERS * per * D, sizeof(float));
	r->v = calloc(LAYERS * per * D, sizeof(float));
	r->pos = calloc(LAYERS * per, sizeof(int32_t));
	r->mass = calloc(LAYERS * H_Q, sizeof(float));
	if (!r->k || !r->v || !r->pos || !r->mass)
		return -1;
	for (uint32_t l = 0; l < LAYERS; l++) {
		const float *b = x + l * LAYER_EL;

		in[l].q =
		    (struct skv_tensor){(float *)b, SKV_DTYPE_F32, W * D, D, NULL, 0, 0, 0, 0};
		in[l].k = (struct skv_tensor){
		    (float *)b + Q_EL, SKV_DTYPE_F32, L * D, D, NULL, 0, 0, 0, 0};
		in[l].v = (struct skv_tensor){
		    (float *)b + Q_EL + KV_EL, SKV_DTYPE_F32, L * D, D, NULL, 0, 0, 0, 0};
		out[l] = (struct skv_layer_out){
		    .k = {r->k + l * per * D, SKV_DTYPE_F32, (int64_t)r->room * D, D, NULL, 0, 0, 0,
			  0},
		    .v = {r->v + l * per * D, SKV_DTYPE_F32, (int64_t)r->room * D, D, NULL, 0, 0, 0,
			  0},
		    .positions = r->pos + l * per,
		    .pos_stride = r->room,
		    .retained_mass = r->mass + l * H_Q,
		};
	}
	r->res = (struct skv_budget_result){.result_size = sizeof(r->res), .kept = r->kept};
	/* a context of its own, freed here: engines fork after this */
	if (skv_ctx_new(1, &ctx) < 0)
		return -1;
	rc = skv_compact_budget(ctx, &sh, p, LAYERS, in, out, &r->res, &err);
	skv_ctx_free(ctx);
	return rc;
}

/* A member's own outcome on its data alone (no group). */
static int own_outcome(const struct data *dt, const struct skv_params *p,
		       struct skv_budget_result *ret)
{
	float *x = malloc(BUF_SIZE);
	struct ref r;
	int rc;

	if (!x)
		return -1;
	fill(x, dt);
	rc = reference(x, p, &r);
	*ret = r.res;
	ret->kept = NULL;
	ref_free(&r);
	free(x);
	return rc;
}

/*
 * What a member must hold when its group decided C* (fallback: the full
 * prompt): libskv's mass mode on the one rung C*, or forced to fall back
 * (fallback_below 1: some head keeps less than all its mass below L).
 */
static void decided_params(const struct skv_params *p, uint32_t c_star, bool fallback,
			   struct skv_params *ret)
{
	*ret = *p;
	ret->c_min = ret->c_max = c_star;
	ret->c_step = 1;
	ret->fallback_below = fallback ? 1.0f : 0.0f;
}

/* The cache k equals the reference r, head by head, bit for bit. */
static bool same_as(const struct skv_cache *k, const struct ref *r)
{
	const struct skv_cache_info *ci = skv_cache_info(k);

	if (ci->h_store != H_Q)
		return false;
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < H_Q; h++) {
			uint32_t kh = r->kept[l * H_Q + h];
			size_t at = ((size_t)l * H_Q + h) * r->room;
			float m = skv_cache_retained_mass(k, l, h), rm = r->mass[l * H_Q + h];

			if (skv_cache_head_kept(k, l, h) != kh ||
			    memcmp(skv_cache_positions(k, l, h), r->pos + at, kh * 4)) {
				fprintf(stderr,
					"layer %u head %u: kept %u/%u or positions differ\n", l, h,
					skv_cache_head_kept(k, l, h), kh);
				return false;
			}
			/* the GPU's scores are the host's within rounding: so are masses */
			if (h_backend_cuda() ? !(fabsf(m - rm) <= 1e-4f)
					     : memcmp(&m, &rm, 4) != 0) {
				fprintf(stderr, "layer %u head %u: mass %.9g, libskv %.9g\n", l, h,
					(double)m, (double)rm);
				return false;
			}
			for (uint32_t i = 0; i < kh; i++)
				if (memcmp(skv_cache_k_slot(k, l, h, i), r->k + (at + i) * D,
					   D * 4) ||
				    memcmp(skv_cache_v_slot(k, l, h, i), r->v + (at + i) * D,
					   D * 4))
					return false;
		}
	return true;
}

/* ------------------------------------------------------ engine processes */

/* What the parent tells a member and what it reports back. */
struct member {
	struct data data;
	struct skv_params params;
	char key[SKV_MAX_GROUP_KEY + 1];
	uint32_t size, timeout_ms;
	/* the group's expected decision, for the bytes check (0: none) */
	uint32_t want_c;
	bool want_fallback;
	/* kill_after_submit: submit, report, then wait to be killed */
	bool hold;
};

struct report {
	int rc, same, connected;
	uint32_t c_star, group_size, kept_min;
	int fallback;
	uint64_t group_wait_us;
	double seconds;
	char err[256];
};

/* A member writes 'S' once its request is on the ring (or it gave up
 * before), then its report. */
struct kid {
	pid_t pid;
	int fd;		/* the report pipe's read end */
	bool submitted; /* 'S' read */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void member_run(const struct member *m, int fd)
{
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = "tp-rank"};
	struct report rep = {.rc = -EIO};
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_cache *k = NULL;
	struct skv_request *rq = NULL;
	struct skv_layer_ref refs[LAYERS];
	struct skv_compact_desc d;
	double t0;

	alarm(CHILD_ALARM_S); /* a hung member must not hang the suite */
	if (skv_client_connect(H.sock, &o, &c) < 0 || skv_buffer_alloc(c, BUF_SIZE, &b) < 0) {
		snprintf(rep.err, sizeof(rep.err), "setup: %s", skv_client_error(c));
		(void)!write(fd, "S", 1);
		goto out;
	}
	rep.connected = 1;
	fill(skv_buffer_data(b), &m->data);
	refs_of(b, refs);
	desc_init(&d, &m->params, refs, m->key, m->size, m->timeout_ms);
	t0 = now_s();
	rep.rc = skv_compact_submit(c, &d, &rq);
	(void)!write(fd, "S", 1);
	if (m->hold) /* wait to be killed: the session ends */
		for (;;)
			pause();
	if (rep.rc == 0)
		rep.rc = skv_request_wait(rq, -1, &k);
	rep.seconds = now_s() - t0;
	snprintf(rep.err, sizeof(rep.err), "%s", rep.rc < 0 ? skv_client_error(c) : "");
	if (rep.rc == 0) {
		struct skv_cache_budget cb = {.budget_size = sizeof(cb)};

		skv_cache_budget(k, &cb);
		rep.c_star = cb.c_star;
		rep.fallback = cb.fallback;
		rep.group_size = cb.group_size;
		rep.group_wait_us = cb.group_wait_us;
		rep.kept_min = cb.kept_min;
		if (m->want_c || m->want_fallback) {
			struct skv_params dp;
			struct ref r;

			decided_params(&m->params, m->want_c, m->want_fallback, &dp);
			rep.same = reference(skv_buffer_data(b), &dp, &r) == 0 && same_as(k, &r);
			ref_free(&r);
		}
	}
out:
	(void)!write(fd, &rep, sizeof(rep));
	skv_cache_release(k);
	skv_buffer_free(b);
	skv_client_close(c);
}

static struct kid spawn(const struct member *m)
{
	struct kid kid = {.pid = -1, .fd = -1};
	int p[2];

	if (pipe(p) < 0)
		return kid;
	fflush(stdout);
	fflush(stderr);
	kid.pid = fork();
	if (kid.pid == 0) {
		close(p[0]);
		member_run(m, p[1]);
		_exit(0);
	}
	close(p[1]);
	kid.fd = p[0];
	return kid;
}

/* Wait until the member has submitted (or given up). */
static void submitted(struct kid *kid)
{
	char ch;

	if (kid->fd >= 0 && !kid->submitted)
		kid->submitted = read(kid->fd, &ch, 1) == 1 || true;
}

/* The member's report (rc -EPIPE when it died without one), and reap it. */
static struct report collect(struct kid kid)
{
	struct report rep = {.rc = -EPIPE};

	submitted(&kid);
	if (kid.fd >= 0) {
		if (read(kid.fd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
			rep = (struct report){.rc = -EPIPE};
		close(kid.fd);
	}
	if (kid.pid > 0)
		waitpid(kid.pid, NULL, 0);
	return rep;
}

/* --------------------------------------------------------- the daemon */

static int n_caches(void)
{
	Snapkv__V1__AdminReply *r = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_CACHES);
	int n = -1;

	if (r) {
		n = (int)r->n_caches;
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
	}
	return n;
}

/* The value of an unlabelled metric, or -1. */
static double metric(const char *name)
{
	Snapkv__V1__AdminReply *a = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS);
	char needle[128];
	const char *at;
	double v = -1;

	snprintf(needle, sizeof(needle), "\n%s ", name);
	if (a && a->text && (at = strstr(a->text, needle)))
		v = strtod(at + strlen(needle), NULL);
	if (a)
		snapkv__v1__admin_reply__free_unpacked(a, NULL);
	return v;
}

/* Wait (up to 30 s: only a stuck daemon takes long) until metric name is want. */
static bool metric_is(const char *name, double want)
{
	for (int i = 0; i < 3000; i++) {
		if (metric(name) == want)
			return true;
		h_sleep_ms(10);
	}
	fprintf(stderr, "%s is %g, not %g\n", name, metric(name), want);
	return false;
}

/* Nothing left behind: no cache, the pool and the fds where they were, no
 * group pending, no member parked. */
/* Until n jobs are parked in groups: a member's first step takes seconds on
 * the CUDA emulator, ms on the host (a bound, not a timing check). */
static void wait_parked(double n)
{
	for (int i = 0; i < 600 && metric("snapkvd_groups_parked_jobs") != n; i++)
		usleep(100000);
}

static void nothing_held(const char *what)
{
	int nc = n_caches(), f = h_fds_settled(H.pid, base_fds);
	int pool = h_wait_pool(H.sock, base_pool, 5000);

	if (nc != 0 || pool != 0 || f != base_fds)
		fprintf(stderr, "%s: %d caches, pool %lld (want %lld), fds %d (want %d)\n", what,
			nc, h_pool_used(H.sock), base_pool, f, base_fds);
	CU_ASSERT_EQUAL(nc, 0);
	CU_ASSERT_EQUAL(pool, 0);
	CU_ASSERT_EQUAL(f, base_fds);
	CU_ASSERT(metric_is("snapkvd_groups_pending", 0));
	CU_ASSERT(metric_is("snapkvd_groups_parked_jobs", 0));
}

static int suite_init(void)
{
	char cfg[300];

	/* the CPU emulator of CUDA runs a member's kernels in seconds, not ms */
	snprintf(cfg, sizeof(cfg),
		 "max_group_size = %d\ngroup_timeout_ms = %d\nmax_group_timeout_ms = %d\n"
		 "max_tenant_groups = %d\n",
		 MAX_GROUP_SIZE, h_backend_cuda() ? MAX_GROUP_TIMEOUT_MS : 10000,
		 MAX_GROUP_TIMEOUT_MS, MAX_TENANT_GROUPS);
	if (h_start_config(&H, "snapkvd-group", cfg) < 0)
		return -1;
	/* uid 65534 may reach the socket (the other-tenant member) */
	chmod(H.dir, 0755);
	chmod(H.sock, 0666);
	base_pool = h_pool_used(H.sock);
	base_fds = h_fds_base(H.pid);
	return 0;
}

static int suite_clean(void)
{
	int st = h_stop(&H);

	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

/* ------------------------------------------------------------- groups */

/*
 * n engine processes in group `key`, member i with data[i]: every one
 * reports the group's C* (the largest own C*), the group size, and holds
 * libskv's output at that C*.
 */
static void group_of(uint32_t n, const struct data *data, const char *key)
{
	struct member m[8];
	struct kid kids[8];
	struct report rep[8];
	struct skv_budget_result own[8];
	struct skv_params p;
	uint32_t want = 0;
	bool differ = false;

	params_mass(&p, TAU, 0.0f);
	for (uint32_t i = 0; i < n; i++) {
		CU_ASSERT_EQUAL_FATAL(own_outcome(&data[i], &p, &own[i]), 0);
		want = own[i].c_star > want ? own[i].c_star : want;
		differ |= own[i].c_star != own[0].c_star;
	}
	printf("\n  group %s of %u: own C*", key, n);
	for (uint32_t i = 0; i < n; i++)
		printf(" %u", own[i].c_star);
	printf(", the group's must be %u\n", want);
	CU_ASSERT(differ); /* else the test could not tell max from any */
	for (uint32_t i = 0; i < n; i++) {
		m[i] = (struct member){.data = data[i], .params = p, .size = n, .want_c = want};
		snprintf(m[i].key, sizeof(m[i].key), "%s", key);
		kids[i] = spawn(&m[i]);
		CU_ASSERT(kids[i].pid > 0);
	}
	for (uint32_t i = 0; i < n; i++)
		rep[i] = collect(kids[i]);
	for (uint32_t i = 0; i < n; i++) {
		printf("  member %u: rc %d C* %u fallback %d group_size %u wait %.1f ms%s%s\n", i,
		       rep[i].rc, rep[i].c_star, rep[i].fallback, rep[i].group_size,
		       (double)rep[i].group_wait_us / 1e3, rep[i].err[0] ? ": " : "", rep[i].err);
		CU_ASSERT_EQUAL(rep[i].rc, 0);
		CU_ASSERT_EQUAL(rep[i].c_star, want);
		CU_ASSERT_EQUAL(rep[i].fallback, 0);
		CU_ASSERT_EQUAL(rep[i].group_size, n);
		CU_ASSERT(rep[i].same);
	}
	nothing_held(key);
}

static void test_group_of_2(void)
{
	const struct data d[2] = {{101, 6.0f, false}, {202, 8.0f, false}};

	group_of(2, d, "tp-2");
}

static void test_group_of_4(void)
{
	const struct data d[4] = {
	    {11, 8.0f, false}, {22, 5.0f, false}, {33, 6.0f, false}, {44, 4.5f, false}};

	group_of(4, d, "tp-4:req 17");
}

/* One member's flat attention would fall back: every member does. */
static void test_group_fallback(void)
{
	const struct data data[3] = {{7, 6.0f, false}, {8, 8.0f, false}, {9, 1.0f, true}};
	struct member m[3];
	struct kid kids[3];
	struct report rep[3];
	struct skv_budget_result own[3];
	struct skv_params p;

	params_mass(&p, TAU, TAU); /* what meets tau never falls back */
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL_FATAL(own_outcome(&data[i], &p, &own[i]), 0);
	printf("\n  own: fallback %d %d %d (min mass %.3f %.3f %.3f)\n", own[0].fallback,
	       own[1].fallback, own[2].fallback, (double)own[0].min_mass, (double)own[1].min_mass,
	       (double)own[2].min_mass);
	/* alone, only the flat one falls back */
	CU_ASSERT(!own[0].fallback && !own[1].fallback && own[2].fallback);
	for (int i = 0; i < 3; i++) {
		m[i] = (struct member){
		    .data = data[i], .params = p, .size = 3, .want_fallback = true, .want_c = 96};
		snprintf(m[i].key, sizeof(m[i].key), "fallback-group");
		kids[i] = spawn(&m[i]);
	}
	for (int i = 0; i < 3; i++)
		rep[i] = collect(kids[i]);
	for (int i = 0; i < 3; i++) {
		printf("  member %d: rc %d fallback %d kept_min %u group_size %u%s%s\n", i,
		       rep[i].rc, rep[i].fallback, rep[i].kept_min, rep[i].group_size,
		       rep[i].err[0] ? ": " : "", rep[i].err);
		CU_ASSERT_EQUAL(rep[i].rc, 0);
		CU_ASSERT_EQUAL(rep[i].fallback, 1);
		CU_ASSERT_EQUAL(rep[i].kept_min, L);
		CU_ASSERT_EQUAL(rep[i].group_size, 3);
		CU_ASSERT(rep[i].same);
	}
	nothing_held("fallback");
}

/* A group of 3 with 2 members: both time out, nothing kept. */
static void test_group_timeout(void)
{
	const struct data data[2] = {{5, 2.0f, false}, {6, 3.0f, false}};
	struct member m[2];
	struct kid kids[2];
	struct report rep[2];
	struct skv_params p;

	double timeouts = metric("snapkvd_groups_timeouts_total");

	params_mass(&p, TAU, 0.0f);
	for (int i = 0; i < 2; i++) {
		m[i] = (struct member){.data = data[i], .params = p, .size = 3, .timeout_ms = 300};
		snprintf(m[i].key, sizeof(m[i].key), "short-by-one");
		kids[i] = spawn(&m[i]);
	}
	for (int i = 0; i < 2; i++)
		rep[i] = collect(kids[i]);
	for (int i = 0; i < 2; i++) {
		printf("\n  member %d: rc %d after %.2f s: %s", i, rep[i].rc, rep[i].seconds,
		       rep[i].err);
		/* the daemon's ETIMEDOUT is libsnapkv's -ETIME (snapkv.h) */
		CU_ASSERT_EQUAL(rep[i].rc, -ETIME);
		CU_ASSERT(rep[i].seconds < 30.0);
	}
	printf("\n");
	CU_ASSERT_EQUAL(metric("snapkvd_groups_timeouts_total"), timeouts + 1);
	nothing_held("timeout");
}

/*
 * A member's session ends while the group waits (the engine dies): the
 * other members fail at once, long before the group's timeout (120 s),
 * and nothing is leaked.
 */
static void test_session_ends(void)
{
	const struct data data[3] = {{51, 2.0f, false}, {52, 3.0f, false}, {53, 4.0f, false}};
	struct member m[3];
	struct kid kids[3];
	struct report rep[3];
	struct skv_params p;
	double failed;

	params_mass(&p, TAU, 0.0f);
	for (int i = 0; i < 3; i++) {
		m[i] = (struct member){.data = data[i],
				       .params = p,
				       .size = 4,
				       .timeout_ms = MAX_GROUP_TIMEOUT_MS,
				       .hold = i == 0};
		snprintf(m[i].key, sizeof(m[i].key), "rank-dies");
	}
	/* the one that dies first, then the others join it */
	kids[0] = spawn(&m[0]);
	submitted(&kids[0]);
	for (int i = 1; i < 3; i++)
		kids[i] = spawn(&m[i]);
	for (int i = 1; i < 3; i++)
		submitted(&kids[i]);
	wait_parked(3);
	CU_ASSERT(metric_is("snapkvd_groups_parked_jobs", 3)); /* all scored, waiting */
	failed = metric("snapkvd_groups_failed_total");
	kill(kids[0].pid, SIGKILL);
	rep[0] = collect(kids[0]);
	for (int i = 1; i < 3; i++) {
		rep[i] = collect(kids[i]);
		printf("\n  member %d: rc %d after %.2f s: %s", i, rep[i].rc, rep[i].seconds,
		       rep[i].err);
		CU_ASSERT_EQUAL(rep[i].rc, -ECANCELED); /* not the group's timeout */
		CU_ASSERT_PTR_NOT_NULL(strstr(rep[i].err, "session ended"));
		CU_ASSERT(rep[i].seconds < 60.0);
	}
	printf("\n");
	CU_ASSERT_EQUAL(metric("snapkvd_groups_failed_total"), failed + 1);
	nothing_held("session ends");
}

/* ---------------------------------------------------------- bad input */

struct eng {
	struct skv_client *c;
	struct skv_buffer *b;
	struct skv_layer_ref refs[LAYERS];
};

static int eng_open(struct eng *e, uint64_t seed)
{
	struct data dt = {seed, 2.0f, false};

	memset(e, 0, sizeof(*e));
	if (skv_client_connect(H.sock, NULL, &e->c) < 0 ||
	    skv_buffer_alloc(e->c, BUF_SIZE, &e->b) < 0)
		return -1;
	fill(skv_buffer_data(e->b), &dt);
	refs_of(e->b, e->refs);
	return 0;
}

static void eng_close(struct eng *e)
{
	skv_buffer_free(e->b);
	skv_client_close(e->c);
}

/* Refused at once (skv_client_compact returns, the group never waits),
 * -want with `needle` in the message, no cache. */
static void refused_desc(struct eng *e, const struct skv_compact_desc *d, int want,
			 const char *needle)
{
	struct skv_cache *k = NULL;
	int rc = skv_client_compact(e->c, d, &k);

	if (rc != -want || !strstr(skv_client_error(e->c), needle))
		fprintf(stderr, "want %d \"%s\", got %d \"%s\"\n", -want, needle, rc,
			skv_client_error(e->c));
	else
		printf("\n  refused (%s): %s", strerrorname_np(want), skv_client_error(e->c));
	CU_ASSERT_EQUAL(rc, -want);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(e->c), needle));
	CU_ASSERT_PTR_NULL(k);
	skv_cache_release(k);
}

static void refused(struct eng *e, const struct skv_params *p, const char *key, uint32_t size,
		    uint32_t timeout_ms, int want, const char *needle)
{
	struct skv_compact_desc d;

	desc_init(&d, p, e->refs, key, size, timeout_ms);
	refused_desc(e, &d, want, needle);
}

/* Limits and modes, each refused alone. */
static void test_bad_alone(void)
{
	struct skv_params p;
	struct skv_compact_desc d;
	struct eng e;
	char long_key[80];

	CU_ASSERT_EQUAL_FATAL(eng_open(&e, 1), 0);
	params_mass(&p, TAU, 0.0f);
	/* checked in libsnapkv before sending */
	refused(&e, &p, "k", 0, 0, EINVAL, "group_size 0 with group_key");
	refused(&e, &p, NULL, 2, 0, EINVAL, "without a group_key");
	memset(long_key, 'a', 65);
	long_key[65] = 0;
	refused(&e, &p, long_key, 2, 0, EINVAL, "longer than 64 bytes");
	refused(&e, &p, "tab\there", 2, 0, EINVAL, "not printable ASCII");
	desc_init(&d, &p, e.refs, NULL, 0, 0);
	CU_ASSERT_EQUAL(skv_compact_desc_group(&d, "k", 0, 0), -EINVAL);
	CU_ASSERT_EQUAL(skv_compact_desc_group(&d, "", 2, 0), -EINVAL);
	d.desc_size = offsetof(struct skv_compact_desc, group_key);
	CU_ASSERT_EQUAL(skv_compact_desc_group(&d, "k", 2, 0), -EINVAL);
	/* checked by snapkvd: its limits and the modes */
	refused(&e, &p, "k", MAX_GROUP_SIZE + 1, 0, EINVAL, "max_group_size");
	refused(&e, &p, "k", 2, MAX_GROUP_TIMEOUT_MS + 1, EINVAL, "max_group_timeout_ms");
	p.budget_mode = SKV_BUDGET_HEADS;
	refused(&e, &p, "k", 2, 0, EINVAL, "budget mode heads");
	params_mass(&p, TAU, 0.0f);
	p.budget_mode = SKV_BUDGET_MASS_HEADS;
	refused(&e, &p, "k", 2, 0, EINVAL, "budget mode mass-heads");
	printf("\n");
	eng_close(&e);
	nothing_held("bad alone");
}

/*
 * Members that disagree with the group's first: refused at once naming the
 * field; the group still completes with a member that agrees.
 */
static void mismatch(const struct skv_params *bad, uint32_t prompt_len, const char *needle)
{
	struct eng a, b, c2;
	struct skv_params p;
	struct skv_compact_desc d, db;
	struct skv_request *ra = NULL, *rc2 = NULL;
	struct skv_cache *ka = NULL, *kc = NULL;

	params_mass(&p, TAU, 0.0f);
	CU_ASSERT_EQUAL_FATAL(eng_open(&a, 61), 0);
	CU_ASSERT_EQUAL_FATAL(eng_open(&b, 62), 0);
	CU_ASSERT_EQUAL_FATAL(eng_open(&c2, 63), 0);
	desc_init(&d, &p, a.refs, "mismatch", 2, 30000);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(a.c, &d, &ra), 0);
	wait_parked(1);
	CU_ASSERT(metric_is("snapkvd_groups_parked_jobs", 1)); /* a is the group's first */
	desc_init(&db, bad, b.refs, "mismatch", 2, 30000);
	db.shape.prompt_len = prompt_len;
	refused_desc(&b, &db, EINVAL, needle);
	desc_init(&d, &p, c2.refs, "mismatch", 2, 30000);
	CU_ASSERT_EQUAL(skv_compact_submit(c2.c, &d, &rc2), 0);
	CU_ASSERT_EQUAL(skv_request_wait(ra, 60000, &ka), 0);
	CU_ASSERT_EQUAL(rc2 ? skv_request_wait(rc2, 60000, &kc) : -1, 0);
	skv_cache_release(ka);
	skv_cache_release(kc);
	eng_close(&a);
	eng_close(&b);
	eng_close(&c2);
}

static void test_bad_mismatch(void)
{
	struct skv_params p;

	params_mass(&p, TAU, 0.0f);
	mismatch(&p, L - 16, "prompt_len 144 differs from the group's 160");
	params_mass(&p, TAU + 0.1f, 0.0f);
	mismatch(&p, L, "tau 0.7 differs from the group's 0.6");
	printf("\n");
	nothing_held("mismatch");
}

/*
 * A third member for a group of 2, while the group is still deciding: the
 * three go on one ring back to back behind long compactions, one for each
 * of the daemon's workers (all busy, so the first two are still unscored
 * when the loop admits the third): refused naming the size; the two
 * complete.
 */
#define MAX_BLOCKERS 16
#define BL_L	     8192
#define BL_D	     128
#define BL_H	     8
#define BL_W	     64

static void test_bad_third_member(void)
{
	struct eng e;
	struct skv_buffer *big = NULL;
	struct skv_layer_ref br;
	struct skv_compact_desc d;
	struct skv_params p;
	struct skv_request *blk[MAX_BLOCKERS] = {NULL}, *rq[3] = {NULL};
	struct skv_cache *k[3] = {NULL}, *kb[MAX_BLOCKERS] = {NULL};
	long long workers = H_STATUS_FIELD(H.sock, workers);
	int nb = workers < 1 ? 1 : workers > MAX_BLOCKERS ? MAX_BLOCKERS : (int)workers;
	size_t qel = (size_t)BL_H * BL_W * BL_D, kel = (size_t)BL_H * BL_L * BL_D;
	uint64_t seed = 5;

	CU_ASSERT_EQUAL_FATAL(eng_open(&e, 99), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(e.c, (qel + kel) * sizeof(float), &big), 0);
	for (size_t i = 0; i < qel + kel; i++)
		((float *)skv_buffer_data(big))[i] = h_rand(&seed);
	br.q = (struct skv_tensor_ref){big, 0, SKV_DTYPE_F32, BL_W * BL_D, BL_D, 0, 0};
	br.k = br.v = (struct skv_tensor_ref){
	    big, qel * sizeof(float), SKV_DTYPE_F32, (int64_t)BL_L * BL_D, BL_D, 0, 0};
	skv_params_init(&p);
	p.window = BL_W;
	p.budget = 256;
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape = (struct skv_shape){
	    .prompt_len = BL_L, .head_dim = BL_D, .h_q = BL_H, .h_kv = BL_H, .n_q = BL_W};
	d.layers = 1;
	d.params = p;
	d.layer = &br;
	for (int i = 0; i < nb; i++)
		CU_ASSERT_EQUAL(skv_compact_submit(e.c, &d, &blk[i]), 0);
	params_mass(&p, TAU, 0.0f);
	/* behind the blockers, which take long on the CUDA emulator */
	const uint32_t wait_ms = h_backend_cuda() ? MAX_GROUP_TIMEOUT_MS : 30000;
	desc_init(&d, &p, e.refs, "two-only", 2, wait_ms);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(skv_compact_submit(e.c, &d, &rq[i]), 0);
	CU_ASSERT_EQUAL(rq[2] ? skv_request_wait(rq[2], 60000, &k[2]) : -1, -EEXIST);
	printf("\n  third member (behind %d compactions): %s", nb, skv_client_error(e.c));
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(e.c), "already has its 2 members"));
	for (int i = 0; i < 2; i++)
		CU_ASSERT_EQUAL(rq[i] ? skv_request_wait(rq[i], 60000 + wait_ms, &k[i]) : -1, 0);
	for (int i = 0; i < nb; i++) {
		CU_ASSERT_EQUAL(blk[i] ? skv_request_wait(blk[i], 60000 + wait_ms, &kb[i]) : -1, 0);
		skv_cache_release(kb[i]);
	}
	for (int i = 0; i < 3; i++)
		skv_cache_release(k[i]);
	skv_buffer_free(big);
	eng_close(&e);
	printf("\n");
	nothing_held("third member");
}

/* More pending groups than max_tenant_groups: the next is refused; the
 * pending ones time out, nothing kept. */
static void test_bad_tenant_groups(void)
{
	struct eng e[MAX_TENANT_GROUPS + 1];
	struct skv_request *rq[MAX_TENANT_GROUPS] = {NULL};
	struct skv_compact_desc d;
	struct skv_params p;
	char key[32];

	params_mass(&p, TAU, 0.0f);
	for (int i = 0; i <= MAX_TENANT_GROUPS; i++)
		CU_ASSERT_EQUAL_FATAL(eng_open(&e[i], 70 + (uint64_t)i), 0);
	for (int i = 0; i < MAX_TENANT_GROUPS; i++) {
		snprintf(key, sizeof(key), "pending-%d", i);
		desc_init(&d, &p, e[i].refs, key, 2, 2000);
		CU_ASSERT_EQUAL(skv_compact_submit(e[i].c, &d, &rq[i]), 0);
	}
	CU_ASSERT(metric_is("snapkvd_groups_pending", MAX_TENANT_GROUPS));
	refused(&e[MAX_TENANT_GROUPS], &p, "one-too-many", 2, 2000, EUSERS, "max_tenant_groups");
	for (int i = 0; i < MAX_TENANT_GROUPS; i++) {
		struct skv_cache *k = NULL;

		CU_ASSERT_EQUAL(rq[i] ? skv_request_wait(rq[i], 60000, &k) : -1, -ETIME);
		skv_cache_release(k);
	}
	for (int i = 0; i <= MAX_TENANT_GROUPS; i++)
		eng_close(&e[i]);
	printf("\n");
	nothing_held("tenant groups");
}

/* Another uid's member for root's group: refused naming the tenant (only
 * as root: it needs setuid). */
static void test_bad_other_uid(void)
{
	struct eng a, b;
	struct skv_params p;
	struct skv_compact_desc d;
	struct skv_request *ra = NULL, *rb = NULL;
	struct skv_cache *ka = NULL, *kb = NULL;
	int pfd[2], st = -1;
	char msg[300] = "";
	pid_t pid;

	params_mass(&p, TAU, 0.0f);
	CU_ASSERT_EQUAL_FATAL(eng_open(&a, 81), 0);
	desc_init(&d, &p, a.refs, "root-group", 2, 30000);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(a.c, &d, &ra), 0);
	wait_parked(1);
	CU_ASSERT(metric_is("snapkvd_groups_parked_jobs", 1));
	CU_ASSERT_EQUAL_FATAL(pipe(pfd), 0);
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		struct eng o;
		struct skv_cache *k = NULL;
		int rc = -EPERM;

		close(pfd[0]);
		alarm(CHILD_ALARM_S);
		/* the same key from another uid: a group of its own, which
		 * neither joins root's nor is refused because of it; alone, it
		 * times out */
		if (setgid(65534) == 0 && setuid(65534) == 0 && eng_open(&o, 82) == 0) {
			desc_init(&d, &p, o.refs, "root-group", 2, 300);
			rc = skv_client_compact(o.c, &d, &k);
			snprintf(msg, sizeof(msg), "%s", skv_client_error(o.c));
		}
		(void)!write(pfd[1], msg, sizeof(msg));
		_exit(rc == -ETIME ? 0 : rc == 0 ? 3 : rc == -EPERM ? 5 : 4);
	}
	close(pfd[1]);
	(void)!read(pfd[0], msg, sizeof(msg));
	close(pfd[0]);
	waitpid(pid, &st, 0);
	msg[sizeof(msg) - 1] = 0;
	printf("\n  uid 65534's member: exit %d: %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1, msg);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CU_ASSERT_PTR_NULL(strstr(msg, "another tenant"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "root-group"));
	/* root's group completes with root's second member */
	CU_ASSERT_EQUAL_FATAL(eng_open(&b, 83), 0);
	desc_init(&d, &p, b.refs, "root-group", 2, 30000);
	CU_ASSERT_EQUAL(skv_compact_submit(b.c, &d, &rb), 0);
	CU_ASSERT_EQUAL(skv_request_wait(ra, 60000, &ka), 0);
	CU_ASSERT_EQUAL(rb ? skv_request_wait(rb, 60000, &kb) : -1, 0);
	skv_cache_release(ka);
	skv_cache_release(kb);
	eng_close(&a);
	eng_close(&b);
	printf("\n");
	nothing_held("other uid");
}

/*
 * A member whose session ended before its partner arrived (issue 24: 8 of
 * 10 groups were still decided with it, the check ran only in the 250 ms
 * sweep): the partner fails (-ECANCELED, or at worst its own group's
 * timeout if the sweep came first), never gets a cache.
 */
static void test_dead_member_arrival(void)
{
	int cancelled = 0;
	/* the emulated GPU takes seconds for a member's first step */
	const uint32_t wait_ms = h_backend_cuda() ? 20000 : 2000;

	for (int t = 0; t < 5; t++) {
		struct member m = {.data = {90 + (uint64_t)t, 2.0f, false},
				   .size = 2,
				   .timeout_ms = wait_ms,
				   .hold = true};
		struct skv_params p;
		struct skv_compact_desc d;
		struct skv_cache *kb = NULL;
		struct eng b;
		double sessions;

		params_mass(&p, TAU, 0.0f);
		m.params = p;
		snprintf(m.key, sizeof(m.key), "dies-%d", t);
		CU_ASSERT_EQUAL_FATAL(eng_open(&b, 95 + (uint64_t)t), 0);
		sessions = metric("snapkvd_sessions");
		/* a member process parked in its group, then killed: its
		 * session ends without a cancel (no close, no fence) */
		struct kid kid = spawn(&m);
		submitted(&kid);
		wait_parked(1);
		CU_ASSERT(metric_is("snapkvd_groups_parked_jobs", 1));
		kill(kid.pid, SIGKILL);
		collect(kid);
		CU_ASSERT(metric_is("snapkvd_sessions", sessions));
		desc_init(&d, &p, b.refs, m.key, 2, wait_ms);
		int rc = skv_client_compact(b.c, &d, &kb);
		printf("\n  trial %d: rc %d: %s", t, rc, rc ? skv_client_error(b.c) : "decided");
		CU_ASSERT(rc == -ECANCELED || rc == -ETIME);
		CU_ASSERT_PTR_NULL(kb);
		cancelled += rc == -ECANCELED;
		skv_cache_release(kb);
		eng_close(&b);
	}
	printf("\n  %d of 5 failed at the partner's arrival\n", cancelled);
	nothing_held("dead member");
}

/* Members must agree on the K/V dtype (snapkv.h): f32 and bf16 refused. */
static void test_bad_dtype(void)
{
	struct eng a, b;
	struct skv_params p;
	struct skv_compact_desc d;
	struct skv_layer_ref bf[LAYERS];
	struct skv_request *ra = NULL;
	struct skv_cache *ka = NULL;

	params_mass(&p, TAU, 0.0f);
	CU_ASSERT_EQUAL_FATAL(eng_open(&a, 71), 0);
	CU_ASSERT_EQUAL_FATAL(eng_open(&b, 72), 0);
	/* the emulated GPU takes seconds for the first member's first step */
	const uint32_t wait_ms = h_backend_cuda() ? 30000 : 1000;
	desc_init(&d, &p, a.refs, "dtypes", 2, wait_ms);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(a.c, &d, &ra), 0);
	/* the f32 one is first (its first step takes seconds on the CUDA emulator) */
	wait_parked(1);
	CU_ASSERT(metric_is("snapkvd_groups_parked_jobs", 1));
	/* the second member's K/V read as bf16 (half the bytes: in range) */
	for (uint32_t l = 0; l < LAYERS; l++) {
		bf[l] = b.refs[l];
		bf[l].k.dtype = bf[l].v.dtype = SKV_DTYPE_BF16;
	}
	desc_init(&d, &p, bf, "dtypes", 2, wait_ms);
	refused_desc(&b, &d, EINVAL, "dtype");
	/* the first member, alone, times out */
	CU_ASSERT_EQUAL(skv_request_wait(ra, 30000 + wait_ms, &ka), -ETIME);
	CU_ASSERT_PTR_NULL(ka);
	eng_close(&a);
	eng_close(&b);
	printf("\n");
	nothing_held("dtype");
}

/* ------------------------------------------------------------ visible */

/*
 * Two members in this process (two sessions, submit then wait): the caches
 * say group_size 2, the ledger and snapkvctl
 * caches/ledger (text and --json) show the group's key and size.
 */
static void test_visible(void)
{
	struct eng e[2];
	struct skv_request *rq[2] = {NULL};
	struct skv_cache *k[2] = {NULL};
	struct skv_compact_desc d;
	struct skv_params p;
	static const char *const text[] = {"group \"visible-1\" of 2", NULL};
	static const char *const json[] = {"\"group_key\": \"visible-1\"", "\"group_size\": 2",
					   NULL};

	params_mass(&p, TAU, 0.0f);
	for (int i = 0; i < 2; i++) {
		CU_ASSERT_EQUAL_FATAL(eng_open(&e[i], 90 + (uint64_t)i), 0);
		desc_init(&d, &p, e[i].refs, "visible-1", 2, 0);
		CU_ASSERT_EQUAL(skv_compact_submit(e[i].c, &d, &rq[i]), 0);
	}
	for (int i = 0; i < 2; i++) {
		struct skv_cache_budget cb = {.budget_size = sizeof(cb)};

		CU_ASSERT_EQUAL(rq[i] ? skv_request_wait(rq[i], 60000, &k[i]) : -1, 0);
		if (!k[i])
			continue;
		skv_cache_budget(k[i], &cb);
		CU_ASSERT_EQUAL(cb.group_size, 2);
		/* an older caller's struct ends before the group fields */
		cb = (struct skv_cache_budget){
		    .budget_size = offsetof(struct skv_cache_budget, group_size), .group_size = 77};
		CU_ASSERT_EQUAL(skv_cache_budget(k[i], &cb), 0);
		CU_ASSERT_EQUAL(cb.group_size, 77);
	}
	CU_ASSERT(h_ctl_shows(H.sock, "caches", text));
	CU_ASSERT(h_ctl_shows(H.sock, "ledger", text));
	CU_ASSERT(h_ctl_shows(H.sock, "caches --json", json));
	CU_ASSERT(h_ctl_shows(H.sock, "ledger --json", json));
	for (int i = 0; i < 2; i++) {
		skv_cache_release(k[i]);
		eng_close(&e[i]);
	}
	nothing_held("visible");
}

/* --backend cuda (SNAPKVD_TEST_BACKEND=cuda-emu): every test above runs
 * there too (the members' first steps and the group's choice on the GPU);
 * only a mass fallback threshold above tau is refused by name, at once,
 * nothing held (a member knows its mass at its own C* only). */
static void test_cuda_refused(void)
{
	struct skv_params p;
	struct eng e;

	CU_ASSERT_EQUAL_FATAL(eng_open(&e, 3), 0);
	params_mass(&p, TAU, TAU + 0.01f);
	refused(&e, &p, "k", 2, 0, EOPNOTSUPP, "fallback_below 0.61 above tau 0.6 (mass)");
	eng_close(&e);
	printf("\n");
	nothing_held("cuda");
}

int main(void)
{
	CU_pSuite s;
	CU_pTest t;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite(h_backend_cuda() ? "daemon-group-cuda" : "daemon-group", suite_init,
			 suite_clean);
	if (h_backend_cuda())
		CU_add_test(s, "cuda: a mass fallback above tau refused by name",
			    test_cuda_refused);
	CU_add_test(s, "a group of 2 engines: one C*, the largest own, = libskv at it",
		    test_group_of_2);
	CU_add_test(s, "a group of 4 engines: one C*, the largest own, = libskv at it",
		    test_group_of_4);
	CU_add_test(s, "one member falls back: every member keeps L", test_group_fallback);
	CU_add_test(s, "a member missing: every member times out, nothing kept",
		    test_group_timeout);
	CU_add_test(s, "a member's session ends: the others fail at once", test_session_ends);
	CU_add_test(s, "bad key, size, timeout, mode: refused naming it", test_bad_alone);
	CU_add_test(s, "members disagreeing on prompt_len, tau: refused naming it",
		    test_bad_mismatch);
	CU_add_test(s, "a third member for a group of 2: refused", test_bad_third_member);
	CU_add_test(s, "more than max_tenant_groups pending: refused", test_bad_tenant_groups);
	t = CU_add_test(s, "keys are per tenant: another uid's key forms its own group",
			test_bad_other_uid);
	if (geteuid() != 0)
		t_skip(s, t, "root", "not root (setuid needed)");
	CU_add_test(s, "a member dead before its partner arrives: never decided",
		    test_dead_member_arrival);
	CU_add_test(s, "members with f32 and bf16 K/V: refused naming the dtype", test_bad_dtype);
	CU_add_test(s, "group key and size in caches, ledger and the budget outcome", test_visible);
	return h_run_tests();
}
