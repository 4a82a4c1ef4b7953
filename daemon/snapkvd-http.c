// SPDX-License-Identifier: MIT
/*
 * snapkvd-http.c - the Prometheus listener; see snapkvd-http.h.
 *
 * A connection has exactly one loop operation in flight at any time (a
 * read of the request, a send of the answer, or a read that discards what
 * the client still sends after the answer), and is freed only from that
 * operation's completion, so no completion can land in freed memory. The
 * deadline shuts the socket down (which completes the operation in flight
 * at once) rather than closing it. The only direct socket calls are
 * shutdown(), close() and the 503 to a connection over the limit, sent with
 * MSG_DONTWAIT: nothing here can block the loop.
 */
#include "snapkvd-http.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "snapkvd-clock.h"
#include "snapkvd-log.h"
#include "snapkvd-loop.h"

#define WARN_INTERVAL_NS (60ull * 1000000000ull) /* one accept warning a minute */

enum conn_state { READING, SENDING, DRAINING };

struct conn {
	struct snapkvd_http *h;
	struct conn *prev, *next;
	int fd;
	enum conn_state state;
	bool shut;    /* shut down: freed when the operation in flight completes */
	bool refused; /* over metrics_http_max_connections: a 503, then closed */
	uint64_t deadline_ns;
	size_t req_len;
	char *resp;
	size_t resp_len, resp_off;
	struct snapkvd_loop_ev ev;
	char req[]; /* max_request + 1 (a NUL after what was read) */
};

struct snapkvd_http {
	struct snapkvd_loop *loop;
	struct snapkvd_http_config cfg;
	struct snapkvd_http_cb cb;
	int fd;
	bool accept_paused; /* after a failed accept (EMFILE, ...): the tick resumes */
	uint64_t last_warn_ns;
	uint64_t refused;
	struct snapkvd_loop_ev ev_accept;
	struct conn *conns;
	unsigned n_conns;
	unsigned n_refused; /* connections being answered 503 (at most max_connections) */
	/* the last exposition, served again for metrics_http_cache_ms: a scrape
	 * loop costs the daemon one rendering per interval */
	char *cached;
	uint64_t cached_ns;
};

/* The exposition to serve now (owned by h), or NULL: out of memory. */
static const char *metrics_text(struct snapkvd_http *h)
{
	uint64_t now = snapkvd_now_ns();
	char *text;

	if (h->cached && now - h->cached_ns < (uint64_t)h->cfg.cache_ms * 1000000u)
		return h->cached;
	text = h->cb.metrics ? h->cb.metrics(h->cb.data) : NULL;
	if (!text)
		return NULL;
	free(h->cached);
	h->cached = text;
	h->cached_ns = now;
	return text;
}

/* ----------------------------------------------------------- connections */

static void conn_free(struct conn *c)
{
	struct snapkvd_http *h = c->h;

	if (c->prev)
		c->prev->next = c->next;
	else
		h->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	if (c->refused)
		h->n_refused--;
	else
		h->n_conns--;
	close(c->fd);
	free(c->resp);
	free(c);
}

/* The answer, whole, in c->resp; the connection moves on to sending it. */
static int answer(struct conn *c, int status, const char *reason, const char *type,
		  const char *extra, const char *body, size_t body_len, bool head)
{
	char hdr[512];
	int n = snprintf(hdr, sizeof(hdr),
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n%s\r\n",
			 status, reason, type, body_len, extra);
	size_t len = (size_t)n + (head ? 0 : body_len);

	c->resp = malloc(len);
	if (!c->resp)
		return -ENOMEM;
	memcpy(c->resp, hdr, n);
	if (!head)
		memcpy(c->resp + n, body, body_len);
	c->resp_len = len;
	c->resp_off = 0;
	c->state = SENDING;
	log_debug("metrics http: %d %s", status, reason);
	return 0;
}

static int answer_text(struct conn *c, int status, const char *reason, const char *extra,
		       const char *body, bool head)
{
	return answer(c, status, reason, "text/plain; charset=utf-8", extra, body, strlen(body),
		      head);
}

