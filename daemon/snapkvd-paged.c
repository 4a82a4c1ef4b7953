// SPDX-License-Identifier: MIT
/*
 * snapkvd-paged.c - paged output of a COMPACT request; see snapkvd-paged.h.
 *
 * Writeback is judged in this order, the first failure naming its reason:
 * one destination per layer, the table's length (at least the kept slots'
 * blocks, at most max_prompt_len entries), each pool (a registered writable
 * buffer of the session, the cache's dtype, one set of strides for all,
 * aligned), each destination block inside its buffer, and no byte written
 * meeting another written or any byte the request reads (Q, K, V of every
 * layer, compared by memfd identity and offset, so two registrations of one
 * memfd are caught too).
 */
#include "snapkvd-paged.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-buffer.h"
#include "snapkvd-cache.h"
#include "snapkvd-cleanup.h"
#include "snapkvd-config.h"
#include "snapkvd-job.h"
#include "snapkvd-request.h"

/* One byte range read or written, keyed by what backs it. */
struct span {
	uint64_t dev, ino; /* memfd identity; CUDA: 0, 0 and device addresses */
	uint64_t start, end;
	bool write;
	uint32_t layer;
};

/* limit: max_writeback_ranges, so that no request makes the daemon hold
 * more than that many (40 bytes each, twice while growing) */
struct spans {
	struct span *v;
	size_t n, cap, limit;
};

static int spans_add(struct spans *s, const struct snapkvd_buffer *b, uint64_t off, uint64_t len,
		     bool write, uint32_t layer)
{
	uint64_t dev = b->imp ? 0 : (uint64_t)b->dev, ino = b->imp ? 0 : (uint64_t)b->ino;
	uint64_t start = b->imp ? (uint64_t)(uintptr_t)b->map + off : off;

	/* a block right after the previous one of the same kind extends it
	 * (a contiguous table is one range) */
	if (s->n) {
		struct span *p = &s->v[s->n - 1];

		if (p->dev == dev && p->ino == ino && p->write == write && p->layer == layer &&
		    p->end == start) {
			p->end = start + len;
			return 0;
		}
	}
	if (s->n == s->limit)
		return -E2BIG;
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		struct span *v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = (struct span){
	    .dev = dev,
	    .ino = ino,
	    .start = start,
	    .end = start + len,
	    .write = write,
	    .layer = layer,
	};
	return 0;
}

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;

	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	return 0;
}

/* The buffer of the job's that holds p (a tensor's data). */
static const struct snapkvd_buffer *buffer_of(const struct snapkvd_job *j, const void *p)
{
	for (unsigned i = 0; i < j->n_bufs; i++) {
		const struct snapkvd_buffer *b = j->bufs[i];

		if ((const uint8_t *)p >= b->map && (const uint8_t *)p < b->map + b->size)
			return b;
	}
	return NULL;
}

/* Bytes from a block's (or a strided tensor's) start to past its last
 * element, for `heads` heads and `rows` rows (validated: no overflow). */
static uint64_t extent(int64_t head_stride, int64_t token_stride, uint32_t heads, uint32_t rows,
		       uint32_t D, size_t es)
{
	return ((uint64_t)(heads - 1) * (uint64_t)head_stride +
		(uint64_t)(rows - 1) * (uint64_t)token_stride + D) *
	       es;
}

/*
 * The bytes of one block of `heads` heads of `rows` rows: one range, or
 * one per head where each head's rows end before the next head starts
 * (HND blocks whose heads are spaced further apart than their rows: K and V
 * interleaved per head in one pool, as vLLM's CPU layout has them), so
 * that two pools interleaved that way do not read as overlapping.
 */
