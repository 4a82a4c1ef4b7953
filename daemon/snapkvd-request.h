/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-request.h - validation of a COMPACT or GROW request into a job.
 *
 * Validation only: nothing here reserves, allocates in an arena, counts,
 * evicts or runs a pressure action, so a request refused here has changed
 * nothing. What a request needs from the daemon is handed in as an env;
 * admission (snapkvd-admission.h) follows, in one place.
 */
#ifndef SNAPKVD_REQUEST_H
#define SNAPKVD_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/snapkv.pb-c.h"
#include "snapkvd-cache.h"
#include "snapkvd-forward.h"

/* What validating a request reads of the daemon, and nothing else. */
struct snapkvd_request_env {
	const struct snapkvd_config *cfg;
	struct snapkvd_buffer *buffers; /* the session's registered buffers */
	uint64_t arena_bytes;		/* the session's host arena */
	bool has_garena;		/* the session has a GPU arena */
	unsigned garena_gpu;		/* on this device (an index) */
	const struct snapkvd_device *device;
	unsigned threads;		  /* of the largest worker: the scratch bound */
	const struct snapkvd_policy *ops; /* the pressure level: C scaling */
	/* decision groups: a member is scaled at the level of its open group */
	struct snapkvd_groups *groups;
	uint32_t uid;
};

/*
 * A CompactRequest into a COMPACT job for session s answered at o: limits,
 * parameters, the plan, every tensor (once each), the prefill wait and the
 * output cache's shape and size. The job holds references on the buffers it
 * reads and copies of what its worker needs (req is not kept); its cache is
 * built but not placed. 0, or -errno with the reason in err.
 */
int snapkvd_request_compact(const struct snapkvd_request_env *env, struct snapkvd_session *s,
			    const struct snapkvd_origin *o, const Snapkv__V1__CompactRequest *req,
			    struct snapkvd_job **ret, char *err, size_t errlen);

/*
 * GROW of cache c by `extra` decode slots: 1..max_reserve in all, and the
 * grown region must fit the arena. The new slot count and region sizes.
 * 0, or -errno with the reason in err.
 */
int snapkvd_request_grow(const struct snapkvd_request_env *env, const struct snapkvd_cache *c,
			 uint32_t extra, uint32_t *ret_slots, struct snapkvd_cache_geom *ret_geom,
			 const char **err);

#endif
