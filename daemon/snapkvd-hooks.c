// SPDX-License-Identifier: MIT
/*
 * snapkvd-hooks.c - non-blocking hook executables with pidfds.
 * See snapkvd-hooks.h.
 */
#include "snapkvd-hooks.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

struct snapkvd_hook {
	char *path;
	pid_t pid;
	int pidfd;
	int out_fd;
	uint64_t start_ns;
	uint64_t deadline_ns;
	int timed_out;
	int reaped;
	struct snapkvd_hook_result result;
	char *out;
	size_t out_len;
	size_t out_cap; /* max_output; out has out_cap + 1 bytes */
	uint64_t dropped;
	void *user;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int sys_pidfd_open(pid_t pid, unsigned flags)
{
	return (int)syscall(SYS_pidfd_open, pid, flags);
}

static int sys_pidfd_send_signal(int pidfd, int sig)
{
	return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

void snapkvd_hooks_config_init(struct snapkvd_hooks_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->timeout_ms = SNAPKVD_HOOK_TIMEOUT_MS_DEFAULT;
	cfg->max_hooks = SNAPKVD_HOOKS_MAX_DEFAULT;
	cfg->max_output = SNAPKVD_HOOK_OUTPUT_DEFAULT;
}

static uint32_t cfg_max_hooks(const struct snapkvd_hooks_config *cfg)
{
	if (cfg->max_hooks == 0)
		return SNAPKVD_HOOKS_MAX_DEFAULT;
	return cfg->max_hooks > SNAPKVD_HOOKS_MAX_LIMIT ? SNAPKVD_HOOKS_MAX_LIMIT : cfg->max_hooks;
}

static uint32_t cfg_max_output(const struct snapkvd_hooks_config *cfg)
{
	return cfg->max_output > SNAPKVD_HOOK_OUTPUT_LIMIT ? SNAPKVD_HOOK_OUTPUT_LIMIT
							   : cfg->max_output;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

void snapkvd_hooks_list_free(char **paths, size_t n)
{
	if (!paths)
		return;
	for (size_t i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
}

int snapkvd_hooks_list(const struct snapkvd_hooks_config *cfg, char ***ret_paths, size_t *ret_n,
		       size_t *ret_skipped)
{
	/* Listing itself is bounded too: a directory of a million files must
	 * not make the daemon allocate for all of them. */
	const size_t scan_limit = 4096;
	char **v = NULL;
	size_t n = 0, cap = 0, scanned = 0, limit = cfg_max_hooks(cfg);
	struct dirent *de;
	DIR *d;
	int dfd, r = 0;

	if (!cfg->dir || !*cfg->dir) {
		*ret_paths = NULL;
		*ret_n = 0;
		if (ret_skipped)
			*ret_skipped = 0;
		return 0;
	}
	d = opendir(cfg->dir);
	if (!d)
		return -errno;
	dfd = dirfd(d);
	while ((de = readdir(d)) && scanned < scan_limit) {
		struct stat st;
		char *p;

		scanned++;
		if (de->d_name[0] == '.')
			continue;
		if (fstatat(dfd, de->d_name, &st, 0) < 0 || !S_ISREG(st.st_mode))
			continue;
		if (faccessat(dfd, de->d_name, X_OK, AT_EACCESS) < 0)
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			char **nv = realloc(v, nc * sizeof(*nv));

			if (!nv) {
				r = -ENOMEM;
				break;
			}
			v = nv;
			cap = nc;
		}
		if (asprintf(&p, "%s/%s", cfg->dir, de->d_name) < 0) {
			r = -ENOMEM;
			break;
		}
		v[n++] = p;
	}
	closedir(d);
	if (r < 0) {
		snapkvd_hooks_list_free(v, n);
		return r;
	}
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_str);
	if (ret_skipped)
		*ret_skipped = n > limit ? n - limit : 0;
	while (n > limit)
		free(v[--n]);
	*ret_paths = v;
	*ret_n = n;
	return 0;
}

/* Environment: the event plus a fixed PATH; nothing of the daemon's own. */
static int build_env(const struct snapkvd_hook_event *ev, uint64_t timeout_ms, char *env[12],
		     char **store)
{
	char *buf;
	size_t cap = 4096 + (ev->ledger_json ? strlen(ev->ledger_json) : 0);
	size_t off = 0;
	int n = 0;

#define ADD(...)                                                                                   \
	do {                                                                                       \
		int _w = snprintf(buf + off, cap - off, __VA_ARGS__);                              \
		if (_w < 0 || (size_t)_w >= cap - off) {                                           \
			free(buf);                                                                 \
			return -E2BIG;                                                             \
		}                                                                                  \
		env[n++] = buf + off;                                                              \
		off += (size_t)_w + 1;                                                             \
	} while (0)

	buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	ADD("PATH=/usr/local/bin:/usr/bin:/bin");
	ADD("LC_ALL=C");
	ADD("SNAPKV_EVENT=%s", ev->event ? ev->event : "pressure");
	ADD("SNAPKV_LEVEL=%s", ev->level ? ev->level : "");
	ADD("SNAPKV_PREV_LEVEL=%s", ev->prev_level ? ev->prev_level : "");
	ADD("SNAPKV_POOL_USED_BYTES=%" PRIu64, ev->pool_used_bytes);
	ADD("SNAPKV_POOL_TOTAL_BYTES=%" PRIu64, ev->pool_total_bytes);
	ADD("SNAPKV_HOOK_TIMEOUT_MS=%" PRIu64, timeout_ms);
	if (ev->ledger_json)
		ADD("SNAPKV_LEDGER_JSON=%s", ev->ledger_json);
	if (ev->suggested_capacity)
		ADD("SNAPKV_SUGGESTED_CAPACITY=%" PRIu32, ev->suggested_capacity);
	env[n] = NULL;
	*store = buf;
	return 0;
#undef ADD
}

int snapkvd_hook_spawn(const char *path, const struct snapkvd_hook_event *ev,
		       const struct snapkvd_hooks_config *cfg, uint64_t now_ns,
		       struct snapkvd_hook **ret_hook)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	sigset_t none, all;
	struct snapkvd_hook *h;
	char *env[12], *envbuf = NULL;
	char *argv[2];
	int pipefd[2] = {-1, -1};
	pid_t pid;
	int r;

	if (!path || !ev || !cfg)
		return -EINVAL;
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->pidfd = -1;
	h->out_fd = -1;
	h->out_cap = cfg_max_output(cfg);
	h->out = malloc(h->out_cap + 1);
	h->path = strdup(path);
	if (!h->out || !h->path) {
		r = -ENOMEM;
		goto fail;
	}
	h->out[0] = '\0';
	r = build_env(ev, cfg->timeout_ms, env, &envbuf);
	if (r < 0)
		goto fail;
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		r = -errno;
		goto fail;
	}
	if (fcntl(pipefd[0], F_SETFL, O_NONBLOCK) < 0) {
		r = -errno;
		goto fail;
	}

