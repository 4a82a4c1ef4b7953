// SPDX-License-Identifier: MIT
/*
 * test-kernels-paged.c - libskv's paged output (the engine's block format):
 * the same bytes, slot for slot, as the strided output of the same input,
 * in every dtype and GQA mode, and every bad block table refused with
 * -EINVAL before anything is written.
 */
#include "test-kernels-util.h"

/* One problem, outputs built in layout `lout` with block size bs. */
static void build(struct prob *pb, enum layout lout, uint32_t bs, enum skv_gqa gqa,
		  enum skv_dtype dt, uint64_t seed)
{
	rng_state = seed;
	prob_init(pb, 97, 16, 4, 2, 3);
	pb->p.window = 6;
	pb->p.capacity = 29;
	pb->p.kernel = 3;
	pb->p.gqa = gqa;
	pb->sh.n_q = 6;
	pb->dk = pb->dv = pb->dq = dt;
	pb->dout = dt;
	pb->lout = lout;
	pb->block_size = bs;
	prob_random(pb, 1.0);
	prob_build(pb);
}

static void test_paged_equals_strided(void)
{
	static const enum skv_dtype dts[] = {SKV_DTYPE_F32, SKV_DTYPE_F16, SKV_DTYPE_BF16};
	static const uint32_t bss[] = {1, 4, 16, 64};

	for (int gi = 0; gi < 2; gi++)
		for (int di = 0; di < 3; di++)
			for (int bi = 0; bi < 4; bi++) {
				enum skv_gqa gqa = gi ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
				struct prob a, b;
				build(&a, LAY_HND, 0, gqa, dts[di], 77 + di);
				build(&b, LAY_PAGED, bss[bi], gqa, dts[di], 77 + di);
				CU_ASSERT_EQUAL_FATAL(prob_run(&a, 2, NULL), 0);
				CU_ASSERT_EQUAL_FATAL(prob_run(&b, 3, NULL), 0);
				CU_ASSERT(prob_check(&b, 1e-3, NULL) == 0);
				uint32_t hs = gi ? a.sh.h_kv : a.sh.h_q, kept = 29;
				size_t es = skv_dtype_size(dts[di]);
				int diff = 0;
				for (uint32_t l = 0; l < 3; l++)
					for (uint32_t h = 0; h < hs; h++) {
						const struct skv_layer_out *oa = &a.out[l],
									   *ob = &b.out[l];
						diff += memcmp(oa->positions + h * oa->pos_stride,
							       ob->positions + h * ob->pos_stride,
							       kept * 4) != 0;
						diff += memcmp(&oa->retained_mass[h],
							       &ob->retained_mass[h], 4) != 0;
						for (uint32_t i = 0; i < kept; i++) {
							const char *ka = oa->k.data,
								   *kb = ob->k.data;
							const char *va = oa->v.data,
								   *vb = ob->v.data;
							diff +=
							    memcmp(ka + toff(&oa->k, h, i, 0) * es,
								   kb + toff(&ob->k, h, i, 0) * es,
								   16 * es) != 0;
							diff +=
							    memcmp(va + toff(&oa->v, h, i, 0) * es,
								   vb + toff(&ob->v, h, i, 0) * es,
								   16 * es) != 0;
						}
					}
				if (diff)
					fprintf(stderr, "\n  gqa %d dtype %d block %u: %d differ\n",
						gi, di, bss[bi], diff);
				CU_ASSERT_EQUAL(diff, 0);
				prob_free(&a);
				prob_free(&b);
			}
}

