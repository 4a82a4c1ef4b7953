// SPDX-License-Identifier: MIT
/*
 * test-paged: a COMPACT request's paged output (daemon/snapkvd-paged.c)
 * without a daemon: the paged fields refused without out_layout PAGED, the
 * block size and budget mode a paged cache needs, an arena destination,
 * and every writeback refusal in the order the file states (destination
 * layers, the table, each pool, blocks inside their buffer, no written
 * byte meeting another or a byte the request reads), each with its reason
 * and nothing held; then a valid writeback into the job and the cache, and
 * the arena's identity table.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-paged.c"
#include "tests/test-skip.h"

#define LAYERS 2
#define HS     2  /* heads stored (and h_q = h_kv) */
#define D      8  /* head_dim */
#define PL     32 /* prompt length */
#define NQ     8
#define BS     4 /* out_block_size */
#define KEPT   16

static struct snapkvd_config cfg;
static struct snapkvd_buffer in_buf, out_buf;
static float in_mem[4096], out_mem[4096];
static struct snapkvd_request_env env;
static struct snapkvd_job *j;
static struct skv_plan plan;
static Snapkv__V1__CompactRequest req;
static Snapkv__V1__OutLayerRef ol[LAYERS], *olp[LAYERS];
static Snapkv__V1__TensorRef ok[LAYERS], ov[LAYERS];
static int32_t table[8];
static char err[256];

static void dest(Snapkv__V1__TensorRef *t, uint64_t off)
{
	snapkv__v1__tensor_ref__init(t);
	t->buffer_id = 2;
	t->offset = off;
	t->dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
	/* a block: HS heads of BS rows of D */
	t->head_stride = BS * D;
	t->token_stride = D;
	t->block_stride = HS * BS * D;
}

static struct skv_tensor input(size_t at, uint32_t rows)
{
	return (struct skv_tensor){.data = in_mem + at,
				   .dtype = SKV_DTYPE_F32,
				   .head_stride = (int64_t)rows * D,
				   .token_stride = D};
}

/* A valid writeback of 2 layers: K of layer l at block pool offset
 * l * 2048 bytes, V 1024 bytes after it, 4 blocks (16 kept slots of 4). */
static int setup(void)
{
	snapkvd_config_defaults(&cfg);
	in_buf = (struct snapkvd_buffer){.id = 1,
					 .size = sizeof(in_mem),
					 .map = (uint8_t *)in_mem,
					 .refs = 1,
					 .dev = 7,
					 .ino = 1};
	out_buf = (struct snapkvd_buffer){.id = 2,
					  .size = sizeof(out_mem),
					  .map = (uint8_t *)out_mem,
					  .refs = 1,
					  .dev = 7,
					  .ino = 2,
					  .writable = true};
	in_buf.next = &out_buf;
	env = (struct snapkvd_request_env){.cfg = &cfg, .buffers = &in_buf, .arena_bytes = 1 << 20};
	j = calloc(1, sizeof(*j));
	j->bufs = calloc(8, sizeof(*j->bufs));
	j->bufs[j->n_bufs++] = &in_buf;
	in_buf.refs++;
	j->in = calloc(LAYERS, sizeof(*j->in));
	j->out = calloc(LAYERS, sizeof(*j->out));
	j->layers = LAYERS;
	j->shape =
	    (struct skv_shape){.h_q = HS, .h_kv = HS, .head_dim = D, .prompt_len = PL, .n_q = NQ};
	skv_params_init(&j->params);
	for (uint32_t l = 0; l < LAYERS; l++) {
		j->in[l].q = input(l * 1536, NQ);
		j->in[l].k = input(l * 1536 + 512, PL);
		j->in[l].v = input(l * 1536 + 1024, PL);
	}
	plan = (struct skv_plan){.h_store = HS, .kept = KEPT};
	snapkv__v1__compact_request__init(&req);
	req.layers = LAYERS;
	req.out_layout = SNAPKV__V1__LAYOUT__LAYOUT_PAGED;
	req.out_block_size = BS;
	req.out_dest = SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK;
	for (uint32_t l = 0; l < LAYERS; l++) {
		snapkv__v1__out_layer_ref__init(&ol[l]);
		dest(&ok[l], (uint64_t)l * 8192);
		dest(&ov[l], (uint64_t)l * 8192 + 4096);
		ol[l].k = &ok[l];
		ol[l].v = &ov[l];
		olp[l] = &ol[l];
	}
	req.n_out_layer = LAYERS;
	req.out_layer = olp;
	for (int i = 0; i < 4; i++)
		table[i] = i;
	req.n_out_block_table = 4;
	req.out_block_table = table;
	return 0;
}

