// SPDX-License-Identifier: MIT
/*
 * ref-snapkv.c - the reference: every step of SPEC.md done the obvious way.
 * Slow on purpose (O(rows * L * D) per head, qsort for top-k).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref-snapkv.h"

struct cand {
	double s;
	uint32_t j;
};

static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->s != y->s)
		return x->s > y->s ? -1 : 1;
	return x->j < y->j ? -1 : (x->j > y->j);
}

/* colsum[j] += sum over rows t of softmax weight a[t][j] for query head h */
static void head_weights(const struct skv_shape *sh, const float *q, const float *k, uint32_t h,
			 uint32_t rows, double *colsum)
{
	uint32_t L = sh->prompt_len, D = sh->head_dim, G = sh->h_q / sh->h_kv;
	const float *kh = k + (size_t)(h / G) * L * D;
	double *z = malloc(sizeof(double) * L);

	for (uint32_t i = 0; i < rows; i++) {
		uint32_t t = L - rows + i;
		const float *qr = q + ((size_t)h * sh->n_q + (sh->n_q - rows + i)) * D;
		double mx = -INFINITY, sum = 0;
		for (uint32_t j = 0; j <= t; j++) {
			double acc = 0;
			for (uint32_t d = 0; d < D; d++)
				acc += (double)qr[d] * kh[(size_t)j * D + d];
			z[j] = acc / sqrt((double)D);
			if (z[j] > mx)
				mx = z[j];
		}
		for (uint32_t j = 0; j <= t; j++)
			sum += exp(z[j] - mx);
		for (uint32_t j = 0; j <= t; j++)
			colsum[j] += exp(z[j] - mx) / sum;
	}
	free(z);
}

