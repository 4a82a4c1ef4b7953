// SPDX-License-Identifier: MIT
/*
 * test-job: one unit of work (daemon/snapkvd-job.c): a new job's kind,
 * session, origin and admission time; buffer references held once each
 * and dropped with the job (the last one frees the buffer); what it owns
 * freed with it; the cancel flags and their reasons; the writing mark.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-job.c"
#include "tests/test-skip.h"

static void test_new(void)
{
	struct snapkvd_origin o = {.ring = true, .has_slot = true, .slot = 3, .user_data = 77};
	struct snapkvd_session *s = (struct snapkvd_session *)&o; /* only its address */
	uint64_t t0 = snapkvd_now_ns();
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_COMPACT, s, &o);

	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_EQUAL(j->kind, SNAPKVD_JOB_COMPACT);
	CU_ASSERT_PTR_EQUAL(j->s, s);
	CU_ASSERT_EQUAL(j->origin.slot, 3);
	CU_ASSERT_EQUAL(j->origin.user_data, 77);
	CU_ASSERT(j->t_start >= t0 && j->t_start <= snapkvd_now_ns());
	CU_ASSERT_EQUAL(j->status, 0);
	CU_ASSERT_PTR_NULL(j->cache);
	snapkvd_job_free(j);
	snapkvd_job_free(NULL);
}

static void test_buffers(void)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_GROW, NULL, &o);
	struct snapkvd_buffer *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));

	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	a->refs = b->refs = 1; /* the session's */
	j->bufs = calloc(2, sizeof(*j->bufs));
	snapkvd_job_hold(j, a);
	snapkvd_job_hold(j, b);
	snapkvd_job_hold(j, a); /* once each */
	CU_ASSERT_EQUAL(j->n_bufs, 2);
	CU_ASSERT_EQUAL(a->refs, 2);
	CU_ASSERT_EQUAL(b->refs, 2);
	/* the session lets b go first: the job's reference keeps it */
	snapkvd_buffer_unref(b);
	CU_ASSERT_EQUAL(b->refs, 1);
	/* what the job owns goes with it (valgrind: nothing leaked) */
	j->out_table = malloc(16);
	j->wb_k_off = calloc(2, sizeof(uint64_t));
	j->g.old_k = malloc(8);
	snapkvd_job_free(j); /* b's last reference: freed */
	CU_ASSERT_EQUAL(a->refs, 1);
	snapkvd_buffer_unref(a);
}

static void test_cancel(void)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = snapkvd_job_new(SNAPKVD_JOB_COMPACT, NULL, &o);
	bool ended = false;

	CU_ASSERT_PTR_NOT_NULL_FATAL(j);
	CU_ASSERT_FALSE(snapkvd_job_cancelled(j)); /* no flag at all */
	j->cancel = &ended;
	CU_ASSERT_FALSE(snapkvd_job_cancelled(j));
	ended = true;
	CU_ASSERT_TRUE(snapkvd_job_cancelled(j));
	CU_ASSERT_STRING_EQUAL(snapkvd_job_cancel_reason(j), "the session ended");
	j->cancel_req = true;
	CU_ASSERT_STRING_EQUAL(snapkvd_job_cancel_reason(j), "the request was cancelled");
	ended = false;
	CU_ASSERT_TRUE(snapkvd_job_cancelled(j));
	CU_ASSERT_FALSE(j->writing);
	snapkvd_job_mark_writing(j);
	CU_ASSERT_TRUE(j->writing);
	snapkvd_job_free(j);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("job", NULL, NULL);
	CU_add_test(su, "a new job", test_new);
	CU_add_test(su, "buffer references", test_buffers);
	CU_add_test(su, "cancel flags and the writing mark", test_cancel);
	return t_run();
}
