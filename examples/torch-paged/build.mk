# SPDX-License-Identifier: MIT
# examples/torch-paged/: the reference paged engine in Python (torch), run by
# `make demo` after the C demo (it says why when it skips: no model, no torch,
# no module). Its kept-positions test against tiny-llama is in tests/python/.
.PHONY: _demo_torch_paged
_demo_torch_paged: $(SNAPKVD) $(SNAPKV_PY_BUILT)
	@BUILD=$(BUILD) SHARED=$(SHARED) PYTHON=$(PYTHON) examples/torch-paged/demo.sh
