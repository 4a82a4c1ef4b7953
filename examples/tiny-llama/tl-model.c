// SPDX-License-Identifier: MIT
#include "tl-model.h"

#include <cblas.h>

#include "tl-quant.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tl_model_free(struct tl_model *m)
{
	if (!m)
		return;
	tl_tok_free(m->tok);
	tl_gguf_free(m->gguf);
	for (uint32_t i = 0; i < m->n_owned; i++)
		free(m->owned[i]);
	free(m->owned);
	free(m->layers);
	free(m);
}

/*
 * A tensor that must exist and have exactly shape [ne0, ne1] (ne1 = 0: 1-D),
 * as F32: pointed to in the file when it is F32, else dequantized into
 * memory the model owns (tl-quant.h).
 */
static int get_w(struct tl_model *m, const char *name, uint64_t ne0, uint64_t ne1,
		 const float **ret, struct tl_err *err)
{
	const struct tl_gguf_tensor *t = tl_gguf_find_tensor(m->gguf, name);
	if (!t)
		return tl_fail(err, -EBADMSG, "model: tensor '%s' missing", name);
	if (!t->data)
		return tl_fail(err, -EBADMSG,
			       "model: tensor '%s' is ggml type %u, not F32/F16/Q4_0/Q4_1/Q8_0",
			       name, t->type);
	uint32_t want_dims = ne1 ? 2 : 1;
	if (t->n_dims != want_dims || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1))
		return tl_fail(err, -EBADMSG,
			       "model: tensor '%s' has shape [%llu, %llu] (%u dims), expected "
			       "[%llu, %llu]",
			       name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
			       t->n_dims, (unsigned long long)ne0, (unsigned long long)ne1);
	if (t->type == TL_GGML_F32) {
		*ret = t->data;
		return 0;
	}
	float *f = malloc(t->n_elems * sizeof(float));
	if (!f)
		return tl_fail(err, -ENOMEM, "model: out of memory for tensor '%s'", name);
	m->owned[m->n_owned++] = f;
	*ret = f;
	return tl_dequant(t->type, t->data, t->n_elems, f);
}