static int add_block(struct spans *s, const struct snapkvd_buffer *b, uint64_t at,
		     int64_t head_stride, int64_t token_stride, uint32_t heads, uint32_t rows,
		     uint32_t D, size_t es, bool write, uint32_t layer)
{
	uint64_t one = extent(0, token_stride, 1, rows, D, es);
	int r = 0;

	if (heads < 2 || head_stride <= 0 || one > (uint64_t)head_stride * es)
		return spans_add(s, b, at, extent(head_stride, token_stride, heads, rows, D, es),
				 write, layer);
	for (uint32_t h = 0; h < heads && !r; h++)
		r = spans_add(s, b, at + (uint64_t)h * (uint64_t)head_stride * es, one, write,
			      layer);
	return r;
}

/* Every byte range an input tensor t (heads x tokens) may be read from. */
static int add_reads(struct spans *s, const struct snapkvd_job *j, const struct skv_tensor *t,
		     uint32_t heads, uint32_t tokens, uint32_t layer)
{
	const struct snapkvd_buffer *b;
	size_t es = skv_dtype_size(t->dtype);
	uint64_t off;
	int r;

	if (!t->data || !tokens)
		return 0;
	b = buffer_of(j, t->data);
	if (!b)
		return -EINVAL;
	off = (uint64_t)((const uint8_t *)t->data - b->map);
	if (!t->block_table)
		return spans_add(
		    s, b, off,
		    extent(t->head_stride, t->token_stride, heads, tokens, j->shape.head_dim, es),
		    false, layer);
	uint32_t rows = tokens < t->block_size ? tokens : t->block_size;
	uint64_t nb = ((uint64_t)tokens + t->block_size - 1) / t->block_size;

	for (uint64_t i = 0; i < nb; i++) {
		uint64_t at = off + (uint64_t)t->block_table[i] * (uint64_t)t->block_stride * es;

		r = spans_add(
		    s, b, at,
		    extent(t->head_stride, t->token_stride, heads, rows, j->shape.head_dim, es),
		    false, layer);
		if (r < 0)
			return r;
	}
	return 0;
}

/*
 * Sorted by start within each backing file, an interval meets an earlier
 * one exactly when it starts before the furthest end seen so far of that
 * kind: writes against reads and writes, reads against writes.
 */
static int check_spans(struct spans *s, char *err, size_t errlen)
{
	qsort(s->v, s->n, sizeof(*s->v), span_cmp);
	for (size_t i = 0; i < s->n;) {
		uint64_t rend = 0, wend = 0;
		uint32_t rl = 0, wl = 0;
		size_t k = i;

		for (; k < s->n && s->v[k].dev == s->v[i].dev && s->v[k].ino == s->v[i].ino; k++) {
			const struct span *x = &s->v[k];

			if (x->write && (x->start < rend || x->start < wend)) {
				snprintf(err, errlen,
					 "writeback: a destination block of layer %u meets %s of "
					 "layer %u",
					 x->layer,
					 x->start < wend ? "another destination block"
							 : "bytes the request reads",
					 x->start < wend ? wl : rl);
				return -EINVAL;
			}
			if (!x->write && x->start < wend) {
				snprintf(err, errlen,
					 "writeback: a destination block of layer %u meets bytes "
					 "the request reads (layer %u)",
					 wl, x->layer);
				return -EINVAL;
			}
			if (x->write && x->end > wend)
				wend = x->end, wl = x->layer;
			if (!x->write && x->end > rend)
				rend = x->end, rl = x->layer;
		}
		i = k;
	}
	return 0;
}

/* One destination pool: its buffer (writable), dtype, strides like the
 * first pool's, aligned offset; every table entry's block inside it. */
