/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-compact.cu - the host side of a GPU compaction, in stages:
 * validation (the same skv_plan() as the host backend, so both reject the
 * same inputs), the call's constants (call_constants), its scratch plan
 * (plan_scratch: every region's size and offset, one allocation from the
 * stream-ordered allocator) and the enqueue of its launches (enqueue_call).
 * Nothing here waits for the GPU: a compaction is a sequence of launches on
 * the context's stream, and its status word comes back with an async copy
 * that skv_cuda_ctx_sync()/query() read.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv-cuda-ctx.cuh"

using namespace skvcuda;

/*
 * libskv's own (kernels/skv-driver.h, linked in statically): the budget
 * modes' per-layer C_l and forced count, and the caller's params as the
 * current struct with SPEC.md's partial window applied (window = n_q when
 * min_window <= n_q < W), so that both backends decide from the same numbers.
 */
extern "C" int skv_layer_caps(const struct skv_params *p, uint32_t n_layers, uint32_t *caps,
			      struct skv_error *err);
extern "C" uint32_t skv_forced_count(const struct skv_shape *sh, const struct skv_params *p);
extern "C" int skv_params_shaped(const struct skv_shape *sh, const struct skv_params *p,
				 struct skv_params *ret, struct skv_error *err);

/*
 * Fused scoring kernels spin-wait for blocks of their own grid, which is
 * safe only while no other spinning grid holds resident slots: every fused
 * launch of the process on a device waits for the previous one (an event
 * chain across the contexts' streams; host-side enqueue only, no sync).
 * Process-lifetime events, one per device, created on first use.
 */
#define FUSED_GATE_DEVICES 64
static pthread_mutex_t fused_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static cudaEvent_t fused_gate_ev[FUSED_GATE_DEVICES];

/* --------------------------------------------------------- validation */

static int check_tensor(const skv_tensor &t, const char *what, uint32_t layer, uint32_t heads,
			uint32_t tokens, bool out, struct skv_error *err)
{
	const int32_t l = (int32_t)layer;

	if (!t.data)
		return skv_cuda_fail(err, -EINVAL, l, -1, "layer %u: %s has no data", layer, what);
	if (!skv_dtype_size(t.dtype))
		return skv_cuda_fail(err, -EINVAL, l, -1, "layer %u: %s has unknown dtype %d",
				     layer, what, (int)t.dtype);
	/* SPEC.md "Quantized K/V": the host backend's for now; the score
	 * kernels here take one dtype for Q and K (f32, f16, bf16) */
	if (skv_dtype_is_fp8(t.dtype))
		return skv_cuda_fail(err, -EOPNOTSUPP, l, -1,
				     "layer %u: %s is %s: fp8 K/V run on the host backend only",
				     layer, what, skv_dtype_name(t.dtype));
	if (heads > 1 && t.head_stride == 0)
		return skv_cuda_fail(err, -EINVAL, l, -1, "layer %u: %s has head_stride 0", layer,
				     what);
	if (tokens > 1 && t.token_stride == 0 && (!t.block_table || t.block_size > 1))
		return skv_cuda_fail(err, -EINVAL, l, -1, "layer %u: %s has token_stride 0", layer,
				     what);
	if (!t.block_table)
		return 0;
	/* a paged output (the engine's block format) as a paged input: the
	 * caller range-checked the entries and kept the blocks disjoint */
	(void)out;
	if (t.block_size == 0)
		return skv_cuda_fail(err, -EINVAL, l, -1, "layer %u: %s has block_size 0", layer,
				     what);
	/* the table itself is device memory: its entries are the engine's to get right */
	uint64_t need = ((uint64_t)tokens + t.block_size - 1) / t.block_size;
	if (need > t.n_blocks)
		return skv_cuda_fail(err, -EINVAL, l, -1,
				     "layer %u: %s needs %llu blocks for %u tokens, table has %u",
				     layer, what, (unsigned long long)need, tokens, t.n_blocks);
	return 0;
}

static bool vec16_ok(const skv_tensor &t, size_t es, uint32_t D)
{
	if (((uintptr_t)t.data & 15) || (D * es) % 16)
		return false;
	int64_t s[3] = {t.head_stride, t.token_stride, t.block_table ? t.block_stride : 0};
	for (int i = 0; i < 3; i++)
		if ((s[i] * (int64_t)es) % 16)
			return false;
	return true;
}

static dten to_dten(const skv_tensor &t)
{
	dten d;
	memset(&d, 0, sizeof(d));
	d.data = (char *)t.data;
	d.head_stride = t.head_stride;
	d.token_stride = t.token_stride;
	d.block_stride = t.block_stride;
	d.block_table = t.block_table;
	d.block_size = t.block_size ? t.block_size : 1;
	return d;
}

static bool mul_ok(uint64_t *acc, uint64_t x)
{
	return !__builtin_mul_overflow(*acc, x, acc);
}

/* ------------------------------------------------------------ compact */

