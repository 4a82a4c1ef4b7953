// SPDX-License-Identifier: MIT
#include "skvpy-compact.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "skvpy-after.h"
#include "skvpy-array.h"
#include "skvpy-session.h"
#include "skvpy-error.h"
#include "skvpy-pool.h"

struct args {
	PyObject *q, *k, *v;
	PyObject *window, *capacity, *kernel, *pooling, *gqa, *policy, *sinks, *protect;
	PyObject *reserve, *block_table, *out, *out_block_size, *out_block_table, *out_buffer;
	PyObject *layout, *out_layout, *prompt_len, *evictable;
	PyObject *budget, *fallback_below, *group, *min_window, *kv_dtype, *kv_scales, *after;
	PyObject *pool, *q_slot;
	PyObject *in_place_blocks, *max_decode;
	PyObject *span;
};

/* What layer 0 fixed; every other layer must match it. */
struct geom {
	int paged, nhd;
	int64_t k_shape[4], q_shape[3];
	enum skv_dtype k_dtype, q_dtype;
	uint32_t h_kv, h_q, n_q, D, T, block_size, pool_blocks;
};

static int u32_arg(PyObject *o, const char *name, uint32_t lo, uint32_t hi, uint32_t *out)
{
	long long x;

	if (!o || o == Py_None)
		return 0;
	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name,
			     Py_TYPE(o)->tp_name);
		return -1;
	}
	x = PyLong_AsLongLong(o);
	if (x == -1 && PyErr_Occurred()) {
		if (!PyErr_ExceptionMatches(PyExc_OverflowError))
			return -1;
		PyErr_Clear();
	}
	if (x < (long long)lo || x > (long long)hi) {
		PyErr_Format(PyExc_ValueError, "%s must be in %u .. %u", name, lo, hi);
		return -1;
	}
	*out = (uint32_t)x;
	return 0;
}

/* One of names[] -> vals[]; absent: *out unchanged. */
static int choice(PyObject *o, const char *name, const char *const *names, const int *vals,
		  int *out)
{
	const char *s;

	if (!o || o == Py_None)
		return 0;
	if (!PyUnicode_Check(o) || !(s = PyUnicode_AsUTF8(o))) {
		PyErr_Clear();
		PyErr_Format(PyExc_TypeError, "%s must be a string", name);
		return -1;
	}
	for (int i = 0; names[i]; i++)
		if (!strcmp(s, names[i])) {
			*out = vals[i];
			return 0;
		}
	char all[128] = "";
	for (int i = 0; names[i]; i++)
		snprintf(all + strlen(all), sizeof(all) - strlen(all), "%s'%s'", i ? ", " : "",
			 names[i]);
	PyErr_Format(PyExc_ValueError, "%s '%s' unknown (one of %s)", name, s, all);
	return -1;
}

/*
 * budget=: an int is uniform C (the request as before the budget modes); a
 * string is a mode in snapkvctl's spelling (libskv's parser), e.g.
 * 'mass-heads:0.9'; (C, 'mode') gives both, for modes that read C (heads,
 * pyramid, a mass ladder left out). capacity=C, the old name of C, is taken
 * for one release with a DeprecationWarning (Cache.capacity is the slot
 * count, not C). Into *ret_c (unchanged when C is not given) and *ret_mode
 * (borrowed; NULL when none).
 */
static int budget_arg(const struct args *a, uint32_t *ret_c, PyObject **ret_mode)
{
	PyObject *b = a->budget && a->budget != Py_None ? a->budget : NULL, *c_obj = NULL;

	*ret_mode = NULL;
	if (b && PyTuple_Check(b)) {
		if (PyTuple_GET_SIZE(b) != 2 || !PyLong_Check(PyTuple_GET_ITEM(b, 0)) ||
		    !PyUnicode_Check(PyTuple_GET_ITEM(b, 1))) {
			PyErr_SetString(PyExc_TypeError,
					"budget must be an int (uniform C), a mode string, or "
					"(C, mode string)");
			return -1;
		}
		c_obj = PyTuple_GET_ITEM(b, 0);
		*ret_mode = PyTuple_GET_ITEM(b, 1);
	} else if (b && PyLong_Check(b)) {
		c_obj = b;
	} else if (b && PyUnicode_Check(b)) {
		*ret_mode = b;
	} else if (b) {
		PyErr_Format(PyExc_TypeError,
			     "budget must be an int (uniform C), a mode string, or (C, mode "
			     "string), not %.100s",
			     Py_TYPE(b)->tp_name);
		return -1;
	}
	if (a->capacity && a->capacity != Py_None) {
		if (c_obj) {
			PyErr_SetString(PyExc_TypeError,
					"budget C given twice: pass budget=C (capacity= is its "
					"deprecated name)");
			return -1;
		}
		if (PyErr_WarnEx(PyExc_DeprecationWarning,
				 "capacity= is deprecated: pass budget=C (an int), or budget=(C, "
				 "'mode') with a budget mode; Cache.capacity stays the slot count",
				 1) < 0)
			return -1;
		c_obj = a->capacity;
	}
	return u32_arg(c_obj, "budget C", 1, 1u << 22, ret_c);
}

/* The budget mode (budget_arg's string) and fallback_below=F; the ranges are
 * the daemon's (skv_plan) to judge. */
static int parse_budget(const struct args *a, PyObject *mode, struct skv_params *p)
{
	struct skv_error e;
	const char *s;

	if (!mode && (!a->fallback_below || a->fallback_below == Py_None))
		return 0; /* today's request: params as before the budget modes */
	/* the full struct, so that libsnapkv carries the mode to snapkvd */
	struct skv_params full = SKV_PARAMS_DEFAULTS;
	memcpy(&full, p, SKV_PARAMS_SIZE_V1);
	full.params_size = sizeof(full);
	*p = full;
	if (mode) {
		if (!(s = PyUnicode_AsUTF8(mode)))
			return -1;
		if (skv_budget_parse(s, p, &e) < 0) {
			PyErr_Format(PyExc_ValueError, "budget: %s", e.msg);
			return -1;
		}
	}
	if (a->fallback_below && a->fallback_below != Py_None) {
		double f = PyFloat_AsDouble(a->fallback_below);

		if (f == -1.0 && PyErr_Occurred())
			return -1;
		p->fallback_below = (float)f;
	}
	skv_budget_defaults(p); /* the ladder from W and C where left out */
	return 0;
}

/* min_window=N: the fewest q rows a partial window (n_q < window) may
 * vote with (SPEC.md); left out, the daemon's min_window applies. The
 * full struct, so that libsnapkv carries it. */
