// SPDX-License-Identifier: MIT
/* skvpy-pool.c - snapkv.Pool; see skvpy-pool.h. */
#include "skvpy-pool.h"

#include <string.h>

#include "skvpy-array.h"
#include "skvpy-session.h"
#include "snapkv.h"

/* One layer's K or V pool: [n_blocks, block_size, H_kv, D], contiguous
 * last dimension, registered with this client; layer 0's fixes the shape. */
static int pool_tensor(struct skvpy_client *cl, PyObject *t, const char *what, int64_t *shape0,
		       enum skv_dtype *dt0, struct skv_tensor_ref *ref)
{
	struct skvpy_view v;

	if (skvpy_view_of(t, what, &v) < 0)
		return -1;
	if (v.ndim != 4 || v.strides[3] != 1 || v.strides[0] < 0 || v.strides[1] < 0 ||
	    v.strides[2] < 0) {
		PyErr_Format(PyExc_ValueError,
			     "%s: a pool is [n_blocks, block_size, H_kv, D] with a contiguous last "
			     "dimension",
			     what);
		return -1;
	}
	if (v.dtype == SKVPY_DTYPE_U8) {
		PyErr_Format(PyExc_ValueError, "%s: fp8 pools are not registered from Python yet",
			     what);
		return -1;
	}
	if (shape0[0] == 0) {
		memcpy(shape0, v.shape, 4 * sizeof(int64_t));
		*dt0 = v.dtype;
	} else if (memcmp(shape0, v.shape, 4 * sizeof(int64_t)) || *dt0 != v.dtype) {
		PyErr_Format(PyExc_ValueError, "%s: shape or dtype differs from k[0]", what);
		return -1;
	}
	if (skvpy_session_locate(cl, &v, what, ref, NULL) < 0)
		return -1;
	ref->block_size = (uint32_t)v.shape[1];
	ref->block_stride = v.strides[0];
	ref->token_stride = v.strides[1];
	ref->head_stride = v.strides[2];
	return 0;
}

static int pool_layers(struct skvpy_client *cl, PyObject *ks, PyObject *vs, int64_t *shape,
		       enum skv_dtype *dt, struct skv_layer_out_ref *refs, Py_ssize_t n)
{
	char what[32];

	for (Py_ssize_t l = 0; l < n; l++) {
		snprintf(what, sizeof(what), "k[%zd]", l);
		if (pool_tensor(cl, PySequence_Fast_GET_ITEM(ks, l), what, shape, dt, &refs[l].k) <
		    0)
			return -1;
		snprintf(what, sizeof(what), "v[%zd]", l);
		if (pool_tensor(cl, PySequence_Fast_GET_ITEM(vs, l), what, shape, dt, &refs[l].v) <
		    0)
			return -1;
	}
	return 0;
}

/* q=: [slots,] layers, H_q, n_q, D (nhd: n_q and H_q swapped), registered,
 * the pool's layers and head_dim, f32/f16/bf16. */
static int pool_q(struct skvpy_client *cl, PyObject *q, int nhd, struct skvpy_pool *po)
{
	struct skvpy_view v;
	int s;

	if (!q || q == Py_None)
		return 0;
	if (skvpy_view_of(q, "q", &v) < 0)
		return -1;
	s = v.ndim == 5;
	if ((v.ndim != 4 && v.ndim != 5) || v.shape[s] != po->layers ||
	    v.shape[s + 3] != po->head_dim || v.strides[s + 3] != 1 || v.strides[0] < 0 ||
	    v.strides[s] < 0 || v.strides[s + 1] < 0 || v.strides[s + 2] < 0) {
		PyErr_Format(PyExc_ValueError,
			     "q: [slots,] layers (%u), H_q, n_q, D (%u) ('nhd': n_q before H_q) "
			     "with a contiguous last dimension",
			     po->layers, po->head_dim);
		return -1;
	}
	if (v.dtype == SKVPY_DTYPE_U8 || skv_dtype_is_fp8(v.dtype)) {
		PyErr_SetString(PyExc_ValueError, "q: queries stay f32, f16 or bf16");
		return -1;
	}
	if (skvpy_session_locate(cl, &v, "q", &po->q_ref, NULL) < 0)
		return -1;
	po->q_ref.head_stride = v.strides[s + (nhd ? 2 : 1)];
	po->q_ref.token_stride = v.strides[s + (nhd ? 1 : 2)];
	po->h_q = (uint32_t)v.shape[s + (nhd ? 2 : 1)];
	po->n_q = (uint32_t)v.shape[s + (nhd ? 1 : 2)];
	po->q_layer_stride = (uint64_t)v.strides[s] * v.elsize;
	po->q_slots = s ? (uint32_t)v.shape[0] : 1;
	po->q_slot_stride = s ? (uint64_t)v.strides[0] * v.elsize : 0;
	po->q = Py_NewRef(q);
	return 0;
}

