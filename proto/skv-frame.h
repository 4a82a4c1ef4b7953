/* SPDX-License-Identifier: MIT */
/*
 * skv-frame.h - the control socket's framing: a fixed 16-byte header in
 * front of each protobuf message, and send/recv helpers that pass file
 * descriptors (SCM_RIGHTS) over an AF_UNIX SOCK_SEQPACKET socket.
 *
 * One frame is one datagram. Every field of the header is little-endian and
 * checked before the payload is looked at; the payload length is bounded by
 * SKV_FRAME_MAX_PAYLOAD. All functions return 0 (or a byte count) or -errno.
 */
#ifndef SKV_FRAME_H
#define SKV_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SKV_FRAME_MAGIC	      0x31564b53u /* "SKV1" little-endian */
#define SKV_PROTO_VERSION     1u
#define SKV_FRAME_HDR_SIZE    16u
#define SKV_FRAME_MAX_PAYLOAD (1u << 20)
#define SKV_FRAME_MAX_FDS     4u
/* No flag is defined yet: a peer setting one speaks something we do not. */
#define SKV_FRAME_FLAGS_KNOWN 0u

/*
 * snapkv.v1.Params.explicit_fields: bit n stands for Params field number n.
 * A flagged field is used as sent, 0 included; an unflagged 0 is "default".
 */
#define SKV_PARAMS_EXPLICIT(field_no) (1u << (field_no))
#define SKV_PARAMS_EXPLICIT_ALL                                                                    \
	(SKV_PARAMS_EXPLICIT(2) | SKV_PARAMS_EXPLICIT(3) | SKV_PARAMS_EXPLICIT(4) |                \
	 SKV_PARAMS_EXPLICIT(7))

struct skv_frame_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type; /* snapkv.v1.MsgType */
	uint32_t flags;
	uint32_t length; /* payload bytes after the header */
};

/* Encode a header into 16 bytes, little-endian. */
void skv_frame_hdr_encode(const struct skv_frame_hdr *h, uint8_t out[SKV_FRAME_HDR_SIZE]);

/*
 * Decode and validate a header from `len` received bytes: -EBADMSG on a short
 * datagram, bad magic, unknown flags, type 0, or a length that disagrees with
 * what arrived; -EPROTONOSUPPORT on another version; -EMSGSIZE when length
 * exceeds max_payload.
 */
int skv_frame_hdr_decode(const uint8_t *buf, size_t len, size_t max_payload,
			 struct skv_frame_hdr *ret_hdr);

/*
 * Send one frame (header + payload) with up to SKV_FRAME_MAX_FDS fds.
 * flags go to sendmsg (MSG_DONTWAIT, ...); MSG_NOSIGNAL is always added.
 * 0 or -errno (-EMSGSIZE for an oversized payload).
 */
int skv_frame_send(int sock, uint16_t type, const void *payload, size_t len, const int *fds,
		   unsigned n_fds, int flags);

/*
 * Receive one frame into buf (cap bytes, header included). fds received are
 * close-on-exec; up to *n_fds (in: room in fds[], out: how many) are handed
 * back, any others are closed. A truncated datagram (MSG_TRUNC) or truncated
 * control data (MSG_CTRUNC) gives -EMSGSIZE with every fd closed.
 * Returns the payload length (payload at buf + SKV_FRAME_HDR_SIZE),
 * -ECONNRESET on end of stream, or -errno.
 */
int skv_frame_recv(int sock, void *buf, size_t cap, struct skv_frame_hdr *ret_hdr, int *fds,
		   unsigned *n_fds, int flags);

/*
 * The part of skv_frame_recv after recvmsg returned: validate a received
 * message (as filled by recvmsg, also via io_uring) and collect its fds.
 * Unexpected fds beyond *n_fds are closed. Same returns as skv_frame_recv.
 * got < 0 (recvmsg failed) touches no fd: the kernel installed none and
 * did not update msg_controllen, so the control buffer may still hold an
 * earlier message's fd numbers, long closed and perhaps reused.
 */
struct msghdr;
int skv_frame_parse(struct msghdr *msg, ssize_t got, size_t max_payload,
		    struct skv_frame_hdr *ret_hdr, int *fds, unsigned *n_fds);

/* Close every fd carried in a received msghdr's control data. */
void skv_frame_close_fds(struct msghdr *msg);

/*
 * Size sock's send and receive buffers for the largest frame (header +
 * SKV_FRAME_MAX_PAYLOAD): on AF_UNIX a datagram larger than the sender's
 * SO_SNDBUF fails with EMSGSIZE, and the default (net.core.wmem_default,
 * about 208 KiB) is below the protocol's 1 MiB. SO_SNDBUFFORCE is tried
 * first (CAP_NET_ADMIN), then SO_SNDBUF (capped by net.core.wmem_max).
 * 0 when both fit a whole frame, -ENOBUFS when the kernel capped them
 * lower (frames up to *ret_max still work; ret_max may be NULL).
 */
int skv_frame_size_socket(int sock, size_t *ret_max);

/* Whether s[0..len) is well-formed UTF-8 (no overlongs, surrogates or
 * code points above U+10FFFF) without NUL or other control characters;
 * engine names are checked with it at HELLO. */
int skv_utf8_valid(const char *s, size_t len);
/* The length of the UTF-8 sequence at p (at most n bytes), 0 if malformed. */
size_t skv_utf8_seq(const unsigned char *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* SKV_FRAME_H */
