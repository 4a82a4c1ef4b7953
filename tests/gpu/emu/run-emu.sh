#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The CUDA kernels, run on the CPU emulator (tests/gpu/emu), agree with the
# host backend on the smaller cases of gpu-agree: every policy, GQA mode,
# pooling, layout, the tensor-core and FMA paths, NaN detection, both
# scoring paths (two-pass and fused); and the two-process test runs on it too. This checks the kernels' logic and the
# plugin's import/arena paths, not the GPU; tests/gpu/run.sh does that on one.
set -u
dir="${BUILD:-build}/tests/gpu/emu"
. "$(dirname "$0")/../../tally.sh"
need_cuda "$dir/gpu-agree-emu" "$dir/gpu-ipc-emu" "$dir/test-emu-errors" "$dir/test-emu-devices"
# the emulator reports refused launches as a GPU does
"$dir/test-emu-errors" || exit 1
# and several devices as a multi-GPU node does (current device, peer access)
"$dir/test-emu-devices" || exit 1
# the engine/daemon pair: VMM fds and IPC handles are memfds on the emulator
"$dir/gpu-ipc-emu" || exit 1
# both scoring paths (fused bit-identical to two-pass) where the fused kernel
# runs on the emulator's 4 resident blocks (L <= 1024; 100 layers: several
# items per block, two launches), and its fallbacks: 12 sub-chunks per item
# (grp-max7), shared memory (bf16-d256); the fused grid's blocks take turns
# in a shuffled order (seed 1, or $SKV_EMU_SCHED_SEED)
SKV_EMU_SCHED_SEED=${SKV_EMU_SCHED_SEED:-1} "$dir/gpu-agree-emu" --paths twopass,fused snapkv-f32-expand snapkv-f32-mha-d80 \
	snapkv-f32-100-layers streaming-f32-rows nan-f32 h2o-bf16 snapkv-bf16-grp-1k \
	snapkv-f16-d64-1k snapkv-bf16-d256 snapkv-f32-grp-max7 partial-bf16-1k || exit 1
# two-pass only for the rest
"$dir/gpu-agree-emu" --paths twopass snapkv-f32-W64-G8 streamingllm-f32 window-f32 bypass-f32 \
	snapkv-f16-d64-paged snapkv-bf16-d96 snapkv-bf16-to-f32 partial-f32-grp || exit 1
# span-aware selection (kernels/skv.h): the composite top-k picks the walk's set
"$dir/gpu-agree-emu" --paths twopass span-f32-expand span-f32-grp-max-prot span-bf16-h2o \
	span-partial-bf16 || exit 1
# a fused grid smaller than an item's sub-chunks can never finish an item:
# its blocks give up after their bound (10 s of the emulator's virtual time)
# and the request fails with -EIO instead of hanging; with the bound out of
# reach (1000 s) the emulator must report the deadlock and abort
out=$(SKV_CUDA_FUSED_GRID=3 "$dir/gpu-agree-emu" --paths fused snapkv-f32-mha-d80 2>&1)
rc=$?
if [ $rc -ne 1 ] || ! grep -q "cuda -5 (layer 0: fused scoring stalled" <<<"$out"; then
	echo "FAIL: a 3-block fused grid for 4 sub-chunks per item did not fail with -EIO (rc $rc)"
	echo "$out" | tail -n 5
	exit 1
fi
echo "fused stall bound: PASS ($(grep -o 'fused scoring stalled[^:]*' <<<"$out"))"
out=$( (ulimit -c 0; SKV_CUDA_FUSED_GRID=3 SKV_CUDA_FUSED_WAIT_MS=1000000 \
	exec "$dir/gpu-agree-emu" --paths fused snapkv-f32-mha-d80) 2>&1)
rc=$?
if [ $rc -eq 0 ] || ! grep -q "emu: deadlock" <<<"$out"; then
	echo "FAIL: an unbounded fused wait that cannot end was not reported (rc $rc)"
	echo "$out" | tail -n 5
	exit 1
fi
echo "deadlock detection: PASS (3 resident blocks, 4 sub-chunks per item: $(grep -c 'emu:   block' <<<"$out") blocks reported)"
