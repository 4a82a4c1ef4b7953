# SPDX-License-Identifier: MIT
# GPU test programs (tests/gpu/), built with the plugin when CUDA=1. They
# need a GPU to run, so they are not in TESTS: tests/gpu/run.sh runs them.
ifeq ($(CUDA),1)
GPU_TEST_PROGS := gpu-agree gpu-ipc gpu-bench
GPU_TESTS := $(GPU_TEST_PROGS:%=$(BUILD)/tests/gpu/%)
OBJS += $(GPU_TESTS:%=%.o)
BINS += $(GPU_TESTS)

$(GPU_TESTS:%=%.o): CFLAGS_BASE += $(CUDA_INC)

# The plugin by path (rpath to $(BUILD)), libskv for the host reference, and
# a static cudart of their own for cudaMalloc and copies.
$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(LIBSKVCUDA) $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $< -L$(BUILD) -lskv-cuda $(LIBSKV) $(CUDART_STATIC) -lm \
		-Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS)

.PHONY: gpu-tests
gpu-tests: $(GPU_TESTS)
endif
