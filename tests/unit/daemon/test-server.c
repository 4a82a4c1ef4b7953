// SPDX-License-Identifier: MIT
/*
 * test-server: the daemon built and torn down (daemon/snapkvd-server.c)
 * without serving: the socket bound and unlinked again, the workers and
 * the pool as configured; a SIGHUP reload applying the file's limits,
 * keeping the keys that need a restart and naming each in the log, keeping
 * everything when the file is bad (the file, line and reason logged), and
 * saying so when there is no file; a server that cannot listen torn down
 * half-built. The log is read back from a memfd.
 */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "daemon/snapkvd-server.c"
#include "tests/test-skip.h"

static char dir[64], sock[96], conf[96];
static int logfd = -1, saved = -1;

/* What was logged since the last call. */
static char *logged(void)
{
	static char buf[16384];
	off_t n = lseek(logfd, 0, SEEK_CUR);

	if (n < 0 || n >= (off_t)sizeof(buf) || pread(logfd, buf, n, 0) != n)
		return strcpy(buf, "(unreadable)");
	buf[n] = 0;
	(void)!ftruncate(logfd, 0);
	lseek(logfd, 0, SEEK_SET);
	return buf;
}

static int setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/test-server-XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	snprintf(conf, sizeof(conf), "%s/snapkvd.conf", dir);
	unsetenv("LISTEN_FDS");
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	logfd = memfd_create("test-server-log", MFD_CLOEXEC);
	saved = dup(STDERR_FILENO);
	return logfd < 0 || saved < 0 || dup2(logfd, STDERR_FILENO) < 0;
}

static int cleanup(void)
{
	dup2(saved, STDERR_FILENO);
	close(saved);
	close(logfd);
	unlink(conf);
	rmdir(dir);
	return 0;
}

static void write_conf(const char *text)
{
	FILE *f = fopen(conf, "w");

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fputs(text, f);
	fclose(f);
}

static struct snapkvd_server *start(const char *path)
{
	struct snapkvd_config cfg;
	struct snapkvd_server *srv = NULL;

	snapkvd_config_defaults(&cfg);
	snprintf(cfg.socket_path, sizeof(cfg.socket_path), "%s", sock);
	cfg.threads = 2;
	cfg.workers = 1;
	cfg.pool_bytes = 64ull << 20;
	cfg.log_level = SNAPKVD_LOG_INFO;
	CU_ASSERT_EQUAL(snapkvd_server_new(&cfg, path, &srv), 0);
	return srv;
}

static void test_lifecycle(void)
{
	struct snapkvd_server *srv = start(NULL);
	struct stat st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	CU_ASSERT_EQUAL(lstat(sock, &st), 0);
	CU_ASSERT_TRUE(S_ISSOCK(st.st_mode));
	CU_ASSERT_EQUAL(snapkvd_compactor_workers(srv->compactor), 1);
	CU_ASSERT_EQUAL(snapkvd_compactor_threads(srv->compactor), 2);
	CU_ASSERT_EQUAL(snapkvd_pool_total(srv->pool), 64ull << 20);
	CU_ASSERT_PTR_NULL(srv->http); /* metrics_listen off by default */
	CU_ASSERT_PTR_NOT_NULL(strstr(logged(), "1 workers x 2 threads, pool 67108864 bytes"));
	/* SIGHUP without a file: said, nothing changed */
	reload(srv);
	CU_ASSERT_PTR_NOT_NULL(strstr(logged(), "SIGHUP: no config file to reload"));
	snapkvd_server_free(srv);
	CU_ASSERT_EQUAL(lstat(sock, &st), -1); /* unlinked */
	snapkvd_server_free(NULL);
}

static void test_reload(void)
{
	struct snapkvd_server *srv = start(conf);
	char *log;

	CU_ASSERT_PTR_NOT_NULL_FATAL(srv);
	logged();
	write_conf("pool_bytes = 128M\nthreads = 8\nsq_entries = 128\nmax_sessions = 7\n"
		   "arena_cache_bytes = 0\nlog_level = info\n");
	reload(srv);
	log = logged();
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "limits reloaded (pool 134217728 bytes)"));
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "SIGHUP: threads changed in "));
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "SIGHUP: sq_entries changed in "));
	CU_ASSERT_PTR_NULL(strstr(log, "pool_bytes changed"));
	CU_ASSERT_PTR_NULL(strstr(log, "workers changed")); /* not in the file: unchanged */
	/* the limits applied, to the config and to the objects holding them */
	CU_ASSERT_EQUAL(srv->cfg.pool_bytes, 128ull << 20);
	CU_ASSERT_EQUAL(snapkvd_pool_total(srv->pool), 128ull << 20);
	CU_ASSERT_EQUAL(srv->cfg.max_sessions, 7);
	CU_ASSERT_EQUAL(srv->arenas.limit, 0);
	/* the restart keys as they run */
	CU_ASSERT_EQUAL(srv->cfg.threads, 2);
	CU_ASSERT_EQUAL(srv->cfg.sq_entries, 64);
	CU_ASSERT_STRING_EQUAL(srv->cfg.socket_path, sock);
	/* a bad file: everything kept, the file, line and reason said */
	write_conf("pool_bytes = 256M\nmax_sessions = many\n");
	reload(srv);
	log = logged();
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "SIGHUP: keeping the old limits: "));
	CU_ASSERT_PTR_NOT_NULL(strstr(log, "snapkvd.conf: line 2: max_sessions: not an integer"));
	CU_ASSERT_EQUAL(srv->cfg.pool_bytes, 128ull << 20);
	CU_ASSERT_EQUAL(srv->cfg.max_sessions, 7);
	snapkvd_server_free(srv);
}

/* A socket path in a missing directory: refused, the half-built server freed. */
static void test_cannot_listen(void)
{
	struct snapkvd_config cfg;
	struct snapkvd_server *srv = NULL;

	snapkvd_config_defaults(&cfg);
	snprintf(cfg.socket_path, sizeof(cfg.socket_path), "%s/no/such/s.sock", dir);
	cfg.threads = 1;
	CU_ASSERT_EQUAL(snapkvd_server_new(&cfg, NULL, &srv), -ENOENT);
	CU_ASSERT_PTR_NULL(srv);
	CU_ASSERT_PTR_NOT_NULL(strstr(logged(), "Failed to listen on "));
}

int main(void)
{
	CU_pSuite su;

	if (CU_initialize_registry() != CUE_SUCCESS)
		return 1;
	su = CU_add_suite("server", setup, cleanup);
	CU_add_test(su, "built and torn down", test_lifecycle);
	CU_add_test(su, "SIGHUP: limits applied, restart keys kept and named", test_reload);
	CU_add_test(su, "cannot listen: torn down half-built", test_cannot_listen);
	return t_run();
}