static bool is_token(const char *s, size_t n)
{
	if (!n)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!strchr("!#$%&'*+-.^_`|~", s[i]) &&
		    !((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') ||
		      (s[i] >= '0' && s[i] <= '9')))
			return false;
	return true;
}

/* Every header line (after the request line, up to the blank one) has a
 * name and a colon. */
static bool headers_ok(const char *p, const char *end)
{
	while (p < end) {
		const char *eol = memchr(p, '\n', end - p);
		size_t n = (eol ? eol : end) - p;

		if (n && p[n - 1] == '\r')
			n--;
		if (!n)
			return true;
		const char *colon = memchr(p, ':', n);

		if (!colon || !is_token(p, colon - p))
			return false;
		if (!eol)
			break;
		p = eol + 1;
	}
	return true;
}

static int route(struct conn *c, const char *path, size_t path_len, bool head)
{
	struct snapkvd_http_cb *cb = &c->h->cb;

	if (path_len == 8 && !memcmp(path, "/metrics", 8)) {
		const char *text = metrics_text(c->h);

		if (!text)
			return answer_text(c, 503, "Service Unavailable", "", "out of memory\n",
					   head);
		return answer(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", "", text,
			      strlen(text), head);
	}
	if (path_len == 8 && !memcmp(path, "/healthz", 8)) {
		if (cb->healthy && !cb->healthy(cb->data))
			return answer_text(c, 503, "Service Unavailable", "", "draining\n", head);
		return answer_text(c, 200, "OK", "", "ok\n", head);
	}
	return answer_text(c, 404, "Not Found", "", "not found: /metrics or /healthz\n", head);
}

/* A whole head (request line, headers, the blank line) is c->req[0, len). */
static int handle_request(struct conn *c, size_t len)
{
	const char *req = c->req, *eol = memchr(req, '\n', len), *sp1, *sp2, *q;
	size_t line = eol - req;
	bool head;

	if (line && req[line - 1] == '\r')
		line--;
	sp1 = memchr(req, ' ', line);
	sp2 = sp1 ? memchr(sp1 + 1, ' ', req + line - sp1 - 1) : NULL;
	if (memchr(req, 0, len) || !sp2 || !is_token(req, sp1 - req) || sp1[1] != '/' ||
	    !headers_ok(eol + 1, req + len) ||
	    ((size_t)(req + line - sp2 - 1) != 8 ||
	     (memcmp(sp2 + 1, "HTTP/1.1", 8) && memcmp(sp2 + 1, "HTTP/1.0", 8))))
		return answer_text(c, 400, "Bad Request", "", "bad request\n", false);
	head = sp1 - req == 4 && !memcmp(req, "HEAD", 4);
	if (!head && !(sp1 - req == 3 && !memcmp(req, "GET", 3)))
		return answer_text(c, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
				   "method not allowed: GET or HEAD\n", false);
	q = memchr(sp1 + 1, '?', sp2 - sp1 - 1);
	return route(c, sp1 + 1, (q ? q : sp2) - sp1 - 1, head);
}

/* Bytes arrived: answer once the head is complete, 431 when it cannot be. */
static int got_request_bytes(struct conn *c)
{
	char msg[128];
	char *end;

	c->req[c->req_len] = 0;
	end = memmem(c->req, c->req_len, "\r\n\r\n", 4);
	if (end)
		return handle_request(c, end - c->req + 4);
	end = memmem(c->req, c->req_len, "\n\n", 2);
	if (end)
		return handle_request(c, end - c->req + 2);
	if (c->req_len < c->h->cfg.max_request)
		return 0; /* read on */
	snprintf(msg, sizeof(msg),
		 "request head larger than %llu bytes (metrics_http_max_request)\n",
		 (unsigned long long)c->h->cfg.max_request);
	return answer_text(c, 431, "Request Header Fields Too Large", "", msg, false);
}

