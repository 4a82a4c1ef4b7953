// SPDX-License-Identifier: MIT
/*
 * test-ops-daemon: the pressure policy through a real snapkvd: watermark
 * crossings up and down, PRESSURE events on the engines' rings, budget
 * scaling in the result, LRU eviction of caches released with linger (held
 * ones untouched), refusal at critical and the guaranteed share, pressure
 * settings changed at run time, hooks (environment, ledger snapshot, failing
 * and hanging ones), the metrics textfile, and eight engine processes
 * racing for the last bytes of a tenant quota.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pwd.h>
#include <sys/stat.h>

#include "client/snapkvctl/ctl-prom.h"
#include "daemon-harness.h"
#include "skv.h"
#include "snapkv.h"

static struct harness H;
static char tmp[64], cfg_path[128], hooks_log[128], prom_path[128];

/* One layer, one head: the region of a cache is known from C alone. */
#define P_D 64
#define P_L 256
#define P_W 8
#define P_C 128

struct engine {
	struct skv_client *c;
	struct skv_buffer *b;
	struct skv_layer_ref lr;
	struct skv_compact_desc d;
};

/* No CUnit asserts here: also used from the suite's set-up. */
static int write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");

	if (!f)
		return -1;
	fputs(text, f);
	fclose(f);
	return chmod(path, mode);
}

static int engine_open(struct engine *e, const char *name)
{
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = name};
	size_t q = (size_t)P_W * P_D * 4, kv = (size_t)P_L * P_D * 4;
	uint64_t seed = 7;
	float *f;

	memset(e, 0, sizeof(*e));
	if (skv_client_connect(H.sock, &o, &e->c) < 0)
		return -1;
	if (skv_buffer_alloc(e->c, q + 2 * kv, &e->b) < 0)
		return -1;
	f = skv_buffer_data(e->b);
	for (size_t i = 0; i < (q + 2 * kv) / 4; i++)
		f[i] = h_rand(&seed);
	e->lr.q = (struct skv_tensor_ref){e->b, 0, SKV_DTYPE_F32, (int64_t)P_W * P_D, P_D, 0, 0};
	e->lr.k = (struct skv_tensor_ref){e->b, q, SKV_DTYPE_F32, (int64_t)P_L * P_D, P_D, 0, 0};
	e->lr.v =
	    (struct skv_tensor_ref){e->b, q + kv, SKV_DTYPE_F32, (int64_t)P_L * P_D, P_D, 0, 0};
	e->d.desc_size = sizeof(e->d);
	e->d.shape =
	    (struct skv_shape){.prompt_len = P_L, .head_dim = P_D, .h_q = 1, .h_kv = 1, .n_q = P_W};
	e->d.layers = 1;
	skv_client_params_init(&e->d.params);
	e->d.params.window = P_W;
	e->d.params.capacity = P_C;
	e->d.layer = &e->lr;
	return 0;
}

static void engine_close(struct engine *e)
{
	skv_buffer_free(e->b);
	skv_client_close(e->c);
}

static Snapkv__V1__AdminReply *admin_req(Snapkv__V1__AdminRequest *ar)
{
	return h_admin_req(H.sock, "test-ops", ar);
}

static int level_now(void)
{
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__AdminReply *r;
	int lv = -1;

	ar.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE;
	r = admin_req(&ar);
	if (r && r->pressure)
		lv = r->pressure->level;
	if (r)
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return lv;
}

static int set_share(const char *share, char *err, size_t errlen)
{
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__PressureSettings ps = SNAPKV__V1__PRESSURE_SETTINGS__INIT;
	Snapkv__V1__AdminReply *r;
	int st;

	ps.guaranteed_share = (char *)share;
	ar.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET;
	ar.pressure = &ps;
	r = admin_req(&ar);
	if (!r)
		return -EIO;
	st = r->status;
	snprintf(err, errlen, "%s", r->error ? r->error : "");
	snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return st;
}

/* The critical watermark and its leave mark, at run time. 0 or the status. */
static int set_critical(const char *critical, const char *leave)
{
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__PressureSettings ps = SNAPKV__V1__PRESSURE_SETTINGS__INIT;
	Snapkv__V1__AdminReply *r;
	int st;

	ps.critical = (char *)critical;
	ps.critical_leave = (char *)leave;
	ar.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_PRESSURE_SET;
	ar.pressure = &ps;
	r = admin_req(&ar);
	if (!r)
		return -EIO;
	st = r->status;
	snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return st;
}

