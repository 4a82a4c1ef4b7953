#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-ops-ctl: snapkvctl pressure (show, set, bad settings, --json), top --once
# and metrics against a private snapkvd; the daemon's metrics textfile.
set -u
BUILD=${BUILD:-build}
D=$(mktemp -d /tmp/snapkvd-opsctl-XXXXXX)
SOCK=$D/s.sock
PID=
fail=0
cleanup() {
	if [ -n "$PID" ]; then
		kill -TERM "$PID" 2>/dev/null
		wait "$PID" 2>/dev/null
	fi
	rm -rf "$D"
}
trap cleanup EXIT
check() { # description, command...
	local what=$1
	shift
	if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fail=1; fi
}

cat >"$D/snapkvd.conf" <<EOF
pool_bytes = 64M
pressure_high = 50%
pressure_high_leave = 40%
pressure_critical = 90%
pressure_critical_leave = 85%
pressure_actions = notify,hooks,evict,refuse
metrics_textfile = $D/snapkvd.prom
metrics_interval_s = 1
EOF
"$BUILD/snapkvd" --config "$D/snapkvd.conf" --socket "$SOCK" --log-level warning &
PID=$!
for _ in $(seq 200); do [ -S "$SOCK" ] && break; sleep 0.05; done
CTL="$BUILD/snapkvctl"

out=$("$CTL" pressure --socket "$SOCK")
check "pressure shows the level" grep -q '^level             normal$' <<<"$out"
check "pressure shows watermarks as configured and in bytes" \
	grep -q '^high              enter 50% (33554432 B), leave 40% (26843546 B)$' <<<"$out"
check "pressure shows the action order" grep -q '^actions           notify,hooks,evict,refuse$' <<<"$out"

out=$("$CTL" pressure set --socket "$SOCK" --high 60% --high-leave 55% --actions evict,notify)
check "pressure set changes watermarks" grep -q 'enter 60% (40265319 B), leave 55%' <<<"$out"
check "pressure set changes the order" grep -q '^actions           evict,notify$' <<<"$out"

out=$("$CTL" pressure set --socket "$SOCK" --high-leave 70% 2>&1)
rc=$?
check "leave above enter is refused (exit 2)" test "$rc" -eq 2
check "with a reason" grep -q 'leave' <<<"$out"
out=$("$CTL" pressure --socket "$SOCK")
check "a refused change leaves the settings alone" grep -q 'enter 60% (40265319 B), leave 55%' <<<"$out"
"$CTL" pressure set --socket "$SOCK" --high 2>/dev/null
check "missing value is a usage error" test $? -eq 2
"$CTL" pressure --socket "$SOCK" --high 10% 2>/dev/null
check "settings without set are a usage error" test $? -eq 2

json=$("$CTL" pressure --socket "$SOCK" --json)
check "pressure --json is JSON with the level" python3 -c '
import json, sys
j = json.loads(sys.argv[1])
assert j["level"] == "normal", j
assert j["watermarks"]["high"]["enter"] == "60%", j
assert j["pool"]["total_bytes"] == 64 << 20, j
assert isinstance(j["transitions"], list)
' "$json"

out=$("$CTL" top --socket "$SOCK" --once)
check "top --once shows the pool bar" grep -q '^pool .*\[\.*\] 0 B / 64.0 MiB   0.0%$' <<<"$out"
check "top --once shows compactions" grep -q '^compactions -  total 0  errors 0  p50 -  p99 -$' <<<"$out"
check "top --once shows the retained-mass histogram" grep -q '^retained mass (0 heads)$' <<<"$out"
check "top --once: count frames" test "$("$CTL" top --socket "$SOCK" --count 2 --interval 100 |
	grep -c '^snapkvd  pressure')" -eq 2

"$CTL" top --socket "$D/nope.sock" --once 2>"$D/err"
check "top without a daemon fails (exit 1)" test $? -eq 1
check "and says why" grep -q 'cannot reach snapkvd' "$D/err"

for _ in $(seq 100); do [ -s "$D/snapkvd.prom" ] && break; sleep 0.05; done
check "the textfile is written" test -s "$D/snapkvd.prom"
check "the textfile has the pool" grep -q '^snapkvd_pool_total_bytes 67108864$' "$D/snapkvd.prom"
check "no temporary files left" test "$(ls -A "$D" | grep -c tmp)" -eq 0

kill -TERM "$PID"
wait "$PID"
rc=$?
PID=
check "snapkvd exits 0 on SIGTERM" test "$rc" -eq 0
exit $fail
