/* SPDX-License-Identifier: MIT */
/*
 * score.cu - fused SnapKV scoring on the GPU: full causal softmax of the
 * observation rows over every visible key, summed into per-query-head votes,
 * without ever writing a rows x L logit or probability tensor to memory.
 *
 * One work item is (layer, K/V head): its G query heads share the keys, so
 * the G * W_obs rows of the group are scored together and K is streamed once
 * per pass for all of them. Two passes, both over key chunks in parallel:
 *   pass 1: per row, online-softmax (max, sum) over the chunk's keys; the
 *           per-chunk partials are merged by pass 2 (a few floats per row);
 *   pass 2: recompute the logits, turn them into normalised probabilities
 *           a[t][j] = exp(z - max) / sum and sum them over the rows of each
 *           query head: votes[layer][q head][j], L floats per head.
 * The softmax runs in base 2 (logits pre-scaled by log2(e) / sqrt(D), exp2f:
 * one ex2 instruction per element); the probabilities are the same.
 * Logits accumulate in fp32: tensor-core MMA (bf16/f16 inputs, fp32
 * accumulate) for head_dim 64/128/256, plain fp32 FMAs otherwise and for f32
 * storage (so f32 results follow the host's arithmetic as closely as possible).
 */
#include <type_traits>

#include <cuda_pipeline.h>
#include <mma.h>

#include "skv-cuda-common.cuh"

