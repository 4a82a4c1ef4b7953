#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The CUDA kernels, run on the CPU emulator (tests/gpu/emu), agree with the
# host backend on the smaller cases of gpu-agree: every policy, GQA mode,
# pooling, layout, the tensor-core and FMA paths, NaN detection; and the
# two-process test runs on it too. This checks the kernels' logic and the
# plugin's import/arena paths, not the GPU; tests/gpu/run.sh does that on one.
set -u
dir="${BUILD:-build}/tests/gpu/emu"
if [ ! -x "$dir/gpu-agree-emu" ]; then
	echo "skip: $dir/gpu-agree-emu not built (CUDA=0 or no CUDA headers)"
	exit 0
fi
# the engine/daemon pair: VMM fds and IPC handles are memfds on the emulator
"$dir/gpu-ipc-emu" || exit 1
"$dir/gpu-agree-emu" snapkv-f32-expand snapkv-f32-grp-max7 snapkv-f32-mha-d80 \
	snapkv-f32-100-layers snapkv-f32-W64-G8 streamingllm-f32 streaming-f32-rows \
	window-f32 bypass-f32 nan-f32 snapkv-bf16-d256 snapkv-bf16-d96 snapkv-bf16-to-f32 \
	snapkv-f16-d64-paged h2o-bf16
