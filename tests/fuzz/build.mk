# SPDX-License-Identifier: MIT
# tests/fuzz/: libFuzzer targets (clang, -fsanitize=fuzzer,address,undefined)
# for every parser that reads what another process wrote: the control
# socket's frames and messages, the shared ring, COMPACT requests (checked
# as snapkvd checks them, then run through libskv's kernels), safetensors,
# GGUF, the daemon's config file, the Prometheus listener's requests. Not part of `make`/`make all` (they need clang):
#   make fuzz FUZZ_S=N   each target N seconds (default 60) over its seeds
#   make fuzz-ci         each target FUZZ_CI_S seconds (8), then every
#                        regression input once (CI runs this)
#   make fuzz-seeds      regenerate tests/fuzz/corpus/ (committed)
# Seeds: tests/fuzz/corpus/<target>/; inputs that once crashed a target:
# tests/fuzz/regress/<target>/ (replayed by both); what a run finds goes to
# $(FUZZ_BUILD)/corpus/ and crashes to $(FUZZ_BUILD)/crashes/.
FUZZ_BUILD ?= $(BUILD)/fuzz
FUZZ_CC ?= clang
FUZZ_S ?= 60
FUZZ_CI_S ?= 8
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS := -std=gnu11 -O1 -g -D_GNU_SOURCE -DSKV_NO_DEPRECATION_WARNINGS -Wall -Wextra -MMD -MP \
	-I. -Ikernels -Iproto -Iclient -Idaemon -I$(BUILD) -I$(BUILD)/proto

# What each target parses, by source file: when a file moves or splits,
# change its line here (`make fuzz-build` is in CI, so a stale line fails it).
FUZZ_FRAME_SRCS ?= proto/skv-frame.c $(BUILD)/proto/snapkv.pb-c.c
FUZZ_RING_SRCS ?=
# snapkvd's validation (daemon/snapkvd-request.c is #included by the target, with
# fakes) and the daemon objects it calls, then libskv's real kernels (ISA files
# with their flags)
FUZZ_REQUEST_SRCS ?= $(BUILD)/proto/snapkv.pb-c.c $(SKV_SRCS) daemon/snapkvd-job.c \
	daemon/snapkvd-cache.c daemon/snapkvd-paged.c daemon/snapkvd-config.c daemon/snapkvd-log.c \
	daemon/snapkvd-pressure.c daemon/snapkvd-hooks.c daemon/snapkvd-clock.c daemon/snapkvd-arena.c \
	daemon/snapkvd-params.c daemon/snapkvd-value.c
FUZZ_ST_SRCS ?= client/libskvst/skv-safetensors.c
FUZZ_ST_INC ?= -Iclient/libskvst
FUZZ_GGUF_SRCS ?= examples/tiny-llama/tl-gguf.c
FUZZ_GGUF_INC ?= -Iexamples/tiny-llama
FUZZ_CONFIG_SRCS ?= daemon/snapkvd-config.c daemon/snapkvd-value.c daemon/snapkvd-log.c daemon/snapkvd-pressure.c \
	daemon/snapkvd-hooks.c
FUZZ_CONFIG_INC ?= -Idaemon
# the Prometheus listener's request parsing (snapkvd-http.c is #included by
# the target, on a fake loop)
FUZZ_HTTP_SRCS ?= daemon/snapkvd-log.c

# differential: random COMPACT requests through a real snapkvd (the
# ordinary build's daemon and libsnapkv) against libskv in process
FUZZ_COMPACT_DIFF_SRCS ?= $(SKV_SRCS)

FUZZ_TARGETS := frame ring request safetensors gguf config http compact-diff
FUZZ_BINS := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz-%)
FUZZ_OBJ = $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(1))

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_ST_INC) $(FUZZ_GGUF_INC) $(FUZZ_CONFIG_INC) \
		$(FUZZ_SAN) -fsanitize=fuzzer-no-link -c $< -o $@
# the targets themselves build warning-free under clang
$(call FUZZ_OBJ,$(FUZZ_TARGETS:%=tests/fuzz/fuzz-%.c)): FUZZ_CFLAGS += -Werror
$(call FUZZ_OBJ,$(FUZZ_TARGETS:%=tests/fuzz/fuzz-%.c) $(FUZZ_FRAME_SRCS)): | $(SKV_PB_H)
$(call FUZZ_OBJ,$(filter kernels/%,$(FUZZ_REQUEST_SRCS))): FUZZ_CFLAGS += -fno-math-errno
$(call FUZZ_OBJ,kernels/skv-ctx.c): FUZZ_CFLAGS += -include tests/fuzz/clang-cpu.h
$(call FUZZ_OBJ,kernels/skv-avx2.c): FUZZ_CFLAGS += -mavx2 -mfma -mf16c
$(call FUZZ_OBJ,kernels/skv-avx512.c): FUZZ_CFLAGS += -mavx512f -mavx512dq -mavx512bw \
	-mavx512vl -mfma -mf16c

