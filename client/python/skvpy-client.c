// SPDX-License-Identifier: MIT
#include "skvpy-client.h"

#include <errno.h>
#include <string.h>

#include "snapkv.h"
#include "skvpy-cache.h"
#include "skvpy-compact.h"
#include "skvpy-pool.h"
#include "skvpy-error.h"
#include "skvpy-mapping.h"
#include "skvpy-request.h"

int skvpy_client_check(struct skvpy_client *cl)
{
	if (!cl->c)
		return skvpy_error_int(ENOTCONN, "the client is closed");
	return 0;
}

static int client_init(struct skvpy_client *cl, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"socket", "name", "timeout_ms", "arrays", NULL};
	const char *path = NULL, *name = NULL, *arrays = NULL;
	PyObject *timeout = Py_None;
	struct skv_client_opts o = {.opts_size = sizeof(o)};
	struct skv_client *c = NULL;
	int r;

	if (cl->c) {
		PyErr_SetString(PyExc_RuntimeError, "Client is already connected");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|zzOz:Client", kwlist, &path, &name, &timeout,
					 &arrays))
		return -1;
	if (path && strlen(path) >= 108) {
		PyErr_Format(PyExc_ValueError, "socket path of %zu bytes (at most 107)",
			     strlen(path));
		return -1;
	}
	if (timeout != Py_None) {
		long long t = PyLong_AsLongLong(timeout);
		if (t == -1 && PyErr_Occurred())
			return -1;
		if (t < 0 || t > INT32_MAX) {
			PyErr_Format(PyExc_ValueError,
				     "timeout_ms %lld: 0 (no deadline) .. %d allowed", t,
				     INT32_MAX);
			return -1;
		}
		o.timeout_ms = t ? (int32_t)t : -1;
	}
	cl->kind = SKVPY_KIND_AUTO;
	if (arrays && !strcmp(arrays, "torch"))
		cl->kind = SKVPY_KIND_TORCH;
	else if (arrays && !strcmp(arrays, "numpy"))
		cl->kind = SKVPY_KIND_NUMPY;
	else if (arrays) {
		PyErr_Format(PyExc_ValueError, "arrays '%s': 'torch' or 'numpy'", arrays);
		return -1;
	}
	if (skvpy_kind_resolve(cl->kind, &cl->kind) < 0)
		return -1;
	o.name = name;
	Py_BEGIN_ALLOW_THREADS r = skv_client_connect(path, &o, &c);
	Py_END_ALLOW_THREADS if (r < 0)
	{
		skvpy_error(r, "cannot connect to snapkvd%s%s: %s", path ? " at " : "",
			    path ? path : "", strerror(-r));
		return -1;
	}
	cl->c = c;
	return 0;
}

/* Release caches, abandon requests, drop registrations, close the session. */
static int client_close_now(struct skvpy_client *cl)
{
	if (!cl->c)
		return 0;
	if (cl->busy)
		return skvpy_error_int(EBUSY,
				       "close: %d call(s) of this client are running in other "
				       "threads",
				       cl->busy);
	while (cl->caches)
		skvpy_cache_drop(cl->caches);
	while (cl->requests)
		skvpy_request_drop(cl->requests);
	struct skv_client *c = cl->c;

	cl->c = NULL; /* other threads see it closed while the fence runs */
	/* fences every write of the session first: may wait for the daemon */
	Py_BEGIN_ALLOW_THREADS skv_client_close(c); /* frees every skv_buffer; our mappings stay */
	Py_END_ALLOW_THREADS;
	for (size_t i = 0; i < cl->n_regs; i++)
		Py_XDECREF(cl->regs[i].mapping);
	PyMem_Free(cl->regs);
	cl->regs = NULL;
	cl->n_regs = cl->cap_regs = 0;
	return 0;
}

static void client_dealloc(struct skvpy_client *cl)
{
	/* caches and requests hold a reference: none is left here */
	cl->busy = 0;
	client_close_now(cl);
	Py_XDECREF(cl->arena);
	Py_TYPE(cl)->tp_free((PyObject *)cl);
}

