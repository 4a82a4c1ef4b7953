// SPDX-License-Identifier: MIT
/*
 * fuzz-frame - libFuzzer target: one received datagram, as the daemon's
 * loop sees it after recvmsg: the 16-byte frame header (skv_frame_parse,
 * with SCM_RIGHTS fds attached, room for fewer than were sent, MSG_TRUNC /
 * MSG_CTRUNC), then the protobuf message that frame type carries, unpacked
 * and walked as the daemon's checks walk it, packed again and unpacked
 * again.
 *
 * Input: byte 0 = fds attached (bits 0-2), room for fds (bits 3-5),
 * MSG_TRUNC (bit 6), MSG_CTRUNC (bit 7); the rest is the datagram.
 *
 * Properties (a violation aborts): every fd attached is either handed back
 * or closed, never leaked; an accepted header agrees with the datagram; the
 * payload of an accepted frame is at most SKV_FRAME_MAX_PAYLOAD; what
 * unpack returns is bounded by the bytes it came from (every string
 * terminated inside them, every repeated count at most one per wire byte,
 * oneof case and pointer agreeing) and survives pack + unpack unchanged in
 * size; unpack + free never crashes or leaks (ASan, LeakSanitizer).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/skv-frame.h"
#include "proto/snapkv.pb-c.h"

#define MAX_FDS 7

#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz-frame: %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* Bytes the walk has read, so that reads of every field are real (ASan sees them). */
static volatile uint64_t sink;

static void walk_str(const char *s, size_t len)
{
	/* protobuf-c gives "" (a static) for an absent proto3 string, never NULL */
	REQUIRE(s);
	REQUIRE(strlen(s) <= len);
	sink += (unsigned char)s[0];
}

static void walk_bytes(ProtobufCBinaryData b, size_t len)
{
	REQUIRE(b.len <= len);
	REQUIRE(!b.len || b.data);
	if (b.len)
		sink += b.data[b.len - 1];
}

/* A repeated field of n elements, each at least min_wire bytes on the wire. */
static void walk_count(size_t n, const void *arr, size_t min_wire, size_t len)
{
	REQUIRE(n <= len / min_wire);
	REQUIRE(!n || arr);
}

/*
 * The daemon's tensor check (snapkvd-compactor.c resolve_tensor): the last
 * byte a strided or paged tensor reaches, with overflow checks, against a
 * buffer of `bufsize` bytes. Returns whether it fits; the point is that the
 * arithmetic on attacker-chosen values never overflows unchecked (UBSan).
 */
static int tensor_fits(const Snapkv__V1__TensorRef *t, uint32_t heads, uint32_t tokens,
		       uint32_t dim, const int32_t *table, size_t n_table, uint64_t bufsize)
{
	uint64_t s, max_el = 0, tmp, end;

	if (!t || t->dtype < SNAPKV__V1__DTYPE__D_TYPE_F32 ||
	    t->dtype > SNAPKV__V1__DTYPE__D_TYPE_BF16)
		return 0;
	s = t->dtype == SNAPKV__V1__DTYPE__D_TYPE_F32 ? 4 : 2;
	if (t->head_stride < 0 || t->token_stride < 0 || t->block_stride < 0 || t->offset % s)
		return 0;
	if (!heads || !tokens || !dim)
		return 1;
	if (__builtin_mul_overflow((uint64_t)(heads - 1), (uint64_t)t->head_stride, &tmp) ||
	    __builtin_add_overflow(max_el, tmp, &max_el) ||
	    __builtin_add_overflow(max_el, (uint64_t)dim - 1, &max_el))
		return 0;
	if (t->block_size) {
		uint64_t nb = ((uint64_t)tokens + t->block_size - 1) / t->block_size, maxb = 0;
		uint64_t in_blk = tokens < t->block_size ? tokens : t->block_size;

		if (nb > n_table)
			return 0;
		for (uint64_t i = 0; i < nb; i++) {
			if (table[i] < 0)
				return 0;
			if ((uint64_t)table[i] > maxb)
				maxb = (uint64_t)table[i];
		}
		if (__builtin_mul_overflow(in_blk - 1, (uint64_t)t->token_stride, &tmp) ||
		    __builtin_add_overflow(max_el, tmp, &max_el) ||
		    __builtin_mul_overflow(maxb, (uint64_t)t->block_stride, &tmp) ||
		    __builtin_add_overflow(max_el, tmp, &max_el))
			return 0;
	} else if (__builtin_mul_overflow((uint64_t)tokens - 1, (uint64_t)t->token_stride, &tmp) ||
		   __builtin_add_overflow(max_el, tmp, &max_el)) {
		return 0;
	}
	if (__builtin_add_overflow(max_el, 1, &end) || __builtin_mul_overflow(end, s, &end) ||
	    __builtin_add_overflow(end, t->offset, &end))
		return 0;
	return end <= bufsize;
}

