/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-internal.h - what the host-side files of libskv-cuda share (C and
 * the nvcc-compiled launcher file). Not installed.
 *
 * The driver API is reached only through these pointers, filled by
 * cudaGetDriverEntryPointByVersion() at skv_cuda_dev_open(): the library
 * never links libcuda, so it loads where no driver is installed.
 */
#ifndef SKV_CUDA_INTERNAL_H
#define SKV_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include <cuda.h>

#include "skv-cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

struct skv_cuda_drv {
	CUresult (*GetErrorName)(CUresult, const char **);
	CUresult (*DeviceGet)(CUdevice *, int);
	CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
	CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
						CUmemAllocationGranularity_flags);
	CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
			      unsigned long long);
	CUresult (*MemRelease)(CUmemGenericAllocationHandle);
	CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
				      unsigned long long);
	CUresult (*MemAddressFree)(CUdeviceptr, size_t);
	CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
			   unsigned long long);
	CUresult (*MemUnmap)(CUdeviceptr, size_t);
	CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
					       CUmemAllocationHandleType, unsigned long long);
	CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
						 CUmemAllocationHandleType);
	CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*StreamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
	/* where an engine's memory lives (skv_cuda_locate, imports' checks) */
	CUresult (*MemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *,
							 CUmemGenericAllocationHandle);
	CUresult (*PointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
};

struct skv_cuda_import {
	struct skv_cuda_dev *dev;
	struct skv_cuda_import *next;
	uint64_t tenant;
	uint64_t generation;
	unsigned refs;
	int vmm; /* 1: cuMemMap of a POSIX fd; 0: cudaIpcOpenMemHandle */
	void *ptr;
	uint64_t size;
};

struct skv_cuda_arena {
	struct skv_cuda_dev *dev;
	struct skv_cuda_arena *next;
	CUmemGenericAllocationHandle handle;
	void *ptr;
	uint64_t size;
};

struct skv_cuda_dev {
	int device;
	struct skv_cuda_drv drv;
	struct skv_cuda_info info;
	size_t granularity; /* VMM allocation granularity (0: no VMM fd support) */
	pthread_mutex_t mu; /* imports and arenas lists */
	struct skv_cuda_import *imports;
	struct skv_cuda_arena *arenas;
};

/* Fill err (may be NULL) and return r. */
int skv_cuda_fail(struct skv_error *err, int r, int32_t layer, int32_t head, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* cudaSetDevice(dev->device): -EIO with the reason on failure. */
int skv_cuda_dev_enter(const struct skv_cuda_dev *dev, struct skv_error *err);

#ifdef __cplusplus
}
#endif
#endif /* SKV_CUDA_INTERNAL_H */
