/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-loop.h - the daemon thread's event loop: one io_uring whose
 * completions each name a {fn, data} to call, and hooks run every round and
 * around sleeping. It knows nothing of sessions, frames or jobs.
 *
 * While work arrives the loop spins without a syscall (peeking io_uring's CQ
 * is a memory read, submitting nothing is free). A round that found no work
 * within spin_ns of the last busy one asks before_sleep whether it may block
 * in io_uring_enter; after waking, after_sleep runs.
 */
#ifndef SNAPKVD_LOOP_H
#define SNAPKVD_LOOP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "snapkvd-forward.h"

/* What a completion is about: fn(data, res) runs on the loop thread. */
struct snapkvd_loop_ev {
	void (*fn)(void *data, int res);
	void *data;
};

struct snapkvd_loop_hooks {
	void *data;
	/* After each round's completions: the work it did (0: none). *ret_spin:
	 * keep polling without sleeping for spin_ns after the last busy round. */
	unsigned (*round)(void *data, bool *ret_spin);
	/* About to block: true when work arrived meanwhile (then it does not). */
	bool (*before_sleep)(void *data);
	void (*after_sleep)(void *data);
};

int snapkvd_loop_new(unsigned entries, struct snapkvd_loop **ret);
/* The kernel side goes first: no armed op can complete into freed memory. */
void snapkvd_loop_free(struct snapkvd_loop *l);
void snapkvd_loop_set_hooks(struct snapkvd_loop *l, const struct snapkvd_loop_hooks *h,
			    uint64_t spin_ns);

/* Arm one operation completing into ev. 0 or -EBUSY (no submission slot). */
int snapkvd_loop_read(struct snapkvd_loop *l, int fd, void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev);
int snapkvd_loop_poll(struct snapkvd_loop *l, int fd, struct snapkvd_loop_ev *ev);
int snapkvd_loop_accept(struct snapkvd_loop *l, int fd, struct snapkvd_loop_ev *ev);
int snapkvd_loop_recvmsg(struct snapkvd_loop *l, int fd, struct msghdr *m, unsigned flags,
			 struct snapkvd_loop_ev *ev);
/* send(2) of up to len bytes, MSG_NOSIGNAL; res: bytes sent or -errno. */
int snapkvd_loop_send(struct snapkvd_loop *l, int fd, const void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev);

/* Run until snapkvd_loop_stop(). 0, or -errno when waiting failed. */
int snapkvd_loop_run(struct snapkvd_loop *l);
/* From a completion or a hook: the current round is the last. */
void snapkvd_loop_stop(struct snapkvd_loop *l);
bool snapkvd_loop_stopped(const struct snapkvd_loop *l);

#endif
