// SPDX-License-Identifier: MIT
/* snapkvd-loop.c - the io_uring event loop; see snapkvd-loop.h. */
#include "snapkvd-loop.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>

#include "snapkvd-clock.h"

struct snapkvd_loop {
	struct io_uring ring;
	struct snapkvd_loop_hooks hooks;
	uint64_t spin_ns;
	bool stop;
};

int snapkvd_loop_new(unsigned entries, struct snapkvd_loop **ret)
{
	struct snapkvd_loop *l = calloc(1, sizeof(*l));
	int r;

	if (!l)
		return -ENOMEM;
	/* COOP_TASKRUN + TASKRUN_FLAG: completions of socket ops wait for us to
	 * enter the kernel, and the kernel tells us (IORING_SQ_TASKRUN) when
	 * there are some, so the polling spin can stay syscall-free and still
	 * pick up socket traffic at once. Older kernels: plain setup. */
	r = io_uring_queue_init(entries, &l->ring,
				IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG);
	if (r == -EINVAL)
		r = io_uring_queue_init(entries, &l->ring, 0);
	if (r < 0) {
		free(l);
		return r;
	}
	*ret = l;
	return 0;
}

void snapkvd_loop_free(struct snapkvd_loop *l)
{
	if (!l)
		return;
	io_uring_queue_exit(&l->ring);
	free(l);
}

void snapkvd_loop_set_hooks(struct snapkvd_loop *l, const struct snapkvd_loop_hooks *h,
			    uint64_t spin_ns)
{
	l->hooks = *h;
	l->spin_ns = spin_ns;
}

static struct io_uring_sqe *get_sqe(struct snapkvd_loop *l)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);

	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	return sqe;
}

int snapkvd_loop_read(struct snapkvd_loop *l, int fd, void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_read(sqe, fd, buf, len, 0);
	io_uring_sqe_set_data(sqe, ev);
	return 0;
}

int snapkvd_loop_poll(struct snapkvd_loop *l, int fd, struct snapkvd_loop_ev *ev)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, fd, POLLIN);
	io_uring_sqe_set_data(sqe, ev);
	return 0;
}

int snapkvd_loop_accept(struct snapkvd_loop *l, int fd, struct snapkvd_loop_ev *ev)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_accept(sqe, fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, ev);
	return 0;
}

int snapkvd_loop_recvmsg(struct snapkvd_loop *l, int fd, struct msghdr *m, unsigned flags,
			 struct snapkvd_loop_ev *ev)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_recvmsg(sqe, fd, m, flags);
	io_uring_sqe_set_data(sqe, ev);
	return 0;
}

int snapkvd_loop_send(struct snapkvd_loop *l, int fd, const void *buf, unsigned len,
		      struct snapkvd_loop_ev *ev)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_send(sqe, fd, buf, len, MSG_NOSIGNAL);
	io_uring_sqe_set_data(sqe, ev);
	return 0;
}

/* Every completion ready now, each to its {fn, data}. Returns how many. */
static unsigned dispatch(struct snapkvd_loop *l)
{
	struct io_uring_cqe *cqe;
	unsigned events = 0;

	io_uring_submit(&l->ring); /* no syscall when nothing is queued */
	if (IO_URING_READ_ONCE(*l->ring.sq.kflags) & IORING_SQ_TASKRUN)
		io_uring_get_events(&l->ring);
	while (io_uring_peek_cqe(&l->ring, &cqe) == 0) {
		struct snapkvd_loop_ev *ev = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&l->ring, cqe);
		if (ev)
			ev->fn(ev->data, res);
		events++;
	}
	return events;
}

/* Block until a completion arrives, unless before_sleep says work did. */
static int sleep_once(struct snapkvd_loop *l)
{
	bool arrived = l->hooks.before_sleep && l->hooks.before_sleep(l->hooks.data);

	if (!arrived) {
		int r = io_uring_submit_and_wait(&l->ring, 1);

		if (r < 0 && r != -EINTR && r != -ETIME && r != -EBUSY)
			return r;
	}
	if (l->hooks.after_sleep)
		l->hooks.after_sleep(l->hooks.data);
	return 0;
}

int snapkvd_loop_run(struct snapkvd_loop *l)
{
	uint64_t last_busy = snapkvd_now_ns();

	while (!l->stop) {
		unsigned events = dispatch(l), work = 0;
		bool spin = false;
		uint64_t now;
		int r;

		if (l->hooks.round)
			work = l->hooks.round(l->hooks.data, &spin);
		if (l->stop)
			break;
		now = snapkvd_now_ns();
		if (work || events) {
			last_busy = now;
			continue;
		}
		if (spin && now - last_busy < l->spin_ns)
			continue; /* spin: no doorbell needed while we poll */
		r = sleep_once(l);
		if (r < 0)
			return r;
		last_busy = snapkvd_now_ns();
	}
	return 0;
}

void snapkvd_loop_stop(struct snapkvd_loop *l)
{
	l->stop = true;
}

bool snapkvd_loop_stopped(const struct snapkvd_loop *l)
{
	return l->stop;
}
