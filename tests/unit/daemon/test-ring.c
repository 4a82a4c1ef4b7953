// SPDX-License-Identifier: MIT
/*
 * test-ring: the daemon's end of a ring without a session
 * (daemon/snapkvd-ring.c): its size and memfd, SQEs taken only with a CQ
 * slot for their completion, argument slots copied and bounded, PRESSURE
 * events that never take a request's completion slot and coalesce while
 * one is unread, NEED_WAKEUP on both queues, and corrupt indices reported
 * as -EBADMSG. The engine's side is played here.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "daemon/snapkvd-ring.c"
#include "tests/test-skip.h"

static struct snapkvd_ring *r;
static struct skv_ring_q esq, ecq; /* the engine's ends */

static void open_ring(uint32_t want_sq)
{
	r = NULL;
	CU_ASSERT_EQUAL_FATAL(snapkvd_ring_new(want_sq, 16, 256, &r), 0);
	skv_ring_q_init(&esq, r->map, r->layout.sq_off, r->layout.sq_entries,
			sizeof(struct skv_sqe));
	skv_ring_q_init(&ecq, r->map, r->layout.cq_off, r->layout.cq_entries,
			sizeof(struct skv_cqe));
}

static void submit(uint8_t opcode, uint64_t user_data, uint32_t slot, uint32_t len)
{
	struct skv_sqe sqe = {.opcode = opcode, .slot = slot, .len = len, .user_data = user_data};

	CU_ASSERT_EQUAL(skv_ring_produce(&esq, &sqe), 0);
}

/* What the dispatcher does with a NOP: take it, complete it. 1 or 0. */
static int serve_one(void)
{
	struct skv_sqe sqe;
	int n = snapkvd_ring_next(r, &sqe);

	if (n == 1) {
		struct skv_cqe cqe = {.user_data = sqe.user_data};

		CU_ASSERT_EQUAL(snapkvd_ring_complete(r, &cqe), 0);
	}
	return n;
}

static int reap(struct skv_cqe *cqe)
{
	return skv_ring_consume(&ecq, cqe);
}

/* The SQ size asked for, rounded up; the default otherwise; a sealed
 * memfd until it is sent. */
static void test_new(void)
{
	struct skv_ring_layout l;

	open_ring(3);
	CU_ASSERT_EQUAL(r->layout.sq_entries, 4);
	CU_ASSERT_EQUAL(r->layout.cq_entries, 8);
	memcpy(&l, r->map, sizeof(l)); /* the header the engine reads */
	CU_ASSERT_EQUAL(l.sq_entries, 4);
	CU_ASSERT_EQUAL(l.total_size, r->bytes);
	CU_ASSERT(fcntl(r->fd, F_GET_SEALS) & F_SEAL_GROW);
	snapkvd_ring_memfd_sent(r);
	CU_ASSERT_EQUAL(r->fd, -1);
	snapkvd_ring_memfd_sent(r); /* twice: nothing */
	snapkvd_ring_free(r);
	open_ring(0);
	CU_ASSERT_EQUAL(r->layout.sq_entries, 16);
	snapkvd_ring_free(r);
	open_ring(SKV_RING_MAX_ENTRIES + 1);
	CU_ASSERT_EQUAL(r->layout.sq_entries, 16);
	snapkvd_ring_free(r);
	snapkvd_ring_free(NULL);
}

/* An engine that stops reading completions stops being served: nothing is
 * dropped, and the rest is taken, in order, once it reads again. */
