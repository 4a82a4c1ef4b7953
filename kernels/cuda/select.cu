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
 * Policies without scoring (streamingllm, window) force only sinks and
 * protected ranges and rank the other positions by recency, as the host does;
 * their votes (when query rows were given) only feed the retained mass.
 */
#include "skv-cuda-select.cuh"

namespace skvcuda
{

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

	const cut ct = radix_cut(keys, L, fill, n_cand);

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
