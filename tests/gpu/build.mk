# SPDX-License-Identifier: MIT
# GPU test programs (tests/gpu/), built with the plugin when CUDA=1. They
# need a GPU to run, so they are not in TESTS: tests/gpu/run.sh runs them.
ifeq ($(CUDA),1)
GPU_TEST_PROGS := gpu-agree gpu-ipc gpu-bench gpu-budget
GPU_TESTS := $(GPU_TEST_PROGS:%=$(BUILD)/tests/gpu/%)
OBJS += $(GPU_TESTS:%=%.o)
BINS += $(GPU_TESTS)

$(GPU_TESTS:%=%.o): CFLAGS_BASE += $(CUDA_INC)

# The plugin by path (rpath to $(BUILD)), libskv for the host reference, and
# a static cudart of their own for cudaMalloc and copies.
$(GPU_TESTS): $(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(LIBSKVCUDA) $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $< -L$(BUILD) -lskv-cuda $(LIBSKV) $(CUDART_STATIC) -lm \
		-Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS)

# An engine process on libsnapkv whose K/V are GPU memory (VMM fd, IPC handle)
GPU_ENGINE := $(BUILD)/tests/gpu/gpu-engine
OBJS += $(GPU_ENGINE).o
BINS += $(GPU_ENGINE)
$(GPU_ENGINE).o: CFLAGS_BASE += $(CUDA_INC)
$(GPU_ENGINE).o: | $(SKV_PB_H)
$(GPU_ENGINE): $(GPU_ENGINE).o $(LIBSKVCUDA) $(LIBSKV) $(LIBSNAPKV_A) $(LIBSKVPROTO)
	$(CC) $(ALL_CFLAGS) -o $@ $< -L$(BUILD) -lskv-cuda $(LIBSNAPKV_A) $(LIBSKVPROTO) $(LIBSKV) \
		$(PBC_LIBS) $(CUDART_STATIC) -lm -Wl,-rpath,'$$ORIGIN/../..' $(LDFLAGS)

.PHONY: gpu-tests
gpu-tests: $(GPU_TESTS) $(GPU_ENGINE) $(BUILD)/snapkvd $(BUILD)/snapkvctl
endif

# The same kernels compiled as host C++ against tests/gpu/emu (a CPU
# emulation of blocks, barriers, warp intrinsics and WMMA), linked with the
# plugin's host code and gpu-agree: host-vs-CUDA agreement of the kernels'
# logic in `make check`, on machines without a GPU. Needs the CUDA headers
# only, so it is built with the plugin.
ifeq ($(CUDA),1)
EMU_DIR := $(BUILD)/tests/gpu/emu
EMU_CXXFLAGS := -std=c++17 -O2 -g -fPIC -Wall -Wextra -Werror -Wno-unknown-pragmas -DSKV_CUDA_EMU \
	-Itests/gpu/emu/include $(CUDA_INC) -Ikernels -I. -MMD -MP
EMU_KOBJS := $(SKVCUDA_CU:%=$(EMU_DIR)/%.o)
EMU_AGREE := $(EMU_DIR)/gpu-agree-emu
-include $(EMU_KOBJS:.o=.d) $(EMU_DIR)/cuda-emu.d

$(EMU_DIR)/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(EMU_CXXFLAGS) -c $< -o $@
$(EMU_DIR)/cuda-emu.o: tests/gpu/emu/cuda-emu.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
EMU_IPC := $(EMU_DIR)/gpu-ipc-emu
# the plugin's host code, marked as the emulator (the loader then needs no driver)
EMU_DEVOBJ := $(EMU_DIR)/skv-cuda-dev.o
$(EMU_DEVOBJ): kernels/cuda/skv-cuda-dev.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(CUDA_INC) -DSKV_CUDA_EMU -c $< -o $@
# gpu-bench-emu is built on demand (SKV_BENCH_LAYERS=1 ... to try the program)
$(GPU_TEST_PROGS:%=$(EMU_DIR)/%-emu): $(EMU_DIR)/gpu-%-emu: $(BUILD)/tests/gpu/gpu-%.o \
		$(EMU_KOBJS) $(EMU_DEVOBJ) \
		$(EMU_DIR)/cuda-emu.o $(LIBSKV)
	$(CXX) -o $@ $^ -lm -pthread $(LDFLAGS)