static int arm(struct conn *c)
{
	struct snapkvd_http *h = c->h;
	size_t left;

	switch (c->state) {
	case READING:
		return snapkvd_loop_read(h->loop, c->fd, c->req + c->req_len,
					 h->cfg.max_request - c->req_len, &c->ev);
	case SENDING:
		left = c->resp_len - c->resp_off;
		return snapkvd_loop_send(h->loop, c->fd, c->resp + c->resp_off,
					 left > (1u << 30) ? (1u << 30) : (unsigned)left, &c->ev);
	case DRAINING:
		return snapkvd_loop_read(h->loop, c->fd, c->req, h->cfg.max_request, &c->ev);
	}
	return -EINVAL;
}

/* The completion of c's one operation. */
static void on_conn(void *data, int res)
{
	struct conn *c = data;
	int r = 0;

	if (c->shut || (res <= 0 && res != -EINTR && res != -EAGAIN)) {
		conn_free(c);
		return;
	}
	if (res > 0) {
		switch (c->state) {
		case READING:
			c->req_len += res;
			r = got_request_bytes(c);
			break;
		case SENDING:
			c->resp_off += res;
			if (c->resp_off == c->resp_len) {
				/* all sent: FIN, then read until the client's FIN, so that
				 * unread bytes cannot turn our close into a reset */
				shutdown(c->fd, SHUT_WR);
				free(c->resp);
				c->resp = NULL;
				c->state = DRAINING;
			}
			break;
		case DRAINING:
			break;
		}
	}
	if (r < 0 || arm(c) < 0)
		conn_free(c);
}

/*
 * Over metrics_http_max_connections. The client's request is usually in
 * the socket already, and closing a socket with unread bytes sends a reset
 * that can reach the client before our 503 does: so up to as many refused
 * connections again get the 503 like any answer (sent by the loop, then
 * FIN, then their bytes read and dropped until the client's FIN or the
 * deadline); past that they get it sent at once and closed, a reset
 * possible.
 */
