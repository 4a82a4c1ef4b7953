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
	uint64_t seed = 12;

	if (h_start_config(&H, "snapkvd-paged", "max_prompt_len = 4096\nmax_block_table = 4096\n") <
		0 ||
	    skv_client_connect(H.sock, NULL, &cl) < 0)
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
	/* APPEND works; GROW takes more slots in the blocks the table has */
	CU_ASSERT_EQUAL(skv_cache_append(k, 2), 0);
	CU_ASSERT_EQUAL(skv_cache_grow(k, 8), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k)->capacity, KEPT + RESERVE + 8);
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
	/* a table over max_block_table (4096 here) */
	wb_desc(&d);
	for (int i = 0; i < 5000; i++)
		big[i] = 40 + i % 4;
	d.out_block_table = big;
	d.out_n_blocks = 5000;
	CU_ASSERT_EQUAL(try_compact(&d), -E2BIG);
	CU_ASSERT(strstr(skv_client_error(cl), "max_block_table") != NULL);
	/* nothing half-applied: the pool as before, the pool's K/V unchanged */
	CU_ASSERT_EQUAL(h_pool_used(H.sock), used);
}

/* ---- budget modes with paged output (SPEC.md: uniform and mass only) ---- */

/*
 * The dense reference of a budget mode: libskv's skv_compact_budget() here
 * on the same paged input, into HND rows of L slots per head (room for
 * anything a head may keep), head h's kept rows at h * L.
 */
#define TARGET	  120 /* the C* the mass tests aim at: 7.5 blocks */
#define MASS_MIN  24
#define MASS_MAX  200
#define MASS_STEP 8
static float dk[LAYERS][H_KV * L * D], dv[LAYERS][H_KV * L * D];
static int32_t dpos[LAYERS][H_KV * L];
static uint32_t dkept[LAYERS * H_KV];
static struct skv_budget_result dres;

