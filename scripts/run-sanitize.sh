#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `make check-sanitize`: runs test programs and scripts built with
# -fsanitize=address,undefined (in their own build tree) through
# scripts/run-tests.sh, every sanitizer halting on its first report, leaks
# checked. A daemon or engine child that a test starts may die of a report,
# or report a leak at exit, without the test noticing, so reports are also
# looked for apart from the tests' verdicts: ASan/LSan write theirs to files
# (one per process); UBSan ignores log_path when linked with ASan (gcc 12),
# so its "runtime error:" lines are found in the output. Any report fails
# the run. Usage: run-sanitize.sh PROG... [-- SCRIPT...]  (BUILD, SHARED as
# for run-tests.sh)
set -u -o pipefail
BUILD=${BUILD:-build-san}
logs=$BUILD/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:exitcode=86:log_path=$logs/asan:log_exe_name=1:detect_stack_use_after_return=1:strict_string_checks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87"
export LSAN_OPTIONS="exitcode=88"
rc=0
"$(dirname "$0")/run-tests.sh" "$@" 2>&1 | tee "$logs/output" || rc=1
mv "$logs/output" "$BUILD/sanitizer-output.log"
reports=$(find "$logs" -type f | sort)
ub=$(grep -c 'runtime error:' "$BUILD/sanitizer-output.log")
if [ -n "$reports" ] || [ "$ub" -gt 0 ]; then
	echo
	echo "sanitizer reports: $(echo "$reports" | grep -c .) from ASan/LSan, $ub from UBSan"
	for f in $reports; do
		echo "=== $f"
		cat "$f"
	done
	[ "$ub" -gt 0 ] && grep -A12 'runtime error:' "$BUILD/sanitizer-output.log"
	rc=1
else
	echo "sanitizer reports: none"
fi
exit $rc
