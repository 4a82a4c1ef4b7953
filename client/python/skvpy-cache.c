// SPDX-License-Identifier: MIT
#include "skvpy-cache.h"

#include <errno.h>

#include "snapkv.h"
#include "skvpy-array.h"
#include "skvpy-client.h"
#include "skvpy-error.h"

static void unlink_cache(struct skvpy_cache *c)
{
	struct skvpy_client *cl = c->client;

	if (c->prev)
		c->prev->next = c->next;
	else if (cl->caches == c)
		cl->caches = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->next = c->prev = NULL;
}

PyObject *skvpy_cache_new(struct skvpy_client *cl, struct skv_cache *k)
{
	struct skvpy_cache *c = PyObject_New(struct skvpy_cache, &skvpy_cache_type);

	if (!c) {
		skv_cache_release(k);
		return NULL;
	}
	Py_INCREF(cl);
	c->client = cl;
	c->k = k;
	c->prev = NULL;
	c->next = cl->caches;
	if (cl->caches)
		cl->caches->prev = c;
	cl->caches = c;
	return (PyObject *)c;
}

/* Release (linger or not) without the GIL. */
static int release(struct skvpy_cache *c, int linger)
{
	struct skv_cache *k = c->k;
	int r;

	c->k = NULL;
	unlink_cache(c);
	c->client->busy++;
	Py_BEGIN_ALLOW_THREADS r = linger ? skv_cache_release_linger(k) : skv_cache_release(k);
	Py_END_ALLOW_THREADS c->client->busy--;
	return r;
}

void skvpy_cache_drop(struct skvpy_cache *c)
{
	if (c->k)
		release(c, 0);
	else
		unlink_cache(c);
}

static void cache_dealloc(struct skvpy_cache *c)
{
	if (c->k)
		release(c, 0);
	Py_DECREF(c->client);
	PyObject_Free(c);
}

static int live(struct skvpy_cache *c)
{
	if (!c->k)
		return skvpy_error_int(EBADF, "the cache was released%s",
				       c->client->c ? "" : " (its client is closed)");
	return 0;
}

static const struct skv_cache_info *info(struct skvpy_cache *c)
{
	return live(c) < 0 ? NULL : skv_cache_info(c->k);
}

static int layer_arg(struct skvpy_cache *c, PyObject *o, uint32_t *ret)
{
	const struct skv_cache_info *in = info(c);
	long l;

	if (!in)
		return -1;
	l = PyLong_AsLong(o);
	if (l == -1 && PyErr_Occurred())
		return -1;
	if (l < 0 || (unsigned long)l >= in->layers) {
		PyErr_Format(PyExc_IndexError, "layer %ld: the cache has %u", l, in->layers);
		return -1;
	}
	*ret = (uint32_t)l;
	return 0;
}

/* K (kv 0) or V of one layer: [h_store, capacity, D] (HND) or [capacity, h_store, D]. */
static PyObject *kv(struct skvpy_cache *c, PyObject *o, int is_v)
{
	const struct skv_cache_info *in;
	uint32_t l;
	size_t off;

	if (layer_arg(c, o, &l) < 0)
		return NULL;
	in = skv_cache_info(c->k);
	if (in->kv_arena != SKV_ARENA_HOST)
		return skvpy_error(EOPNOTSUPP, "the cache's K/V are in the GPU arena");
	void *p = is_v ? skv_cache_v(c->k, l, 0) : skv_cache_k(c->k, l, 0);
	if (!p)
		return skvpy_error(EPROTO, "layer %u has no K/V in the arena", l);
	if (skvpy_client_arena_offset(c->client, p, &off) < 0)
		return NULL;
	int nhd = in->layout == SKV_LAYOUT_NHD;
	int64_t shape[3] = {nhd ? in->capacity : in->h_store, nhd ? in->h_store : in->capacity,
			    in->head_dim};
	int64_t strides[3] = {nhd ? in->token_stride : in->head_stride,
			      nhd ? in->head_stride : in->token_stride, 1};
	return skvpy_array_new(c->client->kind, (PyObject *)c->client->arena, off,
			       (enum skvpy_elem)in->dtype, 3, shape, strides);
}

static PyObject *cache_k(struct skvpy_cache *c, PyObject *o)
{
	return kv(c, o, 0);
}

static PyObject *cache_v(struct skvpy_cache *c, PyObject *o)
{
	return kv(c, o, 1);
}

