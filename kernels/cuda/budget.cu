/* SPDX-License-Identifier: MIT */
/*
 * budget.cu - the budget modes of SPEC.md beyond one C on the GPU, from the
 * one scoring pass, with the decisions of the host backend (skv.h, the
 * comment before struct skv_budget_result) made in the same arithmetic:
 *
 *   keys      per (layer, head): the ordered 32-bit key of each candidate's
 *             pooled vote (0: not a candidate), as select.cu computes them;
 *   topk      layers / uniform with a fallback: the top C_l - F of each head;
 *   heads     each head's floor f, then one block per layer takes the top
 *             of the layer's H_store x L keys (ties: smaller head, then
 *             smaller position: the key array's index order);
 *   rank      mass modes: the top R of each head, sorted (bitonic, best
 *             first), the forced votes summed in double in ascending order
 *             and the ranked votes added in rank order by one thread: the
 *             host's mass curve bit for bit; mass-heads picks its k here,
 *             mass its smallest ladder C, then C* and the picks at C*;
 *   emit      per head: forced and picked positions ascending, the kept
 *             count, the retained mass (ascending double sum, or the curve);
 *   final     one block: the smallest mass, the fallback, C*, kept counts;
 *   full      every head keeps all L positions when the fallback fired.
 *
 * A picked candidate's key becomes MARK; the gather then copies kept[l][h]
 * rows per head (ragged counts in one grid sized for the most).
 */
#include "skv-cuda-select.cuh"

namespace skvcuda
{

__device__ __forceinline__ bool layer_bypass(const launch_params &p, const dlayer &ly)
{
	if (p.b.mode == SKV_BUDGET_MASS || p.b.mode == SKV_BUDGET_MASS_HEADS)
		return p.c.bypass != 0;
	return p.c.L < ly.cap;
}

__device__ __forceinline__ const float *head_votes(const launch_params &p, uint32_t layer,
						   uint32_t h)
{
	const sel_consts &c = p.c;
	if (!c.w_obs)
		return nullptr;
	return p.votes + ((size_t)layer * c.h_q + (c.group ? h * c.G : h)) * c.L;
}

__device__ __forceinline__ float curve(double acc, uint32_t rows)
{
	float m = (float)(acc / (double)rows);
	return m < 1.0f ? m : 1.0f;
}

/* Candidates (key > MARK) of keys[0..n), summed over the block. */
__device__ uint32_t count_cand(const uint32_t *keys, uint32_t n, uint32_t *ws)
{
	uint32_t k = 0;
	for (uint32_t j = threadIdx.x; j < n; j += SEL_THREADS)
		k += keys[j] > MARK;
	return block_sum(k, ws);
}

/* Mark the candidates of keys[0..n) that the cut takes. */
__device__ void mark_cut(uint32_t *keys, uint32_t n, const cut &ct, uint32_t *ws)
{
	uint32_t ties_before = 0;
	for (uint32_t base = 0; base < n; base += SEL_THREADS) {
		const uint32_t j = base + threadIdx.x;
		const uint32_t key = j < n ? keys[j] : 0;
		const uint32_t tie = at_cut(key, ct);
		uint32_t total;
		const uint32_t ex = block_excl_scan(tie, ws, &total);
		if (taken(key, ct, ties_before + ex))
			keys[j] = MARK;
		ties_before += total;
	}
}

/* grid: x = stored head, y = layer in launch. Candidate keys of each head. */
__global__ void __launch_bounds__(SEL_THREADS) bkeys_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t h = blockIdx.x, ll = blockIdx.y, layer = p.layer0 + ll;
	if (layer_bypass(p, p.layers[ll]))
		return;
	const float *v = head_votes(p, layer, h);
	uint32_t *keys = p.keys + ((size_t)layer * c.h_store + h) * c.L;
	for (uint32_t j = threadIdx.x; j < c.L; j += SEL_THREADS) {
		uint32_t key = 0;
		if (!is_forced(c, j) && j < c.P)
			key = ordered_key(c.rank_votes ? pooled_at(c, v, c.P, j) : (float)j);
		keys[j] = key;
	}
}

