// SPDX-License-Identifier: MIT
/*
 * test-libsnapkv-v1.c - libsnapkv against a program built before the budget
 * modes grew struct skv_params: its skv_compact_desc (replicated here field
 * by field as snapkv.h had it) is read and written at the old offsets, and
 * skv_client_params_init() writes no byte past the old params; likewise a
 * SNAPKV_1.8 description (before span grew params past min_window).
 */
#include <CUnit/Basic.h>
#include <stddef.h>
#include <string.h>

#include "snapkv.h"

struct v1_params {
	uint32_t params_size;
	enum skv_policy policy;
	uint32_t window, capacity, kernel;
	enum skv_pooling pooling;
	enum skv_gqa gqa;
	uint32_t sinks, n_protected;
	struct skv_range protected_ranges[SKV_MAX_PROTECTED];
};

struct v1_desc {
	uint32_t desc_size;
	struct skv_shape shape;
	uint32_t layers;
	struct v1_params params;
	const struct skv_layer_ref *layer;
	enum skv_layout out_layout;
	uint32_t decode_reserve;
	const int32_t *block_table;
	uint32_t n_blocks;
	int evictable;
	enum skv_arena_kind out_arena;
	enum skv_prefill_wait prefill_wait;
	const struct skv_buffer *wait_buffer;
	uint64_t wait_offset;
	uint32_t wait_value;
	uint32_t wait_timeout_ms;
	uint8_t wait_ipc_event[64];
};

/* SNAPKV_1.8's description: params up to min_window (SKV_PARAMS_SIZE_V3),
 * then the same tail, 8 bytes earlier than today's (span grew params). */
struct v8_desc {
	uint32_t desc_size;
	struct skv_shape shape;
	uint32_t layers;
	uint8_t params[SKV_PARAMS_SIZE_V3];
	const struct skv_layer_ref *layer;
	enum skv_layout out_layout;
	uint32_t decode_reserve;
	const int32_t *block_table;
	uint32_t n_blocks;
	int evictable;
	enum skv_arena_kind out_arena;
	enum skv_prefill_wait prefill_wait;
	const struct skv_buffer *wait_buffer;
	uint64_t wait_offset;
	uint32_t wait_value;
	uint32_t wait_timeout_ms;
	uint8_t wait_ipc_event[64];
	uint32_t out_block_size;
	enum skv_out_dest out_dest;
	const struct skv_layer_out_ref *out_layer;
	const int32_t *out_block_table;
	uint32_t out_n_blocks;
	const char *group_key;
	uint32_t group_size;
	uint32_t group_timeout_ms;
	const float *kv_scales;
};

struct guarded8 {
	struct v8_desc d;
	uint8_t after[2048];
};

struct guarded {
	struct v1_desc d;
	uint8_t after[2048]; /* where the current layout would write */
};

static void test_layout(void)
{
	CU_ASSERT_EQUAL(sizeof(struct v1_params), SKV_PARAMS_SIZE_V1);
	CU_ASSERT_EQUAL(offsetof(struct v1_desc, layer), 192);
	CU_ASSERT(offsetof(struct skv_compact_desc, layer) > sizeof(struct v1_desc));
}

static void test_params_init(void)
{
	struct guarded g;
	memset(&g, 0x5a, sizeof(g));
	skv_client_params_init((struct skv_params *)&g.d.params);
	CU_ASSERT_EQUAL(g.d.params.params_size, SKV_PARAMS_SIZE_V1);
	CU_ASSERT_EQUAL(g.d.params.window, 32);
	CU_ASSERT_EQUAL(g.d.params.capacity, 2048);
	const uint8_t *p = (const uint8_t *)&g.d.layer;
	for (size_t i = 0; i < sizeof(g) - offsetof(struct v1_desc, layer); i++)
		if (p[i] != 0x5a) {
			CU_FAIL("skv_client_params_init wrote past the old params");
			break;
		}
}

