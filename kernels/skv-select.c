// SPDX-License-Identifier: MIT
/*
 * skv-select.c - selection of one stored head: pooling, top-k with ties to the
 * smaller position, and the retained mass of what is kept.
 */
#include <stdlib.h>
#include <string.h>

#include "skv-driver.h"

/* ----------------------------------------------------------- selection */

static void pool(const struct skv_params *p, uint32_t kernel, const float *v, float *out,
		 uint32_t P)
{
	const uint32_t h = kernel / 2;

	if (kernel == 1) {
		memcpy(out, v, (size_t)P * sizeof(float));
		return;
	}
	/* edges: only in-range neighbours (avg counts the padding as 0) */
	for (uint32_t j = 0; j < P; j++) {
		if (j == h && P > 2 * h) {
			j = P - h - 1; /* interior done below */
			continue;
		}
		uint32_t a = j < h ? 0 : j - h, b = j + h >= P ? P - 1 : j + h;
		float acc = v[a], mx = v[a];
		for (uint32_t i = a + 1; i <= b; i++) {
			acc += v[i];
			mx = v[i] > mx ? v[i] : mx;
		}
		out[j] = p->pooling == SKV_POOL_AVG ? acc / (float)kernel : mx;
	}
	if (P <= 2 * h)
		return;
	/* interior [h, P - h): the same left-to-right order, as vectorisable loops */
	const uint32_t n = P - 2 * h;
	float *o = out + h;
	memcpy(o, v, (size_t)n * sizeof(float));
	if (p->pooling == SKV_POOL_AVG) {
		for (uint32_t i = 1; i < kernel; i++)
			for (uint32_t j = 0; j < n; j++)
				o[j] += v[j + i];
		const float k = (float)kernel;
		for (uint32_t j = 0; j < n; j++)
			o[j] /= k;
	} else {
		for (uint32_t i = 1; i < kernel; i++)
			for (uint32_t j = 0; j < n; j++)
				o[j] = v[j + i] > o[j] ? v[j + i] : o[j];
	}
}

/* Rearrange key[0..n) so that its first k entries are the k largest (quickselect). */
#define SELECT_TOP(NAME, KT, IT)                                                                   \
	static void NAME(KT *key, IT n, IT k)                                                      \
	{                                                                                          \
		IT lo = 0, hi = n; /* [0, lo) best, [hi, n) worst, k in [lo, hi] */                \
		while (hi - lo > 1) {                                                              \
			IT ia = lo, ib = lo + (hi - lo) / 2, ic = hi - 1, ip;                      \
			KT a = key[ia], b = key[ib], c = key[ic], t;                               \
			if (a > b)                                                                 \
				ip = b > c ? ib : (a > c ? ic : ia);                               \
			else                                                                       \
				ip = a > c ? ia : (b > c ? ic : ib);                               \
			t = key[ip];                                                               \
			key[ip] = key[hi - 1];                                                     \
			key[hi - 1] = t;                                                           \
			KT pv = t;                                                                 \
			IT st = lo;                                                                \
			for (IT i = lo; i < hi - 1; i++) {                                         \
				KT x = key[i];                                                     \
				key[i] = key[st];                                                  \
				key[st] = x;                                                       \
				st += x > pv;                                                      \
			}                                                                          \
			key[hi - 1] = key[st];                                                     \
			key[st] = pv;                                                              \
			if (k == st || k == st + 1)                                                \
				return;                                                            \
			if (k < st)                                                                \
				hi = st;                                                           \
			else                                                                       \
				lo = st + 1;                                                       \
		}                                                                                  \
	}
SELECT_TOP(select_top128, unsigned __int128, size_t)
#undef SELECT_TOP

void skv_select_top128(unsigned __int128 *key, size_t n, size_t k)
{
	select_top128(key, n, k);
}