static void refuse(struct snapkvd_http *h, int fd)
{
	static const char busy[] =
	    "HTTP/1.1 503 Service Unavailable\r\n"
	    "Content-Type: text/plain; charset=utf-8\r\n"
	    "Content-Length: 21\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
	    "too many connections\n";
	struct conn *c = NULL;

	h->refused++;
	log_debug("metrics http: %u connections open (metrics_http_max_connections): "
		  "refused one",
		  h->n_conns);
	if (h->n_refused < h->cfg.max_connections)
		c = malloc(sizeof(*c) + h->cfg.max_request + 1);
	if (!c) {
		/* a fresh socket's send buffer is empty: this cannot block */
		(void)send(fd, busy, sizeof(busy) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
		close(fd);
		return;
	}
	*c = (struct conn){
	    .h = h,
	    .next = h->conns,
	    .fd = fd,
	    .refused = true,
	    .deadline_ns = snapkvd_now_ns() + (uint64_t)h->cfg.timeout_ms * 1000000ull,
	    .ev = {.fn = on_conn, .data = c},
	};
	if (h->conns)
		h->conns->prev = c;
	h->conns = c;
	h->n_refused++;
	if (answer_text(c, 503, "Service Unavailable", "Retry-After: 1\r\n",
			"too many connections\n", false) < 0 ||
	    arm(c) < 0)
		conn_free(c);
}

static void take(struct snapkvd_http *h, int fd)
{
	struct conn *c;

	if (h->n_conns >= h->cfg.max_connections) {
		refuse(h, fd);
		return;
	}
	c = malloc(sizeof(*c) + h->cfg.max_request + 1);
	if (!c) {
		close(fd);
		return;
	}
	*c = (struct conn){
	    .h = h,
	    .next = h->conns,
	    .fd = fd,
	    .state = READING,
	    .deadline_ns = snapkvd_now_ns() + (uint64_t)h->cfg.timeout_ms * 1000000ull,
	    .ev = {.fn = on_conn, .data = c},
	};
	if (h->conns)
		h->conns->prev = c;
	h->conns = c;
	h->n_conns++;
	if (arm(c) < 0)
		conn_free(c);
}

static void warn_accept(struct snapkvd_http *h, int err)
{
	uint64_t now = snapkvd_now_ns();

	if (h->last_warn_ns && now - h->last_warn_ns < WARN_INTERVAL_NS)
		return;
	h->last_warn_ns = now;
	log_warning_errno(err,
			  "metrics http: accept on %s failed, paused until the next tick "
			  "(said at most once a minute)",
			  h->cfg.listen);
}

static void on_accept(void *data, int res)
{
	struct snapkvd_http *h = data;

	if (res >= 0) {
		take(h, res);
	} else if (res != -EAGAIN && res != -EINTR && res != -ECONNABORTED) {
		/* EMFILE and the like would fail again at once: wait for the tick */
		warn_accept(h, res);
		h->accept_paused = true;
		return;
	}
	if (!snapkvd_loop_stopped(h->loop) &&
	    snapkvd_loop_accept(h->loop, h->fd, &h->ev_accept) < 0)
		h->accept_paused = true;
}

void snapkvd_http_tick(struct snapkvd_http *h, uint64_t now_ns)
{
	if (!h)
		return;
	for (struct conn *c = h->conns; c; c = c->next) {
		if (c->shut || now_ns < c->deadline_ns)
			continue;
		log_debug("metrics http: connection past metrics_http_timeout_ms (%u ms): closed",
			  h->cfg.timeout_ms);
		shutdown(c->fd, SHUT_RDWR);
		c->shut = true;
	}
	if (h->accept_paused && snapkvd_loop_accept(h->loop, h->fd, &h->ev_accept) == 0)
		h->accept_paused = false;
}

unsigned snapkvd_http_connections(const struct snapkvd_http *h)
{
	return h ? h->n_conns : 0;
}

/* ---------------------------------------------------------- the listener */

static int listen_tcp(const struct snapkvd_http_config *cfg)
{
	int fd, one = 1, r;

	fd = socket(cfg->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		if (r == -EAFNOSUPPORT)
			return log_error_errno(r,
					       "Failed to open a socket for metrics_listen = %s "
					       "(under the shipped unit, RestrictAddressFamilies= "
					       "must allow AF_INET/AF_INET6: snapkvd(8), METRICS)",
					       cfg->listen);
		return log_error_errno(r, "Failed to open a socket for metrics_listen = %s",
				       cfg->listen);
	}
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (const struct sockaddr *)&cfg->addr, cfg->addr_len) < 0 ||
	    listen(fd, 64) < 0) {
		r = -errno;
		close(fd);
		return log_error_errno(r, "Failed to listen on %s (metrics_listen)", cfg->listen);
	}
	return fd;
}

int snapkvd_http_new(struct snapkvd_loop *loop, const struct snapkvd_http_config *cfg,
		     const struct snapkvd_http_cb *cb, struct snapkvd_http **ret)
{
	struct snapkvd_http *h = calloc(1, sizeof(*h));

	if (!h)
		return log_error_errno(-ENOMEM, "Failed to set up the metrics listener");
	h->loop = loop;
	h->cfg = *cfg;
	h->cb = *cb;
	h->ev_accept = (struct snapkvd_loop_ev){.fn = on_accept, .data = h};
	h->fd = listen_tcp(cfg);
	if (h->fd < 0) {
		int r = h->fd;

		free(h);
		return r;
	}
	if (snapkvd_loop_accept(loop, h->fd, &h->ev_accept) < 0) {
		snapkvd_http_free(h);
		return log_error_errno(-EBUSY, "Failed to accept on %s", cfg->listen);
	}
	log_info("metrics on http://%s/metrics (at most %u connections, %llu-byte requests, "
		 "%u ms each, rendered at most every %u ms)",
		 cfg->listen, cfg->max_connections, (unsigned long long)cfg->max_request,
		 cfg->timeout_ms, cfg->cache_ms);
	*ret = h;
	return 0;
}

void snapkvd_http_free(struct snapkvd_http *h)
{
	if (!h)
		return;
	while (h->conns)
		conn_free(h->conns);
	if (h->fd >= 0)
		close(h->fd);
	free(h->cached);
	free(h);
}
