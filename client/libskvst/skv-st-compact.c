// SPDX-License-Identifier: MIT
/*
 * skv-st-compact.c - the compact-cache file of a compaction (libskvst):
 * one definition of its tensors and metadata, used by the offline CLI and
 * the daemon alike so that both write the same bytes. A separate object so
 * that plain safetensors users do not pull in libskv.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv-safetensors.h"
#include "skv-st-internal.h"

/* ---- compaction results ------------------------------------------------- */

static const char *const policy_names[] = {
    [SKV_POLICY_SNAPKV] = "snapkv",
    [SKV_POLICY_H2O] = "h2o",
    [SKV_POLICY_STREAMINGLLM] = "streamingllm",
    [SKV_POLICY_WINDOW] = "window",
};
static const char *const pooling_names[] = {
    [SKV_POOL_AVG] = "avg",
    [SKV_POOL_MAX] = "max",
};
static const char *const gqa_names[] = {
    [SKV_GQA_EXPAND] = "expand",
    [SKV_GQA_GROUP] = "group",
};

#define NAME_OF(tab, v) ((unsigned)(v) < sizeof(tab) / sizeof(tab[0]) ? tab[v] : NULL)

const char *skv_st_policy_name(enum skv_policy p)
{
	return NAME_OF(policy_names, p);
}

const char *skv_st_pooling_name(enum skv_pooling p)
{
	return NAME_OF(pooling_names, p);
}

