// SPDX-License-Identifier: MIT
#include "skvpy-array.h"

#include <stdbool.h>
#include <string.h>

/* torch and numpy objects, looked up once (under the GIL). */
static struct {
	int tried, ok;
	PyObject *tensor_type, *frombuffer, *f32, *f16, *bf16, *i32, *u8;
	PyObject *f8e4m3fn, *f8e5m2; /* NULL where torch has no float8 */
} torch;
static struct {
	int tried, ok;
	PyObject *frombuffer, *as_strided, *dtype, *f32, *f16, *u16, *i32, *u8;
} np;
static PyObject *s_dtype, *s_shape, *s_stride, *s_data_ptr, *s_is_cuda, *s_get_device,
    *s_as_strided;

static int strings(void)
{
	if (s_dtype)
		return 0;
	s_dtype = PyUnicode_InternFromString("dtype");
	s_shape = PyUnicode_InternFromString("shape");
	s_stride = PyUnicode_InternFromString("stride");
	s_data_ptr = PyUnicode_InternFromString("data_ptr");
	s_is_cuda = PyUnicode_InternFromString("is_cuda");
	s_get_device = PyUnicode_InternFromString("get_device");
	s_as_strided = PyUnicode_InternFromString("as_strided");
	return s_dtype && s_shape && s_stride && s_data_ptr && s_is_cuda && s_get_device &&
		       s_as_strided
		   ? 0
		   : -1;
}

/* 1 when torch imports, 0 when not (no exception left set). */
static int torch_load(void)
{
	PyObject *m;

	if (torch.tried)
		return torch.ok;
	torch.tried = 1;
	m = PyImport_ImportModule("torch");
	if (!m) {
		PyErr_Clear();
		return 0;
	}
	torch.tensor_type = PyObject_GetAttrString(m, "Tensor");
	torch.frombuffer = PyObject_GetAttrString(m, "frombuffer");
	torch.f32 = PyObject_GetAttrString(m, "float32");
	torch.f16 = PyObject_GetAttrString(m, "float16");
	torch.bf16 = PyObject_GetAttrString(m, "bfloat16");
	torch.i32 = PyObject_GetAttrString(m, "int32");
	torch.u8 = PyObject_GetAttrString(m, "uint8");
	torch.f8e4m3fn = PyObject_GetAttrString(m, "float8_e4m3fn");
	PyErr_Clear();
	torch.f8e5m2 = PyObject_GetAttrString(m, "float8_e5m2");
	PyErr_Clear();
	Py_DECREF(m);
	torch.ok = torch.tensor_type && torch.frombuffer && torch.f32 && torch.f16 && torch.bf16 &&
		   torch.i32 && torch.u8 && PyType_Check(torch.tensor_type);
	PyErr_Clear();
	return torch.ok;
}

static int numpy_load(void)
{
	PyObject *m, *st;

	if (np.tried)
		return np.ok;
	np.tried = 1;
	m = PyImport_ImportModule("numpy");
	st = m ? PyImport_ImportModule("numpy.lib.stride_tricks") : NULL;
	if (!m || !st) {
		Py_XDECREF(m);
		PyErr_Clear();
		return 0;
	}
	np.frombuffer = PyObject_GetAttrString(m, "frombuffer");
	np.as_strided = PyObject_GetAttrString(st, "as_strided");
	np.dtype = PyObject_GetAttrString(m, "dtype");
	np.f32 = PyObject_CallMethod(m, "dtype", "s", "float32");
	np.f16 = PyObject_CallMethod(m, "dtype", "s", "float16");
	np.u16 = PyObject_CallMethod(m, "dtype", "s", "uint16");
	np.i32 = PyObject_CallMethod(m, "dtype", "s", "int32");
	np.u8 = PyObject_CallMethod(m, "dtype", "s", "uint8");
	Py_DECREF(m);
	Py_DECREF(st);
	np.ok = np.frombuffer && np.as_strided && np.dtype && np.f32 && np.f16 && np.u16 &&
		np.i32 && np.u8;
	PyErr_Clear();
	return np.ok;
}

int skvpy_kind_resolve(enum skvpy_kind k, enum skvpy_kind *ret)
{
	if ((k == SKVPY_KIND_AUTO || k == SKVPY_KIND_TORCH) && torch_load()) {
		*ret = SKVPY_KIND_TORCH;
		return 0;
	}
	if (k == SKVPY_KIND_TORCH) {
		PyErr_SetString(PyExc_ImportError, "torch is not available (python3-torch)");
		return -1;
	}
	if (numpy_load()) {
		*ret = SKVPY_KIND_NUMPY;
		return 0;
	}
	PyErr_SetString(PyExc_ImportError, "neither torch nor numpy is available");
	return -1;
}