/*
 * Whether this request scores with the fused kernel: *ret_blocks = its
 * persistent grid (0: the two passes). It applies when the kernel fits the
 * device (shared memory: tensor cores up to head_dim 128, fp32 up to 256)
 * and an item's sub-chunks fit in the resident blocks (the kernel's
 * deadlock-freedom condition, see score.cu); else two-pass, or -ENOTSUP
 * with the reason for fused-only.
 */
static int plan_fused(struct skv_cuda_ctx *c, launch_params *b, enum skv_dtype dt,
		      uint32_t n_layers, int *ret_blocks, struct skv_error *err)
{
	if (c->score == SCORE_TWOPASS)
		return 0;
	const sel_consts &k = b->c;
	const uint32_t nsub = (k.L + SUBCHUNK - 1) / SUBCHUNK;
	const uint64_t items = (uint64_t)n_layers * k.h_kv * b->row_tiles;
	if (c->cap_dt != (int)dt || c->cap_d != k.D) {
		c->cap = c->dev->device >= 0 && c->dev->device < FUSED_GATE_DEVICES
			     ? score_fused_capacity(dt, k.D, c->dev->info.sm_count)
			     : 0;
		c->cap_dt = (int)dt;
		c->cap_d = k.D;
	}
	const int cap = c->cap;
	const char *why = NULL;
	if (cap <= 0)
		why = "the kernel does not fit this device for this dtype and head_dim";
	else if (nsub > (uint32_t)cap)
		why = "more key sub-chunks per item than resident blocks";
	else if (items * nsub + (uint64_t)cap * ((n_layers + LPL - 1) / LPL) > INT32_MAX)
		why = "too many tickets";
	if (why) {
		if (c->score != SCORE_FUSED_ONLY)
			return 0;
		return skv_cuda_fail(
		    err, -ENOTSUP, -1, -1,
		    "fused scoring (SKV_CUDA_SCORE=fused-only): %s (%u sub-chunks of "
		    "%d keys per item, %d resident blocks)",
		    why, nsub, SUBCHUNK, cap);
	}
	b->nsub = nsub;
	*ret_blocks = c->fused_grid ? c->fused_grid : cap;
	return 0;
}

/* One fused launch, after the previous fused launch on this device (any context). */
static cudaError_t fused_gated_launch(struct skv_cuda_ctx *c, const launch_params &lp,
				      enum skv_dtype dt, int blocks)
{
	const int d = c->dev->device;
	cudaError_t e = cudaSuccess;
	pthread_mutex_lock(&fused_gate_mu);
	if (!fused_gate_ev[d])
		e = cudaEventCreateWithFlags(&fused_gate_ev[d], cudaEventDisableTiming);
	else
		e = cudaStreamWaitEvent(c->stream, fused_gate_ev[d], 0);
	if (e == cudaSuccess)
		e = score_fused_launch(lp, dt, blocks, c->stream);
	if (e == cudaSuccess)
		e = cudaEventRecord(fused_gate_ev[d], c->stream);
	pthread_mutex_unlock(&fused_gate_mu);
	return e;
}

/* What a call decides per layer before anything is queued. */
struct call_plan {
	bool budget;	      /* the budget path (budget.cu): not plain uniform   */
	bool layer_bypass;    /* layers: some layer keeps all L (two-pass, runs)  */
	uint32_t max_rows;    /* most rows one head's output needs                */
	const uint32_t *caps; /* [n_layers] C_l (mass modes: C_max)             */
	const uint32_t *rows; /* [n_layers] skv_budget_rows()                   */
	uint32_t c_force;     /* a decision group's C* (mass; 0: the call's own) */
	bool force_fallback;  /* a decision group's fallback                    */
};

/* Every layer's tensors against the shape and rows[l]; *ret_gvec: 16-byte gathers. */
static int check_layers(const struct skv_shape *sh, const struct skv_plan &pl, bool scoring,
			uint32_t n_layers, const struct skv_layer_in *in,
			const struct skv_layer_out *out, const uint32_t *rows, bool *ret_kvec,
			bool *ret_gvec, struct skv_error *err)
{
	const uint32_t L = sh->prompt_len, D = sh->head_dim;
	const enum skv_dtype dt = in[0].k.dtype, odt = out[0].k.dtype;
	bool kvec = true, gvec = true;
	int r;

	for (uint32_t l = 0; l < n_layers; l++) {
		const skv_layer_in &li = in[l];
		const skv_layer_out &lo = out[l];
		if (scoring) {
			r = check_tensor(li.q, "q", l, sh->h_q, sh->n_q, false, err);
			if (r < 0)
				return r;
		}
		r = check_tensor(li.k, "k", l, sh->h_kv, L, false, err);
		if (!r)
			r = check_tensor(li.v, "v", l, sh->h_kv, L, false, err);
		if (!r)
			r = check_tensor(lo.k, "output k", l, pl.h_store, rows[l], true, err);
		if (!r)
			r = check_tensor(lo.v, "output v", l, pl.h_store, rows[l], true, err);
		if (r < 0)
			return r;
		if (!lo.positions)
			return skv_cuda_fail(err, -EINVAL, (int32_t)l, -1,
					     "layer %u: no positions output", l);
		if (lo.pos_stride < rows[l] && pl.h_store > 1)
			return skv_cuda_fail(err, -EINVAL, (int32_t)l, -1,
					     "layer %u: pos_stride %u is below the kept count %u",
					     l, lo.pos_stride, rows[l]);
		if (li.k.dtype != dt || li.v.dtype != dt || lo.k.dtype != odt ||
		    lo.v.dtype != odt || (scoring && li.q.dtype != dt))
			return skv_cuda_fail(err, -ENOTSUP, (int32_t)l, -1,
					     "layer %u: the CUDA backend needs q, k and v of one "
					     "dtype, outputs of one dtype, the same in every layer",
					     l);
		const size_t es = skv_dtype_size(dt), oes = skv_dtype_size(odt);
		kvec = kvec && vec16_ok(li.k, es, D);
		gvec = gvec && vec16_ok(li.k, es, D) && vec16_ok(li.v, es, D) &&
		       vec16_ok(lo.k, oes, D) && vec16_ok(lo.v, oes, D);
	}
	*ret_kvec = kvec;
	*ret_gvec = gvec;
	return 0;
}

