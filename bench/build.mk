# SPDX-License-Identifier: MIT
# Benchmarks run by `make bench` (see bench/README.md).
SKV_BENCH := $(BUILD)/bench/bench-kernels
BENCHES += $(SKV_BENCH)
OBJS += $(SKV_BENCH).o

$(BUILD)/bench/bench-kernels.o: CFLAGS_BASE += $(BLAS_CFLAGS)
$(SKV_BENCH): %: %.o $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(BLAS_LIBS) $(LDFLAGS)

# bench-budget: the budget modes' cost over uniform (one layer, L 32768).
BUDGET_BENCH := $(BUILD)/bench/bench-budget
BENCHES += $(BUDGET_BENCH)
OBJS += $(BUDGET_BENCH).o
$(BUDGET_BENCH): $(BUDGET_BENCH).o $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $^ -lpthread $(LDFLAGS)
