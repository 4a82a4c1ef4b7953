// SPDX-License-Identifier: MIT
/*
 * test-daemon-budget: budget modes (SPEC.md "Budgets beyond one C") through
 * snapkvd. Every mode's cache equals libskv's skv_compact_budget() run here
 * on the same input, bit for bit (per-head kept counts, positions, K and V
 * rows, retained mass, C*, fallback); APPEND, GROW, RELEASE and linger on a
 * ragged cache; the summed ledger; and every bad budget refused before any
 * work with its message, nothing leaked (pool used back at 0, fds back at
 * the baseline). On --backend cuda (emulated): every mode on the plugin's
 * kernels, and with K/V in the GPU arena equal to the host arena's cache,
 * through APPEND and GROW.
 */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon-harness.h"
#include "skv.h"
#include "snapkv.h"

#define LAYERS 3
#define H_Q    4
#define H_KV   2
#define D      16
#define L      160
#define W      8
#define C      32

static struct harness H;
static struct skv_client *cl;
static struct skv_buffer *buf;
static struct skv_layer_ref refs[LAYERS];
static struct skv_ctx *ctx;
static int base_fds;

/* buffer: per layer Q [H_Q][W][D], K [H_KV][L][D], V the same, f32 */
#define Q_EL	 ((size_t)H_Q * W * D)
#define KV_EL	 ((size_t)H_KV * L * D)
#define LAYER_EL (Q_EL + 2 * KV_EL)

static float *layer_base(uint32_t l)
{
	return (float *)skv_buffer_data(buf) + (size_t)l * LAYER_EL;
}

/* The inputs of every layer: peaked, so the heads' masses differ. */
static void fill_inputs(float *x)
{
	uint64_t seed = 13;

	for (size_t i = 0; i < LAYERS * LAYER_EL; i++)
		x[i] = h_rand(&seed) * (i % 7 == 0 ? 4.0f : 1.0f);
}

static int suite_init(void)
{

	if (h_start(&H, NULL) < 0 || skv_client_connect(H.sock, NULL, &cl) < 0 ||
	    skv_buffer_alloc(cl, LAYERS * LAYER_EL * sizeof(float), &buf) < 0 ||
	    skv_ctx_new(1, &ctx) < 0)
		return -1;
	fill_inputs(skv_buffer_data(buf));
	for (uint32_t l = 0; l < LAYERS; l++) {
		uint64_t o = (uint64_t)l * LAYER_EL * sizeof(float);

		refs[l].q = (struct skv_tensor_ref){buf, o, SKV_DTYPE_F32, W * D, D, 0, 0};
		refs[l].k =
		    (struct skv_tensor_ref){buf, o + Q_EL * 4, SKV_DTYPE_F32, L * D, D, 0, 0};
		refs[l].v = (struct skv_tensor_ref){
		    buf, o + (Q_EL + KV_EL) * 4, SKV_DTYPE_F32, L * D, D, 0, 0};
	}
	return 0;
}

static int suite_clean(void)
{
	int st;

	skv_ctx_free(ctx);
	skv_client_close(cl);
	st = h_stop(&H);
	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

/* Uniform C, W, the given mode's fields on top. */
static void params_base(struct skv_params *p, enum skv_gqa gqa)
{
	skv_params_init(p);
	p->window = W;
	p->capacity = C;
	p->gqa = gqa;
}

static void desc_init(struct skv_compact_desc *d, const struct skv_params *p, uint32_t reserve)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	d->layers = LAYERS;
	d->params = *p;
	d->layer = refs;
	d->decode_reserve = reserve;
}

/* What libskv keeps here: each head at rows h * room of its layer. */
struct ref {
	uint32_t room, hs;
	float *k, *v, *mass;
	int32_t *pos;
	uint32_t kept[LAYERS * H_Q];
	struct skv_budget_result res;
};

static void ref_free(struct ref *r)
{
	free(r->k);
	free(r->v);
	free(r->mass);
	free(r->pos);
}