static void select_top(uint64_t *key, uint32_t n, uint32_t k)
{
	uint32_t lo = 0, hi = n; /* [0, lo) best, [hi, n) worst, k in [lo, hi] */

	while (hi - lo > 1) {
		/* median of three as pivot, moved to the end (deterministic) */
		uint32_t ia = lo, ib = lo + (hi - lo) / 2, ic = hi - 1, ip;
		uint64_t a = key[ia], b = key[ib], c = key[ic], t;
		if (a > b)
			ip = b > c ? ib : (a > c ? ic : ia);
		else
			ip = a > c ? ia : (b > c ? ic : ib);
		t = key[ip];
		key[ip] = key[hi - 1];
		key[hi - 1] = t;
		uint64_t pv = t;
		uint32_t st = lo;
		/* branchless Lomuto: [lo, st) better, [st, i) not */
		for (uint32_t i = lo; i < hi - 1; i++) {
			uint64_t x = key[i];
			key[i] = key[st];
			key[st] = x;
			st += x > pv;
		}
		key[hi - 1] = key[st];
		key[st] = pv;
		/* [lo, st) better than the pivot at st, (st, hi) worse */
		if (k == st || k == st + 1)
			return;
		if (k < st)
			hi = st;
		else
			lo = st + 1;
	}
}

void skv_pool_votes(const struct skv_job *jb, const float *votes, float *out)
{
	uint32_t kernel = jb->p->policy == SKV_POLICY_H2O ? 1 : jb->p->kernel;

	pool(jb->p, kernel, votes, out, jb->P);
}

static void sort_desc(uint64_t *a, uint64_t *tmp, uint32_t n);

/* Walk ranked centres key[0..n) (best first): each keeps itself and its
 * neighbours out to s, nearest first, until need more are kept. */
static uint32_t span_walk(const uint64_t *key, uint32_t n, uint8_t *keep, uint32_t P, uint32_t s,
			  uint32_t need)
{
	for (uint32_t i = 0; i < n && need; i++) {
		const uint32_t c = ~(uint32_t)key[i];
		for (uint32_t d = 0; d <= s && need; d++) {
			if (d <= c && !keep[c - d]) { /* c - d, then c + d */
				keep[c - d] = 1;
				need--;
			}
			if (d && need && c + d < P && !keep[c + d]) {
				keep[c + d] = 1;
				need--;
			}
		}
	}
	return need;
}

/*
 * Span-aware pick (skv.h): k of the n candidate keys w->key[0..n), k < n,
 * by walking the ranking. The k best go first (quickselect, then sorted);
 * the rest, sorted, only when their spans did not fill the budget (the
 * walk never needs more than k centres unless spans overlap a lot).
 */
static void span_pick(struct skv_ws *w, uint32_t n, uint32_t k, uint32_t P, uint32_t s)
{
	select_top(w->key, n, k);
	sort_desc(w->key, w->rtmp, k);
	uint32_t need = span_walk(w->key, k, w->keep, P, s, k);
	if (need) {
		sort_desc(w->key + k, w->rtmp, n - k);
		span_walk(w->key + k, n - k, w->keep, P, s, need);
	}
}

/* Positions kept for one stored head into w->pos (ascending); returns count. */
uint32_t skv_choose(const struct skv_job *jb, struct skv_ws *w, const float *votes, uint32_t k)
{
	const uint32_t L = jb->sh->prompt_len, P = jb->P;
	uint32_t n = 0, cnt = 0;

	memcpy(w->keep, jb->base_keep, L);
	skv_pool_votes(jb, votes, w->pooled);
	if (k >= P) { /* everything left fits (L == C) */
		memset(w->keep, 1, P);
	} else {
		for (uint32_t j = 0; j < P; j++)
			if (!w->keep[j])
				w->key[n++] = skv_rank_key(w->pooled[j], j);
		if (k > n)
			k = n;
		if (jb->p->span && k < n) {
			span_pick(w, n, k, P, jb->p->span);
		} else {
			if (k < n)
				select_top(w->key, n, k);
			for (uint32_t i = 0; i < k; i++)
				w->keep[~(uint32_t)w->key[i]] = 1;
		}
	}
	for (uint32_t j = 0; j < L; j++)
		if (w->keep[j])
			w->pos[cnt++] = (int32_t)j;
	return cnt;
}

