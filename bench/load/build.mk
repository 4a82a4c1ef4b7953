# SPDX-License-Identifier: MIT
# bench-load: 16 engines x 1000 compactions against one snapkvd, throughput
# and latency percentiles (make bench; bench/README.md records results).
BENCH_LOAD := $(BUILD)/bench/bench-load
OBJS += $(BUILD)/bench/load/bench-load.o
# named literally: daemon/build.mk, which defines them, is read after this file
$(BENCH_LOAD): $(BUILD)/bench/load/bench-load.o $(BUILD)/libsnapkv.so $(BUILD)/snapkvd
	$(CC) $(ALL_CFLAGS) -o $@ $< -L$(BUILD) -lsnapkv -Wl,-rpath,$(abspath $(BUILD)) \
		$(PBC_LIBS) $(LDFLAGS)
BENCHES += $(BENCH_LOAD)
# bench-scale: issue 24's scenario, one tenant holding N caches at high
# pressure, a bystander's latency per phase (and under root ledger pollers), watchdog gaps, SIGTERM time
# (run by hand: bench/README.md, "Many caches").
BENCH_SCALE := $(BUILD)/bench/bench-scale
OBJS += $(BUILD)/bench/load/bench-scale.o
$(BENCH_SCALE): $(BUILD)/bench/load/bench-scale.o $(BUILD)/libsnapkv.so $(BUILD)/snapkvd \
		$(BUILD)/libskvproto.a
	$(CC) $(ALL_CFLAGS) -o $@ $< -L$(BUILD) -lsnapkv -Wl,-rpath,$(abspath $(BUILD)) \
		$(BUILD)/libskvproto.a $(PBC_LIBS) $(LDFLAGS)
BINS += $(BENCH_SCALE)