static int reference(const struct skv_params *p, struct ref *r)
{
	struct skv_shape sh = {.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	struct skv_error err = {{0}, -1, -1};
	struct skv_layer_in in[LAYERS];
	struct skv_layer_out out[LAYERS];
	uint32_t rows[LAYERS];
	size_t per;

	memset(r, 0, sizeof(*r));
	if (skv_budget_rows(&sh, p, LAYERS, rows, &err) < 0)
		return -1;
	for (uint32_t l = 0; l < LAYERS; l++)
		r->room = rows[l] > r->room ? rows[l] : r->room;
	r->hs = p->gqa == SKV_GQA_GROUP ? H_KV : H_Q;
	per = (size_t)r->hs * r->room;
	r->k = calloc(LAYERS * per * D, sizeof(float));
	r->v = calloc(LAYERS * per * D, sizeof(float));
	r->pos = calloc(LAYERS * per, sizeof(int32_t));
	r->mass = calloc(LAYERS * r->hs, sizeof(float));
	if (!r->k || !r->v || !r->pos || !r->mass)
		return -1;
	for (uint32_t l = 0; l < LAYERS; l++) {
		float *b = layer_base(l);

		in[l].q = (struct skv_tensor){b, SKV_DTYPE_F32, W * D, D, NULL, 0, 0, 0, 0};
		in[l].k = (struct skv_tensor){b + Q_EL, SKV_DTYPE_F32, L * D, D, NULL, 0, 0, 0, 0};
		in[l].v = (struct skv_tensor){
		    b + Q_EL + KV_EL, SKV_DTYPE_F32, L * D, D, NULL, 0, 0, 0, 0};
		out[l] = (struct skv_layer_out){
		    .k = {r->k + l * per * D, SKV_DTYPE_F32, (int64_t)r->room * D, D, NULL, 0, 0, 0,
			  0},
		    .v = {r->v + l * per * D, SKV_DTYPE_F32, (int64_t)r->room * D, D, NULL, 0, 0, 0,
			  0},
		    .positions = r->pos + l * per,
		    .pos_stride = r->room,
		    .retained_mass = r->mass + l * r->hs,
		};
	}
	r->res = (struct skv_budget_result){.result_size = sizeof(r->res), .kept = r->kept};
	return skv_compact_budget(ctx, &sh, p, LAYERS, in, out, &r->res, &err);
}

/* The daemon's cache k equals the reference, head by head, bit for bit. */
static void check_equal(const struct skv_cache *k, const struct ref *r, const char *what)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	struct skv_cache_budget cb = {.budget_size = sizeof(cb)};
	bool same = ci->h_store == r->hs;

	CU_ASSERT_EQUAL_FATAL(skv_cache_budget(k, &cb), 0);
	for (uint32_t l = 0; same && l < LAYERS; l++)
		for (uint32_t h = 0; same && h < r->hs; h++) {
			uint32_t kh = r->kept[l * r->hs + h];
			size_t at = ((size_t)l * r->hs + h) * r->room;
			float m = skv_cache_retained_mass(k, l, h), rm = r->mass[l * r->hs + h];

			same = skv_cache_head_kept(k, l, h) == kh &&
			       !memcmp(skv_cache_positions(k, l, h), r->pos + at, kh * 4) &&
			       !memcmp(&m, &rm, 4);
			for (uint32_t i = 0; same && i < kh; i++)
				same = !memcmp(skv_cache_k_slot(k, l, h, i), r->k + (at + i) * D,
					       D * 4) &&
				       !memcmp(skv_cache_v_slot(k, l, h, i), r->v + (at + i) * D,
					       D * 4) &&
				       (skv_cache_k(k, l, h) == NULL ||
					(float *)skv_cache_k(k, l, h) + i * ci->token_stride ==
					    skv_cache_k_slot(k, l, h, i));
			if (!same)
				fprintf(stderr,
					"%s: layer %u head %u differs (kept %u/%u, pos %d, mass "
					"%d, k %p slot %p)\n",
					what, l, h, skv_cache_head_kept(k, l, h), kh,
					!memcmp(skv_cache_positions(k, l, h), r->pos + at, kh * 4),
					!memcmp(&m, &rm, 4), skv_cache_k(k, l, h),
					skv_cache_k_slot(k, l, h, 0));
		}
	CU_ASSERT(same);
	CU_ASSERT_EQUAL(cb.c_star, r->res.c_star);
	CU_ASSERT_EQUAL(cb.fallback, r->res.fallback);
	CU_ASSERT(!memcmp(&cb.mass_min, &r->res.min_mass, 4) || !r->res.fallback);
}

/* One mode through the daemon and here; the cache released, pool back to 0. */
static void one_mode(const struct skv_params *p, const char *what, bool want_ragged)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct skv_cache_budget cb = {.budget_size = sizeof(cb)};
	struct ref r;
	int rc;

	CU_ASSERT_EQUAL_FATAL(reference(p, &r), 0);
	desc_init(&d, p, 2);
	rc = skv_client_compact(cl, &d, &k);
	if (rc < 0)
		fprintf(stderr, "%s: %s\n", what, skv_client_error(cl));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	check_equal(k, &r, what);
	skv_cache_budget(k, &cb);
	CU_ASSERT_EQUAL(cb.ragged, want_ragged);
	CU_ASSERT_EQUAL(cb.mode, p->budget_mode);
	printf("  %s: c_star %u fallback %d kept min %u mean %.1f ragged %d\n", what, cb.c_star,
	       cb.fallback, cb.kept_min, (double)cb.kept_mean, cb.ragged);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 2000), 0);
	ref_free(&r);
}

/*
 * Mode i of the list every suite runs (false past its end): the modes
 * (0-7), then the fallbacks (8-10); *ragged: whether its heads are stored
 * ragged on this input.
 */
#define N_MODES 8
static bool mode_at(unsigned i, struct skv_params *p, const char **what, bool *ragged)
{
	params_base(p, i == 4 || i == 7 ? SKV_GQA_GROUP : SKV_GQA_EXPAND);
	*ragged = true;
	switch (i) {
	case 0:
		p->budget_mode = SKV_BUDGET_UNIFORM;
		*what = "uniform", *ragged = false;
		return true;
	case 1:
		p->budget_mode = SKV_BUDGET_LAYERS;
		p->n_layer_caps = 3;
		p->layer_caps[0] = 20;
		p->layer_caps[1] = 40;
		p->layer_caps[2] = 12;
		*what = "layers 20,40,12";
		return true;
	case 2:
		p->budget_mode = SKV_BUDGET_LAYERS;
		p->pyramid_r = 0.5f;
		*what = "pyramid 0.5";
		return true;
	case 3:
		p->budget_mode = SKV_BUDGET_HEADS;
		*what = "heads";
		return true;
	case 4:
		p->budget_mode = SKV_BUDGET_HEADS;
		p->head_floor = 0.0f;
		*what = "heads 0 group";
		return true;
	case 5:
		p->budget_mode = SKV_BUDGET_MASS;
		p->tau = 0.9f, p->c_min = 12, p->c_max = 96, p->c_step = 4;
		*what = "mass 0.9", *ragged = false;
		return true;
	case 6:
		p->budget_mode = SKV_BUDGET_MASS_HEADS;
		p->tau = 0.8f, p->c_min = 10, p->c_max = 80;
		*what = "mass-heads 0.8";
		return true;
	case 7:
		p->budget_mode = SKV_BUDGET_MASS_HEADS;
		p->tau = 0.85f, p->c_min = 10, p->c_max = 80;
		*what = "mass-heads 0.85 group";
		return true;
	case 8:
		p->capacity = 12;
		p->fallback_below = 0.999f;
		*what = "uniform C 12, fallback 0.999", *ragged = false;
		return true;
	case 9: /* every head all L: packed */
		p->budget_mode = SKV_BUDGET_MASS_HEADS;
		p->tau = 0.5f, p->c_min = 10, p->c_max = 20;
		p->fallback_below = 0.999f;
		*what = "mass-heads, fallback 0.999", *ragged = false;
		return true;
	case 10:
		p->budget_mode = SKV_BUDGET_HEADS;
		p->fallback_below = 0.01f;
		*what = "heads, fallback 0.01 (not taken)";
		return true;
	default:
		return false;
	}
}

