// SPDX-License-Identifier: MIT
/* test-ops-config: every ops config key, its bounds, and the cross-key check. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <string.h>

#include "daemon/snapkvd-config.h"

static void test_keys(void)
{
	struct snapkvd_policy_config c;
	const struct snapkvd_tenant_quota *q;
	struct skv_error err;

	snapkvd_policy_config_init(&c);
	CU_ASSERT_EQUAL(c.metrics_interval_s, 15);
	CU_ASSERT_EQUAL(c.hooks.timeout_ms, 5000);
	CU_ASSERT_EQUAL(c.pressure.n_order, 5);
	CU_ASSERT_EQUAL(snapkvd_policy_config_check(&c, &err), 0);

	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_high", "70%", &err), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_high_leave", "0.6", &err), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_critical", "3G", &err), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_critical_leave", "2GiB", &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(c.pressure.high_enter.fraction, 0.70, 1e-12);
	CU_ASSERT_DOUBLE_EQUAL(c.pressure.high_leave.fraction, 0.60, 1e-12);
	CU_ASSERT_EQUAL(c.pressure.critical_enter.bytes, 3ull << 30);
	CU_ASSERT_EQUAL(c.pressure.critical_leave.bytes, 2ull << 30);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_actions", "hooks,refuse", &err), 0);
	CU_ASSERT_EQUAL(c.pressure.n_order, 2);
	CU_ASSERT_EQUAL(c.pressure.order[0], SNAPKVD_ACTION_HOOKS);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_scale_high", "60%", &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(c.pressure.scale_high, 0.6, 1e-12);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_scale_critical", "0.3", &err), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_guaranteed_share", "5%", &err), 0);
	CU_ASSERT_DOUBLE_EQUAL(c.pressure.guaranteed_share, 0.05, 1e-12);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "hook_dir", "/etc/snapkvd/hooks.d", &err), 0);
	CU_ASSERT_STRING_EQUAL(c.hook_dir, "/etc/snapkvd/hooks.d");
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "hook_timeout_ms", "250", &err), 0);
	CU_ASSERT_EQUAL(c.hooks.timeout_ms, 250);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "hook_max", "4", &err), 0);
	CU_ASSERT_EQUAL(c.hooks.max_hooks, 4);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "hook_max_output", "4K", &err), 0);
	CU_ASSERT_EQUAL(c.hooks.max_output, 4096);
	CU_ASSERT_EQUAL(
	    snapkvd_policy_config_set(&c, "hook_ledger_json", "/run/snapkvd/ledger.json", &err), 0);
	CU_ASSERT_EQUAL(
	    snapkvd_policy_config_set(&c, "metrics_textfile", "/var/lib/prom/snapkvd.prom", &err),
	    0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "metrics_interval_s", "5", &err), 0);
	CU_ASSERT_EQUAL(c.metrics_interval_s, 5);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "tenant_quota", "1000:2G", &err), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "tenant_quota", "1001:512M:25%", &err), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "tenant_quota", "1000:1G:0.1", &err), 0);
	CU_ASSERT_EQUAL(c.n_quotas, 2);
	q = snapkvd_policy_config_quota(&c, 1000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	CU_ASSERT_EQUAL(q->quota_bytes, 1ull << 30);
	CU_ASSERT_DOUBLE_EQUAL(q->guaranteed_share, 0.1, 1e-12);
	q = snapkvd_policy_config_quota(&c, 1001);
	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	CU_ASSERT_EQUAL(q->quota_bytes, 512ull << 20);
	CU_ASSERT_DOUBLE_EQUAL(q->guaranteed_share, 0.25, 1e-12);
	CU_ASSERT_PTR_NULL(snapkvd_policy_config_quota(&c, 1002));
	CU_ASSERT_EQUAL(snapkvd_policy_config_check(&c, &err), 0);
}

static void test_bad_values(void)
{
	struct snapkvd_policy_config c;
	struct skv_error err;
	const char *bad[][2] = {
	    {"pressure_high", "120%"},
	    {"pressure_high", "high"},
	    {"pressure_actions", "notify,notify"},
	    {"pressure_scale_high", "1.5"},
	    {"pressure_guaranteed_share", "-1%"},
	    {"hook_dir", "relative/dir"},
	    {"hook_timeout_ms", "0"},
	    {"hook_timeout_ms", "10s"},
	    {"hook_max", "100000"},
	    {"hook_max_output", "2G"},
	    {"metrics_interval_s", "0"},
	    {"tenant_quota", "1000"},
	    {"tenant_quota", "alice:1G"},
	    {"tenant_quota", "1000:1G:200%"},
	    {"tenant_quota", "1000:1G:1:2"},
	    {"tenant_quota", "1000:lots"},
	};

	snapkvd_policy_config_init(&c);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err.msg[0] = '\0';
		CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, bad[i][0], bad[i][1], &err), -EINVAL);
		CU_ASSERT(strlen(err.msg) > 0);
	}
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pool_bytes", "1G", &err), -ENOENT);
	/* Per-key values fine, the combination not: leave above enter. */
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "pressure_high_leave", "85%", &err), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_check(&c, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "leave"));
	/* Too many tenants. */
	snapkvd_policy_config_init(&c);
	for (int i = 0; i < SNAPKVD_POLICY_MAX_TENANT_QUOTAS; i++) {
		char v[32];

		snprintf(v, sizeof(v), "%d:1M", 2000 + i);
		CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "tenant_quota", v, &err), 0);
	}
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c, "tenant_quota", "9:1M", &err), -EINVAL);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("ops-config", NULL, NULL);
	CU_add_test(s, "every key", test_keys);
	CU_add_test(s, "bad values and limits", test_bad_values);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
