#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# snapkvd --backend cuda: where no NVIDIA driver is, it refuses to start with
# a clear message (exit 1); with the plugin built for the CPU emulator
# (tests/gpu/emu) it serves compactions whose positions and K/V are the
# bytes the host backend writes (`snapkvctl compact --offline`), masses
# within 1e-4, and stops cleanly. The daemon's GPU path minus the GPU.
# PLUGIN=build/libskv-cuda.so runs the same against a real GPU (run.sh).
# ok never fails, so `A && ok || not_ok` is an if-then-else here
# shellcheck disable=SC2015
set -u
BUILD=${BUILD:-build}
SNAPKVD=${SNAPKVD:-$BUILD/snapkvd} # tests/gpu/run.sh: snapkvd under compute-sanitizer
CTL=$BUILD/snapkvctl
GEN=$BUILD/examples/gen-layer
EMU=${PLUGIN:-$BUILD/tests/gpu/emu/libskv-cuda-emu.so}
. "$(dirname "$0")/../../tally.sh"
need_built "$SNAPKVD" "$CTL" "$GEN"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-daemon-cuda-emu.XXXXXX")
pid=
cleanup() {
	[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

echo "== refusals"
SKV_CUDA_PLUGIN=/nonexistent/libskv-cuda.so timeout 20 "$SNAPKVD" --socket "$tmp/a.sock" \
	--backend cuda 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "backend cuda: CUDA backend not available: /nonexistent" "$tmp/err" &&
	ok "plugin missing: exit 1, $(cat "$tmp/err")" || not_ok "plugin missing: rc $rc $(cat "$tmp/err")"
if [ -e "$BUILD/libskv-cuda.so" ] && ! ldconfig -p | grep -q 'libcuda\.so\.1'; then
	timeout 20 "$SNAPKVD" --socket "$tmp/a.sock" --backend cuda 2>"$tmp/err"
	rc=$?
	[ $rc -eq 1 ] && grep -q "backend cuda: no CUDA driver found: libcuda.so.1" "$tmp/err" &&
		ok "no driver: exit 1, $(cat "$tmp/err")" || not_ok "no driver: rc $rc $(cat "$tmp/err")"
fi
[ ! -e "$tmp/a.sock" ] && ok "no socket left behind" || not_ok "socket left behind"

if [ ! -e "$EMU" ]; then
	echo "test-daemon-cuda-emu: $pass passed, $fail failed"
	[ $fail -eq 0 ] || exit 1
	need_cuda "$EMU" # the refusals above ran; the rest needs the plugin
fi

SKV_CUDA_SCORE=bogus SKV_CUDA_PLUGIN=$(realpath "$EMU") timeout 20 "$SNAPKVD" \
	--socket "$tmp/b.sock" --backend cuda --pool-bytes 64M --threads 2 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "Failed to start the compactor: .*SKV_CUDA_SCORE" "$tmp/err" &&
	ok "bad SKV_CUDA_SCORE: exit 1, $(cat "$tmp/err")" ||
	not_ok "bad SKV_CUDA_SCORE: rc $rc $(cat "$tmp/err")"

# one worker stream: more workers asked for are refused by name, not clamped
SKV_CUDA_PLUGIN=$(realpath "$EMU") timeout 20 "$SNAPKVD" --socket "$tmp/b.sock" --backend cuda \
	--pool-bytes 64M --threads 2 --workers 3 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "workers = 3 is over the cuda backend's maximum of 1" "$tmp/err" &&
	ok "--workers 3: exit 1, $(cat "$tmp/err")" || not_ok "--workers 3: rc $rc $(cat "$tmp/err")"

echo "== serving from $(basename "$EMU")"
sock=$tmp/snapkvd.sock
SKV_CUDA_PLUGIN=$(realpath "$EMU") "$SNAPKVD" --socket "$sock" --backend cuda \
	--pool-bytes 64M --threads 2 --log-level info 2>"$tmp/daemon.log" &
pid=$!
for _ in $(seq 250); do
	[ -S "$sock" ] && break
	sleep 0.02
done
if [ ! -S "$sock" ]; then
	echo "snapkvd did not start: $(cat "$tmp/daemon.log")"
	exit 1
fi
grep -q "backend cuda (.*, memfd cuda host-mapped)" "$tmp/daemon.log" &&
	ok "started: $(grep -o 'backend cuda ([^)]*)' "$tmp/daemon.log")" ||
	not_ok "log does not name the device: $(cat "$tmp/daemon.log")"

# equal A B: every tensor byte-identical but retained_mass (|diff| <= 1e-4)
equal() {
	python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
if a.keys() != b.keys():
    sys.exit("tensor names differ")
for k in a:
    if k.endswith("retained_mass"):
        x = struct.unpack("<%df" % (len(a[k][1]) // 4), a[k][1])
        y = struct.unpack("<%df" % (len(b[k][1]) // 4), b[k][1])
        if any(not (abs(p - q) <= 1e-4 or (p != p and q != q)) for p, q in zip(x, y)):
            sys.exit("%s: %s vs %s" % (k, x, y))
    elif a[k] != b[k]:
        sys.exit("%s differs" % k)
PY
}

same() {
	local name=$1 in=$2
	shift 2
	rm -f "$tmp/on.st" "$tmp/off.st"
	if "$CTL" compact --socket "$sock" "$in" "$tmp/on.st" -q "$@" 2>"$tmp/err" &&
		"$CTL" compact --offline "$in" "$tmp/off.st" -q "$@" 2>>"$tmp/err" &&
		equal "$tmp/on.st" "$tmp/off.st" 2>>"$tmp/err"; then
		ok "$name: cuda == host"
	else
		not_ok "$name: $(cat "$tmp/err")"
	fi
}

seed=20
for dt in f32 f16 bf16; do
	for gqa in expand group; do
		seed=$((seed + 1))
		"$GEN" "$tmp/in.st" --layers 2 --h-q 4 --h-kv 2 --head-dim 16 --len 80 --rows 8 \
			--spans 2 --dtype $dt --seed $seed --quiet
		same "$dt $gqa" "$tmp/in.st" --window 6 --capacity 30 --kernel 3 --gqa $gqa
	done
done
"$GEN" "$tmp/tc.st" --layers 1 --h-q 8 --h-kv 2 --head-dim 64 --len 300 --rows 32 \
	--spans 3 --dtype bf16 --seed 7 --quiet
same "bf16, head_dim 64 (tensor-core path)" "$tmp/tc.st" --window 32 --capacity 100
"$GEN" "$tmp/h2o.st" --layers 1 --h-q 4 --h-kv 2 --head-dim 8 --len 48 --rows 48 --quiet
same "h2o, all 48 query rows" "$tmp/h2o.st" --policy h2o --window 4 --capacity 16
same "streamingllm, protected range" "$tmp/h2o.st" --policy streamingllm --sinks 2 \
	--capacity 16 --protect 10:14
"$GEN" "$tmp/noq.st" --layers 2 --h-q 2 --h-kv 2 --head-dim 8 --len 40 --rows 0 --quiet
same "window, no query rows" "$tmp/noq.st" --policy window --capacity 12
same "bypass (L < C)" "$tmp/noq.st" --policy window --capacity 64

SNAPKV_SOCKET=$sock "$CTL" status >"$tmp/status" 2>&1 &&
	grep -q "backend *cuda: .*, memfd cuda host-mapped" "$tmp/status" &&
	ok "snapkvctl status: $(grep -o 'backend.*' "$tmp/status")" || not_ok "status: $(cat "$tmp/status")"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] && ok "SIGTERM: snapkvd exits 0" || not_ok "SIGTERM: snapkvd exited $rc"

echo "test-daemon-cuda-emu: $pass passed, $fail failed"
[ $fail -eq 0 ]