static void test_modes(void)
{
	struct skv_params p;
	const char *what;
	bool ragged;

	for (unsigned i = 0; i < N_MODES && mode_at(i, &p, &what, &ragged); i++)
		one_mode(&p, what, ragged);
}

static void test_fallback(void)
{
	struct skv_params p;
	const char *what;
	bool ragged;

	for (unsigned i = N_MODES; mode_at(i, &p, &what, &ragged); i++)
		one_mode(&p, what, ragged);
	/* the metrics count the two fallbacks and every mode's compactions */
	Snapkv__V1__AdminReply *a = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_METRICS);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL(strstr(a->text, "\nsnapkvd_fallbacks_total 2\n"));
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(a->text, "snapkvd_budget_kept_fraction_count{mode=\"heads\"} 3\n"));
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(a->text, "snapkvd_budget_kept_fraction_count{mode=\"mass-heads\"} 3\n"));
	CU_ASSERT_PTR_NOT_NULL(
	    strstr(a->text, "snapkvd_budget_kept_fraction_count{mode=\"mass\"} 1\n"));
	snapkv__v1__admin_reply__free_unpacked(a, NULL);
}

/* The ledger line of cache id. */
static const Snapkv__V1__CacheLedger *ledger_of(const Snapkv__V1__AdminReply *a, uint64_t id)
{
	for (size_t i = 0; a && i < a->n_caches; i++)
		if (a->caches[i]->id == id)
			return a->caches[i];
	return NULL;
}

/* The summed ledger of SPEC.md for kept counts + g. */
static void check_ledger(const struct skv_cache *k, uint32_t g)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	Snapkv__V1__AdminReply *a = h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER);
	const Snapkv__V1__CacheLedger *cl0 = ledger_of(a, ci->id);
	uint64_t sum = 0, lk = 0;
	uint32_t mn = UINT32_MAX;

	CU_ASSERT_PTR_NOT_NULL_FATAL(cl0);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < ci->h_store; h++) {
			uint32_t kh = skv_cache_head_kept(k, l, h);

			sum += kh + g;
			mn = kh < mn ? kh : mn;
			if (l == 1)
				lk += kh;
		}
	CU_ASSERT_EQUAL(cl0->bytes->compact, 2ull * 4 * D * sum);
	CU_ASSERT_EQUAL(cl0->bytes->index, 4ull * sum);
	CU_ASSERT_EQUAL(cl0->bytes->reserved,
			2ull * 4 * D * LAYERS * ci->h_store * (ci->capacity - ci->kept - g));
	CU_ASSERT_EQUAL(cl0->budget_mode, SNAPKV__V1__BUDGET_MODE__BUDGET_MODE_HEADS);
	CU_ASSERT_EQUAL(cl0->kept_min, mn);
	CU_ASSERT_TRUE(cl0->ragged);
	CU_ASSERT_EQUAL(cl0->n_layer_kept, LAYERS);
	CU_ASSERT_EQUAL(cl0->n_layer_kept == LAYERS ? cl0->layer_kept[1] : 0, lk);
	CU_ASSERT_EQUAL(cl0->n_layer_mass_min, LAYERS);
	CU_ASSERT(cl0->n_layer_mass_min == LAYERS &&
		  cl0->layer_mass_min[0] == skv_cache_layer_mass_min(k, 0));
	snapkv__v1__admin_reply__free_unpacked(a, NULL);
}

/* Decode slots of every head: positions L + i for the g appended, -1 after. */
static bool decode_positions(const struct skv_cache *k, uint32_t g)
{
	const struct skv_cache_info *ci = skv_cache_info(k);

	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < ci->h_store; h++) {
			const int32_t *pos = skv_cache_positions(k, l, h);
			uint32_t kh = skv_cache_head_kept(k, l, h);

			for (uint32_t i = kh; i < skv_cache_head_capacity(k, l, h); i++)
				if (pos[i] != (i - kh < g ? (int32_t)(L + i - kh) : -1))
					return false;
		}
	return true;
}

/* Every head's decode rows (K and V) read as zero, the region reused or not. */
static bool decode_rows_zero(const struct skv_cache *k)
{
	static const float zero[D];

	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < skv_cache_info(k)->h_store; h++)
			for (uint32_t i = skv_cache_head_kept(k, l, h);
			     i < skv_cache_head_capacity(k, l, h); i++)
				if (memcmp(skv_cache_k_slot(k, l, h, i), zero, sizeof(zero)) ||
				    memcmp(skv_cache_v_slot(k, l, h, i), zero, sizeof(zero)))
					return false;
	return true;
}

/* Mark head h's decode slot i of layer l (K row) with a value of its own. */
static void mark(const struct skv_cache *k, uint32_t l, uint32_t h, uint32_t i, bool check,
		 bool *ok)
{
	float *row = skv_cache_k_slot(k, l, h, skv_cache_head_kept(k, l, h) + i);
	float want = 1000.0f + (float)(l * 100 + h * 10 + i);

	if (!row) {
		*ok = false;
		return;
	}
	if (check)
		*ok = *ok && row[0] == want;
	else
		row[0] = want;
}

