# SPDX-License-Identifier: MIT
# tests/integration/: programs and scripts that drive a live snapkvd.
#
# CUnit programs that start their own snapkvd, tests/integration/<name>.c,
# built as $(BUILD)/tests/<name> by one rule (libsnapkv, libskvproto, and
# libskv for the references some compare with); add a name to the list. A
# program's own objects: a prerequisite of its binary, as test-ops-daemon's.
#   test-daemon-e2e        the request path end to end
#   test-daemon-badinput   bad input answered, nothing lost
#   test-daemon-paged      paged output vs libskv here
#   test-daemon-cancel     writeback destinations reused after a cancel or
#                          a close are never written again (issue 20)
#   test-daemon-budget     budget modes vs skv_compact_budget here
#   test-daemon-window     a partial window (and fp8 K/V) vs libskv here
#   test-daemon-fuzz       random requests through the daemon
#   test-hostile           one test per hardening defect (issue 11)
#   test-ops-daemon        the policy through a real snapkvd, eight engine
#                          processes; the hooks' ledger snapshot against
#                          `snapkvctl ledger --json` (jansson)
#   test-daemon-group      decision groups: engines in processes of their
#                          own vs skv_compact_budget here, timeouts, bad groups
#   test-libsnapkv-threads libsnapkv's thread-safety promise from C: one
#                          client, several threads (check-tsan runs it too)
#   test-daemon-pools      registered KV pools and tables in buffers vs the
#                          inline path and libskv (a 1M-token table; issue 20)
DAEMON_ITESTS := test-daemon-e2e test-daemon-badinput test-daemon-paged test-daemon-cancel \
	test-daemon-budget test-daemon-window test-daemon-fuzz test-hostile test-ops-daemon \
	test-daemon-group test-libsnapkv-threads test-daemon-admin test-daemon-pools
DAEMON_ITEST_BINS := $(DAEMON_ITESTS:%=$(BUILD)/tests/%)
OBJS += $(DAEMON_ITESTS:%=$(BUILD)/tests/integration/%.o)
$(DAEMON_ITESTS:%=$(BUILD)/tests/integration/%.o): | $(SKV_PB_H)
$(DAEMON_ITEST_BINS): $(BUILD)/tests/%: $(BUILD)/tests/integration/%.o $(LIBSNAPKV) \
		$(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD) $(SNAPKVCTL)
	$(CC) $(ALL_CFLAGS) -o $@ $(filter %.o,$^) $(SNAPKV_LINK) $(LIBSKVPROTO) $(LIBSKV) \
		$(PBC_LIBS) $(BLAS_LIBS) $(JSON_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
$(BUILD)/tests/test-ops-daemon: $(SNAPKVCTL_VIEW_OBJS)
TESTS += $(DAEMON_ITEST_BINS)

# snapkvctl against a live daemon
ifneq ($(SNAPKVCTL),)
# the ledger of real caches (expand, group, APPEND, GROW) per cache, tenant, pool
TEST_SCRIPTS += tests/integration/test-daemon-ledger.sh
# the worker pool: the suites above again with 3 workers, engines at once
TEST_SCRIPTS += tests/integration/test-daemon-workers.sh
endif
# log lines under a flood of connections: summarised per cause (issue 20)
TEST_SCRIPTS += tests/integration/test-daemon-logflood.sh

# The chaos test (engines and the daemon SIGKILLed while they work).
#   make check   runs it for 30 s with 4 engines (test-chaos's defaults)
#   make chaos   CHAOS_S seconds (300) with CHAOS_ENGINES engines (8)
TEST_CHAOS := $(BUILD)/tests/test-chaos
OBJS += $(BUILD)/tests/integration/test-chaos.o
$(BUILD)/tests/integration/test-chaos.o: | $(BUILD)/proto/snapkv.pb-c.h
$(TEST_CHAOS): $(BUILD)/tests/integration/test-chaos.o $(LIBSNAPKV) $(LIBSKVST) $(LIBSKVPROTO) \
		$(LIBSKV) $(SNAPKVD) $(SNAPKVCTL) $(GEN_LAYER)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVST) $(LIBSKVPROTO) $(LIBSKV) \
		$(JSON_LIBS) $(PBC_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(TEST_CHAOS)

CHAOS_S ?= 300
CHAOS_ENGINES ?= 8
CHAOS_SEED ?= 1
.PHONY: chaos
chaos: $(TEST_CHAOS)
	BUILD=$(BUILD) CHAOS_SECONDS=$(CHAOS_S) CHAOS_ENGINES=$(CHAOS_ENGINES) \
		CHAOS_SEED=$(CHAOS_SEED) CHAOS_MAX_KILLS=$$(( $(CHAOS_S) * 4 )) $(TEST_CHAOS)

# the Prometheus listener (metrics_listen) through curl and promtool
# (scripts/deps.sh unpacks promtool from Debian's prometheus package)
TEST_SCRIPTS += tests/integration/test-metrics-http.sh

# a skip is a skip: run-tests.sh's tally and SNAPKV_REQUIRE, every script
# that can skip on an empty build tree, tests/test-skip.h through test-llama
TEST_SCRIPTS += tests/integration/test-skips.sh
