/* SPDX-License-Identifier: MIT */
/*
 * score.cu - SnapKV scoring on the GPU: full causal softmax of the
 * observation rows over every visible key, summed into per-query-head votes,
 * without ever writing a rows x L logit or probability tensor to memory.
 *
 * One work item is (layer, K/V head, row tile): its G query heads share the
 * keys, so the G * W_obs rows of the group are scored together and K is
 * streamed once per pass for all of them. Two ways to run it:
 *   two-pass (default), over key chunks in parallel:
 *     pass 1: per row, online-softmax (max, sum) over the chunk's keys; the
 *             per-chunk partials are merged by pass 2 (a few floats per row);
 *     pass 2: recompute the logits, turn them into normalised probabilities
 *             a[t][j] = exp(z - max) / sum and sum them over the rows of each
 *             query head: votes[layer][q head][j], L floats per head.
 *   fused (SKV_CUDA_SCORE=fused|auto): one persistent kernel that computes
 *     the logits of a sub-chunk once, keeps them in shared memory while the
 *     item's row statistics are completed by its other blocks, and writes the
 *     votes from them: K read once, MMAs once (score_fused_kernel below).
 * Both compute and merge the row statistics per SUBCHUNK keys in the same
 * order, so their results are bit-identical.
 * The softmax runs in base 2 (logits pre-scaled by log2(e) / sqrt(D), exp2f:
 * one ex2 instruction per element); the probabilities are the same.
 * Logits accumulate in fp32: tensor-core MMA (bf16/f16 inputs, fp32
 * accumulate) for head_dim 64/128/256, plain fp32 FMAs otherwise and for f32
 * storage (so f32 results follow the host's arithmetic as closely as possible).
 */
#include <string.h>

#include <type_traits>

#include <cuda_pipeline.h>
#include <mma.h>

#include "skv-cuda-common.cuh"

