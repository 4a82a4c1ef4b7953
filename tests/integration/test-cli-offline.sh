#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-cli-offline.sh - `snapkvctl compact --offline`: SPEC.md worked examples
# A and B end to end, random files in every dtype and GQA mode checked by an
# independent Python reader (kept sets optimal, K/V rows equal the input rows,
# byte-identical output whatever the thread count), every policy, and
# malformed files and options: exit 2, one line on stderr, OUT untouched, no
# temporary file left.
set -u
BUILD=${BUILD:-build}
CTL=$BUILD/snapkvctl
GEN=$BUILD/examples/gen-layer
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test-cli-offline.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../tally.sh"

# ---- an independent safetensors reader and checker (standard library only) ----
cat >"$tmp/st.py" <<'PY'
import json, math, struct, sys

def write(path, tensors, meta=None, raw_header=None, hlen=None, cut=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    hdr, data = {}, b""
    for name, dt, shape, b in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    if meta is not None:
        hdr["__metadata__"] = meta
    h = raw_header if raw_header is not None else json.dumps(hdr).encode()
    blob = struct.pack("<Q", len(h) if hlen is None else hlen) + h + data
    with open(path, "wb") as f:
        f.write(blob if cut is None else blob[:cut])

def read(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", b, 0)
    hdr = json.loads(b[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, t in hdr.items():
        s, e = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], b[base + s:base + e])
    return out, meta

SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4}

def decode(dt, b):
    n = len(b) // SIZE[dt]
    if dt == "F32":
        return list(struct.unpack("<%df" % n, b))
    if dt == "F16":
        return list(struct.unpack("<%de" % n, b))
    if dt == "I32":
        return list(struct.unpack("<%di" % n, b))
    return [struct.unpack("<f", struct.pack("<I", u << 16))[0]
            for u in struct.unpack("<%dH" % n, b)]

def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)

def example(which, path):
    """SPEC.md worked examples A and B: k_j = [ln w_row0_j, ln w_row1_j]."""
    r2 = math.sqrt(2.0)
    if which == "A":
        w0 = [1, 2, 10, 8, 1, 1, 2, 1]  # query 6; position 7 masked, any value
        w1 = [1, 1, 8, 12, 1, 1, 1, 1]  # query 7
    else:
        w0 = [9, 1, 90, 1]  # query 2; position 3 masked
        w1 = [9, 27, 2, 2]  # query 3
    L = len(w0)
    k = []
    for j in range(L):
        k += [math.log(w0[j]), math.log(w1[j])]
    v = []
    for j in range(L):
        v += [float(j), 100.0 + j]
    write(path, [("layers.0.q", "F32", [1, 2, 2], f32([r2, 0.0, 0.0, r2])),
                 ("layers.0.k", "F32", [1, L, 2], f32(k)),
                 ("layers.0.v", "F32", [1, L, 2], f32(v))])

def hf_layout(path):
    """What the reference safetensors library demands of a file: tensors
    back to back from offset 0 to the end of the data, no gaps. Ours also
    pads the header to 8 bytes and aligns every tensor to its element size."""
    b = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", b, 0)
    assert n % 8 == 0, "header length %d not a multiple of 8" % n
    hdr = json.loads(b[8:8 + n])
    hdr.pop("__metadata__", None)
    spans = sorted((t["data_offsets"][0], t["data_offsets"][1], t["dtype"]) for t in hdr.values())
    pos = 0
    for s, e, dt in spans:
        assert s == pos, "gap or overlap at %d" % s
        assert s % SIZE[dt] == 0, "misaligned %s at %d" % (dt, s)
        pos = e
    assert pos == len(b) - 8 - n, "data area %d, tensors end at %d" % (len(b) - 8 - n, pos)

def check_example(out_path, want, want_mass):
    hf_layout(out_path)
    t, meta = read(out_path)
    idx = decode("I32", t["layers.0.indices"][2])
    assert idx == want, "kept %s, want %s" % (idx, want)
    v = decode("F32", t["layers.0.v"][2])
    assert v == sum(([float(j), 100.0 + j] for j in want), []), "V rows %s" % v
    m = decode("F32", t["layers.0.retained_mass"][2])[0]
    assert abs(m - want_mass) < 1e-4, "retained mass %f, want %f" % (m, want_mass)
    assert t["layers.0.indices"][1] == [1, len(want)]