/* grid: x = stored head, y = layer in launch. Own top picks of each head:
 * min(L, C_l) - F (layers, uniform), or the floor f (heads). */
__global__ void __launch_bounds__(SEL_THREADS) btopk_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t h = blockIdx.x, ll = blockIdx.y, layer = p.layer0 + ll;
	const dlayer &ly = p.layers[ll];
	__shared__ uint32_t ws[32];
	if (layer_bypass(p, ly))
		return;
	uint32_t *keys = p.keys + ((size_t)layer * c.h_store + h) * c.L;
	const uint32_t n_cand = count_cand(keys, c.L, ws);
	uint32_t fill;
	if (p.b.mode == SKV_BUDGET_HEADS) {
		fill = p.b.floor;
	} else {
		const uint32_t kept = min(c.L, ly.cap);
		fill = kept > p.b.forced ? kept - p.b.forced : 0;
	}
	fill = min(fill, n_cand);
	const cut ct = radix_cut(keys, c.L, fill, n_cand);
	mark_cut(keys, c.L, ct, ws);
}

/* grid: x = layer in launch. heads: the layer's remaining H_store x (P(C) - f)
 * picks over every (head, position) left, by key, ties by index. */
__global__ void __launch_bounds__(SEL_THREADS)
    bheads_layer_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t ll = blockIdx.x, layer = p.layer0 + ll;
	__shared__ uint32_t ws[32];
	if (layer_bypass(p, p.layers[ll]))
		return;
	const uint32_t n = c.h_store * c.L; /* the host refuses more than 2^31 */
	uint32_t *keys = p.keys + (size_t)layer * n;
	const uint32_t left = count_cand(keys, n, ws);
	const uint64_t rest = (uint64_t)c.h_store * p.b.layer_rest;
	const uint32_t take = rest < left ? (uint32_t)rest : left;
	const cut ct = radix_cut(keys, n, take, left);
	mark_cut(keys, n, ct, ws);
}

/*
 * grid: x = stored head, y = layer in launch. Mass modes: the best R
 * candidates sorted best first into p.b.ranked (composite key << 32 |
 * ~position), the forced votes' sum, and the walk along the curve:
 * mass-heads keeps its smallest k (marked here, mass in p.b.mass), mass
 * records its smallest ladder C (p.b.aux) and the forced sum (p.b.fsum).
 */
