// SPDX-License-Identifier: MIT
#include "skvpy-cache.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "snapkv.h"
#include "skvpy-array.h"
#include "skvpy-compact.h"
#include "skvpy-session.h"
#include "skvpy-error.h"
#include "skvpy-mapping.h"

static void unlink_cache(struct skvpy_cache *c)
{
	struct skvpy_client *cl = c->client;

	if (c->prev)
		c->prev->next = c->next;
	else if (cl->caches == c)
		cl->caches = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->next = c->prev = NULL;
}

PyObject *skvpy_cache_new(struct skvpy_client *cl, struct skv_cache *k, PyObject *out)
{
	struct skvpy_cache *c = PyObject_New(struct skvpy_cache, &skvpy_cache_type);

	if (!c) {
		skv_cache_release(k);
		Py_XDECREF(out);
		return NULL;
	}
	c->out = out;
	c->busy = 0;
	c->mapped = (struct skvpy_blockmap){0};
	Py_INCREF(cl);
	c->client = cl;
	c->k = k;
	c->prev = NULL;
	c->next = cl->caches;
	if (cl->caches)
		cl->caches->prev = c;
	cl->caches = c;
	return (PyObject *)c;
}

/* Release (linger or not; appended >= 0: the engine's g reported) without
 * the GIL. A refused report (-EINVAL) leaves the cache the caller's. */
static int release(struct skvpy_cache *c, int linger, long long appended)
{
	struct skv_cache *k = c->k;
	int r;

	c->client->busy++;
	Py_BEGIN_ALLOW_THREADS r = appended >= 0
				       ? skv_cache_release_appended(k, (uint32_t)appended, linger)
				   : linger ? skv_cache_release_linger(k)
					    : skv_cache_release(k);
	Py_END_ALLOW_THREADS c->client->busy--;
	if (r == -EINVAL && appended >= 0)
		return r;
	c->k = NULL;
	unlink_cache(c);
	return r;
}

/* An implicit release (garbage collection, a with block, the client
 * closing): the engine buffers its blocks are mapped over get their own
 * pages back first, so that no later cache is written through them. */
static void release_unmapped(struct skvpy_cache *c)
{
	(void)skvpy_blockmap_restore(&c->mapped);
	if (c->k)
		release(c, 0, -1);
}

void skvpy_cache_drop(struct skvpy_cache *c)
{
	if (c->k)
		release_unmapped(c);
	else
		unlink_cache(c);
}

static void cache_dealloc(struct skvpy_cache *c)
{
	if (c->k)
		release_unmapped(c);
	skvpy_blockmap_free(&c->mapped);
	Py_XDECREF(c->out);
	Py_DECREF(c->client);
	PyObject_Free(c);
}

static int live(struct skvpy_cache *c)
{
	if (!c->k)
		return skvpy_error_int(EBADF, "the cache was released%s",
				       c->client->c ? "" : " (its client is closed)");
	return 0;
}

static const struct skv_cache_info *info(struct skvpy_cache *c)
{
	return live(c) < 0 ? NULL : skv_cache_info(c->k);
}

static int layer_arg(struct skvpy_cache *c, PyObject *o, uint32_t *ret)
{
	const struct skv_cache_info *in = info(c);
	long l;

	if (!in)
		return -1;
	l = PyLong_AsLong(o);
	if (l == -1 && PyErr_Occurred())
		return -1;
	if (l < 0 || (unsigned long)l >= in->layers) {
		PyErr_Format(PyExc_IndexError, "layer %ld: the cache has %u", l, in->layers);
		return -1;
	}
	*ret = (uint32_t)l;
	return 0;
}

/* Paged output: writeback gives the engine's own pool back; the arena gives
 * the cache's run [n_blocks, block_size, H_store, D] over the alias. */
