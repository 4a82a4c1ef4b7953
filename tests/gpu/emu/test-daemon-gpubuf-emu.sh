#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Engine K/V in GPU memory: an engine process (gpu-engine) allocates VMM
# memory (K/V, exported as a POSIX fd) and cudaMalloc memory (the query
# window, legacy IPC handle), registers both with snapkvd --backend cuda,
# compacts and checks the compact cache against libskv's host result. The
# daemon must name the transports (register reply, snapkvctl status and
# ledger), put K/V into the session's GPU arena on request (the engine
# imports its fd and reads them there), drop the IPC import when the engine unregisters it and the VMM
# import when the session ends (status: 0 CUDA imports live), and a
# host-backend daemon must answer both registrations with -ENOTSUP.
# Prefill waits (CompactRequest.prefill_wait, CUDA_FLAG): a compaction
# submitted before the engine sets its flag completes only after it, with the
# right result; a flag never set fails with -ETIMEDOUT after the bound (the
# daemon writes the flag itself to release its stream) and the daemon keeps
# serving with its pool back to the baseline; bad offset -ERANGE, unknown
# buffer -ENOENT, timeout over the max -E2BIG; host backend -ENOTSUP.
# CUDA_IPC_EVENT waits: an event recorded after an async upload; one
# completed well after submitting (not complete before, equal to the host
# after); one never completed (-ETIMEDOUT at the bound, nothing run, pool
# back to the baseline); a handle of zeros -EINVAL naming the open; a handle
# not of 64 bytes -EINVAL (raw frames); SIGTERM with an event wait pending:
# the drain fails it at its bound and the daemon exits 0, no later.
# GROW of caches in the GPU arena (device-to-device copy; HND and NHD, decode
# rows, equal to the host arena's and the reference; -EINVAL, -E2BIG,
# -EDQUOT, -ENOSPC leave the cache intact) and paged K/V in memfd and VMM
# buffers (equal to the reference; bad block tables refused before any work,
# pool at its baseline).
# Default: the CPU emulation of CUDA (tests/gpu/emu); with
# PLUGIN=build/libskv-cuda.so ENGINE=build/tests/gpu/gpu-engine the same
# runs on a GPU (tests/gpu/run.sh).
# ok never fails, so `A && ok || not_ok` is an if-then-else here
# shellcheck disable=SC2015
set -u
BUILD=${BUILD:-build}
SNAPKVD=$BUILD/snapkvd
CTL=$BUILD/snapkvctl
PLUGIN=${PLUGIN:-$BUILD/tests/gpu/emu/libskv-cuda-emu.so}
ENGINE=${ENGINE:-$BUILD/tests/gpu/emu/gpu-engine-emu}
. "$(dirname "$0")/../../tally.sh"
need_built "$SNAPKVD" "$CTL"
need_cuda "$ENGINE" "$PLUGIN"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-daemon-gpubuf.XXXXXX")
pid=
epid=
cleanup() {
	[ -n "$epid" ] && kill -KILL "$epid" 2>/dev/null
	[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
# start_daemon SOCKET ARGS...: snapkvd in the background, pid in $pid
start_daemon() {
	local s=$1
	shift
	SKV_CUDA_PLUGIN=$(realpath "$PLUGIN") "$SNAPKVD" --socket "$s" --pool-bytes 64M \
		--threads 1 --log-level info "$@" 2>"$tmp/daemon.log" &
	pid=$!
	for _ in $(seq 250); do
		[ -S "$s" ] && return 0
		sleep 0.02
	done
	echo "snapkvd did not start: $(cat "$tmp/daemon.log")"
	exit 1
}
stop_daemon() {
	kill -TERM "$pid"
	wait "$pid"
	local rc=$?
	pid=
	[ $rc -eq 0 ] && ok "SIGTERM: snapkvd exits 0" || not_ok "SIGTERM: snapkvd exited $rc"
}
# status_has PATTERN: snapkvctl status matches within 5 s (session end is async)
status_has() {
	for _ in $(seq 100); do
		"$CTL" status --socket "$sock" >"$tmp/status" 2>&1 && grep -q "$1" "$tmp/status" &&
			return 0
		sleep 0.05
	done
	return 1
}

echo "== host backend: CUDA registrations are refused"
sock=$tmp/host.sock
start_daemon "$sock" --backend host
timeout 60 "$ENGINE" "$sock" --enotsup >"$tmp/eng.out" 2>&1 &&
	ok "-ENOTSUP for VMM fd and IPC handle: $(grep -m1 'host backend' "$tmp/eng.out")" ||
	not_ok "host backend: $(cat "$tmp/eng.out")"
grep -q "prefill wait on the host backend: .*--backend cuda" "$tmp/eng.out" &&
	ok "prefill wait -ENOTSUP: $(grep -m1 'prefill wait on' "$tmp/eng.out")" ||
	not_ok "prefill wait on the host backend: $(cat "$tmp/eng.out")"
stop_daemon

echo "== --backend cuda on $(basename "$PLUGIN")"
sock=$tmp/cuda.sock
start_daemon "$sock" --backend cuda
mkdir "$tmp/hold"
timeout 120 "$ENGINE" "$sock" --hold "$tmp/hold" >"$tmp/eng.out" 2>&1 &
epid=$!
for _ in $(seq 1200); do
	[ -e "$tmp/hold/ready" ] && break
	kill -0 "$epid" 2>/dev/null || break
	sleep 0.05
done
if [ -e "$tmp/hold/ready" ]; then
	grep -q "host arena: .*equal to the host result" "$tmp/eng.out" &&
		ok "compact cache == host: $(grep -m1 'host arena' "$tmp/eng.out")" ||
		not_ok "engine: $(cat "$tmp/eng.out")"
	grep -q "GPU arena .*equal to the host result" "$tmp/eng.out" &&
		ok "K/V in the GPU arena == host: $(grep -m1 'GPU arena' "$tmp/eng.out")" ||
		not_ok "engine, GPU arena: $(cat "$tmp/eng.out")"
	grep -q "prefill wait: flag set after .*completed after it: equal to the host result" \
		"$tmp/eng.out" &&
		ok "flag wait: $(grep -m1 'flag set after' "$tmp/eng.out")" ||
		not_ok "flag wait: $(cat "$tmp/eng.out")"
	grep -q "prefill wait: never set, timeout 200 ms: -ETIMEDOUT" "$tmp/eng.out" &&
		grep -q "prefill wait: engine did not signal in time; stream released" \
			"$tmp/daemon.log" &&
		ok "flag never set: $(grep -m1 'never set' "$tmp/eng.out")" ||
		not_ok "flag never set: $(cat "$tmp/eng.out") $(cat "$tmp/daemon.log")"
	grep -q "prefill wait: -ERANGE, -ENOENT, -E2BIG refused; served after .*: ok" \
		"$tmp/eng.out" &&
		ok "$(grep -m1 'served after' "$tmp/eng.out" | sed 's/^engine: //')" ||
		not_ok "after the timeout: $(cat "$tmp/eng.out")"
	grep -q "event wait: recorded after an async upload: equal to the host result" \
		"$tmp/eng.out" &&
		ok "event wait after an async upload == host" ||
		not_ok "event wait after an async upload: $(cat "$tmp/eng.out")"
	grep -q "event wait: completed after .*compaction after it: equal to the host result" \
		"$tmp/eng.out" &&
		ok "$(grep -m1 'event wait: completed after' "$tmp/eng.out" | sed 's/^engine: //')" ||
		not_ok "event completed later: $(cat "$tmp/eng.out")"
	grep -q "event wait: never completed, timeout 200 ms: -ETIMEDOUT" "$tmp/eng.out" &&
		grep -q "prefill wait: engine's IPC event not complete within 200 ms" \
			"$tmp/daemon.log" &&
		ok "$(grep -m1 'event wait: never' "$tmp/eng.out" | sed 's/^engine: //')" ||
		not_ok "event never completed: $(cat "$tmp/eng.out") $(cat "$tmp/daemon.log")"
	grep -q "event wait: a handle of zeros: prefill_wait: cudaIpcOpenEventHandle" \
		"$tmp/eng.out" &&
		grep -q "event wait: -EINVAL, -E2BIG refused; served after the timeout; pool .* as before: ok" \
			"$tmp/eng.out" &&
		ok "event wait: bad handle -EINVAL, -E2BIG; served after; pool at its baseline" ||
		not_ok "event wait errors: $(cat "$tmp/eng.out")"
	grep -q "cuda-vmm-fd buffer, generation .* imported" "$tmp/daemon.log" &&
		grep -q "cuda-ipc buffer, generation .* imported" "$tmp/daemon.log" &&
		ok "daemon imported a VMM fd and an IPC handle" ||
		not_ok "imports not logged: $(cat "$tmp/daemon.log")"
	status_has "buffers   memfd 0, cuda-vmm-fd 1, cuda-ipc 0 (1 CUDA imports live)" &&
		grep -q "arena     host-memfd+cuda-vmm" "$tmp/status" &&
		ok "status after unregistering the IPC buffer: $(grep buffers "$tmp/status")" ||
		not_ok "status: $(cat "$tmp/status")"
	"$CTL" ledger --socket "$sock" --json >"$tmp/ledger" 2>&1 &&
		python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["caches"]
sys.exit(not (len(c) == 2 and all(x["transport"] == "cuda-ipc+cuda-vmm-fd" for x in c)
              and sorted(x["arena_transport"] for x in c) == ["cuda-vmm", "host-memfd"]))
' "$tmp/ledger" &&
		ok "ledger: transport cuda-ipc+cuda-vmm-fd, arenas host-memfd and cuda-vmm" ||
		not_ok "ledger: $(cat "$tmp/ledger")"
	"$CTL" ledger --socket "$sock" | grep -q "cuda-ipc+cuda-vmm-fd *cuda-vmm" &&
		ok "ledger table names the transport" || not_ok "ledger table"
else
	not_ok "engine did not get ready: $(cat "$tmp/eng.out")"
fi
touch "$tmp/hold/go"
wait "$epid"
rc=$?
epid=
[ $rc -eq 0 ] && ok "engine exits 0" || not_ok "engine exited $rc: $(cat "$tmp/eng.out")"
status_has "(0 CUDA imports live)" &&
	ok "session end released the VMM import: $(grep buffers "$tmp/status")" ||
	not_ok "imports after session end: $(cat "$tmp/status")"
timeout 60 "$ENGINE" "$sock" --generations >"$tmp/eng.out" 2>&1 &&
	ok "(session, generation) keying: a repeat is the same buffer needing its own unregister; -EEXIST, -EBADF, -EINVAL" ||
	not_ok "generations: $(cat "$tmp/eng.out")"
grep -q "event handle of 10 bytes: -22 prefill_wait: ipc_event has 10 bytes, not 64" \
	"$tmp/eng.out" &&
	ok "event handle of 10, 80, 0 bytes: -EINVAL ($(grep -m1 'of 10 bytes' "$tmp/eng.out" |
		sed 's/^.*-22 //'))" ||
	not_ok "event handle length: $(cat "$tmp/eng.out")"
