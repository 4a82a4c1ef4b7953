#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# demo.sh: two tiny-llama engines beside one snapkvd, with different prompts
# at once. Each prefills its prompt, hands K/V and window queries to the
# daemon, decodes its story from the compact cache in the daemon's arena,
# and compares with its own full cache. While both caches are alive the
# daemon's ledger is shown (snapkvctl ledger); then the same prompt runs with
# a retained-mass budget and with a fallback; then the daemon stops.
#
#   examples/tiny-llama/demo.sh        (BUILD=build, model from SNAPKV_MODEL
#                                       or $SHARED/models, SHARED=../shared)
# Without the model file it says so and runs the daemon demo on generated
# K/V instead (examples/demo-daemon.sh), when that exists.
set -u
BUILD=${BUILD:-build}
SHARED=${SHARED:-../shared}
MODEL=${SNAPKV_MODEL:-$SHARED/models/stories260K.gguf}
ENGINE=$BUILD/tiny-llama
DAEMON=$BUILD/snapkvd
CTL=$BUILD/snapkvctl

if [ ! -r "$MODEL" ]; then
	echo "tiny-llama demo: model $MODEL not found (set SNAPKV_MODEL or SHARED)."
	fallback=$(dirname "$0")/../demo-daemon.sh
	if [ -x "$fallback" ]; then
		echo "tiny-llama demo: running the daemon demo on generated K/V instead."
		exec env BUILD="$BUILD" "$fallback"
	fi
	echo "tiny-llama demo: skipped, nothing real to decode"
	exit 0
fi
for b in "$ENGINE" "$DAEMON"; do
	[ -x "$b" ] || { echo "tiny-llama demo: $b not built (run make)" >&2; exit 1; }
done

dir=$(mktemp -d /tmp/tiny-llama-demo.XXXXXX)
sock=$dir/snapkvd.sock
pid=
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	rm -rf "$dir"
}
trap cleanup EXIT

echo "== starting snapkvd on $sock"
"$DAEMON" --socket "$sock" --threads 2 --log-level warning 2>"$dir/snapkvd.log" &
pid=$!
for _ in $(seq 100); do
	[ -S "$sock" ] && break
	sleep 0.05
done
[ -S "$sock" ] || { echo "snapkvd did not start:"; cat "$dir/snapkvd.log"; exit 1; }

# Two stories of about 320 tokens (the model was trained on 512-token ones).
prompt_a='Once upon a time, there was a little dog named Max. Max lived in a small house with a girl called Lily. Every day, Lily and Max went to the park. Max loved to run on the green grass and chase the birds. Lily liked to sit under a big tree and read her book. One sunny day, Max found a big red ball under the tree. He picked it up with his mouth and ran to Lily. Lily laughed and threw the ball far away. Max ran very fast to get it. He brought it back again and again. Then a boy named Tom came to the park. Tom saw the red ball and wanted to play too. Lily said, "You can play with us, Tom!" Tom was very happy. The three friends played with the ball all afternoon. Then Tom kicked the ball very high, and it went over the fence.'
prompt_b='Sara had a small garden behind her house. Every morning she gave water to the flowers and talked to the birds. She had red flowers, yellow flowers and a tall sunflower. Her mom helped her plant new seeds in the spring. One day, a little bird did not sing. Sara was worried. She looked at the bird and saw that its wing was hurt. Sara took the bird inside and made a soft bed for it in a box. She gave the bird some water and some seeds. Her mom said, "We must be gentle with the bird. It needs to rest." Every day, Sara sat next to the box and sang a song for the bird. After many days, the bird began to move its wing again. One morning, the bird flew around the room and sang a happy song. Sara opened the window and the bird flew out to the garden.'

# Both engines hold their caches a moment after decoding so the ledger sees them.
"$ENGINE" -m "$MODEL" --socket "$sock" --name engine-a -p "$prompt_a" -n 64 \
	--policy snapkv -C 48 -W 8 -k 5 --pool avg --gqa expand --layout hnd \
	--reserve 16 --compare --pause-before-release 1500 >"$dir/a.out" 2>"$dir/a.err" &
pids+=($!)
"$ENGINE" -m "$MODEL" --socket "$sock" --name engine-b -p "$prompt_b" -n 64 \
	--policy snapkv -C 32 -W 8 -k 7 --pool max --gqa group --layout nhd \
	--reserve 16 --compare --pause-before-release 1500 >"$dir/b.out" 2>"$dir/b.err" &
pids+=($!)

# Wait until both have decoded (they print their cache line), then ask the daemon.
for _ in $(seq 200); do
	grep -q "^--- daemon cache" "$dir/a.out" 2>/dev/null &&
		grep -q "^--- daemon cache" "$dir/b.out" 2>/dev/null && break
	sleep 0.05
done
echo
echo "== snapkvctl ledger (both engines' caches alive)"
if [ -x "$CTL" ]; then
	SNAPKV_SOCKET=$sock "$CTL" ledger || echo "(snapkvctl ledger failed)"
else
	echo "(snapkvctl not built: $CTL)"
fi

status=0
for i in 0 1; do
	wait "${pids[$i]}" || status=1
done
pids=()
for e in a b; do
	echo
	echo "== engine-$e ($(grep -o 'compact cache keeps.*' "$dir/$e.err"))"
	sed -n '1,/^--- full cache:/p' "$dir/$e.out" | sed '$d'
	echo "-- the same engine decoding from its full cache:"
	sed -n '/^--- full cache:/,/^--- agreement/p' "$dir/$e.out" | sed '1d;$d'
	grep -E '^--- (agreement|teacher-forced|daemon cache)' "$dir/$e.out"
	grep -v 'compact cache keeps' "$dir/$e.err" || true
done

# Budgets that follow the prompt (SPEC.md budget modes), through the daemon:
# a retained-mass target picks each head's count (a ragged cache: one row
# block per layer, each head its own count), and a fallback keeps the whole
# prompt when some head would lose too much of it.
for spec in "mass-heads:0.9:9:48" "mass-heads:0.9:9:48 --fallback-below 0.8"; do
	echo
	echo "== engine-a, --budget $spec (snapkvd)"
	# shellcheck disable=SC2086 # the spec carries its own options
	if "$ENGINE" -m "$MODEL" --socket "$sock" --name engine-a -p "$prompt_a" -n 64 \
		--policy snapkv -C 48 -W 8 -k 5 --pool avg --gqa expand --reserve 16 --compare \
		--budget $spec \
		>"$dir/m.out" 2>"$dir/m.err"; then
		grep -E '^--- (budget|agreement|teacher-forced|daemon cache)' "$dir/m.out"
	else
		cat "$dir/m.err"
		status=1
	fi
done

echo
echo "== stopping snapkvd"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] && echo "snapkvd exited cleanly" || { echo "snapkvd exit status $rc"; status=1; }
exit $status
