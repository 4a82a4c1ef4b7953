// SPDX-License-Identifier: MIT
/*
 * test-kvpool: a session's registered KV pools (daemon/snapkvd-kvpool.c)
 * with fake buffers: registration's checks (shape limits, each tensor's
 * dtype, block size, buffer, strides, alignment, fp8 scale, every block
 * inside its buffer, max_session_pools named), ids never reused,
 * unregister (ENOENT, EBUSY while busy), and the view of a request: the
 * pool's K/V per layer with q at q_window + l x q_layer_stride or from
 * q-only LayerRefs, out_pool_id's pools as out_layer, tables by reference
 * copied (a later write to the buffer changes nothing), and every refusal
 * (unknown pool, K/V named with a pool, shapes that differ, q_window
 * without a pool, inline and by reference at once, over max_block_table,
 * out of the buffer, unaligned, a CUDA buffer).
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-kvpool.c"
#include "tests/test-skip.h"

/* ------------------------------------------------- the fake buffers */

static uint8_t mem[2][1 << 16];
static struct snapkvd_buffer bufs[3] = {
    {.id = 1, .size = sizeof(mem[0]), .map = mem[0]},
    {.id = 2, .size = sizeof(mem[1]), .map = mem[1]},
    {.id = 3, .size = 4096, .map = mem[1], .imp = &bufs[2]}, /* "CUDA" */
};

struct snapkvd_buffer *snapkvd_buffer_find(struct snapkvd_buffer *list, uint64_t id)
{
	(void)list;
	for (unsigned i = 0; i < 3; i++)
		if (bufs[i].id == id)
			return &bufs[i];
	return NULL;
}

/* 2 layers, h_kv 2, D 4, f32, blocks of 4 slots (4 x 2 x 4 floats, 128
 * bytes), 16 blocks: K and V of layer l at (2l + v) x 2 KiB of buffer 1 */
#define LAYERS 2
#define BS     4
#define NB     16
#define BLOCK  (BS * 2 * 4)

static const struct snapkvd_kvpool_limits lim = {.max_session_pools = 3,
						 .max_layers = 8,
						 .max_heads = 8,
						 .max_head_dim = 64,
						 .max_block_table = 100};
static Snapkv__V1__TensorRef tr[2 * LAYERS];
static Snapkv__V1__OutLayerRef ol[LAYERS], *olp[LAYERS];
static Snapkv__V1__PoolRequest pr;
static char err[256];

static void pool_req(void)
{
	snapkv__v1__pool_request__init(&pr);
	pr.layers = LAYERS;
	pr.h_kv = 2;
	pr.head_dim = 4;
	pr.dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
	pr.block_size = BS;
	pr.n_blocks = NB;
	for (unsigned i = 0; i < 2 * LAYERS; i++) {
		snapkv__v1__tensor_ref__init(&tr[i]);
		tr[i].buffer_id = 1;
		tr[i].offset = (uint64_t)i * NB * BLOCK * 4;
		tr[i].dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
		tr[i].head_stride = 4;
		tr[i].token_stride = 8;
		tr[i].block_stride = BLOCK;
	}
	for (unsigned l = 0; l < LAYERS; l++) {
		snapkv__v1__out_layer_ref__init(&ol[l]);
		ol[l].k = &tr[2 * l];
		ol[l].v = &tr[2 * l + 1];
		olp[l] = &ol[l];
	}
	pr.n_layer = LAYERS;
	pr.layer = olp;
}

static int add(struct snapkvd_kvpools *set, uint64_t *id)
{
	err[0] = 0;
	return snapkvd_kvpools_add(set, &lim, bufs, &pr, id, err, sizeof(err));
}

