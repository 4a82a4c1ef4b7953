/* SPDX-License-Identifier: MIT */
/*
 * skv-cuda-dev.c - device, driver entry points, imports of engine buffers
 * (VMM POSIX fds and legacy CUDA IPC handles) and tenant arenas.
 *
 * Imports are keyed by (tenant, generation), never by handle bytes, so a
 * recycled fd number or a handle replayed by another tenant can never alias a
 * live mapping; each key is mapped once and refcounted.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "skv-backend.h"
#include "skv-cuda-internal.h"

int skv_cuda_fail(struct skv_error *err, int r, int32_t layer, int32_t head, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		err->layer = layer;
		err->head = head;
	}
	return r;
}

static const char *cu_name(const struct skv_cuda_dev *dev, CUresult r)
{
	const char *s = NULL;

	if (dev->drv.GetErrorName && dev->drv.GetErrorName(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown CUDA driver error";
}

int skv_cuda_dev_enter(const struct skv_cuda_dev *dev, struct skv_error *err)
{
	cudaError_t e = cudaSetDevice(dev->device);

	if (e != cudaSuccess)
		return skv_cuda_fail(err, -EIO, -1, -1, "cudaSetDevice(%d): %s", dev->device,
				     cudaGetErrorString(e));
	return 0;
}

/*
 * Wait for every kernel of the device before its memory goes: pages freed,
 * unmapped or unregistered under a running kernel are a device fault.
 */
static void dev_drain(const struct skv_cuda_dev *dev)
{
	cudaSetDevice(dev->device);
	cudaDeviceSynchronize();
}

static int entry(void **fn, const char *sym, struct skv_error *err)
{
	enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	/* 12000: the ABI of each symbol as of CUDA 12.0 (e.g. cuStreamWaitValue32_v2) */
	cudaError_t e = cudaGetDriverEntryPointByVersion(sym, fn, 12000, cudaEnableDefault, &q);

	if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !*fn)
		return skv_cuda_fail(err, -ENOSYS, -1, -1, "CUDA driver has no %s (%s)", sym,
				     e != cudaSuccess ? cudaGetErrorString(e)
						      : "symbol or version not found");
	return 0;
}

#define ENTRY(dev, name, err) entry((void **)&(dev)->drv.name, "cu" #name, err)

static int load_driver(struct skv_cuda_dev *dev, struct skv_error *err)
{
	int r = 0;

	r = r ? r : ENTRY(dev, GetErrorName, err);
	r = r ? r : ENTRY(dev, DeviceGet, err);
	r = r ? r : ENTRY(dev, DeviceGetAttribute, err);
	r = r ? r : ENTRY(dev, MemGetAllocationGranularity, err);
	r = r ? r : ENTRY(dev, MemCreate, err);
	r = r ? r : ENTRY(dev, MemRelease, err);
	r = r ? r : ENTRY(dev, MemAddressReserve, err);
	r = r ? r : ENTRY(dev, MemAddressFree, err);
	r = r ? r : ENTRY(dev, MemMap, err);
	r = r ? r : ENTRY(dev, MemUnmap, err);
	r = r ? r : ENTRY(dev, MemSetAccess, err);
	r = r ? r : ENTRY(dev, MemExportToShareableHandle, err);
	r = r ? r : ENTRY(dev, MemImportFromShareableHandle, err);
	r = r ? r : ENTRY(dev, MemGetAddressRange, err);
	r = r ? r : ENTRY(dev, StreamWaitValue32, err);
	r = r ? r : ENTRY(dev, MemGetAllocationPropertiesFromHandle, err);
	r = r ? r : ENTRY(dev, PointerGetAttribute, err);
	return r;
}

static CUmemAllocationProp vmm_prop(int device)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = device;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	return p;
}

int skv_cuda_dev_count(int *ret_n, struct skv_error *err)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess)
		return skv_cuda_fail(err, -ENODEV, -1, -1, "no CUDA device: %s (%s)",
				     cudaGetErrorString(e), cudaGetErrorName(e));
	if (n == 0)
		return skv_cuda_fail(err, -ENODEV, -1, -1, "no CUDA device");
	*ret_n = n;
	return 0;
}