static void test_ragged_ops(void)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct skv_params p;
	struct ref r;
	bool ok = true;
	int fds = h_fds_base(H.pid);

	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_HEADS;
	CU_ASSERT_EQUAL_FATAL(reference(&p, &r), 0);
	desc_init(&d, &p, 4);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	CU_ASSERT(decode_positions(k, 0));
	CU_ASSERT(decode_rows_zero(k)); /* this session's released regions are reused */
	check_ledger(k, 0);
	{
		static const char *const text[] = {"heads, kept per head mean 32.0", "ragged",
						   "layer kept 128,128,128; mass min", NULL};
		static const char *const json[] = {"\"budget_mode\": \"heads\"", "\"ragged\": true",
						   "\"layer_kept\": [", "\"layer_mass_min\": [",
						   NULL};

		CU_ASSERT(h_ctl_shows(H.sock, "caches", text));
		CU_ASSERT(h_ctl_shows(H.sock, "ledger", text));
		CU_ASSERT(h_ctl_shows(H.sock, "caches --json", json));
		CU_ASSERT(h_ctl_shows(H.sock, "ledger --json", json));
	}
	/* APPEND 3: every head's next slots, after its own kept rows */
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < H_Q; h++)
			for (uint32_t i = 0; i < 3; i++)
				mark(k, l, h, i, false, &ok);
	CU_ASSERT_EQUAL(skv_cache_append(k, 3), 0);
	CU_ASSERT(decode_positions(k, 3));
	CU_ASSERT_EQUAL(skv_cache_append(k, 2), -ENOSPC); /* 1 slot left per head */
	check_ledger(k, 3);
	/* GROW 5: every head grows, rows and marks kept, bit for bit */
	CU_ASSERT_EQUAL_FATAL(skv_cache_grow(k, 5), 0);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < H_Q; h++) {
			CU_ASSERT_EQUAL(skv_cache_head_capacity(k, l, h),
					skv_cache_head_kept(k, l, h) + 9);
			for (uint32_t i = 0; i < 3; i++)
				mark(k, l, h, i, true, &ok);
		}
	CU_ASSERT(ok);
	CU_ASSERT(decode_positions(k, 3));
	check_equal(k, &r, "heads after GROW");
	CU_ASSERT_EQUAL(skv_cache_append(k, 6), 0);
	CU_ASSERT(decode_positions(k, 9));
	check_ledger(k, 9);
	/* RELEASE with linger: still counted; the session's end frees it */
	CU_ASSERT(h_pool_used(H.sock) > 0);
	CU_ASSERT_EQUAL(skv_cache_release_linger(k), 0);
	CU_ASSERT(h_pool_used(H.sock) > 0);
	skv_buffer_free(buf);
	skv_client_close(cl);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 2000), 0);
	CU_ASSERT_EQUAL_FATAL(skv_client_connect(H.sock, NULL, &cl), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(cl, LAYERS * LAYER_EL * sizeof(float), &buf), 0);
	fill_inputs(skv_buffer_data(buf));
	for (uint32_t l = 0; l < LAYERS; l++)
		refs[l].q.buf = refs[l].k.buf = refs[l].v.buf = buf;
	CU_ASSERT_EQUAL(h_fds_settled(H.pid, fds), fds);
	/* RELEASE: gone at once */
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	check_equal(k, &r, "heads again");
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 2000), 0);
	ref_free(&r);
}

/*
 * A mass cache whose C* is below C_max gives its region's tail back: it holds
 * exactly the pool bytes of a uniform cache at C = C*, reads as libskv's,
 * and APPEND and GROW work on it.
 */
static void test_mass_shrinks(void)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	struct skv_cache_budget b = {.budget_size = sizeof(b)};
	struct skv_params p;
	struct ref r;
	uint64_t used_mass, used_uniform;

	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_MASS;
	p.tau = 0.5f;
	p.c_min = 12;
	p.c_max = 96;
	p.c_step = 4;
	CU_ASSERT_EQUAL_FATAL(reference(&p, &r), 0);
	desc_init(&d, &p, 4);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	CU_ASSERT_EQUAL_FATAL(skv_cache_budget(k, &b), 0);
	printf("  mass 0.5: C* %u of C_max %u\n", b.c_star, p.c_max);
	CU_ASSERT_FATAL(b.c_star < p.c_max);
	check_equal(k, &r, "mass after the shrink");
	used_mass = h_pool_used(H.sock);
	CU_ASSERT_EQUAL(skv_cache_append(k, 4), 0);
	CU_ASSERT_EQUAL(skv_cache_append(k, 1), -ENOSPC);
	CU_ASSERT_EQUAL_FATAL(skv_cache_grow(k, 8), 0);
	check_equal(k, &r, "mass after GROW");
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 2000), 0);
	/* uniform at C = C*, the same reserve */
	params_base(&p, SKV_GQA_EXPAND);
	p.capacity = b.c_star;
	desc_init(&d, &p, 4);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	used_uniform = h_pool_used(H.sock);
	printf("  pool bytes: mass %llu, uniform at C* %llu\n", (unsigned long long)used_mass,
	       (unsigned long long)used_uniform);
	CU_ASSERT_EQUAL(used_mass, used_uniform);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 2000), 0);
	ref_free(&r);
}

/* A bad budget: refused with `needle` in the message, nothing held. */
static void refused(const struct skv_params *p, enum skv_layout layout, const char *needle)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;
	int fds = h_fds_settled(H.pid, base_fds), rc;

	desc_init(&d, p, 0);
	d.out_layout = layout;
	if (layout == SKV_LAYOUT_PAGED)
		d.out_block_size = 16;
	rc = skv_client_compact(cl, &d, &k);
	CU_ASSERT(rc == -EINVAL || rc == -E2BIG);
	if (!strstr(skv_client_error(cl), needle) || rc >= 0)
		fprintf(stderr, "want \"%s\", got %d \"%s\"\n", needle, rc, skv_client_error(cl));
	else
		printf("  refused: %s\n", skv_client_error(cl));
	CU_ASSERT_PTR_NOT_NULL(strstr(skv_client_error(cl), needle));
	CU_ASSERT_PTR_NULL(k);
	skv_cache_release(k);
	CU_ASSERT_EQUAL(h_pool_used(H.sock), 0);
	CU_ASSERT_EQUAL(h_fds_settled(H.pid, fds), fds);
}