static PyObject *cache_positions(struct skvpy_cache *c, PyObject *o)
{
	uint32_t l;
	size_t off;

	if (layer_arg(c, o, &l) < 0)
		return NULL;
	const struct skv_cache_info *in = skv_cache_info(c->k);
	const int32_t *p = skv_cache_positions(c->k, l, 0);
	if (!p)
		return skvpy_error(EPROTO, "layer %u has no position table", l);
	if (skvpy_client_arena_offset(c->client, p, &off) < 0)
		return NULL;
	int64_t shape[2] = {in->h_store, in->capacity}, strides[2] = {in->capacity, 1};
	return skvpy_array_new(c->client->kind, (PyObject *)c->client->arena, off, SKVPY_EL_I32, 2,
			       shape, strides);
}

/* append(n), grow(extra): ring calls without the GIL. */
static PyObject *ring_call(struct skvpy_cache *c, PyObject *o, int grow)
{
	long n;
	int r;

	if (live(c) < 0)
		return NULL;
	n = PyLong_AsLong(o);
	if (n == -1 && PyErr_Occurred())
		return NULL;
	if (n < (grow ? 1 : 0) || n > (1l << 22)) {
		PyErr_Format(PyExc_ValueError, "%s %ld: %d .. %ld", grow ? "grow" : "append", n,
			     grow ? 1 : 0, 1l << 22);
		return NULL;
	}
	c->client->busy++;
	Py_BEGIN_ALLOW_THREADS r =
	    grow ? skv_cache_grow(c->k, (uint32_t)n) : skv_cache_append(c->k, (uint32_t)n);
	Py_END_ALLOW_THREADS c->client->busy--;
	if (r < 0)
		return skvpy_client_fail(c->client, r, grow ? "grow" : "append");
	Py_RETURN_NONE;
}

static PyObject *cache_append(struct skvpy_cache *c, PyObject *args)
{
	PyObject *n = NULL;

	if (!PyArg_ParseTuple(args, "|O:append", &n))
		return NULL;
	if (n)
		return ring_call(c, n, 0);
	PyObject *one = PyLong_FromLong(1);
	PyObject *r = one ? ring_call(c, one, 0) : NULL;
	Py_XDECREF(one);
	return r;
}

static PyObject *cache_grow(struct skvpy_cache *c, PyObject *o)
{
	return ring_call(c, o, 1);
}

static PyObject *cache_release(struct skvpy_cache *c, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"linger", NULL};
	int linger = 0, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p:release", kwlist, &linger))
		return NULL;
	if (live(c) < 0)
		return NULL;
	r = release(c, linger);
	if (r < 0)
		return skvpy_error(r, "release: %s",
				   c->client->c ? skv_client_error(c->client->c) : "failed");
	Py_RETURN_NONE;
}

static PyObject *cache_enter(struct skvpy_cache *c, PyObject *unused)
{
	(void)unused;
	if (live(c) < 0)
		return NULL;
	Py_INCREF(c);
	return (PyObject *)c;
}

static PyObject *cache_exit(struct skvpy_cache *c, PyObject *args)
{
	(void)args;
	if (c->k)
		release(c, 0);
	Py_RETURN_FALSE;
}

static PyObject *cache_mass(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);
	PyObject *res;

	(void)closure;
	if (!in)
		return NULL;
	size_t n = (size_t)in->layers * in->h_store;
	float *m = PyMem_Malloc(n * sizeof(float) + 1);
	if (!m)
		return PyErr_NoMemory();
	for (uint32_t l = 0; l < in->layers; l++)
		for (uint32_t h = 0; h < in->h_store; h++)
			m[(size_t)l * in->h_store + h] = skv_cache_retained_mass(c->k, l, h);
	res = skvpy_array_from_floats(c->client->kind, m, in->layers, in->h_store);
	PyMem_Free(m);
	return res;
}

/* The integer fields of skv_cache_info, by offset. */
#define FIELD(f) ((void *)offsetof(struct skv_cache_info, f))

static PyObject *cache_u32(struct skvpy_cache *c, void *off)
{
	const struct skv_cache_info *in = info(c);

	if (!in)
		return NULL;
	return PyLong_FromUnsignedLong(*(const uint32_t *)((const char *)in + (size_t)off));
}

static PyObject *cache_id(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);

	(void)closure;
	return in ? PyLong_FromUnsignedLongLong(in->id) : NULL;
}

static PyObject *cache_next_position(struct skvpy_cache *c, void *closure)
{
	(void)closure;
	return live(c) < 0 ? NULL : PyLong_FromUnsignedLong(skv_cache_next_position(c->k));
}