int skv_cuda_dev_open(int device, struct skv_cuda_dev **ret_dev, struct skv_error *err)
{
	struct skv_cuda_dev *dev;
	int n = 0, v = 0, r;
	cudaError_t e;

	if (!ret_dev)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "ret_dev is required");
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess)
		return skv_cuda_fail(err, -ENODEV, -1, -1, "no CUDA device: %s (%s)",
				     cudaGetErrorString(e), cudaGetErrorName(e));
	if (n == 0)
		return skv_cuda_fail(err, -ENODEV, -1, -1, "no CUDA device");
	if (device < 0)
		device = 0;
	if (device >= n)
		return skv_cuda_fail(err, -ENODEV, -1, -1, "no CUDA device %d (%d present)", device,
				     n);
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return skv_cuda_fail(err, -ENOMEM, -1, -1, "out of memory");
	dev->device = device;
	pthread_mutex_init(&dev->mu, NULL);
	r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		goto fail;
	e = cudaFree(NULL); /* create the primary context now, not in the first compaction */
	if (e != cudaSuccess) {
		r = skv_cuda_fail(err, -ENODEV, -1, -1, "CUDA device %d: %s", device,
				  cudaGetErrorString(e));
		goto fail;
	}
	r = load_driver(dev, err);
	if (r < 0)
		goto fail;

	struct cudaDeviceProp prop;
	e = cudaGetDeviceProperties(&prop, device);
	if (e != cudaSuccess) {
		r = skv_cuda_fail(err, -EIO, -1, -1, "cudaGetDeviceProperties: %s",
				  cudaGetErrorString(e));
		goto fail;
	}
	struct skv_cuda_info *in = &dev->info;
	snprintf(in->name, sizeof(in->name), "%s", prop.name);
	in->device = device;
	in->cc_major = prop.major;
	in->cc_minor = prop.minor;
	in->sm_count = prop.multiProcessorCount;
	in->total_mem = prop.totalGlobalMem;
	int clk_khz = 0, bus_bits = 0;
	cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, device);
	cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
	in->hbm_bytes_per_s = 2.0 * clk_khz * 1e3 * bus_bits / 8.0;
	cudaDriverGetVersion(&in->driver_version);
	cudaRuntimeGetVersion(&in->runtime_version);

	CUdevice cud;
	if (dev->drv.DeviceGet(&cud, device) == CUDA_SUCCESS &&
	    dev->drv.DeviceGetAttribute(
		&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cud) ==
		CUDA_SUCCESS &&
	    v) {
		CUmemAllocationProp p = vmm_prop(device);
		size_t g = 0;
		if (dev->drv.MemGetAllocationGranularity(
			&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
		    g)
			dev->granularity = g;
	}
	in->vmm_posix_fd = dev->granularity != 0;
	*ret_dev = dev;
	return 0;
fail:
	pthread_mutex_destroy(&dev->mu);
	free(dev);
	return r;
}

int skv_cuda_dev_info(const struct skv_cuda_dev *dev, struct skv_cuda_info *ret_info)
{
	if (!dev || !ret_info)
		return -EINVAL;
	*ret_info = dev->info;
	return 0;
}

/* ------------------------------------------------------------ imports */

static void unmap_import(struct skv_cuda_import *imp)
{
	struct skv_cuda_dev *dev = imp->dev;

	if (imp->vmm) {
		dev->drv.MemUnmap((CUdeviceptr)(uintptr_t)imp->ptr, imp->size);
		dev->drv.MemAddressFree((CUdeviceptr)(uintptr_t)imp->ptr, imp->size);
	} else {
		cudaIpcCloseMemHandle(imp->ptr);
	}
	free(imp);
}

/* With dev->mu held: the live import of a key, its refcount raised. */
static struct skv_cuda_import *lookup(struct skv_cuda_dev *dev, uint64_t tenant, uint64_t gen)
{
	for (struct skv_cuda_import *i = dev->imports; i; i = i->next)
		if (i->tenant == tenant && i->generation == gen) {
			i->refs++;
			return i;
		}
	return NULL;
}

/*
 * Read-write access for this device to a mapped range; on failure the range
 * is unmapped and its address space freed, as both mappers need.
 */
static CUresult grant_rw(const struct skv_cuda_dev *dev, CUdeviceptr ptr, size_t size)
{
	CUmemAccessDesc acc;
	CUresult cr;

	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = dev->device;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	cr = dev->drv.MemSetAccess(ptr, size, &acc, 1);
	if (cr != CUDA_SUCCESS) {
		dev->drv.MemUnmap(ptr, size);
		dev->drv.MemAddressFree(ptr, size);
	}
	return cr;
}