static PyObject *client_close(struct skvpy_client *cl, PyObject *unused)
{
	(void)unused;
	if (client_close_now(cl) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *client_enter(struct skvpy_client *cl, PyObject *unused)
{
	(void)unused;
	if (skvpy_client_check(cl) < 0)
		return NULL;
	Py_INCREF(cl);
	return (PyObject *)cl;
}

static PyObject *client_exit(struct skvpy_client *cl, PyObject *args)
{
	(void)args;
	if (client_close_now(cl) < 0)
		return NULL;
	Py_RETURN_FALSE;
}

static struct skvpy_reg *reg_add(struct skvpy_client *cl)
{
	if (cl->n_regs == SKVPY_MAX_REGS) {
		skvpy_error(ENOSPC, "%d buffers registered with this client (the limit)",
			    SKVPY_MAX_REGS);
		return NULL;
	}
	if (cl->n_regs == cl->cap_regs) {
		size_t n = cl->cap_regs ? cl->cap_regs * 2 : 8;
		struct skvpy_reg *r = PyMem_Realloc(cl->regs, n * sizeof(*r));
		if (!r) {
			PyErr_NoMemory();
			return NULL;
		}
		cl->regs = r;
		cl->cap_regs = n;
	}
	struct skvpy_reg *g = &cl->regs[cl->n_regs];
	memset(g, 0, sizeof(*g));
	return g;
}

/* 1 when m is registered here (writable as asked, or read-only and asking for
 * read-only); -1 with ValueError when registered read-only but wanted writable. */
static int find_reg(struct skvpy_client *cl, struct skvpy_mapping *m, int writable)
{
	for (size_t i = 0; i < cl->n_regs; i++)
		if (cl->regs[i].mapping == m) {
			if (writable && !cl->regs[i].writable) {
				PyErr_SetString(
				    PyExc_ValueError,
				    "the buffer is registered read-only with this client: "
				    "allocate it with empty(..., writable=True)");
				return -1;
			}
			return 1;
		}
	return 0;
}

/*
 * Register a memfd buffer with this session. -1 with an exception. The
 * table is only touched with the GIL held: other threads may register
 * (and grow it) while this one waits for the daemon.
 */
static int register_mapping(struct skvpy_client *cl, struct skvpy_mapping *m, int writable)
{
	struct skv_buffer *b = NULL;
	struct skvpy_reg *g;
	int r;

	if ((r = find_reg(cl, m, writable)) != 0)
		return r < 0 ? -1 : 0;
	if (cl->n_regs >= SKVPY_MAX_REGS)
		return skvpy_error_int(ENOSPC, "%d buffers registered with this client (the limit)",
				       SKVPY_MAX_REGS);
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_buffer_register_fd_flags(
	    cl->c, m->fd, m->size, writable ? SKV_BUFFER_WRITABLE : 0, &b);
	Py_END_ALLOW_THREADS cl->busy--;
	if (r < 0) {
		skvpy_session_fail(cl, r, "register");
		return -1;
	}
	if (find_reg(cl, m, 0) || !(g = reg_add(cl))) {
		/* registered meanwhile by another thread, or no room */
		int failed = PyErr_Occurred() != NULL;
		cl->busy++;
		Py_BEGIN_ALLOW_THREADS skv_buffer_free(b);
		Py_END_ALLOW_THREADS cl->busy--;
		return failed ? -1 : 0;
	}
	Py_INCREF(m);
	g->mapping = m;
	g->b = b;
	g->base = (uintptr_t)m->data;
	g->size = m->size;
	g->writable = writable;
	cl->n_regs++;
	return 0;
}

/* shape: an int or a sequence of 1..8 positive ints. */
static int parse_shape(PyObject *o, int64_t *shape, int *ret_n, uint64_t *ret_elems)
{
	PyObject *seq;
	Py_ssize_t n;
	uint64_t elems = 1;

	if (PyLong_Check(o))
		seq = PyTuple_Pack(1, o);
	else
		seq = PySequence_Fast(o, "shape must be an int or a sequence of ints");
	if (!seq)
		return -1;
	n = PySequence_Fast_GET_SIZE(seq);
	if (n < 1 || n > 8) {
		Py_DECREF(seq);
		PyErr_Format(PyExc_ValueError, "shape has %zd dimensions (1 .. 8 allowed)", n);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
		if ((x == -1 && PyErr_Occurred()) || x < 1 || x > (1ll << 40) ||
		    elems > SKVPY_MAX_BUFFER_BYTES / (uint64_t)x) {
			Py_DECREF(seq);
			if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError)) {
				PyErr_Clear();
				PyErr_Format(PyExc_ValueError,
					     "shape: dimension %zd must be >= 1 and the buffer at "
					     "most %llu bytes",
					     i, (unsigned long long)SKVPY_MAX_BUFFER_BYTES);
			}
			return -1;
		}
		shape[i] = x;
		elems *= (uint64_t)x;
	}
	Py_DECREF(seq);
	*ret_n = (int)n;
	*ret_elems = elems;
	return 0;
}

