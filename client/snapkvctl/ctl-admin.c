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
#include <unistd.h>

#include "ctl-admin.h"
#include "ctl-daemon.h"
#include "proto/skv-frame.h"
#include "proto/skv-io.h"

/* One admin round trip, connect included, within one deadline (--timeout).
 * 0 and *ret (free with ..._free_unpacked) or -errno. */
int ctl_admin_call(const char *sock, Snapkv__V1__AdminRequest *req, Snapkv__V1__AdminReply **ret,
		   char *err, size_t errlen)
{
	static uint8_t buf[SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD];
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct skv_frame_hdr hdr;
	Snapkv__V1__AdminReply *rep;
	uint64_t dl = ctl_daemon_deadline();
	size_t n;
	int fd, r;

	if (strlen(sock) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "%s: socket path too long", sock);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	r = fd < 0 ? -errno : skv_io_connect(fd, &sa, dl);
	if (r < 0) {
		if (r == -ETIMEDOUT)
			snprintf(err, errlen,
				 "cannot reach snapkvd at %s: not accepted within %u ms", sock,
				 ctl_daemon_timeout_ms());
		else
			snprintf(err, errlen, "cannot reach snapkvd at %s: %s", sock, strerror(-r));
		if (fd >= 0)
			close(fd);
		return r;
	}
	hello.client_version = SKV_PROTO_VERSION;
	hello.admin = 1;
	hello.name = "snapkvctl";
	n = snapkv__v1__hello__pack(&hello, buf);
	r = skv_io_send(fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, buf, n, NULL, 0, dl);
	if (r >= 0)
		r = skv_io_recv(fd, buf, sizeof(buf), &hdr, NULL, NULL, dl);
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
			 ctl_daemon_timeout_ms());
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
		snprintf(err, errlen, "%s", rep->error && *rep->error ? rep->error : strerror(-r));
		snapkv__v1__admin_reply__free_unpacked(rep, NULL);
		return r;
	}
	*ret = rep;
	return 0;
}
