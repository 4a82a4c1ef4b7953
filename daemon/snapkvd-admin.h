/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-admin.h - snapkvctl's questions: status, caches, ledger, metrics,
 * pressure (and pressure settings). Answers are structured (AdminReply);
 * snapkvctl renders tables and JSON.
 */
#ifndef SNAPKVD_ADMIN_H
#define SNAPKVD_ADMIN_H

#include <stddef.h>
#include <stdint.h>

#include "snapkvd-forward.h"
#include "snapkvd-metrics.h"

/*
 * The answer to one AdminRequest of session s: 0 with the packed AdminReply
 * in a malloc'd *ret_buf (a reply that cannot be packed says so itself), or
 * 0 with *ret_a: a ledger or caches page, to be built by snapkvd_admin_step
 * (in slices, on later loop rounds: snapkvd-adminq.h). -ENOMEM.
 */
struct snapkvd_admin_answer;
int snapkvd_admin_start(struct snapkvd_server *srv, const struct snapkvd_session *s,
			const uint8_t *payload, size_t len, uint8_t **ret_buf, size_t *ret_len,
			struct snapkvd_admin_answer **ret_a);
/* At most max more caches of a (*ret_built of them): 0 when more remain, 1
 * with the packed reply in *ret_buf once the page is complete (its status,
 * totals and cursor as they are then), -ENOMEM (a is unchanged). */
int snapkvd_admin_step(struct snapkvd_server *srv, struct snapkvd_admin_answer *a, unsigned max,
		       unsigned *ret_built, uint8_t **ret_buf, size_t *ret_len);
void snapkvd_admin_answer_free(struct snapkvd_admin_answer *a);
/* A packed AdminReply refusing a request: status, err, retry_after_ms. */
int snapkvd_admin_refusal(struct snapkvd_server *srv, int status, const char *err,
			  uint32_t retry_ms, uint8_t **ret_buf, size_t *ret_len);
/* Prometheus text exposition of the server, for snapkvctl metrics, the
 * metrics textfile and the HTTP listener, with the per-tenant series that
 * `shown` allows; caller frees. NULL: out of memory. */
char *snapkvd_admin_metrics_text(struct snapkvd_server *srv, enum snapkvd_metrics_tenants shown);

#endif
