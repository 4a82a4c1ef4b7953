#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-cli-online.sh - `snapkvctl compact` through a running snapkvd writes
# the same bytes as `--offline` (every dtype, both GQA modes, h2o, window
# without query rows); bad input is refused before the daemon is asked; a
# missing daemon is exit 1 with OUT untouched; the daemon keeps serving and
# stops cleanly.
set -u
BUILD=${BUILD:-build}
CTL=$BUILD/snapkvctl
GEN=$BUILD/examples/gen-layer
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-cli-online.XXXXXX")
sock=$tmp/snapkvd.sock
pid=
cleanup() {
	[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
. "$(dirname "$0")/../tally.sh"

"$BUILD/snapkvd" --socket "$sock" --backend host --pool-bytes 64M --threads 2 \
	--log-level warning 2>"$tmp/daemon.log" &
pid=$!
for _ in $(seq 250); do
	[ -S "$sock" ] && break
	sleep 0.02
done
if [ ! -S "$sock" ]; then
	echo "snapkvd did not start: $(cat "$tmp/daemon.log")"
	exit 1
fi

# same NAME IN [options...]: online and offline outputs are identical.
same() {
	local name=$1 in=$2
	shift 2
	rm -f "$tmp/on.st" "$tmp/off.st"
	if "$CTL" compact --socket "$sock" "$in" "$tmp/on.st" -q "$@" 2>"$tmp/err" &&
		"$CTL" compact --offline "$in" "$tmp/off.st" -q "$@" 2>>"$tmp/err" &&
		cmp -s "$tmp/on.st" "$tmp/off.st"; then
		ok "$name: daemon and --offline files are byte-identical"
	else
		not_ok "$name: $(cat "$tmp/err")"
	fi
}

echo "== online == offline"
seed=10
for dt in f32 f16 bf16; do
	for gqa in expand group; do
		seed=$((seed + 1))
		"$GEN" "$tmp/in.st" --layers 2 --h-q 4 --h-kv 2 --head-dim 16 --len 80 --rows 8 \
			--spans 2 --dtype $dt --seed $seed --quiet
		same "$dt $gqa" "$tmp/in.st" --window 6 --capacity 30 --kernel 3 --gqa $gqa
	done
done
"$GEN" "$tmp/h2o.st" --layers 1 --h-q 4 --h-kv 2 --head-dim 8 --len 48 --rows 48 --quiet
same "h2o, all 48 query rows" "$tmp/h2o.st" --policy h2o --window 4 --capacity 16
same "streamingllm, protected range" "$tmp/h2o.st" --policy streamingllm --sinks 2 \
	--capacity 16 --protect 10:14
"$GEN" "$tmp/noq.st" --layers 2 --h-q 2 --h-kv 2 --head-dim 8 --len 40 --rows 0 --quiet
same "window, no query rows" "$tmp/noq.st" --policy window --capacity 12
same "bypass (L < C)" "$tmp/noq.st" --policy window --capacity 64
# Explicit zeros are meant, not "use the default" (SPEC: S = 0 keeps no sinks,
# h2o with r = 0 keeps no recent positions); the daemon must not substitute.
same "streamingllm --sinks 0" "$tmp/h2o.st" --policy streamingllm --sinks 0 --capacity 16
same "h2o --window 0" "$tmp/h2o.st" --policy h2o --window 0 --capacity 16
same "window --window 0 --sinks 0" "$tmp/noq.st" --policy window --window 0 --sinks 0 \
	--capacity 12
same "paged output, block size 8" "$tmp/in.st" --window 6 --capacity 30 --gqa group \
	--out-layout paged --block-size 8
same "paged output, block size 64 (one block)" "$tmp/h2o.st" --policy h2o --window 4 \
	--capacity 16 --out-layout paged --block-size 64

echo "== errors"
echo sentinel >"$tmp/out.st"
head -c 100 "$tmp/in.st" >"$tmp/cut.st"
"$CTL" compact --socket "$sock" "$tmp/cut.st" "$tmp/out.st" 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && [ "$(cat "$tmp/out.st")" = sentinel ] && ok "truncated IN: exit 2, $(cat "$tmp/err")" ||
	not_ok "truncated IN: rc $rc"
"$CTL" compact --socket "$sock" "$tmp/in.st" "$tmp/out.st" --window 6 --capacity 6 2>"$tmp/err"
rc=$?
[ $rc -eq 2 ] && [ "$(cat "$tmp/out.st")" = sentinel ] && ok "C <= W: exit 2, $(cat "$tmp/err")" ||
	not_ok "C <= W: rc $rc"
"$CTL" compact --socket "$tmp/none.sock" "$tmp/in.st" "$tmp/out.st" --window 6 --capacity 30 \
	2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && [ "$(cat "$tmp/out.st")" = sentinel ] && ok "no daemon there: exit 1, $(cat "$tmp/err")" ||
	not_ok "no daemon there: rc $rc"
[ "$(ls -A "$tmp" | grep -c '\.tmp-')" -eq 0 ] && ok "no temporary files left" ||
	not_ok "temporary files left: $(ls -A "$tmp")"

echo "== daemon still serving"
SNAPKV_SOCKET=$sock "$CTL" status >"$tmp/status" 2>&1 && grep -q "requests" "$tmp/status" &&
	ok "snapkvctl status (via \$SNAPKV_SOCKET)" || not_ok "status: $(cat "$tmp/status")"
"$CTL" ledger --socket "$sock" >/dev/null 2>"$tmp/err" && ok "snapkvctl ledger" ||
	not_ok "ledger: $(cat "$tmp/err")"
# --socket before the command as well as after it; after it wins, and both
# beat $SNAPKV_SOCKET.
"$CTL" --socket "$sock" status >"$tmp/status" 2>&1 && grep -q "requests" "$tmp/status" &&
	ok "snapkvctl --socket PATH status" || not_ok "--socket before: $(cat "$tmp/status")"
SNAPKV_SOCKET=$tmp/none.sock "$CTL" --socket="$sock" ledger >/dev/null 2>"$tmp/err" &&
	ok "snapkvctl --socket=PATH ledger beats \$SNAPKV_SOCKET" ||
	not_ok "--socket= before: $(cat "$tmp/err")"
"$CTL" --socket "$tmp/none.sock" status --socket "$sock" >/dev/null 2>"$tmp/err" &&
	ok "--socket after the command wins over one before it" ||
	not_ok "--socket after: $(cat "$tmp/err")"
"$CTL" --socket "$tmp/none.sock" status >/dev/null 2>&1
rc=$?
[ $rc -eq 1 ] && ok "--socket before names the daemon: none there, exit 1" ||
	not_ok "--socket before to nowhere: rc $rc"
"$CTL" --socket >/dev/null 2>&1
rc=$?
[ $rc -eq 2 ] && ok "--socket without PATH: exit 2" || not_ok "--socket without PATH: rc $rc"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] && ok "SIGTERM: snapkvd exits 0" || not_ok "SIGTERM: snapkvd exited $rc"

echo "test-cli-online: $pass passed, $fail failed"
[ $fail -eq 0 ]