static void test_bad_input(void)
{
	struct skv_params p;

	base_fds = h_fds_base(H.pid);

	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_MASS;
	p.tau = 0.0f, p.c_min = 12, p.c_max = 64, p.c_step = 4;
	refused(&p, SKV_LAYOUT_HND, "tau = 0 must be in (0, 1]");
	p.tau = 1.5f;
	refused(&p, SKV_LAYOUT_HND, "tau = 1.5 must be in (0, 1]");
	p.tau = 0.9f, p.c_min = 40, p.c_max = 20;
	refused(&p, SKV_LAYOUT_HND, "C_min = 40 must be at least 1 and at most C_max = 20");
	p.c_min = 12, p.c_max = 64, p.c_step = 0;
	refused(&p, SKV_LAYOUT_HND, "step must be at least 1");
	p.c_step = 4, p.c_min = W;
	refused(&p, SKV_LAYOUT_HND, "C_min = 8");
	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_LAYERS;
	p.n_layer_caps = 2, p.layer_caps[0] = 20, p.layer_caps[1] = 30;
	refused(&p, SKV_LAYOUT_HND, "the list has 2 budgets for 3 layers");
	p.n_layer_caps = 3, p.layer_caps[1] = W, p.layer_caps[2] = 30;
	refused(&p, SKV_LAYOUT_HND, "layer 1 (C_l = 8)");
	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_HEADS;
	p.head_floor = 1.5f;
	refused(&p, SKV_LAYOUT_HND, "floor a = 1.5 must be in [0, 1]");
	p.head_floor = -0.2f;
	refused(&p, SKV_LAYOUT_HND, "floor a = -0.2 must be in [0, 1]");
	p.head_floor = 0.2f;
	refused(&p, SKV_LAYOUT_PAGED, "paged output needs one count for every head");
	refused(&p, SKV_LAYOUT_NHD, "out_layout must be HND");
	/* paged output: one count for every head of every layer (uniform,
	 * mass; test-daemon-paged holds those to libskv) */
	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_MASS_HEADS;
	p.tau = 0.9f, p.c_min = 12, p.c_max = 64;
	refused(&p, SKV_LAYOUT_PAGED, "budget mode mass-heads gives heads different counts");
	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_LAYERS;
	p.pyramid_r = 0.5f;
	refused(&p, SKV_LAYOUT_PAGED, "budget mode layers gives layers different counts");
	params_base(&p, SKV_GQA_EXPAND);
	p.fallback_below = 2.0f;
	refused(&p, SKV_LAYOUT_HND, "fallback_below 2 must be in [0, 1]");
	p.fallback_below = 0.0f;
	p.budget_mode = (enum skv_budget)9;
	refused(&p, SKV_LAYOUT_HND, "unknown budget mode");
}

/*
 * Under pressure a mode's own budgets scale with C: a daemon at high from
 * its first cache on (pressure_high 4K) halves C, every C_l of a list and
 * the mass ladder, and the cache says budget < requested_budget.
 */
static struct harness P;

static int pressure_init(void)
{
	return h_start_config(&P, "snapkvd-budgetp",
			      "pressure_high = 4096\npressure_high_leave = 2048\n"
			      "pressure_min_dwell_ms = 0\npressure_actions = notify,scale\n"
			      "pressure_scale_high = 0.5\n") < 0
		   ? -1
		   : 0;
}

static int pressure_clean(void)
{
	int st = h_stop(&P);

	h_cleanup(&P);
	return st == 0 ? 0 : -1;
}

