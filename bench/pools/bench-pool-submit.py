#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Python cost of one submit for an 80-layer model (issue 20 point 4): the
per-request description (q, k, v lists: 3 x 80 tensors) against a
registered pool (q as one [layers, H_q, n_q, D] tensor, or registered with
the pool and named by slot; the block table as a list or as an int32
tensor in registered storage), and submit_many.

Only the submit() call is timed: wall (perf_counter) and the calling
thread's CPU (thread_time). Two patterns: a burst (8 submits one after the
other, as an engine submits the sequences that finished prefill in a step;
then all are waited for) and isolated (one submit after the daemon has
finished the previous compaction and gone to sleep: the daemon's doorbell
and caches left cold by the compaction add to it). Starts its own snapkvd
from the build tree.

usage: bench-pool-submit.py [--build DIR] [--rounds N] [--layers N]
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
ap.add_argument("--rounds", type=int, default=40)
ap.add_argument("--layers", type=int, default=80)
args = ap.parse_args()
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, args.build)
sys.path.insert(0, os.path.join(BUILD, "python"))
import torch  # noqa: E402
import snapkv  # noqa: E402

LAYERS, H_Q, H_KV, D, BS, NB, L, NQ = args.layers, 16, 8, 64, 16, 64, 480, 32
P = dict(window=NQ, budget=128, gqa="group")
BURST = 8

d = tempfile.mkdtemp(prefix="skv-bench-pool.")
sock = os.path.join(d, "snapkvd.sock")
daemon = subprocess.Popen([os.path.join(BUILD, "snapkvd"), "--socket", sock, "--threads", "1",
                           "--log-level", "warning"])
for _ in range(200):
    if os.path.exists(sock):
        break
    time.sleep(0.02)


def med_p90(xs):
    xs = sorted(xs)
    return statistics.median(xs) * 1e6, xs[int(len(xs) * 0.9)] * 1e6


def timed(submit, burst, rounds):
    """rounds x (burst submits, each timed; then wait for all)."""
    wall, cpu = [], []
    for i in range(rounds + 2):
        reqs = []
        for _ in range(burst):
            c0, t0 = time.thread_time(), time.perf_counter()
            r = submit()
            t1, c1 = time.perf_counter(), time.thread_time()
            reqs.append(r)
            if i >= 2:  # warm-up rounds
                wall.append(t1 - t0)
                cpu.append(c1 - c0)
        for r in reqs:
            for x in (r if isinstance(r, list) else [r]):
                x.wait().release()
        del reqs
    return wall, cpu


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
        pool_q = c.register_pool(ks, vs, q=qb)  # the window's queries located once
        cases = [
            ("per-request q, k, v lists (before)",
             lambda: c.submit(qs, ks, vs, **P, block_table=table, prompt_len=L)),
            ("pool, q one tensor, table a list",
             lambda: c.submit(qb, pool=pool, **P, block_table=table, prompt_len=L)),
            ("pool, q one tensor, table in storage",
             lambda: c.submit(qb, pool=pool, **P, block_table=tb, prompt_len=L)),
            ("pool with q registered (q_slot), table in storage",
             lambda: c.submit(pool=pool_q, **P, block_table=tb, prompt_len=L)),
        ]
        print(f"{LAYERS} layers, H_q {H_Q}, H_kv {H_KV}, D {D}, f16, block {BS}, L {L}; "
              f"time of the submit() call, median and p90 in us, wall | thread CPU")
        for mode, burst, rounds in (("burst of 8", BURST, args.rounds),
                                    ("isolated", 1, args.rounds * 4)):
            print(f" {mode}:")
            for name, fn in cases:
                wall, cpu = timed(fn, burst, rounds)
                w, wp = med_p90(wall)
                u, up = med_p90(cpu)
                print(f"  {name:50s} {w:7.1f} {wp:7.1f} | {u:7.1f} {up:7.1f}")
        many = [dict(pool=pool_q, **P, block_table=tb, prompt_len=L)] * BURST
        wall, cpu = timed(lambda: c.submit_many(many), 1, args.rounds * 2)
        w, wp = med_p90(wall)
        u, up = med_p90(cpu)
        print(f" submit_many of {BURST} (pool, q_slot, table in storage), per sequence:")
        print(f"  {'':50s} {w / BURST:7.1f} {wp / BURST:7.1f} | {u / BURST:7.1f} "
              f"{up / BURST:7.1f}")
        pool.unregister()
        pool_q.unregister()
finally:
    daemon.terminate()
    daemon.wait()
