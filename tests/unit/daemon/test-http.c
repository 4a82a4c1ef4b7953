// SPDX-License-Identifier: MIT
/*
 * test-http: the Prometheus listener (daemon/snapkvd-http.c) on a fake
 * loop and clock: each route and method and its answer, a request in
 * pieces, a head over metrics_http_max_request (431 naming the key), the
 * exposition failing (503), connections over metrics_http_max_connections
 * answered 503 and counted apart, the deadline closing a silent client,
 * an accept failure paused until the tick, and a listening address in use
 * refused at start-up.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-http.c"
#include "daemon/snapkvd-value.h"
#include "tests/test-skip.h"

/* --------------------------------------------------- the fake loop, clock */

enum { NONE, READ, SEND };
struct op {
	struct snapkvd_loop_ev *ev;
	int kind;
	void *buf;
	unsigned len;
};
static struct op ops[16];
static unsigned accepts;
static int accept_fails; /* snapkvd_loop_accept answers this while set */
static uint64_t now;

static struct op *op_of(struct snapkvd_loop_ev *ev)
{
	for (int i = 0; i < 16; i++)
		if (ops[i].ev == ev)
			return &ops[i];
	for (int i = 0; i < 16; i++)
		if (!ops[i].ev) {
			ops[i].ev = ev;
			return &ops[i];
		}
	abort();
}

static int arm_op(struct snapkvd_loop_ev *ev, int kind, const void *buf, unsigned len)
{
	*op_of(ev) = (struct op){ev, kind, (void *)buf, len};
	return 0;
}

int snapkvd_loop_read(struct snapkvd_loop *l, int fd, void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd;
	return arm_op(ev, READ, buf, len);
}

int snapkvd_loop_send(struct snapkvd_loop *l, int fd, const void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd;
	return arm_op(ev, SEND, buf, len);
}

int snapkvd_loop_accept(struct snapkvd_loop *l, int fd, struct snapkvd_loop_ev *ev)
{
	(void)l, (void)fd, (void)ev;
	accepts++;
	return accept_fails;
}

bool snapkvd_loop_stopped(const struct snapkvd_loop *l)
{
	(void)l;
	return false;
}

uint64_t snapkvd_now_ns(void)
{
	return now;
}

static bool healthy = true, metrics_fail;
static char *metrics(void *data)
{
	(void)data;
	return metrics_fail ? NULL : strdup("# TYPE x gauge\nx 1\n");
}
static bool is_healthy(void *data)
{
	(void)data;
	return healthy;
}

/* ------------------------------------------------------------- a client */

static struct snapkvd_http *h;

static struct snapkvd_http *listener(unsigned max_request, unsigned max_conns)
{
	struct snapkvd_http_config cfg = {
	    .max_request = max_request, .max_connections = max_conns, .timeout_ms = 1000};
	struct snapkvd_http_cb cb = {.metrics = metrics, .healthy = is_healthy};
	struct sockaddr_in *in = (struct sockaddr_in *)&cfg.addr;
	struct snapkvd_http *ret = NULL;

	/* loopback, a port the kernel picks (metrics_listen itself wants 1..65535) */
	in->sin_family = AF_INET;
	in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cfg.addr_len = sizeof(*in);
	snprintf(cfg.listen, sizeof(cfg.listen), "127.0.0.1:0");
	CU_ASSERT_EQUAL_FATAL(snapkvd_http_new(NULL, &cfg, &cb, &ret), 0);
	return ret;
}

/* An accepted socket: any fd the connection may close (res < 0 would be an
 * accept's error). */
static int new_fd(void)
{
	int fd = open("/dev/null", O_RDWR | O_CLOEXEC);

	CU_ASSERT_FATAL(fd >= 0);
	return fd;
}

/* A new connection: the op its first read armed. */
static struct snapkvd_loop_ev *connect_one(void)
{
	h->ev_accept.fn(h, new_fd());
	return &h->conns->ev;
}

/* Feed `req` in pieces of `chunk`, collect what is sent until the client's
 * EOF frees the connection: the answer, malloc'd. */
