#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-install.sh - `make install` and `make uninstall`, as a packager and an
# operator use them:
#  - into a DESTDIR (PREFIX /usr/local): every file where it belongs, with
#    its mode, nothing else; no @PLACEHOLDER@ and no other prefix left in the
#    units, the drop-in or snapkv.pc; the default config installed, an
#    edited one never overwritten; tmpfiles and sysusers entries that
#    systemd-tmpfiles and systemd-sysusers apply in a scratch root;
#  - the man pages render without groff warnings and `man` finds them; the
#    bash completion completes commands and options;
#  - a program built with `pkg-config --cflags --libs snapkv` against the
#    installed headers and library runs;
#  - into a real PREFIX: `systemd-analyze verify` (man pages checked, so
#    with the installed MANPATH) accepts the installed units; the socket's
#    directory is not the service's runtime directory (it survives
#    restarts); `systemd-analyze security --offline` score printed.
#  - `make uninstall` removes it all (the edited config stays).
# PID 1 is not systemd here: what needs a running manager (start, restart,
# socket activation) is not tested.
set -u
BUILD=${BUILD:-build}
. "$(dirname "$0")/../tally.sh"
top=$(pwd)
tmp=$(mktemp -d /tmp/snapkv-install-XXXXXX)
dpid=""
trap '[ -n "$dpid" ] && kill -KILL $dpid 2>/dev/null; rm -rf "$tmp"' EXIT
mk() { make --no-print-directory -s BUILD="$BUILD" "$@" >"$tmp/make.log" 2>&1; }

# ---- 1. DESTDIR, PREFIX=/usr/local ----
d=$tmp/dest
p=/usr/local
if mk install DESTDIR="$d" PREFIX=$p; then ok "make install DESTDIR"; else
	not_ok "make install DESTDIR: $(tail -5 "$tmp/make.log")"
fi
declare -A want=(
	[$p/bin/snapkvd]=755 [$p/bin/snapkvctl]=755
	[$p/lib/libsnapkv.so.1]=link [$p/lib/libsnapkv.so]=link
	[$p/include/snapkv/snapkv.h]=644 [$p/include/snapkv/skv.h]=644
	[$p/lib/pkgconfig/snapkv.pc]=644
	[$p/lib/systemd/system/snapkvd.service]=644 [$p/lib/systemd/system/snapkvd.socket]=644
	[$p/lib/tmpfiles.d/snapkvd.conf]=644 [$p/lib/sysusers.d/snapkvd.conf]=644
	[/etc/snapkvd/snapkvd.conf]=644 [$p/share/snapkvd/snapkvd.conf]=644
	[$p/share/snapkvd/snapkvd.service.d/cuda.conf]=644
	[$p/share/snapkvd/snapkvd.service.d/metrics.conf]=644
	[$p/share/man/man8/snapkvd.8]=644 [$p/share/man/man1/snapkvctl.1]=644
	[$p/share/man/man5/snapkvd.conf.5]=644
	[$p/share/bash-completion/completions/snapkvctl]=644
	[$p/share/bash-completion/completions/snapkvd]=644
)
real=$(readlink "$BUILD/libsnapkv.so.1")
want[$p/lib/$real]=644
[ -f "$BUILD/libskv.a" ] && want[$p/lib/libskv.a]=644
missing=0 badmode=0
for f in "${!want[@]}"; do
	if [ "${want[$f]}" = link ]; then
		[ -L "$d$f" ] && [ -e "$d$f" ] || { echo "    not a working link: $f"; missing=$((missing + 1)); }
	elif [ ! -f "$d$f" ]; then
		echo "    missing: $f"
		missing=$((missing + 1))
	elif [ "$(stat -c %a "$d$f")" != "${want[$f]}" ]; then
		echo "    mode $(stat -c %a "$d$f") of $f, want ${want[$f]}"
		badmode=$((badmode + 1))
	fi
