// SPDX-License-Identifier: MIT
/*
 * test-request: every way a COMPACT request is refused, in validation
 * (daemon/snapkvd-request.c) and in admission (daemon/snapkvd-admission.c),
 * without a live daemon; and that a refusal in validation changed nothing.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/snapkvd-admission.c"
#include "daemon/snapkvd-request.c"

/* ------------------------------------------------------------- the fakes */

static bool fake_device;	  /* the daemon has a GPU (--backend cuda) */
static uint8_t fake_gpu_arena[1]; /* its GPU arena's base */
static int fake_admit = 0;	  /* what the policy's admission says */
static unsigned fake_pool_changed, fake_scaled;

bool snapkvd_device_present(const struct snapkvd_device *d)
{
	(void)d;
	return fake_device;
}

const char *snapkvd_device_backend(const struct snapkvd_device *d)
{
	(void)d;
	return fake_device ? "cuda" : "host";
}

int snapkvd_device_ordinal(const struct snapkvd_device *d, unsigned gpu)
{
	(void)d;
	return (int)gpu;
}

uint8_t *snapkvd_device_arena_base(struct snapkvd_device *d, struct skv_cuda_arena *a)
{
	(void)d;
	return a ? fake_gpu_arena : NULL;
}

struct snapkvd_buffer *snapkvd_buffer_find(struct snapkvd_buffer *list, uint64_t id)
{
	for (struct snapkvd_buffer *b = list; b; b = b->next)
		if (b->id == id)
			return b;
	return NULL;
}

void snapkvd_buffer_unref(struct snapkvd_buffer *b)
{
	b->refs--;
}

void snapkvd_policy_count_scaled(struct snapkvd_policy *ops)
{
	(void)ops;
	fake_scaled++;
}

int snapkvd_policy_pool_changed(struct snapkvd_policy *ops, uint64_t used, uint64_t total)
{
	(void)ops;
	(void)used;
	(void)total;
	fake_pool_changed++;
	return 0;
}

int snapkvd_policy_admit(struct snapkvd_policy *ops, uid_t uid, uint64_t tenant_used,
			 uint64_t request, char *msg, size_t msg_len)
{
	(void)ops;
	(void)uid;
	(void)tenant_used;
	(void)request;
	if (fake_admit)
		snprintf(msg, msg_len, "refused by the policy");
	return fake_admit;
}

/* ----------------------------------------------------- a request to break */

#define L   64
#define D   16
#define HQ  4
#define HKV 2
#define NQ  8

static struct snapkvd_config cfg;
static struct snapkvd_policy policy;
static struct snapkvd_buffer buf1, cudabuf;
static uint8_t mem[64 * 1024];
static struct snapkvd_request_env env;

static Snapkv__V1__TensorRef tq, tk, tv;
static Snapkv__V1__LayerRef lr;
static Snapkv__V1__LayerRef *lrs[2];
static Snapkv__V1__Params params;
static Snapkv__V1__CompactRequest req;
static Snapkv__V1__PrefillWait wait;
static Snapkv__V1__Range pr0, *prs[SKV_MAX_PROTECTED + 1];
static int32_t table[8];
static uint8_t handle[64];

static void tensor(Snapkv__V1__TensorRef *t, uint64_t off, int64_t head_stride)
{
	snapkv__v1__tensor_ref__init(t);
	t->buffer_id = 1;
	t->offset = off;
	t->dtype = SNAPKV__V1__DTYPE__D_TYPE_F32;
	t->head_stride = head_stride;
	t->token_stride = D;
}

/* A valid request: 2 layers of Q (8 tokens), K and V (64 tokens), fp32,
 * all in buffer 1; window 8, capacity 16. */