int tl_model_from_gguf(struct tl_gguf *g, struct tl_model **ret_m, struct tl_err *err)
{
	struct tl_model *m = calloc(1, sizeof(*m));
	struct tl_config *c;
	uint32_t rope_dims;
	int r;

	if (!m) {
		tl_gguf_free(g);
		return tl_fail(err, -ENOMEM, "model: out of memory");
	}
	m->gguf = g;
	c = &m->cfg;
	const struct tl_gguf_kv *arch = tl_gguf_find_kv(g, "general.architecture");
	if (!arch || arch->val.type != TL_GGUF_STRING || !tl_str_eq(arch->val.s, "llama")) {
		r = tl_fail(err, -EBADMSG, "model: general.architecture is not 'llama'");
		goto fail;
	}
	if ((r = tl_gguf_get_u32(g, "llama.embedding_length", &c->dim, err)) < 0 ||
	    (r = tl_gguf_get_u32(g, "llama.block_count", &c->n_layers, err)) < 0 ||
	    (r = tl_gguf_get_u32(g, "llama.attention.head_count", &c->n_heads, err)) < 0 ||
	    (r = tl_gguf_get_u32(g, "llama.feed_forward_length", &c->hidden_dim, err)) < 0 ||
	    (r = tl_gguf_get_u32(g, "llama.context_length", &c->ctx_len, err)) < 0)
		goto fail;
	c->n_kv_heads = c->n_heads;
	if (tl_gguf_find_kv(g, "llama.attention.head_count_kv") &&
	    (r = tl_gguf_get_u32(g, "llama.attention.head_count_kv", &c->n_kv_heads, err)) < 0)
		goto fail;
	c->norm_eps = 1e-5f;
	if (tl_gguf_find_kv(g, "llama.attention.layer_norm_rms_epsilon") &&
	    (r = tl_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c->norm_eps, err)) <
		0)
		goto fail;
	c->rope_base = 10000.0f;
	if (tl_gguf_find_kv(g, "llama.rope.freq_base") &&
	    (r = tl_gguf_get_f32(g, "llama.rope.freq_base", &c->rope_base, err)) < 0)
		goto fail;
	if (c->dim == 0 || c->dim > TL_MAX_DIM || c->n_layers == 0 || c->n_layers > TL_MAX_LAYERS ||
	    c->n_heads == 0 || c->n_heads > TL_MAX_HEADS || c->n_kv_heads == 0 ||
	    c->n_heads % c->n_kv_heads || c->dim % c->n_heads || c->hidden_dim == 0 ||
	    c->hidden_dim > 4 * TL_MAX_DIM) {
		r = tl_fail(err, -EBADMSG,
			    "model: inconsistent shape dim %u layers %u heads %u/%u "
			    "hidden %u",
			    c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->hidden_dim);
		goto fail;
	}
	c->head_dim = c->dim / c->n_heads;
	rope_dims = c->head_dim;
	if (tl_gguf_find_kv(g, "llama.rope.dimension_count") &&
	    (r = tl_gguf_get_u32(g, "llama.rope.dimension_count", &rope_dims, err)) < 0)
		goto fail;
	if (c->head_dim % 2 || rope_dims != c->head_dim || !(c->norm_eps > 0) ||
	    !(c->rope_base > 1)) {
		r = tl_fail(err, -EBADMSG,
			    "model: head_dim %u / rope dims %u / eps / base unsupported",
			    c->head_dim, rope_dims);
		goto fail;
	}
	if ((r = tl_tok_load(g, &m->tok, err)) < 0)
		goto fail;
	c->vocab_size = m->tok->n_vocab;

	uint64_t qd = (uint64_t)c->n_heads * c->head_dim,
		 kvd = (uint64_t)c->n_kv_heads * c->head_dim;
	m->layers = calloc(c->n_layers, sizeof(*m->layers));
	/* every tensor may need its own F32 copy: 9 per layer and 3 more */
	m->owned = calloc((size_t)c->n_layers * 9 + 3, sizeof(*m->owned));
	if (!m->layers || !m->owned) {
		r = tl_fail(err, -ENOMEM, "model: out of memory");
		goto fail;
	}
	if ((r = get_w(m, "token_embd.weight", c->dim, c->vocab_size, &m->tok_embd, err)) < 0 ||
	    (r = get_w(m, "output_norm.weight", c->dim, 0, &m->out_norm, err)) < 0)
		goto fail;
	if (tl_gguf_find_tensor(g, "output.weight")) {
		if ((r = get_w(m, "output.weight", c->dim, c->vocab_size, &m->output, err)) < 0)
			goto fail;
	} else {
		m->output = m->tok_embd; /* tied embeddings */
	}
	for (uint32_t l = 0; l < c->n_layers; l++) {
		struct tl_layer_w *w = &m->layers[l];
		char n[9][64];
		static const char *const sfx[9] = {"attn_norm", "attn_q",      "attn_k",
						   "attn_v",	"attn_output", "ffn_norm",
						   "ffn_gate",	"ffn_up",      "ffn_down"};
		for (int i = 0; i < 9; i++)
			snprintf(n[i], sizeof(n[i]), "blk.%u.%s.weight", l, sfx[i]);
		if ((r = get_w(m, n[0], c->dim, 0, &w->attn_norm, err)) < 0 ||
		    (r = get_w(m, n[1], c->dim, qd, &w->wq, err)) < 0 ||
		    (r = get_w(m, n[2], c->dim, kvd, &w->wk, err)) < 0 ||
		    (r = get_w(m, n[3], c->dim, kvd, &w->wv, err)) < 0 ||
		    (r = get_w(m, n[4], qd, c->dim, &w->wo, err)) < 0 ||
		    (r = get_w(m, n[5], c->dim, 0, &w->ffn_norm, err)) < 0 ||
		    (r = get_w(m, n[6], c->dim, c->hidden_dim, &w->w_gate, err)) < 0 ||
		    (r = get_w(m, n[7], c->dim, c->hidden_dim, &w->w_up, err)) < 0 ||
		    (r = get_w(m, n[8], c->hidden_dim, c->dim, &w->w_down, err)) < 0)
			goto fail;
	}
	*ret_m = m;
	return 0;
fail:
	tl_model_free(m);
	return r;
}

