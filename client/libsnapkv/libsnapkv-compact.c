// SPDX-License-Identifier: MIT
/*
 * libsnapkv-compact.c - a compaction description into a CompactRequest
 * (tensors, params, paged writeback destination, prefill wait, group) and
 * its submission: over the ring, or over the socket when it does not fit a
 * ring slot.
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "proto/skv-frame.h"

static void tensor_msg(const struct skv_tensor_ref *t, Snapkv__V1__TensorRef *m)
{
	snapkv__v1__tensor_ref__init(m);
	m->buffer_id = t->buf ? t->buf->id : 0;
	m->offset = t->offset;
	m->dtype = (Snapkv__V1__DType)t->dtype;
	m->head_stride = t->head_stride;
	m->token_stride = t->token_stride;
	m->block_size = t->block_size;
	m->block_stride = t->block_stride;
}

/* The SNAPKV_1.9 fields are read only when desc_size covers them. */
static bool has_pools(const struct skv_compact_desc *d)
{
	return d->desc_size >= offsetof(struct skv_compact_desc, out_pool) + sizeof(d->out_pool);
}

static const struct skv_pool *in_pool(const struct skv_compact_desc *d)
{
	return has_pools(d) ? d->pool : NULL;
}

static const struct skv_pool *out_pool(const struct skv_compact_desc *d)
{
	return has_pools(d) ? d->out_pool : NULL;
}

/* The layer count of d: its own, else its pool's. */
static uint32_t desc_layers(const struct skv_compact_desc *d)
{
	return d->layers ? d->layers : in_pool(d) ? in_pool(d)->layers : 0;
}

/* A table in a buffer: its reference, and its entries when mapped here. */
static void table_ref(const struct skv_buffer *b, uint64_t off, uint32_t n, Snapkv__V1__TableRef *m)
{
	snapkv__v1__table_ref__init(m);
	m->buffer_id = b->id;
	m->offset = off;
	m->entries = n;
}

static const int32_t *table_in(const struct skv_buffer *b, uint64_t off, uint32_t n)
{
	if (!b->data || off % 4 || off > b->size || (uint64_t)n * 4 > b->size - off)
		return NULL;
	return (const int32_t *)((const uint8_t *)b->data + off);
}

/* The input's block table where this process can read it: inline, or in a
 * mapped host buffer (SNAPKV_1.9); NULL otherwise. */
static const int32_t *in_table(const struct skv_compact_desc *d)
{
	if (has_pools(d) && d->table_buf)
		return table_in(d->table_buf, d->table_offset, d->n_blocks);
	return d->block_table;
}

void skv__request_free(struct skv_request *rq)
{
	if (!rq)
		return;
	skv__wb_free(rq->wb);
	free(rq);
}

/* The messages paged_fields() allocates; the caller frees them. */
struct paged_msgs {
	Snapkv__V1__OutLayerRef *ol, **olp;
	Snapkv__V1__TensorRef *tr;
	Snapkv__V1__TableRef otr; /* out_table_buf */
};

static void paged_msgs_free(struct paged_msgs *m)
{
	free(m->ol);
	free(m->olp);
	free(m->tr);
}

/* The writeback destination as the cache will need it: each pool's mapping. */
static int wb_new(const struct skv_compact_desc *d, uint32_t n_in, struct skv_wb **ret)
{
	struct skv_wb *w = calloc(1, sizeof(*w));
	const struct skv_layer_out_ref *ol = out_pool(d) ? out_pool(d)->layer : d->out_layer;
	const int32_t *tab = d->out_block_table;
	uint32_t layers = desc_layers(d);

	if (has_pools(d) && d->out_table_buf)
		tab = table_in(d->out_table_buf, d->out_table_offset, d->out_n_blocks);
	if (!w)
		return -ENOMEM;
	w->layers = layers;
	w->n_table = n_in + d->out_n_blocks;
	w->data = calloc((size_t)layers * 2, sizeof(*w->data));
	w->size = calloc((size_t)layers * 2, sizeof(*w->size));
	w->table = calloc((size_t)w->n_table + 1, sizeof(int32_t));
	if (!w->data || !w->size || !w->table) {
		skv__wb_free(w);
		return -ENOMEM;
	}
	/* in-place blocks: the input's, where those slots are (the daemon
	 * checks they are the destination pools' blocks; paged_fields that the
	 * input table is readable here) */
	if (n_in)
		memcpy(w->table, in_table(d), n_in * sizeof(int32_t));
	/* a table in an unmapped buffer: the cache's block offsets unknown here */
	if (d->out_n_blocks && tab)
		memcpy(w->table + n_in, tab, d->out_n_blocks * sizeof(int32_t));
	for (uint32_t l = 0; l < layers; l++)
		for (unsigned t = 0; t < 2; t++) {
			const struct skv_buffer *b = t ? ol[l].v.buf : ol[l].k.buf;

			w->data[2 * l + t] = b ? b->data : NULL;
			w->size[2 * l + t] = b ? b->size : 0;
		}
	*ret = w;
	return 0;
}

