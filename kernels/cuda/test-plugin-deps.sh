#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# libskv-cuda.so must load where no NVIDIA driver is: no NEEDED entry for
# libcuda or a shared cudart, and only skv_cuda_* exported.
set -u
so="${BUILD:-build}/libskv-cuda.so"
. "$(dirname "$0")/../../tests/tally.sh"
need_cuda "$so"
fail=0
needed=$(readelf -d "$so" | awk '/NEEDED/ {print $NF}' | tr -d '[]')
echo "NEEDED: $(echo "$needed" | tr '\n' ' ')"
if echo "$needed" | grep -Eq '^lib(cuda|cudart)\.so'; then
	echo "FAIL: $so links the CUDA driver or a shared cudart"
	fail=1
fi
bad=$(nm -D --defined-only "$so" | awk '$2 ~ /[TDBR]/ {print $3}' | grep -v '^skv_cuda_' || true)
if [ -n "$bad" ]; then
	echo "FAIL: exported symbols outside skv_cuda_*:"
	echo "$bad" | head -20
	fail=1
fi
[ $fail -eq 0 ] && echo "PASS: $so has no libcuda dependency and exports only skv_cuda_*"
exit $fail
