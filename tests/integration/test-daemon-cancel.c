// SPDX-License-Identifier: MIT
/*
 * test-daemon-cancel: skv_request_cancel() and skv_client_close() are
 * fences (issue 20, the write after free): an engine that gives up on a
 * writeback compaction, cancels it and gives its destination blocks to
 * someone else must never see a write of it afterwards. Cancelled while
 * queued (behind a long job on the daemon's one worker: nothing written),
 * while running (stopped part-way or completed, never after the cancel),
 * after it completed (the cache handed back), and abandoned then closed
 * (close fences it). After each cancel the destination is refilled (reused)
 * and a small compaction is run through the same worker, which then has
 * left the cancelled job behind: the refill must be intact.
 *
 * Runs on --backend cuda too (SNAPKVD_TEST_BACKEND=cuda-emu, the
 * emulator; tests/gpu/emu/test-daemon-suites-cuda-emu.sh), where a running
 * compaction cannot stop part-way but its cancel returns after its stream.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon-harness.h"
#include "snapkv.h"

#define LAYERS 48
#define H_Q    8
#define H_KV   2
#define D      64
#define L      8192
#define W      32
#define C      256
#define BS     16
#define NB     (C / BS) /* destination blocks per pool: exactly the kept rows */
#define POOL_B ((size_t)NB * BS * H_KV * D * 2) /* bytes of one f16 pool */
#define DEST_B ((size_t)LAYERS * 2 * POOL_B)	/* one request's destination */
#define FILL   0x5a
#define HANG_S 120 /* a hang guard, never a timing */

static struct harness H;
static struct skv_client *cl;
static struct skv_buffer *kv, *qb;
static struct skv_layer_ref lin[LAYERS];
/* layers of a long request: fewer on the emulated GPU, whose kernels run
 * on the CPU one thread per block and take long enough with a quarter */
static uint32_t n_layers = LAYERS;

/* Destinations the test maps itself (they outlive a closed client). */
struct dest {
	int fd;
	uint8_t *p;
	struct skv_buffer *b;
	struct skv_layer_out_ref out[LAYERS];
	int32_t table[NB];
};

static struct dest da, db;

