// SPDX-License-Identifier: MIT
/* test-pressure (daemon/snapkvd-pressure.c): levels, hysteresis, action order, scaling, admission,
 * LRU eviction. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-pressure.c"

struct fake_clock {
	uint64_t now;
};

static uint64_t fake_now(void *opaque)
{
	return ((struct fake_clock *)opaque)->now;
}

static struct snapkvd_pressure *new_default(struct fake_clock *clk)
{
	struct snapkvd_pressure_config cfg;
	struct snapkvd_pressure *p = NULL;

	snapkvd_pressure_config_init(&cfg);
	CU_ASSERT_EQUAL_FATAL(snapkvd_pressure_new(&cfg, fake_now, clk, &p), 0);
	return p;
}

static void test_crossings_with_hysteresis(void)
{
	struct fake_clock clk = {.now = 1000};
	struct snapkvd_pressure *p = new_default(&clk);
	struct snapkvd_pressure_change ch;
	struct snapkvd_pressure_transition t;
	/* Pool of 1000 bytes: high 800/750, critical 950/900. */
	const struct {
		uint64_t used;
		int changed;
		enum snapkvd_pressure_level level;
	} steps[] = {
	    {0, 0, SNAPKVD_PRESSURE_NORMAL},	 {799, 0, SNAPKVD_PRESSURE_NORMAL},
	    {800, 1, SNAPKVD_PRESSURE_HIGH},	 {760, 0, SNAPKVD_PRESSURE_HIGH},
	    {750, 0, SNAPKVD_PRESSURE_HIGH},	 {749, 1, SNAPKVD_PRESSURE_NORMAL},
	    {790, 0, SNAPKVD_PRESSURE_NORMAL},	 {950, 1, SNAPKVD_PRESSURE_CRITICAL},
	    {949, 0, SNAPKVD_PRESSURE_CRITICAL}, {900, 0, SNAPKVD_PRESSURE_CRITICAL},
	    {899, 1, SNAPKVD_PRESSURE_HIGH},	 {949, 0, SNAPKVD_PRESSURE_HIGH},
	    {10, 1, SNAPKVD_PRESSURE_NORMAL},	 {1000, 1, SNAPKVD_PRESSURE_CRITICAL},
	    {700, 1, SNAPKVD_PRESSURE_NORMAL},
	};
	uint64_t changes = 0;

	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		enum snapkvd_pressure_level before = snapkvd_pressure_level(p);
		int r;

		clk.now = 1000 + i * 10;
		r = snapkvd_pressure_update(p, steps[i].used, 1000, &ch);
		CU_ASSERT_EQUAL(r, steps[i].changed);
		CU_ASSERT_EQUAL(snapkvd_pressure_level(p), steps[i].level);
		if (r == 1) {
			changes++;
			CU_ASSERT_EQUAL(ch.transition.prev, before);
			CU_ASSERT_EQUAL(ch.transition.level, steps[i].level);
			CU_ASSERT_EQUAL(ch.transition.used_bytes, steps[i].used);
			CU_ASSERT_EQUAL(ch.transition.total_bytes, 1000);
			CU_ASSERT_EQUAL(ch.transition.time_ns, 1000 + i * 10);
		}
	}
	CU_ASSERT_EQUAL(snapkvd_pressure_transitions_total(p), changes);
	CU_ASSERT_EQUAL(snapkvd_pressure_history_len(p), changes);
	/* Newest first: critical -> normal at step 14, normal -> critical at 13. */
	CU_ASSERT_EQUAL(snapkvd_pressure_history_get(p, 0, &t), 0);
	CU_ASSERT_EQUAL(t.prev, SNAPKVD_PRESSURE_CRITICAL);
	CU_ASSERT_EQUAL(t.level, SNAPKVD_PRESSURE_NORMAL);
	CU_ASSERT_EQUAL(t.time_ns, 1140);
	CU_ASSERT_EQUAL(snapkvd_pressure_history_get(p, 1, &t), 0);
	CU_ASSERT_EQUAL(t.level, SNAPKVD_PRESSURE_CRITICAL);
	CU_ASSERT_EQUAL(t.used_bytes, 1000);
	CU_ASSERT_EQUAL(snapkvd_pressure_history_get(p, changes, &t), -ENOENT);
	/* An empty pool is never under pressure. */
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 0, 0, NULL), 0);
	snapkvd_pressure_free(p);
}

