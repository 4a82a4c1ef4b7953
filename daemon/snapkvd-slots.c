// SPDX-License-Identifier: MIT
/* snapkvd-slots.c - server-wide connection limits; see snapkvd-slots.h. */
#include "snapkvd-slots.h"

#include <errno.h>
#include <stdio.h>

#include "snapkvd-config.h"
#include "snapkvd-server.h"
#include "snapkvd-session.h"

void snapkvd_slots_handshake_begin(struct snapkvd_server *srv, struct snapkvd_session *s)
{
	s->handshake = true;
	srv->n_handshakes++;
}

void snapkvd_slots_handshake_end(struct snapkvd_server *srv, struct snapkvd_session *s)
{
	if (s->handshake) {
		s->handshake = false;
		srv->n_handshakes--;
	}
}

/*
 * A connection in its handshake holds no session slot: only max_handshakes
 * of them exist at once (the oldest gives way to a new one) and each has
 * hello_timeout_ms to say HELLO. Slots are taken at HELLO.
 */
struct snapkvd_session *snapkvd_slots_handshake_victim(struct snapkvd_server *srv)
{
	struct snapkvd_session *old = NULL;

	if (srv->n_handshakes < srv->cfg.max_handshakes)
		return NULL;
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		if (x->handshake && !x->closing)
			old = x; /* the list is newest first */
	return old;
}

bool snapkvd_slots_hello_late(const struct snapkvd_server *srv, const struct snapkvd_session *s,
			      uint64_t now_ns, char *err, size_t errlen)
{
	if (!s->handshake || s->closing ||
	    now_ns - s->created_ns <= srv->cfg.hello_timeout_ms * 1000000ull)
		return false;
	snprintf(err, errlen, "no HELLO within hello_timeout_ms (%u ms)",
		 srv->cfg.hello_timeout_ms);
	return true;
}

static int take_admin(struct snapkvd_server *srv, struct snapkvd_session *s, char *err,
		      size_t errlen)
{
	const struct snapkvd_config *cfg = &srv->cfg;
	unsigned cap = cfg->max_admin_sessions + (snapkvd_config_is_admin(cfg, s->uid) ? 1 : 0);

	if (srv->n_admin_sessions >= cap) {
		snprintf(err, errlen, "too many admin sessions: %u open, max_admin_sessions is %u",
			 srv->n_admin_sessions, cfg->max_admin_sessions);
		return -EUSERS;
	}
	srv->n_admin_sessions++;
	s->slot = true;
	return 0;
}

int snapkvd_slots_take(struct snapkvd_server *srv, struct snapkvd_session *s, bool admin, char *err,
		       size_t errlen)
{
	const struct snapkvd_config *cfg = &srv->cfg;
	unsigned mine = 0;

	if (admin)
		return take_admin(srv, s, err, errlen);
	if (srv->n_sessions >= cfg->max_sessions) {
		snprintf(err, errlen, "too many sessions: %u open, max_sessions is %u",
			 srv->n_sessions, cfg->max_sessions);
		return -EUSERS;
	}
	for (struct snapkvd_session *x = srv->sessions; x; x = x->next)
		if (x->slot && !x->admin && !x->closing && x->uid == s->uid)
			mine++;
	if (mine >= cfg->max_sessions_per_tenant) {
		snprintf(err, errlen,
			 "uid %u already has %u sessions: max_sessions_per_tenant is %u",
			 (unsigned)s->uid, mine, cfg->max_sessions_per_tenant);
		return -EUSERS;
	}
	srv->n_sessions++;
	s->slot = true;
	return 0;
}

void snapkvd_slots_put(struct snapkvd_server *srv, struct snapkvd_session *s)
{
	if (!s->slot)
		return;
	s->slot = false;
	if (s->admin)
		srv->n_admin_sessions--;
	else
		srv->n_sessions--;
}
