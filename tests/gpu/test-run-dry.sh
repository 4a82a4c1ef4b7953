#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-run-dry: tests/gpu/run.sh --dry-run (no GPU needed) lists what the
# GPU run would do, and that is everything it must: every emulated suite
# whose header says it runs on a GPU (PLUGIN=build/libskv-cuda.so), the
# kernel programs, and compute-sanitizer's memcheck, racecheck and
# synccheck over the kernels and memcheck over snapkvd --backend cuda.
# ok never fails, so `A && ok || not_ok` is an if-then-else here
# shellcheck disable=SC2015
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../tally.sh"
out=$(bash "$here/run.sh" --dry-run 2>&1)
rc=$?
[ $rc -eq 0 ] && ok "run.sh --dry-run: exit 0 without a GPU" || not_ok "--dry-run: exit $rc: $out"
for s in "$here"/emu/*.sh; do
	grep -q 'PLUGIN=build/libskv-cuda.so' "$s" || continue
	n=$(basename "$s")
	grep -q "PLUGIN=build/libskv-cuda.so .*$n" <<<"$out" &&
		ok "$n (says it runs on a GPU) runs there on the real plugin" ||
		not_ok "$n says it runs on a GPU; run.sh does not run it"
done
for p in test-skv-cuda-loader gpu-agree gpu-budget gpu-ipc gpu-engine gpu-bench; do
	grep -q "build/[a-z/]*$p\b" <<<"$out" && ok "runs $p" || not_ok "does not run $p"
done
for t in memcheck racecheck synccheck; do
	grep -q "csan $t .*gpu-agree" <<<"$out" && ok "compute-sanitizer $t over the kernels" ||
		not_ok "no compute-sanitizer $t over the kernels"
done
grep -q "SNAPKVD=build/snapkvd-under-memcheck bash tests/gpu/emu/test-daemon-cuda-emu.sh" <<<"$out" &&
	ok "compute-sanitizer memcheck over snapkvd --backend cuda" ||
	not_ok "the daemon's CUDA path is not run under compute-sanitizer"
grep -q '^export SNAPKV_REQUIRE=all$' "$here/run.sh" && ok "every skip is a failure (SNAPKV_REQUIRE=all)" ||
	not_ok "run.sh does not require what its suites could skip"
echo "test-run-dry: $pass passed, $fail failed"
[ $fail -eq 0 ]