static PyObject *cache_next_slot(struct skvpy_cache *c, void *closure)
{
	(void)closure;
	return live(c) < 0 ? NULL : PyLong_FromUnsignedLong(skv_cache_next_slot(c->k));
}

static PyObject *cache_dtype(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);

	(void)closure;
	return in ? PyUnicode_FromString(skv_dtype_name(in->dtype) ? skv_dtype_name(in->dtype)
								   : "?")
		  : NULL;
}

static PyObject *cache_layout(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);

	(void)closure;
	if (!in)
		return NULL;
	return PyUnicode_FromString(in->layout == SKV_LAYOUT_NHD ? "nhd" : "hnd");
}

static PyObject *cache_released(struct skvpy_cache *c, void *closure)
{
	(void)closure;
	return PyBool_FromLong(!c->k);
}

static PyGetSetDef cache_getset[] = {
    {"id", (getter)cache_id, NULL, "the daemon's cache id", NULL},
    {"layers", (getter)cache_u32, NULL, "layers", FIELD(layers)},
    {"h_store", (getter)cache_u32, NULL, "stored heads (H_q expand, H_kv group)", FIELD(h_store)},
    {"head_dim", (getter)cache_u32, NULL, "D", FIELD(head_dim)},
    {"prompt_len", (getter)cache_u32, NULL, "L", FIELD(prompt_len)},
    {"kept", (getter)cache_u32, NULL, "slots filled by the compaction, per head", FIELD(kept)},
    {"capacity", (getter)cache_u32, NULL, "slots per head: kept + decode headroom",
     FIELD(capacity)},
    {"appended", (getter)cache_u32, NULL, "g, decode tokens appended", FIELD(appended)},
    {"budget", (getter)cache_u32, NULL, "C used (after pressure scaling)", FIELD(budget)},
    {"requested_budget", (getter)cache_u32, NULL, "C asked for", FIELD(requested_budget)},
    {"pressure", (getter)cache_u32, NULL, "pool pressure at admission (1 normal .. 3)",
     FIELD(pressure)},
    {"next_position", (getter)cache_next_position, NULL,
     "logical position of the next token: L + g (RoPE)", NULL},
    {"next_slot", (getter)cache_next_slot, NULL, "physical slot of the next token: kept + g", NULL},
    {"dtype", (getter)cache_dtype, NULL, "'f32', 'f16' or 'bf16'", NULL},
    {"layout", (getter)cache_layout, NULL, "'hnd' or 'nhd'", NULL},
    {"retained_mass", (getter)cache_mass, NULL, "[layers, h_store] float32 (a copy)", NULL},
    {"released", (getter)cache_released, NULL, "True once released", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cache_methods[] = {
    {"k", (PyCFunction)cache_k, METH_O,
     "k(layer) -> zero-copy K of a layer: [h_store, capacity, D] (hnd) or\n"
     "[capacity, h_store, D] (nhd); slots kept + g onwards are the decode headroom."},
    {"v", (PyCFunction)cache_v, METH_O, "v(layer) -> zero-copy V, as k()."},
    {"positions", (PyCFunction)cache_positions, METH_O,
     "positions(layer) -> int32 [h_store, capacity]: each slot's original position,\n"
     "-1 for slots not yet appended."},
    {"append", (PyCFunction)cache_append, METH_VARARGS,
     "append(n=1): report n decode tokens written at slots next_slot.. (positions\n"
     "next_position..)."},
    {"grow", (PyCFunction)cache_grow, METH_O,
     "grow(extra): more decode headroom (the cache moves: take k()/v() again)."},
    {"release", (PyCFunction)(void (*)(void))cache_release, METH_VARARGS | METH_KEYWORDS,
     "release(linger=False): free the cache in the daemon (linger: keep it counted until\n"
     "pressure evicts it or the session ends)."},
    {"__enter__", (PyCFunction)cache_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)cache_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject skvpy_cache_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "snapkv.Cache",
    .tp_basicsize = sizeof(struct skvpy_cache),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compact cache held by snapkvd (from Client.compact or Request.wait).",
    .tp_methods = cache_methods,
    .tp_getset = cache_getset,
};

int skvpy_cache_init_type(PyObject *module)
{
	if (PyType_Ready(&skvpy_cache_type) < 0)
		return -1;
	Py_INCREF(&skvpy_cache_type);
	if (PyModule_AddObject(module, "Cache", (PyObject *)&skvpy_cache_type) < 0) {
		Py_DECREF(&skvpy_cache_type);
		return -1;
	}
	return 0;
}