namespace skvcuda
{

template <bool TC> struct tile_shape {
	static constexpr int RT = TC ? 128 : 64;   /* rows per block          */
	static constexpr int TK = 64;		   /* keys per tile           */
	static constexpr int SP = TK + 4;	   /* logit tile row pitch    */
	static constexpr int FSP = SUBCHUNK + 4;   /* fused: logits of a sub-chunk, row pitch */
	static constexpr int SUBT = SUBCHUNK / TK; /* key tiles per sub-chunk */
	static constexpr int THREADS = 256;
	static constexpr int TPR = THREADS / RT; /* threads per row, pass 1 */
};

struct smem_layout {
	size_t q, k, s, rows, red, misc, total;
	int dp; /* row pitch of the Q and K tiles, elements */
};

__host__ __device__ constexpr size_t align128(size_t x)
{
	return (x + 127) & ~(size_t)127;
}

/*
 * Q tile [RT][dp], K tiles [2 or 1][TK][dp], logits [RT][SP] fp32 (the fused
 * kernel keeps a whole sub-chunk: [RT][FSP]), row max and 1/sum [2][RT],
 * partial column sums [THREADS], a few words to broadcast (tickets, flags).
 * Tensor-core tiles keep the storage type (pitch D + 8 keeps WMMA loads
 * 32-byte aligned and spreads banks); the fp32 path converts on load (pitch
 * D + 1 for conflict-free column reads).
 */
template <typename T, bool TC> __host__ __device__ smem_layout score_smem(uint32_t D, bool fused)
{
	using sh = tile_shape<TC>;
	smem_layout l{};
	size_t es = TC ? sizeof(T) : sizeof(float);
	l.dp = TC ? (int)D + 8 : (int)D + 1;
	l.q = 0;
	l.k = align128(l.q + (size_t)sh::RT * l.dp * es);
	l.s = align128(l.k + (size_t)(TC ? 2 : 1) * sh::TK * l.dp * es);
	l.rows = align128(l.s + (size_t)sh::RT * (fused ? sh::FSP : sh::SP) * sizeof(float));
	l.red = align128(l.rows + 2 * sh::RT * sizeof(float));
	l.misc = align128(l.red + sh::THREADS * sizeof(float));
	l.total = align128(l.misc + 4 * sizeof(uint32_t));
	return l;
}

/*
 * Merge a partial (max, sum of exp2(z - max)) into a running one. Both paths
 * merge the same partials in the same order with this, so their row
 * statistics are bit-identical.
 */
__device__ __forceinline__ void merge_part(float &m, float &s, float2 ms)
{
	if (ms.x == -INFINITY)
		return;
	float nm = fmaxf(m, ms.x);
	s = s * exp2f(m - nm) + ms.y * exp2f(ms.x - nm);
	m = nm;
}

/*
 * Tensor-core warp tiles: 8 warps cover the RT x TK = 128 x 64 logit tile.
 * Up to head_dim 128 a warp takes 32 rows x 32 keys (2 x 2 MMA tiles: each
 * K fragment read from shared memory feeds two MMAs); at 256 the A
 * fragments of 32 rows would not fit in registers, so 16 rows x 64 keys.
 */
template <int D_> struct warp_tile {
	static constexpr int MR = D_ <= 128 ? 2 : 1; /* 16-row fragments per warp  */
	static constexpr int KG = MR;		     /* warps side by side in keys  */
	static constexpr int NK = 4 / KG;	     /* 16-key fragments per warp   */
};

/*
 * A warp's query rows as tensor-core A fragments, loaded once per block and
 * kept in registers for every key tile of the chunk (Q does not change).
 */
template <typename T, int D_, bool TC> struct q_frags {
	__device__ void load(const T *, int, int)
	{
	}
};
template <typename T, int D_> struct q_frags<T, D_, true> {
	static constexpr int MR = warp_tile<D_>::MR;
	nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major>
	    a[MR][D_ / 16];
	/* rows r0 .. r0 + 16 * MR - 1 of the Q tile */
	__device__ void load(const T *qs, int dp, int r0)
	{
#pragma unroll
		for (int m = 0; m < MR; m++)
#pragma unroll
			for (int i = 0; i < D_ / 16; i++)
				nvcuda::wmma::load_matrix_sync(
				    a[m][i], qs + (r0 + 16 * m) * dp + i * 16, dp);
	}
};

enum score_mode { PASS1 = 1, PASS2 = 2, FUSED = 3 };

/* A row's running online-softmax statistics, held by TPR adjacent threads. */
struct row_acc {
	uint32_t my_r;	 /* the row this thread works on                    */
	uint32_t sub;	 /* its share of the row's keys: kk = sub (mod TPR) */
	uint32_t my_pos; /* the row's position: it sees keys <= my_pos      */
	float run_m, run_s;
	int bad; /* a logit was NaN or Inf */
};

/*
 * One block's work on one piece of one item (layer-in-launch ll, K/V head
 * kvh, row tile rt), one stage per member function; the modes put them
 * together (score_pass1, score_pass2, score_fused below):
 *   PASS1: key chunk `piece` (CHUNK keys): per row, the online-softmax (max,
 *          sum) of each SUBCHUNK, merged in order into the chunk's partial;
 *   PASS2: key chunk `piece`: merge the chunk partials, recompute the
 *          logits, sum the normalised probabilities into votes;
 *   FUSED: sub-chunk `piece` (SUBCHUNK keys): logits once, kept in shared
 *          memory; the sub-chunk's partial published (publish); the
 *          item's row statistics awaited; votes from the kept logits.
 * p.layers[].q: [H_q, n_q, D], rows n_q - W_obs .. n_q - 1 are used
 * p.layers[].k: [H_kv, L, D]
 * PASS1 writes p.partials [N][H_kv][row_tiles][chunks][RT] (max, sum of exp(z - max));
 * FUSED writes p.sub_partials, and p.partials / p.row_stats where it merges
 * PASS2 and FUSED write p.votes [N][H_q][L] (stores with one row tile, atomics otherwise)
 */
template <typename T, int D_, bool TC, int MODE> struct score_piece {
	using sh = tile_shape<TC>;
	using E = typename std::conditional<TC, T, float>::type;
	static constexpr int RT = sh::RT, TK = sh::TK, NT = sh::THREADS, TPR = sh::TPR;
	static constexpr int SP = MODE == FUSED ? sh::FSP : sh::SP;
	static constexpr uint32_t KEYS = MODE == FUSED ? SUBCHUNK : CHUNK;

	const launch_params &p;
	const sel_consts &c;
	const dlayer &ly;
	uint32_t D, L, G, W, layer, kvh, piece, r0, nr, k0, k1, tid;
	uint32_t qbase; /* position of row t = 0 */
	uint32_t qtok0; /* its token index in q  */
	uint32_t g_lo, g_hi;
	uint32_t maxpos; /* the last key any row of this tile may see */
	size_t item;
	float2 *part; /* PASS1: the chunk's partial; FUSED: the sub-chunk's */
	int dp;	      /* row pitch of the Q and K tiles */
	E *qs, *ks;
	float *ss, *rowm, *rowis, *red;
	uint32_t *misc;

	__device__ __forceinline__ score_piece(const launch_params &p_, uint32_t ll, uint32_t kvh_,
					       uint32_t rt, uint32_t piece_, unsigned char *smem)
	    : p(p_), c(p_.c), ly(p_.layers[ll])
	{
		D = D_ ? (uint32_t)D_ : c.D;
		L = c.L;
		G = c.G;
		W = c.w_obs;
		layer = p.layer0 + ll;
		kvh = kvh_;
		piece = piece_;
		r0 = rt * RT;
		nr = min((uint32_t)RT, G * W - r0);
		k0 = piece * KEYS;
		k1 = min(L, k0 + KEYS);
		tid = threadIdx.x;
		qbase = L - W;
		qtok0 = c.n_q - W;
		g_lo = r0 / W;
		g_hi = (r0 + nr - 1) / W;
		const uint32_t tfirst = r0 % W, tlast = (r0 + nr - 1) % W;
		maxpos = (nr >= W || tlast < tfirst) ? L - 1 : qbase + tlast;
		item = ((size_t)layer * c.h_kv + kvh) * p.row_tiles + rt;
		part = MODE == PASS1   ? p.partials + (item * p.chunks + piece) * RT
		       : MODE == FUSED ? p.sub_partials + (item * p.nsub + piece) * RT
				       : nullptr;
		const smem_layout lay = score_smem<T, TC>(D, MODE == FUSED);
		dp = lay.dp;
		qs = (E *)(smem + lay.q);
		ks = (E *)(smem + lay.k);
		ss = (float *)(smem + lay.s);
		rowm = (float *)(smem + lay.rows);
		rowis = rowm + RT;
		red = (float *)(smem + lay.red);
		misc = (uint32_t *)(smem + lay.misc);
	}

	__device__ __forceinline__ void zero_votes(uint32_t from, uint32_t to) const
	{
		uint32_t n = to > from ? to - from : 0;
		for (uint32_t idx = tid; idx < (g_hi - g_lo + 1) * n; idx += NT) {
			uint32_t g = g_lo + idx / n, j = from + idx % n;
			p.votes[((size_t)layer * c.h_q + kvh * G + g) * L + j] = 0.f;
		}
	}

	__device__ __forceinline__ void add_vote(uint32_t g, uint32_t j, float sum) const
	{
		if (j >= k1)
			return;
		float *vp = p.votes + ((size_t)layer * c.h_q + kvh * G + g) * L + j;
		if (p.row_tiles == 1)
			*vp = sum;
		else
			atomicAdd(vp, sum);
	}

	/* No row sees any key of this piece (it lies past the tile's last row). */
	__device__ __forceinline__ bool unseen() const
	{
		return k0 > maxpos;
	}

	/* An unseen piece's statistics: no key, sum 0. */
	__device__ __forceinline__ void empty_partial() const
	{
		for (uint32_t r = tid; r < nr; r += NT)
			part[r] = make_float2(-INFINITY, 0.f);
	}

	/* Q rows of the tile into shared memory; rows past nr are zero */
	__device__ __forceinline__ void load_q() const
	{
		const T *qd = (const T *)ly.q.data;
		for (uint32_t idx = tid; idx < RT * D; idx += NT) {
			uint32_t r = idx / D, d = idx % D;
			E val = E(0.f);
			if (r < nr) {
				uint32_t g = (r0 + r) / W, t = (r0 + r) % W;
				T x = qd[dten_off(ly.q, kvh * G + g, qtok0 + t) + d];
				if constexpr (TC)
					val = x;
				else
					val = to_f32<T>(x);
			}
			qs[r * dp + d] = val;
		}
	}

	/* PASS2: the chunk partials of pass 1 merged into each row's max and 1/sum */
	__device__ __forceinline__ void merge_partials() const
	{
		const float2 *rp = p.partials + item * p.chunks * RT;
		for (uint32_t r = tid; r < RT; r += NT) {
			float m = -INFINITY, s = 0.f;
			if (r < nr)
				for (uint32_t ch = 0; ch < p.chunks; ch++)
					merge_part(m, s, rp[(size_t)ch * RT + r]);
			rowm[r] = m;
			rowis[r] = s > 0.f ? 1.f / s : 0.f;
		}
	}

	/* tensor-core warp tile: rows wr0() .., keys wk0() .. of the block's tile */
	__device__ __forceinline__ int wr0() const
	{
		return (int)(tid / 32) / warp_tile<D_>::KG * 16 * warp_tile<D_>::MR;
	}
	__device__ __forceinline__ int wk0() const
	{
		return (int)(tid / 32) % warp_tile<D_>::KG * 16 * warp_tile<D_>::NK;
	}

	/* The warp's Q fragments, once the Q tile is complete (tensor cores only). */
	__device__ __forceinline__ void load_q_frags(q_frags<E, D_, TC> &qf) const
	{
		if constexpr (TC) {
			__syncthreads(); /* Q tile complete */
			if (wr0() < (int)nr)
				qf.load(qs, dp, wr0());
		}
	}

	/* K rows j0 .. j0 + TK - 1 into K buffer buf (async with tensor cores); zero past k1 */
	__device__ __forceinline__ void load_k(uint32_t j0, int buf) const
	{
		const T *kd = (const T *)ly.k.data;
		E *dst = ks + (size_t)buf * TK * dp;
		if constexpr (TC) {
			if (p.vec16) {
				constexpr int EPV = 16 / sizeof(T); /* elements per 16 bytes */
				constexpr int U = D_ / EPV;
				for (int idx = tid; idx < TK * U; idx += NT) {
					int kk = idx / U, u = idx % U;
					uint32_t j = j0 + kk;
					E *dp16 = dst + kk * dp + u * EPV;
					if (j < k1)
						__pipeline_memcpy_async(
						    dp16, kd + dten_off(ly.k, kvh, j) + u * EPV,
						    16);
					else
						*(uint4 *)dp16 = make_uint4(0, 0, 0, 0);
				}
				__pipeline_commit();
				return;
			}
		}
		for (uint32_t idx = tid; idx < TK * D; idx += NT) {
			uint32_t kk = idx / D, d = idx % D, j = j0 + kk;
			E val = E(0.f);
			if (j < k1) {
				T x = kd[dten_off(ly.k, kvh, j) + d];
				if constexpr (TC)
					val = x;
				else
					val = to_f32<T>(x);
			}
			dst[kk * dp + d] = val;
		}
		if constexpr (TC)
			__pipeline_commit();
	}

	/* Logits (unscaled dot products) of a tile, tensor cores: st[r][kk] */
	__device__ __forceinline__ void logits_mma(const q_frags<E, D_, TC> &qf, const E *kb,
						   float *st) const
	{
		using namespace nvcuda;
		constexpr int MR = warp_tile<D_>::MR, NK = warp_tile<D_>::NK;
		const int r = wr0(), k = wk0();
		if (r >= (int)nr)
			return;
		wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MR][NK];
#pragma unroll
		for (int m = 0; m < MR; m++)
#pragma unroll
			for (int n = 0; n < NK; n++)
				wmma::fill_fragment(acc[m][n], 0.f);
#pragma unroll
		for (int i = 0; i < D_ / 16; i++) {
#pragma unroll
			for (int n = 0; n < NK; n++) {
				wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
				wmma::load_matrix_sync(b, kb + (k + n * 16) * dp + i * 16, dp);
#pragma unroll
				for (int m = 0; m < MR; m++)
					wmma::mma_sync(acc[m][n], qf.a[m][i], b, acc[m][n]);
			}
		}
#pragma unroll
		for (int m = 0; m < MR; m++)
#pragma unroll
			for (int n = 0; n < NK; n++)
				wmma::store_matrix_sync(st + (r + 16 * m) * SP + k + n * 16,
							acc[m][n], SP, wmma::mem_row_major);
	}

