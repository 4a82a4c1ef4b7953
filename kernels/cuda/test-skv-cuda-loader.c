/* SPDX-License-Identifier: MIT */
/*
 * test-skv-cuda-loader.c - the CUDA backend loader fails cleanly where there
 * is no plugin, no driver or no GPU, and works where there is.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <CUnit/Basic.h>

#include "kernels/cuda/skv-backend.h"
#include "kernels/cuda/skv-cuda.h" /* struct skv_cuda_copy */
#include "tests/test-skip.h"

static void test_missing_plugin(void)
{
	struct skv_backend *be = NULL;
	struct skv_error err = {.layer = 7};
	int r = skv_backend_load("/nonexistent/dir/libskv-cuda.so", -1, &be, &err);

	CU_ASSERT_EQUAL(r, -ENOENT);
	CU_ASSERT_PTR_NULL(be);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent/dir/libskv-cuda.so"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "CUDA backend not available"));
	CU_ASSERT_EQUAL(err.layer, -1);
}

/* A loadable library without the backend table is refused, not called. */
static void test_not_a_plugin(void)
{
	struct skv_backend *be = NULL;
	struct skv_error err = {0};
	int r = skv_backend_load("libc.so.6", -1, &be, &err);

	CU_ASSERT_EQUAL(r, -ENOENT);
	CU_ASSERT_PTR_NULL(be);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "not a snapkvd CUDA backend"));
}

static void test_bad_args(void)
{
	struct skv_error err = {0};

	CU_ASSERT_EQUAL(skv_backend_load(NULL, -1, NULL, &err), -EINVAL);
	CU_ASSERT_EQUAL(skv_backend_load("/nonexistent.so", -1, NULL, NULL), -EINVAL);
	skv_backend_unload(NULL);
}

/*
 * The plugin this tree built: without a driver (this CI machine) -ENODEV
 * naming libcuda.so.1; with a driver but no GPU -ENODEV "no CUDA device";
 * on a GPU machine it loads and describes the device.
 */
static void test_built_plugin(void)
{
	const char *b = getenv("BUILD");
	char path[512];
	struct skv_backend *be = NULL;
	struct skv_error err = {0};

	snprintf(path, sizeof(path), "%s/libskv-cuda.so", b && *b ? b : "build");
	CU_ASSERT_EQUAL_FATAL(access(path, R_OK), 0); /* main() skips the test without it */
	void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
	int r = skv_backend_load(path, -1, &be, &err);
	if (!drv) {
		CU_ASSERT_EQUAL(r, -ENODEV);
		CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "no CUDA driver found: libcuda.so.1"));
		printf("\n  no driver: %d %s\n", r, err.msg);
	} else if (r < 0) {
		CU_ASSERT_EQUAL(r, -ENODEV);
		CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "CUDA device"));
		printf("\n  driver, no device: %d %s\n", r, err.msg);
	}
	if (r == 0) {
		CU_ASSERT_PTR_NOT_NULL(be);
		CU_ASSERT_STRING_EQUAL(be->ops->name, "cuda");
		CU_ASSERT_PTR_NOT_NULL(be->dev);
		skv_backend_unload(be);
	} else {
		CU_ASSERT_PTR_NULL(be);
	}
	if (drv)
		dlclose(drv);
}

