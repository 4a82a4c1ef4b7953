# SPDX-License-Identifier: MIT
# tests/python/: pytest suite of the snapkv module (client/python/), run by
# `make check` against private daemons; PYTHON is the interpreter it runs with.
TEST_SCRIPTS += tests/python/run-pytest.sh
export PYTHON
# The emulated CUDA runtime alone, for test_after.py: it makes interprocess
# events through ctypes that snapkvd --backend cuda on the emulated plugin
# (libskv-cuda-emu.so, whose copy of the runtime is hidden) opens by handle.
ifeq ($(CUDA),1)
PY_EMU_RT := $(EMU_DIR)/libcuda-emu-rt.so
$(PY_EMU_RT): $(EMU_DIR)/cuda-emu.o
	$(CXX) -shared -o $@ $< -lm -pthread $(LDFLAGS)
BINS += $(PY_EMU_RT)
endif