/* Is the cache with this id still in the daemon's ledger? */
static int cache_listed(uint64_t id, int *ret_lingering)
{
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__AdminReply *r;
	int found = 0;

	ar.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER;
	r = admin_req(&ar);
	for (size_t i = 0; r && i < r->n_caches; i++)
		if (r->caches[i]->id == id) {
			found = 1;
			if (ret_lingering)
				*ret_lingering = r->caches[i]->lingering;
		}
	if (r)
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return found;
}

/* Wait for the engine to see a PRESSURE event with this level. */
static int wait_event(struct engine *e, uint32_t level, struct skv_pressure *ret)
{
	for (int i = 0; i < 300; i++) {
		if (skv_client_pressure(e->c, ret) == 0 && ret->level == level)
			return 0;
		h_sleep_ms(10);
	}
	return -1;
}

static double metric_label(const char *name, const char *lname, const char *lvalue)
{
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__AdminReply *r;
	struct ctl_prom p;
	double v = NAN;

	ar.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS;
	r = admin_req(&ar);
	if (r && r->text && ctl_prom_parse(r->text, strlen(r->text), &p, NULL) == 0) {
		v = ctl_prom_get(&p, name, lname, lvalue);
		ctl_prom_free(&p);
	}
	if (r)
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return v;
}

static double metric(const char *name)
{
	Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
	Snapkv__V1__AdminReply *r;
	struct ctl_prom p;
	double v = NAN;

	ar.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS;
	r = admin_req(&ar);
	if (r && r->text && ctl_prom_parse(r->text, strlen(r->text), &p, NULL) == 0) {
		v = ctl_prom_get(&p, name, NULL, NULL);
		ctl_prom_free(&p);
	}
	if (r)
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return v;
}

static int ctl_exists(void)
{
	char p[256];

	snprintf(p, sizeof(p), "%s/snapkvctl", getenv("BUILD") ? getenv("BUILD") : "build");
	return access(p, X_OK) == 0;
}

/* Run snapkvctl with args against our daemon; its stdout into out. */
static int run_ctl(const char *args, char *out, size_t len)
{
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	char cmd[512];
	size_t n;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "%s/snapkvctl %s --socket %s", build, args, H.sock);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	n = fread(out, 1, len - 1, p);
	out[n] = '\0';
	return pclose(p) == 0 ? 0 : -1;
}

static int suite_init(void)
{
	char conf[2048], path[160];
	const char *argv[] = {"--config", cfg_path, NULL};

	snprintf(tmp, sizeof(tmp), "/tmp/snapkvd-ops-XXXXXX");
	if (!mkdtemp(tmp))
		return -1;
	snprintf(cfg_path, sizeof(cfg_path), "%s/snapkvd.conf", tmp);
	snprintf(hooks_log, sizeof(hooks_log), "%s/hooks.log", tmp);
	snprintf(prom_path, sizeof(prom_path), "%s/snapkvd.prom", tmp);
	snprintf(path, sizeof(path), "%s/hooks", tmp);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/hooks/10-record", tmp);
	snprintf(conf, sizeof(conf),
		 "#!/bin/sh\n"
		 "grep -q '\"pool\"' \"$SNAPKV_LEDGER_JSON\" && j=json || j=nojson\n"
		 "cp \"$SNAPKV_LEDGER_JSON\" \"%s/snap-$SNAPKV_PREV_LEVEL-$SNAPKV_LEVEL.tmp\" &&\n"
		 "  mv \"%s/snap-$SNAPKV_PREV_LEVEL-$SNAPKV_LEVEL.tmp\" "
		 "\"%s/snap-$SNAPKV_PREV_LEVEL-$SNAPKV_LEVEL.json\"\n"
		 "echo \"$SNAPKV_EVENT $SNAPKV_PREV_LEVEL>$SNAPKV_LEVEL $SNAPKV_POOL_USED_BYTES "
		 "$SNAPKV_POOL_TOTAL_BYTES $j\" >> '%s'\n",
		 tmp, tmp, tmp, hooks_log);
	write_file(path, conf, 0755);
	snprintf(path, sizeof(path), "%s/hooks/20-fail", tmp);
	write_file(path, "#!/bin/sh\necho failing on purpose\nexit 3\n", 0755);
	snprintf(path, sizeof(path), "%s/hooks/30-hang", tmp);
	write_file(path, "#!/bin/sh\nexec sleep 60\n", 0755);
	snprintf(path, sizeof(path), "%s/hooks/40-not-executable", tmp);
	write_file(path, "#!/bin/sh\necho never >> /dev/null\n", 0644);
	snprintf(conf, sizeof(conf),
		 "pool_bytes = 1M\n"
		 "session_arena_bytes = 1M\n"
		 "pressure_high = 50%%\n"
		 "pressure_high_leave = 40%%\n"
		 "pressure_critical = 75%%\n"
		 "pressure_critical_leave = 65%%\n"
		 "pressure_actions = notify,hooks,scale,evict,refuse\n"
		 "hook_dir = %s/hooks\n"
		 "hook_timeout_ms = 1000\n"
		 "hook_ledger_json = %s/ledger.json\n"
		 "hook_ledger_max_caches = 3\n"
		 "metrics_textfile = %s\n"
		 "metrics_interval_s = 1\n",
		 tmp, tmp, prom_path);
	write_file(cfg_path, conf, 0644);
	return h_start(&H, argv) == 0 ? 0 : -1;
}

