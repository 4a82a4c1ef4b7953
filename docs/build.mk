# SPDX-License-Identifier: MIT
# docs/: the decode loop of docs/engines.md is compiled and run as written.
# The fenced block after the `<!-- decode-loop` marker is copied verbatim
# into $(BUILD)/tests/engines-decode.inc, which the test #includes; a doc
# without the block fails the build rather than testing nothing.
ENGINES_DECODE_INC := $(BUILD)/tests/engines-decode.inc
$(ENGINES_DECODE_INC): docs/engines.md docs/build.mk
	@mkdir -p $(dir $@)
	awk '/^<!-- decode-loop/ { want = 1; next } \
	     want && /^```c$$/ { inside = 1; next } \
	     inside && /^```$$/ { exit } \
	     inside { print }' $< >$@.tmp
	@test -s $@.tmp || { echo "$<: no decode-loop block" >&2; rm -f $@.tmp; exit 1; }
	mv $@.tmp $@

TEST_ENGINES_DOC := $(BUILD)/tests/test-engines-doc
OBJS += $(BUILD)/tests/integration/test-engines-doc.o
$(BUILD)/tests/integration/test-engines-doc.o: ALL_CFLAGS += -I$(BUILD)/tests
$(BUILD)/tests/integration/test-engines-doc.o: $(ENGINES_DECODE_INC) | $(SKV_PB_H)
$(TEST_ENGINES_DOC): $(BUILD)/tests/integration/test-engines-doc.o $(LIBSNAPKV) $(LIBSKVPROTO) \
		$(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		$(LDFLAGS)
TESTS += $(TEST_ENGINES_DOC)