namespace skvcuda
{

template <bool TC> struct tile_shape {
	static constexpr int RT = TC ? 128 : 64; /* rows per block          */
	static constexpr int TK = 64;		 /* keys per tile           */
	static constexpr int SP = TK + 4;	 /* logit tile row pitch    */
	static constexpr int THREADS = 256;
	static constexpr int TPR = THREADS / RT; /* threads per row, pass 1 */
};

struct smem_layout {
	size_t q, k, s, rows, red, total;
	int dp; /* row pitch of the Q and K tiles, elements */
};

__host__ __device__ constexpr size_t align128(size_t x)
{
	return (x + 127) & ~(size_t)127;
}

/*
 * Q tile [RT][dp], K tiles [2 or 1][TK][dp], logits [RT][SP] fp32, row
 * max and 1/sum [2][RT], partial column sums [THREADS]. Tensor-core tiles keep the storage type
 * (pitch D + 8 keeps WMMA loads 32-byte aligned and spreads banks); the fp32 path converts on load
 * (pitch D + 1 for conflict-free column reads).
 */
template <typename T, bool TC> __host__ __device__ smem_layout score_smem(uint32_t D)
{
	using sh = tile_shape<TC>;
	smem_layout l{};
	size_t es = TC ? sizeof(T) : sizeof(float);
	l.dp = TC ? (int)D + 8 : (int)D + 1;
	l.q = 0;
	l.k = align128(l.q + (size_t)sh::RT * l.dp * es);
	l.s = align128(l.k + (size_t)(TC ? 2 : 1) * sh::TK * l.dp * es);
	l.rows = align128(l.s + (size_t)sh::RT * sh::SP * sizeof(float));
	l.red = align128(l.rows + 2 * sh::RT * sizeof(float));
	l.total = align128(l.red + sh::THREADS * sizeof(float));
	return l;
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

/*
 * grid:  x = key chunk (CHUNK keys), y = row tile, z = layer-in-launch * H_kv + K/V head
 * block: 256 threads
 * p.layers[].q: [H_q, n_q, D], rows n_q - W_obs .. n_q - 1 are used
 * p.layers[].k: [H_kv, L, D]
 * pass 1 writes p.partials [N][H_kv][row_tiles][chunks][RT] (max, sum of exp(z - max))
 * pass 2 writes p.votes    [N][H_q][L] (stores with one row tile, atomics otherwise)
 */
/* Two blocks per SM where shared memory allows (head_dim <= 128): registers capped at 128. */
template <typename T, int D_, bool TC, int PASS>
__global__ void __launch_bounds__(256, D_ == 256 ? 1 : 2)
    score_kernel(const __grid_constant__ launch_params p)
{
	using sh = tile_shape<TC>;
	using E = typename std::conditional<TC, T, float>::type;
	constexpr int RT = sh::RT, TK = sh::TK, SP = sh::SP, NT = sh::THREADS, TPR = sh::TPR;
	const sel_consts &c = p.c;
	const uint32_t D = D_ ? (uint32_t)D_ : c.D;
	const uint32_t L = c.L, G = c.G, W = c.w_obs;
	const uint32_t ll = blockIdx.z / c.h_kv, kvh = blockIdx.z % c.h_kv;
	const uint32_t layer = p.layer0 + ll;
	const dlayer &ly = p.layers[ll];
	const uint32_t rt = blockIdx.y, chunk = blockIdx.x;
	const uint32_t r0 = rt * RT;
	const uint32_t nr = min((uint32_t)RT, G * W - r0);
	const uint32_t k0 = chunk * CHUNK;
	const uint32_t k1 = min(L, k0 + CHUNK);
	const uint32_t tid = threadIdx.x;
	const uint32_t qbase = L - W;	  /* position of row t = 0       */
	const uint32_t qtok0 = c.n_q - W; /* its token index in q        */
	const uint32_t g_lo = r0 / W, g_hi = (r0 + nr - 1) / W;
	/* the last key any row of this tile may see */
	const uint32_t tfirst = r0 % W, tlast = (r0 + nr - 1) % W;
	const uint32_t maxpos = (nr >= W || tlast < tfirst) ? L - 1 : qbase + tlast;
	float2 *part =
	    p.partials +
	    ((((size_t)layer * c.h_kv + kvh) * p.row_tiles + rt) * p.chunks + chunk) * RT;

	auto zero_votes = [&](uint32_t from, uint32_t to) {
		uint32_t n = to > from ? to - from : 0;
		for (uint32_t idx = tid; idx < (g_hi - g_lo + 1) * n; idx += NT) {
			uint32_t g = g_lo + idx / n, j = from + idx % n;
			p.votes[((size_t)layer * c.h_q + kvh * G + g) * L + j] = 0.f;
		}
	};

	auto add_vote = [&](uint32_t g, uint32_t j, float sum) {
		if (j >= k1)
			return;
		float *vp = p.votes + ((size_t)layer * c.h_q + kvh * G + g) * L + j;
		if (p.row_tiles == 1)
			*vp = sum;
		else
			atomicAdd(vp, sum);
	};

	if (k0 > maxpos) { /* no row sees any key of this chunk */
		if (PASS == 1) {
			for (uint32_t r = tid; r < nr; r += NT)
				part[r] = make_float2(-INFINITY, 0.f);
		} else if (p.row_tiles == 1) {
			zero_votes(k0, k1);
		}
		return;
	}

	SKV_DYNAMIC_SMEM(smem);
	const smem_layout lay = score_smem<T, TC>(D);
	const int dp = lay.dp;
	E *qs = (E *)(smem + lay.q);
	E *ks = (E *)(smem + lay.k);
	float *ss = (float *)(smem + lay.s);
	float *rowm = (float *)(smem + lay.rows);
	float *rowis = rowm + RT;
	float *red = (float *)(smem + lay.red);

	/* Q rows of the tile; rows past nr are zero */
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

	if (PASS == 2) {
		/* merge the chunk partials of pass 1 into each row's max and 1/sum */
		const float2 *rp =
		    p.partials +
		    (((size_t)layer * c.h_kv + kvh) * p.row_tiles + rt) * p.chunks * RT;
		for (uint32_t r = tid; r < RT; r += NT) {
			float m = -INFINITY, s = 0.f;
			if (r < nr) {
				for (uint32_t ch = 0; ch < p.chunks; ch++) {
					float2 ms = rp[(size_t)ch * RT + r];
					if (ms.x == -INFINITY)
						continue;
					float nm = fmaxf(m, ms.x);
					s = s * exp2f(m - nm) + ms.y * exp2f(ms.x - nm);
					m = nm;
				}
			}
			rowm[r] = m;
			rowis[r] = s > 0.f ? 1.f / s : 0.f;
		}
	}

	/* tensor-core warp tile: rows wr0 .., keys wk0 .. of the block's tile */
	const int wr0 = (int)(tid / 32) / warp_tile<D_>::KG * 16 * warp_tile<D_>::MR;
	const int wk0 = (int)(tid / 32) % warp_tile<D_>::KG * 16 * warp_tile<D_>::NK;
	q_frags<E, D_, TC> qf;
	if constexpr (TC) {
		__syncthreads(); /* Q tile complete */
		if (wr0 < (int)nr)
			qf.load(qs, dp, wr0);
	}

	const T *kd = (const T *)ly.k.data;
	auto load_k = [&](uint32_t j0, int buf) {
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
	};

	/* pass 1 state: thread owns row tid / TPR, keys kk = sub (mod TPR) */
	const uint32_t my_r = tid / TPR, sub = tid % TPR;
	const uint32_t my_pos = qbase + (r0 + my_r) % W;
	float run_m = -INFINITY, run_s = 0.f;
	int bad = 0;

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

		/* logits (unscaled dot products) of the tile: ss[r][kk] */
		const E *kb = ks + (size_t)buf * TK * dp;
		if constexpr (TC) {
			using namespace nvcuda;
			constexpr int MR = warp_tile<D_>::MR, NK = warp_tile<D_>::NK;
			if (wr0 < (int)nr) {
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
						wmma::fragment<wmma::matrix_b, 16, 16, 16, T,
							       wmma::col_major>
						    b;
						wmma::load_matrix_sync(
						    b, kb + (wk0 + n * 16) * dp + i * 16, dp);
#pragma unroll
						for (int m = 0; m < MR; m++)
							wmma::mma_sync(acc[m][n], qf.a[m][i], b,
								       acc[m][n]);
					}
				}
#pragma unroll
				for (int m = 0; m < MR; m++)
#pragma unroll
					for (int n = 0; n < NK; n++)
						wmma::store_matrix_sync(
						    ss + (wr0 + 16 * m) * SP + wk0 + n * 16,
						    acc[m][n], SP, wmma::mem_row_major);
			}
		} else {
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
					acc[i] =
					    fmaf(qs[(rg + i * (NT / TK)) * dp + d], kv, acc[i]);
			}
#pragma unroll
			for (int i = 0; i < RPT; i++)
				ss[(rg + i * (NT / TK)) * SP + kk] = acc[i];
		}
		__syncthreads();

		if (PASS == 1) {
			/* one read per logit: rescale the running sum when the max moves */
			if (my_r < nr) {
				for (uint32_t kk = sub; kk < TK; kk += TPR) {
					uint32_t j = j0 + kk;
					if (j >= k1 || j > my_pos)
						continue;
					float z = ss[my_r * SP + kk] * c.scale_log2;
					if (!isfinite(z)) {
						bad = 1;
					} else if (z > run_m) {
						run_s = run_s * exp2f(run_m - z) + 1.f;
						run_m = z;
					} else {
						run_s += exp2f(z - run_m);
					}
				}
			}
		} else {
			/*
			 * Column sums of a[t][j] = exp(z - max) / sum straight from the
			 * logits, one read each: a thread owns (query head, key) items;
			 * when there are fewer items than threads (one head, or h2o's
			 * long rows) S threads share an item's rows and add up in `red`.
			 */
			const uint32_t items = (g_hi - g_lo + 1) * TK;
			const uint32_t S = items >= NT ? 1 : min(NT / items, 8u);
			for (uint32_t idx = tid; idx < items * S; idx += NT) {
				const uint32_t item = idx % items, part = idx / items;
				const uint32_t g = g_lo + item / TK, kk = item % TK, j = j0 + kk;
				const uint32_t rlo = max(g * W, r0) - r0;
				const uint32_t rhi = min((g + 1) * W, r0 + nr) - r0;
				float sum = 0.f;
				if (j < k1)
					for (uint32_t r = rlo + part; r < rhi; r += S)
						if (j <= qbase + (r0 + r) % W)
							sum +=
							    exp2f(ss[r * SP + kk] * c.scale_log2 -
								  rowm[r]) *
							    rowis[r];
				if (S == 1)
					add_vote(g, j, sum);
				else
					red[part * items + item] = sum;
			}
			if (S > 1) {
				__syncthreads();
				for (uint32_t item = tid; item < items; item += NT) {
					float sum = 0.f;
					for (uint32_t part = 0; part < S; part++)
						sum += red[part * items + item];
					add_vote(g_lo + item / TK, j0 + item % TK, sum);
				}
			}
		}
		__syncthreads();
	}

	if (PASS == 1) {
		/* merge the TPR threads of a row (adjacent lanes) */
#pragma unroll
		for (int off = 1; off < TPR; off <<= 1) {
			float om = __shfl_xor_sync(0xffffffffu, run_m, off);
			float os = __shfl_xor_sync(0xffffffffu, run_s, off);
			bad |= __shfl_xor_sync(0xffffffffu, bad, off);
			float nm = fmaxf(run_m, om);
			float a = run_m == -INFINITY ? 0.f : run_s * exp2f(run_m - nm);
			float b = om == -INFINITY ? 0.f : os * exp2f(om - nm);
			run_m = nm;
			run_s = a + b;
		}
		if (sub == 0 && my_r < nr) {
			part[my_r] = make_float2(run_m, run_s);
			if (bad) {
				uint32_t g = (r0 + my_r) / W;
				set_status(p.status, STATUS_NONFINITE, (int32_t)layer,
					   (int32_t)(kvh * G + g));
			}
		}
	} else if (p.row_tiles == 1) {
		zero_votes(k0 + (uint32_t)ntile * TK, k1);
	}
}

template <typename T, int D, bool TC>
static cudaError_t score_launch_one(const launch_params &p, int pass, cudaStream_t s)
{
	using sh = tile_shape<TC>;
	const smem_layout lay = score_smem<T, TC>(p.c.D);
	auto kern = pass == 1 ? score_kernel<T, D, TC, 1> : score_kernel<T, D, TC, 2>;
	cudaError_t e =
	    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)lay.total);
	if (e != cudaSuccess)
		return e;
	dim3 grid(p.chunks, p.row_tiles, p.n_layers * p.c.h_kv);
	SKV_LAUNCH(kern, grid, sh::THREADS, lay.total, s, p);
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

} /* namespace skvcuda */
