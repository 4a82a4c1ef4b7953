// SPDX-License-Identifier: MIT
/* test-hooks (daemon/snapkvd-hooks.c): hook discovery, environment, timeout kill, failure, bounded
 * output. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/snapkvd-hooks.c"

static char tmpdir[200];

static void write_file(const char *name, const char *body, mode_t mode)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs(body, f);
	fclose(f);
	CU_ASSERT_EQUAL(chmod(path, mode), 0);
}

static void clean_dir(void)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'/* '%s'/.[!.]*", tmpdir, tmpdir);
	CU_ASSERT_EQUAL(system(cmd), 0);
}

static void default_cfg(struct snapkvd_hooks_config *cfg)
{
	snapkvd_hooks_config_init(cfg);
	cfg->dir = tmpdir;
	cfg->timeout_ms = 20000; /* generous: a loaded machine must not fail the test */
}

static const struct snapkvd_hook_event ev = {
    .event = "pressure",
    .level = "critical",
    .prev_level = "high",
    .pool_used_bytes = 987654321,
    .pool_total_bytes = 1073741824,
    .ledger_json = "/run/snapkvd/ledger-1.json",
    .suggested_capacity = 512,
};

static void test_environment(void)
{
	struct snapkvd_hooks_config cfg;
	struct snapkvd_hook *h = NULL;
	struct snapkvd_hook_result res;
	sigset_t block, old;
	char path[512];
	int r;

	clean_dir();
	default_cfg(&cfg);
	write_file("10-env",
		   "#!/bin/sh\nenv | grep -E '^(SNAPKV_|PATH=)' | sort\n"
		   "exec grep '^SigBlk' /proc/self/status\n",
		   0755);
	snprintf(path, sizeof(path), "%s/10-env", tmpdir);
	/* The daemon blocks signals for its signalfd; the hook must not inherit that. */
	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGCHLD);
	sigaddset(&block, SIGHUP);
	sigprocmask(SIG_BLOCK, &block, &old);
	r = snapkvd_hook_spawn(path, &ev, &cfg, 0, &h);
	sigprocmask(SIG_SETMASK, &old, NULL);
	CU_ASSERT_EQUAL_FATAL(r, 0);
	CU_ASSERT(snapkvd_hook_pidfd(h) >= 0);
	CU_ASSERT(snapkvd_hook_output_fd(h) >= 0);
	CU_ASSERT(snapkvd_hook_pid(h) > 0);
	CU_ASSERT_EQUAL(snapkvd_hook_wait(h, &res), 0);
	CU_ASSERT_EQUAL(res.exited, 1);
	CU_ASSERT_EQUAL(res.status, 0);
	CU_ASSERT_EQUAL(res.timed_out, 0);
	CU_ASSERT_EQUAL(res.output_dropped, 0);
	if (!strstr(res.output, "SNAPKV_SUGGESTED_CAPACITY=512\nSigBlk:\t0000000000000000\n"))
		fprintf(stderr, "hook output:\n%s", res.output);
	CU_ASSERT_STRING_EQUAL(res.output, "PATH=/usr/local/bin:/usr/bin:/bin\n"
					   "SNAPKV_EVENT=pressure\n"
					   "SNAPKV_HOOK_TIMEOUT_MS=20000\n"
					   "SNAPKV_LEDGER_JSON=/run/snapkvd/ledger-1.json\n"
					   "SNAPKV_LEVEL=critical\n"
					   "SNAPKV_POOL_TOTAL_BYTES=1073741824\n"
					   "SNAPKV_POOL_USED_BYTES=987654321\n"
					   "SNAPKV_PREV_LEVEL=high\n"
					   "SNAPKV_SUGGESTED_CAPACITY=512\n"
					   "SigBlk:\t0000000000000000\n");
	/* Reaping again gives the same result. */
	CU_ASSERT_EQUAL(snapkvd_hook_reap(h, &res), 0);
	CU_ASSERT_EQUAL(res.status, 0);
	snapkvd_hook_free(h);
}