const char *skv_st_gqa_name(enum skv_gqa g)
{
	return NAME_OF(gqa_names, g);
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

#define N_META	 48
#define META_VAL 160

static bool is_packed(const struct skv_st_layer_result *lr, uint64_t kept, uint64_t hd)
{
	return (lr->head_stride == 0 || (uint64_t)lr->head_stride == kept * hd) &&
	       (lr->token_stride == 0 || (uint64_t)lr->token_stride == hd);
}

/* Copy a strided [hs, kept, hd] tensor into a packed one. */
static int pack_kv(const void *src, const struct skv_st_layer_result *lr, uint64_t hs,
		   uint64_t kept, uint64_t hd, size_t es, void **ret)
{
	uint64_t hst = lr->head_stride ? (uint64_t)lr->head_stride : kept * hd;
	uint64_t tst = lr->token_stride ? (uint64_t)lr->token_stride : hd;
	uint64_t n = hs * kept * hd * es;
	uint8_t *dst = malloc(n > 0 ? n : 1);
	if (!dst)
		return -ENOMEM;
	for (uint64_t h = 0; h < hs; h++)
		for (uint64_t i = 0; i < kept; i++)
			memcpy(dst + ((h * kept + i) * hd) * es,
			       (const uint8_t *)src + (h * hst + i * tst) * es, hd * es);
	*ret = dst;
	return 0;
}

/*
 * The budget's metadata: mode, outcome and the mode's own parameters. The
 * per-layer list may be long: it gets its own buffer (*ret_lst).
 */
static int budget_meta(const struct skv_st_compact_desc *d, struct skv_st_meta *meta,
		       char (*vals)[META_VAL], size_t *nm, char **ret_lst)
{
	const struct skv_params *p = &d->params;
	const char *name = skv_budget_name(p->budget_mode);

	if (!name)
		return -EINVAL;
#define BMETA(k, ...)                                                                              \
	do {                                                                                       \
		if (*nm >= N_META)                                                                 \
			return -EINVAL;                                                            \
		snprintf(vals[*nm], META_VAL, __VA_ARGS__);                                        \
		meta[*nm].key = (k);                                                               \
		meta[*nm].value = vals[*nm];                                                       \
		(*nm)++;                                                                           \
	} while (0)
	BMETA("budget", "%s", name);
	if (d->c_star)
		BMETA("budget.c_star", "%" PRIu32, d->c_star);
	else
		BMETA("budget.c_star", "none");
	BMETA("budget.fallback", "%d", d->fallback ? 1 : 0);
	BMETA("budget.fallback_below", "%.6g", (double)p->fallback_below);
	switch (p->budget_mode) {
	case SKV_BUDGET_LAYERS:
		if (p->n_layer_caps) {
			size_t cap = (size_t)p->n_layer_caps * 11 + 1, o = 0;
			char *l = malloc(cap);
			if (!l)
				return -ENOMEM;
			l[0] = '\0';
			for (uint32_t i = 0; i < p->n_layer_caps && i < SKV_MAX_LAYER_CAPS; i++)
				o += (size_t)snprintf(l + o, cap - o, "%s%" PRIu32, i ? "," : "",
						      p->layer_caps[i]);
			*ret_lst = l;
			if (*nm >= N_META)
				return -EINVAL;
			meta[*nm].key = "budget.layers";
			meta[*nm].value = l;
			(*nm)++;
		} else {
			BMETA("budget.pyramid_r", "%.6g", (double)p->pyramid_r);
		}
		break;
	case SKV_BUDGET_HEADS:
		BMETA("budget.floor", "%.6g", (double)p->head_floor);
		break;
	case SKV_BUDGET_MASS:
	case SKV_BUDGET_MASS_HEADS:
		BMETA("budget.tau", "%.6g", (double)p->tau);
		BMETA("budget.c_min", "%" PRIu32, p->c_min);
		BMETA("budget.c_max", "%" PRIu32, p->c_max);
		if (p->budget_mode == SKV_BUDGET_MASS)
			BMETA("budget.step", "%" PRIu32, p->c_step);
		break;
	default:
		break;
	}
#undef BMETA
	return 0;
}

/* A ragged layer: K, V [sum kept, D] head after head, indices [sum kept],
 * kept [h_store], retained mass [h_store], into t[0..4]. */
static int ragged_layer(const struct skv_st_compact_desc *d, const struct skv_st_layer_result *lr,
			uint32_t layer, struct skv_st_tensor *t, char (*nmv)[32], void **packed,
			size_t *n_packed, enum skv_st_dtype st_dt, struct skv_st_error *err)
{
	const uint64_t hs = d->plan.h_store, hd = d->shape.head_dim;
	const size_t es = skv_dtype_size(d->dtype);
	uint64_t sum = 0;

	if (!lr->kept || !lr->positions || !lr->head_stride || !lr->pos_stride)
		return skv_st__fail(err, -EINVAL,
				    "layer %" PRIu32 ": a ragged layer needs kept counts and "
				    "explicit strides",
				    layer);
	for (uint64_t h = 0; h < hs; h++)
		sum += lr->kept[h];
	uint64_t tst = lr->token_stride ? (uint64_t)lr->token_stride : hd;
	int32_t *idx = malloc((sum ? sum : 1) * sizeof(int32_t));
	int32_t *kc = malloc(hs * sizeof(int32_t));
	if (!idx || !kc) {
		free(idx);
		free(kc);
		return skv_st__fail(err, -ENOMEM, "out of memory");
	}
	packed[(*n_packed)++] = idx;
	packed[(*n_packed)++] = kc;
	const void *src[2] = {lr->k, lr->v};
	void *dst[2] = {NULL, NULL};
	for (int j = 0; j < 2; j++) {
		uint8_t *o = malloc(sum * hd * es + 1);
		if (!o)
			return skv_st__fail(err, -ENOMEM, "out of memory");
		packed[(*n_packed)++] = o;
		dst[j] = o;
		for (uint64_t h = 0, row = 0; h < hs; h++)
			for (uint64_t i = 0; i < lr->kept[h]; i++, row++)
				memcpy(o + row * hd * es,
				       (const uint8_t *)src[j] +
					   (h * (uint64_t)lr->head_stride + i * tst) * es,
				       hd * es);
	}
	for (uint64_t h = 0, row = 0; h < hs; h++) {
		kc[h] = (int32_t)lr->kept[h];
		memcpy(idx + row, lr->positions + h * lr->pos_stride,
		       lr->kept[h] * sizeof(int32_t));
		row += lr->kept[h];
	}
	for (int j = 0; j < 2; j++)
		t[j] = (struct skv_st_tensor){
		    .name = nmv[j], .dtype = st_dt, .rank = 2, .shape = {sum, hd}, .data = dst[j]};
	t[2] = (struct skv_st_tensor){
	    .name = nmv[2], .dtype = SKV_ST_I32, .rank = 1, .shape = {sum}, .data = idx};
	t[3] = (struct skv_st_tensor){.name = nmv[3],
				      .dtype = SKV_ST_F32,
				      .rank = 1,
				      .shape = {hs},
				      .data = lr->retained_mass};
	t[4] = (struct skv_st_tensor){
	    .name = nmv[4], .dtype = SKV_ST_I32, .rank = 1, .shape = {hs}, .data = kc};
	return 0;
}

/* The file's metadata of d into meta/vals (*ret_nm entries; *lst, when
 * set, holds the budget's layer list for the caller to free) and the
 * file's dtype. 0 or -errno with err set. */
static int compact_meta(const struct skv_st_compact_desc *d, struct skv_st_meta *meta,
			char (*vals)[META_VAL], size_t *ret_nm, char **lst,
			enum skv_st_dtype *ret_dt, struct skv_st_error *err)
{
	enum skv_st_dtype st_dt;
	size_t nm = 0;
	int r;

	const char *pol = skv_st_policy_name(d->params.policy);
	const char *pool = skv_st_pooling_name(d->params.pooling);
	const char *gqa = skv_st_gqa_name(d->params.gqa);
	const char *dtn = skv_dtype_name(d->dtype);
	if (!pol || !pool || !gqa || !dtn)
		return skv_st__fail(err, -EINVAL, "unknown policy, pooling, gqa mode or dtype");
	switch (d->dtype) {
	case SKV_DTYPE_F32:
		st_dt = SKV_ST_F32;
		break;
	case SKV_DTYPE_F16:
		st_dt = SKV_ST_F16;
		break;
	case SKV_DTYPE_F8E4M3FN:
		st_dt = SKV_ST_F8_E4M3;
		break;
	case SKV_DTYPE_F8E5M2:
		st_dt = SKV_ST_F8_E5M2;
		break;
	default:
		st_dt = SKV_ST_BF16;
		break;
	}
	if (d->params.n_protected > SKV_MAX_PROTECTED || d->ledger.native_full == 0)
		return skv_st__fail(err, -EINVAL, "invalid protected ranges or ledger");

#define META(k, ...)                                                                               \
	do {                                                                                       \
		snprintf(vals[nm], META_VAL, __VA_ARGS__);                                         \
		meta[nm].key = (k);                                                                \
		meta[nm].value = vals[nm];                                                         \
		nm++;                                                                              \
	} while (0)

	META("format", "snapkv-compact");
	META("version", "1");
	META("policy", "%s", pol);
	META("window", "%" PRIu32, d->params.window);
	META("capacity", "%" PRIu32, d->params.capacity);
	META("kernel", "%" PRIu32, d->params.kernel);
	META("pooling", "%s", pool);
	META("gqa", "%s", gqa);
	META("sinks", "%" PRIu32, d->params.sinks);
	{
		/* Half-open ranges "A:B,C:D", empty when none. */
		size_t o = 0;
		vals[nm][0] = '\0';
		for (uint32_t i = 0; i < d->params.n_protected && o < META_VAL; i++)
			o += (size_t)snprintf(vals[nm] + o, META_VAL - o, "%s%" PRIu32 ":%" PRIu32,
					      i ? "," : "", d->params.protected_ranges[i].begin,
					      d->params.protected_ranges[i].end);
		if (o >= META_VAL)
			return skv_st__fail(err, -EINVAL, "protected ranges too long for metadata");
		meta[nm].key = "protected";
		meta[nm].value = vals[nm];
		nm++;
	}
	META("L", "%" PRIu32, d->shape.prompt_len);
	META("layers", "%" PRIu32, d->n_layers);
	META("h_q", "%" PRIu32, d->shape.h_q);
	META("h_kv", "%" PRIu32, d->shape.h_kv);
	META("head_dim", "%" PRIu32, d->shape.head_dim);
	META("n_q", "%" PRIu32, d->shape.n_q);
	META("dtype", "%s", dtn);
	META("h_store", "%" PRIu32, d->plan.h_store);
	META("kept", "%" PRIu32, d->plan.kept);
	META("bypass", "%d", d->plan.bypass ? 1 : 0);
	META("plan.sinks", "%" PRIu32, d->plan.sinks);
	META("plan.w_obs", "%" PRIu32, d->plan.w_obs);
	META("plan.w_keep", "%" PRIu32, d->plan.w_keep);
	META("ledger.batch", "1");
	META("ledger.appended", "0");
	META("ledger.native_full", "%" PRIu64, d->ledger.native_full);
	META("ledger.compact", "%" PRIu64, d->ledger.compact);
	META("ledger.index", "%" PRIu64, d->ledger.index);
	META("ledger.reserved", "%" PRIu64, d->ledger.reserved);
	META("ledger.ratio", "%.6f", (double)d->ledger.compact / (double)d->ledger.native_full);
	{
		uint64_t g = gcd_u64(d->ledger.compact, d->ledger.native_full);
		META("ledger.ratio_exact", "%" PRIu64 "/%" PRIu64, d->ledger.compact / g,
		     d->ledger.native_full / g);
	}
	if (d->out_block_size) { /* dense files stay as they were */
		META("out_layout", "paged");
		META("block_size", "%" PRIu32, d->out_block_size);
	}
	r = budget_meta(d, meta, vals, &nm, lst);
	if (r < 0)
		return skv_st__fail(err, r, "budget parameters do not fit the metadata");
#undef META
	*ret_nm = nm;
	*ret_dt = st_dt;
	return 0;
}

/* A layer whose heads keep one count: K/V [h_store, kept, D] (paged:
 * [blocks, block_size, h_store, D]), indices [h_store, kept] and retained
 * mass into t[0..3], repacked into packed[] where strided. */
static int dense_layer(const struct skv_st_compact_desc *d, const struct skv_st_layer_result *lr,
		       uint32_t i, struct skv_st_tensor *t, char (*nmv)[32], void **packed,
		       size_t *np, enum skv_st_dtype st_dt, float *nan_mass,
		       struct skv_st_error *err)
{
	uint64_t hs = d->plan.h_store, hd = d->shape.head_dim;
	int r;

	uint64_t kept = lr->kept ? lr->kept[0] : d->plan.kept;
	for (uint64_t h = 1; lr->kept && h < hs; h++)
		if (lr->kept[h] != kept)
			return skv_st__fail(err, -EINVAL,
					    "layer %" PRIu32 ": heads keep different counts in "
					    "budget mode %s",
					    i, skv_budget_name(d->params.budget_mode));
	const void *kv[2] = {lr->k, lr->v};
	const int32_t *pos = lr->positions;
	if (!d->out_block_size && !is_packed(lr, kept, hd)) {
		for (int j = 0; j < 2; j++) {
			if (!kv[j])
				continue;
			r = pack_kv(kv[j], lr, hs, kept, hd, skv_dtype_size(d->dtype),
				    &packed[*np]);
			if (r < 0)
				return skv_st__fail(err, r, "out of memory");
			kv[j] = packed[(*np)++];
		}
	}
	if (pos && lr->pos_stride && lr->pos_stride != kept) {
		uint64_t n = hs * kept;
		int32_t *pp = malloc((n > 0 ? n : 1) * sizeof(int32_t));
		if (!pp)
			return skv_st__fail(err, -ENOMEM, "out of memory");
		for (uint64_t h = 0; h < hs; h++)
			memcpy(pp + h * kept, pos + h * lr->pos_stride, kept * sizeof(int32_t));
		packed[(*np)++] = pp;
		pos = pp;
	}
	for (int j = 0; j < 2; j++) {
		t[j] = (struct skv_st_tensor){.name = nmv[j],
					      .dtype = st_dt,
					      .rank = 3,
					      .shape = {hs, kept, hd},
					      .data = kv[j]};
		if (d->out_block_size) {
			uint64_t bs = d->out_block_size;

			t[j].rank = 4;
			t[j].shape[0] = (kept + bs - 1) / bs;
			t[j].shape[1] = bs;
			t[j].shape[2] = hs;
			t[j].shape[3] = hd;
		}
	}
	t[2] = (struct skv_st_tensor){
	    .name = nmv[2], .dtype = SKV_ST_I32, .rank = 2, .shape = {hs, kept}, .data = pos};
	t[3] = (struct skv_st_tensor){.name = nmv[3],
				      .dtype = SKV_ST_F32,
				      .rank = 1,
				      .shape = {hs},
				      .data = lr->retained_mass ? lr->retained_mass : nan_mass};
	return 0;
}

int skv_st_write_compact(const char *path, const struct skv_st_compact_desc *d,
			 const struct skv_st_layer_result *layers, struct skv_st_error *err)
{
	struct skv_st_meta meta[N_META];
	char vals[N_META][META_VAL];
	struct skv_st_tensor *ts = NULL;
	char(*names)[32] = NULL;
	char *lst = NULL;
	float *nan_mass = NULL;
	void **packed = NULL;
	size_t nm = 0, n_packed = 0;
	enum skv_st_dtype st_dt = SKV_ST_F32;
	int r;

	if (!d || !layers || d->n_layers == 0)
		return skv_st__fail(err, -EINVAL, "no layers to write");
	r = compact_meta(d, meta, vals, &nm, &lst, &st_dt, err);
	if (r < 0)
		goto out;

	uint64_t hs = d->plan.h_store;
	const bool ragged = skv_st_budget_ragged(d->params.budget_mode);
	const bool f8 = skv_dtype_is_fp8(d->dtype);
	if (f8 && !d->kv_scales) {
		r = skv_st__fail(err, -EINVAL, "fp8 K/V without their scales");
		goto out;
	}
	size_t nt = (size_t)d->n_layers * 7;
	ts = calloc(nt, sizeof(*ts));
	names = calloc(nt, sizeof(*names));
	packed = calloc(nt + 1, sizeof(*packed));
	nan_mass = malloc((hs ? hs : 1) * sizeof(float));
	if (!ts || !names || !packed || !nan_mass) {
		r = skv_st__fail(err, -ENOMEM, "out of memory");
		goto out;
	}
	for (uint64_t h = 0; h < hs; h++)
		nan_mass[h] = NAN;
	size_t ti = 0;
	for (uint32_t i = 0; i < d->n_layers; i++) {
		const struct skv_st_layer_result *lr = &layers[i];
		struct skv_st_tensor *t = &ts[ti];
		char(*nmv)[32] = &names[ti];
		snprintf(nmv[0], 32, "layers.%" PRIu32 ".k", i);
		snprintf(nmv[1], 32, "layers.%" PRIu32 ".v", i);
		snprintf(nmv[2], 32, "layers.%" PRIu32 ".indices", i);
		snprintf(nmv[3], 32, "layers.%" PRIu32 ".retained_mass", i);
		snprintf(nmv[4], 32, "layers.%" PRIu32 ".kept", i);
		if (lr->head_stride < 0 || lr->token_stride < 0) {
			r = skv_st__fail(err, -EINVAL, "layer %" PRIu32 ": negative stride", i);
			goto out;
		}
		if (ragged) {
			r = ragged_layer(d, lr, i, t, nmv, packed, &n_packed, st_dt, err);
			if (r < 0)
				goto out;
			if (!t[3].data)
				t[3].data = nan_mass;
			ti += 5;
		} else {
			r = dense_layer(d, lr, i, t, nmv, packed, &n_packed, st_dt, nan_mass, err);
			if (r < 0)
				goto out;
			ti += 4;
		}
		for (int s = 0; f8 && s < 2; s++, ti++) { /* the scales of the fp8 bytes */
			snprintf(names[ti], 32, "layers.%" PRIu32 ".%s", i,
				 s ? "v_scale" : "k_scale");
			ts[ti] = (struct skv_st_tensor){.name = names[ti],
							.dtype = SKV_ST_F32,
							.rank = 1,
							.shape = {1},
							.data = &d->kv_scales[2 * i + s]};
		}
	}
	nt = ti;
	r = skv_st_write(path, ts, nt, meta, nm, err);
out:
	for (size_t i = 0; i < n_packed; i++)
		free(packed[i]);
	free(packed);
	free(ts);
	free(names);
	free(nan_mass);
	free(lst);
	return r;
}

int skv_st_compact_desc_init(struct skv_st_compact_desc *ret_desc, const struct skv_params *params,
			     const struct skv_shape *shape, enum skv_dtype dtype, uint32_t n_layers,
			     struct skv_error *err)
{
	struct skv_st_compact_desc d = {0};
	int r;

	if (!ret_desc || !params || !shape || n_layers == 0 || !skv_dtype_size(dtype)) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "no layers, or unknown dtype");
		return -EINVAL;
	}
	r = skv_plan(shape, params, &d.plan, err);
	if (r < 0)
		return r;
	struct skv_ledger_in li = {
	    .batch = 1,
	    .layers = n_layers,
	    .h_q = shape->h_q,
	    .h_kv = shape->h_kv,
	    .head_dim = shape->head_dim,
	    .dtype_bytes = skv_dtype_size(dtype),
	    .prompt_len = shape->prompt_len,
	    .capacity = params->capacity,
	    .appended = 0,
	    .reserve = 0,
	    .gqa = params->gqa,
	};
	r = skv_ledger_compute(&li, &d.ledger);
	if (r < 0) {
		if (err)
			snprintf(err->msg, sizeof(err->msg), "ledger: %s",
				 r == -EOVERFLOW ? "byte counts overflow 64 bits"
						 : "invalid sizes");
		return r;
	}
	d.params = *params;
	if (params->params_size != sizeof(*params)) {
		/* a V1 caller: its struct ends before the budget fields */
		skv_params_init(&d.params);
		memcpy(&d.params, params, SKV_PARAMS_SIZE_V1);
		d.params.params_size = sizeof(d.params);
	}
	d.c_star = d.params.budget_mode == SKV_BUDGET_UNIFORM ? d.params.capacity : 0;
	d.shape = *shape;
	d.dtype = dtype;
	d.n_layers = n_layers;
	*ret_desc = d;
	return 0;
}

int skv_st_compact_desc_budget(struct skv_st_compact_desc *d, const uint32_t *kept, uint32_t c_star,
			       int fallback)
{
	if (!d || !kept)
		return -EINVAL;
	struct skv_ledger_in li = {
	    .batch = 1,
	    .layers = d->n_layers,
	    .h_q = d->shape.h_q,
	    .h_kv = d->shape.h_kv,
	    .head_dim = d->shape.head_dim,
	    .dtype_bytes = skv_dtype_size(d->dtype),
	    .prompt_len = d->shape.prompt_len,
	    .capacity = d->params.capacity,
	    .gqa = d->params.gqa,
	};
	int r = skv_ledger_sum(&li, kept, (uint64_t)d->n_layers * d->plan.h_store, &d->ledger);
	if (r < 0)
		return r;
	d->c_star = c_star;
	d->fallback = fallback ? 1 : 0;
	return 0;
}