static int check_pool(const struct snapkvd_request_env *env, struct snapkvd_job *j,
		      const Snapkv__V1__TensorRef *t, const char *what, uint32_t l,
		      enum skv_dtype odt, uint32_t h_store, struct snapkvd_buffer **ret, char *err,
		      size_t errlen)
{
	size_t es = skv_dtype_size(odt);
	struct snapkvd_buffer *b;
	uint64_t blk, maxe = 0, end;

	if (!t) {
		snprintf(err, errlen, "writeback: layer %u: no %s destination", l, what);
		return -EINVAL;
	}
	b = snapkvd_buffer_find(env->buffers, t->buffer_id);
	if (!b) {
		snprintf(err, errlen, "writeback: layer %u: %s: buffer %llu is not registered", l,
			 what, (unsigned long long)t->buffer_id);
		return -ENOENT;
	}
	if (!b->writable) {
		snprintf(err, errlen,
			 "writeback: layer %u: %s: buffer %llu is not registered writable", l, what,
			 (unsigned long long)b->id);
		return -EINVAL;
	}
	if ((enum skv_dtype)t->dtype != odt) {
		snprintf(err, errlen, "writeback: layer %u: %s: dtype %d, the cache's is %d", l,
			 what, (int)t->dtype, (int)odt);
		return -EINVAL;
	}
	if (t->head_stride != j->wb_head_stride || t->token_stride != j->wb_token_stride ||
	    t->block_stride != j->wb_block_stride ||
	    (t->block_size && t->block_size != j->out_block_size)) {
		snprintf(err, errlen,
			 "writeback: layer %u: %s: every destination pool must have the strides "
			 "and block size of layer 0's K",
			 l, what);
		return -EINVAL;
	}
	if (t->offset % es || t->offset >= b->size) {
		snprintf(err, errlen,
			 "writeback: layer %u: %s: offset %llu not aligned or outside buffer %llu",
			 l, what, (unsigned long long)t->offset, (unsigned long long)b->id);
		return -EINVAL;
	}
	blk = extent(t->head_stride, t->token_stride, h_store, j->out_block_size, j->shape.head_dim,
		     es);
	for (uint32_t i = j->in_place; i < j->n_out_table; i++)
		if ((uint64_t)j->out_table[i] > maxe)
			maxe = (uint64_t)j->out_table[i];
	if (__builtin_mul_overflow(maxe, (uint64_t)t->block_stride * es, &end) ||
	    __builtin_add_overflow(end, t->offset, &end) ||
	    __builtin_add_overflow(end, blk, &end) || end > b->size) {
		snprintf(err, errlen,
			 "writeback: layer %u: %s: destination block %llu is outside buffer %llu "
			 "(%llu bytes)",
			 l, what, (unsigned long long)maxe, (unsigned long long)b->id,
			 (unsigned long long)b->size);
		return -EINVAL;
	}
	*ret = b;
	return 0;
}

/* The destination block table: long enough for the kept slots (a budget
 * mode: the most a head may keep, min(L, C_max) for mass, L with a
 * fallback), at most max_block_table entries, none negative; copied into
 * the job. */
static int read_out_table(const struct snapkvd_config *cfg, struct snapkvd_job *j,
			  const Snapkv__V1__CompactRequest *req, uint32_t kept, char *err,
			  size_t errlen)
{
	uint64_t need = ((uint64_t)kept + j->out_block_size - 1) / j->out_block_size;

	/* in-place blocks (checked first) stand for the table's first entries */
	need = need > j->in_place ? need - j->in_place : 0;

	if (req->n_out_block_table > (size_t)cfg->max_block_table) {
		snprintf(err, errlen,
			 "out_block_table of %zu entries exceeds the limit %u (max_block_table)",
			 req->n_out_block_table, cfg->max_block_table);
		return -E2BIG;
	}
	if (req->n_out_block_table < need) {
		snprintf(err, errlen,
			 "writeback: out_block_table has %zu blocks, the %u kept slots need %llu "
			 "of %u%s%s",
			 req->n_out_block_table, kept, (unsigned long long)need, j->out_block_size,
			 j->in_place ? " beyond the out_in_place_blocks" : "",
			 j->params.fallback_below != 0.0f
			     ? " (fallback_below: a fallback keeps every prompt row)"
			 : j->params.budget_mode == SKV_BUDGET_MASS
			     ? " (budget mode mass: room for C_max, the most C* may be)"
			     : "");
		return -EINVAL;
	}
	for (size_t i = 0; i < req->n_out_block_table; i++)
		if (req->out_block_table[i] < 0) {
			snprintf(err, errlen, "writeback: out_block_table entry %zu is negative",
				 i);
			return -EINVAL;
		}
	j->out_table = malloc(((size_t)j->in_place + req->n_out_block_table + 1) * sizeof(int32_t));
	if (!j->out_table)
		return -ENOMEM;
	for (uint32_t i = 0; i < j->in_place; i++)
		j->out_table[i] = SKV_BLOCK_IN_PLACE;
	if (req->n_out_block_table)
		memcpy(j->out_table + j->in_place, req->out_block_table,
		       req->n_out_block_table * sizeof(int32_t));
	j->n_out_table = j->in_place + (uint32_t)req->n_out_block_table;
	return 0;
}

