/* SPDX-License-Identifier: MIT */
/*
 * test-emu-devices - the emulator's several devices ($SKV_EMU_DEVICES=2)
 * behave as two GPUs do: a thread's current device (cudaSetDevice, invalid
 * ordinals refused), launches counted on the device that ran them, memory
 * that remembers its device (cudaMalloc, a VMM allocation and its exported
 * fd, an IPC handle), a kernel on one device naming another's memory
 * refused (cudaErrorIllegalAddress) until peer access is enabled (or
 * cuMemSetAccess grants it, for VMM), a launch into another device's stream
 * refused, and no peer access at all with $SKV_EMU_NO_PEER. Exit 0 when
 * every check passed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cuda.h>

#include "cuda_runtime.h"

extern "C" unsigned long long cuda_emu_launches(int d);

static __global__ void mark(int *p)
{
	p[threadIdx.x] = 1;
}

static int fails;

static void check(bool ok, const char *what)
{
	printf("  %s %s\n", ok ? "ok  " : "FAIL", what);
	fails += !ok;
}

/* the driver entry point sym of the emulator */
template <typename F> static F drv(const char *sym)
{
	void *fn = NULL;
	cudaDriverEntryPointQueryResult q;
	cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault, &q);
	return (F)fn;
}

static cudaError_t launch_on(int dev, int *p, cudaStream_t s = 0)
{
	cudaSetDevice(dev);
	cudaGetLastError();
	SKV_LAUNCH(mark, 1, 32, 0, s, p);
	return cudaGetLastError();
}

static void runtime_memory(void)
{
	int n = 0, d = -1, *m1 = NULL;
	cudaStream_t s1;

	check(cudaGetDeviceCount(&n) == cudaSuccess && n == 2, "SKV_EMU_DEVICES=2: two devices");
	check(cudaSetDevice(2) == cudaErrorInvalidDevice, "cudaSetDevice(2): invalid device");
	check(cudaGetDevice(&d) == cudaSuccess && d == 0, "a thread starts on device 0");
	cudaSetDevice(1);
	check(cudaMalloc((void **)&m1, 128 * 1024) == cudaSuccess, "cudaMalloc on device 1");
	cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
	unsigned long long l0 = cuda_emu_launches(0), l1 = cuda_emu_launches(1);
	check(launch_on(1, m1, s1) == cudaSuccess, "device 1 runs a kernel on its own memory");
	check(cuda_emu_launches(1) == l1 + 1 && cuda_emu_launches(0) == l0,
	      "counted on device 1, not device 0");
	check(launch_on(0, m1, s1) == cudaErrorInvalidResourceHandle,
	      "device 0 into device 1's stream: cudaErrorInvalidResourceHandle");
	check(launch_on(0, m1) == cudaErrorIllegalAddress,
	      "device 0 on device 1's memory without peer access: cudaErrorIllegalAddress");
	check(cuda_emu_launches(0) == l0, "the refused launches ran nothing");
	int can = 0;
	cudaDeviceCanAccessPeer(&can, 0, 1);
	check(can == 1, "device 0 can access device 1");
	cudaSetDevice(0);
	check(cudaDeviceEnablePeerAccess(1, 0) == cudaSuccess, "peer access 0 -> 1 enabled");
	check(cudaDeviceEnablePeerAccess(1, 0) == cudaErrorPeerAccessAlreadyEnabled,
	      "enabled twice: cudaErrorPeerAccessAlreadyEnabled");
	check(launch_on(0, m1) == cudaSuccess && cuda_emu_launches(0) == l0 + 1,
	      "with peer access device 0 runs on device 1's memory");
	cudaSetDevice(0);
	cudaDeviceDisablePeerAccess(1);
	check(launch_on(0, m1) == cudaErrorIllegalAddress, "disabled again: refused again");

	/* an IPC handle remembers device 1; opened on device 0 without the lazy flag */
	cudaIpcMemHandle_t h;
	int *o = NULL, od = -1;
	check(cudaIpcGetMemHandle(&h, m1) == cudaSuccess, "IPC handle of device 1's memory");
	cudaSetDevice(0);
	check(cudaIpcOpenMemHandle((void **)&o, h, 0) == cudaSuccess, "opened on device 0");
	auto ptr_attr = drv<CUresult(CUDAAPI *)(void *, CUpointer_attribute, CUdeviceptr)>(
	    "cuPointerGetAttribute");
	check(ptr_attr(&od, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)o) ==
		      CUDA_SUCCESS &&
		  od == 1,
	      "cuPointerGetAttribute: the opened memory is device 1's");
	check(launch_on(0, o) == cudaErrorIllegalAddress,
	      "opened without cudaIpcMemLazyEnablePeerAccess: device 0 may not use it");
	cudaIpcCloseMemHandle(o);
	cudaSetDevice(0);
	cudaIpcOpenMemHandle((void **)&o, h, cudaIpcMemLazyEnablePeerAccess);
	check(launch_on(0, o) == cudaSuccess, "with the lazy peer flag it may");
	check(launch_on(1, o) == cudaSuccess, "and so may device 1, its owner");
	cudaIpcCloseMemHandle(o);
	cudaFree(m1);
	cudaStreamDestroy(s1);
}