static void walk_compact(const Snapkv__V1__CompactRequest *c, size_t len)
{
	walk_count(c->n_layer, c->layer, 2, len);
	/* packed or not, each int32 takes at least one byte */
	walk_count(c->n_block_table, c->block_table, 1, len);
	if (c->params) {
		walk_count(c->params->n_protected_ranges, c->params->protected_ranges, 2, len);
		for (size_t i = 0; i < c->params->n_protected_ranges; i++) {
			REQUIRE(c->params->protected_ranges[i]);
			sink += c->params->protected_ranges[i]->end -
				c->params->protected_ranges[i]->begin;
		}
	}
	if (c->prefill_wait)
		walk_bytes(c->prefill_wait->ipc_event, len);
	for (size_t l = 0; l < c->n_layer; l++) {
		const Snapkv__V1__LayerRef *lr = c->layer[l];

		REQUIRE(lr);
		/* q, k, v may each be absent: the daemon refuses a missing one */
		sink += tensor_fits(lr->q, c->h_q, c->n_q, c->head_dim, c->block_table,
				    c->n_block_table, 1ull << 40);
		sink += tensor_fits(lr->k, c->h_kv, c->prompt_len, c->head_dim, c->block_table,
				    c->n_block_table, 1ull << 40);
		sink += tensor_fits(lr->v, c->h_kv, c->prompt_len, c->head_dim, c->block_table,
				    c->n_block_table, 1ull << 40);
	}
}

static void walk_request(const Snapkv__V1__Request *r, size_t len)
{
	switch (r->op_case) {
	case SNAPKV__V1__REQUEST__OP_NOP:
		REQUIRE(r->nop);
		break;
	case SNAPKV__V1__REQUEST__OP_COMPACT:
		REQUIRE(r->compact);
		walk_compact(r->compact, len);
		break;
	case SNAPKV__V1__REQUEST__OP_APPEND:
		REQUIRE(r->append);
		sink += r->append->cache_id + r->append->tokens;
		break;
	case SNAPKV__V1__REQUEST__OP_GROW:
		REQUIRE(r->grow);
		sink += r->grow->cache_id + r->grow->extra;
		break;
	case SNAPKV__V1__REQUEST__OP_RELEASE:
		REQUIRE(r->release);
		sink += r->release->cache_id + r->release->linger;
		break;
	case SNAPKV__V1__REQUEST__OP_STATS:
		REQUIRE(r->stats);
		break;
	case SNAPKV__V1__REQUEST__OP__NOT_SET:
		break;
	default:
		REQUIRE(!"unknown oneof case");
	}
}

static void walk_ledger_bytes(const Snapkv__V1__LedgerBytes *b)
{
	if (b)
		sink += b->native_full + b->compact + b->index + b->reserved + b->allocated +
			b->real + b->padding;
}

static void walk_admin_reply(const Snapkv__V1__AdminReply *a, size_t len)
{
	walk_str(a->error, len);
	walk_str(a->version, len);
	walk_str(a->backend, len);
	walk_str(a->text, len);
	walk_str(a->arena_transport, len);
	walk_count(a->n_tenants, a->tenants, 2, len);
	walk_count(a->n_caches, a->caches, 2, len);
	for (size_t i = 0; i < a->n_tenants; i++) {
		REQUIRE(a->tenants[i]);
		walk_str(a->tenants[i]->name, len);
		walk_ledger_bytes(a->tenants[i]->bytes);
	}
	for (size_t i = 0; i < a->n_caches; i++) {
		const Snapkv__V1__CacheLedger *c = a->caches[i];

		REQUIRE(c);
		walk_str(c->tenant, len);
		walk_str(c->engine, len);
		walk_str(c->transport, len);
		walk_str(c->arena_transport, len);
		walk_ledger_bytes(c->bytes);
	}
	walk_ledger_bytes(a->pool_bytes);
	if (a->pressure) {
		const Snapkv__V1__PressureInfo *p = a->pressure;

		walk_str(p->high, len);
		walk_str(p->high_leave, len);
		walk_str(p->critical, len);
		walk_str(p->critical_leave, len);
		walk_str(p->actions, len);
		walk_str(p->hook_dir, len);
		walk_count(p->n_transitions, p->transitions, 2, len);
		for (size_t i = 0; i < p->n_transitions; i++) {
			REQUIRE(p->transitions[i]);
			sink += p->transitions[i]->used_bytes;
		}
	}
}

static void walk_cache_info(const Snapkv__V1__CacheInfo *c, size_t len)
{
	/* packed or not, each u64 takes at least one byte, each float four */
	walk_count(c->n_k_offset, c->k_offset, 1, len);
	walk_count(c->n_v_offset, c->v_offset, 1, len);
	walk_count(c->n_pos_offset, c->pos_offset, 1, len);
	walk_count(c->n_retained_mass, c->retained_mass, 4, len);
	for (size_t i = 0; i < c->n_k_offset; i++)
		sink += c->k_offset[i];
}