	/* Logits of a tile, fp32 FMAs: st[r][kk] */
	__device__ __forceinline__ void logits_fma(const E *kb, float *st) const
	{
		constexpr int RPT = RT / (NT / TK); /* rows per thread */
		const int kk = tid % TK, rg = tid / TK;
		float acc[RPT];
#pragma unroll
		for (int i = 0; i < RPT; i++)
			acc[i] = 0.f;
		for (uint32_t d = 0; d < D; d++) {
			float kv = kb[kk * dp + d];
#pragma unroll
			for (int i = 0; i < RPT; i++)
				acc[i] = fmaf(qs[(rg + i * (NT / TK)) * dp + d], kv, acc[i]);
		}
#pragma unroll
		for (int i = 0; i < RPT; i++)
			st[(rg + i * (NT / TK)) * SP + kk] = acc[i];
	}

	/*
	 * The piece's key tiles up to the last key a row sees: K loaded (double
	 * buffered with tensor cores), logits into shared memory (FUSED keeps
	 * every tile of its sub-chunk), then consume(st, j0, it, ntile) between
	 * barriers. Returns the number of tiles.
	 */
	template <typename F>
	__device__ __forceinline__ int key_tiles(const q_frags<E, D_, TC> &qf, F &&consume) const
	{
		const uint32_t kend = min(k1, maxpos + 1);
		const int ntile = (int)((kend - k0 + TK - 1) / TK);
		if constexpr (TC)
			load_k(k0, 0);
		for (int it = 0; it < ntile; it++) {
			const uint32_t j0 = k0 + it * TK;
			int buf = 0;
			if constexpr (TC) {
				buf = it & 1;
				if (it + 1 < ntile)
					load_k(j0 + TK, buf ^ 1);
				else
					__pipeline_commit();
				__pipeline_wait_prior(1);
			} else {
				load_k(j0, 0);
			}
			__syncthreads();
			float *st = ss + (MODE == FUSED ? it * TK : 0);
			const E *kb = ks + (size_t)buf * TK * dp;
			if constexpr (TC)
				logits_mma(qf, kb, st);
			else
				logits_fma(kb, st);
			__syncthreads();
			consume(st, j0, it, ntile);
			__syncthreads();
		}
		return ntile;
	}

