// SPDX-License-Identifier: MIT
/*
 * test-daemon-paged: paged output (out_layout PAGED) through snapkvd, both
 * destinations, byte-identical to libskv's kernels run here on the same
 * input (SPEC-exactness: same kept positions, same rows); an arena run
 * mapped MAP_FIXED into an engine's pool at a block boundary and read as
 * blocks; GROW and APPEND on paged caches; the ledger's engine-held bytes;
 * and every refusal before any work: overlap with read blocks, outside the
 * buffer, not writable, bad block size, a table over the limit.
 *
 * The engine's pool: one writable memfd, per layer a K pool and a V pool of
 * NB blocks [block][BS][H_KV][D] f32 (8 KiB blocks, page multiples). The
 * prompt's K/V are read paged from blocks IN_BASE.. of the same pools (the
 * way vLLM holds them), Q from a separate read-only buffer.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon-harness.h"
#include "snapkv.h"

#define LAYERS	   2
#define H_Q	   8
#define H_KV	   2
#define D	   64
#define L	   300
#define W	   16
#define C	   100
#define BS	   16
#define NB	   64
#define IN_BASE	   2 /* the prompt's blocks: IN_BASE .. IN_BASE + 18 */
#define IN_BLOCKS  ((L + BS - 1) / BS)
#define KEPT	   C
#define OUT_BLOCKS ((KEPT + BS - 1) / BS)
#define BLOCK_EL   (BS * H_KV * D)
#define POOL_EL	   ((size_t)NB * BLOCK_EL)
#define RESERVE	   10

static struct harness H;
static struct skv_client *cl;
static struct skv_buffer *pool, *qbuf, *ro_pool;
static int32_t in_table[IN_BLOCKS];

static float *pool_k(uint32_t l)
{
	return (float *)skv_buffer_data(pool) + (size_t)(2 * l) * POOL_EL;
}

static float *pool_v(uint32_t l)
{
	return (float *)skv_buffer_data(pool) + (size_t)(2 * l + 1) * POOL_EL;
}

static uint64_t pool_off(uint32_t l, int v)
{
	return (uint64_t)(2 * l + v) * POOL_EL * sizeof(float);
}

static int suite_init(void)
{
	static const char *extra[] = {"--config", NULL, NULL};
	char cfg[300];
	uint64_t seed = 12;
	FILE *f;

	snprintf(H.dir, sizeof(H.dir), "/tmp/snapkvd-paged-XXXXXX");
	if (!mkdtemp(H.dir))
		return -1;
	snprintf(cfg, sizeof(cfg), "%s/snapkvd.conf", H.dir);
	f = fopen(cfg, "w");
	if (!f)
		return -1;
	fprintf(f, "max_prompt_len = 4096\n");
	fclose(f);
	extra[1] = cfg;
	if (h_start(&H, extra) < 0 || skv_client_connect(H.sock, NULL, &cl) < 0)
		return -1;
	if (skv_buffer_alloc_flags(cl, (size_t)LAYERS * 2 * POOL_EL * sizeof(float),
				   SKV_BUFFER_WRITABLE, &pool) < 0 ||
	    skv_buffer_alloc(cl, (size_t)LAYERS * H_Q * W * D * sizeof(float), &qbuf) < 0 ||
	    skv_buffer_alloc(cl, (size_t)LAYERS * 2 * POOL_EL * sizeof(float), &ro_pool) < 0)
		return -1;
	for (size_t i = 0; i < (size_t)LAYERS * 2 * POOL_EL; i++)
		((float *)skv_buffer_data(pool))[i] = h_rand(&seed);
	for (size_t i = 0; i < (size_t)LAYERS * H_Q * W * D; i++)
		((float *)skv_buffer_data(qbuf))[i] = h_rand(&seed);
	for (int i = 0; i < IN_BLOCKS; i++) /* not in order: a real table */
		in_table[i] = IN_BASE + (i * 7) % IN_BLOCKS;
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

static struct skv_tensor_ref pool_ref(const struct skv_buffer *b, uint32_t l, int v)
{
	return (struct skv_tensor_ref){.buf = b,
				       .offset = pool_off(l, v),
				       .dtype = SKV_DTYPE_F32,
				       .head_stride = D,
				       .token_stride = H_KV * D,
				       .block_size = BS,
				       .block_stride = BLOCK_EL};
}

static struct skv_layer_ref layers_in[LAYERS];
static struct skv_layer_out_ref layers_out[LAYERS];

static void desc_init(struct skv_compact_desc *d, uint32_t block_size)
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
	for (uint32_t l = 0; l < LAYERS; l++) {
		layers_in[l].q = (struct skv_tensor_ref){.buf = qbuf,
							 .offset = (uint64_t)l * H_Q * W * D * 4,
							 .dtype = SKV_DTYPE_F32,
							 .head_stride = W * D,
							 .token_stride = D};
		layers_in[l].k = pool_ref(pool, l, 0);
		layers_in[l].v = pool_ref(pool, l, 1);
		layers_out[l].k = pool_ref(pool, l, 0);
		layers_out[l].v = pool_ref(pool, l, 1);
		layers_out[l].k.block_size = layers_out[l].v.block_size = 0;
	}
	d->layer = layers_in;
	d->block_table = in_table;
	d->n_blocks = IN_BLOCKS;
	d->out_layout = SKV_LAYOUT_PAGED;
	d->out_block_size = block_size;
	d->decode_reserve = RESERVE;
}

