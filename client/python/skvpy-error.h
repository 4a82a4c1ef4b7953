/* SPDX-License-Identifier: MIT */
/*
 * skvpy-error.h - snapkv.Error, the one exception type of the module for
 * failures of libsnapkv or the daemon: an OSError subclass carrying errno
 * and the daemon's (or libsnapkv's) message.
 */
#ifndef SKVPY_ERROR_H
#define SKVPY_ERROR_H

#include <Python.h>

/* The exception type; created by skvpy_error_init() at module import. */
extern PyObject *skvpy_error_type;

int skvpy_error_init(PyObject *module);
/* Raise snapkv.Error(errno = -r or r, message). Returns NULL (for any pointer type). */
void *skvpy_error(int r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same, as an int for functions returning -1 on error. */
int skvpy_error_int(int r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
