// SPDX-License-Identifier: MIT
/*
 * test-daemon-admin: admin answers that do not stall the event loop (issue
 * 20, point 9), through a real snapkvd:
 *  - a ledger listing built one cache per loop round (admin_slice_caches =
 *    1), page by page, while another session creates and releases caches
 *    between the slices: ids strictly ascending over the whole listing
 *    (never a cache twice), every cache that lived through it exactly once
 *    with its own fields, the status's admin_slices counting at least one
 *    slice per cache listed, and once the churn stops a listing that agrees
 *    with caches_visible and the pool's count;
 *  - an admin session that goes away while its page is being built: the
 *    daemon serves on;
 *  - the rate limits: admin_root_rate (per uid, root), admin_session_rate
 *    (one session; a new session has its own), admin_tenant_rate (another
 *    uid, root unaffected) refuse with -EAGAIN, an error naming the key and
 *    retry_after_ms, and serve again after that wait; admin_refused counts.
 * No timing is asserted: the waits are the daemon's own retry_after_ms.
 */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "daemon-harness.h"
#include "proto/skv-io.h"
#include "snapkv.h"

static struct harness H;

/* ------------------------------------------------------------- engines */

struct engine {
	struct skv_client *c;
	struct skv_buffer *b;
	struct skv_layer_ref lr;
	struct skv_compact_desc d;
};

/* A tiny compaction (1 layer, 1 head, D 8, L 16, W 4, C 8), prompt_len L. */
static int engine_open(struct engine *e, const char *name, unsigned prompt)
{
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = name};
	float *p;

	memset(e, 0, sizeof(*e));
	if (skv_client_connect(H.sock, &o, &e->c) < 0 || skv_buffer_alloc(e->c, 8192, &e->b) < 0)
		return -1;
	p = skv_buffer_data(e->b);
	for (unsigned i = 0; i < (4 + 2 * prompt) * 8; i++)
		p[i] = (float)((i * 7919u) % 97) / 97.0f - 0.5f;
	e->lr.q = (struct skv_tensor_ref){e->b, 0, SKV_DTYPE_F32, 4 * 8, 8, 0, 0};
	e->lr.k = (struct skv_tensor_ref){e->b, 4 * 8 * 4, SKV_DTYPE_F32, prompt * 8, 8, 0, 0};
	e->lr.v =
	    (struct skv_tensor_ref){e->b, (4 + prompt) * 8 * 4, SKV_DTYPE_F32, prompt * 8, 8, 0, 0};
	e->d.desc_size = sizeof(e->d);
	e->d.shape =
	    (struct skv_shape){.prompt_len = prompt, .head_dim = 8, .h_q = 1, .h_kv = 1, .n_q = 4};
	e->d.layers = 1;
	skv_client_params_init(&e->d.params);
	e->d.params.window = 4;
	e->d.params.capacity = 8;
	e->d.layer = &e->lr;
	return 0;
}

static void engine_close(struct engine *e)
{
	skv_buffer_free(e->b);
	skv_client_close(e->c);
}

/* -------------------------------------------------- one admin session */

struct admin {
	int fd;
	uint8_t buf[SKV_FRAME_HDR_SIZE + SKV_FRAME_MAX_PAYLOAD];
};

static int admin_open(struct admin *a)
{
	Snapkv__V1__Hello hello = SNAPKV__V1__HELLO__INIT;
	struct skv_frame_hdr h;
	uint64_t dl = skv_io_deadline(30000);
	int r;

	a->fd = h_connect_raw(H.sock);
	if (a->fd < 0)
		return a->fd;
	hello.client_version = SKV_PROTO_VERSION;
	hello.admin = 1;
	hello.name = "test-admin";
	r = skv_io_send(a->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_HELLO, a->buf,
			snapkv__v1__hello__pack(&hello, a->buf), NULL, 0, dl);
	if (r >= 0)
		r = skv_io_recv(a->fd, a->buf, sizeof(a->buf), &h, NULL, NULL, dl);
	return r < 0 ? r : h.type == SNAPKV__V1__MSG_TYPE__MSG_TYPE_WELCOME ? 0 : -EPROTO;
}