/*
 * Whether m or any message inside it kept unknown fields. libprotobuf-c
 * keeps them verbatim and packs them again, and accepts tags on unpack
 * that it then refuses in the short form it packs them in (field number 0
 * in an over-long varint): the round trip below holds only without them.
 * Nothing here re-packs what it received, so that is the library's quirk.
 */
static int has_unknown(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	if (m->n_unknown_fields)
		return 1;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const char *at = (const char *)m + f->offset;

		if (f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
			ProtobufCMessage *const *a = *(ProtobufCMessage *const **)at;

			for (size_t k = 0; k < n; k++)
				if (has_unknown(a[k]))
					return 1;
		} else {
			const ProtobufCMessage *sub = *(ProtobufCMessage *const *)at;

			if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF &&
			    *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
				continue;
			if (sub && has_unknown(sub))
				return 1;
		}
	}
	return 0;
}

/*
 * Unpack `len` bytes as `desc`, walk, pack again: the second encoding
 * unpacks, and packs to the same size (deterministic encoding).
 */
static void one_message(const ProtobufCMessageDescriptor *desc, const uint8_t *p, size_t len,
			void (*walk)(const ProtobufCMessage *, size_t))
{
	ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, p), *m2;
	size_t n, n2;
	uint8_t *buf;

	if (!m)
		return;
	REQUIRE(m->descriptor == desc);
	if (walk)
		walk(m, len);
	if (has_unknown(m)) {
		protobuf_c_message_free_unpacked(m, NULL);
		return;
	}
	n = protobuf_c_message_get_packed_size(m);
	buf = malloc(n ? n : 1);
	REQUIRE(buf);
	REQUIRE(protobuf_c_message_pack(m, buf) == n);
	m2 = protobuf_c_message_unpack(desc, NULL, n, buf);
	REQUIRE(m2);
	n2 = protobuf_c_message_get_packed_size(m2);
	REQUIRE(n2 == n);
	protobuf_c_message_free_unpacked(m2, NULL);
	free(buf);
	protobuf_c_message_free_unpacked(m, NULL);
}

static void w_hello(const ProtobufCMessage *m, size_t len)
{
	walk_str(((const Snapkv__V1__Hello *)m)->name, len);
}

static void w_register(const ProtobufCMessage *m, size_t len)
{
	walk_bytes(((const Snapkv__V1__RegisterBuffer *)m)->ipc_handle, len);
}

static void w_request(const ProtobufCMessage *m, size_t len)
{
	walk_request((const Snapkv__V1__Request *)m, len);
}

static void w_admin(const ProtobufCMessage *m, size_t len)
{
	const Snapkv__V1__AdminRequest *a = (const Snapkv__V1__AdminRequest *)m;

	if (a->pressure) {
		walk_str(a->pressure->high, len);
		walk_str(a->pressure->high_leave, len);
		walk_str(a->pressure->critical, len);
		walk_str(a->pressure->critical_leave, len);
		walk_str(a->pressure->actions, len);
		walk_str(a->pressure->scale_high, len);
		walk_str(a->pressure->scale_critical, len);
		walk_str(a->pressure->guaranteed_share, len);
	}
}

static void w_welcome(const ProtobufCMessage *m, size_t len)
{
	walk_str(((const Snapkv__V1__Welcome *)m)->tenant, len);
	walk_str(((const Snapkv__V1__Welcome *)m)->backend, len);
}

static void w_register_reply(const ProtobufCMessage *m, size_t len)
{
	walk_str(((const Snapkv__V1__RegisterReply *)m)->error, len);
	walk_str(((const Snapkv__V1__RegisterReply *)m)->transport, len);
}

static void w_response(const ProtobufCMessage *m, size_t len)
{
	const Snapkv__V1__Response *r = (const Snapkv__V1__Response *)m;

	walk_str(r->error, len);
	if (r->result_case == SNAPKV__V1__RESPONSE__RESULT_CACHE) {
		REQUIRE(r->cache);
		walk_cache_info(r->cache, len);
	} else if (r->result_case == SNAPKV__V1__RESPONSE__RESULT_STATS) {
		REQUIRE(r->stats);
	}
}

static void w_admin_reply(const ProtobufCMessage *m, size_t len)
{
	walk_admin_reply((const Snapkv__V1__AdminReply *)m, len);
}

static void w_status_error(const ProtobufCMessage *m, size_t len)
{
	/* ErrorNotice, UnregisterReply and CudaArena share fields 1 and 2 */
	const ProtobufCFieldDescriptor *f =
	    protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "error");

	REQUIRE(f && f->type == PROTOBUF_C_TYPE_STRING);
	walk_str(*(char *const *)((const char *)m + f->offset), len);
}