int tl_model_load(const char *path, struct tl_model **ret_m, struct tl_err *err)
{
	struct tl_gguf *g;
	int r = tl_gguf_open(path, &g, err);
	if (r < 0)
		return r;
	return tl_model_from_gguf(g, ret_m, err);
}

/* ---- KV cache ---- */

static int kv_alloc(const struct tl_config *c, uint32_t h_store, uint32_t cap,
		    struct tl_kv **ret_kv)
{
	if (!h_store || (h_store != c->n_heads && h_store != c->n_kv_heads))
		return -EINVAL;
	struct tl_kv *kv = calloc(1, sizeof(*kv));
	if (!kv)
		return -ENOMEM;
	kv->layers = calloc(c->n_layers, sizeof(*kv->layers));
	if (!kv->layers) {
		free(kv);
		return -ENOMEM;
	}
	kv->n_layers = c->n_layers;
	kv->h_store = h_store;
	kv->head_dim = c->head_dim;
	kv->cap = cap;
	*ret_kv = kv;
	return 0;
}

void tl_kv_free(struct tl_kv *kv)
{
	if (!kv)
		return;
	free(kv->mem);
	free(kv->layers);
	free(kv->head_lens);
	free(kv->head_offs);
	free(kv);
}

uint64_t tl_kv_bytes(const struct tl_config *c, uint32_t h_store, uint32_t cap)
{
	uint64_t per = (uint64_t)h_store * cap;
	return (uint64_t)c->n_layers * (2 * per * c->head_dim * sizeof(float) + per * 4);
}

/* Per layer: K [h][cap][D], V likewise, then positions [h][cap]. */
int tl_kv_place(struct tl_kv *kv, void *mem, uint64_t bytes)
{
	uint64_t per = (uint64_t)kv->h_store * kv->cap;
	uint64_t kvel = per * kv->head_dim;
	if (((uintptr_t)mem & 3) || bytes < kv->n_layers * (2 * kvel * sizeof(float) + per * 4))
		return -EINVAL;
	char *p = mem;
	for (uint32_t l = 0; l < kv->n_layers; l++) {
		struct tl_kv_layer *L = &kv->layers[l];
		L->k = (float *)p;
		p += kvel * sizeof(float);
		L->v = (float *)p;
		p += kvel * sizeof(float);
		L->pos = (int32_t *)p;
		p += per * 4;
		L->head_stride = (int64_t)kv->cap * kv->head_dim;
		L->token_stride = kv->head_dim;
		L->pos_stride = kv->cap;
	}
	return 0;
}

static int kv_carve(struct tl_kv *kv, uint32_t cap)
{
	uint64_t per = (uint64_t)kv->h_store * cap;
	uint64_t bytes =
	    (uint64_t)kv->n_layers * (2 * per * kv->head_dim * sizeof(float) + per * 4);
	if (cap > (1u << 24) || bytes > (1ull << 36))
		return -EINVAL;
	char *mem = calloc(1, bytes ? bytes : 1);
	if (!mem)
		return -ENOMEM;
	uint32_t old_cap = kv->cap;
	kv->cap = cap;
	int r = tl_kv_place(kv, mem, bytes);
	if (r < 0) {
		kv->cap = old_cap;
		free(mem);
		return r;
	}
	kv->mem = mem;
	return 0;
}

int tl_kv_new(const struct tl_config *c, uint32_t h_store, uint32_t cap, struct tl_kv **ret_kv)
{
	struct tl_kv *kv;
	int r = kv_alloc(c, h_store, cap, &kv);
	if (r < 0)
		return r;
	r = kv_carve(kv, cap);
	if (r < 0) {
		tl_kv_free(kv);
		return r;
	}
	*ret_kv = kv;
	return 0;
}

int tl_kv_new_view(const struct tl_config *c, uint32_t h_store, uint32_t cap, struct tl_kv **ret_kv)
{
	return kv_alloc(c, h_store, cap, ret_kv);
}