static int suite_clean(void)
{
	char cmd[160];
	int st = h_stop(&H);

	h_cleanup(&H);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		st = -1;
	return st == 0 ? 0 : -1;
}

#define MAXC 64

/* Drop what may differ between two ledgers taken at different moments of a
 * quiet daemon: the sessions of each tenant (snapkvctl's own, engines that
 * came and went). */
static void drop_sessions(json_t *ledger)
{
	size_t i;
	json_t *t;

	json_array_foreach(json_object_get(ledger, "tenants"), i, t) json_object_del(t, "sessions");
}

/*
 * The snapshot the hooks get is the ledger of `snapkvctl ledger --json`
 * (every key of that schema, the same values), plus "pressure". A change
 * made by traffic can come while an admission is in flight; this one is
 * made on a quiet daemon at critical, by moving the critical watermark above
 * the pool (critical -> high) and back, so nothing changes but sessions
 * between the snapshot and snapkvctl's answer.
 */
static void check_hook_snapshot(void)
{
	char path[160], *out = malloc(1 << 18);
	json_t *snap = NULL, *ctl = NULL, *pr;
	json_error_t je;
	const char *key;
	json_t *v;

	CU_ASSERT_PTR_NOT_NULL_FATAL(out);
	/* the first critical -> high of the run: no hook of an earlier change
	 * (however late it runs) writes this file */
	snprintf(path, sizeof(path), "%s/snap-critical-high.json", tmp);
	CU_ASSERT_EQUAL(access(path, F_OK), -1);
	CU_ASSERT_EQUAL_FATAL(set_critical("95%", "85%"), 0);
	for (int i = 0; i < 500 && access(path, F_OK) != 0; i++)
		h_sleep_ms(10);
	CU_ASSERT_EQUAL(level_now(), SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_HIGH);
	snap = json_load_file(path, 0, &je);
	CU_ASSERT_PTR_NOT_NULL(snap);
	CU_ASSERT_EQUAL(run_ctl("ledger --json", out, 1 << 18), 0);
	ctl = json_loads(out, 0, &je);
	CU_ASSERT_PTR_NOT_NULL(ctl);
	if (!snap || !ctl)
		goto out;
	pr = json_object_get(snap, "pressure");
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(pr, "level")), "high");
	json_object_del(snap, "pressure");
	/* the extended schema, not only issue 3's keys */
	v = json_array_get(json_object_get(snap, "caches"), 0);
	json_object_foreach(json_array_get(json_object_get(ctl, "caches"), 0), key, pr)
	    CU_ASSERT_PTR_NOT_NULL(json_object_get(v, key));
	CU_ASSERT_PTR_NOT_NULL(json_object_get(v, "engine"));
	CU_ASSERT_PTR_NOT_NULL(json_object_get(v, "arena_transport"));
	CU_ASSERT_PTR_NOT_NULL(json_object_get(json_object_get(v, "bytes"), "padding"));
	CU_ASSERT_PTR_NOT_NULL(json_object_get(json_object_get(snap, "pool"), "free_bytes"));
	CU_ASSERT_PTR_NOT_NULL(
	    json_object_get(json_array_get(json_object_get(snap, "tenants"), 0), "quota_bytes"));
	drop_sessions(snap);
	drop_sessions(ctl);
	/* hook_ledger_max_caches = 3: the three of lowest id, totals over all,
	 * and the snapshot says how many it left out */
	{
		json_t *cc = json_object_get(ctl, "caches");
		size_t total = json_array_size(cc);

		CU_ASSERT(total > 3);
		CU_ASSERT_EQUAL(json_array_size(json_object_get(snap, "caches")), 3);
		CU_ASSERT_EQUAL(json_integer_value(json_object_get(snap, "caches_listed")), 3);
		CU_ASSERT_EQUAL(json_integer_value(json_object_get(snap, "caches_total")),
				(json_int_t)total);
		json_object_del(snap, "caches_listed");
		json_object_del(snap, "caches_total");
		while (json_array_size(cc) > 3)
			json_array_remove(cc, json_array_size(cc) - 1);
	}
	CU_ASSERT(json_equal(snap, ctl));
	if (!json_equal(snap, ctl)) {
		char *a = json_dumps(snap, JSON_INDENT(1)), *b = json_dumps(ctl, JSON_INDENT(1));

		fprintf(stderr, "\nhook snapshot:\n%s\nsnapkvctl ledger --json:\n%s\n", a, b);
		free(a);
		free(b);
	}
