# SPDX-License-Identifier: MIT
# systemd/: unit files, tmpfiles/sysusers entries and the sample config.
# `systemd-analyze verify` runs on them in make check (tests/integration).
TEST_SCRIPTS += tests/integration/test-daemon-systemd.sh
TEST_SCRIPTS += tests/integration/test-daemon-config.sh
