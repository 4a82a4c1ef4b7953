// SPDX-License-Identifier: MIT
/*
 * test-value: the config's value parsers (daemon/snapkvd-value.c) alone:
 * sizes with suffixes and their overflow, integers and their bounds,
 * fractions and percentages, id lists and their limit, metrics_listen's
 * addresses normalised (and the reason for each refusal), and a size
 * formatted back with the largest exact suffix.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <string.h>

#include "daemon/snapkvd-value.c"
#include "tests/test-skip.h"

static void test_size(void)
{
	uint64_t v = 0;

	CU_ASSERT_EQUAL(snapkvd_parse_size("4096", &v), 0);
	CU_ASSERT_EQUAL(v, 4096);
	CU_ASSERT_EQUAL(snapkvd_parse_size("64K", &v), 0);
	CU_ASSERT_EQUAL(v, 65536);
	CU_ASSERT_EQUAL(snapkvd_parse_size("2GiB", &v), 0);
	CU_ASSERT_EQUAL(v, 2ull << 30);
	CU_ASSERT_EQUAL(snapkvd_parse_size("3mb", &v), 0);
	CU_ASSERT_EQUAL(v, 3ull << 20);
	CU_ASSERT_EQUAL(snapkvd_parse_size("1T", &v), 0);
	CU_ASSERT_EQUAL(v, 1ull << 40);
	CU_ASSERT_EQUAL(snapkvd_parse_size("-1", &v), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_parse_size("1Q", &v), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_parse_size("1Ki2", &v), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_parse_size("", &v), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_parse_size(NULL, &v), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_parse_size("99999999999999999999", &v), -ERANGE);
	CU_ASSERT_EQUAL(snapkvd_parse_size("16777216T", &v), -ERANGE); /* 2^64 */
	CU_ASSERT_EQUAL(v, 1ull << 40);				       /* untouched on failure */
}

static void test_integers(void)
{
	unsigned u = 7;
	uint32_t x = 7;

	CU_ASSERT_EQUAL(snapkvd_value_uint("12", 1, 12, &u), 0);
	CU_ASSERT_EQUAL(u, 12);
	CU_ASSERT_EQUAL(snapkvd_value_uint("13", 1, 12, &u), -ERANGE);
	CU_ASSERT_EQUAL(snapkvd_value_uint("0", 1, 12, &u), -ERANGE);
	CU_ASSERT_EQUAL(snapkvd_value_uint("x", 1, 12, &u), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_uint("-1", 0, 12, &u), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_uint("5 ", 0, 12, &u), -ERANGE);
	CU_ASSERT_EQUAL(u, 12);
	CU_ASSERT_EQUAL(snapkvd_value_u32("4294967294", 0, UINT32_MAX - 1, &x), 0);
	CU_ASSERT_EQUAL(x, UINT32_MAX - 1);
	CU_ASSERT_EQUAL(snapkvd_value_u32("4294967295", 0, UINT32_MAX - 1, &x), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_u32("", 0, 1, &x), -EINVAL);
}

static void test_fraction(void)
{
	double d = -1;

	CU_ASSERT_EQUAL(snapkvd_value_fraction("0.25", &d), 0);
	CU_ASSERT_DOUBLE_EQUAL(d, 0.25, 1e-12);
	CU_ASSERT_EQUAL(snapkvd_value_fraction("50%", &d), 0);
	CU_ASSERT_DOUBLE_EQUAL(d, 0.5, 1e-12);
	CU_ASSERT_EQUAL(snapkvd_value_fraction("1", &d), 0);
	CU_ASSERT_EQUAL(snapkvd_value_fraction("1.01", &d), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_fraction("101%", &d), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_fraction("nan", &d), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_fraction("", &d), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_fraction("0.5x", &d), -EINVAL);
}

static void test_idlist(void)
{
	uint32_t ids[SNAPKVD_VALUE_MAX_IDS];
	char many[SNAPKVD_VALUE_MAX_IDS * 4 + 8] = "";
	unsigned n = 99;

	CU_ASSERT_EQUAL(snapkvd_value_idlist("0, 1000\t7", &n, ids), 0);
	CU_ASSERT_EQUAL(n, 3);
	CU_ASSERT_EQUAL(ids[1], 1000);
	CU_ASSERT_EQUAL(snapkvd_value_idlist("", &n, ids), 0);
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_EQUAL(snapkvd_value_idlist("1 a", &n, ids), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_idlist("2147483648", &n, ids), -EINVAL); /* > INT_MAX */
	for (int i = 0; i <= SNAPKVD_VALUE_MAX_IDS; i++)
		strcat(many, "1 ");
	CU_ASSERT_EQUAL(snapkvd_value_idlist(many, &n, ids), -E2BIG);
}

static void test_listen(void)
{
	struct snapkvd_http_config h;
	struct skv_error why = {{0}, -1, -1};

	memset(&h, 0, sizeof(h));
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "9464", &why), 0);
	CU_ASSERT_STRING_EQUAL(h.listen, "127.0.0.1:9464"); /* a port alone: loopback */
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "localhost:80", &why), 0);
	CU_ASSERT_STRING_EQUAL(h.listen, "127.0.0.1:80");
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "[::1]:9000", &why), 0);
	CU_ASSERT_STRING_EQUAL(h.listen, "[::1]:9000");
	CU_ASSERT_EQUAL(h.addr.ss_family, AF_INET6);
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "off", &why), 0);
	CU_ASSERT_STRING_EQUAL(h.listen, "");
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "::1:80", &why), -EINVAL);
	CU_ASSERT_STRING_EQUAL(why.msg, "an IPv6 address goes in brackets: [::1]:9464");
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "example.org:80", &why), -EINVAL);
	CU_ASSERT_STRING_EQUAL(why.msg, "not a numeric IPv4 address (names are not resolved)");
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "1.2.3.4:0", &why), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "1.2.3.4:65536", &why), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_value_listen(&h, "[::1", &why), -EINVAL);
}

static void test_fmt_size(void)
{
	char b[24];

	snapkvd_value_fmt_size(1 << 20, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "1M");
	snapkvd_value_fmt_size(3 << 10, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "3K");
	snapkvd_value_fmt_size(4097, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "4097");
	snapkvd_value_fmt_size(0, b, sizeof(b));
	CU_ASSERT_STRING_EQUAL(b, "0");
	snapkvd_value_fmt_size(5ull << 50, b, sizeof(b)); /* T is the largest suffix */
	CU_ASSERT_STRING_EQUAL(b, "5120T");
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("value", NULL, NULL);
	CU_add_test(su, "sizes", test_size);
	CU_add_test(su, "integers in bounds", test_integers);
	CU_add_test(su, "fractions", test_fraction);
	CU_add_test(su, "id lists", test_idlist);
	CU_add_test(su, "metrics_listen addresses", test_listen);
	CU_add_test(su, "sizes formatted back", test_fmt_size);
	return t_run();
}
