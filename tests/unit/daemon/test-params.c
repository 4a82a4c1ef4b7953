// SPDX-License-Identifier: MIT
/*
 * test-params: a CompactRequest's parameters (daemon/snapkvd-params.c)
 * with a fake device and a fake pressure level: Params fields taken as
 * sent when flagged explicit (0 included) and defaulted otherwise, the
 * protected ranges' count, the budget mode's fields and list length, the
 * decision group's key, size, wait and mode (each refusal naming its
 * field or limit), a ragged mode refusing NHD, and C with a mode's own
 * budgets scaled under pressure, never below what the policy keeps.
 */
#include <CUnit/Basic.h>
#include <string.h>

#include "daemon/snapkvd-params.c"
#include "tests/test-skip.h"

/* ------------------------------------------------------------- the fakes */

static bool fake_gpu;
static double fake_scale = 1.0; /* the pressure level's factor */

bool snapkvd_device_present(const struct snapkvd_device *d)
{
	(void)d;
	return fake_gpu;
}

const char *snapkvd_device_backend(const struct snapkvd_device *d)
{
	(void)d;
	return fake_gpu ? "cuda" : "host";
}

/* the level is the fake's: fake_scale */
uint32_t snapkvd_pressure_scale_capacity_at(const struct snapkvd_pressure *p,
					    enum snapkvd_pressure_level level, uint32_t capacity,
					    uint32_t window, int *ret_scaled)
{
	uint32_t c = (uint32_t)(capacity * fake_scale);

	(void)p, (void)level;
	c = c > window ? c : window + 1;
	*ret_scaled = c < capacity;
	return c < capacity ? c : capacity;
}

/* --------------------------------------------------------------- tests */

