// SPDX-License-Identifier: MIT
/*
 * test-config: the config table (daemon/snapkvd-config.c): the file format
 * and its limits, every row's bounds and the reason each refusal gives
 * (line, key, limit), all or nothing for a file, an option and a policy
 * key, the dump reading back as the same configuration, the table's own
 * consistency, and a reload keeping the keys that need a restart.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <string.h>

#include "daemon/snapkvd-config.c"
#include "tests/test-skip.h"

static struct skv_error err;

static int parse(struct snapkvd_config *c, const char *text)
{
	snapkvd_config_defaults(c);
	memset(&err, 0, sizeof(err));
	return snapkvd_config_parse(c, text, strlen(text), &err);
}

static void test_file(void)
{
	struct snapkvd_config c;

	CU_ASSERT_EQUAL(parse(&c, "# comment\n\n ; also\npool_bytes = 2G\nthreads=3\n"
				  "allow_uids = 1000, 1001 7\nallow_gids=5\nlog_level = debug\n"
				  "socket = /tmp/x.sock\nsq_entries = 128\n"),
			0);
	CU_ASSERT_EQUAL(c.pool_bytes, 2ull << 30);
	CU_ASSERT_EQUAL(c.threads, 3);
	CU_ASSERT_EQUAL(c.n_allow_uids, 3);
	CU_ASSERT_EQUAL(c.allow_uids[2], 7);
	CU_ASSERT_EQUAL(c.log_level, SNAPKVD_LOG_DEBUG);
	CU_ASSERT_STRING_EQUAL(c.socket_path, "/tmp/x.sock");
	CU_ASSERT_EQUAL(c.sq_entries, 128);
	CU_ASSERT(snapkvd_config_allows(&c, 1001, 99));
	CU_ASSERT(snapkvd_config_allows(&c, 42, 5));
	CU_ASSERT(!snapkvd_config_allows(&c, 42, 6));
	snapkvd_config_defaults(&c);
	CU_ASSERT(snapkvd_config_allows(&c, 42, 6)); /* no lists: the socket mode decides */
	CU_ASSERT(snapkvd_config_is_admin(&c, geteuid()));
	CU_ASSERT_EQUAL(parse(&c, "admin_uids = 4242\n"), 0);
	CU_ASSERT(snapkvd_config_is_admin(&c, 4242));
	CU_ASSERT_EQUAL(snapkvd_config_is_admin(&c, 4243), geteuid() == 4243);
	/* the policy's keys in the same file */
	CU_ASSERT_EQUAL(parse(&c, "pressure_high = 85%\nhook_max_output = 4K\n"
				  "tenant_quota = 1000:2G:25%\nmetrics_listen = 9464\n"),
			0);
	CU_ASSERT_DOUBLE_EQUAL(c.policy.pressure.high_enter.fraction, 0.85, 1e-12);
	CU_ASSERT_EQUAL(c.policy.hooks.max_output, 4096);
	CU_ASSERT_EQUAL(c.policy.n_quotas, 1);
	CU_ASSERT_STRING_EQUAL(c.http.listen, "127.0.0.1:9464");
	CU_ASSERT_EQUAL(c.http.addr_len, sizeof(struct sockaddr_in));
}