/* Whether a destination pool is exactly where the layer's input lives. */
static bool same_pool(const Snapkv__V1__TensorRef *in, const Snapkv__V1__TensorRef *out,
		      uint32_t bs)
{
	return in && out && in->buffer_id == out->buffer_id && in->offset == out->offset &&
	       in->dtype == out->dtype && in->head_stride == out->head_stride &&
	       in->token_stride == out->token_stride && in->block_stride == out->block_stride &&
	       in->block_size == bs;
}

/*
 * out_in_place_blocks n (CompactRequest field 220): the first n compact
 * blocks are the input's blocks block_table[0 .. n - 1], in place. They must
 * hold protected positions only (every head keeps positions 0 .. n * bs - 1
 * in slots of the same index), and every layer's K and V must be read from
 * the destination pools themselves, so the bytes there are what the
 * compaction would write.
 */
static int check_in_place(struct snapkvd_job *j, const Snapkv__V1__CompactRequest *req,
			  enum skv_dtype odt, char *err, size_t errlen)
{
	uint64_t n = req->out_in_place_blocks, bs = j->out_block_size;
	uint32_t prefix = skv_kept_prefix(&j->shape, &j->params);

	if (!n)
		return 0;
	if (n * bs > prefix) {
		snprintf(err, errlen,
			 "writeback: out_in_place_blocks %llu of %llu slots cover positions 0 .. "
			 "%llu, but only the first %u are protected (protected_ranges from 0)",
			 (unsigned long long)n, (unsigned long long)bs,
			 (unsigned long long)(n * bs - 1), prefix);
		return -EINVAL;
	}
	for (uint32_t l = 0; l < req->layers; l++) {
		const Snapkv__V1__LayerRef *in = req->layer[l];
		const Snapkv__V1__OutLayerRef *o = req->out_layer[l];

		if (!in || !o || !same_pool(in->k, o->k, req->out_block_size) ||
		    !same_pool(in->v, o->v, req->out_block_size) ||
		    (enum skv_dtype)in->k->dtype != odt) {
			snprintf(err, errlen,
				 "writeback: out_in_place_blocks needs layer %u's K and V read "
				 "from its destination pools (same buffer, offset, strides, dtype "
				 "and block_size %u as out_block_size)",
				 l, req->out_block_size);
			return -EINVAL;
		}
	}
	j->in_place = (uint32_t)n;
	return 0;
}

static void ranges_refused(const struct snapkvd_config *cfg, uint32_t layers, uint32_t n_table,
			   char *err, size_t errlen)
{
	snprintf(err, errlen,
		 "writeback: checking that no destination block meets another or an input "
		 "takes more than %u byte ranges (max_writeback_ranges) for %u layers and "
		 "%u destination blocks; use larger blocks, a contiguous table, or raise "
		 "max_writeback_ranges",
		 cfg->max_writeback_ranges, layers, n_table);
}