static void test_byte_watermarks_and_history_wrap(void)
{
	struct fake_clock clk = {0};
	struct snapkvd_pressure_config cfg;
	struct snapkvd_pressure *p = NULL;
	struct snapkvd_pressure_transition t;

	snapkvd_pressure_config_init(&cfg);
	CU_ASSERT_EQUAL(snapkvd_watermark_parse("1MiB", &cfg.high_enter), 0);
	CU_ASSERT_EQUAL(snapkvd_watermark_parse("512K", &cfg.high_leave), 0);
	CU_ASSERT_EQUAL(snapkvd_watermark_parse("2M", &cfg.critical_enter), 0);
	CU_ASSERT_EQUAL(snapkvd_watermark_parse("1572864", &cfg.critical_leave), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_pressure_new(&cfg, fake_now, &clk, &p), 0);
	/* Byte marks do not move with the pool size. */
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, (1 << 20) - 1, 1ull << 40, NULL), 0);
	for (int i = 0; i < 40; i++) {
		clk.now = (uint64_t)i;
		CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 1 << 20, 1ull << 40, NULL), 1);
		CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 600 << 10, 1ull << 40, NULL), 0);
		CU_ASSERT_EQUAL(snapkvd_pressure_update(p, (512 << 10) - 1, 1ull << 40, NULL), 1);
	}
	CU_ASSERT_EQUAL(snapkvd_pressure_history_len(p), SNAPKVD_PRESSURE_HISTORY);
	CU_ASSERT_EQUAL(snapkvd_pressure_transitions_total(p), 80);
	CU_ASSERT_EQUAL(snapkvd_pressure_history_get(p, 0, &t), 0);
	CU_ASSERT_EQUAL(t.level, SNAPKVD_PRESSURE_NORMAL);
	CU_ASSERT_EQUAL(t.time_ns, 39);
	CU_ASSERT_EQUAL(snapkvd_pressure_history_get(p, SNAPKVD_PRESSURE_HISTORY - 1, &t), 0);
	CU_ASSERT_EQUAL(t.level, SNAPKVD_PRESSURE_HIGH);
	CU_ASSERT_EQUAL(t.time_ns, 32);
	snapkvd_pressure_free(p);
}

