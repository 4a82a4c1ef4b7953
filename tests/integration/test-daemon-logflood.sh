#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-daemon-logflood: a flood of connections makes no flood of log lines
# (issue 20, point 10). 1,500 connections that never say HELLO, past
# max_handshakes = 8 (each new one evicts the oldest), then 300 refused
# HELLOs (uid not allowed) and 300 bad frames: at most one line per cause
# per 10 s of the flood, plus the summary at shutdown, never a line per
# connection; the summaries' counts add up to every connection. The
# daemon logs at info to stderr, as under systemd.
set -euo pipefail
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
D=$BUILD/snapkvd
tmp=$(mktemp -d /tmp/snapkvd-logflood-XXXXXX)
dpid=
cleanup() {
	[ -n "$dpid" ] && kill -KILL "$dpid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

sock=$tmp/s.sock
run() { # run CONFIG: a daemon until flood.py is done, its stderr in $tmp/log
	printf '%s\n' "$1" >"$tmp/snapkvd.conf"
	"$D" --socket "$sock" --log-level info --config "$tmp/snapkvd.conf" 2>"$tmp/log" &
	dpid=$!
	for _ in $(seq 1000); do [ -S "$sock" ] && break; sleep 0.01; done
	[ -S "$sock" ] || fail "daemon did not start"
}
stop() {
	# accepts are FIFO: once snapkvctl is answered (or refused, in 3.),
	# every flood connection was accepted (and is closed by now or at
	# shutdown)
	SNAPKV_SOCKET=$sock "$BUILD/snapkvctl" status >/dev/null 2>&1 || [ "${1:-}" = refused ] ||
		fail "status"
	kill -TERM "$dpid"
	wait "$dpid" || fail "daemon exit status $?"
	dpid=
}

# the flood: N connections, each closed by the client after the next one
# (the daemon evicts the oldest past max_handshakes first); MODE silent
# sends nothing, bad a broken frame
cat >"$tmp/flood.py" <<'EOF'
import socket, struct, sys, time
path, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t0 = time.monotonic()
prev = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    if mode == "bad":
        s.send(b"XXXX" + bytes(12))
    prev.append(s)
    if len(prev) > 16:
        prev.pop(0).close()
for s in prev:
    s.close()
print(f"{time.monotonic() - t0:.1f}")
EOF

lines() { grep -c "$1" "$tmp/log" || true; }
# the counts in a cause's lines: 1 for its first line, N for each "N more"
counted() {
	awk -v pat="$1" 'index($0, pat) { n = 0; if (match($0, /: [0-9]+ more /))
		n = substr($0, RSTART + 2, RLENGTH - 8); else n = 1; sum += n } END { print sum + 0 }' \
		"$tmp/log"
}
allowed() { # lines allowed for a flood of S seconds: one per 10 s window, + the shutdown summary
	echo $(( ${1%.*} / 10 + 2 ))
}

# judge WHAT NEEDLE SECS WANT [ALL]: the log of a flood of WHAT lasting SECS:
# at least one line naming NEEDLE and at most one per 10 s window (+ the
# shutdown summary), their counts adding up to WANT; ALL: under 20 lines in all
judge() {
	local what=$1 needle=$2 secs=$3 want=$4 all=${5:-} n c max
	n=$(lines "$needle")
	max=$(allowed "$secs")
	echo "$what in ${secs}s: $n log lines (allowed $max)"
	[ "$n" -ge 1 ] && [ "$n" -le "$max" ] || { cat "$tmp/log"; fail "$n lines for $what"; }
	c=$(counted "$needle")
	[ "$c" -eq "$want" ] || { cat "$tmp/log"; fail "the lines count $c, not $want, for $what"; }
	[ -z "$all" ] || [ "$(wc -l <"$tmp/log")" -lt 20 ] ||
		{ cat "$tmp/log"; fail "$(wc -l <"$tmp/log") lines in all"; }
}

# 1. silent connections past max_handshakes
run "max_handshakes = 8"
secs=$("$PYTHON" "$tmp/flood.py" "$sock" 1500 silent)
stop
judge "1500 silent connections" "before they held a session" "$secs" 1500 all

# 2. bad frames (each closes its session)
run "max_handshakes = 8"
secs=$("$PYTHON" "$tmp/flood.py" "$sock" 300 bad)
stop
judge "300 bad frames" "bad frame" "$secs" 300 all

# 3. refused at connect (uid not allowed), then closed
run "allow_uids = 4000000"
secs=$("$PYTHON" "$tmp/flood.py" "$sock" 300 silent)
stop refused
# 300 refusals and snapkvctl's own
judge "300 refused connections" "not allowed" "$secs" 301
echo "test-daemon-logflood: ok"