static void dense_ref(const struct skv_params *p)
{
	struct skv_shape sh = {.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	struct skv_error err = {{0}, -1, -1};
	struct skv_layer_in in[LAYERS];
	struct skv_layer_out out[LAYERS];
	struct skv_ctx *ctx;

	for (uint32_t l = 0; l < LAYERS; l++) {
		struct skv_tensor kin = {.data = pool_k(l),
					 .dtype = SKV_DTYPE_F32,
					 .head_stride = D,
					 .token_stride = H_KV * D,
					 .block_table = in_table,
					 .block_size = BS,
					 .n_blocks = IN_BLOCKS,
					 .block_stride = BLOCK_EL};

		in[l].q = (struct skv_tensor){.data = (float *)skv_buffer_data(qbuf) +
						      (size_t)l * H_Q * W * D,
					      .dtype = SKV_DTYPE_F32,
					      .head_stride = W * D,
					      .token_stride = D};
		in[l].k = kin;
		in[l].v = kin;
		in[l].v.data = pool_v(l);
		out[l] = (struct skv_layer_out){
		    .k = {.data = dk[l],
			  .dtype = SKV_DTYPE_F32,
			  .head_stride = L * D,
			  .token_stride = D},
		    .v = {.data = dv[l],
			  .dtype = SKV_DTYPE_F32,
			  .head_stride = L * D,
			  .token_stride = D},
		    .positions = dpos[l],
		    .pos_stride = L,
		};
	}
	dres = (struct skv_budget_result){.result_size = sizeof(dres), .kept = dkept};
	CU_ASSERT_FATAL(skv_ctx_new(1, &ctx) == 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact_budget(ctx, &sh, p, LAYERS, in, out, &dres, &err), 0);
	skv_ctx_free(ctx);
}

static void mass_params(struct skv_params *p, float tau, uint32_t cmin, uint32_t cmax)
{
	skv_params_init(p); /* the full size: the mode reaches snapkvd */
	p->window = W;
	p->capacity = C;
	p->gqa = SKV_GQA_GROUP;
	p->budget_mode = SKV_BUDGET_MASS;
	p->tau = tau;
	p->c_min = cmin;
	p->c_max = cmax;
	p->c_step = MASS_STEP;
}

/*
 * A tau whose C* is TARGET with a margin: halfway between the smallest
 * mass over every head at TARGET - step and at TARGET (a ladder of one
 * rung each), so rounding of another backend cannot move C*.
 */
static float mass_tau(void)
{
	static float tau;
	struct skv_params p;
	float lo, hi;

	if (tau > 0)
		return tau;
	mass_params(&p, 0.5f, TARGET - MASS_STEP, TARGET - MASS_STEP);
	dense_ref(&p);
	lo = dres.min_mass;
	mass_params(&p, 0.5f, TARGET, TARGET);
	dense_ref(&p);
	hi = dres.min_mass;
	CU_ASSERT_FATAL(hi > lo + 1e-3f);
	tau = (lo + hi) / 2;
	return tau;
}

/* The daemon's paged cache k against the dense reference: every kept row
 * of every head, K, V and positions, bit for bit; kept and C* alike. */
static int check_dense(const struct skv_cache *k, uint32_t kept)
{
	struct skv_cache_budget cb = {.budget_size = sizeof(cb)};
	int bad = 0;

	CU_ASSERT_EQUAL(skv_cache_info(k)->kept, kept);
	CU_ASSERT_EQUAL(skv_cache_budget(k, &cb), 0);
	CU_ASSERT_EQUAL(cb.c_star, dres.c_star);
	CU_ASSERT_EQUAL(cb.fallback, dres.fallback);
	CU_ASSERT_EQUAL(cb.ragged, 0);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < H_KV; h++) {
			bad += dkept[l * H_KV + h] != kept || skv_cache_head_kept(k, l, h) != kept;
			bad += memcmp(skv_cache_positions(k, l, h), dpos[l] + h * L, kept * 4) != 0;
			for (uint32_t s = 0; s < kept; s++) {
				const void *kp = skv_cache_k_slot(k, l, h, s);
				const void *vp = skv_cache_v_slot(k, l, h, s);

				bad += !kp || !vp ||
				       memcmp(kp, dk[l] + ((size_t)h * L + s) * D, D * 4) ||
				       memcmp(vp, dv[l] + ((size_t)h * L + s) * D, D * 4);
			}
		}
	CU_ASSERT_EQUAL(bad, 0);
	return bad;
}

/* The ledger's compact (arena) or engine-held (writeback) bytes of the
 * only cache: SPEC's sums, every head kept `kept` rows + the reserve. */
static void check_ledger_kept(uint32_t kept, bool writeback)
{
	Snapkv__V1__AdminReply *a = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER);
	uint64_t rows = (uint64_t)LAYERS * H_KV * kept, res = (uint64_t)LAYERS * H_KV * RESERVE;

	CU_ASSERT_FATAL(a != NULL && a->n_caches == 1);
	if (writeback) {
		CU_ASSERT_EQUAL(a->caches[0]->bytes->compact, 0);
		CU_ASSERT_EQUAL(a->caches[0]->bytes->engine_held, 2 * D * 4 * (rows + res));
	} else {
		CU_ASSERT_EQUAL(a->caches[0]->bytes->compact, 2 * D * 4 * rows);
		CU_ASSERT_EQUAL(a->caches[0]->bytes->reserved, 2 * D * 4 * res);
	}
	CU_ASSERT_EQUAL(a->caches[0]->bytes->index, 4 * rows);
	snapkv__v1__admin_reply__free_unpacked(a, NULL);
}

/* mass into the arena: sized for C_max, C* kept; n_blocks and the runs
 * those of C*; APPEND and GROW keep the rows. */
