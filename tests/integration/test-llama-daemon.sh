#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-llama-daemon: the tiny-llama engine through a private snapkvd. With
# C > L (bypass) the compact cache in the daemon's arena decodes bit-identically
# to the full cache, in expand and group mode, HND and NHD; a real compaction
# with little headroom grows, appends at L + g, and produces exactly the text
# of the same compaction done in process with libskv; every policy keeps
# protected ranges.
set -u
BUILD=${BUILD:-build}
SHARED=${SHARED:-../shared}
MODEL=${SNAPKV_MODEL:-$SHARED/models/stories260K.gguf}
ENGINE=$BUILD/tiny-llama
DAEMON=$BUILD/snapkvd

echo "test-llama-daemon: tiny-llama through snapkvd"
. "$(dirname "$0")/../tally.sh"
[ -r "$MODEL" ] || skip model "$MODEL not found (set SHARED or SNAPKV_MODEL)"
for b in "$ENGINE" "$DAEMON"; do
	[ -x "$b" ] || { echo "FAIL: $b not built"; exit 1; }
done

dir=$(mktemp -d /tmp/test-llama-daemon.XXXXXX)
sock=$dir/snapkvd.sock
pid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	rm -rf "$dir"
}
trap cleanup EXIT

"$DAEMON" --socket "$sock" --threads 1 --log-level warning 2>"$dir/daemon.log" &
pid=$!
for _ in $(seq 100); do
	[ -S "$sock" ] && break
	sleep 0.05
done
[ -S "$sock" ] || { echo "FAIL: snapkvd did not create $sock"; cat "$dir/daemon.log"; exit 1; }

fails=0
pass() { echo "  ok: $*"; }
fail() { echo "  FAIL: $*"; fails=$((fails + 1)); }

prompt="Lily and Ben went to the park. They saw a big dog. The dog was brown and had a long tail."
steps=48

# 1. Bypass (C > L): identical tokens and bit-identical logits, 4 layouts.
for gqa in expand group; do
	for layout in hnd nhd; do
		out=$("$ENGINE" -m "$MODEL" --socket "$sock" -p "$prompt" -n $steps --policy snapkv \
			-C 400 -W 8 --gqa $gqa --layout $layout --reserve 8 --grow 8 --compare -q 2>&1)
		rc=$?
		what="bypass $gqa $layout"
		if [ $rc -ne 0 ]; then
			fail "$what: exit $rc"; echo "$out"; continue
		fi
		echo "$out" | grep -q "agreement: $steps of $steps tokens agree" ||
			{ fail "$what: tokens differ"; echo "$out"; continue; }
		echo "$out" | grep -q "logits: bit-identical over $((steps - 1)) decode steps" ||
			{ fail "$what: logits differ"; echo "$out"; continue; }
		echo "$out" | grep -Eq "appended $((steps - 1)) .*: ok\), capacity [0-9]+ after [1-9][0-9]* GROW" ||
			{ fail "$what: positions/APPEND/GROW"; echo "$out"; continue; }
		pass "$what: $steps tokens, logits bit-identical, positions L+g, grew"
	done
done

# 2. A real compaction (C = 16 < L): the daemon's cache decodes exactly like
#    libskv in process, positions continue at L + g, GROW when full.
for gqa in expand group; do
	d=$("$ENGINE" -m "$MODEL" --socket "$sock" -p "$prompt" -n $steps --policy snapkv \
		-C 16 -W 8 --gqa $gqa --reserve 4 --grow 4 -q 2>&1)
	rc=$?
	l=$("$ENGINE" -m "$MODEL" --local -p "$prompt" -n $steps --policy snapkv \
		-C 16 -W 8 --gqa $gqa --reserve 4 -q 2>&1)
	what="snapkv C=16 $gqa"
	if [ $rc -ne 0 ]; then
		fail "$what: exit $rc"; echo "$d"; continue
	fi
	echo "$d" | grep -Eq "kept 16, appended $((steps - 1)) .*: ok\), capacity [0-9]+ after [1-9][0-9]* GROW" ||
		{ fail "$what: positions/APPEND/GROW"; echo "$d"; continue; }
	[ "$(echo "$d" | head -n 1)" = "$(echo "$l" | head -n 1)" ] ||
		{ fail "$what: daemon and in-process texts differ"; echo "$d"; echo "$l"; continue; }
	pass "$what: same text as in-process libskv, positions L+g, grew"
done

# 3. Every policy through the daemon, with protected ranges kept in every head.
for pol in snapkv h2o streamingllm window; do
	out=$("$ENGINE" -m "$MODEL" --socket "$sock" -p "$prompt" -n 16 --policy $pol -C 20 -W 8 \
		--protect 1:4 --protect 10:13 --gqa group -q 2>&1)
	rc=$?
	if [ $rc -eq 0 ] && echo "$out" | grep -q "protected ranges: kept in every head" &&
		echo "$out" | grep -Eq "kept 20, appended 15 .*: ok\)"; then
		pass "$pol C=20 with protected ranges"
	else
		fail "$pol C=20 with protected ranges (exit $rc)"; echo "$out"
	fi
done

# 4. Budget modes through the daemon: ragged heads (their own counts, one
#    row block per layer) decode, APPEND and GROW exactly as in process
#    (tl_compact_budget), and a fallback keeps the whole prompt.
for spec in "mass-heads:0.9:9:24" "heads:0.2" "mass:0.9:9:32:4" "mass-heads:0.9:9:24 --fallback-below 0.99"; do
	# shellcheck disable=SC2086 # the spec carries its own options
	d=$("$ENGINE" -m "$MODEL" --socket "$sock" -p "$prompt" -n $steps --policy snapkv \
		-C 24 -W 8 --gqa expand --reserve 4 --grow 4 --compare --budget $spec 2>/dev/null)
	rc=$?
	# shellcheck disable=SC2086
	l=$("$ENGINE" -m "$MODEL" --local -p "$prompt" -n $steps --policy snapkv \
		-C 24 -W 8 --gqa expand --reserve 4 --grow 4 --compare --budget $spec 2>/dev/null)
	what="budget $spec"
	if [ $rc -ne 0 ]; then
		fail "$what: exit $rc"; echo "$d"; continue
	fi
	echo "$d" | grep -Eq "appended $((steps - 1)) .*: ok\), capacity [0-9]+ after [1-9][0-9]* GROW" ||
		{ fail "$what: positions/APPEND/GROW"; echo "$d"; continue; }
	[ "$(echo "$d" | grep -v '^--- daemon cache')" = "$l" ] ||
		{ fail "$what: daemon and in-process outputs differ"; echo "$d"; echo "$l"; continue; }
	case $spec in
	*fallback*) echo "$d" | grep -q "FALLBACK, the full prompt is kept" ||
		{ fail "$what: no fallback"; echo "$d"; continue; } ;;
	esac
	pass "$what: $(echo "$d" | grep -o 'kept per head [0-9.]* mean ([0-9.]*)'), same output as in process, grew"
done

# 5. The daemon is still healthy and shuts down cleanly.
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] && pass "snapkvd exited 0 on SIGTERM" || fail "snapkvd exit status $rc"

if [ $fails -ne 0 ]; then
	echo "test-llama-daemon: $fails failed"
	exit 1
fi
echo "test-llama-daemon: all passed"
