// SPDX-License-Identifier: MIT
/* snapkvd-kvpool.c - a session's registered KV pools; see snapkvd-kvpool.h. */
#include "snapkvd-kvpool.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"
#include "snapkvd-buffer.h"

/* Pool ids are unique in the daemon, not only in a session, so that a
 * request naming another session's pool never finds one of its own by
 * the same number (loop thread only). */
static uint64_t last_pool_id;

static void pool_free(struct snapkvd_kvpool *p)
{
	if (!p)
		return;
	free(p->tr);
	free(p->ol);
	free(p->olp);
	free(p);
}

struct snapkvd_kvpool *snapkvd_kvpools_find(const struct snapkvd_kvpools *set, uint64_t id)
{
	for (struct snapkvd_kvpool *p = set ? set->list : NULL; p; p = p->next)
		if (p->id == id)
			return p;
	return NULL;
}

/* Owns the pool's own fields: shape limits, dtype, block size, block count. */
static int check_shape(const struct snapkvd_kvpool_limits *lim, const Snapkv__V1__PoolRequest *m,
		       char *err, size_t errlen)
{
	if (m->layers < 1 || m->layers > lim->max_layers || m->n_layer != m->layers) {
		snprintf(err, errlen, "pool: %u layers with %zu descriptions (1 .. %u, max_layers)",
			 m->layers, m->n_layer, lim->max_layers);
		return m->layers > lim->max_layers ? -E2BIG : -EINVAL;
	}
	if (m->h_kv < 1 || m->h_kv > lim->max_heads || m->head_dim < 1 ||
	    m->head_dim > lim->max_head_dim) {
		snprintf(err, errlen,
			 "pool: h_kv %u, head_dim %u (1 .. %u max_heads, 1 .. %u max_head_dim)",
			 m->h_kv, m->head_dim, lim->max_heads, lim->max_head_dim);
		return -EINVAL;
	}
	if (m->dtype < SNAPKV__V1__DTYPE__D_TYPE_F32 ||
	    m->dtype > SNAPKV__V1__DTYPE__D_TYPE_F8E5M2) {
		snprintf(err, errlen, "pool: unknown dtype %d", (int)m->dtype);
		return -EINVAL;
	}
	if (m->block_size < 1 || m->n_blocks < 1 || m->n_blocks > INT32_MAX) {
		snprintf(err, errlen,
			 "pool: block_size %u, n_blocks %llu (both >= 1, n_blocks <= %d)",
			 m->block_size, (unsigned long long)m->n_blocks, INT32_MAX);
		return -EINVAL;
	}
	return 0;
}

/*
 * Owns one tensor of the pool: present, the pool's dtype and block size
 * (0 there means the pool's), a session buffer, non-negative strides, an
 * aligned offset, an fp8 scale when fp8, and every element of blocks 0 ..
 * n_blocks - 1 inside the buffer (overflow-checked).
 */
static int check_tensor(const Snapkv__V1__PoolRequest *m, struct snapkvd_buffer *buffers,
			const Snapkv__V1__TensorRef *t, uint32_t l, const char *what, char *err,
			size_t errlen)
{
	const struct snapkvd_buffer *b;
	uint64_t s = skv_dtype_size((enum skv_dtype)m->dtype), e = 0, x, end;
	bool over;

	if (!t || t->dtype != m->dtype || (t->block_size && t->block_size != m->block_size)) {
		snprintf(err, errlen,
			 "pool: layer %u: %s %s (each tensor: the pool's dtype and block_size)", l,
			 what, t ? "differs" : "missing");
		return -EINVAL;
	}
	if (!(b = snapkvd_buffer_find(buffers, t->buffer_id))) {
		snprintf(err, errlen, "pool: layer %u: %s: buffer %llu is not registered", l, what,
			 (unsigned long long)t->buffer_id);
		return -ENOENT;
	}
	if (t->head_stride < 0 || t->token_stride < 0 || t->block_stride < 0 || t->offset % s) {
		snprintf(err, errlen, "pool: layer %u: %s: negative stride or unaligned offset", l,
			 what);
		return -EINVAL;
	}
	if (skv_dtype_is_fp8((enum skv_dtype)m->dtype) &&
	    !(t->scale > 0.0f && t->scale < INFINITY)) {
		snprintf(err, errlen, "pool: layer %u: %s: fp8 needs a finite scale above 0", l,
			 what);
		return -EINVAL;
	}
	over = __builtin_mul_overflow(m->n_blocks - 1, (uint64_t)t->block_stride, &e) ||
	       __builtin_mul_overflow((uint64_t)m->block_size - 1, (uint64_t)t->token_stride, &x) ||
	       __builtin_add_overflow(e, x, &e) ||
	       __builtin_mul_overflow((uint64_t)m->h_kv - 1, (uint64_t)t->head_stride, &x) ||
	       __builtin_add_overflow(e, x, &e) || __builtin_add_overflow(e, m->head_dim, &e) ||
	       __builtin_mul_overflow(e, s, &end) || __builtin_add_overflow(end, t->offset, &end);
	if (over || end > b->size) {
		snprintf(err, errlen,
			 "pool: layer %u: %s: %llu blocks reach %sbyte %llu of buffer %llu, which "
			 "has %llu",
			 l, what, (unsigned long long)m->n_blocks, over ? "past " : "",
			 (unsigned long long)(over ? UINT64_MAX : end), (unsigned long long)b->id,
			 (unsigned long long)b->size);
		return -ERANGE;
	}
	return 0;
}

