/* SPDX-License-Identifier: MIT */
/*
 * skv-internal.h - what the generic driver (skv-driver.h) and the per-ISA kernels
 * (skv-scalar.c, skv-avx2.c, skv-avx512.c) share. Not installed.
 *
 * Scoring of one work item (one layer, one K/V head, its G query heads)
 * streams over key tiles of SKV_TILE keys. Rows (query rows of all G heads)
 * lie in the lanes of vectors: the packed query block is Qt[d][rbp] and the
 * logit buffer is key-major, z[j][rbp]. A tile pass computes the logits of
 * SKV_TILE keys for every row, runs one step of an online softmax per row
 * (running max m, running sum s) and overwrites the logits with
 * exp(z - m_tile), recording m_tile. Once every tile is done, factors turn
 * m_tile into exp(m_tile - m) / s, and the votes pass sums e * factor over
 * the rows of each query head: one matrix product of the keys, never two.
 */
#ifndef SKV_INTERNAL_H
#define SKV_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "skv.h"

/* Keys per tile: a multiple of every micro-kernel's key count (6 and 8). */
#define SKV_TILE 48
/* Rows are padded to a multiple of this (one AVX-512 vector of floats). */
#define SKV_ROWPAD 16

struct skv_tile_args {
	const float *qt;     /* [d][rbp] packed query rows of the block      */
	const float *kt;     /* [nk][d] keys j0 .. j0+nk-1, f32             */
	float *z;	     /* [nk][rbp]: logits out, then exp(z - m_tile) */
	float *m;	     /* [rbp] running max, -inf before the 1st tile */
	float *s;	     /* [rbp] running sum, 0 before the first tile  */
	float *tmax;	     /* [rbp] out: the max used for this tile       */
	uint8_t *bad;	     /* [rbp] set to 1 for a row with a NaN/Inf     */
	const int32_t *trow; /* [rbp] last key position each row may see    */
	uint32_t rbp;	     /* rows, a multiple of SKV_ROWPAD              */
	uint32_t d;	     /* head dim                                    */
	uint32_t nk;	     /* keys in this tile, 1 .. SKV_TILE            */
	uint32_t j0;	     /* position of the first key                   */
	float scale;	     /* 1 / sqrt(D) */
	int32_t trow_min;    /* min of trow: no masking at or below it */
	/* the next tile's key rows (may be ignored): fetched into L2 while this
	 * tile computes, so staging them does not wait for DRAM */
	const void *const *pf; /* [pf_n] row addresses              */
	uint32_t pf_n;	       /* rows, 0 .. SKV_TILE               */
	uint32_t pf_bytes;     /* bytes per row                     */
};

/* A run of consecutive rows that belong to one query head of the item. */
struct skv_seg {
	uint32_t g;	/* query head within the group, 0 .. G-1 */
	uint32_t begin; /* first row in the block                 */
	uint32_t end;	/* one past the last row                  */
};

struct skv_votes_args {
	const float *e; /* [ext][rbp] exp(z - m_tile)                      */
	const float *f; /* [ntiles][rbp] exp(m_tile - m) / s               */
	float *colsum;	/* [G][colsum_stride] += sum over rows of a[t][j]  */
	const struct skv_seg *segs;
	uint32_t n_segs;
	uint32_t rbp;
	uint32_t ext; /* keys 0 .. ext-1 */
	uint32_t colsum_stride;
};

struct skv_isa {
	const char *name;
	void (*tile)(const struct skv_tile_args *a);
	/* f[t][r] = exp(f[t][r] - m[r]) / s[r] for t < ntiles, r < rbp */
	void (*factors)(float *f, const float *m, const float *s, uint32_t ntiles, uint32_t rbp);
	void (*votes)(const struct skv_votes_args *a);
	/*
	 * Optional (NULL where the CPU lacks it): logits from bf16 pairs with
	 * a dot-product instruction. a->qt holds [d/2][rbp] 32-bit words of
	 * two bf16 (d even in the low half), a->kt [nk][d] raw bf16 keys.
	 * Same outputs as tile(), the dots accumulated in fp32 pair by pair:
	 * acc += q[d+1] k[d+1], then acc += q[d] k[d] (exact products, RNE).
	 */
	void (*tile_bf16)(const struct skv_tile_args *a);
	/* copy n bf16; false when one is subnormal (tile_bf16 would flush it) */
	bool (*stage_bf16)(uint16_t *dst, const uint16_t *src, uint32_t n);
	/* n elements of dtype dt at src to f32 */
	void (*to_f32)(const void *src, enum skv_dtype dt, float *dst, uint32_t n);
	/* copy of an output row; may use non-temporal stores (then fence()) */
	void (*copy)(void *dst, const void *src, size_t bytes);
	void (*fence)(void);
};

extern const struct skv_isa skv_isa_scalar;
extern const struct skv_isa skv_isa_avx2;
extern const struct skv_isa skv_isa_avx512;
extern const struct skv_isa skv_isa_avx512bf16;

/* Scalar exp for x <= ~88 with the kernels' polynomial; 0 below -87.3. */
float skv_expf(float x);

#endif /* SKV_INTERNAL_H */