/* The device a VMM allocation lives on (-1: unknown). */
static int vmm_device(const struct skv_cuda_dev *dev, CUmemGenericAllocationHandle h)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	if (dev->drv.MemGetAllocationPropertiesFromHandle(&p, h) != CUDA_SUCCESS ||
	    p.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return -1;
	return p.location.id;
}

/* The device an opened pointer's memory lives on (-1: unknown). */
static int ptr_device(const struct skv_cuda_dev *dev, const void *p)
{
	int d = -1;

	if (dev->drv.PointerGetAttribute(&d, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					 (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
		return -1;
	return d;
}

static int map_fd(struct skv_cuda_dev *dev, int fd, uint64_t size, void **ret_ptr,
		  struct skv_error *err)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr ptr = 0;
	CUresult cr;

	cr = dev->drv.MemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
						   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (cr != CUDA_SUCCESS)
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "cuMemImportFromShareableHandle(fd %d): %s", fd,
				     cu_name(dev, cr));
	int where = vmm_device(dev, h);
	if (where != dev->device) {
		dev->drv.MemRelease(h);
		return skv_cuda_fail(err, -EXDEV, -1, -1,
				     "the VMM allocation lives on device %d, not on device %d: "
				     "import it there",
				     where, dev->device);
	}
	cr = dev->drv.MemAddressReserve(&ptr, size, 0, 0, 0);
	if (cr != CUDA_SUCCESS) {
		dev->drv.MemRelease(h);
		return skv_cuda_fail(err, -ENOMEM, -1, -1, "cuMemAddressReserve(%llu): %s",
				     (unsigned long long)size, cu_name(dev, cr));
	}
	cr = dev->drv.MemMap(ptr, size, 0, h, 0);
	/* the mapping holds the allocation from here on */
	dev->drv.MemRelease(h);
	if (cr != CUDA_SUCCESS) {
		dev->drv.MemAddressFree(ptr, size);
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "cuMemMap of %llu bytes (larger than the export?): %s",
				     (unsigned long long)size, cu_name(dev, cr));
	}
	cr = grant_rw(dev, ptr, size);
	if (cr != CUDA_SUCCESS)
		return skv_cuda_fail(err, -EIO, -1, -1, "cuMemSetAccess: %s", cu_name(dev, cr));
	*ret_ptr = (void *)(uintptr_t)ptr;
	return 0;
}

static int import_common(struct skv_cuda_dev *dev, uint64_t tenant, uint64_t gen, int vmm, int fd,
			 uint64_t size, const void *handle64, struct skv_cuda_import **ret_imp,
			 struct skv_error *err)
{
	struct skv_cuda_import *imp;
	int r;