static void test_pressure_scaling(void)
{
	struct skv_client *c = NULL;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[LAYERS];
	struct skv_compact_desc d;
	struct skv_cache *first = NULL, *k = NULL;
	struct skv_cache_budget cb = {.budget_size = sizeof(cb)};
	struct skv_params p;

	CU_ASSERT_EQUAL_FATAL(skv_client_connect(P.sock, NULL, &c), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c, LAYERS * LAYER_EL * sizeof(float), &b), 0);
	fill_inputs(skv_buffer_data(b));
	for (uint32_t l = 0; l < LAYERS; l++) {
		lr[l] = refs[l];
		lr[l].q.buf = lr[l].k.buf = lr[l].v.buf = b;
	}
	params_base(&p, SKV_GQA_EXPAND);
	desc_init(&d, &p, 0);
	d.layer = lr;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &first), 0); /* now at high */
	for (int i = 0; i < 300; i++) {
		struct skv_pressure pr = {0};

		if (skv_client_pressure(c, &pr) == 0 && pr.level >= SKV_PRESSURE_HIGH)
			break;
		h_sleep_ms(10);
	}
	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_LAYERS;
	p.n_layer_caps = 3, p.layer_caps[0] = 20, p.layer_caps[1] = 40, p.layer_caps[2] = 80;
	desc_init(&d, &p, 0);
	d.layer = lr;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	CU_ASSERT_EQUAL(skv_cache_info(k)->budget_scaled, 1);
	printf("  scaled %d budget %u of %u, kept %u %u %u\n", skv_cache_info(k)->budget_scaled,
	       skv_cache_info(k)->budget, skv_cache_info(k)->requested_budget,
	       skv_cache_head_kept(k, 0, 0), skv_cache_head_kept(k, 1, 0),
	       skv_cache_head_kept(k, 2, 3));
	CU_ASSERT_EQUAL(skv_cache_head_kept(k, 0, 0), 10 > W ? 10 : W + 1);
	CU_ASSERT_EQUAL(skv_cache_head_kept(k, 1, 0), 20);
	CU_ASSERT_EQUAL(skv_cache_head_kept(k, 2, 3), 40);
	skv_cache_release(k);
	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_MASS;
	p.tau = 1.0f, p.c_min = 40, p.c_max = 120, p.c_step = 8; /* tau 1: C* = C_max */
	desc_init(&d, &p, 0);
	d.layer = lr;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	skv_cache_budget(k, &cb);
	CU_ASSERT_EQUAL(cb.c_star, 60);
	CU_ASSERT_EQUAL(skv_cache_info(k)->budget_scaled, 1);
	skv_cache_release(k);
	/* decision groups are scaled like any request (issue 24: a "group of
	 * one" kept C 40 where a plain request got 20, and mass C* 88 for 44):
	 * uniform as a group of one, mass as a group of two, both members alike */
	params_base(&p, SKV_GQA_EXPAND);
	desc_init(&d, &p, 0);
	d.layer = lr;
	d.group_key = "solo";
	d.group_size = 1;
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	printf("  group of one: scaled %d budget %u of %u\n", skv_cache_info(k)->budget_scaled,
	       skv_cache_info(k)->budget, skv_cache_info(k)->requested_budget);
	CU_ASSERT_EQUAL(skv_cache_info(k)->budget_scaled, 1);
	CU_ASSERT_EQUAL(skv_cache_info(k)->budget, C / 2);
	CU_ASSERT_EQUAL(skv_cache_head_kept(k, 0, 0), C / 2);
	skv_cache_release(k);
	params_base(&p, SKV_GQA_EXPAND);
	p.budget_mode = SKV_BUDGET_MASS;
	p.tau = 1.0f, p.c_min = 40, p.c_max = 120, p.c_step = 8;
	desc_init(&d, &p, 0);
	d.layer = lr;
	d.group_key = "pair";
	d.group_size = 2;
	struct skv_request *r0 = NULL, *r1 = NULL;
	struct skv_cache *k1 = NULL;
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c, &d, &r0), 0);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c, &d, &r1), 0);
	CU_ASSERT_EQUAL_FATAL(skv_request_wait(r0, 30000, &k), 0);
	CU_ASSERT_EQUAL_FATAL(skv_request_wait(r1, 30000, &k1), 0);
	for (int m = 0; m < 2; m++) {
		struct skv_cache *km = m ? k1 : k;
		skv_cache_budget(km, &cb);
		printf("  group member %d: mass C* %u scaled %d\n", m, cb.c_star,
		       skv_cache_info(km)->budget_scaled);
		CU_ASSERT_EQUAL(cb.c_star, 60);
		CU_ASSERT_EQUAL(skv_cache_info(km)->budget_scaled, 1);
	}
	skv_cache_release(k);
	skv_cache_release(k1);
	skv_cache_release(first);
	skv_buffer_free(b);
	skv_client_close(c);
}

/*
 * --backend cuda (SNAPKVD_TEST_BACKEND=cuda-emu): the budget kernels of the
 * CUDA plugin through the daemon. The two backends score in other orders
 * (votes differ in their last bits on random input), so this suite's input
 * makes every vote exact, as tests/gpu/gpu-budget.c does: K rows are
 * A * e_c for clusters c of 1, 2 or 4 prefix positions (0 in the other
 * cluster dimensions, random beyond them), every window query A * e_c for
 * one cluster, A = 64, so each window row weighs exactly 1/|c| on its
 * cluster and 0 elsewhere. Then every mode's cache equals libskv's here bit
 * for bit, as on the host backend.
 */
#define A_CODE 64.0f
#define N_CL   4 /* cluster dimensions, < D */

static void fill_exact(void)
{
	uint64_t seed = 29;

	for (uint32_t l = 0; l < LAYERS; l++) {
		float *q = layer_base(l), *k = q + Q_EL, *v = k + KV_EL;

		for (uint32_t kvh = 0; kvh < H_KV; kvh++) {
			float *kh = k + (size_t)kvh * L * D, *vh = v + (size_t)kvh * L * D;
			uint32_t next = (uint32_t)(h_rand(&seed) > 0) * 3, size[N_CL];

			for (size_t i = 0; i < (size_t)L * D; i++) {
				kh[i] = (i % D) < N_CL ? 0.0f : h_rand(&seed);
				vh[i] = h_rand(&seed);
			}
			/* cluster c: 1 << ((c + l + kvh) % 3) positions, spread over the prefix */
			for (uint32_t c = 0; c < N_CL; c++) {
				size[c] = 1u << ((c + l + kvh) % 3);
				for (uint32_t m = 0; m < size[c]; m++, next += 7)
					kh[(size_t)(next % (L - W)) * D + c] = A_CODE;
			}
			for (uint32_t g = 0; g < H_Q / H_KV; g++)
				for (uint32_t t = 0; t < W; t++) {
					float *qr =
					    q + (((size_t)kvh * (H_Q / H_KV) + g) * W + t) * D;

					memset(qr, 0, D * sizeof(float));
					qr[(t + g + l) % N_CL] = A_CODE;
				}
		}
	}
}

/*
 * Zero ranking width (issue 24): the forced positions fill C_max (W 8 +
 * protected [0,4) = C_max 12) or all of L (protected [0,152) + W 8 = L).
 * One such request killed the daemon for every tenant (SIGSEGV in phase
 * one); now every head keeps exactly the forced positions, bit for bit as
 * libskv here, and the daemon goes on serving.
 */
