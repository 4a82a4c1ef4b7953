// SPDX-License-Identifier: MIT
/*
 * test-buffer: engine buffers and a session's set of them
 * (daemon/snapkvd-buffer.c) on real memfds and a real pool, with a fake
 * device: a memfd's checks (sealed against shrinking, size within it and
 * max_buffer_bytes, writable only without write seals), a repeated
 * generation counted on its buffer (the same memfd, size and access, or
 * -EEXIST), max_buffers, the tenant's charge (before anything is mapped,
 * given back when the last registration goes), ids never reused, and a
 * CUDA buffer imported once, released with its last reference.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/snapkvd-buffer.c"
#include "tests/test-skip.h"

/* ------------------------------------------------- the fake device */

static bool fake_present;
static unsigned fake_imports, fake_released;
static uint8_t fake_gpu[1 << 16];

bool snapkvd_device_present(const struct snapkvd_device *d)
{
	(void)d;
	return fake_present;
}

const char *snapkvd_device_backend(const struct snapkvd_device *d)
{
	(void)d;
	return fake_present ? "cuda" : "host";
}

int snapkvd_device_import(struct snapkvd_device *d, uint64_t session_id, uint64_t key, int fd,
			  uint64_t size, const void *ipc_handle, int engine_device,
			  struct snapkvd_import *ret, char *err, size_t errlen)
{
	(void)d, (void)session_id, (void)key, (void)fd, (void)size, (void)ipc_handle;
	(void)engine_device;
	(void)err, (void)errlen;
	*ret = (struct snapkvd_import){.imp = &fake_imports,
				       .ptr = fake_gpu,
				       .size = sizeof(fake_gpu),
				       .transport = fd >= 0 ? "cuda-vmm-fd" : "cuda-ipc"};
	fake_imports++;
	return 0;
}

void snapkvd_device_import_release(struct snapkvd_device *d, const struct snapkvd_import *imp)
{
	(void)d;
	CU_ASSERT_PTR_EQUAL(imp->imp, &fake_imports);
	fake_imports--;
	fake_released++;
}

unsigned snapkvd_device_imports(const struct snapkvd_device *d)
{
	(void)d;
	return fake_imports;
}

int snapkvd_device_ordinal(const struct snapkvd_device *d, unsigned gpu)
{
	(void)d;
	return (int)gpu;
}

/* ------------------------------------------------------------ helpers */

#define MAXB	 8
#define MAXBYTES (1 << 20)

static struct snapkvd_pool *pool;
static struct snapkvd_tenant *tenant;
static struct snapkvd_buffers set;

static void open_set(void)
{
	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_new(1ull << 30, 0, &pool), 0);
	snapkvd_pool_set_map_limits(pool, 64, 1ull << 30, 1ull << 30);
	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_tenant_get(pool, 1000, &tenant), 0);
	memset(&set, 0, sizeof(set));
	snapkvd_buffers_init(&set, pool, tenant, NULL, 1);
}

static void close_set(void)
{
	snapkvd_buffers_clear(&set);
	CU_ASSERT_EQUAL(set.n, 0);
	CU_ASSERT_PTR_NULL(set.list);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(pool), 0); /* every charge given back */
	snapkvd_pool_tenant_put(pool, tenant);
	snapkvd_pool_free(pool);
}