FUZZ_LINK = $(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $^
$(FUZZ_BUILD)/fuzz-frame: $(call FUZZ_OBJ,tests/fuzz/fuzz-frame.c $(FUZZ_FRAME_SRCS))
	$(FUZZ_LINK) $(PBC_LIBS)
$(FUZZ_BUILD)/fuzz-ring: $(call FUZZ_OBJ,tests/fuzz/fuzz-ring.c $(FUZZ_RING_SRCS))
	$(FUZZ_LINK)
$(FUZZ_BUILD)/fuzz-request: $(call FUZZ_OBJ,tests/fuzz/fuzz-request.c $(FUZZ_REQUEST_SRCS))
	$(FUZZ_LINK) $(PBC_LIBS) -lm -pthread
$(FUZZ_BUILD)/fuzz-safetensors: $(call FUZZ_OBJ,tests/fuzz/fuzz-safetensors.c $(FUZZ_ST_SRCS))
	$(FUZZ_LINK) $(JSON_LIBS) -lm
$(FUZZ_BUILD)/fuzz-gguf: $(call FUZZ_OBJ,tests/fuzz/fuzz-gguf.c $(FUZZ_GGUF_SRCS))
	$(FUZZ_LINK) -lm
$(FUZZ_BUILD)/fuzz-config: $(call FUZZ_OBJ,tests/fuzz/fuzz-config.c $(FUZZ_CONFIG_SRCS))
	$(FUZZ_LINK) -lm
$(FUZZ_BUILD)/fuzz-http: $(call FUZZ_OBJ,tests/fuzz/fuzz-http.c $(FUZZ_HTTP_SRCS))
	$(FUZZ_LINK)
$(call FUZZ_OBJ,tests/fuzz/fuzz-compact-diff.c): FUZZ_CFLAGS += -Iclient/libsnapkv
# the daemon it starts and the library it talks through are prerequisites,
# so that a changed daemon is rebuilt before a run (not linked in)
$(FUZZ_BUILD)/fuzz-compact-diff: $(call FUZZ_OBJ,tests/fuzz/fuzz-compact-diff.c \
		$(FUZZ_COMPACT_DIFF_SRCS)) $(LIBSNAPKV) $(BUILD)/snapkvd
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $(filter %.o,$^) -L$(BUILD) -lsnapkv \
		-Wl,-rpath,$(abspath $(BUILD)) -lm -pthread

-include $(patsubst %.o,%.d,$(call FUZZ_OBJ,$(FUZZ_TARGETS:%=tests/fuzz/fuzz-%.c) \
	$(FUZZ_FRAME_SRCS) $(FUZZ_REQUEST_SRCS) $(FUZZ_ST_SRCS) $(FUZZ_GGUF_SRCS) $(FUZZ_CONFIG_SRCS) \
	$(FUZZ_HTTP_SRCS) $(FUZZ_COMPACT_DIFF_SRCS)))

.PHONY: fuzz fuzz-ci fuzz-build fuzz-seeds
fuzz-build: $(FUZZ_BINS)
fuzz: fuzz-build
	@tests/fuzz/run-fuzz.sh $(FUZZ_BUILD) $(FUZZ_S) $(FUZZ_TARGETS)
fuzz-ci: fuzz-build
	@tests/fuzz/run-fuzz.sh $(FUZZ_BUILD) $(FUZZ_CI_S) $(FUZZ_TARGETS)

# The seed generator is an ordinary program (gcc, $(BUILD)): frames from
# the generated protobuf code, files from libskvst's writer.
FUZZ_GEN_SEEDS := $(BUILD)/tests/fuzz/gen-seeds
BINS += $(FUZZ_GEN_SEEDS)
OBJS += $(FUZZ_GEN_SEEDS).o
$(FUZZ_GEN_SEEDS).o: | $(SKV_PB_H)
$(FUZZ_GEN_SEEDS): $(FUZZ_GEN_SEEDS).o $(LIBSKVST) $(LIBSKVPROTO) $(LIBSKV)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIBSKVST) $(LIBSKVPROTO) $(LIBSKV) $(JSON_LIBS) \
		$(PBC_LIBS) -lm $(LDFLAGS)
fuzz-seeds: $(FUZZ_GEN_SEEDS)
	rm -rf $(FUZZ_TARGETS:%=tests/fuzz/corpus/%)
	$(FUZZ_GEN_SEEDS) tests/fuzz/corpus
	mkdir -p tests/fuzz/corpus/config
	cp systemd/snapkvd.conf tests/fuzz/corpus/config/sample
	sed -n 's/^#\([a-z_]* = \)/\1/p' systemd/snapkvd.conf > tests/fuzz/corpus/config/every-key
	mkdir -p tests/fuzz/corpus/http
	printf '\000\003\001GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n' >tests/fuzz/corpus/http/get-metrics
	printf '\005\000\000HEAD /healthz HTTP/1.0\n\n' >tests/fuzz/corpus/http/head-healthz
	printf '\001\000\001POST /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc' >tests/fuzz/corpus/http/post
	{ printf '\000\000\001GET /metrics HTTP/1.1\r\nX: '; head -c 400 /dev/zero | tr '\0' a; \
	  printf '\r\n\r\n'; } >tests/fuzz/corpus/http/big-header