done
[ $missing -eq 0 ] && ok "all ${#want[@]} files installed" || not_ok "$missing files missing"
[ $badmode -eq 0 ] && ok "modes 755 (programs) and 644" || not_ok "$badmode files with a wrong mode"
# anything else must be a header or a library another part of the tree adds
extra=$(cd "$d" && find . \( -type f -o -type l \) | sed 's|^\.||' | sort | while read -r f; do
	[ -n "${want[$f]+x}" ] && continue
	case $f in $p/include/snapkv/*.h | $p/lib/libskv*.so | $p/lib/libskv*.a) continue ;; esac
	case $f in $p/lib/python3*/*-packages/snapkv.*.so) continue ;; esac
	echo "$f"
done)
[ -z "$extra" ] && ok "nothing else installed" || not_ok "unexpected files: $extra"
# the Python module (client/python), when it was built, in the interpreter's site dir
if ls "$BUILD"/python/snapkv.*.so >/dev/null 2>&1; then
	py=$(cd "$d" && ls .$p/lib/python3*/*-packages/snapkv.*.so 2>/dev/null | head -n 1)
	[ -n "$py" ] && [ "$(stat -c %a "$d/$py")" = 644 ] &&
		ok "Python module installed: ${py#.}" || not_ok "Python module not installed"
fi
[ "$(readlink "$d$p/lib/libsnapkv.so")" = libsnapkv.so.1 ] &&
	[ "$(readlink "$d$p/lib/libsnapkv.so.1")" = "$real" ] &&
	ok "libsnapkv.so -> libsnapkv.so.1 -> $real" || not_ok "library links"

svc=$d$p/lib/systemd/system/snapkvd.service
grep -qx "ExecStart=$p/bin/snapkvd --config /etc/snapkvd/snapkvd.conf" "$svc" &&
	ok "unit: ExecStart with the installed paths" || not_ok "unit: $(grep ExecStart= "$svc")"
left=$(grep -l '@[A-Z_]*@' "$svc" "$d$p/share/snapkvd/snapkvd.service.d/cuda.conf" \
	"$d$p/lib/pkgconfig/snapkv.pc")
[ -z "$left" ] && ok "no @PLACEHOLDER@ left" || not_ok "placeholders left in $left"
grep -qx "ExecStart=$p/bin/snapkvd --config /etc/snapkvd/snapkvd.conf --backend cuda" \
	"$d$p/share/snapkvd/snapkvd.service.d/cuda.conf" &&
	grep -qx 'PrivateDevices=no' "$d$p/share/snapkvd/snapkvd.service.d/cuda.conf" &&
	grep -qx 'DeviceAllow=/dev/nvidiactl rw' "$d$p/share/snapkvd/snapkvd.service.d/cuda.conf" &&
	grep -qx 'DeviceAllow=/dev/nvidia-uvm rw' "$d$p/share/snapkvd/snapkvd.service.d/cuda.conf" &&
	grep -qx 'DeviceAllow=char-nvidia-frontend rw' "$d$p/share/snapkvd/snapkvd.service.d/cuda.conf" &&
	ok "cuda drop-in: --backend cuda, PrivateDevices=no, the nvidia devices" ||
	not_ok "cuda drop-in: $(cat "$d$p/share/snapkvd/snapkvd.service.d/cuda.conf")"
cmp -s systemd/snapkvd.conf "$d/etc/snapkvd/snapkvd.conf" && ok "default config installed" ||
	not_ok "config differs from systemd/snapkvd.conf"
grep -q "/tmp\|$top" "$svc" "$d$p/lib/pkgconfig/snapkv.pc" &&
	not_ok "build paths in the installed files" || ok "no build path in the unit or snapkv.pc"

# an operator's config survives a second install
echo "pool_bytes = 2G" >>"$d/etc/snapkvd/snapkvd.conf"
cp "$d/etc/snapkvd/snapkvd.conf" "$tmp/edited.conf"
mk install DESTDIR="$d" PREFIX=$p
cmp -s "$tmp/edited.conf" "$d/etc/snapkvd/snapkvd.conf" &&
	grep -q 'keeping the existing' "$tmp/make.log" &&
	ok "second install keeps the edited config and says so" || not_ok "config overwritten"

# tmpfiles and sysusers applied in a scratch root: group snapkv, /run/snapkvd
r=$tmp/root
mkdir -p "$r/etc" "$r/run"
if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
	if systemd-sysusers --root="$r" "$d$p/lib/sysusers.d/snapkvd.conf" 2>"$tmp/su.err" &&
		grep -q '^snapkv:' "$r/etc/group"; then
		ok "sysusers: creates group snapkv"
	else
		not_ok "sysusers: $(cat "$tmp/su.err")"
	fi
	gid=$(awk -F: '$1 == "snapkv" {print $3}' "$r/etc/group")
	if systemd-tmpfiles --root="$r" --create "$d$p/lib/tmpfiles.d/snapkvd.conf" 2>"$tmp/tf.err" &&
		[ "$(stat -c '%a %u %g' "$r/run/snapkvd")" = "755 0 $gid" ]; then
		ok "tmpfiles: /run/snapkvd 0755 root:snapkv"
	else
		not_ok "tmpfiles: $(stat -c '%a %u %g' "$r/run/snapkvd" 2>&1) $(cat "$tmp/tf.err")"
	fi
else
	skip_part systemd "sysusers/tmpfiles: systemd-sysusers or systemd-tmpfiles missing"
fi

# ---- 2. man pages and completion ----
m=$d$p/share/man
for page in man8/snapkvd.8 man1/snapkvctl.1 man5/snapkvd.conf.5; do
	w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$m/$page" 2>&1 >"$tmp/page.txt")
	[ -z "$w" ] && [ -s "$tmp/page.txt" ] && ok "man $page renders without warnings" ||
		not_ok "man $page: $w"
done
[ "$(MANPATH=$m man -w snapkvd.conf 2>/dev/null)" = "$m/man5/snapkvd.conf.5" ] &&
	[ "$(MANPATH=$m man -w 8 snapkvd 2>/dev/null)" = "$m/man8/snapkvd.8" ] &&
	[ "$(MANPATH=$m man -w snapkvctl 2>/dev/null)" = "$m/man1/snapkvctl.1" ] &&
	ok "man finds snapkvd(8), snapkvctl(1), snapkvd.conf(5) in the installed MANPATH" ||
	not_ok "man -w in $m"
# every key the daemon knows is documented: the sample config lists them all
undoc=$(grep -o '^#\?[a-z_]* = ' systemd/snapkvd.conf | tr -d '#= ' | sort -u | while read -r k; do
	grep -q "^\.B[IR]* $k " "$m/man5/snapkvd.conf.5" || echo "$k"
done)
[ -z "$undoc" ] && ok "snapkvd.conf(5) documents every key of the sample config" ||
	not_ok "keys missing from snapkvd.conf(5): $undoc"
undoc=$(for o in $("$BUILD/snapkvd" --help | grep -o '\-\-[a-z-]*' | sort -u); do
	grep -q -- "${o//-/\\\\-}" "$m/man8/snapkvd.8" || echo "$o"
done)
[ -z "$undoc" ] && ok "snapkvd(8) documents every option of --help" || not_ok "snapkvd(8) lacks $undoc"
cmds=$("$BUILD/snapkvctl" --help | awk '/^commands:/ {c = 1; next} c && /^  [a-z]/ {print $1}')
undoc=$(for c in $cmds; do grep -q "^\.B $c\b" "$m/man1/snapkvctl.1" || echo "$c"; done)
[ -n "$cmds" ] && [ -z "$undoc" ] && ok "snapkvctl(1) documents every command ($(echo $cmds))" ||
	not_ok "snapkvctl(1) lacks: $undoc"

comp() { # completion-file words...: the completions of the last word
	bash -c '. "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1));
		f=$(complete -p "$1" | awk "{print \$3}"); $f; printf "%s\n" "${COMPREPLY[@]}"' \
		_ "$@" | sort | tr '\n' ' '
}
bc=$d$p/share/bash-completion/completions
[ "$(comp "$bc/snapkvctl" snapkvctl le)" = "ledger " ] &&
	[ "$(comp "$bc/snapkvctl" snapkvctl ledger --)" = "--bytes --help --json --socket --timeout " ] &&
	[ "$(comp "$bc/snapkvctl" snapkvctl pressure s)" = "set " ] &&
	[ "$(comp "$bc/snapkvctl" snapkvctl compact --gqa "")" = "expand group " ] &&
	[ "$(comp "$bc/snapkvd" snapkvd --backend "")" = "cuda host " ] &&
	[ "$(comp "$bc/snapkvd" snapkvd --po)" = "--pool-bytes " ] &&
	ok "bash completion: commands, options, values" ||
	not_ok "bash completion: '$(comp "$bc/snapkvctl" snapkvctl ledger --)'"

# ---- 3. pkg-config: build and run an engine against the installed tree ----
# the installed snapkv.pc first, the system's libprotobuf-c.pc after it
export PKG_CONFIG_SYSROOT_DIR=$d PKG_CONFIG_PATH=$d$p/lib/pkgconfig
if flags=$(pkg-config --cflags --libs snapkv 2>"$tmp/pc.err"); then
	ok "pkg-config snapkv: $flags (version $(pkg-config --modversion snapkv))"
else
	not_ok "pkg-config: $(cat "$tmp/pc.err")"
fi
unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_PATH
cat >"$tmp/engine.c" <<'EOF'
#include <errno.h>
#include <stdio.h>
#include <snapkv.h>

int main(int argc, char **argv)
{
	struct skv_client *c = NULL;
	int r = skv_client_connect(argc > 1 ? argv[1] : NULL, NULL, &c);

	if (r < 0) {
		fprintf(stderr, "connect: %d %s\n", r, c ? skv_client_error(c) : "");
		return 1;
	}
	skv_client_close(c);
	printf("connected");
	return 0;
}
EOF
# the installed daemon, on a socket of its own, for the installed library
# and the installed snapkvctl
sock=$tmp/s.sock
"$d$p/bin/snapkvd" --socket "$sock" --pool-bytes 64M --threads 1 --log-level warning &
dpid=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
out=""
# shellcheck disable=SC2086
if cc -Werror -Wall -o "$tmp/engine" "$tmp/engine.c" $flags 2>"$tmp/cc.err" &&
	LD_LIBRARY_PATH=$d$p/lib ldd "$tmp/engine" | grep -q "=> $d$p/lib/libsnapkv.so.1 " &&
	out=$(LD_LIBRARY_PATH=$d$p/lib "$tmp/engine" "$sock" 2>&1); then
	ok "an engine built with pkg-config's flags connects through the installed libsnapkv"
else
	not_ok "engine against the installed tree: $(cat "$tmp/cc.err") $out"
fi
# budget is C, capacity is slots: the new names compile clean with -Werror;
# the old ones (skv_params.capacity, suggested_capacity) still compile and
# alias the same storage, with a deprecation warning naming the new one
cat >"$tmp/names.c" <<'EOF'
#include <snapkv.h>
int main(void)
{
	struct skv_params p = SKV_PARAMS_DEFAULTS;
	struct skv_pressure pr = {0};
	struct skv_ledger_in li = {0};
#ifdef OLD
	p.capacity = 7, pr.suggested_capacity = 3, li.capacity = 5;
#else
	p.budget = 7, pr.suggested_budget = 3, li.budget = 5;
#endif
	return !(p.budget == 7 && pr.suggested_budget == 3 && li.budget == 5 && p.window == 32);
}
EOF
# shellcheck disable=SC2086
if cc -Wall -Wextra -Werror -o "$tmp/names" "$tmp/names.c" $flags 2>"$tmp/cc.err" && "$tmp/names" &&
	cc -Wall -DOLD -o "$tmp/names-old" "$tmp/names.c" $flags 2>"$tmp/cc-old.err" &&
	"$tmp/names-old" && [ "$(grep -c 'warning: .* is deprecated: .* is now' "$tmp/cc-old.err")" -eq 3 ]; then
	ok "budget/suggested_budget compile clean; the old capacity names alias them, deprecated"
else
	not_ok "names: $(cat "$tmp/cc.err" "$tmp/cc-old.err" 2>/dev/null)"
fi
"$d$p/bin/snapkvctl" --socket "$sock" status >"$tmp/status" 2>&1 &&
	ok "the installed snapkvctl talks to the installed snapkvd" ||
	not_ok "snapkvctl status: $(cat "$tmp/status")"
# one version: the programs, the library's file name, pkg-config, the
# metric snapkvd_build_info and snapkvctl status all say the same
v=$("$d$p/bin/snapkvd" --version | awk '{print $2}')
vctl=$("$d$p/bin/snapkvctl" --version | awk '{print $2}')
vinfo=$("$d$p/bin/snapkvctl" --socket "$sock" metrics 2>&1 |
	sed -n 's/^snapkvd_build_info{version="\([^"]*\)",backend="host"} 1$/\1/p')
vstat=$("$d$p/bin/snapkvctl" --socket "$sock" status 2>&1 | sed -n '1s/^snapkvd \([^ ]*\) .*/\1/p')
vpc=$(PKG_CONFIG_SYSROOT_DIR=$d PKG_CONFIG_PATH=$d$p/lib/pkgconfig pkg-config --modversion snapkv)
[ -n "$v" ] && [ "$vctl" = "$v" ] && [ "$vinfo" = "$v" ] && [ "$vstat" = "$v" ] &&
	[ "$vpc" = "$v" ] && [ "$real" = "libsnapkv.so.$v" ] &&
	ok "one version $v: snapkvd, snapkvctl, $real, snapkv.pc, snapkvd_build_info, status" ||
	not_ok "versions: snapkvd '$v' snapkvctl '$vctl' build_info '$vinfo' status '$vstat' pc '$vpc' $real"
kill -TERM $dpid
wait $dpid && ok "the installed snapkvd stops with 0 on SIGTERM" || not_ok "snapkvd exit $?"

# ---- 4. uninstall ----
mk uninstall DESTDIR="$d" PREFIX=$p
rest=$(cd "$d" && find . \( -type f -o -type l \) | sed 's|^\.||' | sort)
[ "$rest" = "/etc/snapkvd/snapkvd.conf" ] && grep -q 'keeping /' "$tmp/make.log" &&
	ok "make uninstall removes everything but the edited config" ||
	not_ok "left after uninstall: $rest"
cp systemd/snapkvd.conf "$d/etc/snapkvd/snapkvd.conf"
mk install DESTDIR="$d" PREFIX=$p && mk uninstall DESTDIR="$d" PREFIX=$p
rest=$(cd "$d" && find . \( -type f -o -type l \) | sort)
[ -z "$rest" ] && [ ! -d "$d/etc/snapkvd" ] && ok "an unchanged config goes too" ||
	not_ok "left: $rest"

# ---- 5. a real PREFIX: systemd-analyze on the installed units ----
if command -v systemd-analyze >/dev/null; then
	q=$tmp/prefix
	mk install PREFIX="$q" SYSCONFDIR="$q/etc" || not_ok "make install PREFIX=$q"
	u=$q/lib/systemd/system
	out=$(cd "$tmp" && MANPATH=$q/share/man SYSTEMD_LOG_LEVEL=warning \
		systemd-analyze verify "$u/snapkvd.socket" "$u/snapkvd.service" 2>&1)
	[ $? -eq 0 ] && ! echo "$out" | grep -q 'snapkvd\.\(service\|socket\)' &&
		ok "systemd-analyze verify (man pages checked) on the installed units" ||
		not_ok "systemd-analyze verify: $out"
	# and it does check them: without the installed MANPATH it must fail
	out=$(cd "$tmp" && MANPATH=$tmp/none SYSTEMD_LOG_LEVEL=warning \
		systemd-analyze verify "$u/snapkvd.socket" "$u/snapkvd.service" 2>&1)
	echo "$out" | grep -q "man snapkvd(8)" && ok "verify really looks the man pages up" ||
		not_ok "verify passed without the man pages: $out"
	# the socket lives outside every directory the service owns
	sockdir=$(sed -n 's|^ListenSequentialPacket=\(.*\)/[^/]*$|\1|p' "$u/snapkvd.socket")
	owned=$(sed -n 's/^RuntimeDirectory=//p' "$u/snapkvd.service" | tr ' ' '\n' | sed 's|^|/run/|')
	preserve=$(sed -n 's/^RuntimeDirectoryPreserve=//p' "$u/snapkvd.service")
	clash=""
	for o in $owned; do
		case "$sockdir/" in "$o"/*) clash=$o ;; esac
	done
	[ -n "$sockdir" ] && { [ -z "$clash" ] || [ "$preserve" = yes ]; } &&
		grep -q "^d $sockdir " systemd/snapkvd.tmpfiles &&
		ok "socket dir $sockdir is tmpfiles', not the service's (runtime: $(echo $owned))" ||
		not_ok "socket dir $sockdir inside the service's RuntimeDirectory $clash"
	score=$(systemd-analyze security --offline=yes "$u/snapkvd.service" 2>&1 |
		sed -n 's/.*Overall exposure level for snapkvd.service: \([0-9.]*\).*/\1/p')
	if [ -n "$score" ] && awk -v s="$score" 'BEGIN { exit !(s <= 1.5) }'; then
		ok "systemd-analyze security --offline: exposure $score (<= 1.5)"
	else
		not_ok "systemd-analyze security: exposure '$score'"
	fi
	# the CUDA drop-in where an operator puts it (verify reads the drop-in
	# directory beside the unit): it parses and lifts PrivateDevices
	mkdir -p "$u/snapkvd.service.d"
	cp "$q/share/snapkvd/snapkvd.service.d/cuda.conf" "$u/snapkvd.service.d/"
	out=$(cd "$tmp" && MANPATH=$q/share/man SYSTEMD_LOG_LEVEL=warning \
		systemd-analyze verify "$u/snapkvd.socket" "$u/snapkvd.service" 2>&1)
	[ $? -eq 0 ] && ! echo "$out" | grep -q 'snapkvd\.\(service\|socket\)\|cuda\.conf' &&
		ok "systemd-analyze verify with the CUDA drop-in" || not_ok "verify with cuda.conf: $out"
	sec=$(systemd-analyze security --offline=yes "$u/snapkvd.service" 2>&1)
	cscore=$(echo "$sec" | sed -n 's/.*Overall exposure level for snapkvd.service: \([0-9.]*\).*/\1/p')
	echo "$sec" | grep -q '^✗ PrivateDevices=' &&
		echo "$sec" | grep -q 'char-nvidia-frontend:rw' &&
		ok "the drop-in applies: devices opened to the nvidia ones (exposure $score -> $cscore)" ||
		not_ok "the drop-in did not apply: $sec"
	rm -r "$u/snapkvd.service.d"
	# the metrics drop-in: parses, opens the network (PrivateNetwork=no,
	# AF_INET/AF_INET6) and keeps peers to loopback
	mkdir -p "$u/snapkvd.service.d"
	cp "$q/share/snapkvd/snapkvd.service.d/metrics.conf" "$u/snapkvd.service.d/"
	out=$(cd "$tmp" && MANPATH=$q/share/man SYSTEMD_LOG_LEVEL=warning \
		systemd-analyze verify "$u/snapkvd.socket" "$u/snapkvd.service" 2>&1)
	[ $? -eq 0 ] && ! echo "$out" | grep -q 'snapkvd\.\(service\|socket\)\|metrics\.conf' &&
		ok "systemd-analyze verify with the metrics drop-in" || not_ok "verify with metrics.conf: $out"
	sec=$(systemd-analyze security --offline=yes "$u/snapkvd.service" 2>&1)
	mscore=$(echo "$sec" | sed -n 's/.*Overall exposure level for snapkvd.service: \([0-9.]*\).*/\1/p')
	echo "$sec" | grep -q '^✗ PrivateNetwork=' &&
		echo "$sec" | grep -qF '✗ RestrictAddressFamilies=~AF_(INET|INET6)' &&
		echo "$sec" | grep -q '^✗ IPAddressDeny=.*only localhost entries' &&
		ok "the metrics drop-in applies: network opened, peers loopback (exposure $score -> $mscore)" ||
		not_ok "the metrics drop-in did not apply: $sec"
	rm -r "$u/snapkvd.service.d"
	mk uninstall PREFIX="$q" SYSCONFDIR="$q/etc"
else
	skip_part systemd "systemd-analyze: not installed"
fi

echo "test-install: $pass passed, $fail failed"
tally_exit
