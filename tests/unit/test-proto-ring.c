// SPDX-License-Identifier: MIT
/* test-proto-ring: ring layout checks, wraparound, full/empty, corrupt indices, SPSC order. */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdlib.h>

#include "proto/skv-ring.h"

struct ring {
	void *mem;
	struct skv_ring_layout *l;
	struct skv_ring_q sq_p, sq_c;
};

static void ring_new(struct ring *r, uint32_t entries)
{
	struct skv_ring_layout l = {0};

	CU_ASSERT_FATAL(skv_ring_layout_init(&l, entries, entries * 2, 256) == 0);
	r->mem = aligned_alloc(4096, (l.total_size + 4095) & ~4095ull);
	memset(r->mem, 0, l.total_size);
	memcpy(r->mem, &l, sizeof(l));
	r->l = r->mem;
	skv_ring_q_init(&r->sq_p, r->mem, l.sq_off, l.sq_entries, l.sq_entry_size);
	skv_ring_q_init(&r->sq_c, r->mem, l.sq_off, l.sq_entries, l.sq_entry_size);
}

static void test_layout(void)
{
	struct skv_ring_layout l;

	CU_ASSERT_EQUAL(skv_ring_layout_init(&l, 3, 8, 256), -EINVAL);
	CU_ASSERT_EQUAL(skv_ring_layout_init(&l, 8, 8, 100), -EINVAL);
	CU_ASSERT_EQUAL(skv_ring_layout_init(&l, 1u << 20, 8, 256), -EINVAL);
	CU_ASSERT_EQUAL_FATAL(skv_ring_layout_init(&l, 64, 128, 4096), 0);
	CU_ASSERT_EQUAL(skv_ring_layout_check(&l, l.total_size), 0);
	CU_ASSERT_EQUAL(skv_ring_layout_check(&l, l.total_size - 1), -EBADMSG);
	/* head and tail on their own cache lines */
	CU_ASSERT_EQUAL(offsetof(struct skv_ring_ctl, tail) - offsetof(struct skv_ring_ctl, head),
			64);
	struct skv_ring_layout b = l;
	b.magic ^= 1;
	CU_ASSERT_EQUAL(skv_ring_layout_check(&b, l.total_size), -EBADMSG);
	b = l;
	b.version = 9;
	CU_ASSERT_EQUAL(skv_ring_layout_check(&b, l.total_size), -EPROTONOSUPPORT);
	b = l;
	b.cq_off = b.sq_off + 64; /* overlaps the SQ */
	CU_ASSERT_EQUAL(skv_ring_layout_check(&b, l.total_size), -EBADMSG);
	b = l;
	b.sq_entries = 48;
	CU_ASSERT_EQUAL(skv_ring_layout_check(&b, l.total_size), -EBADMSG);
	b = l;
	b.arg_slot_size = 0x7fffffff;
	CU_ASSERT_EQUAL(skv_ring_layout_check(&b, l.total_size), -EBADMSG);
}

static void test_full_empty_wrap(void)
{
	struct ring r;
	struct skv_sqe e = {0}, o;
	const uint32_t start = 0xfffffff0u; /* free-running indices cross 2^32 */

	ring_new(&r, 8);
	atomic_store(&r.sq_p.ctl->head, start);
	atomic_store(&r.sq_p.ctl->tail, start);
	r.sq_p.local = start;
	r.sq_c.local = start;
	CU_ASSERT_EQUAL(skv_ring_consume(&r.sq_c, &o), -EAGAIN);
	for (int round = 0; round < 10; round++) {
		for (int i = 0; i < 8; i++) {
			e.user_data = round * 100 + i;
			CU_ASSERT_EQUAL(skv_ring_produce(&r.sq_p, &e), 0);
		}
		CU_ASSERT_EQUAL(skv_ring_produce(&r.sq_p, &e), -EAGAIN);
		CU_ASSERT_EQUAL(skv_ring_space(&r.sq_p), 0);
		CU_ASSERT_EQUAL(skv_ring_ready(&r.sq_c), 8);
		for (int i = 0; i < 8; i++) {
			CU_ASSERT_EQUAL(skv_ring_consume(&r.sq_c, &o), 0);
			CU_ASSERT_EQUAL(o.user_data, (uint64_t)(round * 100 + i));
		}
		CU_ASSERT_EQUAL(skv_ring_consume(&r.sq_c, &o), -EAGAIN);
	}
	CU_ASSERT(r.sq_c.local < start); /* wrapped */
	free(r.mem);
}

