#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `make check-fresh`: the README's two commands (`make demo`, `make check`)
# as root in a fresh Debian 12 (bookworm) `debootstrap --variant=minbase`
# chroot that has build-essential and git added and nothing else, on a clean
# clone of HEAD with ../shared beside it. A package that scripts/deps.sh
# forgets fails here, as it would for a new user, rather than passing on a
# machine that happens to have it.
#
# The base tree (minbase + build-essential + git) is built once and kept as
# a tarball in $SNAPKV_FRESH_CACHE (default /var/cache/snapkv-fresh, outside
# the repository); every run unpacks a new copy in $SNAPKV_FRESH_WORK
# (default /var/tmp) and removes it afterwards. The mirror is the first
# Debian one in this machine's /etc/apt/sources.list(.d), or
# $SNAPKV_FRESH_MIRROR. /proc, /sys, /dev (with /dev/pts and a fresh
# /dev/shm) and a fresh /run are mounted for the tests (memfd, io_uring,
# SCM_RIGHTS, AF_UNIX sockets, ptys) and unmounted on every way out.
#
# Usage: check-fresh.sh [SHARED]   (SHARED: ../shared by default)
set -euo pipefail

top=$(git rev-parse --show-toplevel)
shared=$(realpath "${1:-$top/../shared}")
cache=${SNAPKV_FRESH_CACHE:-/var/cache/snapkv-fresh}
workdir=${SNAPKV_FRESH_WORK:-/var/tmp}
suite=bookworm
base_pkgs=build-essential,git
tarball=$cache/$suite-minbase+${base_pkgs//,/+}.tar

say() { printf 'check-fresh: %s\n' "$*"; }
die() { say "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, mount); run: sudo make check-fresh"
command -v debootstrap >/dev/null ||
	die "debootstrap is missing; run as root: apt-get install -y debootstrap"
[ -d "$shared" ] || die "no $shared beside the clone (SHARED=...)"

# The first http(s) Debian mirror this machine uses for the suite (deb822
# .sources or one-line .list), not the security archive.
find_mirror() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		awk -v s="$suite" '$1 == "deb" { u = ($2 ~ /^\[/) ? $3 : $2; n = ($2 ~ /^\[/) ? 4 : 3;
			if ($n == s && u ~ /^https?:/ && u !~ /security/) { print u; exit } }' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk -v s="$suite" 'BEGIN { RS = ""; FS = "\n" }
			{ u = ""; ok = 0; deb = 0
			  for (i = 1; i <= NF; i++) {
				if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); u = a[2] }
				if ($i ~ /^Suites:/) { n = split($i, b, /[ \t]+/)
					for (j = 2; j <= n; j++) if (b[j] == s) ok = 1 }
				if ($i ~ /^Types:.*(^|[ \t])deb([ \t]|$)/) deb = 1 }
			  if (deb && ok && u ~ /^https?:/ && u !~ /security/) { print u; exit } }' "$f"
	done
}
mirror=${SNAPKV_FRESH_MIRROR:-$(find_mirror | head -n1)}
[ -n "$mirror" ] || die "no $suite mirror in /etc/apt/sources.list(.d); set SNAPKV_FRESH_MIRROR"

t0=$(date +%s)
mkdir -p "$cache"
# one builder of the tarball at a time; later runs only read it
exec 9>"$cache/.lock"
flock 9
if [ ! -s "$tarball" ]; then
	say "building the base tree ($suite minbase + $base_pkgs from $mirror), cached as $tarball"
	tree=$(mktemp -d "$cache/tree.XXXXXX")
	chmod 0755 "$tree"
	if ! debootstrap --variant=minbase --include="$base_pkgs" "$suite" "$tree" "$mirror" \
		>"$cache/debootstrap.log" 2>&1; then
		tail -n 30 "$cache/debootstrap.log" >&2
		rm -rf --one-file-system "$tree"
		die "debootstrap failed (log: $cache/debootstrap.log)"
	fi
	apt_clean() { rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*_Packages; }
	apt_clean "$tree"
	tar -C "$tree" --numeric-owner -cf "$tarball.tmp" .
	mv "$tarball.tmp" "$tarball"
	rm -rf --one-file-system "$tree"
fi
flock -u 9
t_base=$(date +%s)

run=$(mktemp -d "$workdir/snapkv-fresh.XXXXXX")
root=$run/root
mounted=()
cleanup() {
	local rc=$? pid i
	trap - EXIT INT TERM HUP
	# whatever a test left running in the chroot holds its mounts
	for i in 1 2 3; do
		local killed=0
		for pid in $(ls /proc | grep -E '^[0-9]+$'); do
			[ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ] &&
				kill -KILL "$pid" 2>/dev/null && killed=1
		done
		[ $killed -eq 1 ] || break
		sleep 1
	done
	for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
		umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" || true
	done
	# never remove a tree with anything still mounted in it (/dev is bound)
	if grep -q " $root[/ ]" /proc/self/mountinfo; then
		say "mounts left under $root; not removing $run" >&2
		rc=1
	else
		rm -rf --one-file-system "$run"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

mkdir -p "$root"
tar -C "$root" --numeric-owner -xpf "$tarball"
# mktemp -d made the tree's top 0700 and tar -p gave that to the chroot's /:
# a test that drops to another uid (test-hostile) could reach nothing
chmod 0755 "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mkdir -p "$root/src"
git clone -q --no-local --no-checkout "$top" "$root/src/snapkvd"
git -C "$root/src/snapkvd" checkout -q --detach "$(git -C "$top" rev-parse HEAD)"
cp -a "$shared" "$root/src/shared"
head=$(git -C "$top" rev-parse --short HEAD)

mnt() { # mount args... target
	mount "$@"
	mounted+=("${!#}")
}
# the chroot's / a mount point of its own: `unshare -m` (test-cli-socket.sh)
# sets the propagation of / and gets EINVAL on a plain directory
mnt --bind "$root" "$root"
mnt -t proc proc "$root/proc"
mnt -t sysfs sysfs "$root/sys"
mnt --bind /dev "$root/dev"
mnt --bind /dev/pts "$root/dev/pts"
mnt -t tmpfs -o mode=1777,nosuid,nodev shm "$root/dev/shm"
mnt -t tmpfs -o mode=0755,nosuid,nodev run "$root/run"
t_setup=$(date +%s)

# In the background and waited for: bash runs a trap only once the
# foreground command is done, so a SIGTERM would wait for a whole `make check`.
in_chroot() {
	chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		bash -c "cd /src/snapkvd && $*" </dev/null &
	wait $!
}
rc_demo=0 rc_check=0
say "commit $head in a fresh $suite minbase chroot ($run): make demo"
in_chroot make demo || rc_demo=$?
t_demo=$(date +%s)
say "make check"
in_chroot make check || rc_check=$?
t_check=$(date +%s)

say "times: base tree $((t_base - t0)) s, unpack+clone+mounts $((t_setup - t_base)) s," \
	"make demo $((t_demo - t_setup)) s (deps and build included), make check" \
	"$((t_check - t_demo)) s; $((t_check - t0)) s in all"
[ $rc_demo -eq 0 ] || say "FAILED: make demo exited $rc_demo"
[ $rc_check -eq 0 ] || say "FAILED: make check exited $rc_check"
[ $rc_demo -eq 0 ] && [ $rc_check -eq 0 ] || exit 1
say "make demo and make check pass on a fresh minimal Debian 12"
