#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# "Impossible to crash from a client" with --backend cuda: the daemon's
# bad-input and fuzz suites (tests/integration) again against snapkvd
# --backend cuda on the emulated plugin (SNAPKVD_TEST_BACKEND=cuda-emu makes
# daemon-harness.h add the flag): bad input, fuzz (jobs of several sessions
# queued on the one worker stream the CUDA runner has: more workers are
# refused, test-daemon-cuda-emu.sh), paged K/V, and the
# budget modes on the CUDA kernels, into the host and the GPU arena, with
# APPEND and GROW there (test-daemon-budget), decision groups on the GPU
# (test-daemon-group: the members' own choices, the group's C* and
# fallback rerun where they differ), a partial window and fp8 K/V refused by
# name (test-daemon-window), and cancel as a fence after the stream
# (test-daemon-cancel). Skipped (exit 77)
# where the emulated plugin is not built (CUDA=0). PLUGIN=build/libskv-cuda.so
# runs the same on a GPU.
set -u
BUILD=${BUILD:-build}
PLUGIN=${PLUGIN:-$BUILD/tests/gpu/emu/libskv-cuda-emu.so}
. "$(dirname "$0")/../../tally.sh"
need_built "$BUILD/snapkvd" "$BUILD/tests/test-daemon-badinput" "$BUILD/tests/test-daemon-fuzz" \
	"$BUILD/tests/test-daemon-paged" "$BUILD/tests/test-daemon-budget" \
	"$BUILD/tests/test-daemon-group" "$BUILD/tests/test-daemon-window" \
	"$BUILD/tests/test-daemon-cancel"
need_cuda "$PLUGIN"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-daemon-suites-cuda.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export SNAPKVD_TEST_BACKEND=cuda-emu
SKV_CUDA_PLUGIN=$(realpath "$PLUGIN")
export SKV_CUDA_PLUGIN
for tw in test-daemon-badinput:1 test-daemon-fuzz:1 test-daemon-paged:1 test-daemon-budget:1 test-daemon-group:1 \
	test-daemon-window:1 test-daemon-cancel:1; do
	t=${tw%:*} w=${tw#*:}
	{
		if SNAPKVD_TEST_WORKERS=$w "$BUILD/tests/$t" >"$tmp/$t.out" 2>&1; then
			ok "$t, --backend cuda, $w worker(s): $(grep -c passed "$tmp/$t.out") tests"
		else
			cat "$tmp/$t.out"
			not_ok "$t, --backend cuda, $w worker(s)"
		fi
	}
done
echo "test-daemon-suites-cuda-emu: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
