# SPDX-License-Identifier: MIT
# man/: hand-written roff pages, installed by `make install` into
# $(MANDIR)/manN by their suffix; tests/integration/test-install.sh checks
# them with `man --warnings`.
INSTALL_MANS += man/snapkvd.8 man/snapkvctl.1 man/snapkvd.conf.5
