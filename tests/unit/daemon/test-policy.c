// SPDX-License-Identifier: MIT
/* test-policy (daemon/snapkvd-policy.c): actions run in the configured order through the daemon's
 * callbacks; hooks, eviction, textfile. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#include "daemon/snapkvd-policy.c"

static char tmpdir[200];

struct fake {
	struct snapkvd_policy *ops;
	char trace[1024];
	char logs[8192];
	struct snapkvd_hook *watched[16];
	int n_watched;
	int refuse_watch;
	uint64_t evict_frees; /* bytes each evict call frees */
	uint64_t used, total;
	uint64_t fake_now;
};

static struct fake F;

static void tr(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tr(const char *fmt, ...)
{
	va_list ap;
	size_t n = strlen(F.trace);

	va_start(ap, fmt);
	vsnprintf(F.trace + n, sizeof(F.trace) - n, fmt, ap);
	va_end(ap);
}

static void cb_notify(void *o, const struct snapkvd_pressure_change *ch)
{
	(void)o;
	tr("notify:%s:%u ", snapkvd_pressure_level_name(ch->transition.level),
	   ch->suggested_capacity);
}

static uint64_t cb_evict(void *o, uint64_t need, uint64_t *ret_caches)
{
	uint64_t freed = F.evict_frees;

	(void)o;
	tr("evict:%llu ", (unsigned long long)need);
	if (freed > F.used)
		freed = F.used;
	F.used -= freed;
	F.evict_frees = 0; /* one cache only */
	*ret_caches = freed ? 1 : 0;
	if (freed) /* the daemon reports the pool change from inside */
		snapkvd_policy_pool_changed(F.ops, F.used, F.total);
	return freed;
}

static char *cb_ledger(void *o)
{
	(void)o;
	return strdup("{\"pool\":{\"used_bytes\":42}}");
}

static int cb_watch(void *o, struct snapkvd_hook *h)
{
	(void)o;
	tr("hook ");
	if (F.refuse_watch)
		return -EBADF;
	F.watched[F.n_watched++] = h;
	return 0;
}

static char *cb_metrics(void *o)
{
	(void)o;
	return strdup("# HELP x y\n# TYPE x gauge\nx 1\n");
}

static void cb_log(void *o, int level, const char *msg)
{
	size_t n = strlen(F.logs);

	(void)o;
	snprintf(F.logs + n, sizeof(F.logs) - n, "<%d>%s\n", level, msg);
}

static uint64_t fake_clock(void *o)
{
	(void)o;
	return F.fake_now;
}

static const struct snapkvd_policy_cb CB = {
    .notify = cb_notify,
    .evict = cb_evict,
    .ledger_json = cb_ledger,
    .watch_hook = cb_watch,
    .metrics_text = cb_metrics,
    .log = cb_log,
};

static void write_hook(const char *name, const char *body, mode_t mode)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/hooks/%s", tmpdir, name);
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs(body, f);
	fclose(f);
	chmod(path, mode);
}

static void setup(struct snapkvd_policy *ops, struct snapkvd_policy_config *c, const char *order)
{
	char cmd[600];

	memset(&F, 0, sizeof(F));
	F.ops = ops;
	F.total = 1000;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s/hooks' && mkdir '%s/hooks'", tmpdir, tmpdir);
	CU_ASSERT_EQUAL(system(cmd), 0);
	snapkvd_policy_config_init(c);
	snprintf(c->hook_dir, sizeof(c->hook_dir), "%s/hooks", tmpdir);
	snprintf(c->hook_ledger_json, sizeof(c->hook_ledger_json), "%s/ledger.json", tmpdir);
	c->hooks.timeout_ms = 20000;
	if (order)
		CU_ASSERT_EQUAL(snapkvd_policy_config_set(c, "pressure_actions", order, NULL), 0);
}

static void wait_all(struct snapkvd_policy *ops)
{
	for (int i = 0; i < F.n_watched; i++) {
		CU_ASSERT_EQUAL(snapkvd_hook_wait(F.watched[i], NULL), 0);
		CU_ASSERT_EQUAL(snapkvd_policy_hook_exited(ops, F.watched[i]), 0);
	}
	F.n_watched = 0;
}