/* Each refusal: -EINVAL, the reason as the daemon prints it, nothing applied. */
static void test_refusals(void)
{
	const struct {
		const char *text, *why;
	} bad[] = {
	    {"threads = 2\nthreads = -1\n", "line 2: threads: not an integer in 0..1024"},
	    {"bogus = 1\n", "line 1: bogus: unknown key"},
	    {"just words\n", "line 1: expected key = value"},
	    {"sq_entries = 100\n", "line 1: sq_entries: not a power of two"},
	    {"slot_bytes = 5000\n", "line 1: slot_bytes: not a multiple of 64"},
	    {"pool_bytes = 1K\n", "line 1: pool_bytes: 1K is below the minimum 1M (1048576 bytes)"},
	    {"pool_bytes = lots\n",
	     "line 1: pool_bytes: not a size (4096, 64K, 1M, 2G; at least 1M)"},
	    {"metrics_http_max_request = 1M\n",
	     "line 1: metrics_http_max_request: 1M is outside 256..64K (256..65536 bytes)"},
	    {"socket = relative.sock\n",
	     "line 1: socket: socket must be an absolute path shorter than 108 bytes"},
	    {"socket =\n",
	     "line 1: socket: socket must be an absolute path shorter than 108 bytes"},
	    {"backend = gpu\n", "line 1: backend: backend must be host or cuda"},
	    {"devices = 1,1\n", "line 1: devices: devices names 1 twice"},
	    {"devices = gpu0\n",
	     "line 1: devices: devices must be all or up to 16 CUDA device ordinals"},
	    {"devices = 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n",
	     "line 1: devices: devices must be all or up to 16 CUDA device ordinals"},
	    {"log_level = loud\n",
	     "line 1: log_level: log_level must be error, warning, notice, info or debug"},
	    {"metrics_http_tenants = some\n",
	     "line 1: metrics_http_tenants: metrics_http_tenants must be none, aggregate or all"},
	    {"max_layers = 99999999\n", "line 1: max_layers: not an integer in 1..4096"},
	    {"metrics_listen = ::1:80\n",
	     "line 1: metrics_listen: an IPv6 address goes in brackets: [::1]:9464"},
	    {"pressure_high = 120%\n",
	     "line 1: pressure_high: expected a percentage, a fraction or bytes"},
	    {"pressure_actions = notify,notify\n",
	     "line 1: pressure_actions: comma-separated notify, hooks, scale, evict, refuse; each "
	     "once"},
	    {"pressure_scale_high = 1.5\n",
	     "line 1: pressure_scale_high: expected 0..1 or 0%..100%"},
	    {"hook_dir = rel\n", "line 1: hook_dir: must be an absolute path"},
	    {"hook_max = 257\n", "line 1: hook_max: not an integer in 1..256"},
	    {"hook_max_output = 2M\n",
	     "line 1: hook_max_output: 2M is outside 0..1M (0..1048576 bytes)"},
	    {"tenant_quota = 1000\n",
	     "line 1: tenant_quota: expected UID:BYTES[:SHARE], got '1000'"},
	    {"tenant_quota = alice:1G\n", "line 1: tenant_quota: bad uid 'alice'"},
	    {"pressure_high = 80%\npressure_high_leave = 85%\n", "pressure: "},
	};
	struct snapkvd_config c, defaults;

	snapkvd_config_defaults(&defaults);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CU_ASSERT_EQUAL(parse(&c, bad[i].text), -EINVAL);
		if (strncmp(err.msg, bad[i].why, strlen(bad[i].why)))
			fprintf(stderr, "%s: got '%s', want '%s'\n", bad[i].text, err.msg,
				bad[i].why);
		CU_ASSERT_NSTRING_EQUAL(err.msg, bad[i].why, strlen(bad[i].why));
		CU_ASSERT_EQUAL(err.layer, -1);
		CU_ASSERT(!memcmp(&c, &defaults, sizeof(c)));
	}
	/* 65 ids (SNAPKVD_VALUE_MAX_IDS is 64) */
	char ids[600] = "allow_uids =";
	for (int i = 0; i < 65; i++)
		strcat(ids, " 1");
	CU_ASSERT_EQUAL(parse(&c, ids), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "up to 64"));
	/* SNAPKVD_CONFIG_MAX_LINE and SNAPKVD_CONFIG_MAX_BYTES */
	char *line = malloc(SNAPKVD_CONFIG_MAX_BYTES + 2);
	CU_ASSERT_PTR_NOT_NULL_FATAL(line);
	memset(line, '#', SNAPKVD_CONFIG_MAX_LINE + 1);
	line[SNAPKVD_CONFIG_MAX_LINE + 1] = 0;
	CU_ASSERT_EQUAL(parse(&c, line), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "line 1: longer than 1024 bytes");
	line[SNAPKVD_CONFIG_MAX_LINE] = 0; /* exactly the limit: a comment */
	CU_ASSERT_EQUAL(parse(&c, line), 0);
	memset(line, '\n', SNAPKVD_CONFIG_MAX_BYTES + 1);
	CU_ASSERT_EQUAL(snapkvd_config_parse(&c, line, SNAPKVD_CONFIG_MAX_BYTES + 1, &err), -EFBIG);
	CU_ASSERT_EQUAL(snapkvd_config_parse(&c, line, SNAPKVD_CONFIG_MAX_BYTES, &err), 0);
	free(line);
	snapkvd_config_defaults(&c);
	CU_ASSERT_EQUAL(snapkvd_config_parse(&c, "threads = 1\0x", 14, &err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "line 1: NUL byte");
	/* no err: the same answers */
	CU_ASSERT_EQUAL(snapkvd_config_parse(&c, "threads = x\n", 12, NULL), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_config_set(&c, "threads", "x", NULL), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_config_set(&c, "pressure_high_leave", "85%", NULL), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_config_parse(&c, "pressure_high_leave = 85%\n", 26, NULL), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c.policy, "hook_max", "0", NULL), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_config_load(&c, "/nonexistent/snapkvd.conf", &err), -ENOENT);
	CU_ASSERT_STRING_EQUAL(err.msg, strerror(ENOENT));
}

