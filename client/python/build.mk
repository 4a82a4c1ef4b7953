# SPDX-License-Identifier: MIT
# client/python/: the snapkv CPython extension, in C over libsnapkv (linked
# statically, its symbols kept inside the module), built when $(PYTHON) has
# its development headers (python3-dev). build/python/ is importable as is
# (PYTHONPATH=build/python); `make install` puts the module in the
# interpreter's site directory under $(PREFIX) (PY_SITEDIR), or DESTDIR.
PYTHON ?= /usr/bin/python3
PYTHON_CONFIG ?= $(PYTHON)-config
PY_EXT_SUFFIX := $(shell $(PYTHON_CONFIG) --extension-suffix 2>/dev/null)
PY_INCLUDES := $(shell $(PYTHON_CONFIG) --includes 2>/dev/null)
PY_HAVE_DEV := $(shell $(PYTHON) -c 'import os, sysconfig; \
	print(int(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))))' \
	2>/dev/null)
# Debian's interpreter searches $(PREFIX)/lib/python3.X/dist-packages for
# /usr/local and /usr/lib/python3/dist-packages for /usr; elsewhere the
# posix_prefix scheme.
PY_SITEDIR ?= $(shell $(PYTHON) -c 'import sys, sysconfig; p = "$(PREFIX)"; \
	deb = sysconfig.get_default_scheme() == "posix_local"; \
	v = "%d.%d" % sys.version_info[:2]; \
	print(p + "/lib/python3/dist-packages" if deb and p == "/usr" else \
	      p + "/lib/python" + v + "/dist-packages" if deb else \
	      sysconfig.get_path("platlib", "posix_prefix", vars={"base": p, "platbase": p}))' \
	2>/dev/null)

PY_DIR  := client/python
PY_SRCS := $(PY_DIR)/skvpy-module.c $(PY_DIR)/skvpy-error.c $(PY_DIR)/skvpy-mapping.c \
	$(PY_DIR)/skvpy-array.c $(PY_DIR)/skvpy-session.c $(PY_DIR)/skvpy-client.c $(PY_DIR)/skvpy-compact.c \
	$(PY_DIR)/skvpy-cache.c $(PY_DIR)/skvpy-blockmap.c $(PY_DIR)/skvpy-request.c \
	$(PY_DIR)/skvpy-after.c $(PY_DIR)/skvpy-pool.c
PY_OBJS := $(PY_SRCS:%.c=$(BUILD)/%.o)
SNAPKV_PY := $(BUILD)/python/snapkv$(PY_EXT_SUFFIX)

ifeq ($(PY_HAVE_DEV)$(if $(PY_EXT_SUFFIX),1,0),11)
OBJS += $(PY_OBJS)
$(PY_OBJS): | $(SKV_PB_H)
# Python's headers need -fno-strict-aliasing; the module exports PyInit_snapkv only
# (Python's own symbols come from the interpreter at import).
$(PY_OBJS): ALL_CFLAGS += $(PY_INCLUDES) -fno-strict-aliasing -fvisibility=hidden \
	$(VERSION_DEFINE)
$(SNAPKV_PY): $(PY_OBJS) $(LIBSNAPKV_A) $(LIBSKVPROTO) $(LIBSKV)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -shared -Wl,--exclude-libs,ALL -o $@ $(PY_OBJS) \
		$(LIBSNAPKV_A) $(LIBSKVPROTO) $(LIBSKV) $(PBC_LIBS) -lm $(LDFLAGS)
LIBS += $(SNAPKV_PY)
SNAPKV_PY_BUILT := $(SNAPKV_PY)

.PHONY: install-python uninstall-python
install: install-python
install-python: $(SNAPKV_PY)
	install -d $(DESTDIR)$(PY_SITEDIR)
	install -m 644 $(SNAPKV_PY) $(DESTDIR)$(PY_SITEDIR)/
uninstall: uninstall-python
uninstall-python:
	rm -f $(DESTDIR)$(PY_SITEDIR)/$(notdir $(SNAPKV_PY))
else
$(info client/python: $(PYTHON) has no development headers (python3-dev): the snapkv module is not built)
endif

# make bench: one compact call from Python vs from C, the same request.
BENCH_COMPACT_C := $(BUILD)/bench-compact-c
OBJS += $(BUILD)/$(PY_DIR)/bench-compact.o
$(BUILD)/$(PY_DIR)/bench-compact.o: | $(SKV_PB_H)
$(BENCH_COMPACT_C): $(BUILD)/$(PY_DIR)/bench-compact.o $(LIBSNAPKV)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(SNAPKV_LINK) $(LDFLAGS)
BINS += $(BENCH_COMPACT_C)
ifneq ($(SNAPKV_PY_BUILT),)
BENCHES += $(PY_DIR)/bench-compact.sh
endif
