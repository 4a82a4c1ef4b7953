# SPDX-License-Identifier: MIT
# daemon/: snapkvd, one object per file (docs/request-path.md maps them),
# and client/libsnapkv (rules here so the file set of client/build.mk stays the
# cli helper's): the engine API as a versioned shared library, soname
# libsnapkv.so.1, plus a static copy for in-tree programs (snapkvctl).
# proto/build.mk is read after this file: name its generated header here too
# so that order-only prerequisites below are not empty.
SKV_PB_H := $(BUILD)/proto/snapkv.pb-c.h

# 1.MINOR.PATCH: MINOR is the newest SNAPKV_1.MINOR node of client/libsnapkv.map
# (tests/integration/test-libsnapkv-abi.sh checks it).
LIBSNAPKV_VER := 1.4.0
LIBSNAPKV_REAL := $(BUILD)/libsnapkv.so.$(LIBSNAPKV_VER)
LIBSNAPKV_A := $(BUILD)/libsnapkv.a
LIBSNAPKV_OBJS := $(BUILD)/client/libsnapkv.o
OBJS += $(LIBSNAPKV_OBJS)
$(LIBSNAPKV_OBJS): | $(SKV_PB_H)
$(BUILD)/client/libsnapkv.o: ALL_CFLAGS += -fvisibility=hidden

$(LIBSNAPKV_REAL): $(LIBSNAPKV_OBJS) $(LIBSKVPROTO) client/libsnapkv.map
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,libsnapkv.so.1 \
		-Wl,--version-script=client/libsnapkv.map -Wl,--no-undefined \
		-o $@ $(LIBSNAPKV_OBJS) $(LIBSKVPROTO) $(PBC_LIBS) $(LDFLAGS)
# daemon/build.mk too: a version bump relinks in an existing build tree
# (.SECONDARY would otherwise let the old real file satisfy the link).
$(BUILD)/libsnapkv.so.1: $(LIBSNAPKV_REAL) daemon/build.mk
	ln -sf libsnapkv.so.$(LIBSNAPKV_VER) $@
$(LIBSNAPKV): $(BUILD)/libsnapkv.so.1
	ln -sf libsnapkv.so.1 $@
$(LIBSNAPKV_A): $(LIBSNAPKV_OBJS)
	rm -f $@ && ar rcs $@ $^
LIBS += $(LIBSNAPKV) $(LIBSNAPKV_A)
INSTALL_LIBS += $(LIBSNAPKV_REAL) $(BUILD)/libsnapkv.so.1 $(LIBSNAPKV)
INSTALL_HEADERS += client/snapkv.h
# Programs in the tree find the .so without installing it.
SNAPKV_RPATH := -Wl,-rpath,$(abspath $(BUILD))
SNAPKV_LINK := -L$(BUILD) -lsnapkv $(SNAPKV_RPATH) $(PBC_LIBS)

SNAPKVD := $(BUILD)/snapkvd
# Every daemon object but main, as one archive: snapkvd links it whole, and
# each unit test takes from it only what its file under test calls.
LIBSNAPKVD := $(BUILD)/libsnapkvd.a
LIBSNAPKVD_OBJS := $(addprefix $(BUILD)/daemon/snapkvd-, server.o loop.o listener.o \
	session.o request.o admission.o job.o compactor.o runner.o runner-host.o \
	runner-cuda.o buffer.o cache.o arena.o pool.o ledger.o admin.o policy.o \
	pressure.o hooks.o metrics.o config.o log.o clock.o)
OBJS += $(LIBSNAPKVD_OBJS) $(BUILD)/daemon/snapkvd.o
$(LIBSNAPKVD_OBJS) $(BUILD)/daemon/snapkvd.o: | $(SKV_PB_H)
$(LIBSNAPKVD): $(LIBSNAPKVD_OBJS)
	rm -f $@ && $(AR) rcs $@ $^
LIBS += $(LIBSNAPKVD)

# the ledger's JSON form is snapkvctl's (client/ctl-ledger-json.c): the hooks'
# snapshot and `snapkvctl ledger --json` share one builder
$(SNAPKVD): $(BUILD)/daemon/snapkvd.o $(LIBSNAPKVD) $(BUILD)/client/ctl-ledger-json.o \
		$(LIBSKVPROTO) $(LIBSKV) $(BUILD)/libskv-backend.a
	$(CC) $(ALL_CFLAGS) -o $@ $(BUILD)/daemon/snapkvd.o $(LIBSNAPKVD) \
		$(BUILD)/client/ctl-ledger-json.o $(LIBSKVPROTO) $(LIBSKV) $(BUILD)/libskv-backend.a \
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

