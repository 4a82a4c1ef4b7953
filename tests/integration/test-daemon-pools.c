// SPDX-License-Identifier: MIT
/*
 * test-daemon-pools: registered KV pools and block tables in registered
 * buffers (issue 20 point 4) through snapkvd. A request naming a pool, its
 * queries at q_window and its table in a buffer gives byte for byte the
 * cache of the same request described inline; the pool serves many
 * requests and batches (skv_compact_submit_many); a writeback into the
 * pool's own blocks (out_pool, out_table_buf) equals the arena cache;
 * refusals: unknown pool, another session's pool, table outside its buffer
 * or over max_block_table (named), unregister while
 * a request uses the pool (EBUSY), max_session_pools (named); pools freed
 * at session end (admin STATUS kv_pools back to 0); on the wire a POOL
 * frame that is not protobuf (EBADMSG), an empty one, an unknown id and an
 * admin session (EPERM), the session staying. And a 1M-token
 * page-size-1 prompt whose table (4 MiB, past the 1 MiB frame) is in a
 * buffer, against libskv's offline compaction of the same input.
 */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon-harness.h"
#include "snapkv.h"

#define LAYERS	  2
#define H_Q	  4
#define H_KV	  2
#define D	  16
#define L	  300
#define W	  16
#define C	  100
#define BS	  16
#define NB	  64
#define IN_BLOCKS ((L + BS - 1) / BS)
#define BLOCK_EL  (BS * H_KV * D)
#define POOL_EL	  ((size_t)NB * BLOCK_EL)
#define Q_EL	  ((size_t)H_Q * W * D)

static struct harness H;
static struct skv_client *cl;
static struct skv_buffer *kv, *qbuf, *tbuf;
static int32_t in_table[IN_BLOCKS];
static struct skv_layer_ref layers_in[LAYERS];
static struct skv_layer_out_ref pool_layers[LAYERS];

static uint64_t pool_off(uint32_t l, int v)
{
	return (uint64_t)(2 * l + v) * POOL_EL * sizeof(float);
}

static struct skv_tensor_ref pool_ref(uint32_t l, int v)
{
	return (struct skv_tensor_ref){.buf = kv,
				       .offset = pool_off(l, v),
				       .dtype = SKV_DTYPE_F32,
				       .head_stride = D,
				       .token_stride = H_KV * D,
				       .block_size = BS,
				       .block_stride = BLOCK_EL};
}

static int suite_init(void)
{
	uint64_t seed = 20;

	if (h_start_config(&H, "snapkvd-pools",
			   "max_session_pools = 4\nworkers = 1\nthreads = 2\n") < 0 ||
	    skv_client_connect(H.sock, NULL, &cl) < 0)
		return -1;
	if (skv_buffer_alloc_flags(cl, (size_t)LAYERS * 2 * POOL_EL * sizeof(float),
				   SKV_BUFFER_WRITABLE, &kv) < 0 ||
	    skv_buffer_alloc(cl, (size_t)LAYERS * Q_EL * sizeof(float), &qbuf) < 0 ||
	    skv_buffer_alloc(cl, 1 << 16, &tbuf) < 0)
		return -1;
	for (size_t i = 0; i < (size_t)LAYERS * 2 * POOL_EL; i++)
		((float *)skv_buffer_data(kv))[i] = h_rand(&seed);
	for (size_t i = 0; i < (size_t)LAYERS * Q_EL; i++)
		((float *)skv_buffer_data(qbuf))[i] = h_rand(&seed);
	for (int i = 0; i < IN_BLOCKS; i++)
		in_table[i] = 2 + (i * 7) % IN_BLOCKS;
	memcpy(skv_buffer_data(tbuf), in_table, sizeof(in_table));
	for (uint32_t l = 0; l < LAYERS; l++) {
		layers_in[l].q = (struct skv_tensor_ref){.buf = qbuf,
							 .offset = l * Q_EL * sizeof(float),
							 .dtype = SKV_DTYPE_F32,
							 .head_stride = W * D,
							 .token_stride = D};
		layers_in[l].k = pool_layers[l].k = pool_ref(l, 0);
		layers_in[l].v = pool_layers[l].v = pool_ref(l, 1);
	}
	return 0;
}

