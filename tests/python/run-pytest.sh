#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run-pytest: the snapkv Python module's tests (tests/python/, pytest) against
# private snapkvd daemons they start on temporary sockets. pytest's summary
# line is the result. Skipped (exit 0, saying why) when the module was not
# built because $PYTHON has no development headers.
set -u
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)

echo "run-pytest: the snapkv module under pytest ($PYTHON)"
if ! ls "$BUILD"/python/snapkv*.so >/dev/null 2>&1; then
	echo "SKIP: $BUILD/python/snapkv*.so not built (python3-dev missing for $PYTHON)"
	exit 0
fi
if ! "$PYTHON" -c 'import pytest, numpy' 2>/dev/null; then
	echo "FAIL: $PYTHON cannot import pytest and numpy (python3-pytest, python3-numpy)"
	exit 1
fi
cd "$here/../.." || exit 1
exec env BUILD="$BUILD" PYTHONDONTWRITEBYTECODE=1 "$PYTHON" -X faulthandler -m pytest -p no:cacheprovider -q -ra "$here"
