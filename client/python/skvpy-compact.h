/* SPDX-License-Identifier: MIT */
/*
 * skvpy-compact.h - the arguments of Client.compact()/submit() turned into a
 * struct skv_compact_desc: one entry per layer of q, k, v (tensors that are
 * views of buffers registered with the client), the shape and dtype read
 * from them, parameters and output choices checked with a message naming
 * the argument. Nothing is sent until the whole request is valid here.
 */
#ifndef SKVPY_COMPACT_H
#define SKVPY_COMPACT_H

#include <Python.h>

#include "snapkv.h"

struct skvpy_client;

/* Limit on layers of one request (the daemon has its own, lower or not). */
#define SKVPY_MAX_LAYERS 4096

struct skvpy_compact {
	struct skv_compact_desc d;
	struct skv_layer_ref *refs;
	int32_t *table;
	struct skv_layer_out_ref *out_refs; /* writeback */
	int32_t *out_table;
	/* writeback: (k pools, v pools, block table) the Cache hands back; a new
	 * reference, NULL otherwise */
	PyObject *out;
	/* group=(key, size[, timeout_ms]): d.group_key points here */
	char group_key[SKV_MAX_GROUP_KEY + 1];
	/* fp8 K/V: [layers][K, V] scales; d.kv_scales points here */
	float *scales;
};

/* -1 with an exception; on success free with skvpy_compact_free() (which drops
 * p->out unless the caller took it). */
int skvpy_compact_parse(struct skvpy_client *cl, PyObject *args, PyObject *kw,
			struct skvpy_compact *ret);
void skvpy_compact_free(struct skvpy_compact *p);
/* A block table (list, tuple, numpy array or tensor of ints in 0 ..
 * pool_blocks - 1) into *ret (PyMem_Malloc'd), *ret_n entries. -1 with an
 * exception. */
int skvpy_block_table(PyObject *o, uint32_t pool_blocks, int32_t **ret, uint32_t *ret_n);

#endif
