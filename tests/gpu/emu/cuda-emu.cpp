/* SPDX-License-Identifier: MIT */
/*
 * cuda-emu.cpp - a CPU stand-in for the CUDA runtime and for the execution
 * of kernels, so that the kernels of kernels/cuda can be checked against the
 * host backend where no GPU is (make check on CI).
 *
 * Kernels: blocks run one after another; the threads of a block are
 * coroutines (ucontext) switched only at __syncthreads(), warp intrinsics
 * (real barriers) and __nanosleep(). A persistent launch (SKV_LAUNCH_PERSISTENT)
 * runs all its blocks at once, interleaved, so blocks can wait for each other;
 * cudaOccupancyMaxActiveBlocksPerMultiprocessor says $SKV_EMU_BLOCKS_PER_SM
 * (default 4) on the one emulated SM. A launch in which no thread can make
 * progress (a barrier nobody completes, or every live block spinning for
 * 120 s of virtual time: each pass of spinners alone advances
 * %globaltimer by 1 ms) is reported as a deadlock and aborts; $SKV_EMU_SCHED_SEED shuffles the
 * order in which resident blocks take turns. A launch a GPU would refuse (block or grid size,
 * dynamic shared memory) runs nothing and cudaGetLastError reports it. Fresh "device" memory and
 * shared memory are filled
 * with 0xff bytes (NaN as floats) so reads of unwritten memory show. Runtime: memory calls work on
 * host memory, streams and events complete at once (a test hook, cuda_emu_event_hold(), can hold an
 * event pending). VMM allocations are memfds (exported and imported as real fds, mapped
 * MAP_SHARED), large cudaMalloc buffers are memfds too so that a legacy IPC handle (pid, fd) can be
 * opened through /proc by another process, interprocess events are one memfd word named the same
 * way, and cuStreamWaitValue32 and stream waits on events poll: the two-process test runs unchanged
 * on it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <utility>

#include <vector>

#include <cuda.h>

#include "cuda_runtime.h"

namespace emu
{
struct blk;
struct thr {
	ucontext_t ctx;
	dim3 tid;
	int done;
	int wait; /* 0 runnable, 1 block barrier, 2 warp barrier, 3 spinning (__nanosleep) */
	unsigned gen;
	blk *b;
};
struct warp {
	int arrived;
	unsigned gen;
	uint64_t vals[32];
	uint64_t snap[32];
};
/* A resident block: its threads, warps, shared memory and barrier. */
struct blk {
	dim3 idx;
	std::vector<warp> warps;
	std::vector<unsigned char> smem;
	int live, bar_arrived;
	unsigned bar_gen;
};

static const size_t STACK = 256 * 1024;
/* Blocks of one persistent launch that may run at once (stacks: 256 KiB each thread, lazily). */
static const unsigned MAX_RESIDENT = 16;
static ucontext_t sched;
static std::vector<thr> thrs;
static std::vector<blk> blks;
static char *stacks;
static size_t stacks_n;
static thr *cur;
static const std::function<void()> *body;

const dim3 &thread_idx()
{
	return cur->tid;
}

const dim3 &block_index()
{
	return cur->b->idx;
}

unsigned char *dyn_smem()
{
	return cur->b->smem.data();
}

int blocks_per_sm()
{
	const char *v = getenv("SKV_EMU_BLOCKS_PER_SM");
	int n = v ? atoi(v) : 4;
	return n < 1 ? 1 : n > (int)MAX_RESIDENT ? (int)MAX_RESIDENT : n;
}

static void yield_to_sched()
{
	swapcontext(&cur->ctx, &sched);
}

void syncthreads()
{
	blk &b = *cur->b;
	unsigned g = b.bar_gen;
	if (++b.bar_arrived == b.live) {
		b.bar_arrived = 0;
		b.bar_gen++;
		return;
	}
	cur->wait = 1;
	cur->gen = g;
	yield_to_sched();
	cur->wait = 0;
}

/* virtual time added by passes in which only spinners ran */
static uint64_t slept_ns;

uint64_t globaltimer_ns()
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec + slept_ns;
}

void spin_yield()
{
	cur->wait = 3;
	yield_to_sched();
	cur->wait = 0;
}

void warp_exchange(uint64_t v, uint64_t *all)
{
	warp &w = cur->b->warps[cur->tid.x / 32];
	unsigned g = w.gen;
	w.vals[cur->tid.x % 32] = v;
	if (++w.arrived == 32) {
		w.arrived = 0;
		memcpy(w.snap, w.vals, sizeof(w.snap));
		w.gen++;
	} else {
		cur->wait = 2;
		cur->gen = g;
		yield_to_sched();
		cur->wait = 0;
	}
	memcpy(all, w.snap, sizeof(w.snap));
}

static void entry()
{
	(*body)();
	blk &b = *cur->b;
	cur->done = 1;
	b.live--;
	if (b.bar_arrived > 0 && b.bar_arrived == b.live) {
		b.bar_arrived = 0;
		b.bar_gen++;
	}
	/* returning resumes uc_link: the scheduler */
}

static bool ready(const thr &t)
{
	if (t.done)
		return false;
	if (t.wait == 1)
		return t.b->bar_gen != t.gen;
	if (t.wait == 2)
		return t.b->warps[t.tid.x / 32].gen != t.gen;
	return true; /* runnable, or a spinner polling again */
}