# snapkvctl's online subcommands (client/ctl-daemon.c, compiled by
# client/build.mk with every client/ctl-*.c) talk to the daemon.
$(BUILD)/client/ctl-daemon.o: | $(SKV_PB_H)
ifneq ($(SNAPKVCTL),)
$(SNAPKVCTL): $(LIBSNAPKV_A) $(LIBSKVPROTO)
SNAPKVCTL_LIBS += $(LIBSNAPKV_A) $(LIBSKVPROTO) $(PBC_LIBS)
endif

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
DAEMON_OBJECT_TESTS := cache loop request session
DAEMON_OBJECT_BINS := $(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/test-daemon-%)
OBJS += $(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/unit/daemon/test-%.o)
$(DAEMON_OBJECT_TESTS:%=$(BUILD)/tests/unit/daemon/test-%.o): | $(SKV_PB_H)
$(DAEMON_OBJECT_BINS): $(BUILD)/tests/test-daemon-%: $(BUILD)/tests/unit/daemon/test-%.o \
		$(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSNAPKVD) $(LIBSKVPROTO) $(LIBSKV) $(URING_LIBS) \
		$(PBC_LIBS) $(CUNIT_LIBS) $(BLAS_LIBS) -lm $(LDFLAGS)
TESTS += $(DAEMON_OBJECT_BINS)

# snapkvctl's side of `top`/`pressure`: the Prometheus parser and renderer
# (client/ctl-ops-view.c), tested against the daemon's writer.
OBJS += $(BUILD)/client/ctl-ops-view.o $(BUILD)/tests/unit/test-ops-view.o
$(BUILD)/tests/test-ops-view: $(BUILD)/tests/unit/test-ops-view.o $(BUILD)/client/ctl-ops-view.o \
		$(LIBSNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-ops-view

# The policy through a real snapkvd, eight engine processes included (jansson:
# the hooks' ledger snapshot is compared with `snapkvctl ledger --json`).
OPS_ITEST := $(BUILD)/tests/test-ops-daemon
OBJS += $(BUILD)/tests/integration/test-ops-daemon.o
$(BUILD)/tests/integration/test-ops-daemon.o: | $(SKV_PB_H)
$(OPS_ITEST): $(BUILD)/tests/integration/test-ops-daemon.o $(BUILD)/client/ctl-ops-view.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD) $(SNAPKVCTL)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(BUILD)/client/ctl-ops-view.o $(SNAPKV_LINK) $(LIBSKVPROTO) \
		$(LIBSKV) $(PBC_LIBS) $(BLAS_LIBS) $(JSON_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(OPS_ITEST)

# snapkvctl pressure/top (client/ctl-ops.c, compiled by client/build.mk with
# every client/ctl-*.c) speak the admin protocol.
ifneq ($(SNAPKVCTL),)
$(BUILD)/client/ctl-ops.o: | $(SKV_PB_H)
TEST_SCRIPTS += tests/integration/test-ops-ctl.sh
endif

# snapkvctl against a live daemon (needs the cli's snapkvctl in the tree).
ifneq ($(wildcard client/snapkvctl.c),)
TEST_SCRIPTS += tests/integration/test-daemon-ctl.sh
# the ledger of real caches (expand, group, APPEND, GROW) per cache, tenant, pool
TEST_SCRIPTS += tests/integration/test-daemon-ledger.sh
# the worker pool: the suites above again with 3 workers, engines at once
TEST_SCRIPTS += tests/integration/test-daemon-workers.sh
endif
TEST_SCRIPTS += tests/integration/test-libsnapkv-abi.sh

$(BUILD)/tests/integration/test-daemon-fuzz.o: | $(SKV_PB_H)
OBJS += $(BUILD)/tests/integration/test-daemon-fuzz.o
$(BUILD)/tests/test-daemon-fuzz: $(BUILD)/tests/integration/test-daemon-fuzz.o \
		$(LIBSNAPKV) $(LIBSKVPROTO) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		-lm $(LDFLAGS)
TESTS += $(BUILD)/tests/test-daemon-fuzz