__global__ void __launch_bounds__(SEL_THREADS) brank_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t h = blockIdx.x, ll = blockIdx.y, layer = p.layer0 + ll;
	const uint32_t tid = threadIdx.x, L = c.L;
	const size_t hi = (size_t)layer * c.h_store + h;
	__shared__ uint32_t ws[32];
	__shared__ float fv[SEL_THREADS];
	__shared__ uint32_t sh_picks;
	uint32_t *keys = p.keys + hi * L;
	uint64_t *list = p.b.ranked + hi * p.b.r2;
	const float *v = head_votes(p, layer, h);
	const uint32_t F = p.b.forced, avail = L - F, R = p.b.r;

	const uint32_t n_cand = count_cand(keys, L, ws);
	const cut ct = radix_cut(keys, L, R, n_cand);
	uint32_t ties_before = 0, slot0 = 0;
	for (uint32_t base = 0; base < L; base += SEL_THREADS) {
		const uint32_t j = base + tid;
		const uint32_t key = j < L ? keys[j] : 0;
		const uint32_t tie = at_cut(key, ct);
		uint32_t tt, st;
		const uint32_t ex = block_excl_scan(tie, ws, &tt);
		const bool in = taken(key, ct, ties_before + ex);
		const uint32_t slot = slot0 + block_excl_scan(in ? 1 : 0, ws, &st);
		if (in)
			list[slot] = (uint64_t)key << 32 | (uint32_t)~j;
		ties_before += tt;
		slot0 += st;
	}
	for (uint32_t i = R + tid; i < p.b.r2; i += SEL_THREADS)
		list[i] = 0;
	__syncthreads();
	/* bitonic sort, descending: distinct keys, so one total order */
	for (uint32_t k = 2; k <= p.b.r2; k <<= 1)
		for (uint32_t j = k >> 1; j > 0; j >>= 1) {
			for (uint32_t i = tid; i < p.b.r2; i += SEL_THREADS) {
				const uint32_t ixj = i ^ j;
				if (ixj > i) {
					const uint64_t a = list[i], b = list[ixj];
					if ((i & k) == 0 ? a < b : a > b) {
						list[i] = b;
						list[ixj] = a;
					}
				}
			}
			__syncthreads();
		}
	/* the ranked votes side by side, for the one thread that walks them */
	float *rv = p.b.rvote + hi * p.b.r2;
	for (uint32_t i = tid; i < R; i += SEL_THREADS)
		rv[i] = vote_at(c, v, ~(uint32_t)list[i]);
	/* the forced votes, ascending, summed in double by one thread */
	double acc = 0.0;
	for (uint32_t base = 0; base < L; base += SEL_THREADS) {
		const uint32_t j = base + tid;
		const bool f = j < L && is_forced(c, j);
		uint32_t total;
		const uint32_t s = block_excl_scan(f ? 1 : 0, ws, &total);
		if (f)
			fv[s] = vote_at(c, v, j);
		__syncthreads();
		if (tid == 0)
			for (uint32_t i = 0; i < total; i++)
				acc += fv[i];
		__syncthreads();
	}
	if (tid == 0) {
		uint32_t picks = 0;
		if (p.b.mode == SKV_BUDGET_MASS_HEADS) {
			float m;
			for (uint32_t k = p.b.c_min;; k++) {
				while (picks < k - F && picks < R)
					acc += rv[picks++];
				m = picks >= avail ? 1.0f : curve(acc, c.w_obs);
				if (m >= p.b.tau || k >= p.b.c_max || picks == R)
					break;
			}
			p.b.mass[hi] = m;
		} else {
			p.b.fsum[hi] = acc;
			uint32_t cc = p.b.c_min;
			for (;;) {
				while (picks < cc - F && picks < R)
					acc += rv[picks++];
				const float m = picks >= avail ? 1.0f : curve(acc, c.w_obs);
				if (m >= p.b.tau || cc >= p.b.c_max)
					break;
				if (picks == R) { /* the curve is flat from here */
					cc = p.b.c_max;
					break;
				}
				cc = p.b.c_max - cc > p.b.c_step ? cc + p.b.c_step : p.b.c_max;
			}
			p.b.aux[hi] = cc;
		}
		sh_picks = picks;
	}
	__syncthreads();
	if (p.b.mode == SKV_BUDGET_MASS_HEADS)
		for (uint32_t i = tid; i < sh_picks; i += SEL_THREADS)
			keys[~(uint32_t)list[i]] = MARK;
}

/* One block: mass's C*, the smallest ladder C every head reaches tau at. */
__global__ void __launch_bounds__(SEL_THREADS)
    bcstar_kernel(const __grid_constant__ launch_params p)
{
	__shared__ uint32_t mx[SEL_THREADS];
	/* a group's C* is the largest of its members': at least this one's */
	uint32_t m = p.b.c_min > p.b.c_force ? p.b.c_min : p.b.c_force;
	for (uint32_t i = threadIdx.x; i < p.b.n_heads; i += SEL_THREADS)
		m = p.b.aux[i] > m ? p.b.aux[i] : m;
	mx[threadIdx.x] = m;
	__syncthreads();
	if (threadIdx.x == 0) {
		for (uint32_t i = 1; i < SEL_THREADS; i++)
			m = mx[i] > m ? mx[i] : m;
		p.b.res->c_star = m;
	}
}

/* grid: x = stored head, y = layer in launch. mass: each head keeps
 * min(L, C*): its first min(C* - F, R) ranked picks, the curve's value
 * there from the same additions in the same order. */
