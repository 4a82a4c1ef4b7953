# SPDX-License-Identifier: MIT
# tests/integration/ programs that need no fragment of their own elsewhere:
# the chaos test (engines and the daemon SIGKILLed while they work).
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

# decision groups through snapkvd: engines in processes of their own vs
# libskv's skv_compact_budget here, timeouts, bad groups
TEST_DAEMON_GROUP := $(BUILD)/tests/test-daemon-group
OBJS += $(BUILD)/tests/integration/test-daemon-group.o
$(BUILD)/tests/integration/test-daemon-group.o: | $(SKV_PB_H)
$(TEST_DAEMON_GROUP): $(BUILD)/tests/integration/test-daemon-group.o $(LIBSNAPKV) \
		$(LIBSKVPROTO) $(LIBSKV) $(SNAPKVD) $(SNAPKVCTL)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) \
		$(BLAS_LIBS) $(CUNIT_LIBS) -lm $(LDFLAGS)
TESTS += $(TEST_DAEMON_GROUP)

# a skip is a skip: run-tests.sh's tally and SNAPKV_REQUIRE, every script
# that can skip on an empty build tree, tests/test-skip.h through test-llama
TEST_SCRIPTS += tests/integration/test-skips.sh

# libsnapkv's thread-safety promise from C: one client, several threads
# (check-tsan runs it too)
TEST_LIBSNAPKV_THREADS := $(BUILD)/tests/test-libsnapkv-threads
OBJS += $(BUILD)/tests/integration/test-libsnapkv-threads.o
$(BUILD)/tests/integration/test-libsnapkv-threads.o: | $(SKV_PB_H)
$(TEST_LIBSNAPKV_THREADS): $(BUILD)/tests/integration/test-libsnapkv-threads.o $(LIBSNAPKV) \
		$(LIBSKVPROTO) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		-lm $(LDFLAGS)
TESTS += $(TEST_LIBSNAPKV_THREADS)

# admin answers without stalling the loop (issue 20): a sliced ledger under
# churn, a session leaving midway, the admin rate limits
TEST_DAEMON_ADMIN := $(BUILD)/tests/test-daemon-admin
OBJS += $(BUILD)/tests/integration/test-daemon-admin.o
$(BUILD)/tests/integration/test-daemon-admin.o: | $(SKV_PB_H)
$(TEST_DAEMON_ADMIN): $(BUILD)/tests/integration/test-daemon-admin.o $(LIBSNAPKV) \
		$(LIBSKVPROTO) $(SNAPKVD)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LIBSKVPROTO) $(PBC_LIBS) $(CUNIT_LIBS) \
		-lm $(LDFLAGS)
TESTS += $(TEST_DAEMON_ADMIN)