static void copy_ref(Snapkv__V1__TensorRef *dst, const Snapkv__V1__TensorRef *src, uint32_t bs)
{
	snapkv__v1__tensor_ref__init(dst);
	dst->buffer_id = src->buffer_id;
	dst->offset = src->offset;
	dst->dtype = src->dtype;
	dst->head_stride = src->head_stride;
	dst->token_stride = src->token_stride;
	dst->block_size = bs;
	dst->block_stride = src->block_stride;
	dst->scale = src->scale;
}

int snapkvd_kvpools_add(struct snapkvd_kvpools *set, const struct snapkvd_kvpool_limits *lim,
			struct snapkvd_buffer *buffers, const Snapkv__V1__PoolRequest *m,
			uint64_t *ret_id, char *err, size_t errlen)
{
	struct snapkvd_kvpool *p;
	int r;

	if (set->n >= lim->max_session_pools) {
		snprintf(err, errlen, "the session has %u pools, the limit (max_session_pools)",
			 set->n);
		return -EMFILE;
	}
	if ((r = check_shape(lim, m, err, errlen)) < 0)
		return r;
	for (uint32_t l = 0; l < m->layers; l++) {
		const Snapkv__V1__OutLayerRef *o = m->layer[l];

		if ((r = check_tensor(m, buffers, o ? o->k : NULL, l, "k", err, errlen)) < 0 ||
		    (r = check_tensor(m, buffers, o ? o->v : NULL, l, "v", err, errlen)) < 0)
			return r;
	}
	p = calloc(1, sizeof(*p));
	if (p) {
		p->tr = calloc((size_t)m->layers * 2, sizeof(*p->tr));
		p->ol = calloc(m->layers, sizeof(*p->ol));
		p->olp = calloc(m->layers, sizeof(*p->olp));
	}
	if (!p || !p->tr || !p->ol || !p->olp) {
		pool_free(p);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < m->layers; l++) {
		copy_ref(&p->tr[2 * l], m->layer[l]->k, m->block_size);
		copy_ref(&p->tr[2 * l + 1], m->layer[l]->v, m->block_size);
		snapkv__v1__out_layer_ref__init(&p->ol[l]);
		p->ol[l].k = &p->tr[2 * l];
		p->ol[l].v = &p->tr[2 * l + 1];
		p->olp[l] = &p->ol[l];
	}
	p->id = ++last_pool_id;
	p->layers = m->layers;
	p->h_kv = m->h_kv;
	p->head_dim = m->head_dim;
	p->block_size = m->block_size;
	p->n_blocks = m->n_blocks;
	p->dtype = m->dtype;
	p->next = set->list;
	set->list = p;
	set->n++;
	*ret_id = p->id;
	return 0;
}

int snapkvd_kvpools_remove(struct snapkvd_kvpools *set, uint64_t id, const char **why)
{
	for (struct snapkvd_kvpool **pp = &set->list; *pp; pp = &(*pp)->next) {
		struct snapkvd_kvpool *p = *pp;

		if (p->id != id)
			continue;
		if (p->busy) {
			*why = "the pool is in use by a request in flight (wait for or cancel it)";
			return -EBUSY;
		}
		*pp = p->next;
		set->n--;
		pool_free(p);
		return 0;
	}
	*why = "no such pool in this session";
	return -ENOENT;
}

void snapkvd_kvpools_clear(struct snapkvd_kvpools *set)
{
	while (set->list) {
		struct snapkvd_kvpool *p = set->list;

		set->list = p->next;
		pool_free(p);
	}
	set->n = 0;
}

/* ----------------------------------------------------------- a request's view */

/*
 * Owns a table given by reference: a host buffer of the session, a
 * 4-aligned offset, 1 .. max_block_table entries inside the buffer; copied
 * (the engine may write the buffer at any time: only the copy is used).
 */
