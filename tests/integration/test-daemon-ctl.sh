#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-daemon-ctl: snapkvctl against a live snapkvd. `compact IN OUT` through
# the daemon writes the same bytes as `compact --offline` (several policies,
# dtypes and GQA modes); status, caches, ledger (table and --json, whose
# schema and numbers are checked independently against SPEC.md's formulas)
# and metrics answer, each read command with --json too (caches and metrics
# agree with the tables, pressure's strings are escaped), ledger --bytes has
# no IEC unit left; --version is the project's VERSION (libsnapkv's); an unreachable
# daemon is a clean exit 1.
set -euo pipefail
BUILD=${BUILD:-build}
CTL=$BUILD/snapkvctl
GEN=$BUILD/examples/gen-layer
tmp=$(mktemp -d /tmp/snapkvd-ctl-XXXXXX)
dpid=
cleanup() {
	[ -n "$dpid" ] && kill -KILL "$dpid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
sock=$tmp/s.sock
"$BUILD/snapkvd" --socket "$sock" --threads 2 --log-level warning &
dpid=$!
for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.01; done
export SNAPKV_SOCKET=$sock

# daemon path == offline path, byte for byte
i=0
for args in "--dtype bf16 --len 512|--capacity 128" \
	"--dtype f16 --len 300 --layers 3|--capacity 64 --gqa group --kernel 7 --pooling max" \
	"--dtype f32 --len 200 --h-q 8 --h-kv 8|--policy streamingllm --capacity 48 --sinks 4" \
	"--dtype bf16 --len 100|--capacity 256"; do
	i=$((i + 1))
	g=${args%%|*}
	c=${args#*|}
	# shellcheck disable=SC2086
	"$GEN" "$tmp/in$i.st" --quiet $g --h-q 8 --h-kv 2 --head-dim 32 2>/dev/null ||
		"$GEN" "$tmp/in$i.st" --quiet $g
	# shellcheck disable=SC2086
	"$CTL" compact --offline "$tmp/in$i.st" "$tmp/off$i.st" -q $c || fail "offline $i"
	# shellcheck disable=SC2086
	"$CTL" compact "$tmp/in$i.st" "$tmp/dmn$i.st" -q $c || fail "daemon $i"
	cmp "$tmp/off$i.st" "$tmp/dmn$i.st" || fail "daemon and offline outputs differ ($c)"
done
# the daemon path reports the daemon's errors as such
rc=0
"$CTL" compact "$tmp/in1.st" "$tmp/bad.st" -q --capacity 16 --window 32 2>"$tmp/err" || rc=$?
[ "$rc" -ne 0 ] && [ ! -e "$tmp/bad.st" ] || fail "invalid parameters accepted"

# the example engine on a safetensors dump: planted spans keep most of the mass
"$BUILD/snapkv-engine" --name fromfile --in "$tmp/in1.st" --window 16 --capacity 128 \
	--decode 4 >"$tmp/file.out" || fail "engine --in"
python3 - "$tmp/file.out" <<'PY' || fail "engine --in: $(cat "$tmp/file.out")"
import re, sys
line = open(sys.argv[1]).read()
m = re.search(r"L=(\d+) kept=(\d+) g=(\d+) next_pos=(\d+).*mass_mean=([0-9.]+)", line)
L, kept, g, nxt, mass = int(m[1]), int(m[2]), int(m[3]), int(m[4]), float(m[5])
assert (L, kept, g, nxt) == (512, 128, 4, 516), line
assert 0.0 < mass <= 1.0, line
PY

# online subcommands while an engine holds a cache
"$BUILD/snapkv-engine" --name held --layers 3 --h-q 8 --h-kv 2 --head-dim 32 --prompt 700 \
	--window 16 --capacity 128 --decode 5 --reserve 8 --gqa group \
	--hold-until "$tmp/go" >"$tmp/eng.out" &
epid=$!
for _ in $(seq 500); do [ -s "$tmp/eng.out" ] && break; sleep 0.01; done
"$CTL" status | grep -q "sessions  1" || fail "status: $("$CTL" status)"
"$CTL" status --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["sessions"]==1'
"$CTL" caches | grep -q "held" || fail "caches does not list the engine's cache"
"$CTL" ledger | grep -q "held" || fail "ledger table"
"$CTL" ledger --json >"$tmp/ledger.json"
python3 - "$tmp/ledger.json" <<'PY' || fail "ledger --json: $(cat "$tmp/ledger.json")"
import json, sys
d = json.load(open(sys.argv[1]))
# issue 3's schema, extended: its keys are all there (extra ones are allowed)
assert {"pool", "tenants", "caches"} <= set(d), d.keys()
assert {"total_bytes", "used_bytes"} <= set(d["pool"]), d["pool"].keys()
assert d["pool"]["used_bytes"] > 0
for t in d["tenants"]:
    assert {"name", "uid", "used_bytes", "caches"} <= set(t), t.keys()
assert len(d["caches"]) == 1
c = d["caches"][0]
assert {"id", "tenant", "layers", "h_q", "h_kv", "head_dim", "dtype_bytes", "prompt_len",
        "capacity", "appended", "gqa", "bytes"} <= set(c), c.keys()
assert {"native_full", "compact", "index", "reserved"} <= set(c["bytes"]), c["bytes"].keys()
assert isinstance(c["id"], int) and c["tenant"] == d["tenants"][0]["name"], c
assert c.get("transport") == "memfd" and c.get("arena_transport") == "host-memfd", c
# SPEC.md ledger, computed here: B=1, group stores H_kv heads
N, Hq, Hkv, D, s, L, C, g = 3, 8, 2, 32, 4, 700, 128, 5
assert (c["layers"], c["h_q"], c["h_kv"], c["head_dim"], c["dtype_bytes"]) == (N, Hq, Hkv, D, s)
assert (c["prompt_len"], c["capacity"], c["appended"], c["gqa"]) == (L, C, g, "group")
b = c["bytes"]
assert b["native_full"] == 2 * N * Hkv * (L + g) * D * s, b
assert b["compact"] == 2 * N * Hkv * (min(L, C) + g) * D * s, b
assert b["index"] == 4 * N * Hkv * (min(L, C) + g), b
assert b["reserved"] == 2 * N * Hkv * (8 - g) * D * s, b
# the extension: real vs allocated (per layer K, V [h][slots][D] and positions
# [h][slots], 64-byte aligned; the region in 4 KiB pages), ratio, state
a64 = lambda x: (x + 63) // 64 * 64
slots = min(L, C) + 8
real = b["compact"] + b["index"] + b["reserved"]
alloc = (N * (2 * a64(Hkv * slots * D * s) + a64(Hkv * slots * 4)) + 4095) // 4096 * 4096
assert (b["real"], b["allocated"], b["padding"]) == (real, alloc, alloc - real), b
assert b["allocated"] >= b["real"]
assert abs(c["ratio"] - b["compact"] / b["native_full"]) < 1e-12, c
assert c["lingering"] is False and c["engine"] == "held", c
t = d["tenants"][0]
assert t["bytes"] == b and t["used_bytes"] == alloc and t["caches"] == 1, t
assert d["pool"]["bytes"] == b and d["pool"]["used_bytes"] == alloc, d["pool"]
assert sum(t["used_bytes"] for t in d["tenants"]) == d["pool"]["used_bytes"]
PY
"$CTL" metrics >"$tmp/metrics"
grep -q "^snapkvd_pool_total_bytes [0-9]" "$tmp/metrics" || fail "metrics"
grep -q "^snapkvd_caches 1$" "$tmp/metrics" || fail "metrics cache count"
"$CTL" caches --json >"$tmp/caches.json"
python3 - "$tmp/caches.json" "$tmp/ledger.json" <<'PY' || fail "caches --json: $(cat "$tmp/caches.json")"
import json, sys
d = json.load(open(sys.argv[1]))
l = json.load(open(sys.argv[2]))["caches"][0]
assert list(d) == ["caches"] and len(d["caches"]) == 1, d
c = d["caches"][0]
assert (c["id"], c["engine"], c["tenant"], c["layers"], c["prompt_len"], c["appended"]) == \
    (l["id"], "held", l["tenant"], 3, 700, 5), c
assert (c["heads"], c["kept"], c["gqa"]) == (2, 128, "group"), c
assert c["slots"] == 128 + 8 and 0 < c["mass_min"] <= c["mass_mean"] <= 1, c
PY
"$CTL" metrics --json >"$tmp/metrics.json"
python3 - "$tmp/metrics.json" "$tmp/metrics" <<'PY' || fail "metrics --json: $(head -c 600 "$tmp/metrics.json")"
import json, sys
d = json.load(open(sys.argv[1]))
text = [l for l in open(sys.argv[2]).read().splitlines() if l and not l.startswith("#")]
s = d["samples"]
assert len(s) == len(text), (len(s), len(text))
by = {x["name"]: x for x in s if not x["labels"]}
assert by["snapkvd_caches"]["value"] == 1, by["snapkvd_caches"]
assert any(x["labels"].get("le") == "+Inf" for x in s)
assert all(isinstance(x["value"], (int, float)) or x["value"] in ("+Inf", "-Inf", "NaN") for x in s)
PY
"$CTL" pressure --json >"$tmp/pressure.json"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["level"] in ("normal","high","critical"), d' \
	"$tmp/pressure.json" || fail "pressure --json: $(cat "$tmp/pressure.json")"
"$CTL" ledger --bytes >"$tmp/ledger.bytes"
head -1 "$tmp/ledger.bytes" | grep -Eq '^pool: [0-9]+ B used of [0-9]+ B \(' ||
	fail "ledger --bytes header: $(head -1 "$tmp/ledger.bytes")"
! grep -q 'iB' "$tmp/ledger.bytes" || fail "ledger --bytes still has IEC units"
"$CTL" ledger | head -1 | grep -Eq '^pool: [0-9.]+ [KMGT]iB used of' || fail "ledger header: $("$CTL" ledger | head -1)"
ver=$(make --no-print-directory -s -f Makefile -f - _print_version <<<'_print_version: ; @echo $(VERSION)' 2>/dev/null)
[ -n "$ver" ] && [ "$("$CTL" --version)" = "snapkvctl $ver" ] ||
	fail "--version: '$("$CTL" --version)', Makefile VERSION '$ver'"
touch "$tmp/go"
wait "$epid" || fail "engine"
kill -TERM "$dpid"
rc=0
wait "$dpid" || rc=$?
dpid=
[ "$rc" -eq 0 ] || fail "snapkvd exited $rc"
rc=0
"$CTL" status 2>"$tmp/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "cannot reach snapkvd" "$tmp/err" || fail "no daemon: rc $rc"
echo "snapkvctl online subcommands and daemon compaction OK"