static void test_back_pressure(void)
{
	struct skv_cqe cqe;
	struct skv_sqe sqe;

	open_ring(4);
	for (int i = 0; i < 4; i++)
		submit(SKV_OP_NOP, i, 0, 0);
	for (int i = 0; i < 4; i++)
		CU_ASSERT_EQUAL(serve_one(), 1);
	for (int i = 4; i < 8; i++)
		submit(SKV_OP_NOP, i, 0, 0);
	for (int i = 4; i < 8; i++)
		CU_ASSERT_EQUAL(serve_one(), 1);
	submit(SKV_OP_NOP, 8, 0, 0);
	submit(SKV_OP_NOP, 9, 0, 0);
	CU_ASSERT_EQUAL(serve_one(), 0); /* the CQ is full */
	CU_ASSERT_EQUAL(skv_ring_ready(&r->sq), 2);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.user_data, 0);
	/* taken but not completed: in flight, it holds its CQ slot */
	CU_ASSERT_EQUAL(snapkvd_ring_next(r, &sqe), 1);
	CU_ASSERT_EQUAL(sqe.user_data, 8);
	CU_ASSERT_EQUAL(r->inflight, 1);
	CU_ASSERT_EQUAL(snapkvd_ring_next(r, &sqe), 0);
	cqe = (struct skv_cqe){.user_data = 8};
	CU_ASSERT_EQUAL(snapkvd_ring_complete(r, &cqe), 0);
	CU_ASSERT_EQUAL(r->inflight, 0);
	for (int i = 1; i <= 8; i++) {
		CU_ASSERT_EQUAL(reap(&cqe), 0);
		CU_ASSERT_EQUAL(cqe.user_data, (uint64_t)i);
	}
	CU_ASSERT_EQUAL(serve_one(), 1);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.user_data, 9);
	CU_ASSERT_EQUAL(serve_one(), 0); /* empty */
	snapkvd_ring_free(r);
}

/* A slot is copied before it is parsed, and only a slot of the ring. */
static void test_arg(void)
{
	struct skv_sqe sqe = {.opcode = SKV_OP_REQUEST, .slot = 1, .len = 5};
	const uint8_t *buf = NULL;

	open_ring(4);
	memcpy(snapkvd_ring_slot(r, 1), "hello", 5);
	CU_ASSERT_EQUAL(snapkvd_ring_arg(r, &sqe, &buf), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
	memcpy(snapkvd_ring_slot(r, 1), "HELLO", 5); /* the engine rewrites it */
	CU_ASSERT_EQUAL(memcmp(buf, "hello", 5), 0);
	CU_ASSERT_EQUAL(snapkvd_ring_slot_size(r), r->layout.arg_slot_size);
	sqe.slot = r->layout.arg_slots;
	CU_ASSERT_EQUAL(snapkvd_ring_arg(r, &sqe, &buf), -EINVAL);
	sqe.slot = 0;
	sqe.len = r->layout.arg_slot_size + 1;
	CU_ASSERT_EQUAL(snapkvd_ring_arg(r, &sqe, &buf), -EINVAL);
	sqe.len = r->layout.arg_slot_size;
	CU_ASSERT_EQUAL(snapkvd_ring_arg(r, &sqe, &buf), 0);
	snapkvd_ring_free(r);
}

/* Events never take the completion slot of a request in flight, and one
 * unread event per ring: the newest waits for it, the others coalesce. */
static void test_events(void)
{
	struct skv_cqe cqe;

	open_ring(4);
	CU_ASSERT_EQUAL(snapkvd_ring_post_pressure(r, 1, 512, 500, 12345), 1);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.flags, SKV_CQE_F_EVENT);
	CU_ASSERT_EQUAL(cqe.user_data, SKV_EVENT_PRESSURE);
	CU_ASSERT_EQUAL(cqe.res, 2); /* level 1 (high) + 1 */
	CU_ASSERT_EQUAL(cqe.slot, 512);
	CU_ASSERT_EQUAL(cqe.len, 500);
	CU_ASSERT_EQUAL(cqe.reserved, 12345);
	CU_ASSERT_TRUE(r->cq_dirty);
	r->inflight = 8; /* 8 CQ slots, 8 requests in flight: missed */
	CU_ASSERT_EQUAL(snapkvd_ring_post_pressure(r, 2, 0, 0, 0), -EAGAIN);
	r->inflight = 7;
	CU_ASSERT_EQUAL(snapkvd_ring_post_pressure(r, 2, 0, 0, 0), 1);
	CU_ASSERT_EQUAL(snapkvd_ring_post_pressure(r, 0, 2048, 1000, 7), 1);
	CU_ASSERT_EQUAL(snapkvd_ring_post_pressure(r, 1, 1024, 500, 8), 1);
	CU_ASSERT_TRUE(r->pev_waiting);
	CU_ASSERT_EQUAL(r->events_coalesced, 1);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.res, 3);
	CU_ASSERT_EQUAL(reap(&cqe), -EAGAIN); /* nothing more until flushed */
	snapkvd_ring_flush(r);		      /* the engine read it: the newest goes */
	CU_ASSERT_FALSE(r->pev_waiting);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.res, 2);
	CU_ASSERT_EQUAL(cqe.reserved, 8);
	snapkvd_ring_free(r);
}

