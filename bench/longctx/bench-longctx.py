#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""bench-longctx: passkey retrieval on SmolLM2-135M-Instruct through snapkvd.

For each length and seed, a prompt from make-prompt.py (a 5-digit key at a
seeded depth of varied licence text, asked at the end); for each observation
window, tiny-llama prefills it with full attention, compacts it through a
private snapkvd (snapkv, uniform, expand, C = each of --keeps % of the prompt) and
decodes greedily from the compact cache and, in lockstep, from the full one
(--compare). A run is correct when the answer holds the key. Reported per
length and window: full-cache and compact accuracy, and the compaction's
time (COMPACT's round trip) against the prefill's, the TTFT overhead.

Each prompt is prefilled once: tiny-llama compacts it with the first
window and budget (-W, -C; --compare decodes the full cache beside it), then
once more per further window and budget from the same prefill
(--also-window W/N%).
"""
import argparse
import json
import math
import os
import re
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def est_seconds(L, nw):
    # one prompt on 2 loaded cores (December 2026): model load and two lanes
    # of 12 decode steps ~5 s, ~3 s per further window, prefill ~9 ms/token
    # at 1K, growing with L
    return 5 + 3 * (nw - 1) + L * 0.009 * (1 + L / 4096)


def wilson(k, n, z=1.96):
    """95 % Wilson score interval of k successes in n, in percent."""
    if n == 0:
        return (0.0, 100.0)
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (100 * max(0.0, c - h), 100 * min(1.0, c + h))


def parse_variant(v):
    """W/N%[/kK][/sS][/group] -> (W, keep %, kernel or None, span or None[, "group"])."""
    parts = v.split("/")
    w, k, ker, sp, g = parts[0], None, None, None, None
    for x in parts[1:]:
        if x in ("group", "expand"):
            g = x
        elif x.endswith("%"):
            k = int(x[:-1])
        elif x[0] == "k":
            ker = int(x[1:])
        elif x[0] == "s":
            sp = int(x[1:])
        else:
            sys.exit("bench-longctx: bad variant " + v)
    if k is None:
        sys.exit("bench-longctx: variant %s needs a keep %%" % v)
    return (w, k, ker, sp) + ((g,) if g else ())


def vname(v):
    w, k, ker, sp = v[:4]
    return "W %s, k %s, span %s%s" % (w, 5 if ker is None else ker, 0 if sp is None else sp,
                                      ", " + v[4] if len(v) > 4 else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--build", default="build")
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--windows", default="8,question,64")
    ap.add_argument("--keeps", default="10,20", help="percents of the prompt kept per head")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--variants",
                    help="W/N%%[/kK][/sS],..: each compaction's window, keep, pooling width "
                         "and span (replaces --windows x --keeps)")
    ap.add_argument("--keys", type=int, default=0,
                    help="multi-key: N door codes, one asked (make-prompt.py --keys)")
    ap.add_argument("--plain", action="store_true",
                    help="the prompt without its framing (make-prompt.py --plain)")
    ap.add_argument("--text", action="store_true",
                    help="natural text: licence text continued without the chat template; "
                         "per compaction the teacher-forced top-1 agreement and "
                         "KL(full || compact) over --steps tokens of the full cache's "
                         "greedy continuation")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--jsonl", help="append one line per prompt and compaction here")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.variants:
        variants = [parse_variant(v) for v in a.variants.split(",")]
    else:
        variants = [(w, int(k), None, None) for k in a.keeps.split(",")
                    for w in a.windows.split(",")]
    engine = os.path.join(a.build, "tiny-llama")
    daemon = os.path.join(a.build, "snapkvd")
    runs = [(L, s) for L in lengths for s in range(a.first_seed, a.first_seed + a.prompts)]
    est = sum(est_seconds(L, len(variants)) for L, _ in runs)
    print("bench-longctx: %d prompts (%s tokens x %d), each prefilled once and compacted "
          "%d ways (%s); estimated %.0f s on 2 loaded cores" %
          (len(runs), a.lengths, a.prompts, len(variants), "; ".join(map(vname, variants)),
           est), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench-longctx: terminated"))
    tmp = tempfile.mkdtemp(prefix="bench-longctx.")
    sock = os.path.join(tmp, "snapkvd.sock")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    d = subprocess.Popen([daemon, "--socket", sock, "--threads", "1", "--log-level", "warning"],
                         stderr=open(os.path.join(tmp, "daemon.log"), "w"))
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        else:
            sys.exit("bench-longctx: snapkvd did not start")
        res = {}
        t_start = time.time()
        for L, seed in runs:
            pdir = os.path.join(tmp, "p%d-%d" % (L, seed))
            subprocess.run([sys.executable, os.path.join(HERE, "make-prompt.py"), "--seed",
                            str(L * 1000 + seed), "--tokens", str(L), "--out", pdir,
                            "--engine", engine, "--model", a.model] +
                           (["--keys", str(a.keys)] if a.keys else []) +
                           (["--plain"] if a.plain else []) +
                           (["--text"] if a.text else []),
                           check=True)
            key = open(os.path.join(pdir, "key.txt")).read().strip()
            q = open(os.path.join(pdir, "question.txt")).read().strip()
            v0 = variants[0]
            cmd = [engine, "-m", a.model, "--socket", sock, "-f", os.path.join(pdir, "doc.txt")]
            cmd += [] if a.text else ["--question", q]
            cmd += ["-n", str(a.steps), "--policy", "snapkv", "-C",
                   "%d%%" % v0[1], "-W", v0[0], "--compare", "--reserve", "16"]
            if v0[2] is not None:
                cmd += ["-k", str(v0[2])]
            if v0[3] is not None:
                cmd += ["--span", str(v0[3])]
            if len(v0) > 4:
                cmd += ["--gqa", v0[4]]
            if len(variants) > 1:
                cmd += ["--also-window", ",".join(
                    "%s/%d%%" % v[:2] + ("/k%d" % v[2] if v[2] is not None else "") +
                    ("/s%d" % v[3] if v[3] is not None else "") +
                    ("/" + v[4] if len(v) > 4 else "") for v in variants[1:])]
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if p.returncode != 0:
                sys.exit("bench-longctx: %s failed:\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))
            out = p.stdout.splitlines()
            full = out[out.index("--- full cache:") + 1] if "--- full cache:" in out else ""
            m = re.search(r"timing: prefill (\d+) tokens ([\d.]+) ms, compaction ([\d.]+) ms "
                          r"\(C (\d+), W (\d+)\)", p.stderr)
            if not m:
                sys.exit("bench-longctx: no timing line:\n" + p.stderr)
            Lt, pre = int(m.group(1)), float(m.group(2))
            tf0 = re.search(r"--- teacher-forced on the full text: (\d+) of (\d+) next-token "
                            r"predictions agree, mean KL\(full \|\| compact\) ([\d.]+)",
                            p.stdout)
            got = [(variants[0], int(m.group(5)), int(m.group(4)), float(m.group(3)),
                    out[0] if out else "",
                    (int(tf0.group(1)), int(tf0.group(2)), float(tf0.group(3))) if tf0 else None)]
            also = [re.match(r"--- window (\d+) \(C (\d+), compaction ([\d.]+) ms"
                             r"(?:, teacher-forced (\d+)/(\d+), KL ([\d.]+))?\): (.*)", l)
                    for l in out if l.startswith("--- window ")]
            for v, mm in zip(variants[1:], also):
                got.append((v, int(mm.group(1)), int(mm.group(2)), float(mm.group(3)),
                            mm.group(7),
                            (int(mm.group(4)), int(mm.group(5)), float(mm.group(6)))
                            if mm.group(4) else None))
            if len(got) != len(variants):
                sys.exit("bench-longctx: %d of %d compactions reported:\n%s" %
                         (len(got), len(variants), p.stdout))
            for v, wv, C, cms, text, tf in got:
                if a.jsonl:
                    with open(a.jsonl, "a") as jf:
                        jf.write(json.dumps({"L": L, "Lt": Lt, "seed": seed, "variant": list(v),
                                             "W": wv, "C": C, "key": key,
                                             "full": key in full, "compact": key in text,
                                             "prefill_ms": pre, "compact_ms": cms,
                                             "tf": tf,
                                             "text": text.strip()[:40]}) + "\n")
                w, k = v[0], v[1]
                r = res.setdefault((L,) + tuple(v), {"full": 0, "compact": 0, "n": 0, "pre": [],
                                            "cmp": [], "L": [], "C": [], "W": []})
                r["n"] += 1
                r.setdefault("kl", []).append(tf[2] if tf else float("nan"))
                r.setdefault("agree", []).append(tf[0] / tf[1] if tf else float("nan"))
                r["full"] += key in full
                r["compact"] += key in text
                r["L"].append(Lt)
                r["pre"].append(pre)
                r["cmp"].append(cms)
                r["C"].append(C)
                r["W"].append(wv)
                print("  L %d seed %d C %d %% %s (W %d): key %s | full: %s | compact: %s | "
                      "prefill %.0f ms, compaction %.1f ms" %
                      (Lt, seed, k, vname(v), wv, key, full.strip()[:24], text.strip()[:24],
                       pre, cms), flush=True)
        print("\nbench-longctx: %.0f s (estimated %.0f s)\n" % (time.time() - t_start, est))
        if a.text:
            print("| L (tokens) | kept | W | k | span | C (per head) | texts | teacher-forced "
                  "top-1 | KL(full || compact), mean ± s.e. over texts |")
            print("|---|---|---|---|---|---|---|---|---|")
            for (L, w, k, ker, sp, *_), r in sorted(res.items(),
                                                    key=lambda x: (x[0][0], -x[0][2])):
                kl = r["kl"]
                se = statistics.stdev(kl) / math.sqrt(len(kl)) if len(kl) > 1 else float("nan")
                print("| %d-%d | %d %% | %s | %s | %s | %d-%d | %d | %.1f %% | %.4f ± %.4f |" % (
                    min(r["L"]), max(r["L"]), k, w, 5 if ker is None else ker,
                    0 if sp is None else sp, min(r["C"]), max(r["C"]), r["n"],
                    100 * statistics.mean(r["agree"]), statistics.mean(kl), se))
            return
        print("| L (tokens) | kept | W | k | span | C (per head) | prompts | full cache | "
              "snapkv (95 % interval) | prefill ms | compaction ms | compaction / prefill |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for (L, w, k, ker, sp, *_), r in sorted(res.items(), key=lambda x: (x[0][0], -x[0][2])):
            pre, cmpt = statistics.median(r["pre"]), statistics.median(r["cmp"])
            wv = "question (%d-%d)" % (min(r["W"]), max(r["W"])) if w == "question" else w
            lo, hi = wilson(r["compact"], r["n"])
            print("| %d-%d | %d %% | %s | %s | %s | %d-%d | %d | %d/%d | %d/%d (%.0f-%.0f %%) | "
                  "%.0f | %.1f | %.2f %% |" % (
                      min(r["L"]), max(r["L"]), k, wv, 5 if ker is None else ker,
                      0 if sp is None else sp, min(r["C"]), max(r["C"]), r["n"], r["full"],
                      r["n"], r["compact"], r["n"], lo, hi, pre, cmpt, 100 * cmpt / pre))
    finally:
        d.terminate()
        d.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