static void teardown(void)
{
	snapkvd_job_free(j);
	j = NULL;
}

/* Each test starts from the valid writeback. */
static void fresh(void)
{
	teardown();
	setup();
}

static int check(void)
{
	err[0] = 0;
	return snapkvd_paged_check(&env, j, &req, &plan, SKV_DTYPE_F32, err, sizeof(err));
}

/* One refusal: its errno and reason, the output buffer not held. */
static void refused(int want, const char *why)
{
	int r = check();

	CU_ASSERT_EQUAL(r, want);
	if (!strstr(err, why))
		fprintf(stderr, "want '%s', got %d '%s'\n", why, r, err);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, why));
	CU_ASSERT_EQUAL(out_buf.refs, 1);
	teardown();
	setup();
}

static void test_dense(void)
{
	fresh();
	req.out_layout = SNAPKV__V1__LAYOUT__LAYOUT_NHD;
	refused(-EINVAL, "need out_layout PAGED");
	req.out_layout = SNAPKV__V1__LAYOUT__LAYOUT_NHD;
	req.out_block_size = 0;
	req.out_dest = 0;
	req.n_out_layer = 0;
	req.n_out_block_table = 0;
	CU_ASSERT_EQUAL(check(), 0);
	CU_ASSERT_FALSE(j->paged);
	teardown();
	setup();
}

static void test_paged_fields(void)
{
	fresh();
	req.out_block_size = 0;
	refused(-EINVAL, "out_block_size = 0: must be 1..4096");
	req.out_block_size = SNAPKVD_MAX_OUT_BLOCK_SIZE + 1;
	refused(-E2BIG, "must be 1..4096");
	req.out_dest = 7;
	refused(-EINVAL, "unknown out_dest 7");
	j->params.budget_mode = SKV_BUDGET_HEADS;
	refused(-EINVAL, "paged output needs one count for every head of every layer");
	j->params.budget_mode = SKV_BUDGET_LAYERS;
	refused(-EINVAL, "gives layers different counts");
	req.out_arena = SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM;
	refused(-EINVAL, "out_arena must be unset");
	/* the arena: no destination of its own */
	req.out_dest = SNAPKV__V1__OUT_DEST__OUT_DEST_ARENA;
	refused(-EINVAL, "out_layer, out_block_table, out_in_place_blocks and max_decode are for "
			 "out_dest WRITEBACK");
	req.out_dest = SNAPKV__V1__OUT_DEST__OUT_DEST_ARENA;
	req.n_out_layer = 0;
	req.n_out_block_table = 0;
	CU_ASSERT_EQUAL(check(), 0);
	CU_ASSERT_TRUE(j->paged);
	CU_ASSERT_FALSE(j->writeback);
	CU_ASSERT_EQUAL(j->out_block_size, BS);
	/* mass is one count too */
	teardown();
	setup();
	j->params.budget_mode = SKV_BUDGET_MASS;
	CU_ASSERT_EQUAL(check(), 0);
	CU_ASSERT_TRUE(j->writeback);
}