status_has "(0 CUDA imports live)" &&
	ok "after the raw session: 0 imports live" ||
	not_ok "imports after the raw session: $(cat "$tmp/status")"
# SIGTERM while an event wait is pending (the engine never completes it,
# 1500 ms bound): the drain ends it at its bound, not later, and exits 0
mkdir "$tmp/hang"
timeout 60 "$ENGINE" "$sock" --event-hang "$tmp/hang" >"$tmp/hang.out" 2>&1 &
epid=$!
for _ in $(seq 1200); do
	[ -e "$tmp/hang/submitted" ] && break
	kill -0 "$epid" 2>/dev/null || break
	sleep 0.05
done
if [ -e "$tmp/hang/submitted" ]; then
	t0=$(date +%s%N)
	stop_daemon
	ms=$((($(date +%s%N) - t0) / 1000000))
	# the bound counts from when the worker took the job, before SIGTERM;
	# 3 s of slack for a loaded machine, far below prefill_wait_max_ms
	[ $ms -lt 4500 ] &&
		ok "SIGTERM with an event wait pending (1500 ms bound): exited after $ms ms" ||
		not_ok "SIGTERM with an event wait pending: $ms ms (bound 1500 ms)"
	wait "$epid"
	rc=$?
	epid=
	[ $rc -eq 0 ] && grep -q "event wait across SIGTERM: -ETIME" "$tmp/hang.out" &&
		ok "$(grep -m1 'across SIGTERM' "$tmp/hang.out" | sed 's/^engine: //')" ||
		not_ok "engine across SIGTERM ($rc): $(cat "$tmp/hang.out")"