static void test_mass_arena(void)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	uint64_t off, bytes;
	uint32_t nb = (TARGET + RESERVE + BS - 1) / BS;

	mass_params(&d.params, mass_tau(), MASS_MIN, MASS_MAX);
	dense_ref(&d.params);
	CU_ASSERT_EQUAL_FATAL(dres.c_star, TARGET);
	struct skv_params p = d.params;
	desc_init(&d, BS);
	d.params = p;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	check_dense(k, TARGET);
	CU_ASSERT_EQUAL(skv_cache_info(k)->capacity, TARGET + RESERVE);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, nb);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (int v = 0; v < 2; v++) {
			CU_ASSERT_EQUAL(skv_cache_block_run(k, l, v, &off, &bytes), 0);
			CU_ASSERT_EQUAL(off % 4096, 0);
			CU_ASSERT_EQUAL(bytes, (uint64_t)nb * BLOCK_EL * 4); /* 8 KiB blocks */
		}
	/* the decode slots read as zero, in a region earlier caches used */
	static const float zero[D];
	int nz = 0;
	for (uint32_t s = TARGET; s < TARGET + RESERVE; s++)
		nz += memcmp(skv_cache_k_slot(k, 1, 1, s), zero, sizeof(zero)) != 0 ||
		      memcmp(skv_cache_v_slot(k, 0, 0, s), zero, sizeof(zero)) != 0;
	CU_ASSERT_EQUAL(nz, 0);
	check_ledger_kept(TARGET, false);
	printf("\n  mass tau %.4f: C* %u of %u..%u, %u blocks of %u\n", (double)p.tau, dres.c_star,
	       MASS_MIN, MASS_MAX, nb, (MASS_MAX + RESERVE + BS - 1) / BS);
	CU_ASSERT_EQUAL(skv_cache_append(k, 3), 0);
	CU_ASSERT_EQUAL(skv_cache_grow(k, 40), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k)->capacity, TARGET + RESERVE + 40);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, (TARGET + RESERVE + 40 + BS - 1) / BS);
	check_dense(k, TARGET);
	CU_ASSERT_EQUAL(skv_cache_positions(k, 1, 1)[TARGET + 2], L + 2);
	CU_ASSERT_EQUAL(skv_cache_positions(k, 1, 1)[TARGET + 3], -1);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
}

/* Every float of the pool that is not one of the first `kept` slots of
 * table[] equals before[]; those slots equal the dense reference. */
static int pool_rows_check(const float *before, const int32_t *table, uint32_t kept)
{
	size_t n = (size_t)LAYERS * 2 * POOL_EL, bad = 0;
	const float *now = skv_buffer_data(pool);
	uint8_t *mine = calloc(n / D, 1); /* per row of D floats: 1 = a kept row */

	CU_ASSERT_FATAL(mine != NULL);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t s = 0; s < kept; s++)
			for (uint32_t h = 0; h < H_KV; h++) {
				size_t at =
				    (size_t)table[s / BS] * BLOCK_EL + (s % BS) * H_KV * D + h * D;

				bad += memcmp(pool_k(l) + at, dk[l] + ((size_t)h * L + s) * D,
					      D * 4) != 0;
				bad += memcmp(pool_v(l) + at, dv[l] + ((size_t)h * L + s) * D,
					      D * 4) != 0;
				mine[(pool_k(l) + at - now) / D] =
				    mine[(pool_v(l) + at - now) / D] = 1;
			}
	for (size_t r = 0; r < n / D; r++)
		if (!mine[r] && memcmp(now + r * D, before + r * D, D * 4))
			bad++;
	free(mine);
	CU_ASSERT_EQUAL(bad, 0);
	return (int)bad;
}

/* mass by writeback: the table covers C_max; C*'s rows land in its first
 * blocks, nothing else of the pool changes, n_blocks counts those used. */
