#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# demo-offline.sh - `make demo` for now: generate a Llama-shaped prefill K/V
# dump, compact it offline with snapkvctl, and show what was kept, the
# retained attention mass and the capacity ledger.
set -euo pipefail
BUILD=${BUILD:-build}
ctl=$BUILD/snapkvctl
gen=$BUILD/examples/gen-layer
tmp=$(mktemp -d "${TMPDIR:-/tmp}/snapkv-demo.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
in=$tmp/prefill.safetensors

echo "== 1. A prefill K/V dump shaped like Llama-3-8B: 2 layers, H_q 32, H_kv 8, D 128,"
echo "      L 4096, bf16. Each query head attends to a few planted spans, a sink at"
echo "      position 0 and noise elsewhere; its 32 window queries are stored too."
"$gen" "$in" --show 2
echo
echo "== 2. SnapKV with the reference parameters (W 32, C 2048, k 5 avg, gqa expand)."
echo "      Expand mode stores H_q = 32 heads, so at L 4096 it keeps more bytes than"
echo "      the native 8-head cache: the ledger says so."
"$ctl" compact --offline "$in" "$tmp/compact-ref.safetensors"
echo
echo "== 3. A tight budget, C 256: the kept positions are the planted spans (widened"
echo "      by the pooling kernel), the sink and the window."
"$ctl" compact --offline "$in" "$tmp/compact-256.safetensors" --capacity 256 --show 2
echo
echo "== 4. Native GQA storage (--gqa group), C 1024: one selection per K/V head."
"$ctl" compact --offline "$in" "$tmp/compact-group.safetensors" --capacity 1024 --gqa group
echo
ls -l "$tmp" | awk 'NR > 1 { printf "  %-28s %10d bytes\n", $9, $5 }'
echo "demo: done (files were in $tmp, now removed)"