/*
 * The SNAPKV_1.5 fields of d into cr (when desc_size covers them): block
 * size and destination; for writeback the destination pools and table, and
 * *ret_wb for the cache. The daemon judges the values.
 */
static int paged_fields(struct skv_client *c, const struct skv_compact_desc *d,
			Snapkv__V1__CompactRequest *cr, struct paged_msgs *m,
			struct skv_wb **ret_wb)
{
	uint32_t n_in = 0;

	if (d->desc_size <
	    offsetof(struct skv_compact_desc, out_n_blocks) + sizeof(d->out_n_blocks))
		return 0;
	cr->out_block_size = d->out_block_size;
	/* SNAPKV_1.9: in-place blocks (the first entries of the input's table)
	 * and max_decode; the daemon refuses them without writeback */
	if (d->desc_size >= offsetof(struct skv_compact_desc, max_decode) + sizeof(d->max_decode)) {
		n_in = d->out_in_place_blocks;
		if (n_in && (!in_table(d) || n_in > d->n_blocks))
			return skv__fail(c, -EINVAL,
					 "out_in_place_blocks %u: the input block_table has %u "
					 "entries readable here",
					 n_in, in_table(d) ? d->n_blocks : 0);
		cr->out_in_place_blocks = n_in;
		cr->max_decode = d->max_decode;
	}
	if (d->out_dest == SKV_OUT_ARENA)
		return 0;
	if (d->out_dest != SKV_OUT_WRITEBACK)
		return skv__fail(c, -EINVAL, "unknown out_dest %d", (int)d->out_dest);
	cr->out_dest = SNAPKV__V1__OUT_DEST__OUT_DEST_WRITEBACK;
	if (has_pools(d) && d->out_table_buf) {
		if (d->out_block_table)
			return skv__fail(c, -EINVAL,
					 "out_block_table and out_table_buf: one or the other");
		table_ref(d->out_table_buf, d->out_table_offset, d->out_n_blocks, &m->otr);
		cr->out_block_table_ref = &m->otr;
	} else if (d->out_n_blocks && !d->out_block_table) {
		return skv__fail(c, -EINVAL, "writeback needs out_block_table or out_table_buf");
	} else {
		cr->n_out_block_table = d->out_n_blocks;
		cr->out_block_table = (int32_t *)d->out_block_table;
	}
	if (out_pool(d)) {
		if (d->out_layer)
			return skv__fail(c, -EINVAL, "out_layer and out_pool: one or the other");
		if (out_pool(d)->c == c && out_pool(d)->session_id != c->session_id)
			return skv__fail(c, -ESTALE,
					 "out_pool was registered in an earlier "
					 "session: register it again");
		cr->out_pool_id = out_pool(d)->id;
		return wb_new(d, n_in, ret_wb) < 0 ? skv__fail(c, -ENOMEM, "out of memory") : 0;
	}
	if (!d->out_layer)
		return skv__fail(c, -EINVAL, "writeback needs out_layer[layers] or out_pool");
	m->ol = calloc(d->layers, sizeof(*m->ol));
	m->olp = calloc(d->layers, sizeof(*m->olp));
	m->tr = calloc((size_t)d->layers * 2, sizeof(*m->tr));
	if (!m->ol || !m->olp || !m->tr || wb_new(d, n_in, ret_wb) < 0)
		return skv__fail(c, -ENOMEM, "out of memory");
	for (uint32_t l = 0; l < d->layers; l++) {
		snapkv__v1__out_layer_ref__init(&m->ol[l]);
		tensor_msg(&d->out_layer[l].k, &m->tr[2 * l]);
		tensor_msg(&d->out_layer[l].v, &m->tr[2 * l + 1]);
		m->ol[l].k = &m->tr[2 * l];
		m->ol[l].v = &m->tr[2 * l + 1];
		m->olp[l] = &m->ol[l];
	}
	cr->n_out_layer = d->layers;
	cr->out_layer = m->olp;
	return 0;
}

