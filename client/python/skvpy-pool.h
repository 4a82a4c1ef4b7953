/* SPDX-License-Identifier: MIT */
/*
 * skvpy-pool.h - snapkv.Pool: an engine's paged K/V pools registered once
 * with the daemon (Client.register_pool; skv_pool_register), then named by
 * compact(pool=...)/submit(pool=...)/submit_many(): a request carries the
 * pool, L, the window's queries and a block table instead of 3 x layers
 * tensors. unregister() (EBUSY while a request uses it); the daemon frees a
 * client's pools when its session ends.
 */
#ifndef SKVPY_POOL_H
#define SKVPY_POOL_H

#include <Python.h>
#include <stdint.h>

#include "skv.h"
#include "snapkv.h"

struct skv_pool;
struct skvpy_client;

struct skvpy_pool {
	PyObject_HEAD struct skvpy_client *client; /* strong reference */
	struct skv_pool *p; /* NULL once unregistered (libsnapkv frees it at close) */
	uint32_t layers, h_kv, head_dim, block_size;
	uint64_t n_blocks;
	enum skv_dtype dtype;
	PyObject *k, *v; /* lists of the pools' tensors (a writeback Cache's) */
	/* register_pool(q=...): the window's queries, slots x [layers, H_q, n_q,
	 * D], located once; a request names a slot (compact(q_slot=i)) */
	PyObject *q;
	struct skv_tensor_ref q_ref;		/* slot 0, layer 0 */
	uint64_t q_layer_stride, q_slot_stride; /* bytes */
	uint32_t q_slots, h_q, n_q;
};

extern PyTypeObject skvpy_pool_type;
int skvpy_pool_init_type(PyObject *module);

/* Client.register_pool(k, v, *, q=None, layout='hnd') of an open client: a
 * new Pool or NULL with an exception. */
PyObject *skvpy_pool_register(struct skvpy_client *cl, PyObject *args, PyObject *kw);
/* The live libsnapkv pool of obj for client cl, or NULL with an exception
 * (not a Pool, another client's, unregistered, client closed). */
struct skvpy_pool *skvpy_pool_of(struct skvpy_client *cl, PyObject *obj);

#endif
