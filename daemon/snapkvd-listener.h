/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-listener.h - the listening socket: the one systemd passes
 * (socket activation) or one bound at a path, and its accept loop. Each
 * accepted connection goes to on_conn(data, fd), which owns the fd.
 */
#ifndef SNAPKVD_LISTENER_H
#define SNAPKVD_LISTENER_H

#include "snapkvd-forward.h"

typedef void (*snapkvd_listener_fn)(void *data, int fd);

/* Listen (on systemd's socket if there is one, else at path) and arm the
 * first accept. Logs what it does; 0 or -errno (logged). */
int snapkvd_listener_new(struct snapkvd_loop *loop, const char *path, snapkvd_listener_fn on_conn,
			 void *data, struct snapkvd_listener **ret);
/* Close the socket; a path we bound is unlinked. */
void snapkvd_listener_free(struct snapkvd_listener *l);

#endif
