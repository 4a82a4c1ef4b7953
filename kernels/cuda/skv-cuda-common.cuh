/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-common.cuh - what the CUDA kernels of libskv-cuda share: the
 * device view of a tensor, the per-launch layer descriptors, dtype helpers
 * and the dispatch switches that turn a runtime dtype / head_dim into
 * compile-time constants (FlashInfer style). Not installed.
 *
 * Layer descriptors travel as kernel parameters (no host staging buffer, so
 * nothing must be synchronised before a compaction can be enqueued).
 */
#ifndef SKV_CUDA_COMMON_CUH
#define SKV_CUDA_COMMON_CUH

#include <stdint.h>

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "skv.h"

/*
 * Kernel launches and dynamic shared memory go through these two macros so
 * that tests/gpu/emu can compile the kernels as host C++ and run them in a
 * CPU emulation of the CUDA execution model (no GPU needed).
 */
#ifndef SKV_CUDA_EMU
#define SKV_LAUNCH(kern, grid, block, smem, stream, ...)                                           \
	kern<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define SKV_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
/* A grid whose blocks may wait for each other: the emulator runs them all at once. */
#define SKV_LAUNCH_PERSISTENT(kern, grid, block, smem, stream, ...)                                \
	kern<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

namespace skvcuda
{

/*
 * Layers per kernel launch. The descriptors travel as kernel parameters
 * (CUDA >= 12.1 takes up to 32764 bytes on sm_70+), so one launch of each
 * kernel covers every layer of models up to 96 layers, with no host staging.
 */
constexpr int LPL = 96;
/* Largest head_dim the CUDA backend handles (shared-memory tiles). */
constexpr uint32_t MAX_HEAD_DIM = 256;
/* Keys one two-pass scoring block streams (a multiple of the key tile). */
constexpr int CHUNK = 1024;
/*
 * Row statistics are computed per SUBCHUNK keys and merged in a fixed order
 * (the sub-chunks of a chunk, then the chunks), by both scoring paths: the
 * fused kernel's blocks take one sub-chunk each and still reproduce the
 * two-pass path's arithmetic exactly.
 */
constexpr int SUBCHUNK = 256;
constexpr int SUBS_PER_CHUNK = CHUNK / SUBCHUNK;
/* Status words written by the kernels, read back by the host after the stream. */
enum status_code {
	STATUS_OK = 0,
	STATUS_NONFINITE = 1, /* a logit was NaN/Inf: -EDOM                 */
	STATUS_INTERNAL = 2,  /* a selection did not produce `kept` slots   */
	STATUS_STALLED = 3,   /* fused scoring: a block gave up waiting     */
};
/*
 * How long a fused-scoring block waits for the rest of its item before it
 * gives up (STATUS_STALLED: the request fails with -EIO instead of the
 * stream hanging; the grid still finishes, every wait being bounded).
 * Legitimate waits are microseconds (the item's other blocks compute one
 * sub-chunk each), or a time slice when another context shares the GPU.
 */
constexpr uint64_t FUSED_WAIT_LIMIT_NS = 10ull * 1000 * 1000 * 1000; /* default */
struct dev_status {
	int32_t code;
	int32_t layer;
	int32_t head;
	int32_t pad;
};

/* Element (h, t, d) of a strided or paged tensor, see struct skv_tensor. */
struct dten {
	char *data;
	int64_t head_stride;  /* elements */
	int64_t token_stride; /* elements */
	int64_t block_stride; /* elements, paged only */
	const int32_t *block_table;
	uint32_t block_size;
	uint32_t pad;
};

/* Element offset of (h, t, 0). */
__device__ __forceinline__ int64_t dten_off(const dten &t, uint32_t h, uint32_t tok)
{
	if (t.block_table) {
		int64_t blk = t.block_table[tok / t.block_size];
		return blk * t.block_stride + (int64_t)(tok % t.block_size) * t.token_stride +
		       (int64_t)h * t.head_stride;
	}
	return (int64_t)tok * t.token_stride + (int64_t)h * t.head_stride;
}

struct dlayer {
	dten q;	 /* [H_q, n_q, D]        */
	dten k;	 /* [H_kv, L, D]         */
	dten v;	 /* [H_kv, L, D]         */
	dten ok; /* [H_store, >=kept, D] */
	dten ov; /* [H_store, >=kept, D] */
	int32_t *positions;
	float *retained_mass;
	uint32_t pos_stride;
	uint32_t cap; /* budget modes: C_l of the layer (mass modes: C_max) */
};

/* Selection constants of one compaction (skv_plan() output + params). */
struct sel_consts {
	uint32_t L;
	uint32_t D;
	uint32_t h_q;
	uint32_t h_kv;
	uint32_t G;
	uint32_t n_q;
	uint32_t h_store;
	uint32_t kept;
	uint32_t w_obs;	     /* rows scored (the last w_obs of q); 0: no scoring     */
	uint32_t sinks;	     /* first positions always kept                          */
	uint32_t tail;	     /* last positions always kept (W_keep, scoring policies) */
	uint32_t P;	     /* candidates and pooling live in [0, P)                */
	uint32_t rank_votes; /* 1: rank by pooled votes; 0: by position (recent)    */
	uint32_t group;	     /* 1: GQA group mode                                    */
	uint32_t pooling;
	uint32_t kernel; /* effective pooling width (1 = none)                     */
	uint32_t bypass;
	uint32_t n_protected;
	uint32_t prot_begin[SKV_MAX_PROTECTED];
	uint32_t prot_end[SKV_MAX_PROTECTED];
	float scale_log2;  /* log2(e) / sqrt(D): logits in base 2 for exp2f     */
	float bypass_mass; /* retained mass reported when nothing is scored (L < C) */
	uint32_t span;	   /* span-aware selection (skv.h): neighbours per side; 0 = top-k */
};

/* What a budget-mode compaction hands back (device copy, then the caller's result). */
struct budget_res {
	uint32_t c_star;
	int32_t fallback;
	float min_mass;
	uint32_t pad;
};

/* The budget modes (budget.cu); all zero for a plain uniform compaction. */
struct budget_consts {
	uint32_t mode;	     /* enum skv_budget                                 */
	uint32_t select;     /* 1: scores choose the positions                 */
	uint32_t forced;     /* F: positions every head keeps                   */
	uint32_t floor;	     /* heads: f, each head's own picks                 */
	uint32_t layer_rest; /* heads: P(C) - f, per head, taken layer-wide     */
	uint32_t r;	     /* mass modes: ranked picks held per head          */
	uint32_t r2;	     /* r rounded up to a power of two (sort length)    */
	uint32_t c_min, c_max, c_step;
	uint32_t c_uniform; /* uniform: C, reported as C*                      */
	uint32_t n_heads;   /* N x H_store of the whole call                   */
	float tau;
	float fallback_below;
	/* a decision group's choice (skv_cuda_compact_decided): C* at least
	 * c_force (mass), the fallback when force_fallback; 0: the call's own */
	uint32_t c_force, force_fallback;
	uint32_t *kept;	  /* [N][H_store] rows kept per head (gather reads it) */
	float *mass;	  /* [N][H_store] retained mass                        */
	uint32_t *aux;	  /* [N][H_store] mass: the smallest ladder C          */
	double *fsum;	  /* [N][H_store] mass: the forced votes' sum          */
	uint64_t *ranked; /* [N][H_store][r2] mass modes: best first           */
	float *rvote;	  /* [N][H_store][r2] their votes, in rank order        */
	budget_res *res;  /* C*, fallback, min_mass                           */
};

/* Parameters of every launch: constants, scratch and up to LPL layers. */
struct launch_params {
	sel_consts c;
	uint32_t layer0;   /* global index of layers[0] (for status and scratch) */
	uint32_t n_layers; /* valid entries of layers[]                          */
	uint32_t row_tiles;
	uint32_t chunks;
	uint32_t vec16;	     /* 1: K, V and outputs allow 16-byte vector access  */
	uint32_t nsub;	     /* fused: SUBCHUNK-key sub-chunks per item           */
	uint32_t n_launches; /* fused: ticket counters at the head of `sync`      */
	uint32_t pad;
	float *votes;	  /* [N][H_q][L] column sums of probabilities         */
	float2 *partials; /* [N][H_kv][row_tiles][chunks][RT] (max, sum)       */
	/* fused scoring only (else null) */
	float2 *sub_partials;	/* [N][H_kv][row_tiles][nsub][RT] (max, sum)          */
	float2 *row_stats;	/* [N][H_kv][row_tiles][RT] merged (max, sum)         */
	uint32_t *sync;		/* [n_launches] tickets, then per item sync_words()   */
	uint64_t wait_limit_ns; /* fused: a block gives up waiting after this      */
	uint32_t *keys;		/* [N][H_store][L] ordered selection keys            */
	uint32_t *span_keys;	/* span: [N][H_store][L] best centre keys, then ranks  */
	dev_status *status;
	budget_consts b; /* budget modes (b.kept: per-head rows for the gather) */
	dlayer layers[LPL];
};
static_assert(sizeof(launch_params) <= 32764, "kernel parameters are limited to 32764 bytes");

/*
 * Counters of one fused item (layer, K/V head, row tile): [0] its row
 * statistics are final, [1] chunks merged, [2 + c] sub-chunks of chunk c
 * published. Zeroed per request on the stream.
 */
__host__ __device__ constexpr uint32_t sync_words(uint32_t chunks)
{
	return 2 + chunks;
}

template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x)
{
	return x;
}
template <> __device__ __forceinline__ float to_f32<__half>(__half x)
{
	return __half2float(x);
}
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x)
{
	return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x)
{
	return x;
}
template <> __device__ __forceinline__ __half from_f32<__half>(float x)
{
	return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x)
{
	return __float2bfloat16_rn(x);
}