static int parse_min_window(const struct args *a, struct skv_params *p)
{
	uint32_t m = 0;

	if (!a->min_window || a->min_window == Py_None)
		return 0;
	if (u32_arg(a->min_window, "min_window", 1, 1u << 22, &m) < 0)
		return -1;
	if (p->params_size != sizeof(*p)) {
		struct skv_params full = SKV_PARAMS_DEFAULTS;
		memcpy(&full, p, SKV_PARAMS_SIZE_V1);
		full.params_size = sizeof(full);
		*p = full;
	}
	p->min_window = m;
	return 0;
}

/* span=N: span-aware selection (kernels/skv.h), 0..SKV_MAX_SPAN; left out,
 * 0 (top-k). The full struct, so that libsnapkv carries it. */
static int parse_span(const struct args *a, struct skv_params *p)
{
	uint32_t s = 0;

	if (!a->span || a->span == Py_None)
		return 0;
	if (u32_arg(a->span, "span", 0, SKV_MAX_SPAN, &s) < 0)
		return -1;
	if (p->params_size != sizeof(*p)) {
		struct skv_params full = SKV_PARAMS_DEFAULTS;
		memcpy(&full, p, SKV_PARAMS_SIZE_V1);
		full.params_size = sizeof(full);
		*p = full;
	}
	p->span = s;
	return 0;
}

/* group=(key, size) or (key, size, timeout_ms): a decision group (the
 * daemon checks the mode, the members' agreement and its limits). */
static int parse_group(PyObject *o, struct skvpy_compact *p)
{
	PyObject *t;
	const char *key;
	Py_ssize_t n;
	int ok = 0;

	if (!o || o == Py_None)
		return 0;
	if (!PyTuple_Check(o) && !PyList_Check(o)) {
		PyErr_SetString(PyExc_TypeError,
				"group must be (key, size) or (key, size, timeout_ms)");
		return -1;
	}
	t = PySequence_Tuple(o);
	if (!t)
		return -1;
	n = PyTuple_GET_SIZE(t);
	if (n != 2 && n != 3) {
		PyErr_SetString(PyExc_TypeError,
				"group must be (key, size) or (key, size, timeout_ms)");
		goto out;
	}
	if (!PyUnicode_Check(PyTuple_GET_ITEM(t, 0)) ||
	    !(key = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(t, 0), &n))) {
		PyErr_Clear();
		PyErr_SetString(PyExc_TypeError, "group: the key must be a string");
		goto out;
	}
	if (n < 1 || n > (Py_ssize_t)SKV_MAX_GROUP_KEY) {
		PyErr_Format(PyExc_ValueError, "group: the key has %zd bytes, it must have 1 .. %u",
			     n, SKV_MAX_GROUP_KEY);
		goto out;
	}
	for (Py_ssize_t i = 0; i < n; i++)
		if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e) {
			PyErr_Format(PyExc_ValueError,
				     "group: key byte %zd (0x%02x) is not printable ASCII", i,
				     (unsigned char)key[i]);
			goto out;
		}
	if (u32_arg(PyTuple_GET_ITEM(t, 1), "group size", 1, UINT32_MAX, &p->d.group_size) < 0 ||
	    (PyTuple_GET_SIZE(t) == 3 && u32_arg(PyTuple_GET_ITEM(t, 2), "group timeout_ms", 0,
						 UINT32_MAX, &p->d.group_timeout_ms) < 0))
		goto out;
	if (PyTuple_GET_ITEM(t, 1) == Py_None) {
		PyErr_SetString(PyExc_TypeError, "group size must be an int");
		goto out;
	}
	memcpy(p->group_key, key, (size_t)n);
	p->group_key[n] = '\0';
	p->d.group_key = p->group_key;
	ok = 1;
out:
	Py_DECREF(t);
	return ok ? 0 : -1;
}

static int parse_params(const struct args *a, struct skv_params *p)
{
	static const char *const pool_n[] = {"avg", "max", NULL};
	static const int pool_v[] = {SKV_POOL_AVG, SKV_POOL_MAX};
	static const char *const gqa_n[] = {"group", "expand", NULL};
	static const int gqa_v[] = {SKV_GQA_GROUP, SKV_GQA_EXPAND};
	static const char *const pol_n[] = {"snapkv", "h2o", "streamingllm", "window", NULL};
	static const int pol_v[] = {SKV_POLICY_SNAPKV, SKV_POLICY_H2O, SKV_POLICY_STREAMINGLLM,
				    SKV_POLICY_WINDOW};
	int pooling = SKV_POOL_AVG, gqa = SKV_GQA_GROUP, policy = SKV_POLICY_SNAPKV;
	PyObject *mode;

	skv_client_params_init(p);
	p->gqa = SKV_GQA_GROUP;
	if (u32_arg(a->window, "window", 1, 1u << 22, &p->window) < 0 ||
	    budget_arg(a, &p->budget, &mode) < 0 ||
	    u32_arg(a->kernel, "kernel", 1, 255, &p->kernel) < 0 ||
	    u32_arg(a->sinks, "sinks", 0, 1u << 22, &p->sinks) < 0 ||
	    choice(a->pooling, "pooling", pool_n, pool_v, &pooling) < 0 ||
	    choice(a->gqa, "gqa", gqa_n, gqa_v, &gqa) < 0 ||
	    choice(a->policy, "policy", pol_n, pol_v, &policy) < 0)
		return -1;
	p->pooling = pooling;
	p->gqa = gqa;
	p->policy = policy;
	if (parse_budget(a, mode, p) < 0 || parse_min_window(a, p) < 0 || parse_span(a, p) < 0)
		return -1;
	if (!a->protect || a->protect == Py_None)
		return 0;
	PyObject *seq = PySequence_Fast(a->protect, "protect must be a sequence of (begin, end)");
	if (!seq)
		return -1;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	if (n > SKV_MAX_PROTECTED) {
		Py_DECREF(seq);
		PyErr_Format(PyExc_ValueError, "protect: %zd ranges (at most %d)", n,
			     SKV_MAX_PROTECTED);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		unsigned int b, e;
		PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
		if (!PyTuple_Check(it) && !PyList_Check(it)) {
			PyErr_SetString(PyExc_TypeError, "protect: each range is (begin, end)");
			Py_DECREF(seq);
			return -1;
		}
		PyObject *t = PySequence_Tuple(it);
		int ok = t && PyArg_ParseTuple(t, "II", &b, &e);
		Py_XDECREF(t);
		if (!ok || b >= e || e > (1u << 22)) {
			Py_DECREF(seq);
			if (!PyErr_Occurred() || !PyErr_ExceptionMatches(PyExc_TypeError)) {
				PyErr_Clear();
				PyErr_Format(PyExc_ValueError,
					     "protect[%zd]: (begin, end) with 0 <= begin < end <= "
					     "%u",
					     i, 1u << 22);
			}
			return -1;
		}
		p->protected_ranges[i] = (struct skv_range){b, e};
	}
	p->n_protected = (uint32_t)n;
	Py_DECREF(seq);
	return 0;
}