	if (!dev || !ret_imp)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "device and ret_imp are required");
	pthread_mutex_lock(&dev->mu);
	imp = lookup(dev, tenant, gen);
	if (imp) {
		pthread_mutex_unlock(&dev->mu);
		*ret_imp = imp;
		return 0;
	}
	r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		goto out;
	imp = calloc(1, sizeof(*imp));
	if (!imp) {
		r = skv_cuda_fail(err, -ENOMEM, -1, -1, "out of memory");
		goto out;
	}
	imp->dev = dev;
	imp->tenant = tenant;
	imp->generation = gen;
	imp->refs = 1;
	imp->vmm = vmm;
	if (vmm) {
		if (!dev->granularity) {
			r = skv_cuda_fail(err, -ENOTSUP, -1, -1,
					  "device %d cannot import VMM POSIX fds", dev->device);
			goto out;
		}
		if (fd < 0 || size == 0 || size % dev->granularity) {
			r = skv_cuda_fail(err, -EINVAL, -1, -1,
					  "VMM import: fd %d, size %llu must be a non-zero "
					  "multiple of the granularity %zu",
					  fd, (unsigned long long)size, dev->granularity);
			goto out;
		}
		r = map_fd(dev, fd, size, &imp->ptr, err);
		if (r < 0)
			goto out;
		imp->size = size;
	} else {
		cudaIpcMemHandle_t h;
		memcpy(&h, handle64, sizeof(h));
		cudaError_t e = cudaIpcOpenMemHandle(&imp->ptr, h, cudaIpcMemLazyEnablePeerAccess);
		if (e != cudaSuccess) {
			r = skv_cuda_fail(err, -EINVAL, -1, -1, "cudaIpcOpenMemHandle: %s",
					  cudaGetErrorString(e));
			goto out;
		}
		int where = ptr_device(dev, imp->ptr);
		if (where != dev->device) {
			cudaIpcCloseMemHandle(imp->ptr);
			r = skv_cuda_fail(err, -EXDEV, -1, -1,
					  "the IPC buffer lives on device %d, not on device %d: "
					  "import it there",
					  where, dev->device);
			goto out;
		}
		CUdeviceptr base = 0;
		size_t sz = 0;
		CUresult cr =
		    dev->drv.MemGetAddressRange(&base, &sz, (CUdeviceptr)(uintptr_t)imp->ptr);
		if (cr != CUDA_SUCCESS) {
			cudaIpcCloseMemHandle(imp->ptr);
			r = skv_cuda_fail(err, -EIO, -1, -1, "cuMemGetAddressRange: %s",
					  cu_name(dev, cr));
			goto out;
		}
		/* usable bytes from the handle's address to the allocation's end */
		imp->size = (uint64_t)(base + sz - (CUdeviceptr)(uintptr_t)imp->ptr);
	}
	imp->next = dev->imports;
	dev->imports = imp;
	*ret_imp = imp;
	imp = NULL;
	r = 0;
out:
	pthread_mutex_unlock(&dev->mu);
	free(imp);
	return r;
}

int skv_cuda_import_fd(struct skv_cuda_dev *dev, uint64_t tenant, uint64_t generation, int fd,
		       uint64_t size, struct skv_cuda_import **ret_imp, struct skv_error *err)
{
	return import_common(dev, tenant, generation, 1, fd, size, NULL, ret_imp, err);
}

int skv_cuda_import_ipc(struct skv_cuda_dev *dev, uint64_t tenant, uint64_t generation,
			const void *handle64, struct skv_cuda_import **ret_imp,
			struct skv_error *err)
{
	if (!handle64)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "no IPC handle");
	return import_common(dev, tenant, generation, 0, -1, 0, handle64, ret_imp, err);
}

void *skv_cuda_import_ptr(const struct skv_cuda_import *imp)
{
	return imp ? imp->ptr : NULL;
}

uint64_t skv_cuda_import_size(const struct skv_cuda_import *imp)
{
	return imp ? imp->size : 0;
}

const char *skv_cuda_import_transport(const struct skv_cuda_import *imp)
{
	if (!imp)
		return NULL;
	return imp->vmm ? "cuda-vmm-fd" : "cuda-ipc";
}

void skv_cuda_import_release(struct skv_cuda_import *imp)
{
	if (!imp)
		return;
	struct skv_cuda_dev *dev = imp->dev;
	pthread_mutex_lock(&dev->mu);
	if (--imp->refs == 0) {
		for (struct skv_cuda_import **pp = &dev->imports; *pp; pp = &(*pp)->next)
			if (*pp == imp) {
				*pp = imp->next;
				break;
			}
		dev_drain(dev); /* no kernel may still read the pages when they go */
		unmap_import(imp);
	}
	pthread_mutex_unlock(&dev->mu);
}

unsigned skv_cuda_release_tenant(struct skv_cuda_dev *dev, uint64_t tenant)
{
	unsigned n = 0;

	if (!dev)
		return 0;
	pthread_mutex_lock(&dev->mu);
	dev_drain(dev);
	for (struct skv_cuda_import **pp = &dev->imports; *pp;) {
		struct skv_cuda_import *i = *pp;
		if (i->tenant != tenant) {
			pp = &i->next;
			continue;
		}
		*pp = i->next;
		unmap_import(i);
		n++;
	}
	pthread_mutex_unlock(&dev->mu);
	return n;
}

int skv_cuda_locate(struct skv_cuda_dev *dev, int fd, const void *handle64, int *ret_device,
		    struct skv_error *err)
{
	CUmemGenericAllocationHandle h;
	cudaIpcMemHandle_t ih;
	void *p = NULL;
	int r, d;