int tl_kv_grow(struct tl_kv *kv, uint32_t new_cap)
{
	if (!kv->mem || new_cap < kv->len)
		return -EINVAL;
	struct tl_kv old = *kv;
	struct tl_kv_layer *old_layers = malloc(sizeof(*old_layers) * kv->n_layers);
	if (!old_layers)
		return -ENOMEM;
	memcpy(old_layers, kv->layers, sizeof(*old_layers) * kv->n_layers);
	int r = kv_carve(kv, new_cap);
	if (r < 0) {
		free(old_layers);
		kv->mem = old.mem;
		kv->cap = old.cap;
		return r;
	}
	for (uint32_t l = 0; l < kv->n_layers; l++) {
		const struct tl_kv_layer *o = &old_layers[l];
		struct tl_kv_layer *n = &kv->layers[l];
		n->head_len = o->head_len; /* ragged heads keep their counts */
		for (uint32_t h = 0; h < kv->h_store; h++)
			for (uint32_t t = 0; t < kv->len; t++) {
				memcpy(n->k + h * n->head_stride + t * n->token_stride,
				       o->k + h * o->head_stride + t * o->token_stride,
				       kv->head_dim * sizeof(float));
				memcpy(n->v + h * n->head_stride + t * n->token_stride,
				       o->v + h * o->head_stride + t * o->token_stride,
				       kv->head_dim * sizeof(float));
				n->pos[h * n->pos_stride + t] = o->pos[h * o->pos_stride + t];
			}
	}
	free(old_layers);
	free(old.mem);
	return 0;
}

/* ---- forward ---- */

/* Elements from a layer's k (v) to stored head sh's slot 0. */
static int64_t head_at(const struct tl_kv_layer *L, uint32_t sh)
{
	return L->head_off ? L->head_off[sh] : (int64_t)sh * L->head_stride;
}

struct tl_state {
	float *x, *xb, *xb2, *q, *k, *v, *hb, *hb2, *att, *logits;
	uint32_t att_cap;
};

void tl_state_free(struct tl_state *s)
{
	if (!s)
		return;
	free(s->x);
	free(s->xb);
	free(s->xb2);
	free(s->q);
	free(s->k);
	free(s->v);
	free(s->hb);
	free(s->hb2);
	free(s->att);
	free(s->logits);
	free(s);
}

int tl_state_new(const struct tl_model *m, struct tl_state **ret_s)
{
	const struct tl_config *c = &m->cfg;
	struct tl_state *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
	s->x = calloc(c->dim, sizeof(float));
	s->xb = calloc(qd > c->dim ? qd : c->dim, sizeof(float));
	s->xb2 = calloc(c->dim, sizeof(float));
	s->q = calloc(qd, sizeof(float));
	s->k = calloc(kvd, sizeof(float));
	s->v = calloc(kvd, sizeof(float));
	s->hb = calloc(c->hidden_dim, sizeof(float));
	s->hb2 = calloc(c->hidden_dim, sizeof(float));
	s->logits = calloc(c->vocab_size, sizeof(float));
	if (!s->x || !s->xb || !s->xb2 || !s->q || !s->k || !s->v || !s->hb || !s->hb2 ||
	    !s->logits) {
		tl_state_free(s);
		return -ENOMEM;
	}
	*ret_s = s;
	return 0;
}

const float *tl_state_logits(const struct tl_state *s)
{
	return s->logits;
}

static void rmsnorm(float *o, const float *x, const float *w, uint32_t n, float eps)
{
	float ss = 0;
	for (uint32_t i = 0; i < n; i++)
		ss += x[i] * x[i];
	ss = 1.0f / sqrtf(ss / n + eps);
	for (uint32_t i = 0; i < n; i++)
		o[i] = w[i] * (ss * x[i]);
}

/* out[i] = sum_j W[i][j] x[j], W row-major [d][n] (GGUF ne = [n, d]). */
static void matvec(float *out, const float *x, const float *w, uint32_t n, uint32_t d)
{
	cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)d, (int)n, 1.0f, w, (int)n, x, 1, 0.0f, out,
		    1);
}

/* out[m][d] (row stride ldo) = x[m][n] (row stride ldx) W^T, W row-major [d][n]. */
static void matmul(float *out, int ldo, const float *x, int ldx, const float *w, uint32_t m,
		   uint32_t n, uint32_t d)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)d, (int)n, 1.0f, x, ldx,
		    w, (int)n, 0.0f, out, ldo);
}

