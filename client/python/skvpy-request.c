// SPDX-License-Identifier: MIT
#include "skvpy-request.h"

#include <errno.h>
#include <math.h>

#include "snapkv.h"
#include "skvpy-cache.h"
#include "skvpy-session.h"
#include "skvpy-error.h"

static void unlink_request(struct skvpy_request *q)
{
	struct skvpy_client *cl = q->client;

	if (q->prev)
		q->prev->next = q->next;
	else if (cl->requests == q)
		cl->requests = q->next;
	if (q->next)
		q->next->prev = q->prev;
	q->next = q->prev = NULL;
}

PyObject *skvpy_request_new(struct skvpy_client *cl, struct skv_request *r, PyObject *out)
{
	struct skvpy_request *q = PyObject_New(struct skvpy_request, &skvpy_request_type);

	if (!q) {
		skv_request_abandon(r);
		Py_XDECREF(out);
		return NULL;
	}
	q->out = out;
	q->waiting = 0;
	q->done = NULL;
	Py_INCREF(cl);
	q->client = cl;
	q->r = r;
	q->prev = NULL;
	q->next = cl->requests;
	if (cl->requests)
		cl->requests->prev = q;
	cl->requests = q;
	return (PyObject *)q;
}

void skvpy_request_drop(struct skvpy_request *q)
{
	if (q->r)
		skv_request_abandon(q->r);
	q->r = NULL;
	if (q->done)
		(void)skv_cache_release(q->done);
	q->done = NULL;
	unlink_request(q);
}

/* A dropped Request that may still write its destination: cancelled,
 * waiting at most the client's deadline (then abandoned, as before). */
static void cancel_on_drop(struct skvpy_request *q)
{
	struct skvpy_client *cl = q->client;
	uint32_t dl;
	int r;

	if (!q->r || !cl->c)
		return;
	dl = skv_client_timeout(cl->c);
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_request_cancel(q->r, dl ? (int)dl : -1, NULL);
	Py_END_ALLOW_THREADS cl->busy--;
	if (r != -ETIMEDOUT)
		q->r = NULL; /* freed by skv_request_cancel */
}

static void request_dealloc(struct skvpy_request *q)
{
	cancel_on_drop(q);
	skvpy_request_drop(q);
	Py_XDECREF(q->out);
	Py_DECREF(q->client);
	PyObject_Free(q);
}

/* timeout in seconds (None: forever) -> ms for skv_request_wait. */
static int timeout_ms(PyObject *o, int *ret)
{
	double s;

	if (!o || o == Py_None) {
		*ret = -1;
		return 0;
	}
	s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (!(s >= 0) || s > INT32_MAX / 1000.0) {
		PyErr_Format(PyExc_ValueError, "timeout must be None or 0 .. %d seconds",
			     INT32_MAX / 1000);
		return -1;
	}
	*ret = (int)ceil(s * 1000.0);
	return 0;
}

static PyObject *request_wait(struct skvpy_request *q, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"timeout", NULL};
	PyObject *to = NULL;
	struct skv_cache *k = NULL;
	int ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:wait", kwlist, &to) ||
	    timeout_ms(to, &ms) < 0)
		return NULL;
	if (q->done) { /* cancel() found it completed */
		PyObject *out = q->out;

		k = q->done;
		q->done = NULL;
		q->out = NULL;
		unlink_request(q);
		return skvpy_cache_new(q->client, k, out);
	}
	if (!q->r)
		return skvpy_error(EINVAL, "the request was already waited for%s",
				   q->client->c ? "" : " (or its client is closed)");
	if (q->waiting)
		return skvpy_error(EBUSY, "another thread waits for this request");
	q->waiting = 1;
	q->client->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_request_wait(q->r, ms, &k);
	Py_END_ALLOW_THREADS q->client->busy--;
	q->waiting = 0;
	if (r == -ETIMEDOUT)
		return skvpy_error(r, "wait: not complete within %d ms (wait again)", ms);
	q->r = NULL; /* freed by skv_request_wait */
	unlink_request(q);
	if (r < 0)
		return skvpy_session_fail(q->client, r, "compact");
	PyObject *out = q->out;
	q->out = NULL;
	return skvpy_cache_new(q->client, k, out);
}