static void test_mass_writeback(void)
{
	size_t n = (size_t)LAYERS * 2 * POOL_EL;
	float *before = malloc(n * sizeof(float));
	static int32_t table[(MASS_MAX + BS - 1) / BS];
	uint32_t nt = (MASS_MAX + BS - 1) / BS;
	struct skv_compact_desc d;
	struct skv_params p;
	struct skv_cache *k = NULL;

	CU_ASSERT_FATAL(before != NULL);
	memcpy(before, skv_buffer_data(pool), n * sizeof(float));
	mass_params(&p, mass_tau(), MASS_MIN, MASS_MAX);
	dense_ref(&p);
	CU_ASSERT_EQUAL_FATAL(dres.c_star, TARGET);
	for (uint32_t i = 0; i < nt; i++)
		table[i] = 50 - (int32_t)i; /* descending: a real table */
	desc_init(&d, BS);
	d.params = p;
	d.out_dest = SKV_OUT_WRITEBACK;
	d.out_layer = layers_out;
	d.out_block_table = table;
	d.out_n_blocks = nt - 1; /* one short of C_max: refused before any work */
	CU_ASSERT_EQUAL(skv_client_compact(cl, &d, &k), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(cl), "C_max"));
	CU_ASSERT_EQUAL(memcmp(before, skv_buffer_data(pool), n * sizeof(float)), 0);
	d.out_n_blocks = nt;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	check_dense(k, TARGET);
	CU_ASSERT_EQUAL(skv_cache_info(k)->out_dest, SKV_OUT_WRITEBACK);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, (TARGET + RESERVE + BS - 1) / BS);
	pool_rows_check(before, table, TARGET);
	check_ledger_kept(TARGET, true);
	CU_ASSERT_EQUAL(skv_cache_append(k, 2), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	memcpy(skv_buffer_data(pool), before, n * sizeof(float));
	free(before);
}

/* A fallback keeps all L in every head: paged output with room for L
 * (arena sized for it; writeback's table covering it) takes it; a table
 * short of L is refused before any work, nothing written or held. */
static void test_fallback(void)
{
	size_t n = (size_t)LAYERS * 2 * POOL_EL;
	float *before = malloc(n * sizeof(float));
	static int32_t table[IN_BLOCKS];
	struct skv_compact_desc d;
	struct skv_params p;
	struct skv_cache *k = NULL;
	long long used = h_pool_used(H.sock);

	CU_ASSERT_FATAL(before != NULL);
	memcpy(before, skv_buffer_data(pool), n * sizeof(float));
	/* uniform C with a fallback, into the arena */
	skv_params_init(&p);
	p.window = W;
	p.capacity = C;
	p.gqa = SKV_GQA_GROUP;
	p.fallback_below = 0.999f;
	dense_ref(&p);
	CU_ASSERT_EQUAL_FATAL(dres.fallback, 1);
	desc_init(&d, BS);
	d.params = p;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	check_dense(k, L);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, (L + RESERVE + BS - 1) / BS);
	check_ledger_kept(L, false);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, used, 2000), 0);
	/* mass with a fallback, by writeback: a table of C_max's blocks is
	 * short of L: refused, naming the rows and the blocks */
	mass_params(&p, mass_tau(), MASS_MIN, MASS_MAX);
	p.fallback_below = 0.999f;
	dense_ref(&p);
	CU_ASSERT_EQUAL_FATAL(dres.fallback, 1);
	for (uint32_t i = 0; i < IN_BLOCKS; i++)
		table[i] = 40 + (int32_t)i;
	desc_init(&d, BS);
	d.params = p;
	d.out_dest = SKV_OUT_WRITEBACK;
	d.out_layer = layers_out;
	d.out_block_table = table;
	d.out_n_blocks = (MASS_MAX + BS - 1) / BS;
	k = NULL;
	CU_ASSERT_EQUAL(skv_client_compact(cl, &d, &k), -EINVAL);
	CU_ASSERT_PTR_NULL(k);
	printf("\n  refused: %s\n", skv_client_error(cl));
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(cl), "has 13 blocks, the 300 kept slots "
							    "need 19 of 16 (fallback_below"));
	CU_ASSERT_EQUAL(memcmp(before, skv_buffer_data(pool), n * sizeof(float)), 0);
	CU_ASSERT_EQUAL(h_pool_used(H.sock), used);
	Snapkv__V1__AdminReply *a = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER);
	CU_ASSERT(a != NULL && a->n_caches == 0);
	if (a)
		snapkv__v1__admin_reply__free_unpacked(a, NULL);
	/* the table covering L: every head keeps the prompt, in the engine's blocks */
	d.out_n_blocks = IN_BLOCKS;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	check_dense(k, L);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, IN_BLOCKS); /* all of the table */
	pool_rows_check(before, table, L);
	check_ledger_kept(L, true);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	memcpy(skv_buffer_data(pool), before, n * sizeof(float));
	free(before);
}