/* Rotate adjacent pairs (x[2i], x[2i+1]) of each head by pos * base^(-2i/D). */
static void rope(float *x, uint32_t n_heads, uint32_t hd, uint32_t pos, float base)
{
	for (uint32_t h = 0; h < n_heads; h++) {
		float *v = x + (size_t)h * hd;
		for (uint32_t i = 0; i < hd; i += 2) {
			float freq = 1.0f / powf(base, (float)i / (float)hd);
			float a = (float)pos * freq;
			float cr = cosf(a), ci = sinf(a);
			float v0 = v[i], v1 = v[i + 1];
			v[i] = v0 * cr - v1 * ci;
			v[i + 1] = v0 * ci + v1 * cr;
		}
	}
}

static int grow_att(struct tl_state *s, uint32_t n)
{
	if (n <= s->att_cap)
		return 0;
	uint32_t cap = s->att_cap ? s->att_cap : 256;
	while (cap < n)
		cap *= 2;
	float *a = realloc(s->att, cap * sizeof(float));
	if (!a)
		return -ENOMEM;
	s->att = a;
	s->att_cap = cap;
	return 0;
}

int tl_forward(const struct tl_model *m, struct tl_state *s, struct tl_kv *kv, uint32_t token,
	       const struct tl_qcap *qcap)
{
	const struct tl_config *c = &m->cfg;
	const uint32_t dim = c->dim, hd = c->head_dim, hq = c->n_heads, hkv = c->n_kv_heads;
	const uint32_t qd = hq * hd, kvd = hkv * hd;
	int r;

	if (token >= c->vocab_size || kv->n_layers != c->n_layers || kv->head_dim != hd ||
	    (kv->h_store != hq && kv->h_store != hkv))
		return -EINVAL;
	if (kv->len >= kv->cap || kv->next_pos >= INT32_MAX)
		return -ENOSPC;
	/* ragged heads: kv->len is the longest head */
	for (uint32_t l = 0; l < kv->n_layers; l++)
		for (uint32_t sh = 0; kv->layers[l].head_len && sh < kv->h_store; sh++)
			if (kv->layers[l].head_len[sh] > kv->len)
				return -EINVAL;
	if ((r = grow_att(s, kv->len + 1)) < 0)
		return r;

	const uint32_t pos = kv->next_pos, slot = kv->len, n_all = kv->len + 1;
	/* Stored heads per K/V head (1 or G) and query heads per stored head. */
	const uint32_t rep = kv->h_store / hkv, qper = hq / kv->h_store;
	const float scale = 1.0f / sqrtf((float)hd);

	memcpy(s->x, m->tok_embd + (size_t)token * dim, dim * sizeof(float));
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const struct tl_layer_w *w = &m->layers[l];
		struct tl_kv_layer *L = &kv->layers[l];

		rmsnorm(s->xb, s->x, w->attn_norm, dim, c->norm_eps);
		matvec(s->q, s->xb, w->wq, dim, qd);
		matvec(s->k, s->xb, w->wk, dim, kvd);
		matvec(s->v, s->xb, w->wv, dim, kvd);
		rope(s->q, hq, hd, pos, c->rope_base);
		rope(s->k, hkv, hd, pos, c->rope_base);
		if (qcap && pos >= qcap->first && pos - qcap->first < qcap->n)
			for (uint32_t h = 0; h < hq; h++)
				memcpy(qcap->q +
					   (((size_t)l * hq + h) * qcap->n + (pos - qcap->first)) *
					       hd,
				       s->q + (size_t)h * hd, hd * sizeof(float));
		/* Append: every stored head copies the K/V of the K/V head it derives from. */
		for (uint32_t sh = 0; sh < kv->h_store; sh++) {
			uint32_t kvh = sh / rep, at = L->head_len ? L->head_len[sh] : slot;
			memcpy(L->k + head_at(L, sh) + (int64_t)at * L->token_stride,
			       s->k + (size_t)kvh * hd, hd * sizeof(float));
			memcpy(L->v + head_at(L, sh) + (int64_t)at * L->token_stride,
			       s->v + (size_t)kvh * hd, hd * sizeof(float));
			if (L->pos)
				L->pos[(size_t)sh * L->pos_stride + at] = (int32_t)pos;
		}
		for (uint32_t h = 0; h < hq; h++) {
			const float *q = s->q + (size_t)h * hd;
			const uint32_t sh = h / qper;
			const uint32_t n = L->head_len ? L->head_len[sh] + 1 : n_all;
			const float *kb = L->k + head_at(L, sh);
			const float *vb = L->v + head_at(L, sh);
			float *att = s->att, *o = s->xb + (size_t)h * hd;
			float mx = -INFINITY, sum = 0;
			for (uint32_t t = 0; t < n; t++) {
				const float *k = kb + (int64_t)t * L->token_stride;
				float sc = 0;
				for (uint32_t d = 0; d < hd; d++)
					sc += q[d] * k[d];
				sc *= scale;
				att[t] = sc;
				if (sc > mx)
					mx = sc;
			}
			for (uint32_t t = 0; t < n; t++) {
				att[t] = expf(att[t] - mx);
				sum += att[t];
			}
			memset(o, 0, hd * sizeof(float));
			for (uint32_t t = 0; t < n; t++) {
				const float *v = vb + (int64_t)t * L->token_stride;
				float a = att[t] / sum;
				for (uint32_t d = 0; d < hd; d++)
					o[d] += a * v[d];
			}
		}
		for (uint32_t sh = 0; L->head_len && sh < kv->h_store; sh++)
			L->head_len[sh]++;
		matvec(s->xb2, s->xb, w->wo, qd, dim);
		for (uint32_t i = 0; i < dim; i++)
			s->x[i] += s->xb2[i];

		rmsnorm(s->xb, s->x, w->ffn_norm, dim, c->norm_eps);
		matvec(s->hb, s->xb, w->w_gate, dim, c->hidden_dim);
		matvec(s->hb2, s->xb, w->w_up, dim, c->hidden_dim);
		for (uint32_t i = 0; i < c->hidden_dim; i++) {
			float g = s->hb[i];
			s->hb[i] = g / (1.0f + expf(-g)) * s->hb2[i];
		}
		matvec(s->xb2, s->hb, w->w_down, c->hidden_dim, dim);
		for (uint32_t i = 0; i < dim; i++)
			s->x[i] += s->xb2[i];
	}
	rmsnorm(s->x, s->x, m->out_norm, dim, c->norm_eps);
	matvec(s->logits, s->x, m->output, dim, c->vocab_size);
	kv->len++;
	kv->next_pos++;
	return 0;
}

