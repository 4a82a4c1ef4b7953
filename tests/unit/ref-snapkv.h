/* SPDX-License-Identifier: MIT */
/*
 * ref-snapkv.h - a plain scalar reference of ../shared/SPEC.md, written
 * from the spec alone (double precision, full sorts, no streaming), for the
 * kernel tests to compare libskv against.
 */
#ifndef REF_SNAPKV_H
#define REF_SNAPKV_H

#include <stdint.h>

#include "skv.h"

struct ref_result {
	uint32_t h_store;
	uint32_t kept;
	int32_t *pos;	/* [h_store][kept] ascending                          */
	double *mass;	/* [h_store]; NaN when no rows vote                   */
	double *score;	/* [h_store][L] pooled score, prefix only (else -1)   */
	double *thresh; /* [h_store] score of the worst position chosen by top-k
			   (+inf when top-k chose nothing, e.g. all kept)     */
	double *vote;	/* [h_store][L] mass share of every position: the
			   (group-mean) column sum over the rows, / rows; 0
			   when nothing was scored                            */
};

/*
 * q [h_q][n_q][D] (row i at position L - n_q + i), k [h_kv][L][D], all f32
 * values (already rounded to the storage dtype). Params are assumed valid.
 * Returns 0 or -1 (out of memory).
 */
int ref_compact(const struct skv_shape *sh, const struct skv_params *p, const float *q,
		const float *k, struct ref_result *res);
void ref_result_free(struct ref_result *res);

/*
 * SPEC.md "Quantized K/V (fp8)": the value of fp8 byte b of dtype dt in a
 * tensor of scale s, as the reference's keys take it: the byte decoded from
 * the format's definition (OCP E4M3: bias 7, no inf, S.1111.111 NaN; E5M2:
 * bias 15, IEEE inf and NaN), exactly, then multiplied by s in fp32.
 */
float ref_fp8_dequant(enum skv_dtype dt, uint8_t b, float s);

#endif