	if (!dev || !ret_device || (fd < 0 && !handle64))
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "device, an fd or handle and "
				     "ret_device are required");
	r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		return r;
	if (fd >= 0) {
		CUresult cr = dev->drv.MemImportFromShareableHandle(
		    &h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		if (cr != CUDA_SUCCESS)
			return skv_cuda_fail(err, -EINVAL, -1, -1,
					     "cuMemImportFromShareableHandle(fd %d): %s", fd,
					     cu_name(dev, cr));
		d = vmm_device(dev, h);
		dev->drv.MemRelease(h);
	} else {
		memcpy(&ih, handle64, sizeof(ih));
		cudaError_t e = cudaIpcOpenMemHandle(&p, ih, cudaIpcMemLazyEnablePeerAccess);
		if (e != cudaSuccess) {
			cudaGetLastError();
			return skv_cuda_fail(err, -EINVAL, -1, -1, "cudaIpcOpenMemHandle: %s",
					     cudaGetErrorString(e));
		}
		d = ptr_device(dev, p);
		cudaIpcCloseMemHandle(p);
	}
	if (d < 0)
		return skv_cuda_fail(err, -EIO, -1, -1,
				     "the driver does not say which device the memory is on");
	*ret_device = d;
	return 0;
}

/* ------------------------------------------------------------- arenas */

int skv_cuda_arena_new(struct skv_cuda_dev *dev, uint64_t size, struct skv_cuda_arena **ret_arena,
		       struct skv_error *err)
{
	struct skv_cuda_arena *a;
	int r;

	if (!dev || !ret_arena || size == 0)
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "device, size and ret_arena are required");
	if (!dev->granularity)
		return skv_cuda_fail(err, -ENOTSUP, -1, -1,
				     "device %d cannot export VMM memory as POSIX fds",
				     dev->device);
	r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		return r;
	uint64_t g = dev->granularity;
	if (size > UINT64_MAX - g)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "arena size %llu too large",
				     (unsigned long long)size);
	size = (size + g - 1) / g * g;
	a = calloc(1, sizeof(*a));
	if (!a)
		return skv_cuda_fail(err, -ENOMEM, -1, -1, "out of memory");
	a->dev = dev;
	a->size = size;
	CUmemAllocationProp prop = vmm_prop(dev->device);
	CUresult cr = dev->drv.MemCreate(&a->handle, size, &prop, 0);
	if (cr != CUDA_SUCCESS) {
		free(a);
		return skv_cuda_fail(err, cr == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO, -1, -1,
				     "cuMemCreate(%llu): %s", (unsigned long long)size,
				     cu_name(dev, cr));
	}
	CUdeviceptr ptr = 0;
	cr = dev->drv.MemAddressReserve(&ptr, size, 0, 0, 0);
	if (cr == CUDA_SUCCESS) {
		cr = dev->drv.MemMap(ptr, size, 0, a->handle, 0);
		if (cr != CUDA_SUCCESS)
			dev->drv.MemAddressFree(ptr, size);
	}
	if (cr == CUDA_SUCCESS)
		cr = grant_rw(dev, ptr, size);
	if (cr != CUDA_SUCCESS) {
		dev->drv.MemRelease(a->handle);
		free(a);
		return skv_cuda_fail(err, -EIO, -1, -1, "mapping a %llu-byte arena: %s",
				     (unsigned long long)size, cu_name(dev, cr));
	}
	a->ptr = (void *)(uintptr_t)ptr;
	pthread_mutex_lock(&dev->mu);
	a->next = dev->arenas;
	dev->arenas = a;
	pthread_mutex_unlock(&dev->mu);
	*ret_arena = a;
	return 0;
}

int skv_cuda_arena_export_fd(struct skv_cuda_arena *a, int *ret_fd, struct skv_error *err)
{
	int fd = -1;

	if (!a || !ret_fd)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "arena and ret_fd are required");
	CUresult cr = a->dev->drv.MemExportToShareableHandle(
	    &fd, a->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (cr != CUDA_SUCCESS)
		return skv_cuda_fail(err, -EIO, -1, -1, "cuMemExportToShareableHandle: %s",
				     cu_name(a->dev, cr));
	*ret_fd = fd;
	return 0;
}

void *skv_cuda_arena_ptr(const struct skv_cuda_arena *a)
{
	return a ? a->ptr : NULL;
}