static void test_writeback_refusals(void)
{
	fresh();
	req.n_out_layer = 1;
	refused(-EINVAL, "writeback: 1 destination layers for 2 layers");
	ok[0].block_stride = 0;
	refused(-EINVAL, "strides must be >= 0 (block_stride > 0)");
	ok[0].head_stride = -1;
	refused(-EINVAL, "strides must be >= 0");
	req.n_out_block_table = 3;
	refused(-EINVAL, "out_block_table has 3 blocks, the 16 kept slots need 4 of 4");
	j->params.fallback_below = 0.5f;
	req.n_out_block_table = 3;
	refused(-EINVAL, "(fallback_below: a fallback keeps every prompt row)");
	cfg.max_block_table = 3;
	refused(-E2BIG, "out_block_table of 4 entries exceeds the limit 3 (max_block_table)");
	table[2] = -1;
	refused(-EINVAL, "out_block_table entry 2 is negative");
	olp[1] = NULL;
	refused(-EINVAL, "writeback: layer 1: no destination");
	ol[1].v = NULL;
	refused(-EINVAL, "writeback: layer 1: no V destination");
	ok[1].buffer_id = 9;
	refused(-ENOENT, "writeback: layer 1: K: buffer 9 is not registered");
	ov[0].buffer_id = 1;
	refused(-EINVAL, "layer 0: V: buffer 1 is not registered writable");
	ov[1].dtype = SNAPKV__V1__DTYPE__D_TYPE_BF16;
	refused(-EINVAL, "layer 1: V: dtype");
	ov[1].token_stride = 2 * D;
	refused(-EINVAL, "every destination pool must have the strides and block size of layer "
			 "0's K");
	ov[1].block_size = BS + 1;
	refused(-EINVAL, "every destination pool must have the strides");
	ok[1].offset = 2;
	refused(-EINVAL, "layer 1: K: offset 2 not aligned or outside buffer 2");
	ok[1].offset = sizeof(out_mem);
	refused(-EINVAL, "offset 16384 not aligned or outside buffer 2");
	table[3] = 30; /* block 30 at 30 * 256 bytes: past the buffer from layer 1's V */
	refused(-EINVAL, "layer 1: V: destination block 30 is outside buffer 2 (16384 bytes)");
	/* K and V of layer 0 on the same bytes */
	ov[0].offset = ok[0].offset + 64;
	refused(-EINVAL, "writeback: a destination block of layer 0 meets");
	/* a destination on what layer 1 reads: the input buffer, registered writable */
	in_buf.writable = true;
	ok[1].buffer_id = 1;
	ok[1].offset = (1536 + 512) * sizeof(float);
	refused(-EINVAL, "layer 1 meets bytes the request reads of layer 1");
	/* K and V interleaved per head in one pool (vLLM's CPU layout: a
	 * block is head 0's K rows, head 0's V rows, head 1's K rows, ...):
	 * their blocks' byte spans cross, their bytes do not */
	for (int l = 0; l < LAYERS; l++) {
		ok[l].head_stride = ov[l].head_stride = 2 * BS * D;
		ok[l].block_stride = ov[l].block_stride = 2 * HS * BS * D;
		ov[l].offset = ok[l].offset + BS * D * sizeof(float);
	}
	CU_ASSERT_EQUAL(check(), 0);
	fresh();
	for (int l = 0; l < LAYERS; l++) {
		ok[l].head_stride = ov[l].head_stride = 2 * BS * D;
		ok[l].block_stride = ov[l].block_stride = 2 * HS * BS * D;
		ov[l].offset =
		    ok[l].offset + (BS * D - 1) * sizeof(float); /* one float too close */
	}
	refused(-EINVAL, "writeback: a destination block of layer 0 meets another destination "
			 "block");
	/* the overlap check's byte ranges, bounded: the contiguous table is one
	 * range per pool (4 writes, at most 6 reads), a scattered one four */
	cfg.max_writeback_ranges = 10;
	CU_ASSERT_EQUAL(check(), 0);
	fresh();
	cfg.max_writeback_ranges = 10;
	table[0] = 3, table[1] = 1, table[2] = 0, table[3] = 2;
	refused(-E2BIG, "more than 10 byte ranges (max_writeback_ranges) for 2 layers and 4 "
			"destination blocks");
}