	/* The daemon blocks signals for its signalfd; a hook must start with
	 * them unblocked and at their defaults, in its own session so that a
	 * timeout can kill whatever it forked too. */
	sigemptyset(&none);
	sigfillset(&all);
	posix_spawnattr_init(&attr);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
					    POSIX_SPAWN_SETSID);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &all);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
	posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
	posix_spawn_file_actions_addclosefrom_np(&fa, 3);
	argv[0] = h->path;
	argv[1] = NULL;
	r = posix_spawn(&pid, h->path, &fa, &attr, argv, env);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	free(envbuf);
	envbuf = NULL;
	if (r != 0) {
		r = -r;
		goto fail;
	}
	close(pipefd[1]);
	pipefd[1] = -1;

	/* The child cannot have been reaped yet: only this module waits on it
	 * (the daemon must not waitpid(-1)), so the pid still names it. */
	h->pidfd = sys_pidfd_open(pid, 0);
	if (h->pidfd < 0) {
		r = -errno;
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		goto fail;
	}
	h->pid = pid;
	h->out_fd = pipefd[0];
	pipefd[0] = -1;
	h->start_ns = now_ns ? now_ns : mono_ns();
	h->deadline_ns = h->start_ns + (uint64_t)cfg->timeout_ms * 1000000ull;
	*ret_hook = h;
	return 0;

fail:
	if (pipefd[0] >= 0)
		close(pipefd[0]);
	if (pipefd[1] >= 0)
		close(pipefd[1]);
	free(envbuf);
	snapkvd_hook_free(h);
	return r;
}

