// SPDX-License-Identifier: MIT
/*
 * bench-ring - control-plane round trip of a no-op request to snapkvd:
 * over the shared-memory ring while the daemon polls, over the ring when the
 * daemon has gone to sleep (doorbell eventfd), and over the Unix socket
 * (protobuf frame both ways). Prints p50/p99 side by side and whether the
 * target (polling ring p50 <= socket p50 / 10) is met.
 *
 *   bench-ring [N]        (starts its own snapkvd from $BUILD, default build/)
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "snapkv.h"

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

struct res {
	double p50, p99;
};

static struct res stats(uint64_t *v, int n)
{
	qsort(v, n, sizeof(*v), cmp);
	return (struct res){v[n / 2] / 1000.0, v[(int)(n * 0.99)] / 1000.0};
}

int main(int argc, char **argv)
{
	const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
	int n = argc > 1 ? atoi(argv[1]) : 20000, n_sleep = n / 40 > 50 ? n / 40 : 50;
	char dir[] = "/tmp/bench-ring-XXXXXX", sock[128], bin[512];
	struct skv_client_opts o = {.opts_size = sizeof(o), .name = "bench-ring", .spin_us = 200};
	struct skv_client *c = NULL;
	uint64_t *t = calloc(n > n_sleep ? n : n_sleep, sizeof(uint64_t));
	struct res poll_r, sleep_r, sock_r;
	pid_t pid;
	int st, r;

	if (!mkdtemp(dir) || !t)
		return 1;
	snprintf(sock, sizeof(sock), "%s/s.sock", dir);
	snprintf(bin, sizeof(bin), "%s/snapkvd", build);
	pid = fork();
	if (pid == 0) {
		execl(bin, bin, "--socket", sock, "--threads", "1", "--log-level", "warning",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500 && skv_client_connect(sock, &o, &c) < 0; i++)
		usleep(10000);
	if (!c) {
		fprintf(stderr, "bench-ring: cannot start %s\n", bin);
		kill(pid, SIGKILL);
		return 1;
	}
	for (int i = 0; i < 2000; i++) /* warm up both paths */
		if (skv_client_nop(c) < 0 || skv_client_nop_socket(c) < 0)
			return 1;
	/* ring, daemon polling: back to back, it never sleeps */
	for (int i = 0; i < n; i++) {
		uint64_t t0 = now_ns();
		r = skv_client_nop(c);
		t[i] = now_ns() - t0;
		if (r < 0)
			return 1;
	}
	poll_r = stats(t, n);
	/* ring, daemon asleep: idle past its spin window before each request */
	for (int i = 0; i < n_sleep; i++) {
		usleep(2000);
		uint64_t t0 = now_ns();
		r = skv_client_nop(c);
		t[i] = now_ns() - t0;
		if (r < 0)
			return 1;
	}
	sleep_r = stats(t, n_sleep);
	/* Unix socket: the same no-op as a framed protobuf request/response */
	for (int i = 0; i < n; i++) {
		uint64_t t0 = now_ns();
		r = skv_client_nop_socket(c);
		t[i] = now_ns() - t0;
		if (r < 0)
			return 1;
	}
	sock_r = stats(t, n);
	skv_client_close(c);
	kill(pid, SIGTERM);
	waitpid(pid, &st, 0);
	unlink(sock);
	rmdir(dir);

	printf("no-op round trip to snapkvd (us), %d requests (%d asleep)\n", n, n_sleep);
	printf("  %-24s %10s %10s\n", "path", "p50", "p99");
	printf("  %-24s %10.2f %10.2f\n", "ring, daemon polling", poll_r.p50, poll_r.p99);
	printf("  %-24s %10.2f %10.2f\n", "ring, daemon asleep", sleep_r.p50, sleep_r.p99);
	printf("  %-24s %10.2f %10.2f\n", "unix socket", sock_r.p50, sock_r.p99);
	printf("  polling ring p50 = 1/%.1f of the socket p50: target 1/10 %s\n",
	       sock_r.p50 / poll_r.p50, poll_r.p50 * 10 <= sock_r.p50 ? "met" : "NOT met");
	free(t);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