static void test_order_and_reentrant_eviction(void)
{
	struct snapkvd_policy ops;
	struct snapkvd_policy_config c;

	setup(&ops, &c, "evict,notify,hooks,scale,refuse");
	write_hook("10-level",
		   "#!/bin/sh\necho \"$SNAPKV_PREV_LEVEL->$SNAPKV_LEVEL "
		   "$(cat \"$SNAPKV_LEDGER_JSON\")\"\n",
		   0755);
	CU_ASSERT_EQUAL_FATAL(snapkvd_policy_init(&ops, &c, &CB, fake_clock, NULL), 0);

	F.used = 700;
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, F.used, F.total), 0);
	CU_ASSERT_STRING_EQUAL(F.trace, "");

	/* Up to critical; eviction frees 300 bytes from inside, which takes
	 * the pool to 660: the loop re-evaluates and falls back to normal. */
	F.used = 960;
	F.evict_frees = 300;
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, F.used, F.total), 1);
	CU_ASSERT_STRING_EQUAL(F.trace,
			       "evict:211 notify:critical:512 hook notify:normal:2048 hook ");
	CU_ASSERT_EQUAL(snapkvd_pressure_level(ops.pressure), SNAPKVD_PRESSURE_NORMAL);
	CU_ASSERT_EQUAL(ops.evictions, 1);
	CU_ASSERT_EQUAL(ops.evicted_bytes, 300);
	CU_ASSERT_EQUAL(ops.hooks_started, 2);
	CU_ASSERT_EQUAL(ops.n_hooks, 2);
	wait_all(&ops);
	CU_ASSERT_EQUAL(ops.n_hooks, 0);
	CU_ASSERT_EQUAL(ops.hooks_failed, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "normal->critical {\"pool\":{\"used_bytes\":42}}"));
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "critical->normal {\"pool\""));
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "pressure normal -> critical: pool 960 of 1000"));

	/* High with nothing to evict: evict asked, then the rest in order. */
	F.trace[0] = '\0';
	F.used = 850;
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, F.used, F.total), 1);
	CU_ASSERT_STRING_EQUAL(F.trace, "evict:101 notify:high:1024 hook ");
	wait_all(&ops);
	/* Still high: every later pool change keeps evicting what lingers. */
	F.trace[0] = '\0';
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 860, F.total), 0);
	CU_ASSERT_STRING_EQUAL(F.trace, "evict:111 ");
	/* Nothing moved: the loop may call every round, nothing is scanned. */
	F.trace[0] = '\0';
	for (int i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 860, F.total), 0);
	CU_ASSERT_STRING_EQUAL(F.trace, "");
	/* A cache starts lingering: looked at again. */
	snapkvd_policy_mark_dirty(&ops);
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 860, F.total), 0);
	CU_ASSERT_STRING_EQUAL(F.trace, "evict:111 ");
	snapkvd_policy_fini(&ops);
}

static uint64_t cb_level(void *o, enum snapkvd_pressure_level level)
{
	(void)o;
	tr("level:%s ", snapkvd_pressure_level_name(level));
	return level >= SNAPKVD_PRESSURE_HIGH ? 4096 : 0;
}

/* Every change of level reaches the daemon's arenas first (they give back
 * their cached pages at high and critical), whatever the action order. */
static void test_level_callback(void)
{
	struct snapkvd_policy ops;
	struct snapkvd_policy_config c;
	struct snapkvd_policy_cb cb = CB;

	cb.level = cb_level;
	setup(&ops, &c, "notify"); /* no scale: the suggested C stays 2048 */
	CU_ASSERT_EQUAL_FATAL(snapkvd_policy_init(&ops, &c, &cb, fake_clock, NULL), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 700, 1000), 0);
	CU_ASSERT_STRING_EQUAL(F.trace, "");
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 850, 1000), 1);
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 960, 1000), 1);
	CU_ASSERT_STRING_EQUAL(F.trace,
			       "level:high notify:high:2048 level:critical notify:critical:2048 ");
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "4096 cached arena bytes given back"));
	F.trace[0] = '\0';
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 100, 1000), 1);
	CU_ASSERT_STRING_EQUAL(F.trace, "level:normal notify:normal:2048 ");
	snapkvd_policy_fini(&ops);
}