/* The reference: libskv here, into a private paged pool of OUT_BLOCKS
 * blocks per (layer, K/V) with the identity table. */
static float ref_k[LAYERS][OUT_BLOCKS * BLOCK_EL], ref_v[LAYERS][OUT_BLOCKS * BLOCK_EL];
static int32_t ref_pos[LAYERS][H_KV * KEPT];

static void reference(void)
{
	static bool done;
	struct skv_layer_in in[LAYERS];
	struct skv_layer_out out[LAYERS];
	int32_t ident[OUT_BLOCKS];
	struct skv_params p;
	struct skv_shape sh = {.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	struct skv_error err = {{0}, -1, -1};
	struct skv_ctx *ctx;

	if (done)
		return;
	for (int i = 0; i < OUT_BLOCKS; i++)
		ident[i] = i;
	skv_params_init(&p);
	p.window = W;
	p.capacity = C;
	p.gqa = SKV_GQA_GROUP;
	for (uint32_t l = 0; l < LAYERS; l++) {
		struct skv_tensor kin = {.data = pool_k(l),
					 .dtype = SKV_DTYPE_F32,
					 .head_stride = D,
					 .token_stride = H_KV * D,
					 .block_table = in_table,
					 .block_size = BS,
					 .n_blocks = IN_BLOCKS,
					 .block_stride = BLOCK_EL};
		struct skv_tensor ko = kin;

		in[l].q = (struct skv_tensor){.data = (float *)skv_buffer_data(qbuf) +
						      (size_t)l * H_Q * W * D,
					      .dtype = SKV_DTYPE_F32,
					      .head_stride = W * D,
					      .token_stride = D};
		in[l].k = kin;
		in[l].v = kin;
		in[l].v.data = pool_v(l);
		ko.block_table = ident;
		ko.n_blocks = OUT_BLOCKS;
		out[l] = (struct skv_layer_out){.k = ko,
						.v = ko,
						.positions = ref_pos[l],
						.pos_stride = KEPT,
						.pool_blocks = OUT_BLOCKS};
		out[l].k.data = ref_k[l];
		out[l].v.data = ref_v[l];
	}
	CU_ASSERT_FATAL(skv_ctx_new(1, &ctx) == 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact(ctx, &sh, &p, LAYERS, in, out, &err), 0);
	skv_ctx_free(ctx);
	done = true;
}

/* The cache's kept slots and positions against the reference, byte for byte. */
static void check_exact(const struct skv_cache *k)
{
	const struct skv_cache_info *i = skv_cache_info(k);
	size_t row = D * sizeof(float);
	int bad = 0;

	reference();
	CU_ASSERT_EQUAL(i->kept, KEPT);
	CU_ASSERT_EQUAL(i->h_store, H_KV);
	CU_ASSERT_EQUAL(i->layout, SKV_LAYOUT_PAGED);
	CU_ASSERT_EQUAL(i->block_size, BS);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < H_KV; h++) {
			const int32_t *pos = skv_cache_positions(k, l, h);

			bad += memcmp(pos, ref_pos[l] + h * KEPT, KEPT * 4) != 0;
			for (uint32_t s = 0; s < KEPT; s++) {
				size_t at =
				    (size_t)(s / BS) * BLOCK_EL + (s % BS) * H_KV * D + h * D;
				const void *kp = skv_cache_k_slot(k, l, h, s);
				const void *vp = skv_cache_v_slot(k, l, h, s);

				if (!kp || !vp || memcmp(kp, ref_k[l] + at, row) ||
				    memcmp(vp, ref_v[l] + at, row))
					bad++;
			}
		}
	CU_ASSERT_EQUAL(bad, 0);
}

