/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-compact.cu - the host side of a GPU compaction: validation (the
 * same skv_plan() as the host backend, so both reject the same inputs),
 * scratch from the stream-ordered allocator, and the launches. Nothing here
 * waits for the GPU: a compaction is a sequence of launches on the context's
 * stream, and its status word comes back with an async copy that
 * skv_cuda_ctx_sync()/query() read.
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
 * modes' per-layer C_l and forced count, and V1 params as the current struct,
 * so that both backends decide from the same numbers.
 */
extern "C" int skv_layer_caps(const struct skv_params *p, uint32_t n_layers, uint32_t *caps,
			      struct skv_error *err);
extern "C" uint32_t skv_forced_count(const struct skv_shape *sh, const struct skv_params *p);
extern "C" int skv_params_resolve(const struct skv_params *p, struct skv_params *ret,
				  struct skv_error *err);

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

static int compact_call(struct skv_cuda_ctx *c, const struct skv_shape *sh,
			const struct skv_params *p, const struct skv_plan &pl, const call_plan &cp,
			uint32_t n_layers, const struct skv_layer_in *in,
			const struct skv_layer_out *out, struct skv_budget_result *res,
			struct skv_error *err)
{
	int r;
	const uint32_t L = sh->prompt_len, D = sh->head_dim, G = sh->h_q / sh->h_kv;
	const bool scores_policy = p->policy == SKV_POLICY_SNAPKV || p->policy == SKV_POLICY_H2O;
	const bool scoring = !pl.bypass && (scores_policy || sh->n_q > 0);
	const bool select = !pl.bypass && scores_policy;
	const uint32_t w_obs = !scoring				? 0
			       : p->policy == SKV_POLICY_SNAPKV ? p->window
			       : p->policy == SKV_POLICY_H2O	? L
								: sh->n_q;
	if (D > MAX_HEAD_DIM)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1,
				     "head_dim %u: the CUDA backend takes at most %u", D,
				     MAX_HEAD_DIM);
	if (pl.h_store > 65535)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1, "%u stored heads: at most 65535",
				     pl.h_store);
	if (sh->h_kv > 65535 / LPL)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1, "h_kv %u: at most %d", sh->h_kv,
				     65535 / LPL);
	if (p->budget_mode == SKV_BUDGET_HEADS && (uint64_t)pl.h_store * L > INT32_MAX)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1,
				     "heads: %u stored heads x L %u exceed 2^31 (head, position) "
				     "pairs per layer",
				     pl.h_store, L);

	const enum skv_dtype dt = in[0].k.dtype, odt = out[0].k.dtype;
	bool kvec = true, gvec = true;
	r = check_layers(sh, pl, scoring, n_layers, in, out, cp.rows, &kvec, &gvec, err);
	if (r < 0)
		return r;

	/* constants shared by every launch */
	launch_params *basep = (launch_params *)calloc(2, sizeof(launch_params));
	if (!basep)
		return skv_cuda_fail(err, -ENOMEM, -1, -1, "out of memory");
	launch_params &base = basep[0], &lp = basep[1];
	sel_consts &k = base.c;
	k.L = L;
	k.D = D;
	k.h_q = sh->h_q;
	k.h_kv = sh->h_kv;
	k.G = G;
	k.n_q = sh->n_q;
	k.h_store = pl.h_store;
	k.kept = cp.budget ? cp.max_rows : pl.kept;
	k.w_obs = w_obs;
	k.sinks = select ? 0 : pl.sinks;
	k.tail = select ? pl.w_keep : 0;
	k.P = select ? L - pl.w_keep : L;
	k.rank_votes = select;
	k.group = p->gqa == SKV_GQA_GROUP;
	k.pooling = p->pooling;
	k.kernel = p->policy == SKV_POLICY_H2O ? 1 : p->kernel;
	k.bypass = pl.bypass;
	k.n_protected = p->n_protected;
	for (uint32_t i = 0; i < p->n_protected; i++) {
		k.prot_begin[i] = p->protected_ranges[i].begin;
		k.prot_end[i] = p->protected_ranges[i].end;
	}
	/* softmax in base 2: exp(z - m) = exp2(z * log2(e) - m * log2(e)), one ex2 per element */
	k.scale_log2 = (float)(1.4426950408889634 / sqrt((double)D));
	k.bypass_mass = 1.0f;
	base.vec16 = kvec;
	base.wait_limit_ns = c->wait_limit_ns;
	const bool want_res = cp.budget || res;
	if (want_res)
		budget_setup(sh, p, pl, select, n_layers, &base.b);

	r = skv_cuda_dev_enter(c->dev, err);
	if (r == 0 && res)
		r = ctx_reserve_result(c, n_layers * pl.h_store, err);
	if (r < 0) {
		free(basep);
		return r;
	}

	/* scratch: votes, pass-1 partials, selection keys, budget arrays; one allocation */
	uint64_t votes_b = 0, part_b = 0, keys_b = 0, subp_b = 0, stats_b = 0, sync_b = 0;
	uint64_t bud_b = 0, rank_b = 0;
	const uint32_t rt = score_rows_per_tile(dt, D);
	int fused_blocks = 0;
	const uint64_t nh = (uint64_t)n_layers * pl.h_store;
	if (scoring) {
		uint64_t rows = (uint64_t)G * w_obs;
		base.row_tiles = (uint32_t)((rows + rt - 1) / rt);
		base.chunks = (L + CHUNK - 1) / CHUNK;
		if ((rows + rt - 1) / rt > 65535) {
			free(basep);
			return skv_cuda_fail(err, -ENOTSUP, -1, -1,
					     "%llu query rows per K/V head: at most %u",
					     (unsigned long long)rows, 65535u * rt);
		}
		votes_b = 4;
		part_b = sizeof(float2) * rt;
		if (!mul_ok(&votes_b, n_layers) || !mul_ok(&votes_b, sh->h_q) ||
		    !mul_ok(&votes_b, L) || !mul_ok(&part_b, n_layers) ||
		    !mul_ok(&part_b, sh->h_kv) || !mul_ok(&part_b, base.row_tiles) ||
		    !mul_ok(&part_b, base.chunks)) {
			free(basep);
			return skv_cuda_fail(err, -ENOMEM, -1, -1, "scratch size overflows");
		}
		if (!cp.layer_bypass)
			r = plan_fused(c, &base, dt, n_layers, &fused_blocks, err);
		if (r < 0) {
			free(basep);
			return r;
		}
	}
	if (fused_blocks) {
		/* sub-chunk partials, merged row statistics, tickets and item counters */
		const uint64_t items = (uint64_t)n_layers * sh->h_kv * base.row_tiles;
		base.n_launches = (n_layers + LPL - 1) / LPL;
		subp_b = items * base.nsub * rt * sizeof(float2);
		stats_b = items * rt * sizeof(float2);
		sync_b = (base.n_launches + items * sync_words(base.chunks)) * sizeof(uint32_t);
	}
	if (!pl.bypass) {
		keys_b = 4;
		if (!mul_ok(&keys_b, n_layers) || !mul_ok(&keys_b, pl.h_store) ||
		    !mul_ok(&keys_b, L)) {
			free(basep);
			return skv_cuda_fail(err, -ENOMEM, -1, -1, "scratch size overflows");
		}
	}
	if (want_res) {
		/* result (budget_res, kept), mass, aux, fsum; then the rankings */
		bud_b = sizeof(budget_res) + nh * (4 + 4 + 4 + 8) + 64;
		rank_b = 8 + 4; /* the ranking and its votes */
		if (!mul_ok(&rank_b, nh) || !mul_ok(&rank_b, base.b.r2)) {
			free(basep);
			return skv_cuda_fail(err, -ENOMEM, -1, -1, "scratch size overflows");
		}
		if (!base.b.r)
			rank_b = 0;
	}
	votes_b = (votes_b + 255) & ~(uint64_t)255;
	part_b = (part_b + 255) & ~(uint64_t)255;
	subp_b = (subp_b + 255) & ~(uint64_t)255;
	stats_b = (stats_b + 255) & ~(uint64_t)255;
	sync_b = (sync_b + 255) & ~(uint64_t)255;
	keys_b = (keys_b + 255) & ~(uint64_t)255;
	bud_b = (bud_b + 255) & ~(uint64_t)255;
	rank_b = (rank_b + 255) & ~(uint64_t)255;
	const uint64_t total =
	    votes_b + part_b + subp_b + stats_b + sync_b + keys_b + bud_b + rank_b;

	char *scratch = NULL;
	if (total) {
		cudaError_t ea = cudaMallocAsync((void **)&scratch, total, c->stream);
		if (ea != cudaSuccess) {
			free(basep);
			return rt_fail(err, ea, "scratch for the compaction");
		}
	}
	char *sp = scratch;
	base.votes = scoring ? (float *)sp : nullptr;
	sp += votes_b;
	base.partials = scoring ? (float2 *)sp : nullptr;
	sp += part_b;
	base.sub_partials = fused_blocks ? (float2 *)sp : nullptr;
	sp += subp_b;
	base.row_stats = fused_blocks ? (float2 *)sp : nullptr;
	sp += stats_b;
	base.sync = fused_blocks ? (uint32_t *)sp : nullptr;
	sp += sync_b;
	base.keys = keys_b ? (uint32_t *)sp : nullptr;
	sp += keys_b;
	if (want_res) {
		budget_consts &b = base.b;
		b.res = (budget_res *)sp;
		b.kept = (uint32_t *)(b.res + 1);
		b.fsum = (double *)(((uintptr_t)(b.kept + nh) + 7) & ~(uintptr_t)7);
		b.mass = (float *)(b.fsum + nh);
		b.aux = (uint32_t *)(b.mass + nh);
		b.ranked = rank_b ? (uint64_t *)(sp + bud_b) : nullptr;
		b.rvote = rank_b ? (float *)(b.ranked + nh * b.r2) : nullptr;
	}
	base.status = c->d_status;

	/* the layers [l0, l0 + LPL) of a launch */
	auto layers_at = [&](uint32_t l0) {
		lp = base;
		lp.layer0 = l0;
		lp.n_layers = n_layers - l0 < (uint32_t)LPL ? n_layers - l0 : (uint32_t)LPL;
		for (uint32_t i = 0; i < lp.n_layers; i++) {
			const skv_layer_in &li = in[l0 + i];
			const skv_layer_out &lo = out[l0 + i];
			dlayer &d = lp.layers[i];
			d.q = to_dten(li.q);
			d.k = to_dten(li.k);
			d.v = to_dten(li.v);
			d.ok = to_dten(lo.k);
			d.ov = to_dten(lo.v);
			d.positions = lo.positions;
			d.retained_mass = lo.retained_mass;
			d.pos_stride = lo.pos_stride;
			d.cap = cp.caps[l0 + i];
			/* uniform with a result: select.cu's masses land in scratch */
			if (!cp.budget && res && !d.retained_mass)
				d.retained_mass = base.b.mass + (size_t)(l0 + i) * pl.h_store;
		}
	};
	const char *what = "cudaMemsetAsync";
	cudaError_t e = cudaSuccess;
	auto step = [&](enum budget_step st, const char *name) {
		if (e == cudaSuccess) {
			what = name;
			e = budget_launch(lp, st, c->stream);
		}
	};

	/* from here on work is queued: errors are reported, and the stream is closed cleanly */
	e = cudaMemsetAsync(c->d_status, 0, sizeof(dev_status), c->stream);
	if (e == cudaSuccess && scoring && base.row_tiles > 1)
		e = cudaMemsetAsync(base.votes, 0, votes_b, c->stream);
	if (e == cudaSuccess && fused_blocks)
		e = cudaMemsetAsync(base.sync, 0, sync_b, c->stream);
	const enum skv_budget mode = p->budget_mode;
	for (uint32_t l0 = 0; e == cudaSuccess && l0 < n_layers; l0 += LPL) {
		layers_at(l0);
		if (scoring && fused_blocks) {
			what = "fused scoring";
			const uint64_t tickets =
			    (uint64_t)lp.n_layers * sh->h_kv * lp.row_tiles * lp.nsub;
			e = fused_gated_launch(c, lp, dt,
					       tickets < (uint64_t)fused_blocks ? (int)tickets
										: fused_blocks);
		} else if (scoring) {
			e = score_layers(lp, cp, dt, c->stream, &what);
		}
		if (!cp.budget) {
			/* uniform: select.cu and the gather, as always */
			if (e == cudaSuccess) {
				what = "selection";
				e = select_launch(lp, c->stream);
			}
			/* the counts (the plan's) before the gather reads them */
			if (res)
				step(BSTEP_COLLECT, "result");
			if (e == cudaSuccess) {
				what = "gather";
				e = gather_launch(lp, dt, odt, gvec, c->stream);
			}
			continue;
		}
		if (pl.bypass)
			continue;
		step(BSTEP_KEYS, "selection keys");
		if (mode == SKV_BUDGET_MASS || mode == SKV_BUDGET_MASS_HEADS) {
			step(BSTEP_RANK, "ranking");
		} else {
			step(BSTEP_TOPK, "selection");
			if (mode == SKV_BUDGET_HEADS)
				step(BSTEP_HEADS_LAYER, "layer-wide selection");
		}
	}
	if (cp.budget && mode == SKV_BUDGET_MASS && select) {
		layers_at(0);
		step(BSTEP_CSTAR, "C*");
		for (uint32_t l0 = 0; e == cudaSuccess && l0 < n_layers; l0 += LPL) {
			layers_at(l0);
			step(BSTEP_MASS_FINISH, "picks at C*");
		}
	}
	for (uint32_t l0 = 0; cp.budget && e == cudaSuccess && l0 < n_layers; l0 += LPL) {
		layers_at(l0);
		step(BSTEP_EMIT, "emission");
	}
	if (want_res) {
		layers_at(0);
		step(BSTEP_FINAL, "result");
	}
	for (uint32_t l0 = 0; cp.budget && e == cudaSuccess && l0 < n_layers; l0 += LPL) {
		layers_at(l0);
		if (p->fallback_below > 0.0f)
			step(BSTEP_FULL, "fallback");
		if (e == cudaSuccess) {
			what = "gather";
			e = gather_launch(lp, dt, odt, gvec, c->stream);
		}
	}
	if (e == cudaSuccess && res) {
		what = "result copy";
		e = cudaMemcpyAsync(c->h_res, base.b.res, sizeof(budget_res) + nh * 4,
				    cudaMemcpyDeviceToHost, c->stream);
	}
	free(basep);
	cudaMemcpyAsync(c->h_status, c->d_status, sizeof(dev_status), cudaMemcpyDeviceToHost,
			c->stream);
	if (scratch)
		cudaFreeAsync(scratch, c->stream);
	cudaEventRecord(c->done, c->stream);
	if (e != cudaSuccess) {
		/* error path only: drain what was queued so the context is reusable */
		cudaEventSynchronize(c->done);
		return rt_fail(err, e, what);
	}
	c->res = res;
	c->res_heads = (uint32_t)nh;
	c->pending = 1;
	return 0;
}

/*
 * The checks of skv_compact_budget() in its order (the same messages), the
 * per-layer budgets and rows, then the launches.
 */
static int compact_entry(struct skv_cuda_ctx *c, const struct skv_shape *sh,
			 const struct skv_params *params, uint32_t n_layers,
			 const struct skv_layer_in *in, const struct skv_layer_out *out,
			 struct skv_budget_result *res, struct skv_error *err)
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
	skv_params_resolve(params, &pr, err);
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
	return compact_entry(c, sh, p, n_layers, in, out, NULL, err);
}

extern "C" int skv_cuda_compact_budget(struct skv_cuda_ctx *c, const struct skv_shape *sh,
				       const struct skv_params *p, uint32_t n_layers,
				       const struct skv_layer_in *in,
				       const struct skv_layer_out *out,
				       struct skv_budget_result *res, struct skv_error *err)
{
	return compact_entry(c, sh, p, n_layers, in, out, res, err);
}