/* A list or tuple of tensors, one per layer. */
static PyObject *layer_list(PyObject *o, const char *name, Py_ssize_t *n)
{
	if (!PyList_Check(o) && !PyTuple_Check(o)) {
		PyErr_Format(PyExc_TypeError, "%s must be a list of tensors, one per layer", name);
		return NULL;
	}
	PyObject *seq = PySequence_Fast(o, name);
	if (!seq)
		return NULL;
	*n = PySequence_Fast_GET_SIZE(seq);
	if (*n < 1 || *n > SKVPY_MAX_LAYERS) {
		Py_DECREF(seq);
		PyErr_Format(PyExc_ValueError, "%s has %zd layers (1 .. %d allowed)", name, *n,
			     SKVPY_MAX_LAYERS);
		return NULL;
	}
	return seq;
}

static int bad(const char *what, const char *fmt, const char *detail)
{
	PyErr_Format(PyExc_ValueError, fmt, what, detail);
	return -1;
}

/* K or V of one layer into ref; layer 0's fixes the geometry. */
static int kv_ref(struct skvpy_client *cl, PyObject *t, const char *what, int first, struct geom *g,
		  struct skv_tensor_ref *ref)
{
	struct skvpy_view v;

	if (skvpy_view_of(t, what, &v) < 0)
		return -1;
	if (v.ndim != (g->paged ? 4 : 3))
		return bad(what, "%s: %s",
			   g->paged ? "a paged pool is [n_blocks, block_size, H_kv, D]"
				    : "expected 3 dimensions ([H, T, D] or [T, H, D])");
	for (int i = 0; i < v.ndim; i++)
		if (v.strides[i] < 0)
			return bad(what, "%s: %s", "negative strides are not supported");
	if (v.strides[v.ndim - 1] != 1)
		return bad(what, "%s: %s", "the last (head_dim) dimension must be contiguous");
	if (first) {
		memcpy(g->k_shape, v.shape, sizeof(g->k_shape));
		g->k_dtype = v.dtype;
	} else if (memcmp(g->k_shape, v.shape, sizeof(int64_t) * v.ndim) || g->k_dtype != v.dtype)
		return bad(what, "%s: %s", "shape or dtype differs from k[0]");
	if (skvpy_session_locate(cl, &v, what, ref, NULL) < 0)
		return -1;
	if (g->paged) {
		ref->block_stride = v.strides[0];
		ref->block_size = (uint32_t)v.shape[1];
		ref->token_stride = v.strides[1];
		ref->head_stride = v.strides[2];
	} else {
		ref->head_stride = v.strides[g->nhd ? 1 : 0];
		ref->token_stride = v.strides[g->nhd ? 0 : 1];
	}
	return 0;
}

static int q_ref(struct skvpy_client *cl, PyObject *t, const char *what, int first, struct geom *g,
		 struct skv_tensor_ref *ref)
{
	struct skvpy_view v;

	if (skvpy_view_of(t, what, &v) < 0)
		return -1;
	if (v.ndim != 3)
		return bad(what, "%s: %s", "window queries are [H_q, n_q, D] (or [n_q, H_q, D])");
	if (v.strides[0] < 0 || v.strides[1] < 0 || v.strides[2] != 1)
		return bad(what, "%s: %s", "strides must be >= 0 with a contiguous last dimension");
	if (first) {
		memcpy(g->q_shape, v.shape, sizeof(g->q_shape));
		g->q_dtype = v.dtype;
	} else if (memcmp(g->q_shape, v.shape, sizeof(g->q_shape)) || g->q_dtype != v.dtype)
		return bad(what, "%s: %s", "shape or dtype differs from q[0]");
	if (v.dtype == SKVPY_DTYPE_U8 || skv_dtype_is_fp8(v.dtype))
		return bad(what, "%s: %s", "queries stay f32, f16 or bf16 (fp8 is for K and V)");
	if (skvpy_session_locate(cl, &v, what, ref, NULL) < 0)
		return -1;
	ref->head_stride = v.strides[g->nhd ? 1 : 0];
	ref->token_stride = v.strides[g->nhd ? 0 : 1];
	return 0;
}

static int layers(struct skvpy_client *cl, const struct args *a, struct geom *g,
		  struct skvpy_compact *p)
{
	Py_ssize_t nk, nv, nq = 0;
	PyObject *k = NULL, *v = NULL, *q = NULL;
	char what[32];
	int r = -1;

	if (!(k = layer_list(a->k, "k", &nk)) || !(v = layer_list(a->v, "v", &nv)))
		goto out;
	if (a->q != Py_None && !(q = layer_list(a->q, "q", &nq)))
		goto out;
	if (nv != nk || (q && nq != nk)) {
		PyErr_Format(PyExc_ValueError, "q, k, v have %zd, %zd, %zd layers", q ? nq : nk, nk,
			     nv);
		goto out;
	}
	p->refs = PyMem_Calloc((size_t)nk, sizeof(*p->refs));
	if (!p->refs) {
		PyErr_NoMemory();
		goto out;
	}
	for (Py_ssize_t l = 0; l < nk; l++) {
		struct skv_layer_ref *lr = &p->refs[l];
		snprintf(what, sizeof(what), "k[%zd]", l);
		if (kv_ref(cl, PySequence_Fast_GET_ITEM(k, l), what, l == 0, g, &lr->k) < 0)
			goto out;
		snprintf(what, sizeof(what), "v[%zd]", l);
		if (kv_ref(cl, PySequence_Fast_GET_ITEM(v, l), what, 0, g, &lr->v) < 0)
			goto out;
		snprintf(what, sizeof(what), "q[%zd]", l);
		if (q && q_ref(cl, PySequence_Fast_GET_ITEM(q, l), what, l == 0, g, &lr->q) < 0)
			goto out;
	}
	p->d.layers = (uint32_t)nk;
	r = 0;
out:
	Py_XDECREF(k);
	Py_XDECREF(v);
	Py_XDECREF(q);
	return r;
}

