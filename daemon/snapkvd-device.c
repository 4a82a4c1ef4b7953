// SPDX-License-Identifier: MIT
/*
 * snapkvd-device.c - the GPU and what lives on it; see snapkvd-device.h.
 */
#include "snapkvd-device.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/skv-backend.h"
#include "kernels/cuda/skv-cuda.h"
#include "snapkvd-cleanup.h"
#include "snapkvd-clock.h"
#include "snapkvd-config.h"
#include "snapkvd-log.h"

_Static_assert(SNAPKVD_DEVICES_MAX == SNAPKVD_CONFIG_MAX_DEVICES, "the config's devices list");

/* One opened device: the plugin loaded with a context on it. */
struct gpu {
	struct skv_backend *be;
	int ordinal;
	char name[300];		  /* "NAME sm_XY" */
	unsigned imports, arenas; /* loop thread */
	uint64_t import_bytes, arena_bytes;
	atomic_uint_fast64_t jobs;
};

struct snapkvd_device {
	char backend[16];
	char desc[1024];
	struct gpu gpus[SNAPKVD_DEVICES_MAX];
	unsigned n_gpus;		   /* 0: no device (host backend) */
	const struct skv_backend_ops *ops; /* the plugin's (every device's) */
	unsigned imports;		   /* live imports (loop thread) */
	atomic_bool stopping;
	/* the thread that releases prefill waits past their deadline (its own
	 * thread: the loop thread may block in a device-wide synchronisation,
	 * e.g. releasing an import, behind the very wait) */
	pthread_mutex_t mu;
	pthread_cond_t wcond; /* CLOCK_MONOTONIC */
	pthread_t waiter;
	bool waiter_started, waiter_stop;
	struct snapkvd_device_wait *waits; /* under mu */
};

static const struct skv_backend_ops *ops_of(const struct snapkvd_device *d)
{
	return d->ops;
}

static struct skv_cuda_dev *dev_of(const struct snapkvd_device *d, unsigned gpu)
{
	return d->gpus[gpu].be->dev;
}

/* ------------------------------------------------------------ the waiter */

/*
 * The deadline bounds the wait, not the kernels queued behind it: a flag
 * the engine reached in time is neither failed -ETIMEDOUT nor overwritten
 * (an engine's counter may be past the value by now). Under d->mu, so the
 * worker cannot drop the buffer meanwhile.
 */
static void release_wait(struct snapkvd_device *d, struct snapkvd_device_wait *w)
{
	struct skv_error kerr = {{0}, -1, -1};
	uint32_t v = 0;
	int r;

	if (ops_of(d)->read_value(dev_of(d, w->gpu), w->flag, &v, &kerr) == 0 && v >= w->value) {
		w->met = true;
		return;
	}
	w->fired = true;
	r = ops_of(d)->signal_value(dev_of(d, w->gpu), w->flag, w->value, &kerr);
	if (r < 0)
		log_error_errno(r, "prefill wait: could not release the stream: %s", kerr.msg);
	else if (!w->stopped)
		log_warning("prefill wait: engine did not signal in time; stream released");
}

/*
 * An engine that never sets its flag must not hold a worker forever: at the
 * deadline the flag gets the value from here, the stream runs on and the job
 * fails with -ETIMEDOUT.
 */