/* Modes that give layers or heads their own counts: refused by name. */
static void test_budget_refusals(void)
{
	static const enum skv_budget modes[] = {SKV_BUDGET_HEADS, SKV_BUDGET_MASS_HEADS,
						SKV_BUDGET_LAYERS};
	static const char *const want[] = {
	    "budget mode heads gives heads different counts: paged output needs one count "
	    "for every head of every layer (uniform or mass)",
	    "budget mode mass-heads gives heads different counts",
	    "budget mode layers gives layers different counts"};
	struct skv_compact_desc d;
	long long used = h_pool_used(H.sock);

	for (unsigned i = 0; i < 3; i++) {
		mass_params(&d.params, 0.9f, MASS_MIN, MASS_MAX);
		struct skv_params p = d.params;
		p.budget_mode = modes[i];
		if (modes[i] == SKV_BUDGET_LAYERS) {
			p.n_layer_caps = LAYERS;
			p.layer_caps[0] = p.layer_caps[1] = C; /* even equal C_l */
		}
		desc_init(&d, BS);
		d.params = p;
		CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
		if (!strstr(skv_client_error(cl), want[i]))
			fprintf(stderr, "want \"%s\", got \"%s\"\n", want[i], skv_client_error(cl));
		CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(cl), want[i]));
	}
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

/* ---- writeback without thrown-away copies, without per-token traffic ---- */

#define PROT_BLOCKS 2 /* positions 0 .. 31 protected: a shared system prompt */

/* A writeback request with the first PROT_BLOCKS blocks' positions protected. */
static void prot_desc(struct skv_compact_desc *d)
{
	wb_desc(d);
	d->params.n_protected = 1;
	d->params.protected_ranges[0] = (struct skv_range){0, PROT_BLOCKS * BS};
}

/* The bytes of every kept slot and the positions, K then V, of cache k. */
static void slot_bytes(const struct skv_cache *k, float *kv, int32_t *pos)
{
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < H_KV; h++) {
			memcpy(pos + ((size_t)l * H_KV + h) * KEPT, skv_cache_positions(k, l, h),
			       KEPT * 4);
			for (uint32_t s = 0; s < KEPT; s++) {
				size_t at = (((size_t)l * H_KV + h) * KEPT + s) * 2 * D;

				memcpy(kv + at, skv_cache_k_slot(k, l, h, s), D * 4);
				memcpy(kv + at + D, skv_cache_v_slot(k, l, h, s), D * 4);
			}
		}
}

/*
 * The protected prefix's blocks (the input's in_table[0..1], shared with
 * other sequences) hold a poison the compaction reads as keys; with
 * out_in_place_blocks they are not written, the destination table covers
 * the rest only, and every slot (in place or written) and position equals
 * what the old path (a full destination table) produced.
 */
