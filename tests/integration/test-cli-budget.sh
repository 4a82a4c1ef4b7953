#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-cli-budget.sh - `snapkvctl compact --offline --budget ... --fallback-below`:
# every budget mode's file checked by an independent Python reader (ragged
# layers add up, positions ascending per head, K rows are the input's rows at
# those positions, the summed ledger, the budget metadata, each mode's own
# promise: C* for mass, tau per head for mass-heads, per-layer counts for
# layers, H * C per layer for heads), uniform unchanged by --budget uniform,
# the fallback, and every bad budget: exit 2, one line on stderr, OUT untouched.
# Through snapkvd: every mode's file byte-identical to the --offline one, the
# same outcome printed, and the bad budgets refused by the daemon too; mass and
# a fallback with --out-layout paged hold the dense file's rows in blocks of
# C* (of L), and the modes with per-layer or per-head counts are refused.
set -u
BUILD=${BUILD:-build}
CTL=$BUILD/snapkvctl
GEN=$BUILD/examples/gen-layer
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-cli-budget.XXXXXX")
sock=$tmp/snapkvd.sock
pid=
cleanup() {
	[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT
. "$(dirname "$0")/../tally.sh"

cat >"$tmp/check.py" <<'PY'
import json, struct, sys

def read(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", b, 0)
    hdr = json.loads(b[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    out = {}
    for name, t in hdr.items():
        s, e = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], b[8 + n + s:8 + n + e])
    return out, meta

def vals(t):
    dt, shape, b = t
    fmt = {"F32": "f", "I32": "i"}[dt]
    return list(struct.unpack("<%d%s" % (len(b) // 4, fmt), b))

def main():
    inp, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    args = sys.argv[4:]
    ti, _ = read(inp)
    to, meta = read(out)
    L = int(meta["L"]); N = int(meta["layers"]); hs = int(meta["h_store"])
    D = int(meta["head_dim"]); hq = int(meta["h_q"]); hkv = int(meta["h_kv"])
    G = hq // hkv
    assert meta["budget"] == mode, (meta["budget"], mode)
    fb = int(meta["budget.fallback"])
    total = 0
    per_layer = []
    for l in range(N):
        kin = vals(ti["layers.%d.k" % l])
        mass = vals(to["layers.%d.retained_mass" % l])
        idx = vals(to["layers.%d.indices" % l])
        k = vals(to["layers.%d.k" % l])
        if "layers.%d.kept" % l in to:
            kept = vals(to["layers.%d.kept" % l])
            assert mode in ("heads", "mass-heads"), "ragged layer in mode " + mode
            assert to["layers.%d.k" % l][1] == [sum(kept), D]
            assert to["layers.%d.indices" % l][1] == [sum(kept)]
        else:
            assert mode not in ("heads", "mass-heads"), "mode %s not ragged" % mode
            sh = to["layers.%d.k" % l][1]
            assert sh[0] == hs and sh[2] == D
            kept = [sh[1]] * hs
        row = 0
        for h in range(hs):
            pos = idx[row:row + kept[h]]
            assert pos == sorted(set(pos)) and all(0 <= p < L for p in pos), "positions"
            kvh = h // G if meta["gqa"] == "expand" else h
            for i, p in enumerate(pos):
                assert k[(row + i) * D:(row + i + 1) * D] == kin[(kvh * L + p) * D:(kvh * L + p + 1) * D], "K row"
            row += kept[h]
        total += sum(kept)
        per_layer.append((kept, mass))
    assert int(meta["ledger.compact"]) == 2 * 4 * D * total, "summed ledger"
    assert int(meta["ledger.index"]) == 4 * total, "summed index"
    if fb:
        assert all(k == [L] * hs for k, _ in per_layer), "fallback keeps all"
        print("fallback"); return
    if mode == "layers":
        if "," in args[0]:
            want = [int(x) for x in args[0].split(",")]
            for l, (k, _) in enumerate(per_layer):
                assert k == [min(L, want[l])] * hs, (k, want[l])
        else:  # pyramid: uniform's total, N * C per stored head
            C = int(meta["capacity"])
            assert sum(k[0] for k, _ in per_layer) == N * C, [k[0] for k, _ in per_layer]
    elif mode == "heads":
        C = int(meta["capacity"])
        for k, _ in per_layer:
            assert sum(k) == hs * min(L, C), (sum(k), hs * C)
    elif mode == "mass":
        tau, cstar = float(args[0]), int(meta["budget.c_star"])
        for k, m in per_layer:
            assert k == [min(L, cstar)] * hs
        assert min(m for _, ms in per_layer for m in ms) >= tau - 1e-6 or cstar == int(meta["budget.c_max"])
    elif mode == "mass-heads":
        tau, cmax = float(args[0]), int(meta["budget.c_max"])
        for k, m in per_layer:
            for kh, mh in zip(k, m):
                assert mh >= tau - 1e-6 or kh == min(L, cmax), (kh, mh)
    print("ok %d" % total)

main()
PY
py() { /usr/bin/python3 "$tmp/check.py" "$@"; }

"$GEN" "$tmp/in.st" --layers 3 --h-q 4 --h-kv 2 --head-dim 8 --len 120 --rows 8 --dtype f32 --quiet
base="--window 8 --capacity 32"

echo "== every mode, checked by an independent reader"
while read -r label mode spec extra; do
	out="$tmp/$label.out"
	if "$CTL" compact --offline "$tmp/in.st" "$out" $base --budget "$spec" $extra -q 2>"$tmp/err" &&
		r=$(py "$tmp/in.st" "$out" "$mode" "$(echo "${spec#*:}" | cut -d: -f1)" 2>&1); then
		ok "$spec: $r"
	else
		not_ok "$spec: $(cat "$tmp/err") $r"
	fi
done <<'EOF2'
list layers layers:20,30,60
pyr layers pyramid:0.5
pyr2 layers pyramid:2
heads heads heads
heads5 heads heads:0.5
heads0 heads heads:0
mass mass mass:0.9
massl mass mass:0.95:16:96:8
mh mass-heads mass-heads:0.9
mh2 mass-heads mass-heads:0.8:12:64
mhgroup mass-heads mass-heads:0.85 --gqa group
EOF2

# The pyramid keeps uniform's total: N * C slots per stored head.
if "$CTL" compact --offline "$tmp/in.st" "$tmp/p.out" $base --budget pyramid:0.3 -q &&
	"$CTL" inspect "$tmp/p.out" >"$tmp/p.txt" &&
	[ $(($(sed -n 's/^layer [0-9]*: 4 heads x \([0-9]*\) kept.*/\1/p' "$tmp/p.txt" | paste -sd+))) = 96 ]; then
	ok "pyramid:0.3 keeps 3 x 32 slots per head in all ($(sed -n 's/^layer \([0-9]*\): 4 heads x \([0-9]*\) kept.*/\2/p' "$tmp/p.txt" | paste -sd,))"
else
	not_ok "pyramid total: $(cat "$tmp/p.txt")"
fi

echo "== uniform unchanged"
"$CTL" compact --offline "$tmp/in.st" "$tmp/u1.out" $base -q
"$CTL" compact --offline "$tmp/in.st" "$tmp/u2.out" $base --budget uniform -q
if cmp -s "$tmp/u1.out" "$tmp/u2.out" && r=$(py "$tmp/in.st" "$tmp/u1.out" uniform); then
	ok "--budget uniform is the default, byte for byte ($r)"
else
	not_ok "uniform differs"
fi

echo "== fallback"
if "$CTL" compact --offline "$tmp/in.st" "$tmp/f.out" --window 8 --capacity 12 --fallback-below 0.99 >"$tmp/f.txt" &&
	grep -q "fallback: a head would keep retained mass" "$tmp/f.txt" &&
	[ "$(py "$tmp/in.st" "$tmp/f.out" uniform)" = fallback ]; then
	ok "uniform C 12 below 0.99: full prompt kept, said so, budget.fallback 1"
else
	not_ok "fallback: $(cat "$tmp/f.txt")"
fi
if "$CTL" compact --offline "$tmp/in.st" "$tmp/f2.out" $base --budget mass-heads:0.5:12:20 --fallback-below 0.999 -q &&
	[ "$(py "$tmp/in.st" "$tmp/f2.out" mass-heads 0.5)" = fallback ]; then
	ok "mass-heads capped at 20 below 0.999: ragged file of full heads"
else
	not_ok "mass-heads fallback"
fi
if "$CTL" compact --offline "$tmp/in.st" "$tmp/f3.out" $base --budget mass:0.5 --fallback-below 0.1 -q &&
	r=$(py "$tmp/in.st" "$tmp/f3.out" mass 0.5) && [ "$r" != fallback ]; then
	ok "a fallback that does not apply changes nothing ($r)"
else
	not_ok "fallback 0.1"
fi

echo "== bad budgets: exit 2, one line, OUT untouched"
echo keep >"$tmp/out.st"
while IFS='|' read -r what args needle; do
	"$CTL" compact $args "$tmp/in.st" "$tmp/out.st" >"$tmp/o" 2>"$tmp/e"
	rc=$?
	if [ $rc -eq 2 ] && [ "$(wc -l <"$tmp/e")" -eq 1 ] && grep -qF -- "$needle" "$tmp/e" &&
		[ "$(cat "$tmp/out.st")" = keep ] && [ -z "$(ls "$tmp" | grep -i '\.tmp')" ]; then
		ok "$what: $(cat "$tmp/e")"
	else
		not_ok "$what: rc $rc: $(cat "$tmp/e")"
	fi
done <<'EOF2'
tau 0|--offline --window 8 --capacity 32 --budget mass:0|tau = 0 must be in (0, 1]
tau above 1|--offline --window 8 --capacity 32 --budget mass-heads:1.5|tau = 1.5 must be in (0, 1]
tau not a number|--offline --window 8 --capacity 32 --budget mass:high|is not a number
C_min > C_max|--offline --window 8 --capacity 32 --budget mass:0.9:40:20:4|C_min = 40 must be at least 1 and at most C_max = 20
step 0|--offline --window 8 --capacity 32 --budget mass:0.9:16:64:0|step must be at least 1
C_min <= W|--offline --window 8 --capacity 32 --budget mass:0.9:8:64:4|C_min = 8
list of the wrong length|--offline --window 8 --capacity 32 --budget layers:20,30|the list has 2 budgets for 3 layers
C_l <= W|--offline --window 8 --capacity 32 --budget layers:20,8,30|layer 1 (C_l = 8)
list not numbers|--offline --window 8 --capacity 32 --budget layers:20,x,30|is not a positive integer
pyramid C_l <= W|--offline --window 8 --capacity 12 --budget pyramid:0.1|pyramid layer 2
pyramid r 0|--offline --window 8 --capacity 32 --budget pyramid:0|pyramid r 0 must be in (0, 64]
floor above 1|--offline --window 8 --capacity 32 --budget heads:1.5|floor a = 1.5 must be in [0, 1]
floor below 0|--offline --window 8 --capacity 32 --budget heads:-0.2|floor a = -0.2 must be in [0, 1]
heads without scores|--offline --window 8 --capacity 32 --policy window --budget heads|needs scores
unknown mode|--offline --window 8 --capacity 32 --budget adaptive|is not uniform, layers
too many fields|--offline --window 8 --capacity 32 --budget mass-heads:0.9:1:2:3|is not uniform, layers
fallback above 1|--offline --window 8 --capacity 32 --fallback-below 2|fallback_below 2 must be in [0, 1]
fallback not a number|--offline --window 8 --capacity 32 --fallback-below x|is not a number
layers paged|--offline --window 8 --capacity 32 --budget pyramid:0.5 --out-layout paged --block-size 16|--out-layout paged takes --budget uniform or mass (one count for every head of every layer), not layers
EOF2

echo "== through snapkvd: byte-identical to --offline, the same outcome"
"$BUILD/snapkvd" --socket "$sock" --backend host --pool-bytes 64M --threads 2 \
	--log-level warning 2>"$tmp/daemon.log" &
pid=$!
for _ in $(seq 250); do
	[ -S "$sock" ] && break
	sleep 0.02
done
[ -S "$sock" ] || { echo "snapkvd did not start: $(cat "$tmp/daemon.log")"; exit 1; }
# the summary minus the file names and the time and where it ran
outcome() { sed 1d "$1" | grep -v '^  compaction .* ms, '; }
while read -r label args; do
	if "$CTL" compact --socket "$sock" "$tmp/in.st" "$tmp/on.st" $args >"$tmp/on.txt" 2>"$tmp/err" &&
		"$CTL" compact --offline "$tmp/in.st" "$tmp/off.st" $args >"$tmp/off.txt" 2>>"$tmp/err" &&
		cmp -s "$tmp/on.st" "$tmp/off.st" &&
		diff <(outcome "$tmp/on.txt") <(outcome "$tmp/off.txt") >"$tmp/diff"; then
		ok "$label: daemon file and outcome = --offline ($(grep -m1 -o 'budget [a-z-]*.*positions' "$tmp/on.txt" || echo uniform))"
	else
		not_ok "$label: $(cat "$tmp/err") $(cat "$tmp/diff" 2>/dev/null)"
	fi
done <<'EOF2'
uniform --window 8 --capacity 32
layers-list --window 8 --capacity 32 --budget layers:20,30,60
pyramid --window 8 --capacity 32 --budget pyramid:0.5
heads --window 8 --capacity 32 --budget heads
heads-group --window 8 --capacity 32 --budget heads:0.5 --gqa group
mass --window 8 --capacity 32 --budget mass:0.9
mass-ladder --window 8 --capacity 32 --budget mass:0.95:16:96:8
mass-heads --window 8 --capacity 32 --budget mass-heads:0.9
mass-heads-group --window 8 --capacity 32 --budget mass-heads:0.85 --gqa group
fallback --window 8 --capacity 12 --fallback-below 0.99
fallback-ragged --window 8 --capacity 32 --budget mass-heads:0.5:12:20 --fallback-below 0.999
fallback-unused --window 8 --capacity 32 --budget mass:0.5 --fallback-below 0.1
mass-paged --window 8 --capacity 32 --budget mass:0.9:12:96:4 --out-layout paged --block-size 16
fallback-paged --window 8 --capacity 12 --fallback-below 0.99 --out-layout paged --block-size 16
EOF2
# paged mass and fallback files: the dense file's rows in blocks of C* (L)
cat >"$tmp/paged.py" <<'PY'
import json, struct, sys

def read(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", b, 0)
    hdr = json.loads(b[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    return {k: (t["dtype"], t["shape"], b[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]])
            for k, t in hdr.items()}, meta

d, dm = read(sys.argv[1]); p, pm = read(sys.argv[2]); bs = int(sys.argv[3])
assert pm["out_layout"] == "paged" and pm["block_size"] == str(bs), "metadata"
assert {k: v for k, v in pm.items() if k not in ("out_layout", "block_size")} == dm, "metadata"
for name, (dt, shape, b) in d.items():
    pdt, pshape, pb = p[name]
    if not name.endswith((".k", ".v")):
        assert (pdt, pshape, pb) == (dt, shape, b), name
        continue
    hs, kept, hd = shape
    row = len(b) // (hs * kept)
    assert pshape == [(kept + bs - 1) // bs, bs, hs, hd], name + " shape"
    for h in range(hs):
        for i in range(kept):
            at = ((i // bs) * bs * hs + (i % bs) * hs + h) * row
            assert pb[at:at + row] == b[(h * kept + i) * row:(h * kept + i + 1) * row], name
    assert pb[kept * hs * row:] == bytes(len(pb) - kept * hs * row), name + " tail"
print("C* %s, %d blocks of %d" % (pm.get("budget.c_star", "?"), pshape[0], bs))
PY
while read -r label args; do
	if "$CTL" compact --socket "$sock" "$tmp/in.st" "$tmp/pd.st" $args -q 2>"$tmp/err" &&
		"$CTL" compact --socket "$sock" "$tmp/in.st" "$tmp/pp.st" $args --out-layout paged \
			--block-size 16 -q 2>>"$tmp/err" &&
		r=$(/usr/bin/python3 "$tmp/paged.py" "$tmp/pd.st" "$tmp/pp.st" 16 2>&1); then
		ok "$label --out-layout paged: the dense rows in blocks, the rest zero ($r)"
	else
		not_ok "$label paged: $(cat "$tmp/err") $r"
	fi
done <<'EOF2'
mass --window 8 --capacity 32 --budget mass:0.9:12:96:4
fallback --window 8 --capacity 12 --budget mass:0.9:12:24:4 --fallback-below 0.999
EOF2
if grep -q "fallback: a head would keep retained mass" <("$CTL" compact --socket "$sock" "$tmp/in.st" "$tmp/on.st" --window 8 --capacity 12 --fallback-below 0.99); then
	ok "the daemon's fallback is said so"
else
	not_ok "daemon fallback not reported"
fi
"$CTL" compact --socket "$sock" "$tmp/in.st" "$tmp/p.st" --window 8 --capacity 32 --budget heads --out-layout paged --block-size 16 >"$tmp/o" 2>"$tmp/e"
rc=$?
[ $rc -eq 2 ] && grep -q "paged" "$tmp/e" && ok "ragged + paged refused: $(cat "$tmp/e")" ||
	not_ok "ragged + paged: rc $rc $(cat "$tmp/e")"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] && ok "SIGTERM: snapkvd exits 0" || not_ok "SIGTERM: snapkvd exited $rc"

echo "test-cli-budget: $pass passed, $fail failed"
[ $fail -eq 0 ]
