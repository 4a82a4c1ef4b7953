// SPDX-License-Identifier: MIT
/* snapkvd-adminq.c - admin requests: rate limits, sliced answers; see
 * snapkvd-adminq.h. */
#include "snapkvd-adminq.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-admin.h"
#include "snapkvd-bucket.h"
#include "snapkvd-clock.h"
#include "snapkvd-config.h"
#include "snapkvd-server.h"
#include "snapkvd-session.h"

/* uids with a bucket at once; past that, the fullest bucket (the one that
 * forgets least) makes room */
#define UID_BUCKETS 64

struct pending {
	struct snapkvd_session *s; /* a reference held */
	struct snapkvd_admin_answer *a;
	snapkvd_adminq_done_fn *done;
	struct pending *next;
};

struct uid_bucket {
	uid_t uid;
	struct snapkvd_bucket b;
};

struct snapkvd_adminq {
	struct pending *head, *tail;
	struct uid_bucket uids[UID_BUCKETS];
	unsigned n_uids;
};

int snapkvd_adminq_new(struct snapkvd_adminq **ret)
{
	*ret = calloc(1, sizeof(**ret));
	return *ret ? 0 : -ENOMEM;
}

void snapkvd_adminq_free(struct snapkvd_adminq *q)
{
	if (!q)
		return;
	while (q->head) {
		struct pending *p = q->head;

		q->head = p->next;
		snapkvd_admin_answer_free(p->a);
		free(p);
	}
	free(q);
}

/* ------------------------------------------------------------ rate limits */

struct limit {
	const char *key;
	unsigned rate, burst;
};

static struct limit uid_limit(const struct snapkvd_config *c, uid_t uid)
{
	if (snapkvd_config_is_admin(c, uid))
		return (struct limit){"admin_root_rate", c->admin_root_rate, c->admin_root_burst};
	return (struct limit){"admin_tenant_rate", c->admin_tenant_rate, c->admin_tenant_burst};
}

/* uid's bucket brought up to now (a new one starts full). */
static struct snapkvd_bucket *uid_bucket(struct snapkvd_adminq *q, const struct snapkvd_config *c,
					 uid_t uid, uint64_t now)
{
	struct limit l = uid_limit(c, uid);
	struct uid_bucket *e = NULL;

	for (unsigned i = 0; i < q->n_uids && !e; i++)
		if (q->uids[i].uid == uid)
			e = &q->uids[i];
	if (!e && q->n_uids < UID_BUCKETS) {
		e = &q->uids[q->n_uids++];
		*e = (struct uid_bucket){.uid = uid};
	}
	if (!e) { /* full: the fullest bucket forgets least */
		for (unsigned i = 0; i < UID_BUCKETS; i++) {
			struct limit li = uid_limit(c, q->uids[i].uid);

			snapkvd_bucket_refill(&q->uids[i].b, li.rate, li.burst, now);
			if (!e || q->uids[i].b.nano > e->b.nano)
				e = &q->uids[i];
		}
	}
	if (e->uid != uid)
		*e = (struct uid_bucket){.uid = uid};
	snapkvd_bucket_refill(&e->b, l.rate, l.burst, now);
	return &e->b;
}

/* A token from the session's bucket and its uid's, or neither: -EAGAIN
 * with the reason (naming the key) and the wait in whole milliseconds. */
static int admit(struct snapkvd_adminq *q, const struct snapkvd_config *c,
		 struct snapkvd_session *s, char *err, size_t errlen, uint32_t *ret_retry_ms)
{
	uint64_t now = snapkvd_now_ns(), ws, wt, w;
	struct limit lt = uid_limit(c, s->uid);
	struct limit ls = {"admin_session_rate", c->admin_session_rate, c->admin_session_burst};
	struct snapkvd_bucket *tb = uid_bucket(q, c, s->uid, now);
	const struct limit *l;

	snapkvd_bucket_refill(&s->admin_bucket, ls.rate, ls.burst, now);
	ws = snapkvd_bucket_wait_ns(&s->admin_bucket, ls.rate);
	wt = snapkvd_bucket_wait_ns(tb, lt.rate);
	if (!ws && !wt) {
		snapkvd_bucket_take(&s->admin_bucket, ls.rate);
		snapkvd_bucket_take(tb, lt.rate);
		return 0;
	}
	l = wt >= ws ? &lt : &ls;
	w = wt >= ws ? wt : ws;
	*ret_retry_ms = (uint32_t)((w + 999999) / 1000000);
	snprintf(err, errlen,
		 "admin requests over %s (%u a second, burst %u %s) for uid %u: retry in %u ms",
		 l->key, l->rate, l->burst, l == &ls ? "for this session" : "for this uid",
		 (unsigned)s->uid, (unsigned)*ret_retry_ms);
	return -EAGAIN;
}

/* -------------------------------------------------------------- answers */

int snapkvd_adminq_request(struct snapkvd_adminq *q, struct snapkvd_server *srv,
			   struct snapkvd_session *s, const uint8_t *payload, size_t len,
			   snapkvd_adminq_done_fn *done, uint8_t **ret_buf, size_t *ret_len)
{
	struct snapkvd_admin_answer *a = NULL;
	struct pending *p;
	uint32_t retry = 0;
	char err[256];
	int r = admit(q, &srv->cfg, s, err, sizeof(err), &retry);

	*ret_buf = NULL;
	if (r < 0) {
		srv->admin_refused++;
		return snapkvd_admin_refusal(srv, r, err, retry, ret_buf, ret_len);
	}
	r = snapkvd_admin_start(srv, s, payload, len, ret_buf, ret_len, &a);
	if (r < 0 || !a)
		return r;
	p = calloc(1, sizeof(*p));
	if (!p) {
		snapkvd_admin_answer_free(a);
		return -ENOMEM;
	}
	*p = (struct pending){.s = s, .a = a, .done = done};
	if (q->tail)
		q->tail->next = p;
	else
		q->head = p;
	q->tail = p;
	s->refs++;
	s->admin_pending = true;
	srv->admin_pending++;
	return 1;
}

static void drop(struct snapkvd_server *srv, struct pending *p)
{
	srv->admin_pending--;
	p->s->admin_pending = false;
	snapkvd_admin_answer_free(p->a);
	snapkvd_session_unref(p->s);
	free(p);
}

unsigned snapkvd_adminq_run(struct snapkvd_adminq *q, struct snapkvd_server *srv)
{
	struct pending *p = q->head;
	unsigned built = 0;
	uint8_t *buf = NULL;
	size_t n = 0;
	int r;

	if (!p)
		return 0;
	q->head = p->next;
	if (!q->head)
		q->tail = NULL;
	p->next = NULL;
	if (p->s->closing) {
		drop(srv, p);
		return 1;
	}
	r = snapkvd_admin_step(srv, p->a,
			       srv->cfg.admin_slice_caches ? srv->cfg.admin_slice_caches : 1,
			       &built, &buf, &n);
	srv->admin_slices++;
	if (r == 0) { /* its turn again after the others' */
		if (q->tail)
			q->tail->next = p;
		else
			q->head = p;
		q->tail = p;
		return built ? built : 1;
	}
	if (r < 0) {
		snapkvd_session_close(p->s, r);
	} else {
		p->s->admin_pending = false;
		p->done(p->s, buf, n);
		free(buf);
	}
	drop(srv, p);
	return built ? built : 1;
}