static void test_corrupt(void)
{
	struct ring r;
	struct skv_sqe e = {0}, o;

	ring_new(&r, 8);
	/* a tail more than n_entries ahead of our head */
	atomic_store(&r.sq_p.ctl->tail, 9);
	CU_ASSERT_EQUAL(skv_ring_consume(&r.sq_c, &o), -EBADMSG);
	CU_ASSERT_EQUAL(skv_ring_ready(&r.sq_c), -EBADMSG);
	/* a tail behind our head */
	atomic_store(&r.sq_p.ctl->tail, 0xffffffffu);
	CU_ASSERT_EQUAL(skv_ring_consume(&r.sq_c, &o), -EBADMSG);
	CU_ASSERT_EQUAL(r.sq_c.local, 0); /* nothing consumed */
	/* the producer sees an impossible head */
	atomic_store(&r.sq_p.ctl->head, 5);
	CU_ASSERT_EQUAL(skv_ring_produce(&r.sq_p, &e), -EBADMSG);
	free(r.mem);
}

static void test_wakeup(void)
{
	struct ring r;
	struct skv_sqe e = {0}, o;

	ring_new(&r, 8);
	CU_ASSERT_EQUAL(skv_ring_prepare_sleep(&r.sq_c), 1);
	CU_ASSERT_EQUAL(skv_ring_produce(&r.sq_p, &e), 0);
	CU_ASSERT_EQUAL(skv_ring_needs_wakeup(&r.sq_p), 1);
	skv_ring_clear_wakeup(&r.sq_c);
	CU_ASSERT_EQUAL(skv_ring_needs_wakeup(&r.sq_p), 0);
	/* an entry already there: not safe to sleep, flag left clear */
	CU_ASSERT_EQUAL(skv_ring_prepare_sleep(&r.sq_c), 0);
	CU_ASSERT_EQUAL(skv_ring_needs_wakeup(&r.sq_p), 0);
	CU_ASSERT_EQUAL(skv_ring_consume(&r.sq_c, &o), 0);
	free(r.mem);
}

#define N_ITEMS 200000
static void *producer(void *arg)
{
	struct ring *r = arg;
	struct skv_sqe e = {0};

	for (uint64_t i = 0; i < N_ITEMS;) {
		e.user_data = i;
		if (skv_ring_produce(&r->sq_p, &e) == 0)
			i++;
	}
	return NULL;
}

static void test_spsc_threads(void)
{
	struct ring r;
	struct skv_sqe o;
	pthread_t t;
	uint64_t want = 0;
	int bad = 0;

	ring_new(&r, 16);
	pthread_create(&t, NULL, producer, &r);
	while (want < N_ITEMS) {
		int n = skv_ring_consume(&r.sq_c, &o);
		if (n == -EAGAIN)
			continue;
		if (n < 0 || o.user_data != want)
			bad++;
		want++;
	}
	pthread_join(t, NULL);
	CU_ASSERT_EQUAL(bad, 0);
	free(r.mem);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("proto-ring", NULL, NULL);
	CU_add_test(s, "layout", test_layout);
	CU_add_test(s, "full, empty, wraparound", test_full_empty_wrap);
	CU_add_test(s, "corrupt indices", test_corrupt);
	CU_add_test(s, "need wakeup", test_wakeup);
	CU_add_test(s, "spsc two threads", test_spsc_threads);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return fails ? 1 : 0;
}
