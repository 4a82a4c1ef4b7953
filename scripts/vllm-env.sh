#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The environment of `make check-vllm` and `make bench-vllm` (issue 27),
# made once and cached: prints two lines, the virtual environment with
# vLLM's CPU build (integrations/vllm/requirements.txt through
# scripts/venv.sh, about 6 GB under ~/.cache/snapkv/venv) and the Hugging
# Face directory of SmolLM2-135M-Instruct that vLLM loads, converted from the
# GGUF of scripts/get-model.sh by integrations/vllm/hf_model.py (tokenizer
# corrected) and cached beside it (smollm2-0.1.2/hf).
#
#   read -r VENV HF < <(scripts/vllm-env.sh | paste -sd' ')
#
# Exit 1, saying why on stderr, when either cannot be made (offline).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$here/scripts/venv.sh" "$here/integrations/vllm/requirements.txt") || exit 1
gguf=$("$here/scripts/get-model.sh") || exit 1
hf=$(dirname "$gguf")/hf
if [ ! -f "$hf/config.json" ]; then
	echo "vllm-env: converting $gguf into $hf (transformers; about a minute)" >&2
	HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1 HF_HUB_OFFLINE=1 \
		"$venv/bin/python" "$here/integrations/vllm/hf_model.py" "$gguf" "$hf" >&2 ||
		{ echo "vllm-env: converting the model failed" >&2; exit 1; }
fi
echo "$venv"
echo "$hf"
