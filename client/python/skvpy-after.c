// SPDX-License-Identifier: MIT
/* skvpy-after.c - compact()/submit()'s after=; see skvpy-after.h. */
#include "skvpy-after.h"

#include <string.h>

#include "snapkv.h"
#include "skvpy-array.h"
#include "skvpy-session.h"

#define IPC_HANDLE_BYTES 64

static const char usage[] =
    "after= takes a torch.cuda.Event created with interprocess=True, its 64-byte ipc_handle(), "
    "or (tensor, offset, value) naming a u32 flag in CUDA memory registered with the client, "
    "each with an optional last timeout_ms";

static int fail_type(PyObject *o)
{
	PyErr_Format(PyExc_TypeError, "%s, not %.100s", usage, Py_TYPE(o)->tp_name);
	return -1;
}

/* A u32 from o, naming it; -1 with ValueError/TypeError. */
static int u32_of(PyObject *o, const char *name, uint32_t *ret)
{
	unsigned long long x;

	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "after=: %s must be an int, not %.100s", name,
			     Py_TYPE(o)->tp_name);
		return -1;
	}
	x = PyLong_AsUnsignedLongLong(o);
	if (PyErr_Occurred() || x > UINT32_MAX) {
		PyErr_Clear();
		PyErr_Format(PyExc_ValueError, "after=: %s must be in 0 .. %u", name, UINT32_MAX);
		return -1;
	}
	*ret = (uint32_t)x;
	return 0;
}

/* The 64 handle bytes of o (bytes-like, or an event's ipc_handle()). */
static int event_handle(PyObject *o, uint8_t handle[IPC_HANDLE_BYTES])
{
	PyObject *h = NULL;
	Py_buffer b;
	int r = -1;

	if (PyObject_CheckBuffer(o)) {
		h = o;
		Py_INCREF(h);
	} else if (PyObject_HasAttrString(o, "ipc_handle")) {
		h = PyObject_CallMethod(o, "ipc_handle", NULL);
		if (!h) {
			PyObject *t, *v, *tb;

			PyErr_Fetch(&t, &v, &tb);
			PyErr_NormalizeException(&t, &v, &tb);
			PyErr_Format(PyExc_ValueError,
				     "after=: the event has no IPC handle (create it with "
				     "torch.cuda.Event(interprocess=True)): %S",
				     v ? v : Py_None);
			Py_XDECREF(t);
			Py_XDECREF(v);
			Py_XDECREF(tb);
			return -1;
		}
	} else {
		return fail_type(o);
	}
	if (PyObject_GetBuffer(h, &b, PyBUF_SIMPLE) < 0) {
		PyErr_Clear();
		PyErr_Format(PyExc_TypeError, "after=: ipc_handle() gave %.100s, not bytes",
			     Py_TYPE(h)->tp_name);
		Py_DECREF(h);
		return -1;
	}
	if (b.len != IPC_HANDLE_BYTES)
		PyErr_Format(
		    PyExc_ValueError,
		    "after=: an IPC event handle is %d bytes (cudaIpcEventHandle_t), not %zd",
		    IPC_HANDLE_BYTES, b.len);
	else {
		memcpy(handle, b.buf, IPC_HANDLE_BYTES);
		r = 0;
	}
	PyBuffer_Release(&b);
	Py_DECREF(h);
	return r;
}

/* (tensor, offset, value): the flag word's buffer and byte offset. */
static int flag_of(struct skvpy_client *cl, PyObject *t, PyObject *off, PyObject *val,
		   uint32_t timeout, struct skv_compact_desc *d)
{
	struct skv_tensor_ref ref = {0};
	const struct skvpy_reg *reg;
	struct skvpy_view v;
	uint32_t offset, value;

	if (skvpy_view_of(t, "after=[0]", &v) < 0 ||
	    skvpy_session_locate(cl, &v, "after=[0]", &ref, &reg) < 0)
		return -1;
	if (!reg->cuda) {
		PyErr_SetString(
		    PyExc_ValueError,
		    "after=(tensor, offset, value): the flag must be in CUDA memory "
		    "registered with client.register() (the daemon's stream waits on it)");
		return -1;
	}
	if (u32_of(off, "offset", &offset) < 0 || u32_of(val, "value", &value) < 0)
		return -1;
	if ((ref.offset + offset) % 4) {
		PyErr_Format(PyExc_ValueError,
			     "after=: the flag is a u32: its byte offset in the buffer (%llu) must "
			     "be a multiple of 4",
			     (unsigned long long)(ref.offset + offset));
		return -1;
	}
	if (ref.offset + offset + 4 > reg->size) {
		PyErr_Format(PyExc_ValueError,
			     "after=: offset %u is past the end of the flag's buffer", offset);
		return -1;
	}
	if (skv_compact_desc_wait_flag(d, ref.buf, ref.offset + offset, value, timeout) < 0) {
		PyErr_SetString(PyExc_ValueError, "after=: the flag wait was refused");
		return -1;
	}
	return 0;
}

int skvpy_after_parse(struct skvpy_client *cl, PyObject *after, struct skv_compact_desc *d)
{
	uint8_t handle[IPC_HANDLE_BYTES];
	uint32_t timeout = 0;
	Py_ssize_t n;

	if (!after || after == Py_None)
		return 0;
	if (!PyTuple_Check(after)) {
		if (event_handle(after, handle) < 0)
			return -1;
		return skv_compact_desc_wait_event(d, handle, 0) < 0 ? fail_type(after) : 0;
	}
	n = PyTuple_GET_SIZE(after);
	if (n == 2) { /* (event, timeout_ms) */
		if (u32_of(PyTuple_GET_ITEM(after, 1), "timeout_ms", &timeout) < 0 ||
		    event_handle(PyTuple_GET_ITEM(after, 0), handle) < 0)
			return -1;
		return skv_compact_desc_wait_event(d, handle, timeout) < 0 ? fail_type(after) : 0;
	}
	if (n != 3 && n != 4)
		return fail_type(after);
	if (n == 4 && u32_of(PyTuple_GET_ITEM(after, 3), "timeout_ms", &timeout) < 0)
		return -1;
	return flag_of(cl, PyTuple_GET_ITEM(after, 0), PyTuple_GET_ITEM(after, 1),
		       PyTuple_GET_ITEM(after, 2), timeout, d);
}
