#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench-compact.sh: one compact call from Python (the snapkv module) vs from C
# (libsnapkv) for the same small request, medians of N calls each, against a
# private snapkvd (make bench).
set -u
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
N=${BENCH_COMPACT_N:-2000}
ls "$BUILD"/python/snapkv*.so >/dev/null 2>&1 || { echo "bench-compact: module not built"; exit 0; }
dir=$(mktemp -d /tmp/bench-compact.XXXXXX)
"$BUILD/snapkvd" --socket "$dir/s.sock" --threads 1 --log-level warning 2>"$dir/log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
SNAPKV_SOCKET=$dir/s.sock BUILD=$BUILD PYTHONPATH=$BUILD/python PYTHONDONTWRITEBYTECODE=1 \
	"$PYTHON" "$(dirname "$0")/bench_compact.py" "$N"