uint64_t skv_cuda_arena_size(const struct skv_cuda_arena *a)
{
	return a ? a->size : 0;
}

static void arena_unmap(struct skv_cuda_arena *a)
{
	struct skv_cuda_dev *dev = a->dev;
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)a->ptr;

	dev->drv.MemUnmap(p, a->size);
	dev->drv.MemAddressFree(p, a->size);
	dev->drv.MemRelease(a->handle);
	free(a);
}

void skv_cuda_arena_free(struct skv_cuda_arena *a)
{
	if (!a)
		return;
	struct skv_cuda_dev *dev = a->dev;
	pthread_mutex_lock(&dev->mu);
	for (struct skv_cuda_arena **pp = &dev->arenas; *pp; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	dev_drain(dev); /* kernels still writing into it must finish before the pages go */
	arena_unmap(a);
	pthread_mutex_unlock(&dev->mu);
}

void skv_cuda_dev_close(struct skv_cuda_dev *dev)
{
	if (!dev)
		return;
	dev_drain(dev);
	while (dev->imports) {
		struct skv_cuda_import *i = dev->imports;
		dev->imports = i->next;
		unmap_import(i);
	}
	while (dev->arenas) {
		struct skv_cuda_arena *a = dev->arenas;
		dev->arenas = a->next;
		arena_unmap(a);
	}
	pthread_mutex_destroy(&dev->mu);
	free(dev);
}

/* -------------------------------------------------------- host memory */

int skv_cuda_host_register(struct skv_cuda_dev *dev, void *ptr, uint64_t size, void **ret_dev,
			   struct skv_error *err)
{
	const uintptr_t pg = 4096;

	if (!dev || !ptr || !size || !ret_dev)
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "device, range and ret_dev are required");
	int r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		return r;
	uintptr_t b = (uintptr_t)ptr & ~(pg - 1);
	uintptr_t e = ((uintptr_t)ptr + size + pg - 1) & ~(pg - 1);
	const unsigned fl = cudaHostRegisterMapped | cudaHostRegisterPortable;
	cudaError_t ce = cudaHostRegister((void *)b, e - b, fl);
	if (ce != cudaSuccess && ce != cudaErrorHostMemoryAlreadyRegistered) {
		/* a PROT_READ mapping (an engine's memfd) pins only read-only */
		cudaGetLastError();
		ce = cudaHostRegister((void *)b, e - b, fl | cudaHostRegisterReadOnly);
	}
	if (ce == cudaErrorHostMemoryAlreadyRegistered) {
		cudaGetLastError();
		return skv_cuda_fail(err, -EEXIST, -1, -1, "host range already registered");
	}
	if (ce != cudaSuccess)
		return skv_cuda_fail(err, ce == cudaErrorMemoryAllocation ? -ENOMEM : -EIO, -1, -1,
				     "cudaHostRegister(%llu bytes): %s",
				     (unsigned long long)(e - b), cudaGetErrorString(ce));
	void *d = NULL;
	ce = cudaHostGetDevicePointer(&d, (void *)b, 0);
	if (ce != cudaSuccess) {
		cudaHostUnregister((void *)b);
		return skv_cuda_fail(err, -EIO, -1, -1, "cudaHostGetDevicePointer: %s",
				     cudaGetErrorString(ce));
	}
	*ret_dev = (char *)d + ((uintptr_t)ptr - b);
	return 0;
}

void skv_cuda_host_unregister(struct skv_cuda_dev *dev, void *ptr)
{
	if (!dev || !ptr)
		return;
	dev_drain(dev); /* kernels may still read it */
	cudaHostUnregister((void *)((uintptr_t)ptr & ~(uintptr_t)4095));
}

/* ------------------------------------------------ interprocess events */

struct skv_cuda_event {
	struct skv_cuda_dev *dev;
	cudaEvent_t ev;
};

int skv_cuda_event_open(struct skv_cuda_dev *dev, const void *handle64,
			struct skv_cuda_event **ret_ev, struct skv_error *err)
{
	struct skv_cuda_event *e;
	cudaIpcEventHandle_t h;
	cudaError_t ce;