PyObject *skvpy_pool_register(struct skvpy_client *cl, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"k", "v", "q", "layout", NULL};
	PyObject *k, *v, *q = NULL, *layout = NULL, *ks = NULL, *vs = NULL;
	int nhd = 0;
	struct skv_layer_out_ref *refs = NULL;
	struct skv_pool_desc d = {.desc_size = sizeof(d)};
	struct skvpy_pool *po = NULL;
	struct skv_pool *p = NULL;
	int64_t shape[4] = {0};
	enum skv_dtype dt = SKV_DTYPE_UNSPECIFIED;
	Py_ssize_t n = 0;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OO:register_pool", kwlist, &k, &v, &q,
					 &layout))
		return NULL;
	if (layout && layout != Py_None) {
		if (!PyUnicode_Check(layout) || (PyUnicode_CompareWithASCIIString(layout, "hnd") &&
						 PyUnicode_CompareWithASCIIString(layout, "nhd"))) {
			PyErr_SetString(PyExc_ValueError, "layout must be 'hnd' or 'nhd'");
			return NULL;
		}
		nhd = !PyUnicode_CompareWithASCIIString(layout, "nhd");
	}
	if (!(ks = PySequence_Fast(k, "k must be a list of pools, one per layer")) ||
	    !(vs = PySequence_Fast(v, "v must be a list of pools, one per layer")))
		goto out;
	n = PySequence_Fast_GET_SIZE(ks);
	if (n < 1 || n > 4096 || PySequence_Fast_GET_SIZE(vs) != n) {
		PyErr_Format(PyExc_ValueError,
			     "k and v: %zd and %zd pools (1 .. 4096, one per layer)", n,
			     PySequence_Fast_GET_SIZE(vs));
		goto out;
	}
	if (!(refs = PyMem_Calloc((size_t)n, sizeof(*refs)))) {
		PyErr_NoMemory();
		goto out;
	}
	if (pool_layers(cl, ks, vs, shape, &dt, refs, n) < 0)
		goto out;
	d.layers = (uint32_t)n;
	d.n_blocks = (uint64_t)shape[0];
	d.block_size = (uint32_t)shape[1];
	d.h_kv = (uint32_t)shape[2];
	d.head_dim = (uint32_t)shape[3];
	d.dtype = dt;
	d.layer = refs;
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_pool_register(cl->c, &d, &p);
	Py_END_ALLOW_THREADS cl->busy--;
	if (r < 0) {
		skvpy_session_fail(cl, r, "register_pool");
		goto out;
	}
	po = PyObject_New(struct skvpy_pool, &skvpy_pool_type);
	if (!po) {
		(void)skv_pool_unregister(p);
		goto out;
	}
	/* everything after the object header zeroed (q_ref's block fields too) */
	memset((char *)po + sizeof(PyObject), 0, sizeof(*po) - sizeof(PyObject));
	Py_INCREF(cl);
	po->client = cl;
	po->p = p;
	po->layers = d.layers;
	po->h_kv = d.h_kv;
	po->head_dim = d.head_dim;
	po->block_size = d.block_size;
	po->n_blocks = d.n_blocks;
	po->dtype = dt;
	po->k = PySequence_List(ks);
	po->v = PySequence_List(vs);
	if (!po->k || !po->v || pool_q(cl, q, nhd, po) < 0)
		Py_CLEAR(po); /* unregisters */
out:
	PyMem_Free(refs);
	Py_XDECREF(ks);
	Py_XDECREF(vs);
	return (PyObject *)po;
}

struct skvpy_pool *skvpy_pool_of(struct skvpy_client *cl, PyObject *obj)
{
	struct skvpy_pool *po;