	/* row statistics: thread owns row tid / TPR, keys kk = sub (mod TPR) */
	__device__ __forceinline__ row_acc rows_begin() const
	{
		row_acc a;
		a.my_r = tid / TPR;
		a.sub = tid % TPR;
		a.my_pos = qbase + (r0 + a.my_r) % W;
		a.run_m = -INFINITY; /* this thread, this sub-chunk */
		a.run_s = 0.f;
		a.bad = 0;
		/* PASS1: the chunk so far, per row, in the (otherwise unused) row arrays */
		if (MODE == PASS1 && a.sub == 0) {
			rowm[a.my_r] = -INFINITY;
			rowis[a.my_r] = 0.f;
		}
		return a;
	}

	/* one read per logit: rescale the running sum when the max moves */
	__device__ __forceinline__ void stats_tile(row_acc &a, const float *st, uint32_t j0) const
	{
		if (a.my_r >= nr)
			return;
		for (uint32_t kk = a.sub; kk < TK; kk += TPR) {
			uint32_t j = j0 + kk;
			if (j >= k1 || j > a.my_pos)
				continue;
			float z = st[a.my_r * SP + kk] * c.scale_log2;
			if (!isfinite(z)) {
				a.bad = 1;
			} else if (z > a.run_m) {
				a.run_s = a.run_s * exp2f(a.run_m - z) + 1.f;
				a.run_m = z;
			} else {
				a.run_s += exp2f(z - a.run_m);
			}
		}
	}

