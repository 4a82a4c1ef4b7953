#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# demo.sh: the reference paged engine in Python (engine.py) beside a private
# snapkvd: three sequences with a shared system prompt, compacted together,
# decoded together from their paged blocks, each checked against its own full
# cache. Run by `make demo` after the C demo when python3-torch is there.
#   examples/torch-paged/demo.sh   (BUILD=build, PYTHON=/usr/bin/python3,
#                                   model from SNAPKV_MODEL or $SHARED/models)
set -u
BUILD=${BUILD:-build}
SHARED=${SHARED:-../shared}
PYTHON=${PYTHON:-/usr/bin/python3}
MODEL=${SNAPKV_MODEL:-$SHARED/models/stories260K.gguf}
here=$(dirname "$0")

if [ ! -r "$MODEL" ]; then
	echo "torch-paged demo: model $MODEL not found (set SNAPKV_MODEL or SHARED): skipped"
	exit 0
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
	echo "torch-paged demo: $PYTHON cannot import torch (python3-torch): skipped"
	exit 0
fi
if ! ls "$BUILD"/python/snapkv*.so >/dev/null 2>&1; then
	echo "torch-paged demo: the snapkv module is not built (python3-dev): skipped"
	exit 0
fi
dir=$(mktemp -d /tmp/torch-paged-demo.XXXXXX)
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

echo "== torch-paged: starting snapkvd on $sock"
"$BUILD/snapkvd" --socket "$sock" --threads 2 --log-level warning 2>"$dir/snapkvd.log" &
pid=$!
for _ in $(seq 100); do
	[ -S "$sock" ] && break
	sleep 0.05
done
[ -S "$sock" ] || { echo "snapkvd did not start:"; cat "$dir/snapkvd.log"; exit 1; }

PYTHONPATH=$BUILD/python PYTHONDONTWRITEBYTECODE=1 "$PYTHON" "$here/engine.py" -m "$MODEL" \
	--socket "$sock" "$@"
status=$?
kill -TERM "$pid"
wait "$pid" || status=1
pid=
exit $status