/* Every byte the request reads and every byte it would write. */
static int check_overlap(const struct snapkvd_config *cfg, struct snapkvd_job *j, uint32_t h_store,
			 enum skv_dtype odt, struct snapkvd_buffer **pools, char *err,
			 size_t errlen)
{
	struct spans s = {.limit = cfg->max_writeback_ranges};
	size_t es = skv_dtype_size(odt);
	int r = 0;

	for (uint32_t l = 0; l < j->layers && !r; l++) {
		r = add_reads(&s, j, &j->in[l].q, j->shape.h_q, j->shape.n_q, l);
		if (!r)
			r = add_reads(&s, j, &j->in[l].k, j->shape.h_kv, j->shape.prompt_len, l);
		if (!r)
			r = add_reads(&s, j, &j->in[l].v, j->shape.h_kv, j->shape.prompt_len, l);
		for (unsigned t = 0; t < 2 && !r; t++) {
			uint64_t base = t ? j->wb_v_off[l] : j->wb_k_off[l];

			for (uint32_t i = j->in_place; i < j->n_out_table && !r; i++)
				r = add_block(&s, pools[2 * l + t],
					      base + (uint64_t)j->out_table[i] *
							 (uint64_t)j->wb_block_stride * es,
					      j->wb_head_stride, j->wb_token_stride, h_store,
					      j->out_block_size, j->shape.head_dim, es, true, l);
		}
	}
	if (r == -EINVAL)
		snprintf(err, errlen, "writeback: an input is outside its buffers");
	if (r == -E2BIG)
		ranges_refused(cfg, j->layers, j->n_out_table, err, errlen);
	if (r == 0)
		r = check_spans(&s, err, errlen);
	free(s.v);
	return r;
}

/* The writeback destination of a PAGED request (see the top of the file). */
static int paged_writeback(const struct snapkvd_request_env *env, struct snapkvd_job *j,
			   const Snapkv__V1__CompactRequest *req, const struct skv_plan *plan,
			   enum skv_dtype odt, char *err, size_t errlen)
{
	struct snapkvd_buffer **pools;
	int r;

	if (req->n_out_layer != req->layers || !req->out_layer[0] || !req->out_layer[0]->k) {
		snprintf(err, errlen, "writeback: %zu destination layers for %u layers",
			 req->n_out_layer, req->layers);
		return -EINVAL;
	}
	j->wb_head_stride = req->out_layer[0]->k->head_stride;
	j->wb_token_stride = req->out_layer[0]->k->token_stride;
	j->wb_block_stride = req->out_layer[0]->k->block_stride;
	if (j->wb_head_stride < 0 || j->wb_token_stride < 0 || j->wb_block_stride <= 0 ||
	    j->wb_head_stride > INT32_MAX || j->wb_token_stride > INT32_MAX ||
	    j->wb_block_stride > (int64_t)1 << 40) {
		snprintf(err, errlen,
			 "writeback: strides must be >= 0 (block_stride > 0), "
			 "head/token stride < 2^31, block_stride < 2^40");
		return -EINVAL;
	}
	r = check_in_place(j, req, odt, err, errlen);
	if (r == 0)
		r = read_out_table(env->cfg, j, req, plan->kept, err, errlen);
	if (r < 0)
		return r;
	j->wb_base = calloc((size_t)req->layers * 2, sizeof(*j->wb_base));
	j->wb_k_off = calloc(req->layers, sizeof(uint64_t));
	j->wb_v_off = calloc(req->layers, sizeof(uint64_t));
	pools = calloc((size_t)req->layers * 2, sizeof(*pools));
	if (!j->wb_base || !j->wb_k_off || !j->wb_v_off || !pools) {
		free(pools);
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < req->layers && !r; l++) {
		const Snapkv__V1__OutLayerRef *o = req->out_layer[l];

		if (!o) {
			snprintf(err, errlen, "writeback: layer %u: no destination", l);
			r = -EINVAL;
			break;
		}
		r = check_pool(env, j, o->k, "K", l, odt, plan->h_store, &pools[2 * l], err,
			       errlen);
		if (!r)
			r = check_pool(env, j, o->v, "V", l, odt, plan->h_store, &pools[2 * l + 1],
				       err, errlen);
		if (!r) {
			j->wb_k_off[l] = o->k->offset;
			j->wb_v_off[l] = o->v->offset;
		}
	}
	if (!r)
		r = check_overlap(env->cfg, j, plan->h_store, odt, pools, err, errlen);
	if (!r) {
		j->wb_table = malloc(((size_t)j->n_out_table + 1) * sizeof(int32_t));
		j->wb_pools = calloc((size_t)req->layers * 2, sizeof(uint64_t));
		if (!j->wb_table || !j->wb_pools)
			r = -ENOMEM;
	}
	for (uint32_t i = 0; !r && i < req->layers * 2; i++) {
		snapkvd_job_hold(j, pools[i]);
		j->wb_base[i] = (uint8_t *)pools[i]->map;
		j->wb_pools[i] = pools[i]->id;
	}
	if (!r) {
		memcpy(j->wb_table, j->out_table, (size_t)j->n_out_table * sizeof(int32_t));
		j->wb_buffer_id = pools[0]->id;
		j->max_decode = req->max_decode;
	}
	free(pools);
	return r;
}