/* A CompactRequest and the messages it points to, on the caller's stack
 * except the per-layer arrays. */
struct compact_msgs {
	Snapkv__V1__Request req;
	Snapkv__V1__CompactRequest cr;
	Snapkv__V1__Params pm;
	Snapkv__V1__PrefillWait pw;
	Snapkv__V1__Range rg[SKV_MAX_PROTECTED], *rgp[SKV_MAX_PROTECTED];
	Snapkv__V1__LayerRef *lr, **lrp;
	Snapkv__V1__TensorRef *tr;
	struct paged_msgs pgm;
	Snapkv__V1__TensorRef qw; /* pool: q_window */
	Snapkv__V1__TableRef btr; /* table_buf */
};

static void compact_msgs_free(struct compact_msgs *m)
{
	paged_msgs_free(&m->pgm);
	free(m->lr);
	free(m->lrp);
	free(m->tr);
}

/* The params, protected ranges and budget fields of d into m. */
static void params_fields(const struct skv_compact_desc *d, struct compact_msgs *m)
{
	Snapkv__V1__Params *pm = &m->pm;

	pm->policy = (Snapkv__V1__Policy)d->params.policy;
	pm->window = d->params.window;
	pm->capacity = d->params.capacity;
	pm->kernel = d->params.kernel;
	pm->pooling = (Snapkv__V1__Pooling)d->params.pooling;
	pm->gqa = (Snapkv__V1__Gqa)d->params.gqa;
	pm->sinks = d->params.sinks;
	/* min_window only from params that have it: before it (params_size
	 * V2) its bytes are the description's padding; 0 is the daemon's */
	pm->min_window = d->params.params_size >= SKV_PARAMS_SIZE_V3 ? d->params.min_window : 0;
	/* span only from params that have it (since SNAPKV_1.9); 0 is top-k */
	pm->span = d->params.params_size == sizeof(d->params) ? d->params.span : 0;
	/* The caller's params are complete (skv_client_params_init): a 0 is
	 * meant, never "use the default". */
	pm->explicit_fields = SKV_PARAMS_EXPLICIT_ALL;
	pm->n_protected_ranges = d->params.n_protected;
	pm->protected_ranges = m->rgp;
	for (uint32_t i = 0; i < d->params.n_protected; i++) {
		snapkv__v1__range__init(&m->rg[i]);
		m->rg[i].begin = d->params.protected_ranges[i].begin;
		m->rg[i].end = d->params.protected_ranges[i].end;
		m->rgp[i] = &m->rg[i];
	}
	m->cr.params = pm;
	if (!skv__desc_budget_plain(d))
		skv__budget_msg(&d->params, &m->cr);
}

/* The shape and each layer's Q, K and V of d into m (arrays allocated). */
static int layer_fields(const struct skv_compact_desc *d, struct compact_msgs *m)
{
	Snapkv__V1__CompactRequest *cr = &m->cr;
	/* fp8 scales (SNAPKV_1.8) from a description that has them */
	const float *scales =
	    d->desc_size >= offsetof(struct skv_compact_desc, kv_scales) + sizeof(d->kv_scales)
		? d->kv_scales
		: NULL;

	cr->layers = d->layers;
	cr->h_q = d->shape.h_q;
	cr->h_kv = d->shape.h_kv;
	cr->head_dim = d->shape.head_dim;
	cr->prompt_len = d->shape.prompt_len;
	cr->n_q = d->shape.n_q;
	if (in_pool(d)) {
		/* K/V are the pool's: the window's queries only */
		cr->pool_id = in_pool(d)->id;
		if (!d->layer) {
			if (d->shape.n_q) {
				tensor_msg(&d->q_window, &m->qw);
				cr->q_window = &m->qw;
				cr->q_layer_stride = d->q_layer_stride;
			}
			return 0;
		}
	}
	m->lr = calloc(d->layers, sizeof(*m->lr));
	m->lrp = calloc(d->layers, sizeof(*m->lrp));
	m->tr = calloc((size_t)d->layers * 3, sizeof(*m->tr));
	if (!m->lr || !m->lrp || !m->tr)
		return -ENOMEM;
	for (uint32_t l = 0; l < d->layers && in_pool(d); l++) {
		snapkv__v1__layer_ref__init(&m->lr[l]);
		tensor_msg(&d->layer[l].q, &m->tr[3 * l]);
		m->lr[l].q = d->shape.n_q ? &m->tr[3 * l] : NULL;
		m->lrp[l] = &m->lr[l];
	}
	for (uint32_t l = 0; l < d->layers && !in_pool(d); l++) {
		snapkv__v1__layer_ref__init(&m->lr[l]);
		tensor_msg(&d->layer[l].q, &m->tr[3 * l]);
		tensor_msg(&d->layer[l].k, &m->tr[3 * l + 1]);
		tensor_msg(&d->layer[l].v, &m->tr[3 * l + 2]);
		if (scales) {
			m->tr[3 * l + 1].scale = scales[2 * l];
			m->tr[3 * l + 2].scale = scales[2 * l + 1];
		}
		m->lr[l].q = d->shape.n_q ? &m->tr[3 * l] : NULL;
		m->lr[l].k = &m->tr[3 * l + 1];
		m->lr[l].v = &m->tr[3 * l + 2];
		m->lrp[l] = &m->lr[l];
	}
	cr->n_layer = d->layers;
	cr->layer = m->lrp;
	return 0;
}

