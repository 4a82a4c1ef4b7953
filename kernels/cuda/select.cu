/* SPDX-License-Identifier: MIT */
/*
 * select.cu - pooling, batched top-k and ordered emission of the kept
 * positions, for every (layer, stored head) of a launch in one grid.
 *
 * Per stored head: forced positions (sinks, protected ranges, the last W_keep)
 * are always kept; the remaining kept - forced slots go to the prefix
 * candidates with the highest pooled vote, ties to the smaller position.
 * The cut is found by the exact 4 x 8-bit MSD radix select over order-
 * preserving 32-bit keys of the scores that budget.cu uses too (radix_cut,
 * skv-cuda-select.cuh); candidates equal to the threshold are then taken in
 * position order, so the result is the unique SPEC.md set. The
 * kept positions are emitted ascending through block-wide prefix sums, and
 * the retained mass (sum of the kept positions' votes / W_obs) comes along.
 * With a span s (skv.h), the walk of the ranking is done as one top-k
 * over a composite key, which picks the same set: a candidate x is first
 * visited from its best centre b (the highest-ranked candidate within s of
 * x), at offset order o (0, -1, +1, -2, +2, ..), so the kept set is the
 * fill candidates with the greatest (key of b, then smallest b * (2s + 1)
 * + o). span_keys holds the key of b; a second radix cut orders the ties
 * at the first cut by b * (2s + 1) + o (unique).
 * Policies without scoring (streamingllm, window) force only sinks and
 * protected ranges and rank the other positions by recency, as the host does;
 * their votes (when query rows were given) only feed the retained mass.
 */
#include "skv-cuda-select.cuh"

namespace skvcuda
{

/* span: the greatest key of the candidates within s of x in [0, P) (x's own
 * included), and the smallest position holding it when bpos is given */
__device__ __forceinline__ uint32_t span_best(const uint32_t *keys, uint32_t P, uint32_t s,
					      uint32_t x, uint32_t *bpos)
{
	const uint32_t a = x > s ? x - s : 0, z = x + s < P ? x + s : P - 1;
	uint32_t best = 0, at = x;
	for (uint32_t c = a; c <= z; c++)
		if (keys[c] > best) {
			best = keys[c];
			at = c;
		}
	if (bpos)
		*bpos = at;
	return best;
}

/*
 * span: replaces keys by the composite order of the walk (see the top):
 * returns the cut of fill over fin (= span_keys), where the candidates above
 * the first cut hold 0xffffffff and its ties 0xfffffffe - (b (2s + 1) + o).
 */
__device__ cut span_cut(const sel_consts &c, const uint32_t *keys, uint32_t *fin, uint32_t L,
			uint32_t fill, uint32_t n_cand, uint32_t *ws)
{
	const uint32_t P = c.P, s = c.span, tid = threadIdx.x;

	for (uint32_t x = tid; x < L; x += SEL_THREADS)
		fin[x] = x < P && keys[x] > MARK ? span_best(keys, P, s, x, nullptr) : 0;
	__syncthreads();
	const cut c1 = radix_cut(fin, L, fill, n_cand);
	uint32_t n2 = 0;
	for (uint32_t x = tid; x < L; x += SEL_THREADS) {
		const uint32_t f = fin[x];
		uint32_t v = 0;
		if (f > MARK && (f > c1.thr || at_cut(f, c1))) {
			uint32_t b;
			span_best(keys, P, s, x, &b);
			const uint32_t o = x == b ? 0 : x < b ? 2 * (b - x) - 1 : 2 * (x - b);
			v = f > c1.thr ? 0xffffffffu : 0xfffffffeu - (b * (2 * s + 1) + o);
		}
		fin[x] = v;
		n2 += v ? 1 : 0;
	}
	n2 = block_sum(n2, ws);
	return radix_cut(fin, L, fill, n2);
}

/*
 * grid:  x = stored head, y = layer in launch
 * block: SEL_THREADS
 * p.votes: [N][H_q][L] (NULL for policies without scoring)
 * p.keys:  [N][H_store][L] scratch
 * out:     layers[].positions [H_store][pos_stride] (first `kept` entries),
 *          layers[].retained_mass [H_store] (optional)
 */
__global__ void __launch_bounds__(SEL_THREADS)
    select_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t h = blockIdx.x, ll = blockIdx.y, layer = p.layer0 + ll;
	const dlayer &ly = p.layers[ll];
	const uint32_t L = c.L, tid = threadIdx.x;
	int32_t *pos_out = ly.positions + (size_t)h * ly.pos_stride;
	__shared__ uint32_t ws[32];
	__shared__ double wsd[32];