/* The budget constants of a call (scratch pointers are set later). */
static void budget_setup(const struct skv_shape *sh, const struct skv_params *p,
			 const struct skv_plan &pl, bool select, uint32_t n_layers,
			 budget_consts *b)
{
	const uint32_t L = sh->prompt_len;
	memset(b, 0, sizeof(*b));
	b->mode = p->budget_mode;
	b->select = select;
	b->forced = pl.bypass ? 0 : skv_forced_count(sh, p);
	b->c_min = p->c_min;
	b->c_max = p->c_max;
	b->c_step = p->c_step;
	b->c_uniform = p->budget;
	b->n_heads = n_layers * pl.h_store;
	b->tau = p->tau;
	b->fallback_below = p->fallback_below;
	const uint32_t avail = L - b->forced;
	if (p->budget_mode == SKV_BUDGET_HEADS && select) {
		/* the host's floor: f = floor(a * P(C)) in double, at most avail */
		const uint32_t pc = p->budget - b->forced;
		const uint32_t f0 = (uint32_t)((double)p->head_floor * pc);
		b->floor = f0 < avail ? f0 : avail;
		b->layer_rest = pc - b->floor;
	}
	if ((p->budget_mode == SKV_BUDGET_MASS || p->budget_mode == SKV_BUDGET_MASS_HEADS) &&
	    select) {
		const uint32_t most = p->c_max - b->forced;
		b->r = most < avail ? most : avail;
		b->r2 = b->r ? 1 : 0;
		while (b->r2 < b->r)
			b->r2 <<= 1;
	}
}

/* Scoring of one launch's layers; layers that keep all L are skipped (two-pass runs). */
static cudaError_t score_layers(const launch_params &lp, const call_plan &cp, enum skv_dtype dt,
				cudaStream_t s, const char **what)
{
	cudaError_t e = cudaSuccess;
	const uint32_t L = lp.c.L;

	*what = "scoring";
	for (uint32_t a = 0; a < lp.n_layers && e == cudaSuccess;) {
		if (cp.layer_bypass && L < cp.caps[lp.layer0 + a]) {
			a++;
			continue;
		}
		uint32_t z = a + 1;
		while (z < lp.n_layers && !(cp.layer_bypass && L < cp.caps[lp.layer0 + z]))
			z++;
		if (a == 0 && z == lp.n_layers) {
			e = score_launch(lp, dt, 1, s);
			if (e == cudaSuccess)
				e = score_launch(lp, dt, 2, s);
			break;
		}
		launch_params *run = (launch_params *)malloc(sizeof(launch_params));
		if (!run)
			return cudaErrorMemoryAllocation;
		*run = lp;
		run->layer0 = lp.layer0 + a;
		run->n_layers = z - a;
		memmove(run->layers, run->layers + a, (size_t)(z - a) * sizeof(dlayer));
		e = score_launch(*run, dt, 1, s);
		if (e == cudaSuccess)
			e = score_launch(*run, dt, 2, s);
		free(run);
		a = z;
	}
	return e;
}

/* The largest grid y or z dimension: stored heads, (layer, K/V head) pairs
 * and row tiles each take one. */
constexpr uint32_t GRID_YZ_MAX = 65535;
/* Scratch regions start at this alignment (covers every element type). */
constexpr uint64_t SCRATCH_ALIGN = 256;

/* Shape limits of the CUDA path, checked before anything else of a call. */
static int check_limits(const struct skv_shape *sh, const struct skv_params *p,
			const struct skv_plan &pl, struct skv_error *err)
{
	const uint32_t L = sh->prompt_len, D = sh->head_dim;

	if (D > MAX_HEAD_DIM)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1,
				     "head_dim %u: the CUDA backend takes at most %u", D,
				     MAX_HEAD_DIM);
	if (pl.h_store > GRID_YZ_MAX)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1, "%u stored heads: at most %u",
				     pl.h_store, GRID_YZ_MAX);
	if (sh->h_kv > GRID_YZ_MAX / LPL)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1, "h_kv %u: at most %d", sh->h_kv,
				     (int)(GRID_YZ_MAX / LPL));
	if (p->budget_mode == SKV_BUDGET_HEADS && (uint64_t)pl.h_store * L > INT32_MAX)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1,
				     "heads: %u stored heads x L %u exceed 2^31 (head, position) "
				     "pairs per layer",
				     pl.h_store, L);
	return 0;
}