static void test_action_order(void)
{
	struct fake_clock clk = {0};
	struct snapkvd_pressure_config cfg;
	struct snapkvd_pressure *p = NULL;
	struct snapkvd_pressure_change ch;
	char buf[128];

	snapkvd_pressure_config_init(&cfg);
	CU_ASSERT_EQUAL(snapkvd_pressure_order_parse(" evict, notify ,refuse,hooks", &cfg), 0);
	CU_ASSERT_EQUAL(cfg.n_order, 4);
	snapkvd_pressure_order_format(&cfg, buf, sizeof(buf));
	CU_ASSERT_STRING_EQUAL(buf, "evict,notify,refuse,hooks");
	CU_ASSERT_EQUAL_FATAL(snapkvd_pressure_new(&cfg, fake_now, &clk, &p), 0);

	/* To critical: all four, in the configured order. */
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 960, 1000, &ch), 1);
	CU_ASSERT_EQUAL_FATAL(ch.n_actions, 4);
	CU_ASSERT_EQUAL(ch.actions[0], SNAPKVD_ACTION_EVICT);
	CU_ASSERT_EQUAL(ch.actions[1], SNAPKVD_ACTION_NOTIFY);
	CU_ASSERT_EQUAL(ch.actions[2], SNAPKVD_ACTION_REFUSE);
	CU_ASSERT_EQUAL(ch.actions[3], SNAPKVD_ACTION_HOOKS);
	/* Scale is not listed: budget suggestion stays the default C. */
	CU_ASSERT_EQUAL(ch.suggested_capacity, 2048);
	CU_ASSERT_EQUAL(ch.scale_permille, 1000);
	/* Evict down to strictly below high's leave mark (750). */
	CU_ASSERT_EQUAL(ch.evict_bytes, 960 - 750 + 1);
	/* To high: refuse no longer applies. */
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 800, 1000, &ch), 1);
	CU_ASSERT_EQUAL_FATAL(ch.n_actions, 3);
	CU_ASSERT_EQUAL(ch.actions[0], SNAPKVD_ACTION_EVICT);
	CU_ASSERT_EQUAL(ch.actions[1], SNAPKVD_ACTION_NOTIFY);
	CU_ASSERT_EQUAL(ch.actions[2], SNAPKVD_ACTION_HOOKS);
	/* Back to normal: only notifications. */
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 100, 1000, &ch), 1);
	CU_ASSERT_EQUAL_FATAL(ch.n_actions, 2);
	CU_ASSERT_EQUAL(ch.actions[0], SNAPKVD_ACTION_NOTIFY);
	CU_ASSERT_EQUAL(ch.actions[1], SNAPKVD_ACTION_HOOKS);
	CU_ASSERT_EQUAL(ch.evict_bytes, 0);
	snapkvd_pressure_free(p);

	/* Default order, and the suggested budget at each level. */
	p = new_default(&clk);
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 810, 1000, &ch), 1);
	CU_ASSERT_EQUAL_FATAL(ch.n_actions, 4);
	CU_ASSERT_EQUAL(ch.actions[0], SNAPKVD_ACTION_NOTIFY);
	CU_ASSERT_EQUAL(ch.actions[1], SNAPKVD_ACTION_HOOKS);
	CU_ASSERT_EQUAL(ch.actions[2], SNAPKVD_ACTION_SCALE);
	CU_ASSERT_EQUAL(ch.actions[3], SNAPKVD_ACTION_EVICT);
	CU_ASSERT_EQUAL(ch.suggested_capacity, 1024);
	CU_ASSERT_EQUAL(ch.scale_permille, 500);
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 990, 1000, &ch), 1);
	CU_ASSERT_EQUAL(ch.n_actions, 5);
	CU_ASSERT_EQUAL(ch.actions[4], SNAPKVD_ACTION_REFUSE);
	CU_ASSERT_EQUAL(ch.suggested_capacity, 512);
	CU_ASSERT_EQUAL(ch.scale_permille, 250);
	snapkvd_pressure_free(p);
}

static void test_scaling_floor(void)
{
	struct fake_clock clk = {0};
	struct snapkvd_pressure *p = new_default(&clk);
	int scaled = -1;

	/* Normal: untouched. */
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 2048, 32, &scaled), 2048);
	CU_ASSERT_EQUAL(scaled, 0);
	snapkvd_pressure_update(p, 800, 1000, NULL);
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 2048, 32, &scaled), 1024);
	CU_ASSERT_EQUAL(scaled, 1);
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 1001, 32, NULL), 500);
	/* 40 * 0.5 = 20 < W + 1 = 33: the floor wins. */
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 40, 32, &scaled), 33);
	CU_ASSERT_EQUAL(scaled, 1);
	/* Already at the floor: nothing to scale, and never grow. */
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 33, 32, &scaled), 33);
	CU_ASSERT_EQUAL(scaled, 0);
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 20, 32, &scaled), 20);
	CU_ASSERT_EQUAL(scaled, 0);
	snapkvd_pressure_update(p, 1000, 1000, NULL);
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 2048, 32, NULL), 512);
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 100, 32, NULL), 33);
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 0xffffffffu, 0xfffffffeu, NULL),
			0xffffffffu);
	snapkvd_pressure_free(p);
}