static int proc_gone_or_zombie(pid_t pid)
{
	char path[64], buf[512];
	FILE *f;
	char *p;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return 1;
	p = fgets(buf, sizeof(buf), f);
	fclose(f);
	if (!p)
		return 1;
	p = strrchr(buf, ')');
	return p && (p[2] == 'Z' || p[2] == 'X');
}

static void test_timeout_kill(void)
{
	struct snapkvd_hooks_config cfg;
	struct snapkvd_hook *h = NULL;
	struct snapkvd_hook_result res;
	char path[512], pidfile[512];
	FILE *f;
	int child = 0;
	uint32_t timeout_ms = 1000;

	/* The hook must have printed and forked before its timeout kills it: a
	 * machine too loaded to run the shell that far in 1 s gets a longer
	 * timeout (4 s, then 16 s), so that load alone cannot fail this. */
	for (;;) {
		clean_dir();
		default_cfg(&cfg);
		cfg.timeout_ms = timeout_ms;
		snprintf(pidfile, sizeof(pidfile), "%s/child.pid", tmpdir);
		{
			char body[1024];

			/* The forked sleep holds the output pipe: it must die too. */
			snprintf(body, sizeof(body),
				 "#!/bin/sh\necho started\nsleep 300 &\necho $! > '%s'\nwait\n",
				 pidfile);
			write_file("20-hang", body, 0755);
		}
		snprintf(path, sizeof(path), "%s/20-hang", tmpdir);
		CU_ASSERT_EQUAL_FATAL(snapkvd_hook_spawn(path, &ev, &cfg, 0, &h), 0);
		CU_ASSERT_EQUAL(snapkvd_hook_wait(h, &res), 0);
		if ((res.output && strstr(res.output, "started") && access(pidfile, R_OK) == 0) ||
		    timeout_ms >= 16000)
			break;
		printf("\n    the hook did not get going in %u ms: again with %u ms ", timeout_ms,
		       timeout_ms * 4);
		snapkvd_hook_free(h);
		h = NULL;
		timeout_ms *= 4;
	}
	CU_ASSERT_EQUAL(res.timed_out, 1);
	CU_ASSERT_EQUAL(res.exited, 0);
	CU_ASSERT_EQUAL(res.status, SIGKILL);
	CU_ASSERT(res.duration_ns >= (uint64_t)timeout_ms * 1000000ull);
	CU_ASSERT(res.duration_ns < 300000000000ull);
	CU_ASSERT_PTR_NOT_NULL(strstr(res.output, "started"));
	f = fopen(pidfile, "r");
	if (f) {
		CU_ASSERT_EQUAL(fscanf(f, "%d", &child), 1);
		fclose(f);
	}
	if (child > 0) {
		int gone = 0;

		for (int i = 0; i < 500 && !gone; i++) {
			gone = proc_gone_or_zombie(child);
			if (!gone)
				usleep(10000);
		}
		CU_ASSERT(gone);
	}
	snapkvd_hook_free(h);
}

static void test_failing_hook(void)
{
	struct snapkvd_hooks_config cfg;
	struct snapkvd_hook *h = NULL;
	struct snapkvd_hook_result res;
	char path[512];

	clean_dir();
	default_cfg(&cfg);
	write_file("30-fail", "#!/bin/sh\necho 'boom' >&2\nexit 3\n", 0755);
	snprintf(path, sizeof(path), "%s/30-fail", tmpdir);
	CU_ASSERT_EQUAL_FATAL(snapkvd_hook_spawn(path, &ev, &cfg, 0, &h), 0);
	CU_ASSERT_EQUAL(snapkvd_hook_wait(h, &res), 0);
	CU_ASSERT_EQUAL(res.exited, 1);
	CU_ASSERT_EQUAL(res.status, 3);
	CU_ASSERT_EQUAL(res.timed_out, 0);
	CU_ASSERT_STRING_EQUAL(res.output, "boom\n");
	snapkvd_hook_free(h);

	/* A hook that cannot be executed at all (bad interpreter) fails alone. */
	write_file("31-badinterp", "#!/nonexistent/interpreter\n", 0755);
	snprintf(path, sizeof(path), "%s/31-badinterp", tmpdir);
	h = NULL;
	CU_ASSERT_EQUAL(snapkvd_hook_spawn(path, &ev, &cfg, 0, &h), -ENOENT);
	CU_ASSERT_PTR_NULL(h);
}