out:
	json_decref(snap);
	json_decref(ctl);
	free(out);
	/* back to critical for what follows */
	CU_ASSERT_EQUAL(set_critical("75%", "65%"), 0);
	for (int i = 0;
	     i < 500 && level_now() != SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_CRITICAL; i++)
		h_sleep_ms(10);
	CU_ASSERT_EQUAL(level_now(), SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_CRITICAL);
}

static void test_pressure_policy(void)
{
	struct engine e, kept;
	struct skv_cache *k[MAXC] = {0}, *x = NULL;
	uint64_t id[MAXC] = {0};
	int n = 0, lingering_from = 0;
	long long R, used, high, leave;
	struct skv_pressure ev;
	const struct skv_cache_info *ci;
	char err[256];
	int r, lg = 0;

	CU_ASSERT_EQUAL_FATAL(engine_open(&e, "pressure"), 0);
	/* One cache tells the region size R of a C=128 cache. */
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &k[n]), 0);
	id[n] = skv_cache_info(k[n])->id;
	n++;
	R = h_pool_used(H.sock);
	CU_ASSERT_FATAL(R > 0 && R < (1 << 20) / 10);
	/* Another session's released region keeps its pages for that session's
	 * next compaction: outside the pool, until pressure reaches high. */
	CU_ASSERT_EQUAL_FATAL(engine_open(&kept, "kept"), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(kept.c, &kept.d, &x), 0);
	CU_ASSERT_EQUAL(skv_cache_release(x), 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, R, 2000), 0);
	/* the pages written (not the decode headroom never touched) */
	CU_ASSERT(metric("snapkvd_arena_cached_bytes") > 0 &&
		  metric("snapkvd_arena_cached_bytes") <= (double)R);
	high = (1 << 20) / 2;
	leave = (long long)ceil((1 << 20) * 0.40);
	/* Fill up to just below high: still normal, nothing scaled. */
	while ((n + 1) * R < high) {
		CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &k[n]), 0);
		CU_ASSERT_EQUAL(skv_cache_info(k[n])->budget_scaled, 0);
		id[n] = skv_cache_info(k[n])->id;
		n++;
	}
	CU_ASSERT_EQUAL(level_now(), SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_NORMAL);
	CU_ASSERT_FATAL(n >= 4);
	/* The three oldest are released with linger: still counted. */
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(skv_cache_release_linger(k[i]), 0);
		k[i] = NULL;
	}
	lingering_from = 0;
	CU_ASSERT_EQUAL(h_pool_used(H.sock), n * R);
	CU_ASSERT(cache_listed(id[0], &lg) && lg);
	/* One more crosses high: eviction frees lingering caches, oldest first,
	 * until the pool is below high's leave mark. */
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &k[n]), 0);
	id[n] = skv_cache_info(k[n])->id;
	n++;
	{
		long long need = n * R - leave + 1;
		int evict = (int)((need + R - 1) / R);

		if (evict > 3)
			evict = 3;
		used = (n - evict) * R;
		CU_ASSERT_EQUAL(h_wait_pool(H.sock, used, 2000), 0);
		for (int i = 0; i < 3; i++)
			CU_ASSERT_EQUAL(cache_listed(id[i], NULL), i >= evict);
		/* Held caches are never touched. */
		for (int i = 3; i < n; i++)
			CU_ASSERT(cache_listed(id[i], &lg) && !lg);
		lingering_from = evict;
		/* The engine saw high, then the level the eviction left. */
		CU_ASSERT_EQUAL(wait_event(&e, used < leave ? 1 : 2, &ev), 0);
		CU_ASSERT(ev.events >= 1);
	}
	/* Keep going until high holds. */
	for (int guard = 0; level_now() != SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_HIGH;
	     guard++) {
		CU_ASSERT_FATAL(guard < 20 && n < MAXC);
		CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &k[n]), 0);
		id[n] = skv_cache_info(k[n])->id;
		n++;
	}
	for (int i = lingering_from; i < 3; i++)
		CU_ASSERT_EQUAL(cache_listed(id[i], NULL), 0);	  /* all evicted by now */
	CU_ASSERT_EQUAL(metric("snapkvd_arena_cached_bytes"), 0); /* given back at high */
	engine_close(&kept);
	CU_ASSERT_EQUAL(wait_event(&e, 2, &ev), 0);
	CU_ASSERT_EQUAL(ev.suggested_capacity, 1024); /* default C 2048 x 0.5 */
	CU_ASSERT_EQUAL(ev.scale_permille, 500);
	/* At high the budget of new requests is halved, and the result says so. */
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &k[n]), 0);
	ci = skv_cache_info(k[n]);
	CU_ASSERT_EQUAL(ci->budget_scaled, 1);
	CU_ASSERT_EQUAL(ci->budget, P_C / 2);
	CU_ASSERT_EQUAL(ci->requested_budget, P_C);
	CU_ASSERT_EQUAL(ci->pressure, 2);
	id[n] = ci->id;
	n++;
	/* On to critical: then new compactions are refused with ENOSPC. */
	for (;;) {
		CU_ASSERT_FATAL(n < MAXC);
		r = skv_client_compact(e.c, &e.d, &k[n]);
		if (r < 0)
			break;
		id[n] = skv_cache_info(k[n])->id;
		n++;
	}
	CU_ASSERT_EQUAL(r, -ENOSPC);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(e.c), "critical"));
	CU_ASSERT_EQUAL(level_now(), SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_CRITICAL);
	CU_ASSERT_EQUAL(wait_event(&e, 3, &ev), 0);
	/* An engine that connects now learns the level at once. */
	{
		struct engine late;

		CU_ASSERT_EQUAL_FATAL(engine_open(&late, "late"), 0);
		CU_ASSERT_EQUAL(wait_event(&late, 3, &ev), 0);
		CU_ASSERT_EQUAL(ev.events, 1);
		CU_ASSERT_EQUAL(ev.suggested_capacity, 512);
		CU_ASSERT_EQUAL(ev.scale_permille, 250);
		engine_close(&late);
	}
	/* What an operator sees now (once snapkvctl is built). */
	if (ctl_exists()) {
		char out[8192];

		CU_ASSERT_EQUAL(run_ctl("pressure", out, sizeof(out)), 0);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "level             critical\n"));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "high     -> critical"));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "normal   -> high"));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "suggested C now 512"));
		CU_ASSERT_EQUAL(run_ctl("top --once", out, sizeof(out)), 0);
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "snapkvd  pressure critical  sessions "));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "p50 "));
		CU_ASSERT_PTR_NULL(strstr(out, "p50 -"));
		CU_ASSERT_PTR_NOT_NULL(strstr(out, "<= 1     ["));
	}
	/* The hooks' ledger snapshot is snapkvctl's ledger. */
	if (ctl_exists())
		check_hook_snapshot();
	/* A tenant within its guaranteed share is still admitted (C x 0.25). */
	CU_ASSERT_EQUAL(set_share("100%", err, sizeof(err)), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &k[n]), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k[n])->budget, P_C / 4);
	n++;
	CU_ASSERT_EQUAL(set_share("0", err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(skv_client_compact(e.c, &e.d, &k[n]), -ENOSPC);
	CU_ASSERT_EQUAL(set_share("150%", err, sizeof(err)), -EINVAL);
	CU_ASSERT(strlen(err) > 0);
	CU_ASSERT(metric("snapkvd_pressure_refusals_total") >= 2);
	/* Real vs padded: the caches' arena regions are exactly the pool in use
	 * (nothing reserved now), and at least the ledger's compact + index. */
	{
		double alloc = metric_label("snapkvd_cache_bytes", "kind", "allocated");
		double real = metric_label("snapkvd_cache_bytes", "kind", "compact") +
			      metric_label("snapkvd_cache_bytes", "kind", "index");

		CU_ASSERT_EQUAL(alloc, (double)h_pool_used(H.sock));
		CU_ASSERT(real > 0 && alloc >= real);
	}
	/* Everything released: back to normal, and the engine hears it. */
	for (int i = 0; i < n; i++)
		if (k[i])
			CU_ASSERT_EQUAL(skv_cache_release(k[i]), 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 2000), 0);
	/* down only after the level's minimum dwell (pressure_min_dwell_ms, 1 s) */
	for (int i = 0; i < 50 && level_now() != SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_NORMAL;
	     i++)
		h_sleep_ms(100);
	CU_ASSERT_EQUAL(level_now(), SNAPKV__V1__PRESSURE_LEVEL__PRESSURE_LEVEL_NORMAL);
	CU_ASSERT_EQUAL(wait_event(&e, 1, &ev), 0);
	engine_close(&e);
}