/* kv_scales=(k, v) for every layer, or one (k, v) per layer, into p->scales. */
static int parse_scales(PyObject *o, uint32_t layers, struct skvpy_compact *p)
{
	PyObject *seq = PySequence_Fast(o, "kv_scales: (k_scale, v_scale) or one per layer");
	int r = -1;

	if (!seq)
		return -1;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	bool one = n == 2 && PyNumber_Check(PySequence_Fast_GET_ITEM(seq, 0));
	if (!one && n != (Py_ssize_t)layers) {
		PyErr_Format(PyExc_ValueError, "kv_scales: %zd pairs for %u layers", n, layers);
		goto out;
	}
	p->scales = PyMem_Calloc((size_t)layers * 2, sizeof(float));
	if (!p->scales) {
		PyErr_NoMemory();
		goto out;
	}
	for (uint32_t l = 0; l < layers; l++) {
		PyObject *pair = one ? o : PySequence_Fast_GET_ITEM(seq, l);
		double k, v;
		PyObject *t = PySequence_Tuple(pair);
		int ok = t && PyArg_ParseTuple(t, "dd", &k, &v);
		Py_XDECREF(t);
		if (!ok) {
			PyErr_Clear();
			PyErr_Format(PyExc_TypeError, "kv_scales[%u]: a (k_scale, v_scale) pair",
				     l);
			goto out;
		}
		p->scales[2 * l] = (float)k;
		p->scales[2 * l + 1] = (float)v;
	}
	p->d.kv_scales = p->scales;
	r = 0;
out:
	Py_DECREF(seq);
	return r;
}

/*
 * fp8 K/V (SPEC.md "Quantized K/V"): uint8 tensors of the raw bytes with
 * kv_dtype="f8e4m3fn"/"f8e5m2", or torch's float8 dtypes where it has them;
 * kv_scales are then needed (the daemon judges their values).
 */
static int fp8_inputs(const struct args *a, const struct geom *g, struct skvpy_compact *p)
{
	static const char *const f8_n[] = {"f8e4m3fn", "f8e5m2", NULL};
	static const int f8_v[] = {SKV_DTYPE_F8E4M3FN, SKV_DTYPE_F8E5M2};
	int dt = 0;
	bool named = a->kv_dtype && a->kv_dtype != Py_None;

	if (named && choice(a->kv_dtype, "kv_dtype", f8_n, f8_v, &dt) < 0)
		return -1;
	if (g->k_dtype == SKVPY_DTYPE_U8 && !named) {
		PyErr_SetString(
		    PyExc_TypeError,
		    "uint8 K/V need kv_dtype='f8e4m3fn' or 'f8e5m2' (their fp8 format)");
		return -1;
	}
	if (skv_dtype_is_fp8(g->k_dtype) && named && dt != (int)g->k_dtype) {
		PyErr_SetString(PyExc_TypeError, "kv_dtype differs from the K/V tensors' dtype");
		return -1;
	}
	if (named && g->k_dtype != SKVPY_DTYPE_U8 && !skv_dtype_is_fp8(g->k_dtype)) {
		PyErr_SetString(PyExc_TypeError,
				"kv_dtype names the fp8 format of uint8 K/V tensors");
		return -1;
	}
	if (!named)
		dt = (int)g->k_dtype;
	if (!skv_dtype_is_fp8((enum skv_dtype)dt)) {
		if (a->kv_scales && a->kv_scales != Py_None) {
			PyErr_SetString(PyExc_TypeError, "kv_scales are for fp8 K/V");
			return -1;
		}
		return 0;
	}
	for (uint32_t l = 0; l < p->d.layers; l++) {
		p->refs[l].k.dtype = p->refs[l].v.dtype = (enum skv_dtype)dt;
		if (p->out_refs)
			p->out_refs[l].k.dtype = p->out_refs[l].v.dtype = (enum skv_dtype)dt;
	}
	if (!a->kv_scales || a->kv_scales == Py_None) {
		PyErr_SetString(PyExc_TypeError, "fp8 K/V need kv_scales=(k_scale, v_scale)");
		return -1;
	}
	return parse_scales(a->kv_scales, p->d.layers, p);
}

/* The block table: ints in a list/tuple, a numpy array or a torch tensor. */
static int parse_table(PyObject *o, uint32_t pool_blocks, int32_t **ret, uint32_t *ret_n)
{
	PyObject *seq, *lst = NULL;

	if (PyList_Check(o) || PyTuple_Check(o))
		seq = PySequence_Fast(o, "block_table");
	else {
		lst = PyObject_CallMethod(o, "tolist", NULL);
		if (!lst) {
			PyErr_Clear();
			PyErr_SetString(PyExc_TypeError,
					"block_table must be a list of ints, a numpy array or a "
					"tensor");
			return -1;
		}
		seq = PySequence_Fast(lst, "block_table must be one-dimensional");
	}
	Py_XDECREF(lst);
	if (!seq)
		return -1;
	Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
	if (n < 1 || n > (1 << 22)) {
		Py_DECREF(seq);
		PyErr_Format(PyExc_ValueError, "block_table has %zd entries (1 .. %d)", n, 1 << 22);
		return -1;
	}
	int32_t *t = PyMem_Malloc((size_t)n * sizeof(*t));
	if (!t) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
		long long x = PyLong_Check(it) ? PyLong_AsLongLong(it) : -1;
		if (x < 0 || x >= pool_blocks) {
			PyErr_Clear();
			PyErr_Format(
			    PyExc_ValueError,
			    "block_table[%zd] must be an int in 0 .. %u (the pool's blocks)", i,
			    pool_blocks - 1);
			PyMem_Free(t);
			Py_DECREF(seq);
			return -1;
		}
		t[i] = (int32_t)x;
	}
	Py_DECREF(seq);
	*ret = t;
	*ret_n = (uint32_t)n;
	return 0;
}

int skvpy_block_table(PyObject *o, uint32_t pool_blocks, int32_t **ret, uint32_t *ret_n)
{
	return parse_table(o, pool_blocks, ret, ret_n);
}

