# SPDX-License-Identifier: MIT
# snapkvd top-level build. Each directory adds its own rules in a build.mk
# fragment (kernels/build.mk, daemon/build.mk, ...) and appends to:
#   BINS        programs built by `make`
#   LIBS        libraries built by `make`
#   TESTS       test programs run by `make check` (each prints a CUnit summary)
#   TEST_SCRIPTS  shell/integration tests run by `make check` after TESTS
#   BENCHES     programs run by `make bench`
#   INSTALL_BINS, INSTALL_LIBS, INSTALL_HEADERS  what `make install` copies

PREFIX   ?= /usr/local
BUILD    ?= build
CC       ?= gcc
OPT      ?= -O2
CFLAGS_BASE := -std=gnu11 $(OPT) -g -Wall -Wextra -Werror -fPIC -pthread \
	-D_GNU_SOURCE -MMD -MP -I. -Ikernels -Iproto -Iclient -I$(BUILD)
CFLAGS   ?=
ALL_CFLAGS = $(CFLAGS_BASE) $(CFLAGS)
LDFLAGS  ?=
SHARED   ?= ../shared

# CUDA: built when nvcc is found; CUDA=0 skips it.
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA     ?= $(if $(NVCC),1,0)

# Libraries several fragments link against, named here so that every
# fragment can use them in prerequisites whatever the include order.
LIBSKV      := $(BUILD)/libskv.a         # kernels/: selection + gather
LIBSKVPROTO := $(BUILD)/libskvproto.a    # proto/: generated protobuf-c, framing, ring ABI helpers
LIBSKVST    := $(BUILD)/libskvst.a       # client/: safetensors read/write (jansson)
LIBSNAPKV   := $(BUILD)/libsnapkv.so     # client/: engine API (soname libsnapkv.so.1)
# System libraries, by Debian package (scripts/deps.sh installs them).
URING_LIBS  := -luring
PBC_LIBS    := -lprotobuf-c
JSON_LIBS   := -ljansson
CUNIT_LIBS  := -lcunit
SYSTEMD_LIBS := -lsystemd
BLAS_LIBS   := -lopenblas
BLAS_CFLAGS := -I/usr/include/x86_64-linux-gnu/openblas-pthread

BINS :=
LIBS :=
TESTS :=
TEST_SCRIPTS :=
BENCHES :=
INSTALL_BINS :=
INSTALL_LIBS :=
INSTALL_HEADERS :=
OBJS :=

.PHONY: all check bench demo install clean deps format _check _bench _demo
all:

include $(sort $(wildcard */build.mk */*/build.mk))

# check-sanitize: every CUnit program (unit tests, libsnapkv, the daemon's
# bad-input and fuzz suites, end to end) and the scripts that drive a daemon,
# built with ASan+UBSan in their own tree (never mixing with $(BUILD)'s
# objects) and run by scripts/run-sanitize.sh. No CUDA: nvcc objects and the
# emulator's C++ are not instrumented. Not test-cli-offline.sh: it runs
# valgrind, which cannot run ASan binaries.
SAN_BUILD ?= build-san
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SAN_TESTS ?= $(TESTS)
SAN_TEST_SCRIPTS ?= $(filter $(addprefix tests/integration/,test-cli-online.sh \
	test-daemon-ctl.sh test-daemon-ledger.sh test-ops-ctl.sh test-llama-daemon.sh \
	test-daemon-config.sh test-daemon-workers.sh),$(TEST_SCRIPTS))
.PHONY: check-sanitize _check_sanitize
check-sanitize: deps
	@$(MAKE) --no-print-directory BUILD=$(SAN_BUILD) CUDA=0 CFLAGS="$(SAN_FLAGS)" \
		LDFLAGS="$(SAN_FLAGS)" _check_sanitize
_check_sanitize: all
	@BUILD=$(BUILD) SHARED=$(SHARED) scripts/run-sanitize.sh $(SAN_TESTS) -- $(SAN_TEST_SCRIPTS)

all: $(LIBS) $(BINS) $(TESTS) $(BENCHES)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

deps:
	@scripts/deps.sh

# check and demo first make sure the Debian packages are there, then build.
check: deps
	@$(MAKE) --no-print-directory _check
_check: all
	@BUILD=$(BUILD) SHARED=$(SHARED) scripts/run-tests.sh $(TESTS) -- $(TEST_SCRIPTS)

bench: deps
	@$(MAKE) --no-print-directory _bench
_bench: all
	@set -e; for b in $(BENCHES); do echo "== $$b"; $$b; done

demo: deps
	@$(MAKE) --no-print-directory _demo

# The main job: two tiny-llama engines beside one snapkvd (examples/tiny-llama/
# demo.sh); without the model file it runs two generated-K/V engines instead.
_demo: all
	@$(MAKE) --no-print-directory _demo_llama

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include
	$(if $(INSTALL_BINS),install -m 755 $(INSTALL_BINS) $(DESTDIR)$(PREFIX)/bin/)
	$(if $(INSTALL_LIBS),cp -P $(INSTALL_LIBS) $(DESTDIR)$(PREFIX)/lib/)
	$(if $(INSTALL_HEADERS),install -m 644 $(INSTALL_HEADERS) $(DESTDIR)$(PREFIX)/include/)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) $(SAN_BUILD)

# Keep intermediate objects (e.g. the CUDA emulator's) so a second make
# does not rebuild them.
.SECONDARY:

-include $(OBJS:.o=.d)

# The README's two commands as root in a fresh debootstrap'd Debian 12 minbase
# chroot (build-essential and git added), on a clean clone of HEAD with
# $(SHARED) beside it: proves scripts/deps.sh installs everything. Root,
# debootstrap and Debian's mirror needed; the base tree is cached in
# /var/cache/snapkv-fresh (scripts/check-fresh.sh).
.PHONY: check-fresh
check-fresh:
	@scripts/check-fresh.sh $(SHARED)

# Compile every .cu with nvcc, warnings as errors (CI has nvcc but no GPU).
.PHONY: cuda-check
cuda-check:
	@set -e; files="$$(git ls-files '*.cu' 2>/dev/null || true)"; \
	[ -n "$$files" ] || files="$$(find . -name '*.cu' -not -path './$(BUILD)/*' | sort)"; \
	if [ -z "$$files" ]; then echo "cuda-check: no .cu files"; exit 0; fi; \
	for f in $$files; do echo "nvcc $$f"; \
	  $(NVCC) -std=c++17 -O2 -arch=sm_90 -Ikernels -I. -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -c $$f -o /dev/null; done