/* A tuple of small ints into out[]; -1 with an exception. */
static int int_tuple(PyObject *t, const char *what, const char *field, int64_t *out, int *ret_n)
{
	Py_ssize_t n;

	if (!t || !PyTuple_Check(t)) {
		if (!PyErr_Occurred())
			PyErr_Format(PyExc_TypeError, "%s: %s is not a tuple", what, field);
		return -1;
	}
	n = PyTuple_GET_SIZE(t);
	if (n < 1 || n > SKVPY_MAX_DIMS) {
		PyErr_Format(PyExc_ValueError, "%s: %zd dimensions (1 .. %d allowed)", what, n,
			     SKVPY_MAX_DIMS);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
		if (x == -1 && PyErr_Occurred())
			return -1;
		out[i] = x;
	}
	*ret_n = (int)n;
	return 0;
}

static int torch_dtype(PyObject *dt, enum skv_dtype *ret)
{
	if (dt == torch.f32)
		*ret = SKV_DTYPE_F32;
	else if (dt == torch.f16)
		*ret = SKV_DTYPE_F16;
	else if (dt == torch.bf16)
		*ret = SKV_DTYPE_BF16;
	else if (dt == torch.u8)
		*ret = SKVPY_DTYPE_U8;
	else if (torch.f8e4m3fn && dt == torch.f8e4m3fn)
		*ret = SKV_DTYPE_F8E4M3FN;
	else if (torch.f8e5m2 && dt == torch.f8e5m2)
		*ret = SKV_DTYPE_F8E5M2;
	else
		return -1;
	return 0;
}

static int view_torch(PyObject *obj, const char *what, struct skvpy_view *v)
{
	PyObject *dt = NULL, *shape = NULL, *stride = NULL, *ptr = NULL, *cuda = NULL;
	int r = -1, ns = 0;

	if (strings() < 0)
		return -1;
	dt = PyObject_GetAttr(obj, s_dtype);
	if (!dt)
		goto out;
	if (torch_dtype(dt, &v->dtype) < 0) {
		PyObject *s = PyObject_Str(dt);
		PyErr_Format(PyExc_TypeError,
			     "%s: dtype %S not supported (float32, float16, bfloat16; uint8 or "
			     "float8 for fp8 K/V)",
			     what, s ? s : Py_None);
		Py_XDECREF(s);
		goto out;
	}
	shape = PyObject_GetAttr(obj, s_shape);
	stride = PyObject_CallMethodNoArgs(obj, s_stride);
	ptr = PyObject_CallMethodNoArgs(obj, s_data_ptr);
	cuda = PyObject_GetAttr(obj, s_is_cuda);
	if (!shape || !stride || !ptr || !cuda)
		goto out;
	if (int_tuple(shape, what, "shape", v->shape, &v->ndim) < 0 ||
	    int_tuple(stride, what, "stride", v->strides, &ns) < 0)
		goto out;
	v->ptr = (uintptr_t)PyLong_AsUnsignedLongLong(ptr);
	if (PyErr_Occurred())
		goto out;
	v->cuda = PyObject_IsTrue(cuda) == 1;
	v->device = -1;
	if (v->cuda) {
		PyObject *d = PyObject_CallMethodNoArgs(obj, s_get_device);
		if (!d)
			goto out;
		v->device = (int)PyLong_AsLong(d);
		Py_DECREF(d);
		if (PyErr_Occurred())
			goto out;
	}
	v->torch = 1;
	r = 0;
out:
	Py_XDECREF(dt);
	Py_XDECREF(shape);
	Py_XDECREF(stride);
	Py_XDECREF(ptr);
	Py_XDECREF(cuda);
	return r;
}

