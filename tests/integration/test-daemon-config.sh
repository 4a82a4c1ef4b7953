#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-daemon-config: snapkvd as a service. A bad config is refused with its
# line number; SIGHUP reloads limits; sd_notify sends READY, STATUS,
# WATCHDOG and STOPPING; a socket passed by systemd (sd_listen_fds) is used;
# SIGTERM exits 0 every time.
set -euo pipefail
BUILD=${BUILD:-build}
D=$BUILD/snapkvd
tmp=$(mktemp -d /tmp/snapkvd-svc-XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/log" ] && cat "$tmp/log"; exit 1; }
wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.01; done; return 1; }
stop() { # pid: SIGTERM, expect exit 0
	kill -TERM "$1"
	local rc=0
	wait "$1" || rc=$?
	[ "$rc" -eq 0 ] || fail "snapkvd exited $rc after SIGTERM"
}

# --help, unknown option
"$D" --help | grep -q "Usage: snapkvd" || fail "--help"
rc=0; "$D" --bogus 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] || fail "unknown option should exit 2, got $rc"

# bad configs: refused before listening, with the line
printf 'pool_bytes = 1G\nthreads = lots\n' >"$tmp/bad.conf"
rc=0; "$D" --config "$tmp/bad.conf" --socket "$tmp/x.sock" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] || fail "bad config should exit 1, got $rc"
grep -q "line 2: threads" "$tmp/err" || fail "no line number in: $(cat "$tmp/err")"
printf 'no_such_key = 1\n' >"$tmp/bad2.conf"
rc=0; "$D" --config "$tmp/bad2.conf" --socket "$tmp/x.sock" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "unknown key" "$tmp/err" || fail "unknown key accepted"
head -c 70000 /dev/zero | tr '\0' '#' >"$tmp/big.conf"
rc=0; "$D" --config "$tmp/big.conf" --socket "$tmp/x.sock" 2>/dev/null || rc=$?
[ "$rc" -eq 1 ] || fail "oversized config accepted"
[ ! -e "$tmp/x.sock" ] || fail "listened despite a bad config"

# SIGHUP reloads limits; a broken file on reload keeps the old ones
printf 'pool_bytes = 64M\nlog_level = notice\n' >"$tmp/good.conf"
"$D" --config "$tmp/good.conf" --socket "$tmp/a.sock" 2>"$tmp/log" &
pids+=($!)
wait_sock "$tmp/a.sock" || fail "did not start"
printf 'pool_bytes = 128M\nlog_level = notice\n' >"$tmp/good.conf"
kill -HUP "${pids[-1]}"
for _ in $(seq 200); do grep -q "limits reloaded (pool 134217728" "$tmp/log" && break; sleep 0.01; done
grep -q "limits reloaded (pool 134217728" "$tmp/log" || fail "SIGHUP did not reload"
printf 'pool_bytes = banana\n' >"$tmp/good.conf"
kill -HUP "${pids[-1]}"
for _ in $(seq 200); do grep -q "keeping the old limits" "$tmp/log" && break; sleep 0.01; done
grep -q "keeping the old limits" "$tmp/log" || fail "bad reload not reported"
"$BUILD/snapkv-engine" --socket "$tmp/a.sock" --layers 1 --prompt 128 --capacity 64 \
	--decode 2 >/dev/null || fail "engine after reload"
stop "${pids[-1]}"

# allow list (SO_PEERCRED) and per-tenant quota
me=$(id -u)
printf 'allow_uids = %s\n' $((me + 4242)) >"$tmp/allow.conf"
"$D" --config "$tmp/allow.conf" --socket "$tmp/d.sock" --log-level warning 2>"$tmp/log" &
pids+=($!)
wait_sock "$tmp/d.sock" || fail "did not start with an allow list"
rc=0; "$BUILD/snapkv-engine" --socket "$tmp/d.sock" --layers 1 --prompt 128 --capacity 64 \
	--decode 1 >/dev/null 2>"$tmp/eng" || rc=$?
[ "$rc" -ne 0 ] && grep -q "Permission denied" "$tmp/eng" || fail "uid not in allow_uids got in: $(cat "$tmp/eng")"
stop "${pids[-1]}"
printf 'allow_uids = %s\ntenant_quota_bytes = 64K\n' "$me" >"$tmp/quota.conf"
"$D" --config "$tmp/quota.conf" --socket "$tmp/e.sock" --log-level warning 2>"$tmp/log" &
pids+=($!)
wait_sock "$tmp/e.sock" || fail "did not start with a quota"
rc=0; "$BUILD/snapkv-engine" --socket "$tmp/e.sock" --layers 4 --prompt 512 --capacity 256 \
	--decode 1 >/dev/null 2>"$tmp/eng" || rc=$?
[ "$rc" -ne 0 ] && grep -q "quota" "$tmp/eng" || fail "quota not enforced: $(cat "$tmp/eng")"
"$BUILD/snapkv-engine" --socket "$tmp/e.sock" --layers 1 --h-q 2 --h-kv 2 --head-dim 16 \
	--prompt 64 --window 8 --capacity 32 --reserve 4 --decode 2 >/dev/null ||
	fail "a cache within the quota was refused"
stop "${pids[-1]}"

# sd_notify protocol
python3 - "$tmp/notify" >"$tmp/notes" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(5)
end = time.time() + 8
while time.time() < end:
    try:
        m = s.recv(4096).decode()
    except socket.timeout:
        break
    print(m.replace("\n", "|"), flush=True)
    if "STOPPING=1" in m:
        break
PY
npid=$!
for _ in $(seq 300); do [ -S "$tmp/notify" ] && break; sleep 0.01; done
NOTIFY_SOCKET=$tmp/notify WATCHDOG_USEC=100000 "$D" --socket "$tmp/b.sock" \
	--log-level warning 2>"$tmp/log" &
pids+=($!)
wait_sock "$tmp/b.sock" || fail "did not start under NOTIFY_SOCKET"
sleep 1.2
stop "${pids[-1]}"
wait "$npid" || true
for w in READY=1 STATUS= WATCHDOG=1 STOPPING=1; do
	grep -q "$w" "$tmp/notes" || fail "no $w in sd_notify messages: $(cat "$tmp/notes")"
done

# socket activation: the daemon takes the listening socket from systemd
systemd-socket-activate --seqpacket -l "$tmp/c.sock" "$(realpath "$D")" --log-level info \
	2>"$tmp/log" &
pids+=($!)
wait_sock "$tmp/c.sock" || fail "systemd-socket-activate did not listen"
"$BUILD/snapkv-engine" --socket "$tmp/c.sock" --layers 1 --prompt 128 --capacity 64 \
	--decode 2 >/dev/null || fail "engine via the activated socket"
grep -q "using the socket passed by systemd" "$tmp/log" || fail "sd_listen_fds not used"
stop "${pids[-1]}"
echo "config, reload, sd_notify and socket activation OK"