static PyObject *kv_paged(struct skvpy_cache *c, const struct skv_cache_info *in, uint32_t l,
			  int is_v)
{
	size_t base;

	if (in->out_dest == SKV_OUT_WRITEBACK) {
		if (!c->out)
			return skvpy_error(EPROTO, "writeback cache without its pools");
		PyObject *pools = PyTuple_GET_ITEM(c->out, is_v ? 1 : 0);
		PyObject *t = PyList_GetItem(pools, l);
		Py_XINCREF(t);
		return t;
	}
	int64_t off = skv_cache_block_offset(c->k, l, is_v ? SKV_KV_V : SKV_KV_K, 0);
	const int32_t *pos = skv_cache_positions(c->k, l, 0);
	if (off < 0 || !pos)
		return skvpy_error(EPROTO, "layer %u has no blocks in the arena", l);
	if (skvpy_session_arena_offset(c->client, pos, &base) < 0) /* makes the alias */
		return NULL;
	if ((uint64_t)off >= c->client->arena->size)
		return skvpy_error(EPROTO, "blocks of layer %u outside the arena", l);
	int64_t shape[4] = {in->n_blocks, in->block_size, in->h_store, in->head_dim};
	int64_t strides[4] = {in->block_stride, in->token_stride, in->head_stride, 1};
	return skvpy_array_new(c->client->kind, (PyObject *)c->client->arena, (size_t)off,
			       (enum skvpy_elem)in->dtype, 4, shape, strides);
}

/*
 * A ragged cache (budget modes layers, heads, mass-heads) keeps a different
 * count per head, one row block per layer: no [h_store, capacity, D] view
 * fits it, so the layer-wide views refuse and name the per-head ones.
 */
static int refuse_ragged(struct skvpy_cache *c, const char *what)
{
	struct skv_cache_budget b = {.budget_size = sizeof(b)};

	if (skv_cache_budget(c->k, &b) < 0 || !b.ragged)
		return 0;
	skvpy_error(EOPNOTSUPP,
		    "a ragged cache (budget mode %s): heads keep different counts; read them "
		    "with %s_head(layer, head)",
		    skv_budget_name(b.mode), what);
	return -1;
}

/* (layer, head) of the per-head views. */
static int head_args(struct skvpy_cache *c, PyObject *args, uint32_t *ret_l, uint32_t *ret_h)
{
	PyObject *lo;
	unsigned int h;

	if (!PyArg_ParseTuple(args, "OI", &lo, &h) || layer_arg(c, lo, ret_l) < 0)
		return -1;
	if (h >= skv_cache_info(c->k)->h_store) {
		PyErr_Format(PyExc_IndexError, "head %u: the cache stores %u", h,
			     skv_cache_info(c->k)->h_store);
		return -1;
	}
	*ret_h = h;
	return 0;
}

/* K or V of one stored head, any cache in the host arena but paged:
 * [head_capacity, D], its kept rows first, then its decode headroom. */
static PyObject *kv_head(struct skvpy_cache *c, PyObject *args, int is_v)
{
	const struct skv_cache_info *in;
	uint32_t l, h;
	size_t off;

	if (head_args(c, args, &l, &h) < 0)
		return NULL;
	in = skv_cache_info(c->k);
	if (in->kv_arena != SKV_ARENA_HOST)
		return skvpy_error(EOPNOTSUPP, "the cache's K/V are in the GPU arena");
	if (in->layout == SKV_LAYOUT_PAGED)
		return skvpy_error(EOPNOTSUPP, "a paged cache: read it with %s(layer)",
				   is_v ? "v" : "k");
	void *p = is_v ? skv_cache_v(c->k, l, h) : skv_cache_k(c->k, l, h);
	if (!p)
		return skvpy_error(EPROTO, "layer %u head %u has no K/V in the arena", l, h);
	if (skvpy_session_arena_offset(c->client, p, &off) < 0)
		return NULL;
	int64_t shape[2] = {skv_cache_head_capacity(c->k, l, h), in->head_dim};
	int64_t strides[2] = {in->token_stride, 1};
	return skvpy_array_new(c->client->kind, (PyObject *)c->client->arena, off,
			       (enum skvpy_elem)in->dtype, 2, shape, strides);
}

static PyObject *cache_k_head(struct skvpy_cache *c, PyObject *args)
{
	return kv_head(c, args, 0);
}

static PyObject *cache_v_head(struct skvpy_cache *c, PyObject *args)
{
	return kv_head(c, args, 1);
}

/* int32 [head_capacity]: the head's slots' original positions. */
static PyObject *cache_positions_head(struct skvpy_cache *c, PyObject *args)
{
	uint32_t l, h;
	size_t off;

	if (head_args(c, args, &l, &h) < 0)
		return NULL;
	const int32_t *p = skv_cache_positions(c->k, l, h);
	if (!p)
		return skvpy_error(EPROTO, "layer %u head %u has no position table", l, h);
	if (skvpy_session_arena_offset(c->client, p, &off) < 0)
		return NULL;
	int64_t shape[1] = {skv_cache_head_capacity(c->k, l, h)}, strides[1] = {1};
	return skvpy_array_new(c->client->kind, (PyObject *)c->client->arena, off, SKVPY_EL_I32, 1,
			       shape, strides);
}

