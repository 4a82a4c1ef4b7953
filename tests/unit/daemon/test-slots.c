// SPDX-License-Identifier: MIT
/*
 * test-slots: the server-wide connection limits (daemon/snapkvd-slots.c)
 * on a server struct and sessions of the test's own: handshakes counted
 * once, the oldest giving way at max_handshakes, hello_timeout_ms, engine
 * slots against max_sessions and max_sessions_per_tenant (closing sessions
 * and admin ones not counted), admin slots against max_admin_sessions plus
 * the one kept for an admin uid, each refusal naming its key, and a slot
 * given back once.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <string.h>

#include "daemon/snapkvd-slots.c"
#include "tests/test-skip.h"

static struct snapkvd_server srv;
static struct snapkvd_session ss[6];
static char err[256];

/* Sessions 0..n-1 listed newest first, as the server lists them. */
static void list(int n)
{
	srv.sessions = NULL;
	for (int i = 0; i < n; i++) {
		ss[i].next = srv.sessions;
		srv.sessions = &ss[i];
	}
}

static void reset(void)
{
	memset(&srv, 0, sizeof(srv));
	memset(ss, 0, sizeof(ss));
	snapkvd_config_defaults(&srv.cfg);
}

static void test_handshakes(void)
{
	reset();
	srv.cfg.max_handshakes = 2;
	srv.cfg.hello_timeout_ms = 100;
	list(3);
	snapkvd_slots_handshake_begin(&srv, &ss[0]);
	CU_ASSERT_PTR_NULL(snapkvd_slots_handshake_victim(&srv));
	snapkvd_slots_handshake_begin(&srv, &ss[1]);
	CU_ASSERT_EQUAL(srv.n_handshakes, 2);
	/* full: the oldest gives way, unless it is closing already */
	CU_ASSERT_PTR_EQUAL(snapkvd_slots_handshake_victim(&srv), &ss[0]);
	ss[0].closing = true;
	CU_ASSERT_PTR_EQUAL(snapkvd_slots_handshake_victim(&srv), &ss[1]);
	ss[0].closing = false;
	/* ended once, however often it is said */
	snapkvd_slots_handshake_end(&srv, &ss[0]);
	snapkvd_slots_handshake_end(&srv, &ss[0]);
	CU_ASSERT_EQUAL(srv.n_handshakes, 1);
	CU_ASSERT_FALSE(ss[0].handshake);
	/* late: strictly past hello_timeout_ms, the reason names the key */
	ss[1].created_ns = 1000;
	CU_ASSERT_FALSE(snapkvd_slots_hello_late(&srv, &ss[1], 1000 + 100000000ull, err, 256));
	CU_ASSERT_TRUE(snapkvd_slots_hello_late(&srv, &ss[1], 1001 + 100000000ull, err, 256));
	CU_ASSERT_STRING_EQUAL(err, "no HELLO within hello_timeout_ms (100 ms)");
	/* past its handshake, or closing: never late */
	CU_ASSERT_FALSE(snapkvd_slots_hello_late(&srv, &ss[0], UINT64_MAX / 2, err, 256));
	ss[1].closing = true;
	CU_ASSERT_FALSE(snapkvd_slots_hello_late(&srv, &ss[1], UINT64_MAX / 2, err, 256));
}

static void test_engine_slots(void)
{
	reset();
	srv.cfg.max_sessions = 3;
	srv.cfg.max_sessions_per_tenant = 2;
	list(5);
	for (int i = 0; i < 5; i++)
		ss[i].uid = 1000;
	ss[3].uid = ss[4].uid = 2000;
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[0], false, err, 256), 0);
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[1], false, err, 256), 0);
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[2], false, err, 256), -EUSERS);
	CU_ASSERT_STRING_EQUAL(err,
			       "uid 1000 already has 2 sessions: max_sessions_per_tenant is 2");
	CU_ASSERT_FALSE(ss[2].slot);
	/* a closing session of the uid no longer counts against it */
	ss[1].closing = true;
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[2], false, err, 256), 0);
	CU_ASSERT_EQUAL(srv.n_sessions, 3);
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[3], false, err, 256), -EUSERS);
	CU_ASSERT_STRING_EQUAL(err, "too many sessions: 3 open, max_sessions is 3");
	/* given back once */
	snapkvd_slots_put(&srv, &ss[1]);
	snapkvd_slots_put(&srv, &ss[1]);
	CU_ASSERT_EQUAL(srv.n_sessions, 2);
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[3], false, err, 256), 0);
	CU_ASSERT_EQUAL(srv.n_admin_sessions, 0);
}

static void test_admin_slots(void)
{
	reset();
	srv.cfg.max_admin_sessions = 1;
	srv.cfg.max_sessions = 1;
	list(4);
	for (int i = 0; i < 4; i++) {
		ss[i].uid = 4242; /* not root, not us, not in admin_uids */
		ss[i].admin = true;
	}
	if (geteuid() == 4242) {
		CU_FAIL("the test runs as uid 4242");
		return;
	}
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[0], true, err, 256), 0);
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[1], true, err, 256), -EUSERS);
	CU_ASSERT_STRING_EQUAL(err, "too many admin sessions: 1 open, max_admin_sessions is 1");
	/* an admin uid gets the one slot beyond the limit */
	srv.cfg.admin_uids[srv.cfg.n_admin_uids++] = 4242;
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[1], true, err, 256), 0);
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[2], true, err, 256), -EUSERS);
	CU_ASSERT_EQUAL(srv.n_admin_sessions, 2);
	/* admin slots do not use engine ones */
	ss[3].admin = false;
	CU_ASSERT_EQUAL(snapkvd_slots_take(&srv, &ss[3], false, err, 256), 0);
	snapkvd_slots_put(&srv, &ss[0]);
	CU_ASSERT_EQUAL(srv.n_admin_sessions, 1);
	CU_ASSERT_EQUAL(srv.n_sessions, 1);
	snapkvd_slots_put(&srv, &ss[3]);
	CU_ASSERT_EQUAL(srv.n_sessions, 0);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("slots", NULL, NULL);
	CU_add_test(su, "handshakes and their deadline", test_handshakes);
	CU_add_test(su, "engine slots per server and per uid", test_engine_slots);
	CU_add_test(su, "admin slots and the admin uid's spare", test_admin_slots);
	return t_run();
}