static PyObject *client_empty(struct skvpy_client *cl, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"shape", "dtype", "writable", NULL};
	PyObject *oshape, *odt, *arr = NULL;
	int writable = 0;
	int64_t shape[8], strides[8];
	enum skv_dtype dt;
	enum skvpy_kind kind;
	uint64_t elems;
	int n;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$p:empty", kwlist, &oshape, &odt, &writable))
		return NULL;
	if (skvpy_client_check(cl) < 0 || parse_shape(oshape, shape, &n, &elems) < 0 ||
	    skvpy_dtype_parse(odt, &dt, &kind) < 0)
		return NULL;
	if (kind == SKVPY_KIND_AUTO)
		kind = cl->kind;
	uint64_t bytes = elems * skv_dtype_size(dt);
	if (bytes > SKVPY_MAX_BUFFER_BYTES) {
		PyErr_Format(PyExc_ValueError, "empty: %llu bytes (at most %llu)",
			     (unsigned long long)bytes, (unsigned long long)SKVPY_MAX_BUFFER_BYTES);
		return NULL;
	}
	struct skvpy_mapping *m = skvpy_mapping_memfd((size_t)bytes);
	if (!m)
		return NULL;
	if (register_mapping(cl, m, writable) == 0) {
		strides[n - 1] = 1;
		for (int i = n - 2; i >= 0; i--)
			strides[i] = strides[i + 1] * shape[i + 1];
		arr =
		    skvpy_array_new(kind, (PyObject *)m, 0, (enum skvpy_elem)dt, n, shape, strides);
	}
	Py_DECREF(m);
	return arr;
}

/* (device, handle, size, offset) of torch's storage sharing tuple. */
static int cuda_share_args(PyObject *sh, int *dev, const char **h, uint64_t *size, uint64_t *off)
{
	Py_ssize_t hn = 0;
	char *hp;

	if (!PyTuple_Check(sh) || PyTuple_GET_SIZE(sh) < 4 ||
	    !PyBytes_Check(PyTuple_GET_ITEM(sh, 1))) {
		PyErr_SetString(PyExc_TypeError, "register: unexpected torch storage sharing data");
		return -1;
	}
	*dev = (int)PyLong_AsLong(PyTuple_GET_ITEM(sh, 0));
	*size = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(sh, 2));
	*off = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(sh, 3));
	if (PyErr_Occurred() || PyBytes_AsStringAndSize(PyTuple_GET_ITEM(sh, 1), &hp, &hn) < 0)
		return -1;
	if (hn != 64 || *size == 0) {
		PyErr_Format(PyExc_ValueError,
			     "register: a CUDA IPC handle of %zd bytes (64 expected), storage of "
			     "%llu bytes",
			     hn, (unsigned long long)*size);
		return -1;
	}
	*h = hp;
	return 0;
}

/*
 * A CUDA tensor's whole storage over CUDA IPC, imported once by the daemon
 * (--backend cuda; otherwise it answers ENOTSUP): torch's storage sharing
 * (_share_cuda_, as torch.multiprocessing uses) gives the cudaIpcMemHandle
 * of the allocation the storage lies in and the storage's offset and size
 * there. Not exercised on this project's CPU-only test machine.
 */