	/* end of a sub-chunk: merge the TPR threads of a row (adjacent lanes) */
	__device__ __forceinline__ void flush_sub(row_acc &a) const
	{
#pragma unroll
		for (int off = 1; off < TPR; off <<= 1) {
			float om = __shfl_xor_sync(0xffffffffu, a.run_m, off);
			float os = __shfl_xor_sync(0xffffffffu, a.run_s, off);
			a.bad |= __shfl_xor_sync(0xffffffffu, a.bad, off);
			float nm = fmaxf(a.run_m, om);
			float x = a.run_m == -INFINITY ? 0.f : a.run_s * exp2f(a.run_m - nm);
			float y = om == -INFINITY ? 0.f : os * exp2f(om - nm);
			a.run_m = nm;
			a.run_s = x + y;
		}
		if (a.sub == 0 && a.my_r < nr) {
			if (MODE == PASS1)
				merge_part(rowm[a.my_r], rowis[a.my_r],
					   make_float2(a.run_m, a.run_s));
			else
				part[a.my_r] = make_float2(a.run_m, a.run_s);
		}
		a.run_m = -INFINITY;
		a.run_s = 0.f;
	}

	/* A tile's statistics, flushed at the end of each sub-chunk. */
	__device__ __forceinline__ void stats_step(row_acc &a, const float *st, uint32_t j0, int it,
						   int ntile) const
	{
		stats_tile(a, st, j0);
		if ((it + 1) % sh::SUBT == 0 || it + 1 == ntile)
			flush_sub(a);
	}

	/* PASS1: the chunk's merged statistics of this thread's row as its partial. */
	__device__ __forceinline__ void store_chunk_partial(const row_acc &a) const
	{
		if (a.sub == 0 && a.my_r < nr)
			part[a.my_r] = make_float2(rowm[a.my_r], rowis[a.my_r]);
	}

	/* A NaN or Inf logit of this thread's row fails the request (-EDOM) naming it. */
	__device__ __forceinline__ void report_bad(const row_acc &a) const
	{
		if (a.bad && a.sub == 0 && a.my_r < nr) {
			uint32_t g = (r0 + a.my_r) / W;
			set_status(p.status, STATUS_NONFINITE, (int32_t)layer,
				   (int32_t)(kvh * G + g));
		}
	}

	/*
	 * Column sums of a[t][j] = exp(z - max) / sum straight from the logits,
	 * one read each: a thread owns (query head, key) items; when there are
	 * fewer items than threads (one head, or h2o's long rows) S threads share
	 * an item's rows and add up in `red`.
	 */
	__device__ __forceinline__ void votes_tile(const float *st, uint32_t j0) const
	{
		const uint32_t items = (g_hi - g_lo + 1) * TK;
		const uint32_t S = items >= NT ? 1 : min(NT / items, 8u);
		for (uint32_t idx = tid; idx < items * S; idx += NT) {
			const uint32_t it2 = idx % items, slice = idx / items;
			const uint32_t g = g_lo + it2 / TK, kk = it2 % TK, j = j0 + kk;
			const uint32_t rlo = max(g * W, r0) - r0;
			const uint32_t rhi = min((g + 1) * W, r0 + nr) - r0;
			float sum = 0.f;
			if (j < k1)
				for (uint32_t r = rlo + slice; r < rhi; r += S)
					if (j <= qbase + (r0 + r) % W)
						sum += exp2f(st[r * SP + kk] * c.scale_log2 -
							     rowm[r]) *
						       rowis[r];
			if (S == 1)
				add_vote(g, j, sum);
			else
				red[slice * items + it2] = sum;
		}
		if (S > 1) {
			__syncthreads();
			for (uint32_t it2 = tid; it2 < items; it2 += NT) {
				float sum = 0.f;
				for (uint32_t sl = 0; sl < S; sl++)
					sum += red[sl * items + it2];
				add_vote(g_lo + it2 / TK, j0 + it2 % TK, sum);
			}
		}
	}

	/* One row tile per K/V head: votes are stores, so the keys no row saw get 0. */
	__device__ __forceinline__ void zero_unseen_votes(int ntile) const
	{
		if (p.row_tiles == 1)
			zero_votes(k0 + (uint32_t)ntile * TK, k1);
	}

