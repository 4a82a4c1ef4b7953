/* SPDX-License-Identifier: MIT */
/*
 * skvpy-request.h - snapkv.Request: a submitted compaction. wait(timeout)
 * gives the Cache; cancel(timeout) stops it and returns once nothing of it
 * can be written any more (skv_request_cancel); a Request dropped without
 * waiting is cancelled the same way (within the client's deadline; past it,
 * abandoned: its cache released by libsnapkv when its completion is read).
 */
#ifndef SKVPY_REQUEST_H
#define SKVPY_REQUEST_H

#include <Python.h>

struct skv_request;
struct skvpy_client;

struct skvpy_request {
	PyObject_HEAD struct skvpy_client *client; /* strong reference */
	struct skv_request *r;			   /* NULL once waited for or abandoned */
	PyObject *out;		/* handed to the Cache (writeback pools), or NULL */
	int waiting;		/* a thread waits without the GIL: others must not touch r */
	struct skv_cache *done; /* cancel() found it completed: wait() hands it out */
	struct skvpy_request *next, *prev; /* the client's live requests */
};

extern PyTypeObject skvpy_request_type;
int skvpy_request_init_type(PyObject *module);

/* Steals out (may be NULL). */
PyObject *skvpy_request_new(struct skvpy_client *cl, struct skv_request *r, PyObject *out);
/* Abandon now and unlink (the client is closing: its close fences them). */
void skvpy_request_drop(struct skvpy_request *q);

#endif