static int register_cuda(struct skvpy_client *cl, PyObject *t, int writable)
{
	PyObject *st, *sh = NULL, *ptr = NULL;
	struct skv_buffer *b = NULL;
	uint64_t size = 0, off = 0, base;
	struct skvpy_reg *g;
	const char *h = NULL;
	int dev = 0, r = -1;

	st = PyObject_CallMethod(t, "untyped_storage", NULL); /* torch >= 2.0 */
	if (!st) {
		PyErr_Clear();
		st = PyObject_CallMethod(t, "storage", NULL);
	}
	if (!st)
		return -1;
	sh = PyObject_CallMethod(st, "_share_cuda_", NULL);
	ptr = PyObject_CallMethod(st, "data_ptr", NULL);
	if (!sh || !ptr || cuda_share_args(sh, &dev, &h, &size, &off) < 0)
		goto out;
	base = PyLong_AsUnsignedLongLong(ptr);
	if (PyErr_Occurred())
		goto out;
	for (size_t i = 0; i < cl->n_regs; i++)
		if (cl->regs[i].cuda && cl->regs[i].base == base && cl->regs[i].size == size) {
			r = 0;
			goto out;
		}
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_buffer_register_cuda_ipc_flags(
	    cl->c, h, off, size, dev, writable ? SKV_BUFFER_WRITABLE : 0, &b);
	Py_END_ALLOW_THREADS cl->busy--;
	if (r < 0) {
		skvpy_session_fail(cl, r, "register");
		r = -1;
		goto out;
	}
	if (!(g = reg_add(cl))) {
		skv_buffer_free(b);
		r = -1;
		goto out;
	}
	g->b = b;
	g->base = (uintptr_t)base;
	g->size = size;
	g->cuda = 1;
	g->writable = writable;
	cl->n_regs++;
	r = 0;
out:
	Py_XDECREF(st);
	Py_XDECREF(sh);
	Py_XDECREF(ptr);
	return r;
}

static PyObject *client_register(struct skvpy_client *cl, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"tensor", "writable", NULL};
	struct skvpy_view v;
	uintptr_t lo, hi;
	PyObject *t;
	int writable = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$p:register", kwlist, &t, &writable))
		return NULL;
	if (skvpy_client_check(cl) < 0 || skvpy_view_of(t, "register(tensor)", &v) < 0)
		return NULL;
	skvpy_view_extent(&v, &lo, &hi);
	if (v.cuda)
		return register_cuda(cl, t, writable) < 0 ? NULL : Py_NewRef(Py_None);
	struct skvpy_mapping *m = skvpy_mapping_find(lo, hi);
	if (!m) {
		PyErr_SetString(PyExc_ValueError,
				"register: the tensor's storage is not a registrable buffer: "
				"allocate it with client.empty() (CPU tensors) or pass a CUDA "
				"tensor");
		return NULL;
	}
	if (register_mapping(cl, m, writable) < 0)
		return NULL;
	Py_RETURN_NONE;
}

/* Submit the request of args/kw; *ret_req and *ret_out (a new reference or
 * NULL: writeback pools for the Cache) on success. */
static int submit(struct skvpy_client *cl, PyObject *args, PyObject *kw, struct skv_request **ret,
		  PyObject **ret_out)
{
	struct skvpy_compact p;
	int r;

	if (skvpy_client_check(cl) < 0 || skvpy_compact_parse(cl, args, kw, &p) < 0)
		return -1;
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_compact_submit(cl->c, &p.d, ret);
	Py_END_ALLOW_THREADS cl->busy--;
	*ret_out = p.out;
	p.out = NULL;
	skvpy_compact_free(&p);
	if (r < 0) {
		Py_CLEAR(*ret_out);
		skvpy_session_fail(cl, r, "compact");
		return -1;
	}
	return 0;
}

static PyObject *client_submit(struct skvpy_client *cl, PyObject *args, PyObject *kw)
{
	struct skv_request *req;
	PyObject *out;

	if (submit(cl, args, kw, &req, &out) < 0)
		return NULL;
	return skvpy_request_new(cl, req, out);
}

static PyObject *client_register_pool(struct skvpy_client *cl, PyObject *args, PyObject *kw)
{
	if (skvpy_client_check(cl) < 0)
		return NULL;
	return skvpy_pool_register(cl, args, kw);
}

/* The descriptions of submit_many's items (each a dict of submit()'s
 * keywords, q among them), parsed before anything is sent. */
