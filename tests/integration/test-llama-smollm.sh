#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-llama-smollm: tiny-llama on a real model, SmolLM2-135M-Instruct
# (scripts/get-model.sh; Q4_1 weights, byte-level BPE, GQA 3:1, 30 layers).
# The tokenizer splits digits and spaces as the vocabulary dictates; with the
# full cache, greedy decoding answers a passkey asked after ~1K tokens of
# licence text; through a private snapkvd, a compaction to a tenth of that
# prompt with the question's window decodes with the daemon's position table
# right (the answer is shown, not asserted: accuracy is `make bench-longctx`'s).
# Without the model (offline) it exits 77, skipped, saying why;
# SNAPKV_REQUIRE=model makes that a failure.
set -u
BUILD=${BUILD:-build}
ENGINE=$BUILD/tiny-llama
DAEMON=$BUILD/snapkvd
here=$(cd "$(dirname "$0")/../.." && pwd)

. "$here/tests/tally.sh"

echo "test-llama-smollm: tiny-llama on SmolLM2-135M-Instruct"
need_built "$ENGINE" "$DAEMON"
MODEL=$("$here/scripts/get-model.sh") ||
	skip model "SmolLM2 unavailable (scripts/get-model.sh failed: offline?); stories260K is covered by test-llama"

dir=$(mktemp -d /tmp/test-llama-smollm.XXXXXX)
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
fails=0
pass() { echo "  ok: $*"; }
fail() { echo "  FAIL: $*"; fails=$((fails + 1)); }
export OPENBLAS_NUM_THREADS=1

# 1. Tokenizer: every digit its own token ('0' is 32), the space before a
# number its own piece (216 'Ġ'), words with their space (314 'Ġis'); the
# chat template's control tokens from the text (1 <|im_start|>, 2 <|im_end|>).
out=$("$ENGINE" -m "$MODEL" -p "The pass key is 48213." --print-tokens 2>&1)
want="tokens 11: 504 1301 1646 314 216 36 40 34 33 35 30"
[ "$out" = "$want" ] && pass "tokens of 'The pass key is 48213.'" ||
	fail "tokens of 'The pass key is 48213.': got '$out', want '$want'"
out=$("$ENGINE" -m "$MODEL" --chat -p "Hi" --print-tokens 2>&1)
case "$out" in
"tokens 31: 1 9690 198 "*" 2 198 1 4093 198 "*" 2 198 1 520 9531 198") pass "chat template" ;;
*) fail "chat template: $out" ;;
esac

# 2. Passkey at ~1K tokens, full cache, greedy.
/usr/bin/python3 "$here/bench/longctx/make-prompt.py" --seed 1 --tokens 1024 --out "$dir/p" ||
	{ echo "FAIL: make-prompt.py"; exit 1; }
key=$(cat "$dir/p/key.txt")
q=$(cat "$dir/p/question.txt")
out=$("$ENGINE" -m "$MODEL" -f "$dir/p/doc.txt" --question "$q" -n 12 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q "$key" <<<"$out"; then
	pass "passkey $key at ~1K tokens, full cache: $(head -n1 <<<"$out")"
else
	fail "passkey $key at ~1K tokens, full cache (exit $rc): $out"
fi

# 3. The same prompt through snapkvd, C = 100 (about 10 %), W = the question.
"$DAEMON" --socket "$sock" --threads 1 --log-level warning 2>"$dir/daemon.log" &
pid=$!
for _ in $(seq 100); do
	[ -S "$sock" ] && break
	sleep 0.05
done
[ -S "$sock" ] || { echo "FAIL: snapkvd did not create $sock"; cat "$dir/daemon.log"; exit 1; }
out=$("$ENGINE" -m "$MODEL" --socket "$sock" -f "$dir/p/doc.txt" --question "$q" -n 12 \
	--policy snapkv -C 100 -W question --reserve 4 --grow 4 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q "^--- daemon cache .*: ok), capacity .* after [1-9][0-9]* GROW" <<<"$out"; then
	pass "through snapkvd, C 100, W question: positions ok, GROW; answer: $(sed -n '/snapkv$/{n;p}' <<<"$out")"
else
	fail "through snapkvd (exit $rc): $out"
fi

[ $fails -eq 0 ] || { echo "test-llama-smollm: $fails failed"; exit 1; }
echo "test-llama-smollm: all passed"
