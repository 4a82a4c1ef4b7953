/* SPDX-License-Identifier: MIT */
/*
 * skv-ring.h - the shared-memory ring ABI between libsnapkv and snapkvd.
 *
 * One memfd per session, created by the daemon and passed at handshake:
 *
 *   offset 0        struct skv_ring_layout (magic, version, features, offsets)
 *   sq_off          struct skv_ring_ctl + sq_entries * struct skv_sqe
 *   cq_off          struct skv_ring_ctl + cq_entries * struct skv_cqe
 *   arg_off         arg_slots * arg_slot_size bytes: request/response payloads
 *
 * The shape is io_uring's: free-running u32 head and tail, masked by
 * entries - 1, each on its own 64-byte cache line. The SQ is produced by the
 * client and consumed by the daemon; the CQ the other way round. Each side
 * keeps its own index privately and only *reads* the peer's index from shared
 * memory, so a peer scribbling on the ring can at worst make us see a
 * corrupt count (detected: -EBADMSG), never index out of bounds.
 *
 * Memory ordering (C11 atomics; labels pair a release with its acquire):
 *   P1 producer: entry stores, then store-release tail   ... pairs with C1
 *   C1 consumer: load-acquire tail, then entry loads
 *   C2 consumer: entry loads, then store-release head    ... pairs with P2
 *   P2 producer: load-acquire head before reusing a slot
 *   W1 sleeper: store NEED_WAKEUP, full fence, re-check tail ... pairs with W2
 *   W2 producer: store-release tail, full fence, load flags
 *
 * Layout changes only by adding fields in reserved words or features bits;
 * a reader checks magic and version and ignores features it does not know.
 */
#ifndef SKV_RING_H
#define SKV_RING_H

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SKV_RING_MAGIC	     0x474e5253u /* "SRNG" little-endian */
#define SKV_RING_VERSION     1u
#define SKV_RING_CACHELINE   64u
#define SKV_RING_MAX_ENTRIES 4096u
#define SKV_RING_MAX_SLOT    (1u << 20)

/* features */
#define SKV_RING_F_NEED_WAKEUP (1u << 0) /* SQ/CQ flags carry NEED_WAKEUP */
#define SKV_RING_F_ARG_SLOTS   (1u << 1) /* one argument slot per SQ entry */
#define SKV_RING_F_EVENTS      (1u << 2) /* the daemon may post event CQEs       */
#define SKV_RING_F_CANCEL      (1u << 3) /* SKV_OP_CANCEL and the CQE's cancel flags */
#define SKV_RING_F_KNOWN                                                                           \
	(SKV_RING_F_NEED_WAKEUP | SKV_RING_F_ARG_SLOTS | SKV_RING_F_EVENTS | SKV_RING_F_CANCEL)

/* skv_ring_ctl.flags */
#define SKV_RING_NEED_WAKEUP (1u << 0) /* consumer sleeps: ring its doorbell */

struct skv_ring_layout {
	uint32_t magic;
	uint16_t version;
	uint16_t layout_size; /* sizeof(struct skv_ring_layout) */
	uint32_t features;
	uint32_t reserved0;
	uint64_t total_size; /* bytes of the memfd */
	uint32_t sq_off, sq_entries, sq_entry_size;
	uint32_t cq_off, cq_entries, cq_entry_size;
	uint32_t arg_off, arg_slots, arg_slot_size;
	uint32_t reserved[9];
};

/* The shared control block of one queue. */
struct skv_ring_ctl {
	_Alignas(SKV_RING_CACHELINE) _Atomic uint32_t head;  /* written by the consumer */
	_Alignas(SKV_RING_CACHELINE) _Atomic uint32_t tail;  /* written by the producer */
	_Alignas(SKV_RING_CACHELINE) _Atomic uint32_t flags; /* written by the consumer */
	uint32_t reserved[15];
};

/* Opcodes of an SQ entry. */
enum skv_op {
	SKV_OP_UNSPECIFIED = 0,
	SKV_OP_NOP = 1,	    /* no payload; completes with res 0 */
	SKV_OP_REQUEST = 2, /* a snapkv.v1.Request in arg slot `slot`, `len` bytes */
	SKV_OP_CANCEL = 3,  /* SKV_RING_F_CANCEL: see below */
};

