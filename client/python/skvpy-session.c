// SPDX-License-Identifier: MIT
#include "skvpy-session.h"

#include <errno.h>
#include <string.h>

#include "snapkv.h"
#include "skvpy-error.h"
#include "skvpy-mapping.h"

PyObject *skvpy_session_fail(struct skvpy_client *cl, int r, const char *what)
{
	const char *msg = cl->c ? skv_client_error(cl->c) : strerror(r < 0 ? -r : r);
	size_t n = strlen(what);

	/* libsnapkv's reasons often start with the call's name already */
	if (!strncmp(msg, what, n) && msg[n] == ':')
		return skvpy_error(r, "%s", msg);
	return skvpy_error(r, "%s: %s", what, msg);
}

int skvpy_session_arena_offset(struct skvpy_client *cl, const void *p, size_t *ret_offset)
{
	uintptr_t a = (uintptr_t)p;

	if (!cl->arena) {
		cl->arena = skvpy_mapping_alias(p, &cl->arena_base);
		if (!cl->arena)
			return -1;
	}
	if (a < cl->arena_base || a >= cl->arena_base + cl->arena->size)
		return skvpy_error_int(EPROTO, "cache at %p outside the arena", p);
	*ret_offset = a - cl->arena_base;
	return 0;
}

int skvpy_session_locate(struct skvpy_client *cl, const struct skvpy_view *v, const char *what,
			 struct skv_tensor_ref *ref, const struct skvpy_reg **ret_reg)
{
	uintptr_t lo, hi;

	skvpy_view_extent(v, &lo, &hi);
	for (size_t i = 0; i < cl->n_regs; i++) {
		const struct skvpy_reg *g = &cl->regs[i];
		if (g->cuda == v->cuda && lo >= g->base && hi <= g->base + g->size && hi > lo) {
			ref->buf = g->b;
			ref->offset = v->ptr - g->base;
			ref->dtype = v->dtype;
			if (ret_reg)
				*ret_reg = g;
			return 0;
		}
	}
	PyErr_Format(PyExc_ValueError,
		     "%s is not in storage registered with this client: allocate it with "
		     "client.empty() (or client.register() a tensor from empty() of another "
		     "client, or a CUDA tensor)",
		     what);
	return -1;
}
