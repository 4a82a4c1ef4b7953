# SPDX-License-Identifier: MIT
# bench-longctx: passkey retrieval on SmolLM2-135M-Instruct (scripts/
# get-model.sh) through a private snapkvd, full cache vs snapkv at --keep %
# with W = 8, the question and 64, and compaction vs prefill time
# (bench/README.md, long context). Not part of `make bench` or `make check`:
# minutes on 2 cores. LONGCTX_ARGS adds the script's options
# (--lengths 1024,2048 --prompts 3 --windows 8,question,64 --keeps 10,20).
LONGCTX_ARGS ?=

.PHONY: bench-longctx
bench-longctx: $(BUILD)/tiny-llama $(BUILD)/snapkvd
	@model=$$(scripts/get-model.sh) || { \
		echo "bench-longctx: SmolLM2 unavailable (scripts/get-model.sh failed); it needs a" \
		     "real model (stories260K's 512-token context cannot hold the prompts)" >&2; exit 1; }; \
	nice -n 10 /usr/bin/python3 bench/longctx/bench-longctx.py --model "$$model" \
		--build $(BUILD) $(LONGCTX_ARGS)
