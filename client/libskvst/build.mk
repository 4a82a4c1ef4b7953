# SPDX-License-Identifier: MIT
# client/libskvst/: safetensors read/write and the compact-cache file
# (skv-safetensors.h), and its unit test.

# skv-st-compact.o (the compact-cache file) calls libskv: link $(LIBSKV)
# after $(LIBSKVST) when using it; plain safetensors users need only jansson.
SKVST_OBJS := $(BUILD)/client/libskvst/skv-safetensors.o $(BUILD)/client/libskvst/skv-st-compact.o
OBJS += $(SKVST_OBJS)
LIBS += $(LIBSKVST)

$(LIBSKVST): $(SKVST_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	$(AR) rcs $@ $^

TEST_SAFETENSORS := $(BUILD)/tests/unit/test-safetensors
OBJS += $(BUILD)/tests/unit/test-safetensors.o
TESTS += $(TEST_SAFETENSORS)

$(TEST_SAFETENSORS): $(BUILD)/tests/unit/test-safetensors.o $(LIBSKVST) $(LIBSKV)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSKVST) $(LIBSKV) $(JSON_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
