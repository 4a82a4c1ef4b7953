# SPDX-License-Identifier: MIT
# bench-anchors: tiny-llama against transformers loading the same GGUF
# (tokenization of a few thousand lines, prefill logits), in the pinned
# environment scripts/venv.sh keeps under ~/.cache/snapkv (bench/anchors/).
.PHONY: bench-anchors
bench-anchors: $(BUILD)/tiny-llama
	@model=$$(scripts/get-model.sh) || { \
		echo "bench-anchors: SmolLM2 unavailable (scripts/get-model.sh failed)" >&2; exit 1; }; \
	venv=$$(scripts/venv.sh bench/anchors/requirements.txt) || exit 1; \
	OPENBLAS_NUM_THREADS=1 nice -n 10 "$$venv/bin/python" bench/anchors/anchors.py \
		--model "$$model" --build $(BUILD)
