// SPDX-License-Identifier: MIT
/*
 * ctl-admin.c - one admin round trip with snapkvd (hello as an admin
 * session, one ADMIN request, its reply), for every snapkvctl command that
 * asks the daemon something; see ctl-admin.h.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ctl-admin.h"
#include "proto/skv-frame.h"
#include "proto/skv-io.h"
#include "proto/skv-socket.h"

struct admin_conn {
	int fd;
	uint64_t dl;
};

/* skv_socket_search_run's try: connect to path by the deadline. */
static int connect_at(const char *path, void *arg)
{
	struct admin_conn *ac = arg;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int r;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path); /* fits: skv_socket_search */
	ac->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (ac->fd < 0)
		return -errno;
	r = skv_io_connect(ac->fd, &sa, ac->dl);
	if (r < 0) {
		close(ac->fd);
		ac->fd = -1;
	}
	return r;
}

uint32_t ctl_admin_timeout_ms(void)
{
	uint32_t ms;

	/* main() refused a malformed value before any command ran */
	return skv_io_timeout_env(&ms) < 0 ? SKV_IO_DEFAULT_TIMEOUT_MS : ms;
}

uint64_t ctl_admin_deadline(void)
{
	return skv_io_deadline(ctl_admin_timeout_ms());
}

void ctl_admin_unreachable(const struct skv_socket_search *s, int r, char *err, size_t errlen)
{
	char tried[600];

	skv_socket_search_tried(s, tried, sizeof(tried));
	if (r == -ETIMEDOUT)
		snprintf(err, errlen, "cannot reach snapkvd: not accepted within %u ms: %s",
			 ctl_admin_timeout_ms(), tried);
	else
		snprintf(err, errlen, "cannot reach snapkvd: tried %s", tried);
}

/* One connection, one request: ctl_admin_call's try. *ret_retry_ms: what
 * the daemon said to wait when it refused the request for a rate limit. */
static int call_once(const char *sock, Snapkv__V1__AdminRequest *req, Snapkv__V1__AdminReply **ret,
		     char *used, char *err, size_t errlen, uint32_t *ret_retry_ms)
{
	static uint8_t buf[SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD];
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	struct admin_conn ac = {.fd = -1, .dl = ctl_admin_deadline()};
	struct skv_socket_search search;
	struct skv_frame_hdr hdr;
	Snapkv__V1__AdminReply *rep;
	uint64_t dl = ac.dl;
	unsigned at = 0;
	size_t n;
	int fd, r;

	r = skv_socket_search_init(&search, sock, "--socket");
	if (r < 0) {
		snprintf(err, errlen, "%s: socket path too long (at most %d bytes)", sock,
			 SKV_SOCKET_PATH_MAX - 1);
		return r;
	}
	r = skv_socket_search_run(&search, connect_at, &ac, &at);
	if (r < 0) {
		ctl_admin_unreachable(&search, r, err, errlen);
		return r;
	}
	fd = ac.fd;
	sock = search.c[at].path;
	if (used)
		snprintf(used, SKV_SOCKET_PATH_MAX, "%s", sock);
	hello.client_version = SKV_PROTO_VERSION;
	hello.admin = 1;
	hello.name = "snapkvctl";
	n = snapkv__v1__hello__pack(&hello, buf);
	r = skv_io_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf, n, NULL, 0, dl);
	if (r >= 0)
		r = skv_io_recv(fd, buf, sizeof(buf), &hdr, NULL, NULL, dl);
	if (r >= 0 && hdr.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR) {
		/* refused at HELLO (not allowed, no admin slot, ...): say why */
		Snapkv__V1__ErrorNotice *e =
		    snapkv__v1__error_notice__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE);

		r = e && e->status < 0 ? e->status : -EPROTO;
		snprintf(err, errlen, "snapkvd at %s refused the connection: %s", sock,
			 e && e->error && *e->error ? e->error : strerror(-r));
		if (e)
			snapkv__v1__error_notice__free_unpacked(e, NULL);
		close(fd);
		return r;
	}
	if (r >= 0 && hdr.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME)
		r = -EPROTO;
	if (r >= 0) {
		n = snapkv__v1__admin_request__get_packed_size(req);
		if (n > SKV_FRAME_MAX_PAYLOAD)
			r = -EMSGSIZE;
		else
			r = skv_io_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, buf,
					snapkv__v1__admin_request__pack(req, buf), NULL, 0, dl);
	}
	if (r >= 0)
		r = skv_io_recv(fd, buf, sizeof(buf), &hdr, NULL, NULL, dl);
	close(fd);
	if (r == -ETIMEDOUT) {
		snprintf(err, errlen, "snapkvd at %s did not answer within %u ms", sock,
			 ctl_admin_timeout_ms());
		return r;
	}
	if (r < 0) {
		snprintf(err, errlen, "talking to snapkvd at %s: %s", sock, strerror(-r));
		return r;
	}
	if (hdr.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY ||
	    !(rep = snapkv__v1__admin_reply__unpack(NULL, hdr.length, buf + SKV_FRAME_HDR_SIZE))) {
		snprintf(err, errlen, "unexpected reply from snapkvd");
		return -EPROTO;
	}
	if (rep->status < 0) {
		r = rep->status;
		*ret_retry_ms = r == -EAGAIN ? rep->retry_after_ms : 0;
		snprintf(err, errlen, "%s", rep->error && *rep->error ? rep->error : strerror(-r));
		snapkv__v1__admin_reply__free_unpacked(rep, NULL);
		return r;
	}
	*ret = rep;
	return 0;
}

/* A request refused by one of the daemon's admin rate limits (-EAGAIN with
 * retry_after_ms) is asked again after that wait, until the deadline; a
 * long listing, page after page, then goes at the pace the daemon allows. */
int ctl_admin_call(const char *sock, Snapkv__V1__AdminRequest *req, Snapkv__V1__AdminReply **ret,
		   char *used, char *err, size_t errlen)
{
	uint64_t dl = ctl_admin_deadline();

	for (;;) {
		uint32_t retry_ms = 0;
		int r = call_once(sock, req, ret, used, err, errlen, &retry_ms);
		struct timespec ts = {retry_ms / 1000, (long)(retry_ms % 1000) * 1000000L};

		if (r != -EAGAIN || !retry_ms || (dl && skv_io_deadline(retry_ms) >= dl))
			return r;
		nanosleep(&ts, NULL);
	}
}
