// SPDX-License-Identifier: MIT
/*
 * test-libsnapkv-threads - libsnapkv's promise that "a client is safe to use
 * from several threads (calls are serialised internally)", kept from C: one
 * client shared by THREADS threads, each registering a buffer of its own,
 * compacting it synchronously and asynchronously, appending, growing and
 * releasing its caches, with stats and NOPs over the ring and the socket in
 * between, against a private snapkvd. Every call succeeds, every cache's
 * positions equal those of the same compaction done alone first, and the
 * pool is back at its baseline. Built into check-tsan, where a data race in
 * the client (or the daemon's workers, SNAPKVD_TEST_WORKERS) fails it.
 */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "daemon-harness.h"
#include "snapkv.h"

#define THREADS 4
#define ROUNDS	16
#define LAYERS	2

static struct harness H;
static struct skv_client *shared;

struct prob {
	uint32_t h_q, h_kv, d, L, w, C;
	size_t q_off[LAYERS], k_off[LAYERS], v_off[LAYERS], bytes;
};

static void prob_init(struct prob *p, uint32_t L)
{
	size_t off = 0;

	*p = (struct prob){.h_q = 4, .h_kv = 2, .d = 16, .L = L, .w = 8, .C = 24};
	for (uint32_t l = 0; l < LAYERS; l++) {
		p->q_off[l] = off;
		off += (size_t)p->h_q * p->w * p->d * 4;
		p->k_off[l] = off;
		off += (size_t)p->h_kv * L * p->d * 4;
		p->v_off[l] = off;
		off += (size_t)p->h_kv * L * p->d * 4;
	}
	p->bytes = off;
}

static void prob_desc(const struct prob *p, struct skv_buffer *b, struct skv_layer_ref *lr,
		      struct skv_compact_desc *d)
{
	memset(d, 0, sizeof(*d));
	d->desc_size = sizeof(*d);
	d->shape = (struct skv_shape){
	    .prompt_len = p->L, .head_dim = p->d, .h_q = p->h_q, .h_kv = p->h_kv, .n_q = p->w};
	d->layers = LAYERS;
	skv_client_params_init(&d->params);
	d->params.window = p->w;
	d->params.capacity = p->C;
	d->params.kernel = 5;
	for (uint32_t l = 0; l < LAYERS; l++) {
		lr[l].q = (struct skv_tensor_ref){
		    b, p->q_off[l], SKV_DTYPE_F32, (int64_t)p->w * p->d, p->d, 0, 0};
		lr[l].k = (struct skv_tensor_ref){
		    b, p->k_off[l], SKV_DTYPE_F32, (int64_t)p->L * p->d, p->d, 0, 0};
		lr[l].v = (struct skv_tensor_ref){
		    b, p->v_off[l], SKV_DTYPE_F32, (int64_t)p->L * p->d, p->d, 0, 0};
	}
	d->layer = lr;
	d->decode_reserve = 4;
}

/* One thread's work; the first failure, as "what: -errno", in msg. */
struct worker {
	pthread_t t;
	unsigned id;
	int32_t want[LAYERS][4][32]; /* positions of its compaction, alone */
	uint32_t kept, h_store;
	char msg[200];
	unsigned compactions;
};

#define TRY(what, call)                                                                            \
	do {                                                                                       \
		int r_ = (call);                                                                   \
		if (r_ < 0) {                                                                      \
			snprintf(w->msg, sizeof(w->msg), "thread %u: %s: %d (%s)", w->id, what,    \
				 r_, skv_client_error(shared));                                    \
			goto out;                                                                  \
		}                                                                                  \
	} while (0)

static int same_positions(const struct worker *w, const struct skv_cache *k)
{
	for (uint32_t l = 0; l < LAYERS; l++)
		for (uint32_t h = 0; h < w->h_store; h++)
			if (memcmp(skv_cache_positions(k, l, h), w->want[l][h],
				   w->kept * sizeof(int32_t)))
				return 0;
	return 1;
}

/* The thread's problem: a buffer of its own, filled from its id. */
static int setup(struct worker *w, struct prob *p, struct skv_buffer **b, struct skv_layer_ref *lr,
		 struct skv_compact_desc *d)
{
	uint64_t seed = 1000 + w->id;
	float *f;

	prob_init(p, 96 + 32 * w->id);
	if (skv_buffer_alloc(shared, p->bytes, b) < 0)
		return -1;
	f = skv_buffer_data(*b);
	for (size_t i = 0; i < p->bytes / 4; i++)
		f[i] = h_rand(&seed) * 2.0f;
	prob_desc(p, *b, lr, d);
	return 0;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	struct skv_buffer *b = NULL;
	struct skv_layer_ref lr[LAYERS];
	struct skv_compact_desc d;
	struct skv_cache *k = NULL, *k2 = NULL;
	struct skv_request *rq = NULL;
	struct skv_stats st;
	struct prob p;

