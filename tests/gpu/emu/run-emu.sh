#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The CUDA kernels, run on the CPU emulator (tests/gpu/emu), agree with the
# host backend on the smaller cases of gpu-agree: every policy, GQA mode,
# pooling, layout, the tensor-core and FMA paths, NaN detection. This checks
# the kernels' logic, not the GPU; tests/gpu/run.sh does that on a GPU.
set -u
bin="${BUILD:-build}/tests/gpu/emu/gpu-agree-emu"
if [ ! -x "$bin" ]; then
	echo "skip: $bin not built (CUDA=0 or no CUDA headers)"
	exit 0
fi
exec "$bin" snapkv-f32-expand snapkv-f32-grp-max7 snapkv-f32-mha-d80 \
	snapkv-f32-100-layers snapkv-f32-W64-G8 streamingllm-f32 streaming-f32-rows \
	window-f32 bypass-f32 nan-f32 snapkv-bf16-d256 snapkv-bf16-d96 snapkv-bf16-to-f32 \
	snapkv-f16-d64-paged h2o-bf16