static void test_guaranteed_share(void)
{
	struct fake_clock clk = {0};
	struct snapkvd_pressure_config cfg;
	struct snapkvd_pressure *p = NULL;
	char msg[256] = "";

	snapkvd_pressure_config_init(&cfg);
	cfg.guaranteed_share = 0.10;
	CU_ASSERT_EQUAL_FATAL(snapkvd_pressure_new(&cfg, fake_now, &clk, &p), 0);
	/* Below critical everything is admitted, whatever the tenant holds. */
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 900, 100, 1000, -1, msg, sizeof(msg)), 0);
	snapkvd_pressure_update(p, 800, 1000, NULL);
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 900, 100, 1000, -1, msg, sizeof(msg)), 0);
	snapkvd_pressure_update(p, 960, 1000, NULL);
	CU_ASSERT_EQUAL(snapkvd_pressure_level(p), SNAPKVD_PRESSURE_CRITICAL);
	/* Within its guaranteed 100 bytes after the request: admitted. */
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 0, 100, 1000, -1, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 50, 50, 1000, -1, msg, sizeof(msg)), 0);
	/* One byte over: refused, and the message carries the numbers. */
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 50, 51, 1000, -1, msg, sizeof(msg)), -ENOSPC);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "51"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "100"));
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "critical"));
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 200, 1, 1000, -1, NULL, 0), -ENOSPC);
	/* Per-tenant share overrides the default; a zero share refuses all. */
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 200, 100, 1000, 0.5, NULL, 0), 0);
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 0, 1, 1000, 0.0, NULL, 0), -ENOSPC);
	/* Overflowing sums are refused, not wrapped. */
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, UINT64_MAX, 2, 1000, 1.0, NULL, 0), -ENOSPC);
	/* Back above critical's leave mark nothing changes; below it, admitted. */
	snapkvd_pressure_update(p, 901, 1000, NULL);
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 200, 1, 1000, -1, NULL, 0), -ENOSPC);
	snapkvd_pressure_update(p, 899, 1000, NULL);
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 200, 1, 1000, -1, NULL, 0), 0);
	snapkvd_pressure_free(p);

	/* Refusal disabled by the order: critical admits everything. */
	snapkvd_pressure_config_init(&cfg);
	CU_ASSERT_EQUAL(snapkvd_pressure_order_parse("notify,hooks", &cfg), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_pressure_new(&cfg, fake_now, &clk, &p), 0);
	snapkvd_pressure_update(p, 1000, 1000, NULL);
	CU_ASSERT_EQUAL(snapkvd_pressure_admit(p, 999, 999, 1000, -1, NULL, 0), 0);
	CU_ASSERT_EQUAL(snapkvd_pressure_scale_capacity(p, 2048, 32, NULL), 2048);
	CU_ASSERT_EQUAL(snapkvd_pressure_evict_need(p, 1000, 1000), 0);
	snapkvd_pressure_free(p);
}