static int read_table(struct snapkvd_buffer *buffers, const struct snapkvd_kvpool_limits *lim,
		      const Snapkv__V1__TableRef *t, const char *what, int32_t **ret, size_t *ret_n,
		      char *err, size_t errlen)
{
	const struct snapkvd_buffer *b = snapkvd_buffer_find(buffers, t->buffer_id);
	uint64_t bytes;

	if (!b) {
		snprintf(err, errlen, "%s: buffer %llu is not registered", what,
			 (unsigned long long)t->buffer_id);
		return -ENOENT;
	}
	if (b->imp) {
		snprintf(err, errlen,
			 "%s: buffer %llu is a CUDA buffer; block tables are read from host "
			 "(memfd) buffers",
			 what, (unsigned long long)b->id);
		return -EOPNOTSUPP;
	}
	if (t->entries > lim->max_block_table) {
		snprintf(err, errlen, "%s of %llu entries exceeds the limit %llu (max_block_table)",
			 what, (unsigned long long)t->entries,
			 (unsigned long long)lim->max_block_table);
		return -E2BIG;
	}
	if (!t->entries || t->offset % 4) {
		snprintf(err, errlen, "%s: %llu entries at offset %llu (>= 1, 4-aligned)", what,
			 (unsigned long long)t->entries, (unsigned long long)t->offset);
		return -EINVAL;
	}
	bytes = t->entries * 4; /* <= 4 * max_block_table: no overflow */
	if (t->offset > b->size || bytes > b->size - t->offset) {
		snprintf(err, errlen,
			 "%s: %llu entries at offset %llu reach past buffer %llu (%llu bytes)",
			 what, (unsigned long long)t->entries, (unsigned long long)t->offset,
			 (unsigned long long)b->id, (unsigned long long)b->size);
		return -ERANGE;
	}
	*ret = malloc(bytes);
	if (!*ret) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(*ret, b->map + t->offset, bytes);
	*ret_n = (size_t)t->entries;
	return 0;
}

/* Owns the two tables: inline or by reference, not both; the length limit. */
static int view_tables(struct snapkvd_buffer *buffers, const struct snapkvd_kvpool_limits *lim,
		       struct snapkvd_kvpool_view *v, char *err, size_t errlen)
{
	Snapkv__V1__CompactRequest *q = &v->req;
	int r;

	if ((q->block_table_ref && q->n_block_table) ||
	    (q->out_block_table_ref && q->n_out_block_table)) {
		snprintf(err, errlen, "a block table inline and by reference: one or the other");
		return -EINVAL;
	}
	if (q->n_block_table > lim->max_block_table ||
	    q->n_out_block_table > lim->max_block_table) {
		snprintf(err, errlen,
			 "block table of %zu entries exceeds the limit %llu "
			 "(max_block_table)",
			 q->n_block_table > q->n_out_block_table ? q->n_block_table
								 : q->n_out_block_table,
			 (unsigned long long)lim->max_block_table);
		return -E2BIG;
	}
	if (q->block_table_ref &&
	    (r = read_table(buffers, lim, q->block_table_ref, "block_table_ref", &v->table,
			    &q->n_block_table, err, errlen)) < 0)
		return r;
	if (q->out_block_table_ref &&
	    (r = read_table(buffers, lim, q->out_block_table_ref, "out_block_table_ref",
			    &v->out_table, &q->n_out_block_table, err, errlen)) < 0)
		return r;
	if (v->table)
		q->block_table = v->table;
	if (v->out_table)
		q->out_block_table = v->out_table;
	return 0;
}

/* Owns a pool's shape fields of the request: 0 (the pool's) or equal. */
static int view_shape(const struct snapkvd_kvpool *p, Snapkv__V1__CompactRequest *q, char *err,
		      size_t errlen)
{
	if ((q->layers && q->layers != p->layers) || (q->h_kv && q->h_kv != p->h_kv) ||
	    (q->head_dim && q->head_dim != p->head_dim)) {
		snprintf(err, errlen,
			 "pool %llu has %u layers, h_kv %u, head_dim %u; the request says %u, %u, "
			 "%u",
			 (unsigned long long)p->id, p->layers, p->h_kv, p->head_dim, q->layers,
			 q->h_kv, q->head_dim);
		return -EINVAL;
	}
	q->layers = p->layers;
	q->h_kv = p->h_kv;
	q->head_dim = p->head_dim;
	return 0;
}

/* Owns the layers of a request naming pool_id: the pool's K/V, and the
 * window's Q from q_window or q-only LayerRefs (one or the other). */