static void test_hooks_and_textfile(void)
{
	static char buf[1 << 16];
	FILE *f;
	size_t len;
	int ok = 0;

	/* Hooks ran on every change, with the event in their environment. */
	for (int i = 0; i < 300 && !ok; i++) {
		f = fopen(hooks_log, "r");
		if (f) {
			len = fread(buf, 1, sizeof(buf) - 1, f);
			buf[len] = '\0';
			fclose(f);
			ok = strstr(buf, "critical>") != NULL;
		}
		if (!ok)
			h_sleep_ms(10);
	}
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "pressure normal>high "));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, "pressure high>critical "));
	CU_ASSERT_PTR_NOT_NULL(strstr(buf, " 1048576 json\n"));
	CU_ASSERT_PTR_NULL(strstr(buf, "nojson"));
	/* The failing and the hanging hook were counted, and killed in time:
	 * the daemon kept serving all along. */
	for (int i = 0; i < 600 && metric("snapkvd_hooks_timed_out_total") < 1; i++)
		h_sleep_ms(10);
	CU_ASSERT(metric("snapkvd_hooks_timed_out_total") >= 1);
	CU_ASSERT(metric("snapkvd_hooks_failed_total") >= 2);
	CU_ASSERT(metric("snapkvd_pressure_transitions_total") >= 4);
	/* The textfile is rewritten on the timer and parses. */
	for (int i = 0; i < 300; i++) {
		struct ctl_prom p;

		f = fopen(prom_path, "r");
		if (f) {
			len = fread(buf, 1, sizeof(buf) - 1, f);
			fclose(f);
			if (ctl_prom_parse(buf, len, &p, NULL) == 0) {
				double t = ctl_prom_get(&p, "snapkvd_pressure_transitions_total",
							NULL, NULL);

				ctl_prom_free(&p);
				if (t >= 4) {
					ok = 2;
					break;
				}
			}
		}
		h_sleep_ms(10);
	}
	CU_ASSERT_EQUAL(ok, 2);
}

