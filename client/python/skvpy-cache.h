/* SPDX-License-Identifier: MIT */
/*
 * skvpy-cache.h - snapkv.Cache: one compact cache in the daemon. k(layer),
 * v(layer), positions(layer) are zero-copy tensors onto the client's arena
 * alias (paged output: [n_blocks, block_size, H_store, D] block pools, in the
 * arena or, for writeback, the engine's own pools); append/grow/release go
 * to the daemon; released on release(), on
 * leaving a with block, when garbage collected, or when its client closes.
 * While map_blocks() has its blocks mapped over an engine buffer, release()
 * is refused (EBUSY); the implicit releases put the buffer's pages back
 * first (skvpy-blockmap.h).
 */
#ifndef SKVPY_CACHE_H
#define SKVPY_CACHE_H

#include <Python.h>

#include "skvpy-blockmap.h"

struct skv_cache;
struct skvpy_client;

struct skvpy_cache {
	PyObject_HEAD struct skvpy_client *client; /* strong reference */
	struct skv_cache *k;			   /* NULL once released */
	PyObject *out;		      /* writeback: (k pools, v pools, block table), else NULL */
	int busy;		      /* append/grow running without the GIL: release must wait */
	struct skvpy_blockmap mapped; /* engine buffer ranges its blocks are mapped over */
	struct skvpy_cache *next, *prev; /* the client's live caches */
};

extern PyTypeObject skvpy_cache_type;
int skvpy_cache_init_type(PyObject *module);

/* A Cache object owning k (released if this fails) and out (may be NULL). */
PyObject *skvpy_cache_new(struct skvpy_client *cl, struct skv_cache *k, PyObject *out);
/* Release now and unlink (the client is closing); errors are ignored. */
void skvpy_cache_drop(struct skvpy_cache *c);

#endif