/* The problem shape from layer 0; L from prompt_len or the tensors. */
static int shape(const struct args *a, struct geom *g, struct skvpy_compact *p)
{
	struct skv_shape *s = &p->d.shape;
	uint32_t L = 0;

	if (g->paged) {
		g->pool_blocks = (uint32_t)g->k_shape[0];
		g->block_size = (uint32_t)g->k_shape[1];
		g->h_kv = (uint32_t)g->k_shape[2];
	} else {
		g->T = (uint32_t)g->k_shape[g->nhd ? 0 : 1];
		g->h_kv = (uint32_t)g->k_shape[g->nhd ? 1 : 0];
	}
	g->D = (uint32_t)g->k_shape[g->paged ? 3 : 2];
	if (a->q != Py_None) {
		g->h_q = (uint32_t)g->q_shape[g->nhd ? 1 : 0];
		g->n_q = (uint32_t)g->q_shape[g->nhd ? 0 : 1];
		if (g->q_shape[2] != g->D) {
			PyErr_Format(PyExc_ValueError, "q has head_dim %lld, k %u",
				     (long long)g->q_shape[2], g->D);
			return -1;
		}
	} else {
		g->h_q = g->h_kv;
	}
	if (g->paged && (!a->prompt_len || a->prompt_len == Py_None)) {
		PyErr_SetString(PyExc_ValueError, "prompt_len is needed with a block_table");
		return -1;
	}
	L = g->T;
	if (u32_arg(a->prompt_len, "prompt_len", 1, 1u << 22, &L) < 0)
		return -1;
	if (!g->paged && L > g->T) {
		PyErr_Format(PyExc_ValueError, "prompt_len %u but k holds %u tokens", L, g->T);
		return -1;
	}
	if (g->paged && (uint64_t)p->d.n_blocks * g->block_size < L) {
		PyErr_Format(PyExc_ValueError,
			     "block_table has %u blocks of %u tokens: fewer than prompt_len %u",
			     p->d.n_blocks, g->block_size, L);
		return -1;
	}
	*s = (struct skv_shape){
	    .prompt_len = L, .head_dim = g->D, .h_q = g->h_q, .h_kv = g->h_kv, .n_q = g->n_q};
	return 0;
}

enum { OUT_ARENA, OUT_PAGED, OUT_WRITEBACK };

static int output(const struct args *a, struct skvpy_compact *p, int *ret_out)
{
	static const char *const out_n[] = {"arena", "paged", "writeback", NULL};
	static const int out_v[] = {OUT_ARENA, OUT_PAGED, OUT_WRITEBACK};
	static const char *const lay_n[] = {"hnd", "nhd", NULL};
	static const int lay_v[] = {SKV_LAYOUT_HND, SKV_LAYOUT_NHD};
	int out = OUT_ARENA, layout = SKV_LAYOUT_HND;
	int has_bs = a->out_block_size && a->out_block_size != Py_None;

	if (choice(a->out, "out", out_n, out_v, &out) < 0 ||
	    choice(a->out_layout, "out_layout", lay_n, lay_v, &layout) < 0 ||
	    u32_arg(a->reserve, "decode_reserve", 0, 1u << 22, &p->d.decode_reserve) < 0)
		return -1;
	if (out == OUT_ARENA && (has_bs || (a->out_block_table && a->out_block_table != Py_None) ||
				 (a->out_buffer && a->out_buffer != Py_None))) {
		PyErr_SetString(PyExc_ValueError,
				"out_block_size, out_block_table and out_buffer are for "
				"out='paged' or 'writeback'");
		return -1;
	}
	if (out != OUT_ARENA) {
		if (!has_bs || (a->out_layout && a->out_layout != Py_None)) {
			PyErr_SetString(PyExc_ValueError,
					"out='paged' and 'writeback' need out_block_size (and no "
					"out_layout: the blocks are [block][block_size][H][D])");
			return -1;
		}
		if (out == OUT_PAGED && ((a->out_block_table && a->out_block_table != Py_None) ||
					 (a->out_buffer && a->out_buffer != Py_None))) {
			PyErr_SetString(PyExc_ValueError,
					"out_block_table and out_buffer are for out='writeback'");
			return -1;
		}
		if (u32_arg(a->out_block_size, "out_block_size", 1, SKV_MAX_OUT_BLOCK_SIZE,
			    &p->d.out_block_size) < 0)
			return -1;
		layout = SKV_LAYOUT_PAGED;
		p->d.out_dest = out == OUT_WRITEBACK ? SKV_OUT_WRITEBACK : SKV_OUT_ARENA;
	}
	p->d.out_layout = (enum skv_layout)layout;
	p->d.out_arena = SKV_ARENA_HOST;
	if (a->evictable && a->evictable != Py_None) {
		int e = PyObject_IsTrue(a->evictable);
		if (e < 0)
			return -1;
		p->d.evictable = e;
	}
	*ret_out = out;
	return 0;
}

/* One destination pool: [n_blocks, out_block_size, H_store, D] in a buffer
 * registered writable with this client, the dtype of k. */
static int out_ref(struct skvpy_client *cl, PyObject *t, const char *what, const struct geom *g,
		   uint32_t bs, struct skv_tensor_ref *ref, uint32_t *ret_blocks)
{
	const struct skvpy_reg *reg;
	struct skvpy_view v;

	if (skvpy_view_of(t, what, &v) < 0)
		return -1;
	if (v.ndim != 4 || v.shape[1] != bs || v.shape[3] != g->D || v.strides[3] != 1 ||
	    v.strides[0] < 0 || v.strides[1] < 0 || v.strides[2] < 0)
		return bad(what, "%s: %s",
			   "a destination pool is [n_blocks, out_block_size, H_store, D] with a "
			   "contiguous last dimension");
	if (v.dtype != g->k_dtype)
		return bad(what, "%s: %s", "a destination pool has the dtype of k");
	if (skvpy_session_locate(cl, &v, what, ref, &reg) < 0)
		return -1;
	if (!reg->writable)
		return bad(what, "%s: %s",
			   "a writeback destination must be in a buffer from "
			   "client.empty(..., writable=True)");
	ref->block_size = bs;
	ref->block_stride = v.strides[0];
	ref->token_stride = v.strides[1];
	ref->head_stride = v.strides[2];
	if (*ret_blocks == 0 || (uint64_t)v.shape[0] < *ret_blocks)
		*ret_blocks = (uint32_t)v.shape[0];
	return 0;
}

/* Writeback: the pools (out_buffer = (k_pools, v_pools), default the paged
 * inputs) and out_block_table. */
static int writeback(struct skvpy_client *cl, const struct args *a, const struct geom *g,
		     struct skvpy_compact *p)
{
	PyObject *kl = a->k, *vl = a->v, *ks = NULL, *vs = NULL, *tab = NULL;
	Py_ssize_t nk = 0, nv = 0;
	uint32_t blocks = 0;
	char what[40];
	int r = -1;

