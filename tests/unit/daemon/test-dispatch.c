// SPDX-License-Identifier: MIT
/*
 * test-dispatch: a session's requests and completions on its ring
 * (daemon/snapkvd-dispatch.c, over the session of snapkvd-session.c and a
 * real ring): completions, back-pressure when the engine stops reading its
 * CQ, pressure events through the session, requests in argument slots
 * (bad slots, NOP, STATS, a COMPACT refused with its reason), and a corrupt
 * ring closing the session. The engine's side is played here.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "daemon/snapkvd-dispatch.c"
#include "daemon/snapkvd-session.c"
#include "tests/test-skip.h"

/* ------------------------------------------------------------- the fakes */

int snapkvd_loop_read(struct snapkvd_loop *l, int fd, void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd, (void)buf, (void)len, (void)ev;
	return 0;
}

static unsigned validated;

int snapkvd_request_compact(const struct snapkvd_request_env *env, struct snapkvd_session *s,
			    const struct snapkvd_origin *o, const Snapkv__V1__CompactRequest *req,
			    struct snapkvd_job **ret, char *err, size_t errlen)
{
	(void)env, (void)s, (void)o, (void)req, (void)ret;
	validated++;
	snprintf(err, errlen, "refused by the fake validator");
	return -EINVAL;
}

int snapkvd_request_grow(const struct snapkvd_request_env *env, const struct snapkvd_cache *c,
			 uint32_t extra, uint32_t *ret_slots, struct snapkvd_cache_geom *ret_geom,
			 const char **err)
{
	(void)env, (void)c, (void)extra, (void)ret_slots, (void)ret_geom;
	*err = "fake";
	return -EINVAL;
}

int snapkvd_paged_grow_blocks(const struct snapkvd_request_env *env, const struct snapkvd_cache *c,
			      uint32_t slots, const int32_t *tab, size_t n, int32_t **ret_table,
			      char *err, size_t errlen)
{
	(void)env, (void)c, (void)slots, (void)tab, (void)n, (void)err, (void)errlen;
	*ret_table = NULL;
	return 0;
}

void snapkvd_paged_grow_done(struct snapkvd_cache *c, struct snapkvd_job *j, uint8_t *host_base,
			     uint32_t old_slots)
{
	(void)c, (void)j, (void)host_base, (void)old_slots;
}

int snapkvd_admission_compact(struct snapkvd_server *srv, struct snapkvd_session *s,
			      struct snapkvd_job *j, char *err, size_t errlen)
{
	(void)srv, (void)s, (void)j, (void)err, (void)errlen;
	return -ENOSYS;
}

int snapkvd_admission_grow(struct snapkvd_server *srv, struct snapkvd_session *s,
			   struct snapkvd_job *j, char *err, size_t errlen)
{
	(void)srv, (void)s, (void)j, (void)err, (void)errlen;
	return -ENOSYS;
}

void snapkvd_compactor_submit(struct snapkvd_compactor *c, struct snapkvd_job *j)
{
	(void)c, (void)j;
	CU_FAIL("nothing reaches the compactor here");
}

static struct snapkvd_job *dequeued; /* what SKV_OP_CANCEL took off the queue */

bool snapkvd_compactor_cancel(struct snapkvd_compactor *c, struct snapkvd_job *j)
{
	(void)c;
	dequeued = j;
	return true;
}

void snapkvd_compactor_finish(struct snapkvd_compactor *c, struct snapkvd_job *list)
{
	(void)c, (void)list;
}

unsigned snapkvd_compactor_threads(const struct snapkvd_compactor *c)
{
	(void)c;
	return 1;
}

void snapkvd_buffers_init(struct snapkvd_buffers *set, struct snapkvd_pool *pool,
			  struct snapkvd_tenant *tenant, struct snapkvd_device *dev,
			  uint64_t session_id)
{
	(void)set, (void)pool, (void)tenant, (void)dev, (void)session_id;
}

void snapkvd_buffers_clear(struct snapkvd_buffers *set)
{
	(void)set;
}