static int setup(void)
{
	snapkvd_config_defaults(&cfg);
	fake_device = false;
	fake_admit = 0;
	memset(&buf1, 0, sizeof(buf1));
	buf1 = (struct snapkvd_buffer){.id = 1, .size = sizeof(mem), .map = mem, .refs = 1};
	cudabuf = (struct snapkvd_buffer){.id = 2,
					  .size = 1024,
					  .map = mem,
					  .refs = 1,
					  .imp = &cudabuf,
					  .transport = "cuda-vmm-fd"};
	buf1.next = &cudabuf;
	tensor(&tq, 0, NQ * D);
	tensor(&tk, 8192, L * D);
	tensor(&tv, 16384, L * D);
	snapkv__v1__layer_ref__init(&lr);
	lr.q = &tq;
	lr.k = &tk;
	lr.v = &tv;
	lrs[0] = lrs[1] = &lr;
	snapkv__v1__params__init(&params);
	params.window = 8;
	params.capacity = 16;
	snapkv__v1__compact_request__init(&req);
	req.layers = 2;
	req.h_q = HQ;
	req.h_kv = HKV;
	req.head_dim = D;
	req.prompt_len = L;
	req.n_q = NQ;
	req.decode_reserve = 4;
	req.n_layer = 2;
	req.layer = lrs;
	req.params = &params;
	snapkv__v1__prefill_wait__init(&wait);
	env = (struct snapkvd_request_env){
	    .cfg = &cfg,
	    .buffers = &buf1,
	    .arena_bytes = 1 << 20,
	    .device = NULL,
	    .threads = 1,
	    .ops = &policy,
	};
	return 0;
}

/* Validate; expect r and a reason containing `why` (NULL: any); a refused
 * request holds nothing. */
static void expect(int r, const char *why)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = NULL;
	char err[256] = "";
	int got = snapkvd_request_compact(&env, NULL, &o, &req, &j, err, sizeof(err));

	CU_ASSERT_EQUAL(got, r);
	if (got != r)
		fprintf(stderr, "\n    got %d (%s), wanted %d (%s)\n", got, err, r, why ? why : "");
	if (why && !strstr(err, why)) {
		CU_FAIL("reason");
		fprintf(stderr, "\n    reason '%s' lacks '%s'\n", err, why);
	}
	if (got == 0)
		snapkvd_job_free(j);
	CU_ASSERT_EQUAL(buf1.refs, 1);
	CU_ASSERT_EQUAL(cudabuf.refs, 1);
	CU_ASSERT_EQUAL(fake_pool_changed, 0); /* validation ran no policy action */
	CU_ASSERT_EQUAL(fake_scaled, 0);
	setup();
}

