/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-compactor.h - the worker pool that runs jobs (snapkvd-job.h) on a
 * runner (snapkvd-runner.h), from one FIFO queue.
 *
 * Workers never touch a session or its CQ: a finished job goes on the done
 * list and the compactor's eventfd becomes readable; the loop thread, the
 * only producer of every CQ, reaps the jobs and posts their completions.
 */
#ifndef SNAPKVD_COMPACTOR_H
#define SNAPKVD_COMPACTOR_H

#include <stdbool.h>

#include "skv.h"
#include "snapkvd-forward.h"

/* `threads` (0: one per core) split among `workers` (0: auto), each at
 * least one thread (more workers than threads: one each); a runner that
 * serves one worker gets one, and more asked for is -EINVAL naming the key
 * `workers`. On failure err->msg says why where the runner gave a reason
 * (e.g. a bad SKV_CUDA_SCORE), else it is left empty. */
int snapkvd_compactor_new(struct snapkvd_runner *r, unsigned threads, unsigned workers,
			  struct skv_error *err, struct snapkvd_compactor **ret);
/* Stops the workers once every queued job has run (the drain). */
void snapkvd_compactor_free(struct snapkvd_compactor *c);
void snapkvd_compactor_submit(struct snapkvd_compactor *c, struct snapkvd_job *j);
/* j is still queued (no worker took it): taken off the queue and done,
 * -ECANCELED, true. False when a worker has it, or had it (its cancel flag
 * stops it at its next safe point), or it is parked in a group. */
bool snapkvd_compactor_cancel(struct snapkvd_compactor *c, struct snapkvd_job *j);
/* Where decision-group members go after their first step (snapkvd-group.h);
 * set before the first group job is submitted. */
void snapkvd_compactor_set_groups(struct snapkvd_compactor *c, struct snapkvd_groups *g);
/* Jobs a group released as failed while parked (linked by ->next): done,
 * reaped like any other (loop thread). */
void snapkvd_compactor_finish(struct snapkvd_compactor *c, struct snapkvd_job *list);
/* Readable when jobs have finished: read it, then reap. */
int snapkvd_compactor_fd(const struct snapkvd_compactor *c);
/* Take every finished job, in the order they finished (loop thread). */
struct snapkvd_job *snapkvd_compactor_reap(struct snapkvd_compactor *c);
/* queued + running + parked in a decision group + done */
unsigned snapkvd_compactor_pending(struct snapkvd_compactor *c);
unsigned snapkvd_compactor_queued(struct snapkvd_compactor *c); /* not started yet */
unsigned snapkvd_compactor_workers(const struct snapkvd_compactor *c);
unsigned snapkvd_compactor_threads(const struct snapkvd_compactor *c); /* of the largest worker */
const char *snapkvd_compactor_isa(const struct snapkvd_compactor *c);
/* Wall time the workers spent in compactions, ns (any thread). */
uint64_t snapkvd_compactor_busy_ns(const struct snapkvd_compactor *c);

#endif
