# SPDX-License-Identifier: MIT
# proto/: snapkv.proto compiled with protoc-c at build time, framing and the
# ring ABI helpers, and what both sides of the control socket share: the
# deadline-bounded socket I/O (skv-io.h) and the ledger's JSON form
# (skv-ledger-json.o: link $(JSON_LIBS) when using it), all in $(LIBSKVPROTO).
PROTOC_C ?= protoc-c
SKV_PB_C := $(BUILD)/proto/snapkv.pb-c.c
SKV_PB_H := $(BUILD)/proto/snapkv.pb-c.h

$(SKV_PB_H): $(SKV_PB_C)
$(SKV_PB_C): proto/snapkv.proto
	@mkdir -p $(BUILD)
	$(PROTOC_C) --c_out=$(BUILD) $<

$(BUILD)/proto/snapkv.pb-c.o: $(SKV_PB_C) $(SKV_PB_H)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

PROTO_OBJS := $(BUILD)/proto/snapkv.pb-c.o $(BUILD)/proto/skv-frame.o \
	$(BUILD)/proto/skv-ledger-json.o $(BUILD)/proto/skv-socket.o
$(BUILD)/proto/skv-ledger-json.o: | $(SKV_PB_H)
OBJS += $(PROTO_OBJS)

$(LIBSKVPROTO): $(PROTO_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
LIBS += $(LIBSKVPROTO)

# Tests
$(BUILD)/tests/test-proto-frame: $(BUILD)/tests/unit/test-proto-frame.o $(LIBSKVPROTO)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(PBC_LIBS) $(CUNIT_LIBS) $(LDFLAGS)
$(BUILD)/tests/test-proto-ring: $(BUILD)/tests/unit/test-proto-ring.o $(LIBSKVPROTO)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(PBC_LIBS) $(CUNIT_LIBS) $(LDFLAGS)
$(BUILD)/tests/unit/test-proto-frame.o $(BUILD)/tests/unit/test-proto-ring.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/unit/test-proto-frame.o $(BUILD)/tests/unit/test-proto-ring.o
TESTS += $(BUILD)/tests/test-proto-frame $(BUILD)/tests/test-proto-ring