	if (a->out_buffer && a->out_buffer != Py_None) {
		if (!PyTuple_Check(a->out_buffer) || PyTuple_GET_SIZE(a->out_buffer) != 2) {
			PyErr_SetString(
			    PyExc_TypeError,
			    "out_buffer must be (k_pools, v_pools): two lists, one pool "
			    "per layer");
			return -1;
		}
		kl = PyTuple_GET_ITEM(a->out_buffer, 0);
		vl = PyTuple_GET_ITEM(a->out_buffer, 1);
	} else if (!g->paged) {
		PyErr_SetString(PyExc_ValueError,
				"out='writeback' without out_buffer writes into the input pools: "
				"they must be paged (block_table)");
		return -1;
	}
	if (!a->out_block_table || a->out_block_table == Py_None) {
		PyErr_SetString(PyExc_ValueError, "out='writeback' needs out_block_table");
		return -1;
	}
	if (!(ks = layer_list(kl, "out_buffer[0]", &nk)) ||
	    !(vs = layer_list(vl, "out_buffer[1]", &nv)))
		goto out;
	if (nk != p->d.layers || nv != p->d.layers) {
		PyErr_Format(PyExc_ValueError, "out_buffer has %zd and %zd pools for %u layers", nk,
			     nv, p->d.layers);
		goto out;
	}
	p->out_refs = PyMem_Calloc(p->d.layers, sizeof(*p->out_refs));
	if (!p->out_refs) {
		PyErr_NoMemory();
		goto out;
	}
	for (uint32_t l = 0; l < p->d.layers; l++) {
		snprintf(what, sizeof(what), "out k pool [%u]", l);
		if (out_ref(cl, PySequence_Fast_GET_ITEM(ks, l), what, g, p->d.out_block_size,
			    &p->out_refs[l].k, &blocks) < 0)
			goto out;
		snprintf(what, sizeof(what), "out v pool [%u]", l);
		if (out_ref(cl, PySequence_Fast_GET_ITEM(vs, l), what, g, p->d.out_block_size,
			    &p->out_refs[l].v, &blocks) < 0)
			goto out;
	}
	if (parse_table(a->out_block_table, blocks, &p->out_table, &p->d.out_n_blocks) < 0)
		goto out;
	/* in_place_blocks: the input's first blocks hold those slots (Cache.block_table
	 * is then where every slot is) */
	uint32_t n_in = p->d.out_in_place_blocks;
	if (n_in && (!p->table || n_in > p->d.n_blocks)) {
		PyErr_Format(PyExc_ValueError,
			     "in_place_blocks %u: the input block_table has %u entries", n_in,
			     p->table ? p->d.n_blocks : 0);
		goto out;
	}
	tab = PyTuple_New(n_in + p->d.out_n_blocks);
	for (uint32_t i = 0; tab && i < n_in + p->d.out_n_blocks; i++) {
		PyObject *x = PyLong_FromLong(i < n_in ? p->table[i] : p->out_table[i - n_in]);
		if (!x)
			Py_CLEAR(tab);
		else
			PyTuple_SET_ITEM(tab, i, x);
	}
	if (!tab)
		goto out;
	p->out = Py_BuildValue("(NNN)", PySequence_List(ks), PySequence_List(vs), tab);
	tab = NULL;
	if (!p->out)
		goto out;
	p->d.out_layer = p->out_refs;
	p->d.out_block_table = p->out_table;
	r = 0;
out:
	Py_XDECREF(ks);
	Py_XDECREF(vs);
	Py_XDECREF(tab);
	return r;
}

/* ----------------------------------------------------- registered pools */

/* A block table in storage registered with this client (host): by
 * reference, 1; anything else, 0 (copied as a list); -1 with an exception. */
static int table_ref(struct skvpy_client *cl, PyObject *o, const struct skv_buffer **ret_buf,
		     uint64_t *ret_off, uint32_t *ret_n)
{
	uintptr_t ptr;
	int64_t n;
	int cuda, r = skvpy_table_view(o, &ptr, &n, &cuda);

	if (r <= 0)
		return r;
	if (cuda) {
		PyErr_SetString(PyExc_ValueError,
				"block_table on a GPU: the daemon reads tables from host storage "
				"(client.empty((n,), torch.float32).view(torch.int32))");
		return -1;
	}
	if (n < 1 || n > (1ll << 30)) {
		PyErr_Format(PyExc_ValueError, "block_table has %lld entries", (long long)n);
		return -1;
	}
	for (size_t i = 0; i < cl->n_regs; i++) {
		const struct skvpy_reg *g = &cl->regs[i];

		if (!g->cuda && ptr >= g->base && ptr + (uint64_t)n * 4 <= g->base + g->size) {
			*ret_buf = g->b;
			*ret_off = ptr - g->base;
			*ret_n = (uint32_t)n;
			return 1;
		}
	}
	return 0;
}

/* q for a pool: one tensor [layers, H_q, n_q, D] (nhd: [layers, n_q, H_q,
 * D]) as q_window, or a list of per-layer tensors (q-only layer refs). */
static int pool_q(struct skvpy_client *cl, const struct args *a, const struct skvpy_pool *po,
		  struct geom *g, struct skvpy_compact *p)
{
	struct skvpy_view v;
	struct skv_tensor_ref *ref = &p->d.q_window;
	char what[32];

	if (a->q == Py_None)
		return 0;
	if (PyList_Check(a->q) || PyTuple_Check(a->q)) {
		Py_ssize_t n;
		PyObject *seq = layer_list(a->q, "q", &n);
		int r = 0;

		if (!seq)
			return -1;
		if (n != po->layers) {
			PyErr_Format(PyExc_ValueError, "q has %zd layers, the pool %u", n,
				     po->layers);
			r = -1;
		} else if (!(p->refs = PyMem_Calloc((size_t)n, sizeof(*p->refs)))) {
			PyErr_NoMemory();
			r = -1;
		}
		for (Py_ssize_t l = 0; r == 0 && l < n; l++) {
			snprintf(what, sizeof(what), "q[%zd]", l);
			r = q_ref(cl, PySequence_Fast_GET_ITEM(seq, l), what, l == 0, g,
				  &p->refs[l].q);
		}
		Py_DECREF(seq);
		p->d.layer = p->refs;
		return r;
	}
	if (skvpy_view_of(a->q, "q", &v) < 0)
		return -1;
	if (v.ndim != 4 || v.shape[0] != po->layers || v.strides[3] != 1 || v.strides[0] < 0 ||
	    v.strides[1] < 0 || v.strides[2] < 0)
		return bad("q", "%s: %s",
			   "with a pool, q is one tensor [layers, H_q, n_q, D] (layout 'nhd': "
			   "[layers, n_q, H_q, D]) with a contiguous last dimension, or a list");
	if (v.dtype == SKVPY_DTYPE_U8 || skv_dtype_is_fp8(v.dtype))
		return bad("q", "%s: %s", "queries stay f32, f16 or bf16");
	if (skvpy_session_locate(cl, &v, "q", ref, NULL) < 0)
		return -1;
	memcpy(g->q_shape, v.shape + 1, sizeof(g->q_shape));
	g->q_dtype = v.dtype;
	ref->head_stride = v.strides[g->nhd ? 2 : 1];
	ref->token_stride = v.strides[g->nhd ? 1 : 2];
	p->d.q_layer_stride = (uint64_t)v.strides[0] * v.elsize;
	return 0;
}

