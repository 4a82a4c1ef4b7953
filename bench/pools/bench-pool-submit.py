#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Python cost of one submit for an 80-layer model (issue 20 point 4):
the per-request description (q, k, v lists: 3 x 80 tensors) against a
registered pool (one Pool, q as one [layers, H_q, n_q, D] tensor, the block
table as a list or as an int32 tensor in registered storage), and
submit_many of 8 sequences per call, and a pool submit while the daemon
is awake (no doorbell: the ring's cost without the wakeup of a sleeping
daemon, which the kernel charges to the caller). Only the submit() call is timed
(time.perf_counter around it); each request is then waited for and its
cache released outside the timing. Starts its own snapkvd (build tree).

usage: bench-pool-submit.py [--build DIR] [--iters N] [--layers N]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
ap.add_argument("--iters", type=int, default=200)
ap.add_argument("--layers", type=int, default=80)
args = ap.parse_args()
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, args.build)
sys.path.insert(0, os.path.join(BUILD, "python"))
import torch  # noqa: E402
import snapkv  # noqa: E402

LAYERS, H_Q, H_KV, D, BS, NB, L, NQ = args.layers, 16, 8, 64, 16, 64, 480, 32
P = dict(window=NQ, budget=128, gqa="group")

d = tempfile.mkdtemp(prefix="skv-bench-pool.")
sock = os.path.join(d, "snapkvd.sock")
daemon = subprocess.Popen([os.path.join(BUILD, "snapkvd"), "--socket", sock, "--threads", "1",
                           "--log-level", "warning"])
for _ in range(200):
    if os.path.exists(sock):
        break
    time.sleep(0.02)


def stats(xs):
    xs = sorted(xs)
    return statistics.median(xs) * 1e6, xs[int(len(xs) * 0.9)] * 1e6


try:
    with snapkv.Client(sock) as c:
        kv = c.empty((2, LAYERS, NB, BS, H_KV, D), torch.float16)
        kv.normal_()
        qb = c.empty((LAYERS, H_Q, NQ, D), torch.float16)
        qb.normal_()
        table = list(range(0, 2 * ((L + BS - 1) // BS), 2))
        tb = c.empty((len(table),), torch.float32).view(torch.int32)
        tb.copy_(torch.tensor(table, dtype=torch.int32))
        ks, vs, qs = list(kv[0]), list(kv[1]), list(qb)
        pool = c.register_pool(ks, vs)

        def run(submit):
            t, cpu = [], []
            for i in range(args.iters + 10):
                c0 = time.thread_time()
                t0 = time.perf_counter()
                r = submit()
                t1 = time.perf_counter()
                c1 = time.thread_time()
                for x in (r if isinstance(r, list) else [r]):
                    x.wait().release()
                if i >= 10:  # warm-up
                    t.append(t1 - t0)
                    cpu.append(c1 - c0)
            return t, cpu

        cases = [
            ("per-request q, k, v lists (before)",
             lambda: c.submit(qs, ks, vs, **P, block_table=table, prompt_len=L), 1),
            ("pool, q one tensor, table a list",
             lambda: c.submit(qb, pool=pool, **P, block_table=table, prompt_len=L), 1),
            ("pool, q one tensor, table in storage",
             lambda: c.submit(qb, pool=pool, **P, block_table=tb, prompt_len=L), 1),
            ("submit_many of 8 (pool, table in storage), per sequence",
             lambda: c.submit_many([dict(q=qb, pool=pool, **P, block_table=tb, prompt_len=L)]
                                   * 8), 8),
        ]
        print(f"{LAYERS} layers, H_q {H_Q}, H_kv {H_KV}, D {D}, f16, block {BS}, L {L}, "
              f"{args.iters} submits each; time of the submit() call only: wall "
              f"(perf_counter) and the calling thread's CPU (thread_time), per sequence")
        for name, fn, per in cases:
            wall, cpu = run(fn)
            med, p90 = stats(wall)
            cmed, cp90 = stats(cpu)
            print(f"  {name:56s} wall median {med / per:7.1f} us p90 {p90 / per:7.1f} us"
                  f" | cpu median {cmed / per:7.1f} us p90 {cp90 / per:7.1f} us")
        # the same submit while the daemon is awake (right after another, within
        # its poll_idle_us spin): no doorbell, so the call is Python and the ring
        t, cpu = [], []
        for i in range(args.iters + 10):
            r0 = c.submit(qb, pool=pool, **P, block_table=tb, prompt_len=L)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            r1 = c.submit(qb, pool=pool, **P, block_table=tb, prompt_len=L)
            t1 = time.perf_counter()
            c1 = time.thread_time()
            r0.wait().release()
            r1.wait().release()
            if i >= 10:
                t.append(t1 - t0)
                cpu.append(c1 - c0)
        med, p90 = stats(t)
        cmed, cp90 = stats(cpu)
        print(f"  {'pool, table in storage, daemon awake (no doorbell)':56s} wall median "
              f"{med:7.1f} us p90 {p90:7.1f} us | cpu median {cmed:7.1f} us p90 {cp90:7.1f} us")
        pool.unregister()
finally:
    daemon.terminate()
    daemon.wait()
