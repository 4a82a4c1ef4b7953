// SPDX-License-Identifier: MIT
/*
 * libsnapkv-desc.c - compaction descriptions and params across ABI sizes:
 * skv_client_params_init, descriptions laid out before the budget modes,
 * the budget fields of a CompactRequest, the prefill-wait helpers and the
 * decision-group fields.
 */
#include "libsnapkv-internal.h"

#include <errno.h>
#include <string.h>

SKV_EXPORT void skv_client_params_init(struct skv_params *p)
{
	/* static: its padding is zero too, as memset left it before */
	static const struct skv_params d = SKV_PARAMS_DEFAULTS;

	/* Only the fields before the budget modes: a program built before them
	 * passes a struct that ends there (params_size says so). */
	memcpy(p, &d, SKV_PARAMS_SIZE_V1);
	p->params_size = SKV_PARAMS_SIZE_V1;
}

/*
 * Older description layouts. Before the budget modes grew struct
 * skv_params (v1), and before span grew it past the padding that
 * min_window had filled (SNAPKV_1.6 to 1.8, v8), the fields after `params`
 * started at the old end of params, 8-aligned. desc_size tells them apart:
 * a v1 description ends before the v8 tail starts, a v8 one at most at the
 * end of kv_scales (the last SNAPKV_1.8 field) in that layout; anything
 * longer is today's.
 */
#define DESC_TAIL offsetof(struct skv_compact_desc, layer)
#define DESC_OLD_TAIL(psize)                                                                       \
	((offsetof(struct skv_compact_desc, params) + (psize) + 7) & ~(size_t)7)
#define DESC_V1_TAIL DESC_OLD_TAIL(SKV_PARAMS_SIZE_V1)
#define DESC_V8_TAIL DESC_OLD_TAIL(SKV_PARAMS_SIZE_V3)
#define DESC_V8_END                                                                                \
	(DESC_V8_TAIL + offsetof(struct skv_compact_desc, kv_scales) + sizeof(const float *) -     \
	 DESC_TAIL)

struct desc_layout {
	size_t params; /* bytes of params it holds */
	size_t tail;   /* where its fields after params start */
};

/* d's layout when it is an old one (1), or today's (0). */
static int desc_old(const struct skv_compact_desc *d, struct desc_layout *ret)
{
	if (d->desc_size < DESC_V8_TAIL)
		*ret = (struct desc_layout){SKV_PARAMS_SIZE_V1, DESC_V1_TAIL};
	else if (d->desc_size <= DESC_V8_END)
		*ret = (struct desc_layout){SKV_PARAMS_SIZE_V3, DESC_V8_TAIL};
	else
		return 0;
	return 1;
}

/* A caller's description in the current layout: d itself, or *tmp filled
 * from an old-layout one (its params take the defaults past what it holds). */
const struct skv_compact_desc *skv__desc_current(const struct skv_compact_desc *d,
						 struct skv_compact_desc *tmp)
{
	static const struct skv_params dp = SKV_PARAMS_DEFAULTS;
	struct desc_layout o;

	if (!desc_old(d, &o))
		return d;
	memset(tmp, 0, sizeof(*tmp));
	memcpy(tmp, d, offsetof(struct skv_compact_desc, params) + o.params);
	memcpy((char *)&tmp->params + o.params, (const char *)&dp + o.params,
	       sizeof(dp) - o.params);
	if (d->desc_size > o.tail) {
		size_t n = d->desc_size - o.tail;
		if (n > sizeof(*tmp) - DESC_TAIL)
			n = sizeof(*tmp) - DESC_TAIL;
		memcpy((char *)tmp + DESC_TAIL, (const char *)d + o.tail, n);
	}
	tmp->desc_size = d->desc_size > o.tail ? d->desc_size + (uint32_t)(DESC_TAIL - o.tail)
					       : (uint32_t)DESC_TAIL;
	return tmp;
}

/* Write back what the helpers set into an old-layout description. */
static void desc_store_old(struct skv_compact_desc *d, const struct skv_compact_desc *cur)
{
	struct desc_layout o;

	if (desc_old(d, &o) && d->desc_size > o.tail)
		memcpy((char *)d + o.tail, (const char *)cur + DESC_TAIL, d->desc_size - o.tail);
}

