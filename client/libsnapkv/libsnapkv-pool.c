// SPDX-License-Identifier: MIT
/*
 * libsnapkv-pool.c - registered KV pools (SNAPKV_1.9): an engine's K/V
 * pools described to snapkvd once, then named by compactions.
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void pool_tensor(const struct skv_tensor_ref *t, float scale, Snapkv__V1__TensorRef *m)
{
	snapkv__v1__tensor_ref__init(m);
	m->buffer_id = t->buf ? t->buf->id : 0;
	m->offset = t->offset;
	m->dtype = (Snapkv__V1__DType)t->dtype;
	m->head_stride = t->head_stride;
	m->token_stride = t->token_stride;
	m->block_size = t->block_size;
	m->block_stride = t->block_stride;
	m->scale = scale;
}

/* The PoolRequest of d: its messages in the arrays the caller frees. */
static int pool_msg(const struct skv_pool_desc *d, Snapkv__V1__PoolRequest *m,
		    Snapkv__V1__OutLayerRef **ol, Snapkv__V1__OutLayerRef ***olp,
		    Snapkv__V1__TensorRef **tr)
{
	*ol = calloc(d->layers, sizeof(**ol));
	*olp = calloc(d->layers, sizeof(**olp));
	*tr = calloc((size_t)d->layers * 2, sizeof(**tr));
	if (!*ol || !*olp || !*tr)
		return -ENOMEM;
	m->layers = d->layers;
	m->h_kv = d->h_kv;
	m->head_dim = d->head_dim;
	m->dtype = (Snapkv__V1__DType)d->dtype;
	m->block_size = d->block_size;
	m->n_blocks = d->n_blocks;
	for (uint32_t l = 0; l < d->layers; l++) {
		snapkv__v1__out_layer_ref__init(&(*ol)[l]);
		pool_tensor(&d->layer[l].k, d->kv_scales ? d->kv_scales[2 * l] : 0.0f,
			    &(*tr)[2 * l]);
		pool_tensor(&d->layer[l].v, d->kv_scales ? d->kv_scales[2 * l + 1] : 0.0f,
			    &(*tr)[2 * l + 1]);
		(*ol)[l].k = &(*tr)[2 * l];
		(*ol)[l].v = &(*tr)[2 * l + 1];
		(*olp)[l] = &(*ol)[l];
	}
	m->n_layer = d->layers;
	m->layer = *olp;
	return 0;
}

static void pool_free(struct skv_pool *p)
{
	if (p)
		free(p->layer);
	free(p);
}

/* The handle of pool id: a copy of what the cache of a writeback needs. */
static struct skv_pool *pool_new(struct skv_client *c, const struct skv_pool_desc *d)
{
	struct skv_pool *p = calloc(1, sizeof(*p));

	if (p && !(p->layer = calloc(d->layers, sizeof(*p->layer)))) {
		free(p);
		return NULL;
	}
	if (!p)
		return NULL;
	memcpy(p->layer, d->layer, d->layers * sizeof(*p->layer));
	p->c = c;
	p->layers = d->layers;
	p->h_kv = d->h_kv;
	p->head_dim = d->head_dim;
	p->block_size = d->block_size;
	p->n_blocks = d->n_blocks;
	return p;
}

SKV_EXPORT int skv_pool_register(struct skv_client *c, const struct skv_pool_desc *d,
				 struct skv_pool **ret_pool)
{
	Snapkv__V1__PoolRequest m = SNAPKV__V1__POOL_REQUEST__INIT;
	Snapkv__V1__PoolReply *rr = NULL;
	Snapkv__V1__OutLayerRef *ol = NULL, **olp = NULL;
	Snapkv__V1__TensorRef *tr = NULL;
	struct skv_pool *p = NULL;
	int r;

	if (!c || !d || !ret_pool || d->desc_size < sizeof(*d) || !d->layer || !d->layers)
		return skv__fail(c, -EINVAL,
				 "a pool needs a description (desc_size %zu) with "
				 "layers",
				 sizeof(*d));
	if (pool_msg(d, &m, &ol, &olp, &tr) < 0 || !(p = pool_new(c, d))) {
		r = skv__fail(c, -ENOMEM, "out of memory");
		goto out;
	}
	pthread_mutex_lock(&c->mu);
	r = c->dead ? skv__fail(c, c->dead, "not connected to snapkvd")
		    : skv__rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL, &m.base, NULL, 0,
			       SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL_REPLY, (ProtobufCMessage **)&rr,
			       NULL, NULL, skv__call_deadline(c));
	if (r == 0) {
		r = rr->status;
		if (r < 0)
			skv__fail(c, r, "register pool: %s",
				  rr->error && rr->error[0] ? rr->error : "failed");
		p->id = rr->pool_id;
		p->session_id = c->session_id;
		if (r == 0) {
			p->next = c->pools;
			c->pools = p;
		}
		snapkv__v1__pool_reply__free_unpacked(rr, NULL);
	}
	pthread_mutex_unlock(&c->mu);
out:
	free(ol);
	free(olp);
	free(tr);
	if (r < 0) {
		pool_free(p);
		return r;
	}
	*ret_pool = p;
	return 0;
}

SKV_EXPORT uint64_t skv_pool_id(const struct skv_pool *p)
{
	return p ? p->id : 0;
}

SKV_EXPORT int skv_pool_unregister(struct skv_pool *p)
{
	Snapkv__V1__PoolRequest m = SNAPKV__V1__POOL_REQUEST__INIT;
	Snapkv__V1__PoolReply *rr = NULL;
	struct skv_client *c;
	int r = 0;

	if (!p)
		return 0;
	c = p->c;
	pthread_mutex_lock(&c->mu);
	/* a pool of an earlier session went with it */
	if (!c->dead && p->session_id == c->session_id) {
		m.unregister = true;
		m.pool_id = p->id;
		r = skv__rpc(c, SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL, &m.base, NULL, 0,
			     SNAPKV__V1__MSG_TYPE__MSG_TYPE_POOL_REPLY, (ProtobufCMessage **)&rr,
			     NULL, NULL, skv__call_deadline(c));
		if (r == 0) {
			r = rr->status;
			if (r < 0)
				skv__fail(c, r, "unregister pool: %s",
					  rr->error && rr->error[0] ? rr->error : "failed");
			snapkv__v1__pool_reply__free_unpacked(rr, NULL);
		}
	}
	if (r != -EBUSY)
		for (struct skv_pool **pp = &c->pools; *pp; pp = &(*pp)->next)
			if (*pp == p) {
				*pp = p->next;
				break;
			}
	pthread_mutex_unlock(&c->mu);
	if (r == -EBUSY)
		return r;
	pool_free(p);
	return r;
}

void skv__pools_free(struct skv_client *c)
{
	while (c->pools) {
		struct skv_pool *p = c->pools;

		c->pools = p->next;
		pool_free(p);
	}
}