static void test_register(void)
{
	struct snapkvd_kvpools set = {0};
	uint64_t id = 0, id2 = 0, id3 = 0;
	const char *why = NULL;

	pool_req();
	CU_ASSERT_EQUAL(add(&set, &id), 0);
	CU_ASSERT(id > 0);
	CU_ASSERT_PTR_NOT_NULL(snapkvd_kvpools_find(&set, id));
	CU_ASSERT_EQUAL(snapkvd_kvpools_find(&set, id)->tr[1].block_size, BS);
	/* each refusal, nothing registered */
	pr.layers = 9, pr.n_layer = 9;
	CU_ASSERT_EQUAL(add(&set, &id2), -E2BIG);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "max_layers"));
	pool_req();
	pr.n_layer = 1;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	pool_req();
	pr.head_dim = 65;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	pool_req();
	pr.dtype = 77;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	pool_req();
	pr.block_size = 0;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	pool_req();
	tr[3].dtype = SNAPKV__V1__DTYPE__D_TYPE_F16;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "layer 1: v"));
	pool_req();
	tr[2].block_size = 8;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	pool_req();
	ol[1].v = NULL;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "missing"));
	pool_req();
	tr[0].buffer_id = 9;
	CU_ASSERT_EQUAL(add(&set, &id2), -ENOENT);
	pool_req();
	tr[0].token_stride = -1;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	pool_req();
	tr[0].offset = 2;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	pool_req();
	pr.n_blocks = 600; /* 128-byte blocks: layer 1's V (at 6 KiB) runs past 64 KiB */
	CU_ASSERT_EQUAL(add(&set, &id2), -ERANGE);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "which has 65536"));
	pool_req();
	tr[0].block_stride = INT64_MAX; /* overflow */
	CU_ASSERT_EQUAL(add(&set, &id2), -ERANGE);
	pool_req();
	pr.dtype = tr[0].dtype = tr[1].dtype = tr[2].dtype = tr[3].dtype =
	    SNAPKV__V1__DTYPE__D_TYPE_F8E4M3FN;
	CU_ASSERT_EQUAL(add(&set, &id2), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "scale"));
	CU_ASSERT_EQUAL(set.n, 1);
	/* the limit, named; ids never reused */
	pool_req();
	CU_ASSERT_EQUAL(add(&set, &id2), 0);
	CU_ASSERT_EQUAL(add(&set, &id3), 0);
	CU_ASSERT_EQUAL(add(&set, &id3), -EMFILE);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "max_session_pools"));
	CU_ASSERT_EQUAL(snapkvd_kvpools_remove(&set, id2, &why), 0);
	CU_ASSERT_EQUAL(add(&set, &id3), 0);
	CU_ASSERT(id3 > id2 && id2 > id);
	/* unregister */
	CU_ASSERT_EQUAL(snapkvd_kvpools_remove(&set, id2, &why), -ENOENT);
	snapkvd_kvpools_find(&set, id)->busy = 1;
	CU_ASSERT_EQUAL(snapkvd_kvpools_remove(&set, id, &why), -EBUSY);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "in use"));
	snapkvd_kvpools_find(&set, id)->busy = 0;
	CU_ASSERT_EQUAL(snapkvd_kvpools_remove(&set, id, &why), 0);
	snapkvd_kvpools_clear(&set);
	CU_ASSERT_EQUAL(set.n, 0);
	CU_ASSERT_PTR_NULL(set.list);
}

static int view(const struct snapkvd_kvpools *set, const Snapkv__V1__CompactRequest *req,
		struct snapkvd_kvpool_view *v)
{
	err[0] = 0;
	return snapkvd_kvpool_view(set, &lim, bufs, req, v, err, sizeof(err));
}

