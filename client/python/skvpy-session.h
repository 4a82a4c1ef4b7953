/* SPDX-License-Identifier: MIT */
/*
 * skvpy-session.h - the state of a snapkv.Client that its Cache, Request
 * and compact() arguments use (skvpy-client.c is the Python type on top):
 * the libsnapkv session, the buffers registered with it (each a Mapping the
 * client keeps alive), an alias of its arena for zero-copy cache tensors,
 * the live Cache and Request objects it must release or abandon before it
 * closes (libsnapkv frees the client on close; a handle used after that
 * would be freed memory), and failures raised as snapkv.Error.
 *
 * Calls that wait for the daemon run without the GIL; `busy` counts them so
 * that close() from another thread never frees the client under them.
 */
#ifndef SKVPY_SESSION_H
#define SKVPY_SESSION_H

#include <Python.h>
#include <stdint.h>

#include "skvpy-array.h"

struct skv_client;
struct skv_buffer;
struct skv_tensor_ref;
struct skvpy_mapping;
struct skvpy_cache;
struct skvpy_request;

/* Limit on registrations of one client. */
#define SKVPY_MAX_REGS 4096

struct skvpy_reg {
	struct skvpy_mapping *mapping; /* memfd buffers: kept alive; NULL for CUDA */
	struct skv_buffer *b;
	uintptr_t base; /* host or device address of the buffer's byte 0 */
	size_t size;
	int cuda;
	int writable;
};

struct skvpy_client {
	PyObject_HEAD struct skv_client *c; /* NULL once closed */
	int busy;			    /* calls running without the GIL */
	enum skvpy_kind kind;		    /* arrays it returns */
	struct skvpy_reg *regs;
	size_t n_regs, cap_regs;
	struct skvpy_mapping *arena; /* alias of the session's arena, made on first use */
	uintptr_t arena_base;	     /* libsnapkv's mapping of it */
	struct skvpy_cache *caches;
	struct skvpy_request *requests;
};

/* Raise snapkv.Error(r, "what: <libsnapkv's reason>"); returns NULL. */
PyObject *skvpy_session_fail(struct skvpy_client *cl, int r, const char *what);
/* Byte offset of p in the arena alias (made on first use); -1 with an exception. */
int skvpy_session_arena_offset(struct skvpy_client *cl, const void *p, size_t *ret_offset);
/* Fill ref->buf and ref->offset for the input v: ValueError naming empty() when it
 * is not in a buffer registered with this client. */
int skvpy_session_locate(struct skvpy_client *cl, const struct skvpy_view *v, const char *what,
			 struct skv_tensor_ref *ref, const struct skvpy_reg **ret_reg);

#endif