/* A memfd of n bytes with `seals`. */
static int memfd(size_t n, int seals)
{
	int fd = memfd_create("test-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL_FATAL(ftruncate(fd, (off_t)n), 0);
	if (seals)
		CU_ASSERT_EQUAL_FATAL(fcntl(fd, F_ADD_SEALS, seals), 0);
	return fd;
}

static int add(int fd, uint64_t size, uint64_t gen, bool writable, struct snapkvd_buffer **b,
	       char *err, size_t errlen)
{
	return snapkvd_buffers_add_memfd(&set, MAXB, MAXBYTES, fd, size, gen, writable, b, err,
					 errlen);
}

/* ------------------------------------------------------------- tests */

static void test_memfd_checks(void)
{
	struct snapkvd_buffer *b = NULL;
	char err[256];

	open_set();
	CU_ASSERT_EQUAL(add(memfd(4096, 0), 0, 1, false, &b, err, sizeof(err)), -EPERM);
	CU_ASSERT_STRING_EQUAL(err, "memfd must carry F_SEAL_SHRINK");
	CU_ASSERT_EQUAL(add(memfd(4096, F_SEAL_SHRINK), 8192, 1, false, &b, err, sizeof(err)),
			-ERANGE);
	CU_ASSERT_EQUAL(add(memfd(2 * MAXBYTES, F_SEAL_SHRINK), 0, 1, false, &b, err, sizeof(err)),
			-E2BIG);
	CU_ASSERT_STRING_EQUAL(err, "buffer larger than max_buffer_bytes");
	CU_ASSERT_EQUAL(
	    add(memfd(4096, F_SEAL_SHRINK | F_SEAL_WRITE), 0, 1, true, &b, err, sizeof(err)),
	    -EPERM);
	CU_ASSERT_EQUAL(set.n, 0);
	CU_ASSERT_PTR_NULL(b); /* ret untouched on failure */
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(pool), 0);
	/* the whole memfd (size 0), read-only: mapped, charged, id 1 */
	CU_ASSERT_EQUAL(add(memfd(8192, F_SEAL_SHRINK), 0, 7, false, &b, err, sizeof(err)), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_EQUAL(b->id, 1);
	CU_ASSERT_EQUAL(b->size, 8192);
	CU_ASSERT_FALSE(b->writable);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(pool), 8192);
	CU_ASSERT_PTR_EQUAL(snapkvd_buffer_find(set.list, 1), b);
	CU_ASSERT_PTR_EQUAL(snapkvd_buffer_by_generation(set.list, 7), b);
	CU_ASSERT_PTR_NULL(snapkvd_buffer_by_generation(set.list, 0)); /* "none" */
	close_set();
}