/* Output layout, arena, prefill wait and decision group of d into m, as far
 * as desc_size covers them. */
static void output_fields(const struct skv_compact_desc *d, struct compact_msgs *m)
{
	Snapkv__V1__CompactRequest *cr = &m->cr;
	Snapkv__V1__PrefillWait *pw = &m->pw;
	const char *gkey;

	cr->out_layout = (Snapkv__V1__Layout)d->out_layout;
	cr->decode_reserve = d->decode_reserve;
	if (has_pools(d) && d->table_buf) {
		table_ref(d->table_buf, d->table_offset, d->n_blocks, &m->btr);
		cr->block_table_ref = &m->btr;
	} else {
		cr->n_block_table = d->block_table ? d->n_blocks : 0;
		cr->block_table = (int32_t *)d->block_table;
	}
	cr->evictable = !!d->evictable;
	if (d->desc_size >= offsetof(struct skv_compact_desc, out_arena) + sizeof(d->out_arena) &&
	    d->out_arena == SKV_ARENA_CUDA)
		cr->out_arena = SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM;
	if (d->desc_size >=
		offsetof(struct skv_compact_desc, wait_ipc_event) + sizeof(d->wait_ipc_event) &&
	    d->prefill_wait != SKV_WAIT_NONE) {
		snapkv__v1__prefill_wait__init(pw);
		pw->kind = (Snapkv__V1__PrefillWaitKind)d->prefill_wait;
		pw->buffer_id = d->wait_buffer ? d->wait_buffer->id : 0;
		pw->offset = d->wait_offset;
		pw->value = d->wait_value;
		pw->timeout_ms = d->wait_timeout_ms;
		if (d->prefill_wait == SKV_WAIT_CUDA_IPC_EVENT) {
			pw->ipc_event.data = (uint8_t *)d->wait_ipc_event;
			pw->ipc_event.len = sizeof(d->wait_ipc_event);
		}
		cr->prefill_wait = pw;
	}
	skv__desc_group(d, &gkey, &cr->group_size, &cr->group_timeout_ms);
	if (gkey)
		cr->group_key = (char *)gkey;
}

/* Submit req for rq: over the ring, or over the socket when it does not fit
 * a ring slot (e.g. a long block table: the socket takes up to 1 MiB; the
 * call completes before returning and wait/poll see it done). Locked. */
static int request_send(struct skv_client *c, Snapkv__V1__Request *req, struct skv_request *rq)
{
	Snapkv__V1__Response *resp = NULL;
	uint32_t slot;
	int r;

	if (c->ring && snapkv__v1__request__get_packed_size(req) > c->layout.arg_slot_size) {
		rq->sync = true;
		r = skv__rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST, &req->base, NULL, 0,
			     SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE, (ProtobufCMessage **)&resp,
			     NULL, NULL, skv__call_deadline(c));
		if (r == 0) {
			rq->sync_res = resp->status;
			rq->sync_resp = resp;
			if (resp->status < 0)
				skv__result_fail(c, resp->status, resp);
		}
		return r;
	}
	r = skv__submit(c, SKV_OP_REQUEST, req, skv__call_deadline(c), &slot);
	if (r == 0) {
		rq->slot = slot;
		rq->user_data = c->slots[slot].user_data;
	}
	return r;
}

/* Build and send d; `locked`: the caller holds c->mu (a batch). */
static int compact_submit(struct skv_client *c, const struct skv_compact_desc *d,
			  struct skv_request **ret_req, bool locked)
{
	struct compact_msgs m = {
	    .req = SNAPKV__V1__REQUEST__INIT,
	    .cr = SNAPKV__V1__COMPACT_REQUEST__INIT,
	    .pm = SNAPKV__V1__PARAMS__INIT,
	};
	struct skv_request *rq;
	int r;

