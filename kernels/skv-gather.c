// SPDX-License-Identifier: MIT
/*
 * skv-gather.c - tensor checks and the gather: kept K/V rows copied (or converted)
 * into the outputs with their positions and retained mass.
 */
#include <string.h>

#include "skv-driver.h"

int skv_check_tensor(const struct skv_tensor *t, const char *what, uint32_t layer, uint32_t heads,
		     uint32_t tokens, bool out, struct skv_error *err)
{
	if (!t->data)
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has no data", layer, what);
	if (!skv_dtype_size(t->dtype))
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has unknown dtype %d", layer,
				what, (int)t->dtype);
	if (heads > 1 && t->head_stride == 0)
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has head_stride 0", layer,
				what);
	if (tokens > 1 && t->token_stride == 0 && (!t->block_table || t->block_size > 1))
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has token_stride 0", layer,
				what);
	if (!t->block_table)
		return 0;
	if (out)
		return skv_fail(err, (int32_t)layer, -1,
				"layer %u: %s must be strided (no block table)", layer, what);
	if (t->block_size == 0)
		return skv_fail(err, (int32_t)layer, -1, "layer %u: %s has block_size 0", layer,
				what);
	uint64_t need = ((uint64_t)tokens + t->block_size - 1) / t->block_size;
	if (need > t->n_blocks)
		return skv_fail(err, (int32_t)layer, -1,
				"layer %u: %s needs %llu blocks for %u tokens, table has %u", layer,
				what, (unsigned long long)need, tokens, t->n_blocks);
	for (uint64_t b = 0; b < need; b++)
		if (t->block_table[b] < 0)
			return skv_fail(err, (int32_t)layer, -1,
					"layer %u: %s block_table[%llu] = %d is negative", layer,
					what, (unsigned long long)b, t->block_table[b]);
	return 0;
}

/* ---------------------------------------------------------------- gather */

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
		out->positions[(size_t)h * out->pos_stride + i] = pos[i];
		copy_row(jb->isa, w->rowbuf, skv_elem(&in->k, kvh, t, kes), in->k.dtype,
			 (void *)skv_elem(&out->k, h, i, oks), out->k.dtype, D);
		copy_row(jb->isa, w->rowbuf, skv_elem(&in->v, kvh, t, ves), in->v.dtype,
			 (void *)skv_elem(&out->v, h, i, ovs), out->v.dtype, D);
	}
	if (out->retained_mass)
		out->retained_mass[h] = mass;
}
