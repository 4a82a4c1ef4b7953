#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the Debian packages snapkvd builds and tests with, when run as root;
# otherwise prints the exact apt-get line and fails.
set -eu
# What each is for: the build (build-essential .. libsystemd-dev), the units'
# tests (systemd: systemd-analyze; man-db: `man` for its man-page check), the
# test scripts (python3, valgrind, tmux, curl), the Python module and its
# tests (python3-dev, -numpy, -torch, -pytest). A minimal Debian 12
# (debootstrap --variant=minbase) plus build-essential and git needs exactly
# these: `make check-fresh` proves it.
pkgs=(build-essential pkg-config liburing-dev libprotobuf-c-dev protobuf-c-compiler
      libcunit1-dev libjansson-dev libopenblas-dev libsystemd-dev systemd man-db
      python3 python3-dev python3-numpy python3-torch python3-pytest
      valgrind tmux curl)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
	echo "deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
	echo "deps: missing Debian packages; run as root:" >&2
	echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
	exit 1
fi