/*
 * SKV_OP_CANCEL: stop the request submitted earlier on this ring whose
 * user_data is this entry's user_data (slot and len unused). The cancel
 * has no completion of its own: the target's completion answers it, and
 * the daemon posts that only once nothing of the target can be written any
 * more (dequeued; or its worker stopped at a safe point and, on a GPU, its
 * stream work complete). A target that already completed, or unknown, is
 * not an error: nothing happens. The target then completes with
 * -ECANCELED and SKV_CQE_F_CANCELLED (stopped or never run), or as it would
 * have (it finished first), or with its own failure. Taking a CANCEL needs
 * no CQ slot.
 */

struct skv_sqe {
	uint8_t opcode;
	uint8_t flags;
	uint16_t reserved0;
	uint32_t slot; /* argument slot index (< arg_slots) */
	uint32_t len;  /* payload bytes in that slot        */
	uint32_t reserved1;
	uint64_t user_data;
	uint64_t reserved2;
};

struct skv_cqe {
	uint64_t user_data;
	int32_t res; /* 0 or -errno                                   */
	uint32_t flags;
	uint32_t slot; /* the request's slot: a snapkv.v1.Response there */
	uint32_t len;  /* response bytes (0: none)                       */
	uint64_t reserved;
};

/* skv_cqe.flags */
#define SKV_CQE_F_EVENT (1u << 0) /* not a completion: an event, user_data = SKV_EVENT_* */
/* SKV_RING_F_CANCEL, on a failed COMPACT's completion: */
#define SKV_CQE_F_CANCELLED (1u << 1) /* stopped, or never run, by SKV_OP_CANCEL       */
#define SKV_CQE_F_WRITTEN                                                                          \
	(1u << 2) /* its worker had begun writing its output: part                                 \
		   * of the destination may have been written      */

/*
 * Event CQEs (SKV_RING_F_EVENTS). They never answer a request: a consumer
 * that matches completions by user_data skips them. The daemon posts one
 * only while the CQ keeps room for every in-flight request's completion.
 *
 * SKV_EVENT_PRESSURE: the pool's pressure level changed.
 *   res      = new level (snapkv.v1.PressureLevel: 1 normal, 2 high, 3 critical)
 *   slot     = suggested budget C for new requests (the daemon's default C,
 *              scaled; new requests at high/critical are scaled anyway)
 *   len      = scale factor in effect, per mille
 *   reserved = pool bytes in use
 */
#define SKV_EVENT_PRESSURE 1u

_Static_assert(sizeof(struct skv_ring_layout) == 96, "ring layout ABI");
_Static_assert(sizeof(struct skv_ring_ctl) == 3 * SKV_RING_CACHELINE, "ring ctl ABI");
_Static_assert(sizeof(struct skv_sqe) == 32, "sqe ABI");
_Static_assert(sizeof(struct skv_cqe) == 32, "cqe ABI");

/* One side's private view of one queue. */
struct skv_ring_q {
	struct skv_ring_ctl *ctl;
	uint8_t *entries;
	uint32_t mask;
	uint32_t n_entries;
	uint32_t esize;
	uint32_t local; /* producer: our tail; consumer: our head */
};

