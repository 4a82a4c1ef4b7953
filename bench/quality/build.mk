# SPDX-License-Identifier: MIT
# bench-quality: top-1 agreement and KL(full || compacted) of the tiny-llama
# engine decoding from caches compacted by each policy (libskv, in process).

# Named literally: this fragment is read before examples/tiny-llama/build.mk.
$(BUILD)/bench-quality: $(BUILD)/bench/quality/quality.o $(BUILD)/libtinyllama.a $(LIBSKV)
	$(CC) $(LDFLAGS) -o $@ $^ -lm -pthread

$(BUILD)/bench/quality/quality.o: ALL_CFLAGS += -Iexamples/tiny-llama

BENCHES += $(BUILD)/bench-quality
OBJS    += $(BUILD)/bench/quality/quality.o
