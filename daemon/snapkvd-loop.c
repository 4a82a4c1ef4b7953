// SPDX-License-Identifier: MIT
/*
 * snapkvd-loop.c - the daemon thread: one io_uring for accept, recvmsg with
 * SCM_RIGHTS, eventfd doorbells, signalfd, timerfd and the compactor's
 * completion eventfd (every worker's), plus polling of every session's SQ.
 *
 * While work arrives the loop spins over the rings without a syscall (peeking
 * io_uring's CQ is a memory read, submitting nothing is free). After
 * poll_idle_us without work it sets NEED_WAKEUP on every SQ, re-checks
 * (W1 in skv-ring.h), and only then blocks in io_uring_enter; an engine that
 * sees the flag writes the session's doorbell eventfd.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>

#include "snapkvd-log.h"
#include "snapkvd-server.h"

#define SNAPKVD_HELLO_TIMEOUT_MS 5000

uint64_t snapkvd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static struct io_uring_sqe *get_sqe(struct io_uring *ring)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);

	if (!sqe) {
		io_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
	}
	return sqe;
}

static int arm_read(struct snapkvd_server *srv, int fd, void *buf, unsigned len,
		    struct snapkvd_ev *ev)
{
	struct io_uring_sqe *sqe = get_sqe(&srv->ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_read(sqe, fd, buf, len, 0);
	io_uring_sqe_set_data(sqe, ev);
	return 0;
}

static int arm_accept(struct snapkvd_server *srv)
{
	struct io_uring_sqe *sqe = get_sqe(&srv->ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_accept(sqe, srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, &srv->ev_accept);
	return 0;
}

int snapkvd_loop_arm_recv(struct snapkvd_session *s)
{
	struct io_uring_sqe *sqe = get_sqe(&s->srv->ring);

	if (!sqe)
		return -EBUSY;
	s->riov = (struct iovec){.iov_base = s->rbuf, .iov_len = s->rbuf_cap};
	memset(&s->rmsg, 0, sizeof(s->rmsg));
	s->rmsg.msg_iov = &s->riov;
	s->rmsg.msg_iovlen = 1;
	s->rmsg.msg_control = s->rctl.buf;
	s->rmsg.msg_controllen = sizeof(s->rctl.buf);
	io_uring_prep_recvmsg(sqe, s->fd, &s->rmsg, MSG_CMSG_CLOEXEC);
	io_uring_sqe_set_data(sqe, &s->ev_recv);
	s->refs++;
	return 0;
}

int snapkvd_loop_arm_poll(struct snapkvd_server *srv, int fd, struct snapkvd_ev *ev)
{
	struct io_uring_sqe *sqe = get_sqe(&srv->ring);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, fd, POLLIN);
	io_uring_sqe_set_data(sqe, ev);
	return 0;
}

int snapkvd_loop_arm_doorbell(struct snapkvd_session *s)
{
	int r =
	    arm_read(s->srv, s->sq_efd, &s->doorbell_val, sizeof(s->doorbell_val), &s->ev_doorbell);

	if (r == 0)
		s->refs++;
	return r;
}

/* A socket path left by a dead daemon is removed; a live one is an error. */
static int listen_on(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == EADDRINUSE) {
		struct stat st;
		int live = 0;

		/* A daemon killed a moment ago can still be listening: its io_uring
		 * is torn down asynchronously after exit. Give that a second. */
		for (int i = 0; i < 20; i++) {
			int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

			live =
			    probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;
			if (probe >= 0)
				close(probe);
			if (!live)
				break;
			usleep(50000);
		}
		if (live) {
			close(fd);
			return -EADDRINUSE;
		}
		if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
			unlink(path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			goto fail;
	} else if (errno == EADDRINUSE) {
		goto fail;
	}
	/* engines of other uids reach us through the group; the allow list decides */
	(void)chmod(path, 0660);
	if (listen(fd, 128) < 0)
		goto fail;
	return fd;
fail:
	r = -errno;
	close(fd);
	return r;
}

