# SPDX-License-Identifier: MIT
# tiny-llama: a small GGUF Llama engine that decodes from full or compacted
# KV caches (libtinyllama.a + the tiny-llama CLI, which compacts through
# snapkvd with libsnapkv or in process with libskv), its unit tests, the
# daemon integration test, and its demo (`_demo_llama`).

TL_DIR  := examples/tiny-llama
TL_SRCS := $(TL_DIR)/tl-gguf.c $(TL_DIR)/tl-quant.c $(TL_DIR)/tl-tok.c $(TL_DIR)/tl-model.c \
	   $(TL_DIR)/tl-compact.c
TL_OBJS := $(TL_SRCS:%.c=$(BUILD)/%.o)
TL_LIB  := $(BUILD)/libtinyllama.a
TL_LIBS := $(BLAS_LIBS) -licuuc -lm -pthread

$(TL_LIB): $(TL_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(BUILD)/tiny-llama: $(BUILD)/$(TL_DIR)/tiny-llama.o $(TL_LIB) $(LIBSKV) $(LIBSNAPKV)
	$(CC) $(LDFLAGS) -o $@ $(BUILD)/$(TL_DIR)/tiny-llama.o $(TL_LIB) $(LIBSKV) \
		$(SNAPKV_LINK) $(TL_LIBS)

$(BUILD)/tests/unit/test-llama: $(BUILD)/tests/unit/test-llama.o $(TL_LIB) $(LIBSKV)
	$(CC) $(LDFLAGS) -o $@ $^ $(CUNIT_LIBS) $(TL_LIBS)

$(BUILD)/tests/unit/test-llama.o: ALL_CFLAGS += -I$(TL_DIR)

# The engine through a private snapkvd on a temporary socket; the same on
# SmolLM2 (scripts/get-model.sh; skipped, exit 77, when it cannot be had).
TEST_SCRIPTS += tests/integration/test-llama-daemon.sh tests/integration/test-llama-smollm.sh

.PHONY: _demo_llama
_demo_llama: $(BUILD)/tiny-llama $(SNAPKVD) $(SNAPKVCTL)
	@BUILD=$(BUILD) SHARED=$(SHARED) $(TL_DIR)/demo.sh

LIBS  += $(TL_LIB)
BINS  += $(BUILD)/tiny-llama
TESTS += $(BUILD)/tests/unit/test-llama
OBJS  += $(TL_OBJS) $(BUILD)/$(TL_DIR)/tiny-llama.o $(BUILD)/tests/unit/test-llama.o

$(BUILD)/$(TL_DIR)/tl-model.o: CFLAGS_BASE += $(BLAS_CFLAGS)
