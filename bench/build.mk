# SPDX-License-Identifier: MIT
# Benchmarks run by `make bench` (see bench/README.md).
SKV_BENCH := $(BUILD)/bench/bench-kernels
BENCHES += $(SKV_BENCH)
OBJS += $(SKV_BENCH).o

$(BUILD)/bench/bench-kernels.o: CFLAGS_BASE += $(BLAS_CFLAGS)
$(SKV_BENCH): %: %.o $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(BLAS_LIBS) $(LDFLAGS)

# bench-daemon: whole-model and per-layer compactions through a live snapkvd
# vs OpenBLAS sgemm, daemon page faults, FMA peak, ring vs cache-line
# ping-pong (bench/README.md). Named literally: daemon/build.mk, which
# defines the daemon's variables, is read after this file.
BENCH_DAEMON := $(BUILD)/bench/bench-daemon
OBJS += $(BENCH_DAEMON).o
$(BUILD)/bench/bench-daemon.o: CFLAGS_BASE += $(BLAS_CFLAGS)
# (libskv for --budget's parser, skv_budget_parse)
$(BENCH_DAEMON): $(BUILD)/bench/bench-daemon.o $(BUILD)/libsnapkv.so $(BUILD)/snapkvd $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSKV) -L$(BUILD) -lsnapkv -Wl,-rpath,$(abspath $(BUILD)) \
		$(BLAS_LIBS) $(PBC_LIBS) -lm -pthread $(LDFLAGS)
BENCHES += $(BENCH_DAEMON)

# bench-budget: the budget modes' cost over uniform (one layer, L 32768).
BUDGET_BENCH := $(BUILD)/bench/bench-budget
BENCHES += $(BUDGET_BENCH)
OBJS += $(BUDGET_BENCH).o
$(BUDGET_BENCH): $(BUDGET_BENCH).o $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $^ -lpthread $(LDFLAGS)
