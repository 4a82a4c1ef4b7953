#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every GPU of the node: one snapkvd --backend cuda over two emulated
# devices (SKV_EMU_DEVICES=2; the emulator refuses a kernel on memory its
# device cannot reach, so a compaction on the wrong device fails there).
# Engines on device 0 and on device 1 (gpu-engine --device N: K/V in a VMM
# allocation, the query window in cudaMalloc memory behind an IPC handle)
# register with the one daemon, compact (== libskv's host result) and
# compact into their session's GPU arena, which is on their own device.
# Each compaction runs on its own device: the emulator's launch log
# (SKV_EMU_LAUNCH_LOG) shows the daemon's kernels on device 1 only while the
# device-1 engine ran, on device 0 only while the device-0 engine ran; the
# per-device totals (snapkvctl status, metrics with device labels) count
# imports, arenas and compactions on the right device. A request whose K/V
# are on device 0 and whose window is on device 1 is refused (-EXDEV, "must
# all be on one device"). devices = 1: buffers on device 0 are refused by
# name; devices = 0,15: the daemon does not start, naming the key. The same
# engines run concurrently on one daemon, each on its device, and as the two
# tensor-parallel ranks of one decision group (mass mode, their data and so
# their own C* differ): both report the group's C*, each member's kernels
# ran on its own device.
# PLUGIN=build/libskv-cuda.so ENGINE=build/tests/gpu/gpu-engine runs it on a
# machine with two GPUs or more (tests/gpu/run.sh), without the launch log
# checks; with one GPU it skips (exit 77, "multigpu"; a failure where
# SNAPKV_REQUIRE names multigpu or all).
# ok never fails, so `A && ok || not_ok` is an if-then-else here
# shellcheck disable=SC2015
set -u
BUILD=${BUILD:-build}
SNAPKVD=${SNAPKVD:-$BUILD/snapkvd}
CTL=$BUILD/snapkvctl
PLUGIN=${PLUGIN:-$BUILD/tests/gpu/emu/libskv-cuda-emu.so}
ENGINE=${ENGINE:-$BUILD/tests/gpu/emu/gpu-engine-emu}
. "$(dirname "$0")/../../tally.sh"
need_built "$SNAPKVD" "$CTL"
need_cuda "$ENGINE" "$PLUGIN"
emulated=0
case $PLUGIN in *emu*) emulated=1 ;; esac
if [ $emulated -eq 0 ]; then
	gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
	[ "$gpus" -ge 2 ] || skip multigpu "$gpus CUDA device(s) here: this test needs two"