static int many_parse(struct skvpy_client *cl, PyObject *seq, struct skvpy_compact *ps,
		      Py_ssize_t n)
{
	PyObject *empty = PyTuple_New(0);
	Py_ssize_t i;

	if (!empty)
		return -1;
	for (i = 0; i < n; i++) {
		PyObject *it = PySequence_Fast_GET_ITEM(seq, i);

		if (!PyDict_Check(it)) {
			PyErr_Format(PyExc_TypeError,
				     "submit_many: item %zd must be a dict of submit()'s keywords",
				     i);
			break;
		}
		if (skvpy_compact_parse(cl, empty, it, &ps[i]) < 0)
			break;
	}
	Py_DECREF(empty);
	if (i == n)
		return 0;
	while (i-- > 0)
		skvpy_compact_free(&ps[i]);
	return -1;
}

/* submit_many([kw, ...]) -> [Request, ...]: one libsnapkv call, one
 * doorbell (skv_compact_submit_many). */
static PyObject *client_submit_many(struct skvpy_client *cl, PyObject *arg)
{
	struct skvpy_compact *ps = NULL;
	const struct skv_compact_desc **ds = NULL;
	struct skv_request **rq = NULL;
	PyObject *seq, *ret = NULL;
	uint32_t done = 0;
	Py_ssize_t n;
	int r;

	if (skvpy_client_check(cl) < 0 ||
	    !(seq = PySequence_Fast(arg, "submit_many takes a list of dicts")))
		return NULL;
	n = PySequence_Fast_GET_SIZE(seq);
	if (n > 4096) {
		PyErr_Format(PyExc_ValueError, "submit_many: %zd requests (at most 4096)", n);
		goto out;
	}
	ps = PyMem_Calloc((size_t)n + 1, sizeof(*ps));
	ds = PyMem_Calloc((size_t)n + 1, sizeof(*ds));
	rq = PyMem_Calloc((size_t)n + 1, sizeof(*rq));
	if (!ps || !ds || !rq) {
		PyErr_NoMemory();
		goto out;
	}
	if (many_parse(cl, seq, ps, n) < 0)
		goto out;
	for (Py_ssize_t i = 0; i < n; i++)
		ds[i] = &ps[i].d;
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_compact_submit_many(cl->c, ds, (uint32_t)n, rq, &done);
	Py_END_ALLOW_THREADS cl->busy--;
	ret = PyList_New(0);
	for (uint32_t i = 0; i < done; i++) {
		PyObject *q = skvpy_request_new(cl, rq[i], ps[i].out);

		ps[i].out = NULL;
		if (!q || !ret || PyList_Append(ret, q) < 0)
			Py_CLEAR(ret);
		Py_XDECREF(q);
	}
	if (r < 0) {
		/* the ones submitted are dropped (a Request dropped cancels) */
		Py_CLEAR(ret);
		skvpy_session_fail(cl, r, "submit_many");
	}
	for (Py_ssize_t i = 0; i < n; i++)
		skvpy_compact_free(&ps[i]);
out:
	PyMem_Free(ps);
	PyMem_Free(ds);
	PyMem_Free(rq);
	Py_DECREF(seq);
	return ret;
}

static PyObject *client_compact(struct skvpy_client *cl, PyObject *args, PyObject *kw)
{
	struct skv_request *req;
	struct skv_cache *k = NULL;
	PyObject *out;
	int r;

	if (submit(cl, args, kw, &req, &out) < 0)
		return NULL;
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_request_wait(req, -1, &k);
	Py_END_ALLOW_THREADS cl->busy--;
	if (r < 0) {
		Py_XDECREF(out);
		return skvpy_session_fail(cl, r, "compact");
	}
	return skvpy_cache_new(cl, k, out);
}

static PyObject *client_stats(struct skvpy_client *cl, PyObject *unused)
{
	struct skv_stats s;
	int r;

	(void)unused;
	if (skvpy_client_check(cl) < 0)
		return NULL;
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_client_stats(cl->c, &s);
	Py_END_ALLOW_THREADS cl->busy--;
	if (r < 0)
		return skvpy_session_fail(cl, r, "stats");
	return Py_BuildValue(
	    "{sKsKsKsKsKsKsKsK}", "caches", (unsigned long long)s.caches, "buffers",
	    (unsigned long long)s.buffers, "arena_used", (unsigned long long)s.arena_used,
	    "arena_bytes", (unsigned long long)s.arena_bytes, "requests",
	    (unsigned long long)s.requests, "errors", (unsigned long long)s.errors, "pool_total",
	    (unsigned long long)s.pool_total, "pool_used", (unsigned long long)s.pool_used);
}

