// SPDX-License-Identifier: MIT
/*
 * test-listener: the listening socket (daemon/snapkvd-listener.c) on a fake
 * loop: bound at a path, group-writable, unlinked when freed; a path left
 * by a dead daemon taken over, a live daemon's refused (-EADDRINUSE), a
 * path too long or in a missing directory refused with its own errno;
 * accepted connections handed over, transient accept errors retried, and
 * running out of fds pausing accept on the backoff timer (doubling, at most
 * 1 s) until it fires.
 */
#include <CUnit/Basic.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/snapkvd-listener.c"
#include "tests/test-skip.h"

/* ------------------------------------------------------- the fake loop */

static unsigned accepts, timer_reads;
static struct snapkvd_loop_ev *timer_ev;

int snapkvd_loop_accept(struct snapkvd_loop *lp, int fd, struct snapkvd_loop_ev *ev)
{
	(void)lp, (void)fd, (void)ev;
	accepts++;
	return 0;
}

int snapkvd_loop_read(struct snapkvd_loop *lp, int fd, void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	(void)lp, (void)fd, (void)buf, (void)len;
	timer_reads++;
	timer_ev = ev;
	return 0;
}

bool snapkvd_loop_stopped(const struct snapkvd_loop *lp)
{
	(void)lp;
	return false;
}

static int conns[8], n_conns;
static void on_conn(void *data, int fd)
{
	CU_ASSERT_PTR_EQUAL(data, conns);
	conns[n_conns++] = fd;
}

static char dir[64], path[96];

static int setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/test-listener-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(path, sizeof(path), "%s/s.sock", dir);
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_PID");
	snapkvd_log_max = SNAPKVD_LOG_ERR - 1; /* refusals are expected here */
	return 0;
}

static int cleanup(void)
{
	unlink(path);
	rmdir(dir);
	return 0;
}

static void test_bind(void)
{
	struct snapkvd_listener *l = NULL;
	struct stat st;

	accepts = 0;
	CU_ASSERT_EQUAL_FATAL(snapkvd_listener_new(NULL, path, on_conn, conns, &l), 0);
	CU_ASSERT_EQUAL(accepts, 1);
	CU_ASSERT_EQUAL_FATAL(lstat(path, &st), 0);
	CU_ASSERT_TRUE(S_ISSOCK(st.st_mode));
	CU_ASSERT_EQUAL(st.st_mode & 0777, 0660);
	/* a second daemon on the same path: this one is alive */
	struct snapkvd_listener *l2 = NULL;
	CU_ASSERT_EQUAL(snapkvd_listener_new(NULL, path, on_conn, conns, &l2), -EADDRINUSE);
	CU_ASSERT_PTR_NULL(l2);
	snapkvd_listener_free(l);
	CU_ASSERT_EQUAL(lstat(path, &st), -1); /* unlinked */
	/* a path left behind by a dead daemon: taken over */
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	CU_ASSERT_EQUAL(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(fd); /* not listening: nobody answers */
	CU_ASSERT_EQUAL_FATAL(snapkvd_listener_new(NULL, path, on_conn, conns, &l), 0);
	snapkvd_listener_free(l);
	snapkvd_listener_free(NULL);
}

static void test_refusals(void)
{
	struct snapkvd_listener *l = NULL;
	char longp[200], missing[160];

	memset(longp, 'a', sizeof(longp));
	longp[0] = '/';
	longp[sizeof(longp) - 1] = 0;
	CU_ASSERT_EQUAL(snapkvd_listener_new(NULL, longp, on_conn, conns, &l), -ENAMETOOLONG);
	snprintf(missing, sizeof(missing), "%s/no/such/s.sock", dir);
	CU_ASSERT_EQUAL(snapkvd_listener_new(NULL, missing, on_conn, conns, &l), -ENOENT);
	CU_ASSERT_PTR_NULL(l);
}

static void test_accept(void)
{
	struct snapkvd_listener *l = NULL;

	CU_ASSERT_EQUAL_FATAL(snapkvd_listener_new(NULL, path, on_conn, conns, &l), 0);
	accepts = timer_reads = 0;
	n_conns = 0;
	l->ev.fn(l, 42);
	CU_ASSERT_EQUAL(n_conns, 1);
	CU_ASSERT_EQUAL(conns[0], 42);
	CU_ASSERT_EQUAL(accepts, 1); /* armed again */
	/* transient errors: accept again at once */
	l->ev.fn(l, -EAGAIN);
	l->ev.fn(l, -ECONNABORTED);
	l->ev.fn(l, -EPERM); /* logged, then again */
	CU_ASSERT_EQUAL(accepts, 4);
	CU_ASSERT_EQUAL(n_conns, 1);
	/* out of fds: paused on the timer, the backoff doubling up to 1 s */
	l->ev.fn(l, -EMFILE);
	CU_ASSERT_TRUE(l->paused);
	CU_ASSERT_EQUAL(l->backoff_ms, 10);
	CU_ASSERT_EQUAL(accepts, 4);
	CU_ASSERT_EQUAL(timer_reads, 1);
	CU_ASSERT_PTR_EQUAL(timer_ev, &l->ev_timer);
	timer_ev->fn(timer_ev->data, 8);
	CU_ASSERT_FALSE(l->paused);
	CU_ASSERT_EQUAL(accepts, 5);
	for (int i = 0; i < 10; i++) {
		l->ev.fn(l, -ENFILE);
		l->ev_timer.fn(l, 8);
	}
	CU_ASSERT_EQUAL(l->backoff_ms, 1000);
	CU_ASSERT_EQUAL(l->fd_failures, 11);
	/* a connection again: the backoff starts over */
	l->ev.fn(l, 43);
	CU_ASSERT_EQUAL(l->backoff_ms, 0);
	CU_ASSERT_EQUAL(l->fd_failures, 0);
	CU_ASSERT_EQUAL(n_conns, 2);
	snapkvd_listener_free(l);
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("listener", setup, cleanup);
	CU_add_test(su, "bound at a path, taken over from the dead", test_bind);
	CU_add_test(su, "paths refused with their errno", test_refusals);
	CU_add_test(su, "accept, its errors and the fd backoff", test_accept);
	return t_run();
}