	if (!PyObject_TypeCheck(obj, &skvpy_pool_type)) {
		PyErr_Format(PyExc_TypeError,
			     "pool must be a snapkv.Pool (register_pool), not %.100s",
			     Py_TYPE(obj)->tp_name);
		return NULL;
	}
	po = (struct skvpy_pool *)obj;
	if (po->client != cl || !po->p || !cl->c) {
		PyErr_SetString(PyExc_ValueError,
				"pool: a Pool of this client, registered and not unregistered");
		return NULL;
	}
	return po;
}

/* 0, or -1 with snapkv.Error (EBUSY: a request in flight names it). */
static int pool_unregister(struct skvpy_pool *po)
{
	struct skvpy_client *cl = po->client;
	int r;

	if (!po->p || !cl->c) { /* done, or freed with the client's session */
		po->p = NULL;
		return 0;
	}
	cl->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_pool_unregister(po->p);
	Py_END_ALLOW_THREADS cl->busy--;
	if (r == -EBUSY) {
		skvpy_session_fail(cl, r, "unregister");
		return -1;
	}
	po->p = NULL; /* freed (another failure: the session's end frees it) */
	if (r < 0) {
		skvpy_session_fail(cl, r, "unregister");
		return -1;
	}
	return 0;
}

static PyObject *pool_unregister_m(struct skvpy_pool *po, PyObject *unused)
{
	(void)unused;
	return pool_unregister(po) < 0 ? NULL : Py_NewRef(Py_None);
}

static void pool_dealloc(struct skvpy_pool *po)
{
	/* best effort: a pool still in use stays until the session ends */
	if (po->p && po->client->c && pool_unregister(po) < 0)
		PyErr_Clear();
	Py_XDECREF(po->k);
	Py_XDECREF(po->v);
	Py_XDECREF(po->q);
	Py_XDECREF(po->client);
	PyObject_Free(po);
}

static PyObject *pool_get_id(struct skvpy_pool *po, void *closure)
{
	(void)closure;
	return PyLong_FromUnsignedLongLong(po->p && po->client->c ? skv_pool_id(po->p) : 0);
}

#define U32_GETTER(name)                                                                           \
	static PyObject *pool_get_##name(struct skvpy_pool *po, void *closure)                     \
	{                                                                                          \
		(void)closure;                                                                     \
		return PyLong_FromUnsignedLongLong(po->name);                                      \
	}
U32_GETTER(layers)
U32_GETTER(h_kv)
U32_GETTER(head_dim)
U32_GETTER(block_size)
U32_GETTER(n_blocks)
U32_GETTER(q_slots)

static PyMethodDef pool_methods[] = {
    {"unregister", (PyCFunction)pool_unregister_m, METH_NOARGS,
     "unregister(): free the pool in the daemon (snapkv.Error EBUSY while a request in\n"
     "flight names it; the pool then stays). A client's pools go with its session."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pool_getset[] = {
    {"id", (getter)pool_get_id, NULL, "the daemon's pool id (0: unregistered)", NULL},
    {"layers", (getter)pool_get_layers, NULL, "layers", NULL},
    {"h_kv", (getter)pool_get_h_kv, NULL, "K/V heads", NULL},
    {"head_dim", (getter)pool_get_head_dim, NULL, "head dimension", NULL},
    {"block_size", (getter)pool_get_block_size, NULL, "slots per block", NULL},
    {"n_blocks", (getter)pool_get_n_blocks, NULL, "blocks of each pool", NULL},
    {"q_slots", (getter)pool_get_q_slots, NULL, "slots of register_pool(q=...) (0: none)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject skvpy_pool_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "snapkv.Pool",
    .tp_basicsize = sizeof(struct skvpy_pool),
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A KV pool registered with snapkvd (Client.register_pool): name it with\n"
	      "compact(q, pool=..., block_table=..., prompt_len=...) and submit_many().",
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};

int skvpy_pool_init_type(PyObject *module)
{
	if (PyType_Ready(&skvpy_pool_type) < 0)
		return -1;
	Py_INCREF(&skvpy_pool_type);
	if (PyModule_AddObject(module, "Pool", (PyObject *)&skvpy_pool_type) < 0) {
		Py_DECREF(&skvpy_pool_type);
		return -1;
	}
	return 0;
}