static void vmm_memory(void)
{
	CUmemAllocationProp p = {}, q = {};
	CUmemGenericAllocationHandle hd, hi;
	CUdeviceptr a = 0;
	const size_t sz = 2u << 20;
	int fd = -1;

	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = 1;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	auto create = drv<CUresult(CUDAAPI *)(CUmemGenericAllocationHandle *, size_t,
					      const CUmemAllocationProp *, unsigned long long)>(
	    "cuMemCreate");
	auto xport =
	    drv<CUresult(CUDAAPI *)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
				    unsigned long long)>("cuMemExportToShareableHandle");
	auto import =
	    drv<CUresult(CUDAAPI *)(CUmemGenericAllocationHandle *, void *,
				    CUmemAllocationHandleType)>("cuMemImportFromShareableHandle");
	auto props = drv<CUresult(CUDAAPI *)(CUmemAllocationProp *, CUmemGenericAllocationHandle)>(
	    "cuMemGetAllocationPropertiesFromHandle");
	auto reserve = drv<CUresult(CUDAAPI *)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
					       unsigned long long)>("cuMemAddressReserve");
	auto map =
	    drv<CUresult(CUDAAPI *)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
				    unsigned long long)>("cuMemMap");
	auto access =
	    drv<CUresult(CUDAAPI *)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)>(
		"cuMemSetAccess");
	auto unmap = drv<CUresult(CUDAAPI *)(CUdeviceptr, size_t)>("cuMemUnmap");

	p.location.id = 2;
	check(create(&hd, sz, &p, 0) == CUDA_ERROR_INVALID_DEVICE,
	      "cuMemCreate on device 2 of 2: CUDA_ERROR_INVALID_DEVICE");
	p.location.id = 1;
	check(create(&hd, sz, &p, 0) == CUDA_SUCCESS, "cuMemCreate on device 1");
	check(xport(&fd, hd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS &&
		  import(&hi, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
		      CUDA_SUCCESS,
	      "exported as an fd and imported");
	check(props(&q, hi) == CUDA_SUCCESS && q.location.id == 1,
	      "the imported fd says device 1 (cuMemGetAllocationPropertiesFromHandle)");
	reserve(&a, sz, 0, 0, 0);
	map(a, sz, 0, hi, 0);
	int *m = (int *)(uintptr_t)a;
	check(launch_on(1, m) == cudaErrorIllegalAddress,
	      "mapped, no cuMemSetAccess yet: even device 1 may not use it");
	CUmemAccessDesc ad = {};
	ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	ad.location.id = 1;
	ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	access(a, sz, &ad, 1);
	check(launch_on(1, m) == cudaSuccess, "access granted to device 1: it runs");
	cudaSetDevice(0);
	cudaDeviceEnablePeerAccess(1, 0);
	check(launch_on(0, m) == cudaErrorIllegalAddress,
	      "device 0 with peer access but no cuMemSetAccess grant: refused");
	ad.location.id = 0;
	access(a, sz, &ad, 1);
	check(launch_on(0, m) == cudaSuccess, "granted to device 0 too: it runs");
	unmap(a, sz);
	close(fd);
}

int main(void)
{
	setenv("SKV_EMU_DEVICES", "2", 1);
	runtime_memory();
	vmm_memory();
	setenv("SKV_EMU_NO_PEER", "1", 1);
	int can = 1;
	cudaDeviceCanAccessPeer(&can, 0, 1);
	cudaSetDevice(1);
	check(can == 0 && cudaDeviceEnablePeerAccess(0, 0) == cudaErrorPeerAccessUnsupported,
	      "SKV_EMU_NO_PEER: no peer access");
	printf("test-emu-devices: %s\n", fails ? "FAILED" : "passed");
	return fails ? 1 : 0;
}
