#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-skips: a skip is a skip. scripts/run-tests.sh counts exit 77 as
# skipped (never passed) and lists each skip with its reason, prints "N
# passed, N failed, N skipped" alone on a line, and SNAPKV_REQUIRE turns the
# skips it names into failures; every script that can skip, pointed at an
# empty build tree, exits 77 or fails, never 0; a CUnit program with tests it
# cannot run (tests/test-skip.h) exits 77, its summary counting them
# inactive, and 1 where they are required.
# ok never fails, so `A && ok || not_ok` is an if-then-else here
# shellcheck disable=SC2015
set -u
BUILD=${BUILD:-build}
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
. "$here/../tally.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-skips.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
unset SNAPKV_REQUIRE CUDA

echo "== run-tests.sh"
printf '#!/bin/sh\necho fine\n' >"$tmp/p-pass"
printf '#!/bin/sh\necho "SKIP(cuda): no plugin here"\nexit 77\n' >"$tmp/p-skip"
printf '#!/bin/sh\nexit 3\n' >"$tmp/p-fail"
printf 'echo "SKIP(model): no model"; exit 77\n' >"$tmp/s-skip.sh"
chmod +x "$tmp"/p-*
"$top/scripts/run-tests.sh" "$tmp/p-pass" "$tmp/p-skip" "$tmp/p-fail" -- "$tmp/s-skip.sh" \
	>"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -qx '1 passed, 1 failed, 2 skipped' "$tmp/out" &&
	ok "exit 0, 77, 3 and a 77 script: '1 passed, 1 failed, 2 skipped', exit 1" ||
	not_ok "tally (exit $rc): $(tail -n 5 "$tmp/out")"
grep -qx "SKIPPED: $tmp/p-skip: SKIP(cuda): no plugin here" "$tmp/out" &&
	grep -qx "SKIPPED: $tmp/s-skip.sh: SKIP(model): no model" "$tmp/out" &&
	grep -qx "FAILED: $tmp/p-fail (exit 3)" "$tmp/out" &&
	ok "skips listed with their reasons, the failure with its status" ||
	not_ok "listing: $(tail -n 5 "$tmp/out")"
"$top/scripts/run-tests.sh" "$tmp/p-pass" "$tmp/p-skip" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -qx '1 passed, 0 failed, 1 skipped' "$tmp/out" &&
	ok "a skip alone does not fail the run" || not_ok "skip alone: exit $rc $(tail -n 3 "$tmp/out")"
SNAPKV_REQUIRE=python,cuda "$top/scripts/run-tests.sh" "$tmp/p-skip" -- "$tmp/s-skip.sh" \
	>"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -qx '0 passed, 1 failed, 1 skipped' "$tmp/out" &&
	grep -q "skipped for want of cuda, which SNAPKV_REQUIRE requires" "$tmp/out" &&
	ok "SNAPKV_REQUIRE=python,cuda: the cuda skip fails, the model skip stays a skip" ||
	not_ok "require: exit $rc $(tail -n 4 "$tmp/out")"

echo "== scripts that can skip, on an empty build tree"
mkdir -p "$tmp/empty"
for s in tests/gpu/emu/run-emu.sh tests/gpu/emu/test-budget-emu.sh \
	tests/gpu/emu/test-daemon-cuda-emu.sh tests/gpu/emu/test-daemon-gpubuf-emu.sh \
	tests/gpu/emu/test-daemon-suites-cuda-emu.sh kernels/cuda/test-plugin-deps.sh \
	tests/python/run-pytest.sh tests/integration/test-llama-daemon.sh; do
	(cd "$top" && BUILD=$tmp/empty SNAPKV_MODEL=$tmp/none.gguf timeout 60 bash "$s") \
		>"$tmp/out" 2>&1
	rc=$?
	why=$(grep -m1 -o 'SKIP([a-z]*): .*\|FAIL.*' "$tmp/out")
	if [ $rc -eq 77 ] && grep -q '^ *SKIP([a-z]*): ' "$tmp/out"; then
		ok "$s: skipped, saying why ($why)"
	elif [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
		ok "$s: fails (exit $rc: $why)"
	else
		not_ok "$s: exit $rc: $(tail -n 3 "$tmp/out")"
	fi
	# where make says CUDA=1, a missing CUDA build is a failure, not a skip
	case $s in *emu* | *plugin-deps*)
		(cd "$top" && BUILD=$tmp/empty CUDA=1 timeout 60 bash "$s") >"$tmp/out" 2>&1
		rc=$?
		[ $rc -ne 0 ] && [ $rc -ne 77 ] && ok "$s, CUDA=1: fails (exit $rc)" ||
			not_ok "$s, CUDA=1: exit $rc $(tail -n 3 "$tmp/out")"
		SNAPKV_REQUIRE=cuda,python,model BUILD=$tmp/empty timeout 60 bash "$top/$s" \
			>"$tmp/out" 2>&1
		rc=$?
		[ $rc -ne 0 ] && [ $rc -ne 77 ] && ok "$s, SNAPKV_REQUIRE: fails (exit $rc)" ||
			not_ok "$s, SNAPKV_REQUIRE: exit $rc $(tail -n 3 "$tmp/out")"
		;;
	esac
done

echo "== a CUnit program with tests it cannot run (test-llama without the model)"
llama=$BUILD/tests/unit/test-llama
need_built "$llama"
SHARED=$tmp/none "$llama" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 77 ] && grep -q '^SKIP(model): model_shape: ' "$tmp/out" &&
	grep -Eq '^ +tests +15 +5 +5 +0 +10$' "$tmp/out" &&
	ok "exit 77, 10 tests inactive (not passed) in CUnit's summary, each SKIP(model)" ||
	not_ok "test-llama without the model: exit $rc $(grep -E 'tests |SKIP' "$tmp/out" | head -3)"
SNAPKV_REQUIRE=model SHARED=$tmp/none "$llama" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -Eq '^ +tests +25 +15 +5 +10 +10$' "$tmp/out" &&
	ok "SNAPKV_REQUIRE=model: exit 1, 10 failed 'required' tests" ||
	not_ok "test-llama, model required: exit $rc $(grep -E 'tests ' "$tmp/out")"

echo "test-skips: $pass passed, $fail failed"
[ $fail -eq 0 ]