int snapkvd_hooks_run(const struct snapkvd_hooks_config *cfg, const struct snapkvd_hook_event *ev,
		      uint64_t now_ns, struct snapkvd_hook ***ret_hooks, size_t *ret_failed)
{
	struct snapkvd_hook **hooks = NULL;
	char **paths = NULL;
	size_t n = 0, started = 0, failed = 0;
	int r;

	r = snapkvd_hooks_list(cfg, &paths, &n, NULL);
	if (r < 0)
		return r;
	if (n > 0) {
		hooks = calloc(n, sizeof(*hooks));
		if (!hooks) {
			snapkvd_hooks_list_free(paths, n);
			return -ENOMEM;
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (snapkvd_hook_spawn(paths[i], ev, cfg, now_ns, &hooks[started]) < 0)
			failed++;
		else
			started++;
	}
	snapkvd_hooks_list_free(paths, n);
	if (started == 0) {
		free(hooks);
		hooks = NULL;
	}
	*ret_hooks = hooks;
	if (ret_failed)
		*ret_failed = failed;
	return (int)started;
}

const char *snapkvd_hook_path(const struct snapkvd_hook *h)
{
	return h->path;
}

pid_t snapkvd_hook_pid(const struct snapkvd_hook *h)
{
	return h->pid;
}

int snapkvd_hook_pidfd(const struct snapkvd_hook *h)
{
	return h->pidfd;
}

int snapkvd_hook_output_fd(const struct snapkvd_hook *h)
{
	return h->out_fd;
}

void snapkvd_hook_set_user(struct snapkvd_hook *h, void *user)
{
	h->user = user;
}

void *snapkvd_hook_user(const struct snapkvd_hook *h)
{
	return h->user;
}

uint64_t snapkvd_hook_deadline_ns(const struct snapkvd_hook *h)
{
	return h->deadline_ns;
}

int snapkvd_hook_drain(struct snapkvd_hook *h)
{
	char scratch[4096];

	while (h->out_fd >= 0) {
		size_t room = h->out_cap - h->out_len;
		char *dst = room ? h->out + h->out_len : scratch;
		size_t want = room ? room : sizeof(scratch);
		ssize_t k = read(h->out_fd, dst, want);

		if (k < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return -errno;
		}
		if (k == 0) {
			close(h->out_fd);
			h->out_fd = -1;
			break;
		}
		if (room)
			h->out_len += (size_t)k;
		else
			h->dropped += (uint64_t)k;
	}
	return 0;
}

static void kill_hook(struct snapkvd_hook *h)
{
	/* The pid cannot be reused before we reap it, so the group id (= pid,
	 * POSIX_SPAWN_SETSID) still names the hook's group. */
	sys_pidfd_send_signal(h->pidfd, SIGKILL);
	kill(-h->pid, SIGKILL);
}

int snapkvd_hook_check_timeout(struct snapkvd_hook *h, uint64_t now_ns)
{
	siginfo_t si;

	if (h->reaped || h->timed_out || now_ns < h->deadline_ns)
		return 0;
	/* Exited but not collected yet (its pidfd event is still on the way):
	 * not a timeout. WNOWAIT leaves it for snapkvd_hook_reap(). */
	memset(&si, 0, sizeof(si));
	if (waitid((idtype_t)P_PIDFD, (id_t)h->pidfd, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
	    si.si_pid != 0)
		return 0;
	kill_hook(h);
	h->timed_out = 1;
	return 1;
}

static int collect(struct snapkvd_hook *h, int options)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	if (waitid((idtype_t)P_PIDFD, (id_t)h->pidfd, &si, WEXITED | options) < 0)
		return -errno;
	if (si.si_pid == 0)
		return -EAGAIN;
	h->reaped = 1;
	/* Its children may still hold the pipe; take what is there, no more. */
	snapkvd_hook_drain(h);
	if (h->out_fd >= 0) {
		close(h->out_fd);
		h->out_fd = -1;
	}
	h->out[h->out_len] = '\0';
	h->result.pid = h->pid;
	h->result.exited = si.si_code == CLD_EXITED;
	h->result.status = si.si_status;
	h->result.timed_out = h->timed_out;
	h->result.duration_ns = mono_ns() - h->start_ns;
	h->result.output = h->out;
	h->result.output_len = h->out_len;
	h->result.output_dropped = h->dropped;
	return 0;
}

int snapkvd_hook_reap(struct snapkvd_hook *h, struct snapkvd_hook_result *ret_result)
{
	int r = 0;

	if (!h->reaped) {
		if (h->timed_out)
			kill(-h->pid, SIGKILL); /* stragglers forked after the kill */
		r = collect(h, WNOHANG);
	}
	if (r == 0 && ret_result)
		*ret_result = h->result;
	return r;
}

int snapkvd_hook_wait(struct snapkvd_hook *h, struct snapkvd_hook_result *ret_result)
{
	while (!h->reaped) {
		struct pollfd pfd[2] = {
		    {.fd = h->pidfd, .events = POLLIN},
		    {.fd = h->out_fd, .events = POLLIN},
		};
		uint64_t now = mono_ns();
		int timeout = -1, r;

		if (!h->timed_out) {
			if (now >= h->deadline_ns) {
				snapkvd_hook_check_timeout(h, now);
				continue;
			}
			timeout = (int)((h->deadline_ns - now + 999999) / 1000000);
		}
		r = poll(pfd, h->out_fd >= 0 ? 2 : 1, timeout);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r > 0 && h->out_fd >= 0 && (pfd[1].revents & (POLLIN | POLLHUP)))
			snapkvd_hook_drain(h);
		if (r > 0 && (pfd[0].revents & POLLIN)) {
			r = snapkvd_hook_reap(h, NULL);
			if (r < 0 && r != -EAGAIN)
				return r;
		}
	}
	if (ret_result)
		*ret_result = h->result;
	return 0;
}

void snapkvd_hook_free(struct snapkvd_hook *h)
{
	if (!h)
		return;
	if (h->pidfd >= 0) {
		if (!h->reaped) {
			kill_hook(h);
			collect(h, 0);
		}
		close(h->pidfd);
	}
	if (h->out_fd >= 0)
		close(h->out_fd);
	free(h->out);
	free(h->path);
	free(h);
}

void snapkvd_hooks_free(struct snapkvd_hook **hooks, size_t n)
{
	if (!hooks)
		return;
	for (size_t i = 0; i < n; i++)
		snapkvd_hook_free(hooks[i]);
	free(hooks);
}