static void *waiter(void *arg)
{
	struct snapkvd_device *d = arg;

	pthread_mutex_lock(&d->mu);
	while (!d->waiter_stop) {
		uint64_t now = snapkvd_now_ns(), next = UINT64_MAX;

		for (struct snapkvd_device_wait *w = d->waits; w; w = w->next) {
			if (!w->flag || w->fired || w->met)
				continue;
			if (w->stop && w->stop(w->stop_arg))
				w->stopped = true; /* cancelled: released now */
			if (now < w->deadline && !w->stopped)
				next = w->deadline < next ? w->deadline : next;
			else
				release_wait(d, w);
		}
		if (next == UINT64_MAX) {
			pthread_cond_wait(&d->wcond, &d->mu);
		} else {
			struct timespec ts = {(time_t)(next / 1000000000u),
					      (long)(next % 1000000000u)};

			pthread_cond_timedwait(&d->wcond, &d->mu, &ts);
		}
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

void snapkvd_device_wait_add(struct snapkvd_device *d, struct snapkvd_device_wait *w)
{
	pthread_mutex_lock(&d->mu);
	w->next = d->waits;
	d->waits = w;
	pthread_mutex_unlock(&d->mu);
}

void snapkvd_device_wait_remove(struct snapkvd_device *d, struct snapkvd_device_wait *w)
{
	pthread_mutex_lock(&d->mu);
	for (struct snapkvd_device_wait **pp = &d->waits; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	pthread_mutex_unlock(&d->mu);
}

void snapkvd_device_wait_arm(struct snapkvd_device *d, struct snapkvd_device_wait *w, void *flag,
			     uint32_t value, uint64_t deadline)
{
	pthread_mutex_lock(&d->mu);
	w->flag = flag;
	w->value = value;
	w->deadline = deadline;
	w->fired = false;
	w->met = false;
	w->stopped = false;
	pthread_cond_signal(&d->wcond);
	pthread_mutex_unlock(&d->mu);
}

void snapkvd_device_wait_poke(struct snapkvd_device *d)
{
	if (!d || !d->waiter_started)
		return;
	pthread_mutex_lock(&d->mu);
	pthread_cond_broadcast(&d->wcond);
	pthread_mutex_unlock(&d->mu);
}

bool snapkvd_device_wait_disarm(struct snapkvd_device *d, struct snapkvd_device_wait *w)
{
	bool fired;

	pthread_mutex_lock(&d->mu);
	fired = w->fired;
	w->flag = NULL;
	pthread_mutex_unlock(&d->mu);
	return fired;
}

/* ------------------------------------------------------------- lifecycle */

/* After the workers: one may still wait on a flag only the waiter releases
 * (at its deadline, so shutdown takes at most prefill_wait_max_ms more). */
void snapkvd_device_free(struct snapkvd_device *d)
{
	if (!d)
		return;
	if (d->waiter_started) {
		pthread_mutex_lock(&d->mu);
		d->waiter_stop = true;
		pthread_cond_broadcast(&d->wcond);
		pthread_mutex_unlock(&d->mu);
		pthread_join(d->waiter, NULL);
	}
	for (unsigned i = 0; i < d->n_gpus; i++)
		skv_backend_unload(d->gpus[i].be);
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->wcond);
	free(d);
}

static void device_freep(struct snapkvd_device **d)
{
	snapkvd_device_free(*d);
}

/* kerr->msg prefixed with what failed */
static void prefix_msg(struct skv_error *kerr, const char *what)
{
	char m[sizeof(kerr->msg)];

	snprintf(m, sizeof(m), "%s", kerr->msg);
	snprintf(kerr->msg, sizeof(kerr->msg), "%s%.*s", what,
		 (int)sizeof(m) - (int)strlen(what) - 1, m);
}

/* The plugin loaded with a context on CUDA device `ordinal`, described. */
static int gpu_open(struct snapkvd_device *d, int ordinal, struct skv_error *kerr)
{
	struct gpu *g = &d->gpus[d->n_gpus];
	struct skv_cuda_info info;
	int e = skv_backend_load(NULL, ordinal, &g->be, kerr);

	if (e < 0) {
		char what[64];

		g->be = NULL;
		if (d->n_gpus)
			snprintf(what, sizeof(what), "backend cuda: devices: device %d: ", ordinal);
		else
			snprintf(what, sizeof(what), "backend cuda: ");
		prefix_msg(kerr, what);
		return e;
	}
	d->ops = g->be->ops;
	ops_of(d)->dev_info(g->be->dev, &info);
	g->ordinal = info.device;
	snprintf(g->name, sizeof(g->name), "%s sm_%d%d", info.name, info.cc_major, info.cc_minor);
	d->n_gpus++;
	return 0;
}

/* Every device of the config's list (none: all visible), the first loaded first. */
static int gpus_open(struct snapkvd_device *d, const int *devices, unsigned n_devices,
		     struct skv_error *kerr)
{
	int n = 0, e;

	e = gpu_open(d, n_devices ? devices[0] : 0, kerr);
	if (e < 0)
		return e;
	if (!n_devices) {
		/* a plugin without dev_count: the one device */
		if (!ops_of(d)->dev_count || ops_of(d)->dev_count(&n, kerr) < 0)
			n = 1;
		if (n > SNAPKVD_DEVICES_MAX) {
			log_warning("%d CUDA devices visible: serving the first %d (devices = to "
				    "choose)",
				    n, SNAPKVD_DEVICES_MAX);
			n = SNAPKVD_DEVICES_MAX;
		}
	}
	for (unsigned i = 1; i < (n_devices ? n_devices : (unsigned)n); i++) {
		e = gpu_open(d, n_devices ? devices[i] : (int)i, kerr);
		if (e < 0)
			return e;
	}
	return 0;
}

/* The status line: "NAME sm_XY" for one device, "cuda0 NAME sm_XY, cuda1 ..." else. */
static void describe(struct snapkvd_device *d)
{
	size_t n = 0;

	if (d->n_gpus == 1) {
		snprintf(d->desc, sizeof(d->desc), "%s", d->gpus[0].name);
		return;
	}
	for (unsigned i = 0; i < d->n_gpus && n < sizeof(d->desc); i++)
		n += (size_t)snprintf(d->desc + n, sizeof(d->desc) - n, "%scuda%d %s",
				      i ? ", " : "", d->gpus[i].ordinal, d->gpus[i].name);
}

/* The plugin loaded on every device, the waiter started. */
static int device_load(struct snapkvd_device *d, const int *devices, unsigned n_devices,
		       struct skv_error *kerr)
{
	int e = gpus_open(d, devices, n_devices, kerr);

	if (e < 0)
		return e;
	describe(d);
	e = -pthread_create(&d->waiter, NULL, waiter, d);
	if (e < 0)
		return e;
	d->waiter_started = true;
	return 0;
}

int snapkvd_device_new(const char *backend, const int *devices, unsigned n_devices,
		       struct snapkvd_device **ret, struct skv_error *kerr)
{
	_cleanup_(device_freep) struct snapkvd_device *d = calloc(1, sizeof(*d));
	pthread_condattr_t ca;
	int e;

	if (!d)
		return -ENOMEM;
	snprintf(d->backend, sizeof(d->backend), "%s", backend);
	pthread_mutex_init(&d->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* snapkvd_now_ns() */
	pthread_cond_init(&d->wcond, &ca);
	pthread_condattr_destroy(&ca);
	if (!strcmp(backend, "cuda")) {
		e = device_load(d, devices, n_devices, kerr);
		if (e < 0)
			return e;
	}
	*ret = TAKE_PTR(d);
	return 0;
}

bool snapkvd_device_present(const struct snapkvd_device *d)
{
	return d && d->n_gpus;
}

unsigned snapkvd_device_count(const struct snapkvd_device *d)
{
	return d ? d->n_gpus : 0;
}

int snapkvd_device_ordinal(const struct snapkvd_device *d, unsigned gpu)
{
	return gpu < d->n_gpus ? d->gpus[gpu].ordinal : -1;
}

int snapkvd_device_index(const struct snapkvd_device *d, int ordinal)
{
	for (unsigned i = 0; i < d->n_gpus; i++)
		if (d->gpus[i].ordinal == ordinal)
			return (int)i;
	return -1;
}

void snapkvd_device_stats(const struct snapkvd_device *d, unsigned gpu,
			  struct snapkvd_device_stats *ret)
{
	const struct gpu *g = &d->gpus[gpu];

	*ret = (struct snapkvd_device_stats){
	    .ordinal = g->ordinal,
	    .name = g->name,
	    .imports = g->imports,
	    .import_bytes = g->import_bytes,
	    .arenas = g->arenas,
	    .arena_bytes = g->arena_bytes,
	    .jobs = atomic_load(&g->jobs),
	};
}

void snapkvd_device_job_ran(struct snapkvd_device *d, unsigned gpu)
{
	if (gpu < d->n_gpus)
		atomic_fetch_add(&d->gpus[gpu].jobs, 1);
}

const char *snapkvd_device_backend(const struct snapkvd_device *d)
{
	return d->backend;
}

const char *snapkvd_device_desc(const struct snapkvd_device *d)
{
	return d->desc;
}

const struct skv_backend_ops *snapkvd_device_ops(const struct snapkvd_device *d)
{
	return ops_of(d);
}

struct skv_cuda_dev *snapkvd_device_dev(const struct snapkvd_device *d, unsigned gpu)
{
	return dev_of(d, gpu);
}

void snapkvd_device_stop(struct snapkvd_device *d)
{
	atomic_store(&d->stopping, true);
}

bool snapkvd_device_stopping(struct snapkvd_device *d)
{
	return atomic_load(&d->stopping);
}

/* --------------------------------------------------------------- imports */

/*
 * The plugin shares the import of a repeated (tenant, key). A repeated
 * generation of a live buffer never gets here (the session's buffer set
 * counts it on that buffer), so a match in the plugin could only be
 * generation 0 ("none") again or a generation unregistered while a job
 * still holds its import: both name another allocation, which must not be
 * read through the old mapping. The key is therefore the buffer id the
 * buffer will get, never reused within the session.
 */
/* The devices named in messages: "0,1" */
static void ordinals(const struct snapkvd_device *d, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = 0;
	for (unsigned i = 0; i < d->n_gpus && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%s%d", i ? "," : "", d->gpus[i].ordinal);
}

/*
 * The opened device that holds the memory: the fd or handle says which
 * (asked on the engine's device first, where an IPC handle always opens,
 * then on the others). A plugin that cannot tell: the engine's device.
 */
static int locate(struct snapkvd_device *d, int fd, const void *ipc_handle, int engine_device,
		  unsigned *ret_gpu, char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	int first = snapkvd_device_index(d, engine_device), where = engine_device, e = -ENOTSUP;
	char list[SNAPKVD_DEVICES_MAX * 4];

	for (unsigned k = 0; ops_of(d)->locate && k <= d->n_gpus && e < 0; k++) {
		int i = k == 0 ? first : (int)k - 1;

		if (i < 0 || (k > 0 && i == first))
			continue;
		e = ops_of(d)->locate(dev_of(d, (unsigned)i), fd, ipc_handle, &where, &kerr);
	}
	if (e < 0 && e != -ENOTSUP) {
		snprintf(err, errlen, "import: %s", kerr.msg[0] ? kerr.msg : strerror(-e));
		return e;
	}
	int i = snapkvd_device_index(d, where);
	if (i < 0) {
		ordinals(d, list, sizeof(list));
		snprintf(err, errlen,
			 "import: the buffer lives on CUDA device %d, which this daemon does not "
			 "use (devices = %s)",
			 where, list);
		return -ENODEV;
	}
	*ret_gpu = (unsigned)i;
	return 0;
}

/*
 * The plugin shares the import of a repeated (tenant, key). A repeated
 * generation of a live buffer never gets here (the session's buffer set
 * counts it on that buffer), so a match in the plugin could only be
 * generation 0 ("none") again or a generation unregistered while a job
 * still holds its import: both name another allocation, which must not be
 * read through the old mapping. The key is therefore the buffer id the
 * buffer will get, never reused within the session.
 */
int snapkvd_device_import(struct snapkvd_device *d, uint64_t session_id, uint64_t key, int fd,
			  uint64_t size, const void *ipc_handle, int engine_device,
			  struct snapkvd_import *ret, char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	struct skv_cuda_import *imp = NULL;
	unsigned gpu = 0;
	int e;

	if (!snapkvd_device_present(d))
		return -ENOTSUP;
	e = locate(d, fd, ipc_handle, engine_device, &gpu, err, errlen);
	if (e < 0)
		return e;
	if (fd >= 0)
		e = ops_of(d)->import_fd(dev_of(d, gpu), session_id, key, fd, size, &imp, &kerr);
	else
		e = ops_of(d)->import_ipc(dev_of(d, gpu), session_id, key, ipc_handle, &imp, &kerr);
	if (e < 0) {
		snprintf(err, errlen, "import: %s", kerr.msg[0] ? kerr.msg : strerror(-e));
		return e;
	}
	*ret = (struct snapkvd_import){
	    .imp = imp,
	    .gpu = gpu,
	    .ptr = ops_of(d)->import_ptr(imp),
	    .size = ops_of(d)->import_size(imp),
	    .transport = ops_of(d)->import_transport(imp),
	};
	d->imports++;
	d->gpus[gpu].imports++;
	d->gpus[gpu].import_bytes += ret->size;
	return 0;
}

void snapkvd_device_import_release(struct snapkvd_device *d, const struct snapkvd_import *imp)
{
	/* the plugin synchronises the device before the last reference unmaps */
	ops_of(d)->import_release(imp->imp);
	d->imports--;
	d->gpus[imp->gpu].imports--;
	d->gpus[imp->gpu].import_bytes -= imp->size;
}

unsigned snapkvd_device_imports(const struct snapkvd_device *d)
{
	return d->imports;
}

/* ------------------------------------------------------------ GPU arenas */

/* ret_fd NULL: the size only. */
static int arena_export(struct snapkvd_device *d, unsigned gpu, struct skv_cuda_arena *a,
			int *ret_fd, uint64_t *ret_size, int *ret_device, struct skv_error *kerr)
{
	struct skv_cuda_info info;
	int e, fd;

	*ret_size = ops_of(d)->arena_size(a);
	if (!ret_fd)
		return 0;
	e = ops_of(d)->arena_export_fd(a, &fd, kerr);
	if (e < 0)
		return e;
	ops_of(d)->dev_info(dev_of(d, gpu), &info);
	*ret_fd = fd;
	*ret_device = info.device;
	return 0;
}

int snapkvd_device_arena_export(struct snapkvd_device *d, unsigned gpu, struct skv_cuda_arena **a,
				uint64_t host_size, uint64_t session_id, int *ret_fd,
				uint64_t *ret_size, int *ret_device, char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	int e;

	if (!snapkvd_device_present(d))
		return -ENOTSUP;
	if (!*a) {
		/* as large as the host arena: every region placed there fits here */
		e = ops_of(d)->arena_new(dev_of(d, gpu), host_size, a, &kerr);
		if (e < 0) {
			*a = NULL;
			snprintf(err, errlen, "GPU arena: %s",
				 kerr.msg[0] ? kerr.msg : strerror(-e));
			return e;
		}
		arena_export(d, gpu, *a, NULL, ret_size, NULL, &kerr);
		d->gpus[gpu].arenas++;
		d->gpus[gpu].arena_bytes += *ret_size;
		log_info("session %llu: GPU arena of %llu bytes (cuda-vmm) on device %d",
			 (unsigned long long)session_id, (unsigned long long)*ret_size,
			 d->gpus[gpu].ordinal);
	}
	e = arena_export(d, gpu, *a, ret_fd, ret_size, ret_device, &kerr);
	if (e < 0)
		snprintf(err, errlen, "GPU arena export: %s",
			 kerr.msg[0] ? kerr.msg : strerror(-e));
	return e;
}

uint8_t *snapkvd_device_arena_base(struct snapkvd_device *d, struct skv_cuda_arena *a)
{
	return a && snapkvd_device_present(d) ? ops_of(d)->arena_ptr(a) : NULL;
}

void snapkvd_device_arena_free(struct snapkvd_device *d, unsigned gpu, struct skv_cuda_arena *a)
{
	if (!a || !snapkvd_device_present(d))
		return;
	d->gpus[gpu].arenas--;
	d->gpus[gpu].arena_bytes -= ops_of(d)->arena_size(a);
	ops_of(d)->arena_free(a);
}