/*
 * The prompt in blocks of TL_PREFILL_BLOCK tokens: each block's projections
 * are matrix products over its rows, and its attention a [block][slots]
 * score matrix (never L x L) over every slot filled so far, causally
 * masked, so an 8K prompt costs memory in proportion to L. The K/V rows
 * land where tl_forward() would put them; the logits are the last token's.
 */
#define TL_PREFILL_BLOCK 64u

struct pf_scratch {
	float *x, *xb, *xb2, *q, *k, *v, *h1, *h2, *sc;
};

static void pf_free(struct pf_scratch *p)
{
	free(p->x);
	free(p->xb);
	free(p->xb2);
	free(p->q);
	free(p->k);
	free(p->v);
	free(p->h1);
	free(p->h2);
	free(p->sc);
}

/* Causal softmax of each row j of sc[b][nk]: slots [0, first + j] are visible. */
static void pf_softmax(float *sc, uint32_t b, uint32_t nk, uint32_t first)
{
	for (uint32_t j = 0; j < b; j++) {
		float *row = sc + (size_t)j * nk, mx = -INFINITY, sum = 0;
		const uint32_t vis = first + j + 1;
		for (uint32_t t = 0; t < vis; t++)
			mx = row[t] > mx ? row[t] : mx;
		for (uint32_t t = 0; t < vis; t++) {
			row[t] = expf(row[t] - mx);
			sum += row[t];
		}
		for (uint32_t t = 0; t < vis; t++)
			row[t] /= sum;
		for (uint32_t t = vis; t < nk; t++)
			row[t] = 0;
	}
}

