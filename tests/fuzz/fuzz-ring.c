// SPDX-License-Identifier: MIT
/*
 * fuzz-ring - libFuzzer target: the shared-memory ring as either peer sees
 * it when the other one lies (proto/skv-ring.h).
 *
 * Input: a struct skv_ring_layout (96 bytes), then the values the peer
 * controls: SQ tail, SQ head, CQ head, CQ tail (4 x u32), then the SQ
 * entries' bytes. Two layouts are tried: the input's own, accepted or not
 * by skv_ring_layout_check() against a mapping of exactly total_size bytes;
 * and skv_ring_layout_init() of sizes taken from it, which must always pass
 * the check.
 *
 * On an accepted layout the daemon's consumer loop runs as in
 * snapkvd_session_poll_ring(): CQ space first (back-pressure), consume an
 * SQE into a private copy, check its slot and length against the layout,
 * copy the argument slot out, answer on the CQ; and the engine's side
 * produces SQEs against the lying SQ head. Properties: no access outside
 * the mapping (a malloc of exactly total_size bytes, so ASan sees any),
 * the ring functions return only 0, -EAGAIN or -EBADMSG (or a count), a
 * consumer never takes more than n_entries entries per tail it saw, and the
 * loops stop.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/skv-ring.h"

#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz-ring: %s:%d: %s\n", __FILE__, __LINE__, #cond);      \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* Keep one run fast: larger rings only repeat what small ones exercise. */
#define MAX_MAP (1u << 20)

struct peer {
	uint32_t sq_tail, sq_head, cq_head, cq_tail;
};

static volatile uint64_t sink;

