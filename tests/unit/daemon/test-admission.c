// SPDX-License-Identifier: MIT
/*
 * test-admission: admitting a validated job (daemon/snapkvd-admission.c)
 * on a real pool, arena and group registry, with the pressure policy
 * faked: the policy brought up to date before its rule judges, each
 * refusal (the policy's, the pool's, the quota's, the arena's, a decision
 * group's) with its reason and nothing held after it, a COMPACT placed
 * with its outputs pointed at the region, each cache with an id and region of
 * its own, and a GROW's region. (K/V in a GPU arena: test-device, on
 * the emulator.)
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-admission.c"
#include "tests/test-skip.h"

/* ------------------------------------------------------------- the fakes */

static int fake_admit;
static unsigned scaled, calls;
static unsigned changed_at, admitted_at; /* the order of the policy's calls */

void snapkvd_policy_count_scaled(struct snapkvd_policy *ops)
{
	(void)ops;
	scaled++;
}

int snapkvd_policy_pool_changed(struct snapkvd_policy *ops, uint64_t used, uint64_t total)
{
	(void)ops, (void)used, (void)total;
	changed_at = ++calls;
	return 0;
}

int snapkvd_policy_admit(struct snapkvd_policy *ops, uid_t uid, uint64_t tenant_used,
			 uint64_t request, char *msg, size_t msg_len)
{
	(void)ops, (void)uid, (void)tenant_used, (void)request;
	admitted_at = ++calls;
	if (fake_admit)
		snprintf(msg, msg_len, "refused by the policy");
	return fake_admit;
}

/* ----------------------------------------------------------- the setting */

static struct snapkvd_server srv;
static struct snapkvd_session sess;
static char err[256];

static int setup(uint64_t pool_bytes, uint64_t quota)
{
	memset(&srv, 0, sizeof(srv));
	memset(&sess, 0, sizeof(sess));
	snapkvd_config_defaults(&srv.cfg);
	fake_admit = 0;
	scaled = calls = 0;
	if (snapkvd_pool_new(pool_bytes, quota, &srv.pool) < 0 ||
	    snapkvd_pool_tenant_get(srv.pool, 1000, &sess.tenant) < 0 ||
	    snapkvd_arena_new(1 << 20, "test-admission", &sess.arena) < 0 ||
	    snapkvd_groups_new(&srv.groups) < 0)
		return -1;
	sess.srv = &srv;
	sess.uid = 1000;
	return 0;
}

static void teardown(void)
{
	snapkvd_groups_free(srv.groups);
	snapkvd_arena_free(sess.arena);
	snapkvd_pool_tenant_put(srv.pool, sess.tenant);
	snapkvd_pool_free(srv.pool);
}

/* A COMPACT of 2 layers x 2 heads x 20 slots of 8 f32, validated. */
static struct snapkvd_job *compact_job(void)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_COMPACT, &sess, &o);
	struct snapkvd_cache *c = NULL;

	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_EQUAL_FATAL(snapkvd_cache_new(2, 2, &c), 0);
	c->h_q = c->h_kv = 2;
	c->head_dim = 8;
	c->dtype = SKV_DTYPE_F32;
	c->dtype_bytes = 4;
	c->kept = 16;
	c->slots = 20;
	j->cache = c;
	j->layers = 2;
	j->out = calloc(2, sizeof(*j->out));
	CU_ASSERT_EQUAL_FATAL(snapkvd_cache_geometry(2, 2, 20, 8, 4, sess.arena->size, &j->geom),
			      0);
	return j;
}

/* Give back what an admitted job holds. */
static void release(struct snapkvd_job *j)
{
	snapkvd_pool_cancel(srv.pool, &j->resv);
	snapkvd_arena_release(sess.arena, j->cache->region_off, j->cache->region_bytes);
	snapkvd_job_free(j);
}

