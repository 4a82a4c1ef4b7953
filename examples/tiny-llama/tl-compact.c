// SPDX-License-Identifier: MIT
#include "tl-compact.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t tl_compact_n_q(const struct skv_params *p, uint32_t L)
{
	switch (p->policy) {
	case SKV_POLICY_SNAPKV:
		return p->window < L ? p->window : L;
	case SKV_POLICY_H2O:
		return L;
	default:
		return 0;
	}
}

struct skv_tensor tl_kv_tensor(const struct tl_kv *kv, uint32_t layer, int want_v)
{
	const struct tl_kv_layer *L = &kv->layers[layer];
	struct skv_tensor t = {
	    .data = want_v ? L->v : L->k,
	    .dtype = SKV_DTYPE_F32,
	    .head_stride = L->head_stride,
	    .token_stride = L->token_stride,
	};
	return t;
}

/* The shape of a compaction of full, and whether the captured queries do. */
static int prepare(const struct tl_model *m, const struct tl_kv *full, const float *q,
		   uint32_t q_first, uint32_t q_n, const struct skv_params *p,
		   struct skv_shape *shape, struct skv_error *err)
{
	const struct tl_config *c = &m->cfg;
	const uint32_t L = full->len;

	*shape = (struct skv_shape){
	    .prompt_len = L,
	    .head_dim = c->head_dim,
	    .h_q = c->n_heads,
	    .h_kv = c->n_kv_heads,
	    .n_q = tl_compact_n_q(p, L),
	};
	if (full->h_store != c->n_kv_heads || full->next_pos != L) {
		snprintf(err->msg, sizeof(err->msg), "tl_compact: input is not a full cache");
		return -EINVAL;
	}
	if (shape->n_q > q_n || (shape->n_q && (!q || q_first + q_n != L))) {
		snprintf(err->msg, sizeof(err->msg),
			 "tl_compact: policy needs the last %u queries, %u captured from %u",
			 shape->n_q, q_n, q_first);
		return -EINVAL;
	}
	return 0;
}

/* Every layer's inputs (full, the last n_q of the captured queries) and
 * outputs (kv), into in[] and out[] of n_layers each (calloc'd). */
static int layer_io(const struct tl_model *m, const struct tl_kv *full, const float *q,
		    uint32_t q_n, const struct skv_shape *shape, struct tl_kv *kv,
		    struct skv_layer_in **ret_in, struct skv_layer_out **ret_out)
{
	const struct tl_config *c = &m->cfg;
	const uint32_t D = c->head_dim, hq = c->n_heads;
	struct skv_layer_in *in = calloc(c->n_layers, sizeof(*in));
	struct skv_layer_out *out = calloc(c->n_layers, sizeof(*out));

	if (!in || !out) {
		free(in);
		free(out);
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < c->n_layers; l++) {
		/* The last n_q of the captured rows: skip q_n - n_q of them in each head. */
		in[l].q = (struct skv_tensor){
		    .data = shape->n_q
				? (void *)(q + (((size_t)l * hq) * q_n + (q_n - shape->n_q)) * D)
				: NULL,
		    .dtype = SKV_DTYPE_F32,
		    .head_stride = (int64_t)q_n * D,
		    .token_stride = D,
		};
		in[l].k = tl_kv_tensor(full, l, 0);
		in[l].v = tl_kv_tensor(full, l, 1);
		out[l].k = tl_kv_tensor(kv, l, 0);
		out[l].v = tl_kv_tensor(kv, l, 1);
		out[l].positions = kv->layers[l].pos;
		out[l].pos_stride = kv->layers[l].pos_stride;
	}
	*ret_in = in;
	*ret_out = out;
	return 0;
}

int tl_compact(struct skv_ctx *ctx, const struct tl_model *m, const struct tl_kv *full,
	       const float *q, uint32_t q_first, uint32_t q_n, const struct skv_params *p,
	       uint32_t reserve, struct tl_kv **ret_kv, struct skv_plan *ret_plan,
	       struct skv_error *err)
{
	const struct tl_config *c = &m->cfg;
	struct skv_shape shape;
	struct skv_plan plan;
	struct skv_layer_in *in = NULL;
	struct skv_layer_out *out = NULL;
	struct tl_kv *kv = NULL;
	int r = prepare(m, full, q, q_first, q_n, p, &shape, err);