static void test_hook_failures_and_timeout(void)
{
	struct snapkvd_policy ops;
	struct snapkvd_policy_config c;
	struct snapkvd_stats st = {0};
	struct snapkvd_policy_snapshot snap;
	siginfo_t si;

	setup(&ops, &c, "hooks");
	c.hooks.timeout_ms = 100;
	write_hook("10-fail", "#!/bin/sh\necho bad >&2\nexit 7\n", 0755);
	write_hook("20-hang", "#!/bin/sh\nexec sleep 300\n", 0755);
	write_hook("30-off", "#!/bin/sh\necho never\n", 0644);
	CU_ASSERT_EQUAL_FATAL(snapkvd_policy_init(&ops, &c, &CB, fake_clock, NULL), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 800, 1000), 1);
	CU_ASSERT_EQUAL_FATAL(F.n_watched, 2);
	/* The failing one exits by itself; its pidfd event is not processed
	 * yet when the timer fires: that is no timeout. */
	while (waitid(P_PIDFD, (id_t)snapkvd_hook_pidfd(F.watched[0]), &si, WEXITED | WNOWAIT) <
		   0 &&
	       errno == EINTR)
		;
	/* The loop's timer: past the deadline the hanging one is killed. */
	{
		struct timespec ts;
		uint64_t now;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
		snapkvd_policy_tick(&ops, now + 1000000000ull);
	}
	wait_all(&ops);
	CU_ASSERT_EQUAL(ops.hooks_started, 2);
	CU_ASSERT_EQUAL(ops.hooks_failed, 2);
	CU_ASSERT_EQUAL(ops.hooks_timed_out, 1);
	if (ops.hooks_timed_out != 1)
		fprintf(stderr, "timed_out %llu logs:\n%s", (unsigned long long)ops.hooks_timed_out,
			F.logs);
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "pressure hook 10-fail exited 7 after"));
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, ": bad"));
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(F.logs, "pressure hook 20-hang timed out, killed by signal 9"));
	CU_ASSERT_PTR_NULL(strstr(F.logs, "30-off"));

	/* A hook the loop cannot watch is killed at once and counted. */
	F.refuse_watch = 1;
	CU_ASSERT_EQUAL(snapkvd_policy_pool_changed(&ops, 10, 1000), 1);
	CU_ASSERT_EQUAL(ops.n_hooks, 0);
	CU_ASSERT_EQUAL(ops.hooks_failed, 4);

	snapkvd_policy_fill_stats(&ops, &st, &snap);
	CU_ASSERT_EQUAL(st.pressure_level, 0);
	CU_ASSERT_EQUAL(st.pressure_transitions_total, 2);
	CU_ASSERT_EQUAL(st.hooks_started_total, 2);
	CU_ASSERT_EQUAL(st.hooks_failed_total, 4);
	CU_ASSERT_EQUAL(st.hooks_timed_out_total, 1);
	snapkvd_policy_fini(&ops);
}

