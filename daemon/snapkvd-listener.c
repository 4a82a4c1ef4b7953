// SPDX-License-Identifier: MIT
/* snapkvd-listener.c - the listening socket; see snapkvd-listener.h. */
#include "snapkvd-listener.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "snapkvd-log.h"
#include "snapkvd-loop.h"

struct snapkvd_listener {
	struct snapkvd_loop *loop;
	int fd;
	bool owned; /* we bound (and unlink) the path */
	char path[108];
	snapkvd_listener_fn on_conn;
	void *data;
	struct snapkvd_loop_ev ev;
	/* EMFILE/ENFILE: accept pauses on a timer, backing off 10 ms .. 1 s,
	 * with one warning per pause (and the count of refusals it covered) */
	int timer_fd;
	uint64_t timerbuf;
	struct snapkvd_loop_ev ev_timer;
	unsigned backoff_ms;
	uint64_t fd_failures; /* accepts failed for want of fds, this pause */
	bool paused;
};

#define ACCEPT_BACKOFF_MIN_MS 10
#define ACCEPT_BACKOFF_MAX_MS 1000

/* Whether a daemon still listens at sa. One killed a moment ago can: its
 * io_uring is torn down asynchronously after exit. Give that a second. */
static bool still_live(const struct sockaddr_un *sa)
{
	bool live = false;

	for (int i = 0; i < 20; i++) {
		int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

		live = probe >= 0 && connect(probe, (const struct sockaddr *)sa, sizeof(*sa)) == 0;
		if (probe >= 0)
			close(probe);
		if (!live)
			break;
		usleep(50000);
	}
	return live;
}

/* A socket path left by a dead daemon is removed; a live one is an error. */
static int listen_on(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		/* ENOENT, EACCES, ...: the real reason, not listen()'s EINVAL */
		if (errno != EADDRINUSE)
			goto fail;
		if (still_live(&sa)) {
			close(fd);
			return -EADDRINUSE;
		}
		if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
			unlink(path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			goto fail;
	}
	/* engines of other uids reach us through the group; the allow list decides */
	(void)chmod(path, 0660);
	if (listen(fd, 128) < 0)
		goto fail;
	return fd;
fail:
	r = -errno;
	close(fd);
	return r;
}

static void arm_accept(struct snapkvd_listener *l)
{
	if (!snapkvd_loop_stopped(l->loop))
		snapkvd_loop_accept(l->loop, l->fd, &l->ev);
}

/* Out of fds: accepting again at once would fail at once, forever (a busy
 * loop); wait, doubling the wait while it lasts. False: no timer, go on. */
static bool pause_accept(struct snapkvd_listener *l, int res)
{
	struct itimerspec its = {0};

	l->backoff_ms = l->backoff_ms ? l->backoff_ms * 2 : ACCEPT_BACKOFF_MIN_MS;
	if (l->backoff_ms > ACCEPT_BACKOFF_MAX_MS)
		l->backoff_ms = ACCEPT_BACKOFF_MAX_MS;
	if (!l->fd_failures++)
		log_warning_errno(res,
				  "accept failed: out of file descriptors; pausing accept "
				  "(backoff up to %d ms, RLIMIT_NOFILE or fs.file-max)",
				  ACCEPT_BACKOFF_MAX_MS);
	its.it_value.tv_sec = l->backoff_ms / 1000;
	its.it_value.tv_nsec = (long)(l->backoff_ms % 1000) * 1000000L;
	if (l->timer_fd < 0 || timerfd_settime(l->timer_fd, 0, &its, NULL) < 0 ||
	    snapkvd_loop_read(l->loop, l->timer_fd, &l->timerbuf, sizeof(l->timerbuf),
			      &l->ev_timer) < 0)
		return false;
	l->paused = true;
	return true;
}

static void on_accept(void *data, int res)
{
	struct snapkvd_listener *l = data;

	if (res >= 0) {
		if (l->fd_failures > 1)
			log_notice("accepting again; %llu accepts failed for want of fds",
				   (unsigned long long)l->fd_failures);
		l->fd_failures = 0;
		l->backoff_ms = 0;
		l->on_conn(l->data, res);
	} else if (res == -EMFILE || res == -ENFILE || res == -ENOBUFS || res == -ENOMEM) {
		if (pause_accept(l, res))
			return;
	} else if (res != -EAGAIN && res != -EINTR && res != -ECONNABORTED) {
		log_warning_errno(res, "accept failed");
	}
	arm_accept(l);
}

static void on_backoff(void *data, int res)
{
	struct snapkvd_listener *l = data;

	(void)res;
	l->paused = false;
	arm_accept(l);
}

static int open_socket(struct snapkvd_listener *l, const char *path)
{
	int n = sd_listen_fds(1);

	if (n > 1)
		return log_error_errno(-EINVAL, "Expected one socket from systemd, got %d", n);
	if (n == 1) {
		l->fd = SD_LISTEN_FDS_START;
		if (sd_is_socket_unix(l->fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0)
			return log_error_errno(-EINVAL, "Socket from systemd is not a listening "
							"AF_UNIX SOCK_SEQPACKET socket");
		log_info("using the socket passed by systemd");
		return 0;
	}
	l->fd = listen_on(path);
	if (l->fd < 0)
		return log_error_errno(l->fd, "Failed to listen on %s", path);
	l->owned = true;
	snprintf(l->path, sizeof(l->path), "%s", path);
	log_info("listening on %s", path);
	return 0;
}

int snapkvd_listener_new(struct snapkvd_loop *loop, const char *path, snapkvd_listener_fn on_conn,
			 void *data, struct snapkvd_listener **ret)
{
	struct snapkvd_listener *l = calloc(1, sizeof(*l));
	int r;

	if (!l)
		return log_error_errno(-ENOMEM, "Failed to listen");
	l->loop = loop;
	l->fd = -1;
	l->on_conn = on_conn;
	l->data = data;
	l->ev = (struct snapkvd_loop_ev){.fn = on_accept, .data = l};
	l->ev_timer = (struct snapkvd_loop_ev){.fn = on_backoff, .data = l};
	/* made now: at EMFILE it could not be */
	l->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	r = open_socket(l, path);
	if (r == 0 && snapkvd_loop_accept(loop, l->fd, &l->ev) < 0)
		r = -EBUSY;
	if (r < 0) {
		snapkvd_listener_free(l);
		return r;
	}
	*ret = l;
	return 0;
}

void snapkvd_listener_free(struct snapkvd_listener *l)
{
	if (!l)
		return;
	if (l->timer_fd >= 0)
		close(l->timer_fd);
	if (l->fd >= 0) {
		close(l->fd);
		if (l->owned)
			unlink(l->path);
	}
	free(l);
}