/* One request on the session; its reply (caller frees) or NULL. */
static Snapkv__V1__AdminReply *admin_ask(struct admin *a, Snapkv__V1__AdminKind kind,
					 uint64_t after, uint32_t page)
{
	Snapkv__V1__AdminRequest req = SNAPKV__V1__ADMIN_REQUEST__INIT;
	uint64_t dl = skv_io_deadline(30000);
	struct skv_frame_hdr h;
	int r;

	req.kind = kind;
	req.page_after = after;
	req.page_size = page;
	r = skv_io_send(a->fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, a->buf,
			snapkv__v1__admin_request__pack(&req, a->buf), NULL, 0, dl);
	if (r >= 0)
		r = skv_io_recv(a->fd, a->buf, sizeof(a->buf), &h, NULL, NULL, dl);
	if (r < 0 || h.type != SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN_REPLY)
		return NULL;
	return snapkv__v1__admin_reply__unpack(NULL, h.length, a->buf + SKV_FRAME_HDR_SIZE);
}

static long long status_field(Snapkv__V1__AdminReply *r, long long v)
{
	if (r)
		snapkv__v1__admin_reply__free_unpacked(r, NULL);
	return v;
}
#define STATUS(field)                                                                              \
	({                                                                                         \
		Snapkv__V1__AdminReply *r_ =                                                       \
		    h_admin(H.sock, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS);                    \
		status_field(r_, r_ ? (long long)r_->field : -1);                                  \
	})

/* ------------------------------------------------ the sliced listing */

#define STABLE	  300
#define CHURN_L	  12 /* the churn's caches have another prompt_len */
#define STABLE_L  16
#define PAGE_SIZE 16

struct churn {
	_Atomic int stop;
	_Atomic unsigned made;
	int failed;
};

/* Another session: a cache created and released, again and again. */
static void *churn_main(void *arg)
{
	struct churn *ch = arg;
	struct engine e;
	struct skv_cache *k[4] = {0};

	if (engine_open(&e, "churn", CHURN_L) < 0) {
		ch->failed = 1;
		return NULL;
	}
	for (unsigned i = 0; !atomic_load(&ch->stop); i++) {
		/* keep up to four, releasing the oldest: ids on both sides */
		if (k[i % 4] && skv_cache_release(k[i % 4]) < 0)
			ch->failed = 1;
		k[i % 4] = NULL;
		if (skv_client_compact(e.c, &e.d, &k[i % 4]) < 0) {
			ch->failed = 1;
			break;
		}
		atomic_fetch_add(&ch->made, 1);
	}
	for (int i = 0; i < 4; i++)
		if (k[i])
			skv_cache_release(k[i]);
	engine_close(&e);
	return NULL;
}

/* Every page of the ledger by cursor; ids and prompt_lens into ids/lens
 * (room for cap). The count, or -1. */
static long list_all(struct admin *a, uint64_t *ids, uint32_t *lens, size_t cap,
		     uint64_t *ret_visible)
{
	uint64_t after = 0;
	size_t n = 0;

	do {
		Snapkv__V1__AdminReply *r =
		    admin_ask(a, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER, after, PAGE_SIZE);

		if (!r || r->status < 0 || r->n_caches > PAGE_SIZE) {
			if (r)
				fprintf(stderr, "ledger page: %s\n", r->error);
			status_field(r, 0);
			return -1;
		}
		for (size_t i = 0; i < r->n_caches && n < cap; i++, n++) {
			ids[n] = r->caches[i]->id;
			lens[n] = r->caches[i]->prompt_len;
		}
		/* the cursor is the last id of a full page */
		if (r->next_page_after)
			CU_ASSERT_EQUAL(r->next_page_after, r->caches[r->n_caches - 1]->id);
		after = r->next_page_after;
		*ret_visible = r->caches_visible;
		status_field(r, 0);
	} while (after);
	return (long)n;
}