/* An option: the same checks, all or nothing, no line and no key. */
static void test_set(void)
{
	struct snapkvd_config c, before;

	snapkvd_config_defaults(&c);
	CU_ASSERT_EQUAL(snapkvd_config_set(&c, "pool_bytes", "3G", &err), 0);
	CU_ASSERT_EQUAL(c.pool_bytes, 3ull << 30);
	before = c;
	CU_ASSERT_EQUAL(snapkvd_config_set(&c, "pool_bytes", "64K", &err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "64K is below the minimum 1M (1048576 bytes)");
	CU_ASSERT_EQUAL(snapkvd_config_set(&c, "nope", "1", &err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "unknown key");
	/* an option's value is bounded as a file's line is (SNAPKVD_VALUE_MAX) */
	char *ids = malloc(2 * SNAPKVD_VALUE_MAX);
	CU_ASSERT_PTR_NOT_NULL_FATAL(ids);
	for (int i = 0; i < SNAPKVD_VALUE_MAX; i++)
		memcpy(ids + 2 * i, "1 ", 2);
	ids[2 * SNAPKVD_VALUE_MAX - 1] = 0;
	CU_ASSERT_EQUAL(snapkvd_config_set(&c, "allow_uids", ids, &err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "value longer than 1024 bytes");
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&c.policy, "hook_dir", ids, &err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "hook_dir: value longer than 1024 bytes");
	free(ids);
	/* valid alone, contradicting the rest: refused whole */
	CU_ASSERT_EQUAL(snapkvd_config_set(&c, "pressure_high_leave", "85%", &err), -EINVAL);
	CU_ASSERT_NSTRING_EQUAL(err.msg, "pressure: ", 10);
	CU_ASSERT(!memcmp(&c, &before, sizeof(c)));
}

/* The policy's keys on their own (snapkvctl's runtime changes). */
static void test_policy_keys(void)
{
	struct snapkvd_policy_config p, before;

	snapkvd_policy_config_init(&p);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "tenant_quota", "7:1G", &err), 0);
	before = p;
	/* a daemon key is not one of them */
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "pool_bytes", "1G", &err), -ENOENT);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "no_such_key", "1", &err), -ENOENT);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, NULL, "1", &err), -EINVAL);
	/* a refusal names the key and changes nothing */
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "tenant_quota", "7:1G:2", &err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "tenant_quota: bad share '2' (0..1 or 0%..100%)");
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "pressure_actions", "notify,", &err),
			-EINVAL);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "pressure_high", "x", &err), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "hook_timeout_ms", "0", &err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err.msg, "hook_timeout_ms: not an integer in 1..3600000");
	CU_ASSERT(!memcmp(&p, &before, sizeof(p)));
	/* the 65th tenant (SNAPKVD_POLICY_MAX_TENANT_QUOTAS) */
	for (int i = 1; i < SNAPKVD_POLICY_MAX_TENANT_QUOTAS; i++) {
		char v[32];

		snprintf(v, sizeof(v), "%d:1M", 2000 + i);
		CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "tenant_quota", v, &err), 0);
	}
	CU_ASSERT_EQUAL(p.n_quotas, SNAPKVD_POLICY_MAX_TENANT_QUOTAS);
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "tenant_quota", "9:1M", &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "at most 64 tenants"));
	/* a uid already listed is replaced, not added */
	CU_ASSERT_EQUAL(snapkvd_policy_config_set(&p, "tenant_quota", "7:2G", &err), 0);
	CU_ASSERT_EQUAL(snapkvd_policy_config_quota(&p, 7)->quota_bytes, 2ull << 30);
	CU_ASSERT_EQUAL(snapkvd_policy_config_check(&p, &err), 0);
	p.pressure.high_leave.fraction = 0.9;
	CU_ASSERT_EQUAL(snapkvd_policy_config_check(&p, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "leave"));
}