/* What one call does, decided from shape, params and plan before anything is queued. */
struct call_kind {
	bool scoring;  /* votes are computed (scoring policy, or query rows for the mass) */
	bool select;   /* votes choose the positions                                      */
	bool want_res; /* budget counts and masses are collected                          */
	uint32_t w_obs;
	enum skv_dtype dt, odt;
};

static call_kind call_kind_of(const struct skv_shape *sh, const struct skv_params *p,
			      const struct skv_plan &pl, const call_plan &cp,
			      const struct skv_layer_in *in, const struct skv_layer_out *out,
			      const struct skv_budget_result *res)
{
	const bool scores_policy = p->policy == SKV_POLICY_SNAPKV || p->policy == SKV_POLICY_H2O;
	call_kind k;

	k.scoring = !pl.bypass && (scores_policy || sh->n_q > 0);
	k.select = !pl.bypass && scores_policy;
	k.want_res = cp.budget || res;
	k.w_obs = !k.scoring			   ? 0
		  : p->policy == SKV_POLICY_SNAPKV ? p->window
		  : p->policy == SKV_POLICY_H2O	   ? sh->prompt_len
						   : sh->n_q;
	k.dt = in[0].k.dtype;
	k.odt = out[0].k.dtype;
	return k;
}

/* The constants every launch of a call shares (scratch pointers come later). */
static void call_constants(const struct skv_cuda_ctx *c, const struct skv_shape *sh,
			   const struct skv_params *p, const struct skv_plan &pl,
			   const call_plan &cp, const call_kind &ck, uint32_t n_layers, bool kvec,
			   launch_params *base)
{
	const uint32_t L = sh->prompt_len, D = sh->head_dim;
	sel_consts &k = base->c;

	k.L = L;
	k.D = D;
	k.h_q = sh->h_q;
	k.h_kv = sh->h_kv;
	k.G = sh->h_q / sh->h_kv;
	k.n_q = sh->n_q;
	k.h_store = pl.h_store;
	k.kept = cp.budget ? cp.max_rows : pl.kept;
	k.w_obs = ck.w_obs;
	k.sinks = ck.select ? 0 : pl.sinks;
	k.tail = ck.select ? pl.w_keep : 0;
	k.P = ck.select ? L - pl.w_keep : L;
	k.rank_votes = ck.select;
	k.group = p->gqa == SKV_GQA_GROUP;
	k.pooling = p->pooling;
	k.kernel = p->policy == SKV_POLICY_H2O ? 1 : p->kernel;
	k.span = ck.select && !cp.budget ? p->span : 0;
	k.bypass = pl.bypass;
	k.n_protected = p->n_protected;
	for (uint32_t i = 0; i < p->n_protected; i++) {
		k.prot_begin[i] = p->protected_ranges[i].begin;
		k.prot_end[i] = p->protected_ranges[i].end;
	}
	/* softmax in base 2: exp(z - m) = exp2(z * log2(e) - m * log2(e)), one ex2 per element */
	k.scale_log2 = (float)(1.4426950408889634 / sqrt((double)D));
	k.bypass_mass = 1.0f;
	base->vec16 = kvec;
	base->wait_limit_ns = c->wait_limit_ns;
	if (ck.want_res) {
		budget_setup(sh, p, pl, ck.select, n_layers, &base->b);
		base->b.c_force = cp.c_force;
		base->b.force_fallback = cp.force_fallback;
	}
}

/* Scratch regions of a call, in the order they lie in its one allocation. */
enum scratch_region {
	SCR_VOTES,    /* [N][H_q][L] float votes                                 */
	SCR_PARTIALS, /* two-pass row statistics, per chunk                      */
	SCR_SUBP,     /* fused: sub-chunk row statistics                         */
	SCR_STATS,    /* fused: merged row statistics                            */
	SCR_SYNC,     /* fused: tickets and item counters (zeroed per call)      */
	SCR_KEYS,     /* [N][H_store][L] selection keys                          */
	SCR_BUDGET,   /* budget_res, kept, fsum, mass, aux per (layer, head)     */
	SCR_RANK,     /* mass modes: rankings and their votes, r2 per head       */
	SCR_N
};

/* Where each region lies: offsets and sizes in bytes, every region SCRATCH_ALIGN-aligned. */
struct scratch_plan {
	uint64_t off[SCR_N];
	uint64_t size[SCR_N];
	uint64_t total;
	int fused_blocks; /* 0: two-pass scoring */
};