/* Order-preserving map of a float to uint32 (larger float, larger key). */
__device__ __forceinline__ uint32_t ordered_key(float f)
{
	uint32_t u = __float_as_uint(f);
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ void set_status(dev_status *st, int32_t code, int32_t layer,
					   int32_t head)
{
	if (atomicCAS(&st->code, 0, code) == 0) {
		st->layer = layer;
		st->head = head;
	}
}

/*
 * Inter-block signalling of the fused scoring kernel, at GPU scope: a block
 * publishes with (all threads store; __syncthreads(); one thread
 * __threadfence() then atomic), and observes with (one thread polls with
 * ld_acquire() and __nanosleep(), then __threadfence(); __syncthreads()), the
 * pattern of a cooperative-groups grid barrier.
 */
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t *p)
{
#ifdef SKV_CUDA_EMU
	return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
	uint32_t v;
	asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
#endif
}

/* Nanoseconds of the GPU's global timer (on the emulator: its virtual clock). */
__device__ __forceinline__ uint64_t globaltimer_ns()
{
#ifdef SKV_CUDA_EMU
	return emu::globaltimer_ns();
#else
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
#endif
}

/* Host launchers (one per topic file). All return the launch's cudaError_t. */
cudaError_t score_launch(const launch_params &p, enum skv_dtype dt, int pass, cudaStream_t s);
/*
 * Fused scoring (one launch instead of passes 1 and 2): blocks the device
 * keeps resident at once for this dtype/head_dim (occupancy x SMs, 0 when
 * the kernel does not fit), and the launch of a persistent grid of `blocks`.
 */