static int view_layers(struct snapkvd_kvpool_view *v, const Snapkv__V1__CompactRequest *req,
		       char *err, size_t errlen)
{
	Snapkv__V1__CompactRequest *q = &v->req;
	const struct snapkvd_kvpool *p = v->pool;
	int r = view_shape(p, q, err, errlen);

	if (r < 0)
		return r;
	if (req->n_layer && (req->n_layer != p->layers || req->q_window)) {
		snprintf(err, errlen,
			 "pool %llu: give the window's queries as q_window or as %u LayerRefs "
			 "holding q only (%zu given)",
			 (unsigned long long)p->id, p->layers, req->n_layer);
		return -EINVAL;
	}
	v->lr = calloc(p->layers, sizeof(*v->lr));
	v->lrp = calloc(p->layers, sizeof(*v->lrp));
	v->q = calloc(p->layers, sizeof(*v->q));
	if (!v->lr || !v->lrp || !v->q) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (uint32_t l = 0; l < p->layers; l++) {
		const Snapkv__V1__LayerRef *in = req->n_layer ? req->layer[l] : NULL;
		uint64_t off;

		snapkv__v1__layer_ref__init(&v->lr[l]);
		if (in && (in->k || in->v)) {
			snprintf(err, errlen,
				 "pool %llu: layer %u names K or V; with a pool a LayerRef holds "
				 "q only",
				 (unsigned long long)p->id, l);
			return -EINVAL;
		}
		if (in)
			v->lr[l].q = in->q;
		else if (req->q_window) {
			if (__builtin_mul_overflow((uint64_t)l, req->q_layer_stride, &off) ||
			    __builtin_add_overflow(off, req->q_window->offset, &off)) {
				snprintf(err, errlen, "q_window: layer %u's offset overflows", l);
				return -ERANGE;
			}
			v->q[l] = *req->q_window;
			v->q[l].offset = off;
			v->lr[l].q = &v->q[l];
		}
		v->lr[l].k = &p->tr[2 * l];
		v->lr[l].v = &p->tr[2 * l + 1];
		v->lrp[l] = &v->lr[l];
	}
	q->n_layer = p->layers;
	q->layer = v->lrp;
	return 0;
}

/* Owns out_pool_id: a writeback request without out_layer, the pool's
 * block size as out_block_size (0: the pool's) and layer count. */
static int view_out_pool(const struct snapkvd_kvpools *set, struct snapkvd_kvpool_view *v,
			 char *err, size_t errlen)
{
	Snapkv__V1__CompactRequest *q = &v->req;
	struct snapkvd_kvpool *p = snapkvd_kvpools_find(set, q->out_pool_id);

	if (!p) {
		snprintf(err, errlen, "out_pool_id %llu is not a pool of this session",
			 (unsigned long long)q->out_pool_id);
		return -ENOENT;
	}
	if (q->out_dest != SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK || q->n_out_layer ||
	    (q->out_block_size && q->out_block_size != p->block_size) ||
	    (q->layers && q->layers != p->layers)) {
		snprintf(err, errlen,
			 "out_pool_id %llu: for out_dest WRITEBACK without out_layer, with "
			 "out_block_size 0 or the pool's %u and its %u layers",
			 (unsigned long long)p->id, p->block_size, p->layers);
		return -EINVAL;
	}
	if (!q->out_layout)
		q->out_layout = SNAPKV__V1__LAYOUT__LAYOUT_PAGED;
	q->out_block_size = p->block_size;
	q->n_out_layer = p->layers;
	q->out_layer = p->olp;
	v->out_pool = p;
	return 0;
}

int snapkvd_kvpool_view(const struct snapkvd_kvpools *set, const struct snapkvd_kvpool_limits *lim,
			struct snapkvd_buffer *buffers, const Snapkv__V1__CompactRequest *req,
			struct snapkvd_kvpool_view *v, char *err, size_t errlen)
{
	int r = 0;

	memset(v, 0, sizeof(*v));
	v->req = *req;
	if (req->pool_id) {
		v->pool = snapkvd_kvpools_find(set, req->pool_id);
		if (!v->pool) {
			snprintf(err, errlen, "pool_id %llu is not a pool of this session",
				 (unsigned long long)req->pool_id);
			r = -ENOENT;
		} else
			r = view_layers(v, req, err, errlen);
	} else if (req->q_window) {
		snprintf(err, errlen, "q_window is for requests that name a pool (pool_id)");
		r = -EINVAL;
	}
	if (r == 0 && req->out_pool_id)
		r = view_out_pool(set, v, err, errlen);
	if (r == 0)
		r = view_tables(buffers, lim, v, err, errlen);
	if (r < 0)
		snapkvd_kvpool_view_free(v);
	return r;
}

void snapkvd_kvpool_view_free(struct snapkvd_kvpool_view *v)
{
	free(v->lr);
	free(v->lrp);
	free(v->q);
	free(v->table);
	free(v->out_table);
	v->lr = NULL;
	v->lrp = NULL;
	v->q = NULL;
	v->table = v->out_table = NULL;
}