static char *converse(struct snapkvd_loop_ev *ev, const char *req, size_t chunk)
{
	size_t off = 0, n, len = 0, req_len = strlen(req);
	char *out = calloc(1, 1);
	unsigned before = h->n_conns + h->n_refused;

	for (int guard = 0; guard < 10000 && h->n_conns + h->n_refused == before; guard++) {
		struct op *o = op_of(ev);

		if (o->kind == READ) {
			n = req_len - off < chunk ? req_len - off : chunk;
			n = n > o->len ? o->len : n;
			memcpy(o->buf, req + off, n);
			off += n;
			o->kind = NONE;
			ev->fn(ev->data, (int)n); /* 0: the client's EOF */
		} else if (o->kind == SEND) {
			out = realloc(out, len + o->len + 1);
			memcpy(out + len, o->buf, o->len);
			len += o->len;
			out[len] = 0;
			n = o->len;
			o->kind = NONE;
			ev->fn(ev->data, (int)n);
		} else {
			break;
		}
	}
	op_of(ev)->ev = NULL;
	return out;
}

static void expect(const char *req, size_t chunk, const char *status, const char *body)
{
	char *a = converse(connect_one(), req, chunk);

	CU_ASSERT_NSTRING_EQUAL(a, status, strlen(status));
	if (strncmp(a, status, strlen(status)))
		fprintf(stderr, "%s -> %s\n", req, a);
	if (body) {
		const char *b = strstr(a, "\r\n\r\n");

		CU_ASSERT_PTR_NOT_NULL(b);
		CU_ASSERT_STRING_EQUAL(b ? b + 4 : "", body);
	}
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "Connection: close\r\n"));
	free(a);
	CU_ASSERT_EQUAL(snapkvd_http_connections(h), 0);
}

static void test_routes(void)
{
	h = listener(8192, 4);
	expect("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 1 << 20, "HTTP/1.1 200 OK\r\n",
	       "# TYPE x gauge\nx 1\n");
	expect("GET /metrics?x=1 HTTP/1.0\n\n", 3, "HTTP/1.1 200 OK\r\n", "# TYPE x gauge\nx 1\n");
	/* HEAD: the length of the body, no body */
	char *a = converse(connect_one(), "HEAD /metrics HTTP/1.1\r\n\r\n", 64);
	CU_ASSERT_PTR_NOT_NULL(strstr(a, "Content-Length: 19\r\n"));
	CU_ASSERT_STRING_EQUAL(strstr(a, "\r\n\r\n"), "\r\n\r\n");
	free(a);
	expect("GET /healthz HTTP/1.1\r\n\r\n", 7, "HTTP/1.1 200 OK\r\n", "ok\n");
	healthy = false;
	expect("GET /healthz HTTP/1.1\r\n\r\n", 64, "HTTP/1.1 503 ", "draining\n");
	healthy = true;
	metrics_fail = true;
	expect("GET /metrics HTTP/1.1\r\n\r\n", 64, "HTTP/1.1 503 ", "out of memory\n");
	metrics_fail = false;
	expect("GET /nope HTTP/1.1\r\n\r\n", 64, "HTTP/1.1 404 ", NULL);
	expect("POST /metrics HTTP/1.1\r\n\r\n", 64, "HTTP/1.1 405 ", NULL);
	expect("GET metrics HTTP/1.1\r\n\r\n", 64, "HTTP/1.1 400 ", NULL);
	expect("GET /metrics HTTP/2\r\n\r\n", 64, "HTTP/1.1 400 ", NULL);
	expect("GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", 64, "HTTP/1.1 400 ", NULL);
	/* a client that leaves before its head ends: no answer, nothing kept */
	a = converse(connect_one(), "GET /met", 64);
	CU_ASSERT_STRING_EQUAL(a, "");
	free(a);
	CU_ASSERT_EQUAL(snapkvd_http_connections(h), 0);
	snapkvd_http_free(h);
}

