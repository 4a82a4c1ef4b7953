#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Tables from bench-longctx.py --jsonl records (one or more files, runs
that were stopped part-way included: every prompt a record covers counts).

    summarize.py pk2048.jsonl pk4096.jsonl [--text]

Passkey and multi-key: per length and kept fraction, the full cache and
each way of compacting, correct / prompts with a 95 % Wilson interval.
--text: teacher-forced top-1 agreement and KL(full || compact), mean and
standard error over the texts, and paired against the first method.
"""
import argparse
import json
import math
import statistics
import sys


def wilson(k, n, z=1.96):
    if n == 0:
        return (0.0, 100.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (100 * max(0.0, c - h), 100 * min(1.0, c + h))


def method(v):
    w, _, ker, sp = v[:4]
    ker = 5 if ker is None else ker
    sp = 0 if sp is None else sp
    name = "span +-%d" % sp if sp else ("pool k%d" % ker if ker > 1 else "top-k (none)")
    if sp and ker > 1:
        name += " k%d" % ker
    return name + ("" if w == "8" else ", W %s" % w) + (", " + v[4] if len(v) > 4 else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--text", action="store_true")
    a = ap.parse_args()
    recs = []
    for f in a.files:
        with open(f) as fh:
            recs += [json.loads(l) for l in fh if l.strip()]
    if not recs:
        sys.exit("summarize: no records")
    cells, full, order = {}, {}, []
    for r in recs:
        v = tuple(r["variant"])
        m = method(v)
        if m not in order:
            order.append(m)
        key = (r["L"], v[1])
        cells.setdefault(key, {}).setdefault(m, []).append(r)
        full.setdefault(r["L"], {})[r["seed"]] = r["full"]
    if a.text:
        print("| L | kept | method | texts | top-1 | KL mean ± s.e. | KL - %s, paired mean ± s.e. |"
              % order[0])
        print("|---|---|---|---|---|---|---|")
        for key in sorted(cells, key=lambda k: (k[0], -k[1])):
            base = {r["seed"]: r["tf"][2] for r in cells[key].get(order[0], []) if r["tf"]}
            for m in order:
                rs = [r for r in cells[key].get(m, []) if r["tf"]]
                if not rs:
                    continue
                kl = [r["tf"][2] for r in rs]
                ag = [r["tf"][0] / r["tf"][1] for r in rs]
                se = statistics.stdev(kl) / math.sqrt(len(kl)) if len(kl) > 1 else float("nan")
                d = [r["tf"][2] - base[r["seed"]] for r in rs if r["seed"] in base]
                dse = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
                Ls = [r["Lt"] for r in rs]
                paired = "%+.4f ± %.4f" % (statistics.mean(d), dse) if len(d) > 1 else "-"
                print("| %d-%d | %d %% | %s | %d | %.1f %% | %.4f ± %.4f | %s |" % (
                    min(Ls), max(Ls), key[1], m, len(rs), 100 * statistics.mean(ag),
                    statistics.mean(kl), se, paired))
        return
    print("| L (tokens) | kept | full cache | " + " | ".join(order) + " |")
    print("|---|---|---|" + "---|" * len(order))
    for key in sorted(cells, key=lambda k: (k[0], -k[1])):
        seeds = {r["seed"] for m in cells[key] for r in cells[key][m]}
        fk = sum(full[key[0]][s] for s in seeds)
        lo, hi = wilson(fk, len(seeds))
        Ls = [r["Lt"] for m in cells[key] for r in cells[key][m]]
        row = ["%d-%d" % (min(Ls), max(Ls)), "%d %%" % key[1],
               "%d/%d (%.0f-%.0f)" % (fk, len(seeds), lo, hi)]
        for m in order:
            rs = cells[key].get(m, [])
            k = sum(r["compact"] for r in rs)
            lo, hi = wilson(k, len(rs))
            row.append("%d/%d (%.0f-%.0f)" % (k, len(rs), lo, hi) if rs else "-")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
