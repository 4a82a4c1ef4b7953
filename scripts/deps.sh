#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the Debian packages snapkvd builds and tests with, when run as root;
# otherwise prints the exact apt-get line and fails.
set -eu
# What each is for: the build (build-essential .. libsystemd-dev), the units'
# tests (systemd: systemd-analyze; man-db: `man` for its man-page check), the
# test scripts (python3, valgrind, tmux, curl; promtool below), the Python module and its
# tests (python3-dev, -numpy, -torch, -pytest). A minimal Debian 12
# (debootstrap --variant=minbase) plus build-essential and git needs exactly
# these: `make check-fresh` proves it.
pkgs=(build-essential pkg-config liburing-dev libprotobuf-c-dev protobuf-c-compiler
      libcunit1-dev libjansson-dev libopenblas-dev libicu-dev libsystemd-dev systemd man-db
      python3 python3-dev python3-numpy python3-torch python3-pytest
      valgrind tmux curl)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# promtool (`promtool check metrics` in tests/integration/test-metrics-http.sh)
# is the one program of Debian's prometheus package the tests need. Installing
# that package would also enable and start a Prometheus server (port 9090, on
# every address) wherever systemd runs, so only its promtool is unpacked from
# the .deb, fetched with apt-get, into $tools (outside the tree: `make clean`
# keeps it). A promtool on PATH (the package installed) is used instead.
tools=${SNAPKV_TOOLS:-/var/cache/snapkv-tools}
need_promtool=0
command -v promtool >/dev/null || [ -x "$tools/promtool" ] || need_promtool=1
[ ${#missing[@]} -eq 0 ] && [ $need_promtool -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing Debian packages or promtool; run as root: scripts/deps.sh" >&2
	[ ${#missing[@]} -eq 0 ] ||
		echo "  (it runs: apt-get update && apt-get install -y ${missing[*]})" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
updated=0
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}"
	apt-get update -qq
	updated=1
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ $need_promtool -eq 1 ]; then
	echo "deps: unpacking promtool from Debian's prometheus package into $tools"
	dl=$(mktemp -d)
	trap 'rm -rf "$dl"' EXIT
	chmod 755 "$dl" # apt's _apt user downloads into it
	[ $updated -eq 1 ] || apt-get update -qq
	# what apt said is shown only when the download failed
	(cd "$dl" && apt-get download -qq prometheus 2>"$dl/err") || {
		cat "$dl/err" >&2
		echo "deps: could not download Debian's prometheus package (for promtool)" >&2
		exit 1
	}
	dpkg-deb --fsys-tarfile "$dl"/prometheus_*.deb | tar -x -C "$dl" ./usr/bin/promtool
	mkdir -p "$tools"
	install -m 755 "$dl/usr/bin/promtool" "$tools/promtool"
fi
