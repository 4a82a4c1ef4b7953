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
env BUILD="$BUILD" PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -X faulthandler -m pytest \
	-p no:cacheprovider -q -ra "$here" >"$out" 2>&1
rc=$?
cat "$out"
[ $rc -eq 0 ] || exit $rc
# a pass with skipped tests is a skip (-ra listed them with their reasons)
! grep -q '^SKIPPED' "$out" || exit 77