static void test_read(void)
{
	Snapkv__V1__Params p = SNAPKV__V1__PARAMS__INIT;
	Snapkv__V1__Range r0 = SNAPKV__V1__RANGE__INIT, *ranges[SKV_MAX_PROTECTED + 1];
	struct skv_params out, def;
	char err[128] = "";

	skv_params_init(&def);
	CU_ASSERT_EQUAL(snapkvd_params_read(NULL, &out, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(out.window, def.window);
	/* 0 unflagged: the default; 0 flagged: taken as sent */
	p.sinks = 0;
	p.window = 16;
	CU_ASSERT_EQUAL(snapkvd_params_read(&p, &out, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(out.window, 16);
	CU_ASSERT_EQUAL(out.sinks, def.sinks);
	p.explicit_fields = SKV_PARAMS_EXPLICIT(7);
	CU_ASSERT_EQUAL(snapkvd_params_read(&p, &out, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(out.sinks, 0);
	/* span (field 300): absent is 0 (top-k), sent is taken for skv_plan() to judge */
	CU_ASSERT_EQUAL(out.span, 0);
	p.span = 3;
	CU_ASSERT_EQUAL(snapkvd_params_read(&p, &out, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(out.span, 3);
	p.span = 0;
	/* protected ranges: present, and at most SKV_MAX_PROTECTED */
	r0.begin = 2;
	r0.end = 5;
	for (int i = 0; i <= SKV_MAX_PROTECTED; i++)
		ranges[i] = &r0;
	p.protected_ranges = ranges;
	p.n_protected_ranges = 1;
	CU_ASSERT_EQUAL(snapkvd_params_read(&p, &out, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(out.n_protected, 1);
	CU_ASSERT_EQUAL(out.protected_ranges[0].end, 5);
	p.n_protected_ranges = SKV_MAX_PROTECTED + 1;
	CU_ASSERT_EQUAL(snapkvd_params_read(&p, &out, err, sizeof(err)), -E2BIG);
	ranges[0] = NULL;
	p.n_protected_ranges = 1;
	CU_ASSERT_EQUAL(snapkvd_params_read(&p, &out, err, sizeof(err)), -EINVAL);
}

static void test_budget(void)
{
	Snapkv__V1__CompactRequest req = SNAPKV__V1__COMPACT_REQUEST__INIT;
	uint32_t caps[SKV_MAX_LAYER_CAPS + 1] = {20, 30};
	struct skv_params p;
	char err[128] = "";

	skv_params_init(&p);
	CU_ASSERT_EQUAL(snapkvd_params_read_budget(&req, &p, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(p.budget_mode, SKV_BUDGET_UNIFORM); /* older senders */
	CU_ASSERT_FALSE(snapkvd_params_budgeted(&p));
	req.budget_mode = SNAPKV__V1__BUDGET_MODE__BUDGET_MODE_MASS_HEADS + 1;
	CU_ASSERT_EQUAL(snapkvd_params_read_budget(&req, &p, err, sizeof(err)), -EINVAL);
	CU_ASSERT(strstr(err, "unknown budget mode") != NULL);
	req.budget_mode = SNAPKV__V1__BUDGET_MODE__BUDGET_MODE_LAYERS;
	req.layer_caps = caps;
	req.n_layer_caps = SKV_MAX_LAYER_CAPS + 1;
	CU_ASSERT_EQUAL(snapkvd_params_read_budget(&req, &p, err, sizeof(err)), -E2BIG);
	req.n_layer_caps = 2;
	req.tau = 0.9f;
	CU_ASSERT_EQUAL(snapkvd_params_read_budget(&req, &p, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(p.budget_mode, SKV_BUDGET_LAYERS);
	CU_ASSERT_EQUAL(p.n_layer_caps, 2);
	CU_ASSERT_EQUAL(p.layer_caps[1], 30);
	CU_ASSERT_TRUE(snapkvd_params_budgeted(&p));
	/* uniform with a fallback is budgeted too */
	skv_params_init(&p);
	p.fallback_below = 0.5f;
	CU_ASSERT_TRUE(snapkvd_params_budgeted(&p));
}

static void test_group(void)
{
	Snapkv__V1__CompactRequest req = SNAPKV__V1__COMPACT_REQUEST__INIT;
	struct snapkvd_config cfg;
	struct snapkvd_request_env env = {.cfg = &cfg};
	struct snapkvd_job j;
	char err[160] = "", key[SNAPKVD_GROUP_KEY_MAX + 2];

	memset(&cfg, 0, sizeof(cfg)); /* the three keys read here */
	cfg.max_group_size = 64;
	cfg.group_timeout_ms = 10000;
	cfg.max_group_timeout_ms = 600000;
	memset(&j, 0, sizeof(j));
	skv_params_init(&j.params);
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(j.gm.size, 0); /* no group */
	req.group_size = 2;
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "a decision group needs a group_key and a group_size above 0");
	memset(key, 'k', sizeof(key) - 1);
	key[sizeof(key) - 1] = 0;
	req.group_key = key;
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "group_key of 65 bytes, at most 64");
	req.group_key = "tp\x01";
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "group_key byte 2 is not printable ASCII");
	req.group_key = "tp";
	req.group_size = cfg.max_group_size + 1;
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), -EINVAL);
	CU_ASSERT(strstr(err, "(max_group_size)") != NULL);
	req.group_size = 2;
	req.group_timeout_ms = cfg.max_group_timeout_ms + 1;
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), -EINVAL);
	CU_ASSERT(strstr(err, "(max_group_timeout_ms)") != NULL);
	req.group_timeout_ms = 0;
	j.params.budget_mode = SKV_BUDGET_MASS_HEADS;
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), -EINVAL);
	CU_ASSERT(strstr(err, "cannot be decided in a group") != NULL);
	/* on the CUDA backend a mass group's fallback above tau is refused,
	 * at or below tau taken */
	j.params.budget_mode = SKV_BUDGET_MASS;
	j.params.tau = 0.9f;
	j.params.fallback_below = 0.95f;
	fake_gpu = true;
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), -EOPNOTSUPP);
	CU_ASSERT(strstr(err, "fallback_below") != NULL);
	CU_ASSERT_EQUAL(j.gm.size, 0);
	j.params.fallback_below = 0.9f;
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), 0);
	snapkvd_group_member_clear(&j.gm);
	memset(&j.gm, 0, sizeof(j.gm));
	fake_gpu = false;
	j.params.fallback_below = 0;
	CU_ASSERT_EQUAL(j.gm.size, 0); /* nothing taken on a refusal */
	CU_ASSERT_EQUAL(snapkvd_params_read_group(&env, &req, &j, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(j.gm.key, "tp");
	CU_ASSERT_EQUAL(j.gm.size, 2);
	CU_ASSERT_EQUAL(j.gm.timeout_ms, cfg.group_timeout_ms); /* 0: the default wait */
}

/* A ragged mode stores row blocks: NHD is refused, HND sized by the
 * largest per-layer budget. */
static void test_check_budget(void)
{
	Snapkv__V1__CompactRequest req = SNAPKV__V1__COMPACT_REQUEST__INIT;
	struct snapkvd_job j;
	struct skv_plan plan = {0};
	char err[160] = "";

	memset(&j, 0, sizeof(j));
	j.layers = 2;
	j.shape =
	    (struct skv_shape){.prompt_len = 100, .h_q = 4, .h_kv = 2, .head_dim = 8, .n_q = 8};
	skv_params_init(&j.params);
	j.params.window = 8;
	CU_ASSERT_EQUAL(snapkvd_params_check_budget(&j, &req, &plan, err, sizeof(err)), 0);
	j.params.budget_mode = SKV_BUDGET_LAYERS;
	j.params.n_layer_caps = 2;
	j.params.layer_caps[0] = 20;
	j.params.layer_caps[1] = 40;
	req.out_layout = SNAPKV__V1__LAYOUT__LAYOUT_NHD;
	CU_ASSERT_EQUAL(snapkvd_params_check_budget(&j, &req, &plan, err, sizeof(err)), -EINVAL);
	CU_ASSERT(strstr(err, "out_layout must be HND") != NULL);
	req.out_layout = SNAPKV__V1__LAYOUT__LAYOUT_HND;
	CU_ASSERT_EQUAL(snapkvd_params_check_budget(&j, &req, &plan, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(plan.kept, 40);
}

/* Under pressure C scales, a mode's budgets with it, never below what the
 * policy keeps plus one. */
static void test_scale(void)
{
	const struct snapkvd_policy pol = {0}; /* its level: fake_scale */
	struct skv_params p;
	bool scaled = true;

	skv_params_init(&p);
	p.window = 8;
	p.capacity = 100;
	fake_scale = 1.0;
	snapkvd_params_scale(&pol, SNAPKVD_PRESSURE_HIGH, &p, &scaled);
	CU_ASSERT_FALSE(scaled);
	CU_ASSERT_EQUAL(p.capacity, 100);
	fake_scale = 0.5;
	p.budget_mode = SKV_BUDGET_MASS;
	p.c_min = 20;
	p.c_max = 80;
	p.n_layer_caps = 1;
	p.layer_caps[0] = 12;
	snapkvd_params_scale(&pol, SNAPKVD_PRESSURE_HIGH, &p, &scaled);
	CU_ASSERT_TRUE(scaled);
	CU_ASSERT_EQUAL(p.capacity, 50);
	CU_ASSERT_EQUAL(p.c_min, 10);
	CU_ASSERT_EQUAL(p.c_max, 40);
	CU_ASSERT_EQUAL(p.layer_caps[0], 9); /* 6 is below the window + 1 */
	fake_scale = 1.0;
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("params", NULL, NULL);
	CU_add_test(su, "Params: explicit fields, protected ranges", test_read);
	CU_add_test(su, "the budget mode's fields", test_budget);
	CU_add_test(su, "the decision group's fields", test_group);
	CU_add_test(su, "a budget mode's layout and room", test_check_budget);
	CU_add_test(su, "pressure scaling", test_scale);
	return t_run();
}
