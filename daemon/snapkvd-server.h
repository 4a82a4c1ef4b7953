/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-server.h - the daemon as a whole: it builds the objects (pool,
 * runner, compactor, loop, listener, pressure policy), owns the session
 * list and the daemon-wide counters, wires signals, the housekeeping timer
 * and the policy's actions to them, and tears it all down in order.
 *
 * Threads: the loop thread owns every object reachable from here. A
 * compaction worker only touches its job (snapkvd-job.h) and hands it back
 * through the compactor; the loop thread posts its completion, so every CQ
 * keeps one producer.
 */
#ifndef SNAPKVD_SERVER_H
#define SNAPKVD_SERVER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "snapkvd-arena.h"
#include "snapkvd-config.h"
#include "snapkvd-forward.h"
#include "snapkvd-log.h"
#include "snapkvd-loop.h"
#include "snapkvd-policy.h"
#include "snapkvd-tally.h"

/* Causes of per-connection log lines, summarised under floods
 * (snapkvd_log_cause). */
enum snapkvd_flood {
	SNAPKVD_FLOOD_NO_SESSION, /* closed before holding a session: evicted, late, refused */
	SNAPKVD_FLOOD_REFUSED,	  /* HELLO refused (uid, limits, name) */
	SNAPKVD_FLOOD_BAD_FRAME,  /* a frame we cannot trust */
	SNAPKVD_FLOOD_N,
};

struct snapkvd_server {
	struct snapkvd_config cfg;
	struct snapkvd_log_cause floods[SNAPKVD_FLOOD_N];
	const char *config_path; /* reread on SIGHUP (NULL: none) */
	struct snapkvd_pool *pool;
	struct snapkvd_device *device; /* the GPU, if any (snapkvd-device.h) */
	struct snapkvd_runner *runner;
	struct snapkvd_compactor *compactor;
	struct snapkvd_groups *groups; /* decision groups (snapkvd-group.h) */
	struct snapkvd_loop *loop;
	struct snapkvd_listener *listener;
	struct snapkvd_http *http;    /* metrics_listen; NULL when off */
	struct snapkvd_policy policy; /* pressure policy, hooks, metrics */
	/* every session's arena: released regions cached for reuse up to
	 * arena_cache_bytes, none under pressure */
	struct snapkvd_arena_set arenas;
	struct snapkvd_session *sessions;
	struct snapkvd_tally tally; /* running ledger sums, LRU of lingering caches */
	unsigned n_sessions;	    /* engine sessions past HELLO (max_sessions) */
	unsigned n_admin_sessions;  /* admin sessions past HELLO (max_admin_sessions) */
	unsigned n_handshakes;	    /* connections before HELLO (max_handshakes) */
	uint64_t next_session_id, next_cache_id;
	bool draining; /* SIGTERM: no new work, stop once the queue is empty */
	uint64_t start_ns;
	double start_realtime_s;
	uint64_t requests, errors, compactions, sessions_total;
	uint64_t jobs_cancelled; /* not run, or stopped, because their session ended */
	/* admin answers (snapkvd-adminq.h): the queue, slices built, requests
	 * refused by a rate limit, answers being built now */
	struct snapkvd_adminq *adminq;
	uint64_t admin_slices, admin_refused;
	unsigned admin_pending;
	/* signals, housekeeping, finished jobs (snapkvd-server.c) */
	int signal_fd, timer_fd;
	struct snapkvd_loop_ev ev_signal, ev_timer, ev_jobs;
	uint8_t sigbuf[128];
	uint64_t timerbuf, jobsbuf;
	bool watchdog;
	uint64_t last_status_ns;
};

/* The signals the daemon takes through its signalfd: TERM, INT, HUP. main
 * blocks them before any thread exists, so every thread inherits the mask. */
void snapkvd_server_signals(sigset_t *ret);

/* Build the daemon for cfg (copied); config_path is kept for SIGHUP. Logs
 * what failed; 0 or -errno. */
int snapkvd_server_new(const struct snapkvd_config *cfg, const char *config_path,
		       struct snapkvd_server **ret);
/* Serve until SIGTERM/SIGINT and the drain of in-flight compactions. */
int snapkvd_server_run(struct snapkvd_server *srv);
/* Tear down, in order; accepts NULL and a half-built server. */
void snapkvd_server_free(struct snapkvd_server *srv);

#endif