	/*
	 * FUSED: publish this sub-chunk's partial (written before); the last
	 * sub-chunk of a chunk to arrive merges the chunk's partials in order,
	 * the last chunk merges the chunks in order into the item's row
	 * statistics and raises the item's flag. Nobody waits here.
	 */
	__device__ __forceinline__ void publish() const
	{
		uint32_t *isync = p.sync + p.n_launches + item * sync_words(p.chunks);
		const uint32_t ch = piece / SUBS_PER_CHUNK;
		const uint32_t s0 = ch * SUBS_PER_CHUNK,
			       ns = min((uint32_t)SUBS_PER_CHUNK, p.nsub - s0);
		__syncthreads();
		if (tid == 0) {
			__threadfence();
			misc[1] = atomicAdd(&isync[2 + ch], 1u) == ns - 1;
		}
		__syncthreads();
		if (!misc[1])
			return;
		__threadfence();
		for (uint32_t r = tid; r < nr; r += NT) {
			float m = -INFINITY, s = 0.f;
			for (uint32_t i = 0; i < ns; i++)
				merge_part(
				    m, s,
				    __ldcg(&p.sub_partials[(item * p.nsub + s0 + i) * RT + r]));
			p.partials[(item * p.chunks + ch) * RT + r] = make_float2(m, s);
		}
		__syncthreads();
		if (tid == 0) {
			__threadfence();
			misc[2] = atomicAdd(&isync[1], 1u) == p.chunks - 1;
		}
		__syncthreads();
		if (!misc[2])
			return;
		__threadfence();
		merge_chunks(isync);
	}

	/* FUSED, the item's last chunk: its row statistics, then the item's flag. */
	__device__ __forceinline__ void merge_chunks(uint32_t *isync) const
	{
		for (uint32_t r = tid; r < nr; r += NT) {
			float m = -INFINITY, s = 0.f;
			for (uint32_t ch2 = 0; ch2 < p.chunks; ch2++)
				merge_part(m, s,
					   __ldcg(&p.partials[(item * p.chunks + ch2) * RT + r]));
			p.row_stats[item * RT + r] = make_float2(m, s);
		}
		__syncthreads();
		if (tid == 0) {
			__threadfence();
			atomicExch(&isync[0], 1u);
		}
	}

	/* FUSED: wait for the item's row statistics (every block of the item has
	 * published), then each row's max and 1/sum into shared memory. */
	__device__ __forceinline__ void await_row_stats() const
	{
		uint32_t *ready = p.sync + p.n_launches + item * sync_words(p.chunks);
		if (tid == 0) {
			unsigned ns = 32;
			const uint64_t t0 = globaltimer_ns();
			while (ld_acquire(ready) == 0) {
				__nanosleep(ns);
				ns = ns < 512 ? 2 * ns : ns;
				if (globaltimer_ns() - t0 > p.wait_limit_ns) {
					/* never expected: fail the request rather than hang */
					set_status(p.status, STATUS_STALLED, (int32_t)layer,
						   (int32_t)(kvh * G));
					break;
				}
			}
			__threadfence();
		}
		__syncthreads();
		for (uint32_t r = tid; r < RT; r += NT) {
			float2 ms = r < nr ? __ldcg(&p.row_stats[item * RT + r])
					   : make_float2(-INFINITY, 0.f);
			rowm[r] = ms.x;
			rowis[r] = ms.y > 0.f ? 1.f / ms.y : 0.f;
		}
		__syncthreads();
	}
};

/* Pass 1 on key chunk `chunk`: each row's (max, sum) partial of the chunk. */
template <typename T, int D_, bool TC>
__device__ __forceinline__ void score_pass1(const launch_params &p, uint32_t ll, uint32_t kvh,
					    uint32_t rt, uint32_t chunk, unsigned char *smem)
{
	using piece = score_piece<T, D_, TC, PASS1>;
	const piece b(p, ll, kvh, rt, chunk, smem);
	if (b.unseen()) {
		b.empty_partial();
		return;
	}
	b.load_q();
	q_frags<typename piece::E, D_, TC> qf;
	b.load_q_frags(qf);
	row_acc a = b.rows_begin();
	b.key_tiles(qf, [&](const float *st, uint32_t j0, int it, int n) {
		b.stats_step(a, st, j0, it, n);
	});
	b.store_chunk_partial(a);
	b.report_bad(a);
}

/* Pass 2 on key chunk `chunk`: the chunk's votes from the merged row statistics. */
template <typename T, int D_, bool TC>
__device__ __forceinline__ void score_pass2(const launch_params &p, uint32_t ll, uint32_t kvh,
					    uint32_t rt, uint32_t chunk, unsigned char *smem)
{
	using piece = score_piece<T, D_, TC, PASS2>;
	const piece b(p, ll, kvh, rt, chunk, smem);
	if (b.unseen()) {
		b.zero_unseen_votes(0);
		return;
	}
	b.load_q();
	b.merge_partials();
	q_frags<typename piece::E, D_, TC> qf;
	b.load_q_frags(qf);
	const int ntile =
	    b.key_tiles(qf, [&](const float *st, uint32_t j0, int, int) { b.votes_tile(st, j0); });
	b.zero_unseen_votes(ntile);
}

