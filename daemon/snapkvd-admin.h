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

/* The packed AdminReply to one AdminRequest of session s, in a malloc'd
 * *ret_buf (a reply that cannot be packed says so itself). 0 or -ENOMEM. */
int snapkvd_admin_answer(struct snapkvd_server *srv, const struct snapkvd_session *s,
			 const uint8_t *payload, size_t len, uint8_t **ret_buf, size_t *ret_len);
/* Prometheus text exposition of the server, for snapkvctl metrics, the
 * metrics textfile and the HTTP listener, with the per-tenant series that
 * `shown` allows; caller frees. NULL: out of memory. */
char *snapkvd_admin_metrics_text(struct snapkvd_server *srv, enum snapkvd_metrics_tenants shown);

#endif
