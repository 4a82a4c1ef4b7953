/* SPDX-License-Identifier: MIT */
/*
 * skvpy-array.h - what the module knows of tensors and arrays: where an
 * input lies (address, shape, strides in elements, dtype, device) read from
 * a torch.Tensor's attributes or any object with the buffer protocol
 * (numpy), and how an output array is made over a Mapping (torch.frombuffer
 * or numpy.frombuffer, then as_strided: zero copy).
 *
 * torch is imported on first use and is optional: without it numpy arrays
 * are taken and made instead.
 */
#ifndef SKVPY_ARRAY_H
#define SKVPY_ARRAY_H

#include <Python.h>
#include <stdint.h>

#include "skv.h"

#define SKVPY_MAX_DIMS 5

/* Element types of arrays the module makes. */
enum skvpy_elem {
	SKVPY_EL_F32 = SKV_DTYPE_F32,
	SKVPY_EL_F16 = SKV_DTYPE_F16,
	SKVPY_EL_BF16 = SKV_DTYPE_BF16,
	/* fp8 (SPEC.md "Quantized K/V"): torch.float8_* where torch has them,
	 * else uint8 arrays of the raw bytes */
	SKVPY_EL_F8E4M3FN = SKV_DTYPE_F8E4M3FN,
	SKVPY_EL_F8E5M2 = SKV_DTYPE_F8E5M2,
	SKVPY_EL_I32 = 16,
};

/* A view of uint8 elements (torch.uint8, numpy uint8): the raw bytes of fp8
 * K/V whose format compact(kv_dtype=) names. Not a libskv dtype. */
#define SKVPY_DTYPE_U8 ((enum skv_dtype)100)

/* What kind of arrays a client returns. */
enum skvpy_kind {
	SKVPY_KIND_AUTO = 0, /* torch when it imports, else numpy */
	SKVPY_KIND_TORCH = 1,
	SKVPY_KIND_NUMPY = 2,
};

struct skvpy_view {
	uintptr_t ptr; /* address of element [0, 0, ...] */
	int ndim;
	int64_t shape[SKVPY_MAX_DIMS];
	int64_t strides[SKVPY_MAX_DIMS]; /* elements */
	enum skv_dtype dtype;
	uint32_t elsize;
	int cuda; /* a CUDA tensor: ptr is a device address */
	int device;
	int torch;
};

/*
 * Read where obj lies. TypeError for something that is neither a torch
 * tensor nor a buffer-protocol array, a dtype other than f32/f16/bf16,
 * uint8 (SKVPY_DTYPE_U8) or torch's float8_e4m3fn/float8_e5m2, or
 * more than SKVPY_MAX_DIMS dimensions; ValueError for an empty one. what
 * names the argument in messages ("k[3]").
 */
int skvpy_view_of(PyObject *obj, const char *what, struct skvpy_view *v);
/*
 * A block table by reference (registered pools): 1 with its address, entry
 * count and whether it is on a GPU when obj is a one-dimensional contiguous
 * int32 torch tensor or buffer-protocol array; 0 for anything else (the
 * caller copies it as a list); -1 with an exception.
 */
int skvpy_table_view(PyObject *obj, uintptr_t *ret_ptr, int64_t *ret_n, int *ret_cuda);
/* The bytes [lo, hi) every element of v lies in. */
void skvpy_view_extent(const struct skvpy_view *v, uintptr_t *ret_lo, uintptr_t *ret_hi);

/* A dtype argument: torch.float32/float16/bfloat16, numpy float32/float16,
 * or "f32"/"float32"/"f16"/"float16"/"half"/"bf16"/"bfloat16", or fp8 by
 * name: "f8e4m3fn"/"float8_e4m3fn", "f8e5m2"/"float8_e5m2" (and torch's
 * float8 dtypes where it has them). *ret_kind
 * is TORCH or NUMPY for a dtype object, AUTO for a string. */
int skvpy_dtype_parse(PyObject *dt, enum skv_dtype *ret, enum skvpy_kind *ret_kind);
/* AUTO -> TORCH or NUMPY (whichever imports). -1 with an exception. */
int skvpy_kind_resolve(enum skvpy_kind k, enum skvpy_kind *ret);

/*
 * A zero-copy array over mapping (a Mapping) at byte offset, with shape and
 * strides (elements, >= 0). bf16 as numpy: uint16 holding the raw bits.
 */
PyObject *skvpy_array_new(enum skvpy_kind kind, PyObject *mapping, size_t offset,
			  enum skvpy_elem el, int ndim, const int64_t *shape,
			  const int64_t *strides);
/* A new array holding a copy of n floats. */
PyObject *skvpy_array_from_floats(enum skvpy_kind kind, const float *f, int64_t rows, int64_t cols);

#endif