static int dest_new(struct skv_client *c, struct dest *d)
{
	d->fd = memfd_create("cancel-dest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (d->fd < 0 || ftruncate(d->fd, (off_t)DEST_B) < 0 ||
	    fcntl(d->fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		return -1;
	d->p = mmap(NULL, DEST_B, PROT_READ | PROT_WRITE, MAP_SHARED, d->fd, 0);
	if (d->p == MAP_FAILED)
		return -1;
	memset(d->p, FILL, DEST_B);
	if (skv_buffer_register_fd_flags(c, d->fd, DEST_B, SKV_BUFFER_WRITABLE, &d->b) < 0)
		return -1;
	for (uint32_t l = 0; l < LAYERS; l++)
		for (int v = 0; v < 2; v++) {
			struct skv_tensor_ref *t = v ? &d->out[l].v : &d->out[l].k;

			*t = (struct skv_tensor_ref){.buf = d->b,
						     .offset = (uint64_t)(2 * l + v) * POOL_B,
						     .dtype = SKV_DTYPE_F16,
						     .head_stride = D,
						     .token_stride = H_KV * D,
						     .block_stride = BS * H_KV * D};
		}
	for (int i = 0; i < NB; i++)
		d->table[i] = NB - 1 - i;
	return 0;
}

static void dest_free(struct dest *d)
{
	if (d->p && d->p != MAP_FAILED)
		munmap(d->p, DEST_B);
	if (d->fd >= 0)
		close(d->fd);
	d->p = NULL;
	d->fd = -1;
}

/* Bytes of d that are not FILL (what the daemon wrote there). */
static size_t dest_written(const struct dest *d)
{
	size_t n = 0;

	for (size_t i = 0; i < DEST_B; i++)
		n += d->p[i] != FILL;
	return n;
}

static void desc_init(struct skv_compact_desc *d, uint32_t layers, struct dest *out)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape =
	    (struct skv_shape){.prompt_len = L, .head_dim = D, .h_q = H_Q, .h_kv = H_KV, .n_q = W};
	d->layers = layers;
	skv_client_params_init(&d->params);
	d->params.window = W;
	d->params.capacity = C;
	d->params.gqa = SKV_GQA_GROUP;
	d->layer = lin;
	if (out) {
		d->out_layout = SKV_LAYOUT_PAGED;
		d->out_block_size = BS;
		d->out_dest = SKV_OUT_WRITEBACK;
		d->out_layer = out->out;
		d->out_block_table = out->table;
		d->out_n_blocks = NB;
	}
}

static int suite_init(void)
{
	uint64_t seed = 20;
	size_t nkv = (size_t)2 * H_KV * L * D, nq = (size_t)H_Q * W * D;

	da.fd = db.fd = -1;
	if (h_backend_cuda())
		n_layers = LAYERS / 4;
	if (h_start_config(&H, "snapkvd-cancel", "max_prompt_len = 65536\n") < 0 ||
	    skv_client_connect(H.sock, NULL, &cl) < 0)
		return -1;
	/* every layer reads the same K/V (one layer's worth of memory); each
	 * layer still costs a full scoring */
	if (skv_buffer_alloc(cl, nkv * 2, &kv) < 0 || skv_buffer_alloc(cl, nq * 2, &qb) < 0)
		return -1;
	uint16_t *k = skv_buffer_data(kv), *q = skv_buffer_data(qb);

	for (size_t i = 0; i < nkv; i++)
		k[i] = skv_f32_to_f16(h_rand(&seed));
	for (size_t i = 0; i < nq; i++)
		q[i] = skv_f32_to_f16(h_rand(&seed));
	for (uint32_t l = 0; l < LAYERS; l++) {
		lin[l].q = (struct skv_tensor_ref){
		    .buf = qb, .dtype = SKV_DTYPE_F16, .head_stride = W * D, .token_stride = D};
		lin[l].k = (struct skv_tensor_ref){
		    .buf = kv, .dtype = SKV_DTYPE_F16, .head_stride = L * D, .token_stride = D};
		lin[l].v = lin[l].k;
		lin[l].v.offset = (uint64_t)H_KV * L * D * 2;
	}
	return dest_new(cl, &da) < 0 || dest_new(cl, &db) < 0 ? -1 : 0;
}

static int suite_clean(void)
{
	int st;

	skv_client_close(cl);
	dest_free(&da);
	dest_free(&db);
	st = h_stop(&H);
	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

/* Until the daemon has written into d: its job is running (hang guard). */
static bool wait_running(const struct dest *d)
{
	for (int i = 0; i < HANG_S * 500; i++) {
		if (dest_written(d))
			return true;
		h_sleep_ms(2);
	}
	return false;
}

/* A small compaction through the daemon's one worker: FIFO, so once it is
 * done the worker has left every earlier job behind. */
static void through_the_worker(struct skv_client *c)
{
	struct skv_compact_desc d;
	struct skv_cache *k = NULL;

	desc_init(&d, 1, NULL);
	CU_ASSERT_EQUAL_FATAL(skv_client_compact(c, &d, &k), 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
}

/* A queued request, then a running one: the queued one never writes, the
 * running one stops (or completes) before its cancel returns, and neither
 * writes after. */
static void test_queued_then_running(void)
{
	struct skv_compact_desc d;
	struct skv_request *ra = NULL, *rb = NULL;
	struct skv_stats st;
	int r;

	desc_init(&d, n_layers, &da);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(cl, &d, &ra), 0);
	CU_ASSERT_FATAL(wait_running(&da));
	desc_init(&d, n_layers, &db);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(cl, &d, &rb), 0);
	/* b is queued behind a on the one worker */
	r = skv_request_cancel(rb, HANG_S * 1000, NULL);
	if (skv_request_poll(ra) == 0) { /* a still runs: b never started */
		CU_ASSERT_EQUAL(r, SKV_CANCEL_UNWRITTEN);
		CU_ASSERT_EQUAL(dest_written(&db), 0);
	} else {
		printf("\n  (the long job ended before the queued cancel: %d)\n", r);
		CU_ASSERT(r >= 0);
	}
	memset(db.p, FILL, DEST_B); /* reused */
	r = skv_request_cancel(ra, HANG_S * 1000, NULL);
	CU_ASSERT(r == SKV_CANCEL_STOPPED || r == SKV_CANCEL_COMPLETED);
	printf("\n  running job cancelled: %s, %zu bytes written before\n",
	       r == SKV_CANCEL_STOPPED ? "stopped" : "completed", dest_written(&da));
	memset(da.p, FILL, DEST_B); /* reused */
	through_the_worker(cl);
	CU_ASSERT_EQUAL(dest_written(&da), 0);
	CU_ASSERT_EQUAL(dest_written(&db), 0);
	CU_ASSERT_EQUAL(skv_client_stats(cl, &st), 0);
	CU_ASSERT_EQUAL(st.caches, 0); /* a cancelled job keeps nothing */
}

/* Cancel after completion: COMPLETED, every block written, the cache here. */
static void test_completed(void)
{
	struct skv_compact_desc d;
	struct skv_request *rq = NULL;
	struct skv_cache *k = NULL;
	int i;

	desc_init(&d, 2, &da);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(cl, &d, &rq), 0);
	for (i = 0; i < HANG_S * 1000 && skv_request_poll(rq) == 0; i++)
		h_sleep_ms(1);
	CU_ASSERT_EQUAL(skv_request_poll(rq), 1);
	CU_ASSERT_EQUAL(skv_request_cancel(rq, -1, &k), SKV_CANCEL_COMPLETED);
	CU_ASSERT_FATAL(k != NULL);
	CU_ASSERT_EQUAL(skv_cache_info(k)->kept, C);
	CU_ASSERT(dest_written(&da) > 0);
	CU_ASSERT_EQUAL(skv_cache_release(k), 0);
	memset(da.p, FILL, DEST_B);
}