/* No q: the pool's registered q (register_pool(q=...)), slot q_slot
 * (default 0), located once at registration. */
static int pool_slot(const struct args *a, const struct skvpy_pool *po, struct geom *g,
		     struct skvpy_compact *p)
{
	uint32_t slot = 0;

	if (a->q != Py_None) {
		if (a->q_slot && a->q_slot != Py_None)
			return bad("q_slot", "%s: %s", "q and q_slot: one or the other");
		return 0;
	}
	if (!po->q_slots) {
		if (a->q_slot && a->q_slot != Py_None)
			return bad("q_slot", "%s: %s", "the pool has no q (register_pool(q=...))");
		return 0;
	}
	if (u32_arg(a->q_slot, "q_slot", 0, po->q_slots - 1, &slot) < 0)
		return -1;
	p->d.q_window = po->q_ref;
	p->d.q_window.offset += (uint64_t)slot * po->q_slot_stride;
	p->d.q_layer_stride = po->q_layer_stride;
	g->h_q = po->h_q;
	g->n_q = po->n_q;
	return 0;
}

/* A table argument of a pool request: by reference or copied. */
static int pool_table(struct skvpy_client *cl, PyObject *o, const char *name, uint64_t blocks,
		      const struct skv_buffer **buf, uint64_t *off, int32_t **copy, uint32_t *n)
{
	int r;

	if (!o || o == Py_None) {
		PyErr_Format(PyExc_ValueError, "%s is needed with pool=", name);
		return -1;
	}
	r = table_ref(cl, o, buf, off, n);
	if (r != 0)
		return r < 0 ? -1 : 0;
	return parse_table(o, blocks > UINT32_MAX ? UINT32_MAX : (uint32_t)blocks, copy, n);
}

/* The input table given in registered storage, copied into p->table and
 * sent inline instead. */
static int inline_table(struct skvpy_client *cl, struct skvpy_compact *p)
{
	for (size_t i = 0; i < cl->n_regs; i++) {
		const struct skvpy_reg *g = &cl->regs[i];

		if (g->b != p->d.table_buf)
			continue;
		p->table = PyMem_Malloc((size_t)p->d.n_blocks * sizeof(int32_t));
		if (!p->table) {
			PyErr_NoMemory();
			return -1;
		}
		memcpy(p->table, (const uint8_t *)g->base + p->d.table_offset,
		       (size_t)p->d.n_blocks * sizeof(int32_t));
		p->d.block_table = p->table;
		p->d.table_buf = NULL;
		p->d.table_offset = 0;
		return 0;
	}
	PyErr_SetString(PyExc_ValueError, "block_table: its storage is no longer registered");
	return -1;
}

/* writeback into the pool's own blocks: the Cache's (k, v, table) */
static int pool_writeback(struct skvpy_client *cl, const struct args *a, struct skvpy_pool *po,
			  struct skvpy_compact *p)
{
	PyObject *tab;
	const int32_t *t, *in;
	uint32_t n_in;

	if (a->out_buffer && a->out_buffer != Py_None) {
		PyErr_SetString(PyExc_ValueError,
				"with pool=, out='writeback' writes into the pool (no out_buffer)");
		return -1;
	}
	if (pool_table(cl, a->out_block_table, "out_block_table", po->n_blocks, &p->d.out_table_buf,
		       &p->d.out_table_offset, &p->out_table, &p->d.out_n_blocks) < 0)
		return -1;
	p->d.out_block_table = p->out_table;
	p->d.out_pool = po->p;
	/* in_place_blocks: the input's first blocks hold those slots, so the
	 * cache's block_table starts with them */
	n_in = p->d.out_in_place_blocks;
	if (n_in > p->d.n_blocks) {
		PyErr_Format(PyExc_ValueError,
			     "in_place_blocks %u: the input block_table has %u entries", n_in,
			     p->d.n_blocks);
		return -1;
	}
	/* libsnapkv builds the cache's table from the input's first entries,
	 * and cannot read a table in storage it did not map: with in-place
	 * blocks such a table travels inline (max_block_table and the frame
	 * limit apply) */
	if (n_in && !p->table && inline_table(cl, p) < 0)
		return -1;
	in = p->table;
	t = p->out_table ? p->out_table
			 : (const int32_t *)((const uint8_t *)skv_buffer_data(p->d.out_table_buf) +
					     p->d.out_table_offset);
	tab = PyTuple_New(n_in + p->d.out_n_blocks);
	for (uint32_t i = 0; tab && i < n_in + p->d.out_n_blocks; i++) {
		PyObject *x = PyLong_FromLong(i < n_in ? in[i] : t[i - n_in]);
		if (!x)
			Py_CLEAR(tab);
		else
			PyTuple_SET_ITEM(tab, i, x);
	}
	if (!tab)
		return -1;
	p->out = Py_BuildValue("(OON)", po->k, po->v, tab);
	return p->out ? 0 : -1;
}

