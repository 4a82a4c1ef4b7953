# SPDX-License-Identifier: MIT
# client/: libskvst (safetensors read/write), snapkvctl (CLI), their tests,
# and the offline demo (examples/).

# skv-st-compact.o (the compact-cache file) calls libskv: link $(LIBSKV)
# after $(LIBSKVST) when using it; plain safetensors users need only jansson.
SKVST_OBJS := $(BUILD)/client/skv-safetensors.o $(BUILD)/client/skv-st-compact.o
OBJS += $(SKVST_OBJS)
LIBS += $(LIBSKVST)

$(LIBSKVST): $(SKVST_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@
	$(AR) rcs $@ $^

# snapkvctl: main + one client/ctl-<name>.c per subcommand (see client/snapkvctl.h).
SNAPKVCTL := $(BUILD)/snapkvctl
SNAPKVCTL_OBJS := $(patsubst %.c,$(BUILD)/%.o,client/snapkvctl.c $(sort $(wildcard client/ctl-*.c)))
# Libraries subcommands need; fragments that add subcommands may append.
SNAPKVCTL_DEPS := $(LIBSKVST) $(LIBSKV)
SNAPKVCTL_LIBS := $(LIBSKVST) $(LIBSKV) $(JSON_LIBS) -lm
OBJS += $(SNAPKVCTL_OBJS)
BINS += $(SNAPKVCTL)
INSTALL_BINS += $(SNAPKVCTL)

$(SNAPKVCTL): $(SNAPKVCTL_OBJS) $(SNAPKVCTL_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $(SNAPKVCTL_OBJS) $(SNAPKVCTL_LIBS) $(LDFLAGS)

# Unit test of libskvst (CUnit).
TEST_SAFETENSORS := $(BUILD)/tests/unit/test-safetensors
OBJS += $(BUILD)/tests/unit/test-safetensors.o
TESTS += $(TEST_SAFETENSORS)

$(TEST_SAFETENSORS): $(BUILD)/tests/unit/test-safetensors.o $(LIBSKVST) $(LIBSKV)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSKVST) $(LIBSKV) $(JSON_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)

# Example generator of Llama-shaped K/V files (demo and tests use it).
GEN_LAYER := $(BUILD)/examples/gen-layer
OBJS += $(BUILD)/examples/gen-layer.o
BINS += $(GEN_LAYER)

$(GEN_LAYER): $(BUILD)/examples/gen-layer.o $(LIBSKVST) $(LIBSKV)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSKVST) $(LIBSKV) $(JSON_LIBS) -lm $(LDFLAGS)

TEST_SCRIPTS += tests/integration/test-cli-offline.sh tests/integration/test-cli-online.sh

# Offline compaction of a generated Llama-shaped file (no daemon).
.PHONY: _demo_offline
_demo_offline: $(SNAPKVCTL) $(GEN_LAYER)
	@BUILD=$(BUILD) SHARED=$(SHARED) examples/demo-offline.sh

# libsnapkv's deadlines against fake daemons that hang (and snapkvctl
# --timeout). The generated header is named literally: proto/build.mk, which
# defines SKV_PB_H, is read after this file.
TEST_LIBSNAPKV_DEADLINE := $(BUILD)/tests/test-libsnapkv-deadline
OBJS += $(BUILD)/tests/integration/test-libsnapkv-deadline.o
$(BUILD)/tests/integration/test-libsnapkv-deadline.o: | $(BUILD)/proto/snapkv.pb-c.h
$(TEST_LIBSNAPKV_DEADLINE): $(BUILD)/tests/integration/test-libsnapkv-deadline.o $(LIBSNAPKV) \
		$(LIBSKVPROTO) $(SNAPKVCTL)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		$(LDFLAGS)
TESTS += $(TEST_LIBSNAPKV_DEADLINE)