static PyObject *client_nop(struct skvpy_client *cl, PyObject *unused)
{
	int r;

	(void)unused;
	if (skvpy_client_check(cl) < 0)
		return NULL;
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_client_nop(cl->c);
	Py_END_ALLOW_THREADS cl->busy--;
	if (r < 0)
		return skvpy_session_fail(cl, r, "nop");
	Py_RETURN_NONE;
}

static PyObject *client_get_closed(struct skvpy_client *cl, void *closure)
{
	(void)closure;
	return PyBool_FromLong(!cl->c);
}

static PyObject *client_get_session(struct skvpy_client *cl, void *closure)
{
	(void)closure;
	return PyLong_FromUnsignedLongLong(cl->c ? skv_client_session_id(cl->c) : 0);
}

static PyObject *client_get_timeout(struct skvpy_client *cl, void *closure)
{
	(void)closure;
	if (skvpy_client_check(cl) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(skv_client_timeout(cl->c));
}

static int client_set_timeout(struct skvpy_client *cl, PyObject *v, void *closure)
{
	(void)closure;
	if (!v) {
		PyErr_SetString(PyExc_AttributeError, "timeout_ms cannot be deleted");
		return -1;
	}
	long long t = PyLong_AsLongLong(v);
	if (t == -1 && PyErr_Occurred())
		return -1;
	if (t < 0 || t > INT32_MAX) {
		PyErr_Format(PyExc_ValueError, "timeout_ms %lld: 0 (none) .. %d", t, INT32_MAX);
		return -1;
	}
	if (skvpy_client_check(cl) < 0)
		return -1;
	int r = skv_client_set_timeout(cl->c, (uint32_t)t);
	if (r < 0) {
		skvpy_session_fail(cl, r, "timeout_ms");
		return -1;
	}
	return 0;
}

static PyMethodDef client_methods[] = {
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close(): end the session; the daemon frees its caches. Caches and requests of this\n"
     "client are released; tensors over its buffers and arena stay readable."},
    {"__enter__", (PyCFunction)client_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)client_exit, METH_VARARGS, NULL},
    {"empty", (PyCFunction)(void (*)(void))client_empty, METH_VARARGS | METH_KEYWORDS,
     "empty(shape, dtype, *, writable=False) -> tensor over a new sealed memfd registered\n"
     "with the daemon (writable: the daemon may write compact K/V there, out='writeback').\n"
     "(zero copy). A torch dtype gives a torch tensor, a numpy dtype a numpy array, a\n"
     "string ('f32', 'f16', 'bf16') the client's kind."},
    {"register", (PyCFunction)(void (*)(void))client_register, METH_VARARGS | METH_KEYWORDS,
     "register(tensor, *, writable=False): register the storage of a tensor from empty()\n"
     "(of any client) with this client, or a CUDA tensor's whole storage over CUDA IPC\n"
     "(the daemon must run --backend cuda); writable: a writeback destination.\n"
     "Anything else raises ValueError."},
    {"compact", (PyCFunction)(void (*)(void))client_compact, METH_VARARGS | METH_KEYWORDS,
     "compact(q, k, v, *, window=32, budget=2048, kernel=5, pooling='avg', gqa='group',\n"
     "        policy='snapkv', sinks=4, protect=(), decode_reserve=0, block_table=None,\n"
     "        out='arena', out_block_size=None, out_block_table=None, out_buffer=None,\n"
     "        layout='hnd', out_layout='hnd', prompt_len=None, evictable=False,\n"
     "        fallback_below=None, group=None, min_window=None, kv_dtype=None,\n"
     "        kv_scales=None, after=None, pool=None, span=None) -> Cache\n"
     "q, k, v: lists, one tensor per layer, views of registered storage.\n"
     "pool: a Pool (register_pool) instead of k and v: compact(q, pool=pool,\n"
     "block_table=..., prompt_len=...), q one [layers, H_q, n_q, D] tensor or a list.\n"
     "span: keep up to span neighbours on either side of each position picked by\n"
     "score until the budget is used (kernels/skv.h; None or 0: top-k; at most 64).\n"
     "A q of n_q < window rows is a partial window: n_q >= min_window rows vote\n"
     "(None: the daemon's min_window, default 8).\n"
     "fp8 K/V: uint8 tensors with kv_dtype='f8e4m3fn'|'f8e5m2' and kv_scales=(k, v)\n"
     "(or one pair per layer); the cache keeps their bytes, cache.kv_scales the scales.\n"
     "budget: an int (uniform C, window included), a budget mode string ('heads:0.2',\n"
     "'mass:0.9:64:512:32', ...), or (C, mode) for modes that read C. capacity=C is the\n"
     "deprecated name of C (DeprecationWarning); Cache.capacity is the slot count.\n"
     "after: the prefill to wait for (the daemon reads nothing before; --backend cuda):\n"
     "a torch.cuda.Event(interprocess=True) recorded after it (or its 64-byte\n"
     "ipc_handle()), or (tensor, offset, value): a u32 flag at byte offset of a\n"
     "registered CUDA tensor, waited for until >= value; a last element timeout_ms\n"
     "((event, ms), (tensor, offset, value, ms)) bounds the wait (snapkv.Error\n"
     "ETIME past it; 0: the daemon's prefill_wait_max_ms)."},
    {"submit", (PyCFunction)(void (*)(void))client_submit, METH_VARARGS | METH_KEYWORDS,
     "submit(...) -> Request: compact() without waiting."},
    {"register_pool", (PyCFunction)(void (*)(void))client_register_pool,
     METH_VARARGS | METH_KEYWORDS,
     "register_pool(k, v) -> Pool: the engine's paged K and V pools, one per layer\n"
     "([n_blocks, block_size, H_kv, D] views of registered storage), validated once by\n"
     "the daemon. Then compact(q, pool=pool, block_table=..., prompt_len=...): q one\n"
     "tensor [layers, H_q, n_q, D] ([layers, n_q, H_q, D] with layout='nhd') or a list;\n"
     "block_table a list, or a 1-D int32 tensor/array in registered storage (read there\n"
     "by the daemon, up to its max_block_table entries); out='writeback' writes into the\n"
     "pool's own blocks (out_block_table). The daemon's max_session_pools bounds them."},
    {"submit_many", (PyCFunction)client_submit_many, METH_O,
     "submit_many([kw, ...]) -> [Request, ...]: several submit(**kw) (q among the\n"
     "keywords) in one call and one doorbell. All are checked before any is sent."},
    {"stats", (PyCFunction)client_stats, METH_NOARGS, "stats() -> dict of session counters"},
    {"nop", (PyCFunction)client_nop, METH_NOARGS, "nop(): a no-op round trip over the ring"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
    {"closed", (getter)client_get_closed, NULL, "True once closed", NULL},
    {"session_id", (getter)client_get_session, NULL, "the daemon's session id (0: closed)", NULL},
    {"timeout_ms", (getter)client_get_timeout, (setter)client_set_timeout,
     "deadline of each call in ms (0: none)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject skvpy_client_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "snapkv.Client",
    .tp_basicsize = sizeof(struct skvpy_client),
    .tp_dealloc = (destructor)client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Client(socket=None, name=None, timeout_ms=None, arrays=None): a session with\n"
	      "snapkvd (socket None: $SNAPKV_SOCKET, the system socket, $XDG_RUNTIME_DIR).\n"
	      "arrays: 'torch' or 'numpy' for the arrays it returns (default: torch when it\n"
	      "imports). A context manager; close() ends the session.",
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_init = (initproc)client_init,
    .tp_new = PyType_GenericNew,
};

int skvpy_client_init_type(PyObject *module)
{
	if (PyType_Ready(&skvpy_client_type) < 0)
		return -1;
	Py_INCREF(&skvpy_client_type);
	if (PyModule_AddObject(module, "Client", (PyObject *)&skvpy_client_type) < 0) {
		Py_DECREF(&skvpy_client_type);
		return -1;
	}
	return 0;
}