/* Slots of a paged output outside the kept range (block tail) stay untouched. */
static void test_paged_writes_nothing_else(void)
{
	struct prob pb;

	build(&pb, LAY_PAGED, 8, SKV_GQA_GROUP, SKV_DTYPE_F32, 5);
	/* the whole pool (the table names 4 of its 7 blocks) holds the canary */
	for (uint32_t l = 0; l < 3; l++)
		memset(pb.out[l].k.data, 0xa5,
		       (size_t)pb.out[l].pool_blocks * pb.out[l].k.block_stride * 4);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 2, NULL), 0);
	for (uint32_t l = 0; l < 3; l++) {
		const struct skv_tensor *t = &pb.out[l].k;
		const uint8_t *d = t->data;
		/* slots 29 .. 31 of every head in the last named block: canary */
		for (uint32_t h = 0; h < 2; h++)
			for (uint32_t i = 29; i < 32; i++) {
				const uint8_t *row = d + toff(t, h, i, 0) * 4;
				for (uint32_t x = 0; x < 16 * 4; x++)
					CU_ASSERT_EQUAL(row[x], 0xa5);
			}
		/* blocks of the pool the table does not name: canary */
		for (uint32_t b = 0; b < pb.out[l].pool_blocks; b++) {
			bool named = false;
			for (uint32_t i = 0; i < 4; i++)
				named |= t->block_table[i] == (int32_t)b;
			if (named)
				continue;
			const uint8_t *blk = d + (size_t)b * t->block_stride * 4;
			size_t n = (size_t)t->block_stride * 4;
			for (size_t x = 0; x < n; x++)
				CU_ASSERT_EQUAL(blk[x], 0xa5);
		}
	}
	prob_free(&pb);
}

static void test_paged_bad_tables(void)
{
	for (int c = 0;; c++) {
		struct prob pb;
		struct skv_error e;
		bool done = false;
		const char *what = "", *needle = "";

		build(&pb, LAY_PAGED, 4, SKV_GQA_EXPAND, SKV_DTYPE_F32, 9);
		struct skv_tensor *k1 = &pb.out[1].k, *v1 = &pb.out[1].v;
		int32_t *tk = (int32_t *)k1->block_table;
		switch (c) {
		case 0:
			what = "table shorter than the kept slots";
			k1->n_blocks = 7; /* 29 slots need 8 blocks of 4 */
			needle = "needs 8 blocks";
			break;
		case 1:
			what = "block outside the pool";
			tk[3] = (int32_t)pb.out[1].pool_blocks;
			needle = "outside the pool";
			break;
		case 2:
			what = "negative block";
			tk[0] = -2;
			needle = "negative";
			break;
		case 3:
			what = "two slots in the same block";
			tk[5] = tk[2];
			needle = "overlaps";
			break;
		case 4:
			what = "K and V in the same blocks";
			*v1 = *k1;
			needle = "overlaps";
			break;
		case 5:
			what = "two layers in the same blocks";
			pb.out[2].v = *k1;
			needle = "overlaps";
			break;
		case 6:
			what = "heads meeting inside a block";
			k1->head_stride = 8; /* D = 16: head h+1 starts inside head h */
			needle = "meet";
			break;
		case 7:
			what = "rows meeting inside a block";
			k1->token_stride = 16; /* 4 heads x 16 per row needed */
			needle = "meet";
			break;
		case 8:
			what = "negative stride";
			k1->block_stride = -k1->block_stride;
			needle = "non-negative";
			break;
		case 9:
			what = "pool_blocks 0";
			pb.out[1].pool_blocks = 0;
			needle = "pool_blocks";
			break;
		case 10:
			what = "block_size 0";
			k1->block_size = 0;
			needle = "block_size 0";
			break;
		case 11:
			what = "blocks overlapping (block_stride below a block)";
			k1->block_stride = 4 * 4 * 16 - 1;
			needle = "overlaps";
			break;
		default:
			done = true;
		}
		if (done) {
			prob_free(&pb);
			break;
		}
		e.msg[0] = 0;
		int r = prob_run(&pb, 2, &e);
		if (r != -EINVAL || !strstr(e.msg, needle) || !canary_intact(&pb)) {
			fprintf(stderr, "\n  case %d (%s): rc %d msg '%s' canary %d\n", c, what, r,
				e.msg, canary_intact(&pb));
			CU_FAIL("bad block table accepted, unclear, or output written");
		}
		prob_free(&pb);
	}
}

/* Interleaved K/V blocks of one pool ([block][2][bs][H][D], FlashInfer's
 * layout) are apart, so they are accepted. */
