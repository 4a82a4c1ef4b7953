// SPDX-License-Identifier: MIT
/*
 * test-engines-doc: the decode loop of docs/engines.md, extracted verbatim
 * by docs/build.mk, run against a private snapkvd through several GROWs:
 * every kept row of every head is untouched afterwards, and every decode
 * row holds what the loop wrote at position L + g. Writing a slot before
 * growing (the guide's old loop) overwrites the next head's slot 0 and fails
 * here.
 */
#include <CUnit/Basic.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon-harness.h"
#include "snapkv.h"

static struct harness H;

/* What the guide leaves to the engine: the new token's rotated K and its V.
 * A value that names layer, head, position and dim, so a row in the wrong
 * place is found. */
static float kv_value(uint32_t l, uint32_t h, uint32_t p, uint32_t x)
{
	return 1.0f + (float)x + 16.0f * (float)p + 65536.0f * (float)(h + 8 * l);
}

static uint32_t head_dim;
static unsigned calls;

static void engine_new_kv(uint32_t l, uint32_t h, uint32_t p, float *K, float *V)
{
	for (uint32_t x = 0; x < head_dim; x++) {
		K[x] = kv_value(l, h, p, x);
		V[x] = -kv_value(l, h, p, x);
	}
	calls++;
}

#include "engines-decode.inc"

enum { LAYERS = 2, H_Q = 4, H_KV = 2, D = 8, L = 64, W = 8, C = 16 };

static int init(void)
{
	return h_start(&H, NULL) < 0;
}

static int fini(void)
{
	int r = h_stop(&H);

	h_cleanup(&H);
	return r != 0;
}

/* Compacts a random prompt with `reserve` decode slots per head; layer l's
 * Q, K, V at fixed offsets of one buffer, HND. */
static struct skv_cache *compact(struct skv_client *c, struct skv_buffer **ret_buf,
				 uint32_t reserve, enum skv_gqa gqa)
{
	size_t q_bytes = (size_t)H_Q * W * D * 4, kv_bytes = (size_t)H_KV * L * D * 4;
	size_t per_layer = q_bytes + 2 * kv_bytes, bytes = LAYERS * per_layer;
	struct skv_layer_ref lr[LAYERS];
	struct skv_compact_desc d = {.desc_size = sizeof(d)};
	struct skv_buffer *b = NULL;
	struct skv_cache *k = NULL;
	uint64_t seed = 7;
	float *f;

	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, bytes, &b), 0);
	f = skv_buffer_data(b);
	for (size_t i = 0; i < bytes / 4; i++)
		f[i] = h_rand(&seed);
	for (uint32_t l = 0; l < LAYERS; l++) {
		size_t o = l * per_layer;

		lr[l].q = (struct skv_tensor_ref){b, o, SKV_DTYPE_F32, W * D, D, 0, 0};
		lr[l].k = (struct skv_tensor_ref){b, o + q_bytes, SKV_DTYPE_F32, L * D, D, 0, 0};
		lr[l].v = (struct skv_tensor_ref){
		    b, o + q_bytes + kv_bytes, SKV_DTYPE_F32, L * D, D, 0, 0};
	}
	d.shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	d.layers = LAYERS;
	skv_client_params_init(&d.params);
	d.params.window = W;
	d.params.capacity = C;
	d.params.gqa = gqa;
	d.layer = lr;
	d.out_layout = SKV_LAYOUT_HND;
	d.decode_reserve = reserve;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	*ret_buf = b;
	return k;
}

