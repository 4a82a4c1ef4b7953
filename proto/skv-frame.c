// SPDX-License-Identifier: MIT
/* Framing and fd passing for the control socket; see skv-frame.h. */
#include "skv-frame.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = v;
	p[1] = v >> 8;
	p[2] = v >> 16;
	p[3] = v >> 24;
}

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = v;
	p[1] = v >> 8;
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

void skv_frame_hdr_encode(const struct skv_frame_hdr *h, uint8_t out[SKV_FRAME_HDR_SIZE])
{
	put_le32(out, h->magic);
	put_le16(out + 4, h->version);
	put_le16(out + 6, h->type);
	put_le32(out + 8, h->flags);
	put_le32(out + 12, h->length);
}

int skv_frame_hdr_decode(const uint8_t *buf, size_t len, size_t max_payload,
			 struct skv_frame_hdr *ret_hdr)
{
	struct skv_frame_hdr h;

	if (!buf || len < SKV_FRAME_HDR_SIZE)
		return -EBADMSG;
	h.magic = get_le32(buf);
	h.version = get_le16(buf + 4);
	h.type = get_le16(buf + 6);
	h.flags = get_le32(buf + 8);
	h.length = get_le32(buf + 12);
	if (h.magic != SKV_FRAME_MAGIC)
		return -EBADMSG;
	if (h.version != SKV_PROTO_VERSION)
		return -EPROTONOSUPPORT;
	if (h.flags & ~SKV_FRAME_FLAGS_KNOWN)
		return -EBADMSG;
	if (h.type == 0)
		return -EBADMSG;
	if (h.length > max_payload || h.length > SKV_FRAME_MAX_PAYLOAD)
		return -EMSGSIZE;
	/* One frame is one datagram: a length that disagrees is a lie. */
	if (h.length != len - SKV_FRAME_HDR_SIZE)
		return -EBADMSG;
	*ret_hdr = h;
	return 0;
}

int skv_frame_send(int sock, uint16_t type, const void *payload, size_t len, const int *fds,
		   unsigned n_fds, int flags)
{
	uint8_t hdr[SKV_FRAME_HDR_SIZE];
	struct skv_frame_hdr h = {
	    .magic = SKV_FRAME_MAGIC,
	    .version = SKV_PROTO_VERSION,
	    .type = type,
	    .flags = 0,
	    .length = (uint32_t)len,
	};
	struct iovec iov[2];
	union {
		char buf[CMSG_SPACE(sizeof(int) * SKV_FRAME_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = {0};
	ssize_t n;

	if (len > SKV_FRAME_MAX_PAYLOAD || n_fds > SKV_FRAME_MAX_FDS || (len && !payload))
		return -EMSGSIZE;
	skv_frame_hdr_encode(&h, hdr);
	iov[0] = (struct iovec){.iov_base = hdr, .iov_len = sizeof(hdr)};
	iov[1] = (struct iovec){.iov_base = (void *)payload, .iov_len = len};
	msg.msg_iov = iov;
	msg.msg_iovlen = len ? 2 : 1;
	if (n_fds) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n_fds);
	}
	do
		n = sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EPIPE ? -ECONNRESET : -errno;
	if ((size_t)n != sizeof(hdr) + len)
		return -EIO;
	return 0;
}

void skv_frame_close_fds(struct msghdr *msg)
{
	struct cmsghdr *c;

	if (!msg->msg_control || msg->msg_controllen == 0)
		return;
	for (c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (fd >= 0)
				close(fd);
		}
	}
}

int skv_frame_parse(struct msghdr *msg, ssize_t got, size_t max_payload,
		    struct skv_frame_hdr *ret_hdr, int *fds, unsigned *n_fds)
{
	unsigned room = n_fds ? *n_fds : 0, have = 0;
	struct cmsghdr *c;
	int r;

	if (got == 0) {
		skv_frame_close_fds(msg);
		return -ECONNRESET;
	}
	if (got < 0) /* nothing was received: msg_control is not ours to read */
		return (int)got;
	if (msg->msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
		skv_frame_close_fds(msg);
		return -EMSGSIZE;
	}
	r = skv_frame_hdr_decode(msg->msg_iov[0].iov_base, (size_t)got, max_payload, ret_hdr);
	if (r < 0) {
		skv_frame_close_fds(msg);
		return r;
	}
	if (msg->msg_control && msg->msg_controllen) {
		for (c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < n; i++) {
				int fd;

				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
				if (fd < 0)
					continue;
				if (have < room)
					fds[have++] = fd;
				else
					close(fd); /* more than the caller expects */
			}
		}
	}
	if (n_fds)
		*n_fds = have;
	return (int)ret_hdr->length;
}

int skv_frame_recv(int sock, void *buf, size_t cap, struct skv_frame_hdr *ret_hdr, int *fds,
		   unsigned *n_fds, int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * SKV_FRAME_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	struct msghdr msg = {
	    .msg_iov = &iov,
	    .msg_iovlen = 1,
	    .msg_control = ctl.buf,
	    .msg_controllen = sizeof(ctl.buf),
	};
	size_t max = cap > SKV_FRAME_HDR_SIZE ? cap - SKV_FRAME_HDR_SIZE : 0;
	ssize_t n;

	if (!buf || cap < SKV_FRAME_HDR_SIZE)
		return -EINVAL;
	do
		n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return skv_frame_parse(&msg, n, max, ret_hdr, fds, n_fds);
}

static int set_buf(int sock, int force_opt, int opt, int want)
{
	int got = 0;
	socklen_t len = sizeof(got);

	if (setsockopt(sock, SOL_SOCKET, force_opt, &want, sizeof(want)) < 0)
		(void)setsockopt(sock, SOL_SOCKET, opt, &want, sizeof(want));
	if (getsockopt(sock, SOL_SOCKET, opt, &got, &len) < 0)
		return 0;
	return got;
}

int skv_frame_size_socket(int sock, size_t *ret_max)
{
	/* the kernel doubles what it is given (for its bookkeeping) and keeps
	 * a little of a datagram's budget for itself */
	const int want = SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD + 64 * 1024;
	int snd = set_buf(sock, SO_SNDBUFFORCE, SO_SNDBUF, want);
	int rcv = set_buf(sock, SO_RCVBUFFORCE, SO_RCVBUF, want);
	int lo = snd < rcv ? snd : rcv;

	if (ret_max)
		*ret_max = lo > 1024 ? (size_t)lo - 1024 : 0;
	return snd >= want && rcv >= want ? 0 : -ENOBUFS;
}

/* The length of the UTF-8 sequence at p (at most n bytes), 0 if malformed. */
size_t skv_utf8_seq(const unsigned char *p, size_t n)
{
	unsigned c = p[0], len, cp, min;

	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, cp = c & 0x1f, min = 0x80;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, cp = c & 0x0f, min = 0x800;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, cp = c & 0x07, min = 0x10000;
	else
		return 0;
	if (n < len)
		return 0;
	for (unsigned i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (p[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

int skv_utf8_valid(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;

	for (size_t i = 0; i < len;) {
		size_t k = skv_utf8_seq(p + i, len - i);

		if (!k || p[i] < 0x20 || p[i] == 0x7f)
			return 0;
		i += k;
	}
	return 1;
}