static void test_writeback_in_place(void)
{
	size_t n = (size_t)LAYERS * 2 * POOL_EL, per = (size_t)LAYERS * H_KV * KEPT;
	float *before = malloc(n * sizeof(float)), *old_kv = malloc(per * 2 * D * 4);
	float *new_kv = malloc(per * 2 * D * 4);
	int32_t *old_pos = malloc(per * 4), *new_pos = malloc(per * 4);
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	size_t changed = 0;

	CU_ASSERT_FATAL(before && old_kv && new_kv && old_pos && new_pos);
	memcpy(before, skv_buffer_data(pool), n * sizeof(float));
	for (uint32_t l = 0; l < LAYERS; l++)
		for (int v = 0; v < 2; v++)
			for (int b = 0; b < PROT_BLOCKS; b++) {
				float *blk =
				    (v ? pool_v(l) : pool_k(l)) + (size_t)in_table[b] * BLOCK_EL;

				for (size_t i = 0; i < BLOCK_EL; i++)
					blk[i] = 0.25f + (float)(i % 7) / 8;
			}
	float *poisoned = malloc(n * sizeof(float));
	CU_ASSERT_FATAL(poisoned != NULL);
	memcpy(poisoned, skv_buffer_data(pool), n * sizeof(float));
	/* the old path: every kept slot written into the destination */
	prot_desc(&d);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	slot_bytes(k, old_kv, old_pos);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	memcpy(skv_buffer_data(pool), poisoned, n * sizeof(float));
	/* in place: the destination table starts at slot 32 */
	prot_desc(&d);
	d.out_in_place_blocks = PROT_BLOCKS;
	d.out_block_table = wb_table + PROT_BLOCKS;
	d.out_n_blocks = OUT_BLOCKS - PROT_BLOCKS;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k)->in_place_blocks, PROT_BLOCKS);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, OUT_BLOCKS);
	/* which physical block holds slot 0: the input's shared block */
	CU_ASSERT_EQUAL(skv_cache_block_offset(k, 1, SKV_KV_V, 1),
			(int64_t)(pool_off(1, 1) + (uint64_t)in_table[1] * BLOCK_EL * 4));
	CU_ASSERT_EQUAL(skv_cache_block_offset(k, 1, SKV_KV_V, PROT_BLOCKS),
			(int64_t)(pool_off(1, 1) + (uint64_t)wb_table[PROT_BLOCKS] * BLOCK_EL * 4));
	slot_bytes(k, new_kv, new_pos);
	CU_ASSERT_EQUAL(memcmp(old_pos, new_pos, per * 4), 0);
	CU_ASSERT_EQUAL(memcmp(old_kv, new_kv, per * 2 * D * 4), 0);
	/* written: the destination blocks only; the shared blocks untouched */
	for (size_t i = 0; i < n; i++) {
		size_t blk = (i % POOL_EL) / BLOCK_EL;

		if ((blk < 40 + PROT_BLOCKS || blk >= 40 + OUT_BLOCKS) &&
		    poisoned[i] != ((float *)skv_buffer_data(pool))[i])
			changed++;
	}
	CU_ASSERT_EQUAL(changed, 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	memcpy(skv_buffer_data(pool), before, n * sizeof(float));
	free(poisoned);
	free(before);
	free(old_kv);
	free(new_kv);
	free(old_pos);
	free(new_pos);
}