static int suite_clean(void)
{
	int st;

	skv_client_close(cl);
	st = h_stop(&H);
	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

static void pool_desc(struct skv_pool_desc *p)
{
	*p = (struct skv_pool_desc){.desc_size = sizeof(*p),
				    .layers = LAYERS,
				    .h_kv = H_KV,
				    .head_dim = D,
				    .dtype = SKV_DTYPE_F32,
				    .block_size = BS,
				    .n_blocks = NB,
				    .layer = pool_layers};
}

/* The inline request: every layer's Q, K, V and the table in the message. */
static void inline_desc(struct skv_compact_desc *d)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	d->layers = LAYERS;
	skv_client_params_init(&d->params);
	d->params.window = W;
	d->params.capacity = C;
	d->params.gqa = SKV_GQA_GROUP;
	d->layer = layers_in;
	d->block_table = in_table;
	d->n_blocks = IN_BLOCKS;
}

/* The same request by pool: layers 0, K/V the pool's, Q at q_window (layer
 * stride Q_EL floats), the table in tbuf. */
static void pool_req(struct skv_compact_desc *d, const struct skv_pool *p)
{
	inline_desc(d);
	d->layers = 0;
	d->shape.h_kv = d->shape.head_dim = 0;
	d->layer = NULL;
	d->block_table = NULL;
	d->pool = p;
	d->q_window = layers_in[0].q;
	d->q_layer_stride = Q_EL * sizeof(float);
	d->table_buf = tbuf;
	d->table_offset = 0;
}

/* Two caches hold the same rows and positions. */
static int same_cache(const struct skv_cache *a, const struct skv_cache *b)
{
	const struct skv_cache_info *ia = skv_cache_info(a), *ib = skv_cache_info(b);
	int bad = 0;

	if (ia->kept != ib->kept || ia->h_store != ib->h_store || ia->layers != ib->layers)
		return 1;
	for (uint32_t l = 0; l < ia->layers; l++)
		for (uint32_t h = 0; h < ia->h_store; h++) {
			bad += memcmp(skv_cache_positions(a, l, h), skv_cache_positions(b, l, h),
				      ia->kept * 4) != 0;
			for (uint32_t s = 0; s < ia->kept; s++)
				bad += memcmp(skv_cache_k_slot(a, l, h, s),
					      skv_cache_k_slot(b, l, h, s), D * 4) != 0 ||
				       memcmp(skv_cache_v_slot(a, l, h, s),
					      skv_cache_v_slot(b, l, h, s), D * 4) != 0;
		}
	return bad;
}

static void test_pool_exact(void)
{
	struct skv_compact_desc d, ds[8];
	const struct skv_compact_desc *dp[8];
	struct skv_request *rq[8];
	struct skv_cache *ref = NULL, *k = NULL;
	struct skv_pool_desc pd;
	struct skv_pool *p = NULL;
	struct skv_stats st;
	uint32_t n = 0;

	inline_desc(&d);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &ref), 0);
	pool_desc(&pd);
	if (skv_pool_register(cl, &pd, &p) < 0)
		fprintf(stderr, "\n  register: %s\n", skv_client_error(cl));
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT(skv_pool_id(p) > 0);
	CU_ASSERT_EQUAL(skv_client_stats(cl, &st), 0);
	/* reused by many requests, each the inline one's cache */
	for (int i = 0; i < 20; i++) {
		pool_req(&d, p);
		CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
		CU_ASSERT_EQUAL(same_cache(ref, k), 0);
		CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	}
	/* q as q-only LayerRefs instead of q_window */
	pool_req(&d, p);
	d.layer = layers_in; /* k, v are ignored by libsnapkv with a pool */
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	CU_ASSERT_EQUAL(same_cache(ref, k), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	/* a batch: one call, one doorbell */
	for (int i = 0; i < 8; i++) {
		pool_req(&ds[i], p);
		dp[i] = &ds[i];
	}
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit_many(cl, dp, 8, rq, &n), 0);
	CU_ASSERT_EQUAL(n, 8);
	for (int i = 0; i < 8; i++) {
		CU_ASSERT_EQUAL_FATAL(skv_request_wait(rq[i], -1, &k), 0);
		CU_ASSERT_EQUAL(same_cache(ref, k), 0);
		CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	}
	CU_ASSERT_EQUAL(skv_pool_unregister(p), 0);
	CU_ASSERT_EQUAL(skv_cache_release(ref), 0);
}