/* The plugin built for the CPU emulator loads and opens its "device" with no driver. */
static void test_emulated_plugin(void)
{
	const char *b = getenv("BUILD");
	char path[512];
	struct skv_backend *be = NULL;
	struct skv_error err = {0};

	snprintf(path, sizeof(path), "%s/tests/gpu/emu/libskv-cuda-emu.so", b && *b ? b : "build");
	CU_ASSERT_EQUAL_FATAL(access(path, R_OK), 0); /* main() skips the test without it */
	int r = skv_backend_load(path, -1, &be, &err);
	CU_ASSERT_EQUAL_FATAL(r, 0);
	CU_ASSERT_EQUAL(be->ops->emulated, 1);
	CU_ASSERT_PTR_NULL(be->libcuda);
	/* the IPC event ops (appended last): 64 bytes naming no event are
	 * refused by the open, with the call named; NULLs are -EINVAL / no-ops */
	CU_ASSERT_PTR_NOT_NULL_FATAL(be->ops->event_open);
	CU_ASSERT_PTR_NOT_NULL_FATAL(be->ops->event_query);
	CU_ASSERT_PTR_NOT_NULL_FATAL(be->ops->event_close);
	unsigned char zeros[64] = {0};
	struct skv_cuda_event *ev = NULL;
	CU_ASSERT_EQUAL(be->ops->event_open(be->dev, zeros, &ev, &err), -EINVAL);
	CU_ASSERT_PTR_NULL(ev);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "cudaIpcOpenEventHandle"));
	CU_ASSERT_EQUAL(be->ops->event_open(be->dev, NULL, &ev, &err), -EINVAL);
	CU_ASSERT_EQUAL(be->ops->event_query(NULL, &err), -EINVAL);
	be->ops->event_close(NULL);
	/* the budget modes' entry (appended last): a mass request without a
	 * kept array is refused with the host's words, before any work */
	CU_ASSERT_PTR_NOT_NULL_FATAL(be->ops->compact_budget);
	struct skv_cuda_ctx *ctx = NULL;
	CU_ASSERT_EQUAL_FATAL(be->ops->ctx_new(be->dev, &ctx, &err), 0);
	struct skv_shape sh = {.prompt_len = 64, .head_dim = 8, .h_q = 1, .h_kv = 1, .n_q = 4};
	struct skv_params p = SKV_PARAMS_DEFAULTS;
	p.window = 4;
	p.budget_mode = SKV_BUDGET_MASS;
	p.tau = 0.5f;
	p.c_min = 8;
	p.c_max = 16;
	p.c_step = 1;
	struct skv_layer_in in = {0};
	struct skv_layer_out out = {0};
	CU_ASSERT_EQUAL(be->ops->compact_budget(ctx, &sh, &p, 1, &in, &out, NULL, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "kept array"));
	/* fp8 K/V (SPEC.md "Quantized K/V") are the host backend's: refused by
	 * name before any work */
	static float qd[4 * 8];
	static uint8_t kd[64 * 8];
	p.budget_mode = SKV_BUDGET_UNIFORM;
	p.budget = 16;
	in.q = (struct skv_tensor){
	    .data = qd, .dtype = SKV_DTYPE_F32, .head_stride = 32, .token_stride = 8};
	in.k = (struct skv_tensor){.data = kd,
				   .dtype = SKV_DTYPE_F8E4M3FN,
				   .head_stride = 512,
				   .token_stride = 8,
				   .scale = 1.0f};
	in.v = in.k;
	CU_ASSERT_EQUAL(be->ops->compact_budget(ctx, &sh, &p, 1, &in, &out, NULL, &err),
			-EOPNOTSUPP);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "f8e4m3fn: fp8 K/V run on the host backend only"));
	be->ops->ctx_free(ctx);
	skv_backend_unload(be);
}

/*
 * ctx_copy and ctx_upload of the emulated plugin (device memory is host
 * memory there): a 2-D copy honours both pitches and leaves the gaps alone,
 * an upload lands in the context's memory, a second operation before the
 * sync is -EBUSY, a pitch below its width -EINVAL.
 */