else
	not_ok "event-hang engine did not submit: $(cat "$tmp/hang.out")"
	wait "$epid"
	epid=
	stop_daemon
fi
start_daemon "$sock" --backend cuda
# SIGTERM while an engine still holds GPU buffers, a GPU arena and caches:
# the daemon drops them before unloading the plugin and exits 0
rm -rf "$tmp/hold"
mkdir "$tmp/hold"
timeout 120 "$ENGINE" "$sock" --hold "$tmp/hold" >"$tmp/eng.out" 2>&1 &
epid=$!
for _ in $(seq 1200); do
	[ -e "$tmp/hold/ready" ] && break
	kill -0 "$epid" 2>/dev/null || break
	sleep 0.05
done
[ -e "$tmp/hold/ready" ] || not_ok "second engine did not get ready: $(cat "$tmp/eng.out")"
stop_daemon
touch "$tmp/hold/go"
wait "$epid"
epid=

# --- GROW of GPU-arena caches and paged layouts (gpu-engine --grow-paged):
# a daemon with a 64M pool and a 40M tenant quota, so that GROW can be
# refused both ways
echo "== GROW in the GPU arena, paged layouts"
sock=$tmp/grow.sock
printf 'tenant_quota_bytes = 40M\n' >"$tmp/grow.conf"
start_daemon "$sock" --backend cuda --config "$tmp/grow.conf"
timeout 60 "$ENGINE" "$sock" --grow-paged >"$tmp/eng.out" 2>&1
rc=$?
for lay in HND NHD; do
	grep -q "GROW $lay, K/V in the GPU arena: .*equal to the host arena and the reference" \
		"$tmp/eng.out" &&
		ok "$(grep -m1 "GROW $lay" "$tmp/eng.out" | sed 's/^engine: //')" ||
		not_ok "GROW $lay: $(cat "$tmp/eng.out")"
