/* SPDX-License-Identifier: MIT */
/*
 * skv-io.h - deadline-bounded control-socket I/O, shared by libsnapkv and
 * snapkvctl (internal: not installed, static functions only).
 *
 * A deadline is an absolute CLOCK_MONOTONIC time in nanoseconds; 0 means
 * none. Every wait is a poll() on the socket for what is left of it, so a
 * daemon that is alive but hung (stopped, deadlocked, swapping) can no longer
 * block a caller forever: the call gives -ETIMEDOUT instead.
 *
 * The control socket is SOCK_SEQPACKET: one frame is one datagram, sent and
 * received whole by one sendmsg/recvmsg (fds ride on the same datagram), so
 * there are no partial frames to resume. What can block is the send (the
 * daemon's receive queue is full: it stopped reading), the receive (it does
 * not answer), and connect (its listen backlog is full: it stopped
 * accepting). Each of these is bounded here.
 */
#ifndef SKV_IO_H
#define SKV_IO_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>

#include "proto/skv-frame.h"

/* Default deadline of one call when neither the caller nor $SNAPKV_TIMEOUT_MS
 * says otherwise. */
#define SKV_IO_DEFAULT_TIMEOUT_MS 30000u
/* Largest deadline accepted (poll() takes an int of milliseconds). */
#define SKV_IO_MAX_TIMEOUT_MS 2147483647u

static inline uint64_t skv_io_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The deadline of a call starting now that may take timeout_ms (0: none). */
static inline uint64_t skv_io_deadline(uint32_t timeout_ms)
{
	return timeout_ms ? skv_io_now_ns() + (uint64_t)timeout_ms * 1000000u : 0;
}

/* poll()'s timeout for what is left of deadline dl: -1 for none, 0 once past,
 * else the remaining milliseconds rounded up (never wake up early). */
static inline int skv_io_poll_ms(uint64_t dl)
{
	uint64_t now, left;

	if (!dl)
		return -1;
	now = skv_io_now_ns();
	if (now >= dl)
		return 0;
	left = (dl - now + 999999u) / 1000000u;
	return left > SKV_IO_MAX_TIMEOUT_MS ? (int)SKV_IO_MAX_TIMEOUT_MS : (int)left;
}

/*
 * $SNAPKV_TIMEOUT_MS as milliseconds: strict decimal, 0 (no deadline) to
 * SKV_IO_MAX_TIMEOUT_MS. Unset or empty: SKV_IO_DEFAULT_TIMEOUT_MS. 0 or
 * -EINVAL for anything else (a typo must not silently mean "wait forever").
 */
static inline int skv_io_timeout_env(uint32_t *ret_ms)
{
	const char *s = getenv("SNAPKV_TIMEOUT_MS");
	uint64_t v = 0;

	if (!s || !*s) {
		*ret_ms = SKV_IO_DEFAULT_TIMEOUT_MS;
		return 0;
	}
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -EINVAL;
		v = v * 10 + (uint64_t)(*p - '0');
		if (v > SKV_IO_MAX_TIMEOUT_MS)
			return -EINVAL;
	}
	*ret_ms = (uint32_t)v;
	return 0;
}

/* Wait until fd is ready for events or deadline dl passes. 0 when ready (or
 * hung up / in error: the following send or recv says which), -ETIMEDOUT,
 * or -errno from poll. */
static inline int skv_io_wait(int fd, short events, uint64_t dl)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		int r = poll(&p, 1, skv_io_poll_ms(dl));

		if (r > 0)
			return 0;
		if (r == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

/*
 * connect() an AF_UNIX socket, waiting at most until dl for room in the
 * listener's backlog. For AF_UNIX a non-blocking connect cannot be polled
 * for completion (it fails with EAGAIN rather than EINPROGRESS), but a
 * blocking one waits no longer than SO_SNDTIMEO: set that to what is left,
 * then clear it. 0, -ETIMEDOUT or -errno.
 */
static inline int skv_io_connect(int fd, const struct sockaddr_un *sa, uint64_t dl)
{
	struct timeval zero = {0, 0};
	int r;

	for (;;) {
		if (dl) {
			uint64_t now = skv_io_now_ns(), left = dl > now ? dl - now : 0;
			/* rounded up to whole microseconds: 0 would mean "forever" */
			uint64_t us = (left + 999) / 1000;
			struct timeval tv = {.tv_sec = (time_t)(us / 1000000u),
					     .tv_usec = (suseconds_t)(us % 1000000u)};

			if (!left) {
				r = -ETIMEDOUT;
				break;
			}
			if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
				r = -errno;
				break;
			}
		}
		r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) < 0 ? -errno : 0;
		if (r != -EINTR)
			break;
	}
	if (dl)
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &zero, sizeof(zero));
	/* the listener's backlog stayed full until the deadline */
	return r == -EAGAIN || r == -EINPROGRESS ? -ETIMEDOUT : r;
}

/* skv_frame_send that waits at most until dl for the daemon to make room.
 * 0, -ETIMEDOUT (nothing was sent) or skv_frame_send's -errno. */
static inline int skv_io_send(int fd, uint16_t type, const void *payload, size_t len,
			      const int *fds, unsigned n_fds, uint64_t dl)
{
	for (;;) {
		int r = skv_frame_send(fd, type, payload, len, fds, n_fds, MSG_DONTWAIT);

		if (r != -EAGAIN)
			return r;
		r = skv_io_wait(fd, POLLOUT, dl);
		if (r < 0)
			return r;
	}
}

/* skv_frame_recv that waits at most until dl for a frame. Same returns, and
 * -ETIMEDOUT with nothing received and *n_fds untouched. */
static inline int skv_io_recv(int fd, void *buf, size_t cap, struct skv_frame_hdr *ret_hdr,
			      int *fds, unsigned *n_fds, uint64_t dl)
{
	for (;;) {
		int r = skv_io_wait(fd, POLLIN, dl);

		if (r < 0)
			return r;
		r = skv_frame_recv(fd, buf, cap, ret_hdr, fds, n_fds, MSG_DONTWAIT);
		if (r != -EAGAIN)
			return r;
	}
}

#endif /* SKV_IO_H */