/* compact(q, pool=..., ...): K/V of every layer are the pool's. */
static int pool_parse(struct skvpy_client *cl, struct args *a, struct skvpy_compact *p)
{
	static const char *const lay_n[] = {"hnd", "nhd", NULL};
	static const int lay_v[] = {0, 1};
	struct skvpy_pool *po = skvpy_pool_of(cl, a->pool);
	struct geom g = {0};
	uint32_t L = 0;
	int out = OUT_ARENA;

	if (!po)
		goto fail;
	if (!a->q)
		a->q = Py_None;
	if ((a->k && a->k != Py_None) || (a->v && a->v != Py_None) ||
	    (a->kv_scales && a->kv_scales != Py_None) || (a->kv_dtype && a->kv_dtype != Py_None)) {
		PyErr_SetString(
		    PyExc_ValueError,
		    "pool= replaces k, v (and their dtype and scales): give q and pool");
		goto fail;
	}
	if (choice(a->layout, "layout", lay_n, lay_v, &g.nhd) < 0 ||
	    parse_params(a, &p->d.params) < 0 || parse_group(a->group, p) < 0 ||
	    output(a, p, &out) < 0 || pool_q(cl, a, po, &g, p) < 0 || pool_slot(a, po, &g, p) < 0)
		goto fail;
	if (out == OUT_PAGED || (out == OUT_WRITEBACK && p->d.out_block_size != po->block_size)) {
		PyErr_Format(PyExc_ValueError,
			     "with pool=, out is 'arena' or 'writeback' (into the pool: "
			     "out_block_size %u, the pool's)",
			     po->block_size);
		goto fail;
	}
	if (a->q == Py_None && !po->q_slots) {
		g.h_q = po->h_kv;
		g.n_q = 0;
	} else if (a->q != Py_None) {
		g.h_q = (uint32_t)g.q_shape[g.nhd ? 1 : 0];
		g.n_q = (uint32_t)g.q_shape[g.nhd ? 0 : 1];
	}
	if (a->q != Py_None && g.q_shape[2] != po->head_dim) {
		PyErr_Format(PyExc_ValueError, "q has head_dim %lld, the pool %u",
			     (long long)g.q_shape[2], po->head_dim);
		goto fail;
	}
	if (!a->prompt_len || a->prompt_len == Py_None) {
		PyErr_SetString(PyExc_ValueError, "prompt_len is needed with pool=");
		goto fail;
	}
	if (u32_arg(a->prompt_len, "prompt_len", 1, 1u << 24, &L) < 0 ||
	    pool_table(cl, a->block_table, "block_table", po->n_blocks, &p->d.table_buf,
		       &p->d.table_offset, &p->table, &p->d.n_blocks) < 0)
		goto fail;
	if ((uint64_t)p->d.n_blocks * po->block_size < L) {
		PyErr_Format(PyExc_ValueError,
			     "block_table has %u blocks of %u tokens: fewer than prompt_len %u",
			     p->d.n_blocks, po->block_size, L);
		goto fail;
	}
	p->d.shape = (struct skv_shape){.prompt_len = L,
					.head_dim = po->head_dim,
					.h_q = g.h_q,
					.h_kv = po->h_kv,
					.n_q = g.n_q};
	p->d.layers = po->layers;
	p->d.pool = po->p;
	p->d.block_table = p->table;
	/* writeback only: libsnapkv and the daemon refuse them with out='arena' */
	if (u32_arg(a->in_place_blocks, "in_place_blocks", 0, 1u << 22, &p->d.out_in_place_blocks) <
		0 ||
	    u32_arg(a->max_decode, "max_decode", 0, 1u << 31, &p->d.max_decode) < 0)
		goto fail;
	if ((out == OUT_WRITEBACK && pool_writeback(cl, a, po, p) < 0) ||
	    skvpy_after_parse(cl, a->after, &p->d) < 0)
		goto fail;
	return 0;
fail:
	skvpy_compact_free(p);
	return -1;
}

int skvpy_compact_parse(struct skvpy_client *cl, PyObject *args, PyObject *kw,
			struct skvpy_compact *p)
{
	static char *kwlist[] = {"q",
				 "k",
				 "v",
				 "window",
				 "capacity",
				 "kernel",
				 "pooling",
				 "gqa",
				 "policy",
				 "sinks",
				 "protect",
				 "decode_reserve",
				 "block_table",
				 "out",
				 "out_block_size",
				 "out_block_table",
				 "out_buffer",
				 "layout",
				 "out_layout",
				 "prompt_len",
				 "evictable",
				 "budget",
				 "fallback_below",
				 "group",
				 "min_window",
				 "kv_dtype",
				 "kv_scales",
				 "after",
				 "pool",
				 "q_slot",
				 "in_place_blocks",
				 "max_decode",
				 "span",
				 NULL};
	static const char *const lay_n[] = {"hnd", "nhd", NULL};
	static const int lay_v[] = {0, 1};
	struct args a = {0};
	struct geom g = {0};
	int out = OUT_ARENA;

	memset(p, 0, sizeof(*p));
	if (!PyArg_ParseTupleAndKeywords(
		args, kw, "|OOO$OOOOOOOOOOOOOOOOOOOOOOOOOOOOOO:compact", kwlist, &a.q, &a.k, &a.v,
		&a.window, &a.capacity, &a.kernel, &a.pooling, &a.gqa, &a.policy, &a.sinks,
		&a.protect, &a.reserve, &a.block_table, &a.out, &a.out_block_size,
		&a.out_block_table, &a.out_buffer, &a.layout, &a.out_layout, &a.prompt_len,
		&a.evictable, &a.budget, &a.fallback_below, &a.group, &a.min_window, &a.kv_dtype,
		&a.kv_scales, &a.after, &a.pool, &a.q_slot, &a.in_place_blocks, &a.max_decode,
		&a.span))
		return -1;
	p->d.desc_size = sizeof(p->d);
	if (a.pool && a.pool != Py_None)
		return pool_parse(cl, &a, p);
	if (!a.q || !a.k || !a.v || (a.q_slot && a.q_slot != Py_None)) {
		PyErr_SetString(PyExc_TypeError,
				"compact() needs q, k and v (or pool=; q_slot is for pool=)");
		return -1;
	}
	g.paged = a.block_table && a.block_table != Py_None;
	if (choice(a.layout, "layout", lay_n, lay_v, &g.nhd) < 0 ||
	    parse_params(&a, &p->d.params) < 0 || parse_group(a.group, p) < 0 ||
	    output(&a, p, &out) < 0 || layers(cl, &a, &g, p) < 0 ||
	    u32_arg(a.in_place_blocks, "in_place_blocks", 0, 1u << 22, &p->d.out_in_place_blocks) <
		0 ||
	    u32_arg(a.max_decode, "max_decode", 0, 1u << 31, &p->d.max_decode) < 0)
		goto fail;
	if (g.paged &&
	    parse_table(a.block_table, (uint32_t)g.k_shape[0], &p->table, &p->d.n_blocks) < 0)
		goto fail;
	if (shape(&a, &g, p) < 0 || (out == OUT_WRITEBACK && writeback(cl, &a, &g, p) < 0) ||
	    fp8_inputs(&a, &g, p) < 0 || skvpy_after_parse(cl, a.after, &p->d) < 0)
		goto fail;
	p->d.block_table = p->table;
	p->d.layer = p->refs;
	return 0;
fail:
	skvpy_compact_free(p);
	return -1;
}

void skvpy_compact_free(struct skvpy_compact *p)
{
	PyMem_Free(p->refs);
	PyMem_Free(p->table);
	PyMem_Free(p->out_refs);
	PyMem_Free(p->out_table);
	PyMem_Free(p->scales);
	p->scales = NULL;
	p->refs = NULL;
	p->table = NULL;
	p->out_refs = NULL;
	p->out_table = NULL;
	Py_CLEAR(p->out);
}
