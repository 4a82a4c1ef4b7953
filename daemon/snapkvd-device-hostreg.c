// SPDX-License-Identifier: MIT
/*
 * snapkvd-device-hostreg.c - host registrations shared by the devices'
 * workers; see snapkvd-device-hostreg.h.
 */
#include "snapkvd-device-hostreg.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/skv-backend.h"

#define PAGE 4096u

/* A range of whole pages: a registration (run) or a job's hold. */
struct span {
	uintptr_t b, e;
	struct span *next;
};

struct snapkvd_hostreg_hold {
	struct span s;
};

struct snapkvd_hostreg {
	const struct skv_backend_ops *ops;
	pthread_mutex_t mu;
	struct span *runs;  /* registered, disjoint */
	struct span *holds; /* the jobs', by s.next */
};

int snapkvd_hostreg_new(const struct skv_backend_ops *ops, struct snapkvd_hostreg **ret)
{
	struct snapkvd_hostreg *h = calloc(1, sizeof(*h));

	if (!h)
		return -ENOMEM;
	h->ops = ops;
	pthread_mutex_init(&h->mu, NULL);
	*ret = h;
	return 0;
}

void snapkvd_hostreg_free(struct snapkvd_hostreg *h)
{
	if (!h)
		return;
	pthread_mutex_destroy(&h->mu);
	free(h);
}

static bool overlap(const struct span *a, uintptr_t b, uintptr_t e)
{
	return a->b < e && b < a->e;
}

/* mu held: the first registered run overlapping [b, e), or NULL */
static const struct span *run_in(const struct snapkvd_hostreg *h, uintptr_t b, uintptr_t e)
{
	const struct span *first = NULL;

	for (const struct span *r = h->runs; r; r = r->next)
		if (overlap(r, b, e) && (!first || r->b < first->b))
			first = r;
	return first;
}

/* mu held: register [b, e) (no page of it registered) as a run */
static int add_run(struct snapkvd_hostreg *h, struct skv_cuda_dev *dev, uintptr_t b, uintptr_t e,
		   struct skv_error *kerr)
{
	struct span *r = calloc(1, sizeof(*r));
	void *d = NULL;
	int e2;

	if (!r) {
		snprintf(kerr->msg, sizeof(kerr->msg), "out of memory");
		return -ENOMEM;
	}
	e2 = h->ops->host_register(dev, (void *)b, e - b, &d, kerr);
	if (e2 == 0 && d != (void *)b) {
		h->ops->host_unregister(dev, (void *)b);
		snprintf(kerr->msg, sizeof(kerr->msg),
			 "the GPU does not see host memory at its host address");
		e2 = -ENOTSUP;
	}
	if (e2 < 0) {
		free(r);
		return e2;
	}
	*r = (struct span){b, e, h->runs};
	h->runs = r;
	return 0;
}

/* mu held: runs no hold overlaps any more go */
static void drop_unheld(struct snapkvd_hostreg *h, struct skv_cuda_dev *dev, uintptr_t b,
			uintptr_t e)
{
	for (struct span **pp = &h->runs; *pp;) {
		struct span *r = *pp;
		bool held = false;

		for (const struct span *k = h->holds; k && !held; k = k->next)
			held = overlap(k, r->b, r->e);
		if (held || !overlap(r, b, e)) {
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		h->ops->host_unregister(dev, (void *)r->b);
		free(r);
	}
}

int snapkvd_hostreg_hold(struct snapkvd_hostreg *h, struct skv_cuda_dev *dev, void *p, uint64_t n,
			 struct snapkvd_hostreg_hold **ret, struct skv_error *kerr)
{
	uintptr_t b = (uintptr_t)p & ~(uintptr_t)(PAGE - 1);
	uintptr_t e = ((uintptr_t)p + n + PAGE - 1) & ~(uintptr_t)(PAGE - 1);
	struct snapkvd_hostreg_hold *k = calloc(1, sizeof(*k));
	int r = 0;

	if (!k) {
		snprintf(kerr->msg, sizeof(kerr->msg), "out of memory");
		return -ENOMEM;
	}
	k->s = (struct span){b, e, NULL};
	pthread_mutex_lock(&h->mu);
	/* the pages between registered runs, run by run */
	for (uintptr_t at = b; at < e && r == 0;) {
		const struct span *x = run_in(h, at, e);

		if (!x) {
			r = add_run(h, dev, at, e, kerr);
			break;
		}
		if (x->b > at)
			r = add_run(h, dev, at, x->b, kerr);
		at = x->e;
	}
	if (r == 0) {
		k->s.next = h->holds;
		h->holds = &k->s;
	} else {
		drop_unheld(h, dev, b, e); /* the runs this hold had added */
		free(k);
		k = NULL;
	}
	pthread_mutex_unlock(&h->mu);
	*ret = k;
	return r;
}

void snapkvd_hostreg_release(struct snapkvd_hostreg *h, struct skv_cuda_dev *dev,
			     struct snapkvd_hostreg_hold *k)
{
	if (!k)
		return;
	pthread_mutex_lock(&h->mu);
	for (struct span **pp = &h->holds; *pp; pp = &(*pp)->next)
		if (*pp == &k->s) {
			*pp = k->s.next;
			break;
		}
	drop_unheld(h, dev, k->s.b, k->s.e);
	pthread_mutex_unlock(&h->mu);
	free(k);
}
