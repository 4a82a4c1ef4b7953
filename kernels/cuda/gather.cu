/* SPDX-License-Identifier: MIT */
/*
 * gather.cu - copy the kept K and V rows, in ascending position order, from
 * the (strided or paged) engine tensors into the compact outputs (any
 * strides). K and V use the same indices. Rows move as 16-byte vectors when
 * every address allows it, else element by element; a dtype change between
 * input and output converts through fp32 with round-to-nearest-even.
 */
#include "skv-cuda-common.cuh"

namespace skvcuda
{

constexpr int GATHER_ROWS = 32; /* kept slots per block */
constexpr int GATHER_THREADS = 256;

/* Rows kept by stored head h of layer-in-launch ll: the plan's, or the
 * budget modes' per-head count (ragged; the grid is sized for the most). */
__device__ __forceinline__ uint32_t head_kept(const launch_params &p, uint32_t h, uint32_t ll)
{
	if (!p.b.kept)
		return p.c.kept;
	return p.b.kept[(size_t)(p.layer0 + ll) * p.c.h_store + h];
}

/* The block's n kept positions of head h from slot i0 into shared memory, for every thread. */
__device__ __forceinline__ void load_positions(const dlayer &ly, uint32_t h, uint32_t i0,
					       uint32_t n, int32_t *spos)
{
	for (uint32_t i = threadIdx.x; i < n; i += GATHER_THREADS)
		spos[i] = ly.positions[(size_t)h * ly.pos_stride + i0 + i];
	__syncthreads();
}

/* Slot i of a paged output whose block is SKV_BLOCK_IN_PLACE (a leading
 * entry of the table, skv.h): its rows are there already, never written.
 * The daemon checked that such blocks cover protected positions only. */
__device__ __forceinline__ bool slot_in_place(const dten &t, uint32_t i)
{
	return t.block_table && t.block_table[i / t.block_size] < 0;
}

/*
 * grid:  x = slot block (GATHER_ROWS slots), y = stored head, z = layer in launch
 * in:    layers[].k, .v [H_kv, L, D]; layers[].positions [H_store][pos_stride]
 * out:   layers[].ok, .ov [H_store, >= kept, D]
 * U:     copy unit (uint4 for 16-byte vectors, else the element's width)
 */
template <typename U>
__global__ void __launch_bounds__(GATHER_THREADS)
    gather_kernel(const __grid_constant__ launch_params p, uint32_t es, uint32_t row_units)
{
	const sel_consts &c = p.c;
	const uint32_t h = blockIdx.y, ll = blockIdx.z;
	const dlayer &ly = p.layers[ll];
	const uint32_t i0 = blockIdx.x * GATHER_ROWS;
	const uint32_t kept = head_kept(p, h, ll);
	if (i0 >= kept)
		return;
	const uint32_t n = min((uint32_t)GATHER_ROWS, kept - i0);
	const uint32_t kvh = c.group ? h : h / c.G;
	__shared__ int32_t spos[GATHER_ROWS];

	load_positions(ly, h, i0, n, spos);
	for (uint32_t idx = threadIdx.x; idx < n * row_units; idx += GATHER_THREADS) {
		const uint32_t i = idx / row_units, u = idx % row_units;
		const uint32_t pos = (uint32_t)spos[i];
		if (pos >= c.L || /* never after a good selection; keeps a bad one in bounds */
		    slot_in_place(ly.ok, i0 + i))
			continue;
		const U *sk = (const U *)(ly.k.data + dten_off(ly.k, kvh, pos) * es) + u;
		const U *sv = (const U *)(ly.v.data + dten_off(ly.v, kvh, pos) * es) + u;
		U *dk = (U *)(ly.ok.data + dten_off(ly.ok, h, i0 + i) * es) + u;
		U *dv = (U *)(ly.ov.data + dten_off(ly.ov, h, i0 + i) * es) + u;
		*dk = *sk;
		*dv = *sv;
	}
}

/* Element-wise variant that converts the dtype (RNE on the way down), as the host does. */
template <typename TI, typename TO>
__global__ void __launch_bounds__(GATHER_THREADS)
    gather_convert_kernel(const __grid_constant__ launch_params p)
{
	const sel_consts &c = p.c;
	const uint32_t h = blockIdx.y, ll = blockIdx.z;
	const dlayer &ly = p.layers[ll];
	const uint32_t i0 = blockIdx.x * GATHER_ROWS;
	const uint32_t kept = head_kept(p, h, ll);
	if (i0 >= kept)
		return;
	const uint32_t n = min((uint32_t)GATHER_ROWS, kept - i0);
	const uint32_t kvh = c.group ? h : h / c.G;
	__shared__ int32_t spos[GATHER_ROWS];

	load_positions(ly, h, i0, n, spos);
	for (uint32_t idx = threadIdx.x; idx < n * c.D; idx += GATHER_THREADS) {
		const uint32_t i = idx / c.D, d = idx % c.D;
		const uint32_t pos = (uint32_t)spos[i];
		if (pos >= c.L || slot_in_place(ly.ok, i0 + i))
			continue;
		float k = to_f32<TI>(((const TI *)ly.k.data)[dten_off(ly.k, kvh, pos) + d]);
		float v = to_f32<TI>(((const TI *)ly.v.data)[dten_off(ly.v, kvh, pos) + d]);
		((TO *)ly.ok.data)[dten_off(ly.ok, h, i0 + i) + d] = from_f32<TO>(k);
		((TO *)ly.ov.data)[dten_off(ly.ov, h, i0 + i) + d] = from_f32<TO>(v);
	}
}

static dim3 gather_grid(const launch_params &p)
{
	return dim3((p.c.kept + GATHER_ROWS - 1) / GATHER_ROWS, p.c.h_store, p.n_layers);
}

template <typename U>
static cudaError_t gather_launch_unit(const launch_params &p, uint32_t es, cudaStream_t s)
{
	const uint32_t row_units = (uint32_t)(p.c.D * es / sizeof(U));
	auto kern = gather_kernel<U>;
	SKV_LAUNCH(kern, gather_grid(p), GATHER_THREADS, 0, s, p, es, row_units);
	return cudaGetLastError();
}

template <typename TI>
static cudaError_t gather_launch_from(const launch_params &p, enum skv_dtype out_dt, cudaStream_t s)
{
	return SKV_DISPATCH_DTYPE(out_dt, TO, [&]() -> cudaError_t {
		auto kern = gather_convert_kernel<TI, TO>;
		SKV_LAUNCH(kern, gather_grid(p), GATHER_THREADS, 0, s, p);
		return cudaGetLastError();
	});
}

cudaError_t gather_launch(const launch_params &p, enum skv_dtype in_dt, enum skv_dtype out_dt,
			  int vec16, cudaStream_t s)
{
	if (p.c.kept == 0)
		return cudaSuccess;
	if (in_dt != out_dt)
		return SKV_DISPATCH_DTYPE(in_dt, TI, [&]() -> cudaError_t {
			return gather_launch_from<TI>(p, out_dt, s);
		});
	const uint32_t es = in_dt == SKV_DTYPE_F32 ? 4 : 2;
	if (vec16)
		return gather_launch_unit<uint4>(p, es, s);
	if (es == 4)
		return gather_launch_unit<uint32_t>(p, es, s);
	return gather_launch_unit<uint16_t>(p, es, s);
}

} /* namespace skvcuda */
