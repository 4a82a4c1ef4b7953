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
};

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

static void on_accept(void *data, int res)
{
	struct snapkvd_listener *l = data;

	if (res >= 0)
		l->on_conn(l->data, res);
	else if (res != -EAGAIN && res != -EINTR && res != -ECONNABORTED)
		log_warning_errno(res, "accept failed");
	if (!snapkvd_loop_stopped(l->loop))
		snapkvd_loop_accept(l->loop, l->fd, &l->ev);
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
	if (l->fd >= 0) {
		close(l->fd);
		if (l->owned)
			unlink(l->path);
	}
	free(l);
}