static void test_valid(void)
{
	struct snapkvd_origin o = {.user_data = 7};
	struct snapkvd_job *j = NULL;
	char err[256] = "";

	CU_ASSERT_EQUAL_FATAL(snapkvd_request_compact(&env, NULL, &o, &req, &j, err, sizeof(err)),
			      0);
	CU_ASSERT_EQUAL(j->kind, SNAPKVD_JOB_COMPACT);
	CU_ASSERT_EQUAL(j->origin.user_data, 7);
	CU_ASSERT_EQUAL(j->layers, 2);
	CU_ASSERT_EQUAL(j->n_bufs, 1); /* one buffer, held once */
	CU_ASSERT_EQUAL(buf1.refs, 2);
	CU_ASSERT_EQUAL(j->cache->kept, 16);
	CU_ASSERT_EQUAL(j->cache->slots, 20);
	CU_ASSERT_EQUAL(j->cache->layout, SNAPKVD_LAYOUT_HND);
	CU_ASSERT_STRING_EQUAL(j->cache->transport, "memfd");
	CU_ASSERT_EQUAL(j->in[1].k.data, mem + 8192);
	CU_ASSERT_EQUAL(j->cache->region_off, 0); /* not placed: admission does */
	snapkvd_job_free(j);
	CU_ASSERT_EQUAL(buf1.refs, 1);
	req.out_layout = SNAPKV__V1__LAYOUT__LAYOUT_NHD;
	CU_ASSERT_EQUAL(snapkvd_request_compact(&env, NULL, &o, &req, &j, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(j->cache->layout, SNAPKVD_LAYOUT_NHD);
	snapkvd_job_free(j);
	setup();
}

/* check_limits */
static void test_limits(void)
{
	char msg[128];

	req.layers = 0, expect(-EINVAL, "layers = 0: must be at least 1");
	/* the limit, its number and the config key that sets it */
	snprintf(msg, sizeof(msg), "layers = %u exceeds the limit %u (max_layers)",
		 cfg.max_layers + 1, cfg.max_layers);
	req.layers = cfg.max_layers + 1, expect(-E2BIG, msg);
	req.h_q = 0, expect(-EINVAL, "h_q");
	req.h_kv = cfg.max_heads + 1, expect(-E2BIG, "h_kv");
	req.head_dim = cfg.max_head_dim + 1, expect(-E2BIG, "head_dim");
	req.prompt_len = 0, expect(-EINVAL, "prompt_len");
	req.n_q = L + 1, expect(-EINVAL, "n_q = 65 exceeds"); /* -EINVAL, not -E2BIG */
	snprintf(msg, sizeof(msg), "decode_reserve = %u exceeds the limit %u (max_reserve)",
		 cfg.max_reserve + 1, cfg.max_reserve);
	req.decode_reserve = cfg.max_reserve + 1, expect(-E2BIG, msg);
	req.n_layer = 1, expect(-EINVAL, "1 layer descriptions for 2 layers");
	req.n_block_table = (size_t)cfg.max_block_table + 1, expect(-E2BIG, "(max_block_table)");
	req.out_layout = 9, expect(-EINVAL, "unknown output layout 9");
}

/* read_params, check_plan */
static void test_params(void)
{
	params.n_protected_ranges = SKV_MAX_PROTECTED + 1, params.protected_ranges = prs;
	expect(-E2BIG, "protected ranges, at most");
	params.n_protected_ranges = 1, params.protected_ranges = prs, prs[0] = NULL;
	expect(-EINVAL, NULL);
	snapkv__v1__range__init(&pr0);
	pr0.begin = 10, pr0.end = 5, prs[0] = &pr0;
	params.n_protected_ranges = 1, params.protected_ranges = prs;
	expect(-EINVAL, NULL); /* skv_plan: a reversed range */
	params.window = 0, params.explicit_fields = SKV_PARAMS_EXPLICIT(2);
	params.capacity = 4;
	expect(-EINVAL, NULL); /* skv_plan: C below the window's keep... or W 0 */
	cfg.max_scratch_bytes = 1, expect(-E2BIG, "over max_scratch_bytes 1");
}

/* resolve_layers, resolve_tensor */
static void test_tensors(void)
{
	lrs[1] = NULL, expect(-EINVAL, NULL);
	lr.q = NULL, expect(-EINVAL, "layer 0: q tensor missing");
	tk.dtype = 9, expect(-EINVAL, "layer 0: k: unknown dtype 9");
	tv.buffer_id = 5, expect(-ENOENT, "layer 0: v: buffer 5 is not registered");
	tq.head_stride = -1, expect(-EINVAL, "layer 0: q: negative stride");
	tk.offset = 2, expect(-EINVAL, "layer 0: k: offset 2 not aligned");
	tq.block_size = 4, expect(-EINVAL, "layer 0: q must be strided");
	tk.block_size = 16, expect(-EINVAL, "4 blocks needed, block table has 0");
	tk.block_size = 16, req.n_block_table = 4, req.block_table = table, table[2] = -1;
	expect(-EINVAL, "block table entry 2 is negative");
	tk.token_stride = INT64_MAX / 2, expect(-ERANGE, "layer 0: k: strides overflow");
	tv.offset = sizeof(mem) - 4096, expect(-ERANGE, "layer 0: v: reaches byte");
	tv.dtype = SNAPKV__V1__DTYPE__D_TYPE_F16, tv.head_stride = L * D;
	expect(-EINVAL, "K and V of every layer must share one dtype");
}

/* resolve_wait */
static void test_wait(void)
{
	req.prefill_wait = &wait,
	wait.kind = SNAPKV__V1__PREFILL_WAIT_KIND__PREFILL_WAIT_KIND_CUDA_FLAG;
	expect(-ENOTSUP, "prefill_wait needs snapkvd --backend cuda; this daemon runs the host");
	req.prefill_wait = &wait, wait.kind = 2, fake_device = true;
	wait.timeout_ms = cfg.prefill_wait_max_ms + 1,
	expect(-E2BIG, "exceeds prefill_wait_max_ms");
	req.prefill_wait = &wait, fake_device = true, wait.kind = 1;
	wait.ipc_event.len = 3, wait.ipc_event.data = handle;
	expect(-EINVAL, "ipc_event has 3 bytes, not 64");
	req.prefill_wait = &wait, fake_device = true, wait.kind = 7;
	expect(-EINVAL, "unknown prefill_wait kind 7");
	req.prefill_wait = &wait, fake_device = true, wait.kind = 2, wait.buffer_id = 9;
	expect(-ENOENT, "prefill_wait: buffer 9 is not registered");
	req.prefill_wait = &wait, fake_device = true, wait.kind = 2, wait.buffer_id = 1;
	expect(-EINVAL, "buffer 1 is not a CUDA buffer");
	req.prefill_wait = &wait, fake_device = true, wait.kind = 2, wait.buffer_id = 2;
	wait.offset = 1022, expect(-ERANGE, "not a 4-aligned word inside buffer 2");
	req.prefill_wait = &wait, fake_device = true, wait.kind = 2, wait.buffer_id = 2;
	wait.offset = 1020, wait.value = 3, expect(0, NULL);
	req.prefill_wait = &wait, fake_device = true, wait.kind = 1;
	wait.ipc_event.len = 64, wait.ipc_event.data = handle, expect(0, NULL);
}

/* build_cache */
static void test_output(void)
{
	req.out_dtype = SNAPKV__V1__DTYPE__D_TYPE_F16, expect(-EINVAL, "out_dtype must equal");
	env.arena_bytes = 4096, expect(-E2BIG, "compact cache of 2 layers x 4 heads x 20 slots");
	req.out_arena = SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM;
	expect(-ENOTSUP, "out_arena CUDA_VMM needs snapkvd --backend cuda");
	req.out_arena = SNAPKV__V1__ARENA_KIND__ARENA_KIND_CUDA_VMM, fake_device = true;
	expect(-EINVAL, "ask for the GPU arena first");
	req.out_arena = 5, expect(-EINVAL, "unknown out_arena 5");
}

/* ------------------------------------------------------------ admission */

static struct snapkvd_server srv;
static struct snapkvd_session sess;

static int admit_setup(uint64_t pool_bytes, uint64_t quota)
{
	setup();
	memset(&srv, 0, sizeof(srv));
	memset(&sess, 0, sizeof(sess));
	srv.cfg = cfg;
	if (snapkvd_pool_new(pool_bytes, quota, &srv.pool) < 0 ||
	    snapkvd_pool_tenant_get(srv.pool, 1000, &sess.tenant) < 0 ||
	    snapkvd_arena_new(1 << 20, "test-request", &sess.arena) < 0)
		return -1;
	sess.srv = &srv;
	sess.uid = 1000;
	env.arena_bytes = sess.arena->size;
	return 0;
}

static void admit_teardown(void)
{
	snapkvd_arena_free(sess.arena);
	snapkvd_pool_tenant_put(srv.pool, sess.tenant);
	snapkvd_pool_free(srv.pool);
}

/* Validate, then admit: r from admission. */
static int admit(char *err, struct snapkvd_job **ret)
{
	struct snapkvd_origin o = {0};
	struct snapkvd_job *j = NULL;
	int r = snapkvd_request_compact(&env, &sess, &o, &req, &j, err, 256);

	CU_ASSERT_EQUAL_FATAL(r, 0);
	fake_pool_changed = 0;
	r = snapkvd_admission_compact(&srv, &sess, j, err, 256);
	CU_ASSERT_EQUAL(fake_pool_changed, 1); /* the level is brought up to date once */
	if (r < 0 || !ret)
		snapkvd_job_free(j);
	else
		*ret = j;
	return r;
}

static void test_admission(void)
{
	struct snapkvd_job *j = NULL;
	uint64_t off;
	char err[256];

	/* accepted: reserved, placed, outputs pointed at the region */
	CU_ASSERT_EQUAL_FATAL(admit_setup(1 << 30, 0), 0);
	CU_ASSERT_EQUAL(admit(err, &j), 0);
	CU_ASSERT_EQUAL(j->cache->id, 1);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), j->cache->region_bytes);
	CU_ASSERT_EQUAL(j->out[0].k.data, sess.arena->base + j->cache->k_off[0]);
	CU_ASSERT_EQUAL((uint8_t *)j->out[1].positions, sess.arena->base + j->cache->pos_off[1]);
	CU_ASSERT_EQUAL(j->out[0].pos_stride, 20);
	snapkvd_pool_cancel(srv.pool, &j->resv);
	snapkvd_arena_release(sess.arena, j->cache->region_off, j->cache->region_bytes);
	snapkvd_job_free(j);
	/* the policy refuses */
	fake_admit = -ENOSPC;
	CU_ASSERT_EQUAL(admit(err, NULL), -ENOSPC);
	CU_ASSERT_STRING_EQUAL(err, "refused by the policy");
	fake_admit = 0;
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	admit_teardown();
	/* the pool, then the tenant's quota */
	CU_ASSERT_EQUAL_FATAL(admit_setup(8192, 0), 0);
	CU_ASSERT_EQUAL(admit(err, NULL), -ENOSPC);
	CU_ASSERT(strstr(err, "pool exhausted") != NULL);
	admit_teardown();
	CU_ASSERT_EQUAL_FATAL(admit_setup(1 << 30, 8192), 0);
	CU_ASSERT_EQUAL(admit(err, NULL), -EDQUOT);
	CU_ASSERT(strstr(err, "over quota") != NULL);
	admit_teardown();
	/* the session's arena is full: the pool gets its bytes back */
	CU_ASSERT_EQUAL_FATAL(admit_setup(1 << 30, 0), 0);
	CU_ASSERT_EQUAL(snapkvd_arena_alloc(sess.arena, sess.arena->size - 4096, &off), 0);
	CU_ASSERT_EQUAL(admit(err, NULL), -ENOSPC);
	CU_ASSERT(strstr(err, "session arena full") != NULL);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	admit_teardown();
	setup();
}

