# SPDX-License-Identifier: MIT
"""bench_compact: the time of one client.compact() call from Python, for the
request build/bench-compact-c makes from C (2 layers, H_q 4, H_kv 2, L 128,
D 32, W 16, C 32, f32, HND, group), median over N calls (argv[1], 2000), to
$SNAPKV_SOCKET; then runs the C program and prints the difference."""
import os
import subprocess
import sys
import time

import torch

import snapkv

LAYERS, HQ, HKV, L, D, W, C = 2, 4, 2, 128, 32, 16, 32


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with snapkv.Client(name="bench-compact-py") as cl:
        kv = cl.empty((LAYERS, 2, HKV, L, D), torch.float32)
        q = cl.empty((LAYERS, HQ, W, D), torch.float32)
        kv.uniform_(-0.5, 0.5)
        q.uniform_(-0.5, 0.5)
        qs, ks, vs = list(q), [kv[l, 0] for l in range(LAYERS)], [kv[l, 1] for l in range(LAYERS)]
        t = []
        for i in range(-(n // 10), n):
            t0 = time.perf_counter()
            c = cl.compact(qs, ks, vs, window=W, capacity=C, gqa="group")
            t1 = time.perf_counter()
            c.release()
            if i >= 0:
                t.append((t1 - t0) * 1e6)
    t.sort()
    py = t[n // 2]
    print(f"Python compact: median {py:.1f} us (p10 {t[n // 10]:.1f}, p90 {t[n * 9 // 10]:.1f})"
          f" over {n} calls")
    cprog = os.path.join(os.environ.get("BUILD", "build"), "bench-compact-c")
    out = subprocess.run([cprog, str(n)], capture_output=True, text=True, check=True).stdout
    print(out.strip())
    c_med = float(out.split("median ")[1].split(" ")[0])
    print(f"the Python call adds {py - c_med:.1f} us to the C call (median vs median)")


if __name__ == "__main__":
    main()
