// SPDX-License-Identifier: MIT
/*
 * test-device-hostreg: host registrations shared by the devices' workers
 * (daemon/snapkvd-device-hostreg.c) against a fake plugin that refuses a
 * page registered twice (-EEXIST), as CUDA does: two jobs holding the same
 * range register it once and it goes with the last hold; overlapping holds
 * register only the pages not yet registered, and a run stays while any
 * hold overlaps it (two mass arrays on one heap page); a registration that
 * fails leaves nothing registered; a device that does not see host memory
 * at its host address is refused (-ENOTSUP) and unregistered.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-device-hostreg.c"
#include "tests/test-skip.h"

#define PG 4096u

/* the fake plugin: registered page ranges, refusals on demand */
static struct {
	uintptr_t b, e;
} regd[64];
static unsigned n_regd, registers, unregisters;
static int fail_next;	/* the next register fails with this */
static bool other_addr; /* the next register answers another address */

static int fake_register(struct skv_cuda_dev *dev, void *ptr, uint64_t size, void **ret_dev,
			 struct skv_error *err)
{
	uintptr_t b = (uintptr_t)ptr & ~(uintptr_t)(PG - 1);
	uintptr_t e = ((uintptr_t)ptr + size + PG - 1) & ~(uintptr_t)(PG - 1);

	(void)dev;
	registers++;
	if (fail_next) {
		int r = fail_next;

		fail_next = 0;
		snprintf(err->msg, sizeof(err->msg), "no");
		return r;
	}
	for (unsigned i = 0; i < n_regd; i++)
		if (regd[i].b < e && b < regd[i].e)
			return -EEXIST;
	regd[n_regd].b = b;
	regd[n_regd].e = e;
	n_regd++;
	*ret_dev = other_addr ? (char *)ptr + PG : ptr;
	other_addr = false;
	return 0;
}

static void fake_unregister(struct skv_cuda_dev *dev, void *ptr)
{
	(void)dev;
	unregisters++;
	for (unsigned i = 0; i < n_regd; i++)
		if (regd[i].b == (uintptr_t)ptr) {
			regd[i] = regd[--n_regd];
			return;
		}
	CU_FAIL("unregister of a range not registered");
}

static const struct skv_backend_ops fake_ops = {
    .host_register = fake_register,
    .host_unregister = fake_unregister,
};

/* whether byte a's page is registered */
static bool page_in(const void *a)
{
	for (unsigned i = 0; i < n_regd; i++)
		if ((uintptr_t)a >= regd[i].b && (uintptr_t)a < regd[i].e)
			return true;
	return false;
}

static char *mem;
static struct snapkvd_hostreg *h;
static struct skv_cuda_dev *dev0 = (struct skv_cuda_dev *)1, *dev1 = (struct skv_cuda_dev *)2;

static int suite_init(void)
{
	mem = aligned_alloc(PG, 16 * PG);
	return mem && snapkvd_hostreg_new(&fake_ops, &h) == 0 ? 0 : -1;
}

static int suite_clean(void)
{
	snapkvd_hostreg_free(h);
	free(mem);
	return 0;
}

static void test_same_range(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_hostreg_hold *a = NULL, *b = NULL;

	registers = unregisters = 0;
	CU_ASSERT_EQUAL_FATAL(snapkvd_hostreg_hold(h, dev0, mem, 3 * PG, &a, &err), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_hostreg_hold(h, dev1, mem, 3 * PG, &b, &err), 0);
	CU_ASSERT_EQUAL(registers, 1); /* the second found it registered */
	snapkvd_hostreg_release(h, dev0, a);
	CU_ASSERT(page_in(mem) && page_in(mem + 2 * PG)); /* device 1's job still runs */
	CU_ASSERT_EQUAL(unregisters, 0);
	snapkvd_hostreg_release(h, dev1, b);
	CU_ASSERT_EQUAL(unregisters, 1);
	CU_ASSERT_EQUAL(n_regd, 0);
}

static void test_overlap(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_hostreg_hold *a = NULL, *b = NULL, *m1 = NULL, *m2 = NULL;

	registers = unregisters = 0;
	CU_ASSERT_EQUAL_FATAL(snapkvd_hostreg_hold(h, dev0, mem, 3 * PG, &a, &err), 0);
	/* pages 2..4: page 2 is registered, 3..4 are registered now */
	CU_ASSERT_EQUAL_FATAL(snapkvd_hostreg_hold(h, dev1, mem + 2 * PG + 8, 2 * PG, &b, &err), 0);
	CU_ASSERT_EQUAL(registers, 2);
	CU_ASSERT(page_in(mem + 4 * PG));
	snapkvd_hostreg_release(h, dev0, a);
	/* pages 0..2 are one run, and b still holds page 2 */
	CU_ASSERT(page_in(mem) && page_in(mem + 2 * PG));
	snapkvd_hostreg_release(h, dev1, b);
	CU_ASSERT_EQUAL(n_regd, 0);
	CU_ASSERT_EQUAL(unregisters, 2);
	/* two small arrays on one page (two jobs' mass arrays) */
	CU_ASSERT_EQUAL(snapkvd_hostreg_hold(h, dev0, mem + 8 * PG + 16, 64, &m1, &err), 0);
	CU_ASSERT_EQUAL(snapkvd_hostreg_hold(h, dev1, mem + 8 * PG + 512, 64, &m2, &err), 0);
	snapkvd_hostreg_release(h, dev0, m1);
	CU_ASSERT(page_in(mem + 8 * PG + 512));
	snapkvd_hostreg_release(h, dev1, m2);
	CU_ASSERT_EQUAL(n_regd, 0);
	snapkvd_hostreg_release(h, dev0, NULL);
}

static void test_failures(void)
{
	struct skv_error err = {{0}, -1, -1};
	struct snapkvd_hostreg_hold *a = NULL, *b = NULL;

	/* a hold over a registered run and a new one whose registration fails:
	 * refused, the run it would have added never made, the other intact */
	CU_ASSERT_EQUAL_FATAL(snapkvd_hostreg_hold(h, dev0, mem + 2 * PG, PG, &a, &err), 0);
	fail_next = -ENOMEM;
	CU_ASSERT_EQUAL(snapkvd_hostreg_hold(h, dev1, mem, 4 * PG, &b, &err), -ENOMEM);
	CU_ASSERT_PTR_NULL(b);
	CU_ASSERT_EQUAL(n_regd, 1);
	/* the first run [0, 2) failed: nothing registered past it either */
	CU_ASSERT(!page_in(mem) && !page_in(mem + 3 * PG));
	snapkvd_hostreg_release(h, dev0, a);
	CU_ASSERT_EQUAL(n_regd, 0);
	/* the GPU sees the memory at another address: refused and undone */
	other_addr = true;
	CU_ASSERT_EQUAL(snapkvd_hostreg_hold(h, dev0, mem, PG, &a, &err), -ENOTSUP);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "host address"));
	CU_ASSERT_EQUAL(n_regd, 0);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("device-hostreg", suite_init, suite_clean);
	CU_add_test(su, "one range, two devices' jobs: registered once, until the last",
		    test_same_range);
	CU_add_test(su, "overlapping holds: only new pages, a run while any holds it",
		    test_overlap);
	CU_add_test(su, "a failed registration leaves nothing; another address refused",
		    test_failures);
	return t_run();
}
