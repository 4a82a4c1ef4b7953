// SPDX-License-Identifier: MIT
/*
 * test-device: the device object (daemon/snapkvd-device.c) without a
 * daemon: on the host backend it is absent and refuses imports and GPU
 * arenas with -ENOTSUP; on the CUDA emulator's plugin (tests/gpu/emu,
 * SKV_CUDA_PLUGIN) it describes the GPU, exports a session's GPU arena
 * (created once, as large as asked), and its waiter thread releases a
 * prefill flag wait at its deadline by writing the value, but leaves a
 * flag the engine reached in time alone. The emulator's device memory is
 * host memory, so a flag here is a plain word.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/snapkvd-device.c"
#include "tests/test-skip.h"

static const char *emu_plugin(void)
{
	static char path[512];
	const char *build = getenv("BUILD");

	snprintf(path, sizeof(path), "%s/tests/gpu/emu/libskv-cuda-emu.so",
		 build ? build : "build");
	return access(path, R_OK) == 0 ? path : NULL;
}

static void test_host(void)
{
	struct skv_error kerr = {{0}, -1, -1};
	struct snapkvd_device *d = NULL;
	struct snapkvd_import imp;
	struct skv_cuda_arena *a = NULL;
	char err[128] = "";
	uint64_t size = 0;
	int fd = -1, dev = -1;

	CU_ASSERT_EQUAL_FATAL(snapkvd_device_new("host", &d, &kerr), 0);
	CU_ASSERT_FALSE(snapkvd_device_present(d));
	CU_ASSERT_STRING_EQUAL(snapkvd_device_backend(d), "host");
	CU_ASSERT_EQUAL(snapkvd_device_import(d, 1, 1, -1, 64, NULL, &imp, err, sizeof(err)),
			-ENOTSUP);
	CU_ASSERT_EQUAL(
	    snapkvd_device_arena_export(d, &a, 4096, 1, &fd, &size, &dev, err, sizeof(err)),
	    -ENOTSUP);
	CU_ASSERT_PTR_NULL(a);
	CU_ASSERT_EQUAL(fd, -1);
	CU_ASSERT_PTR_NULL(snapkvd_device_arena_base(d, a));
	snapkvd_device_arena_free(d, NULL);
	CU_ASSERT_EQUAL(snapkvd_device_imports(d), 0);
	CU_ASSERT_FALSE(snapkvd_device_stopping(d));
	snapkvd_device_stop(d);
	CU_ASSERT_TRUE(snapkvd_device_stopping(d));
	snapkvd_device_free(d);
	snapkvd_device_free(NULL);
}

/* No plugin where one is asked for: a reason, nothing handed out. */
static void test_no_plugin(void)
{
	struct skv_error kerr = {{0}, -1, -1};
	struct snapkvd_device *d = NULL;

	setenv("SKV_CUDA_PLUGIN", "/nonexistent/libskv-cuda.so", 1);
	CU_ASSERT(snapkvd_device_new("cuda", &d, &kerr) < 0);
	CU_ASSERT_PTR_NULL(d);
	CU_ASSERT_EQUAL(strncmp(kerr.msg, "backend cuda: ", 14), 0);
}

static struct snapkvd_device *emu_device(void)
{
	struct skv_error kerr = {{0}, -1, -1};
	struct snapkvd_device *d = NULL;
	const char *p = emu_plugin();

	if (!p) {
		fprintf(stderr, "(no emulator plugin: CUDA=0 build) ");
		return NULL;
	}
	setenv("SKV_CUDA_PLUGIN", p, 1);
	CU_ASSERT_EQUAL(snapkvd_device_new("cuda", &d, &kerr), 0);
	if (!d)
		fprintf(stderr, "%s\n", kerr.msg);
	return d;
}