static int view_buffer(PyObject *obj, const char *what, struct skvpy_view *v)
{
	Py_buffer b;
	const char *f;
	int r = -1;

	if (PyObject_GetBuffer(obj, &b, PyBUF_RECORDS_RO) < 0)
		return -1;
	f = b.format ? b.format : "B";
	if (*f == '<' || *f == '=' || *f == '@')
		f++;
	if (!strcmp(f, "f") && b.itemsize == 4)
		v->dtype = SKV_DTYPE_F32;
	else if (!strcmp(f, "e") && b.itemsize == 2)
		v->dtype = SKV_DTYPE_F16;
	else if (!strcmp(f, "B") && b.itemsize == 1)
		v->dtype = SKVPY_DTYPE_U8;
	else {
		PyErr_Format(PyExc_TypeError,
			     "%s: element format '%s' not supported (float32 'f', float16 'e'; "
			     "bfloat16 needs a torch tensor)",
			     what, b.format ? b.format : "B");
		goto out;
	}
	if (b.ndim < 1 || b.ndim > SKVPY_MAX_DIMS) {
		PyErr_Format(PyExc_ValueError, "%s: %d dimensions (1 .. %d allowed)", what, b.ndim,
			     SKVPY_MAX_DIMS);
		goto out;
	}
	v->ndim = b.ndim;
	for (int i = 0; i < b.ndim; i++) {
		if (b.strides[i] % b.itemsize) {
			PyErr_Format(PyExc_ValueError,
				     "%s: stride %zd bytes of dimension %d is not a multiple of "
				     "the element size",
				     what, b.strides[i], i);
			goto out;
		}
		v->shape[i] = b.shape[i];
		v->strides[i] = b.strides[i] / b.itemsize;
	}
	v->ptr = (uintptr_t)b.buf;
	v->cuda = 0;
	v->device = -1;
	v->torch = 0;
	r = 0;
out:
	PyBuffer_Release(&b);
	return r;
}

int skvpy_view_of(PyObject *obj, const char *what, struct skvpy_view *v)
{
	int r;

	memset(v, 0, sizeof(*v));
	if (PyObject_CheckBuffer(obj))
		r = view_buffer(obj, what, v);
	else if (torch_load() && PyObject_TypeCheck(obj, (PyTypeObject *)torch.tensor_type))
		r = view_torch(obj, what, v);
	else {
		PyErr_Format(PyExc_TypeError,
			     "%s: expected a torch tensor or a numpy array, not %.100s", what,
			     Py_TYPE(obj)->tp_name);
		return -1;
	}
	if (r < 0)
		return -1;
	v->elsize = v->dtype == SKVPY_DTYPE_U8 ? 1 : (uint32_t)skv_dtype_size(v->dtype);
	for (int i = 0; i < v->ndim; i++) {
		if (v->shape[i] <= 0) {
			PyErr_Format(PyExc_ValueError, "%s: empty (dimension %d is %lld)", what, i,
				     (long long)v->shape[i]);
			return -1;
		}
		if (v->shape[i] > (1ll << 40) || v->strides[i] > (1ll << 40) ||
		    v->strides[i] < -(1ll << 40)) {
			PyErr_Format(PyExc_ValueError, "%s: dimension %d too large", what, i);
			return -1;
		}
	}
	return 0;
}