	if (!dev || !handle64 || !ret_ev)
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "device, event handle and ret_ev are required");
	int r = skv_cuda_dev_enter(dev, err);
	if (r < 0)
		return r;
	e = calloc(1, sizeof(*e));
	if (!e)
		return skv_cuda_fail(err, -ENOMEM, -1, -1, "out of memory");
	e->dev = dev;
	memcpy(&h, handle64, sizeof(h));
	ce = cudaIpcOpenEventHandle(&e->ev, h);
	if (ce != cudaSuccess) {
		/* not sticky: clear it, so that no later launch check reports it */
		cudaGetLastError();
		free(e);
		return skv_cuda_fail(err, -EINVAL, -1, -1,
				     "cudaIpcOpenEventHandle: %s (%s); the handle must come from "
				     "cudaIpcGetEventHandle of a live process's event created "
				     "with cudaEventInterprocess | cudaEventDisableTiming",
				     cudaGetErrorString(ce), cudaGetErrorName(ce));
	}
	*ret_ev = e;
	return 0;
}

int skv_cuda_event_query(struct skv_cuda_event *e, struct skv_error *err)
{
	cudaError_t ce;

	if (!e)
		return skv_cuda_fail(err, -EINVAL, -1, -1, "no event");
	int r = skv_cuda_dev_enter(e->dev, err);
	if (r < 0)
		return r;
	ce = cudaEventQuery(e->ev);
	if (ce == cudaSuccess)
		return 0;
	cudaGetLastError(); /* "not ready" is an answer, not an error to keep */
	if (ce == cudaErrorNotReady)
		return -EAGAIN;
	return skv_cuda_fail(err, -EIO, -1, -1, "cudaEventQuery: %s (%s)", cudaGetErrorString(ce),
			     cudaGetErrorName(ce));
}

void skv_cuda_event_close(struct skv_cuda_event *e)
{
	if (!e)
		return;
	cudaSetDevice(e->dev->device);
	cudaEventDestroy(e->ev);
	free(e);
}

/* ------------------------------------------------------ backend table */

static const struct skv_backend_ops ops = {
    .abi = SKV_CUDA_ABI,
    .size = sizeof(struct skv_backend_ops),
    .name = "cuda",
    .dev_open = skv_cuda_dev_open,
    .dev_close = skv_cuda_dev_close,
    .dev_info = skv_cuda_dev_info,
    .ctx_new = skv_cuda_ctx_new,
    .ctx_free = skv_cuda_ctx_free,
    .ctx_stream = skv_cuda_ctx_stream,
    .ctx_wait_ipc_event = skv_cuda_ctx_wait_ipc_event,
    .ctx_wait_value = skv_cuda_ctx_wait_value,
    .compact = skv_cuda_compact,
    .ctx_sync = skv_cuda_ctx_sync,
    .ctx_query = skv_cuda_ctx_query,
    .import_fd = skv_cuda_import_fd,
    .import_ipc = skv_cuda_import_ipc,
    .import_ptr = skv_cuda_import_ptr,
    .import_size = skv_cuda_import_size,
    .import_transport = skv_cuda_import_transport,
    .import_release = skv_cuda_import_release,
    .release_tenant = skv_cuda_release_tenant,
    .arena_new = skv_cuda_arena_new,
    .arena_export_fd = skv_cuda_arena_export_fd,
    .arena_ptr = skv_cuda_arena_ptr,
    .arena_size = skv_cuda_arena_size,
    .arena_free = skv_cuda_arena_free,
    .host_register = skv_cuda_host_register,
    .host_unregister = skv_cuda_host_unregister,
#ifdef SKV_CUDA_EMU
    .emulated = 1,
#endif
    .signal_value = skv_cuda_signal_value,
    /* CUDA_IPC_EVENT prefill waits */
    .event_open = skv_cuda_event_open,
    .event_query = skv_cuda_event_query,
    .event_close = skv_cuda_event_close,
    /* GROW in a GPU arena, paged block tables */
    .ctx_copy = skv_cuda_ctx_copy,
    .ctx_upload = skv_cuda_ctx_upload,
    .read_value = skv_cuda_read_value,
    /* budget modes */
    .compact_budget = skv_cuda_compact_budget,
    /* several devices */
    .dev_count = skv_cuda_dev_count,
    .locate = skv_cuda_locate,
    .compact_decided = skv_cuda_compact_decided,
};

const struct skv_backend_ops *skv_cuda_backend_ops(void)
{
	return &ops;
}
