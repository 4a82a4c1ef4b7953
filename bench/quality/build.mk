# SPDX-License-Identifier: MIT
# bench-quality: top-1 agreement and KL(full || compacted) of the tiny-llama
# engine decoding from caches compacted by each policy (libskv, in process).

# Named literally: this fragment is read before examples/tiny-llama/build.mk
# (TL_LIBS, OpenBLAS and ICU, is expanded when the recipe runs).
$(BUILD)/bench-quality: $(BUILD)/bench/quality/quality.o $(BUILD)/bench/quality/quality-common.o \
		$(BUILD)/libtinyllama.a $(LIBSKV)
	$(CC) $(LDFLAGS) -o $@ $^ $(TL_LIBS)

$(BUILD)/bench/quality/quality.o $(BUILD)/bench/quality/quality-common.o: \
	ALL_CFLAGS += -Iexamples/tiny-llama

BENCHES += $(BUILD)/bench-quality
OBJS    += $(BUILD)/bench/quality/quality.o $(BUILD)/bench/quality/quality-common.o

# bench-quality-budget: the budget modes of SPEC.md at equal memory and along tau.
$(BUILD)/bench-quality-budget: $(BUILD)/bench/quality/quality-budget.o \
		$(BUILD)/bench/quality/quality-common.o $(BUILD)/libtinyllama.a $(LIBSKV)
	$(CC) $(LDFLAGS) -o $@ $^ $(TL_LIBS)

$(BUILD)/bench/quality/quality-budget.o: ALL_CFLAGS += -Iexamples/tiny-llama

BENCHES += $(BUILD)/bench-quality-budget
OBJS    += $(BUILD)/bench/quality/quality-budget.o