static void stacks_for(size_t n)
{
	if (stacks_n >= n)
		return;
	if (stacks)
		munmap(stacks, stacks_n * STACK);
	stacks = (char *)mmap(NULL, n * STACK, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (stacks == MAP_FAILED) {
		perror("emu: mmap");
		abort();
	}
	stacks_n = n;
}

/* (a function of its own: getcontext() returns twice, keep the callers' loops out of it) */
static __attribute__((noinline)) void init_thread(thr &t, blk *b, unsigned i, char *stack)
{
	t = thr();
	t.tid = dim3(i, 0, 0);
	t.b = b;
	getcontext(&t.ctx);
	t.ctx.uc_stack.ss_sp = stack;
	t.ctx.uc_stack.ss_size = STACK;
	t.ctx.uc_link = &sched;
	makecontext(&t.ctx, entry, 0);
}

static bool spinners_left(unsigned nb, unsigned n)
{
	for (size_t i = 0; i < (size_t)nb * n; i++)
		if (!thrs[i].done && thrs[i].wait == 3)
			return true;
	return false;
}

/*
 * Run blocks blks[0 .. nb) to completion, their threads interleaved. A thread
 * runs until a barrier, a warp intrinsic or a spin (__nanosleep) yields. A
 * pass over every thread in which nothing but spinners ran, each polling
 * again without having done anything else, changes no state but the clock
 * (1 ms of virtual time per such pass): after 120 s of it, or at once when
 * nobody spins, that is a deadlock, reported with the blocks' states.
 */
static void run_resident(unsigned nb, unsigned n, size_t smem_bytes)
{
	for (unsigned bi = 0; bi < nb; bi++) {
		blk &b = blks[bi];
		b.warps.assign(n / 32, warp());
		b.smem.assign(smem_bytes + 16, 0xff);
		b.live = (int)n;
		b.bar_arrived = 0;
		b.bar_gen = 0;
		for (unsigned i = 0; i < n; i++)
			init_thread(thrs[(size_t)bi * n + i], &b, i,
				    stacks + ((size_t)bi * n + i) * STACK);
	}
	/* $SKV_EMU_SCHED_SEED (not 0): blocks take turns in a new random order each pass */
	const char *sv = getenv("SKV_EMU_SCHED_SEED");
	uint64_t seed = sv ? strtoull(sv, NULL, 0) : 0;
	std::vector<unsigned> order(nb);
	for (unsigned bi = 0; bi < nb; bi++)
		order[bi] = bi;
	uint64_t idle_ns = 0;
	for (;;) {
		bool progress = false, all_done = true;
		for (unsigned bi = nb - 1; seed && bi > 0; bi--) {
			seed ^= seed << 13;
			seed ^= seed >> 7;
			seed ^= seed << 17;
			std::swap(order[bi], order[seed % (bi + 1)]);
		}
		for (size_t i = 0; i < (size_t)nb * n; i++) {
			thr &t = thrs[(size_t)order[i / n] * n + i % n];
			if (!t.done)
				all_done = false;
			if (!ready(t))
				continue;
			const bool was_spinning = t.wait == 3;
			cur = &t;
			swapcontext(&sched, &t.ctx);
			if (!(was_spinning && !t.done && t.wait == 3))
				progress = true;
		}
		if (all_done)
			return;
		if (progress) {
			idle_ns = 0;
			continue;
		}
		/*
		 * Only spinners ran: let them sleep 1 ms of virtual time (a
		 * kernel may bound its waits with %globaltimer); after 120 s
		 * of it, or with nobody spinning, nothing will ever change.
		 */
		if (spinners_left(nb, n) && idle_ns < 120000000000ull) {
			slept_ns += 1000000;
			idle_ns += 1000000;
			continue;
		}
		fprintf(stderr,
			"emu: deadlock in a launch of %u resident block(s): no thread can "
			"make progress\n",
			nb);
		for (unsigned bi = 0; bi < nb; bi++) {
			unsigned spin = 0, bar = 0, wbar = 0, done = 0;
			for (unsigned i = 0; i < n; i++) {
				const thr &t = thrs[(size_t)bi * n + i];
				done += t.done != 0;
				spin += !t.done && t.wait == 3;
				bar += !t.done && t.wait == 1;
				wbar += !t.done && t.wait == 2;
			}
			fprintf(stderr,
				"emu:   block (%u,%u,%u): %u spinning in __nanosleep, %u at "
				"__syncthreads, %u at a warp barrier, %u exited\n",
				blks[bi].idx.x, blks[bi].idx.y, blks[bi].idx.z, spin, bar, wbar,
				done);
		}
		abort();
	}
}

static unsigned block_threads(dim3 block)
{
	const unsigned n = block.x * block.y * block.z;
	if (block.y != 1 || block.z != 1 || n % 32) {
		fprintf(stderr, "emu: only 1-D blocks of whole warps\n");
		abort();
	}
	return n;
}

/*
 * The last error of this host thread, as cudaGetLastError reads and clears
 * it: a launch a GPU refuses (no threads or more than 1024 per block, an
 * empty or oversized grid, more dynamic shared memory than sm_90's opt-in
 * 227 KiB) runs no block and leaves its error here, as on a GPU.
 */
thread_local cudaError_t last_error = cudaSuccess;
static bool refused(dim3 grid, dim3 block, size_t smem_bytes)
{
	const unsigned long long n = (unsigned long long)block.x * block.y * block.z;

	if (n == 0 || n > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
	    grid.y > 65535 || grid.z > 65535) {
		last_error = cudaErrorInvalidConfiguration;
		return true;
	}
	if (smem_bytes > SKV_EMU_MAX_DYN_SMEM) {
		last_error = cudaErrorInvalidValue;
		return true;
	}
	return false;
}

/*
 * The scheduler's state (threads, blocks, stacks) is one per process: a launch
 * from another host thread (a second device's worker) waits for the one in
 * progress, as if both devices were busy in turn.
 */
static std::mutex launch_mu;
void launch_ran(); /* "Devices" below: counts the launch on its device */

/* An ordinary launch: blocks one after another (static __shared__ is one per process here). */
void launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &fn)
{
	if (refused(grid, block, smem_bytes))
		return;
	std::lock_guard<std::mutex> one_at_a_time(launch_mu);
	launch_ran();
	const unsigned n = block_threads(block);
	stacks_for(n);
	body = &fn;
	thrs.assign(n, thr());
	blks.assign(1, blk());
	for (unsigned bz = 0; bz < grid.z; bz++)
		for (unsigned by = 0; by < grid.y; by++)
			for (unsigned bx = 0; bx < grid.x; bx++) {
				blks[0].idx = dim3(bx, by, bz);
				run_resident(1, n, smem_bytes);
			}
}