static void test_view(void)
{
	struct snapkvd_kvpools set = {0};
	struct snapkvd_kvpool_view v;
	Snapkv__V1__CompactRequest req = SNAPKV__V1__COMPACT_REQUEST__INIT;
	Snapkv__V1__TensorRef qw = SNAPKV__V1__TENSOR_REF__INIT, q1 = SNAPKV__V1__TENSOR_REF__INIT;
	Snapkv__V1__LayerRef lr[LAYERS], *lrp[LAYERS];
	Snapkv__V1__TableRef t = SNAPKV__V1__TABLE_REF__INIT;
	int32_t inl[3] = {1, 2, 3};
	uint64_t id = 0;

	pool_req();
	CU_ASSERT_EQUAL_FATAL(add(&set, &id), 0);
	/* no pool, no reference: the request as it is */
	req.n_block_table = 3, req.block_table = inl;
	CU_ASSERT_EQUAL_FATAL(view(&set, &req, &v), 0);
	CU_ASSERT_PTR_EQUAL(v.req.block_table, inl);
	CU_ASSERT_PTR_NULL(v.pool);
	snapkvd_kvpool_view_free(&v);
	/* the pool's K/V, q at q_window + l x stride; the table copied */
	for (int i = 0; i < 10; i++)
		((int32_t *)mem[1])[25 + i] = 100 + i;
	t.buffer_id = 2, t.offset = 100, t.entries = 10;
	req.n_block_table = 0, req.block_table = NULL;
	req.block_table_ref = &t;
	req.pool_id = id;
	req.n_q = 4;
	qw.buffer_id = 1, qw.offset = 512, qw.dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
	req.q_window = &qw;
	req.q_layer_stride = 4096;
	CU_ASSERT_EQUAL_FATAL(view(&set, &req, &v), 0);
	CU_ASSERT_EQUAL(v.req.layers, LAYERS);
	CU_ASSERT_EQUAL(v.req.h_kv, 2);
	CU_ASSERT_EQUAL(v.req.head_dim, 4);
	CU_ASSERT_EQUAL(v.req.n_layer, LAYERS);
	CU_ASSERT_EQUAL(v.req.layer[1]->q->offset, 512 + 4096);
	CU_ASSERT_EQUAL(v.req.layer[1]->v->offset, tr[3].offset);
	CU_ASSERT_EQUAL(v.req.n_block_table, 10);
	((int32_t *)mem[1])[25] = -5; /* the engine writes after: the copy holds */
	CU_ASSERT_EQUAL(v.req.block_table[0], 100);
	CU_ASSERT_EQUAL(v.req.block_table[9], 109);
	CU_ASSERT_PTR_EQUAL(v.pool, snapkvd_kvpools_find(&set, id));
	snapkvd_kvpool_view_free(&v);
	/* q-only LayerRefs */
	for (unsigned l = 0; l < LAYERS; l++) {
		snapkv__v1__layer_ref__init(&lr[l]);
		lr[l].q = &q1;
		lrp[l] = &lr[l];
	}
	req.q_window = NULL;
	req.n_layer = LAYERS, req.layer = lrp;
	CU_ASSERT_EQUAL_FATAL(view(&set, &req, &v), 0);
	CU_ASSERT_PTR_EQUAL(v.req.layer[1]->q, &q1);
	CU_ASSERT_PTR_EQUAL(v.req.layer[0]->k, &snapkvd_kvpools_find(&set, id)->tr[0]);
	snapkvd_kvpool_view_free(&v);
	lr[1].k = &q1; /* K named with a pool */
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	lr[1].k = NULL;
	req.n_layer = 1; /* neither q_window nor one per layer */
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	req.n_layer = 0, req.layer = NULL, req.q_window = &qw;
	req.head_dim = 8; /* not the pool's */
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	req.head_dim = 0;
	req.pool_id = id + 100;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -ENOENT);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "not a pool of this session"));
	req.pool_id = 0; /* q_window without a pool */
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	req.pool_id = id;
	/* tables: both ways at once, over the limit (named), out of the
	 * buffer, unaligned, empty, a CUDA buffer, unknown */
	req.n_block_table = 3, req.block_table = inl;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	req.n_block_table = 0, req.block_table = NULL;
	t.entries = 101;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -E2BIG);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "max_block_table"));
	t.entries = 10, t.offset = sizeof(mem[1]) - 36;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -ERANGE);
	t.offset = UINT64_MAX - 3;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -ERANGE);
	t.offset = 102;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	t.offset = 100, t.entries = 0;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	t.entries = 10, t.buffer_id = 3;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EOPNOTSUPP);
	t.buffer_id = 7;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -ENOENT);
	t.buffer_id = 2;
	req.n_out_block_table = 101, req.out_block_table = inl; /* inline, over the limit */
	CU_ASSERT_EQUAL(view(&set, &req, &v), -E2BIG);
	req.n_out_block_table = 0, req.out_block_table = NULL;
	/* out_pool_id: writeback only, its pools as out_layer */
	req.out_pool_id = id;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	req.out_dest = SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK;
	req.out_block_size = BS + 1;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -EINVAL);
	req.out_block_size = 0;
	CU_ASSERT_EQUAL_FATAL(view(&set, &req, &v), 0);
	CU_ASSERT_EQUAL(v.req.out_block_size, BS);
	CU_ASSERT_EQUAL(v.req.out_layout, SNAPKV__V1__LAYOUT__LAYOUT_PAGED);
	CU_ASSERT_EQUAL(v.req.n_out_layer, LAYERS);
	CU_ASSERT_PTR_EQUAL(v.req.out_layer[1]->v, &snapkvd_kvpools_find(&set, id)->tr[3]);
	CU_ASSERT_PTR_EQUAL(v.out_pool, v.pool);
	snapkvd_kvpool_view_free(&v);
	req.out_pool_id = id + 100;
	CU_ASSERT_EQUAL(view(&set, &req, &v), -ENOENT);
	snapkvd_kvpools_clear(&set);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("kvpool", NULL, NULL);
	CU_add_test(su, "register: every check, the limit, ids, unregister", test_register);
	CU_add_test(su, "a request's view: pool, q, tables, out_pool, refusals", test_view);
	return t_run();
}
