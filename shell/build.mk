# SPDX-License-Identifier: MIT
# shell/: bash completion, installed as $(BASHCOMPDIR)/<command>
# (tests/integration/test-install.sh completes with them).
INSTALL_COMPLETIONS += shell/snapkvctl.bash shell/snapkvd.bash
