// SPDX-License-Identifier: MIT
#include "tl-compact.h"

#include <errno.h>
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

int tl_compact(struct skv_ctx *ctx, const struct tl_model *m, const struct tl_kv *full,
	       const float *q, uint32_t q_first, uint32_t q_n, const struct skv_params *p,
	       uint32_t reserve, struct tl_kv **ret_kv, struct skv_plan *ret_plan,
	       struct skv_error *err)
{
	const struct tl_config *c = &m->cfg;
	const uint32_t L = full->len, D = c->head_dim, hq = c->n_heads;
	struct skv_shape shape = {
	    .prompt_len = L,
	    .head_dim = D,
	    .h_q = hq,
	    .h_kv = c->n_kv_heads,
	    .n_q = tl_compact_n_q(p, L),
	};
	struct skv_plan plan;
	struct skv_layer_in *in = NULL;
	struct skv_layer_out *out = NULL;
	struct tl_kv *kv = NULL;
	int r;

	if (full->h_store != c->n_kv_heads || full->next_pos != L) {
		snprintf(err->msg, sizeof(err->msg), "tl_compact: input is not a full cache");
		return -EINVAL;
	}
	if (shape.n_q > q_n || (shape.n_q && (!q || q_first + q_n != L))) {
		snprintf(err->msg, sizeof(err->msg),
			 "tl_compact: policy needs the last %u queries, %u captured from %u",
			 shape.n_q, q_n, q_first);
		return -EINVAL;
	}
	r = skv_plan(&shape, p, &plan, err);
	if (r < 0)
		return r;
	if (reserve > UINT32_MAX - plan.kept)
		return -EOVERFLOW;
	r = tl_kv_new(c, plan.h_store, plan.kept + reserve, &kv);
	in = calloc(c->n_layers, sizeof(*in));
	out = calloc(c->n_layers, sizeof(*out));
	if (r < 0 || !in || !out) {
		r = r < 0 ? r : -ENOMEM;
		goto out;
	}
	for (uint32_t l = 0; l < c->n_layers; l++) {
		/* The last n_q of the captured rows: skip q_n - n_q of them in each head. */
		in[l].q = (struct skv_tensor){
		    .data = shape.n_q
				? (void *)(q + (((size_t)l * hq) * q_n + (q_n - shape.n_q)) * D)
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
	r = skv_compact(ctx, &shape, p, c->n_layers, in, out, err);
	if (r < 0)
		goto out;
	kv->len = plan.kept;
	/* Physical slot != logical position: decoding resumes at L, not at kept. */
	kv->next_pos = L;
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