int snapkvd_loop_init(struct snapkvd_server *srv)
{
	sigset_t mask;
	uint64_t wd_usec = 0;
	unsigned period_ms = srv->cfg.watchdog_ms;
	struct itimerspec its;
	int n, r;

	srv->listen_fd = srv->signal_fd = srv->timer_fd = srv->jobs_efd = -1;
	/* COOP_TASKRUN + TASKRUN_FLAG: completions of socket ops wait for us to
	 * enter the kernel, and the kernel tells us (IORING_SQ_TASKRUN) when
	 * there are some, so the ring-polling spin can stay syscall-free and
	 * still pick up socket traffic at once. Older kernels: plain setup. */
	r = io_uring_queue_init(512, &srv->ring,
				IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG);
	if (r == -EINVAL)
		r = io_uring_queue_init(512, &srv->ring, 0);
	if (r < 0)
		return log_error_errno(r, "Failed to set up io_uring");
	n = sd_listen_fds(1);
	if (n > 1)
		return log_error_errno(-EINVAL, "Expected one socket from systemd, got %d", n);
	if (n == 1) {
		srv->listen_fd = SD_LISTEN_FDS_START;
		if (sd_is_socket_unix(srv->listen_fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0)
			return log_error_errno(-EINVAL, "Socket from systemd is not a listening "
							"AF_UNIX SOCK_SEQPACKET socket");
		log_info("using the socket passed by systemd");
	} else {
		srv->listen_fd = listen_on(srv->cfg.socket_path);
		if (srv->listen_fd < 0)
			return log_error_errno(srv->listen_fd, "Failed to listen on %s",
					       srv->cfg.socket_path);
		srv->listen_owned = true;
		log_info("listening on %s", srv->cfg.socket_path);
	}
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	srv->signal_fd = signalfd(-1, &mask, SFD_CLOEXEC);
	srv->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
	srv->jobs_efd = eventfd(0, EFD_CLOEXEC);
	if (srv->signal_fd < 0 || srv->timer_fd < 0 || srv->jobs_efd < 0)
		return log_error_errno(-errno, "Failed to create signalfd/timerfd/eventfd");
	if (sd_watchdog_enabled(0, &wd_usec) > 0) {
		srv->watchdog = true;
		if (wd_usec / 2000 < period_ms)
			period_ms = wd_usec / 2000 ? wd_usec / 2000 : 1;
	}
	its.it_interval.tv_sec = period_ms / 1000;
	its.it_interval.tv_nsec = (period_ms % 1000) * 1000000L;
	its.it_value = its.it_interval;
	timerfd_settime(srv->timer_fd, 0, &its, NULL);
	srv->ev_accept.kind = SNAPKVD_EV_ACCEPT;
	srv->ev_signal.kind = SNAPKVD_EV_SIGNAL;
	srv->ev_timer.kind = SNAPKVD_EV_TIMER;
	srv->ev_jobs.kind = SNAPKVD_EV_JOBS;
	srv->start_realtime_s = (double)time(NULL);
	r = snapkvd_server_ops_init(srv);
	if (r < 0)
		return r;
	if (arm_accept(srv) ||
	    arm_read(srv, srv->signal_fd, srv->sigbuf, sizeof(srv->sigbuf), &srv->ev_signal) ||
	    arm_read(srv, srv->timer_fd, &srv->timerbuf, 8, &srv->ev_timer) ||
	    arm_read(srv, srv->jobs_efd, &srv->jobsbuf, 8, &srv->ev_jobs))
		return -EBUSY;
	io_uring_submit(&srv->ring);
	return 0;
}

static void reload(struct snapkvd_server *srv)
{
	struct snapkvd_config c = srv->cfg;
	char err[256];
	int r;

	if (!srv->config_path) {
		log_info("SIGHUP: no config file to reload");
		return;
	}
	r = snapkvd_config_load(&c, srv->config_path, err, sizeof(err));
	if (r < 0) {
		log_error("SIGHUP: keeping the old limits: %s", err);
		return;
	}
	/* limits only: socket, backend, threads and workers need a restart */
	snprintf(c.socket_path, sizeof(c.socket_path), "%s", srv->cfg.socket_path);
	snprintf(c.backend, sizeof(c.backend), "%s", srv->cfg.backend);
	c.threads = srv->cfg.threads;
	c.workers = srv->cfg.workers;
	c.sq_entries = srv->cfg.sq_entries;
	c.slot_bytes = srv->cfg.slot_bytes;
	c.session_arena_bytes = srv->cfg.session_arena_bytes;
	srv->cfg = c;
	snapkvd_log_max = c.log_level;
	snapkvd_pool_set_limits(&srv->pool, c.pool_bytes, c.tenant_quota_bytes);
	if (snapkvd_ops_reconfigure(&srv->ops, &c.ops, err, sizeof(err)) < 0)
		log_error("SIGHUP: keeping the old pressure policy: %s", err);
	/* per-tenant quotas (tenant_quota = UID:BYTES) of tenants already known */
	pthread_mutex_lock(&srv->pool.mu);
	for (struct snapkvd_tenant *t = srv->pool.tenants; t; t = t->next)
		t->quota = snapkvd_ops_tenant_quota(&srv->ops, t->uid);
	pthread_mutex_unlock(&srv->pool.mu);
	log_notice("SIGHUP: limits reloaded (pool %llu bytes)", (unsigned long long)c.pool_bytes);
}

static void on_timer(struct snapkvd_server *srv)
{
	uint64_t now = snapkvd_now_ns();

	if (srv->watchdog)
		sd_notify(0, "WATCHDOG=1");
	/* a connection that never says HELLO must not hold a session slot */
	for (struct snapkvd_session *s = srv->sessions, *n; s; s = n) {
		n = s->next;
		if (!s->greeted && !s->closing &&
		    now - s->created_ns > SNAPKVD_HELLO_TIMEOUT_MS * 1000000ull)
			snapkvd_session_close(s, -ETIMEDOUT);
	}
	snapkvd_ops_tick(&srv->ops, now);
	if (now - srv->last_status_ns > 1000000000ull) {
		srv->last_status_ns = now;
		sd_notifyf(0, "STATUS=%u sessions, pool %llu/%llu bytes, %llu compactions",
			   srv->n_sessions, (unsigned long long)snapkvd_pool_used(&srv->pool),
			   (unsigned long long)srv->pool.total,
			   (unsigned long long)srv->compactions);
	}
}

static void reap_jobs(struct snapkvd_server *srv)
{
	struct snapkvd_job *j = snapkvd_compactor_reap(srv->compactor);

	while (j) {
		struct snapkvd_job *n = j->next;

		snapkvd_session_job_done(j);
		j = n;
	}
}

static void handle_cqe(struct snapkvd_server *srv, struct io_uring_cqe *cqe)
{
	struct snapkvd_ev *ev = io_uring_cqe_get_data(cqe);
	struct snapkvd_session *s;
	int res = cqe->res;

	if (!ev)
		return;
	switch (ev->kind) {
	case SNAPKVD_EV_ACCEPT:
		if (res >= 0) {
			if (snapkvd_session_new(srv, res, &s) < 0)
				log_debug("connection refused");
		} else if (res != -EAGAIN && res != -EINTR && res != -ECONNABORTED) {
			log_warning_errno(res, "accept failed");
		}
		if (!srv->stop)
			arm_accept(srv);
		break;
	case SNAPKVD_EV_RECV: {
		struct skv_frame_hdr h;
		int fds[SKV_FRAME_MAX_FDS];
		unsigned n_fds = SKV_FRAME_MAX_FDS;
		int r;

		s = ev->s;
		if (s->closing) {
			if (res > 0)
				skv_frame_close_fds(&s->rmsg);
			snapkvd_session_unref(s);
			break;
		}
		r = skv_frame_parse(&s->rmsg, res, SKV_FRAME_MAX_PAYLOAD, &h, fds, &n_fds);
		if (r < 0) {
			/* end of stream, or framing we cannot trust: close this one */
			if (r != -ECONNRESET)
				log_notice("session %llu: bad frame: %s", (unsigned long long)s->id,
					   strerror(-r));
			snapkvd_session_close(s, r == -ECONNRESET ? 0 : r);
		} else {
			snapkvd_session_on_frame(s, &h, s->rbuf + SKV_FRAME_HDR_SIZE, fds, n_fds);
			if (!s->closing && snapkvd_loop_arm_recv(s) < 0)
				snapkvd_session_close(s, -EBUSY);
		}
		snapkvd_session_unref(s);
		break;
	}
	case SNAPKVD_EV_DOORBELL:
		s = ev->s;
		if (!s->closing && snapkvd_loop_arm_doorbell(s) < 0)
			snapkvd_session_close(s, -EBUSY);
		snapkvd_session_unref(s);
		break;
	case SNAPKVD_EV_SIGNAL:
		if (res == (int)sizeof(struct signalfd_siginfo) ||
		    res >= (int)sizeof(struct signalfd_siginfo)) {
			struct signalfd_siginfo *si = (struct signalfd_siginfo *)srv->sigbuf;

			if (si->ssi_signo == SIGHUP) {
				sd_notify(0, "RELOADING=1");
				reload(srv);
				sd_notify(0, "READY=1");
			} else if (!srv->draining) {
				log_notice("%s: draining %u in-flight compactions",
					   strsignal(si->ssi_signo),
					   snapkvd_compactor_pending(srv->compactor));
				sd_notify(0, "STOPPING=1");
				srv->draining = true;
			}
		}
		arm_read(srv, srv->signal_fd, srv->sigbuf, sizeof(srv->sigbuf), &srv->ev_signal);
		break;
	case SNAPKVD_EV_TIMER:
		on_timer(srv);
		arm_read(srv, srv->timer_fd, &srv->timerbuf, 8, &srv->ev_timer);
		break;
	case SNAPKVD_EV_JOBS:
		reap_jobs(srv);
		arm_read(srv, srv->jobs_efd, &srv->jobsbuf, 8, &srv->ev_jobs);
		break;
	case SNAPKVD_EV_HOOK:
		snapkvd_server_hook_event(srv, ev, res);
		break;
	}
}

int snapkvd_loop_run(struct snapkvd_server *srv)
{
	uint64_t last_busy = snapkvd_now_ns();
	const unsigned budget = 64;

	sd_notifyf(0, "READY=1\nSTATUS=listening\nMAINPID=%d", (int)getpid());
	while (!srv->stop) {
		struct io_uring_cqe *cqe;
		unsigned events = 0;
		int work = 0;
		bool rings = false;

		io_uring_submit(&srv->ring); /* no syscall when nothing is queued */
		if (IO_URING_READ_ONCE(*srv->ring.sq.kflags) & IORING_SQ_TASKRUN)
			io_uring_get_events(&srv->ring);
		while (io_uring_peek_cqe(&srv->ring, &cqe) == 0) {
			handle_cqe(srv, cqe);
			io_uring_cqe_seen(&srv->ring, cqe);
			events++;
		}
		for (struct snapkvd_session *s = srv->sessions, *n; s; s = n) {
			n = s->next;
			if (s->closing || !s->ring_map)
				continue;
			rings = true;
			work += snapkvd_session_poll_ring(s, budget);
		}
		reap_jobs(srv);
		/* pool changes of this round (commits, frees, closed sessions) */
		snapkvd_server_pool_changed(srv);
		for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
			snapkvd_session_flush_cq(s);
		if (srv->draining && snapkvd_compactor_pending(srv->compactor) == 0) {
			srv->stop = true;
			break;
		}
		uint64_t now = snapkvd_now_ns();
		if (work || events) {
			last_busy = now;
			continue;
		}
		if (rings && now - last_busy < (uint64_t)srv->cfg.poll_idle_us * 1000)
			continue; /* spin: the engine needs no doorbell while we poll */
		/* about to sleep: W1 on every SQ */
		bool arrived = false;
		for (struct snapkvd_session *s = srv->sessions, *n; s; s = n) {
			n = s->next;
			if (s->closing || !s->ring_map)
				continue;
			/* W1, extended: a session whose CQ is full (it stopped reading
			 * completions) has SQEs we may not take yet; they must not keep
			 * us spinning. libsnapkv rings the doorbell after reaping CQEs
			 * when it sees the flag and an SQ we have not drained. */
			atomic_fetch_or_explicit(&s->sq.ctl->flags, SKV_RING_NEED_WAKEUP,
						 memory_order_relaxed);
			atomic_thread_fence(memory_order_seq_cst);
			int ready = skv_ring_ready(&s->sq), space = skv_ring_space(&s->cq);
			if (ready < 0 || space < 0) {
				snapkvd_session_close(s, -EBADMSG);
			} else if (ready > 0 && (unsigned)space > s->inflight) {
				skv_ring_clear_wakeup(&s->sq);
				arrived = true;
			}
		}
		if (!arrived) {
			int r = io_uring_submit_and_wait(&srv->ring, 1);

			if (r < 0 && r != -EINTR && r != -ETIME && r != -EBUSY)
				return log_error_errno(r, "io_uring wait failed");
		}
		for (struct snapkvd_session *s = srv->sessions; s; s = s->next)
			if (!s->closing && s->ring_map)
				skv_ring_clear_wakeup(&s->sq);
		last_busy = snapkvd_now_ns();
	}
	return 0;
}

void snapkvd_loop_fini(struct snapkvd_server *srv)
{
	struct snapkvd_session *s, *n;

	/* the kernel side goes first: no armed op can complete into freed memory */
	io_uring_queue_exit(&srv->ring);
	snapkvd_server_ops_fini(srv);
	for (s = srv->sessions; s; s = s->next) {
		/* engines may still be reading caches they were answered for
		 * during the drain: exiting must not zero them under their feet */
		if (s->arena)
			s->arena->keep_pages = true;
		if (!s->closing)
			snapkvd_session_close(s, 0);
	}
	for (s = srv->sessions; s; s = n) {
		n = s->next;
		s->refs = 1;
		snapkvd_session_unref(s);
	}
	if (srv->listen_fd >= 0) {
		close(srv->listen_fd);
		if (srv->listen_owned)
			unlink(srv->cfg.socket_path);
	}
	if (srv->signal_fd >= 0)
		close(srv->signal_fd);
	if (srv->timer_fd >= 0)
		close(srv->timer_fd);
	if (srv->jobs_efd >= 0)
		close(srv->jobs_efd);
}