/* A released region goes to the session's next compaction with its pages:
 * no more pool bytes than the first took, nothing new populated, and quotas
 * refuse as before (cached pages are free in the pool, never a tenant's). */
static void test_reuse(void)
{
	struct snapkvd_job *j = NULL, *j2 = NULL;
	struct stat st0, st1;
	uint64_t off, bytes;
	char err[256];

	CU_ASSERT_EQUAL_FATAL(admit_setup(1 << 30, 0), 0);
	srv.arenas.limit = 1 << 20;
	snapkvd_arena_join(sess.arena, &srv.arenas);
	CU_ASSERT_EQUAL_FATAL(admit(err, &j), 0);
	CU_ASSERT_FALSE(j->cache->region_dirty);
	off = j->cache->region_off;
	bytes = j->cache->region_bytes;
	memset(sess.arena->base + off, 0xab, bytes); /* the kernels, the engine's decode */
	snapkvd_pool_commit(srv.pool, &j->resv);
	CU_ASSERT_EQUAL(fstat(sess.arena->fd, &st0), 0);
	snapkvd_pool_tenant_set_quota(srv.pool, sess.tenant, bytes);
	CU_ASSERT_EQUAL(admit(err, NULL), -EDQUOT); /* one cache: the quota */
	/* released: the pool has its bytes back, the arena keeps the pages */
	snapkvd_arena_release(sess.arena, off, bytes);
	snapkvd_pool_give_back(srv.pool, sess.tenant, bytes);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&srv.arenas), bytes);
	CU_ASSERT_EQUAL(sess.arena->base[off], 0xab);
	/* the same request again: the same pages, the same pool bytes */
	CU_ASSERT_EQUAL(admit(err, &j2), 0);
	CU_ASSERT_EQUAL(j2->cache->region_off, off);
	CU_ASSERT_TRUE(j2->cache->region_dirty);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), bytes);
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&srv.arenas), 0);
	CU_ASSERT_EQUAL(fstat(sess.arena->fd, &st1), 0);
	CU_ASSERT_EQUAL(st1.st_blocks, st0.st_blocks);
	CU_ASSERT_EQUAL(admit(err, NULL), -EDQUOT); /* the reused one counts */
	CU_ASSERT(strstr(err, "over quota") != NULL);
	snapkvd_pool_cancel(srv.pool, &j2->resv);
	snapkvd_arena_release(sess.arena, off, bytes);
	CU_ASSERT_EQUAL(snapkvd_pool_used(srv.pool), 0);
	snapkvd_job_free(j);
	snapkvd_job_free(j2);
	admit_teardown();
	CU_ASSERT_EQUAL(snapkvd_arena_set_cached(&srv.arenas), 0); /* the arena went */
	setup();
}