/* The engine sleeping on its CQ is woken once per flush with new CQEs;
 * the daemon about to sleep sets NEED_WAKEUP and stays up for work it may
 * take. */
static void test_wakeup(void)
{
	eventfd_t v = 0;

	open_ring(4);
	atomic_fetch_or(&r->cq.ctl->flags, SKV_RING_NEED_WAKEUP); /* the engine sleeps */
	submit(SKV_OP_NOP, 1, 0, 0);
	CU_ASSERT_EQUAL(serve_one(), 1);
	snapkvd_ring_flush(r);
	CU_ASSERT_EQUAL(eventfd_read(r->cq_efd, &v), 0);
	CU_ASSERT_EQUAL(v, 1);
	snapkvd_ring_flush(r); /* nothing new: no second wakeup */
	CU_ASSERT_EQUAL(eventfd_read(r->cq_efd, &v), -1);
	/* empty SQ: sleep, with the flag up for the engine */
	CU_ASSERT_EQUAL(snapkvd_ring_prepare_sleep(r), 0);
	CU_ASSERT_TRUE(skv_ring_needs_wakeup(&esq));
	snapkvd_ring_wake(r);
	CU_ASSERT_FALSE(skv_ring_needs_wakeup(&esq));
	/* work arrived: stay awake, flag down */
	submit(SKV_OP_NOP, 2, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_ring_prepare_sleep(r), 1);
	CU_ASSERT_FALSE(skv_ring_needs_wakeup(&esq));
	/* work it may not take (a full CQ) does not keep it awake */
	r->inflight = 7;
	CU_ASSERT_EQUAL(snapkvd_ring_prepare_sleep(r), 0);
	r->inflight = 0;
	snapkvd_ring_free(r);
}

/* Indices we cannot trust are -EBADMSG, never a read out of the ring. */
static void test_corrupt(void)
{
	struct skv_sqe sqe;
	struct skv_cqe cqe = {0};

	open_ring(4);
	atomic_store(&r->sq.ctl->tail, r->sq.local + r->layout.sq_entries + 3);
	CU_ASSERT_EQUAL(snapkvd_ring_next(r, &sqe), -EBADMSG);
	CU_ASSERT_EQUAL(snapkvd_ring_prepare_sleep(r), -EBADMSG);
	snapkvd_ring_free(r);
	open_ring(4);
	atomic_store(&r->cq.ctl->head, r->cq.local + 100);
	submit(SKV_OP_NOP, 1, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_ring_next(r, &sqe), -EBADMSG);
	CU_ASSERT_EQUAL(snapkvd_ring_post_pressure(r, 1, 0, 0, 0), -EBADMSG);
	CU_ASSERT_EQUAL(snapkvd_ring_prepare_sleep(r), -EBADMSG);
	r->inflight = 1;
	CU_ASSERT_EQUAL(snapkvd_ring_complete(r, &cqe), -EBADMSG);
	snapkvd_ring_free(r);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("ring", NULL, NULL);
	CU_add_test(su, "size, layout header, sealed memfd", test_new);
	CU_add_test(su, "back-pressure on a full CQ", test_back_pressure);
	CU_add_test(su, "argument slots copied and bounded", test_arg);
	CU_add_test(su, "pressure events", test_events);
	CU_add_test(su, "NEED_WAKEUP on both queues", test_wakeup);
	CU_add_test(su, "corrupt indices", test_corrupt);
	return t_run();
}
