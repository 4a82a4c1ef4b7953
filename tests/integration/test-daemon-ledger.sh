#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-daemon-ledger: the capacity ledger of real caches through snapkvd.
# Five example engines hold caches in expand and group mode (one bypassed,
# L < C; three GROW their decode headroom while APPENDing g tokens; one has
# no headroom at all; one released its cache with linger, so the daemon keeps
# and counts it while the session lives). Every number of `snapkvctl ledger --json` (per cache, per
# tenant, for the pool) and of the human table (IEC and --bytes) is compared
# with values computed here from SPEC.md's formulas and the arena layout
# (per layer K and V [h_store][slots][D] and positions [h_store][slots], each
# 64-byte aligned, the region rounded to 4 KiB pages), never with the daemon's
# own arithmetic.
set -euo pipefail
BUILD=${BUILD:-build}
CTL=$BUILD/snapkvctl
ENG=$BUILD/snapkv-engine
tmp=$(mktemp -d /tmp/snapkvd-ledger-XXXXXX)
dpid=
epids=()
cleanup() {
	touch "$tmp/go" 2>/dev/null || true
	for p in "${epids[@]}"; do
		kill -KILL "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	[ -n "$dpid" ] && kill -KILL "$dpid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
sock=$tmp/s.sock
pool=$((64 << 20))
quota=$((32 << 20))
printf 'tenant_quota = %s:%s\n' "$(id -u)" "$quota" >"$tmp/d.conf"
"$BUILD/snapkvd" --config "$tmp/d.conf" --socket "$sock" --pool-bytes "$pool" --threads 2 \
	--log-level warning &
dpid=$!
for _ in $(seq 300); do [ -S "$sock" ] && break; sleep 0.01; done
export SNAPKV_SOCKET=$sock

# name gqa layers h_q h_kv head_dim prompt window capacity decode reserve
specs="ex1 expand 2 8 2 32 300 16 64 13 4
gr1 group 3 8 2 16 100 8 128 5 8
gr2 group 2 6 3 8 500 8 40 7 3
ex2 expand 1 4 1 16 64 8 32 0 0
lg1 expand 1 4 2 16 200 8 48 3 2"
while read -r name gqa n hq hkv d L w C g r; do
	linger=
	[ "$name" = lg1 ] && linger=--linger
	# shellcheck disable=SC2086
	"$ENG" --name "$name" $linger --gqa "$gqa" --layers "$n" --h-q "$hq" --h-kv "$hkv" \
		--head-dim "$d" --prompt "$L" --window "$w" --capacity "$C" --decode "$g" \
		--reserve "$r" --hold-until "$tmp/go" >"$tmp/$name.out" &
	epids+=($!)
done <<<"$specs"
for name in ex1 gr1 gr2 ex2 lg1; do
	for _ in $(seq 1000); do [ -s "$tmp/$name.out" ] && break; sleep 0.01; done
	[ -s "$tmp/$name.out" ] || fail "engine $name did not get its cache"
done
"$CTL" ledger --json >"$tmp/ledger.json" || fail "ledger --json"
"$CTL" ledger >"$tmp/ledger.txt" || fail "ledger"
"$CTL" ledger --bytes >"$tmp/ledger.bytes" || fail "ledger --bytes"

SPECS=$specs python3 - "$tmp" "$pool" "$quota" "$(id -u)" <<'PY' || fail "ledger numbers"
import json, os, re, sys
tmp, pool, quota, uid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
specs = os.environ["SPECS"]

def align(x, a):
    return (x + a - 1) // a * a

def human(b):
    # IEC units with 2 decimals, as documented for the table
    if b < 1024:
        return "%d B" % b
    for i, u in enumerate(["KiB", "MiB", "GiB", "TiB"]):
        v = b / 1024 ** (i + 1)
        if v < 1024 or u == "TiB":
            return "%.2f %s" % (v, u)

want = {}
for line in specs.splitlines():
    f = line.split()
    name, gqa = f[0], f[1]
    N, Hq, Hkv, D, L, W, C, g, r = map(int, f[2:])
    s = 4  # the engine's K/V are f32
    kept = min(L, C)
    # the engine GROWs by its reserve (16 when 0) whenever the slots are full
    slots, grows = kept + r, 0
    for i in range(g):
        if kept + i == slots:
            slots += r or 16
            grows += 1
    hs = Hq if gqa == "expand" else Hkv
    b = {
        "native_full": 2 * N * Hkv * (L + g) * D * s,
        "compact": 2 * N * hs * (kept + g) * D * s,
        "index": 4 * N * hs * (kept + g),
        "reserved": 2 * N * hs * (slots - kept - g) * D * s,
    }
    b["real"] = b["compact"] + b["index"] + b["reserved"]
    layer = 2 * align(hs * slots * D * s, 64) + align(hs * slots * 4, 64)
    b["allocated"] = align(N * layer, 4096)
    b["padding"] = b["allocated"] - b["real"]
    assert b["allocated"] >= b["real"], (name, b)
    out = open("%s/%s.out" % (tmp, name)).read()
    m = re.search(r"L=(\d+) kept=(\d+) g=(\d+) .*slots=(\d+) grows=(\d+)", out)
    assert m and tuple(map(int, m.groups())) == (L, kept, g, slots, grows), (name, out)
    want[name] = dict(gqa=gqa, N=N, Hq=Hq, Hkv=Hkv, D=D, s=s, L=L, C=C, g=g, kept=kept,
                      slots=slots, hs=hs, bytes=b, ratio=b["compact"] / b["native_full"])
assert want["ex1"]["bytes"]["reserved"] > 0 and want["ex2"]["bytes"]["reserved"] == 0
assert [want[n]["slots"] - want[n]["kept"] for n in ("ex1", "gr2", "lg1")] == [16, 9, 4]

KEYS = ["native_full", "compact", "index", "reserved", "real", "allocated", "padding"]
def total(names):
    return {k: sum(want[n]["bytes"][k] for n in names) for k in KEYS}

d = json.load(open(tmp + "/ledger.json"))
# issue 3's schema: the required keys are there, with their meanings
for k in ("pool", "tenants", "caches"):
    assert k in d, d.keys()
caches = {c["engine"]: c for c in d["caches"]}
assert sorted(caches) == sorted(want), caches.keys()
for name, w in want.items():
    c = caches[name]
    for k in ("id", "tenant", "layers", "h_q", "h_kv", "head_dim", "dtype_bytes",
              "prompt_len", "capacity", "appended", "gqa", "bytes"):
        assert k in c, (name, k)
    got = (c["layers"], c["h_q"], c["h_kv"], c["head_dim"], c["dtype_bytes"], c["prompt_len"],
           c["capacity"], c["appended"], c["gqa"])
    assert got == (w["N"], w["Hq"], w["Hkv"], w["D"], w["s"], w["L"], w["C"], w["g"],
                   w["gqa"]), (name, got)
    assert c["bytes"] == w["bytes"], (name, c["bytes"], w["bytes"])
    assert abs(c["ratio"] - w["ratio"]) < 1e-12, (name, c["ratio"], w["ratio"])
    assert (c["kept"], c["slots"], c["h_store"]) == (w["kept"], w["slots"], w["hs"]), name
    assert c["requested_capacity"] == w["C"], name
    assert c["lingering"] is (name == "lg1"), (name, c["lingering"])
    assert isinstance(c["id"], int) and c["tenant"] == d["tenants"][0]["name"], name
all_b = total(want)
assert len(d["tenants"]) == 1, d["tenants"]
t = d["tenants"][0]
for k in ("name", "uid", "used_bytes", "caches"):
    assert k in t, k
assert t["uid"] == uid and t["caches"] == 5 and t["quota_bytes"] == quota, t
assert t["bytes"] == all_b, (t["bytes"], all_b)
# nothing is in flight: the tenant's pool bytes are exactly its regions
assert t["used_bytes"] == all_b["allocated"], (t["used_bytes"], all_b)
assert t["lingering_caches"] == 1, t
assert abs(t["ratio"] - all_b["compact"] / all_b["native_full"]) < 1e-12, t
p = d["pool"]
assert p["total_bytes"] == pool and p["used_bytes"] == all_b["allocated"], p
assert p["reserved_bytes"] == 0 and p["free_bytes"] == pool - all_b["allocated"], p
assert p["caches"] == 5 and p["lingering_caches"] == 1, p
assert p["bytes"] == all_b, (p["bytes"], all_b)
assert abs(p["ratio"] - all_b["compact"] / all_b["native_full"]) < 1e-12, p

# the tables: one row per tenant and per cache, totals and pool lines
COLS = ["native_full", "compact", "index", "reserved", "real", "allocated"]
def row_ok(line, b, fmt, what):
    want_cols = [fmt(b[k]) for k in COLS] + ["%.4f" % (b["compact"] / b["native_full"])]
    tail = " ".join(want_cols)
    norm = re.sub(r"\s+", " ", line.strip())
    assert norm.endswith(tail), (what, norm, tail)

# the header line in the table's units: IEC, or bytes with --bytes
for path, fmt, head in ((tmp + "/ledger.txt", human, human),
                        (tmp + "/ledger.bytes", str, lambda b: "%d B" % b)):
    lines = open(path).read().splitlines()
    assert lines[0].startswith("pool: " + head(all_b["allocated"]) + " used of " +
                               head(pool)), lines[0]
    trow = [l for l in lines if l.startswith(t["name"] + " ")]
    assert len(trow) == 1, lines
    row_ok(trow[0], all_b, fmt, "tenant")
    assert (" %s " % fmt(quota)) in trow[0] and (" %s " % fmt(all_b["allocated"])) in trow[0]
    tot = [l for l in lines if l.startswith("total ")]
    assert len(tot) == 2, lines
    for l in tot:
        row_ok(l, all_b, fmt, "total")
    assert "5 caches (1 lingering)" in lines[0], lines[0]
    prow = [l for l in lines if l.startswith("pool ")]
    assert len(prow) == 1 and "1 lingering" in prow[0], lines
    row_ok(prow[0], all_b, fmt, "pool")
    for name, w in want.items():
        r = [l for l in lines if re.match(r"\s*\d+ %s " % name, l)]
        assert len(r) == 1, (name, lines)
        state = "lingering" if name == "lg1" else "held"
        assert " %s %s " % (w["gqa"], state) in re.sub(r"\s+", " ", r[0]), r[0]
        row_ok(r[0], w["bytes"], fmt, name)
print("ledger: %d caches, pool %d B allocated for %d B real" %
      (len(want), all_b["allocated"], all_b["real"]))
PY
touch "$tmp/go"
for p in "${epids[@]}"; do wait "$p" || fail "an engine failed"; done
epids=()
# released: the ledger is empty and every byte is back
"$CTL" ledger --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["caches"] == [] and d["pool"]["used_bytes"] == 0, d
assert all(v == 0 for v in d["pool"]["bytes"].values()), d["pool"]
assert d["pool"]["ratio"] is None, d["pool"]
' || fail "ledger after release"
kill -TERM "$dpid"
rc=0
wait "$dpid" || rc=$?
dpid=
[ "$rc" -eq 0 ] || fail "snapkvd exited $rc"
echo "daemon ledger per cache, tenant and pool OK"
