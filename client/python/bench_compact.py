# SPDX-License-Identifier: MIT
"""bench_compact: the time of one client.compact() call from Python, for the
request build/bench-compact-c makes from C (2 layers, H_q 4, H_kv 2, L 128,
D 32, W 16, C 32, f32, HND, group), median over N calls (argv[1], 2000), to
$SNAPKV_SOCKET, in rounds that alternate with the C program's, and prints
the difference of the medians."""
import os
import subprocess
import sys
import time

import torch

import snapkv

LAYERS, HQ, HKV, L, D, W, C = 2, 4, 2, 128, 32, 16, 32


def c_times(n):
    """The median of n calls of the C program."""
    cprog = os.path.join(os.environ.get("BUILD", "build"), "bench-compact-c")
    out = subprocess.run([cprog, str(n)], capture_output=True, text=True, check=True).stdout
    return float(out.split("median ")[1].split(" ")[0])


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = 40  # Python and C alternate, so that load on a shared machine hits both
    per = max(10, n // rounds)
    py_meds, c_meds = [], []
    with snapkv.Client(name="bench-compact-py") as cl:
        kv = cl.empty((LAYERS, 2, HKV, L, D), torch.float32)
        q = cl.empty((LAYERS, HQ, W, D), torch.float32)
        kv.uniform_(-0.5, 0.5)
        q.uniform_(-0.5, 0.5)
        qs, ks, vs = list(q), [kv[l, 0] for l in range(LAYERS)], [kv[l, 1] for l in range(LAYERS)]
        for _ in range(rounds):
            t = []
            for i in range(-(per // 10), per):
                t0 = time.perf_counter()
                c = cl.compact(qs, ks, vs, window=W, budget=C, gqa="group")
                t1 = time.perf_counter()
                c.release()
                if i >= 0:
                    t.append((t1 - t0) * 1e6)
            t.sort()
            py_meds.append(t[len(t) // 2])
            c_meds.append(c_times(per))
    py_meds.sort()
    c_meds.sort()
    diffs = sorted(p - c for p, c in zip(py_meds, c_meds))
    print(f"Python compact: median of {rounds} round medians {py_meds[rounds // 2]:.1f} us "
          f"({per} calls a round)")
    print(f"C compact:      median of {rounds} round medians {c_meds[rounds // 2]:.1f} us")
    # the paired difference of neighbouring rounds is what load on a shared
    # machine disturbs least
    print(f"the Python call adds {diffs[rounds // 2]:.1f} us to the C call (median of "
          f"{rounds} paired round differences; quartiles {diffs[rounds // 4]:.1f} .. "
          f"{diffs[rounds * 3 // 4]:.1f} us)")


if __name__ == "__main__":
    main()