/* Writeback into the pool's own blocks (out_pool), the table in a buffer:
 * the rows the arena cache holds, in the blocks named. */
static void test_pool_writeback(void)
{
	struct skv_compact_desc d;
	struct skv_cache *ref = NULL, *k = NULL;
	struct skv_pool_desc pd;
	struct skv_pool *p = NULL;
	int32_t out[(C + BS - 1) / BS];
	int bad = 0;

	inline_desc(&d);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &ref), 0);
	pool_desc(&pd);
	CU_ASSERT_EQUAL_FATAL(skv_pool_register(cl, &pd, &p), 0);
	for (unsigned i = 0; i < sizeof(out) / 4; i++)
		out[i] = NB - 1 - (int32_t)i; /* above the prompt's blocks */
	memcpy((uint8_t *)skv_buffer_data(tbuf) + 4096, out, sizeof(out));
	pool_req(&d, p);
	d.out_layout = SKV_LAYOUT_PAGED;
	d.out_dest = SKV_OUT_WRITEBACK;
	d.out_pool = p;
	d.out_table_buf = tbuf;
	d.out_table_offset = 4096;
	d.out_n_blocks = sizeof(out) / 4;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k)->out_dest, SKV_OUT_WRITEBACK);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < H_KV; h++)
			for (uint32_t s = 0; s < C; s++) {
				const float *kp =
				    (const float *)skv_buffer_data(kv) + (size_t)(2 * l) * POOL_EL +
				    (size_t)out[s / BS] * BLOCK_EL + (s % BS) * H_KV * D + h * D;

				bad += memcmp(kp, skv_cache_k_slot(ref, l, h, s), D * 4) != 0;
				bad += memcmp(skv_cache_k_slot(k, l, h, s), kp, D * 4) != 0;
			}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(skv_cache_release(ref), 0);
	CU_ASSERT_EQUAL(skv_pool_unregister(p), 0);
}

static void expect(struct skv_compact_desc *d, int want, const char *msg)
{
	struct skv_cache *k = NULL;
	int r = skv_client_compact(cl, d, &k);

	CU_ASSERT_EQUAL(r, want);
	if (r != want || (msg && !strstr(skv_client_error(cl), msg)))
		fprintf(stderr, "\n  got %d (%s), want %d (%s)\n", r, skv_client_error(cl), want,
			msg ? msg : "");
	else if (msg)
		CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(cl), msg));
	if (r == 0)
		skv_cache_release(k);
}

static void test_refusals(void)
{
	struct skv_client *other = NULL;
	struct skv_pool *p = NULL, *theirs = NULL, *ps[4] = {NULL};
	struct skv_pool_desc pd;
	struct skv_compact_desc d;
	long long used = h_pool_used(H.sock);

	pool_desc(&pd);
	CU_ASSERT_EQUAL_FATAL(skv_pool_register(cl, &pd, &p), 0);
	/* another session's pool: not ours, whatever its number */
	CU_ASSERT_EQUAL_FATAL(skv_client_connect(H.sock, NULL, &other), 0);
	CU_ASSERT_EQUAL(skv_pool_register(other, &pd, &theirs), -ENOENT); /* our buffers */
	pool_req(&d, p);
	d.pool = p;
	expect(&d, 0, NULL);
	/* table out of its buffer's bounds, unaligned, over the limit */
	pool_req(&d, p);
	d.table_offset = (1 << 16) - 8;
	expect(&d, -ERANGE, "reach past buffer");
	pool_req(&d, p);
	d.table_offset = 2;
	expect(&d, -EINVAL, "4-aligned");
	pool_req(&d, p);
	d.n_blocks = (1u << 22) + 1;
	expect(&d, -E2BIG, "max_block_table");
	/* a pool whose blocks leave the buffer, a dtype that differs */
	pd.n_blocks = NB + 1;
	CU_ASSERT_EQUAL(skv_pool_register(cl, &pd, &theirs), -ERANGE);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(cl), "blocks reach"));
	pool_desc(&pd);
	pd.dtype = SKV_DTYPE_F16;
	CU_ASSERT_EQUAL(skv_pool_register(cl, &pd, &theirs), -EINVAL);
	/* max_session_pools (4 here): p + 3 more, then refused by name */
	pool_desc(&pd);
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(skv_pool_register(cl, &pd, &ps[i]), 0);
	CU_ASSERT_EQUAL(skv_pool_register(cl, &pd, &ps[3]), -EMFILE);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(cl), "max_session_pools"));
	for (int i = 0; i < 3; i++)
		CU_ASSERT_EQUAL(skv_pool_unregister(ps[i]), 0);
	/* nothing half-applied */
	CU_ASSERT_EQUAL(h_pool_used(H.sock), used);
	CU_ASSERT_EQUAL(skv_pool_unregister(p), 0);
	skv_client_close(other);
}