/*
 * A persistent launch: every block of the grid resident at once, as on a GPU
 * when the grid fits its occupancy, so blocks may wait for each other
 * (spinning with __nanosleep). Kernels launched so must use dynamic shared
 * memory only.
 */
void launch_resident(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &fn)
{
	if (refused(grid, block, smem_bytes))
		return;
	std::lock_guard<std::mutex> one_at_a_time(launch_mu);
	launch_ran();
	const unsigned n = block_threads(block), nb = grid.x * grid.y * grid.z;
	if (nb == 0 || nb > MAX_RESIDENT) {
		fprintf(stderr, "emu: a persistent grid of %u blocks (at most %u resident)\n", nb,
			MAX_RESIDENT);
		abort();
	}
	stacks_for((size_t)nb * n);
	body = &fn;
	thrs.assign((size_t)nb * n, thr());
	blks.assign(nb, blk());
	unsigned bi = 0;
	for (unsigned bz = 0; bz < grid.z; bz++)
		for (unsigned by = 0; by < grid.y; by++)
			for (unsigned bx = 0; bx < grid.x; bx++)
				blks[bi++].idx = dim3(bx, by, bz);
	run_resident(nb, n, smem_bytes);
}
} /* namespace emu */

/* ------------------------------------------------------------ devices */

/*
 * Devices. $SKV_EMU_DEVICES (default 1, at most 16) devices, all of them
 * this CPU; each host thread has a current device (cudaSetDevice, 0 at
 * first). What a GPU would tell apart is remembered:
 * - every range of device memory (cudaMalloc, a VMM mapping, an opened IPC
 *   handle) has the device it lives on and the devices that may reach it:
 *   its own and the peers that enabled access (cudaDeviceEnablePeerAccess,
 *   or an IPC handle opened with cudaIpcMemLazyEnablePeerAccess on another
 *   device) for memory of cudaMalloc, the devices cuMemSetAccess granted
 *   for a VMM mapping; host memory reaches every device;
 * - a VMM allocation's memfd is named after its device (emu-vmm-dN), so an
 *   exported fd still says where it lives (cuMemGetAllocationPropertiesFromHandle)
 *   and an IPC memory handle carries its device (cuPointerGetAttribute of
 *   the opened pointer answers it);
 * - a stream belongs to the device current at its creation.
 * A launch runs on the current device: on a stream of another device, or
 * naming (in the bytes of its arguments) device memory that device cannot
 * reach, it runs no block and leaves cudaErrorInvalidResourceHandle /
 * cudaErrorIllegalAddress for cudaGetLastError, with a line on stderr (a
 * GPU would fault in the kernel). Peer access is possible between every two
 * devices unless $SKV_EMU_NO_PEER is set. Each launch is counted on its
 * device (cuda_emu_launches()) and, with $SKV_EMU_LAUNCH_LOG set, appended
 * to that file as "pid P device D" (tests of a daemon in another process).
 */
