# SPDX-License-Identifier: MIT
# systemd/: unit files, tmpfiles/sysusers entries, the default config and the
# drop-ins for CUDA and for the Prometheus listener. The service and the drop-in are templates: the installed
# paths (@BINDIR@, @SYSCONFDIR@) are filled in here, for `make install`.
# `systemd-analyze verify` runs on them in make check (tests/integration).
SYSTEMD_GEN := $(BUILD)/systemd/snapkvd.service $(BUILD)/systemd/cuda.conf \
	$(BUILD)/systemd/metrics.conf
$(BUILD)/systemd/snapkvd.service: systemd/snapkvd.service.in Makefile
$(BUILD)/systemd/cuda.conf: systemd/snapkvd-cuda.conf.in Makefile
$(BUILD)/systemd/metrics.conf: systemd/snapkvd-metrics.conf.in Makefile
$(SYSTEMD_GEN):
	@mkdir -p $(dir $@)
	sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' $< >$@.tmp
	@! grep -n '@[A-Z]*@' $@.tmp || { echo "$@: unsubstituted" >&2; exit 1; }
	mv $@.tmp $@
# the paths are in the files: a `make install PREFIX=...` regenerates them
$(SYSTEMD_GEN): $(BUILD)/install-paths

INSTALL_UNITS += $(BUILD)/systemd/snapkvd.service systemd/snapkvd.socket
INSTALL_DROPINS += $(BUILD)/systemd/cuda.conf $(BUILD)/systemd/metrics.conf
INSTALL_TMPFILES += systemd/snapkvd.tmpfiles
INSTALL_SYSUSERS += systemd/snapkvd.sysusers
INSTALL_CONFIGS += systemd/snapkvd.conf

TEST_SCRIPTS += tests/integration/test-daemon-systemd.sh
TEST_SCRIPTS += tests/integration/test-daemon-config.sh
TEST_SCRIPTS += tests/integration/test-install.sh