float skv_mass_of(const float *colsum, const int32_t *pos, uint32_t cnt, uint32_t rows)
{
	double acc = 0.0;

	for (uint32_t i = 0; i < cnt; i++)
		acc += colsum[pos[i]];
	return (float)(acc / rows);
}

/* group votes: the G heads' column sums averaged, in a fixed order */
void skv_group_votes(const struct skv_job *jb, struct skv_ws *w, const float *colsum)
{
	const uint32_t G = jb->G, L = jb->sh->prompt_len;

	for (uint32_t j = 0; j < L; j++) {
		float acc = 0.0f;
		for (uint32_t q = 0; q < G; q++)
			acc += colsum[(size_t)q * L + j];
		w->vote[j] = acc / (float)G;
	}
}

/* ------------------------------------------------- budget modes: ranking */

/* Sort distinct keys descending: LSD radix sort by bytes (stable, the
 * highest byte value first), skipping the bytes every key has alike (the
 * high bytes of ~position, often the top of the score); tmp holds n keys.
 * About a fifth of the time of a quicksort of C_max - F keys, whose
 * mispredicted compares cost the mass modes ~3% of a compaction. */
static void sort_desc(uint64_t *a, uint64_t *tmp, uint32_t n)
{
	if (n <= 32) {
		for (uint32_t i = 1; i < n; i++) {
			uint64_t v = a[i];
			uint32_t j = i;
			for (; j > 0 && a[j - 1] < v; j--)
				a[j] = a[j - 1];
			a[j] = v;
		}
		return;
	}
	uint64_t diff = 0, *src = a, *dst = tmp;
	for (uint32_t i = 1; i < n; i++)
		diff |= a[i] ^ a[0];
	for (unsigned b = 0; b < 64; b += 8) {
		if (!((diff >> b) & 0xff))
			continue;
		uint32_t cnt[256] = {0}, off[256], at = 0;
		for (uint32_t i = 0; i < n; i++)
			cnt[(src[i] >> b) & 0xff]++;
		for (unsigned d = 256; d-- > 0;) {
			off[d] = at;
			at += cnt[d];
		}
		for (uint32_t i = 0; i < n; i++) {
			uint64_t k = src[i];
			dst[off[(k >> b) & 0xff]++] = k;
		}
		uint64_t *t = src;
		src = dst;
		dst = t;
	}
	if (src != a)
		memcpy(a, src, (size_t)n * sizeof(*a));
}

uint32_t skv_rank(const struct skv_job *jb, struct skv_ws *w, const float *votes, uint32_t R)
{
	const uint32_t P = jb->P;
	uint32_t n = 0;

	if (R == 0) /* zero ranking width (skv.h): nothing can be picked */
		return 0;
	skv_pool_votes(jb, votes, w->pooled);
	for (uint32_t j = 0; j < P; j++)
		if (!jb->base_keep[j])
			w->key[n++] = skv_rank_key(w->pooled[j], j);
	if (R > n)
		R = n;
	if (R < n)
		select_top(w->key, n, R);
	/* keys are distinct (the position is in them): the order is total */
	sort_desc(w->key, w->rtmp, R);
	return R;
}

uint32_t skv_keep_ranked(const struct skv_job *jb, struct skv_ws *w, const uint32_t *ranked,
			 uint32_t picks)
{
	const uint32_t L = jb->sh->prompt_len;
	uint32_t cnt = 0;

	memcpy(w->keep, jb->base_keep, L);
	for (uint32_t i = 0; i < picks; i++)
		w->keep[ranked[i]] = 1;
	for (uint32_t j = 0; j < L; j++)
		if (w->keep[j])
			w->pos[cnt++] = (int32_t)j;
	return cnt;
}

double skv_forced_sum(const struct skv_job *jb, const float *votes)
{
	double acc = 0.0;

	for (uint32_t i = 0; i < jb->forced; i++)
		acc += votes[jb->base_pos[i]];
	return acc;
}

float skv_curve(double acc, uint32_t rows)
{
	float m = (float)(acc / rows);

	return m < 1.0f ? m : 1.0f;
}

uint32_t skv_top_keys(uint64_t *key, uint32_t n, uint32_t k)
{
	if (k >= n)
		return n;
	select_top(key, n, k);
	return k;
}
