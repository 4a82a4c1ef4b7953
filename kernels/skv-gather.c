// SPDX-License-Identifier: MIT
/*
 * skv-gather.c - tensor checks and the gather: kept K/V rows copied (or converted)
 * into the outputs with their positions and retained mass.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "skv-driver.h"

/* Elements one block spans: its rows and heads, each D long. */
static uint64_t block_extent(const struct skv_tensor *t, uint32_t heads, uint32_t D)
{
	return (uint64_t)(t->block_size - 1) * (uint64_t)t->token_stride +
	       (uint64_t)(heads - 1) * (uint64_t)t->head_stride + D;
}

/*
 * A paged output (the engine's block format): the table's first `need`
 * entries name blocks of a pool of pool_blocks, each block holds
 * block_size rows of `heads` heads without two (row, head) pairs meeting,
 * and blocks do not overlap one another. Which blocks are distinct (and K
 * apart from V, layers apart) is skv_check_paged_disjoint()'s.
 */
static int check_paged_out(const struct skv_tensor *t, const char *what, uint32_t layer,
			   uint32_t heads, uint32_t D, uint64_t need, uint32_t pool_blocks,
			   struct skv_error *err)
{
	const int32_t lay = (int32_t)layer;

	if (pool_blocks == 0)
		return skv_fail(err, lay, -1, "layer %u: %s is paged but pool_blocks is 0", layer,
				what);
	for (uint64_t b = skv_in_place_blocks(t, need); b < need; b++)
		if ((uint32_t)t->block_table[b] >= pool_blocks)
			return skv_fail(err, lay, -1,
					"layer %u: %s block_table[%llu] = %d is outside the pool "
					"of %u blocks",
					layer, what, (unsigned long long)b, t->block_table[b],
					pool_blocks);
	if (t->head_stride < 0 || t->token_stride < 0 || t->block_stride < 0)
		return skv_fail(err, lay, -1, "layer %u: paged %s needs non-negative strides",
				layer, what);
	/* (stride, count) of dim, head and row within a block, by stride: each
	 * stride must clear what the smaller ones span, so no two slots meet */
	uint64_t st[3] = {1, (uint64_t)t->head_stride, (uint64_t)t->token_stride};
	uint64_t cnt[3] = {D, heads, t->block_size};
	for (int i = 1; i < 3; i++)
		for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
			uint64_t a = st[j], c = cnt[j];
			st[j] = st[j - 1];
			cnt[j] = cnt[j - 1];
			st[j - 1] = a;
			cnt[j - 1] = c;
		}
	uint64_t span = 0;
	for (int i = 0; i < 3; i++) {
		if (cnt[i] <= 1)
			continue;
		if (st[i] <= span)
			return skv_fail(err, lay, -1,
					"layer %u: paged %s strides (head %lld, token %lld) make "
					"two slots of a block meet",
					layer, what, (long long)t->head_stride,
					(long long)t->token_stride);
		span += st[i] * (cnt[i] - 1);
	}
	return 0;
}

int skv_check_tensor(const struct skv_tensor *t, const char *what, uint32_t layer, uint32_t heads,
		     uint32_t tokens, uint32_t D, const struct skv_layer_out *out,
		     struct skv_error *err)
{
	if (!t->data)
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has no data", layer, what);
	if (!skv_dtype_size(t->dtype))
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has unknown dtype %d", layer,
				what, (int)t->dtype);
	/* an output's scale is its input's, kept by the caller: not read */
	if (skv_dtype_is_fp8(t->dtype) && !out && !(t->scale > 0.0f && t->scale < INFINITY))
		return skv_fail(err, (int32_t)layer, -1,
				"layer %u: %s is %s with scale %g: it must be finite and above 0",
				layer, what, skv_dtype_name(t->dtype), (double)t->scale);
	if (heads > 1 && t->head_stride == 0)
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has head_stride 0", layer,
				what);
	if (tokens > 1 && t->token_stride == 0 && (!t->block_table || t->block_size > 1))
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has token_stride 0", layer,
				what);
	if (!t->block_table)
		return 0;
	if (t->block_size == 0)
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has block_size 0", layer,
				what);
	uint64_t need = ((uint64_t)tokens + t->block_size - 1) / t->block_size;
	if (need > t->n_blocks)
		return skv_fail(err, (int32_t)layer, -1,
				"layer %u: %s needs %llu blocks for %u tokens, table has %u", layer,
				what, (unsigned long long)need, tokens, t->n_blocks);
	/* an output's leading SKV_BLOCK_IN_PLACE entries are not written */
	for (uint64_t b = out ? skv_in_place_blocks(t, need) : 0; b < need; b++)
		if (t->block_table[b] < 0)
			return skv_fail(err, (int32_t)layer, -1,
					"layer %u: %s block_table[%llu] = %d is negative%s", layer,
					what, (unsigned long long)b, t->block_table[b],
					out && t->block_table[b] == SKV_BLOCK_IN_PLACE
					    ? " (in-place blocks only lead the table)"
					    : "");
	if (out)
		return check_paged_out(t, what, layer, heads, D, need, out->pool_blocks, err);
	return 0;
}

/*
 * Output intervals of the paged outputs: [begin, end) bytes of every block a
 * call writes, K and V of all layers, and whether two of them meet.
 */
