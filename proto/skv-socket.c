// SPDX-License-Identifier: MIT
/* The search for snapkvd's control socket; see skv-socket.h. */
#include "skv-socket.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int add(struct skv_socket_search *s, const char *dir, const char *name, const char *from)
{
	struct skv_socket_candidate *c = &s->c[s->n++];
	int n = name ? snprintf(c->path, sizeof(c->path), "%s/%s", dir, name)
		     : snprintf(c->path, sizeof(c->path), "%s", dir);

	c->from = from;
	c->err = 0;
	c->tried = 0;
	c->if_there = 0;
	if (n < 0 || (size_t)n >= sizeof(c->path)) {
		c->err = -ENAMETOOLONG;
		c->tried = 1; /* so that the reason is listed */
		return -ENAMETOOLONG;
	}
	return 0;
}

int skv_socket_search_init(struct skv_socket_search *s, const char *path, const char *from)
{
	const char *env = getenv("SNAPKV_SOCKET"), *rt = getenv("XDG_RUNTIME_DIR");

	s->n = 0;
	if (path)
		return add(s, path, NULL, from ? from : "given");
	if (env && *env)
		return add(s, env, NULL, "$SNAPKV_SOCKET");
	add(s, SKV_SOCKET_SYSTEM, NULL, "system socket");
	s->c[0].if_there = 1;
	if (rt && *rt)
		add(s, rt, SKV_SOCKET_NAME, "$XDG_RUNTIME_DIR"); /* too long: kept, passed over */
	return 0;
}

/* Nobody is listening there for us: a socket that is not there, refused,
 * or not ours to open (libsnapkv says -ENOTCONN for the first two). */
static int absent(int r)
{
	return r == -ENOENT || r == -ECONNREFUSED || r == -ENOTCONN || r == -EACCES ||
	       r == -EPERM || r == -ENOTSOCK || r == -ENOTDIR || r == -ENAMETOOLONG;
}

int skv_socket_search_run(struct skv_socket_search *s, int (*try_path)(const char *path, void *arg),
			  void *arg, unsigned *ret_index)
{
	int r = -ENOENT;

	for (unsigned i = 0; i < s->n; i++) {
		struct skv_socket_candidate *c = &s->c[i];
		struct stat st;

		c->tried = 1;
		if (c->err) { /* a path too long for a socket address */
			r = c->err;
			continue;
		}
		if (c->if_there && i + 1 < s->n &&
		    (stat(c->path, &st) < 0 || !S_ISSOCK(st.st_mode))) {
			c->err = r = stat(c->path, &st) < 0 ? -errno : -ENOTSOCK;
			continue;
		}
		r = try_path(c->path, arg);
		if (r == 0) {
			if (ret_index)
				*ret_index = i;
			return 0;
		}
		c->err = r;
		if (!absent(r))
			return r;
	}
	return r;
}

static const char *why(int r)
{
	if (r == -ENOTCONN)
		return "no snapkvd listening";
	if (r == -ENOTSOCK)
		return "not a socket";
	return strerror(-r);
}

void skv_socket_search_tried(const struct skv_socket_search *s, char *buf, size_t len)
{
	size_t o = 0;

	if (len)
		buf[0] = '\0';
	for (unsigned i = 0; i < s->n && o < len; i++) {
		const struct skv_socket_candidate *c = &s->c[i];
		int n;

		if (!c->tried)
			continue;
		n = snprintf(buf + o, len - o, "%s%s (%s): %s", o ? ", " : "", c->path, c->from,
			     c->err ? why(c->err) : "connected");
		if (n < 0)
			break;
		o += (size_t)n;
	}
}