# The whole plugin on the emulator: `SKV_CUDA_PLUGIN=... snapkvd --backend cuda`
# serves from it where no GPU is (tests/gpu/emu/test-daemon-cuda-emu.sh).
EMU_PLUGIN := $(EMU_DIR)/libskv-cuda-emu.so
$(EMU_PLUGIN): $(EMU_KOBJS) $(EMU_DEVOBJ) $(EMU_DIR)/cuda-emu.o $(LIBSKV) kernels/cuda/skv-cuda.map
	$(CXX) -shared -o $@ $(EMU_KOBJS) $(EMU_DEVOBJ) $(EMU_DIR)/cuda-emu.o $(LIBSKV) \
		-Wl,--version-script=kernels/cuda/skv-cuda.map -Wl,-soname,libskv-cuda-emu.so \
		-lm -pthread $(LDFLAGS)
# The engine process on the emulator: its VMM memory is a memfd, its IPC
# handle names a memfd through /proc (tests/gpu/emu/test-daemon-gpubuf-emu.sh)
EMU_ENGINE := $(EMU_DIR)/gpu-engine-emu
$(EMU_ENGINE): $(BUILD)/tests/gpu/gpu-engine.o $(EMU_KOBJS) $(EMU_DEVOBJ) $(EMU_DIR)/cuda-emu.o \
		$(LIBSNAPKV_A) $(LIBSKVPROTO) $(LIBSKV)
	$(CXX) -o $@ $^ $(PBC_LIBS) -lm -pthread $(LDFLAGS)
# the budget modes on the emulator, bit for bit against the host (test-budget-emu.sh)
EMU_BUDGET := $(EMU_DIR)/gpu-budget-emu
# launches a GPU refuses are refused, cudaGetLastError says so (run-emu.sh)
EMU_ERRORS := $(EMU_DIR)/test-emu-errors
$(EMU_ERRORS): tests/gpu/emu/test-emu-errors.cpp $(EMU_DIR)/cuda-emu.o
	$(CXX) $(EMU_CXXFLAGS) -o $@ $^ -lm -pthread $(LDFLAGS)
# several devices: current device, memory that remembers its device, peer access (run-emu.sh)
EMU_DEVICES := $(EMU_DIR)/test-emu-devices
$(EMU_DEVICES): tests/gpu/emu/test-emu-devices.cpp $(EMU_DIR)/cuda-emu.o
	$(CXX) $(EMU_CXXFLAGS) -o $@ $^ -lm -pthread $(LDFLAGS)
BINS += $(EMU_AGREE) $(EMU_IPC) $(EMU_PLUGIN) $(EMU_ENGINE) $(EMU_BUDGET) $(EMU_ERRORS) \
	$(EMU_DEVICES)
endif
TEST_SCRIPTS += tests/gpu/emu/run-emu.sh
TEST_SCRIPTS += tests/gpu/emu/test-budget-emu.sh
TEST_SCRIPTS += tests/gpu/emu/test-daemon-cuda-emu.sh
TEST_SCRIPTS += tests/gpu/emu/test-daemon-gpubuf-emu.sh
TEST_SCRIPTS += tests/gpu/emu/test-daemon-suites-cuda-emu.sh
TEST_SCRIPTS += tests/gpu/emu/test-daemon-devices-emu.sh
# tests/gpu/run.sh --dry-run lists every GPU-capable suite and compute-sanitizer run
TEST_SCRIPTS += tests/gpu/test-run-dry.sh

# Bad and random input on the CUDA paths of snapkvd --backend cuda, on the
# emulated plugin (it makes the emulator's memfd "GPU memory" itself: no CUDA)
ifeq ($(CUDA),1)
GPUFUZZ := $(BUILD)/tests/test-daemon-gpufuzz
OBJS += $(BUILD)/tests/gpu/emu/test-daemon-gpufuzz.o
$(BUILD)/tests/gpu/emu/test-daemon-gpufuzz.o: CFLAGS_BASE += -Itests/integration
$(BUILD)/tests/gpu/emu/test-daemon-gpufuzz.o: | $(SKV_PB_H)
$(GPUFUZZ): $(BUILD)/tests/gpu/emu/test-daemon-gpufuzz.o $(LIBSNAPKV) $(LIBSKVPROTO) $(LIBSKV) \
		$(SNAPKVD) $(EMU_PLUGIN)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) \
		$(BLAS_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(GPUFUZZ)
endif
