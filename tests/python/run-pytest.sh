#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run-pytest: the snapkv Python module's tests (tests/python/, pytest) against
# private snapkvd daemons they start on temporary sockets. pytest's summary
# line is the result. Skipped (exit 77, saying why) when the module was not
# built because $PYTHON has no development headers, and when pytest skipped
# a test (its reasons read "SKIP(WHAT): ...", conftest.py's skip_unless).
set -u
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)

. "$here/../tally.sh"
echo "run-pytest: the snapkv module under pytest ($PYTHON)"
ls "$BUILD"/python/snapkv*.so >/dev/null 2>&1 ||
	skip python "$BUILD/python/snapkv*.so not built (python3-dev missing for $PYTHON)"
if ! "$PYTHON" -c 'import pytest, numpy' 2>/dev/null; then
	echo "FAIL: $PYTHON cannot import pytest and numpy (python3-pytest, python3-numpy)"
	exit 1
fi
cd "$here/../.." || exit 1
out=$(mktemp "${TMPDIR:-/tmp}/run-pytest.XXXXXX")
trap 'rm -f "$out"' EXIT
# A module built with ASan (make check-sanitize) runs in an uninstrumented
# interpreter: the runtime is preloaded into it, and CPython's own leaks at
# exit are not ours (detect_leaks=0 for the interpreter only: conftest.py
# gives the daemons it starts the run's options back, leak checks included).
pre=()
so=$(ls "$BUILD"/python/snapkv*.so | head -n 1)
if readelf -d "$so" | grep -q 'NEEDED.*libasan'; then
	asan=$(readelf -d "$so" | sed -n 's/.*NEEDED.*\[\(libasan[^]]*\)\].*/\1/p')
	asan=$(ldconfig -p | awk -v n="$asan" '$1 == n {print $NF; exit}')
	[ -n "$asan" ] || { echo "FAIL: the ASan runtime of $so is not found"; exit 1; }
	echo "run-pytest: $so is built with ASan: $asan preloaded into $PYTHON"
	pre=(SNAPKV_PYTEST_DAEMON_ASAN_OPTIONS="${ASAN_OPTIONS:-}" LD_PRELOAD="$asan"
		ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
fi
env "${pre[@]}" BUILD="$BUILD" PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -X faulthandler -m pytest \
	-p no:cacheprovider -q -ra "$here" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc -eq 0 ] || exit $rc
# a pass with skipped tests is a skip (-ra listed them with their reasons),
# counted and named in the SKIP line run-tests.sh reports
n=$(grep -c '^SKIPPED' "$out")
[ "$n" -eq 0 ] || skip python "$n pytest tests skipped, the others passed: $(grep '^SKIPPED' "$out" |
	sed 's/^SKIPPED \[[0-9]*\] [^ ]*: //' | sort -u | head -n 2 | paste -sd ';')"