static void test_sliced_listing(void)
{
	static uint64_t ids[65536];
	static uint32_t lens[65536];
	struct engine e;
	struct skv_cache *stable[STABLE];
	uint64_t stable_id[STABLE], visible = 0;
	struct churn ch = {0};
	struct admin a;
	pthread_t t;
	long long slices0;
	unsigned made0;
	long n;

	CU_ASSERT_EQUAL_FATAL(engine_open(&e, "stable", STABLE_L), 0);
	for (int i = 0; i < STABLE; i++)
		CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &stable[i]), 0);
	CU_ASSERT_EQUAL_FATAL(admin_open(&a), 0);
	/* before the churn, the listing is the stable caches: their ids */
	CU_ASSERT_EQUAL_FATAL(list_all(&a, ids, lens, 65536, &visible), STABLE);
	memcpy(stable_id, ids, sizeof(stable_id));
	slices0 = STATUS(admin_slices);
	CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, churn_main, &ch), 0);
	/* the churn under way first (slow to start under a sanitizer) */
	for (int i = 0; i < 6000 && !atomic_load(&ch.made) && !ch.failed; i++)
		h_sleep_ms(5);
	CU_ASSERT_FATAL(atomic_load(&ch.made) > 0);
	/* listings while the churn goes on: at least three, and until it has
	 * made 20 more caches meanwhile (at most 500) */
	made0 = atomic_load(&ch.made);
	for (int round = 0; round < 500 && (round < 3 || atomic_load(&ch.made) - made0 < 20);
	     round++) {
		unsigned seen = 0;

		n = list_all(&a, ids, lens, 65536, &visible);
		CU_ASSERT_FATAL(n >= STABLE);
		for (long i = 1; i < n; i++)
			if (ids[i] <= ids[i - 1]) {
				CU_FAIL(
				    "ids not strictly ascending: a cache twice or out of order");
				break;
			}
		for (long i = 0, j = 0; i < n; i++) {
			/* each listed cache is one of the two sessions', with its own shape */
			CU_ASSERT(lens[i] == STABLE_L || lens[i] == CHURN_L);
			if (lens[i] != STABLE_L)
				continue;
			while (j < STABLE && stable_id[j] < ids[i])
				j++;
			if (j < STABLE && stable_id[j] == ids[i])
				seen++;
		}
		CU_ASSERT_EQUAL(seen, STABLE);
		CU_ASSERT(STATUS(admin_slices) - slices0 >= n);
		slices0 = STATUS(admin_slices);
	}
	atomic_store(&ch.stop, 1);
	pthread_join(t, NULL);
	CU_ASSERT_EQUAL(ch.failed, 0);
	printf("\n    churn: %u caches created during the listings\n",
	       atomic_load(&ch.made) - made0);
	/* quiet now: the listing is the ledger */
	n = list_all(&a, ids, lens, 65536, &visible);
	CU_ASSERT_EQUAL(n, STABLE);
	CU_ASSERT_EQUAL(visible, (uint64_t)STABLE);
	{
		Snapkv__V1__AdminReply *r =
		    admin_ask(&a, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER, 0, 0);

		CU_ASSERT_PTR_NOT_NULL_FATAL(r);
		CU_ASSERT_EQUAL(r->caches_visible, (uint64_t)STABLE);
		CU_ASSERT(r->pool_bytes && r->pool_bytes->allocated > 0);
		CU_ASSERT_EQUAL(r->n_caches, (size_t)STABLE); /* one page: 512 at most */
		status_field(r, 0);
	}
	close(a.fd);
	for (int i = 0; i < STABLE; i++)
		skv_cache_release(stable[i]);
	engine_close(&e);
}