int score_fused_capacity(enum skv_dtype dt, uint32_t head_dim, int sm_count);
cudaError_t score_fused_launch(const launch_params &p, enum skv_dtype dt, int blocks,
			       cudaStream_t s);
cudaError_t select_launch(const launch_params &p, cudaStream_t s);
/* The steps of a budget-mode selection (budget.cu), in the order they run. */
enum budget_step {
	BSTEP_KEYS,	   /* candidate keys per head                          */
	BSTEP_TOPK,	   /* layers/uniform: own top; heads: the floor        */
	BSTEP_HEADS_LAYER, /* heads: the layer-wide rest                       */
	BSTEP_RANK,	   /* mass modes: ranking and curve                    */
	BSTEP_CSTAR,	   /* mass: C*                                         */
	BSTEP_MASS_FINISH, /* mass: the picks at C*                            */
	BSTEP_EMIT,	   /* positions, counts, masses                        */
	BSTEP_COLLECT,	   /* uniform through select.cu: counts and masses     */
	BSTEP_FINAL,	   /* min mass, fallback, C*                           */
	BSTEP_FULL,	   /* the fallback's full prompt                       */
};
cudaError_t budget_launch(const launch_params &p, enum budget_step step, cudaStream_t s);
cudaError_t gather_launch(const launch_params &p, enum skv_dtype in_dt, enum skv_dtype out_dt,
			  int vec16, cudaStream_t s);
/* Rows per scoring block for a dtype/head_dim (decides row_tiles). */
uint32_t score_rows_per_tile(enum skv_dtype dt, uint32_t head_dim);

} /* namespace skvcuda */

/* Dispatch a runtime dtype to a type T. */
#define SKV_DISPATCH_DTYPE(dt, T, ...)                                                             \
	[&]() -> cudaError_t {                                                                     \
		switch (dt) {                                                                      \
		case SKV_DTYPE_F32: {                                                              \
			using T = float;                                                           \
			return __VA_ARGS__();                                                      \
		}                                                                                  \
		case SKV_DTYPE_F16: {                                                              \
			using T = __half;                                                          \
			return __VA_ARGS__();                                                      \
		}                                                                                  \
		case SKV_DTYPE_BF16: {                                                             \
			using T = __nv_bfloat16;                                                   \
			return __VA_ARGS__();                                                      \
		}                                                                                  \
		default:                                                                           \
			return cudaErrorInvalidValue;                                              \
		}                                                                                  \
	}()

/* Dispatch the head dims with a tensor-core path; other values go to D = 0 (runtime). */
#define SKV_DISPATCH_HEAD_DIM(d, D, ...)                                                           \
	[&]() -> cudaError_t {                                                                     \
		switch (d) {                                                                       \
		case 64: {                                                                         \
			constexpr int D = 64;                                                      \
			return __VA_ARGS__();                                                      \
		}                                                                                  \
		case 128: {                                                                        \
			constexpr int D = 128;                                                     \
			return __VA_ARGS__();                                                      \
		}                                                                                  \
		case 256: {                                                                        \
			constexpr int D = 256;                                                     \
			return __VA_ARGS__();                                                      \
		}                                                                                  \
		default: {                                                                         \
			constexpr int D = 0;                                                       \
			return __VA_ARGS__();                                                      \
		}                                                                                  \
		}                                                                                  \
	}()

#endif /* SKV_CUDA_COMMON_CUH */
