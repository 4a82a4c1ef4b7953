#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-metrics-http.sh - snapkvd's Prometheus listener (metrics_listen), with
# a real HTTP client (curl, on loopback only) and Prometheus' own checker:
#  - off by default: no TCP socket at all among the daemon's fds;
#  - GET /metrics: 200, the 0.0.4 text type, the same families (HELP and
#    TYPE lines) as `snapkvctl metrics`, accepted by `promtool check
#    metrics` (which is shown to reject a broken exposition); HEAD, /healthz;
#  - 404, 405 (with Allow), 400 (bad request line, bad version, bad header),
#    431 for a head over metrics_http_max_request;
#  - metrics_http_max_connections: one more connection is answered 503
#    while the others stay open, and served again once they close; the 503
#    reaches a client that writes its request in two parts around it (10 of
#    10: closing over the unread first part sent a reset, and the second
#    write failed before the client read anything);
#  - metrics_http_tenants: aggregate (default) shows the snapkvd_tenant_*
#    families as one unlabelled sum, none leaves them out, all shows every
#    tenant's (a non-root engine's tenant line included); --check-config
#    prints it and refuses another value, naming the key;
#  - metrics_http_timeout_ms: a client that trickles its request (slowloris)
#    or never reads is disconnected, and others are still served;
#  - metrics_http_cache_ms: a scrape loop (300 GETs, engines compacting
#    meanwhile) gets 200 and a well-formed exposition every time, counters
#    never going back, and promtool accepts the last one; within the
#    interval a scrape is served the same rendering (snapkvctl metrics is
#    not cached), after it a fresh one; 0 renders each scrape;
#  - a port in use: start-up fails with exit 1 naming the address and errno;
#  - SIGTERM with connections open exits 0.
# Timings are printed (curl's time_total), never asserted.
set -u
BUILD=${BUILD:-build}
. "$(dirname "$0")/../tally.sh"
D=$BUILD/snapkvd
tmp=$(mktemp -d /tmp/snapkvd-http-XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
PROMTOOL=${PROMTOOL:-$(command -v promtool || echo /var/cache/snapkv-tools/promtool)}

# A free loopback port (the kernel's pick; the daemon binds it right after).
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_for() { # file pattern
	for _ in $(seq 500); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.02; done
	return 1
}
# start NAME CONFIG-LINES...: a daemon on $tmp/NAME.sock; sets $pid
start() {
	local name=$1
	shift
	printf '%s\n' "$@" >"$tmp/$name.conf"
	"$D" --config "$tmp/$name.conf" --socket "$tmp/$name.sock" --threads 1 \
		--log-level debug 2>"$tmp/$name.log" &
	pid=$!
	pids+=("$pid")
	wait_for "$tmp/$name.log" "backend host" || { kill -0 $pid 2>/dev/null || wait $pid; }
}
stop() { # pid name: SIGTERM, expect 0
	kill -TERM "$1"
	local rc=0
	wait "$1" || rc=$?
	[ $rc -eq 0 ] && ok "$2: SIGTERM exits 0" || not_ok "$2: exit $rc after SIGTERM: $(tail -3 "$tmp/$2.log")"
}
# the inodes of the TCP sockets (any state) that process $1 holds
tcp_inodes() {
	local ino
	for ino in $(find /proc/"$1"/fd -lname 'socket:*' -printf '%l\n' 2>/dev/null | tr -dc '0-9\n'); do
		awk -v i="$ino" 'NR > 1 && $10 == i { print i }' /proc/net/tcp /proc/net/tcp6
	done
}
# raw REQUEST-BYTES: what the daemon answers (the status line), via python
raw() {
	python3 - "$port" "$1" <<'PY'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
s.sendall(sys.argv[2].encode().decode("unicode_escape").encode("latin-1"))
data = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    data += b
print(data.split(b"\r\n", 1)[0].decode())
PY
}
status() { curl -s -o /dev/null -w '%{http_code}' "$@"; }

# ---- off by default ----
start off "log_level = debug"
if [ -z "$(tcp_inodes $pid)" ] && ! grep -q "metrics on http" "$tmp/off.log"; then
	ok "off by default: the daemon holds no TCP socket"
else
	not_ok "a TCP socket without metrics_listen: $(tcp_inodes $pid)"
fi
stop $pid off

# ---- on: /metrics through curl, checked by promtool ----
port=$(free_port)
start on "metrics_listen = $port" "metrics_http_max_request = 1K" "metrics_http_cache_ms = 0"
grep -q "metrics on http://127.0.0.1:$port/metrics" "$tmp/on.log" &&
	ok "a port alone listens on loopback (127.0.0.1:$port)" || not_ok "log: $(cat "$tmp/on.log")"
"$BUILD/snapkvctl" --socket "$tmp/on.sock" metrics >"$tmp/ctl.prom" 2>&1 ||
	not_ok "snapkvctl metrics: $(cat "$tmp/ctl.prom")"
hdr=$(curl -sS -D - -o "$tmp/http.prom" -w 'time_total=%{time_total}' \
	"http://127.0.0.1:$port/metrics" 2>&1)
echo "    curl /metrics: $(echo "$hdr" | tail -1) s, $(wc -c <"$tmp/http.prom") bytes"
echo "$hdr" | head -1 | grep -q '^HTTP/1.1 200' &&
	echo "$hdr" | grep -qi '^Content-Type: text/plain; version=0.0.4' &&
	ok "GET /metrics: 200, text/plain; version=0.0.4" || not_ok "GET /metrics: $hdr"
if [ -s "$tmp/http.prom" ] && diff <(grep '^# ' "$tmp/ctl.prom") <(grep '^# ' "$tmp/http.prom") \
	>"$tmp/fam.diff"; then
	ok "the same $(grep -c '^# TYPE' "$tmp/http.prom") families as snapkvctl metrics"
else
	not_ok "families differ from snapkvctl metrics: $(head -5 "$tmp/fam.diff")"
fi
grep -q '^snapkvd_pool_total_bytes [0-9]' "$tmp/http.prom" &&
	ok "values present (snapkvd_pool_total_bytes)" || not_ok "no pool gauge"
if [ -x "$PROMTOOL" ]; then
	if out=$("$PROMTOOL" check metrics <"$tmp/http.prom" 2>&1); then
		ok "promtool check metrics accepts /metrics"
	else
		not_ok "promtool check metrics: $out"
	fi
	printf '# TYPE x counter\nx{a="1" 2\n' >"$tmp/broken.prom"
	"$PROMTOOL" check metrics <"$tmp/broken.prom" >/dev/null 2>&1 &&
		not_ok "promtool accepted a broken exposition" || ok "promtool rejects a broken one"
else
	not_ok "promtool missing ($PROMTOOL): run scripts/deps.sh as root"
fi
[ "$(status -I "http://127.0.0.1:$port/metrics")" = 200 ] &&
	[ -z "$(curl -s -I "http://127.0.0.1:$port/metrics" | tr -d '\r' | sed '1,/^$/d')" ] &&
	ok "HEAD /metrics: 200, no body" || not_ok "HEAD /metrics"
[ "$(curl -s "http://127.0.0.1:$port/healthz")" = ok ] &&
	[ "$(status "http://127.0.0.1:$port/healthz")" = 200 ] &&
	ok "GET /healthz: 200 ok" || not_ok "/healthz"
[ "$(status "http://127.0.0.1:$port/metrics?x=1")" = 200 ] && ok "a query string is ignored" ||
	not_ok "query string"
[ "$(status "http://127.0.0.1:$port/")" = 404 ] &&
	[ "$(status "http://127.0.0.1:$port/metricsx")" = 404 ] && ok "other paths: 404" ||
	not_ok "404"
out=$(curl -s -D - -o /dev/null -X POST "http://127.0.0.1:$port/metrics")
echo "$out" | head -1 | grep -q ' 405 ' && echo "$out" | grep -qi '^Allow: GET, HEAD' &&
	ok "POST: 405 with Allow: GET, HEAD" || not_ok "POST: $out"
[ "$(raw 'GARBAGE\r\n\r\n')" = "HTTP/1.1 400 Bad Request" ] &&
	[ "$(raw 'GET /metrics HTTP/2.0\r\n\r\n')" = "HTTP/1.1 400 Bad Request" ] &&
	[ "$(raw 'GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n')" = "HTTP/1.1 400 Bad Request" ] &&
	[ "$(raw 'GET metrics HTTP/1.1\r\n\r\n')" = "HTTP/1.1 400 Bad Request" ] &&
	ok "bad request line, version, header, target: 400" || not_ok "400s"
[ "$(raw 'GET /metrics HTTP/1.0\n\n')" = "HTTP/1.1 200 OK" ] &&
	ok "HTTP/1.0 with bare newlines: 200" || not_ok "HTTP/1.0"
pad=$(head -c 2000 /dev/zero | tr '\0' a)
[ "$(status -H "X-Pad: $pad" "http://127.0.0.1:$port/metrics")" = 431 ] &&
	ok "a 2000-byte header over metrics_http_max_request = 1K: 431" || not_ok "431"
[ "$(status -H "X-Pad: ${pad:0:800}" "http://127.0.0.1:$port/metrics")" = 200 ] &&
	ok "an 800-byte header within it: 200" || not_ok "800-byte header refused"
# an engine's socket is not disturbed by the listener
"$BUILD/snapkv-engine" --socket "$tmp/on.sock" --layers 1 --prompt 128 --capacity 64 \
	--decode 2 >/dev/null 2>&1 && ok "an engine runs beside the listener" || not_ok "engine"
curl -s "http://127.0.0.1:$port/metrics" | grep -q '^snapkvd_compactions_total [1-9]' &&
	ok "/metrics counts the engine's compaction" || not_ok "compaction not counted"
# metrics_http_tenants = aggregate (the default): the tenant families as one
# unlabelled sum each, no tenant name or uid; snapkvctl (root) sees them all
curl -s "http://127.0.0.1:$port/metrics" >"$tmp/agg.prom"
"$BUILD/snapkvctl" --socket "$tmp/on.sock" metrics >"$tmp/ctl.prom" 2>&1
if grep -q '^snapkvd_tenant_compactions_total [1-9]' "$tmp/agg.prom" &&
	! grep -q '^snapkvd_tenant_[a-z_]*{' "$tmp/agg.prom" &&
	grep -q '^snapkvd_tenant_compactions_total{tenant="root",uid="0"} [1-9]' "$tmp/ctl.prom"; then
	ok "metrics_http_tenants default aggregate: sums without tenant labels over HTTP"
else
	not_ok "aggregate: $(grep '^snapkvd_tenant_' "$tmp/agg.prom" | head -5)"
fi
stop $pid on
for mode in none all; do
	port=$(free_port)
	start "t$mode" "metrics_listen = $port" "metrics_http_tenants = $mode"
	"$BUILD/snapkv-engine" --socket "$tmp/t$mode.sock" --layers 1 --prompt 128 --capacity 64 \
		--decode 2 >/dev/null 2>&1 || not_ok "engine ($mode)"
	curl -s "http://127.0.0.1:$port/metrics" >"$tmp/t$mode.prom"
	case $mode in
	none) ! grep -q 'snapkvd_tenant_' "$tmp/t$mode.prom" &&
		grep -q '^snapkvd_compactions_total [1-9]' "$tmp/t$mode.prom" ;;
	all) grep -q '^snapkvd_tenant_compactions_total{tenant="root",uid="0"} [1-9]' \
		"$tmp/t$mode.prom" ;;
	esac && ok "metrics_http_tenants = $mode over HTTP" ||
		not_ok "metrics_http_tenants = $mode: $(grep snapkvd_tenant_ "$tmp/t$mode.prom" | head -3)"
	stop $pid "t$mode"
done
printf 'metrics_listen = 9464\n' >"$tmp/cc.conf"
"$D" --check-config --config "$tmp/cc.conf" 2>&1 | grep -qx 'metrics_http_tenants = aggregate' &&
	ok "--check-config prints metrics_http_tenants = aggregate" || not_ok "--check-config"
printf 'metrics_http_tenants = some\n' >"$tmp/cc.conf"
"$D" --check-config --config "$tmp/cc.conf" >"$tmp/cc.out" 2>&1 &&
	not_ok "metrics_http_tenants = some accepted" ||
	{ grep -q 'metrics_http_tenants must be none, aggregate or all' "$tmp/cc.out" &&
		ok "metrics_http_tenants = some refused, naming the key"; } ||
	not_ok "metrics_http_tenants = some: $(cat "$tmp/cc.out")"

# ---- a scrape loop, and the rendering served again for metrics_http_cache_ms ----
port=$(free_port)
start cache "metrics_listen = $port" "metrics_http_cache_ms = 200"
( for _ in 1 2 3; do "$BUILD/snapkv-engine" --socket "$tmp/cache.sock" --layers 1 --prompt 128 \
	--capacity 64 --decode 2 >/dev/null 2>&1; done ) &
eng=$!
python3 - "$port" "$tmp/last.prom" >"$tmp/loop.out" 2>&1 <<'PY'
import re, socket, sys
port, last = int(sys.argv[1]), sys.argv[2]
sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$')
bad, prev, body = [], {}, b""
for i in range(300):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 OK"):
        bad.append("scrape %d: %r" % (i, head[:40]))
        continue
    clen = int(re.search(rb"Content-Length: (\d+)", head).group(1))
    if clen != len(body):
        bad.append("scrape %d: %d bytes, Content-Length %d" % (i, len(body), clen))
    for line in body.decode().splitlines():
        if line.startswith("#") or not line:
            continue
        if not sample.match(line):
            bad.append("scrape %d: %r" % (i, line))
            continue
        name, value = line.rsplit(" ", 1)
        if name.split("{")[0].endswith("_total"):
            if float(value) < prev.get(name, 0):
                bad.append("scrape %d: %s went back to %s" % (i, name, value))
            prev[name] = float(value)
open(last, "wb").write(body)
print("scrapes: 300, bad: %d" % len(bad))
for b in bad[:5]:
    print(b)
PY
wait $eng
grep -q '^scrapes: 300, bad: 0$' "$tmp/loop.out" &&
	ok "a scrape loop of 300 while engines compact: 200, well formed, counters monotonic" ||
	not_ok "scrape loop: $(head -6 "$tmp/loop.out")"
if [ -x "$PROMTOOL" ]; then
	"$PROMTOOL" check metrics <"$tmp/last.prom" >/dev/null 2>&1 &&
		ok "promtool accepts the loop's last scrape" || not_ok "promtool: the loop's last scrape"
fi
sleep 0.3 # past metrics_http_cache_ms: the next scrape is rendered now
curl -s "http://127.0.0.1:$port/metrics" | grep -q '^snapkvd_compactions_total 3$' &&
	ok "past metrics_http_cache_ms: a fresh rendering (3 compactions)" ||
	not_ok "not fresh after the interval: $(curl -s "http://127.0.0.1:$port/metrics" | grep compactions_total)"
stop $pid cache
port=$(free_port)
start cache60 "metrics_listen = $port" "metrics_http_cache_ms = 60000"
curl -s "http://127.0.0.1:$port/metrics" >"$tmp/c1.prom"
"$BUILD/snapkv-engine" --socket "$tmp/cache60.sock" --layers 1 --prompt 128 --capacity 64 \
	--decode 2 >/dev/null 2>&1 || not_ok "engine (cache60)"
curl -s "http://127.0.0.1:$port/metrics" >"$tmp/c2.prom"
"$BUILD/snapkvctl" --socket "$tmp/cache60.sock" metrics >"$tmp/c3.prom" 2>&1
if cmp -s "$tmp/c1.prom" "$tmp/c2.prom" && grep -q '^snapkvd_compactions_total 0$' "$tmp/c2.prom" &&
	grep -q '^snapkvd_compactions_total 1$' "$tmp/c3.prom"; then
	ok "within metrics_http_cache_ms the same rendering is served (snapkvctl metrics is fresh)"
else
	not_ok "cache: $(grep compactions_total "$tmp/c1.prom" "$tmp/c2.prom" "$tmp/c3.prom")"
fi
stop $pid cache60

# ---- the connection limit ----
port=$(free_port)
start limit "metrics_listen = 127.0.0.1:$port" "metrics_http_max_connections = 2" \
	"metrics_http_timeout_ms = 600000"
python3 - "$port" >"$tmp/limit.out" 2>&1 <<'PY'
import socket, sys, time
port = int(sys.argv[1])
idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
extra = socket.create_connection(("127.0.0.1", port), timeout=30)
data = b""
while True:
    b = extra.recv(4096)
    if not b:
        break
    data += b
print("third:", data.split(b"\r\n", 1)[0].decode())
# the two idle ones were not closed meanwhile
for s in idle:
    s.setblocking(False)
    try:
        print("idle:", "closed" if s.recv(1) == b"" else "data")
    except BlockingIOError:
        print("idle: open")
for s in idle:
    s.close()
PY
python3 - "$port" >"$tmp/limit503.out" 2>&1 <<'PY'
import socket, sys, time
port = int(sys.argv[1])
idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
got = 0
for _ in range(10):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    # a request in two writes, the 503 already sent between them: the first
    # part is unread when the daemon is done with the connection
    data, ok = b"", True
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        time.sleep(0.2)
        s.sendall(b"Host: x\r\n\r\n")
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
    except (BrokenPipeError, ConnectionResetError):
        ok = False
    if ok and data.startswith(b"HTTP/1.1 503 Service Unavailable") and data.endswith(b"too many connections\n"):
        got += 1
    s.close()
    time.sleep(0.2)  # the daemon reads the FIN: its refused slots are free again
print("503 received: %d of 10" % got)
for s in idle:
    s.close()
PY
grep -q '^503 received: 10 of 10' "$tmp/limit503.out" &&
	ok "a refused client still writing its request gets the whole 503 (10 of 10)" ||
	not_ok "503 lost: $(cat "$tmp/limit503.out")"
grep -q '^third: HTTP/1.1 503 Service Unavailable' "$tmp/limit.out" &&
	[ "$(grep -c '^idle: open' "$tmp/limit.out")" = 2 ] &&
	ok "max_connections 2: a third gets 503, the two stay open" ||
	not_ok "connection limit: $(cat "$tmp/limit.out")"
code=""
for _ in $(seq 100); do
	code=$(status "http://127.0.0.1:$port/healthz")
	[ "$code" = 200 ] && break
	sleep 0.1
done
[ "$code" = 200 ] && ok "served again once they closed" || not_ok "after closing: $code"
grep -q "metrics_http_max_connections" "$tmp/limit.log" &&
	ok "the refusal is logged (debug) with its key" || not_ok "no refusal in the log"
stop $pid limit

# ---- the per-connection deadline: slowloris, a reader that never reads ----
port=$(free_port)
start slow "metrics_listen = $port" "metrics_http_timeout_ms = 300"
python3 - "$port" >"$tmp/slow.out" 2>&1 <<'PY'
import socket, sys, time
port = int(sys.argv[1])
# trickle a request one byte every 50 ms: cut off, however slowly it goes
s = socket.create_connection(("127.0.0.1", port), timeout=30)
req = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 10000
end = time.time() + 60
sent = 0
try:
    while time.time() < end:
        s.sendall(req[sent:sent + 1])
        sent += 1
        s.settimeout(0.05)
        try:
            if s.recv(4096) == b"":
                print("trickle: closed after %d bytes" % sent)
                break
        except socket.timeout:
            pass
    else:
        print("trickle: still open after 60 s")
except (BrokenPipeError, ConnectionResetError):
    print("trickle: closed after %d bytes" % sent)
# a client that sends nothing at all
s = socket.create_connection(("127.0.0.1", port), timeout=60)
try:
    print("silent:", "closed" if s.recv(1) == b"" else "data")
except socket.timeout:
    print("silent: still open after 60 s")
PY
grep -q '^trickle: closed' "$tmp/slow.out" && grep -q '^silent: closed' "$tmp/slow.out" &&
	ok "metrics_http_timeout_ms: a trickling and a silent client are disconnected" ||
	not_ok "deadline: $(cat "$tmp/slow.out")"
grep -q "past metrics_http_timeout_ms" "$tmp/slow.log" && ok "the cut is logged (debug)" ||
	not_ok "no deadline in the log"
[ "$(status "http://127.0.0.1:$port/healthz")" = 200 ] && ok "others still served" ||
	not_ok "not served after the slow clients"
# SIGTERM while a client holds a connection open
python3 -c 'import socket, sys, time; s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); time.sleep(30)' \
	"$port" &
holder=$!
sleep 0.2
stop $pid slow
kill $holder 2>/dev/null
wait $holder 2>/dev/null

# ---- a port in use: start-up fails, naming it ----
python3 -c 'import socket, sys, time; s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(30)' \
	>"$tmp/busy.port" &
holder=$!
for _ in $(seq 200); do [ -s "$tmp/busy.port" ] && break; sleep 0.02; done
busy=$(cat "$tmp/busy.port")
printf 'metrics_listen = %s\n' "$busy" >"$tmp/busy.conf"
rc=0
timeout 60 "$D" --config "$tmp/busy.conf" --socket "$tmp/busy.sock" --threads 1 2>"$tmp/busy.log" ||
	rc=$?
kill $holder 2>/dev/null
wait $holder 2>/dev/null
[ $rc -eq 1 ] && grep -q "127.0.0.1:$busy (metrics_listen): Address already in use" "$tmp/busy.log" &&
	[ ! -e "$tmp/busy.sock" ] &&
	ok "port in use: exit 1, naming 127.0.0.1:$busy and EADDRINUSE" ||
	not_ok "port in use: rc $rc: $(cat "$tmp/busy.log")"

echo "test-metrics-http: $pass passed, $fail failed"
[ $fail -eq 0 ]