/* K (kv 0) or V of one layer: [h_store, capacity, D] (HND) or [capacity, h_store, D]. */
static PyObject *kv(struct skvpy_cache *c, PyObject *o, int is_v)
{
	const struct skv_cache_info *in;
	uint32_t l;
	size_t off;

	if (layer_arg(c, o, &l) < 0)
		return NULL;
	in = skv_cache_info(c->k);
	if (in->kv_arena != SKV_ARENA_HOST)
		return skvpy_error(EOPNOTSUPP, "the cache's K/V are in the GPU arena");
	if (in->layout == SKV_LAYOUT_PAGED)
		return kv_paged(c, in, l, is_v);
	if (refuse_ragged(c, is_v ? "v" : "k") < 0)
		return NULL;
	void *p = is_v ? skv_cache_v(c->k, l, 0) : skv_cache_k(c->k, l, 0);
	if (!p)
		return skvpy_error(EPROTO, "layer %u has no K/V in the arena", l);
	if (skvpy_session_arena_offset(c->client, p, &off) < 0)
		return NULL;
	int nhd = in->layout == SKV_LAYOUT_NHD;
	int64_t shape[3] = {nhd ? in->capacity : in->h_store, nhd ? in->h_store : in->capacity,
			    in->head_dim};
	int64_t strides[3] = {nhd ? in->token_stride : in->head_stride,
			      nhd ? in->head_stride : in->token_stride, 1};
	return skvpy_array_new(c->client->kind, (PyObject *)c->client->arena, off,
			       (enum skvpy_elem)in->dtype, 3, shape, strides);
}

/* map_blocks/unmap_blocks(layer, which, dest): which 'k' or 'v'; dest a
 * tensor from empty() whose first byte is page-aligned. */
static int map_args(struct skvpy_cache *c, PyObject *args, const char *fn, uint32_t *ret_l,
		    enum skv_kv *ret_kv, struct skvpy_view *ret_v, struct skvpy_mapping **ret_m,
		    uint64_t *ret_bytes)
{
	PyObject *lo, *dest;
	const char *which;
	uintptr_t lo_a, hi_a;
	uint64_t off;
	int r;

	if (!PyArg_ParseTuple(args, "OsO", &lo, &which, &dest) || layer_arg(c, lo, ret_l) < 0)
		return -1;
	if (strcmp(which, "k") && strcmp(which, "v")) {
		PyErr_Format(PyExc_ValueError, "%s: which must be 'k' or 'v'", fn);
		return -1;
	}
	*ret_kv = which[0] == 'k' ? SKV_KV_K : SKV_KV_V;
	if (skvpy_view_of(dest, "dest", ret_v) < 0)
		return -1;
	skvpy_view_extent(ret_v, &lo_a, &hi_a);
	*ret_m = ret_v->cuda ? NULL : skvpy_mapping_find(lo_a, hi_a);
	if (!*ret_m) {
		PyErr_Format(PyExc_ValueError, "%s: dest must be a tensor from client.empty()", fn);
		return -1;
	}
	if (ret_v->ptr % (uintptr_t)sysconf(_SC_PAGESIZE)) {
		PyErr_Format(PyExc_ValueError, "%s: dest must start on a page boundary", fn);
		return -1;
	}
	r = skv_cache_block_run(c->k, *ret_l, *ret_kv, &off, ret_bytes);
	if (r < 0) {
		skvpy_error(r, "%s: not a paged arena cache", fn);
		return -1;
	}
	return 0;
}

/* [lo, hi) of an engine buffer now holds other pages (mapped over, or its
 * own put back): no cache of the client has its blocks there any more. */
static void forget_mapped(struct skvpy_client *cl, uintptr_t lo, uintptr_t hi)
{
	for (struct skvpy_cache *o = cl->caches; o; o = o->next)
		skvpy_blockmap_forget(&o->mapped, lo, hi);
}