static void test_listing_skips(void)
{
	struct snapkvd_hooks_config cfg;
	char **paths = NULL, sub[512], target[512], link[512];
	size_t n = 0, skipped = 0;

	clean_dir();
	default_cfg(&cfg);
	write_file("50-b", "#!/bin/sh\n", 0755);
	write_file("40-a", "#!/bin/sh\n", 0700);
	write_file("60-noexec", "#!/bin/sh\n", 0644);
	write_file(".hidden", "#!/bin/sh\n", 0755);
	write_file("70-c", "#!/bin/sh\n", 0755);
	snprintf(sub, sizeof(sub), "%s/45-dir", tmpdir);
	CU_ASSERT_EQUAL(mkdir(sub, 0755), 0);
	snprintf(target, sizeof(target), "%s/70-c", tmpdir);
	snprintf(link, sizeof(link), "%s/80-link", tmpdir);
	CU_ASSERT_EQUAL(symlink(target, link), 0);
	snprintf(link, sizeof(link), "%s/90-dangling", tmpdir);
	CU_ASSERT_EQUAL(symlink("/nonexistent/x", link), 0);

	CU_ASSERT_EQUAL_FATAL(snapkvd_hooks_list(&cfg, &paths, &n, &skipped), 0);
	CU_ASSERT_EQUAL_FATAL(n, 4);
	CU_ASSERT_EQUAL(skipped, 0);
	CU_ASSERT_PTR_NOT_NULL(strstr(paths[0], "/40-a"));
	CU_ASSERT_PTR_NOT_NULL(strstr(paths[1], "/50-b"));
	CU_ASSERT_PTR_NOT_NULL(strstr(paths[2], "/70-c"));
	CU_ASSERT_PTR_NOT_NULL(strstr(paths[3], "/80-link"));
	snapkvd_hooks_list_free(paths, n);

	/* The count limit keeps the first ones by name and says how many it left. */
	cfg.max_hooks = 2;
	CU_ASSERT_EQUAL_FATAL(snapkvd_hooks_list(&cfg, &paths, &n, &skipped), 0);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_EQUAL(skipped, 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(paths[1], "/50-b"));
	snapkvd_hooks_list_free(paths, n);

	cfg.dir = "/nonexistent/hooks.d";
	CU_ASSERT_EQUAL(snapkvd_hooks_list(&cfg, &paths, &n, &skipped), -ENOENT);
	cfg.dir = NULL;
	CU_ASSERT_EQUAL(snapkvd_hooks_list(&cfg, &paths, &n, &skipped), 0);
	CU_ASSERT_EQUAL(n, 0);
}

static void test_output_bound(void)
{
	struct snapkvd_hooks_config cfg;
	struct snapkvd_hook *h = NULL;
	struct snapkvd_hook_result res;
	char path[512];

	clean_dir();
	default_cfg(&cfg);
	cfg.max_output = 1000;
	/* 200000 bytes: more than a pipe holds, so the reader must keep draining. */
	write_file("60-loud", "#!/bin/sh\nhead -c 200000 /dev/zero | tr '\\0' x\n", 0755);
	snprintf(path, sizeof(path), "%s/60-loud", tmpdir);
	CU_ASSERT_EQUAL_FATAL(snapkvd_hook_spawn(path, &ev, &cfg, 0, &h), 0);
	CU_ASSERT_EQUAL(snapkvd_hook_wait(h, &res), 0);
	CU_ASSERT_EQUAL(res.exited, 1);
	CU_ASSERT_EQUAL(res.status, 0);
	CU_ASSERT_EQUAL(res.output_len, 1000);
	CU_ASSERT_EQUAL(res.output_dropped, 199000);
	CU_ASSERT_EQUAL(strlen(res.output), 1000);
	snapkvd_hook_free(h);
}