__global__ void __launch_bounds__(SEL_THREADS)
    bmass_finish_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t h = blockIdx.x, ll = blockIdx.y, layer = p.layer0 + ll;
	const size_t hi = (size_t)layer * c.h_store + h;
	const uint64_t *list = p.b.ranked + hi * p.b.r2;
	uint32_t *keys = p.keys + hi * c.L;
	const uint32_t F = p.b.forced, cs = p.b.res->c_star;
	const uint32_t picks = cs - F < p.b.r ? cs - F : p.b.r;
	if (threadIdx.x == 0) {
		const float *rv = p.b.rvote + hi * p.b.r2;
		double acc = p.b.fsum[hi];
		for (uint32_t i = 0; i < picks; i++)
			acc += rv[i];
		p.b.mass[hi] = picks >= c.L - F ? 1.0f : curve(acc, c.w_obs);
	}
	for (uint32_t i = threadIdx.x; i < picks; i += SEL_THREADS)
		keys[~(uint32_t)list[i]] = MARK;
}

/* grid: x = stored head, y = layer in launch. Kept positions ascending,
 * their count and the retained mass. */
__global__ void __launch_bounds__(SEL_THREADS) bemit_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t h = blockIdx.x, ll = blockIdx.y, layer = p.layer0 + ll;
	const dlayer &ly = p.layers[ll];
	const uint32_t L = c.L, tid = threadIdx.x;
	const size_t hi = (size_t)layer * c.h_store + h;
	int32_t *pos_out = ly.positions + (size_t)h * ly.pos_stride;
	__shared__ uint32_t ws[32];
	__shared__ float fv[SEL_THREADS];

	if (layer_bypass(p, ly)) {
		for (uint32_t j = tid; j < L; j += SEL_THREADS)
			pos_out[j] = (int32_t)j;
		if (tid == 0) {
			p.b.kept[hi] = L;
			p.b.mass[hi] = 1.0f;
			if (ly.retained_mass)
				ly.retained_mass[h] = 1.0f;
		}
		return;
	}
	const uint32_t *keys = p.keys + hi * L;
	const float *v = head_votes(p, layer, h);
	const bool curve_mass = p.b.mode == SKV_BUDGET_MASS || p.b.mode == SKV_BUDGET_MASS_HEADS;
	uint32_t kept = 0;
	double acc = 0.0;
	for (uint32_t base = 0; base < L; base += SEL_THREADS) {
		const uint32_t j = base + tid;
		const bool keep = j < L && (keys[j] == MARK || is_forced(c, j));
		uint32_t total;
		const uint32_t s = block_excl_scan(keep ? 1 : 0, ws, &total);
		if (keep) {
			pos_out[kept + s] = (int32_t)j;
			if (v)
				fv[s] = vote_at(c, v, j);
		}
		__syncthreads();
		if (tid == 0 && v && !curve_mass)
			for (uint32_t i = 0; i < total; i++)
				acc += fv[i];
		__syncthreads();
		kept += total;
	}
	if (tid == 0) {
		float m = curve_mass ? p.b.mass[hi] : v ? (float)(acc / (double)c.w_obs) : NAN;
		p.b.kept[hi] = kept;
		p.b.mass[hi] = m;
		if (ly.retained_mass)
			ly.retained_mass[h] = m;
	}
}

constexpr int COLLECT_THREADS = 256;

/* grid: x = layer in launch. Uniform through select.cu: counts and masses
 * into the result (the masses select.cu wrote, caller's or scratch). */
__global__ void bcollect_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t ll = blockIdx.x, layer = p.layer0 + ll;
	const dlayer &ly = p.layers[ll];
	for (uint32_t h = threadIdx.x; h < c.h_store; h += COLLECT_THREADS) {
		const size_t hi = (size_t)layer * c.h_store + h;
		p.b.kept[hi] = c.kept;
		p.b.mass[hi] = ly.retained_mass[h];
	}
}

/* One block: the smallest mass (NaN never counts), the fallback, C*, and
 * kept counts of L for every head when the fallback fires. */