	if (r < 0)
		return r;
	r = skv_plan(&shape, p, &plan, err);
	if (r < 0)
		return r;
	if (reserve > UINT32_MAX - plan.kept)
		return -EOVERFLOW;
	r = tl_kv_new(c, plan.h_store, plan.kept + reserve, &kv);
	if (r == 0)
		r = layer_io(m, full, q, q_n, &shape, kv, &in, &out);
	if (r < 0)
		goto out;
	r = skv_compact(ctx, &shape, p, c->n_layers, in, out, err);
	if (r < 0)
		goto out;
	kv->len = plan.kept;
	/* Physical slot != logical position: decoding resumes at L, not at kept. */
	kv->next_pos = full->len;
	*ret_kv = kv;
	kv = NULL;
	if (ret_plan)
		*ret_plan = plan;
out:
	tl_kv_free(kv);
	free(in);
	free(out);
	return r;
}

/* The per-head counts of res into kv (head_len where they differ) and t. */
static int take_counts(struct tl_kv *kv, const struct skv_budget_result *res, struct tl_budget *t)
{
	const size_t n = (size_t)kv->n_layers * kv->h_store;
	bool ragged = false;

	*t = (struct tl_budget){.c_star = res->c_star,
				.fallback = res->fallback,
				.min_mass = res->min_mass,
				.kept_min = UINT32_MAX};
	for (size_t i = 0; i < n; i++) {
		t->kept_total += res->kept[i];
		t->kept_min = res->kept[i] < t->kept_min ? res->kept[i] : t->kept_min;
		t->kept_max = res->kept[i] > t->kept_max ? res->kept[i] : t->kept_max;
	}
	ragged = t->kept_min != t->kept_max;
	kv->len = t->kept_max;
	if (!ragged)
		return 0;
	kv->head_lens = malloc(n * sizeof(uint32_t));
	if (!kv->head_lens)
		return -ENOMEM;
	memcpy(kv->head_lens, res->kept, n * sizeof(uint32_t));
	for (uint32_t l = 0; l < kv->n_layers; l++)
		kv->layers[l].head_len = kv->head_lens + (size_t)l * kv->h_store;
	return 0;
}

int tl_compact_budget(struct skv_ctx *ctx, const struct tl_model *m, const struct tl_kv *full,
		      const float *q, uint32_t q_first, uint32_t q_n, const struct skv_params *p,
		      uint32_t reserve, struct tl_kv **ret_kv, struct tl_budget *ret_res,
		      struct skv_error *err)
{
	const struct tl_config *c = &m->cfg;
	struct skv_shape shape;
	struct skv_plan plan;
	struct skv_layer_in *in = NULL;
	struct skv_layer_out *out = NULL;
	struct skv_budget_result res = {.result_size = sizeof(res)};
	struct tl_budget t;
	struct tl_kv *kv = NULL;
	uint32_t rows[TL_MAX_LAYERS], room = 0;
	int r = prepare(m, full, q, q_first, q_n, p, &shape, err);

	if (!r)
		r = skv_plan(&shape, p, &plan, err);
	if (!r)
		r = skv_budget_rows(&shape, p, c->n_layers, rows, err);
	if (r < 0)
		return r;
	for (uint32_t l = 0; l < c->n_layers; l++)
		room = rows[l] > room ? rows[l] : room;
	if (reserve > UINT32_MAX - room)
		return -EOVERFLOW;
	res.kept = calloc((size_t)c->n_layers * plan.h_store, sizeof(uint32_t));
	r = res.kept ? tl_kv_new(c, plan.h_store, room + reserve, &kv) : -ENOMEM;
	if (r == 0)
		r = layer_io(m, full, q, q_n, &shape, kv, &in, &out);
	if (r == 0)
		r = skv_compact_budget(ctx, &shape, p, c->n_layers, in, out, &res, err);
	if (r == 0)
		r = take_counts(kv, &res, &t);
	if (r < 0)
		goto out;
	kv->next_pos = full->len;
	*ret_kv = kv;
	kv = NULL;
	if (ret_res)
		*ret_res = t;
out:
	tl_kv_free(kv);
	free(res.kept);
	free(in);
	free(out);
	return r;
}
