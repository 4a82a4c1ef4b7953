// SPDX-License-Identifier: MIT
/*
 * test-device: the device object (daemon/snapkvd-device.c) without a
 * daemon: on the host backend it is absent and refuses imports and GPU
 * arenas with -ENOTSUP; on the CUDA emulator's plugin (tests/gpu/emu,
 * SKV_CUDA_PLUGIN) it describes the GPU, exports a session's GPU arena
 * (created once, as large as asked), and its waiter thread releases a
 * prefill flag wait at its deadline by writing the value, but leaves a
 * flag the engine reached in time alone. The emulator's device memory is
 * host memory, so a flag here is a plain word. With two emulated devices
 * (SKV_EMU_DEVICES=2): both opened by default, or those of `devices`, one
 * not there refused by name; an engine's VMM fd imported on the device it
 * was made on (the fd says which), counted there; memory on a device not
 * opened refused by name; a GPU arena on the device asked for.
 */
#include <CUnit/Basic.h>
#include <sys/mman.h>
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

	CU_ASSERT_EQUAL_FATAL(snapkvd_device_new("host", NULL, 0, &d, &kerr), 0);
	CU_ASSERT_FALSE(snapkvd_device_present(d));
	CU_ASSERT_STRING_EQUAL(snapkvd_device_backend(d), "host");
	CU_ASSERT_EQUAL(snapkvd_device_import(d, 1, 1, -1, 64, NULL, 0, &imp, err, sizeof(err)),
			-ENOTSUP);
	CU_ASSERT_EQUAL(
	    snapkvd_device_arena_export(d, 0, &a, 4096, 1, &fd, &size, &dev, err, sizeof(err)),
	    -ENOTSUP);
	CU_ASSERT_PTR_NULL(a);
	CU_ASSERT_EQUAL(fd, -1);
	CU_ASSERT_PTR_NULL(snapkvd_device_arena_base(d, a));
	snapkvd_device_arena_free(d, 0, NULL);
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
	CU_ASSERT(snapkvd_device_new("cuda", NULL, 0, &d, &kerr) < 0);
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
	CU_ASSERT_EQUAL(snapkvd_device_new("cuda", NULL, 0, &d, &kerr), 0);
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
	    snapkvd_device_arena_export(d, 0, &a, 1 << 20, 7, &fd, &size, &dev, err, sizeof(err)),
	    0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT(fd >= 0);
	CU_ASSERT(size >= 1 << 20);
	CU_ASSERT(dev >= 0);
	CU_ASSERT_PTR_NOT_NULL(snapkvd_device_arena_base(d, a));
	/* asked again: the same arena, a new fd */
	first = a;
	CU_ASSERT_EQUAL(
	    snapkvd_device_arena_export(d, 0, &a, 1 << 20, 7, &fd2, &size2, &dev, err, sizeof(err)),
	    0);
	CU_ASSERT_PTR_EQUAL(a, first);
	CU_ASSERT_EQUAL(size2, size);
	CU_ASSERT(fd2 >= 0 && fd2 != fd);
	close(fd);
	close(fd2);
	snapkvd_device_arena_free(d, 0, a);
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
	struct skv_cuda_arena *a = NULL;
	char err[256] = "";
	uint64_t size = 0;
	int fd = -1, dev = -1;
	uint32_t *flags;

	if (!d)
		return;
	/* the engine's flag words live in device memory, as a CUDA_FLAG's
	 * buffer does (the emulator checks the copy reading them) */
	CU_ASSERT_EQUAL_FATAL(
	    snapkvd_device_arena_export(d, 0, &a, 1 << 20, 7, &fd, &size, &dev, err, sizeof(err)),
	    0);
	close(fd);
	flags = (uint32_t *)snapkvd_device_arena_base(d, a);
	snapkvd_device_wait_add(d, &w);
	snapkvd_device_wait_add(d, &w2);
	/* never signalled: released at the deadline with the value */
	flags[0] = 0;
	snapkvd_device_wait_arm(d, &w, &flags[0], 5, snapkvd_now_ns() + 20 * 1000000ull);
	/* reached in time (the engine's counter is past the value): left alone */
	flags[1] = 9;
	snapkvd_device_wait_arm(d, &w2, &flags[1], 3, snapkvd_now_ns() + 10 * 1000000ull);
	for (int i = 0; i < 200 && __atomic_load_n(&flags[0], __ATOMIC_ACQUIRE) != 5; i++)
		usleep(5000);
	usleep(20000);
	CU_ASSERT_EQUAL(__atomic_load_n(&flags[0], __ATOMIC_ACQUIRE), 5);
	CU_ASSERT_TRUE(snapkvd_device_wait_disarm(d, &w));
	CU_ASSERT_EQUAL(flags[1], 9);
	CU_ASSERT_FALSE(snapkvd_device_wait_disarm(d, &w2));
	CU_ASSERT_PTR_NULL(w.flag);
	/* stopped (its job cancelled) long before its deadline: released at
	 * the poke, without the deadline's warning */
	static bool cancelled;
	flags[0] = 0;
	cancelled = false;
	w.stop = stop_when;
	w.stop_arg = &cancelled;
	snapkvd_device_wait_arm(d, &w, &flags[0], 7, snapkvd_now_ns() + 60000 * 1000000ull);
	__atomic_store_n(&cancelled, true, __ATOMIC_RELEASE);
	snapkvd_device_wait_poke(d);
	for (int i = 0; i < 12000 && __atomic_load_n(&flags[0], __ATOMIC_ACQUIRE) != 7; i++)
		usleep(5000); /* a hang guard: the poke releases it at once */
	CU_ASSERT_EQUAL(__atomic_load_n(&flags[0], __ATOMIC_ACQUIRE), 7);
	CU_ASSERT_TRUE(snapkvd_device_wait_disarm(d, &w));
	CU_ASSERT_TRUE(w.stopped);
	w.stop = NULL;
	/* disarmed before its deadline: never fired */
	flags[0] = 0;
	snapkvd_device_wait_arm(d, &w, &flags[0], 5, snapkvd_now_ns() + 60000 * 1000000ull);
	CU_ASSERT_FALSE(snapkvd_device_wait_disarm(d, &w));
	CU_ASSERT_EQUAL(flags[0], 0);
	snapkvd_device_wait_remove(d, &w);
	snapkvd_device_wait_remove(d, &w2);
	CU_ASSERT_PTR_NULL(d->waits);
	snapkvd_device_arena_free(d, 0, a);
	snapkvd_device_free(d); /* joins the waiter */
}