static void run_ring(const struct skv_ring_layout *l, const struct peer *pv,
		     const uint8_t *sqe_bytes, size_t n_sqe_bytes)
{
	uint8_t *map = malloc(l->total_size), *scratch = malloc(l->arg_slot_size);
	struct skv_ring_q sq, cq, esq, ecq;
	unsigned inflight = 0, steps = 0, taken = 0;
	size_t sq_bytes = (size_t)l->sq_entries * sizeof(struct skv_sqe);
	int n;

	REQUIRE(map && scratch);
	memset(map, 0, l->total_size);
	memcpy(map, l, sizeof(*l));
	skv_ring_q_init(&sq, map, l->sq_off, l->sq_entries, sizeof(struct skv_sqe));
	skv_ring_q_init(&cq, map, l->cq_off, l->cq_entries, sizeof(struct skv_cqe));
	memcpy(sq.entries, sqe_bytes, n_sqe_bytes < sq_bytes ? n_sqe_bytes : sq_bytes);
	/* the engine's (lying) indices in shared memory; ours stay private */
	atomic_store(&sq.ctl->tail, pv->sq_tail);
	atomic_store(&sq.ctl->head, pv->sq_head);
	atomic_store(&cq.ctl->head, pv->cq_head);
	atomic_store(&cq.ctl->tail, pv->cq_tail);

	/* the daemon: snapkvd_session_poll_ring() */
	n = skv_ring_ready(&sq);
	REQUIRE(n == -EBADMSG || (n >= 0 && (uint32_t)n <= l->sq_entries));
	while (steps++ < 4 * l->sq_entries + 4) {
		struct skv_sqe e;
		struct skv_cqe c = {0};
		int space = skv_ring_space(&cq), r;

		REQUIRE(space == -EBADMSG || (space >= 0 && (uint32_t)space <= l->cq_entries));
		if (space < 0 || (unsigned)space <= inflight)
			break;
		r = skv_ring_consume(&sq, &e);
		REQUIRE(r == 0 || r == -EAGAIN || r == -EBADMSG);
		if (r < 0)
			break;
		taken++;
		REQUIRE(taken <= l->sq_entries); /* one tail, at most one ring of entries */
		inflight++;
		c.user_data = e.user_data;
		c.slot = e.slot;
		if (e.opcode == SKV_OP_REQUEST) {
			if (e.slot >= l->arg_slots || e.len > l->arg_slot_size) {
				c.res = -EINVAL;
			} else {
				const uint8_t *slot =
				    map + l->arg_off + (size_t)e.slot * l->arg_slot_size;

				memcpy(scratch, slot, e.len);
				sink += e.len ? scratch[e.len - 1] : 0;
				/* the answer goes back into the same slot */
				memset((uint8_t *)slot, 0x5a, l->arg_slot_size);
				c.len = l->arg_slot_size;
			}
		} else if (e.opcode != SKV_OP_NOP) {
			c.res = -EOPNOTSUPP;
		}
		r = skv_ring_produce(&cq, &c);
		REQUIRE(r == 0 || r == -EBADMSG); /* never full: space was checked */
		if (r < 0)
			break;
		inflight--;
	}
	n = skv_ring_prepare_sleep(&sq);
	REQUIRE(n == 1 || n == 0 || n == -EBADMSG);
	skv_ring_clear_wakeup(&sq);
	sink += skv_ring_needs_wakeup(&cq);

	/* the engine: resumes producing on the SQ, reaps the CQ, both against
	 * indices the daemon side may have left anywhere */
	skv_ring_q_init(&esq, map, l->sq_off, l->sq_entries, sizeof(struct skv_sqe));
	skv_ring_q_init(&ecq, map, l->cq_off, l->cq_entries, sizeof(struct skv_cqe));
	skv_ring_q_resume_producer(&esq);
	esq.local = pv->sq_tail ^ pv->cq_tail;
	ecq.local = pv->cq_head;
	for (unsigned i = 0; i <= l->sq_entries; i++) {
		struct skv_sqe e = {.opcode = SKV_OP_NOP, .user_data = i};
		int r = skv_ring_produce(&esq, &e);

		REQUIRE(r == 0 || r == -EAGAIN || r == -EBADMSG);
		if (r < 0)
			break;
	}
	for (unsigned i = 0; i <= l->cq_entries; i++) {
		struct skv_cqe c;
		int r = skv_ring_consume(&ecq, &c);

		REQUIRE(r == 0 || r == -EAGAIN || r == -EBADMSG);
		if (r < 0)
			break;
		if (!(c.flags & SKV_CQE_F_EVENT) && c.len && c.slot < l->arg_slots &&
		    c.len <= l->arg_slot_size)
			sink += map[l->arg_off + (size_t)c.slot * l->arg_slot_size + c.len - 1];
	}
	free(scratch);
	free(map);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct skv_ring_layout l, k;
	struct peer pv;
	const uint8_t *rest;
	size_t n_rest;

	if (size < sizeof(l) + sizeof(pv))
		return -1;
	memcpy(&l, data, sizeof(l));
	memcpy(&pv, data + sizeof(l), sizeof(pv));
	rest = data + sizeof(l) + sizeof(pv);
	n_rest = size - sizeof(l) - sizeof(pv);

	/* the layout as sent: checked against a mapping of exactly its claimed size */
	if (l.total_size >= sizeof(l) && l.total_size <= MAX_MAP &&
	    skv_ring_layout_check(&l, l.total_size) == 0)
		run_ring(&l, &pv, rest, n_rest);
	/* a bigger mapping than the layout needs is fine too */
	if (l.total_size <= MAX_MAP / 2)
		(void)skv_ring_layout_check(&l, (uint64_t)l.total_size * 2);

	/* a layout the daemon computes passes the check, whatever the sizes asked */
	uint32_t sqn = 1u << (data[0] % 14), cqn = 1u << (data[1] % 14);
	uint32_t slot = (uint32_t)(data[2] | data[3] << 8) * 64u;

	if (skv_ring_layout_init(&k, sqn, cqn, slot) == 0) {
		REQUIRE(skv_ring_layout_check(&k, k.total_size) == 0);
		REQUIRE(k.arg_slots == sqn && k.arg_slot_size == slot);
		if (k.total_size <= MAX_MAP)
			run_ring(&k, &pv, rest, n_rest);
	} else {
		/* refused only for a reason: sizes out of range, or a memfd
		 * beyond 4 GiB (offsets are u32) */
		REQUIRE(slot < 64 || slot > SKV_RING_MAX_SLOT || sqn > SKV_RING_MAX_ENTRIES ||
			cqn > SKV_RING_MAX_ENTRIES ||
			(uint64_t)sqn * slot + (1u << 20) > UINT32_MAX);
	}
	return 0;
}
