# SPDX-License-Identifier: MIT
# daemon/: snapkvd, one object per file (docs/request-path.md maps them).

SNAPKVD := $(BUILD)/snapkvd
# Every daemon object but main, as one archive: snapkvd links it whole, and
# each unit test takes from it only what its file under test calls.
LIBSNAPKVD := $(BUILD)/libsnapkvd.a
LIBSNAPKVD_OBJS := $(addprefix $(BUILD)/daemon/snapkvd-, server.o loop.o listener.o \
	session.o control.o ring.o dispatch.o slots.o device.o device-hostreg.o request.o params.o paged.o admission.o job.o group.o compactor.o runner.o runner-host.o \
	runner-cuda.o buffer.o cache.o arena.o pool.o ledger.o admin.o policy.o \
	pressure.o hooks.o metrics.o config.o value.o log.o clock.o http.o tally.o)
OBJS += $(LIBSNAPKVD_OBJS) $(BUILD)/daemon/snapkvd.o
$(LIBSNAPKVD_OBJS) $(BUILD)/daemon/snapkvd.o: | $(SKV_PB_H)
# --version, --check-config's header and snapkvd_build_info: the top VERSION
$(BUILD)/daemon/snapkvd.o $(BUILD)/daemon/snapkvd-admin.o: ALL_CFLAGS += $(VERSION_DEFINE)
$(BUILD)/daemon/snapkvd.o $(BUILD)/daemon/snapkvd-admin.o: $(BUILD)/version
$(LIBSNAPKVD): $(LIBSNAPKVD_OBJS)
	rm -f $@ && $(AR) rcs $@ $^
LIBS += $(LIBSNAPKVD)

# the ledger's JSON form (proto/skv-ledger-json.c, in $(LIBSKVPROTO)): the
# hooks' snapshot and `snapkvctl ledger --json` share one builder
$(SNAPKVD): $(BUILD)/daemon/snapkvd.o $(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV) \
		$(BUILD)/libskv-backend.a
	$(CC) $(ALL_CFLAGS) -o $@ $(BUILD)/daemon/snapkvd.o $(LIBSNAPKVD) \
		$(LIBSKVPROTO) $(LIBSKV) $(BUILD)/libskv-backend.a \
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
# Paged output through snapkvd vs libskv here (needs libskv for the reference).
DAEMON_ITESTS += $(BUILD)/tests/test-daemon-paged
$(BUILD)/tests/integration/test-daemon-paged.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-paged.o
$(BUILD)/tests/test-daemon-paged: $(BUILD)/tests/integration/test-daemon-paged.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) \
		$(BLAS_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-daemon-paged
# Cancel and fence (issue 20): writeback destinations reused after a cancel
# or a close are never written again.
DAEMON_ITESTS += $(BUILD)/tests/test-daemon-cancel
$(BUILD)/tests/integration/test-daemon-cancel.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-cancel.o
$(BUILD)/tests/test-daemon-cancel: $(BUILD)/tests/integration/test-daemon-cancel.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) \
		$(BLAS_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-daemon-cancel
# Budget modes through snapkvd vs libskv's skv_compact_budget here.
DAEMON_ITESTS += $(BUILD)/tests/test-daemon-budget
$(BUILD)/tests/integration/test-daemon-budget.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-budget.o
$(BUILD)/tests/test-daemon-budget: $(BUILD)/tests/integration/test-daemon-budget.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) \
		$(BLAS_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-daemon-budget
# A partial window (and fp8 K/V) through snapkvd vs libskv here.
DAEMON_ITESTS += $(BUILD)/tests/test-daemon-window
$(BUILD)/tests/integration/test-daemon-window.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-window.o
$(BUILD)/tests/test-daemon-window: $(BUILD)/tests/integration/test-daemon-window.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) \
		$(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-daemon-window
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

# Unit tests of the daemon's pieces, SPDX-style: each includes the .c it
# tests, with fakes for the neighbours it calls, and takes the rest from
# libsnapkvd.a.
DAEMON_UNITS := daemon-units ops-pressure ops-hooks ops-metrics ops-quota ops-config \
	ops-runtime
DAEMON_UNIT_BINS := $(DAEMON_UNITS:%=$(BUILD)/tests/test-%)
OBJS += $(DAEMON_UNITS:%=$(BUILD)/tests/unit/test-%.o)
$(DAEMON_UNITS:%=$(BUILD)/tests/unit/test-%.o): | $(SKV_PB_H)
$(DAEMON_UNIT_BINS): $(BUILD)/tests/test-%: $(BUILD)/tests/unit/test-%.o $(LIBSNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) \
		$(CUNIT_LIBS) $(BLAS_LIBS) -lm $(LDFLAGS)
TESTS += $(DAEMON_UNIT_BINS)
# tests/unit/daemon/test-<object>.c: one per object without a live daemon
# (device: the plugin loader, libskv-backend.a; its CUDA half runs on the
# emulator's plugin where one is built)
DAEMON_OBJECT_TESTS := cache loop request dispatch ring device buffer session groups control \
	value params tally
DAEMON_OBJECT_BINS := $(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/test-daemon-%)
OBJS += $(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/unit/daemon/test-%.o)
$(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/unit/daemon/test-%.o): | $(SKV_PB_H)
$(DAEMON_OBJECT_BINS): $(BUILD)/tests/test-daemon-%: $(BUILD)/tests/unit/daemon/test-%.o \
		$(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV) $(BUILD)/libskv-backend.a
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV) \
		$(BUILD)/libskv-backend.a $(URING_LIBS) $(PBC_LIBS) $(JSON_LIBS) $(CUNIT_LIBS) $(BLAS_LIBS) -lm \
		$(LDFLAGS)
TESTS += $(DAEMON_OBJECT_BINS)

# snapkvctl's side of `top`/`pressure`: the Prometheus parser and the frame
# of top ($(SNAPKVCTL_VIEW_OBJS)), tested against the daemon's writer.
OBJS += $(BUILD)/tests/unit/test-ops-view.o
$(BUILD)/tests/test-ops-view: $(BUILD)/tests/unit/test-ops-view.o $(SNAPKVCTL_VIEW_OBJS) \
		$(LIBSNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-ops-view

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

# snapkvctl against a live daemon
ifneq ($(SNAPKVCTL),)
# the ledger of real caches (expand, group, APPEND, GROW) per cache, tenant, pool
TEST_SCRIPTS += tests/integration/test-daemon-ledger.sh
# the worker pool: the suites above again with 3 workers, engines at once
TEST_SCRIPTS += tests/integration/test-daemon-workers.sh
endif
# log lines under a flood of connections: summarised per cause (issue 20)
TEST_SCRIPTS += tests/integration/test-daemon-logflood.sh

$(BUILD)/tests/integration/test-daemon-fuzz.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-fuzz.o
$(BUILD)/tests/test-daemon-fuzz: $(BUILD)/tests/integration/test-daemon-fuzz.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		-lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-daemon-fuzz

# The hostile-client suite (issue 11): one test per hardening defect.
$(BUILD)/tests/integration/test-hostile.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-hostile.o
$(BUILD)/tests/test-hostile: $(BUILD)/tests/integration/test-hostile.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(SNAPKVD) $(SNAPKVCTL)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(JSON_LIBS) \
		$(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-hostile