/* A VMM export of the emulator made on device `dev` (its memfd is named so). */
static int emu_vmm_fd(int dev, uint64_t size)
{
	char name[32];
	int fd;

	snprintf(name, sizeof(name), "emu-vmm-d%d", dev);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd >= 0 && ftruncate(fd, (off_t)size) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static struct snapkvd_device *emu_devices(const int *list, unsigned n, struct skv_error *kerr)
{
	struct snapkvd_device *d = NULL;
	const char *p = emu_plugin();

	if (!p)
		return NULL;
	setenv("SKV_CUDA_PLUGIN", p, 1);
	setenv("SKV_EMU_DEVICES", "2", 1);
	snapkvd_device_new("cuda", list, n, &d, kerr);
	return d;
}

static void test_two_devices(void)
{
	struct skv_error kerr = {{0}, -1, -1};
	struct snapkvd_device *d = emu_devices(NULL, 0, &kerr);
	struct snapkvd_device_stats st0, st1;
	struct snapkvd_import imp = {0};
	struct skv_cuda_arena *a = NULL;
	char err[256] = "";
	uint64_t size = 0;
	int fd, afd = -1, dev = -1;

	if (!emu_plugin())
		return;
	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	CU_ASSERT_EQUAL(snapkvd_device_count(d), 2);
	CU_ASSERT_EQUAL(snapkvd_device_ordinal(d, 1), 1);
	CU_ASSERT_EQUAL(snapkvd_device_index(d, 1), 1);
	CU_ASSERT_EQUAL(snapkvd_device_index(d, 2), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(snapkvd_device_desc(d), "cuda0 "));
	CU_ASSERT_PTR_NOT_NULL(strstr(snapkvd_device_desc(d), ", cuda1 "));
	/* the engine says device 0 (its own numbering): the fd says 1 */
	fd = emu_vmm_fd(1, 2 << 20);
	CU_ASSERT_EQUAL_FATAL(
	    snapkvd_device_import(d, 1, 1, fd, 2 << 20, NULL, 0, &imp, err, sizeof(err)), 0);
	close(fd);
	CU_ASSERT_EQUAL(imp.gpu, 1);
	snapkvd_device_stats(d, 0, &st0);
	snapkvd_device_stats(d, 1, &st1);
	CU_ASSERT_EQUAL(st0.imports, 0);
	CU_ASSERT_EQUAL(st1.imports, 1);
	CU_ASSERT_EQUAL(st1.import_bytes, 2 << 20);
	CU_ASSERT_EQUAL(st1.ordinal, 1);
	/* a GPU arena on device 1, counted there */
	CU_ASSERT_EQUAL(
	    snapkvd_device_arena_export(d, 1, &a, 1 << 20, 7, &afd, &size, &dev, err, sizeof(err)),
	    0);
	CU_ASSERT_EQUAL(dev, 1);
	snapkvd_device_stats(d, 1, &st1);
	CU_ASSERT_EQUAL(st1.arenas, 1);
	CU_ASSERT_EQUAL(st1.arena_bytes, size);
	close(afd);
	snapkvd_device_arena_free(d, 1, a);
	snapkvd_device_import_release(d, &imp);
	snapkvd_device_stats(d, 1, &st1);
	CU_ASSERT_EQUAL(st1.imports + st1.arenas, 0);
	CU_ASSERT_EQUAL(st1.import_bytes + st1.arena_bytes, 0);
	snapkvd_device_free(d);

	/* devices = 1: only that one; memory of device 0 is refused by name */
	int one = 1, bad[] = {0, 5};
	d = emu_devices(&one, 1, &kerr);
	CU_ASSERT_PTR_NOT_NULL_FATAL(d);
	CU_ASSERT_EQUAL(snapkvd_device_count(d), 1);
	CU_ASSERT_EQUAL(snapkvd_device_ordinal(d, 0), 1);
	fd = emu_vmm_fd(0, 2 << 20);
	CU_ASSERT_EQUAL(
	    snapkvd_device_import(d, 1, 2, fd, 2 << 20, NULL, 0, &imp, err, sizeof(err)), -ENODEV);
	close(fd);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "lives on CUDA device 0, which this daemon does not "
					   "use (devices = 1)"));
	CU_ASSERT_EQUAL(snapkvd_device_imports(d), 0);
	snapkvd_device_free(d);
	/* devices = 0,5 of 2: refused, naming the key and the device */
	d = emu_devices(bad, 2, &kerr);
	CU_ASSERT_PTR_NULL(d);
	CU_ASSERT_PTR_NOT_NULL(strstr(kerr.msg, "backend cuda: devices: device 5: "));
	unsetenv("SKV_EMU_DEVICES");
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
	CU_add_test(su, "emulator, two devices: each import and arena on its own",
		    test_two_devices);
	return t_run();
}
