/* SPDX-License-Identifier: MIT */
/*
 * skv-socket.h - where a client finds snapkvd's control socket: the one
 * search libsnapkv (skv_client_connect with no path) and snapkvctl share.
 *
 * In order:
 *   1. the path the caller names (snapkvctl --socket), alone;
 *   2. else $SNAPKV_SOCKET, alone;
 *   3. else the system daemon's /run/snapkvd/snapkvd.sock when it exists,
 *   4. then $XDG_RUNTIME_DIR/snapkvd.sock, a daemon of the user's own.
 * A path given by the caller or the environment is never replaced by
 * another: asking for one daemon must not reach a different one. Of the two
 * defaults the system socket comes first because that is the daemon an
 * operator installs and every login shell has $XDG_RUNTIME_DIR set, so a
 * user daemon first would hide the system one from everybody; a user who
 * runs their own daemon while a system one exists says so with
 * $SNAPKV_SOCKET. When the system socket exists but cannot be reached
 * (refused, no permission) the user's socket is tried next.
 */
#ifndef SKV_SOCKET_H
#define SKV_SOCKET_H

#include <stddef.h>

#define SKV_SOCKET_SYSTEM "/run/snapkvd/snapkvd.sock"
#define SKV_SOCKET_NAME	  "snapkvd.sock"
/* sizeof(struct sockaddr_un.sun_path) */
#define SKV_SOCKET_PATH_MAX 108

struct skv_socket_candidate {
	char path[SKV_SOCKET_PATH_MAX];
	const char *from; /* "--socket", "$SNAPKV_SOCKET", ... */
	int err;	  /* why it was passed over or failed; 0 when not tried or used */
	int tried;	  /* considered: passed over (err) or connected to */
	int if_there;	  /* the system socket: passed over when it does not exist */
};

struct skv_socket_search {
	unsigned n;
	struct skv_socket_candidate c[3];
};

/*
 * The candidates for `path` (NULL: search as above; `from` names where a
 * non-NULL path came from, for messages). 0, or -ENAMETOOLONG when the
 * named path (or $SNAPKV_SOCKET) does not fit a socket address.
 */
int skv_socket_search_init(struct skv_socket_search *s, const char *path, const char *from);

/*
 * Call try(path, arg) on each candidate in order until one returns 0 (its
 * index in *ret_index when not NULL) or a failure that says the daemon is
 * there but failing (a timeout, a bad handshake: reported as is, nothing
 * else tried). A system socket that does not exist is passed over without
 * a call while another candidate follows. 0 or the last -errno.
 */
int skv_socket_search_run(struct skv_socket_search *s, int (*try_path)(const char *path, void *arg),
			  void *arg, unsigned *ret_index);

/* "A (from): why, B (from): why" for every candidate considered. */
void skv_socket_search_tried(const struct skv_socket_search *s, char *buf, size_t len);

#endif /* SKV_SOCKET_H */