int snapkvd_paged_check(const struct snapkvd_request_env *env, struct snapkvd_job *j,
			const Snapkv__V1__CompactRequest *req, const struct skv_plan *plan,
			enum skv_dtype odt, char *err, size_t errlen)
{
	bool wb = req->out_dest == SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK;

	if (req->out_layout != SNAPKV__V1__LAYOUT__LAYOUT_PAGED) {
		if (req->out_block_size || wb || req->n_out_layer || req->n_out_block_table ||
		    req->out_in_place_blocks || req->max_decode) {
			snprintf(err, errlen,
				 "out_block_size, out_dest, out_layer, out_block_table, "
				 "out_in_place_blocks and max_decode need out_layout PAGED");
			return -EINVAL;
		}
		return 0;
	}
	if (req->out_dest != SNAPKV__V1__OUT_DEST__OUT_DEST_UNSPECIFIED &&
	    req->out_dest != SNAPKV__V1__OUT_DEST__OUT_DEST_ARENA && !wb) {
		snprintf(err, errlen, "unknown out_dest %d", (int)req->out_dest);
		return -EINVAL;
	}
	if (req->out_block_size == 0 || req->out_block_size > SNAPKVD_MAX_OUT_BLOCK_SIZE) {
		snprintf(err, errlen, "out_block_size = %u: must be 1..%u", req->out_block_size,
			 SNAPKVD_MAX_OUT_BLOCK_SIZE);
		return req->out_block_size ? -E2BIG : -EINVAL;
	}
	/* Paged-attention kernels read one context length per sequence, for
	 * every head of every layer (one block table): uniform and mass (one
	 * C*) only, a fallback alike (every head keeps L). layers would give
	 * each layer its own length, heads and mass-heads each head. */
	if (j->params.budget_mode != SKV_BUDGET_UNIFORM &&
	    j->params.budget_mode != SKV_BUDGET_MASS) {
		snprintf(err, errlen,
			 "budget mode %s gives %s different counts: paged output needs one "
			 "count for every head of every layer (uniform or mass)",
			 skv_budget_name(j->params.budget_mode),
			 j->params.budget_mode == SKV_BUDGET_LAYERS ? "layers" : "heads");
		return -EINVAL;
	}
	if (req->out_arena == SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM && wb) {
		snprintf(err, errlen, "writeback names its own buffers: out_arena must be unset");
		return -EINVAL;
	}
	j->paged = true;
	j->writeback = wb;
	j->out_block_size = req->out_block_size;
	if (!wb) {
		if (req->n_out_layer || req->n_out_block_table || req->out_in_place_blocks ||
		    req->max_decode) {
			snprintf(err, errlen,
				 "out_layer, out_block_table, out_in_place_blocks and max_decode "
				 "are for out_dest WRITEBACK");
			return -EINVAL;
		}
		return 0;
	}
	return paged_writeback(env, j, req, plan, odt, err, errlen);
}