/* Eight engine processes race for the last bytes of one tenant's quota. */
static void test_quota_race(void)
{
	struct engine e;
	struct skv_cache *k = NULL;
	long long R;
	char conf[4300], buf[4096];
	int fds[8][2], go[2], total = 0;
	pid_t pids[8];
	FILE *f;
	size_t len;

	/* Region of one cache, then a quota of 5.5 of them for this uid. */
	CU_ASSERT_EQUAL_FATAL(engine_open(&e, "probe"), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &k), 0);
	R = h_pool_used(H.sock);
	skv_cache_release(k);
	engine_close(&e);
	CU_ASSERT_EQUAL_FATAL(h_wait_pool(H.sock, 0, 2000), 0);
	f = fopen(cfg_path, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	len = fread(buf, 1, sizeof(buf) - 1, f);
	buf[len] = '\0';
	fclose(f);
	snprintf(conf, sizeof(conf), "%stenant_quota = %u:%lld\n", buf, (unsigned)getuid(),
		 5 * R + R / 2);
	CU_ASSERT_EQUAL_FATAL(write_file(cfg_path, conf, 0644), 0);
	kill(H.pid, SIGHUP);
	for (int i = 0; i < 300; i++) {
		Snapkv__V1__AdminRequest ar = SNAPKV__V1__ADMIN_REQUEST__INIT;
		Snapkv__V1__AdminReply *rep;
		struct ctl_prom p;
		int have = 0;

		ar.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS;
		rep = admin_req(&ar);
		if (rep && rep->text &&
		    ctl_prom_parse(rep->text, strlen(rep->text), &p, NULL) == 0) {
			for (size_t j = 0; j < p.n; j++)
				if (!strcmp(p.s[j].name, "snapkvd_tenant_quota_bytes") &&
				    p.s[j].value == (double)(5 * R + R / 2))
					have = 1;
			ctl_prom_free(&p);
		}
		if (rep)
			snapkv__v1__admin_reply__free_unpacked(rep, NULL);
		if (have)
			break;
		CU_ASSERT_FATAL(i < 299);
		h_sleep_ms(10);
	}
	CU_ASSERT_EQUAL_FATAL(pipe(go), 0);
	for (int i = 0; i < 8; i++) {
		CU_ASSERT_EQUAL_FATAL(pipe(fds[i]), 0);
		pids[i] = fork();
		if (pids[i] == 0) {
			struct skv_cache *mine[16];
			int got = 0, r = 0;
			char c;

			close(go[1]);
			if (engine_open(&e, "racer") < 0)
				_exit(100);
			/* all start together */
			if (read(go[0], &c, 1) != 0)
				_exit(101);
			while (got < 16 && (r = skv_client_compact(e.c, &e.d, &mine[got])) == 0)
				got++;
			/* -EDQUOT with the numbers, nothing else */
			if (r != -EDQUOT || !strstr(skv_client_error(e.c), "over quota"))
				_exit(102);
			c = (char)got;
			if (write(fds[i][1], &c, 1) != 1)
				_exit(103);
			/* hold the caches until the parent has counted */
			h_sleep_ms(60000);
			_exit(0);
		}
		close(fds[i][1]);
	}
	close(go[0]);
	h_sleep_ms(200); /* let every engine connect and register */
	close(go[1]);
	for (int i = 0; i < 8; i++) {
		char c = 0;

		CU_ASSERT_EQUAL(read(fds[i][0], &c, 1), 1);
		total += c;
		close(fds[i][0]);
	}
	/* Exactly five fit: never a sixth, and no half-used last slot. */
	CU_ASSERT_EQUAL(total, 5);
	CU_ASSERT_EQUAL(h_pool_used(H.sock), 5 * R);
	CU_ASSERT(metric("snapkvd_pool_used_bytes") <= 5 * R + R / 2);
	for (int i = 0; i < 8; i++) {
		int st = 0;

		kill(pids[i], SIGKILL);
		waitpid(pids[i], &st, 0);
		CU_ASSERT(WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) == 0));
	}
	/* Killed engines give everything back. */
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 3000), 0);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("ops-daemon", suite_init, suite_clean);
	CU_add_test(s, "pressure: crossings, events, scaling, eviction, refusal",
		    test_pressure_policy);
	CU_add_test(s, "hooks and metrics textfile", test_hooks_and_textfile);
	CU_add_test(s, "8 engines race for a tenant quota", test_quota_race);
	return h_run_tests();
}