static void test_compact(void)
{
	struct snapkvd_job *j, *j2;

	CU_ASSERT_EQUAL_FATAL(setup(1 << 30, 0), 0);
	j = compact_job();
	CU_ASSERT(j->geom.region > 4096);
	j->scaled = true;
	CU_ASSERT_EQUAL_FATAL(snapkvd_admission_compact(&srv, &sess, j, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(j->cache->id, 1);
	CU_ASSERT_EQUAL(scaled, 1);
	CU_ASSERT(changed_at && changed_at < admitted_at); /* up to date, then judged */
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), j->geom.region);
	CU_ASSERT_EQUAL(sess.arena->used, j->geom.region);
	CU_ASSERT_EQUAL(j->cache->region_bytes, j->geom.region);
	CU_ASSERT_PTR_EQUAL(j->host_base, sess.arena->base);
	CU_ASSERT_PTR_EQUAL(j->out[1].k.data, sess.arena->base + j->cache->k_off[1]);
	CU_ASSERT_PTR_EQUAL(j->out[1].v.data, sess.arena->base + j->cache->v_off[1]);
	CU_ASSERT_PTR_EQUAL((uint8_t *)j->out[0].positions,
			    sess.arena->base + j->cache->pos_off[0]);
	CU_ASSERT_EQUAL(j->out[0].pos_stride, 20);
	CU_ASSERT_PTR_EQUAL(j->out[1].retained_mass, j->cache->mass + 2);
	/* the next cache: its own id and region */
	j2 = compact_job();
	CU_ASSERT_EQUAL_FATAL(snapkvd_admission_compact(&srv, &sess, j2, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(j2->cache->id, 2);
	CU_ASSERT(j2->cache->region_off >= j->cache->region_off + j->cache->region_bytes);
	release(j);
	release(j2);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	teardown();
}

/* Each refusal: its errno and reason; no pool byte, no arena byte held. */
static void refused(int want, const char *why, struct snapkvd_job *j)
{
	int r = snapkvd_admission_compact(&srv, &sess, j, err, sizeof(err));

	CU_ASSERT_EQUAL(r, want);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, why));
	if (r != want || !strstr(err, why))
		fprintf(stderr, "want %d '%s', got %d '%s'\n", want, why, r, err);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	CU_ASSERT_EQUAL(sess.arena->used, 0);
	snapkvd_job_free(j);
}

static void test_refusals(void)
{
	struct snapkvd_job *j;
	uint64_t off;

	CU_ASSERT_EQUAL_FATAL(setup(1 << 30, 0), 0);
	fake_admit = -ENOSPC;
	refused(-ENOSPC, "refused by the policy", compact_job());
	fake_admit = 0;
	/* the arena full: the pool's bytes go back */
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(sess.arena, sess.arena->size - 4096, &off), 0);
	j = compact_job();
	CU_ASSERT_EQUAL(snapkvd_admission_compact(&srv, &sess, j, err, sizeof(err)), -ENOSPC);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "session arena full"));
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	snapkvd_job_free(j);
	snapkvd_arena_release(sess.arena, off, sess.arena->size - 4096);
	/* a decision group refuses last: the pool and the arena are undone */
	j = compact_job();
	j->gm.size = 2;
	snprintf(j->gm.key, sizeof(j->gm.key), "g");
	srv.cfg.max_tenant_groups = 0;
	refused(-EUSERS, "max_tenant_groups", j);
	teardown();
	CU_ASSERT_EQUAL_FATAL(setup(4096, 0), 0); /* the region is more than a page */
	refused(-ENOSPC, "pool exhausted", compact_job());
	teardown();
	CU_ASSERT_EQUAL_FATAL(setup(1 << 30, 4096), 0);
	refused(-EDQUOT, "over quota", compact_job());
	teardown();
}

static void test_grow(void)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j;

	CU_ASSERT_EQUAL_FATAL(setup(1 << 30, 0), 0);
	j = snapkvd_job_new(SNAPKVD_JOB_GROW, &sess, &o);
	j->g.geom.region = 64 * 1024;
	CU_ASSERT_EQUAL(snapkvd_admission_grow(&srv, &sess, j, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 64 * 1024);
	CU_ASSERT_PTR_EQUAL(j->host_base, sess.arena->base);
	snapkvd_pool_cancel(srv.pool, &j->resv);
	snapkvd_arena_release(sess.arena, j->g.off, 64 * 1024);
	/* the arena full: the bare reason, the pool's bytes back */
	j->g.geom.region = 2 << 20;
	CU_ASSERT_EQUAL(snapkvd_admission_grow(&srv, &sess, j, err, sizeof(err)), -ENOSPC);
	CU_ASSERT_STRING_EQUAL(err, "session arena full");
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	snapkvd_job_free(j);
	teardown();
	CU_ASSERT_EQUAL_FATAL(setup(4096, 0), 0);
	j = snapkvd_job_new(SNAPKVD_JOB_GROW, &sess, &o);
	j->g.geom.region = 8192;
	CU_ASSERT_EQUAL(snapkvd_admission_grow(&srv, &sess, j, err, sizeof(err)), -ENOSPC);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "pool exhausted: wants 8192 bytes"));
	snapkvd_job_free(j);
	teardown();
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("admission", NULL, NULL);
	CU_add_test(su, "a COMPACT placed, its outputs pointed", test_compact);
	CU_add_test(su, "refusals hold nothing", test_refusals);
	CU_add_test(su, "a GROW's region", test_grow);
	return t_run();
}
