# SPDX-License-Identifier: MIT
# tests/python/: pytest suite of the snapkv module (client/python/), run by
# `make check` against private daemons; PYTHON is the interpreter it runs with.
TEST_SCRIPTS += tests/python/run-pytest.sh
export PYTHON