static void test_paged_interleaved_pool(void)
{
	struct prob pb, ref;

	build(&ref, LAY_HND, 0, SKV_GQA_GROUP, SKV_DTYPE_BF16, 21);
	build(&pb, LAY_PAGED, 4, SKV_GQA_GROUP, SKV_DTYPE_BF16, 21);
	const uint32_t bs = 4, H = 2, D = 16, nb = 8;
	for (uint32_t l = 0; l < 3; l++) {
		uint16_t *pool = track(&pb, calloc((size_t)nb * 2 * bs * H * D, 2));
		int32_t *tab = track(&pb, malloc(nb * sizeof(int32_t)));
		for (uint32_t i = 0; i < nb; i++)
			tab[i] = (int32_t)(nb - 1 - i);
		struct skv_tensor t = {.data = pool,
				       .dtype = SKV_DTYPE_BF16,
				       .head_stride = D,
				       .token_stride = H * D,
				       .block_table = tab,
				       .block_size = bs,
				       .n_blocks = nb,
				       .block_stride = 2 * bs * H * D};
		pb.out[l].k = t;
		t.data = pool + bs * H * D;
		pb.out[l].v = t;
		pb.out[l].pool_blocks = nb;
	}
	CU_ASSERT_EQUAL_FATAL(prob_run(&ref, 1, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(prob_run(&pb, 2, NULL), 0);
	int diff = 0;
	for (uint32_t l = 0; l < 3; l++)
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t i = 0; i < 29; i++) {
				const struct skv_layer_out *a = &ref.out[l], *b = &pb.out[l];
				diff += memcmp((const uint16_t *)a->k.data + toff(&a->k, h, i, 0),
					       (const uint16_t *)b->k.data + toff(&b->k, h, i, 0),
					       D * 2) != 0;
				diff += memcmp((const uint16_t *)a->v.data + toff(&a->v, h, i, 0),
					       (const uint16_t *)b->v.data + toff(&b->v, h, i, 0),
					       D * 2) != 0;
			}
	CU_ASSERT_EQUAL(diff, 0);
	prob_free(&pb);
	prob_free(&ref);
}

/* A problem with positions 0 .. 8 protected (a shared prompt prefix). */
static void build_protected(struct prob *pb, uint32_t protect, uint64_t seed)
{
	build(pb, LAY_PAGED, 4, SKV_GQA_GROUP, SKV_DTYPE_BF16, seed);
	pb->p.n_protected = 1;
	pb->p.protected_ranges[0] = (struct skv_range){0, protect};
}

/* In-place blocks (SKV_BLOCK_IN_PLACE): the leading blocks of protected
 * positions are not written at all (their poison stays), every other slot
 * and every position is what the plain paged output holds. */
static void test_paged_in_place(void)
{
	const uint32_t bs = 4, skip = 2, kept = 29, H = 2, D = 16;
	struct prob a, b;
	int32_t was[3][2][2];

	build_protected(&a, 9, 31);
	build_protected(&b, 9, 31);
	for (uint32_t l = 0; l < 3; l++)
		for (int kv = 0; kv < 2; kv++) {
			struct skv_tensor *t = kv ? &b.out[l].v : &b.out[l].k;
			int32_t *tab = (int32_t *)t->block_table;
			for (uint32_t i = 0; i < skip; i++) {
				was[l][kv][i] = tab[i];
				memset((uint16_t *)t->data + (size_t)tab[i] * t->block_stride, 0x5a,
				       (size_t)t->block_stride * 2);
				tab[i] = SKV_BLOCK_IN_PLACE;
			}
		}
	CU_ASSERT_EQUAL_FATAL(prob_run(&a, 2, NULL), 0);
	CU_ASSERT_EQUAL_FATAL(prob_run(&b, 2, NULL), 0);
	int diff = 0, touched = 0;
	for (uint32_t l = 0; l < 3; l++) {
		const struct skv_layer_out *oa = &a.out[l], *ob = &b.out[l];
		for (uint32_t h = 0; h < H; h++) {
			diff += memcmp(oa->positions + h * oa->pos_stride,
				       ob->positions + h * ob->pos_stride, kept * 4) != 0;
			for (uint32_t i = 0; i < skip * bs; i++)
				diff += ob->positions[h * ob->pos_stride + i] != (int32_t)i;
			for (uint32_t i = skip * bs; i < kept; i++) {
				diff += memcmp((const uint16_t *)oa->k.data + toff(&oa->k, h, i, 0),
					       (const uint16_t *)ob->k.data + toff(&ob->k, h, i, 0),
					       D * 2) != 0;
				diff += memcmp((const uint16_t *)oa->v.data + toff(&oa->v, h, i, 0),
					       (const uint16_t *)ob->v.data + toff(&ob->v, h, i, 0),
					       D * 2) != 0;
			}
		}
		for (int kv = 0; kv < 2; kv++) {
			const struct skv_tensor *t = kv ? &ob->v : &ob->k;
			for (uint32_t i = 0; i < skip; i++) {
				const uint8_t *blk = (const uint8_t *)t->data +
						     (size_t)was[l][kv][i] * t->block_stride * 2;
				for (size_t x = 0; x < (size_t)t->block_stride * 2; x++)
					touched += blk[x] != 0x5a;
			}
		}
	}
	CU_ASSERT_EQUAL(diff, 0);
	CU_ASSERT_EQUAL(touched, 0);
	prob_free(&a);
	prob_free(&b);
}

/* In-place blocks the rules do not allow: -EINVAL, nothing written. */
static void test_paged_in_place_refused(void)
{
	for (int c = 0; c < 4; c++) {
		struct prob pb;
		struct skv_error e = {0};
		const char *needle = "";

		build_protected(&pb, c == 0 ? 7 : 9, 41);
		for (uint32_t l = 0; l < 3; l++) {
			int32_t *tk = (int32_t *)pb.out[l].k.block_table;
			int32_t *tv = (int32_t *)pb.out[l].v.block_table;
			switch (c) {
			case 0: /* 2 blocks of 4 = positions 0 .. 7, only 0 .. 6 protected */
				tk[0] = tk[1] = tv[0] = tv[1] = SKV_BLOCK_IN_PLACE;
				needle = "protected";
				break;
			case 1: /* not leading */
				tk[1] = tv[1] = SKV_BLOCK_IN_PLACE;
				needle = "only lead";
				break;
			case 2: /* K in place, V not */
				tk[0] = SKV_BLOCK_IN_PLACE;
				needle = "agree";
				break;
			case 3: /* no protected range at all */
				pb.p.n_protected = 0;
				tk[0] = tv[0] = SKV_BLOCK_IN_PLACE;
				needle = "protected";
				break;
			}
		}
		int r = prob_run(&pb, 2, &e);
		if (r != -EINVAL || !strstr(e.msg, needle) || !canary_intact(&pb)) {
			fprintf(stderr, "\n  case %d: rc %d msg '%s' canary %d\n", c, r, e.msg,
				canary_intact(&pb));
			CU_FAIL("bad in-place blocks accepted, unclear, or output written");
		}
		prob_free(&pb);
	}
}

int main(void)
{
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	CU_pSuite s = CU_add_suite("kernels_paged_output", NULL, NULL);
	CU_add_test(s, "paged output equals strided output", test_paged_equals_strided);
	CU_add_test(s, "paged output writes nothing else", test_paged_writes_nothing_else);
	CU_add_test(s, "bad block tables: -EINVAL, nothing written", test_paged_bad_tables);
	CU_add_test(s, "interleaved K/V pool accepted", test_paged_interleaved_pool);
	CU_add_test(s, "in-place blocks: untouched, the rest as before", test_paged_in_place);
	CU_add_test(s, "in-place blocks: refused outside the protected prefix",
		    test_paged_in_place_refused);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned f = CU_get_number_of_failures();
	CU_cleanup_registry();
	return f ? 1 : 0;
}