/* A generation again: the same buffer, counted; or -EEXIST naming it. */
static void test_generation(void)
{
	struct snapkvd_buffer *b = NULL, *b2 = NULL;
	char err[256];
	int fd = memfd(4096, F_SEAL_SHRINK), fd2 = dup(fd);

	open_set();
	CU_ASSERT_EQUAL(add(fd, 0, 5, false, &b, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(add(fd2, 0, 5, false, &b2, err, sizeof(err)), 0);
	CU_ASSERT_PTR_EQUAL(b2, b);
	CU_ASSERT_EQUAL(b->regs, 2);
	CU_ASSERT_EQUAL(set.n, 1);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(pool), 4096); /* charged once */
	CU_ASSERT_EQUAL(add(memfd(4096, F_SEAL_SHRINK), 0, 5, false, &b2, err, sizeof(err)),
			-EEXIST);
	CU_ASSERT_STRING_EQUAL(err,
			       "generation 5 is already buffer 1 with another memfd (4096 bytes)");
	CU_ASSERT_EQUAL(snapkvd_buffers_remove(&set, 1), 0); /* regs 2 -> 1 */
	CU_ASSERT_EQUAL(set.n, 1);
	CU_ASSERT_EQUAL(snapkvd_buffers_remove(&set, 1), 0); /* gone */
	CU_ASSERT_EQUAL(set.n, 0);
	CU_ASSERT_EQUAL(snapkvd_buffers_remove(&set, 1), -ENOENT);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(pool), 0);
	/* ids are never reused */
	CU_ASSERT_EQUAL(add(memfd(4096, F_SEAL_SHRINK), 0, 5, false, &b, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(b->id, 2);
	close_set();
}

static void test_access(void)
{
	struct snapkvd_buffer *b = NULL, *b2 = NULL;
	char err[256];
	int fd = memfd(4096, F_SEAL_SHRINK);
	int fd2 = dup(fd);

	open_set();
	CU_ASSERT_EQUAL(add(fd, 0, 9, true, &b, err, sizeof(err)), 0);
	CU_ASSERT_TRUE(b->writable);
	((uint8_t *)b->map)[0] = 1; /* mapped PROT_WRITE */
	CU_ASSERT_EQUAL(add(fd2, 0, 9, false, &b2, err, sizeof(err)), -EEXIST);
	CU_ASSERT_STRING_EQUAL(err, "generation 9 is already buffer 1, registered writable");
	CU_ASSERT_EQUAL(b->regs, 1);
	close_set();
}

/* max_buffers counts buffers, not registrations of one. */
static void test_limit(void)
{
	struct snapkvd_buffer *b = NULL;
	char err[256];

	open_set();
	for (int i = 0; i < MAXB; i++)
		CU_ASSERT_EQUAL(
		    add(memfd(4096, F_SEAL_SHRINK), 0, 100 + i, false, &b, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(add(memfd(4096, F_SEAL_SHRINK), 0, 200, false, &b, err, sizeof(err)),
			-EMFILE);
	CU_ASSERT_STRING_EQUAL(err, "too many buffers in this session");
	CU_ASSERT_EQUAL(set.n, MAXB);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(pool), MAXB * 4096);
	close_set();
}

/* The tenant's charge is refused before anything is mapped. */
static void test_charge(void)
{
	struct snapkvd_buffer *b = NULL;
	char err[256] = "";

	open_set();
	snapkvd_pool_set_map_limits(pool, 64, 8192, 1ull << 30);
	CU_ASSERT_EQUAL(add(memfd(8192, F_SEAL_SHRINK), 0, 1, false, &b, err, sizeof(err)), 0);
	CU_ASSERT(add(memfd(4096, F_SEAL_SHRINK), 0, 2, false, &b, err, sizeof(err)) < 0);
	CU_ASSERT(strstr(err, "max_tenant_mapped_bytes") != NULL);
	CU_ASSERT_EQUAL(set.n, 1);
	CU_ASSERT_EQUAL(snapkvd_pool_mapped(pool), 8192);
	close_set();
}

static void test_cuda(void)
{
	const uint8_t handle[64] = {1};
	struct snapkvd_buffer_cuda m = {.kind = SNAPKV__V1__BUFFER_KIND__BUFFER_KIND_CUDA_IPC,
					.size = 4096,
					.offset = 512,
					.generation = 3,
					.ipc_handle = handle,
					.ipc_handle_len = sizeof(handle)};
	struct snapkvd_buffer *b = NULL, *b2 = NULL;
	char err[256] = "";

	open_set();
	fake_present = false;
	CU_ASSERT_EQUAL(
	    snapkvd_buffers_add_cuda(&set, MAXB, MAXBYTES, &m, false, -1, &b, err, sizeof(err)),
	    -ENOTSUP);
	CU_ASSERT_STRING_EQUAL(
	    err, "CUDA buffers need snapkvd --backend cuda; this daemon runs the host backend");
	fake_present = true;
	m.ipc_handle_len = 63;
	CU_ASSERT_EQUAL(
	    snapkvd_buffers_add_cuda(&set, MAXB, MAXBYTES, &m, false, -1, &b, err, sizeof(err)),
	    -EINVAL);
	m.ipc_handle_len = 64;
	CU_ASSERT_EQUAL(
	    snapkvd_buffers_add_cuda(&set, MAXB, MAXBYTES, &m, true, -1, &b, err, sizeof(err)), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_PTR_EQUAL(b->map, fake_gpu + 512);
	CU_ASSERT_TRUE(b->writable);
	CU_ASSERT_STRING_EQUAL(b->transport, "cuda-ipc");
	CU_ASSERT_EQUAL(fake_imports, 1);
	/* the same generation with another window: -EEXIST, no import */
	m.offset = 0;
	CU_ASSERT_EQUAL(
	    snapkvd_buffers_add_cuda(&set, MAXB, MAXBYTES, &m, true, -1, &b2, err, sizeof(err)),
	    -EEXIST);
	m.offset = 512;
	CU_ASSERT_EQUAL(
	    snapkvd_buffers_add_cuda(&set, MAXB, MAXBYTES, &m, true, -1, &b2, err, sizeof(err)), 0);
	CU_ASSERT_PTR_EQUAL(b2, b);
	CU_ASSERT_EQUAL(fake_imports, 1);
	/* a job's reference keeps the import past the set */
	b->refs++;
	snapkvd_buffers_clear(&set);
	CU_ASSERT_EQUAL(fake_imports, 1);
	snapkvd_buffer_unref(b);
	CU_ASSERT_EQUAL(fake_imports, 0);
	CU_ASSERT_EQUAL(fake_released, 1);
	fake_present = false;
	close_set();
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	snapkvd_log_max = SNAPKVD_LOG_ERR - 1; /* quiet */
	su = CU_add_suite("buffer", NULL, NULL);
	CU_add_test(su, "a memfd's checks, then mapped and charged", test_memfd_checks);
	CU_add_test(su, "a generation again: counted, or -EEXIST", test_generation);
	CU_add_test(su, "a repeat must ask for the same access", test_access);
	CU_add_test(su, "max_buffers", test_limit);
	CU_add_test(su, "the tenant's charge before the mapping", test_charge);
	CU_add_test(su, "a CUDA buffer: imported once, released last", test_cuda);
	return t_run();
}