/* A numpy int32 array (or any 1-D buffer of 4-byte ints). */
static int table_buffer(PyObject *obj, uintptr_t *ret_ptr, int64_t *ret_n)
{
	Py_buffer b;
	int r = 0;

	if (PyObject_GetBuffer(obj, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
		PyErr_Clear();
		return 0;
	}
	if (b.ndim == 1 && b.itemsize == 4 && b.format &&
	    strchr("il", b.format[strlen(b.format) - 1]) &&
	    (b.format[0] != '>' && b.format[0] != '!')) {
		*ret_ptr = (uintptr_t)b.buf;
		*ret_n = b.shape ? b.shape[0] : (int64_t)(b.len / 4);
		r = 1;
	}
	PyBuffer_Release(&b);
	return r;
}

int skvpy_table_view(PyObject *obj, uintptr_t *ret_ptr, int64_t *ret_n, int *ret_cuda)
{
	struct skvpy_view v;
	PyObject *dt;
	int r, contig;

	*ret_cuda = 0;
	if (PyObject_CheckBuffer(obj))
		return table_buffer(obj, ret_ptr, ret_n);
	if (!torch_load() || !PyObject_TypeCheck(obj, (PyTypeObject *)torch.tensor_type) ||
	    strings() < 0)
		return 0;
	if (!(dt = PyObject_GetAttr(obj, s_dtype)))
		return -1;
	r = PyObject_RichCompareBool(dt, torch.i32, Py_EQ);
	Py_DECREF(dt);
	if (r <= 0)
		return r;
	/* the shape, strides and address as for any tensor, dtype aside */
	memset(&v, 0, sizeof(v));
	{
		PyObject *shape = PyObject_GetAttr(obj, s_shape),
			 *stride = PyObject_CallMethodNoArgs(obj, s_stride),
			 *ptr = PyObject_CallMethodNoArgs(obj, s_data_ptr),
			 *cuda = PyObject_GetAttr(obj, s_is_cuda);
		int ns = 0;

		r = -1;
		if (shape && stride && ptr && cuda &&
		    int_tuple(shape, "block_table", "shape", v.shape, &v.ndim) == 0 &&
		    int_tuple(stride, "block_table", "stride", v.strides, &ns) == 0) {
			v.ptr = (uintptr_t)PyLong_AsUnsignedLongLong(ptr);
			v.cuda = PyObject_IsTrue(cuda) == 1;
			r = PyErr_Occurred() ? -1 : 0;
		}
		Py_XDECREF(shape);
		Py_XDECREF(stride);
		Py_XDECREF(ptr);
		Py_XDECREF(cuda);
	}
	if (r < 0)
		return -1;
	contig = v.ndim == 1 && (v.shape[0] == 1 || v.strides[0] == 1);
	if (!contig)
		return 0;
	*ret_ptr = v.ptr;
	*ret_n = v.shape[0];
	*ret_cuda = v.cuda;
	return 1;
}

void skvpy_view_extent(const struct skvpy_view *v, uintptr_t *ret_lo, uintptr_t *ret_hi)
{
	int64_t lo = 0, hi = 0;

	for (int i = 0; i < v->ndim; i++) {
		int64_t span = (v->shape[i] - 1) * v->strides[i];
		if (span < 0)
			lo += span;
		else
			hi += span;
	}
	*ret_lo = v->ptr + (uintptr_t)(lo * (int64_t)v->elsize);
	*ret_hi = v->ptr + (uintptr_t)((hi + 1) * (int64_t)v->elsize);
}

static int dtype_name(const char *s, enum skv_dtype *ret)
{
	static const struct {
		const char *n;
		enum skv_dtype d;
	} names[] = {{"f32", SKV_DTYPE_F32},	       {"float32", SKV_DTYPE_F32},
		     {"float", SKV_DTYPE_F32},	       {"f16", SKV_DTYPE_F16},
		     {"float16", SKV_DTYPE_F16},       {"half", SKV_DTYPE_F16},
		     {"bf16", SKV_DTYPE_BF16},	       {"bfloat16", SKV_DTYPE_BF16},
		     {"f8e4m3fn", SKV_DTYPE_F8E4M3FN}, {"float8_e4m3fn", SKV_DTYPE_F8E4M3FN},
		     {"f8e5m2", SKV_DTYPE_F8E5M2},     {"float8_e5m2", SKV_DTYPE_F8E5M2}};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(s, names[i].n)) {
			*ret = names[i].d;
			return 0;
		}
	return -1;
}

int skvpy_dtype_parse(PyObject *dt, enum skv_dtype *ret, enum skvpy_kind *ret_kind)
{
	if (PyUnicode_Check(dt)) {
		const char *s = PyUnicode_AsUTF8(dt);
		if (!s)
			return -1;
		if (dtype_name(s, ret) == 0) {
			*ret_kind = SKVPY_KIND_AUTO;
			return 0;
		}
	} else if (torch_load() && torch_dtype(dt, ret) == 0 && *ret != SKVPY_DTYPE_U8) {
		*ret_kind = SKVPY_KIND_TORCH;
		return 0;
	} else if (numpy_load()) {
		/* numpy.float32 (a type) or numpy.dtype('float32') */
		PyObject *d = PyObject_CallOneArg(np.dtype, dt);
		if (d) {
			int f32 = PyObject_RichCompareBool(d, np.f32, Py_EQ) == 1;
			int f16 = !f32 && PyObject_RichCompareBool(d, np.f16, Py_EQ) == 1;
			Py_DECREF(d);
			if (f32 || f16) {
				*ret = f32 ? SKV_DTYPE_F32 : SKV_DTYPE_F16;
				*ret_kind = SKVPY_KIND_NUMPY;
				return 0;
			}
		}
		PyErr_Clear();
	}
	PyErr_Format(PyExc_TypeError,
		     "dtype %R not supported: torch.float32/float16/bfloat16, numpy "
		     "float32/float16, or 'f32', 'f16', 'bf16', 'f8e4m3fn', 'f8e5m2'",
		     dt);
	return -1;
}

static int64_t extent_elems(int ndim, const int64_t *shape, const int64_t *strides)
{
	int64_t n = 1;

	for (int i = 0; i < ndim; i++)
		n += (shape[i] - 1) * strides[i];
	return n;
}

static PyObject *tuple_of(int n, const int64_t *x, int64_t scale)
{
	PyObject *t = PyTuple_New(n);

	for (int i = 0; t && i < n; i++) {
		PyObject *v = PyLong_FromLongLong(x[i] * scale);
		if (!v) {
			Py_CLEAR(t);
			break;
		}
		PyTuple_SET_ITEM(t, i, v);
	}
	return t;
}

