# SPDX-License-Identifier: MIT
# tests/unit/: the daemon's unit programs, built from lists by one rule each.
# Every one includes the .c it tests (SPDK style), with fakes for the
# neighbours it calls, and takes the rest from libsnapkvd.a.

# tests/unit/daemon/test-<object>.c: one per daemon object, built as
# $(BUILD)/tests/unit/daemon/test-<object> (the integration programs are
# $(BUILD)/tests/test-daemon-*). Add an object's name to the list.
# (device: the plugin loader, libskv-backend.a; its CUDA half runs on the
# emulator's plugin where one is built)
DAEMON_OBJECT_TESTS := cache loop request dispatch ring device buffer session group control \
	value params tally config pool arena paged ledger http compactor slots job clock \
	admission log listener pressure hooks metrics policy \
	runner-host server bucket device-hostreg kvpool cacheinfo
DAEMON_OBJECT_BINS := $(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/unit/daemon/test-%)
OBJS += $(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/unit/daemon/test-%.o)
$(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/unit/daemon/test-%.o): | $(SKV_PB_H)
$(DAEMON_OBJECT_BINS): $(BUILD)/tests/unit/daemon/test-%: $(BUILD)/tests/unit/daemon/test-%.o \
		$(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV) $(BUILD)/libskv-backend.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV) \
		$(BUILD)/libskv-backend.a $(URING_LIBS) $(PBC_LIBS) $(JSON_LIBS) $(SYSTEMD_LIBS) \
		$(CUNIT_LIBS) $(BLAS_LIBS) -lm $(LDFLAGS)
TESTS += $(DAEMON_OBJECT_BINS)

# tests/unit/test-ops-<name>.c, built as $(BUILD)/tests/test-ops-<name>:
# the config's policy keys (beside test-config), the pool's quotas under
# load (beside test-pool), and snapkvctl's side of `top`/`pressure` (the
# Prometheus parser and the frame of top, $(SNAPKVCTL_VIEW_OBJS), against
# the daemon's writer). A program's own objects: a prerequisite of its
# binary, as test-ops-view's below.
OPS_UNITS := ops-quota ops-config ops-view
OPS_UNIT_BINS := $(OPS_UNITS:%=$(BUILD)/tests/test-%)
OBJS += $(OPS_UNITS:%=$(BUILD)/tests/unit/test-%.o)
$(OPS_UNITS:%=$(BUILD)/tests/unit/test-%.o): | $(SKV_PB_H)
$(OPS_UNIT_BINS): $(BUILD)/tests/test-%: $(BUILD)/tests/unit/test-%.o $(LIBSNAPKVD) \
		$(LIBSKVPROTO) $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $(filter %.o,$^) $(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV) \
		$(PBC_LIBS) $(CUNIT_LIBS) $(BLAS_LIBS) -lm $(LDFLAGS)
$(BUILD)/tests/test-ops-view: $(SNAPKVCTL_VIEW_OBJS)
TESTS += $(OPS_UNIT_BINS)
