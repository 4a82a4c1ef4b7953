// SPDX-License-Identifier: MIT
/*
 * test-group (build/tests/test-daemon-group is the integration suite):
 * the decision-group registry (daemon/snapkvd-group.c) with
 * jobs built here and a fake first step (struct skv_pending holds the
 * member's own C* and its mass at any C): joining (same tenant, size,
 * shape and parameters, at most group_size members, max_tenant_groups),
 * the last arrival deciding C* (the largest own C*) and the fallback for
 * all, a member's failure failing the group, and the sweep failing groups
 * past their deadline, with a member whose session ended, or all of them.
 * Every member's reference is dropped with its membership.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-group.c"
#include "tests/test-skip.h"

/* ---------------------------------------------- the fake first step */

struct skv_pending {
	uint32_t c_star;
	float mass; /* at every C */
};
static unsigned pendings;

uint32_t skv_pending_c_star(const struct skv_pending *pd)
{
	return pd->c_star;
}

float skv_pending_min_mass(const struct skv_pending *pd, uint32_t c)
{
	(void)c;
	return pd->mass;
}

void skv_pending_free(struct skv_pending *pd)
{
	if (pd)
		pendings--;
	free(pd);
}

/* ------------------------------------------------------------ helpers */

#define UID 1000

static struct snapkvd_groups *reg;
static bool ended; /* the members' session */

static struct snapkvd_job *member(const char *key, uint32_t size)
{
	struct snapkvd_job *j = calloc(1, sizeof(*j));

	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	snprintf(j->gm.key, sizeof(j->gm.key), "%s", key);
	j->gm.size = size;
	j->gm.timeout_ms = 1000;
	j->layers = 2;
	j->shape =
	    (struct skv_shape){.prompt_len = 64, .h_q = 4, .h_kv = 2, .head_dim = 8, .n_q = 4};
	skv_params_init(&j->params);
	j->params.budget_mode = SKV_BUDGET_MASS;
	j->cancel = &ended;
	return j;
}

/* Its first step done: own C*, mass. */
static void scored(struct snapkvd_job *j, uint32_t c_star, float mass)
{
	j->gm.pending = calloc(1, sizeof(*j->gm.pending));
	CU_ASSERT_PTR_NOT_NULL_FATAL(j->gm.pending);
	j->gm.pending->c_star = c_star;
	j->gm.pending->mass = mass;
	pendings++;
}

static void drop(struct snapkvd_job *j)
{
	snapkvd_group_member_clear(&j->gm);
	CU_ASSERT_PTR_NULL(j->gm.group);
	free(j);
}

static unsigned count(const struct snapkvd_job *list)
{
	unsigned n = 0;

	for (; list; list = list->next)
		n++;
	return n;
}

static int join(struct snapkvd_job *j, uint32_t uid, char *err)
{
	return snapkvd_groups_join(reg, j, uid, 2, 0, err, 200);
}

/* -------------------------------------------------------------- tests */