static PyObject *cache_map_blocks(struct skvpy_cache *c, PyObject *args)
{
	struct skvpy_mapping *m;
	struct skvpy_view v;
	enum skv_kv which;
	uint64_t bytes;
	uint32_t l;
	int r;

	if (map_args(c, args, "map_blocks", &l, &which, &v, &m, &bytes) < 0)
		return NULL;
	if (v.ptr + bytes > (uintptr_t)m->data + m->size)
		return skvpy_error(EINVAL,
				   "map_blocks: the run of %llu bytes passes the buffer's end",
				   (unsigned long long)bytes);
	if (skvpy_blockmap_reserve(&c->mapped) < 0)
		return NULL;
	r = skv_cache_map_blocks(c->k, l, which, (void *)v.ptr);
	if (r < 0)
		return skvpy_session_fail(c->client, r, "map_blocks");
	forget_mapped(c->client, v.ptr, v.ptr + bytes);
	skvpy_blockmap_add(&c->mapped, m, v.ptr, v.ptr + bytes);
	Py_RETURN_NONE;
}

static PyObject *cache_unmap_blocks(struct skvpy_cache *c, PyObject *args)
{
	struct skvpy_mapping *m;
	struct skvpy_view v;
	enum skv_kv which;
	uint64_t bytes;
	uint32_t l;
	int r;

	if (map_args(c, args, "unmap_blocks", &l, &which, &v, &m, &bytes) < 0)
		return NULL;
	r = skvpy_mapping_restore(m, v.ptr - (uintptr_t)m->data, bytes);
	if (r < 0)
		return skvpy_error(r, "unmap_blocks: restoring the buffer's pages failed");
	forget_mapped(c->client, v.ptr, v.ptr + bytes);
	Py_RETURN_NONE;
}

static PyObject *cache_k(struct skvpy_cache *c, PyObject *o)
{
	return kv(c, o, 0);
}

static PyObject *cache_v(struct skvpy_cache *c, PyObject *o)
{
	return kv(c, o, 1);
}

static PyObject *cache_positions(struct skvpy_cache *c, PyObject *o)
{
	uint32_t l;
	size_t off;

	if (layer_arg(c, o, &l) < 0)
		return NULL;
	const struct skv_cache_info *in = skv_cache_info(c->k);
	if (refuse_ragged(c, "positions") < 0)
		return NULL;
	const int32_t *p = skv_cache_positions(c->k, l, 0);
	if (!p)
		return skvpy_error(EPROTO, "layer %u has no position table", l);
	if (skvpy_session_arena_offset(c->client, p, &off) < 0)
		return NULL;
	int64_t shape[2] = {in->h_store, in->capacity}, strides[2] = {in->capacity, 1};
	return skvpy_array_new(c->client->kind, (PyObject *)c->client->arena, off, SKVPY_EL_I32, 2,
			       shape, strides);
}

/* append(n), grow(extra): ring calls without the GIL. */
static PyObject *ring_call(struct skvpy_cache *c, PyObject *o, int grow)
{
	long n;
	int r;

	if (live(c) < 0)
		return NULL;
	n = PyLong_AsLong(o);
	if (n == -1 && PyErr_Occurred())
		return NULL;
	if (n < (grow ? 1 : 0) || n > (1l << 22)) {
		PyErr_Format(PyExc_ValueError, "%s %ld: %d .. %ld", grow ? "grow" : "append", n,
			     grow ? 1 : 0, 1l << 22);
		return NULL;
	}
	if (c->busy)
		return skvpy_error(EBUSY, "another thread is appending to or growing this cache");
	c->busy = 1;
	c->client->busy++;
	Py_BEGIN_ALLOW_THREADS r =
	    grow ? skv_cache_grow(c->k, (uint32_t)n) : skv_cache_append(c->k, (uint32_t)n);
	Py_END_ALLOW_THREADS c->client->busy--;
	c->busy = 0;
	if (r < 0)
		return skvpy_session_fail(c->client, r, grow ? "grow" : "append");
	Py_RETURN_NONE;
}

static PyObject *cache_append(struct skvpy_cache *c, PyObject *args)
{
	PyObject *n = NULL;

	if (!PyArg_ParseTuple(args, "|O:append", &n))
		return NULL;
	if (n)
		return ring_call(c, n, 0);
	PyObject *one = PyLong_FromLong(1);
	PyObject *r = one ? ring_call(c, one, 0) : NULL;
	Py_XDECREF(one);
	return r;
}