void snapkvd_buffer_unref(struct snapkvd_buffer *b)
{
	(void)b;
}

/* snapkvd-kvpool.c's only neighbour: no buffers here (tables by reference
 * are judged in test-daemon-pools) */
struct snapkvd_buffer *snapkvd_buffer_find(struct snapkvd_buffer *list, uint64_t id)
{
	(void)list, (void)id;
	return NULL;
}

uint8_t *snapkvd_device_arena_base(struct snapkvd_device *d, struct skv_cuda_arena *a)
{
	(void)d, (void)a;
	return NULL;
}

void snapkvd_device_arena_free(struct snapkvd_device *d, unsigned gpu, struct skv_cuda_arena *a)
{
	(void)d, (void)gpu, (void)a;
}

void snapkvd_device_wait_poke(struct snapkvd_device *d)
{
	(void)d;
}

static unsigned errors_counted;

uint64_t snapkvd_policy_tenant_quota(const struct snapkvd_policy *ops, uid_t uid)
{
	(void)ops, (void)uid;
	return 0;
}

int snapkvd_policy_greeting(const struct snapkvd_policy *ops, enum snapkvd_pressure_level *lv,
			    uint32_t *cap, uint32_t *permille, uint64_t *used)
{
	(void)ops, (void)lv, (void)cap, (void)permille, (void)used;
	return 0;
}

void snapkvd_policy_mark_dirty(struct snapkvd_policy *ops)
{
	(void)ops;
}

void snapkvd_policy_observe_compaction(struct snapkvd_policy *ops, double seconds,
				       const float *mass, size_t n_mass)
{
	(void)ops, (void)seconds, (void)mass, (void)n_mass;
}

void snapkvd_policy_observe_budget(struct snapkvd_policy *ops, int mode, double kept_fraction,
				   bool fallback)
{
	(void)ops, (void)mode, (void)kept_fraction, (void)fallback;
}

void snapkvd_policy_count_error(struct snapkvd_policy *ops, int err)
{
	(void)ops, (void)err;
	errors_counted++;
}

/* -------------------------------------------------- a session and its ring */

static struct snapkvd_server srv;
static struct snapkvd_session *s;
static struct snapkvd_ring *r;	   /* s's */
static struct skv_ring_q esq, ecq; /* the engine's ends */
static int peer = -1;

/* A session on one end of a socketpair, with a ring of 4 SQ entries (and so
 * 8 CQ entries), as after its HELLO. */
static void open_session(void)
{
	int sv[2];

	memset(&srv, 0, sizeof(srv));
	snapkvd_config_defaults(&srv.cfg);
	srv.cfg.slot_bytes = 256;
	CU_ASSERT_EQUAL_FATAL(snapkvd_pool_new(1 << 30, 0, &srv.pool), 0);
	CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	peer = sv[1];
	CU_ASSERT_EQUAL_FATAL(snapkvd_session_new(&srv, sv[0], &s), 0);
	CU_ASSERT_EQUAL_FATAL(setup_engine(s, 4), 0);
	r = s->ring;
	s->greeted = true;
	s->refs++; /* kept after a close, to look at */
	skv_ring_q_init(&esq, r->map, r->layout.sq_off, r->layout.sq_entries,
			sizeof(struct skv_sqe));
	skv_ring_q_init(&ecq, r->map, r->layout.cq_off, r->layout.cq_entries,
			sizeof(struct skv_cqe));
}

static void close_session(void)
{
	snapkvd_session_close(s, 0);
	snapkvd_session_unref(s); /* our extra reference: frees it */
	CU_ASSERT_PTR_NULL(srv.sessions);
	close(peer);
	snapkvd_pool_free(srv.pool);
}

static void submit(uint8_t opcode, uint64_t user_data, uint32_t slot, uint32_t len)
{
	struct skv_sqe sqe = {.opcode = opcode, .slot = slot, .len = len, .user_data = user_data};

	CU_ASSERT_EQUAL(skv_ring_produce(&esq, &sqe), 0);
}

