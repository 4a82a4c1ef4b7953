#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-cli-top.sh - `snapkvctl top` on a real terminal (a tmux pane): the
# frame fits the pane (no line wider, no more lines than it has, the header
# on the first row even at 8 rows), a resize redraws at once (before the
# next refresh), q quits without Enter, and the terminal is put back
# (canonical mode and echo) when it exits; the daemon exits 0 on SIGTERM.
# The waits are for events, each bounded by a generous hang guard (20 s,
# below the 60 s refresh, so a redraw still proves the resize).
set -u
BUILD=${BUILD:-build}
command -v tmux >/dev/null || {
	echo "test-cli-top: tmux is not installed (scripts/deps.sh installs it)"
	exit 1
}
BUILD=$(realpath "$BUILD")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-cli-top.XXXXXX")
sock=$tmp/snapkvd.sock
# a private tmux server: never the user's
tm() { tmux -S "$tmp/tmux.sock" "$@"; }
pid=
cleanup() {
	tm kill-server 2>/dev/null
	[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
. "$(dirname "$0")/../tally.sh"

"$BUILD/snapkvd" --socket "$sock" --backend host --pool-bytes 64M --threads 1 \
	--log-level warning 2>"$tmp/daemon.log" &
pid=$!
for _ in $(seq 250); do
	[ -S "$sock" ] && break
	sleep 0.02
done
[ -S "$sock" ] || {
	echo "snapkvd did not start: $(cat "$tmp/daemon.log")"
	exit 1
}
# a tenant line too, so the frame is taller than the small pane
"$BUILD/snapkv-engine" --socket "$sock" --name top-test >/dev/null 2>&1

screen() { tm capture-pane -p -t top; }
# wait_for TEXT: until the pane shows TEXT (20 s at most: a hang guard)
wait_for() {
	for _ in $(seq 1000); do
		screen | grep -q -- "$1" && return 0
		sleep 0.02
	done
	return 1
}
fits() { # fits COLS ROWS: every line of the pane within COLS, at most ROWS lines
	screen | awk -v c="$1" -v r="$2" 'length($0) > c {bad = 1} END {exit bad || NR > r}'
}

# 60 x 8: narrower than the pool line and shorter than the frame. The
# refresh interval (60 s) is longer than the test: whatever changes on the
# screen was drawn for the resize, not by a refresh.
tm -f /dev/null new-session -d -s top -x 60 -y 8 \
	"$BUILD/snapkvctl top --socket $sock --interval 60000; stty -a > $tmp/stty; sleep 30"
wait_for "snapkvd  pressure" && ok "top draws its first frame in a tmux pane" ||
	not_ok "no frame: $(screen)"
fits 60 8 && ok "60x8: no line wider than 60, no more than 8 lines" ||
	not_ok "60x8 frame does not fit: $(screen | cat -A | head -20)"
screen | head -1 | grep -q "^snapkvd  pressure" && ok "the header stays on the first row" ||
	not_ok "first row: $(screen | head -1)"
screen | grep -q "^pool " && ok "the pool line is there, clipped, not wrapped" ||
	not_ok "no pool line: $(screen)"
w1=$(screen | awk '/^pool / {print length($0)}')

tm resize-window -t top -x 120 -y 30
for _ in $(seq 1000); do
	w2=$(screen | awk '/^pool / {print length($0)}')
	[ -n "$w2" ] && [ "$w2" -gt 60 ] && break
	sleep 0.02
done
[ -n "$w2" ] && [ "$w2" -gt 60 ] && [ "$w2" -le 120 ] &&
	ok "SIGWINCH: redrawn at 120 columns before the next refresh (pool line $w1 -> $w2)" ||
	not_ok "after the resize the pool line is $w2 wide: $(screen)"
fits 120 30 && screen | grep -q "retained mass" && ok "120x30: the whole frame, fitted" ||
	not_ok "120x30: $(screen)"

tm send-keys -t top q
for _ in $(seq 1000); do
	[ -s "$tmp/stty" ] && break
	sleep 0.02
done
[ -s "$tmp/stty" ] && ok "q (no Enter) quits" || not_ok "q did not quit: $(screen)"
grep -qw icanon "$tmp/stty" && grep -qw echo "$tmp/stty" &&
	ok "the terminal is back in canonical mode with echo" ||
	not_ok "terminal left raw: $(cat "$tmp/stty")"

kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] && ok "SIGTERM: snapkvd exits 0" || not_ok "SIGTERM: snapkvd exited $rc: $(cat "$tmp/daemon.log")"

echo "test-cli-top: $pass passed, $fail failed"
[ $fail -eq 0 ]