/* A writeback cache's block_table after a GROW took `n` more blocks. */
static int grown_table(struct skvpy_cache *c, const int32_t *t, uint32_t n)
{
	PyObject *old = PyTuple_GET_ITEM(c->out, 2), *tab, *out;
	Py_ssize_t m = PyTuple_GET_SIZE(old);

	tab = PyTuple_New(m + n);
	for (Py_ssize_t i = 0; tab && i < m + n; i++) {
		PyObject *x = i < m ? PyTuple_GET_ITEM(old, i) : PyLong_FromLong(t[i - m]);

		if (i < m)
			Py_INCREF(x);
		if (!x)
			Py_CLEAR(tab);
		else
			PyTuple_SET_ITEM(tab, i, x);
	}
	if (!tab)
		return -1;
	out = Py_BuildValue("(OON)", PyTuple_GET_ITEM(c->out, 0), PyTuple_GET_ITEM(c->out, 1), tab);
	if (!out)
		return -1;
	Py_SETREF(c->out, out);
	return 0;
}

static PyObject *cache_grow(struct skvpy_cache *c, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"extra", "blocks", NULL};
	PyObject *extra, *blocks = NULL;
	int32_t *t = NULL;
	uint32_t n = 0;
	long x;
	int r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$O:grow", kwlist, &extra, &blocks))
		return NULL;
	if (!blocks || blocks == Py_None)
		return ring_call(c, extra, 1);
	if (live(c) < 0)
		return NULL;
	if (!c->out)
		return skvpy_error(EINVAL, "grow(blocks=...) is for a writeback cache");
	x = PyLong_AsLong(extra);
	if (x == -1 && PyErr_Occurred())
		return NULL;
	if (x < 1 || x > (1l << 22)) {
		PyErr_Format(PyExc_ValueError, "grow %ld: 1 .. %ld", x, 1l << 22);
		return NULL;
	}
	if (skvpy_block_table(blocks, 1u << 31, &t, &n) < 0)
		return NULL;
	if (c->busy) {
		PyMem_Free(t);
		return skvpy_error(EBUSY, "another thread is appending to or growing this cache");
	}
	c->busy = 1;
	c->client->busy++;
	Py_BEGIN_ALLOW_THREADS r = skv_cache_grow_blocks(c->k, (uint32_t)x, t, n);
	Py_END_ALLOW_THREADS c->client->busy--;
	c->busy = 0;
	if (r == 0 && grown_table(c, t, n) < 0) {
		PyMem_Free(t);
		return NULL;
	}
	PyMem_Free(t);
	if (r < 0)
		return skvpy_session_fail(c->client, r, "grow");
	Py_RETURN_NONE;
}

static PyObject *cache_release(struct skvpy_cache *c, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"linger", "appended", NULL};
	PyObject *app = NULL;
	long long appended = -1;
	int linger = 0, r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|p$O:release", kwlist, &linger, &app))
		return NULL;
	if (app && app != Py_None) {
		appended = PyLong_AsLongLong(app);
		if (appended == -1 && PyErr_Occurred())
			return NULL;
		if (appended < 0 || appended > UINT32_MAX) {
			PyErr_Format(PyExc_ValueError, "appended %lld: 0 .. %u", appended,
				     UINT32_MAX);
			return NULL;
		}
	}
	if (live(c) < 0)
		return NULL;
	if (c->busy)
		return skvpy_error(EBUSY, "release: another thread is appending to or growing "
					  "this cache");
	if (c->mapped.n)
		return skvpy_error(EBUSY,
				   "release: %zu range(s) of engine buffers are mapped over this "
				   "cache's blocks (map_blocks): unmap_blocks() them first, or a "
				   "later cache in the same arena pages would be written through "
				   "them",
				   c->mapped.n);
	r = release(c, linger, appended);
	if (r < 0)
		return skvpy_error(r, "release: %s",
				   c->client->c ? skv_client_error(c->client->c) : "failed");
	Py_RETURN_NONE;
}

static PyObject *cache_enter(struct skvpy_cache *c, PyObject *unused)
{
	(void)unused;
	if (live(c) < 0)
		return NULL;
	Py_INCREF(c);
	return (PyObject *)c;
}

static PyObject *cache_exit(struct skvpy_cache *c, PyObject *args)
{
	(void)args;
	if (c->busy)
		return skvpy_error(EBUSY, "release: another thread is appending to or growing "
					  "this cache");
	if (c->k)
		release_unmapped(c);
	Py_RETURN_FALSE;
}

static PyObject *cache_mass(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);
	PyObject *res;

	(void)closure;
	if (!in)
		return NULL;
	size_t n = (size_t)in->layers * in->h_store;
	float *m = PyMem_Malloc(n * sizeof(float) + 1);
	if (!m)
		return PyErr_NoMemory();
	for (uint32_t l = 0; l < in->layers; l++)
		for (uint32_t h = 0; h < in->h_store; h++)
			m[(size_t)l * in->h_store + h] = skv_cache_retained_mass(c->k, l, h);
	res = skvpy_array_from_floats(c->client->kind, m, in->layers, in->h_store);
	PyMem_Free(m);
	return res;
}