namespace emu
{
static const int MAX_DEVICES = 16;

int device_count()
{
	const char *v = getenv("SKV_EMU_DEVICES");
	int n = v ? atoi(v) : 1;
	return n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

static bool device_valid(int d)
{
	return d >= 0 && d < device_count();
}

thread_local int cur_device = 0;

struct dev_range {
	size_t size;
	int dev;
	unsigned reach; /* devices granted access besides its own (bit d) */
	bool vmm;	/* a VMM mapping: only cuMemSetAccess grants access */
};
static std::mutex dev_mu; /* the ranges, peer access, the counters */
static std::map<uintptr_t, dev_range> dev_ranges;
static bool peer_on[MAX_DEVICES][MAX_DEVICES]; /* [from][to] */
static unsigned long long dev_launches[MAX_DEVICES];
static int launch_log = -2; /* -2: not opened yet; -1: none */

void range_add(const void *p, size_t n, int dev, unsigned reach, bool vmm)
{
	std::lock_guard<std::mutex> g(dev_mu);
	dev_ranges[(uintptr_t)p] = dev_range{n, dev, reach, vmm};
}

void range_del(const void *p)
{
	std::lock_guard<std::mutex> g(dev_mu);
	dev_ranges.erase((uintptr_t)p);
}

/* dev_mu held: the range holding address a, or NULL */
static const dev_range *range_at(uintptr_t a, uintptr_t *base)
{
	auto it = dev_ranges.upper_bound(a);
	if (it == dev_ranges.begin())
		return NULL;
	--it;
	if (a >= it->first + it->second.size)
		return NULL;
	if (base)
		*base = it->first;
	return &it->second;
}

/* cuMemSetAccess: the devices of the descriptors may reach [p, p + n) */
bool range_grant(uintptr_t p, size_t n, const CUmemAccessDesc *d, size_t count)
{
	std::lock_guard<std::mutex> g(dev_mu);
	auto it = dev_ranges.find(p);
	if (it == dev_ranges.end() || it->second.size != n)
		return false;
	for (size_t i = 0; i < count; i++) {
		if (!device_valid(d[i].location.id))
			return false;
		if (d[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE)
			it->second.reach &= ~(1u << d[i].location.id);
		else
			it->second.reach |= 1u << d[i].location.id;
	}
	return true;
}

/* The device of device memory at a; -1 for host memory. */
int range_device(uintptr_t a)
{
	std::lock_guard<std::mutex> g(dev_mu);
	const dev_range *r = range_at(a, NULL);
	return r ? r->dev : -1;
}

/* dev_mu held */
static bool reaches(int from, const dev_range &r)
{
	if (r.reach & (1u << from))
		return true;
	if (r.vmm)
		return false; /* a VMM mapping nobody granted this device */
	return r.dev == from || peer_on[from][r.dev];
}

/* streams: a word of the device they belong to after a magic word */
static const uint32_t STREAM_MAGIC = 0x454d5553u; /* "EMUS" */

int stream_device(const void *s)
{
	const uint32_t *w = (const uint32_t *)s;
	return w && w[0] == STREAM_MAGIC ? (int)w[1] : -1;
}

bool launch_device_ok(const void *stream, const std::vector<arg_span> &args)
{
	const int d = cur_device, sd = stream_device(stream);

	if (sd >= 0 && sd != d) {
		fprintf(stderr, "emu: a launch on device %d into a stream of device %d\n", d, sd);
		last_error = cudaErrorInvalidResourceHandle;
		return false;
	}
	std::lock_guard<std::mutex> g(dev_mu);
	for (const arg_span &a : args)
		for (size_t off = 0; off + sizeof(uintptr_t) <= a.n; off += sizeof(uintptr_t)) {
			uintptr_t w, base = 0;
			memcpy(&w, (const char *)a.p + off, sizeof(w));
			const dev_range *r = range_at(w, &base);
			if (!r || reaches(d, *r))
				continue;
			fprintf(stderr,
				"emu: a kernel on device %d names %p, memory of device %d it has "
				"no access to (%s)\n",
				d, (void *)w, r->dev,
				r->vmm ? "cuMemSetAccess did not grant it" : "no peer access");
			last_error = cudaErrorIllegalAddress;
			return false;
		}
	return true;
}

void launch_ran()
{
	std::lock_guard<std::mutex> g(dev_mu);
	dev_launches[cur_device]++;
	if (launch_log == -2) {
		const char *p = getenv("SKV_EMU_LAUNCH_LOG");
		launch_log =
		    p && *p ? open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
	}
	if (launch_log >= 0) {
		char line[64];
		int n =
		    snprintf(line, sizeof(line), "pid %d device %d\n", (int)getpid(), cur_device);
		(void)!write(launch_log, line, (size_t)n);
	}
}

/* The device a memfd of this emulator was made for: its name's "-dN" (0 without). */
int memfd_device(int fd)
{
	char path[64], link[128];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t k = readlink(path, link, sizeof(link) - 1);
	if (k < 0)
		return -1;
	link[k] = 0;
	const char *m = strstr(link, "-d");
	return m ? atoi(m + 2) : 0;
}
} /* namespace emu */

extern "C" {
cudaError_t CUDARTAPI cudaGetDeviceCount(int *n)
{
	*n = emu::device_count();
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaSetDevice(int d)
{
	if (!emu::device_valid(d))
		return cudaErrorInvalidDevice;
	emu::cur_device = d;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDevice(int *d)
{
	*d = emu::cur_device;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int *can, int d, int peer)
{
	if (!emu::device_valid(d) || !emu::device_valid(peer))
		return cudaErrorInvalidDevice;
	*can = d != peer && !getenv("SKV_EMU_NO_PEER");
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int peer, unsigned int)
{
	const int d = emu::cur_device;
	if (!emu::device_valid(peer) || peer == d)
		return cudaErrorInvalidDevice;
	if (getenv("SKV_EMU_NO_PEER"))
		return cudaErrorPeerAccessUnsupported;
	std::lock_guard<std::mutex> g(emu::dev_mu);
	if (emu::peer_on[d][peer])
		return cudaErrorPeerAccessAlreadyEnabled;
	emu::peer_on[d][peer] = true;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceDisablePeerAccess(int peer)
{
	const int d = emu::cur_device;
	if (!emu::device_valid(peer) || peer == d)
		return cudaErrorInvalidDevice;
	std::lock_guard<std::mutex> g(emu::dev_mu);
	if (!emu::peer_on[d][peer])
		return cudaErrorPeerAccessNotEnabled;
	emu::peer_on[d][peer] = false;
	return cudaSuccess;
}
/* Launches that ran on device d in this process (test hook, emulator only). */
unsigned long long cuda_emu_launches(int d)
{
	if (d < 0 || d >= emu::MAX_DEVICES)
		return 0;
	std::lock_guard<std::mutex> g(emu::dev_mu);
	return emu::dev_launches[d];
}
} /* extern "C" */

/* ------------------------------------------------------------- driver */

static CUresult CUDAAPI emu_cuGetErrorName(CUresult, const char **s)
{
	*s = "CUDA_ERROR (emulator)";
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuDeviceGet(CUdevice *d, int o)
{
	if (!emu::device_valid(o))
		return CUDA_ERROR_INVALID_DEVICE;
	*d = o;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice)
{
	*v = a == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuStreamWaitValue32(CUstream, CUdeviceptr addr, cuuint32_t value,
						unsigned int)
{
	/* streams run at once here, so the wait happens now: poll for up to 60 s */
	for (int i = 0; i < 60000; i++) {
		if (__atomic_load_n((uint32_t *)(uintptr_t)addr, __ATOMIC_ACQUIRE) >= value)
			return CUDA_SUCCESS;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return CUDA_ERROR_NOT_READY;
}

/* VMM: a generic allocation handle is a memfd (an fd of this process, + 1) */
static const size_t EMU_GRANULARITY = 2u << 20;
static CUresult CUDAAPI emu_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *,
							  CUmemAllocationGranularity_flags)
{
	*g = EMU_GRANULARITY;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
					const CUmemAllocationProp *prop, unsigned long long)
{
	char name[32];

	if (size == 0 || size % EMU_GRANULARITY)
		return CUDA_ERROR_INVALID_VALUE;
	if (!emu::device_valid(prop->location.id))
		return CUDA_ERROR_INVALID_DEVICE;
	/* the name says the device, also to a process the fd is exported to */
	snprintf(name, sizeof(name), "emu-vmm-d%d", prop->location.id);
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*h = (CUmemGenericAllocationHandle)fd + 1;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuMemRelease(CUmemGenericAllocationHandle h)
{
	return close((int)(h - 1)) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static CUresult CUDAAPI emu_cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t, CUdeviceptr,
						unsigned long long)
{
	void *a = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (a == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = (CUdeviceptr)(uintptr_t)a;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuMemAddressFree(CUdeviceptr p, size_t size)
{
	return munmap((void *)(uintptr_t)p, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static CUresult CUDAAPI emu_cuMemMap(CUdeviceptr p, size_t size, size_t off,
				     CUmemGenericAllocationHandle h, unsigned long long)
{
	struct stat st;
	int fd = (int)(h - 1);
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < off + size)
		return CUDA_ERROR_INVALID_VALUE;
	void *a = mmap((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
		       fd, (off_t)off);
	if (a == MAP_FAILED)
		return CUDA_ERROR_INVALID_VALUE;
	emu::range_add(a, size, emu::memfd_device(fd), 0, true); /* no access until granted */
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuMemUnmap(CUdeviceptr p, size_t size)
{
	void *a = mmap((void *)(uintptr_t)p, size, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	if (a == MAP_FAILED)
		return CUDA_ERROR_INVALID_VALUE;
	emu::range_del(a);
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d,
					   size_t count)
{
	return emu::range_grant((uintptr_t)p, size, d, count) ? CUDA_SUCCESS
							      : CUDA_ERROR_INVALID_VALUE;
}
static CUresult CUDAAPI emu_cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
								   CUmemGenericAllocationHandle h)
{
	int dev = emu::memfd_device((int)(h - 1));
	if (dev < 0)
		return CUDA_ERROR_INVALID_VALUE;
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
	prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
	int dev = emu::range_device((uintptr_t)p);
	if (a != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (dev < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*(int *)data = dev;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
							 CUmemAllocationHandleType,
							 unsigned long long)
{
	int fd = fcntl((int)(h - 1), F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h,
							   void *osh, CUmemAllocationHandleType)
{
	int fd = fcntl((int)(intptr_t)osh, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*h = (CUmemGenericAllocationHandle)fd + 1;
	return CUDA_SUCCESS;
}

/* cudaMalloc buffers: memfd-backed from 64 KiB on, so IPC handles can name them */
struct emu_buf {
	size_t size;
	int fd; /* -1: plain malloc */
};
static std::map<uintptr_t, emu_buf> emu_bufs;
static std::mutex emu_bufs_mu; /* workers of several devices allocate at once */
struct emu_ipc_handle {
	uint32_t magic, pid;
	int32_t fd;
	uint32_t pad;
	uint64_t size, offset;
};

static CUresult CUDAAPI emu_cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	std::lock_guard<std::mutex> g(emu_bufs_mu);
	auto it = emu_bufs.upper_bound((uintptr_t)p);
	if (it == emu_bufs.begin())
		return CUDA_ERROR_INVALID_VALUE;
	--it;
	if ((uintptr_t)p >= it->first + it->second.size)
		return CUDA_ERROR_INVALID_VALUE;
	*base = it->first;
	*size = it->second.size;
	return CUDA_SUCCESS;
}
static CUresult CUDAAPI emu_cuNotSupported()
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

extern "C" {

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned int,
						       unsigned long long,
						       cudaDriverEntryPointQueryResult *q)
{
	static const struct {
		const char *name;
		void *fn;
	} tab[] = {
	    {"cuGetErrorName", (void *)emu_cuGetErrorName},
	    {"cuDeviceGet", (void *)emu_cuDeviceGet},
	    {"cuDeviceGetAttribute", (void *)emu_cuDeviceGetAttribute},
	    {"cuStreamWaitValue32", (void *)emu_cuStreamWaitValue32},
	    {"cuMemGetAllocationGranularity", (void *)emu_cuMemGetAllocationGranularity},
	    {"cuMemCreate", (void *)emu_cuMemCreate},
	    {"cuMemRelease", (void *)emu_cuMemRelease},
	    {"cuMemAddressReserve", (void *)emu_cuMemAddressReserve},
	    {"cuMemAddressFree", (void *)emu_cuMemAddressFree},
	    {"cuMemMap", (void *)emu_cuMemMap},
	    {"cuMemUnmap", (void *)emu_cuMemUnmap},
	    {"cuMemSetAccess", (void *)emu_cuMemSetAccess},
	    {"cuMemExportToShareableHandle", (void *)emu_cuMemExportToShareableHandle},
	    {"cuMemImportFromShareableHandle", (void *)emu_cuMemImportFromShareableHandle},
	    {"cuMemGetAddressRange", (void *)emu_cuMemGetAddressRange},
	    {"cuMemGetAllocationPropertiesFromHandle",
	     (void *)emu_cuMemGetAllocationPropertiesFromHandle},
	    {"cuPointerGetAttribute", (void *)emu_cuPointerGetAttribute},
	};
	*fn = (void *)emu_cuNotSupported;
	for (const auto &t : tab)
		if (!strcmp(sym, t.name))
			*fn = t.fn;
	if (q)
		*q = cudaDriverEntryPointSuccess;
	return cudaSuccess;
}

const char *CUDARTAPI cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "no error";
	case cudaErrorNotReady:
		return "device not ready";
	case cudaErrorInvalidResourceHandle:
		return "invalid resource handle";
	case cudaErrorInvalidConfiguration:
		return "invalid configuration argument";
	case cudaErrorInvalidValue:
		return "invalid argument";
	default:
		return "error (CUDA emulator)";
	}
}
const char *CUDARTAPI cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return "cudaSuccess";
	case cudaErrorNotReady:
		return "cudaErrorNotReady";
	case cudaErrorInvalidResourceHandle:
		return "cudaErrorInvalidResourceHandle";
	case cudaErrorInvalidConfiguration:
		return "cudaErrorInvalidConfiguration";
	case cudaErrorInvalidValue:
		return "cudaErrorInvalidValue";
	default:
		return "cudaErrorEmulator";
	}
}
cudaError_t CUDARTAPI cudaGetLastError(void)
{
	cudaError_t e = emu::last_error;

	emu::last_error = cudaSuccess;
	return e;
}
cudaError_t CUDARTAPI cudaDeviceSynchronize(void)
{
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
	if (!emu::device_valid(d))
		return cudaErrorInvalidDevice;
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "CUDA CPU emulator");
	p->major = 9;
	p->minor = 0;
	p->multiProcessorCount = 1;
	p->totalGlobalMem = 1ull << 30;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr, int)
{
	*v = 0;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDriverGetVersion(int *v)
{
	*v = 13000;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *v)
{
	*v = 13000;
	return cudaSuccess;
}

static void *dev_alloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (p)
		memset(p, 0xff, n); /* NaN: unwritten memory shows */
	return p;
}
cudaError_t CUDARTAPI cudaMalloc(void **p, size_t n)
{
	if (n < (64u << 10)) {
		*p = dev_alloc(n);
		if (!*p)
			return cudaErrorMemoryAllocation;
		std::lock_guard<std::mutex> g(emu_bufs_mu);
		emu_bufs[(uintptr_t)*p] = emu_buf{n, -1};
		emu::range_add(*p, n ? n : 1, emu::cur_device, 0, false);
		return cudaSuccess;
	}
	int fd = memfd_create("emu-malloc", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)n) < 0)
		return cudaErrorMemoryAllocation;
	void *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (a == MAP_FAILED) {
		close(fd);
		return cudaErrorMemoryAllocation;
	}
	memset(a, 0xff, n);
	std::lock_guard<std::mutex> g(emu_bufs_mu);
	emu_bufs[(uintptr_t)a] = emu_buf{n, fd};
	emu::range_add(a, n, emu::cur_device, 0, false);
	*p = a;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaFree(void *p)
{
	std::lock_guard<std::mutex> g(emu_bufs_mu);
	auto it = emu_bufs.find((uintptr_t)p);
	if (it == emu_bufs.end())
		return p ? cudaErrorInvalidValue : cudaSuccess;
	if (it->second.fd < 0) {
		free(p);
	} else {
		munmap(p, it->second.size);
		close(it->second.fd);
	}
	emu_bufs.erase(it);
	emu::range_del(p);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMallocHost(void **p, size_t n)
{
	*p = dev_alloc(n);
	return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t CUDARTAPI cudaFreeHost(void *p)
{
	free(p);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMallocAsync(void **p, size_t n, cudaStream_t)
{
	return cudaMalloc(p, n);
}
cudaError_t CUDARTAPI cudaFreeAsync(void *p, cudaStream_t)
{
	return cudaFree(p);
}
/*
 * A copy between overlapping ranges is undefined in CUDA (the device copies
 * in whatever order its engines take): here it aborts, so that a caller
 * relying on memmove order is caught on the emulator, where memcpy would
 * often happen to work.
 */
static void emu_no_overlap(const char *what, const void *d, size_t dspan, const void *s,
			   size_t sspan)
{
	if (!dspan || !sspan)
		return;
	if ((uintptr_t)d < (uintptr_t)s + sspan && (uintptr_t)s < (uintptr_t)d + dspan) {
		fprintf(stderr, "emu: %s between overlapping ranges (dst %p + %zu, src %p + %zu)\n",
			what, d, dspan, s, sspan);
		abort();
	}
}
/*
 * A copy's kind against where its pointers live: device memory is what
 * cudaMalloc, a VMM mapping or an opened IPC handle made, anything else is
 * host memory. On a GPU a kind that does not match is undefined (a fault,
 * or bytes from the wrong place); here it aborts naming the copy, as an
 * overlap does. cudaMemcpyDefault (UVA) takes any pair.
 */
static void emu_copy_kind(const char *what, const void *d, const void *s, enum cudaMemcpyKind k)
{
	static const char *const names[] = {"HostToHost", "HostToDevice", "DeviceToHost",
					    "DeviceToDevice"};

	if (k == cudaMemcpyDefault)
		return;
	if ((unsigned)k > cudaMemcpyDeviceToDevice) {
		fprintf(stderr, "emu: %s with an unknown kind %d\n", what, (int)k);
		abort();
	}
	bool dd = emu::range_device((uintptr_t)d) >= 0, sd = emu::range_device((uintptr_t)s) >= 0;
	bool want_dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
	bool want_sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
	if (dd != want_dd || sd != want_sd) {
		fprintf(stderr,
			"emu: %s as cudaMemcpy%s, but dst %p is %s memory and src %p is %s "
			"memory\n",
			what, names[k], d, dd ? "device" : "host", s, sd ? "device" : "host");
		abort();
	}
}
cudaError_t CUDARTAPI cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
	emu_no_overlap("cudaMemcpy", d, n, s, n);
	if (n)
		emu_copy_kind("cudaMemcpy", d, s, k);
	memcpy(d, s, n);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
				      cudaStream_t)
{
	emu_no_overlap("cudaMemcpyAsync", d, n, s, n);
	if (n)
		emu_copy_kind("cudaMemcpyAsync", d, s, k);
	memcpy(d, s, n);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemcpy2DAsync(void *d, size_t dpitch, const void *s, size_t spitch,
					size_t width, size_t height, enum cudaMemcpyKind k,
					cudaStream_t)
{
	if (height > 1 && (dpitch < width || spitch < width))
		return cudaErrorInvalidPitchValue;
	/* a failing copy on demand: the daemon's error path of a GPU GROW */
	if (getenv("SKV_EMU_FAIL_COPY2D"))
		return cudaErrorInvalidValue;
	if (width && height) {
		emu_no_overlap("cudaMemcpy2DAsync", d, (height - 1) * dpitch + width, s,
			       (height - 1) * spitch + width);
		emu_copy_kind("cudaMemcpy2DAsync", d, s, k);
	}
	for (size_t y = 0; y < height; y++)
		memcpy((char *)d + y * dpitch, (const char *)s + y * spitch, width);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemset(void *d, int v, size_t n)
{
	memset(d, v, n);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t)
{
	memset(d, v, n);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int)
{
	uint32_t *w = (uint32_t *)dev_alloc(64);
	if (!w)
		return cudaErrorMemoryAllocation;
	w[0] = emu::STREAM_MAGIC; /* the device it belongs to (launches check it) */
	w[1] = (uint32_t)emu::cur_device;
	*s = (cudaStream_t)w;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t s)
{
	free((void *)s);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t)
{
	return cudaSuccess;
}
/*
 * Events: a completion word (1 complete, 0 pending). Interprocess events
 * keep it in a one-page memfd, so that a handle (pid, fd) opened through
 * /proc by another process sees the same word. Streams run at once here, so
 * cudaEventRecord completes the event at once, unless the test hook
 * cuda_emu_event_hold() left it pending for the engine to complete later.
 */
struct emu_event {
	uint32_t magic;
	int fd;		/* memfd of an interprocess event; -1 otherwise */
	uint32_t *word; /* 1 complete, 0 pending */
	uint32_t local; /* the word of a process-local event */
	bool opened;	/* opened from a handle (not the creator's) */
	bool hold;	/* records leave it pending (cuda_emu_event_hold) */
};
static const uint32_t EMU_EVENT_MAGIC = 0x454d5545u; /* "EMUE" */
struct emu_ipc_event_handle {
	uint32_t magic, pid;
	int32_t fd;
};
static emu_event *emu_ev(cudaEvent_t e)
{
	emu_event *v = (emu_event *)e;
	return v && v->magic == EMU_EVENT_MAGIC ? v : NULL;
}
static bool emu_ev_done(const emu_event *v)
{
	return __atomic_load_n(v->word, __ATOMIC_ACQUIRE) != 0;
}
/* a stream (or the host) waiting on an event: it runs now, so poll up to 60 s */
static cudaError_t emu_ev_wait(cudaEvent_t e)
{
	emu_event *v = emu_ev(e);
	if (!v)
		return cudaErrorInvalidResourceHandle;
	for (int i = 0; i < 60000 && !emu_ev_done(v); i++) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return emu_ev_done(v) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned int)
{
	return emu_ev_wait(e);
}
cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
	emu_event *v = (emu_event *)calloc(1, sizeof(*v));
	if (!v)
		return cudaErrorMemoryAllocation;
	v->magic = EMU_EVENT_MAGIC;
	v->fd = -1;
	v->word = &v->local;
	if (flags & cudaEventInterprocess) {
		void *a = MAP_FAILED;
		v->fd = memfd_create("emu-event", MFD_CLOEXEC);
		if (v->fd >= 0 && ftruncate(v->fd, 4096) == 0)
			a = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
		if (a == MAP_FAILED) {
			if (v->fd >= 0)
				close(v->fd);
			free(v);
			return cudaErrorMemoryAllocation;
		}
		v->word = (uint32_t *)a;
	}
	*v->word = 1; /* never recorded: complete, as in CUDA */
	*e = (cudaEvent_t)v;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t *e)
{
	return cudaEventCreateWithFlags(e, 0);
}
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t e)
{
	emu_event *v = emu_ev(e);
	if (!v)
		return cudaErrorInvalidResourceHandle;
	if (v->fd >= 0) {
		munmap(v->word, 4096);
		close(v->fd);
	}
	v->magic = 0;
	free(v);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t e, cudaStream_t)
{
	emu_event *v = emu_ev(e);
	if (!v)
		return cudaErrorInvalidResourceHandle;
	__atomic_store_n(v->word, v->hold ? 0u : 1u, __ATOMIC_RELEASE);
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t e)
{
	return emu_ev_wait(e);
}
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t e)
{
	emu_event *v = emu_ev(e);
	if (!v)
		return cudaErrorInvalidResourceHandle;
	return emu_ev_done(v) ? cudaSuccess : cudaErrorNotReady;
}
/*
 * Test hook (emulator only; gpu-engine finds it through a weak reference):
 * hold 1: from now on cudaEventRecord leaves the event pending, as if the
 * recorded work were still running; hold 0: that work completes now, and
 * later records complete at once again.
 */
int cuda_emu_event_hold(cudaEvent_t e, int hold)
{
	emu_event *v = emu_ev(e);
	if (!v)
		return -1;
	v->hold = hold != 0;
	if (!hold)
		__atomic_store_n(v->word, 1u, __ATOMIC_RELEASE);
	return 0;
}
cudaError_t CUDARTAPI cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t)
{
	*ms = 0;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t *p, int)
{
	*p = (cudaMemPool_t)1;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t, enum cudaMemPoolAttr, void *)
{
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
	CUdeviceptr base;
	size_t size;
	if (emu_cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
		return cudaErrorInvalidValue;
	int fd;
	{
		std::lock_guard<std::mutex> g(emu_bufs_mu);
		fd = emu_bufs[(uintptr_t)base].fd;
	}
	if (fd < 0)
		return cudaErrorNotSupported; /* small buffers are plain malloc here */
	/* pad: the device the memory lives on */
	emu_ipc_handle e = {0x454d5531u, (uint32_t)getpid(),
			    fd,		 (uint32_t)emu::range_device(base),
			    size,	 (uint64_t)((uintptr_t)p - base)};
	static_assert(sizeof(e) <= sizeof(*h), "handle size");
	memset(h, 0, sizeof(*h));
	memcpy(h, &e, sizeof(e));
	return cudaSuccess;
}
/*
 * Open (pid, fd) of a handle: only a memfd this emulator made (named
 * `name`) of at least `bytes` bytes. CUDA validates its handles; so must
 * the emulator, or a byte-flipped handle would map another process's file
 * (a daemon that writes a released prefill flag would write into it) or a
 * range past the memfd's end (SIGBUS on the first read): -1 then.
 */
static int emu_open_handle_fd(uint32_t pid, int32_t hfd, const char *name, uint64_t bytes)
{
	char path[64], link[64];
	struct stat st;
	size_t n = strlen(name);

	snprintf(path, sizeof(path), "/proc/%u/fd/%d", pid, hfd);
	ssize_t k = readlink(path, link, sizeof(link) - 1);
	if (k < (ssize_t)n || memcmp(link, name, n) != 0)
		return -1;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < bytes) {
		close(fd);
		return -1;
	}
	return fd;
}
cudaError_t CUDARTAPI cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags)
{
	emu_ipc_handle e;
	memcpy(&e, &h, sizeof(e));
	if (e.magic != 0x454d5531u || e.size == 0 || e.offset >= e.size ||
	    !emu::device_valid((int)e.pad))
		return cudaErrorInvalidValue;
	int fd = emu_open_handle_fd(e.pid, e.fd, "/memfd:emu-malloc", e.size);
	if (fd < 0)
		return cudaErrorInvalidValue;
	void *a = mmap(NULL, e.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (a == MAP_FAILED) {
		close(fd);
		return cudaErrorMemoryAllocation;
	}
	std::lock_guard<std::mutex> g(emu_bufs_mu);
	emu_bufs[(uintptr_t)a] = emu_buf{e.size, fd};
	/* opened on another device: that device reaches it only through the
	 * peer access the lazy flag enables */
	const int owner = (int)e.pad, me = emu::cur_device;
	emu::range_add(a, e.size, owner,
		       owner != me && (flags & cudaIpcMemLazyEnablePeerAccess) &&
			       !getenv("SKV_EMU_NO_PEER")
			   ? 1u << me
			   : 0,
		       false);
	*p = (char *)a + e.offset;
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaIpcCloseMemHandle(void *p)
{
	CUdeviceptr base;
	size_t size;
	if (emu_cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
		return cudaErrorInvalidValue;
	return cudaFree((void *)(uintptr_t)base);
}
/* host memory is device memory here */
cudaError_t CUDARTAPI cudaHostRegister(void *, size_t, unsigned int)
{
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaHostUnregister(void *)
{
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaHostGetDevicePointer(void **d, void *h, unsigned int)
{
	*d = h;
	return cudaSuccess;
}
/* an interprocess event's handle names its memfd, like a legacy memory handle */
cudaError_t CUDARTAPI cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e)
{
	emu_event *v = emu_ev(e);
	if (!v || v->fd < 0 || v->opened)
		return cudaErrorInvalidResourceHandle; /* not cudaEventInterprocess */
	emu_ipc_event_handle eh = {EMU_EVENT_MAGIC, (uint32_t)getpid(), v->fd};
	static_assert(sizeof(eh) <= sizeof(*h), "handle size");
	memset(h, 0, sizeof(*h));
	memcpy(h, &eh, sizeof(eh));
	return cudaSuccess;
}
cudaError_t CUDARTAPI cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h)
{
	emu_ipc_event_handle eh;
	memcpy(&eh, &h, sizeof(eh));
	if (eh.magic != EMU_EVENT_MAGIC)
		return cudaErrorInvalidResourceHandle;
	int fd = emu_open_handle_fd(eh.pid, eh.fd, "/memfd:emu-event", 4096);
	if (fd < 0)
		return cudaErrorInvalidResourceHandle;
	void *a = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	emu_event *v = (emu_event *)calloc(1, sizeof(*v));
	if (a == MAP_FAILED || !v) {
		if (a != MAP_FAILED)
			munmap(a, 4096);
		close(fd);
		free(v);
		return cudaErrorMemoryAllocation;
	}
	v->magic = EMU_EVENT_MAGIC;
	v->fd = fd;
	v->word = (uint32_t *)a;
	v->opened = true;
	*e = (cudaEvent_t)v;
	return cudaSuccess;
}

} /* extern "C" */
