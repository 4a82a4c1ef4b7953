#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-daemon-config: snapkvd as a service. A bad config is refused with its
# file, line number and limit, a bad option value with the same exit code;
# --check-config prints every key and reads back; SIGHUP reloads limits
# and names the keys it keeps until a restart; sd_notify sends READY, STATUS,
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
grep -q "$tmp/bad.conf: line 2: threads: not an integer in 0..1024" <("$D" --config \
	"$tmp/bad.conf" --check-config 2>&1) || fail "the error does not name the file and the range"

# one exit code for a bad value, from the file or the command line; the
# option named as given, the limit printed
printf 'pool_bytes = 64K\n' >"$tmp/small.conf"
rc=0; "$D" --config "$tmp/small.conf" --socket "$tmp/x.sock" 2>"$tmp/err" || rc=$?
grep -q "small.conf: line 1: pool_bytes: 64K is below the minimum 1M (1048576 bytes)" "$tmp/err" ||
	fail "file: $(cat "$tmp/err")"
rc2=0; "$D" --pool-bytes 64K --socket "$tmp/x.sock" 2>"$tmp/err" || rc2=$?
grep -q -- "--pool-bytes 64K: 64K is below the minimum 1M (1048576 bytes)" "$tmp/err" ||
	fail "option: $(cat "$tmp/err")"
[ "$rc" -eq 1 ] && [ "$rc2" -eq 1 ] || fail "a bad pool_bytes exits $rc from the file, $rc2 as an option"
rc=0; "$D" --threads lots --socket "$tmp/x.sock" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q -- "--threads lots: not an integer in 0..1024" "$tmp/err" ||
	fail "--threads lots: rc $rc: $(cat "$tmp/err")"
printf 'metrics_http_max_request = 1M\n' >"$tmp/big-req.conf"
rc=0; "$D" --config "$tmp/big-req.conf" --check-config >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "1M is outside 256..64K (256..65536 bytes)" "$tmp/err" ||
	fail "an upper size limit: rc $rc: $(cat "$tmp/err")"
printf 'pressure_high = 80%%\npressure_high_leave = 85%%\n' >"$tmp/leave.conf"
rc=0; "$D" --config "$tmp/leave.conf" --check-config >/dev/null 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "leave.conf: pressure: " "$tmp/err" ||
	fail "a cross-key error: rc $rc: $(cat "$tmp/err")"
[ ! -e "$tmp/x.sock" ] || fail "listened despite a bad option"

# a socket that cannot be bound: the path and bind's own errno, exit 1
rc=0; "$D" --socket "$tmp/no/such/dir/s.sock" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "Failed to listen on $tmp/no/such/dir/s.sock: No such file or directory" \
	"$tmp/err" || fail "missing directory: rc $rc: $(cat "$tmp/err")"
touch "$tmp/plain"
rc=0; "$D" --socket "$tmp/plain/s.sock" 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "Failed to listen on $tmp/plain/s.sock: Not a directory" "$tmp/err" ||
	fail "a file as the directory: rc $rc: $(cat "$tmp/err")"

# --check-config: the effective configuration, every key, and it reads back
"$D" --check-config >"$tmp/eff.conf" 2>"$tmp/err" || fail "--check-config: $(cat "$tmp/err")"
keys() { sed -n 's/^#\?\([a-z_]*\) =.*/\1/p' "$1" | sort -u; }
doc=$(keys systemd/snapkvd.conf)
printed=$(keys "$tmp/eff.conf"; grep -q '^# tenant_quota: none' "$tmp/eff.conf" && echo tenant_quota)
[ "$(echo "$printed" | sort -u)" = "$doc" ] ||
	fail "--check-config keys differ from systemd/snapkvd.conf's: $(diff <(echo "$doc") <(echo "$printed" | sort -u))"
printf 'pool_bytes = 3G\ntenant_quota = 1000:2G:25%%\nmetrics_listen = 9464\nallow_gids = 5 6\n' \
	>"$tmp/some.conf"
"$D" --config "$tmp/some.conf" --threads 3 --log-level debug --check-config \
	--socket "$tmp/y.sock" >"$tmp/eff2.conf" || fail "--check-config with a file"