static void test_writeback_in_place_refused(void)
{
	struct skv_compact_desc d;
	struct skv_layer_ref other[LAYERS];
	long long used = h_pool_used(H.sock);
	size_t n = (size_t)LAYERS * 2 * POOL_EL;
	float *before = malloc(n * sizeof(float));

	CU_ASSERT_FATAL(before != NULL);
	memcpy(before, skv_buffer_data(pool), n * sizeof(float));
	/* in-place blocks past the protected prefix */
	prot_desc(&d);
	d.out_in_place_blocks = PROT_BLOCKS + 1;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "protected") != NULL);
	/* a destination table too short for the unprotected part */
	prot_desc(&d);
	d.out_in_place_blocks = PROT_BLOCKS;
	d.out_block_table = wb_table + PROT_BLOCKS;
	d.out_n_blocks = OUT_BLOCKS - PROT_BLOCKS - 1;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "out_in_place_blocks") != NULL);
	/* the input read from another buffer: the bytes are not in place */
	prot_desc(&d);
	d.out_in_place_blocks = PROT_BLOCKS;
	memcpy(other, layers_in, sizeof(other));
	other[1].v = pool_ref(ro_pool, 1, 1);
	d.layer = other;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "destination pools") != NULL);
	/* more in-place blocks than the input table has (libsnapkv) */
	prot_desc(&d);
	d.out_in_place_blocks = IN_BLOCKS + 1;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	/* arena output: nothing is in place there */
	desc_init(&d, BS);
	d.params.n_protected = 1;
	d.params.protected_ranges[0] = (struct skv_range){0, PROT_BLOCKS * BS};
	d.out_in_place_blocks = 1;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "WRITEBACK") != NULL);
	/* nothing half-applied */
	CU_ASSERT_EQUAL(h_pool_used(H.sock), used);
	CU_ASSERT_EQUAL(memcmp(before, skv_buffer_data(pool), n * sizeof(float)), 0);
	free(before);
}

#define MAX_DECODE 64

/* The one cache's ledger line: its appended g, engine-held bytes, max_decode. */
static void ledger_line(uint32_t *g, uint64_t *held, uint32_t *maxd, bool *lingering)
{
	Snapkv__V1__AdminReply *a = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER);

	CU_ASSERT_FATAL(a != NULL && a->n_caches == 1);
	*g = a->caches[0]->appended;
	*held = a->caches[0]->bytes->engine_held;
	*maxd = a->caches[0]->max_decode;
	*lingering = a->caches[0]->lingering;
	snapkv__v1__admin_reply__free_unpacked(a, NULL);
}

/*
 * max_decode: the ledger counts the writeback cache at kept + max_decode
 * from the start; APPEND is optional up to that; GROW takes the engine's
 * new blocks, up to max_decode; RELEASE reports g.
 */
