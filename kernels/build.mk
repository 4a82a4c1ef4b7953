# SPDX-License-Identifier: MIT
# libskv: host selection + gather kernels (kernels/skv.h). The SIMD files are
# compiled for their ISA only; skv-ctx.c picks one at run time. No libm needed.
SKV_SRCS := $(addprefix kernels/,skv-params.c skv-dtype.c skv-plan.c skv-ledger.c skv-ctx.c \
	skv-score.c skv-select.c skv-budget.c skv-budget-spec.c skv-gather.c skv-compact.c skv-scalar.c skv-avx2.c skv-avx512.c)
SKV_OBJS := $(SKV_SRCS:%.c=$(BUILD)/%.o)
OBJS += $(SKV_OBJS)
LIBS += $(LIBSKV)
INSTALL_LIBS += $(LIBSKV)
INSTALL_HEADERS += kernels/skv.h

$(SKV_OBJS): CFLAGS_BASE += -fno-math-errno
$(BUILD)/kernels/skv-avx2.o: CFLAGS_BASE += -O3 -mavx2 -mfma -mf16c
$(BUILD)/kernels/skv-avx512.o: CFLAGS_BASE += -O3 -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma -mf16c

$(LIBSKV): $(SKV_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^

# Kernel tests (tests/unit/test-kernels*.c) against the scalar reference.
SKV_TEST_REF := $(BUILD)/tests/unit/ref-snapkv.o
SKV_TESTS := $(addprefix $(BUILD)/tests/unit/,test-kernels test-kernels-random test-kernels-paged \
	test-kernels-budget test-kernels-span)
TESTS += $(SKV_TESTS)
OBJS += $(SKV_TEST_REF) $(SKV_TESTS:%=%.o)

$(SKV_TESTS): %: %.o $(SKV_TEST_REF) $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $^ $(CUNIT_LIBS) -lm $(LDFLAGS)
