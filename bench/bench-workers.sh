#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench-workers: two engines at once against one snapkvd, per worker count.
# Engine A compacts a large request (h2o over L = 4096, 3 layers) in a loop;
# engine B compacts a small one (L = 256, 1 layer) N times meanwhile. Prints
# B's latency (p50, best, worst: snapkvctl's wall time, process start and
# file I/O included) and A's mean, for each `--workers` given.
# usage: bench/bench-workers.sh [N] [WORKERS...]   (default 20 runs, 1 2)
set -euo pipefail
BUILD=${BUILD:-build}
CTL=$BUILD/snapkvctl
n=${1:-20}
shift || true
ws=("$@")
[ ${#ws[@]} -gt 0 ] || ws=(1 2)
tmp=$(mktemp -d /tmp/bench-workers-XXXXXX)
dpid=
apid=
trap '[ -n "$apid" ] && kill "$apid" 2>/dev/null; [ -n "$dpid" ] && kill -KILL "$dpid" 2>/dev/null; rm -rf "$tmp"' EXIT
"$BUILD/examples/gen-layer" "$tmp/big.st" --quiet --layers 3 --len 4096 --rows 4096 --h-q 8 \
	--h-kv 2 --head-dim 64
"$BUILD/examples/gen-layer" "$tmp/small.st" --quiet --layers 1 --len 256 --h-q 8 --h-kv 2 \
	--head-dim 32
export SNAPKV_SOCKET=$tmp/s.sock
ms() { echo $(($(date +%s%N) / 1000)); }
for w in "${ws[@]}"; do
	"$BUILD/snapkvd" --socket "$SNAPKV_SOCKET" --threads 2 --workers "$w" --log-level warning &
	dpid=$!
	for _ in $(seq 500); do "$CTL" status >/dev/null 2>&1 && break; sleep 0.01; done
	# engine A: large requests back to back, each one's time in a.txt
	(while :; do
		t0=$(ms)
		"$CTL" compact "$tmp/big.st" "$tmp/b.st" -q --policy h2o --capacity 256
		echo $(($(ms) - t0)) >>"$tmp/a$w.txt"
	done) &
	apid=$!
	sleep 1
	for _ in $(seq "$n"); do
		t0=$(ms)
		"$CTL" compact "$tmp/small.st" "$tmp/s.st" -q --capacity 64
		echo $(($(ms) - t0)) >>"$tmp/b$w.txt"
		sleep 0.0$((RANDOM % 10))
	done
	kill "$apid"
	wait "$apid" 2>/dev/null || true
	apid=
	kill -TERM "$dpid"
	wait "$dpid" || true
	dpid=
	python3 - "$w" "$tmp/b$w.txt" "$tmp/a$w.txt" <<'PY'
import statistics, sys
w, b, a = sys.argv[1], [int(x) / 1000 for x in open(sys.argv[2])], [int(x) / 1000 for x in open(sys.argv[3])]
print(f"workers={w}: small p50 {statistics.median(b):.1f} ms, best {min(b):.1f}, worst {max(b):.1f} "
      f"({len(b)} runs); large mean {statistics.mean(a):.1f} ms ({len(a)} runs)")
PY
done