static void pf_layer(const struct tl_model *m, struct pf_scratch *p, struct tl_kv *kv, uint32_t l,
		     uint32_t b, const struct tl_qcap *qcap)
{
	const struct tl_config *c = &m->cfg;
	const struct tl_layer_w *w = &m->layers[l];
	struct tl_kv_layer *L = &kv->layers[l];
	const uint32_t dim = c->dim, hd = c->head_dim, hq = c->n_heads, hkv = c->n_kv_heads;
	const uint32_t qd = hq * hd, kvd = hkv * hd, hid = c->hidden_dim;
	const uint32_t rep = kv->h_store / hkv, qper = hq / kv->h_store;
	const uint32_t slot0 = kv->len, pos0 = kv->next_pos, nk = slot0 + b;

	for (uint32_t j = 0; j < b; j++)
		rmsnorm(p->xb + (size_t)j * dim, p->x + (size_t)j * dim, w->attn_norm, dim,
			c->norm_eps);
	matmul(p->q, (int)qd, p->xb, (int)dim, w->wq, b, dim, qd);
	matmul(p->k, (int)kvd, p->xb, (int)dim, w->wk, b, dim, kvd);
	matmul(p->v, (int)kvd, p->xb, (int)dim, w->wv, b, dim, kvd);
	for (uint32_t j = 0; j < b; j++) {
		const uint32_t pos = pos0 + j;
		rope(p->q + (size_t)j * qd, hq, hd, pos, c->rope_base);
		rope(p->k + (size_t)j * kvd, hkv, hd, pos, c->rope_base);
		if (qcap && pos >= qcap->first && pos - qcap->first < qcap->n)
			for (uint32_t h = 0; h < hq; h++)
				memcpy(qcap->q +
					   (((size_t)l * hq + h) * qcap->n + (pos - qcap->first)) *
					       hd,
				       p->q + (size_t)j * qd + (size_t)h * hd, hd * sizeof(float));
		for (uint32_t sh = 0; sh < kv->h_store; sh++) {
			const uint32_t kvh = sh / rep;
			memcpy(L->k + head_at(L, sh) + (int64_t)(slot0 + j) * L->token_stride,
			       p->k + (size_t)j * kvd + (size_t)kvh * hd, hd * sizeof(float));
			memcpy(L->v + head_at(L, sh) + (int64_t)(slot0 + j) * L->token_stride,
			       p->v + (size_t)j * kvd + (size_t)kvh * hd, hd * sizeof(float));
			if (L->pos)
				L->pos[(size_t)sh * L->pos_stride + slot0 + j] = (int32_t)pos;
		}
	}
	for (uint32_t h = 0; h < hq; h++) {
		const uint32_t sh = h / qper;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b, (int)nk, (int)hd,
			    1.0f / sqrtf((float)hd), p->q + (size_t)h * hd, (int)qd,
			    L->k + head_at(L, sh), (int)L->token_stride, 0.0f, p->sc, (int)nk);
		pf_softmax(p->sc, b, nk, slot0);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)b, (int)hd, (int)nk,
			    1.0f, p->sc, (int)nk, L->v + head_at(L, sh), (int)L->token_stride, 0.0f,
			    p->xb + (size_t)h * hd, (int)qd);
	}
	matmul(p->xb2, (int)dim, p->xb, (int)qd, w->wo, b, qd, dim);
	for (size_t i = 0; i < (size_t)b * dim; i++)
		p->x[i] += p->xb2[i];

	for (uint32_t j = 0; j < b; j++)
		rmsnorm(p->xb + (size_t)j * dim, p->x + (size_t)j * dim, w->ffn_norm, dim,
			c->norm_eps);
	matmul(p->h1, (int)hid, p->xb, (int)dim, w->w_gate, b, dim, hid);
	matmul(p->h2, (int)hid, p->xb, (int)dim, w->w_up, b, dim, hid);
	for (size_t i = 0; i < (size_t)b * hid; i++) {
		float g = p->h1[i];
		p->h1[i] = g / (1.0f + expf(-g)) * p->h2[i];
	}
	matmul(p->xb2, (int)dim, p->h1, (int)hid, w->w_down, b, hid, dim);
	for (size_t i = 0; i < (size_t)b * dim; i++)
		p->x[i] += p->xb2[i];
}