/* Rows each (layer, head) kept, [[.. per head] per layer] (budget modes:
 * they differ; uniform: every one is kept). */
static PyObject *cache_head_kept(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);
	PyObject *res;

	(void)closure;
	if (!in || !(res = PyList_New(in->layers)))
		return NULL;
	for (uint32_t l = 0; l < in->layers; l++) {
		PyObject *row = PyList_New(in->h_store);

		if (!row) {
			Py_DECREF(res);
			return NULL;
		}
		PyList_SET_ITEM(res, l, row);
		for (uint32_t h = 0; h < in->h_store; h++) {
			PyObject *v = PyLong_FromUnsignedLong(skv_cache_head_kept(c->k, l, h));

			if (!v) {
				Py_DECREF(res);
				return NULL;
			}
			PyList_SET_ITEM(row, h, v);
		}
	}
	return res;
}

/* The budget outcome: {"mode", "c_star", "fallback", "ragged", "kept_min",
 * "kept_mean", "mass_min"}. */
static PyObject *cache_budget(struct skvpy_cache *c, void *closure)
{
	static const char *const modes[] = {"uniform", "layers", "heads", "mass", "mass-heads"};
	struct skv_cache_budget b = {.budget_size = sizeof(b)};

	(void)closure;
	if (!info(c))
		return NULL;
	skv_cache_budget(c->k, &b);
	return Py_BuildValue("{s:s, s:I, s:O, s:O, s:I, s:d, s:d, s:I, s:K}", "mode",
			     (unsigned)b.mode < 5 ? modes[b.mode] : "unknown", "c_star", b.c_star,
			     "fallback", b.fallback ? Py_True : Py_False, "ragged",
			     b.ragged ? Py_True : Py_False, "kept_min", b.kept_min, "kept_mean",
			     (double)b.kept_mean, "mass_min", (double)b.mass_min, "group_size",
			     b.group_size, "group_wait_us", (unsigned long long)b.group_wait_us);
}

/* The decision group's size (0: none) and wait (us), from the budget outcome. */
static PyObject *cache_group(struct skvpy_cache *c, void *closure)
{
	struct skv_cache_budget b = {.budget_size = sizeof(b)};

	if (!info(c))
		return NULL;
	skv_cache_budget(c->k, &b);
	if (closure)
		return PyLong_FromUnsignedLongLong(b.group_wait_us);
	return PyLong_FromUnsignedLong(b.group_size);
}

/* The integer fields of skv_cache_info, by offset. */
#define FIELD(f) ((void *)offsetof(struct skv_cache_info, f))

static PyObject *cache_u32(struct skvpy_cache *c, void *off)
{
	const struct skv_cache_info *in = info(c);

	if (!in)
		return NULL;
	return PyLong_FromUnsignedLong(*(const uint32_t *)((const char *)in + (size_t)off));
}

static PyObject *cache_id(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);

	(void)closure;
	return in ? PyLong_FromUnsignedLongLong(in->id) : NULL;
}

static PyObject *cache_next_position(struct skvpy_cache *c, void *closure)
{
	(void)closure;
	return live(c) < 0 ? NULL : PyLong_FromUnsignedLong(skv_cache_next_position(c->k));
}

static PyObject *cache_next_slot(struct skvpy_cache *c, void *closure)
{
	(void)closure;
	return live(c) < 0 ? NULL : PyLong_FromUnsignedLong(skv_cache_next_slot(c->k));
}

static PyObject *cache_dtype(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);

	(void)closure;
	return in ? PyUnicode_FromString(skv_dtype_name(in->dtype) ? skv_dtype_name(in->dtype)
								   : "?")
		  : NULL;
}

/* fp8 caches: [(k_scale, v_scale)] per layer, the request's; else None */
static PyObject *cache_kv_scales(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);

	(void)closure;
	if (!in)
		return NULL;
	if (!skv_dtype_is_fp8(in->dtype))
		Py_RETURN_NONE;
	PyObject *lst = PyList_New(in->layers);
	for (uint32_t l = 0; lst && l < in->layers; l++) {
		PyObject *t = Py_BuildValue("(dd)", (double)skv_cache_kv_scale(c->k, l, 0),
					    (double)skv_cache_kv_scale(c->k, l, 1));
		if (!t) {
			Py_CLEAR(lst);
			break;
		}
		PyList_SET_ITEM(lst, l, t);
	}
	return lst;
}