/* The one rounding of scratch sizes. */
static uint64_t scratch_round(uint64_t bytes)
{
	return (bytes + SCRATCH_ALIGN - 1) & ~(SCRATCH_ALIGN - 1);
}

/* acc = a * b * c * d, false on overflow. */
static bool bytes_of(uint64_t *acc, uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	*acc = a;
	return mul_ok(acc, b) && mul_ok(acc, c) && mul_ok(acc, d);
}

/*
 * Every scratch region's size and offset for one call; fixes the scoring
 * path too (base->row_tiles, chunks, nsub and n_launches are set here).
 * -ENOTSUP for too many query rows, -ENOMEM when a size overflows.
 */
static int plan_scratch(struct skv_cuda_ctx *c, const struct skv_shape *sh,
			const struct skv_plan &pl, const call_plan &cp, const call_kind &ck,
			uint32_t n_layers, launch_params *base, scratch_plan *sp,
			struct skv_error *err)
{
	const uint32_t L = sh->prompt_len, rt = score_rows_per_tile(ck.dt, sh->head_dim);
	const uint64_t nh = (uint64_t)n_layers * pl.h_store;
	uint64_t *sz = sp->size;
	bool ok = true;
	int r = 0;

	memset(sp, 0, sizeof(*sp));
	if (ck.scoring) {
		const uint64_t rows = (uint64_t)sh->h_q / sh->h_kv * ck.w_obs;
		if ((rows + rt - 1) / rt > GRID_YZ_MAX)
			return skv_cuda_fail(err, -ENOTSUP, -1, -1,
					     "%llu query rows per K/V head: at most %u",
					     (unsigned long long)rows, GRID_YZ_MAX * rt);
		base->row_tiles = (uint32_t)((rows + rt - 1) / rt);
		base->chunks = (L + CHUNK - 1) / CHUNK;
		ok = bytes_of(&sz[SCR_VOTES], 4, n_layers, sh->h_q, L) &&
		     bytes_of(&sz[SCR_PARTIALS], sizeof(float2) * rt, n_layers, sh->h_kv,
			      base->row_tiles) &&
		     mul_ok(&sz[SCR_PARTIALS], base->chunks);
		if (ok && !cp.layer_bypass)
			r = plan_fused(c, base, ck.dt, n_layers, &sp->fused_blocks, err);
	}
	if (ok && !r && sp->fused_blocks) {
		const uint64_t items = (uint64_t)n_layers * sh->h_kv * base->row_tiles;
		base->n_launches = (n_layers + LPL - 1) / LPL;
		sz[SCR_SUBP] = items * base->nsub * rt * sizeof(float2);
		sz[SCR_STATS] = items * rt * sizeof(float2);
		sz[SCR_SYNC] = (base->n_launches + items * sync_words(base->chunks)) * 4;
	}
	if (ok && !pl.bypass)
		ok = bytes_of(&sz[SCR_KEYS], base->c.span ? 8 : 4, n_layers, pl.h_store, L);
	if (ok && ck.want_res) {
		/* budget_res, then kept (4), fsum (8, aligned), mass (4) and aux (4) per head */
		sz[SCR_BUDGET] = sizeof(budget_res) + nh * (4 + 4 + 4 + 8) + 64;
		/* a ranking entry (8) and its vote (4); none at zero ranking width */
		if (base->b.r)
			ok = bytes_of(&sz[SCR_RANK], 8 + 4, nh, base->b.r2, 1);
	}
	if (r < 0)
		return r;
	if (!ok)
		return skv_cuda_fail(err, -ENOMEM, -1, -1, "scratch size overflows");
	for (int i = 0; i < SCR_N; i++) {
		sz[i] = scratch_round(sz[i]);
		sp->off[i] = sp->total;
		sp->total += sz[i];
	}
	return 0;
}

/* The scratch pointers of base, in the allocation at s laid out by sp. */
static void scratch_assign(const scratch_plan &sp, const call_kind &ck, uint64_t nh, char *s,
			   launch_params *base)
{
	const bool fused = sp.fused_blocks != 0;

	base->votes = ck.scoring ? (float *)(s + sp.off[SCR_VOTES]) : nullptr;
	base->partials = ck.scoring ? (float2 *)(s + sp.off[SCR_PARTIALS]) : nullptr;
	base->sub_partials = fused ? (float2 *)(s + sp.off[SCR_SUBP]) : nullptr;
	base->row_stats = fused ? (float2 *)(s + sp.off[SCR_STATS]) : nullptr;
	base->sync = fused ? (uint32_t *)(s + sp.off[SCR_SYNC]) : nullptr;
	base->keys = sp.size[SCR_KEYS] ? (uint32_t *)(s + sp.off[SCR_KEYS]) : nullptr;
	base->span_keys = base->keys && base->c.span ? base->keys + nh * base->c.L : nullptr;
	if (ck.want_res) {
		budget_consts &b = base->b;
		b.res = (budget_res *)(s + sp.off[SCR_BUDGET]);
		b.kept = (uint32_t *)(b.res + 1);
		b.fsum = (double *)(((uintptr_t)(b.kept + nh) + 7) & ~(uintptr_t)7);
		b.mass = (float *)(b.fsum + nh);
		b.aux = (uint32_t *)(b.mass + nh);
		b.ranked = sp.size[SCR_RANK] ? (uint64_t *)(s + sp.off[SCR_RANK]) : nullptr;
		b.rvote = sp.size[SCR_RANK] ? (float *)(b.ranked + nh * b.r2) : nullptr;
	}
}

