// SPDX-License-Identifier: MIT
/*
 * fuzz-http - libFuzzer target: what a client sends to snapkvd's
 * Prometheus listener (daemon/snapkvd-http.c, included whole, on a fake
 * loop that hands each armed read the fuzzer's bytes in chunks).
 *
 * Input: byte 0 picks the chunk size (1..16 bytes a read, or all at once),
 * byte 1 metrics_http_max_request (256..8K), byte 2 whether /healthz is
 * healthy; the rest is the request stream. Properties: no read or write
 * outside the connection's buffer (ASan); exactly one answer, whose status
 * line is one of 200, 400, 404, 405, 431, 503 and whose Content-Length is
 * the body sent (no body for a HEAD that was routed); 431 only when no head ended within the
 * limit; 200 only for GET or HEAD of /metrics or /healthz; the connection
 * is freed once the client's EOF comes (nothing leaked, LSan).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapkvd-http.c"

#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "fuzz-http: %s:%d: %s\n", __FILE__, __LINE__, #cond);      \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* --------------------------------------------------- the fake loop, clock */

enum { NONE, READ, SEND };
static struct {
	int kind;
	struct snapkvd_loop_ev *ev;
	void *buf;
	unsigned len;
} armed;

int snapkvd_loop_read(struct snapkvd_loop *l, int fd, void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd;
	armed.kind = READ, armed.ev = ev, armed.buf = buf, armed.len = len;
	return 0;
}

int snapkvd_loop_send(struct snapkvd_loop *l, int fd, const void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd;
	armed.kind = SEND, armed.ev = ev, armed.buf = (void *)buf, armed.len = len;
	return 0;
}

int snapkvd_loop_accept(struct snapkvd_loop *l, int fd, struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd, (void)ev;
	return 0;
}

bool snapkvd_loop_stopped(const struct snapkvd_loop *l)
{
	(void)l;
	return false;
}

uint64_t snapkvd_now_ns(void)
{
	return 0;
}

static bool healthy;
static char *metrics(void *data)
{
	(void)data;
	return strdup("# HELP x y\n# TYPE x gauge\nx 1\n");
}
static bool is_healthy(void *data)
{
	(void)data;
	return healthy;
}

/* ------------------------------------------------------------- the target */

/* Whether a head ended (a blank line, CRLF or bare LF) within limit bytes. */
static bool head_within(const uint8_t *d, size_t n, size_t limit)
{
	size_t m = n < limit ? n : limit;

	return memmem(d, m, "\r\n\r\n", 4) || memmem(d, m, "\n\n", 2);
}

static void check_answer(const char *r, size_t n, const uint8_t *req, size_t req_len, size_t limit)
{
	const char *end = memmem(r, n, "\r\n\r\n", 4), *cl;
	unsigned long long len;
	int status;
	bool head = req_len >= 5 && !memcmp(req, "HEAD ", 5);

	REQUIRE(n > 12 && !memcmp(r, "HTTP/1.1 ", 9) && end);
	status = atoi(r + 9);
	REQUIRE(status == 200 || status == 400 || status == 404 || status == 405 || status == 431 ||
		status == 503);
	cl = memmem(r, end - r, "\r\nContent-Length: ", 18);
	REQUIRE(cl);
	len = strtoull(cl + 18, NULL, 10);
	/* HEAD answers have no body, but for what refused the request itself */
	if (head && status != 400 && status != 405 && status != 431)
		REQUIRE((size_t)(end + 4 - r) == n);
	else
		REQUIRE((size_t)(end + 4 - r) + len == n);
	if (status == 431)
		REQUIRE(!head_within(req, req_len, limit));
	if (status == 200)
		REQUIRE((req_len >= 4 && !memcmp(req, "GET ", 4)) || head);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const unsigned limits[] = {256, 512, 1024, 8192};
	struct snapkvd_http h = {.fd = -1};
	char *answer = NULL;
	size_t chunk, off = 3, answer_len = 0;
	bool answered = false; /* the answer went out: the rest is discarded */

	if (size < 3)
		return 0;
	chunk = data[0] % 17 ? data[0] % 17 : SIZE_MAX;
	h.cfg.max_request = limits[data[1] % 4];
	h.cfg.max_connections = 1;
	h.cfg.timeout_ms = 1000;
	h.cb = (struct snapkvd_http_cb){.metrics = metrics, .healthy = is_healthy};
	healthy = data[2] & 1;
	armed.kind = NONE;
	take(&h, -1);
	REQUIRE(h.n_conns == 1 && armed.kind == READ);
	while (h.n_conns) {
		struct snapkvd_loop_ev *ev = armed.ev;
		size_t n;

		if (armed.kind == READ) {
			answered = answer != NULL;
			n = size - off < chunk ? size - off : chunk;
			if (n > armed.len)
				n = armed.len;
			memcpy(armed.buf, data + off, n);
			off += n;
			armed.kind = NONE;
			ev->fn(ev->data, (int)n); /* 0: the client's EOF */
		} else {
			REQUIRE(armed.kind == SEND && armed.len > 0);
			REQUIRE(!answered); /* one answer */
			answer = realloc(answer, answer_len + armed.len);
			REQUIRE(answer);
			memcpy(answer + answer_len, armed.buf, armed.len);
			answer_len += armed.len;
			n = armed.len;
			armed.kind = NONE;
			ev->fn(ev->data, (int)n);
		}
	}
	if (answer)
		check_answer(answer, answer_len, data + 3, size - 3, h.cfg.max_request);
	free(answer);
	free(h.cached); /* the exposition kept for metrics_http_cache_ms */
	return 0;
}
