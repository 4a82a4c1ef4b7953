// SPDX-License-Identifier: MIT
/* test-loop: the event loop's dispatch, spin and sleep on a fake clock
 * (daemon/snapkvd-loop.c). */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/snapkvd-loop.c"
#include "tests/test-skip.h"

/* The fake clock: each reading advances it by tick_ns. */
static uint64_t fake_ns, tick_ns;

uint64_t snapkvd_now_ns(void)
{
	fake_ns += tick_ns;
	return fake_ns;
}

struct probe {
	struct snapkvd_loop *l;
	int fired, last_res;
	unsigned rounds, sleeps, wakes;
	unsigned work_rounds; /* rounds that report work */
	unsigned stop_after;  /* rounds, then stop */
	bool spin, arrived;
	bool stop_on_fire; /* stop in the round after a completion */
};

static void on_ev(void *data, int res)
{
	struct probe *p = data;

	p->fired++;
	p->last_res = res;
}

static unsigned round_fn(void *data, bool *ret_spin)
{
	struct probe *p = data;

	p->rounds++;
	*ret_spin = p->spin;
	if (p->rounds >= p->stop_after || (p->stop_on_fire && p->fired))
		snapkvd_loop_stop(p->l);
	return p->rounds <= p->work_rounds;
}

static bool before_fn(void *data)
{
	struct probe *p = data;

	p->sleeps++;
	return p->arrived;
}

static void after_fn(void *data)
{
	((struct probe *)data)->wakes++;
}

static void hooks(struct probe *p, uint64_t spin_ns)
{
	const struct snapkvd_loop_hooks h = {
	    .data = p, .round = round_fn, .before_sleep = before_fn, .after_sleep = after_fn};

	snapkvd_loop_set_hooks(p->l, &h, spin_ns);
}

/* A completion reaches its {fn, data} with the operation's result. */
static void test_dispatch(void)
{
	struct probe p = {.stop_after = 1000, .stop_on_fire = true};
	uint64_t buf = 0;
	struct snapkvd_loop_ev ev = {.fn = on_ev, .data = &p};
	int efd = eventfd(0, EFD_CLOEXEC);

	CU_ASSERT_EQUAL_FATAL(snapkvd_loop_new(8, &p.l), 0);
	hooks(&p, 0);
	CU_ASSERT_EQUAL(eventfd_write(efd, 5), 0);
	CU_ASSERT_EQUAL(snapkvd_loop_read(p.l, efd, &buf, 8, &ev), 0);
	/* the read completes in the first round or after one sleep */
	CU_ASSERT_EQUAL(snapkvd_loop_run(p.l), 0);
	CU_ASSERT_EQUAL(p.fired, 1);
	CU_ASSERT_EQUAL(p.last_res, 8);
	CU_ASSERT_EQUAL(buf, 5);
	CU_ASSERT(snapkvd_loop_stopped(p.l));
	snapkvd_loop_free(p.l);
	close(efd);
}

/* While rounds report work the loop never sleeps; stop ends the run. */
static void test_busy(void)
{
	struct probe p = {.work_rounds = 100, .stop_after = 50};

	CU_ASSERT_EQUAL_FATAL(snapkvd_loop_new(8, &p.l), 0);
	hooks(&p, 0);
	tick_ns = 1000;
	CU_ASSERT_EQUAL(snapkvd_loop_run(p.l), 0);
	CU_ASSERT_EQUAL(p.rounds, 50);
	CU_ASSERT_EQUAL(p.sleeps, 0);
	snapkvd_loop_free(p.l);
}

/* Idle rounds that ask to spin keep polling until spin_ns has passed on
 * the clock, then the loop prepares to sleep; before_sleep saying work
 * arrived skips the wait (no completion is armed: a wait would hang). */
static void test_spin_then_sleep(void)
{
	struct probe p = {.work_rounds = 0, .stop_after = 13, .spin = true, .arrived = true};

	CU_ASSERT_EQUAL_FATAL(snapkvd_loop_new(8, &p.l), 0);
	hooks(&p, 10000); /* 10 us */
	tick_ns = 1000;	  /* 1 us per clock reading */
	CU_ASSERT_EQUAL(snapkvd_loop_run(p.l), 0);
	CU_ASSERT_EQUAL(p.rounds, 13);
	/* one reading at start, one per round: the 10th idle round is 10 us
	 * after the start, so rounds 1-9 spin and round 10 sleeps; after a
	 * sleep the spin starts anew, so round 11 and 12 spin again */
	CU_ASSERT_EQUAL(p.sleeps, 1);
	CU_ASSERT_EQUAL(p.wakes, 1);
	snapkvd_loop_free(p.l);
}

static void *write_later(void *arg)
{
	usleep(100000);
	(void)!eventfd_write(*(int *)arg, 1);
	return NULL;
}

/* Without spinning an idle round sleeps at once, and a sleep waits for a
 * completion (an eventfd written 100 ms later). */
static void test_sleep_waits(void)
{
	struct probe p = {.stop_after = 1000, .stop_on_fire = true};
	uint64_t buf = 0;
	struct snapkvd_loop_ev ev = {.fn = on_ev, .data = &p};
	int efd = eventfd(0, EFD_CLOEXEC);
	pthread_t th;

	CU_ASSERT_EQUAL_FATAL(snapkvd_loop_new(8, &p.l), 0);
	hooks(&p, 1000000);
	tick_ns = 1;
	CU_ASSERT_EQUAL(snapkvd_loop_read(p.l, efd, &buf, 8, &ev), 0);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&th, NULL, write_later, &efd), 0);
	CU_ASSERT_EQUAL(snapkvd_loop_run(p.l), 0);
	pthread_join(th, NULL);
	CU_ASSERT_EQUAL(p.fired, 1);
	CU_ASSERT_EQUAL(buf, 1);
	CU_ASSERT(p.sleeps >= 1);
	CU_ASSERT_EQUAL(p.sleeps, p.wakes);
	CU_ASSERT(p.rounds < 1000);
	snapkvd_loop_free(p.l);
	close(efd);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("loop", NULL, NULL);
	CU_add_test(s, "completions go to their fn", test_dispatch);
	CU_add_test(s, "busy rounds never sleep", test_busy);
	CU_add_test(s, "spin for spin_ns, then sleep", test_spin_then_sleep);
	CU_add_test(s, "a sleep waits for a completion", test_sleep_waits);
	return t_run();
}
