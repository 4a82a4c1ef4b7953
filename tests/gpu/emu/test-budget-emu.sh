#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The budget modes of SPEC.md on the CUDA kernels, run on the CPU emulator
# (tests/gpu/emu): skv_cuda_compact_budget() bit-identical to the host's
# skv_compact_budget() on random cases of every mode (exact votes: see
# tests/gpu/gpu-budget.c), the same refusals with the same messages, and
# uniform through the budget entry byte-identical to skv_cuda_compact().
set -u
prog="${BUILD:-build}/tests/gpu/emu/gpu-budget-emu"
. "$(dirname "$0")/../../tally.sh"
need_cuda "$prog"
"$prog" --cases "${BUDGET_CASES:-6}" --seed "${BUDGET_SEED:-20261202}" || exit 1
# the fused scoring path feeds the same votes to the budget kernels
"$prog" --score fused --cases 1 --seed 11