static void test_eviction_order(void)
{
	struct fake_clock clk = {0};
	struct snapkvd_pressure *p = new_default(&clk);
	const struct snapkvd_evict_candidate c[] = {
	    {.id = 1, .bytes = 100, .last_use_ns = 50, .lingering = 1, .held = 0},
	    {.id = 2, .bytes = 100, .last_use_ns = 10, .lingering = 1, .held = 1}, /* held */
	    {.id = 3, .bytes = 100, .last_use_ns = 5, .lingering = 0, .held = 0},  /* live */
	    {.id = 4, .bytes = 100, .last_use_ns = 30, .lingering = 1, .held = 0},
	    {.id = 9, .bytes = 100, .last_use_ns = 20, .lingering = 1, .held = 0},
	    {.id = 7, .bytes = 100, .last_use_ns = 20, .lingering = 1, .held = 0},
	};
	size_t idx[8], n = 99;
	uint64_t bytes = 0;

	/* Oldest first, ties by id: 7 (20), 9 (20), 4 (30), 1 (50). */
	CU_ASSERT_EQUAL(snapkvd_pressure_pick_evictions(c, 6, 1000, idx, 8, &n, &bytes), 0);
	CU_ASSERT_EQUAL_FATAL(n, 4);
	CU_ASSERT_EQUAL(c[idx[0]].id, 7);
	CU_ASSERT_EQUAL(c[idx[1]].id, 9);
	CU_ASSERT_EQUAL(c[idx[2]].id, 4);
	CU_ASSERT_EQUAL(c[idx[3]].id, 1);
	CU_ASSERT_EQUAL(bytes, 400);
	/* Only as many as needed. */
	CU_ASSERT_EQUAL(snapkvd_pressure_pick_evictions(c, 6, 150, idx, 8, &n, &bytes), 0);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_EQUAL(bytes, 200);
	CU_ASSERT_EQUAL(snapkvd_pressure_pick_evictions(c, 6, 1000, idx, 1, &n, &bytes), 0);
	CU_ASSERT_EQUAL(n, 1);
	CU_ASSERT_EQUAL(c[idx[0]].id, 7);
	CU_ASSERT_EQUAL(snapkvd_pressure_pick_evictions(c, 6, 0, idx, 8, &n, &bytes), 0);
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_EQUAL(snapkvd_pressure_pick_evictions(NULL, 3, 10, idx, 8, &n, NULL), -EINVAL);
	/* Need follows the level: nothing at normal, down below high's leave above. */
	CU_ASSERT_EQUAL(snapkvd_pressure_evict_need(p, 900, 1000), 0);
	snapkvd_pressure_update(p, 900, 1000, NULL);
	CU_ASSERT_EQUAL(snapkvd_pressure_evict_need(p, 900, 1000), 151);
	snapkvd_pressure_free(p);
}

