/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-http.h - the optional HTTP listener for Prometheus: GET (or HEAD)
 * /metrics answers the exposition `snapkvctl metrics` prints (the daemon's
 * metrics code makes it; this object only carries it), /healthz answers
 * "ok" (503 "draining" once SIGTERM came). Anything else gets 400, 404,
 * 405 or 431, and one request per connection (Connection: close).
 *
 * Off unless metrics_listen is set; then bound to that address only, a
 * port alone meaning loopback. It runs on the daemon's io_uring loop and
 * never blocks it: every read and send is a loop operation into a buffer of
 * bounded size, and three limits hold per listener:
 *   metrics_http_max_request      bytes of request line and headers (431)
 *   metrics_http_max_connections  open at once; one more is answered 503
 *   metrics_http_timeout_ms       from accept to the last byte, after
 *                                 which the connection is shut down
 * and the exposition, once rendered, is served again to every scrape for
 * metrics_http_cache_ms (0: rendered for each), so a scrape loop costs the
 * loop one rendering per interval.
 */
#ifndef SNAPKVD_HTTP_H
#define SNAPKVD_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "snapkvd-forward.h"

struct snapkvd_http;

#define SNAPKVD_HTTP_LISTEN_MAX 64 /* "[v6 address]:port" and a NUL */

/* Filled by snapkvd-config.c, which parses metrics_listen (PORT alone is
 * loopback; IPV4:PORT, [IPV6]:PORT, localhost:PORT; numeric only). */
struct snapkvd_http_config {
	char listen[SNAPKVD_HTTP_LISTEN_MAX]; /* normalised ADDR:PORT; "": off */
	struct sockaddr_storage addr;	      /* what listen says */
	socklen_t addr_len;
	uint64_t max_request; /* request line + headers, bytes */
	unsigned max_connections;
	unsigned timeout_ms;
	unsigned cache_ms; /* metrics_http_cache_ms: a rendered exposition served again this long */
	int tenants;	   /* metrics_http_tenants: enum snapkvd_metrics_tenants */
};

struct snapkvd_http_cb {
	void *data;
	/* The exposition, malloc'd, NUL-terminated; NULL: out of memory (503). */
	char *(*metrics)(void *data);
	/* false: /healthz answers 503. */
	bool (*healthy)(void *data);
};

/* Listen at cfg->addr (cfg->listen not "") and arm the first accept. Logs what
 * failed, naming the address and the errno; 0 or -errno. */
int snapkvd_http_new(struct snapkvd_loop *loop, const struct snapkvd_http_config *cfg,
		     const struct snapkvd_http_cb *cb, struct snapkvd_http **ret);
/* From the housekeeping timer: shut down connections past their deadline,
 * resume accepting after a failed accept. */
void snapkvd_http_tick(struct snapkvd_http *h, uint64_t now_ns);
/* Connections open now (for tests and the log). */
unsigned snapkvd_http_connections(const struct snapkvd_http *h);
/* After the loop is gone (no operation can complete into a connection):
 * closes every connection and the socket. Accepts NULL. */
void snapkvd_http_free(struct snapkvd_http *h);

#endif