static PyObject *cache_layout(struct skvpy_cache *c, void *closure)
{
	const struct skv_cache_info *in = info(c);

	(void)closure;
	if (!in)
		return NULL;
	return PyUnicode_FromString(in->layout == SKV_LAYOUT_NHD     ? "nhd"
				    : in->layout == SKV_LAYOUT_PAGED ? "paged"
								     : "hnd");
}

static PyObject *cache_block_table(struct skvpy_cache *c, void *closure)
{
	(void)closure;
	if (live(c) < 0)
		return NULL;
	if (!c->out)
		Py_RETURN_NONE;
	PyObject *t = PyTuple_GET_ITEM(c->out, 2);
	Py_INCREF(t);
	return t;
}

static PyObject *cache_released(struct skvpy_cache *c, void *closure)
{
	(void)closure;
	return PyBool_FromLong(!c->k);
}

static PyGetSetDef cache_getset[] = {
    {"id", (getter)cache_id, NULL, "the daemon's cache id", NULL},
    {"layers", (getter)cache_u32, NULL, "layers", FIELD(layers)},
    {"h_store", (getter)cache_u32, NULL, "stored heads (H_q expand, H_kv group)", FIELD(h_store)},
    {"head_dim", (getter)cache_u32, NULL, "D", FIELD(head_dim)},
    {"prompt_len", (getter)cache_u32, NULL, "L", FIELD(prompt_len)},
    {"kept", (getter)cache_u32, NULL, "slots filled by the compaction, per head", FIELD(kept)},
    {"capacity", (getter)cache_u32, NULL, "slots per head: kept + decode headroom",
     FIELD(capacity)},
    {"appended", (getter)cache_u32, NULL, "g, decode tokens appended", FIELD(appended)},
    {"budget", (getter)cache_u32, NULL, "C used (after pressure scaling)", FIELD(budget)},
    {"requested_budget", (getter)cache_u32, NULL, "C asked for", FIELD(requested_budget)},
    {"pressure", (getter)cache_u32, NULL, "pool pressure at admission (1 normal .. 3)",
     FIELD(pressure)},
    {"next_position", (getter)cache_next_position, NULL,
     "logical position of the next token: L + g (RoPE)", NULL},
    {"next_slot", (getter)cache_next_slot, NULL, "physical slot of the next token: kept + g", NULL},
    {"dtype", (getter)cache_dtype, NULL, "'f32', 'f16', 'bf16', 'f8e4m3fn' or 'f8e5m2'", NULL},
    {"layout", (getter)cache_layout, NULL, "'hnd', 'nhd' or 'paged'", NULL},
    {"block_size", (getter)cache_u32, NULL, "paged: slots per block (else 0)", FIELD(block_size)},
    {"n_blocks", (getter)cache_u32, NULL, "paged: blocks per layer in each of K and V",
     FIELD(n_blocks)},
    {"block_table", (getter)cache_block_table, NULL,
     "writeback: the destination blocks (slot i in block_table[i // block_size]), the\n"
     "first in_place_blocks of them the input's blocks in place; else None",
     NULL},
    {"in_place_blocks", (getter)cache_u32, NULL,
     "writeback: leading blocks left in place (the input's, never written)",
     FIELD(in_place_blocks)},
    {"max_decode", (getter)cache_u32, NULL, "writeback: the declared most decode tokens (0: none)",
     FIELD(max_decode)},
    {"decode_limit", (getter)cache_u32, NULL,
     "the most g may reach: capacity - kept, or max_decode when larger", FIELD(decode_limit)},
    {"retained_mass", (getter)cache_mass, NULL, "[layers, h_store] float32 (a copy)", NULL},
    {"kv_scales", (getter)cache_kv_scales, NULL,
     "fp8 caches: [(k_scale, v_scale)] per layer (K/V are the input's bytes); else None", NULL},
    {"head_kept", (getter)cache_head_kept, NULL,
     "rows each (layer, head) kept, a list per layer (budget modes: they differ)", NULL},
    {"budget_outcome", (getter)cache_budget, NULL,
     "dict: mode, c_star, fallback, ragged, kept_min, kept_mean, mass_min, group_size,\n"
     "group_wait_us",
     NULL},
    {"group_size", (getter)cache_group, NULL,
     "members of the decision group the cache was decided in (0: none)", NULL},
    {"group_wait_us", (getter)cache_group, NULL,
     "us from the group's first scored member to the decision (0: no group)", (void *)1},
    {"released", (getter)cache_released, NULL, "True once released", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef cache_methods[] = {
    {"k", (PyCFunction)cache_k, METH_O,
     "k(layer) -> zero-copy K of a layer: [h_store, capacity, D] (hnd) or\n"
     "[capacity, h_store, D] (nhd); slots kept + g onwards are the decode headroom.\n"
     "Paged: [n_blocks, block_size, h_store, D], slot i at block i // block_size (in the\n"
     "arena), or for writeback the engine's own pool (see block_table)."},
    {"v", (PyCFunction)cache_v, METH_O, "v(layer) -> zero-copy V, as k()."},
    {"k_head", (PyCFunction)cache_k_head, METH_VARARGS,
     "k_head(layer, head) -> zero-copy K of one stored head: [head_capacity, D], its\n"
     "head_kept[layer][head] rows first, then its decode headroom. The only view of a\n"
     "ragged cache (budget modes layers, heads, mass-heads); works for any host cache\n"
     "but paged."},
    {"v_head", (PyCFunction)cache_v_head, METH_VARARGS, "v_head(layer, head) -> as k_head()."},
    {"positions_head", (PyCFunction)cache_positions_head, METH_VARARGS,
     "positions_head(layer, head) -> int32 [head_capacity]: original positions, -1 for\n"
     "slots not yet appended."},
    {"positions", (PyCFunction)cache_positions, METH_O,
     "positions(layer) -> int32 [h_store, capacity]: each slot's original position,\n"
     "-1 for slots not yet appended."},
    {"map_blocks", (PyCFunction)cache_map_blocks, METH_VARARGS,
     "map_blocks(layer, 'k'|'v', dest): map the paged arena cache's run of that pool over\n"
     "dest (a page-aligned view of a tensor from empty(), e.g. pool[b]), MAP_FIXED: the\n"
     "pool's blocks there are the cache's until unmap_blocks() (or until another\n"
     "cache's map_blocks() there). While any is mapped release() is refused."},
    {"unmap_blocks", (PyCFunction)cache_unmap_blocks, METH_VARARGS,
     "unmap_blocks(layer, 'k'|'v', dest): put the buffer's own pages back over dest\n"
     "(before release() or grow(): the daemon reuses the region)."},
    {"append", (PyCFunction)cache_append, METH_VARARGS,
     "append(n=1): report n decode tokens written at slots next_slot.. (positions\n"
     "next_position..)."},
    {"grow", (PyCFunction)(void (*)(void))cache_grow, METH_VARARGS | METH_KEYWORDS,
     "grow(extra, *, blocks=None): more decode headroom (the cache moves: take k()/v()\n"
     "again). A writeback cache: blocks are the engine's new destination blocks for the\n"
     "grown slots past n_blocks, exactly ceil((capacity + extra) / block_size) - n_blocks\n"
     "of them (none: leave blocks out); nothing is copied; up to max_decode when the\n"
     "cache declared one (beyond: snapkv.Error E2BIG). block_table then lists them."},
    {"release", (PyCFunction)(void (*)(void))cache_release, METH_VARARGS | METH_KEYWORDS,
     "release(linger=False, *, appended=None): free the cache in the daemon (linger: keep\n"
     "it counted until pressure evicts it or the session ends). appended: the engine's g\n"
     "now (from appended to decode_limit), so a writeback cache needs no append() per\n"
     "token; a bad one is snapkv.Error EINVAL and the cache stays. Refused (snapkv.Error\n"
     "EBUSY) while its blocks are mapped over an engine buffer: unmap_blocks() first."},
    {"__enter__", (PyCFunction)cache_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)cache_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject skvpy_cache_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "snapkv.Cache",
    .tp_basicsize = sizeof(struct skvpy_cache),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compact cache held by snapkvd (from Client.compact or Request.wait).",
    .tp_methods = cache_methods,
    .tp_getset = cache_getset,
};

int skvpy_cache_init_type(PyObject *module)
{
	if (PyType_Ready(&skvpy_cache_type) < 0)
		return -1;
	Py_INCREF(&skvpy_cache_type);
	if (PyModule_AddObject(module, "Cache", (PyObject *)&skvpy_cache_type) < 0) {
		Py_DECREF(&skvpy_cache_type);
		return -1;
	}
	return 0;
}