static void test_arena(void)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	uint64_t off, bytes;

	desc_init(&d, BS);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	check_exact(k);
	CU_ASSERT_EQUAL(skv_cache_info(k)->out_dest, SKV_OUT_ARENA);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, (KEPT + RESERVE + BS - 1) / BS);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (int v = 0; v < 2; v++) {
			CU_ASSERT_EQUAL(skv_cache_block_run(k, l, v, &off, &bytes), 0);
			CU_ASSERT_EQUAL(off % 4096, 0);
			CU_ASSERT_EQUAL(bytes % 4096, 0);
			CU_ASSERT(bytes >= (uint64_t)skv_cache_info(k)->n_blocks * BLOCK_EL * 4);
			CU_ASSERT_EQUAL(skv_cache_block_offset(k, l, v, 1),
					(int64_t)(off + BLOCK_EL * 4));
		}
	/* APPEND then GROW keep the rows (a paged GROW copies whole runs) */
	CU_ASSERT_EQUAL(skv_cache_append(k, 3), 0);
	CU_ASSERT_EQUAL(skv_cache_grow(k, 40), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k)->capacity, KEPT + RESERVE + 40);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, (KEPT + RESERVE + 40 + BS - 1) / BS);
	check_exact(k);
	CU_ASSERT_EQUAL(skv_cache_positions(k, 1, 1)[KEPT + 2], L + 2);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
}

/* An engine maps a run over its pool at a block boundary and reads blocks. */
static void test_map_fixed(void)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct skv_buffer *epool = NULL;
	const uint32_t at = 8; /* the engine's block where the run goes */
	size_t bb = BLOCK_EL * sizeof(float);
	uint64_t off, bytes;
	int bad = 0;

	reference();
	desc_init(&d, BS);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(cl, NB * bb, &epool), 0);
	uint8_t *base = skv_buffer_data(epool);
	memset(base, 0x5a, NB * bb);
	CU_ASSERT_EQUAL_FATAL(skv_cache_block_run(k, 1, SKV_KV_V, &off, &bytes), 0);
	CU_ASSERT_EQUAL(skv_cache_map_blocks(k, 1, SKV_KV_V, base + at * bb + 64), -EINVAL);
	CU_ASSERT_EQUAL_FATAL(skv_cache_map_blocks(k, 1, SKV_KV_V, base + at * bb), 0);
	/* the pool's blocks at .. at + n are the cache's: read as an engine would */
	for (uint32_t s = 0; s < KEPT; s++)
		for (uint32_t h = 0; h < H_KV; h++) {
			const float *e = (const float *)(base + (at + s / BS) * bb) +
					 (s % BS) * H_KV * D + h * D;

			bad += memcmp(e, skv_cache_v_slot(k, 1, h, s), D * 4) != 0;
			bad +=
			    memcmp(e, ref_v[1] + (s / BS) * BLOCK_EL + (s % BS) * H_KV * D + h * D,
				   D * 4) != 0;
		}
	CU_ASSERT_EQUAL(bad, 0);
	CU_ASSERT_EQUAL((uint8_t)base[(at - 1) * bb], 0x5a);   /* the block before */
	CU_ASSERT_EQUAL((uint8_t)base[at * bb + bytes], 0x5a); /* the block after */
	/* the engine writes a decode row into the mapped blocks: the cache sees it */
	((float *)(base + (at + KEPT / BS) * bb))[(KEPT % BS) * H_KV * D] = 42.0f;
	CU_ASSERT_EQUAL(*(float *)skv_cache_v_slot(k, 1, 0, KEPT), 42.0f);
	CU_ASSERT_EQUAL(skv_buffer_restore(epool, at * bb, bytes), 0);
	CU_ASSERT_EQUAL((uint8_t)base[at * bb], 0x5a);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(skv_buffer_free(epool), 0);
}