static void test_limits(void)
{
	char big[600];

	h = listener(256, 2);
	memset(big, 'a', sizeof(big));
	memcpy(big, "GET /metrics HTTP/1.1\r\nX: ", 26);
	big[sizeof(big) - 1] = 0;
	expect(big, 100, "HTTP/1.1 431 ",
	       "request head larger than 256 bytes (metrics_http_max_request)\n");
	/* two open, the third and fourth answered 503 apart, the fifth closed at once */
	struct snapkvd_loop_ev *e1 = connect_one(), *e2 = connect_one();
	CU_ASSERT_EQUAL(snapkvd_http_connections(h), 2);
	h->ev_accept.fn(h, new_fd());
	CU_ASSERT_EQUAL(h->n_refused, 1);
	CU_ASSERT_EQUAL(op_of(&h->conns->ev)->kind, SEND);
	/* the answer being sent: len bytes, not a C string */
	CU_ASSERT_PTR_NOT_NULL(memmem(op_of(&h->conns->ev)->buf, op_of(&h->conns->ev)->len,
				      "503 Service Unavailable", 23));
	op_of(&h->conns->ev)->ev = NULL;
	h->ev_accept.fn(h, new_fd());
	op_of(&h->conns->ev)->ev = NULL;
	h->ev_accept.fn(h, new_fd());
	CU_ASSERT_EQUAL(h->n_refused, 2);
	CU_ASSERT_EQUAL(h->refused, 3);
	CU_ASSERT_EQUAL(snapkvd_http_connections(h), 2);
	/* the deadline: every connection shut, freed when its operation completes */
	now += 999ull * 1000000;
	snapkvd_http_tick(h, now);
	CU_ASSERT_FALSE(h->conns->shut);
	now += 1000000;
	snapkvd_http_tick(h, now);
	for (struct conn *c = h->conns; c; c = c->next)
		CU_ASSERT_TRUE(c->shut);
	e1->fn(e1->data, -ECANCELED);
	e2->fn(e2->data, 5); /* bytes after the shutdown: freed all the same */
	CU_ASSERT_EQUAL(snapkvd_http_connections(h), 0);
	op_of(e1)->ev = op_of(e2)->ev = NULL;
	snapkvd_http_free(h); /* the refused ones still open */
}

/* An accept that fails (EMFILE): paused, warned once, resumed by the tick. */
static void test_accept_paused(void)
{
	unsigned before;

	h = listener(8192, 4);
	h->ev_accept.fn(h, -EMFILE);
	CU_ASSERT_TRUE(h->accept_paused);
	before = accepts;
	accept_fails = -EBUSY;
	snapkvd_http_tick(h, now);
	CU_ASSERT_TRUE(h->accept_paused);
	accept_fails = 0;
	snapkvd_http_tick(h, now);
	CU_ASSERT_FALSE(h->accept_paused);
	CU_ASSERT_EQUAL(accepts, before + 2);
	/* a transient error: accept again at once */
	h->ev_accept.fn(h, -EAGAIN);
	CU_ASSERT_FALSE(h->accept_paused);
	snapkvd_http_free(h);
	snapkvd_http_free(NULL);
	snapkvd_http_tick(NULL, 0);
	CU_ASSERT_EQUAL(snapkvd_http_connections(NULL), 0);
}

static void test_address_in_use(void)
{
	struct snapkvd_http_config cfg = {.max_request = 256, .max_connections = 1};
	struct snapkvd_http_cb cb = {.metrics = metrics};
	struct snapkvd_http *other = NULL;
	struct sockaddr_in in;
	socklen_t len = sizeof(in);
	char where[64];
	struct skv_error why = {{0}, -1, -1};

	h = listener(256, 1);
	CU_ASSERT_EQUAL_FATAL(getsockname(h->fd, (struct sockaddr *)&in, &len), 0);
	snprintf(where, sizeof(where), "127.0.0.1:%u", ntohs(in.sin_port));
	CU_ASSERT_EQUAL_FATAL(snapkvd_value_listen(&cfg, where, &why), 0);
	CU_ASSERT_EQUAL(snapkvd_http_new(NULL, &cfg, &cb, &other), -EADDRINUSE);
	CU_ASSERT_PTR_NULL(other);
	snapkvd_http_free(h);
}

int main(void)
{
	CU_pSuite su;

	snapkvd_log_max = SNAPKVD_LOG_ERR - 1; /* the refusals logged are expected */
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("http", NULL, NULL);
	CU_add_test(su, "routes, methods and their answers", test_routes);
	CU_add_test(su, "limits: request size, connections, deadline", test_limits);
	CU_add_test(su, "a failed accept paused until the tick", test_accept_paused);
	CU_add_test(su, "an address in use", test_address_in_use);
	return t_run();
}