static PyObject *request_cancel(struct skvpy_request *q, PyObject *args, PyObject *kw)
{
	static const char *const outcome[] = {"unwritten", "stopped", "completed"};
	static char *kwlist[] = {"timeout", NULL};
	PyObject *to = NULL;
	struct skv_cache *k = NULL;
	int ms, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:cancel", kwlist, &to) ||
	    timeout_ms(to, &ms) < 0)
		return NULL;
	if (!q->r)
		return skvpy_error(EINVAL, "the request was already waited for or cancelled%s",
				   q->client->c ? "" : " (or its client is closed)");
	if (q->waiting)
		return skvpy_error(EBUSY, "another thread waits for this request");
	q->waiting = 1;
	q->client->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_request_cancel(q->r, ms, &k);
	Py_END_ALLOW_THREADS q->client->busy--;
	q->waiting = 0;
	if (r == -ETIMEDOUT)
		return skvpy_error(r,
				   "cancel: not stopped within %d ms (the destination is still "
				   "the daemon's; cancel or wait again)",
				   ms);
	q->r = NULL; /* freed by skv_request_cancel */
	if (r < 0) {
		unlink_request(q);
		return skvpy_session_fail(q->client, r, "cancel");
	}
	if (r == SKV_CANCEL_COMPLETED)
		q->done = k; /* wait() hands it out; released with the Request */
	else
		unlink_request(q);
	return PyUnicode_FromString(outcome[r]);
}

static PyObject *request_done(struct skvpy_request *q, PyObject *unused)
{
	(void)unused;
	if (q->done)
		Py_RETURN_TRUE;
	if (!q->r)
		return skvpy_error(EINVAL, "the request was already waited for");
	if (q->waiting)
		return skvpy_error(EBUSY, "another thread waits for this request");
	int r = skv_request_poll(q->r);
	return PyBool_FromLong(r != 0);
}

static PyMethodDef request_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))request_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None) -> Cache. timeout in seconds; past it snapkv.Error(ETIMEDOUT)\n"
     "and the request can be waited for again."},
    {"cancel", (PyCFunction)(void (*)(void))request_cancel, METH_VARARGS | METH_KEYWORDS,
     "cancel(timeout=None) -> 'unwritten' | 'stopped' | 'completed'. Stops the\n"
     "compaction and returns only once nothing of it can be written any more\n"
     "(skv_request_cancel): 'unwritten': it never wrote its output; 'stopped':\n"
     "it stopped (or failed) part-way, any destination block may hold part of\n"
     "it; 'completed': it finished first, and wait() returns its Cache. From\n"
     "submit until wait() or cancel() returns, a writeback destination is the\n"
     "daemon's. Past timeout (seconds) snapkv.Error(ETIMEDOUT): still the\n"
     "daemon's; cancel or wait again."},
    {"done", (PyCFunction)request_done, METH_NOARGS, "done() -> True once wait() will not block."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject skvpy_request_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "snapkv.Request",
    .tp_basicsize = sizeof(struct skvpy_request),
    .tp_dealloc = (destructor)request_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A submitted compaction (Client.submit).",
    .tp_methods = request_methods,
};

int skvpy_request_init_type(PyObject *module)
{
	if (PyType_Ready(&skvpy_request_type) < 0)
		return -1;
	Py_INCREF(&skvpy_request_type);
	if (PyModule_AddObject(module, "Request", (PyObject *)&skvpy_request_type) < 0) {
		Py_DECREF(&skvpy_request_type);
		return -1;
	}
	return 0;
}