static int32_t wb_table[OUT_BLOCKS + 1];

static void wb_desc(struct skv_compact_desc *d)
{
	desc_init(d, BS);
	for (int i = 0; i < OUT_BLOCKS + 1; i++)
		wb_table[i] = 40 + i;
	d->out_dest = SKV_OUT_WRITEBACK;
	d->out_layer = layers_out;
	d->out_block_table = wb_table;
	d->out_n_blocks = OUT_BLOCKS + 1; /* one more for decode: checked, not written */
}

static void test_writeback(void)
{
	size_t n = (size_t)LAYERS * 2 * POOL_EL;
	float *before = malloc(n * sizeof(float));
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	size_t changed_outside = 0;

	CU_ASSERT_FATAL(before != NULL);
	memcpy(before, skv_buffer_data(pool), n * sizeof(float));
	wb_desc(&d);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	check_exact(k);
	CU_ASSERT_EQUAL(skv_cache_info(k)->out_dest, SKV_OUT_WRITEBACK);
	CU_ASSERT_EQUAL(skv_cache_k(k, 0, 0), NULL);
	CU_ASSERT_EQUAL(skv_cache_block_offset(k, 1, SKV_KV_K, 2),
			(int64_t)(pool_off(1, 0) + (uint64_t)wb_table[2] * BLOCK_EL * 4));
	/* nothing written outside the kept slots' blocks */
	for (size_t i = 0; i < n; i++) {
		size_t blk = (i % POOL_EL) / BLOCK_EL;

		if ((blk < 40 || blk >= 40 + OUT_BLOCKS) &&
		    before[i] != ((float *)skv_buffer_data(pool))[i])
			changed_outside++;
	}
	CU_ASSERT_EQUAL(changed_outside, 0);
	/* the ledger: engine-held, only the index tables in the pool */
	Snapkv__V1__AdminReply *a = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER);
	CU_ASSERT_FATAL(a != NULL && a->n_caches == 1);
	CU_ASSERT(a->caches[0]->engine_held);
	CU_ASSERT_EQUAL(a->caches[0]->layout, SNAPKV__V1__LAYOUT__LAYOUT_PAGED);
	CU_ASSERT_EQUAL(a->caches[0]->bytes->compact, 0);
	CU_ASSERT(a->caches[0]->bytes->engine_held >= (uint64_t)LAYERS * 2 * H_KV * KEPT * D * 4);
	CU_ASSERT(a->caches[0]->bytes->allocated < 4096 * 4);
	printf("\n  writeback cache: %llu bytes in the pool, %llu engine-held\n",
	       (unsigned long long)a->caches[0]->bytes->allocated,
	       (unsigned long long)a->caches[0]->bytes->engine_held);
	snapkv__v1__admin_reply__free_unpacked(a, NULL);
	/* APPEND works, GROW is refused: the engine owns the blocks */
	CU_ASSERT_EQUAL(skv_cache_append(k, 2), 0);
	CU_ASSERT_EQUAL(skv_cache_grow(k, 8), -EOPNOTSUPP);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	/* restore the pool for later tests */
	memcpy(skv_buffer_data(pool), before, n * sizeof(float));
	free(before);
}