/* Compute a layout for the given sizes (powers of two). 0 or -EINVAL. */
static inline int skv_ring_layout_init(struct skv_ring_layout *l, uint32_t sq_entries,
				       uint32_t cq_entries, uint32_t slot_size)
{
	uint64_t off, total;

	if (!sq_entries || !cq_entries || sq_entries > SKV_RING_MAX_ENTRIES ||
	    cq_entries > SKV_RING_MAX_ENTRIES || (sq_entries & (sq_entries - 1)) ||
	    (cq_entries & (cq_entries - 1)) || slot_size < 64 || slot_size > SKV_RING_MAX_SLOT ||
	    slot_size % 64)
		return -EINVAL;
	memset(l, 0, sizeof(*l));
	l->magic = SKV_RING_MAGIC;
	l->version = SKV_RING_VERSION;
	l->layout_size = sizeof(*l);
	l->features = SKV_RING_F_KNOWN;
	off = 4096;
	l->sq_off = (uint32_t)off;
	l->sq_entries = sq_entries;
	l->sq_entry_size = sizeof(struct skv_sqe);
	off += sizeof(struct skv_ring_ctl) + (uint64_t)sq_entries * sizeof(struct skv_sqe);
	off = (off + 4095) & ~4095ull;
	l->cq_off = (uint32_t)off;
	l->cq_entries = cq_entries;
	l->cq_entry_size = sizeof(struct skv_cqe);
	off += sizeof(struct skv_ring_ctl) + (uint64_t)cq_entries * sizeof(struct skv_cqe);
	off = (off + 4095) & ~4095ull;
	l->arg_off = (uint32_t)off;
	l->arg_slots = sq_entries;
	l->arg_slot_size = slot_size;
	total = off + (uint64_t)sq_entries * slot_size;
	if (total > UINT32_MAX)
		return -EINVAL;
	l->total_size = total;
	return 0;
}

/*
 * Validate a layout read from shared memory against the mapping size: magic,
 * version, sizes, every region inside `size` without overlap. 0, -EBADMSG or
 * -EPROTONOSUPPORT.
 */
static inline int skv_ring_layout_check(const struct skv_ring_layout *l, uint64_t size)
{
	uint64_t sq_end, cq_end, arg_end;

	if (size < sizeof(*l) || l->magic != SKV_RING_MAGIC)
		return -EBADMSG;
	if (l->version != SKV_RING_VERSION)
		return -EPROTONOSUPPORT;
	if (l->layout_size < sizeof(*l) || l->total_size > size)
		return -EBADMSG;
	if (!l->sq_entries || !l->cq_entries || l->sq_entries > SKV_RING_MAX_ENTRIES ||
	    l->cq_entries > SKV_RING_MAX_ENTRIES || (l->sq_entries & (l->sq_entries - 1)) ||
	    (l->cq_entries & (l->cq_entries - 1)))
		return -EBADMSG;
	if (l->sq_entry_size != sizeof(struct skv_sqe) ||
	    l->cq_entry_size != sizeof(struct skv_cqe))
		return -EBADMSG;
	if (l->sq_off % SKV_RING_CACHELINE || l->cq_off % SKV_RING_CACHELINE ||
	    l->sq_off < sizeof(*l))
		return -EBADMSG;
	if (l->arg_slots < l->sq_entries || !l->arg_slot_size ||
	    l->arg_slot_size > SKV_RING_MAX_SLOT)
		return -EBADMSG;
	sq_end = (uint64_t)l->sq_off + sizeof(struct skv_ring_ctl) +
		 (uint64_t)l->sq_entries * sizeof(struct skv_sqe);
	cq_end = (uint64_t)l->cq_off + sizeof(struct skv_ring_ctl) +
		 (uint64_t)l->cq_entries * sizeof(struct skv_cqe);
	arg_end = (uint64_t)l->arg_off + (uint64_t)l->arg_slots * l->arg_slot_size;
	if (sq_end > l->cq_off || cq_end > l->arg_off || arg_end > l->total_size)
		return -EBADMSG;
	return 0;
}

/* Build the private views of a mapped, checked ring. */
static inline void skv_ring_q_init(struct skv_ring_q *q, void *base, uint32_t off,
				   uint32_t n_entries, uint32_t esize)
{
	q->ctl = (struct skv_ring_ctl *)((uint8_t *)base + off);
	q->entries = (uint8_t *)q->ctl + sizeof(struct skv_ring_ctl);
	q->n_entries = n_entries;
	q->mask = n_entries - 1;
	q->esize = esize;
	q->local = 0;
}

/* Producer-side setup for a ring someone else may have used: resume at its tail. */
static inline void skv_ring_q_resume_producer(struct skv_ring_q *q)
{
	q->local = atomic_load_explicit(&q->ctl->tail, memory_order_relaxed);
}