/* The grown table's blocks of every layer's K and V pool as write spans. */
static int grow_spans(const struct snapkvd_request_env *env, const struct snapkvd_cache *c,
		      const int32_t *all, uint32_t n_all, struct spans *s, char *err, size_t errlen)
{
	uint64_t es = c->dtype_bytes;
	uint64_t blk =
	    extent(c->head_stride, c->token_stride, c->h_store, c->block_size, c->head_dim, es);
	int r;

	for (uint32_t l = 0; l < c->layers; l++)
		for (unsigned t = 0; t < 2; t++) {
			struct snapkvd_buffer *b =
			    snapkvd_buffer_find(env->buffers, c->wb_pools[2 * l + t]);
			uint64_t base = t ? c->v_off[l] : c->k_off[l], end;

			if (!b) {
				snprintf(err, errlen,
					 "GROW: layer %u's %s pool (buffer %llu) is no longer "
					 "registered",
					 l, t ? "V" : "K",
					 (unsigned long long)c->wb_pools[2 * l + t]);
				return -ENOENT;
			}
			for (uint32_t i = c->in_place_blocks; i < n_all; i++) {
				uint64_t at =
				    base + (uint64_t)all[i] * (uint64_t)c->block_stride * es;

				if (__builtin_add_overflow(at, blk, &end) || end > b->size) {
					snprintf(err, errlen,
						 "GROW: destination block %d is outside layer %u's "
						 "%s pool (buffer %llu, %llu bytes)",
						 all[i], l, t ? "V" : "K",
						 (unsigned long long)b->id,
						 (unsigned long long)b->size);
					return -EINVAL;
				}
				r = add_block(s, b, at, c->head_stride, c->token_stride, c->h_store,
					      c->block_size, c->head_dim, es, true, l);
				if (r == -E2BIG)
					ranges_refused(env->cfg, c->layers, n_all, err, errlen);
				if (r < 0)
					return r;
			}
		}
	return 0;
}

