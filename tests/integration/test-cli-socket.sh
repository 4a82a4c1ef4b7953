#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-cli-socket.sh - socket discovery as a user's login shell meets it
# ($XDG_RUNTIME_DIR set, $SNAPKV_SOCKET not): with a system snapkvd at
# /run/snapkvd/snapkvd.sock and a user one at $XDG_RUNTIME_DIR/snapkvd.sock,
# snapkvctl and libsnapkv (an engine) reach the system one; $SNAPKV_SOCKET
# and --socket win over both; a stale or missing system socket falls back
# to the user's; with neither daemon the error lists every path tried.
# /run is a tmpfs of a private mount namespace (unshare), so the host's
# /run is never touched.
set -u
BUILD=${BUILD:-build}
if [ "${SKV_SOCKET_TEST_NS:-}" != 1 ]; then
	for u in "unshare -m" "unshare -rm"; do
		if $u true 2>/dev/null; then
			SKV_SOCKET_TEST_NS=1 exec $u bash "$0" "$@"
		fi
	done
	echo "test-cli-socket: cannot make a private mount namespace (unshare -m or -rm)"
	exit 1
fi
BUILD=$(realpath "$BUILD")
CTL=$BUILD/snapkvctl
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-cli-socket.XXXXXX")
spid= upid=
cleanup() {
	[ -n "$spid" ] && kill -KILL "$spid" 2>/dev/null
	[ -n "$upid" ] && kill -KILL "$upid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
. "$(dirname "$0")/../tally.sh"

mount -t tmpfs tmpfs /run || {
	echo "test-cli-socket: cannot mount a tmpfs on /run in the namespace"
	exit 1
}
mkdir -p /run/snapkvd "$tmp/xdg" "$tmp/home"
sys=/run/snapkvd/snapkvd.sock
usr=$tmp/xdg/snapkvd.sock

start() { # start SOCKET -> pid in $started
	"$BUILD/snapkvd" --socket "$1" --backend host --pool-bytes 64M --threads 1 \
		--log-level warning 2>>"$tmp/daemon.log" &
	started=$!
	for _ in $(seq 250); do
		[ -S "$1" ] && return 0
		sleep 0.02
	done
	echo "snapkvd did not start at $1: $(cat "$tmp/daemon.log")"
	exit 1
}
# login CMD...: as from a user's login shell: a clean environment with
# HOME and XDG_RUNTIME_DIR, profile files read (bash -l).
login() {
	env -i PATH="$PATH" HOME="$tmp/home" XDG_RUNTIME_DIR="$tmp/xdg" ${EXTRA:+"$EXTRA"} \
		bash -l -c '"$@"' login "$@"
}
# stop PID SOCKET: kill -KILL (a stale socket is the point), the status must
# say SIGKILL (128 + 9: it had not died before), then wait until the listener
# is really gone (io_uring lets the kernel close the daemon's files a moment
# after exit).
stop() {
	local rc
	kill -KILL "$1"
	wait "$1" 2>/dev/null
	rc=$?
	[ $rc -eq 137 ] || {
		echo "FAIL: snapkvd $1 exited $rc before its SIGKILL: $(cat "$tmp/daemon.log")"
		exit 1
	}
	for _ in $(seq 250); do
		"$CTL" status --socket "$2" 2>&1 >/dev/null | grep -q refused && return 0
		sleep 0.02
	done
	echo "the listener at $2 outlived its snapkvd"
	exit 1
}
pid_of() { # the pid snapkvctl status --json reports, given its stdout
	sed -n 's/.*"pid": \([0-9]*\).*/\1/p'
}

start "$sys"
spid=$started
start "$usr"
upid=$started

got=$(login "$CTL" status --json 2>"$tmp/err" | pid_of)
[ "$got" = "$spid" ] && ok "snapkvctl status reaches the system daemon first" ||
	not_ok "status reached pid '$got' (system $spid, user $upid): $(cat "$tmp/err")"
login "$CTL" status 2>&1 | grep -q "at $sys\$" && ok "and says it is at $sys" ||
	not_ok "status does not name $sys"
got=$(login "$CTL" ledger --json 2>&1 >/dev/null)
[ -z "$got" ] && ok "ledger, metrics, pressure: same search" || not_ok "ledger: $got"

# libsnapkv's own search (skv_client_connect(NULL)): an engine holding its
# cache shows in the system daemon's list, not the user's.
rm -f "$tmp/go"
login "$BUILD/snapkv-engine" --name probe --hold-until "$tmp/go" >"$tmp/engine.out" 2>&1 &
epid=$!
seen=
for _ in $(seq 250); do
	"$CTL" caches --socket "$sys" 2>/dev/null | grep -q probe && { seen=sys; break; }
	"$CTL" caches --socket "$usr" 2>/dev/null | grep -q probe && { seen=usr; break; }
	sleep 0.02
done
touch "$tmp/go"
wait "$epid"
erc=$?
[ "$seen" = sys ] && [ $erc -eq 0 ] && ok "libsnapkv (engine, no path) reaches the system daemon" ||
	not_ok "engine's cache seen at '$seen', rc $erc: $(cat "$tmp/engine.out")"

got=$(EXTRA="SNAPKV_SOCKET=$usr" login "$CTL" status --json 2>&1 | pid_of)
[ "$got" = "$upid" ] && ok "\$SNAPKV_SOCKET wins over the system socket" ||
	not_ok "SNAPKV_SOCKET: pid '$got'"
got=$(login "$CTL" --socket "$usr" status --json 2>&1 | pid_of)
[ "$got" = "$upid" ] && ok "snapkvctl --socket (before the command) wins" ||
	not_ok "--socket before: pid '$got'"
got=$(login "$CTL" status --socket "$usr" --json 2>&1 | pid_of)
[ "$got" = "$upid" ] && ok "status --socket wins" || not_ok "--socket after: pid '$got'"
EXTRA="SNAPKV_SOCKET=$tmp/none.sock" login "$CTL" status >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "$tmp/none.sock (\$SNAPKV_SOCKET)" "$tmp/err" &&
	! grep -q "$sys" "$tmp/err" && ok "a named socket that is not there is not replaced" ||
	not_ok "SNAPKV_SOCKET missing: rc $rc, $(cat "$tmp/err")"

# A system daemon killed hard leaves its socket behind: refused, so the
# user's daemon is next.
stop "$spid" "$sys"
spid=
got=$(login "$CTL" status --json 2>"$tmp/err" | pid_of)
[ "$got" = "$upid" ] && ok "a stale system socket (refused) falls back to \$XDG_RUNTIME_DIR" ||
	not_ok "stale system socket: pid '$got': $(cat "$tmp/err")"
rm -f "$sys"
got=$(login "$CTL" status --json 2>"$tmp/err" | pid_of)
[ "$got" = "$upid" ] && ok "no system socket: \$XDG_RUNTIME_DIR" ||
	not_ok "no system socket: pid '$got': $(cat "$tmp/err")"
rm -f "$tmp/go"
login "$BUILD/snapkv-engine" --name probe2 >"$tmp/engine.out" 2>&1 &&
	ok "libsnapkv falls back the same way" || not_ok "engine: $(cat "$tmp/engine.out")"

# Neither: every path tried, each with its reason.
stop "$upid" "$usr"
upid=
login "$CTL" status >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "$sys (system socket): No such file or directory" "$tmp/err" &&
	grep -q "$usr (\$XDG_RUNTIME_DIR): " "$tmp/err" &&
	ok "no daemon: exit 1, both paths in the error" ||
	not_ok "no daemon: rc $rc, $(cat "$tmp/err")"
sed 's/^/       /' "$tmp/err"
"$BUILD/examples/gen-layer" "$tmp/in.st" --layers 1 --h-q 2 --h-kv 2 --head-dim 8 --len 40 \
	--rows 8 --quiet
login "$CTL" compact "$tmp/in.st" "$tmp/out.st" -q --window 4 --capacity 16 >/dev/null \
	2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "$sys (system socket): No such file or directory" "$tmp/err" &&
	grep -q "$usr (\$XDG_RUNTIME_DIR): no snapkvd listening" "$tmp/err" && [ ! -e "$tmp/out.st" ] &&
	ok "compact through libsnapkv: exit 1, both paths in the error" ||
	not_ok "compact, no daemon: rc $rc, $(cat "$tmp/err")"
env -i PATH="$PATH" HOME="$tmp/home" "$CTL" pressure >/dev/null 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] && grep -q "tried $sys (system socket): No such file or directory\$" "$tmp/err" &&
	ok "no \$XDG_RUNTIME_DIR: the system socket alone" ||
	not_ok "no XDG: rc $rc, $(cat "$tmp/err")"

echo "test-cli-socket: $pass passed, $fail failed"
[ $fail -eq 0 ]