/* The table itself: one row per key, bounds a field of its width can hold,
 * a size for every row a reload copies, a type for each. */
static void test_table(void)
{
	for (size_t i = 0; i < N_KEYS; i++) {
		const struct key *k = &keys[i];

		CU_ASSERT_PTR_NOT_NULL(k->type);
		CU_ASSERT(k->spec.size > 0);
		CU_ASSERT(k->spec.lo <= k->spec.hi || k->spec.hi == 0);
		if (k->type == &snapkvd_value_uint_type)
			CU_ASSERT(k->spec.hi <= UINT_MAX && k->spec.size == sizeof(unsigned));
		if (k->type == &snapkvd_value_size_type && k->spec.size == sizeof(uint32_t))
			CU_ASSERT(k->spec.hi <= UINT32_MAX);
		CU_ASSERT(k->off + k->spec.size <= (k->in == IN_POLICY
							? sizeof(struct snapkvd_policy_config)
							: sizeof(struct snapkvd_config)));
		for (size_t j = 0; j < i; j++)
			if (!strcmp(keys[j].name, k->name))
				CU_FAIL("a key in two rows");
		CU_ASSERT_PTR_EQUAL(find_key(k->name), k);
	}
	CU_ASSERT(N_KEYS >= 60);
}

/* devices: all (the default) or distinct CUDA ordinals; restart only */
static void test_devices(void)
{
	struct snapkvd_config c, cur;
	const char *kept[2];
	char *a = NULL;

	CU_ASSERT_EQUAL(parse(&c, ""), 0);
	CU_ASSERT_EQUAL(c.n_devices, 0);
	CU_ASSERT_EQUAL(parse(&c, "devices = 1, 3\n"), 0);
	CU_ASSERT_EQUAL(c.n_devices, 2);
	CU_ASSERT(c.devices[0] == 1 && c.devices[1] == 3);
	CU_ASSERT_EQUAL_FATAL(snapkvd_config_dump(&c, &a), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\ndevices = 1,3\n"));
	free(a);
	CU_ASSERT_EQUAL(parse(&c, "devices = all\n"), 0);
	CU_ASSERT_EQUAL(c.n_devices, 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_config_dump(&c, &a), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\ndevices = all\n"));
	free(a);
	/* a reload keeps the devices the daemon opened */
	CU_ASSERT_EQUAL(parse(&cur, "devices = 0\n"), 0);
	CU_ASSERT_EQUAL(parse(&c, "devices = all\n"), 0);
	CU_ASSERT_EQUAL(snapkvd_config_keep_running(&c, &cur, kept, 2), 1);
	CU_ASSERT_STRING_EQUAL(kept[0], "devices");
	CU_ASSERT(c.n_devices == 1 && c.devices[0] == 0);
}

/* --check-config's text parses back into the same configuration. */
static void test_dump(void)
{
	struct snapkvd_config c, back;
	char *a = NULL, *b = NULL;

	CU_ASSERT_EQUAL(parse(&c, "pool_bytes = 3G\ntenant_quota = 1000:2G:25%\n"
				  "tenant_quota = 1001:4097\nmetrics_listen = [::1]:9000\n"
				  "allow_gids = 5 6\nlog_level = err\nhook_dir = /h\n"
				  "pressure_actions = evict,notify\nmetrics_http_tenants = all\n"),
			0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_config_dump(&c, &a), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\npool_bytes = 3G\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\ntenant_quota = 1000:2G:0.25\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\ntenant_quota = 1001:4097\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\nmetrics_listen = [::1]:9000\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\nallow_gids = 5 6\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\nallow_uids =\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\nlog_level = error\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\npressure_actions = evict,notify\n"));
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\nmetrics_http_tenants = all\n"));
	CU_ASSERT_NSTRING_EQUAL(a, "socket = ", 9);
	CU_ASSERT_EQUAL(parse(&back, a), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_config_dump(&back, &b), 0);
	CU_ASSERT_STRING_EQUAL(a, b);
	free(a);
	free(b);
	snapkvd_config_defaults(&c);
	CU_ASSERT_EQUAL_FATAL(snapkvd_config_dump(&c, &a), 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "\n# tenant_quota: none\n"));
	/* every row prints its key */
	for (size_t i = 0; i < N_KEYS; i++) {
		char want[64];

		snprintf(want, sizeof(want), "%s =", keys[i].name);
		if (strcmp(keys[i].name, "tenant_quota"))
			CU_ASSERT_PTR_NOT_NULL(strstr(a, want));
	}
	free(a);
}

/* A reload applies the reloadable rows and keeps the RESTART ones. */
static void test_reload(void)
{
	struct snapkvd_config cur, next;
	const char *kept[4];
	size_t n;

	CU_ASSERT_EQUAL(parse(&cur, "threads = 4\nmetrics_listen = 9464\npool_bytes = 1G\n"), 0);
	CU_ASSERT_EQUAL(parse(&next,
			      "threads = 8\nmetrics_listen = 127.0.0.1:9465\n"
			      "pool_bytes = 2G\nsocket = /run/other.sock\nlog_level = debug\n"
			      "metrics_http_timeout_ms = 100\n"),
			0);
	n = snapkvd_config_keep_running(&next, &cur, kept, 4);
	CU_ASSERT_EQUAL(n, 4);
	CU_ASSERT_STRING_EQUAL(kept[0], "socket");
	CU_ASSERT_STRING_EQUAL(kept[1], "threads");
	CU_ASSERT_STRING_EQUAL(kept[2], "metrics_listen");
	CU_ASSERT_STRING_EQUAL(kept[3], "metrics_http_timeout_ms");
	CU_ASSERT_EQUAL(next.threads, 4);
	CU_ASSERT_STRING_EQUAL(next.socket_path, cur.socket_path);
	CU_ASSERT_STRING_EQUAL(next.http.listen, "127.0.0.1:9464");
	CU_ASSERT(!memcmp(&next.http.addr, &cur.http.addr, sizeof(cur.http.addr)));
	CU_ASSERT_EQUAL(next.http.timeout_ms, cur.http.timeout_ms);
	/* the reloadable ones from the new file */
	CU_ASSERT_EQUAL(next.pool_bytes, 2ull << 30);
	CU_ASSERT_EQUAL(next.log_level, SNAPKVD_LOG_DEBUG);
	/* nothing changed that needs a restart: nothing to say */
	CU_ASSERT_EQUAL(snapkvd_config_keep_running(&next, &cur, kept, 4), 0);
	/* more than max: the count, the first max names */
	CU_ASSERT_EQUAL(parse(&next, "threads = 8\nworkers = 2\nbackend = cuda\n"), 0);
	CU_ASSERT_EQUAL(snapkvd_config_keep_running(&next, &cur, kept, 1), 4);
	CU_ASSERT_STRING_EQUAL(kept[0], "backend"); /* threads, workers, metrics_listen */
	CU_ASSERT_EQUAL(next.workers, cur.workers);
	CU_ASSERT_STRING_EQUAL(next.backend, "host");
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("config", NULL, NULL);
	CU_add_test(su, "the file format", test_file);
	CU_add_test(su, "refusals name line, key and limit", test_refusals);
	CU_add_test(su, "an option: all or nothing", test_set);
	CU_add_test(su, "the policy's keys alone", test_policy_keys);
	CU_add_test(su, "the table's rows", test_table);
	CU_add_test(su, "the dump reads back", test_dump);
	CU_add_test(su, "devices: all or distinct ordinals", test_devices);
	CU_add_test(su, "reload keeps the restart keys", test_reload);
	return t_run();
}