	if (in_pool(d) && d->layers && d->layers != in_pool(d)->layers)
		return skv__fail(c, -EINVAL, "%u layers, the pool has %u", d->layers,
				 in_pool(d)->layers);
	if ((!d->layer && !in_pool(d)) || !d->layers)
		return skv__fail(c, -EINVAL, "compaction needs a description with layers");
	if (in_pool(d) && in_pool(d)->c == c && in_pool(d)->session_id != c->session_id)
		return skv__fail(c, -ESTALE,
				 "pool was registered in an earlier session: register it again");
	if (has_pools(d) && d->table_buf && d->block_table)
		return skv__fail(c, -EINVAL, "block_table and table_buf: one or the other");
	if (d->params.n_protected > SKV_MAX_PROTECTED)
		return skv__fail(c, -EINVAL, "too many protected ranges");
	rq = calloc(1, sizeof(*rq));
	if (!rq || layer_fields(d, &m) < 0) {
		r = skv__fail(c, -ENOMEM, "out of memory");
		goto out;
	}
	params_fields(d, &m);
	output_fields(d, &m);
	r = paged_fields(c, d, &m.cr, &m.pgm, &rq->wb);
	if (r < 0)
		goto out;
	m.req.op_case = SNAPKV__V1__REQUEST__OP_COMPACT;
	m.req.compact = &m.cr;
	if (!locked)
		pthread_mutex_lock(&c->mu);
	rq->c = c;
	r = request_send(c, &m.req, rq);
	if (!locked)
		pthread_mutex_unlock(&c->mu);
out:
	compact_msgs_free(&m);
	if (r < 0) {
		skv__request_free(rq);
		return r;
	}
	*ret_req = rq;
	return 0;
}

/* d in the current layout, checked, its layer count its pool's when 0;
 * *ret_r 0 or -errno. */
static const struct skv_compact_desc *desc_prepare(struct skv_client *c,
						   const struct skv_compact_desc *d,
						   struct skv_compact_desc *tmp,
						   struct skv_compact_desc *tmp2, int *ret_r)
{
	d = skv__desc_current(d, tmp);
	*ret_r = skv__desc_check(c, d);
	if (*ret_r == 0 && in_pool(d) && !d->layers) {
		*tmp2 = *d;
		tmp2->layers = in_pool(d)->layers;
		d = tmp2;
	}
	return d;
}

SKV_EXPORT int skv_compact_submit(struct skv_client *c, const struct skv_compact_desc *d,
				  struct skv_request **ret_req)
{
	struct skv_compact_desc tmp, tmp2;
	int r;

	if (!c || !d || !ret_req)
		return skv__fail(c, -EINVAL, "compaction needs a description with layers");
	d = desc_prepare(c, d, &tmp, &tmp2, &r);
	if (r < 0)
		return r;
	return compact_submit(c, d, ret_req, false);
}

SKV_EXPORT int skv_compact_submit_many(struct skv_client *c,
				       const struct skv_compact_desc *const *descs, uint32_t n,
				       struct skv_request **ret_reqs, uint32_t *ret_n)
{
	struct skv_compact_desc tmp, tmp2;
	uint32_t i = 0;
	int r = 0;

	if (ret_n)
		*ret_n = 0;
	if (!c || (n && (!descs || !ret_reqs)))
		return skv__fail(c, -EINVAL,
				 "submit_many needs n descriptions and n request slots");
	pthread_mutex_lock(&c->mu);
	c->defer_doorbell = true;
	c->doorbell_owed = false;
	for (; i < n; i++) {
		const struct skv_compact_desc *d = descs[i];

		if (!d) {
			r = skv__fail(c, -EINVAL, "description %u is NULL", i);
			break;
		}
		d = desc_prepare(c, d, &tmp, &tmp2, &r);
		if (r < 0 || (r = compact_submit(c, d, &ret_reqs[i], true)) < 0)
			break;
	}
	c->defer_doorbell = false;
	/* W2 on the SQ, once for the batch */
	if (c->doorbell_owed && skv_ring_needs_wakeup(&c->sq))
		(void)!eventfd_write(c->sq_efd, 1);
	c->doorbell_owed = false;
	pthread_mutex_unlock(&c->mu);
	if (ret_n)
		*ret_n = i;
	return r;
}
