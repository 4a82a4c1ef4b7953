# SPDX-License-Identifier: MIT
# client/snapkvctl/: the snapkvctl CLI, its tests, and the offline demo
# (examples/).

# main + one ctl-<name>.c per subcommand and the helpers they share (see
# snapkvctl.h).
SNAPKVCTL := $(BUILD)/snapkvctl
SNAPKVCTL_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard client/snapkvctl/*.c)))
# The Prometheus parser and the frame of `top`: pure, also linked by tests.
SNAPKVCTL_VIEW_OBJS := $(addprefix $(BUILD)/client/snapkvctl/,ctl-prom.o ctl-top-frame.o ctl-fmt.o)
SNAPKVCTL_DEPS := $(LIBSKVST) $(LIBSKV) $(LIBSNAPKV_A) $(LIBSKVPROTO)
SNAPKVCTL_LIBS := $(LIBSKVST) $(LIBSKV) $(LIBSNAPKV_A) $(LIBSKVPROTO) $(PBC_LIBS) $(JSON_LIBS) -lm
OBJS += $(SNAPKVCTL_OBJS)
$(SNAPKVCTL_OBJS): | $(SKV_PB_H)
# --version; a new VERSION rebuilds it
$(BUILD)/client/snapkvctl/snapkvctl.o: ALL_CFLAGS += $(VERSION_DEFINE)
$(BUILD)/client/snapkvctl/snapkvctl.o: $(BUILD)/version
BINS += $(SNAPKVCTL)
INSTALL_BINS += $(SNAPKVCTL)

$(SNAPKVCTL): $(SNAPKVCTL_OBJS) $(SNAPKVCTL_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $(SNAPKVCTL_OBJS) $(SNAPKVCTL_LIBS) $(LDFLAGS)

# Example generator of Llama-shaped K/V files (demo and tests use it).
GEN_LAYER := $(BUILD)/examples/gen-layer
OBJS += $(BUILD)/examples/gen-layer.o
BINS += $(GEN_LAYER)

$(GEN_LAYER): $(BUILD)/examples/gen-layer.o $(LIBSKVST) $(LIBSKV)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSKVST) $(LIBSKV) $(JSON_LIBS) -lm $(LDFLAGS)

TEST_SCRIPTS += tests/integration/test-cli-offline.sh tests/integration/test-cli-online.sh \
	tests/integration/test-cli-budget.sh
# snapkvctl against a live daemon: status, caches, ledger, metrics, compact
TEST_SCRIPTS += tests/integration/test-daemon-ctl.sh
# pressure and top against a live daemon
TEST_SCRIPTS += tests/integration/test-ops-ctl.sh
# top on a terminal (tmux): clipped, resized, q, the terminal put back
TEST_SCRIPTS += tests/integration/test-cli-top.sh
# socket discovery (snapkvctl and libsnapkv) from a login shell's environment
TEST_SCRIPTS += tests/integration/test-cli-socket.sh

# Offline compaction of a generated Llama-shaped file (no daemon).
.PHONY: _demo_offline
_demo_offline: $(SNAPKVCTL) $(GEN_LAYER)
	@BUILD=$(BUILD) SHARED=$(SHARED) examples/demo-offline.sh