/* A session that leaves with its page half built: nothing lost, served on. */
static void test_leave_midway(void)
{
	struct engine e;
	struct skv_cache *k[64];
	Snapkv__V1__AdminRequest req = SNAPKV__V1__ADMIN_REQUEST__INIT;

	CU_ASSERT_EQUAL_FATAL(engine_open(&e, "leave", STABLE_L), 0);
	for (int i = 0; i < 64; i++)
		CU_ASSERT_EQUAL_FATAL(skv_client_compact(e.c, &e.d, &k[i]), 0);
	/* fewer than max_admin_sessions (16): a session whose page is being
	 * built holds its slot until the page is sent (and the send fails) */
	for (int i = 0; i < 10; i++) {
		struct admin a;

		CU_ASSERT_EQUAL_FATAL(admin_open(&a), 0);
		req.kind = SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_CACHES;
		CU_ASSERT_EQUAL(skv_io_send(a.fd, SNAPKV__V1__MSG_TYPE__MSG_TYPE_ADMIN, a.buf,
					    snapkv__v1__admin_request__pack(&req, a.buf), NULL, 0,
					    0),
				0);
		close(a.fd);
	}
	CU_ASSERT(STATUS(pool_total) > 0);
	for (int i = 0; i < 1000 && STATUS(admin_pending) > 0; i++)
		h_sleep_ms(10);
	CU_ASSERT_EQUAL(STATUS(admin_pending), 0);
	CU_ASSERT(h_alive(&H));
	for (int i = 0; i < 64; i++)
		skv_cache_release(k[i]);
	engine_close(&e);
}

static int start(const char *config)
{
	if (h_start_config(&H, "snapkvd-admin", config) < 0)
		return -1;
	/* the other uid's sessions reach the socket */
	return chmod(H.dir, 0755) || chmod(H.sock, 0666) ? -1 : 0;
}

static void stop(void)
{
	CU_ASSERT_EQUAL(h_stop(&H), 0);
	h_cleanup(&H);
	memset(&H, 0, sizeof(H));
}

static void test_slices(void)
{
	CU_ASSERT_EQUAL_FATAL(start("admin_slice_caches = 1\nadmin_root_rate = 0\n"
				    "admin_session_rate = 0\nmax_caches = 4096\n"),
			      0);
	test_sliced_listing();
	test_leave_midway();
	stop();
}

/* ------------------------------------------------------ rate limits */

/* Asked until refused (at most 10 times, far past any limit these tests
 * set, however slowly the machine goes): the refusal names key and a wait,
 * and a request after that wait is served. How many were served first. */