/* torch.frombuffer(mapping, dtype=dt, count=count, offset=offset): keyword-only. */
static PyObject *torch_frombuffer(PyObject *mapping, PyObject *dt, int64_t count, size_t offset)
{
	PyObject *args = PyTuple_Pack(1, mapping), *kw = NULL, *res = NULL;

	if (args)
		kw = Py_BuildValue("{sOsLsn}", "dtype", dt, "count", (long long)count, "offset",
				   (Py_ssize_t)offset);
	if (kw)
		res = PyObject_Call(torch.frombuffer, args, kw);
	Py_XDECREF(args);
	Py_XDECREF(kw);
	return res;
}

static PyObject *torch_new(PyObject *mapping, size_t offset, enum skvpy_elem el, int ndim,
			   const int64_t *shape, const int64_t *strides)
{
	PyObject *dt = el == SKVPY_EL_F32	 ? torch.f32
		       : el == SKVPY_EL_F16	 ? torch.f16
		       : el == SKVPY_EL_BF16	 ? torch.bf16
		       : el == SKVPY_EL_F8E4M3FN ? (torch.f8e4m3fn ? torch.f8e4m3fn : torch.u8)
		       : el == SKVPY_EL_F8E5M2	 ? (torch.f8e5m2 ? torch.f8e5m2 : torch.u8)
						 : torch.i32;
	PyObject *flat, *res = NULL, *sh, *st;

	flat = torch_frombuffer(mapping, dt, extent_elems(ndim, shape, strides), offset);
	if (!flat)
		return NULL;
	sh = tuple_of(ndim, shape, 1);
	st = tuple_of(ndim, strides, 1);
	if (sh && st)
		res = PyObject_CallMethodObjArgs(flat, s_as_strided, sh, st, NULL);
	Py_XDECREF(sh);
	Py_XDECREF(st);
	Py_DECREF(flat);
	return res;
}

static PyObject *numpy_new(PyObject *mapping, size_t offset, enum skvpy_elem el, int ndim,
			   const int64_t *shape, const int64_t *strides)
{
	const bool f8 = el == SKVPY_EL_F8E4M3FN || el == SKVPY_EL_F8E5M2;
	PyObject *dt = el == SKVPY_EL_F32    ? np.f32
		       : el == SKVPY_EL_F16  ? np.f16
		       : el == SKVPY_EL_BF16 ? np.u16
		       : f8		     ? np.u8
					     : np.i32;
	int64_t es = el == SKVPY_EL_F32 || el == SKVPY_EL_I32 ? 4 : f8 ? 1 : 2;
	PyObject *flat, *res = NULL, *sh, *st;

	flat = PyObject_CallFunction(np.frombuffer, "OOLn", mapping, dt,
				     (long long)extent_elems(ndim, shape, strides),
				     (Py_ssize_t)offset);
	if (!flat)
		return NULL;
	sh = tuple_of(ndim, shape, 1);
	st = tuple_of(ndim, strides, es);
	if (sh && st)
		res = PyObject_CallFunctionObjArgs(np.as_strided, flat, sh, st, NULL);
	Py_XDECREF(sh);
	Py_XDECREF(st);
	Py_DECREF(flat);
	return res;
}

PyObject *skvpy_array_new(enum skvpy_kind kind, PyObject *mapping, size_t offset,
			  enum skvpy_elem el, int ndim, const int64_t *shape,
			  const int64_t *strides)
{
	if (strings() < 0 || skvpy_kind_resolve(kind, &kind) < 0)
		return NULL;
	if (kind == SKVPY_KIND_TORCH)
		return torch_new(mapping, offset, el, ndim, shape, strides);
	return numpy_new(mapping, offset, el, ndim, shape, strides);
}

PyObject *skvpy_array_from_floats(enum skvpy_kind kind, const float *f, int64_t rows, int64_t cols)
{
	PyObject *bytes, *arr = NULL, *flat;
	PyObject *shape;

	if (strings() < 0 || skvpy_kind_resolve(kind, &kind) < 0)
		return NULL;
	bytes = PyByteArray_FromStringAndSize((const char *)f, (Py_ssize_t)(rows * cols * 4));
	if (!bytes)
		return NULL;
	if (kind == SKVPY_KIND_TORCH)
		flat = torch_frombuffer(bytes, torch.f32, rows * cols, 0);
	else
		flat = PyObject_CallFunction(np.frombuffer, "OO", bytes, np.f32);
	Py_DECREF(bytes);
	if (!flat)
		return NULL;
	shape = Py_BuildValue("(LL)", (long long)rows, (long long)cols);
	if (shape)
		arr = PyObject_CallMethod(flat, "reshape", "O", shape);
	Py_XDECREF(shape);
	Py_DECREF(flat);
	return arr;
}