static void test_admission_scaling_stats(void)
{
	struct snapkvd_policy ops;
	struct snapkvd_policy_config c;
	struct snapkvd_stats st = {0};
	struct snapkvd_policy_snapshot snap;
	const float mass[] = {0.5f, 0.97f, 0.97f, NAN};
	char msg[256];
	int scaled;

	setup(&ops, &c, NULL);
	c.hook_dir[0] = '\0'; /* no hooks */
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_guaranteed_share", "10%", NULL), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "tenant_quota", "1001:500:30%", NULL), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_policy_init(&ops, &c, &CB, fake_clock, NULL), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_tenant_quota(&ops, 1001), 500);
	CU_ASSERT_EQUAL(snapkvd_policy_tenant_quota(&ops, 1000), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_scale_capacity(&ops, 2048, 32, &scaled), 2048);
	CU_ASSERT_EQUAL(scaled, 0);
	snapkvd_policy_pool_changed(&ops, 990, 1000);
	CU_ASSERT_EQUAL(snapkvd_policy_scale_capacity(&ops, 2048, 32, &scaled), 512);
	CU_ASSERT_EQUAL(scaled, 1);
	/* Default share 10% = 100 bytes; uid 1001 has 30% = 300. */
	CU_ASSERT_EQUAL(snapkvd_policy_admit(&ops, 1000, 50, 50, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_admit(&ops, 1000, 50, 51, msg, sizeof(msg)), -ENOSPC);
	CU_ASSERT_EQUAL(snapkvd_policy_admit(&ops, 1001, 250, 50, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_admit(&ops, 1001, 250, 51, msg, sizeof(msg)), -ENOSPC);
	snapkvd_policy_observe_compaction(&ops, 0.004, mass, 4);
	snapkvd_policy_count_error(&ops, -EINVAL);
	snapkvd_policy_count_error(&ops, -EINVAL);
	snapkvd_policy_count_error(&ops, EDQUOT);
	snapkvd_policy_count_error(&ops, -100000); /* out of range: ignored */
	snapkvd_policy_fill_stats(&ops, &st, &snap);
	CU_ASSERT_EQUAL_FATAL(st.n_errors, 2);
	CU_ASSERT_STRING_EQUAL(st.errors[0].code, "EINVAL");
	CU_ASSERT_EQUAL(st.errors[0].count, 2);
	CU_ASSERT_STRING_EQUAL(st.errors[1].code, "EDQUOT");
	CU_ASSERT_EQUAL(st.errors[1].count, 1);
	CU_ASSERT_EQUAL(st.refusals_total, 2);
	CU_ASSERT_EQUAL(st.compactions_scaled_total, 1);
	CU_ASSERT_EQUAL(st.pressure_level, 2);
	CU_ASSERT_EQUAL(snap.seconds.count, 1);
	CU_ASSERT_EQUAL(snap.mass.count, 3); /* NaN ignored */
	CU_ASSERT_PTR_EQUAL(st.retained_mass, &snap.mass);
	snapkvd_policy_fini(&ops);
}

static void test_textfile_tick(void)
{
	struct snapkvd_policy ops;
	struct snapkvd_policy_config c;
	char path[300], buf[128] = "";
	FILE *f;

	setup(&ops, &c, NULL);
	snprintf(path, sizeof(path), "%s/snapkvd.prom", tmpdir);
	snprintf(c.metrics_textfile, sizeof(c.metrics_textfile), "%s", path);
	c.metrics_interval_s = 10;
	CU_ASSERT_EQUAL_FATAL(snapkvd_policy_init(&ops, &c, &CB, fake_clock, NULL), 0);
	snapkvd_policy_tick(&ops, 5000000000ull);
	f = fopen(path, "r");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT(fread(buf, 1, sizeof(buf) - 1, f) > 0);
	fclose(f);
	CU_ASSERT_STRING_EQUAL(buf, "# HELP x y\n# TYPE x gauge\nx 1\n");
	/* Not due again before the interval. */
	unlink(path);
	snapkvd_policy_tick(&ops, 14000000000ull);
	CU_ASSERT_EQUAL(access(path, F_OK), -1);
	snapkvd_policy_tick(&ops, 15000000000ull);
	CU_ASSERT_EQUAL(access(path, F_OK), 0);
	unlink(path);
	snapkvd_policy_fini(&ops);
}

static unsigned count(const char *hay, const char *needle)
{
	unsigned n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

/* A textfile that cannot be written: said once, then every 10 minutes while
 * it fails, and once when it works again; written on every interval. */
static void test_textfile_failure_rate_limited(void)
{
	struct snapkvd_policy ops;
	struct snapkvd_policy_config c;
	char dir[300];
	uint64_t t = 0;

	setup(&ops, &c, NULL);
	F.logs[0] = 0;
	snprintf(dir, sizeof(dir), "%s/textdir", tmpdir);
	snprintf(c.metrics_textfile, sizeof(c.metrics_textfile), "%s/snapkvd.prom", dir);
	c.metrics_interval_s = 15;
	CU_ASSERT_EQUAL_FATAL(snapkvd_policy_init(&ops, &c, &CB, fake_clock, NULL), 0);
	for (int i = 0; i < 40; i++, t += 15000000000ull) /* 10 minutes of failures */
		snapkvd_policy_tick(&ops, t);
	CU_ASSERT_EQUAL(count(F.logs, "<4>metrics textfile"), 1);
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "No such file or directory (1 failed writes"));
	snapkvd_policy_tick(&ops, t);
	CU_ASSERT_EQUAL(count(F.logs, "<4>metrics textfile"), 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "(41 failed writes"));
	CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0755), 0);
	snapkvd_policy_tick(&ops, t += 15000000000ull);
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "<5>metrics textfile"));
	CU_ASSERT_PTR_NOT_NULL(strstr(F.logs, "written again after 41 failed writes"));
	CU_ASSERT_EQUAL(access(c.metrics_textfile, F_OK), 0);
	unlink(c.metrics_textfile);
	rmdir(dir);
	snapkvd_policy_fini(&ops);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;
	char cmd[300];

	snprintf(tmpdir, sizeof(tmpdir), "%s/snapkvd-ops-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmpdir))
		return 2;
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("ops-runtime", NULL, NULL);
	CU_add_test(s, "actions in order, re-entrant eviction", test_order_and_reentrant_eviction);
	CU_add_test(s, "a change of level reaches the arenas", test_level_callback);
	CU_add_test(s, "failing, hanging and unwatchable hooks", test_hook_failures_and_timeout);
	CU_add_test(s, "admission, scaling and stats", test_admission_scaling_stats);
	CU_add_test(s, "metrics textfile on the timer", test_textfile_tick);
	CU_add_test(s, "a failing textfile warns once per 10 minutes",
		    test_textfile_failure_rate_limited);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fails++;
	return fails ? 1 : 0;
}