static int refused_then_served(struct admin *a, const char *key)
{
	Snapkv__V1__AdminReply *r = NULL;
	uint32_t wait_ms;
	int served = 0;

	for (int i = 0; i < 10; i++) {
		r = admin_ask(a, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS, 0, 0);
		CU_ASSERT_PTR_NOT_NULL_FATAL(r);
		if (r->status == -EAGAIN)
			break;
		CU_ASSERT_EQUAL(r->status, 0);
		served++;
		status_field(r, 0);
		r = NULL;
	}
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL(r->status, -EAGAIN);
	CU_ASSERT_PTR_NOT_NULL(strstr(r->error, key));
	if (!strstr(r->error, key))
		fprintf(stderr, "refusal: \"%s\", not naming %s\n", r->error, key);
	CU_ASSERT(r->retry_after_ms > 0 && r->retry_after_ms <= 1000);
	wait_ms = r->retry_after_ms;
	status_field(r, 0);
	h_sleep_ms(wait_ms + 1);
	r = admin_ask(a, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS, 0, 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	CU_ASSERT_EQUAL(r->status, 0);
	status_field(r, 0);
	return served;
}

static void test_root_rate(void)
{
	struct admin a;

	/* root: 2 a second, 3 saved up; sessions unlimited. h_start's own
	 * status calls may have taken some of the 3. */
	CU_ASSERT_EQUAL_FATAL(start("admin_root_rate = 2\nadmin_root_burst = 3\n"
				    "admin_session_rate = 0\n"),
			      0);
	CU_ASSERT_EQUAL_FATAL(admin_open(&a), 0);
	CU_ASSERT(refused_then_served(&a, "admin_root_rate") <= 4);
	CU_ASSERT(STATUS(admin_refused) >= 1);
	close(a.fd);
	stop();
}

static void test_session_rate(void)
{
	Snapkv__V1__AdminReply *r;
	struct admin a, b;

	CU_ASSERT_EQUAL_FATAL(start("admin_session_rate = 1\nadmin_session_burst = 2\n"
				    "admin_root_rate = 0\n"),
			      0);
	CU_ASSERT_EQUAL_FATAL(admin_open(&a), 0);
	CU_ASSERT(refused_then_served(&a, "admin_session_rate") >= 2);
	/* a new session has a bucket of its own, full */
	CU_ASSERT_EQUAL_FATAL(admin_open(&b), 0);
	for (int i = 0; i < 2; i++) {
		r = admin_ask(&b, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_LEDGER, 0, 0);
		CU_ASSERT_PTR_NOT_NULL_FATAL(r);
		CU_ASSERT_EQUAL(r->status, 0);
		status_field(r, 0);
	}
	close(a.fd);
	close(b.fd);
	stop();
}

/* Another uid (65534) in a child: its own limit; root is not held back. */
static void test_tenant_rate(void)
{
	int st = 0;
	pid_t pid;

	if (getuid() != 0) {
		printf("\n    SKIP(root): another uid's limit needs root to switch uid\n");
		return;
	}
	CU_ASSERT_EQUAL_FATAL(start("admin_tenant_rate = 1\nadmin_tenant_burst = 1\n"
				    "admin_session_rate = 0\n"),
			      0);
	pid = fork();
	if (pid == 0) {
		struct admin a;
		Snapkv__V1__AdminReply *r;
		int bad = 0;

		if (setgid(65534) < 0 || setuid(65534) < 0 || admin_open(&a) < 0)
			_exit(2);
		r = admin_ask(&a, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS, 0, 0);
		bad |= !r || r->status != 0;
		for (int i = 0; i < 10 && r && r->status == 0; i++) {
			status_field(r, 0);
			r = admin_ask(&a, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS, 0, 0);
		}
		bad |= !r || r->status != -EAGAIN || !strstr(r->error, "admin_tenant_rate") ||
		       !strstr(r->error, "uid 65534") || !r->retry_after_ms;
		if (r && bad)
			fprintf(stderr, "tenant refusal: %d \"%s\"\n", r->status, r->error);
		if (r && !bad)
			h_sleep_ms(r->retry_after_ms + 1);
		status_field(r, 0);
		r = admin_ask(&a, SNAPKV__V1__ADMIN_KIND__ADMIN_KIND_STATUS, 0, 0);
		bad |= !r || r->status != 0;
		status_field(r, 0);
		_exit(bad);
	}
	CU_ASSERT_FATAL(pid > 0);
	/* root meanwhile: its own (default) limit, not the tenant's */
	for (int i = 0; i < 5; i++)
		CU_ASSERT(STATUS(pool_total) > 0);
	waitpid(pid, &st, 0);
	CU_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	stop();
}

int main(void)
{
	CU_pSuite s;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	s = CU_add_suite("daemon-admin", NULL, NULL);
	CU_add_test(s, "sliced ledger under churn: every cache once, ascending; leaving midway",
		    test_slices);
	CU_add_test(s, "admin_root_rate: refused naming the key, served after the wait",
		    test_root_rate);
	CU_add_test(s, "admin_session_rate: per session, refused and served again",
		    test_session_rate);
	CU_add_test(s, "admin_tenant_rate: another uid refused, root not", test_tenant_rate);
	return t_run();
}
