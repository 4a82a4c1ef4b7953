# SPDX-License-Identifier: MIT
# daemon/: snapkvd, one object per file (the ops fragment adds
# snapkvd-pressure.*, snapkvd-hooks.*, snapkvd-metrics.* via SNAPKVD_EXTRA_OBJS).

SNAPKVD := $(BUILD)/snapkvd
SNAPKVD_CORE_OBJS := $(addprefix $(BUILD)/daemon/, snapkvd-log.o snapkvd-config.o \
	snapkvd-pool.o snapkvd-arena.o snapkvd-ledger.o snapkvd-session.o \
	snapkvd-compactor.o snapkvd-gpu.o snapkvd-admin.o snapkvd-loop.o snapkvd-ops-daemon.o)
# pressure, hooks, metrics (daemon/ops/build.mk); named literally because
# that fragment is read after this one
SNAPKVD_OPS_LIB := $(BUILD)/libsnapkvd-ops.a
SNAPKVD_EXTRA_OBJS ?=
# the ledger's JSON form (proto/skv-ledger-json.c, in $(LIBSKVPROTO)): the
# hooks' snapshot and `snapkvctl ledger --json` share one builder
SNAPKVD_OBJS := $(SNAPKVD_CORE_OBJS) $(SNAPKVD_EXTRA_OBJS) $(BUILD)/daemon/snapkvd.o
OBJS += $(SNAPKVD_OBJS)
$(SNAPKVD_OBJS): | $(SKV_PB_H)

$(SNAPKVD): $(SNAPKVD_OBJS) $(SNAPKVD_OPS_LIB) $(LIBSKVPROTO) $(LIBSKV) $(BUILD)/libskv-backend.a
	$(CC) $(ALL_CFLAGS) -o $@ $(SNAPKVD_OBJS) $(SNAPKVD_OPS_LIB) $(LIBSKVPROTO) $(LIBSKV) \
		$(BUILD)/libskv-backend.a \
		$(URING_LIBS) $(PBC_LIBS) $(SYSTEMD_LIBS) $(BLAS_LIBS) $(JSON_LIBS) -lm $(LDFLAGS)
BINS += $(SNAPKVD)
INSTALL_BINS += $(SNAPKVD)

# Multi-process tests (CUnit programs that start their own snapkvd).
DAEMON_ITESTS := $(BUILD)/tests/test-daemon-e2e
$(BUILD)/tests/integration/test-daemon-e2e.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-e2e.o
$(BUILD)/tests/test-daemon-e2e: $(BUILD)/tests/integration/test-daemon-e2e.o $(LIBSNAPKV) \
		$(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) \
		$(BLAS_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(DAEMON_ITESTS)
DAEMON_ITESTS += $(BUILD)/tests/test-daemon-badinput
$(BUILD)/tests/integration/test-daemon-badinput.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-badinput.o
$(BUILD)/tests/test-daemon-badinput: $(BUILD)/tests/integration/test-daemon-badinput.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		-lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-daemon-badinput

# bench/bench-ring: ring vs socket round trip of a no-op (make bench).
BENCH_RING := $(BUILD)/bench/bench-ring
OBJS += $(BUILD)/bench/bench-ring.o
$(BENCH_RING): $(BUILD)/bench/bench-ring.o $(LIBSNAPKV) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LDFLAGS)
BENCHES += $(BENCH_RING)

# Unit tests of the daemon's pieces (the .c files are #included).
$(BUILD)/tests/test-daemon-units: $(BUILD)/tests/unit/test-daemon-units.o $(SNAPKVD_OPS_LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKVD_OPS_LIB) $(CUNIT_LIBS) -lm $(LDFLAGS)
OBJS += $(BUILD)/tests/unit/test-daemon-units.o
TESTS += $(BUILD)/tests/test-daemon-units

# snapkvctl against a live daemon
ifneq ($(SNAPKVCTL),)
# the ledger of real caches (expand, group, APPEND, GROW) per cache, tenant, pool
TEST_SCRIPTS += tests/integration/test-daemon-ledger.sh
# the worker pool: the suites above again with 3 workers, engines at once
TEST_SCRIPTS += tests/integration/test-daemon-workers.sh
endif

$(BUILD)/tests/integration/test-daemon-fuzz.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-fuzz.o
$(BUILD)/tests/test-daemon-fuzz: $(BUILD)/tests/integration/test-daemon-fuzz.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		-lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-daemon-fuzz