static void test_wait_helpers(void)
{
	struct guarded g;
	uint8_t handle[64];
	struct skv_buffer *buf = (struct skv_buffer *)handle; /* only its address is kept */

	memset(&g, 0, sizeof(g));
	memset(g.after, 0x5a, sizeof(g.after));
	memset(handle, 7, sizeof(handle));
	g.d.desc_size = sizeof(g.d);
	skv_client_params_init((struct skv_params *)&g.d.params);
	g.d.decode_reserve = 77;
	CU_ASSERT_EQUAL(skv_compact_desc_wait_event((struct skv_compact_desc *)&g.d, handle, 5), 0);
	CU_ASSERT_EQUAL(g.d.prefill_wait, SKV_WAIT_CUDA_IPC_EVENT);
	CU_ASSERT_EQUAL(g.d.wait_timeout_ms, 5);
	CU_ASSERT(memcmp(g.d.wait_ipc_event, handle, 64) == 0);
	CU_ASSERT_EQUAL(g.d.decode_reserve, 77);
	CU_ASSERT_EQUAL(skv_compact_desc_wait_flag((struct skv_compact_desc *)&g.d, buf, 64, 9, 6),
			0);
	CU_ASSERT_EQUAL(g.d.prefill_wait, SKV_WAIT_CUDA_FLAG);
	CU_ASSERT(g.d.wait_buffer == buf);
	CU_ASSERT_EQUAL(g.d.wait_offset, 64);
	CU_ASSERT_EQUAL(g.d.wait_value, 9);
	CU_ASSERT_EQUAL(g.d.wait_timeout_ms, 6);
	CU_ASSERT_EQUAL(g.d.decode_reserve, 77);
	for (size_t i = 0; i < sizeof(g.after); i++)
		if (g.after[i] != 0x5a) {
			CU_FAIL("a wait helper wrote past the old description");
			break;
		}
	/* an old description too short for the wait fields is refused */
	g.d.desc_size = offsetof(struct v1_desc, out_arena);
	CU_ASSERT_EQUAL(skv_compact_desc_wait_event((struct skv_compact_desc *)&g.d, handle, 5),
			-EINVAL);
}

static void test_v8_helpers(void)
{
	struct guarded8 g;
	uint8_t handle[64];

	CU_ASSERT(offsetof(struct skv_compact_desc, layer) == offsetof(struct v8_desc, layer) + 8);
	memset(&g, 0, sizeof(g));
	memset(g.after, 0x5a, sizeof(g.after));
	memset(handle, 7, sizeof(handle));
	g.d.desc_size = sizeof(g.d);
	skv_client_params_init((struct skv_params *)g.d.params);
	g.d.decode_reserve = 77;
	g.d.kv_scales = (const float *)handle;
	CU_ASSERT_EQUAL(skv_compact_desc_wait_event((struct skv_compact_desc *)&g.d, handle, 5), 0);
	CU_ASSERT_EQUAL(g.d.prefill_wait, SKV_WAIT_CUDA_IPC_EVENT);
	CU_ASSERT_EQUAL(g.d.wait_timeout_ms, 5);
	CU_ASSERT(memcmp(g.d.wait_ipc_event, handle, 64) == 0);
	CU_ASSERT_EQUAL(skv_compact_desc_group((struct skv_compact_desc *)&g.d, "tenant", 2, 9), 0);
	CU_ASSERT(g.d.group_key && strcmp(g.d.group_key, "tenant") == 0);
	CU_ASSERT_EQUAL(g.d.group_size, 2);
	CU_ASSERT_EQUAL(g.d.group_timeout_ms, 9);
	CU_ASSERT_EQUAL(g.d.decode_reserve, 77);
	CU_ASSERT(g.d.kv_scales == (const float *)handle);
	for (size_t i = 0; i < sizeof(g.after); i++)
		if (g.after[i] != 0x5a) {
			CU_FAIL("a helper wrote past the SNAPKV_1.8 description");
			break;
		}
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	CU_pSuite s = CU_add_suite("libsnapkv_v1", NULL, NULL);
	CU_add_test(s, "the old layout as replicated here", test_layout);
	CU_add_test(s, "params_init writes the old params only", test_params_init);
	CU_add_test(s, "wait helpers on an old description", test_wait_helpers);
	CU_add_test(s, "wait and group helpers on a SNAPKV_1.8 description", test_v8_helpers);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned f = CU_get_number_of_failures();
	CU_cleanup_registry();
	return f ? 1 : 0;
}
