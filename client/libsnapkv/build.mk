# SPDX-License-Identifier: MIT
# client/libsnapkv/: the engine API (snapkv.h) as a versioned shared library,
# soname libsnapkv.so.1, plus a static copy for in-tree programs (snapkvctl),
# and its tests.

# 1.MINOR.PATCH: MINOR is the newest SNAPKV_1.MINOR node of libsnapkv.map
# (tests/integration/test-libsnapkv-abi.sh checks it).
LIBSNAPKV_VER := 1.9.0
LIBSNAPKV_MAP := client/libsnapkv/libsnapkv.map
LIBSNAPKV_REAL := $(BUILD)/libsnapkv.so.$(LIBSNAPKV_VER)
LIBSNAPKV_SRCS := $(addprefix client/libsnapkv/libsnapkv-,rpc.c ring.c buffer.c pool.c client.c desc.c \
	compact.c request.c cache.c layout.c)
LIBSNAPKV_OBJS := $(LIBSNAPKV_SRCS:%.c=$(BUILD)/%.o)
OBJS += $(LIBSNAPKV_OBJS)
$(LIBSNAPKV_OBJS): | $(SKV_PB_H)
$(LIBSNAPKV_OBJS): ALL_CFLAGS += -fvisibility=hidden

$(LIBSNAPKV_REAL): $(LIBSNAPKV_OBJS) $(LIBSKVPROTO) $(LIBSNAPKV_MAP)
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,libsnapkv.so.1 \
		-Wl,--version-script=$(LIBSNAPKV_MAP) -Wl,--no-undefined \
		-o $@ $(LIBSNAPKV_OBJS) $(LIBSKVPROTO) $(PBC_LIBS) $(LDFLAGS)
# this file too: a version bump relinks in an existing build tree
# (.SECONDARY would otherwise let the old real file satisfy the link).
$(BUILD)/libsnapkv.so.1: $(LIBSNAPKV_REAL) client/libsnapkv/build.mk
	ln -sf libsnapkv.so.$(LIBSNAPKV_VER) $@
$(LIBSNAPKV): $(BUILD)/libsnapkv.so.1
	ln -sf libsnapkv.so.1 $@
$(LIBSNAPKV_A): $(LIBSNAPKV_OBJS)
	rm -f $@ && ar rcs $@ $^
LIBS += $(LIBSNAPKV) $(LIBSNAPKV_A)
INSTALL_LIBS += $(LIBSNAPKV_REAL) $(BUILD)/libsnapkv.so.1 $(LIBSNAPKV)
INSTALL_HEADERS += client/libsnapkv/snapkv.h
# Programs in the tree find the .so without installing it.
SNAPKV_RPATH := -Wl,-rpath,$(abspath $(BUILD))
SNAPKV_LINK := -L$(BUILD) -lsnapkv $(SNAPKV_RPATH) $(PBC_LIBS)

# libsnapkv's deadlines against fake daemons that hang (and snapkvctl
# --timeout).
TEST_LIBSNAPKV_DEADLINE := $(BUILD)/tests/test-libsnapkv-deadline
OBJS += $(BUILD)/tests/integration/test-libsnapkv-deadline.o
$(BUILD)/tests/integration/test-libsnapkv-deadline.o: | $(SKV_PB_H)
$(TEST_LIBSNAPKV_DEADLINE): $(BUILD)/tests/integration/test-libsnapkv-deadline.o $(LIBSNAPKV) \
		$(LIBSKVPROTO) $(SNAPKVCTL)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		$(LDFLAGS)
TESTS += $(TEST_LIBSNAPKV_DEADLINE)
# the exported symbols against the map and snapkv.h, the file version
TEST_SCRIPTS += tests/integration/test-libsnapkv-abi.sh

# libsnapkv with a description laid out before the budget modes grew skv_params.
TEST_LIBSNAPKV_V1 := $(BUILD)/tests/unit/test-libsnapkv-v1
OBJS += $(BUILD)/tests/unit/test-libsnapkv-v1.o
$(TEST_LIBSNAPKV_V1): $(BUILD)/tests/unit/test-libsnapkv-v1.o $(LIBSNAPKV)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(CUNIT_LIBS) $(LDFLAGS)
TESTS += $(TEST_LIBSNAPKV_V1)