/* Fused, sub-chunk `sub`: logits once, the partial published, the item's row
 * statistics awaited, then the votes from the kept logits. */
template <typename T, int D_, bool TC>
__device__ __forceinline__ void score_fused(const launch_params &p, uint32_t ll, uint32_t kvh,
					    uint32_t rt, uint32_t sub, unsigned char *smem)
{
	using piece = score_piece<T, D_, TC, FUSED>;
	const piece b(p, ll, kvh, rt, sub, smem);
	if (b.unseen()) {
		b.empty_partial();
		b.zero_unseen_votes(0);
		b.publish();
		return;
	}
	b.load_q();
	q_frags<typename piece::E, D_, TC> qf;
	b.load_q_frags(qf);
	row_acc a = b.rows_begin();
	const int ntile = b.key_tiles(qf, [&](const float *st, uint32_t j0, int it, int n) {
		b.stats_step(a, st, j0, it, n);
	});
	b.report_bad(a);
	b.publish();
	b.await_row_stats();
	for (int it = 0; it < ntile; it++) {
		b.votes_tile(b.ss + it * piece::TK, b.k0 + it * piece::TK);
		__syncthreads();
	}
	b.zero_unseen_votes(ntile);
}

/*
 * Two-pass scoring.
 * grid:  x = key chunk (CHUNK keys), y = row tile, z = layer-in-launch * H_kv + K/V head
 * block: 256 threads
 * Two blocks per SM where shared memory allows (head_dim <= 128): registers capped at 128.
 */
template <typename T, int D_, bool TC, int PASS>
__global__ void __launch_bounds__(256, D_ == 256 ? 1 : 2)
    score_kernel(const __grid_constant__ launch_params p)
{
	SKV_DYNAMIC_SMEM(smem);
	const uint32_t ll = blockIdx.z / p.c.h_kv, kvh = blockIdx.z % p.c.h_kv;
	if constexpr (PASS == PASS1)
		score_pass1<T, D_, TC>(p, ll, kvh, blockIdx.y, blockIdx.x, smem);
	else
		score_pass2<T, D_, TC>(p, ll, kvh, blockIdx.y, blockIdx.x, smem);
}

/*
 * Fused scoring: a persistent grid (at most the blocks the device keeps
 * resident at once); each block takes tickets in order from an atomic
 * counter, ticket t = (item t / nsub, sub-chunk t % nsub), items ordered
 * (layer, K/V head, row tile). A block computes the logits of its sub-chunk
 * for all rows of the item once, keeps them in shared memory, publishes the
 * sub-chunk's (max, sum) per row, waits until the item's row statistics are
 * complete, and writes its votes from the kept logits: K is read once, the
 * MMAs run once, nothing of size rows x L reaches memory.
 *
 * Why it cannot deadlock: a block only ever waits for the other sub-chunks
 * of its own item, and only after publishing its own. Tickets are taken in
 * order, so when some ticket of the lowest unfinished item i is not taken
 * yet, every ticket below it is finished or held by a block of item i: at
 * most nsub - 1 blocks are waiting, all on item i. With nsub <= the resident
 * capacity, a resident slot is free of waiters: a block of this grid there
 * (or one that a finishing kernel makes room for) takes the next ticket,
 * which is item i's. So item i's tickets are all taken, all publish, its
 * blocks go on, and by induction every item completes. The host launches
 * this kernel only when nsub <= capacity (else the two passes), and never
 * two of them at once on one device (they would share the resident slots:
 * skv-cuda-compact.cu chains them with an event). Other kernels that share
 * the device finish on their own, so they only delay the argument. Not
 * covered: two daemon processes whose fused grids share SMs under MPS. As a
 * safety net every wait is bounded (p.wait_limit_ns): a block that gives
 * up marks the request failed (-EIO) and goes on, so the grid still ends.
 */
template <typename T, int D_, bool TC>
__global__ void __launch_bounds__(256, 1)
    score_fused_kernel(const __grid_constant__ launch_params p)
{
	SKV_DYNAMIC_SMEM(smem);
	const smem_layout lay = score_smem<T, TC>(D_ ? (uint32_t)D_ : p.c.D, true);
	uint32_t *misc = (uint32_t *)(smem + lay.misc);
	uint32_t *ticket = p.sync + p.layer0 / LPL;
	const uint32_t total = p.n_layers * p.c.h_kv * p.row_tiles * p.nsub;
	for (;;) {
		if (threadIdx.x == 0)
			misc[0] = atomicAdd(ticket, 1u);
		__syncthreads();
		const uint32_t t = misc[0];
		__syncthreads();
		if (t >= total)
			return;
		uint32_t rest = t / p.nsub;
		const uint32_t rt = rest % p.row_tiles;
		rest /= p.row_tiles;
		score_fused<T, D_, TC>(p, rest / p.c.h_kv, rest % p.c.h_kv, rt, t % p.nsub, smem);
	}
}