/* One call's launches while they are queued: the first error stops the rest. */
struct enqueue {
	struct skv_cuda_ctx *c;
	const call_plan *cp;
	const call_kind *ck;
	const scratch_plan *sp;
	const struct skv_layer_in *in;
	const struct skv_layer_out *out;
	const launch_params *base;
	launch_params *lp; /* the launch being queued */
	uint32_t n_layers;
	bool res;  /* the caller wants a budget result */
	bool gvec; /* 16-byte gathers */
	cudaError_t e;
	const char *what; /* the step that failed */
};

/* q.lp: the constants and the layers [l0, l0 + LPL) of a launch. */
static void layers_at(enqueue &q, uint32_t l0)
{
	launch_params &lp = *q.lp;
	const uint32_t h_store = q.base->c.h_store;

	lp = *q.base;
	lp.layer0 = l0;
	lp.n_layers = q.n_layers - l0 < (uint32_t)LPL ? q.n_layers - l0 : (uint32_t)LPL;
	for (uint32_t i = 0; i < lp.n_layers; i++) {
		const skv_layer_in &li = q.in[l0 + i];
		const skv_layer_out &lo = q.out[l0 + i];
		dlayer &d = lp.layers[i];
		d.q = to_dten(li.q);
		d.k = to_dten(li.k);
		d.v = to_dten(li.v);
		d.ok = to_dten(lo.k);
		d.ov = to_dten(lo.v);
		d.positions = lo.positions;
		d.retained_mass = lo.retained_mass;
		d.pos_stride = lo.pos_stride;
		d.cap = q.cp->caps[l0 + i];
		/* uniform with a result: select.cu's masses land in scratch */
		if (!q.cp->budget && q.res && !d.retained_mass)
			d.retained_mass = q.base->b.mass + (size_t)(l0 + i) * h_store;
	}
}

/* One budget.cu step over q.lp's layers. */
static void step(enqueue &q, enum budget_step st, const char *name)
{
	if (q.e != cudaSuccess)
		return;
	q.what = name;
	q.e = budget_launch(*q.lp, st, q.c->stream);
}

static void gather(enqueue &q)
{
	if (q.e != cudaSuccess)
		return;
	q.what = "gather";
	q.e = gather_launch(*q.lp, q.ck->dt, q.ck->odt, q.gvec, q.c->stream);
}

/* Scoring of q.lp's layers, fused or two-pass. */
static void score(enqueue &q)
{
	const launch_params &lp = *q.lp;

	if (q.e != cudaSuccess || !q.ck->scoring)
		return;
	if (!q.sp->fused_blocks) {
		q.e = score_layers(lp, *q.cp, q.ck->dt, q.c->stream, &q.what);
		return;
	}
	q.what = "fused scoring";
	const uint64_t tickets = (uint64_t)lp.n_layers * lp.c.h_kv * lp.row_tiles * lp.nsub;
	const int blocks = q.sp->fused_blocks;
	q.e = fused_gated_launch(q.c, lp, q.ck->dt,
				 tickets < (uint64_t)blocks ? (int)tickets : blocks);
}

/* Per launch of layers: scoring, then select.cu and the gather (uniform), or
 * the per-head steps of budget.cu that need no call-wide decision. */
static void enqueue_layers(enqueue &q, enum skv_budget mode, bool bypass)
{
	for (uint32_t l0 = 0; q.e == cudaSuccess && l0 < q.n_layers; l0 += LPL) {
		layers_at(q, l0);
		score(q);
		if (!q.cp->budget) {
			if (q.e == cudaSuccess) {
				q.what = "selection";
				q.e = select_launch(*q.lp, q.c->stream);
			}
			/* the counts (the plan's) before the gather reads them */
			if (q.res)
				step(q, BSTEP_COLLECT, "result");
			gather(q);
			continue;
		}
		if (bypass)
			continue;
		step(q, BSTEP_KEYS, "selection keys");
		if (mode == SKV_BUDGET_MASS || mode == SKV_BUDGET_MASS_HEADS) {
			step(q, BSTEP_RANK, "ranking");
		} else {
			step(q, BSTEP_TOPK, "selection");
			if (mode == SKV_BUDGET_HEADS)
				step(q, BSTEP_HEADS_LAYER, "layer-wide selection");
		}
	}
}

/* The call-wide budget steps: C* and the picks at it (mass), emission, the
 * result, the fallback and the ragged gather. */