/* Today's single C: params from before the budget modes, or uniform with
 * no fallback (sent without the budget fields, as before). */
bool skv__desc_budget_plain(const struct skv_compact_desc *d)
{
	return d->params.params_size < SKV_PARAMS_SIZE_V2 ||
	       (d->params.budget_mode == SKV_BUDGET_UNIFORM && d->params.fallback_below == 0.0f);
}

/* The budget mode's fields of a CompactRequest (120-129). */
void skv__budget_msg(const struct skv_params *p, Snapkv__V1__CompactRequest *cr)
{
	cr->budget_mode = (Snapkv__V1__BudgetMode)(p->budget_mode + 1);
	cr->n_layer_caps = p->n_layer_caps <= SKV_MAX_LAYER_CAPS ? p->n_layer_caps : 0;
	cr->layer_caps = (uint32_t *)p->layer_caps;
	cr->pyramid_r = p->pyramid_r;
	cr->head_floor = p->head_floor;
	cr->head_floor_given = true;
	cr->tau = p->tau;
	cr->c_min = p->c_min;
	cr->c_max = p->c_max;
	cr->c_step = p->c_step;
	cr->fallback_below = p->fallback_below;
}

static int wait_flag(struct skv_compact_desc *d, const struct skv_buffer *flag_buf, uint64_t offset,
		     uint32_t value, uint32_t timeout_ms)
{
	if (!d || !flag_buf || offset % 4 ||
	    d->desc_size <
		offsetof(struct skv_compact_desc, wait_ipc_event) + sizeof(d->wait_ipc_event))
		return -EINVAL;
	d->prefill_wait = SKV_WAIT_CUDA_FLAG;
	d->wait_buffer = flag_buf;
	d->wait_offset = offset;
	d->wait_value = value;
	d->wait_timeout_ms = timeout_ms;
	return 0;
}

static int wait_event(struct skv_compact_desc *d, const void *ipc_handle, uint32_t timeout_ms)
{
	if (!d || !ipc_handle ||
	    d->desc_size <
		offsetof(struct skv_compact_desc, wait_ipc_event) + sizeof(d->wait_ipc_event))
		return -EINVAL;
	d->prefill_wait = SKV_WAIT_CUDA_IPC_EVENT;
	d->wait_buffer = NULL;
	d->wait_offset = 0;
	d->wait_value = 0;
	memcpy(d->wait_ipc_event, ipc_handle, sizeof(d->wait_ipc_event));
	d->wait_timeout_ms = timeout_ms;
	return 0;
}

#define DESC_GROUP_END (offsetof(struct skv_compact_desc, group_timeout_ms) + sizeof(uint32_t))

/* The group fields of d, when desc_size covers them; else no group. */
void skv__desc_group(const struct skv_compact_desc *d, const char **key, uint32_t *size,
		     uint32_t *timeout_ms)
{
	bool has = d->desc_size >= DESC_GROUP_END;

	*key = has && d->group_key && d->group_key[0] ? d->group_key : NULL;
	*size = has ? d->group_size : 0;
	*timeout_ms = has ? d->group_timeout_ms : 0;
}

/* What the daemon checks first, checked here with a clear message: the
 * key's length and bytes, a size with the key and a key with the size. */
static int group_check(struct skv_client *c, const char *key, uint32_t size)
{
	size_t n;

	if (!key && !size)
		return 0;
	if (!key)
		return skv__fail(c, -EINVAL,
				 "group_size %u without a group_key (a decision group needs both)",
				 size);
	n = strnlen(key, SKV_MAX_GROUP_KEY + 1);
	if (n > SKV_MAX_GROUP_KEY)
		return skv__fail(c, -EINVAL, "group_key is longer than %u bytes",
				 SKV_MAX_GROUP_KEY);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e)
			return skv__fail(c, -EINVAL,
					 "group_key: byte %zu (0x%02x) is not printable ASCII", i,
					 (unsigned char)key[i]);
	if (!size)
		return skv__fail(c, -EINVAL,
				 "group_size 0 with group_key \"%s\": a decision group needs its "
				 "size (1..max_group_size)",
				 key);
	return 0;
}