static void test_zero_width(void)
{
	struct skv_params p;
	const char *what;
	bool ragged;

	for (int gm = 0; gm < 2; gm++) {
		enum skv_gqa gqa = gm ? SKV_GQA_GROUP : SKV_GQA_EXPAND;
		params_base(&p, gqa);
		p.budget_mode = SKV_BUDGET_MASS;
		p.tau = 0.9f, p.c_min = 12, p.c_max = 12, p.c_step = 1;
		p.n_protected = 1;
		p.protected_ranges[0] = (struct skv_range){0, 4};
		one_mode(&p,
			 gm ? "mass:0.9:12:12:1 protect [0,4) group"
			    : "mass:0.9:12:12:1 protect [0,4)",
			 false);
		p.budget_mode = SKV_BUDGET_MASS_HEADS;
		one_mode(&p, "mass-heads:0.9:12:12 protect [0,4)", true);
		params_base(&p, gqa);
		p.budget_mode = SKV_BUDGET_MASS;
		p.tau = 0.9f, p.c_min = L, p.c_max = L + 40, p.c_step = 4;
		p.n_protected = 1;
		p.protected_ranges[0] = (struct skv_range){0, L - W};
		one_mode(&p, "mass, window + protected = L", false);
	}
	/* and the daemon still serves an ordinary request */
	CU_ASSERT_FATAL(mode_at(5, &p, &what, &ragged));
	one_mode(&p, what, ragged);
}

static int cuda_init(void)
{
	if (suite_init() < 0)
		return -1;
	fill_exact();
	return 0;
}

/* Every mode, and the fallbacks, on the emulated CUDA backend: the same
 * caches as libskv here. */
static void test_cuda_modes(void)
{
	test_modes();
	test_fallback();
	test_zero_width();
}

/*
 * The session's GPU arena, mapped here: on the emulator its VMM fd is a
 * memfd (a real GPU's cannot be mapped: NULL, and only what the host arena
 * holds is compared).
 */
static uint8_t *garena;
static uint64_t garena_size;

/* The K (kv 0) or V row of slot i of (l, h): in the host arena through
 * libsnapkv, in the GPU arena at the cache's offsets there. */
static float *row_of(const struct skv_cache *k, int kv, uint32_t l, uint32_t h, uint32_t i)
{
	const struct skv_cache_info *ci = skv_cache_info(k);
	int64_t off;

	if (ci->kv_arena == SKV_ARENA_HOST)
		return kv ? skv_cache_v_slot(k, l, h, i) : skv_cache_k_slot(k, l, h, i);
	off = kv ? skv_cache_v_offset(k, l, h) : skv_cache_k_offset(k, l, h);
	if (!garena || off < 0 || i >= skv_cache_head_capacity(k, l, h))
		return NULL;
	off += (int64_t)i * ci->token_stride * 4;
	return (uint64_t)off + D * 4 <= garena_size ? (float *)(garena + off) : NULL;
}

/* (l, h)'s K or V row offset from its layer's head 0, in elements. */
static int64_t rel_off(const struct skv_cache *k, int kv, uint32_t l, uint32_t h)
{
	return kv ? (skv_cache_v_offset(k, l, h) - skv_cache_v_offset(k, l, 0)) / 4
		  : (skv_cache_k_offset(k, l, h) - skv_cache_k_offset(k, l, 0)) / 4;
}

/* One (layer, head) of the GPU-arena cache g as in the host-arena cache k:
 * count, start, row offsets, mass, the position of every slot, and the K/V
 * of its kept and `extra` appended rows, bit for bit. */
static bool same_head(const struct skv_cache *k, const struct skv_cache *g, uint32_t l, uint32_t h,
		      uint32_t extra)
{
	uint32_t kh = skv_cache_head_kept(k, l, h), cap = skv_cache_head_capacity(k, l, h);
	float mk = skv_cache_retained_mass(k, l, h), mg = skv_cache_retained_mass(g, l, h);
	bool same = kh == skv_cache_head_kept(g, l, h) && cap == skv_cache_head_capacity(g, l, h) &&
		    skv_cache_head_start(k, l, h) == skv_cache_head_start(g, l, h) &&
		    rel_off(k, 0, l, h) == rel_off(g, 0, l, h) &&
		    rel_off(k, 1, l, h) == rel_off(g, 1, l, h) && !memcmp(&mk, &mg, 4) &&
		    !memcmp(skv_cache_positions(k, l, h), skv_cache_positions(g, l, h), cap * 4);

	for (uint32_t i = 0; same && garena && i < kh + extra; i++)
		for (int kv = 0; same && kv < 2; kv++) {
			const float *a = row_of(k, kv, l, h, i), *b = row_of(g, kv, l, h, i);

			same = a && b && !memcmp(a, b, D * 4);
		}
	return same;
}

/* The GPU-arena cache g laid out and filled as the host-arena cache k (see
 * same_head; the decode rows past them are not compared: a GPU arena's
 * reused region is not zeroed there). */
static bool same_cache(const struct skv_cache *k, const struct skv_cache *g, uint32_t extra,
		       const char *what)
{
	const struct skv_cache_info *a = skv_cache_info(k), *b = skv_cache_info(g);
	struct skv_cache_budget ka = {.budget_size = sizeof(ka)}, kb = {.budget_size = sizeof(kb)};
	bool same = b->kv_arena == SKV_ARENA_CUDA && a->kv_arena == SKV_ARENA_HOST &&
		    a->h_store == b->h_store && a->kept == b->kept && a->capacity == b->capacity &&
		    a->appended == b->appended && a->head_stride == b->head_stride &&
		    a->token_stride == b->token_stride && a->layout == b->layout &&
		    skv_cache_budget(k, &ka) == 0 && skv_cache_budget(g, &kb) == 0 &&
		    ka.mode == kb.mode && ka.c_star == kb.c_star && ka.fallback == kb.fallback &&
		    ka.ragged == kb.ragged && ka.kept_min == kb.kept_min;

	if (!same)
		fprintf(stderr,
			"%s: the GPU-arena cache's info differs (kept %u/%u, capacity %u/%u)\n",
			what, a->kept, b->kept, a->capacity, b->capacity);
	for (uint32_t l = 0; same && l < LAYERS; l++)
		for (uint32_t h = 0; same && h < a->h_store; h++)
			if (!(same = same_head(k, g, l, h, extra)))
				fprintf(stderr, "%s: layer %u head %u differs in the GPU arena\n",
					what, l, h);
	return same;
}

/* Write decode slot i of every head (K and V rows, as an engine does), the
 * same in both caches. */
