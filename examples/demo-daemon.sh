#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The daemon demo: start snapkvd (host backend) on a temporary socket, run two
# example engines at once against it, print `snapkvctl ledger` while both
# hold their compact caches, then stop the daemon with SIGTERM and check
# that it exits 0.
set -euo pipefail
BUILD=${BUILD:-build}
tmp=$(mktemp -d /tmp/snapkvd-demo-XXXXXX)
sock=$tmp/snapkvd.sock
daemon_pid=
cleanup() {
	[ -n "$daemon_pid" ] && kill -KILL "$daemon_pid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

echo "== snapkvd --socket $sock --backend host --pool-bytes 256M"
"$BUILD/snapkvd" --socket "$sock" --backend host --pool-bytes 256M --threads 2 \
	--log-level notice &
daemon_pid=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.02; done
[ -S "$sock" ] || { echo "demo: snapkvd did not start" >&2; exit 1; }

echo "== two engines at once: llama-a reads a Llama-3-8B-shaped prefill dump (4 layers,"
echo "   H_q 32, H_kv 8, D 128, L 2048, bf16, planted attention spans); llama-b generates"
echo "   its own K/V"
"$BUILD/examples/gen-layer" "$tmp/prefill.safetensors" --layers 4 --len 2048 --quiet
"$BUILD/snapkv-engine" --socket "$sock" --name llama-a --in "$tmp/prefill.safetensors" \
	--window 32 --capacity 256 --decode 48 --reserve 16 --gqa group \
	--hold-until "$tmp/go" >"$tmp/a.out" &
a=$!
"$BUILD/snapkv-engine" --socket "$sock" --name llama-b --layers 4 --h-q 8 --h-kv 8 \
	--head-dim 64 --prompt 1024 --window 16 --capacity 128 --decode 32 --reserve 32 \
	--gqa expand --seed 2 --hold-until "$tmp/go" >"$tmp/b.out" &
b=$!
for _ in $(seq 500); do
	[ -s "$tmp/a.out" ] && [ -s "$tmp/b.out" ] && break
	sleep 0.02
done
cat "$tmp/a.out" "$tmp/b.out"

echo "== snapkvctl ledger"
SNAPKV_SOCKET=$sock "$BUILD/snapkvctl" ledger
touch "$tmp/go"
wait "$a"
wait "$b"

echo "== SIGTERM"
kill -TERM "$daemon_pid"
set +e
wait "$daemon_pid"
rc=$?
set -e
daemon_pid=
[ "$rc" -eq 0 ] || { echo "demo: snapkvd exited $rc" >&2; exit 1; }
echo "demo: snapkvd stopped cleanly (exit 0)"