/* A Request packed into argument slot `slot`. */
static uint32_t put_request(uint32_t slot, Snapkv__V1__Request *rq)
{
	size_t n = snapkv__v1__request__get_packed_size(rq);

	CU_ASSERT_FATAL(n <= r->layout.arg_slot_size);
	snapkv__v1__request__pack(rq, r->map + r->layout.arg_off +
					  (size_t)slot * r->layout.arg_slot_size);
	return (uint32_t)n;
}

static int reap(struct skv_cqe *cqe)
{
	return skv_ring_consume(&ecq, cqe);
}

static void test_nop(void)
{
	struct skv_cqe cqe;

	open_session();
	CU_ASSERT_EQUAL(r->layout.sq_entries, 4);
	CU_ASSERT_EQUAL(r->layout.cq_entries, 8);
	submit(SKV_OP_NOP, 42, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 1);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.user_data, 42);
	CU_ASSERT_EQUAL(cqe.res, 0);
	CU_ASSERT_EQUAL(cqe.flags, 0);
	CU_ASSERT_EQUAL(r->inflight, 0);
	CU_ASSERT_EQUAL(reap(&cqe), -EAGAIN);
	/* an empty SQ: nothing to do */
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 0);
	/* the budget bounds one poll */
	for (int i = 0; i < 3; i++)
		submit(SKV_OP_NOP, i, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 2), 2);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 2), 1);
	close_session();
}

/* An engine that stops reading completions stops being served: nothing is
 * dropped, and the rest is served once it reads again. */
static void test_back_pressure(void)
{
	struct skv_cqe cqe;

	open_session();
	for (int i = 0; i < 4; i++)
		submit(SKV_OP_NOP, i, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 4);
	for (int i = 4; i < 8; i++)
		submit(SKV_OP_NOP, i, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 4); /* the CQ is full now */
	submit(SKV_OP_NOP, 8, 0, 0);
	submit(SKV_OP_NOP, 9, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 0);
	CU_ASSERT_EQUAL(skv_ring_ready(&r->sq), 2); /* still there */
	/* about to sleep with work it may not take: no reason to stay awake */
	CU_ASSERT_FALSE(snapkvd_session_prepare_sleep(s));
	CU_ASSERT(skv_ring_needs_wakeup(&esq) || (r->sq.ctl->flags & SKV_RING_NEED_WAKEUP));
	snapkvd_session_wake(s);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.user_data, 0);
	/* one slot free: one served, in order */
	CU_ASSERT_TRUE(snapkvd_session_prepare_sleep(s)); /* now it may: stay awake */
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 1);
	for (int i = 1; i <= 8; i++) {
		CU_ASSERT_EQUAL(reap(&cqe), 0);
		CU_ASSERT_EQUAL(cqe.user_data, (uint64_t)i);
	}
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 1);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.user_data, 9);
	close_session();
}

/* SKV_OP_CANCEL has no completion of its own and takes no CQ slot: one
 * naming nothing in flight changes nothing; one naming a queued COMPACT
 * flags it and has it taken off the queue; a second is ignored. */
static void test_cancel_op(void)
{
	struct snapkvd_origin o = {.ring = true, .has_slot = true, .slot = 1, .user_data = 7};
	struct snapkvd_job *j;
	struct skv_cqe cqe;

	open_session();
	CU_ASSERT(r->layout.features & SKV_RING_F_CANCEL);
	submit(SKV_OP_CANCEL, 99, 0, 0);
	submit(SKV_OP_NOP, 1, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 2);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.user_data, 1); /* the NOP's: the cancel posted nothing */
	CU_ASSERT_EQUAL(reap(&cqe), -EAGAIN);
	CU_ASSERT_EQUAL(r->inflight, 0);
	j = snapkvd_job_new(SNAPKVD_JOB_COMPACT, s, &o);
	CU_ASSERT_FATAL(j != NULL);
	j->s_next = s->jobs;
	s->jobs = j;
	dequeued = NULL;
	submit(SKV_OP_CANCEL, 8, 0, 0); /* another request's name */
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 1);
	CU_ASSERT_PTR_NULL(dequeued);
	CU_ASSERT_FALSE(snapkvd_job_cancelled(j));
	submit(SKV_OP_CANCEL, 7, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 1);
	CU_ASSERT_PTR_EQUAL(dequeued, j);
	CU_ASSERT_TRUE(snapkvd_job_cancelled(j));
	CU_ASSERT_STRING_EQUAL(snapkvd_job_cancel_reason(j), "the request was cancelled");
	dequeued = NULL;
	submit(SKV_OP_CANCEL, 7, 0, 0); /* again: already cancelled */
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 1);
	CU_ASSERT_PTR_NULL(dequeued);
	CU_ASSERT_EQUAL(reap(&cqe), -EAGAIN);
	CU_ASSERT_EQUAL(r->inflight, 0);
	s->jobs = NULL;
	snapkvd_job_free(j);
	close_session();
}