__global__ void __launch_bounds__(SEL_THREADS)
    bfinal_kernel(const __grid_constant__ launch_params p)
{
	__shared__ float lo_s[SEL_THREADS];
	__shared__ uint32_t fall_s[SEL_THREADS];
	__shared__ uint32_t fall;
	const uint32_t tid = threadIdx.x, n = p.b.n_heads;
	float lo = INFINITY;
	uint32_t f = 0;
	for (uint32_t i = tid; i < n; i += SEL_THREADS) {
		const float m = p.b.mass[i];
		lo = m < lo ? m : lo;
		f |= m < p.b.fallback_below;
	}
	lo_s[tid] = lo;
	fall_s[tid] = f;
	__syncthreads();
	if (tid == 0) {
		for (uint32_t i = 1; i < SEL_THREADS; i++) {
			lo = lo_s[i] < lo ? lo_s[i] : lo;
			f |= fall_s[i];
		}
		f |= p.b.force_fallback; /* a group's: some member fell below */
		budget_res *r = p.b.res;
		r->fallback = (int32_t)f;
		r->min_mass = n ? lo : NAN;
		if (p.b.mode == SKV_BUDGET_UNIFORM)
			r->c_star = p.b.c_uniform;
		else if (p.b.mode == SKV_BUDGET_MASS && !p.b.select)
			r->c_star = p.b.c_min > p.b.c_force ? p.b.c_min : p.b.c_force;
		else if (p.b.mode != SKV_BUDGET_MASS)
			r->c_star = 0;
		fall = f;
	}
	__syncthreads();
	if (fall)
		for (uint32_t i = tid; i < n; i += SEL_THREADS)
			p.b.kept[i] = p.c.L;
}

/* grid: x = stored head, y = layer in launch. The fallback: all L in order, mass 1. */
__global__ void __launch_bounds__(SEL_THREADS) bfull_kernel(const __grid_constant__ launch_params p)
{
	const uint32_t h = blockIdx.x, ll = blockIdx.y;
	const dlayer &ly = p.layers[ll];
	if (!p.b.res->fallback)
		return;
	int32_t *pos_out = ly.positions + (size_t)h * ly.pos_stride;
	for (uint32_t j = threadIdx.x; j < p.c.L; j += SEL_THREADS)
		pos_out[j] = (int32_t)j;
	if (threadIdx.x == 0 && ly.retained_mass)
		ly.retained_mass[h] = 1.0f;
}

cudaError_t budget_launch(const launch_params &p, enum budget_step step, cudaStream_t s)
{
	const dim3 heads(p.c.h_store, p.n_layers);
	switch (step) {
	case BSTEP_KEYS:
		SKV_LAUNCH(bkeys_kernel, heads, SEL_THREADS, 0, s, p);
		break;
	case BSTEP_TOPK:
		SKV_LAUNCH(btopk_kernel, heads, SEL_THREADS, 0, s, p);
		break;
	case BSTEP_HEADS_LAYER:
		SKV_LAUNCH(bheads_layer_kernel, dim3(p.n_layers), SEL_THREADS, 0, s, p);
		break;
	case BSTEP_RANK:
		SKV_LAUNCH(brank_kernel, heads, SEL_THREADS, 0, s, p);
		break;
	case BSTEP_CSTAR:
		SKV_LAUNCH(bcstar_kernel, dim3(1), SEL_THREADS, 0, s, p);
		break;
	case BSTEP_MASS_FINISH:
		SKV_LAUNCH(bmass_finish_kernel, heads, SEL_THREADS, 0, s, p);
		break;
	case BSTEP_EMIT:
		SKV_LAUNCH(bemit_kernel, heads, SEL_THREADS, 0, s, p);
		break;
	case BSTEP_COLLECT:
		SKV_LAUNCH(bcollect_kernel, dim3(p.n_layers), COLLECT_THREADS, 0, s, p);
		break;
	case BSTEP_FINAL:
		SKV_LAUNCH(bfinal_kernel, dim3(1), SEL_THREADS, 0, s, p);
		break;
	case BSTEP_FULL:
		SKV_LAUNCH(bfull_kernel, heads, SEL_THREADS, 0, s, p);
		break;
	}
	return cudaGetLastError();
}

} /* namespace skvcuda */