/* A pool of another session by its id: the daemon's own check (libsnapkv
 * passes pools of other clients through). */
static void test_other_session(void)
{
	struct skv_client *other = NULL;
	struct skv_buffer *okv = NULL;
	struct skv_pool *theirs = NULL;
	struct skv_layer_out_ref ol[LAYERS];
	struct skv_pool_desc pd;
	struct skv_compact_desc d;

	CU_ASSERT_EQUAL_FATAL(skv_client_connect(H.sock, NULL, &other), 0);
	CU_ASSERT_EQUAL_FATAL(
	    skv_buffer_alloc(other, (size_t)LAYERS * 2 * POOL_EL * sizeof(float), &okv), 0);
	pool_desc(&pd);
	for (uint32_t l = 0; l < LAYERS; l++) {
		ol[l] = pool_layers[l];
		ol[l].k.buf = ol[l].v.buf = okv;
	}
	pd.layer = ol;
	CU_ASSERT_EQUAL_FATAL(skv_pool_register(other, &pd, &theirs), 0);
	pool_req(&d, theirs);
	expect(&d, -ENOENT, "not a pool of this session");
	CU_ASSERT_EQUAL(H_STATUS_FIELD(H.sock, kv_pools), 1);
	/* freed with the session, nothing left behind */
	skv_client_close(other);
	for (int i = 0; i < 500 && H_STATUS_FIELD(H.sock, kv_pools) != 0; i++)
		h_sleep_ms(10);
	CU_ASSERT_EQUAL(H_STATUS_FIELD(H.sock, kv_pools), 0);
}

/* Unregister while a request names the pool: EBUSY, then 0 once it is
 * done. The request is held deterministically as a decision-group member
 * waiting for a second member that never comes, then cancelled. */
static void test_busy(void)
{
	struct skv_compact_desc d;
	struct skv_pool_desc pd;
	struct skv_pool *p = NULL;
	struct skv_request *rq = NULL;

	pool_desc(&pd);
	CU_ASSERT_EQUAL_FATAL(skv_pool_register(cl, &pd, &p), 0);
	pool_req(&d, p);
	CU_ASSERT_EQUAL_FATAL(skv_compact_desc_group(&d, "pools-busy", 2, 60000), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(cl, &d, &rq), 0);
	CU_ASSERT_EQUAL(skv_client_nop(cl), 0); /* the ring taken in order: it is in */
	CU_ASSERT_EQUAL(skv_pool_unregister(p), -EBUSY);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(cl), "in use"));
	CU_ASSERT(skv_request_cancel(rq, -1, NULL) >= 0);
	CU_ASSERT_EQUAL(skv_pool_unregister(p), 0);
	CU_ASSERT_EQUAL(skv_pool_unregister(NULL), 0);
}

/* ---- the wire: a PoolRequest that is not protobuf, an admin session ---- */

/* One POOL frame of len bytes on fd; the reply's status (1: no reply). */
static int raw_pool(int fd, const void *p, size_t len)
{
	static uint8_t buf[1 << 16];
	struct skv_frame_hdr h;
	Snapkv__V1__PoolReply *rr;
	int st = 1;

	if (skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL, p, len, NULL, 0, 0) < 0 ||
	    skv_frame_recv(fd, buf, sizeof(buf), &h, NULL, NULL, 0) < 0 ||
	    h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL_REPLY)
		return 1;
	rr = snapkv__v1__pool_reply__unpack(NULL, h.length, buf + SKV_FRAME_HDR_SIZE);
	if (rr) {
		st = rr->status;
		snapkv__v1__pool_reply__free_unpacked(rr, NULL);
	}
	return st;
}