/* Runs the guide's decode() for n tokens and checks every row of the cache. */
static void run_decode(uint32_t reserve, uint32_t n, uint32_t grow_by, enum skv_gqa gqa)
{
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = "engines-doc"};
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_cache *k;
	const struct skv_cache_info *ci;
	uint32_t heads, kept, cap0;
	float *kept_k, *kept_v;
	int32_t *kept_pos;

	CU_ASSERT_EQUAL_FATAL(skv_client_connect(H.sock, &o, &c), 0);
	k = compact(c, &b, reserve, gqa);
	ci = skv_cache_info(k);
	heads = ci->h_store;
	kept = ci->kept;
	cap0 = ci->capacity;
	head_dim = ci->head_dim;
	CU_ASSERT_EQUAL_FATAL(cap0, kept + reserve);
	CU_ASSERT_EQUAL_FATAL(ci->dtype, SKV_DTYPE_F32);
	/* the kept rows as the compaction left them */
	kept_k = calloc((size_t)LAYERS * heads * kept * D, 4);
	kept_v = calloc((size_t)LAYERS * heads * kept * D, 4);
	kept_pos = calloc((size_t)LAYERS * heads * kept, 4);
	CU_ASSERT_FATAL(kept_k && kept_v && kept_pos);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < heads; h++) {
			size_t at = ((size_t)l * heads + h) * kept;

			for (uint32_t i = 0; i < kept; i++) {
				memcpy(kept_k + (at + i) * D,
				       (float *)skv_cache_k(k, l, h) + (size_t)i * ci->token_stride,
				       D * 4);
				memcpy(kept_v + (at + i) * D,
				       (float *)skv_cache_v(k, l, h) + (size_t)i * ci->token_stride,
				       D * 4);
			}
			memcpy(kept_pos + at, skv_cache_positions(k, l, h), kept * 4);
		}

	calls = 0;
	CU_ASSERT_EQUAL(decode(k, n, grow_by), 0);
	CU_ASSERT_EQUAL(calls, n * LAYERS * heads);

	ci = skv_cache_info(k);
	CU_ASSERT_EQUAL(ci->appended, n);
	CU_ASSERT_EQUAL(skv_cache_next_slot(k), kept + n);
	CU_ASSERT_EQUAL(skv_cache_next_position(k), L + n);
	CU_ASSERT(ci->capacity >= kept + n);
	/* it had to grow (the test is about that), by grow_by at a time */
	CU_ASSERT(n > reserve);
	CU_ASSERT_EQUAL((ci->capacity - cap0) % grow_by, 0);
	unsigned bad_kept = 0, bad_new = 0, bad_pos = 0;
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < heads; h++) {
			const float *K = skv_cache_k(k, l, h), *V = skv_cache_v(k, l, h);
			const int32_t *pos = skv_cache_positions(k, l, h);
			size_t at = ((size_t)l * heads + h) * kept;

			for (uint32_t i = 0; i < kept; i++) {
				bad_kept += memcmp(K + (size_t)i * ci->token_stride,
						   kept_k + (at + i) * D, D * 4) != 0;
				bad_kept += memcmp(V + (size_t)i * ci->token_stride,
						   kept_v + (at + i) * D, D * 4) != 0;
				bad_pos += pos[i] != kept_pos[at + i];
			}
			for (uint32_t g = 0; g < n; g++) {
				const float *kr = K + (size_t)(kept + g) * ci->token_stride;
				const float *vr = V + (size_t)(kept + g) * ci->token_stride;

				for (uint32_t x = 0; x < D; x++)
					bad_new += kr[x] != kv_value(l, h, L + g, x) ||
						   vr[x] != -kv_value(l, h, L + g, x);
				bad_pos += pos[kept + g] != (int32_t)(L + g);
			}
		}
	if (bad_kept || bad_new || bad_pos)
		fprintf(stderr,
			"decode loop: %u kept rows changed, %u decode values wrong, %u "
			"positions wrong\n",
			bad_kept, bad_new, bad_pos);
	CU_ASSERT_EQUAL(bad_kept, 0);
	CU_ASSERT_EQUAL(bad_new, 0);
	CU_ASSERT_EQUAL(bad_pos, 0);
	free(kept_k);
	free(kept_v);
	free(kept_pos);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	skv_buffer_free(b);
	skv_client_close(c);
}

/* Headroom for 3 tokens, 11 decoded: three grows of 3 slots. */
static void test_decode_grows_group(void)
{
	run_decode(3, 11, 3, SKV_GQA_GROUP);
}

/* Expand mode (H_q heads stored), grows of 4. */
static void test_decode_grows_expand(void)
{
	run_decode(2, 9, 4, SKV_GQA_EXPAND);
}

/* No headroom at all: the very first token needs a grow. */
static void test_decode_no_reserve(void)
{
	run_decode(0, 5, 1, SKV_GQA_GROUP);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("engines.md decode loop", init, fini);
	CU_add_test(s, "grows while decoding (group)", test_decode_grows_group);
	CU_add_test(s, "grows while decoding (expand)", test_decode_grows_expand);
	CU_add_test(s, "no decode reserve", test_decode_no_reserve);
	return h_run_tests();
}