int snapkvd_paged_grow_blocks(const struct snapkvd_request_env *env, const struct snapkvd_cache *c,
			      uint32_t slots, const int32_t *tab, size_t n, int32_t **ret_table,
			      char *err, size_t errlen)
{
	uint64_t want, need;
	struct spans s = {.limit = env->cfg->max_writeback_ranges};
	int32_t *all;
	int r;

	*ret_table = NULL;
	if (!c->writeback && n) {
		snprintf(err, errlen, "out_block_table is for GROW of a writeback cache");
		return -EINVAL;
	}
	/* an arena cache has no block size: nothing to place */
	if (!c->writeback || !c->block_size)
		return 0;
	want = ((uint64_t)slots + c->block_size - 1) / c->block_size;
	need = want > c->n_blocks ? want - c->n_blocks : 0;
	if (n != need) {
		snprintf(err, errlen,
			 "GROW of a writeback cache to %u slots needs %llu new destination blocks "
			 "(out_block_table) past its %u, got %zu",
			 slots, (unsigned long long)need, c->n_blocks, n);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		if (tab[i] < 0) {
			snprintf(err, errlen, "GROW: out_block_table entry %zu is negative", i);
			return -EINVAL;
		}
	all = malloc(((size_t)c->n_blocks + n + 1) * sizeof(int32_t));
	if (!all)
		return -ENOMEM;
	memcpy(all, c->wb_table, (size_t)c->n_blocks * sizeof(int32_t));
	if (n)
		memcpy(all + c->n_blocks, tab, n * sizeof(int32_t));
	r = grow_spans(env, c, all, c->n_blocks + (uint32_t)n, &s, err, errlen);
	if (r == 0)
		r = check_spans(&s, err, errlen);
	free(s.v);
	if (r < 0) {
		free(all);
		return r;
	}
	*ret_table = all;
	return 0;
}

void snapkvd_paged_grow_done(struct snapkvd_cache *c, struct snapkvd_job *j, uint8_t *host_base,
			     uint32_t old_slots)
{
	uint64_t used = (uint64_t)c->kept + c->appended;

	if (j->out_table) {
		free(c->wb_table);
		c->wb_table = TAKE_PTR(j->out_table);
		c->n_blocks = j->n_out_table;
	}
	for (uint32_t l = 0; l < c->layers; l++) {
		int32_t *pos = (int32_t *)(host_base + c->pos_off[l]);

		for (uint32_t h = 0; h < c->h_store; h++)
			for (uint64_t i = old_slots; i < used && i < c->slots; i++)
				pos[(uint64_t)h * c->slots + i] =
				    (int32_t)(c->prompt_len + (i - c->kept));
	}
}

int snapkvd_paged_geometry(const struct snapkvd_request_env *env, const struct snapkvd_job *j,
			   uint32_t h_store, uint32_t slots, uint32_t dtype_bytes,
			   struct snapkvd_cache_geom *ret)
{
	return snapkvd_cache_geometry_paged(j->layers, h_store, slots, j->shape.head_dim,
					    dtype_bytes, j->out_block_size, j->writeback,
					    env->arena_bytes, ret);
}

void snapkvd_paged_cache(struct snapkvd_job *j)
{
	struct snapkvd_cache *c = j->cache;

	c->layout = SNAPKVD_LAYOUT_PAGED;
	c->block_size = j->out_block_size;
	c->writeback = j->writeback;
	if (!j->writeback)
		return;
	c->head_stride = j->wb_head_stride;
	c->token_stride = j->wb_token_stride;
	c->block_stride = j->wb_block_stride;
	c->n_blocks = j->n_out_table;
	c->in_place_blocks = j->in_place;
	c->max_decode = j->max_decode;
	c->out_buffer_id = j->wb_buffer_id;
	c->wb_table = TAKE_PTR(j->wb_table);
	c->wb_pools = TAKE_PTR(j->wb_pools);
	memcpy(c->k_off, j->wb_k_off, c->layers * sizeof(uint64_t));
	memcpy(c->v_off, j->wb_v_off, c->layers * sizeof(uint64_t));
}

/* Arena: the identity table over the run's blocks. */
static int identity_table(struct snapkvd_job *j, uint32_t n)
{
	j->out_table = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
	if (!j->out_table)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		j->out_table[i] = (int32_t)i;
	j->n_out_table = n;
	return 0;
}

void snapkvd_paged_outputs(struct snapkvd_job *j, uint8_t *kv_base)
{
	const struct snapkvd_cache *c = j->cache;

	if (!j->writeback && !j->out_table && identity_table(j, c->n_blocks) < 0) {
		/* no table: the kernels refuse the job (-EINVAL), nothing written */
		j->n_out_table = 0;
	}
	for (uint32_t l = 0; l < c->layers; l++) {
		uint8_t *kb = j->writeback ? j->wb_base[2 * l] : kv_base;
		uint8_t *vb = j->writeback ? j->wb_base[2 * l + 1] : kv_base;
		struct skv_tensor t = {
		    .dtype = c->dtype,
		    .head_stride = c->head_stride,
		    .token_stride = c->token_stride,
		    .block_table = j->out_table,
		    .block_size = c->block_size,
		    .n_blocks = j->n_out_table,
		    .block_stride = c->block_stride,
		};
		uint32_t pool = 0;

		for (uint32_t i = j->in_place; i < j->n_out_table; i++)
			if ((uint32_t)j->out_table[i] + 1 > pool)
				pool = (uint32_t)j->out_table[i] + 1;
		j->out[l].k = t;
		j->out[l].k.data = kb + c->k_off[l];
		j->out[l].v = t;
		j->out[l].v.data = vb + c->v_off[l];
		/* every block in place (a bypass over a protected prompt): no
		 * entry to bound, but a pool of 0 reads as no pool */
		j->out[l].pool_blocks = pool || !j->in_place ? pool : 1;
	}
}