static void test_wire(void)
{
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	Snapkv__V1__PoolRequest pr = SNAPKV__V1__POOL_REQUEST__INIT;
	static uint8_t buf[1 << 16];
	struct skv_frame_hdr h;
	int fds[4] = {-1, -1, -1, -1}, fd;
	unsigned nf = 4;
	size_t n;

	/* an engine session: garbage is EBADMSG, an unknown id ENOENT, and the
	 * session stays (a NOP over the socket still answers) */
	fd = h_connect_raw(H.sock);
	CU_ASSERT_FATAL(fd >= 0);
	hello.client_version = SKV_PROTO_VERSION;
	n = snapkv__v1__hello__pack(&hello, buf);
	CU_ASSERT_EQUAL_FATAL(
	    skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf, n, NULL, 0, 0), 0);
	CU_ASSERT_FATAL(skv_frame_recv(fd, buf, sizeof(buf), &h, fds, &nf, 0) >= 0);
	CU_ASSERT_EQUAL(raw_pool(fd, "\xff\xff\xff", 3), -EBADMSG);
	pr.unregister = true;
	pr.pool_id = 123456;
	n = snapkv__v1__pool_request__pack(&pr, buf);
	CU_ASSERT_EQUAL(raw_pool(fd, buf, n), -ENOENT);
	pr.unregister = false; /* a description of nothing */
	n = snapkv__v1__pool_request__pack(&pr, buf);
	CU_ASSERT_EQUAL(raw_pool(fd, buf, n), -EINVAL);
	for (unsigned i = 0; i < nf; i++)
		close(fds[i]);
	close(fd);
	/* an admin session registers nothing */
	fd = h_connect_raw(H.sock);
	CU_ASSERT_FATAL(fd >= 0);
	hello.admin = true;
	n = snapkv__v1__hello__pack(&hello, buf);
	nf = 4;
	CU_ASSERT_EQUAL_FATAL(
	    skv_frame_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf, n, NULL, 0, 0), 0);
	CU_ASSERT_FATAL(skv_frame_recv(fd, buf, sizeof(buf), &h, fds, &nf, 0) >= 0);
	for (unsigned i = 0; i < nf; i++)
		close(fds[i]);
	CU_ASSERT_EQUAL(raw_pool(fd, buf, 0), -EPERM);
	close(fd);
	CU_ASSERT_EQUAL(skv_client_nop(cl), 0);
}

/* ---- 1M tokens, page size 1, the table in a buffer ---- */

#define BIG_L  (1u << 20)
#define BIG_D  8
#define BIG_W  8
#define BIG_C  64
#define BIG_NB (BIG_L + 64)