done
grep -q "GROW errors -EINVAL, -E2BIG, -EDQUOT, -ENOSPC left the cache intact; .*: ok" \
	"$tmp/eng.out" && ok "$(grep -m1 'GROW errors' "$tmp/eng.out" | sed 's/^engine: //')" ||
	not_ok "GROW errors: $(cat "$tmp/eng.out")"
for t in memfd cuda-vmm-fd; do
	grep -q "paged $t K/V .*: equal to the host result, host and GPU arena" "$tmp/eng.out" &&
		ok "$(grep -m1 "paged $t K/V" "$tmp/eng.out" | sed 's/^engine: //')" ||
		not_ok "paged $t: $(cat "$tmp/eng.out")"
done
grep -q "paged: out-of-range -ERANGE, negative and short table -EINVAL; .*: ok" \
	"$tmp/eng.out" &&
	ok "$(grep -m1 'paged: out-of-range' "$tmp/eng.out" | sed 's/^engine: //')" ||
	not_ok "paged refusals: $(cat "$tmp/eng.out")"
grep -q "paged output (blocks of 4) in the host arena, the GPU arena and written back .*: equal to the host result" \
	"$tmp/eng.out" && ok "$(grep -m1 'paged output' "$tmp/eng.out" | sed 's/^engine: //')" ||
	not_ok "paged output: $(cat "$tmp/eng.out")"
[ $rc -eq 0 ] && ok "grow/paged engine exits 0" ||
	not_ok "grow/paged engine exited $rc: $(cat "$tmp/eng.out")"
status_has "(0 CUDA imports live)" && ok "grow/paged: 0 imports live after the session" ||
	not_ok "imports after grow/paged: $(cat "$tmp/status")"
stop_daemon
# a device copy that fails (the emulator only: SKV_EMU_FAIL_COPY2D)
if [ "$(basename "$PLUGIN")" = libskv-cuda-emu.so ]; then
	SKV_EMU_FAIL_COPY2D=1 start_daemon "$sock" --backend cuda
	timeout 60 "$ENGINE" "$sock" --grow-fail >"$tmp/eng.out" 2>&1
	rc=$?
	[ $rc -eq 0 ] && grep -q "failed GROW: the cache as it was and usable, .*: ok" \
		"$tmp/eng.out" &&
		ok "$(grep -m1 'failing device copy' "$tmp/eng.out" | sed 's/^engine: //')" ||
		not_ok "failed GROW (rc $rc): $(cat "$tmp/eng.out")"
	stop_daemon
fi

echo "test-daemon-gpubuf-emu: $pass passed, $fail failed"
[ $fail -eq 0 ]
