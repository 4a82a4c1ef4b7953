# SPDX-License-Identifier: MIT
# client/: libskvst (safetensors read/write), snapkvctl (CLI), their tests,
# and the offline demo (examples/).

SKVST_OBJS := $(BUILD)/client/skv-safetensors.o
OBJS += $(SKVST_OBJS)
LIBS += $(LIBSKVST)

$(LIBSKVST): $(SKVST_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	$(AR) rcs $@ $^

# Unit test of libskvst (CUnit).
TEST_SAFETENSORS := $(BUILD)/tests/unit/test-safetensors
OBJS += $(BUILD)/tests/unit/test-safetensors.o
TESTS += $(TEST_SAFETENSORS)

$(TEST_SAFETENSORS): $(BUILD)/tests/unit/test-safetensors.o $(LIBSKVST)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSKVST) $(JSON_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)

