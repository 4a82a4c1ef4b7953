/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-slots.h - the limits on connections, which count server-wide,
 * not per session: connections still in their handshake (max_handshakes,
 * each with hello_timeout_ms to say HELLO) and the session slot a greeted
 * connection takes (engines: max_sessions in all and
 * max_sessions_per_tenant per uid; snapkvctl: max_admin_sessions, plus one
 * for root or an admin_uids member, so engines never lock the operator
 * out). The counters live in the server (n_handshakes, n_sessions,
 * n_admin_sessions); the sessions are only read here, never closed: the
 * session decides what to do with an answer.
 */
#ifndef SNAPKVD_SLOTS_H
#define SNAPKVD_SLOTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "snapkvd-forward.h"

/* Session s enters its handshake. */
void snapkvd_slots_handshake_begin(struct snapkvd_server *srv, struct snapkvd_session *s);
/* Its handshake ended (HELLO or close); once only. */
void snapkvd_slots_handshake_end(struct snapkvd_server *srv, struct snapkvd_session *s);
/* With max_handshakes connections in their handshake, the oldest one,
 * which gives way to a new connection; else NULL. */
struct snapkvd_session *snapkvd_slots_handshake_victim(struct snapkvd_server *srv);
/* Whether s, still in its handshake at now_ns, is past hello_timeout_ms:
 * then true with the reason in err. */
bool snapkvd_slots_hello_late(const struct snapkvd_server *srv, const struct snapkvd_session *s,
			      uint64_t now_ns, char *err, size_t errlen);

/* The slot of a greeted session (admin: snapkvctl). 0, or -EUSERS with
 * the limit and its key in err. */
int snapkvd_slots_take(struct snapkvd_server *srv, struct snapkvd_session *s, bool admin, char *err,
		       size_t errlen);
/* The session is freed: its slot, if it took one, is free again. */
void snapkvd_slots_put(struct snapkvd_server *srv, struct snapkvd_session *s);

#endif
