# SPDX-License-Identifier: MIT
# examples/engine: a small engine on libsnapkv, and the daemon demo
# (`_demo_daemon`: snapkvd on a temporary socket, two engines at once,
# snapkvctl ledger, clean SIGTERM stop).
ENGINE_EX := $(BUILD)/snapkv-engine
OBJS += $(BUILD)/examples/engine/engine.o
$(ENGINE_EX): $(BUILD)/examples/engine/engine.o $(LIBSNAPKV) $(LIBSKVST) $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVST) $(LIBSKV) $(JSON_LIBS) -lm \
		$(LDFLAGS)
BINS += $(ENGINE_EX)

.PHONY: _demo_daemon
_demo_daemon: $(SNAPKVD) $(ENGINE_EX) $(SNAPKVCTL) $(GEN_LAYER)
	@BUILD=$(BUILD) examples/demo-daemon.sh
