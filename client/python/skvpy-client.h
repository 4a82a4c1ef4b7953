/* SPDX-License-Identifier: MIT */
/*
 * skvpy-client.h - snapkv.Client, the Python type: connect, register
 * buffers, compact (a Cache, or a Request to wait for), stats, close. Its
 * state, shared with Cache and Request, is in skvpy-session.h.
 */
#ifndef SKVPY_CLIENT_H
#define SKVPY_CLIENT_H

#include <Python.h>

#include "skvpy-session.h"

extern PyTypeObject skvpy_client_type;
int skvpy_client_init_type(PyObject *module);

/* -1 with snapkv.Error(ENOTCONN) when closed. */
int skvpy_client_check(struct skvpy_client *cl);

#endif