int ref_compact(const struct skv_shape *sh, const struct skv_params *p, const float *q,
		const float *k, struct ref_result *res)
{
	uint32_t L = sh->prompt_len, C = p->capacity, G = sh->h_q / sh->h_kv;
	int expand = p->gqa == SKV_GQA_EXPAND;
	int scoring = p->policy == SKV_POLICY_SNAPKV || p->policy == SKV_POLICY_H2O;

	memset(res, 0, sizeof(*res));
	res->h_store = expand ? sh->h_q : sh->h_kv;
	res->kept = L < C ? L : C;
	res->pos = calloc((size_t)res->h_store * res->kept + 1, sizeof(int32_t));
	res->mass = calloc(res->h_store, sizeof(double));
	res->score = calloc((size_t)res->h_store * L, sizeof(double));
	res->thresh = calloc(res->h_store, sizeof(double));
	res->vote = calloc((size_t)res->h_store * L, sizeof(double));
	double *cs = calloc((size_t)G * L, sizeof(double));
	double *v = calloc(L, sizeof(double));
	char *keep = calloc(L, 1);
	struct cand *cd = calloc(L, sizeof(*cd));
	if (!res->pos || !res->mass || !res->score || !res->thresh || !res->vote || !cs || !v ||
	    !keep || !cd)
		goto nomem;

	/* SPEC.md "Partial window": snapkv given n_q < W rows runs with W' =
	 * n_q in place of W everywhere (the rows that vote and the kept window) */
	uint32_t W = p->policy == SKV_POLICY_SNAPKV && sh->n_q < p->window ? sh->n_q : p->window;
	uint32_t rows = p->policy == SKV_POLICY_SNAPKV ? W
			: p->policy == SKV_POLICY_H2O  ? L
						       : sh->n_q;
	uint32_t wkeep = scoring ? W : 0;
	uint32_t S = p->policy == SKV_POLICY_STREAMINGLLM ? p->sinks : 0;
	uint32_t P = L - wkeep;
	uint32_t kern = p->policy == SKV_POLICY_H2O ? 1 : p->kernel;

	for (uint32_t hs = 0; hs < res->h_store; hs++) {
		int32_t *out = res->pos + (size_t)hs * res->kept;
		double *sc = res->score + (size_t)hs * L;
		res->thresh[hs] = INFINITY;
		for (uint32_t j = 0; j < L; j++)
			sc[j] = -1;
		if (L < C) { /* bypass */
			for (uint32_t j = 0; j < L; j++)
				out[j] = (int32_t)j;
			res->mass[hs] = 1.0;
			continue;
		}
		/* per query head column sums of the weights */
		uint32_t nh = expand ? 1 : G;
		memset(cs, 0, sizeof(double) * G * L);
		for (uint32_t g = 0; g < nh && rows; g++) {
			uint32_t h = expand ? hs : hs * G + g;
			head_weights(sh, q, k, h, rows, cs + (size_t)g * L);
		}
		memset(keep, 0, L);
		for (uint32_t j = 0; j < S && j < L; j++)
			keep[j] = 1;
		for (uint32_t j = P; j < L; j++)
			keep[j] = 1;
		for (uint32_t i = 0; i < p->n_protected; i++)
			for (uint32_t j = p->protected_ranges[i].begin;
			     j < p->protected_ranges[i].end; j++)
				keep[j] = 1;
		uint32_t nk = 0;
		for (uint32_t j = 0; j < L; j++)
			nk += keep[j];
		if (scoring) {
			/* votes: mean over the group of per-head sums over the window rows */
			for (uint32_t j = 0; j < P; j++) {
				double a = 0;
				for (uint32_t g = 0; g < nh; g++)
					a += cs[(size_t)g * L + j];
				v[j] = a / nh;
			}
			int h = (int)kern / 2;
			for (int j = 0; j < (int)P; j++) {
				double a = 0, mx = -INFINITY;
				for (int i = j - h; i <= j + h; i++) {
					double x = (i >= 0 && i < (int)P) ? v[i] : 0.0;
					a += x;
					if (i >= 0 && i < (int)P && x > mx)
						mx = x;
				}
				sc[j] = kern == 1		     ? v[j]
					: p->pooling == SKV_POOL_AVG ? a / kern
								     : mx;
			}
			uint32_t n = 0;
			for (uint32_t j = 0; j < P; j++)
				if (!keep[j])
					cd[n++] = (struct cand){sc[j], j};
			qsort(cd, n, sizeof(*cd), cand_cmp);
			uint32_t take = C - nk;
			if (take > n)
				take = n;
			for (uint32_t i = 0; i < take; i++)
				keep[cd[i].j] = 1;
			if (take && take < n)
				res->thresh[hs] = cd[take - 1].s;
		} else {
			uint32_t fill = C - nk;
			for (uint32_t j = L; j-- > 0 && fill;)
				if (!keep[j]) {
					keep[j] = 1;
					fill--;
				}
		}
		uint32_t c = 0;
		for (uint32_t j = 0; j < L; j++)
			if (keep[j])
				out[c++] = (int32_t)j;
		if (!rows) {
			res->mass[hs] = NAN;
			continue;
		}
		for (uint32_t j = 0; j < L; j++) {
			double a = 0;
			for (uint32_t g = 0; g < nh; g++)
				a += cs[(size_t)g * L + j];
			res->vote[(size_t)hs * L + j] = a / nh / rows;
		}
		double m = 0;
		for (uint32_t g = 0; g < nh; g++) {
			double mg = 0;
			for (uint32_t j = 0; j < L; j++)
				if (keep[j])
					mg += cs[(size_t)g * L + j];
			m += mg / rows;
		}
		res->mass[hs] = m / nh;
	}
	free(cs);
	free(v);
	free(keep);
	free(cd);
	return 0;
nomem:
	free(cs);
	free(v);
	free(keep);
	free(cd);
	ref_result_free(res);
	return -1;
}

void ref_result_free(struct ref_result *res)
{
	free(res->pos);
	free(res->mass);
	free(res->score);
	free(res->thresh);
	free(res->vote);
	memset(res, 0, sizeof(*res));
}

float ref_fp8_dequant(enum skv_dtype dt, uint8_t b, float s)
{
	int e4 = dt == SKV_DTYPE_F8E4M3FN;
	int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15, emax = e4 ? 15 : 31;
	int exp = (b & 0x7f) >> mbits, man = b & ((1 << mbits) - 1);
	double v;

	if (e4 && exp == emax && man == (1 << mbits) - 1)
		v = NAN;
	else if (!e4 && exp == emax)
		v = man ? NAN : INFINITY;
	else if (exp == 0) /* subnormal: 0.man * 2^(1 - bias) */
		v = ldexp((double)man, 1 - bias - mbits);
	else
		v = ldexp((double)((1 << mbits) + man), exp - bias - mbits);
	float x = (float)(b & 0x80 ? -v : v); /* exact: at most 4 significant bits */
	return x * s;
}