def softmax_rows(qrows, k, L, D, pos0):
    """Full causal softmax a[t][j] of query rows at positions pos0.."""
    rows = []
    for t, qv in enumerate(qrows):
        p = pos0 + t
        z = [sum(qv[d] * k[j][d] for d in range(D)) / math.sqrt(D) for j in range(p + 1)]
        mx = max(z)
        e = [math.exp(x - mx) for x in z]
        s = sum(e)
        rows.append([x / s for x in e] + [0.0] * (L - p - 1))
    return rows

def check_roundtrip(in_path, out_path, W, C, K, pooling, gqa):
    W, C, K = int(W), int(C), int(K)
    hf_layout(out_path)
    ti, _ = read(in_path)
    to, meta = read(out_path)
    layers = len([n for n in ti if n.endswith(".k")])
    assert len(to) == 4 * layers, "OUT has %d tensors" % len(to)
    assert meta["format"] == "snapkv-compact" and meta["gqa"] == gqa
    for l in range(layers):
        qdt, (h_q, rows, D), qb = ti["layers.%d.q" % l]
        kdt, (h_kv, L, _), kb = ti["layers.%d.k" % l]
        _, _, vb = ti["layers.%d.v" % l]
        G = h_q // h_kv
        hs = h_q if gqa == "expand" else h_kv
        kept = min(L, C)
        es = SIZE[kdt]
        for nm in ("k", "v"):
            dt, shape, _ = to["layers.%d.%s" % (l, nm)]
            assert dt == kdt and shape == [hs, kept, D], (nm, dt, shape)
        assert to["layers.%d.indices" % l][:2] == ("I32", [hs, kept])
        assert to["layers.%d.retained_mass" % l][:2] == ("F32", [hs])
        idx = decode("I32", to["layers.%d.indices" % l][2])
        mass = decode("F32", to["layers.%d.retained_mass" % l][2])
        q = decode(qdt, qb)
        kf = decode(kdt, kb)
        okb, ovb = to["layers.%d.k" % l][2], to["layers.%d.v" % l][2]
        P = L - W
        for h in range(hs):
            sel = idx[h * kept:(h + 1) * kept]
            assert all(a < b for a, b in zip(sel, sel[1:])), "not ascending: %s" % sel
            assert 0 <= sel[0] and sel[-1] < L
            assert set(range(P, L)) <= set(sel), "window missing"
            kvh = h // G if gqa == "expand" else h
            rb = D * es
            for i, j in enumerate(sel):
                src = (kvh * L + j) * rb
                dst = (h * kept + i) * rb
                assert okb[dst:dst + rb] == kb[src:src + rb], "K row %d/%d" % (h, j)
                assert ovb[dst:dst + rb] == vb[src:src + rb], "V row %d/%d" % (h, j)
            # Optimality with a rounding margin: every kept prefix position
            # scores at least as high as every dropped one.
            k_rows = [kf[(kvh * L + j) * D:(kvh * L + j + 1) * D] for j in range(L)]
            qheads = [h] if gqa == "expand" else list(range(h * G, (h + 1) * G))
            votes = [0.0] * P
            m = 0.0
            keep = set(sel)
            for qh in qheads:
                qr = [q[((qh * rows) + t) * D:((qh * rows) + t + 1) * D]
                      for t in range(rows - W, rows)]
                a = softmax_rows(qr, k_rows, L, D, L - W)
                for row in a:
                    for j in range(P):
                        votes[j] += row[j] / len(qheads)
                    m += sum(row[j] for j in keep)
            m /= W * len(qheads)
            assert abs(m - mass[h]) < 2e-3, "mass %f vs %f" % (mass[h], m)
            half = K // 2
            pooled = []
            for j in range(P):
                nb = [votes[x] for x in range(j - half, j + half + 1) if 0 <= x < P]
                pooled.append(sum(nb) / K if pooling == "avg" else max(nb))
            kept_sc = [pooled[j] for j in sel if j < P]
            drop_sc = [pooled[j] for j in range(P) if j not in keep]
            if kept_sc and drop_sc:
                assert min(kept_sc) >= max(drop_sc) - 2e-3 * max(drop_sc) - 1e-6, \
                    "head %d: kept score %g < dropped %g" % (h, min(kept_sc), max(drop_sc))