static void test_writeback(void)
{
	struct snapkvd_cache *c = NULL;

	fresh();
	CU_ASSERT_EQUAL_FATAL(check(), 0);
	CU_ASSERT_TRUE(j->paged);
	CU_ASSERT_TRUE(j->writeback);
	CU_ASSERT_EQUAL(j->n_out_table, 4);
	CU_ASSERT_EQUAL(j->out_table[3], 3);
	CU_ASSERT_PTR_NOT_EQUAL(j->out_table, table); /* a private copy */
	CU_ASSERT_EQUAL(j->wb_k_off[1], 8192);
	CU_ASSERT_EQUAL(j->wb_v_off[1], 8192 + 4096);
	CU_ASSERT_PTR_EQUAL(j->wb_base[3], out_buf.map);
	CU_ASSERT_EQUAL(j->wb_block_stride, HS * BS * D);
	CU_ASSERT_EQUAL(j->wb_buffer_id, 2);
	/* held once, however many pools it holds */
	CU_ASSERT_EQUAL(out_buf.refs, 2);
	CU_ASSERT_EQUAL(j->n_bufs, 2);
	/* into the cache, then the kernels' outputs */
	CU_ASSERT_EQUAL_FATAL(snapkvd_cache_new(LAYERS, HS, &c), 0);
	c->dtype = SKV_DTYPE_F32;
	j->cache = c;
	snapkvd_paged_cache(j);
	CU_ASSERT_EQUAL(c->layout, SNAPKVD_LAYOUT_PAGED);
	CU_ASSERT_TRUE(c->writeback);
	CU_ASSERT_EQUAL(c->block_size, BS);
	CU_ASSERT_EQUAL(c->n_blocks, 4);
	CU_ASSERT_EQUAL(c->out_buffer_id, 2);
	CU_ASSERT_EQUAL(c->v_off[1], 8192 + 4096);
	snapkvd_paged_outputs(j, NULL);
	CU_ASSERT_PTR_EQUAL(j->out[1].k.data, out_buf.map + 8192);
	CU_ASSERT_PTR_EQUAL(j->out[1].v.data, out_buf.map + 8192 + 4096);
	CU_ASSERT_EQUAL(j->out[0].pool_blocks, 4);
	CU_ASSERT_PTR_EQUAL(j->out[0].k.block_table, j->out_table);
}

/* An arena destination: the kernels get the identity table over its blocks. */
static void test_arena_outputs(void)
{
	static uint8_t arena[1 << 16];
	struct snapkvd_cache *c = NULL;

	fresh();
	req.out_dest = SNAPKV__V1__OUT_DEST__OUT_DEST_ARENA;
	req.n_out_layer = 0;
	req.n_out_block_table = 0;
	CU_ASSERT_EQUAL_FATAL(check(), 0);
	CU_ASSERT_EQUAL_FATAL(snapkvd_cache_new(LAYERS, HS, &c), 0);
	c->dtype = SKV_DTYPE_F32;
	c->n_blocks = 5;
	c->k_off[1] = 4096;
	c->v_off[1] = 8192;
	j->cache = c;
	snapkvd_paged_cache(j);
	CU_ASSERT_FALSE(c->writeback);
	CU_ASSERT_EQUAL(c->block_size, BS);
	snapkvd_paged_outputs(j, arena);
	CU_ASSERT_EQUAL(j->n_out_table, 5);
	for (uint32_t i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(j->out_table[i], (int32_t)i);
	CU_ASSERT_PTR_EQUAL(j->out[1].k.data, arena + 4096);
	CU_ASSERT_PTR_EQUAL(j->out[1].v.data, arena + 8192);
	CU_ASSERT_EQUAL(j->out[1].pool_blocks, 5);
}

int main(void)
{
	CU_pSuite su;
	int r;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("paged", NULL, NULL);
	CU_add_test(su, "dense: no paged field", test_dense);
	CU_add_test(su, "block size, destination, budget mode", test_paged_fields);
	CU_add_test(su, "every writeback refusal, in order", test_writeback_refusals);
	CU_add_test(su, "a valid writeback into the job and the cache", test_writeback);
	CU_add_test(su, "an arena's identity table", test_arena_outputs);
	r = t_run();
	teardown();
	return r;
}
