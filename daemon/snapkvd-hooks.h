/* SPDX-License-Identifier: MIT */
/*
 * snapkvd-hooks.h - operator hook executables run on pressure events.
 *
 * Every executable regular file of a configured directory is started with
 * posix_spawn (new session, signals reset, stdin /dev/null, stdout and
 * stderr into one pipe) and the event in its environment. Nothing here
 * blocks: the daemon watches each hook's pidfd and output pipe with its
 * io_uring loop, calls snapkvd_hook_drain() when the pipe is readable,
 * snapkvd_hook_check_timeout() from its timer, and snapkvd_hook_reap()
 * when the pidfd is readable. snapkvd_hook_wait() is the blocking variant
 * for tests and tools. A hook that fails or hangs only costs its own slot:
 * it is SIGKILLed (with its process group) after the timeout, and its
 * output is bounded.
 */
#ifndef SNAPKVD_HOOKS_H
#define SNAPKVD_HOOKS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SNAPKVD_HOOKS_MAX_DEFAULT	16
#define SNAPKVD_HOOKS_MAX_LIMIT		256
#define SNAPKVD_HOOK_OUTPUT_DEFAULT	(16 * 1024)
#define SNAPKVD_HOOK_OUTPUT_LIMIT	(1024 * 1024)
#define SNAPKVD_HOOK_TIMEOUT_MS_DEFAULT 5000

struct snapkvd_hooks_config {
	const char *dir;     /* hook directory; NULL or "" disables hooks   */
	uint32_t timeout_ms; /* SIGKILL after this long (default 5000)     */
	uint32_t max_hooks;  /* executables run per event (default 16)      */
	uint32_t max_output; /* bytes of output kept per hook (16 KiB)      */
};

void snapkvd_hooks_config_init(struct snapkvd_hooks_config *cfg);

/* The event, as the hook sees it in its environment. */
struct snapkvd_hook_event {
	const char *event;	     /* SNAPKV_EVENT, e.g. "pressure"             */
	const char *level;	     /* SNAPKV_LEVEL                              */
	const char *prev_level;	     /* SNAPKV_PREV_LEVEL                         */
	uint64_t pool_used_bytes;    /* SNAPKV_POOL_USED_BYTES                 */
	uint64_t pool_total_bytes;   /* SNAPKV_POOL_TOTAL_BYTES                */
	const char *ledger_json;     /* SNAPKV_LEDGER_JSON (path; may be NULL) */
	uint32_t suggested_capacity; /* SNAPKV_SUGGESTED_CAPACITY when != 0  */
};

/*
 * The executables of cfg->dir, sorted by name: regular files (symlinks
 * followed) with an execute bit the daemon may use; dot-files and
 * everything else skipped. At most cfg->max_hooks are returned; *ret_skipped
 * (may be NULL) counts executables left out by that limit.
 * Free with snapkvd_hooks_list_free(). 0, -ENOENT/-ENOTDIR/-EACCES, -ENOMEM.
 */
int snapkvd_hooks_list(const struct snapkvd_hooks_config *cfg, char ***ret_paths, size_t *ret_n,
		       size_t *ret_skipped);
void snapkvd_hooks_list_free(char **paths, size_t n);

struct snapkvd_hook;

struct snapkvd_hook_result {
	pid_t pid;
	int exited;    /* 1: exit status valid; 0: killed by signal      */
	int status;    /* exit status or signal number                   */
	int timed_out; /* killed by us after the timeout                 */
	uint64_t duration_ns;
	const char *output; /* NUL-terminated; owned by the hook object   */
	size_t output_len;
	uint64_t output_dropped; /* bytes beyond max_output, discarded     */
};

/*
 * Start one hook. now_ns is a CLOCK_MONOTONIC time the timeout counts from
 * (0: read the clock). 0, or -errno from pipe/posix_spawn/pidfd_open;
 * nothing is left running on failure.
 */
int snapkvd_hook_spawn(const char *path, const struct snapkvd_hook_event *ev,
		       const struct snapkvd_hooks_config *cfg, uint64_t now_ns,
		       struct snapkvd_hook **ret_hook);

/*
 * Start every hook of the directory. Returns the number started (>= 0) and
 * an array of hooks (NULL when none) in *ret_hooks; a hook that fails to
 * start is counted in *ret_failed (may be NULL) and the others still run.
 * Negative errno only when the directory cannot be listed.
 */
int snapkvd_hooks_run(const struct snapkvd_hooks_config *cfg, const struct snapkvd_hook_event *ev,
		      uint64_t now_ns, struct snapkvd_hook ***ret_hooks, size_t *ret_failed);

const char *snapkvd_hook_path(const struct snapkvd_hook *h);
pid_t snapkvd_hook_pid(const struct snapkvd_hook *h);
/* Readable (POLLIN) when the hook has exited; for io_uring poll. */
int snapkvd_hook_pidfd(const struct snapkvd_hook *h);
/* Non-blocking read end of the output pipe; -1 once it hit EOF. */
int snapkvd_hook_output_fd(const struct snapkvd_hook *h);
/* An opaque pointer for the caller (e.g. its event-loop record). */
void snapkvd_hook_set_user(struct snapkvd_hook *h, void *user);
void *snapkvd_hook_user(const struct snapkvd_hook *h);
/* CLOCK_MONOTONIC time at which the hook will be killed. */
uint64_t snapkvd_hook_deadline_ns(const struct snapkvd_hook *h);

/* Read what the pipe holds without blocking. 0, or -errno on a read error. */
int snapkvd_hook_drain(struct snapkvd_hook *h);
/* SIGKILL the hook (and its process group) if now_ns is past the deadline
 * and it still runs. Returns 1 when it killed, 0 otherwise. */
int snapkvd_hook_check_timeout(struct snapkvd_hook *h, uint64_t now_ns);
/*
 * Collect an exited hook: drains the pipe, fills *ret_result (valid until
 * the hook is freed). -EAGAIN while it still runs; 0 once collected (again
 * 0 with the same result on later calls).
 */
int snapkvd_hook_reap(struct snapkvd_hook *h, struct snapkvd_hook_result *ret_result);
/* Blocking: wait for exit or the deadline (then kill), then reap. */
int snapkvd_hook_wait(struct snapkvd_hook *h, struct snapkvd_hook_result *ret_result);
/* Kills a hook still running, reaps it and frees everything. NULL is fine. */
void snapkvd_hook_free(struct snapkvd_hook *h);
void snapkvd_hooks_free(struct snapkvd_hook **hooks, size_t n);

#endif /* SNAPKVD_HOOKS_H */