/* Events never take the completion slot of a request in flight. */
static void test_events(void)
{
	struct skv_cqe cqe;

	open_session();
	CU_ASSERT_EQUAL(snapkvd_session_post_pressure(s, 1, 512, 500, 12345), 1);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.flags, SKV_CQE_F_EVENT);
	CU_ASSERT_EQUAL(cqe.user_data, SKV_EVENT_PRESSURE);
	CU_ASSERT_EQUAL(cqe.res, 2); /* level 1 (high) + 1 */
	CU_ASSERT_EQUAL(cqe.slot, 512);
	CU_ASSERT_EQUAL(cqe.len, 500);
	CU_ASSERT_EQUAL(cqe.reserved, 12345);
	CU_ASSERT_TRUE(r->cq_dirty);
	/* 8 CQ slots, 8 requests in flight: the event is missed */
	r->inflight = 8;
	CU_ASSERT_EQUAL(snapkvd_session_post_pressure(s, 2, 0, 0, 0), -EAGAIN);
	r->inflight = 7;
	CU_ASSERT_EQUAL(snapkvd_session_post_pressure(s, 2, 0, 0, 0), 1);
	/* one unread event per ring: the next waits (coalesced) for it */
	CU_ASSERT_EQUAL(snapkvd_session_post_pressure(s, 0, 2048, 1000, 7), 1);
	CU_ASSERT_EQUAL(snapkvd_session_post_pressure(s, 1, 1024, 500, 8), 1);
	CU_ASSERT_TRUE(r->pev_waiting);
	CU_ASSERT_EQUAL(r->events_coalesced, 1);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.res, 3);
	CU_ASSERT_EQUAL(reap(&cqe), -EAGAIN); /* nothing more until flushed */
	snapkvd_session_flush_cq(s);	      /* the engine read it: the newest goes */
	CU_ASSERT_FALSE(r->pev_waiting);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.res, 2);
	CU_ASSERT_EQUAL(cqe.reserved, 8);
	r->inflight = 0;
	/* admin sessions and sessions without a ring get none */
	s->admin = true;
	CU_ASSERT_EQUAL(snapkvd_session_post_pressure(s, 2, 0, 0, 0), 0);
	s->admin = false;
	close_session();
}

/* Requests in argument slots: a bad slot, an unknown opcode, a NOP and a
 * STATS request, a COMPACT refused with its reason in the slot. */