int tl_prefill(const struct tl_model *m, struct tl_state *s, struct tl_kv *kv,
	       const uint32_t *tokens, uint32_t n, const struct tl_qcap *qcap)
{
	const struct tl_config *c = &m->cfg;
	const uint32_t B = TL_PREFILL_BLOCK, dim = c->dim;
	const size_t qd = (size_t)c->n_heads * c->head_dim,
		     kvd = (size_t)c->n_kv_heads * c->head_dim;
	struct pf_scratch p = {0};
	int ragged = 0;

	for (uint32_t l = 0; l < kv->n_layers; l++)
		ragged |= kv->layers[l].head_len != NULL;
	if (ragged || n == 1) { /* per-head lengths: one token at a time */
		for (uint32_t i = 0; i < n; i++) {
			int r = tl_forward(m, s, kv, tokens[i], qcap);
			if (r < 0)
				return r;
		}
		return 0;
	}
	if (!n)
		return 0;
	if (kv->n_layers != c->n_layers || kv->head_dim != c->head_dim ||
	    (kv->h_store != c->n_heads && kv->h_store != c->n_kv_heads))
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		if (tokens[i] >= c->vocab_size)
			return -EINVAL;
	if (n > kv->cap - kv->len || kv->next_pos > INT32_MAX - n)
		return -ENOSPC;
	p.x = malloc(sizeof(float) * B * dim);
	p.xb = malloc(sizeof(float) * B * (qd > dim ? qd : dim));
	p.xb2 = malloc(sizeof(float) * B * dim);
	p.q = malloc(sizeof(float) * B * qd);
	p.k = malloc(sizeof(float) * B * kvd);
	p.v = malloc(sizeof(float) * B * kvd);
	p.h1 = malloc(sizeof(float) * B * c->hidden_dim);
	p.h2 = malloc(sizeof(float) * B * c->hidden_dim);
	p.sc = malloc(sizeof(float) * B * ((size_t)kv->len + n));
	if (!p.x || !p.xb || !p.xb2 || !p.q || !p.k || !p.v || !p.h1 || !p.h2 || !p.sc) {
		pf_free(&p);
		return -ENOMEM;
	}
	uint32_t b = 0;
	for (uint32_t i0 = 0; i0 < n; i0 += b) {
		b = n - i0 < B ? n - i0 : B;
		for (uint32_t j = 0; j < b; j++)
			memcpy(p.x + (size_t)j * dim, m->tok_embd + (size_t)tokens[i0 + j] * dim,
			       dim * sizeof(float));
		for (uint32_t l = 0; l < c->n_layers; l++)
			pf_layer(m, &p, kv, l, b, qcap);
		kv->len += b;
		kv->next_pos += b;
	}
	rmsnorm(s->x, p.x + (size_t)(b - 1) * dim, m->out_norm, dim, c->norm_eps);
	matvec(s->logits, s->x, m->output, dim, c->vocab_size);
	pf_free(&p);
	return 0;
}

/* ---- sampling ---- */

void tl_rng_seed(struct tl_rng *r, uint64_t seed)
{
	r->s = seed ? seed : 0x9e3779b97f4a7c15ull;
}

uint32_t tl_rng_u32(struct tl_rng *r)
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return (uint32_t)((r->s * 0x2545F4914F6CDD1Dull) >> 32);
}

float tl_rng_f32(struct tl_rng *r)
{
	return (tl_rng_u32(r) >> 8) / 16777216.0f;
}

uint32_t tl_argmax(const float *logits, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t i = 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}

uint32_t tl_sample(const float *logits, uint32_t n, float temp, struct tl_rng *rng, float *probs)
{
	if (!(temp > 0))
		return tl_argmax(logits, n);
	float mx = logits[tl_argmax(logits, n)], sum = 0;
	for (uint32_t i = 0; i < n; i++) {
		probs[i] = expf((logits[i] - mx) / temp);
		sum += probs[i];
	}
	float coin = tl_rng_f32(rng) * sum, cdf = 0;
	for (uint32_t i = 0; i < n; i++) {
		cdf += probs[i];
		if (coin < cdf)
			return i;
	}
	return n - 1;
}
