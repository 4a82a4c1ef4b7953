/* SPDX-License-Identifier: MIT */
/*
 * select.cu - pooling, batched top-k and ordered emission of the kept
 * positions, for every (layer, stored head) of a launch in one grid.
 *
 * Per stored head: forced positions (sinks, protected ranges, the last W_keep)
 * are always kept; the remaining kept - forced slots go to the prefix
 * candidates with the highest pooled vote, ties to the smaller position.
 * The cut is found by an exact 4 x 8-bit MSD radix select over order-
 * preserving 32-bit keys of the scores; candidates equal to the threshold are
 * then taken in position order, so the result is the unique SPEC.md set. The
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
	__shared__ uint32_t hist[256];
	__shared__ uint32_t ws[32];
	__shared__ double wsd[32];
	__shared__ uint32_t sh_prefix, sh_need;

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

	/* threshold key thr: take key > thr, then the first `need` keys == thr */
	uint32_t thr = 0xffffffffu, need = 0;
	if (fill == n_cand) {
		thr = 0;
	} else if (fill > 0) {
		uint32_t prefix = 0, mask = 0;
		need = fill;
		for (int shift = 24; shift >= 0; shift -= 8) {
			for (uint32_t i = tid; i < 256; i += SEL_THREADS)
				hist[i] = 0;
			__syncthreads();
			for (uint32_t base = 0; base < L; base += SEL_THREADS) {
				const uint32_t j = base + tid;
				const uint32_t key = j < L ? keys[j] : 0;
				const bool in = key && (key & mask) == prefix;
				/*
				 * Scores crowd into few bins in the first passes: one
				 * atomic per distinct bin of the warp, not per lane.
				 */
				const uint32_t bin = in ? (key >> shift) & 255 : 256;
				const uint32_t peers = __match_any_sync(0xffffffffu, bin);
				if (in && (tid & 31) == (uint32_t)(__ffs(peers) - 1))
					atomicAdd(&hist[bin], (uint32_t)__popc(peers));
			}
			__syncthreads();
			if (tid < 32) {
				/* lane l holds bins 255 - 8l .. 248 - 8l, scanned from the top */
				uint32_t sum = 0;
				for (int b = 0; b < 8; b++)
					sum += hist[255 - 8 * tid - b];
				uint32_t incl = sum;
				for (int o = 1; o < 32; o <<= 1) {
					uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
					if (tid >= (uint32_t)o)
						incl += y;
				}
				uint32_t acc = incl - sum;
				if (acc < need && incl >= need) {
					for (int b = 0; b < 8; b++) {
						uint32_t bin = 255 - 8 * tid - b;
						if (acc + hist[bin] >= need) {
							sh_prefix = prefix | (bin << shift);
							sh_need = need - acc;
							break;
						}
						acc += hist[bin];
					}
				}
			}
			__syncthreads();
			prefix = sh_prefix;
			need = sh_need;
			mask |= 255u << shift;
		}
		thr = prefix;
	}

	/* emit ascending: forced, above the threshold, or among the first `need` ties */
	uint32_t ties_before = 0, kept_before = 0;
	double mass = 0.0; /* in double, as the host sums it */
	for (uint32_t base = 0; base < L; base += SEL_THREADS) {
		const uint32_t j = base + tid;
		const bool in = j < L;
		const uint32_t key = in ? keys[j] : 0;
		const bool forced = in && is_forced(c, j);
		const uint32_t tie = (key != 0 && key == thr && need > 0) ? 1 : 0;
		uint32_t tie_total, kept_total;
		const uint32_t tie_ex = block_excl_scan(tie, ws, &tie_total);
		const bool keep =
		    forced || (key != 0 && key > thr) || (tie && ties_before + tie_ex < need);
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
