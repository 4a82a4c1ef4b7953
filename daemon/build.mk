# SPDX-License-Identifier: MIT
# daemon/: snapkvd, one object per file (docs/request-path.md maps them).

SNAPKVD := $(BUILD)/snapkvd
# Every daemon object but main, as one archive: snapkvd links it whole, and
# each unit test takes from it only what its file under test calls.
LIBSNAPKVD := $(BUILD)/libsnapkvd.a
LIBSNAPKVD_OBJS := $(addprefix $(BUILD)/daemon/snapkvd-, server.o loop.o listener.o \
	session.o control.o ring.o dispatch.o slots.o device.o device-hostreg.o request.o kvpool.o params.o paged.o admission.o job.o group.o compactor.o runner.o runner-host.o \
	runner-cuda.o buffer.o cache.o arena.o pool.o ledger.o admin.o policy.o \
	pressure.o hooks.o metrics.o config.o value.o log.o clock.o http.o tally.o \
	adminq.o bucket.o cacheinfo.o)
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

# bench/bench-ring: ring vs socket round trip of a no-op (make bench).
BENCH_RING := $(BUILD)/bench/bench-ring
OBJS += $(BUILD)/bench/bench-ring.o
$(BENCH_RING): $(BUILD)/bench/bench-ring.o $(LIBSNAPKV) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LDFLAGS)
BENCHES += $(BENCH_RING)

# Its tests: tests/unit/build.mk (one file per object, tests/unit/daemon/),
# tests/integration/build.mk (programs that start a snapkvd).