static void test_requests(void)
{
	Snapkv__V1__Request rq = SNAPKV__V1__REQUEST__INIT;
	Snapkv__V1__CompactRequest cr = SNAPKV__V1__COMPACT_REQUEST__INIT;
	Snapkv__V1__NopRequest nop = SNAPKV__V1__NOP_REQUEST__INIT;
	Snapkv__V1__StatsRequest stats = SNAPKV__V1__STATS_REQUEST__INIT;
	Snapkv__V1__Response *resp;
	struct skv_cqe cqe;
	uint32_t n;

	open_session();
	submit(SKV_OP_REQUEST, 1, r->layout.arg_slots, 4);
	submit(SKV_OP_REQUEST, 2, 0, r->layout.arg_slot_size + 1);
	submit(77, 3, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 3);
	for (int i = 1; i <= 3; i++) {
		CU_ASSERT_EQUAL(reap(&cqe), 0);
		CU_ASSERT_EQUAL(cqe.res, i < 3 ? -EINVAL : -EOPNOTSUPP);
	}
	rq.op_case = SNAPKV__V1__REQUEST__OP_NOP;
	rq.nop = &nop;
	n = put_request(0, &rq);
	submit(SKV_OP_REQUEST, 4, 0, n);
	rq.op_case = SNAPKV__V1__REQUEST__OP_STATS;
	rq.stats = &stats;
	n = put_request(1, &rq);
	submit(SKV_OP_REQUEST, 5, 1, n);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 2);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.res, 0);
	CU_ASSERT_EQUAL(cqe.len, 0); /* a bare success carries no Response */
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.res, 0);
	CU_ASSERT_EQUAL(cqe.slot, 1);
	resp = snapkv__v1__response__unpack(
	    NULL, cqe.len, r->map + r->layout.arg_off + (size_t)1 * r->layout.arg_slot_size);
	CU_ASSERT_PTR_NOT_NULL_FATAL(resp);
	CU_ASSERT_EQUAL_FATAL(resp->result_case, SNAPKV__V1__RESPONSE__RESULT_STATS);
	CU_ASSERT_EQUAL(resp->stats->pool_total, 1 << 30);
	snapkv__v1__response__free_unpacked(resp, NULL);
	rq.op_case = SNAPKV__V1__REQUEST__OP_COMPACT;
	rq.compact = &cr;
	n = put_request(2, &rq);
	submit(SKV_OP_REQUEST, 6, 2, n);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 1);
	CU_ASSERT_EQUAL(validated, 1);
	CU_ASSERT_EQUAL(reap(&cqe), 0);
	CU_ASSERT_EQUAL(cqe.res, -EINVAL);
	resp = snapkv__v1__response__unpack(
	    NULL, cqe.len, r->map + r->layout.arg_off + (size_t)2 * r->layout.arg_slot_size);
	CU_ASSERT_PTR_NOT_NULL_FATAL(resp);
	CU_ASSERT_STRING_EQUAL(resp->error, "refused by the fake validator");
	snapkv__v1__response__free_unpacked(resp, NULL);
	CU_ASSERT(errors_counted >= 3);
	close_session();
}

/* Indices we cannot trust close the session with -EBADMSG. */
static void test_corrupt(void)
{
	open_session();
	/* the engine claims more entries than the SQ holds */
	atomic_store(&r->sq.ctl->tail, r->sq.local + r->layout.sq_entries + 3);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 0);
	CU_ASSERT_TRUE(s->closing);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 0); /* closed: not polled */
	close_session();
	/* a CQ head beyond the tail */
	open_session();
	atomic_store(&r->cq.ctl->head, r->cq.local + 100);
	submit(SKV_OP_NOP, 1, 0, 0);
	CU_ASSERT_EQUAL(snapkvd_dispatch_poll_ring(s, 64), 0);
	CU_ASSERT_TRUE(s->closing);
	close_session();
	/* found corrupt while preparing to sleep */
	open_session();
	atomic_store(&r->cq.ctl->head, r->cq.local + 100);
	CU_ASSERT_FALSE(snapkvd_session_prepare_sleep(s));
	CU_ASSERT_TRUE(s->closing);
	close_session();
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	snapkvd_log_max = SNAPKVD_LOG_ERR - 1; /* quiet */
	su = CU_add_suite("dispatch", NULL, NULL);
	CU_add_test(su, "a NOP completes; the budget bounds a poll", test_nop);
	CU_add_test(su, "back-pressure on a full CQ", test_back_pressure);
	CU_add_test(su, "SKV_OP_CANCEL: no completion of its own, its target dequeued",
		    test_cancel_op);
	CU_add_test(su, "pressure events", test_events);
	CU_add_test(su, "requests in argument slots", test_requests);
	CU_add_test(su, "a corrupt ring closes the session", test_corrupt);
	return t_run();
}