static void enqueue_budget(enqueue &q, enum skv_budget mode, bool fallback)
{
	const bool budget = q.cp->budget;

	if (budget && mode == SKV_BUDGET_MASS && q.ck->select) {
		layers_at(q, 0);
		step(q, BSTEP_CSTAR, "C*");
		for (uint32_t l0 = 0; q.e == cudaSuccess && l0 < q.n_layers; l0 += LPL) {
			layers_at(q, l0);
			step(q, BSTEP_MASS_FINISH, "picks at C*");
		}
	}
	for (uint32_t l0 = 0; budget && q.e == cudaSuccess && l0 < q.n_layers; l0 += LPL) {
		layers_at(q, l0);
		step(q, BSTEP_EMIT, "emission");
	}
	if (q.ck->want_res) {
		layers_at(q, 0);
		step(q, BSTEP_FINAL, "result");
	}
	for (uint32_t l0 = 0; budget && q.e == cudaSuccess && l0 < q.n_layers; l0 += LPL) {
		layers_at(q, l0);
		if (fallback)
			step(q, BSTEP_FULL, "fallback");
		gather(q);
	}
}

/*
 * Everything of one call on the context's stream, scratch allocated: status
 * and counters zeroed, the launches, the result copy. The caller closes the
 * stream's part of the call (status copy, scratch free, event) either way.
 */
static void enqueue_call(enqueue &q, const struct skv_params *p, const struct skv_plan &pl,
			 uint64_t nh)
{
	const launch_params &base = *q.base;
	const cudaStream_t s = q.c->stream;

	q.what = "cudaMemsetAsync";
	q.e = cudaMemsetAsync(q.c->d_status, 0, sizeof(dev_status), s);
	if (q.e == cudaSuccess && q.ck->scoring && base.row_tiles > 1)
		q.e = cudaMemsetAsync(base.votes, 0, q.sp->size[SCR_VOTES], s);
	if (q.e == cudaSuccess && q.sp->fused_blocks)
		q.e = cudaMemsetAsync(base.sync, 0, q.sp->size[SCR_SYNC], s);
	enqueue_layers(q, p->budget_mode, pl.bypass);
	enqueue_budget(q, p->budget_mode, p->fallback_below > 0.0f);
	if (q.e == cudaSuccess && q.res) {
		q.what = "result copy";
		q.e = cudaMemcpyAsync(q.c->h_res, base.b.res, sizeof(budget_res) + nh * 4,
				      cudaMemcpyDeviceToHost, s);
	}
}

/*
 * One validated call: its constants, its scratch plan, then the launches on
 * the context's stream. Once scratch is allocated the stream always gets the
 * status copy, the scratch free and the completion event; a failed launch
 * drains the stream so the context is reusable.
 */
static int compact_call(struct skv_cuda_ctx *c, const struct skv_shape *sh,
			const struct skv_params *p, const struct skv_plan &pl, const call_plan &cp,
			uint32_t n_layers, const struct skv_layer_in *in,
			const struct skv_layer_out *out, struct skv_budget_result *res,
			struct skv_error *err)
{
	const call_kind ck = call_kind_of(sh, p, pl, cp, in, out, res);
	const uint64_t nh = (uint64_t)n_layers * pl.h_store;
	launch_params *lps = NULL; /* [0] the constants, [1] the launch being queued */
	scratch_plan sp;
	char *scratch = NULL;
	bool kvec = true, gvec = true;

	int r = check_limits(sh, p, pl, err);
	if (r == 0)
		r = check_layers(sh, pl, ck.scoring, n_layers, in, out, cp.rows, &kvec, &gvec, err);
	if (r == 0) {
		lps = (launch_params *)calloc(2, sizeof(launch_params));
		r = lps ? 0 : skv_cuda_fail(err, -ENOMEM, -1, -1, "out of memory");
	}
	if (r == 0) {
		call_constants(c, sh, p, pl, cp, ck, n_layers, kvec, &lps[0]);
		r = skv_cuda_dev_enter(c->dev, err);
	}
	if (r == 0 && res)
		r = ctx_reserve_result(c, n_layers * pl.h_store, err);
	if (r == 0)
		r = plan_scratch(c, sh, pl, cp, ck, n_layers, &lps[0], &sp, err);
	if (r == 0 && sp.total) {
		cudaError_t ea = cudaMallocAsync((void **)&scratch, sp.total, c->stream);
		if (ea != cudaSuccess)
			r = rt_fail(err, ea, "scratch for the compaction");
	}
	if (r == 0) {
		scratch_assign(sp, ck, nh, scratch, &lps[0]);
		lps[0].status = c->d_status;
		enqueue q = {c,	      &cp,	&ck,	     &sp,  in,		out, &lps[0],
			     &lps[1], n_layers, res != NULL, gvec, cudaSuccess, NULL};
		enqueue_call(q, p, pl, nh);
		cudaMemcpyAsync(c->h_status, c->d_status, sizeof(dev_status),
				cudaMemcpyDeviceToHost, c->stream);
		if (scratch)
			cudaFreeAsync(scratch, c->stream);
		cudaEventRecord(c->done, c->stream);
		if (q.e != cudaSuccess) {
			/* error path only: drain what was queued so the context is reusable */
			cudaEventSynchronize(c->done);
			r = rt_fail(err, q.e, q.what);
		}
	}
	free(lps);
	if (r == 0) {
		c->res = res;
		c->res_heads = (uint32_t)nh;
		c->pending = 1;
	}
	return r;
}