/* Abandoned (plain abandon: no fence), then the client closed: close is
 * the fence. The destination is the test's own mapping, so it outlives
 * the client. */
static void test_close_fences(void)
{
	struct skv_client *c2 = NULL;
	struct skv_compact_desc d;
	struct skv_request *rq = NULL;
	struct dest dc = {.fd = -1};

	CU_ASSERT_EQUAL_FATAL(skv_client_connect(H.sock, NULL, &c2), 0);
	CU_ASSERT_EQUAL_FATAL(dest_new(c2, &dc), 0);
	/* c2's own K/V: the same bytes in buffers it registers */
	struct skv_buffer *kv2 = NULL, *q2 = NULL;

	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c2, skv_buffer_size(kv), &kv2), 0);
	CU_ASSERT_EQUAL_FATAL(skv_buffer_alloc(c2, skv_buffer_size(qb), &q2), 0);
	memcpy(skv_buffer_data(kv2), skv_buffer_data(kv), skv_buffer_size(kv));
	memcpy(skv_buffer_data(q2), skv_buffer_data(qb), skv_buffer_size(qb));
	for (uint32_t l = 0; l < LAYERS; l++) {
		lin[l].q.buf = q2;
		lin[l].k.buf = lin[l].v.buf = kv2;
	}
	desc_init(&d, n_layers, &dc);
	CU_ASSERT_EQUAL_FATAL(skv_compact_submit(c2, &d, &rq), 0);
	for (uint32_t l = 0; l < LAYERS; l++) {
		lin[l].q.buf = qb;
		lin[l].k.buf = lin[l].v.buf = kv;
	}
	CU_ASSERT_FATAL(wait_running(&dc));
	skv_request_abandon(rq);
	skv_client_close(c2);
	memset(dc.p, FILL, DEST_B); /* reused */
	through_the_worker(cl);
	CU_ASSERT_EQUAL(dest_written(&dc), 0);
	dest_free(&dc);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("daemon-cancel", suite_init, suite_clean);
	CU_add_test(s, "queued: never written; running: stopped, nothing after the cancel",
		    test_queued_then_running);
	CU_add_test(s, "cancel after completion: the cache handed back", test_completed);
	CU_add_test(s, "abandon then close: close fences the writes", test_close_fences);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	unsigned failed = CU_get_number_of_failures() + CU_get_number_of_suites_failed();
	CU_cleanup_registry();
	return failed ? 1 : 0;
}