static void test_writeback_max_decode(void)
{
	const uint64_t slot = (uint64_t)LAYERS * 2 * H_KV * D * 4;
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	uint64_t held;
	uint32_t g, maxd;
	bool ling;
	int32_t nb[2];

	wb_desc(&d);
	d.max_decode = MAX_DECODE;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k)->max_decode, MAX_DECODE);
	CU_ASSERT_EQUAL(skv_cache_info(k)->decode_limit, MAX_DECODE);
	ledger_line(&g, &held, &maxd, &ling);
	CU_ASSERT_EQUAL(g, 0);
	CU_ASSERT_EQUAL(maxd, MAX_DECODE);
	CU_ASSERT_EQUAL(held, slot * (KEPT + MAX_DECODE));
	/* no APPEND needed; one past the reserve is fine, past max_decode not */
	CU_ASSERT_EQUAL(skv_cache_append(k, 20), 0);
	CU_ASSERT_EQUAL(skv_cache_append(k, MAX_DECODE - 19), -ENOSPC);
	CU_ASSERT(strstr(skv_client_error(cl), "max_decode") != NULL);
	ledger_line(&g, &held, &maxd, &ling);
	CU_ASSERT_EQUAL(g, 20);
	CU_ASSERT_EQUAL(held, slot * (KEPT + MAX_DECODE));
	/* GROW to 140 slots: 9 blocks, the table has 8: one new block */
	CU_ASSERT_EQUAL(skv_cache_grow(k, 30), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "needs 1 new destination blocks") != NULL);
	nb[0] = wb_table[2]; /* one of the cache's own */
	CU_ASSERT_EQUAL(skv_cache_grow_blocks(k, 30, nb, 1), -EINVAL);
	nb[0] = NB; /* outside the pools */
	CU_ASSERT_EQUAL(skv_cache_grow_blocks(k, 30, nb, 1), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "outside") != NULL);
	nb[0] = 50;
	nb[1] = 51;
	CU_ASSERT_EQUAL(skv_cache_grow_blocks(k, 30, nb, 2), -EINVAL); /* one too many */
	CU_ASSERT_EQUAL(skv_cache_info(k)->capacity, KEPT + RESERVE);
	CU_ASSERT_EQUAL_FATAL(skv_cache_grow_blocks(k, 30, nb, 1), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k)->capacity, KEPT + RESERVE + 30);
	CU_ASSERT_EQUAL(skv_cache_info(k)->n_blocks, OUT_BLOCKS + 2);
	CU_ASSERT_EQUAL(skv_cache_block_offset(k, 0, SKV_KV_K, OUT_BLOCKS + 1),
			(int64_t)(pool_off(0, 0) + 50ull * BLOCK_EL * 4));
	/* the appended slots past the old rows got their positions */
	CU_ASSERT_EQUAL(skv_cache_positions(k, 1, 1)[KEPT + 15], L + 15);
	CU_ASSERT_EQUAL(skv_cache_positions(k, 1, 1)[KEPT + 20], -1);
	check_exact(k);
	/* beyond the declared maximum */
	CU_ASSERT_EQUAL(skv_cache_grow(k, MAX_DECODE - 40 + 1), -E2BIG);
	CU_ASSERT(strstr(skv_client_error(cl), "declared maximum") != NULL);
	/* the engine reports g at release: below its g or past the limit refused */
	CU_ASSERT_EQUAL(skv_cache_release_appended(k, 19, 1), -EINVAL);
	CU_ASSERT_EQUAL(skv_cache_release_appended(k, MAX_DECODE + 1, 1), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "nothing released") != NULL);
	CU_ASSERT_EQUAL(skv_cache_release_appended(k, 50, 1), 0);
	ledger_line(&g, &held, &maxd, &ling);
	CU_ASSERT(ling);
	CU_ASSERT_EQUAL(g, 50);
	CU_ASSERT_EQUAL(held, slot * (KEPT + MAX_DECODE));
}

/* max_decode with arena output, or over the config's limit: refused. */
static void test_max_decode_refused(void)
{
	struct skv_compact_desc d;

	desc_init(&d, BS);
	d.max_decode = 8;
	CU_ASSERT_EQUAL(try_compact(&d), -EINVAL);
	CU_ASSERT(strstr(skv_client_error(cl), "max_decode") != NULL);
	wb_desc(&d);
	d.max_decode = (1u << 20) + 1;
	CU_ASSERT_EQUAL(try_compact(&d), -E2BIG);
	CU_ASSERT(strstr(skv_client_error(cl), "max_decode") != NULL);
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
	CU_add_test(s, "mass, arena: C* rows = skv_compact_budget's, blocks of C*, GROW",
		    test_mass_arena);
	CU_add_test(s, "mass, writeback: room for C_max, C*'s blocks written, nothing else",
		    test_mass_writeback);
	CU_add_test(s, "fallback: all L with room, refused untouched without", test_fallback);
	CU_add_test(s, "heads, mass-heads, layers refused with paged output", test_budget_refusals);
	CU_add_test(s, "writable registration", test_writable_registration);
	CU_add_test(s, "writeback in place: protected blocks untouched, the rest as before",
		    test_writeback_in_place);
	CU_add_test(s, "writeback in place: refusals, nothing half-applied",
		    test_writeback_in_place_refused);
	CU_add_test(s, "max_decode refusals", test_max_decode_refused);
	/* last: it leaves a lingering cache */
	CU_add_test(s, "writeback max_decode: ledger, optional APPEND, GROW blocks, RELEASE g",
		    test_writeback_max_decode);
	return h_run_tests();
}