	if (c.bypass) {
		for (uint32_t j = tid; j < L; j += SEL_THREADS)
			pos_out[j] = (int32_t)j;
		if (tid == 0 && ly.retained_mass)
			ly.retained_mass[h] = c.bypass_mass;
		return;
	}

	const float *v =
	    c.w_obs ? p.votes + ((size_t)layer * c.h_q + (c.group ? h * c.G : h)) * L : nullptr;
	uint32_t *keys = p.keys + ((size_t)layer * c.h_store + h) * L;
	const uint32_t P = c.P;

	/* keys: 0 = not a candidate; scores are >= 0 so candidate keys are >= 2^31 */
	uint32_t n_forced = 0, n_cand = 0;
	for (uint32_t j = tid; j < L; j += SEL_THREADS) {
		uint32_t key = 0;
		if (is_forced(c, j)) {
			n_forced++;
		} else if (j < P) {
			float sc = c.rank_votes ? pooled_at(c, v, P, j) : (float)j;
			key = ordered_key(sc);
			n_cand++;
		}
		keys[j] = key;
	}
	n_forced = block_sum(n_forced, ws);
	n_cand = block_sum(n_cand, ws);
	const uint32_t fill = c.kept > n_forced ? min(c.kept - n_forced, n_cand) : 0;

	const bool span = c.span && c.rank_votes && fill < n_cand;
	if (span)
		keys = p.span_keys + ((size_t)layer * c.h_store + h) * L;
	const cut ct = span ? span_cut(c, p.keys + ((size_t)layer * c.h_store + h) * L, keys, L,
				       fill, n_cand, ws)
			    : radix_cut(keys, L, fill, n_cand);

	/* emit ascending: forced, above the threshold, or among the first `need` ties */
	uint32_t ties_before = 0, kept_before = 0;
	double mass = 0.0; /* in double, as the host sums it */
	for (uint32_t base = 0; base < L; base += SEL_THREADS) {
		const uint32_t j = base + tid;
		const bool in = j < L;
		const uint32_t key = in ? keys[j] : 0;
		const bool forced = in && is_forced(c, j);
		const uint32_t tie = at_cut(key, ct) ? 1 : 0;
		uint32_t tie_total, kept_total;
		const uint32_t tie_ex = block_excl_scan(tie, ws, &tie_total);
		const bool keep = forced || taken(key, ct, ties_before + tie_ex);
		const uint32_t slot = kept_before + block_excl_scan(keep ? 1 : 0, ws, &kept_total);
		if (keep) {
			if (slot < c.kept)
				pos_out[slot] = (int32_t)j;
			if (v)
				mass += vote_at(c, v, j);
		}
		ties_before += tie_total;
		kept_before += kept_total;
	}
	mass = block_sum(mass, wsd);
	if (tid == 0) {
		if (kept_before != c.kept)
			set_status(p.status, STATUS_INTERNAL, (int32_t)layer, (int32_t)h);
		if (ly.retained_mass)
			ly.retained_mass[h] = (v && c.w_obs) ? (float)(mass / c.w_obs) : NAN;
	}
}

cudaError_t select_launch(const launch_params &p, cudaStream_t s)
{
	dim3 grid(p.c.h_store, p.n_layers);
	SKV_LAUNCH(select_kernel, grid, SEL_THREADS, 0, s, p);
	return cudaGetLastError();
}

} /* namespace skvcuda */