SKV_EXPORT int skv_compact_desc_group(struct skv_compact_desc *d, const char *key, uint32_t size,
				      uint32_t timeout_ms)
{
	struct skv_compact_desc tmp, *cur;

	if (!d || !key || !key[0] || group_check(NULL, key, size))
		return -EINVAL;
	/* an old-layout description (SNAPKV_1.7, 1.8) has them elsewhere */
	cur = (struct skv_compact_desc *)skv__desc_current(d, &tmp);
	if (cur->desc_size < DESC_GROUP_END)
		return -EINVAL;
	cur->group_key = key;
	cur->group_size = size;
	cur->group_timeout_ms = timeout_ms;
	if (cur != d)
		desc_store_old(d, cur);
	return 0;
}

int skv__desc_check(struct skv_client *c, const struct skv_compact_desc *d)
{
	const char *key;
	uint32_t size, timeout_ms;

	/* params sized before the budget modes (skv_client_params_init) with a
	 * mode or a fallback set after: sending them as uniform would silently
	 * drop what the caller asked for */
	if (d->params.params_size < SKV_PARAMS_SIZE_V2 &&
	    (d->params.budget_mode != SKV_BUDGET_UNIFORM || d->params.fallback_below != 0.0f))
		return skv__fail(c, -EINVAL,
				 "params_size %u ends before budget_mode and fallback_below, "
				 "which are set (budget_mode %d, fallback_below %g): "
				 "skv_client_params_init() gives the size from before the budget "
				 "modes; fill params with skv_params_init() or "
				 "SKV_PARAMS_DEFAULTS, or set params_size to sizeof(struct "
				 "skv_params) (%zu)",
				 d->params.params_size, (int)d->params.budget_mode,
				 (double)d->params.fallback_below, sizeof(d->params));
	if (!skv__desc_budget_plain(d) && d->params.n_layer_caps > SKV_MAX_LAYER_CAPS)
		return skv__fail(c, -EINVAL, "%u per-layer budgets, at most %u",
				 d->params.n_layer_caps, SKV_MAX_LAYER_CAPS);
	/* the wire's mode is ours + 1, and its 0 means uniform: an unknown mode
	 * must not travel as one */
	if (!skv__desc_budget_plain(d) && (unsigned)d->params.budget_mode > SKV_BUDGET_MASS_HEADS)
		return skv__fail(c, -EINVAL, "unknown budget mode %d", (int)d->params.budget_mode);
	skv__desc_group(d, &key, &size, &timeout_ms);
	if (group_check(c, key, size) < 0)
		return -EINVAL;
	return 0;
}

/* The wait helpers on a description of either layout. */
SKV_EXPORT int skv_compact_desc_wait_flag(struct skv_compact_desc *d,
					  const struct skv_buffer *flag_buf, uint64_t offset,
					  uint32_t value, uint32_t timeout_ms)
{
	struct skv_compact_desc tmp;
	int r;

	if (!d || !desc_old(d, &(struct desc_layout){0}))
		return wait_flag(d, flag_buf, offset, value, timeout_ms);
	r = wait_flag((struct skv_compact_desc *)skv__desc_current(d, &tmp), flag_buf, offset,
		      value, timeout_ms);
	if (r == 0)
		desc_store_old(d, &tmp);
	return r;
}

SKV_EXPORT int skv_compact_desc_wait_event(struct skv_compact_desc *d, const void *ipc_handle,
					   uint32_t timeout_ms)
{
	struct skv_compact_desc tmp;
	int r;

	if (!d || !desc_old(d, &(struct desc_layout){0}))
		return wait_event(d, ipc_handle, timeout_ms);
	r = wait_event((struct skv_compact_desc *)skv__desc_current(d, &tmp), ipc_handle,
		       timeout_ms);
	if (r == 0)
		desc_store_old(d, &tmp);
	return r;
}