static void test_join(void)
{
	struct snapkvd_job *a = member("tp", 2), *b = member("tp", 3), *c = member("tp", 2),
			   *d = member("tp", 2), *e = member("tp", 2);
	char err[200] = "";

	CU_ASSERT_EQUAL_FATAL(snapkvd_groups_new(&reg), 0);
	CU_ASSERT_EQUAL(join(a, UID, err), 0);
	CU_ASSERT_PTR_NOT_NULL(a->gm.group);
	CU_ASSERT_EQUAL(join(b, UID, err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "decision group 'tp': group_size 3 differs from the group's 2");
	CU_ASSERT_PTR_NULL(b->gm.group); /* nothing changed */
	/* keys are per tenant: another uid's "tp" is another group */
	struct snapkvd_job *o = member("tp", 2);
	CU_ASSERT_EQUAL(join(o, UID + 1, err), 0);
	CU_ASSERT_PTR_NOT_NULL(o->gm.group);
	CU_ASSERT_PTR_NOT_EQUAL(o->gm.group, a->gm.group);
	/* members agree on the K/V dtype */
	struct skv_layer_in f16 = {.k = {.dtype = SKV_DTYPE_F16}, .v = {.dtype = SKV_DTYPE_F16}};
	c->in = &f16;
	CU_ASSERT_EQUAL(join(c, UID, err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(
	    err, "decision group 'tp': K/V dtype f16/f16 differs from the group's unset/unset");
	c->in = NULL;
	c->params.window = 16;
	CU_ASSERT_EQUAL(join(c, UID, err), -EINVAL);
	CU_ASSERT_STRING_EQUAL(err, "decision group 'tp': window 16 differs from the group's 32");
	CU_ASSERT_EQUAL(join(d, UID, err), 0);
	CU_ASSERT_EQUAL(join(e, UID, err), -EEXIST); /* its 2 members are in */
	/* max_tenant_groups (2 here): a second key, then no third */
	snprintf(e->gm.key, sizeof(e->gm.key), "k2");
	CU_ASSERT_EQUAL(join(e, UID, err), 0);
	snprintf(c->gm.key, sizeof(c->gm.key), "k3");
	c->params.window = 32;
	CU_ASSERT_EQUAL(join(c, UID, err), -EUSERS);
	CU_ASSERT(strstr(err, "max_tenant_groups") != NULL);
	/* the daemon stops: every pending group fails, none parked yet */
	CU_ASSERT_PTR_NULL(snapkvd_groups_sweep(reg, 0, true));
	drop(a), drop(b), drop(c), drop(d), drop(e), drop(o);
	snapkvd_groups_free(reg);
}

/* A parked member whose session ended fails the group as the next member
 * arrives, before any sweep: never decided with a dead member. */
static void test_arrival_sees_ended(void)
{
	struct snapkvd_job *a = member("tp", 2), *b = member("tp", 2), *list;
	bool dead = false;
	char err[200];

	CU_ASSERT_EQUAL_FATAL(snapkvd_groups_new(&reg), 0);
	a->cancel = &dead;
	CU_ASSERT_EQUAL(join(a, UID, err), 0);
	CU_ASSERT_EQUAL(join(b, UID, err), 0);
	scored(a, 4, 1.0f);
	scored(b, 4, 1.0f);
	CU_ASSERT_PTR_NULL(snapkvd_groups_arrive(reg, a, 0));
	dead = true;
	list = snapkvd_groups_arrive(reg, b, 0);
	CU_ASSERT_EQUAL(count(list), 2);
	CU_ASSERT_FALSE(a->gm.decided || b->gm.decided);
	CU_ASSERT_EQUAL(b->status, -ECANCELED);
	CU_ASSERT(strstr(b->err, "session ended") != NULL);
	drop(a), drop(b);
	CU_ASSERT_EQUAL(pendings, 0);
	snapkvd_groups_free(reg);
}

/* The last arrival decides for all: the largest own C*; the fallback
 * for all when one member's mass at C* is below fallback_below. */
static void test_decide(void)
{
	struct snapkvd_job *m[3], *list;
	struct snapkvd_group_stats st;
	char err[200];

	CU_ASSERT_EQUAL_FATAL(snapkvd_groups_new(&reg), 0);
	for (int i = 0; i < 3; i++) {
		m[i] = member("tp", 3);
		m[i]->params.fallback_below = 0.5f;
		CU_ASSERT_EQUAL(join(m[i], UID, err), 0);
	}
	scored(m[0], 10, 0.9f);
	scored(m[1], 20, 0.9f);
	scored(m[2], 15, 0.9f);
	CU_ASSERT_PTR_NULL(snapkvd_groups_arrive(reg, m[0], 100));
	CU_ASSERT_PTR_NULL(snapkvd_groups_arrive(reg, m[1], 200));
	list = snapkvd_groups_arrive(reg, m[2], 1100);
	CU_ASSERT_EQUAL(count(list), 3);
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_TRUE(m[i]->gm.decided);
		CU_ASSERT_EQUAL(m[i]->gm.c_star, 20);
		CU_ASSERT_FALSE(m[i]->gm.fallback);
		CU_ASSERT_EQUAL(m[i]->gm.wait_ns, 1000);
		CU_ASSERT_EQUAL(m[i]->status, 0);
	}
	snapkvd_groups_stats(reg, &st);
	CU_ASSERT_EQUAL(st.decided, 1);
	CU_ASSERT_EQUAL(st.pending, 0);
	CU_ASSERT_EQUAL(st.parked, 0);
	for (int i = 0; i < 3; i++)
		drop(m[i]);
	/* the key is free again; one low mass: everyone falls back */
	for (int i = 0; i < 2; i++) {
		m[i] = member("tp", 2);
		m[i]->params.fallback_below = 0.5f;
		CU_ASSERT_EQUAL(join(m[i], UID, err), 0);
	}
	scored(m[0], 8, 0.9f);
	scored(m[1], 8, 0.4f);
	CU_ASSERT_PTR_NULL(snapkvd_groups_arrive(reg, m[0], 0));
	CU_ASSERT_EQUAL(count(snapkvd_groups_arrive(reg, m[1], 0)), 2);
	CU_ASSERT_TRUE(m[0]->gm.fallback && m[1]->gm.fallback);
	snapkvd_groups_stats(reg, &st);
	CU_ASSERT_EQUAL(st.fallbacks, 1);
	drop(m[0]), drop(m[1]);
	CU_ASSERT_EQUAL(pendings, 0);
	snapkvd_groups_free(reg);
}

/* One member's failure fails them all: the parked at once, the others
 * when they arrive. */
static void test_member_fails(void)
{
	struct snapkvd_job *m[3], *list;
	char err[200];

	CU_ASSERT_EQUAL_FATAL(snapkvd_groups_new(&reg), 0);
	for (int i = 0; i < 3; i++) {
		m[i] = member("tp", 3);
		CU_ASSERT_EQUAL(join(m[i], UID, err), 0);
	}
	scored(m[0], 10, 1.0f);
	CU_ASSERT_PTR_NULL(snapkvd_groups_arrive(reg, m[0], 0));
	m[1]->status = -EINVAL;
	snprintf(m[1]->err, sizeof(m[1]->err), "bad layer");
	list = snapkvd_groups_arrive(reg, m[1], 0);
	CU_ASSERT_EQUAL(count(list), 2); /* itself and the parked one */
	CU_ASSERT_EQUAL(m[1]->status, -EINVAL);
	CU_ASSERT_EQUAL(m[0]->status, -ECANCELED);
	CU_ASSERT(strstr(m[0]->err, "another member failed (bad layer)") != NULL);
	scored(m[2], 10, 1.0f);
	CU_ASSERT_PTR_EQUAL(snapkvd_groups_arrive(reg, m[2], 0), m[2]);
	CU_ASSERT_EQUAL(m[2]->status, -ECANCELED);
	for (int i = 0; i < 3; i++)
		drop(m[i]);
	snapkvd_groups_free(reg);
}

static void test_sweep(void)
{
	struct snapkvd_job *a = member("t1", 2), *b = member("t2", 2), *list;
	struct snapkvd_group_stats st;
	char err[200];

	CU_ASSERT_EQUAL_FATAL(snapkvd_groups_new(&reg), 0);
	CU_ASSERT_EQUAL(join(a, UID, err), 0);
	CU_ASSERT_EQUAL(join(b, UID, err), 0);
	scored(a, 4, 1.0f);
	scored(b, 4, 1.0f);
	CU_ASSERT_PTR_NULL(snapkvd_groups_arrive(reg, a, 0));
	CU_ASSERT_PTR_NULL(snapkvd_groups_arrive(reg, b, 0));
	/* before the deadline, sessions alive: nothing */
	CU_ASSERT_PTR_NULL(snapkvd_groups_sweep(reg, 999999999ull, false));
	/* past t1's deadline (1000 ms): t1 fails, t2 is kept... */
	b->gm.group->deadline_ns = UINT64_MAX;
	list = snapkvd_groups_sweep(reg, 1000000001ull, false);
	CU_ASSERT_PTR_EQUAL(list, a);
	CU_ASSERT_EQUAL(count(list), 1);
	CU_ASSERT_EQUAL(a->status, -ETIMEDOUT);
	CU_ASSERT(strstr(a->err, "1 of 2 members arrived") != NULL);
	/* ...until its member's session ends */
	ended = true;
	CU_ASSERT_PTR_EQUAL(snapkvd_groups_sweep(reg, 0, false), b);
	CU_ASSERT_EQUAL(b->status, -ECANCELED);
	ended = false;
	snapkvd_groups_stats(reg, &st);
	CU_ASSERT_EQUAL(st.timeouts, 1);
	CU_ASSERT_EQUAL(st.failed, 1);
	CU_ASSERT_EQUAL(st.pending, 0);
	drop(a), drop(b);
	/* the daemon stops with a member parked */
	a = member("t3", 2);
	CU_ASSERT_EQUAL(join(a, UID, err), 0);
	scored(a, 4, 1.0f);
	CU_ASSERT_PTR_NULL(snapkvd_groups_arrive(reg, a, 0));
	CU_ASSERT_PTR_EQUAL(snapkvd_groups_sweep(reg, 0, true), a);
	CU_ASSERT_EQUAL(a->status, -ESHUTDOWN);
	drop(a);
	CU_ASSERT_EQUAL(pendings, 0);
	snapkvd_groups_free(reg);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("group", NULL, NULL);
	CU_add_test(su, "joining: keys per tenant, size, dtype, parameters, limits", test_join);
	CU_add_test(su, "the last arrival decides C* and the fallback", test_decide);
	CU_add_test(su, "an arrival fails a group with an ended member", test_arrival_sees_ended);
	CU_add_test(su, "a member's failure fails the group", test_member_fails);
	CU_add_test(su, "the sweep: deadline, ended session, shutdown", test_sweep);
	return t_run();
}