/*
 * The checks of skv_compact_budget() in its order (the same messages), the
 * per-layer budgets and rows, then the launches.
 */
static int compact_entry(struct skv_cuda_ctx *c, const struct skv_shape *sh,
			 const struct skv_params *params, uint32_t n_layers,
			 const struct skv_layer_in *in, const struct skv_layer_out *out,
			 struct skv_budget_result *res, uint32_t c_force, bool force_fallback,
			 struct skv_error *err)
{
	struct skv_params pr;
	struct skv_plan pl;
	int r;

	if (err) {
		err->msg[0] = 0;
		err->layer = -1;
		err->head = -1;
	}
	if (!c)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "no context");
	if (c->pending)
		return skv_cuda_fail(err, -EBUSY, -1, -1,
				     "the previous compaction of this context was not synced");
	r = skv_plan(sh, params, &pl, err);
	if (r < 0)
		return r;
	skv_params_shaped(sh, params, &pr, err);
	const struct skv_params *p = &pr;
	if (res && res->result_size != sizeof(*res))
		return skv_cuda_fail(err, -EINVAL, -1, -1, "result_size is %u, expected %zu",
				     res->result_size, sizeof(*res));
	if (n_layers == 0)
		return 0;
	if (n_layers > 65535)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "%u layers exceed 65535", n_layers);
	if (!in || !out)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "layer inputs and outputs are required");
	const enum skv_budget mode = p->budget_mode;
	if ((!res || !res->kept) && (mode == SKV_BUDGET_HEADS || mode == SKV_BUDGET_MASS ||
				     mode == SKV_BUDGET_MASS_HEADS || p->fallback_below > 0.0f))
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "budget mode %s%s decides the counts per head: give a result "
				     "with a kept array (skv_compact_budget)",
				     skv_budget_name(mode),
				     p->fallback_below > 0.0f ? " with a fallback" : "");

	uint32_t *caps = (uint32_t *)malloc((size_t)n_layers * 2 * sizeof(uint32_t));
	if (!caps)
		return skv_cuda_fail(err, -ENOMEM, -1, -1, "out of memory");
	call_plan cp;
	memset(&cp, 0, sizeof(cp));
	cp.caps = caps;
	cp.rows = caps + n_layers;
	cp.budget = mode != SKV_BUDGET_UNIFORM || p->fallback_below > 0.0f;
	cp.c_force = mode == SKV_BUDGET_MASS ? c_force : 0;
	cp.force_fallback = force_fallback;
	if (p->span && cp.budget)
		r = skv_cuda_fail(err, -ENOTSUP, -1, -1,
				  "span %u on the CUDA backend: budget mode uniform without a "
				  "fallback only (the host backend also takes layers)",
				  p->span);
	if (r == 0 && force_fallback && !(p->fallback_below > 0.0f))
		r = skv_cuda_fail(err, -EINVAL, -1, -1,
				  "a group's fallback needs fallback_below > 0 (room for L)");
	if (r == 0)
		r = skv_budget_rows(sh, p, n_layers, caps + n_layers, err);
	if (r == 0)
		r = skv_layer_caps(p, n_layers, caps, err);
	for (uint32_t l = 0; r == 0 && l < n_layers; l++) {
		cp.max_rows = cp.rows[l] > cp.max_rows ? cp.rows[l] : cp.max_rows;
		cp.layer_bypass |= mode == SKV_BUDGET_LAYERS && sh->prompt_len < caps[l];
	}
	if (r == 0)
		r = compact_call(c, sh, p, pl, cp, n_layers, in, out, res, err);
	free(caps);
	return r;
}

extern "C" int skv_cuda_compact(struct skv_cuda_ctx *c, const struct skv_shape *sh,
				const struct skv_params *p, uint32_t n_layers,
				const struct skv_layer_in *in, const struct skv_layer_out *out,
				struct skv_error *err)
{
	return compact_entry(c, sh, p, n_layers, in, out, NULL, 0, false, err);
}

extern "C" int skv_cuda_compact_budget(struct skv_cuda_ctx *c, const struct skv_shape *sh,
				       const struct skv_params *p, uint32_t n_layers,
				       const struct skv_layer_in *in,
				       const struct skv_layer_out *out,
				       struct skv_budget_result *res, struct skv_error *err)
{
	return compact_entry(c, sh, p, n_layers, in, out, res, 0, false, err);
}

extern "C" int skv_cuda_compact_decided(struct skv_cuda_ctx *c, const struct skv_shape *sh,
					const struct skv_params *p, uint32_t n_layers,
					const struct skv_layer_in *in,
					const struct skv_layer_out *out, uint32_t c_star,
					int fallback, struct skv_budget_result *res,
					struct skv_error *err)
{
	if (!res)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "a decided compaction needs a result");
	return compact_entry(c, sh, p, n_layers, in, out, res, c_star, fallback != 0, err);
}