struct span {
	uintptr_t begin, end;
	uint32_t layer;
	const char *what;
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

int skv_check_paged_disjoint(uint32_t n_layers, const struct skv_layer_out *out,
			     const uint32_t *rows, uint32_t heads, uint32_t D,
			     struct skv_error *err)
{
	size_t n = 0, cap = 0;

	for (uint32_t l = 0; l < n_layers; l++) {
		if (out[l].k.block_table)
			cap += ((size_t)rows[l] + out[l].k.block_size - 1) / out[l].k.block_size;
		if (out[l].v.block_table)
			cap += ((size_t)rows[l] + out[l].v.block_size - 1) / out[l].v.block_size;
	}
	if (cap == 0)
		return 0;
	struct span *sp = malloc(cap * sizeof(*sp));
	if (!sp)
		return skv_fail(err, -1, -1, "out of memory checking the output blocks"), -ENOMEM;
	for (uint32_t l = 0; l < n_layers; l++)
		for (int kv = 0; kv < 2; kv++) {
			const struct skv_tensor *t = kv ? &out[l].v : &out[l].k;
			if (!t->block_table)
				continue;
			size_t es = skv_dtype_size(t->dtype);
			uint64_t ext = block_extent(t, heads, D) * es;
			uint64_t need = ((uint64_t)rows[l] + t->block_size - 1) / t->block_size;
			for (uint64_t b = skv_in_place_blocks(t, need); b < need; b++) {
				uintptr_t a =
				    (uintptr_t)t->data + (uintptr_t)((int64_t)t->block_table[b] *
								     t->block_stride * (int64_t)es);
				sp[n++] =
				    (struct span){a, a + ext, l, kv ? "output v" : "output k"};
			}
		}
	qsort(sp, n, sizeof(*sp), span_cmp);
	int r = 0;
	for (size_t i = 1; i < n && !r; i++)
		if (sp[i].begin < sp[i - 1].end)
			r = skv_fail(err, (int32_t)sp[i].layer, -1,
				     "layer %u: a block of %s overlaps a block of layer %u's %s "
				     "(two output slots in the same place)",
				     sp[i].layer, sp[i].what, sp[i - 1].layer, sp[i - 1].what);
	free(sp);
	return r;
}

/* ---------------------------------------------------------------- gather */

/* rows of K and V prefetched ahead of the one being copied */
#define SKV_GATHER_AHEAD 4

static void copy_row(const struct skv_isa *isa, float *tmp, const void *src, enum skv_dtype sdt,
		     void *dst, enum skv_dtype ddt, uint32_t D)
{
	if (sdt == ddt) {
		isa->copy(dst, src, (size_t)D * skv_dtype_size(sdt));
		return;
	}
	isa->to_f32(src, sdt, tmp, D);
	if (ddt == SKV_DTYPE_F32) {
		memcpy(dst, tmp, (size_t)D * 4);
	} else if (ddt == SKV_DTYPE_F16) {
		uint16_t *o = dst;
		for (uint32_t d = 0; d < D; d++)
			o[d] = skv_f32_to_f16(tmp[d]);
	} else {
		uint16_t *o = dst;
		for (uint32_t d = 0; d < D; d++)
			o[d] = skv_f32_to_bf16(tmp[d]);
	}
}

void skv_emit(const struct skv_job *jb, struct skv_ws *w, uint32_t layer, uint32_t kvh, uint32_t h,
	      const int32_t *pos, uint32_t cnt, float mass)
{
	const struct skv_layer_in *in = &jb->in[layer];
	const struct skv_layer_out *out = &jb->out[layer];
	const uint32_t D = jb->sh->head_dim;
	size_t kes = skv_dtype_size(in->k.dtype), ves = skv_dtype_size(in->v.dtype);
	size_t oks = skv_dtype_size(out->k.dtype), ovs = skv_dtype_size(out->v.dtype);

	for (uint32_t i = 0; i < cnt; i++) {
		uint32_t t = (uint32_t)pos[i];
		/* the kept rows are scattered: fetch a few rows ahead, as the
		 * hardware prefetchers do not follow such a pattern */
		if (i + SKV_GATHER_AHEAD < cnt) {
			uint32_t ta = (uint32_t)pos[i + SKV_GATHER_AHEAD];
			const char *ka = skv_elem(&in->k, kvh, ta, kes);
			const char *va = skv_elem(&in->v, kvh, ta, ves);
			for (size_t b = 0; b < D * kes; b += 64)
				__builtin_prefetch(ka + b, 0, 0);
			for (size_t b = 0; b < D * ves; b += 64)
				__builtin_prefetch(va + b, 0, 0);
		}
		out->positions[(size_t)h * out->pos_stride + i] = pos[i];
		/* a paged output's in-place block: its rows are there already */
		if (out->k.block_table && out->k.block_table[i / out->k.block_size] < 0)
			continue;
		copy_row(jb->isa, w->rowbuf, skv_elem(&in->k, kvh, t, kes), in->k.dtype,
			 (void *)skv_elem(&out->k, h, i, oks), out->k.dtype, D);
		copy_row(jb->isa, w->rowbuf, skv_elem(&in->v, kvh, t, ves), in->v.dtype,
			 (void *)skv_elem(&out->v, h, i, ovs), out->v.dtype, D);
	}
	if (out->retained_mass)
		out->retained_mass[h] = mass;
	if (jb->kept_all) {
		jb->kept_all[(size_t)layer * jb->h_store + h] = cnt;
		jb->mass_all[(size_t)layer * jb->h_store + h] = mass;
	}
}