static void test_parsing_and_config(void)
{
	struct snapkvd_pressure_config cfg;
	struct snapkvd_watermark wm;
	enum snapkvd_pressure_level lv;
	char msg[128], buf[64];

	CU_ASSERT_EQUAL(snapkvd_watermark_parse("80%", &wm), 0);
	CU_ASSERT_DOUBLE_EQUAL(wm.fraction, 0.8, 1e-12);
	CU_ASSERT_EQUAL(wm.bytes, 0);
	CU_ASSERT_EQUAL(snapkvd_watermark_bytes(&wm, 1000), 800);
	CU_ASSERT_EQUAL(snapkvd_watermark_bytes(&wm, 1001), 801);
	snapkvd_watermark_format(&wm, buf, sizeof(buf));
	CU_ASSERT_STRING_EQUAL(buf, "80%");
	CU_ASSERT_EQUAL(snapkvd_watermark_parse("0.95", &wm), 0);
	CU_ASSERT_EQUAL(snapkvd_watermark_bytes(&wm, 1ull << 30), 1020054733ull);
	CU_ASSERT_EQUAL(snapkvd_watermark_parse("12GiB", &wm), 0);
	CU_ASSERT_EQUAL(wm.bytes, 12ull << 30);
	CU_ASSERT_EQUAL(snapkvd_watermark_bytes(&wm, 5), 12ull << 30);
	const char *bad[] = {"",    "%",   "0%",   "101%", "1.5",
			     "0.0", "-3",  "12X",  "12GG", "99999999999999999999",
			     "0",   "abc", "80 %", "1e3"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CU_ASSERT_EQUAL(snapkvd_watermark_parse(bad[i], &wm), -EINVAL);

	CU_ASSERT_EQUAL(snapkvd_pressure_level_parse("HIGH", &lv), 0);
	CU_ASSERT_EQUAL(lv, SNAPKVD_PRESSURE_HIGH);
	CU_ASSERT_EQUAL(snapkvd_pressure_level_parse("panic", &lv), -EINVAL);
	CU_ASSERT_STRING_EQUAL(snapkvd_pressure_level_name(SNAPKVD_PRESSURE_CRITICAL), "critical");

	snapkvd_pressure_config_init(&cfg);
	CU_ASSERT_EQUAL(snapkvd_pressure_config_check(&cfg, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL(snapkvd_pressure_order_parse("notify,notify", &cfg), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_pressure_order_parse("notify,", &cfg), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_pressure_order_parse("notify,panic", &cfg), -EINVAL);
	CU_ASSERT_EQUAL(cfg.n_order, 5); /* untouched on failure */
	CU_ASSERT_EQUAL(snapkvd_pressure_order_parse("", &cfg), 0);
	CU_ASSERT_EQUAL(cfg.n_order, 0);

	snapkvd_pressure_config_init(&cfg);
	cfg.high_leave.fraction = 0.85; /* leave above enter */
	CU_ASSERT_EQUAL(snapkvd_pressure_config_check(&cfg, msg, sizeof(msg)), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(msg, "leave"));
	snapkvd_pressure_config_init(&cfg);
	cfg.critical_enter.fraction = 0.7; /* critical below high */
	CU_ASSERT_EQUAL(snapkvd_pressure_config_check(&cfg, msg, sizeof(msg)), -EINVAL);
	snapkvd_pressure_config_init(&cfg);
	cfg.scale_high = 0;
	CU_ASSERT_EQUAL(snapkvd_pressure_config_check(&cfg, msg, sizeof(msg)), -EINVAL);
	snapkvd_pressure_config_init(&cfg);
	cfg.guaranteed_share = 1.5;
	CU_ASSERT_EQUAL(snapkvd_pressure_config_check(&cfg, msg, sizeof(msg)), -EINVAL);
	snapkvd_pressure_config_init(&cfg);
	cfg.default_capacity = 32;
	CU_ASSERT_EQUAL(snapkvd_pressure_config_check(&cfg, msg, sizeof(msg)), -EINVAL);
}

static void test_runtime_reconfig(void)
{
	struct fake_clock clk = {0};
	struct snapkvd_pressure *p = new_default(&clk);
	struct snapkvd_pressure_config cfg = *snapkvd_pressure_get_config(p);
	char msg[128];

	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 600, 1000, NULL), 0);
	CU_ASSERT_EQUAL(snapkvd_watermark_parse("50%", &cfg.high_enter), 0);
	CU_ASSERT_EQUAL(snapkvd_watermark_parse("40%", &cfg.high_leave), 0);
	CU_ASSERT_EQUAL(snapkvd_pressure_set_config(p, &cfg, msg, sizeof(msg)), 0);
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 600, 1000, NULL), 1);
	CU_ASSERT_EQUAL(snapkvd_pressure_level(p), SNAPKVD_PRESSURE_HIGH);
	/* A bad config is refused and the old one stays. */
	cfg.high_leave.fraction = 0.9;
	CU_ASSERT_EQUAL(snapkvd_pressure_set_config(p, &cfg, msg, sizeof(msg)), -EINVAL);
	CU_ASSERT_DOUBLE_EQUAL(snapkvd_pressure_get_config(p)->high_leave.fraction, 0.4, 1e-12);
	CU_ASSERT_EQUAL(snapkvd_pressure_update(p, 399, 1000, NULL), 1);
	snapkvd_pressure_free(p);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("pressure", NULL, NULL);
	CU_add_test(s, "crossings with hysteresis", test_crossings_with_hysteresis);
	CU_add_test(s, "byte watermarks, history wrap", test_byte_watermarks_and_history_wrap);
	CU_add_test(s, "action order", test_action_order);
	CU_add_test(s, "scaling floor", test_scaling_floor);
	CU_add_test(s, "guaranteed share at critical", test_guaranteed_share);
	CU_add_test(s, "eviction order", test_eviction_order);
	CU_add_test(s, "parsing and config checks", test_parsing_and_config);
	CU_add_test(s, "runtime reconfiguration", test_runtime_reconfig);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