static void test_million(void)
{
	struct skv_buffer *bkv = NULL, *bq = NULL, *bt = NULL;
	struct skv_layer_out_ref ol;
	struct skv_pool_desc pd;
	struct skv_pool *p = NULL;
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct skv_ctx *ctx = NULL;
	struct skv_error err = {{0}, -1, -1};
	struct skv_params prm;
	struct skv_layer_in in;
	struct skv_layer_out out;
	static float ref_k[BIG_C * BIG_D], ref_v[BIG_C * BIG_D];
	static int32_t ref_pos[BIG_C];
	struct skv_shape sh = {
	    .prompt_len = BIG_L, .head_dim = BIG_D, .h_q = 1, .h_kv = 1, .n_q = BIG_W};
	uint64_t seed = 7, pool_bytes = (uint64_t)BIG_NB * BIG_D * 4;
	int32_t *tab;
	float *f;

	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(cl, 2 * pool_bytes, &bkv), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(cl, BIG_W * BIG_D * 4, &bq), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(cl, (size_t)BIG_L * 4, &bt), 0);
	f = skv_buffer_data(bkv);
	for (uint64_t i = 0; i < 2 * pool_bytes / 4; i++)
		f[i] = h_rand(&seed);
	f = skv_buffer_data(bq);
	for (int i = 0; i < BIG_W * BIG_D; i++)
		f[i] = h_rand(&seed);
	tab = skv_buffer_data(bt);
	for (uint32_t i = 0; i < BIG_L; i++) /* a permutation: 7 is odd */
		tab[i] = (int32_t)((i * 7u + 3u) % BIG_L);
	ol.k = (struct skv_tensor_ref){.buf = bkv,
				       .dtype = SKV_DTYPE_F32,
				       .head_stride = BIG_D,
				       .token_stride = BIG_D,
				       .block_size = 1,
				       .block_stride = BIG_D};
	ol.v = ol.k;
	ol.v.offset = pool_bytes;
	pd = (struct skv_pool_desc){.desc_size = sizeof(pd),
				    .layers = 1,
				    .h_kv = 1,
				    .head_dim = BIG_D,
				    .dtype = SKV_DTYPE_F32,
				    .block_size = 1,
				    .n_blocks = BIG_NB,
				    .layer = &ol};
	CU_ASSERT_EQUAL_FATAL(skv_pool_register(cl, &pd, &p), 0);
	memset(&d, 0, sizeof(d));
	d.desc_size = sizeof(d);
	d.shape = sh;
	d.shape.h_kv = d.shape.head_dim = 0;
	skv_client_params_init(&d.params);
	d.params.window = BIG_W;
	d.params.capacity = BIG_C;
	d.pool = p;
	d.q_window = (struct skv_tensor_ref){
	    .buf = bq, .dtype = SKV_DTYPE_F32, .head_stride = BIG_W * BIG_D, .token_stride = BIG_D};
	/* inline, the table does not fit a frame */
	d.block_table = tab;
	d.n_blocks = BIG_L;
	CU_ASSERT(skv_client_compact(cl, &d, &k) < 0);
	d.block_table = NULL;
	d.table_buf = bt;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	/* offline: libskv on the same bytes */
	skv_params_init(&prm);
	prm.window = BIG_W;
	prm.capacity = BIG_C;
	in.q = (struct skv_tensor){.data = skv_buffer_data(bq),
				   .dtype = SKV_DTYPE_F32,
				   .head_stride = BIG_W * BIG_D,
				   .token_stride = BIG_D};
	in.k = (struct skv_tensor){.data = skv_buffer_data(bkv),
				   .dtype = SKV_DTYPE_F32,
				   .head_stride = BIG_D,
				   .token_stride = BIG_D,
				   .block_table = tab,
				   .block_size = 1,
				   .n_blocks = BIG_L,
				   .block_stride = BIG_D};
	in.v = in.k;
	in.v.data = (uint8_t *)skv_buffer_data(bkv) + pool_bytes;
	out = (struct skv_layer_out){.k = {.data = ref_k,
					   .dtype = SKV_DTYPE_F32,
					   .head_stride = BIG_C * BIG_D,
					   .token_stride = BIG_D},
				     .v = {.data = ref_v,
					   .dtype = SKV_DTYPE_F32,
					   .head_stride = BIG_C * BIG_D,
					   .token_stride = BIG_D},
				     .positions = ref_pos,
				     .pos_stride = BIG_C};
	CU_ASSERT_EQUAL_FATAL(skv_ctx_new(2, &ctx), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &sh, &prm, 1, &in, &out, &err), 0);
	skv_ctx_free(ctx);
	CU_ASSERT_EQUAL(skv_cache_info(k)->kept, BIG_C);
	CU_ASSERT_EQUAL(memcmp(skv_cache_positions(k, 0, 0), ref_pos, sizeof(ref_pos)), 0);
	for (uint32_t s = 0; s < BIG_C; s++) {
		CU_ASSERT_EQUAL(memcmp(skv_cache_k_slot(k, 0, 0, s), ref_k + s * BIG_D, BIG_D * 4),
				0);
		CU_ASSERT_EQUAL(memcmp(skv_cache_v_slot(k, 0, 0, s), ref_v + s * BIG_D, BIG_D * 4),
				0);
	}
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(skv_pool_unregister(p), 0);
	skv_buffer_free(bt);
	skv_buffer_free(bq);
	skv_buffer_free(bkv);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("daemon-pools", suite_init, suite_clean);
	CU_add_test(s, "pool + q_window + table in a buffer = inline, reused, batched",
		    test_pool_exact);
	CU_add_test(s, "writeback into the pool's blocks (out_pool, out_table_buf)",
		    test_pool_writeback);
	CU_add_test(s, "refusals: bounds, alignment, max_block_table, max_session_pools",
		    test_refusals);
	CU_add_test(s, "another session's pool; freed at session end", test_other_session);
	CU_add_test(s, "unregister while in use: EBUSY", test_busy);
	CU_add_test(s, "the wire: malformed, unknown id, empty, admin session", test_wire);
	CU_add_test(s, "1M-token page-size-1 table in a buffer = libskv offline", test_million);
	return h_run_tests();
}