fi
export SKV_EMU_DEVICES=2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-daemon-devices.XXXXXX")
pid=
cleanup() {
	[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
sock=$tmp/snapkvd.sock
# start_daemon CONFIG: snapkvd in the background, pid in $pid; 1 if it did not start
start_daemon() {
	rm -f "$sock"
	SKV_EMU_LAUNCH_LOG=$tmp/launches SKV_CUDA_PLUGIN=$(realpath "$PLUGIN") "$SNAPKVD" \
		--config "$1" --socket "$sock" --backend cuda --pool-bytes 64M --threads 2 \
		--log-level info 2>"$tmp/daemon.log" &
	pid=$!
	for _ in $(seq 250); do
		[ -S "$sock" ] && return 0
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.02
	done
	return 1
}
stop_daemon() {
	kill -TERM "$pid"
	wait "$pid"
	local rc=$?
	pid=
	[ $rc -eq 0 ] && ok "SIGTERM: snapkvd exits 0" || not_ok "SIGTERM: snapkvd exited $rc"
}
# launches DEVICE: kernels the daemon ran on DEVICE so far (emulator log)
launches() {
	if [ -e "$tmp/launches" ]; then
		grep -c "^pid $pid device $1\$" "$tmp/launches"
	else
		echo 0
	fi
}
# engine NAME ARGS...: gpu-engine against the daemon, ok when it exits 0
engine() {
	local name=$1
	shift
	if "$ENGINE" "$sock" --quick "$@" >"$tmp/engine.out" 2>&1; then
		ok "$name: $(grep -c 'equal to the host result' "$tmp/engine.out") compactions == host"
	else
		not_ok "$name: $(tail -n 5 "$tmp/engine.out")"
	fi
}
metric() {
	SNAPKV_SOCKET=$sock "$CTL" metrics 2>/dev/null | grep "^$1 " | awk '{print $2}'
}

echo "== two devices, one daemon"
: >"$tmp/all.conf"
start_daemon "$tmp/all.conf" || {
	echo "snapkvd did not start: $(cat "$tmp/daemon.log")"
	exit 1
}
grep -q "backend cuda (cuda0 .*, cuda1 .*, memfd cuda host-mapped)" "$tmp/daemon.log" &&
	ok "both devices opened: $(grep -o 'backend cuda ([^)]*)' "$tmp/daemon.log")" ||
	not_ok "log does not name both devices: $(cat "$tmp/daemon.log")"
l0=$(launches 0)
l1=$(launches 1)
engine "engine on device 1" --device 1
n0=$(launches 0)
n1=$(launches 1)
if [ $emulated -eq 1 ]; then
	[ "$n1" -gt "$l1" ] && [ "$n0" -eq "$l0" ] &&
		ok "device 1's compactions ran on device 1 ($((n1 - l1)) kernels there, none on device 0)" ||
		not_ok "device 1's engine: launches on 0: $l0 -> $n0, on 1: $l1 -> $n1"
fi
engine "engine on device 0" --device 0
m0=$(launches 0)
m1=$(launches 1)
if [ $emulated -eq 1 ]; then
	[ "$m0" -gt "$n0" ] && [ "$m1" -eq "$n1" ] &&
		ok "device 0's compactions ran on device 0 ($((m0 - n0)) kernels there, none on device 1)" ||
		not_ok "device 0's engine: launches on 0: $n0 -> $m0, on 1: $n1 -> $m1"
fi
SNAPKV_SOCKET=$sock "$CTL" status >"$tmp/status" 2>&1
grep -q "device 0 .*: 0 imports .*, 0 GPU arenas .*, 2 compactions" "$tmp/status" &&
	grep -q "device 1 .*: 0 imports .*, 0 GPU arenas .*, 2 compactions" "$tmp/status" &&
	ok "snapkvctl status: two compactions on each device, nothing held after the sessions" ||
	not_ok "status: $(cat "$tmp/status")"
SNAPKV_SOCKET=$sock "$CTL" status --json >"$tmp/status.json" 2>&1
python3 - "$tmp/status.json" <<'PY' && ok "status --json: devices [0, 1] with their totals" || not_ok "status --json: $(cat "$tmp/status.json")"
import json, sys
d = json.load(open(sys.argv[1]))["devices"]
assert [x["device"] for x in d] == [0, 1], d
assert all(x["compactions"] == 2 and x["imports"] == 0 for x in d), d
PY
[ "$(metric 'snapkvd_device_compactions_total{device="1"}')" = 2 ] &&
	[ "$(metric 'snapkvd_device_compactions_total{device="0"}')" = 2 ] &&
	ok "metrics: snapkvd_device_compactions_total{device=\"0\"} and {device=\"1\"} are 2" ||
	not_ok "metrics: $(SNAPKV_SOCKET=$sock "$CTL" metrics 2>&1 | grep snapkvd_device_)"

echo "== a request spanning devices"
"$ENGINE" "$sock" --quick --device 0 --mixed 1 >"$tmp/engine.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "must all be on one device" "$tmp/engine.out" &&
	ok "refused: $(grep -o 'buffer [0-9]* is on CUDA device.*' "$tmp/engine.out" | head -1)" ||
	not_ok "no refusal: $(cat "$tmp/engine.out")"

echo "== both engines at once"
"$ENGINE" "$sock" --quick --device 0 >"$tmp/e0.out" 2>&1 &
e0=$!
"$ENGINE" "$sock" --quick --device 1 >"$tmp/e1.out" 2>&1
r1=$?
wait $e0
r0=$?
[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && ok "engines on devices 0 and 1 together: both == host" ||
	not_ok "together: device 0 rc $r0 $(tail -n 3 "$tmp/e0.out"), device 1 rc $r1 $(tail -n 3 "$tmp/e1.out")"

echo "== a decision group across devices"
g0=$(launches 0)
g1=$(launches 1)
"$ENGINE" "$sock" --quick --device 0 --group tp >"$tmp/e0.out" 2>&1 &
e0=$!
"$ENGINE" "$sock" --quick --device 1 --group tp >"$tmp/e1.out" 2>&1
r1=$?
wait $e0
r0=$?
c0=$(grep -o 'group tp: C\* [0-9]*' "$tmp/e0.out")
c1=$(grep -o 'group tp: C\* [0-9]*' "$tmp/e1.out")
[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && [ -n "$c0" ] && [ "$c0" = "$c1" ] &&
	ok "ranks on devices 0 and 1, one group: both $c0" ||
	not_ok "group across devices: rc $r0/$r1, '$c0' / '$c1': $(tail -n 3 "$tmp/e0.out" "$tmp/e1.out")"
if [ $emulated -eq 1 ]; then
	[ "$(launches 0)" -gt "$g0" ] && [ "$(launches 1)" -gt "$g1" ] &&
		ok "each rank's kernels on its own device ($(($(launches 0) - g0)) on 0, $(($(launches 1) - g1)) on 1)" ||
		not_ok "group launches: device 0 $g0 -> $(launches 0), device 1 $g1 -> $(launches 1)"
fi
stop_daemon

echo "== devices = 1"
echo "devices = 1" >"$tmp/one.conf"
start_daemon "$tmp/one.conf" || {
	echo "snapkvd did not start: $(cat "$tmp/daemon.log")"
	exit 1
}
engine "engine on device 1" --device 1
"$ENGINE" "$sock" --quick --device 0 >"$tmp/engine.out" 2>&1
grep -q "lives on CUDA device 0, which this daemon does not use (devices = 1)" "$tmp/engine.out" &&
	ok "device 0's buffers refused: $(grep -o 'the buffer lives.*' "$tmp/engine.out" | head -1)" ||
	not_ok "device 0 on a devices = 1 daemon: $(tail -n 5 "$tmp/engine.out")"
if [ $emulated -eq 1 ]; then
	[ "$(launches 0)" -eq 0 ] && ok "nothing ran on device 0" || not_ok "$(launches 0) kernels on device 0"
fi
stop_daemon

echo "devices = 0,15" >"$tmp/bad.conf"
if start_daemon "$tmp/bad.conf"; then
	not_ok "devices = 0,15: started"
	stop_daemon
else
	wait "$pid"
	rc=$?
	pid=
	[ $rc -eq 1 ] && grep -q "backend cuda: devices: device 15: " "$tmp/daemon.log" &&
		ok "devices = 0,15: exit 1, $(grep -o 'backend cuda: devices.*' "$tmp/daemon.log")" ||
		not_ok "devices = 0,15: rc $rc $(cat "$tmp/daemon.log")"
fi

echo "test-daemon-devices-emu: $pass passed, $fail failed"
[ $fail -eq 0 ]