static void test_emulated_copy_ops(void)
{
	const char *b = getenv("BUILD");
	char path[512];
	struct skv_backend *be = NULL;
	struct skv_cuda_ctx *ctx = NULL;
	struct skv_error err = {0};
	unsigned char src[4 * 16], dst[4 * 24];
	int32_t table[5] = {4, 0, 3, 1, 2};
	void *dtab = NULL;
	int diff = 0;

	snprintf(path, sizeof(path), "%s/tests/gpu/emu/libskv-cuda-emu.so", b && *b ? b : "build");
	CU_ASSERT_EQUAL_FATAL(access(path, R_OK), 0); /* main() skips the test without it */
	CU_ASSERT_EQUAL_FATAL(skv_backend_load(path, -1, &be, &err), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(be->ops->ctx_copy);
	CU_ASSERT_PTR_NOT_NULL_FATAL(be->ops->ctx_upload);
	CU_ASSERT_EQUAL_FATAL(be->ops->ctx_new(be->dev, &ctx, &err), 0);
	for (unsigned i = 0; i < sizeof(src); i++)
		src[i] = (unsigned char)(i + 1);
	memset(dst, 0xee, sizeof(dst));
	/* 4 rows of 10 bytes, 16 apart in the source, 24 in the destination */
	struct skv_cuda_copy cp = {dst, src, 10, 4, 24, 16};
	CU_ASSERT_EQUAL(be->ops->ctx_copy(ctx, &cp, 1, &err), 0);
	CU_ASSERT_EQUAL(be->ops->ctx_copy(ctx, &cp, 1, &err), -EBUSY);
	CU_ASSERT_EQUAL(be->ops->ctx_upload(ctx, table, sizeof(table), &dtab, &err), -EBUSY);
	CU_ASSERT_EQUAL(be->ops->ctx_sync(ctx, &err), 0);
	for (unsigned y = 0; y < 4; y++)
		for (unsigned x = 0; x < 24; x++)
			diff += dst[y * 24 + x] != (x < 10 ? src[y * 16 + x] : 0xee);
	CU_ASSERT_EQUAL(diff, 0);
	cp.dpitch = 8; /* below the width */
	CU_ASSERT_EQUAL(be->ops->ctx_copy(ctx, &cp, 1, &err), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "pitch"));
	CU_ASSERT_EQUAL(be->ops->ctx_upload(ctx, table, sizeof(table), &dtab, &err), 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(dtab);
	CU_ASSERT(dtab != (void *)table);
	CU_ASSERT_EQUAL(memcmp(dtab, table, sizeof(table)), 0);
	CU_ASSERT_EQUAL(be->ops->ctx_upload(ctx, NULL, 4, &dtab, &err), -EINVAL);
	be->ops->ctx_free(ctx);
	skv_backend_unload(be);
}

/* $SKV_CUDA_PLUGIN names the plugin when no path is given. */
static void test_env_path(void)
{
	struct skv_backend *be = NULL;
	struct skv_error err = {0};

	setenv("SKV_CUDA_PLUGIN", "/nonexistent/env/libskv-cuda.so", 1);
	int r = skv_backend_load(NULL, -1, &be, &err);
	unsetenv("SKV_CUDA_PLUGIN");
	CU_ASSERT_EQUAL(r, -ENOENT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err.msg, "/nonexistent/env/libskv-cuda.so"));
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	CU_pSuite s = CU_add_suite("cuda_loader", NULL, NULL);
	CU_pTest built, emu, copies;
	if (!s || !CU_add_test(s, "missing plugin", test_missing_plugin) ||
	    !CU_add_test(s, "not a plugin", test_not_a_plugin) ||
	    !CU_add_test(s, "bad arguments", test_bad_args) ||
	    !(built = CU_add_test(s, "built plugin", test_built_plugin)) ||
	    !(emu = CU_add_test(s, "emulated plugin", test_emulated_plugin)) ||
	    !(copies =
		  CU_add_test(s, "emulated plugin: copies on a context", test_emulated_copy_ops)) ||
	    !CU_add_test(s, "plugin path from environment", test_env_path)) {
		CU_cleanup_registry();
		return 1;
	}
	/* what the tests above load, where main() can say they are missing */
	const char *b = getenv("BUILD");
	char plug[512], emu_plug[512];
	snprintf(plug, sizeof(plug), "%s/libskv-cuda.so", b && *b ? b : "build");
	snprintf(emu_plug, sizeof(emu_plug), "%s/tests/gpu/emu/libskv-cuda-emu.so",
		 b && *b ? b : "build");
	if (access(plug, R_OK) != 0)
		t_skip(s, built, "cuda", "%s not built", plug);
	if (access(emu_plug, R_OK) != 0) {
		t_skip(s, emu, "cuda", "%s not built", emu_plug);
		t_skip(s, copies, "cuda", "%s not built", emu_plug);
	}
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	return t_exit(fails);
}
