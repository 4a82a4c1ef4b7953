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
#include "snapkvd-log.h"

struct snapkvd_device {
	char backend[16];
	char desc[320];
	struct skv_backend *gpu; /* NULL: no device (host backend) */
	unsigned imports;	 /* live imports (loop thread) */
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
	return d->gpu->ops;
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

	if (ops_of(d)->read_value(d->gpu->dev, w->flag, &v, &kerr) == 0 && v >= w->value) {
		w->met = true;
		return;
	}
	w->fired = true;
	r = ops_of(d)->signal_value(d->gpu->dev, w->flag, w->value, &kerr);
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
	if (d->gpu)
		skv_backend_unload(d->gpu);
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->wcond);
	free(d);
}

static void device_freep(struct snapkvd_device **d)
{
	snapkvd_device_free(*d);
}

/* The plugin loaded, the GPU described, the waiter started. */
static int device_load(struct snapkvd_device *d, struct skv_error *kerr)
{
	struct skv_cuda_info info;
	int e = skv_backend_load(NULL, -1, &d->gpu, kerr);

	if (e < 0) {
		char m[sizeof(kerr->msg)];

		d->gpu = NULL;
		snprintf(m, sizeof(m), "%s", kerr->msg);
		snprintf(kerr->msg, sizeof(kerr->msg), "backend cuda: %.*s",
			 (int)sizeof(m) - (int)sizeof("backend cuda: "), m);
		return e;
	}
	ops_of(d)->dev_info(d->gpu->dev, &info);
	snprintf(d->desc, sizeof(d->desc), "%s sm_%d%d", info.name, info.cc_major, info.cc_minor);
	e = -pthread_create(&d->waiter, NULL, waiter, d);
	if (e < 0)
		return e;
	d->waiter_started = true;
	return 0;
}

int snapkvd_device_new(const char *backend, struct snapkvd_device **ret, struct skv_error *kerr)
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
		e = device_load(d, kerr);
		if (e < 0)
			return e;
	}
	*ret = TAKE_PTR(d);
	return 0;
}

bool snapkvd_device_present(const struct snapkvd_device *d)
{
	return d && d->gpu;
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

struct skv_cuda_dev *snapkvd_device_dev(const struct snapkvd_device *d)
{
	return d->gpu->dev;
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
int snapkvd_device_import(struct snapkvd_device *d, uint64_t session_id, uint64_t key, int fd,
			  uint64_t size, const void *ipc_handle, struct snapkvd_import *ret,
			  char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	struct skv_cuda_import *imp = NULL;
	int e;

	if (!snapkvd_device_present(d))
		return -ENOTSUP;
	if (fd >= 0)
		e = ops_of(d)->import_fd(d->gpu->dev, session_id, key, fd, size, &imp, &kerr);
	else
		e = ops_of(d)->import_ipc(d->gpu->dev, session_id, key, ipc_handle, &imp, &kerr);
	if (e < 0) {
		snprintf(err, errlen, "import: %s", kerr.msg[0] ? kerr.msg : strerror(-e));
		return e;
	}
	*ret = (struct snapkvd_import){
	    .imp = imp,
	    .ptr = ops_of(d)->import_ptr(imp),
	    .size = ops_of(d)->import_size(imp),
	    .transport = ops_of(d)->import_transport(imp),
	};
	d->imports++;
	return 0;
}

void snapkvd_device_import_release(struct snapkvd_device *d, void *imp)
{
	/* the plugin synchronises the device before the last reference unmaps */
	ops_of(d)->import_release(imp);
	d->imports--;
}

unsigned snapkvd_device_imports(const struct snapkvd_device *d)
{
	return d->imports;
}

/* ------------------------------------------------------------ GPU arenas */

/* ret_fd NULL: the size only. */
static int arena_export(struct snapkvd_device *d, struct skv_cuda_arena *a, int *ret_fd,
			uint64_t *ret_size, int *ret_device, struct skv_error *kerr)
{
	struct skv_cuda_info info;
	int e, fd;

	*ret_size = ops_of(d)->arena_size(a);
	if (!ret_fd)
		return 0;
	e = ops_of(d)->arena_export_fd(a, &fd, kerr);
	if (e < 0)
		return e;
	ops_of(d)->dev_info(d->gpu->dev, &info);
	*ret_fd = fd;
	*ret_device = info.device;
	return 0;
}

int snapkvd_device_arena_export(struct snapkvd_device *d, struct skv_cuda_arena **a,
				uint64_t host_size, uint64_t session_id, int *ret_fd,
				uint64_t *ret_size, int *ret_device, char *err, size_t errlen)
{
	struct skv_error kerr = {{0}, -1, -1};
	int e;

	if (!snapkvd_device_present(d))
		return -ENOTSUP;
	if (!*a) {
		/* as large as the host arena: every region placed there fits here */
		e = ops_of(d)->arena_new(d->gpu->dev, host_size, a, &kerr);
		if (e < 0) {
			*a = NULL;
			snprintf(err, errlen, "GPU arena: %s",
				 kerr.msg[0] ? kerr.msg : strerror(-e));
			return e;
		}
		arena_export(d, *a, NULL, ret_size, NULL, &kerr);
		log_info("session %llu: GPU arena of %llu bytes (cuda-vmm)",
			 (unsigned long long)session_id, (unsigned long long)*ret_size);
	}
	e = arena_export(d, *a, ret_fd, ret_size, ret_device, &kerr);
	if (e < 0)
		snprintf(err, errlen, "GPU arena export: %s",
			 kerr.msg[0] ? kerr.msg : strerror(-e));
	return e;
}

uint8_t *snapkvd_device_arena_base(struct snapkvd_device *d, struct skv_cuda_arena *a)
{
	return a && snapkvd_device_present(d) ? ops_of(d)->arena_ptr(a) : NULL;
}

void snapkvd_device_arena_free(struct snapkvd_device *d, struct skv_cuda_arena *a)
{
	if (a && snapkvd_device_present(d))
		ops_of(d)->arena_free(a);
}
