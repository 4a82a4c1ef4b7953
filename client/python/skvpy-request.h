/* SPDX-License-Identifier: MIT */
/*
 * skvpy-request.h - snapkv.Request: a submitted compaction. wait(timeout)
 * gives the Cache; a Request dropped without waiting is abandoned: its
 * cache is released by libsnapkv, now if it is done, else when its
 * completion is read from the ring.
 */
#ifndef SKVPY_REQUEST_H
#define SKVPY_REQUEST_H

#include <Python.h>

struct skv_request;
struct skvpy_client;

struct skvpy_request {
	PyObject_HEAD struct skvpy_client *client; /* strong reference */
	struct skv_request *r;			   /* NULL once waited for or abandoned */
	PyObject *out; /* handed to the Cache (writeback pools), or NULL */
	int waiting;   /* a thread waits without the GIL: others must not touch r */
	struct skvpy_request *next, *prev; /* the client's live requests */
};

extern PyTypeObject skvpy_request_type;
int skvpy_request_init_type(PyObject *module);

/* Steals out (may be NULL). */
PyObject *skvpy_request_new(struct skvpy_client *cl, struct skv_request *r, PyObject *out);
/* Abandon now and unlink (the client is closing). */
void skvpy_request_drop(struct skvpy_request *q);

#endif