static void test_arena(void)
{
	struct snapkvd_device *d = emu_device();
	struct skv_cuda_arena *a = NULL, *first;
	char err[256] = "";
	uint64_t size = 0, size2 = 0;
	int fd = -1, fd2 = -1, dev = -1;

	if (!d)
		return;
	CU_ASSERT_TRUE(snapkvd_device_present(d));
	CU_ASSERT(strlen(snapkvd_device_desc(d)) > 0);
	CU_ASSERT_EQUAL_FATAL(
	    snapkvd_device_arena_export(d, &a, 1 << 20, 7, &fd, &size, &dev, err, sizeof(err)), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT(fd >= 0);
	CU_ASSERT(size >= 1 << 20);
	CU_ASSERT(dev >= 0);
	CU_ASSERT_PTR_NOT_NULL(snapkvd_device_arena_base(d, a));
	/* asked again: the same arena, a new fd */
	first = a;
	CU_ASSERT_EQUAL(
	    snapkvd_device_arena_export(d, &a, 1 << 20, 7, &fd2, &size2, &dev, err, sizeof(err)),
	    0);
	CU_ASSERT_PTR_EQUAL(a, first);
	CU_ASSERT_EQUAL(size2, size);
	CU_ASSERT(fd2 >= 0 && fd2 != fd);
	close(fd);
	close(fd2);
	snapkvd_device_arena_free(d, a);
	snapkvd_device_free(d);
}

static bool stop_when(const void *arg)
{
	return __atomic_load_n((const bool *)arg, __ATOMIC_ACQUIRE);
}

static void test_waiter(void)
{
	struct snapkvd_device *d = emu_device();
	struct snapkvd_device_wait w = {0}, w2 = {0};
	static uint32_t flag, flag2;

	if (!d)
		return;
	snapkvd_device_wait_add(d, &w);
	snapkvd_device_wait_add(d, &w2);
	/* never signalled: released at the deadline with the value */
	flag = 0;
	snapkvd_device_wait_arm(d, &w, &flag, 5, snapkvd_now_ns() + 20 * 1000000ull);
	/* reached in time (the engine's counter is past the value): left alone */
	flag2 = 9;
	snapkvd_device_wait_arm(d, &w2, &flag2, 3, snapkvd_now_ns() + 10 * 1000000ull);
	for (int i = 0; i < 200 && __atomic_load_n(&flag, __ATOMIC_ACQUIRE) != 5; i++)
		usleep(5000);
	usleep(20000);
	CU_ASSERT_EQUAL(__atomic_load_n(&flag, __ATOMIC_ACQUIRE), 5);
	CU_ASSERT_TRUE(snapkvd_device_wait_disarm(d, &w));
	CU_ASSERT_EQUAL(flag2, 9);
	CU_ASSERT_FALSE(snapkvd_device_wait_disarm(d, &w2));
	CU_ASSERT_PTR_NULL(w.flag);
	/* stopped (its job cancelled) long before its deadline: released at
	 * the poke, without the deadline's warning */
	static bool cancelled;
	flag = 0;
	cancelled = false;
	w.stop = stop_when;
	w.stop_arg = &cancelled;
	snapkvd_device_wait_arm(d, &w, &flag, 7, snapkvd_now_ns() + 60000 * 1000000ull);
	__atomic_store_n(&cancelled, true, __ATOMIC_RELEASE);
	snapkvd_device_wait_poke(d);
	for (int i = 0; i < 12000 && __atomic_load_n(&flag, __ATOMIC_ACQUIRE) != 7; i++)
		usleep(5000); /* a hang guard: the poke releases it at once */
	CU_ASSERT_EQUAL(__atomic_load_n(&flag, __ATOMIC_ACQUIRE), 7);
	CU_ASSERT_TRUE(snapkvd_device_wait_disarm(d, &w));
	CU_ASSERT_TRUE(w.stopped);
	w.stop = NULL;
	/* disarmed before its deadline: never fired */
	flag = 0;
	snapkvd_device_wait_arm(d, &w, &flag, 5, snapkvd_now_ns() + 60000 * 1000000ull);
	CU_ASSERT_FALSE(snapkvd_device_wait_disarm(d, &w));
	CU_ASSERT_EQUAL(flag, 0);
	snapkvd_device_wait_remove(d, &w);
	snapkvd_device_wait_remove(d, &w2);
	CU_ASSERT_PTR_NULL(d->waits);
	snapkvd_device_free(d); /* joins the waiter */
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	snapkvd_log_max = SNAPKVD_LOG_ERR - 1; /* quiet */
	su = CU_add_suite("device", NULL, NULL);
	CU_add_test(su, "host backend: no device, -ENOTSUP", test_host);
	CU_add_test(su, "cuda without its plugin: refused with a reason", test_no_plugin);
	CU_add_test(su, "emulator: a GPU arena, exported twice", test_arena);
	CU_add_test(su, "emulator: the waiter releases late flags only", test_waiter);
	return t_run();
}