static void mark_all(const struct skv_cache *k, uint32_t i)
{
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < skv_cache_info(k)->h_store; h++)
			for (int kv = 0; kv < 2; kv++) {
				float *row = row_of(k, kv, l, h, skv_cache_head_kept(k, l, h) + i);

				for (uint32_t e = 0; row && e < D; e++)
					row[e] = 1000.0f + (float)(l * 100 + h * 10 + i) +
						 (float)e / 64 + (float)kv / 2;
			}
}

/* One mode into both arenas (see test_cuda_arena); quiet: no line printed. */
static void arena_mode(const struct skv_params *p, const char *what, bool ragged, bool quiet)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL, *g = NULL;
	struct skv_cache_budget cb = {.budget_size = sizeof(cb)};
	bool grown = true;
	int rc;

	desc_init(&d, p, 4);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(cl, &d, &k), 0);
	d.out_arena = SKV_ARENA_CUDA;
	rc = skv_client_compact(cl, &d, &g);
	if (rc < 0)
		fprintf(stderr, "%s, GPU arena: %s\n", what, skv_client_error(cl));
	CU_ASSERT_EQUAL_FATAL(rc, 0);
	skv_cache_budget(g, &cb);
	CU_ASSERT_EQUAL(cb.ragged, ragged);
	CU_ASSERT(same_cache(k, g, 0, what));
	/* APPEND 3 rows, written as an engine would, then GROW 5: every head */
	for (uint32_t t = 0; t < 3; t++) {
		mark_all(k, t);
		mark_all(g, t);
	}
	CU_ASSERT_EQUAL(skv_cache_append(k, 3), 0);
	CU_ASSERT_EQUAL(skv_cache_append(g, 3), 0);
	CU_ASSERT_EQUAL(skv_cache_grow(k, 5), 0);
	CU_ASSERT_EQUAL_FATAL(skv_cache_grow(g, 5), 0);
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < skv_cache_info(g)->h_store; h++)
			grown = grown && skv_cache_head_capacity(g, l, h) ==
					     skv_cache_head_kept(g, l, h) + 9;
	CU_ASSERT(grown);
	CU_ASSERT(decode_positions(g, 3));
	CU_ASSERT(same_cache(k, g, 3, what));
	CU_ASSERT_EQUAL(skv_cache_append(k, 6), 0);
	CU_ASSERT_EQUAL(skv_cache_append(g, 6), 0);
	CU_ASSERT(decode_positions(g, 9));
	CU_ASSERT(same_cache(k, g, 3, what));
	if (!quiet)
		printf("  %s, GPU arena: c_star %u fallback %d kept min %u ragged %d, GROW 5: %s\n",
		       what, cb.c_star, cb.fallback, cb.kept_min, cb.ragged,
		       same_cache(k, g, 3, what) ? "equal to the host arena" : "DIFFERENT");
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	CU_ASSERT_EQUAL(skv_cache_release(g), 0);
	CU_ASSERT_EQUAL(h_wait_pool(H.sock, 0, 2000), 0);
}

/*
 * Every mode with out_arena CUDA: K/V in the GPU arena (settled there by
 * the plugin's device copies), positions in the host arena, laid out and
 * filled as the same request's cache in the host arena; then APPEND 3 and
 * GROW 5 of both (every head, the appended rows written), equal again, and
 * APPEND 6 into the grown room. Every mode twice: nothing held afterwards,
 * the fds at rest after the first round (by then the worker's context
 * holds its staging for overlapping moves: on the emulator device memory
 * is a memfd).
 */
static void test_cuda_arena(void)
{
	const char *plugin = getenv("SKV_CUDA_PLUGIN");
	struct skv_params p;
	const char *what;
	bool ragged;
	int afd = -1, fds = -1;

	CU_ASSERT_EQUAL_FATAL(skv_client_cuda_arena(cl, &afd, &garena_size, NULL), 0);
	garena = mmap(NULL, garena_size, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
	if (garena == MAP_FAILED) {
		garena = NULL;
		printf("  the GPU arena cannot be mapped here (%s): K/V rows not compared\n",
		       plugin ? plugin : "?");
		CU_ASSERT(!plugin || !strstr(plugin, "emu")); /* the emulator's can */
	}
	for (int round = 0; round < 2; round++) {
		for (unsigned i = 0; mode_at(i, &p, &what, &ragged); i++)
			arena_mode(&p, what, ragged, round > 0);
		if (round == 0)
			fds = h_fds_base(H.pid);
	}
	if (garena)
		munmap(garena, garena_size);
	garena = NULL;
	close(afd);
	CU_ASSERT_EQUAL(h_fds_settled(H.pid, fds), fds);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	if (h_backend_cuda()) {
		s = CU_add_suite("daemon-budget-cuda", cuda_init, suite_clean);
		CU_add_test(s, "every mode on the CUDA kernels = skv_compact_budget here",
			    test_cuda_modes);
		CU_add_test(
		    s, "every mode, APPEND and GROW with K/V in the GPU arena = the host arena",
		    test_cuda_arena);
		return h_run_tests();
	}
	s = CU_add_suite("daemon-budget", suite_init, suite_clean);
	CU_add_test(s, "every mode = skv_compact_budget here, bit for bit", test_modes);
	CU_add_test(s, "fallback through the daemon", test_fallback);
	CU_add_test(s, "zero ranking width: forced positions fill C_max or L", test_zero_width);
	CU_add_test(s, "APPEND, GROW, RELEASE, linger and the ledger on a ragged cache",
		    test_ragged_ops);
	CU_add_test(s, "a mass cache below C_max gives its region's tail back", test_mass_shrinks);
	CU_add_test(s, "bad budgets refused before any work, nothing held", test_bad_input);
	s = CU_add_suite("daemon-budget-pressure", pressure_init, pressure_clean);
	CU_add_test(s, "under pressure the modes' budgets scale with C", test_pressure_scaling);
	return h_run_tests();
}