static int try_compact(struct skv_compact_desc *d)
{
	struct skv_cache *k = NULL;
	int r = skv_client_compact(cl, d, &k);

	if (r == 0)
		skv_cache_release(k);
	return r;
}

static void test_refusals(void)
{
	struct skv_compact_desc d;
	static int32_t big[5000];
	struct skv_layer_out_ref ro[LAYERS];
	long long used = h_pool_used(H.sock);

	/* a destination block that the request reads (input block IN_BASE + 3) */
	wb_desc(&d);
	wb_table[2] = IN_BASE + 3;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "reads") != NULL);
	/* two destination blocks the same */
	wb_desc(&d);
	wb_table[3] = wb_table[1];
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	/* outside the buffer (the last layer's V pool ends the buffer) */
	wb_desc(&d);
	wb_table[OUT_BLOCKS] = NB;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "outside") != NULL);
	wb_desc(&d);
	wb_table[0] = -1;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	/* too few destination blocks for the kept slots */
	wb_desc(&d);
	d.out_n_blocks = OUT_BLOCKS - 1;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	/* not registered writable */
	wb_desc(&d);
	for (uint32_t l = 0; l < LAYERS; l++) {
		ro[l].k = pool_ref(ro_pool, l, 0);
		ro[l].v = pool_ref(ro_pool, l, 1);
	}
	d.out_layer = ro;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "writable") != NULL);
	/* bad block sizes */
	desc_init(&d, 0);
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	desc_init(&d, 5000);
	CU_ASSERT_EQUAL(try_compact(&d), -E2BIG);
	/* paged fields without PAGED */
	desc_init(&d, BS);
	d.out_layout = SKV_LAYOUT_HND;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	/* a table over max_prompt_len (4096 here) */
	wb_desc(&d);
	for (int i = 0; i < 5000; i++)
		big[i] = 40 + i % 4;
	d.out_block_table = big;
	d.out_n_blocks = 5000;
	CU_ASSERT_EQUAL(try_compact(&d), -E2BIG);
	CU_ASSERT(strstr(skv_client_error(cl), "max_prompt_len") != NULL);
	/* nothing half-applied: the pool as before, the pool's K/V unchanged */
	CU_ASSERT_EQUAL(h_pool_used(H.sock), used);
}

static void test_writable_registration(void)
{
	struct skv_buffer *b = NULL;
	int fd = memfd_create("ro", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(ftruncate(fd, 65536), 0);
	CU_ASSERT_EQUAL(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE), 0);
	CU_ASSERT_EQUAL(skv_buffer_register_fd_flags(cl, fd, 0, SKV_BUFFER_WRITABLE, &b), -EPERM);
	CU_ASSERT_EQUAL(skv_buffer_register_fd_flags(cl, fd, 0, 0x8, &b), -EINVAL);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_register_fd_flags(cl, fd, 0, 0, &b), 0);
	CU_ASSERT_EQUAL(skv_buffer_flags(b), 0);
	CU_ASSERT_EQUAL(skv_buffer_flags(pool), SKV_BUFFER_WRITABLE);
	skv_buffer_free(b);
	close(fd);
}

int main(void)
{
	CU_pSuite s;

	signal(SIGPIPE, SIG_IGN);
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("daemon-paged", suite_init, suite_clean);
	CU_add_test(s, "arena: exact vs libskv, runs page-aligned, APPEND, GROW", test_arena);
	CU_add_test(s, "arena run mapped MAP_FIXED into an engine's pool", test_map_fixed);
	CU_add_test(s, "writeback: exact, nothing else written, engine-held ledger",
		    test_writeback);
	CU_add_test(s, "refusals before any work", test_refusals);
	CU_add_test(s, "writable registration", test_writable_registration);
	return h_run_tests();
}