def check_set(out_path, want):
    t, meta = read(out_path)
    want = [int(x) for x in want.split(",")] if want else []
    for name, (dt, shape, b) in t.items():
        if name.endswith(".indices"):
            idx = decode("I32", b)
            for h in range(shape[0]):
                got = idx[h * shape[1]:(h + 1) * shape[1]]
                assert got == want, "%s head %d: %s != %s" % (name, h, got, want)

def contains(out_path, lo, hi):
    t, _ = read(out_path)
    for name, (dt, shape, b) in t.items():
        if name.endswith(".indices"):
            idx = decode("I32", b)
            for h in range(shape[0]):
                got = set(idx[h * shape[1]:(h + 1) * shape[1]])
                assert set(range(int(lo), int(hi))) <= got, "%s head %d" % (name, h)

def bad(kind, path, good):
    """Malformed inputs, derived from a valid file where that helps."""
    t, _ = read(good)
    ts = [(n, dt, s, b) for n, (dt, s, b) in sorted(t.items())]
    blob = open(good, "rb").read()
    if kind == "empty":
        open(path, "wb").close()
    elif kind == "short-length":
        open(path, "wb").write(blob[:5])
    elif kind == "cut-header":
        open(path, "wb").write(blob[:100])
    elif kind == "cut-data":
        open(path, "wb").write(blob[:-10])
    elif kind == "length-past-eof":
        write(path, ts, hlen=1 << 20)
    elif kind == "length-huge":
        write(path, ts, hlen=1 << 62)
    elif kind == "bad-json":
        write(path, ts, raw_header=b'{"layers.0.k": {"dtype": "F32", ')
    elif kind == "not-object":
        write(path, ts, raw_header=b'[1, 2, 3]')
    elif kind == "f64":
        ts = [(n, "F64" if n == "layers.0.k" else dt, s, b) for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "shape-lie":
        ts = [(n, dt, [s[0], s[1] + 1, s[2]] if n == "layers.1.v" else s, b)
              for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "negative":
        ts = [(n, dt, [-s[0], s[1], s[2]] if n == "layers.0.q" else s, b) for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "offsets-past-end":
        h = json.loads(blob[8:8 + struct.unpack_from("<Q", blob)[0]])
        h["layers.1.v"]["data_offsets"][1] += 1 << 40
        h["layers.1.v"]["data_offsets"][0] += 1 << 40
        hb = json.dumps(h).encode()
        n = struct.unpack_from("<Q", blob)[0]
        open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + blob[8 + n:])
    elif kind == "overlap":
        h = json.loads(blob[8:8 + struct.unpack_from("<Q", blob)[0]])
        h["layers.1.v"]["data_offsets"] = list(h["layers.1.k"]["data_offsets"])
        hb = json.dumps(h).encode()
        n = struct.unpack_from("<Q", blob)[0]
        open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + blob[8 + n:])
    elif kind == "layer-gap":
        ts = [(n.replace("layers.1.", "layers.2."), dt, s, b) for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "missing-v":
        write(path, [x for x in ts if x[0] != "layers.1.v"])
    elif kind == "no-q":
        write(path, [x for x in ts if not x[0].endswith(".q")])
    elif kind == "missing-q":
        write(path, [x for x in ts if x[0] != "layers.1.q"])
    elif kind == "kv-mismatch":
        ts = [(n, dt, s, b[:len(b) // 2]) if n == "layers.1.v" else (n, dt, s, b)
              for n, dt, s, b in ts]
        ts = [(n, dt, [s[0] // 2, s[1], s[2]] if n == "layers.1.v" else s, b)
              for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "q-dim":
        ts = [(n, dt, [s[0], s[1] * 2, s[2] // 2] if n.endswith(".q") else s, b)
              for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "stray":
        write(path, ts + [("lm_head", "F32", [1], f32([0.0]))])
    elif kind == "i32-kv":
        ts = [(n, "I32" if n.endswith(".k") or n.endswith(".v") else dt, s, b)
              for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "rank2":
        ts = [(n, dt, [s[0] * s[1], s[2]] if n.endswith(".k") else s, b) for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "hq-not-multiple":
        # 1 query head over 2 K/V heads, same bytes.
        ts = [(n, dt, [1, s[1] * s[0], s[2]] if n.endswith(".q") else s, b)
              for n, dt, s, b in ts]
        write(path, ts)
    elif kind == "mixed-dtype":
        ts = [(n, "F16", s, b[:len(b) // 2]) if n == "layers.1.k" else (n, dt, s, b)
              for n, dt, s, b in ts]
        write(path, ts)
    else:
        raise SystemExit("unknown kind " + kind)

def check_json(st_path, json_path):
    """snapkvctl inspect --json agrees with this reader."""
    t, meta = read(st_path)
    j = json.load(open(json_path))
    assert j["metadata"] == meta, "metadata differs"
    got = {x["name"]: (x["dtype"], x["shape"], x["bytes"]) for x in j["tensors"]}
    want = {n: (dt, s, len(b)) for n, (dt, s, b) in t.items()}
    assert got == want, "tensors differ"

def check_paged(dense_path, paged_path, bs):
    """--out-layout paged holds the dense file's rows in blocks, the rest zero."""
    bs = int(bs)
    d, dm = read(dense_path)
    p, pm = read(paged_path)
    assert pm["out_layout"] == "paged" and pm["block_size"] == str(bs), "metadata"
    assert {k: v for k, v in pm.items() if k not in ("out_layout", "block_size")} == dm
    for name, (dt, shape, b) in d.items():
        pdt, pshape, pb = p[name]
        if not (name.endswith(".k") or name.endswith(".v")):
            assert (pdt, pshape, pb) == (dt, shape, b), name
            continue
        hs, kept, hd = shape
        es = len(b) // (hs * kept * hd)
        row = hd * es
        assert pshape == [(kept + bs - 1) // bs, bs, hs, hd], name + " shape"
        for h in range(hs):
            for i in range(kept):
                at = ((i // bs) * bs * hs + (i % bs) * hs + h) * row
                assert pb[at:at + row] == b[(h * kept + i) * row:(h * kept + i + 1) * row], name
        tail = pb[kept * hs * row:]
        assert tail == bytes(len(tail)), name + " tail"

def evil(path):
    """A valid file whose names and metadata carry terminal escapes."""
    write(path, [("x\x1b[2Jy", "F32", [1], f32([1.0]))], meta={"k\x07": "v\x1b]0;t\x07"})

if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    try:
        {"example": example, "check-example": lambda p, w, m: check_example(
            p, [int(x) for x in w.split(",")], float(m)),
         "check-roundtrip": check_roundtrip, "check-set": check_set,
         "contains": contains, "bad": bad, "check-json": check_json, "evil": evil,
         "check-paged": check_paged}[cmd](*args)
    except AssertionError as e:
        print("check failed:", e, file=sys.stderr)
        sys.exit(1)
PY
py() { python3 "$tmp/st.py" "$@"; }

# ---- 1. SPEC.md worked examples ----
echo "== worked examples"
py example A "$tmp/a.st"
if "$CTL" compact --offline "$tmp/a.st" "$tmp/a.out" --window 2 --capacity 5 --kernel 3 \
	--pooling avg -q && py check-example "$tmp/a.out" 2,3,4,6,7 0.862308; then
	ok "A: pooling changes the winner: kept [2, 3, 4, 6, 7], mass 21/50 + 23/52"
else
	not_ok "A"
fi
py example B "$tmp/b.st"
if "$CTL" compact --offline "$tmp/b.st" "$tmp/b.out" --window 2 --capacity 3 --kernel 1 -q &&
	py check-example "$tmp/b.out" 1,2,3 0.8425; then
	ok "B: full-softmax denominator: kept [1, 2, 3], mass (0.91 + 0.775) / 2"
else
	not_ok "B"
fi

echo "== inspect"
"$CTL" inspect "$tmp/a.out" --show 1 >"$tmp/insp" 2>&1
if grep -q '^  head 0 kept: 2-4, 6-7$' "$tmp/insp" && grep -q 'layers.0.indices  *I32  *\[1, 5\]' "$tmp/insp" &&
	grep -q 'retained mass min 0.8623' "$tmp/insp"; then
	ok "inspect: kept ranges, tensor list and retained mass of example A"
else
	not_ok "inspect: $(cat "$tmp/insp")"
fi
if "$CTL" inspect --json "$tmp/a.out" >"$tmp/a.json" && py check-json "$tmp/a.out" "$tmp/a.json"; then
	ok "inspect --json agrees with an independent reader"
else
	not_ok "inspect --json"
fi
py evil "$tmp/evil.st"
"$CTL" inspect "$tmp/evil.st" >"$tmp/insp" 2>&1
rc=$?
if [ $rc -eq 0 ] && ! grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$tmp/insp"; then
	ok "inspect: no control bytes from the file reach the terminal"
else
	not_ok "inspect of escape-laden names: rc $rc"
fi

# ---- 2. random files: every dtype, both GQA modes, both poolings ----
echo "== random files"
seed=1
for dt in f32 f16 bf16; do
	for gqa in expand group; do
		for pool in avg max; do
			seed=$((seed + 1))
			in=$tmp/r-$dt-$gqa-$pool.st
			"$GEN" "$in" --layers 2 --h-q 4 --h-kv 2 --head-dim 16 --len 80 --rows 8 \
				--spans 2 --dtype "$dt" --seed $seed --quiet
			args=(--window 6 --capacity 30 --kernel 3 --pooling $pool --gqa $gqa -q)
			if "$CTL" compact --offline "$in" "$tmp/o1.st" "${args[@]}" --threads 1 &&
				"$CTL" compact --offline "$in" "$tmp/o2.st" "${args[@]}" --threads 2 &&
				cmp -s "$tmp/o1.st" "$tmp/o2.st" &&
				py check-roundtrip "$in" "$tmp/o1.st" 6 30 3 $pool $gqa; then
				ok "$dt $gqa $pool: shapes, rows, optimal kept sets, 1 vs 2 threads identical"
			else
				not_ok "$dt $gqa $pool"
			fi
		done
	done
done

# ---- 3. policies, bypass, protected ranges ----
echo "== policies"
in=$tmp/p.st
"$GEN" "$in" --layers 1 --h-q 4 --h-kv 2 --head-dim 8 --len 48 --rows 48 --spans 2 --quiet
seq_csv() { seq -s, "$@"; }
if "$CTL" compact --offline "$in" "$tmp/p.out" --policy streamingllm --sinks 3 --capacity 20 -q &&
	py check-set "$tmp/p.out" "0,1,2,$(seq_csv 31 47)"; then
	ok "streamingllm S 3 C 20: sinks + last 17"
else
	not_ok "streamingllm"
fi
if "$CTL" compact --offline "$in" "$tmp/p.out" --policy window --capacity 20 -q &&
	py check-set "$tmp/p.out" "$(seq_csv 28 47)"; then
	ok "window C 20: last 20"
else
	not_ok "window"
fi
if "$CTL" compact --offline "$in" "$tmp/p.out" --capacity 60 --window 4 -q &&
	py check-set "$tmp/p.out" "$(seq_csv 0 47)"; then
	ok "bypass: L 48 < C 60 keeps everything in order"
else
	not_ok "bypass"
fi
if "$CTL" compact --offline "$in" "$tmp/p.out" --policy h2o --window 4 --capacity 16 -q &&
	py contains "$tmp/p.out" 44 48; then
	ok "h2o (all 48 query rows): runs, recent 4 kept"
else
	not_ok "h2o"
fi
if "$CTL" compact --offline "$in" "$tmp/p.out" --window 4 --capacity 16 --protect 10:15 \
	--protect 20:21 -q && py contains "$tmp/p.out" 10 15 && py contains "$tmp/p.out" 20 21; then
	ok "--protect 10:15 --protect 20:21 (half-open) kept on every head"
else
	not_ok "protect"
fi

# ---- 4. malformed files and bad options ----
echo "== malformed input"
good=$tmp/good.st
"$GEN" "$good" --layers 2 --h-q 4 --h-kv 2 --head-dim 8 --len 40 --rows 8 --spans 1 --dtype f32 \
	--quiet
mkdir -p "$tmp/o"
# expect_usage NAME IN [options...]: exit 2, one line "snapkvctl compact: ...",
# the sentinel OUT untouched, nothing else in the output directory.
expect_usage() {
	local name=$1 in=$2
	shift 2
	echo sentinel >"$tmp/o/out.st"
	"$CTL" compact --offline "$in" "$tmp/o/out.st" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
	local rc=$?
	local lines
	lines=$(wc -l <"$tmp/stderr")
	if [ $rc -eq 2 ] && [ "$lines" -eq 1 ] && grep -q '^snapkvctl compact: ' "$tmp/stderr" &&
		[ "$(cat "$tmp/o/out.st")" = sentinel ] && [ "$(ls -A "$tmp/o" | wc -l)" -eq 1 ] &&
		[ ! -s "$tmp/stdout" ]; then
		ok "$name: $(cat "$tmp/stderr")"
	else
		not_ok "$name: rc $rc, stderr: $(head -c 300 "$tmp/stderr")"
	fi
}
expect_usage "missing file" "$tmp/nonexistent.st"
expect_usage "directory" "$tmp/o"
for kind in empty short-length cut-header cut-data length-past-eof length-huge bad-json \
	not-object f64 shape-lie negative offsets-past-end overlap layer-gap missing-v missing-q \
	kv-mismatch q-dim stray i32-kv rank2 hq-not-multiple mixed-dtype; do
	py bad $kind "$tmp/bad-$kind.st" "$good"
	expect_usage "$kind" "$tmp/bad-$kind.st" --window 4 --capacity 16
done
py bad no-q "$tmp/noq.st" "$good"
expect_usage "--window abc" "$good" --window abc
expect_usage "--window 8x" "$good" --window 8x
expect_usage "--window -1" "$good" --window -1
expect_usage "--window ' 8'" "$good" --window ' 8'
expect_usage "--capacity 2^32" "$good" --capacity 4294967296
expect_usage "--capacity 10^20" "$good" --capacity 100000000000000000000
expect_usage "--pooling foo" "$good" --pooling foo
expect_usage "--gqa foo" "$good" --gqa foo
expect_usage "--policy foo" "$good" --policy foo
expect_usage "--protect 5:3" "$good" --protect 5:3
expect_usage "--protect 5" "$good" --protect 5
expect_usage "--protect 1:2:3" "$good" --protect 1:2:3
expect_usage "--threads 5000" "$good" --threads 5000
expect_usage "--bogus" "$good" --bogus
expect_usage "--window without value" "$good" --window
expect_usage "even kernel" "$good" --window 4 --capacity 16 --kernel 4
expect_usage "C <= W" "$good" --window 8 --capacity 8
# fewer q rows (8) than W: a partial window (SPEC.md), W' = 8, even when W > L
for w in 9 41; do
	if "$CTL" compact --offline "$good" "$tmp/o/partial.st" --window $w --capacity 60 -q \
		2>"$tmp/stderr"; then
		ok "W = $w > q rows: a partial window"
	else
		not_ok "W = $w > q rows: $(head -c 300 "$tmp/stderr")"
	fi
	rm -f "$tmp/o/partial.st"
done
expect_usage "h2o without all query rows" "$good" --policy h2o --window 4 --capacity 16
expect_usage "snapkv without q" "$tmp/noq.st" --window 4 --capacity 16
expect_usage "protected + W > C" "$good" --window 4 --capacity 16 --protect 0:13
if "$CTL" compact --offline "$tmp/noq.st" "$tmp/noq.out" --policy window --capacity 16 -q &&
	py check-set "$tmp/noq.out" "$(seq_csv 24 39)"; then
	ok "window policy on a file without q"
else
	not_ok "window policy on a file without q"
fi
echo sentinel >"$tmp/o/out.st"
"$CTL" compact --socket "$tmp/no-daemon.sock" "$good" "$tmp/o/out.st" --window 4 --capacity 16 \
	>/dev/null 2>"$tmp/stderr"
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l <"$tmp/stderr")" -eq 1 ] && [ "$(cat "$tmp/o/out.st")" = sentinel ] &&
	[ "$(ls -A "$tmp/o" | wc -l)" -eq 1 ] && ok "no daemon: exit 1, $(cat "$tmp/stderr")" ||
	not_ok "no daemon: rc $rc $(cat "$tmp/stderr")"
expect_usage "--offline with --socket" "$good" --socket "$tmp/s.sock"
"$CTL" compact --offline "$good" >/dev/null 2>"$tmp/stderr"
rc=$?
[ $rc -eq 2 ] && ok "missing OUT: $(cat "$tmp/stderr")" || not_ok "missing OUT: rc $rc"
"$CTL" inspect "$tmp/bad-offsets-past-end.st" >/dev/null 2>"$tmp/stderr"
rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$tmp/stderr")" -eq 1 ] && ok "inspect malformed: $(cat "$tmp/stderr")" ||
	not_ok "inspect malformed: rc $rc"
"$CTL" frobnicate >/dev/null 2>&1
[ $? -eq 2 ] && ok "unknown command: exit 2" || not_ok "unknown command"
"$CTL" compact --offline "$good" "$tmp/nodir/out.st" --window 4 --capacity 16 -q 2>"$tmp/stderr"
rc=$?
[ $rc -ne 0 ] && [ ! -e "$tmp/nodir" ] && ok "OUT in a missing directory: rc $rc, $(cat "$tmp/stderr")" ||
	not_ok "OUT in a missing directory: rc $rc"

# ---- 5. valgrind on a few cases, when installed ----
if command -v valgrind >/dev/null 2>&1; then
	echo "== valgrind"
	vg=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite)
	for kind in offsets-past-end bad-json f64; do
		"${vg[@]}" "$CTL" compact --offline "$tmp/bad-$kind.st" "$tmp/o/vg.st" 2>"$tmp/vg.err"
		rc=$?
		[ $rc -eq 2 ] && ok "valgrind $kind: clean, exit 2" || not_ok "valgrind $kind: rc $rc $(head -c 500 "$tmp/vg.err")"
	done
	"${vg[@]}" "$CTL" compact --offline "$good" "$tmp/o/vg.st" --window 4 --capacity 16 --threads 2 -q \
		2>"$tmp/vg.err"
	rc=$?
	[ $rc -eq 0 ] && ok "valgrind success path: clean" || not_ok "valgrind success: rc $rc $(head -c 500 "$tmp/vg.err")"
	"${vg[@]}" "$CTL" inspect --show 1 "$tmp/a.out" >/dev/null 2>"$tmp/vg.err" &&
		"${vg[@]}" "$CTL" inspect --json "$tmp/a.out" >/dev/null 2>>"$tmp/vg.err"
	rc=$?
	[ $rc -eq 0 ] && ok "valgrind inspect: clean" || not_ok "valgrind inspect: rc $rc $(head -c 500 "$tmp/vg.err")"
fi

echo "== paged output"
"$GEN" "$tmp/pg.st" --layers 2 --h-q 4 --h-kv 2 --head-dim 16 --len 80 --rows 8 --dtype bf16 \
	--seed 5 --quiet
for bs in 1 7 16 64; do
	if "$CTL" compact --offline "$tmp/pg.st" "$tmp/pg-d.st" -q --window 6 --capacity 30 \
		--gqa group 2>"$tmp/err" &&
		"$CTL" compact --offline "$tmp/pg.st" "$tmp/pg-p.st" -q --window 6 --capacity 30 \
			--gqa group --out-layout paged --block-size $bs 2>>"$tmp/err" &&
		py check-paged "$tmp/pg-d.st" "$tmp/pg-p.st" $bs 2>>"$tmp/err"; then
		ok "--out-layout paged --block-size $bs: the dense rows in blocks, the rest zero"
	else
		not_ok "paged $bs: $(cat "$tmp/err")"
	fi
done
for bad in "--out-layout paged" "--block-size 16" "--out-layout paged --block-size 0" \
	"--out-layout paged --block-size 4097" "--out-layout nhd --block-size 4"; do
	# shellcheck disable=SC2086
	"$CTL" compact --offline "$tmp/pg.st" "$tmp/pg-x.st" -q --window 6 --capacity 30 $bad \
		2>"$tmp/err"
	rc=$?
	[ $rc -eq 2 ] && [ ! -e "$tmp/pg-x.st" ] && ok "refused ($bad): $(head -1 "$tmp/err")" ||
		not_ok "$bad: rc $rc"
done

echo "test-cli-offline: $pass passed, $fail failed"
[ $fail -eq 0 ]