template <typename T, int D, bool TC>
static cudaError_t score_launch_one(const launch_params &p, int pass, cudaStream_t s)
{
	using sh = tile_shape<TC>;
	const smem_layout lay = score_smem<T, TC>(p.c.D, false);
	auto kern = pass == 1 ? score_kernel<T, D, TC, 1> : score_kernel<T, D, TC, 2>;
	cudaError_t e =
	    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)lay.total);
	if (e != cudaSuccess)
		return e;
	dim3 grid(p.chunks, p.row_tiles, p.n_layers * p.c.h_kv);
	SKV_LAUNCH(kern, grid, sh::THREADS, lay.total, s, p);
	return cudaGetLastError();
}

/* blocks < 0: only report the resident capacity in *ret_cap; else launch that many */
template <typename T, int D, bool TC>
static cudaError_t score_fused_one(const launch_params &p, uint32_t head_dim, int sm_count,
				   int blocks, cudaStream_t s, int *ret_cap)
{
	using sh = tile_shape<TC>;
	const smem_layout lay = score_smem<T, TC>(head_dim, true);
	auto kern = score_fused_kernel<T, D, TC>;
	cudaError_t e =
	    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)lay.total);
	if (blocks < 0) {
		int per_sm = 0;
		if (e == cudaSuccess)
			e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern,
									  sh::THREADS, lay.total);
		if (e != cudaSuccess) {
			(void)cudaGetLastError(); /* not covered: not an error of the stream */
			per_sm = 0;
		}
		*ret_cap = per_sm * sm_count;
		return cudaSuccess;
	}
	if (e != cudaSuccess)
		return e;
	SKV_LAUNCH_PERSISTENT(kern, blocks, sh::THREADS, lay.total, s, p);
	return cudaGetLastError();
}

uint32_t score_rows_per_tile(enum skv_dtype dt, uint32_t head_dim)
{
	bool tc = dt != SKV_DTYPE_F32 && (head_dim == 64 || head_dim == 128 || head_dim == 256);
	return tc ? tile_shape<true>::RT : tile_shape<false>::RT;
}

/* f32 storage always takes the fp32 FMA path; 16-bit storage uses tensor cores when it can. */
template <typename T>
static cudaError_t score_launch_typed(const launch_params &p, int pass, cudaStream_t s)
{
	return SKV_DISPATCH_HEAD_DIM(p.c.D, D, [&]() -> cudaError_t {
		return score_launch_one<T, D, (D != 0)>(p, pass, s);
	});
}

template <> cudaError_t score_launch_typed<float>(const launch_params &p, int pass, cudaStream_t s)
{
	return score_launch_one<float, 0, false>(p, pass, s);
}

cudaError_t score_launch(const launch_params &p, enum skv_dtype dt, int pass, cudaStream_t s)
{
	return SKV_DISPATCH_DTYPE(
	    dt, T, [&]() -> cudaError_t { return score_launch_typed<T>(p, pass, s); });
}

/* The same dtype / head_dim choice as score_launch_typed(). */
template <typename T>
static cudaError_t score_fused_typed(const launch_params &p, uint32_t head_dim, int sm_count,
				     int blocks, cudaStream_t s, int *ret_cap)
{
	return SKV_DISPATCH_HEAD_DIM(head_dim, D, [&]() -> cudaError_t {
		return score_fused_one<T, D, (D != 0)>(p, head_dim, sm_count, blocks, s, ret_cap);
	});
}

template <>
cudaError_t score_fused_typed<float>(const launch_params &p, uint32_t head_dim, int sm_count,
				     int blocks, cudaStream_t s, int *ret_cap)
{
	return score_fused_one<float, 0, false>(p, head_dim, sm_count, blocks, s, ret_cap);
}

int score_fused_capacity(enum skv_dtype dt, uint32_t head_dim, int sm_count)
{
	launch_params none;
	int cap = 0;
	memset(&none, 0, sizeof(none));
	if (head_dim == 0 || head_dim > MAX_HEAD_DIM)
		return 0;
	cudaError_t e = SKV_DISPATCH_DTYPE(dt, T, [&]() -> cudaError_t {
		return score_fused_typed<T>(none, head_dim, sm_count, -1, nullptr, &cap);
	});
	return e == cudaSuccess ? cap : 0;
}

cudaError_t score_fused_launch(const launch_params &p, enum skv_dtype dt, int blocks,
			       cudaStream_t s)
{
	if (blocks <= 0)
		return cudaErrorInvalidValue;
	return SKV_DISPATCH_DTYPE(dt, T, [&]() -> cudaError_t {
		return score_fused_typed<T>(p, p.c.D, 0, blocks, s, nullptr);
	});
}

} /* namespace skvcuda */