/* ---------------------------------------------------------------- GROW */

static void test_grow(void)
{
	struct snapkvd_cache c = {
	    .layers = 2, .h_store = 2, .head_dim = D, .dtype_bytes = 4, .kept = 16, .slots = 20};
	struct snapkvd_cache_geom g;
	const char *why = NULL;
	uint32_t slots = 0;

	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, 0, &slots, &g, &why), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, cfg.max_reserve + 1, &slots, &g, &why),
			-E2BIG);
	CU_ASSERT_STRING_EQUAL(why, "extra must be 1..max_reserve in all");
	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, cfg.max_reserve - 3, &slots, &g, &why),
			-E2BIG); /* 4 reserved already */
	env.arena_bytes = 8192;
	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, 100, &slots, &g, &why), -E2BIG);
	CU_ASSERT_STRING_EQUAL(why, "grown cache does not fit the arena");
	env.arena_bytes = 1 << 20;
	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, 12, &slots, &g, &why), 0);
	CU_ASSERT_EQUAL(slots, 32);
	CU_ASSERT_EQUAL(g.kv_bytes, 2 * 32 * D * 4);
}

/* GROW of a writeback cache: position rows only (no K/V in the region), up
 * to its declared max_decode, else max_reserve. */
static void test_grow_writeback(void)
{
	struct snapkvd_cache c = {.layers = 2,
				  .h_store = 2,
				  .head_dim = D,
				  .dtype_bytes = 4,
				  .kept = 16,
				  .slots = 20,
				  .layout = SNAPKVD_LAYOUT_PAGED,
				  .block_size = 8,
				  .writeback = true,
				  .max_decode = 10};
	struct snapkvd_cache_geom g;
	const char *why = NULL;
	uint32_t slots = 0;

	env.arena_bytes = 1 << 20;
	CU_ASSERT_EQUAL(snapkvd_cache_decode_limit(&c), 10);
	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, 0, &slots, &g, &why), -EINVAL);
	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, 7, &slots, &g, &why), -E2BIG);
	CU_ASSERT(why && strstr(why, "declared maximum") != NULL);
	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, 6, &slots, &g, &why), 0);
	CU_ASSERT_EQUAL(slots, 26);
	CU_ASSERT_EQUAL(g.kv_bytes, 0);
	c.max_decode = 0;
	CU_ASSERT_EQUAL(snapkvd_cache_decode_limit(&c), 4);
	CU_ASSERT_EQUAL(snapkvd_request_grow(&env, &c, cfg.max_reserve, &slots, &g, &why), -E2BIG);
	CU_ASSERT(why && strstr(why, "max_reserve") != NULL);
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	if (snapkvd_pressure_new(&cfg.policy.pressure, NULL, NULL, &policy.pressure) < 0) {
		snapkvd_config_defaults(&cfg);
		if (snapkvd_pressure_new(&cfg.policy.pressure, NULL, NULL, &policy.pressure) < 0)
			return 1;
	}
	s = CU_add_suite("request", NULL, NULL);
	setup();
	CU_add_test(s, "a valid request becomes a job", test_valid);
	CU_add_test(s, "shape limits", test_limits);
	CU_add_test(s, "parameters and plan", test_params);
	CU_add_test(s, "every tensor check", test_tensors);
	CU_add_test(s, "prefill waits", test_wait);
	CU_add_test(s, "output cache and arena", test_output);
	CU_add_test(s, "admission after validation", test_admission);
	CU_add_test(s, "a released region is reused; quotas still refuse", test_reuse);
	CU_add_test(s, "GROW limits", test_grow);
	CU_add_test(s, "GROW of a writeback cache: up to max_decode, no K/V", test_grow_writeback);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	snapkvd_pressure_free(policy.pressure);
	return fails ? 1 : 0;
}