static void test_nonblocking_run(void)
{
	struct snapkvd_hooks_config cfg;
	struct snapkvd_hook **hooks = NULL;
	struct snapkvd_hook_result res;
	size_t failed = 99;
	int n;

	clean_dir();
	default_cfg(&cfg);
	write_file("10-hang", "#!/bin/sh\nexec sleep 300\n", 0755);
	write_file("20-quick", "#!/bin/sh\necho \"$SNAPKV_LEVEL\"\n", 0755);
	write_file("30-noexec", "#!/bin/sh\necho never\n", 0644);
	n = snapkvd_hooks_run(&cfg, &ev, 0, &hooks, &failed);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT_EQUAL(failed, 0);
	/* The quick one completes while the hanging one is still running. */
	CU_ASSERT_EQUAL(snapkvd_hook_wait(hooks[1], &res), 0);
	CU_ASSERT_STRING_EQUAL(res.output, "critical\n");
	CU_ASSERT_EQUAL(snapkvd_hook_reap(hooks[0], &res), -EAGAIN);
	CU_ASSERT_EQUAL(snapkvd_hook_check_timeout(hooks[0], 0), 0);
	/* The loop's timer fires past the deadline: killed, then reaped. */
	CU_ASSERT_EQUAL(snapkvd_hook_check_timeout(hooks[0], snapkvd_hook_deadline_ns(hooks[0])),
			1);
	CU_ASSERT_EQUAL(snapkvd_hook_wait(hooks[0], &res), 0);
	CU_ASSERT_EQUAL(res.timed_out, 1);
	CU_ASSERT_EQUAL(res.status, SIGKILL);
	snapkvd_hooks_free(hooks, (size_t)n);

	/* Freeing a running hook kills and reaps it: no zombie, no leaked fd. */
	n = snapkvd_hooks_run(&cfg, &ev, 0, &hooks, &failed);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	{
		pid_t pid = snapkvd_hook_pid(hooks[0]);
		int fd = snapkvd_hook_pidfd(hooks[0]);

		snapkvd_hooks_free(hooks, (size_t)n);
		CU_ASSERT_EQUAL(kill(pid, 0), -1);
		CU_ASSERT_EQUAL(fcntl(fd, F_GETFD), -1);
	}
}

int main(void)
{
	CU_pSuite s;
	unsigned fails;
	char cmd[400];

	snprintf(tmpdir, sizeof(tmpdir), "%s/snapkvd-hooks-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmpdir))
		return 2;
	if (CU_initialize_registry() != CUE_SUCCESS)
		return 2;
	s = CU_add_suite("hooks", NULL, NULL);
	CU_add_test(s, "environment seen by a hook", test_environment);
	CU_add_test(s, "timeout kills the hook and its children", test_timeout_kill);
	CU_add_test(s, "failing hook", test_failing_hook);
	CU_add_test(s, "non-executables and dot-files skipped, limit", test_listing_skips);
	CU_add_test(s, "output bounded", test_output_bound);
	CU_add_test(s, "hooks run without blocking", test_nonblocking_run);
	CU_basic_set_mode(CU_BRM_VERBOSE);
	CU_basic_run_tests();
	fails = CU_get_number_of_failures();
	CU_cleanup_registry();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fails++;
	return fails ? 1 : 0;
}