	TRY("buffer_alloc", setup(w, &p, &b, lr, &d));
	for (unsigned round = 0; round < ROUNDS; round++) {
		TRY("nop", skv_client_nop(shared));
		TRY("stats", skv_client_stats(shared, &st));
		TRY("compact", skv_client_compact(shared, &d, &k));
		w->compactions++;
		if (!same_positions(w, k)) {
			snprintf(w->msg, sizeof(w->msg), "thread %u: positions differ", w->id);
			goto out;
		}
		/* one asynchronous beside the synchronous one's cache */
		TRY("submit", skv_compact_submit(shared, &d, &rq));
		TRY("nop_socket", skv_client_nop_socket(shared));
		TRY("append", skv_cache_append(k, 2));
		TRY("wait", skv_request_wait(rq, -1, &k2));
		rq = NULL;
		w->compactions++;
		if (!same_positions(w, k2)) {
			snprintf(w->msg, sizeof(w->msg), "thread %u: positions differ (async)",
				 w->id);
			goto out;
		}
		TRY("grow", skv_cache_grow(k2, 4));
		TRY("release", skv_cache_release(k));
		k = NULL;
		TRY("release", skv_cache_release(k2));
		k2 = NULL;
	}
out:
	if (rq)
		skv_request_abandon(rq);
	if (k)
		skv_cache_release(k);
	if (k2)
		skv_cache_release(k2);
	if (b)
		skv_buffer_free(b);
	return NULL;
}

static int suite_init(void)
{
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = "threads"};

	if (h_start(&H, NULL) < 0)
		return -1;
	return skv_client_connect(H.sock, &o, &shared) == 0 ? 0 : -1;
}

static int suite_clean(void)
{
	int st;

	skv_client_close(shared);
	st = h_stop(&H);
	h_cleanup(&H);
	return st == 0 ? 0 : -1;
}

static void test_one_client_many_threads(void)
{
	static struct worker w[THREADS];
	long long base = h_pool_used(H.sock);
	unsigned total = 0;

	/* each thread's compaction alone first: the positions to expect */
	for (unsigned i = 0; i < THREADS; i++) {
		struct skv_buffer *b = NULL;
		struct skv_layer_ref lr[LAYERS];
		struct skv_compact_desc d;
		struct skv_cache *k = NULL;
		const struct skv_cache_info *ci;
		struct prob p;

		w[i] = (struct worker){.id = i};
		CU_ASSERT_EQUAL_FATAL(setup(&w[i], &p, &b, lr, &d), 0);
		CU_ASSERT_EQUAL_FATAL(skv_client_compact(shared, &d, &k), 0);
		ci = skv_cache_info(k);
		CU_ASSERT_FATAL(ci->kept <= 32 && ci->h_store <= 4);
		w[i].kept = ci->kept;
		w[i].h_store = ci->h_store;
		for (uint32_t l = 0; l < LAYERS; l++)
			for (uint32_t h = 0; h < ci->h_store; h++)
				memcpy(w[i].want[l][h], skv_cache_positions(k, l, h),
				       ci->kept * sizeof(int32_t));
		CU_ASSERT_EQUAL(skv_cache_release(k), 0);
		CU_ASSERT_EQUAL(skv_buffer_free(b), 0);
	}
	for (unsigned i = 0; i < THREADS; i++)
		CU_ASSERT_EQUAL_FATAL(pthread_create(&w[i].t, NULL, work, &w[i]), 0);
	for (unsigned i = 0; i < THREADS; i++) {
		pthread_join(w[i].t, NULL);
		if (w[i].msg[0])
			printf("\n    %s", w[i].msg);
		CU_ASSERT_EQUAL(w[i].msg[0], 0);
		total += w[i].compactions;
	}
	printf("\n    %u threads, one client: %u compactions ", THREADS, total);
	CU_ASSERT_EQUAL(total, THREADS * ROUNDS * 2);
	CU_ASSERT(h_alive(&H));
	/* every cache released, every buffer freed */
	for (int i = 0; i < 500 && h_pool_used(H.sock) != base; i++)
		h_sleep_ms(10);
	CU_ASSERT_EQUAL(h_pool_used(H.sock), base);
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("libsnapkv-threads", suite_init, suite_clean);
	CU_add_test(s, "one client, several threads", test_one_client_many_threads);
	return h_run_tests();
}
