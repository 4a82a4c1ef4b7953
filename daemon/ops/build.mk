# SPDX-License-Identifier: MIT
# Operations modules of the daemon: pressure policy, hooks, metrics, their
# config keys and the runtime that runs the actions in order
# (daemon/snapkvd-{pressure,hooks,metrics,ops-config,ops}.[ch]). They are
# standalone (no dependency on the rest of the daemon) and go into a static
# library the daemon links, so their unit tests build without the daemon;
# daemon/snapkvd-ops-daemon.c (in daemon/build.mk) ties them to the server.
# This fragment lives in its own directory so that daemon/build.mk stays the
# daemon's.

LIBSNAPKVD_OPS := $(BUILD)/libsnapkvd-ops.a
OPS_SRCS := daemon/snapkvd-pressure.c daemon/snapkvd-hooks.c daemon/snapkvd-metrics.c \
	daemon/snapkvd-ops-config.c daemon/snapkvd-ops.c
OPS_OBJS := $(OPS_SRCS:%.c=$(BUILD)/%.o)
OBJS += $(OPS_OBJS)
LIBS += $(LIBSNAPKVD_OPS)

$(LIBSNAPKVD_OPS): $(OPS_OBJS)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

# CUnit suites: tests/unit/test-ops-<module>.c, each linked against the library.
OPS_TESTS := pressure hooks metrics quota config runtime

# snapkvctl's side of `top`/`pressure`: the Prometheus parser and the frame
# of top ($(SNAPKVCTL_VIEW_OBJS)), tested against the daemon's writer.
OPS_TESTS += view
$(BUILD)/tests/unit/test-ops-view: $(SNAPKVCTL_VIEW_OBJS)

# the quota race runs against the daemon's pool (snapkvd-pool.c)
$(BUILD)/tests/unit/test-ops-quota: $(BUILD)/daemon/snapkvd-pool.o
OPS_TEST_BINS := $(OPS_TESTS:%=$(BUILD)/tests/unit/test-ops-%)
TESTS += $(OPS_TEST_BINS)
OBJS += $(OPS_TESTS:%=$(BUILD)/tests/unit/test-ops-%.o)

$(OPS_TEST_BINS): $(BUILD)/tests/unit/test-ops-%: $(BUILD)/tests/unit/test-ops-%.o $(LIBSNAPKVD_OPS)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(LDFLAGS) $(CUNIT_LIBS) -lm

# The policy through a real snapkvd, eight engine processes included (jansson:
# the hooks' ledger snapshot is compared with `snapkvctl ledger --json`).
OPS_ITEST := $(BUILD)/tests/test-ops-daemon
OBJS += $(BUILD)/tests/integration/test-ops-daemon.o
$(BUILD)/tests/integration/test-ops-daemon.o: | $(SKV_PB_H)
$(OPS_ITEST): $(BUILD)/tests/integration/test-ops-daemon.o $(SNAPKVCTL_VIEW_OBJS) \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD) $(SNAPKVCTL)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKVCTL_VIEW_OBJS) $(SNAPKV_LINK) $(LIBSKVPROTO) \
		$(LIBSKV) $(PBC_LIBS) $(BLAS_LIBS) $(JSON_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(OPS_ITEST)