for want in "pool_bytes = 3G" "threads = 3" "log_level = debug" "tenant_quota = 1000:2G:0.25" \
	"metrics_listen = 127.0.0.1:9464" "allow_gids = 5 6" "socket = $tmp/y.sock"; do
	grep -qx "$want" "$tmp/eff2.conf" || fail "--check-config lacks '$want': $(cat "$tmp/eff2.conf")"
done
"$D" --config "$tmp/eff2.conf" --check-config >"$tmp/eff3.conf" || fail "the dump does not parse"
diff <(tail -n +2 "$tmp/eff2.conf") <(tail -n +2 "$tmp/eff3.conf") >/dev/null ||
	fail "the dump does not read back as the same configuration"
[ ! -e "$tmp/y.sock" ] || fail "--check-config listened"

# SIGHUP reloads limits; a broken file on reload keeps the old ones
printf 'pool_bytes = 64M\nlog_level = notice\n' >"$tmp/good.conf"
"$D" --config "$tmp/good.conf" --socket "$tmp/a.sock" 2>"$tmp/log" &
pids+=($!)
wait_sock "$tmp/a.sock" || fail "did not start"
# a key that needs a restart (threads): kept, and the log names it
printf 'pool_bytes = 128M\nlog_level = notice\nthreads = 3\n' >"$tmp/good.conf"
kill -HUP "${pids[-1]}"
for _ in $(seq 200); do grep -q "limits reloaded (pool 134217728" "$tmp/log" && break; sleep 0.01; done
grep -q "limits reloaded (pool 134217728" "$tmp/log" || fail "SIGHUP did not reload"
grep -q "SIGHUP: threads changed in $tmp/good.conf: it needs a restart, the running value is kept" \
	"$tmp/log" || fail "a restart-only key changed on reload was not named: $(cat "$tmp/log")"
grep -q "SIGHUP: pool_bytes changed" "$tmp/log" && fail "a reloadable key was reported as kept"
printf 'pool_bytes = banana\n' >"$tmp/good.conf"
kill -HUP "${pids[-1]}"
for _ in $(seq 200); do grep -q "keeping the old limits" "$tmp/log" && break; sleep 0.01; done
grep -q "keeping the old limits" "$tmp/log" || fail "bad reload not reported"
"$BUILD/snapkv-engine" --socket "$tmp/a.sock" --layers 1 --prompt 128 --capacity 64 \
	--decode 2 >/dev/null || fail "engine after reload"
stop "${pids[-1]}"

# snapkvctl's (admin) connections are logged at debug level only, engines' at info
for level in info debug; do
	"$D" --socket "$tmp/f.sock" --log-level $level 2>"$tmp/log" &
	pids+=($!)
	wait_sock "$tmp/f.sock" || fail "did not start at $level"
	for _ in 1 2 3; do "$BUILD/snapkvctl" --socket "$tmp/f.sock" status >/dev/null || fail "status"; done
	"$BUILD/snapkv-engine" --socket "$tmp/f.sock" --layers 1 --prompt 128 --capacity 64 \
		--decode 1 >/dev/null || fail "engine at $level"
	stop "${pids[-1]}"
	admin=$(grep -c ' admin$\|(snapkvctl, uid [0-9]*) closed' "$tmp/log" || true)
	engine=$(grep -c 'session [0-9]*: .*(pid [0-9]*, uid [0-9]*)$' "$tmp/log" || true)
	if [ $level = info ]; then
		[ "$admin" -eq 0 ] && [ "$engine" -eq 1 ] ||
			fail "at info: $admin admin lines (want 0), $engine engine lines (want 1): $(cat "$tmp/log")"
	else
		[ "$admin" -eq 6 ] || fail "at debug: $admin admin lines, want 6: $(cat "$tmp/log")"
	fi
done

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
s.settimeout(30)
end = time.time() + 60
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
# until a watchdog ping arrived (30 s: a hang guard, not a timing claim)
for _ in $(seq 3000); do
	grep -q WATCHDOG=1 "$tmp/notes" && break
	sleep 0.01
done
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