/*
 * Produce one entry. 0; -EAGAIN when full; -EBADMSG when the consumer's head
 * is impossible (ahead of our tail, or more than n_entries behind).
 */
static inline int skv_ring_produce(struct skv_ring_q *q, const void *entry)
{
	/* P2: pairs with C2; the consumer is done with the slot we reuse. */
	uint32_t head = atomic_load_explicit(&q->ctl->head, memory_order_acquire);
	uint32_t used = q->local - head;

	if (used > q->n_entries)
		return -EBADMSG;
	if (used == q->n_entries)
		return -EAGAIN;
	memcpy(q->entries + (size_t)(q->local & q->mask) * q->esize, entry, q->esize);
	q->local++;
	/* P1: pairs with C1; the entry is visible before the new tail. */
	atomic_store_explicit(&q->ctl->tail, q->local, memory_order_release);
	return 0;
}

/* Free entries the producer may still write; -EBADMSG as above. */
static inline int skv_ring_space(const struct skv_ring_q *q)
{
	uint32_t head = atomic_load_explicit(&q->ctl->head, memory_order_acquire);
	uint32_t used = q->local - head;

	if (used > q->n_entries)
		return -EBADMSG;
	return (int)(q->n_entries - used);
}

/* Entries ready for the consumer; -EBADMSG when the tail is corrupt. */
static inline int skv_ring_ready(const struct skv_ring_q *q)
{
	/* C1: pairs with P1. */
	uint32_t tail = atomic_load_explicit(&q->ctl->tail, memory_order_acquire);
	uint32_t n = tail - q->local;

	if (n > q->n_entries)
		return -EBADMSG;
	return (int)n;
}

/*
 * Consume one entry into a private copy (never parse it in place: the peer
 * can rewrite shared memory at any time). 0, -EAGAIN when empty, -EBADMSG
 * on a corrupt tail.
 */
static inline int skv_ring_consume(struct skv_ring_q *q, void *entry)
{
	int n = skv_ring_ready(q);

	if (n < 0)
		return n;
	if (n == 0)
		return -EAGAIN;
	memcpy(entry, q->entries + (size_t)(q->local & q->mask) * q->esize, q->esize);
	q->local++;
	/* C2: pairs with P2; our copy is taken before the slot is handed back. */
	atomic_store_explicit(&q->ctl->head, q->local, memory_order_release);
	return 0;
}

/*
 * Consumer about to sleep: W1. Sets NEED_WAKEUP, then re-checks the tail
 * after a full fence. Returns 1 when it is safe to sleep, 0 when entries
 * arrived meanwhile (flag cleared again), -EBADMSG on a corrupt tail.
 */
static inline int skv_ring_prepare_sleep(struct skv_ring_q *q)
{
	int n;

	atomic_fetch_or_explicit(&q->ctl->flags, SKV_RING_NEED_WAKEUP, memory_order_relaxed);
	/* W1: pairs with W2; either we see the new tail or the producer sees the flag. */
	atomic_thread_fence(memory_order_seq_cst);
	n = skv_ring_ready(q);
	if (n != 0) {
		atomic_fetch_and_explicit(&q->ctl->flags, ~SKV_RING_NEED_WAKEUP,
					  memory_order_relaxed);
		return n < 0 ? n : 0;
	}
	return 1;
}

static inline void skv_ring_clear_wakeup(struct skv_ring_q *q)
{
	atomic_fetch_and_explicit(&q->ctl->flags, ~SKV_RING_NEED_WAKEUP, memory_order_relaxed);
}

/* Producer after publishing: W2. 1 when the consumer asked to be woken. */
static inline int skv_ring_needs_wakeup(struct skv_ring_q *q)
{
	/* W2: pairs with W1. */
	atomic_thread_fence(memory_order_seq_cst);
	return !!(atomic_load_explicit(&q->ctl->flags, memory_order_relaxed) &
		  SKV_RING_NEED_WAKEUP);
}

#ifdef __cplusplus
}
#endif
#endif /* SKV_RING_H */
