// SPDX-License-Identifier: MIT
#include "skvpy-error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

PyObject *skvpy_error_type;

int skvpy_error_init(PyObject *module)
{
	skvpy_error_type = PyErr_NewExceptionWithDoc(
	    "snapkv.Error",
	    "A failure reported by libsnapkv or snapkvd: an OSError whose errno is the\n"
	    "call's error number and whose strerror is the daemon's (or libsnapkv's)\n"
	    "message.",
	    PyExc_OSError, NULL);
	if (!skvpy_error_type)
		return -1;
	Py_INCREF(skvpy_error_type);
	if (PyModule_AddObject(module, "Error", skvpy_error_type) < 0) {
		Py_DECREF(skvpy_error_type);
		return -1;
	}
	return 0;
}

static void raise_v(int r, const char *fmt, va_list ap)
{
	char msg[512];
	PyObject *e;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (r < 0)
		r = -r;
	e = PyObject_CallFunction(skvpy_error_type, "is", r, msg);
	if (e) {
		PyErr_SetObject(skvpy_error_type, e);
		Py_DECREF(e);
	}
}

void *skvpy_error(int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	raise_v(r, fmt, ap);
	va_end(ap);
	return NULL;
}

int skvpy_error_int(int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	raise_v(r, fmt, ap);
	va_end(ap);
	return -1;
}