/* What the daemon (and libsnapkv, for the daemon's replies) unpacks per frame type. */
static void dispatch(uint16_t type, const uint8_t *p, size_t len)
{
	switch (type) {
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO:
		one_message(&snapkv__v1__hello__descriptor, p, len, w_hello);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER:
		one_message(&snapkv__v1__register_buffer__descriptor, p, len, w_register);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER:
		one_message(&snapkv__v1__unregister__descriptor, p, len, NULL);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REQUEST:
		one_message(&snapkv__v1__request__descriptor, p, len, w_request);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN:
		one_message(&snapkv__v1__admin_request__descriptor, p, len, w_admin);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA:
		one_message(&snapkv__v1__cuda_arena_request__descriptor, p, len, NULL);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME:
		one_message(&snapkv__v1__welcome__descriptor, p, len, w_welcome);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_REGISTER_REPLY:
		one_message(&snapkv__v1__register_reply__descriptor, p, len, w_register_reply);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_UNREGISTER_REPLY:
		one_message(&snapkv__v1__unregister_reply__descriptor, p, len, w_status_error);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_RESPONSE:
		one_message(&snapkv__v1__response__descriptor, p, len, w_response);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY:
		one_message(&snapkv__v1__admin_reply__descriptor, p, len, w_admin_reply);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_ERROR:
		one_message(&snapkv__v1__error_notice__descriptor, p, len, w_status_error);
		break;
	case SNAPKV__V1__MSG_TYPE__MSG_TYPE_CUDA_ARENA_REPLY:
		one_message(&snapkv__v1__cuda_arena__descriptor, p, len, w_status_error);
		break;
	default:
		break; /* the daemon answers an unknown type with an error */
	}
}

static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int devnull = -1;
	union {
		char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	int sent[MAX_FDS], got_fds[MAX_FDS];
	unsigned n_sent, room, n_got;
	struct skv_frame_hdr hdr = {0};
	struct msghdr msg = {0};
	struct iovec iov;
	uint8_t *dgram;
	size_t len;
	int r;

	if (size < 1 || size > 1 + SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD + 64)
		return -1;
	if (devnull < 0)
		devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	REQUIRE(devnull >= 0);
	n_sent = data[0] & 7;
	room = (data[0] >> 3) & 7;
	len = size - 1;
	/* its own allocation, so that any read past the datagram is caught */
	dgram = malloc(len ? len : 1);
	REQUIRE(dgram);
	memcpy(dgram, data + 1, len);
	iov = (struct iovec){.iov_base = dgram, .iov_len = len};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_flags = (data[0] & 0x40 ? MSG_TRUNC : 0) | (data[0] & 0x80 ? MSG_CTRUNC : 0);
	if (n_sent) {
		struct cmsghdr *c;

		for (unsigned i = 0; i < n_sent; i++) {
			sent[i] = fcntl(devnull, F_DUPFD_CLOEXEC, 0);
			REQUIRE(sent[i] >= 0);
		}
		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * n_sent);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n_sent);
		memcpy(CMSG_DATA(c), sent, sizeof(int) * n_sent);
	}
	n_got = room;
	r = skv_frame_parse(&msg, (ssize_t)len, SKV_FRAME_MAX_PAYLOAD, &hdr, got_fds, &n_got);
	if (r >= 0) {
		uint8_t enc[SKV_FRAME_HDR_SIZE];

		REQUIRE(!(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)));
		REQUIRE((size_t)r == hdr.length && hdr.length + SKV_FRAME_HDR_SIZE == len);
		REQUIRE(hdr.length <= SKV_FRAME_MAX_PAYLOAD);
		REQUIRE(hdr.magic == SKV_FRAME_MAGIC && hdr.version == SKV_PROTO_VERSION);
		REQUIRE(hdr.type != 0 && hdr.flags == 0);
		REQUIRE(n_got == (n_sent < room ? n_sent : room));
		skv_frame_hdr_encode(&hdr, enc);
		REQUIRE(!memcmp(enc, dgram, SKV_FRAME_HDR_SIZE));
		for (unsigned i = 0; i < n_got; i++) {
			unsigned k;

			for (k = 0; k < n_sent && sent[k] != got_fds[i]; k++)
				;
			REQUIRE(k < n_sent); /* one of ours */
			close(got_fds[i]);
		}
	}
	/* handed back and closed above, or closed by the parser: none left */
	for (unsigned i = 0; i < n_sent; i++)
		REQUIRE(!fd_open(sent[i]));
	if (r >= 0)
		dispatch(hdr.type, dgram + SKV_FRAME_HDR_SIZE, hdr.length);
	free(dgram);
	return 0;
}
