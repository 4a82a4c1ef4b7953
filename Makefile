# SPDX-License-Identifier: MIT
# snapkvd top-level build. Each directory adds its own rules in a build.mk
# fragment (kernels/build.mk, daemon/build.mk, ...) and appends to:
#   BINS        programs built by `make`
#   LIBS        libraries built by `make`
#   TESTS       test programs run by `make check` (each prints a CUnit summary)
#   TEST_SCRIPTS  shell/integration tests run by `make check` after TESTS
#   BENCHES     programs run by `make bench`
#   INSTALL_BINS, INSTALL_LIBS, INSTALL_HEADERS  what `make install` copies
#   INSTALL_UNITS, INSTALL_DROPINS, INSTALL_TMPFILES, INSTALL_SYSUSERS,
#   INSTALL_CONFIGS, INSTALL_MANS, INSTALL_COMPLETIONS  the same, for the
#   service (systemd/), its man pages (man/) and bash completion (shell/)

# One version for the project: libsnapkv's (1.MINOR.PATCH, MINOR its newest
# SNAPKV_1.MINOR symbol node: client/libsnapkv/build.mk), so that the .so's
# file name, `snapkvd --version`, `snapkvctl --version`, snapkvctl status and
# the metric snapkvd_build_info all say the same. Objects that print it
# depend on $(BUILD)/version, rewritten only when it changes.
VERSION = $(LIBSNAPKV_VER)
VERSION_DEFINE = -DSKV_VERSION='"$(VERSION)"'

PREFIX   ?= /usr/local
# Where `make install` puts things (under $(DESTDIR)); the units get these
# paths written in. Units, tmpfiles and sysusers go below $(PREFIX)/lib,
# which systemd searches for /usr and /usr/local alike.
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
DATADIR      ?= $(PREFIX)/share
MANDIR       ?= $(DATADIR)/man
SYSCONFDIR   ?= /etc
UNITDIR      ?= $(PREFIX)/lib/systemd/system
TMPFILESDIR  ?= $(PREFIX)/lib/tmpfiles.d
SYSUSERSDIR  ?= $(PREFIX)/lib/sysusers.d
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
BASHCOMPDIR  ?= $(DATADIR)/bash-completion/completions
BUILD    ?= build
CC       ?= gcc
OPT      ?= -O2
CFLAGS_BASE := -std=gnu11 $(OPT) -g -Wall -Wextra -Werror -fPIC -pthread \
	-D_GNU_SOURCE -DSKV_NO_DEPRECATION_WARNINGS -MMD -MP -I. -Ikernels -Iproto -Iclient/libsnapkv \
	-Iclient/libskvst -I$(BUILD)
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
LIBSKVST    := $(BUILD)/libskvst.a       # client/libskvst/: safetensors read/write (jansson)
LIBSNAPKV   := $(BUILD)/libsnapkv.so     # client/libsnapkv/: engine API (soname libsnapkv.so.1)
LIBSNAPKV_A := $(BUILD)/libsnapkv.a      # client/libsnapkv/: its static copy (snapkvctl)
# proto/'s generated header, for order-only prerequisites of any fragment.
SKV_PB_H    := $(BUILD)/proto/snapkv.pb-c.h
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
INSTALL_UNITS :=
INSTALL_DROPINS :=
INSTALL_TMPFILES :=
INSTALL_SYSUSERS :=
INSTALL_CONFIGS :=
INSTALL_MANS :=
INSTALL_COMPLETIONS :=
OBJS :=

.PHONY: all check bench demo install uninstall clean deps format _check _bench _demo FORCE
all:

include $(sort $(wildcard */build.mk */*/build.mk))

# check-sanitize: every CUnit program (unit tests, libsnapkv, the daemon's
# bad-input and fuzz suites, end to end) and the scripts that drive a daemon,
# built with ASan+UBSan in their own tree (never mixing with $(BUILD)'s
# objects) and run by scripts/run-sanitize.sh. No CUDA: nvcc objects and the
# emulator's C++ are not instrumented. Not test-cli-offline.sh: it runs
# valgrind, which cannot run ASan binaries. The Python suite runs its
# ASan-built module in the system interpreter, the runtime preloaded
# (tests/python/run-pytest.sh).
SAN_BUILD ?= build-san
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
SAN_TESTS ?= $(TESTS)
SAN_TEST_SCRIPTS ?= $(filter $(addprefix tests/integration/,test-cli-online.sh \
	test-daemon-ctl.sh test-daemon-ledger.sh test-ops-ctl.sh test-llama-daemon.sh \
	test-daemon-config.sh test-daemon-workers.sh test-cli-socket.sh test-cli-top.sh \
	test-metrics-http.sh test-cli-budget.sh) tests/python/run-pytest.sh,$(TEST_SCRIPTS))
.PHONY: check-sanitize _check_sanitize
check-sanitize: deps
	@$(MAKE) --no-print-directory BUILD=$(SAN_BUILD) CUDA=0 CFLAGS="$(SAN_FLAGS)" \
		LDFLAGS="$(SAN_FLAGS)" _check_sanitize
_check_sanitize: all
	@BUILD=$(BUILD) SHARED=$(SHARED) scripts/run-sanitize.sh $(SAN_TESTS) -- $(SAN_TEST_SCRIPTS)

# check-tsan: the programs that drive a daemon (its loop thread, compaction
# workers and their thread pools, hooks), built with ThreadSanitizer in their
# own tree and run by scripts/run-tsan.sh; any data race fails it. (-Wno-tsan:
# TSan does not model the rings' fences; they order memory shared with
# another process, which it cannot see anyway.)
TSAN_BUILD ?= build-tsan
TSAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer -Wno-tsan
TSAN_TESTS ?= $(addprefix $(BUILD)/tests/,test-daemon-e2e test-daemon-badinput test-hostile \
	test-ops-daemon test-daemon-fuzz test-daemon-group test-libsnapkv-threads)
# then a second pass with a pool of 3 compaction workers (the harness's
# --workers): jobs of several sessions on several workers at once, and the
# worker-pool script (which runs the daemon suites with 3 workers itself)
TSAN_WORKERS_TESTS ?= $(addprefix $(BUILD)/tests/,test-libsnapkv-threads)
TSAN_WORKERS_SCRIPTS ?= tests/integration/test-daemon-workers.sh
.PHONY: check-tsan _check_tsan
check-tsan: deps
	@$(MAKE) --no-print-directory BUILD=$(TSAN_BUILD) CUDA=0 CFLAGS="$(TSAN_FLAGS)" \
		LDFLAGS="$(TSAN_FLAGS)" _check_tsan
_check_tsan: $(SNAPKVD) $(SNAPKVCTL) $(GEN_LAYER) $(TSAN_TESTS)
	@BUILD=$(BUILD) SHARED=$(SHARED) scripts/run-tsan.sh $(TSAN_TESTS)
	@BUILD=$(BUILD) SHARED=$(SHARED) SNAPKVD_TEST_WORKERS=3 scripts/run-tsan.sh \
		$(TSAN_WORKERS_TESTS) -- $(TSAN_WORKERS_SCRIPTS)

all: $(LIBS) $(BINS) $(TESTS) $(BENCHES)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

deps:
	@scripts/deps.sh

# check and demo first make sure the Debian packages are there, then build.
check: deps
	@$(MAKE) --no-print-directory _check
# (CUDA=1 tells the scripts that a missing CUDA build is a failure, not a skip)
_check: all
	@BUILD=$(BUILD) SHARED=$(SHARED) CUDA=$(CUDA) scripts/run-tests.sh $(TESTS) -- $(TEST_SCRIPTS)

bench: deps
	@$(MAKE) --no-print-directory _bench
_bench: all
	@set -e; for b in $(BENCHES); do echo "== $$b"; $$b; done

demo: deps
	@$(MAKE) --no-print-directory _demo

# The main job: two tiny-llama engines beside one snapkvd (examples/tiny-llama/
# demo.sh); without the model file it runs two generated-K/V engines instead.
# Then the reference paged engine in Python (examples/torch-paged/demo.sh).
_demo: all
	@$(MAKE) --no-print-directory _demo_llama
	@$(MAKE) --no-print-directory _demo_torch_paged

# The installed paths, rewritten only when they change, so that files that
# have them written in (units, snapkv.pc) follow PREFIX and friends.
INSTALL_PATHS = $(PREFIX) $(BINDIR) $(LIBDIR) $(INCLUDEDIR) $(SYSCONFDIR) $(LIBSNAPKV_VER)
$(BUILD)/install-paths: FORCE
	@mkdir -p $(BUILD)
	@echo '$(INSTALL_PATHS)' | cmp -s - $@ || echo '$(INSTALL_PATHS)' >$@
FORCE:

$(BUILD)/version: FORCE
	$(if $(VERSION),,$(error VERSION is unset: it is libsnapkv's LIBSNAPKV_VER))
	@mkdir -p $(BUILD)
	@echo '$(VERSION)' | cmp -s - $@ || echo '$(VERSION)' >$@

SNAPKV_PC := $(BUILD)/snapkv.pc
$(SNAPKV_PC): snapkv.pc.in $(BUILD)/install-paths
	$(if $(LIBSNAPKV_VER),,$(error LIBSNAPKV_VER is unset: snapkv.pc needs libsnapkv's version))
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
		-e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(LIBSNAPKV_VER)|g' $< >$@.tmp
	@! grep -n '@[A-Z]*@' $@.tmp || { echo "$@: unsubstituted" >&2; exit 1; }
	mv $@.tmp $@

# Headers go to include/snapkv/ (`pkg-config --cflags snapkv`), the config to
# $(SYSCONFDIR)/snapkvd/ unless one is there (an operator's is never
# overwritten; the default stays readable in $(DATADIR)/snapkvd/).
INSTALL_DEST = $(DESTDIR)$(1)/$(notdir $(2))
install: all $(INSTALL_UNITS) $(INSTALL_DROPINS) $(SNAPKV_PC)
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/snapkv \
		$(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(TMPFILESDIR) \
		$(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(SYSCONFDIR)/snapkvd \
		$(DESTDIR)$(DATADIR)/snapkvd/snapkvd.service.d $(DESTDIR)$(BASHCOMPDIR) \
		$(addprefix $(DESTDIR)$(MANDIR)/man,$(sort $(subst .,,$(suffix $(INSTALL_MANS)))))
	$(if $(INSTALL_BINS),install -m 755 $(INSTALL_BINS) $(DESTDIR)$(BINDIR)/)
	@set -e; for f in $(INSTALL_LIBS); do if [ -L "$$f" ]; then echo "cp -P $$f $(DESTDIR)$(LIBDIR)/"; \
	  cp -P "$$f" $(DESTDIR)$(LIBDIR)/; else echo "install -m 644 $$f $(DESTDIR)$(LIBDIR)/"; \
	  install -m 644 "$$f" $(DESTDIR)$(LIBDIR)/; fi; done
	$(if $(INSTALL_HEADERS),install -m 644 $(INSTALL_HEADERS) $(DESTDIR)$(INCLUDEDIR)/snapkv/)
	install -m 644 $(SNAPKV_PC) $(DESTDIR)$(PKGCONFIGDIR)/
	$(if $(INSTALL_UNITS),install -m 644 $(INSTALL_UNITS) $(DESTDIR)$(UNITDIR)/)
	$(if $(INSTALL_DROPINS),install -m 644 $(INSTALL_DROPINS) \
		$(DESTDIR)$(DATADIR)/snapkvd/snapkvd.service.d/)
	$(foreach f,$(INSTALL_TMPFILES),install -m 644 $(f) $(DESTDIR)$(TMPFILESDIR)/snapkvd.conf;)
	$(foreach f,$(INSTALL_SYSUSERS),install -m 644 $(f) $(DESTDIR)$(SYSUSERSDIR)/snapkvd.conf;)
	$(foreach f,$(INSTALL_MANS),install -m 644 $(f) \
		$(DESTDIR)$(MANDIR)/man$(subst .,,$(suffix $(f)))/;)
	$(foreach f,$(INSTALL_COMPLETIONS),install -m 644 $(f) \
		$(DESTDIR)$(BASHCOMPDIR)/$(basename $(notdir $(f)));)
	$(foreach f,$(INSTALL_CONFIGS),install -m 644 $(f) $(DESTDIR)$(DATADIR)/snapkvd/;)
	@set -e; for f in $(INSTALL_CONFIGS); do d=$(DESTDIR)$(SYSCONFDIR)/snapkvd/$${f##*/}; \
	  if [ -e "$$d" ]; then echo "install: keeping the existing $$d"; \
	  else echo "install -m 644 $$f $$d"; install -m 644 "$$f" "$$d"; fi; done

# Removes what install put there; an edited config stays (and is named).
uninstall:
	rm -f $(foreach f,$(INSTALL_BINS),$(call INSTALL_DEST,$(BINDIR),$(f))) \
		$(foreach f,$(INSTALL_LIBS),$(call INSTALL_DEST,$(LIBDIR),$(f))) \
		$(foreach f,$(INSTALL_HEADERS),$(call INSTALL_DEST,$(INCLUDEDIR)/snapkv,$(f))) \
		$(DESTDIR)$(PKGCONFIGDIR)/snapkv.pc \
		$(foreach f,$(INSTALL_UNITS),$(call INSTALL_DEST,$(UNITDIR),$(f))) \
		$(foreach f,$(INSTALL_DROPINS),$(call INSTALL_DEST,$(DATADIR)/snapkvd/snapkvd.service.d,$(f))) \
		$(if $(INSTALL_TMPFILES),$(DESTDIR)$(TMPFILESDIR)/snapkvd.conf) \
		$(if $(INSTALL_SYSUSERS),$(DESTDIR)$(SYSUSERSDIR)/snapkvd.conf) \
		$(foreach f,$(INSTALL_MANS),$(DESTDIR)$(MANDIR)/man$(subst .,,$(suffix $(f)))/$(notdir $(f))) \
		$(foreach f,$(INSTALL_COMPLETIONS),$(DESTDIR)$(BASHCOMPDIR)/$(basename $(notdir $(f))))
	@set -e; for f in $(INSTALL_CONFIGS); do d=$(DESTDIR)$(SYSCONFDIR)/snapkvd/$${f##*/}; \
	  if cmp -s "$$f" "$$d"; then rm -f "$$d"; \
	  elif [ -e "$$d" ]; then echo "uninstall: keeping $$d (changed from the default)"; fi; \
	  rm -f $(DESTDIR)$(DATADIR)/snapkvd/$${f##*/}; done
	-rmdir $(DESTDIR)$(INCLUDEDIR)/snapkv $(DESTDIR)$(DATADIR)/snapkvd/snapkvd.service.d \
		$(DESTDIR)$(DATADIR)/snapkvd $(DESTDIR)$(SYSCONFDIR)/snapkvd 2>/dev/null

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD)

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

# vLLM's CPU build 0.32.0 with the snapkv_vllm plugin (integrations/vllm/,
# issue 27): serves SmolLM2-135M-Instruct on this CPU, plugin off then on
# beside a private snapkvd (scripts/check-vllm.sh). Its environment (about
# 6 GB) and the converted model are cached under ~/.cache/snapkv
# (scripts/vllm-env.sh); offline it is skipped (77), SNAPKV_REQUIRE=vllm
# makes that a failure. Not part of `make check`.
.PHONY: check-vllm
check-vllm: all
	@BUILD=$(BUILD) scripts/check-vllm.sh
