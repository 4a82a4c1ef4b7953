# SPDX-License-Identifier: MIT
"""fp8 K/V (SPEC.md "Quantized K/V"): uint8 tensors of e4m3fn or e5m2 bytes
named by kv_dtype, with per-layer scales, compact to the positions of the
same keys dequantized (s * byte in fp32) and given as f32, and the cache
holds the input's bytes at those positions, in its dtype, with its scales;
what fp8 may not be is refused. On main the uint8 tensors, kv_dtype and
kv_scales were all refused."""
import errno
import json
import math
import os
import struct
import subprocess

import numpy as np
import pytest
import torch

from conftest import BUILD

LAYERS, H_Q, H_KV, L, D, N_Q = 2, 8, 4, 70, 16, 8
SCALES = [(0.0371, 0.5), (2.7, 0.31)]


def decode(fmt, b):
    """The value of fp8 byte b, from the format's definition."""
    e4 = fmt == "f8e4m3fn"
    mb, bias = (3, 7) if e4 else (2, 15)
    e, m = (b & 0x7f) >> mb, b & ((1 << mb) - 1)
    if e4 and e == 15 and m == 7:
        v = math.nan
    elif not e4 and e == 31:
        v = math.nan if m else math.inf
    elif e == 0:
        v = m * 2.0 ** (1 - bias - mb)
    else:
        v = ((1 << mb) + m) * 2.0 ** (e - bias - mb)
    return -v if b & 0x80 else v


def finite_bytes(fmt, shape, g):
    b = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    return b & (0xf7 if fmt == "f8e4m3fn" else 0xfb)  # no NaN/inf codes


def inputs(client, fmt, seed=5):
    g = torch.Generator().manual_seed(seed)
    qs, ks, vs, kd, vd = [], [], [], [], []
    table = torch.tensor([decode(fmt, b) for b in range(256)], dtype=torch.float32)
    for l in range(LAYERS):
        q = client.empty((H_Q, N_Q, D), torch.float32)
        q.copy_(torch.randn(H_Q, N_Q, D, generator=g))
        k, v = client.empty((H_KV, L, D), fmt), client.empty((H_KV, L, D), fmt)
        assert k.dtype == torch.uint8 or k.element_size() == 1
        k.copy_(finite_bytes(fmt, (H_KV, L, D), g))
        v.copy_(finite_bytes(fmt, (H_KV, L, D), g))
        # the same keys as f32: s * byte, one fp32 rounding
        fk = client.empty((H_KV, L, D), torch.float32)
        fk.copy_(table[k.long()] * torch.tensor(SCALES[l][0], dtype=torch.float32))
        qs.append(q), ks.append(k), vs.append(v), kd.append(fk)
    return qs, ks, vs, kd


@pytest.mark.parametrize("fmt", ["f8e4m3fn", "f8e5m2"])
@pytest.mark.parametrize("gqa", ["group", "expand"])
def test_fp8_positions_and_bytes(client, fmt, gqa):
    qs, ks, vs, kd = inputs(client, fmt)
    P = dict(window=N_Q, budget=24, gqa=gqa)
    with client.compact(qs, ks, vs, kv_dtype=fmt, kv_scales=SCALES, **P) as c, \
            client.compact(qs, kd, kd, **P) as ref:
        assert c.dtype == fmt and c.kept == 24
        for (a, b), (x, y) in zip(c.kv_scales, SCALES):
            assert a == pytest.approx(x, rel=1e-7) and b == pytest.approx(y, rel=1e-7)
        G = H_Q // H_KV
        for l in range(LAYERS):
            pos = c.positions(l)[:, :24]
            assert torch.equal(pos, ref.positions(l)[:, :24])
            ck, cv = c.k(l)[:, :24], c.v(l)[:, :24]
            for h in range(c.h_store):
                kvh = h if gqa == "group" else h // G
                idx = pos[h].long()
                assert torch.equal(ck[h].view(torch.uint8), ks[l][kvh][idx].view(torch.uint8))
                assert torch.equal(cv[h].view(torch.uint8), vs[l][kvh][idx].view(torch.uint8))


def test_fp8_refusals(client, snapkv):
    qs, ks, vs, _ = inputs(client, "f8e4m3fn")
    P = dict(window=N_Q, budget=24)
    with pytest.raises(TypeError, match="kv_dtype"):
        client.compact(qs, ks, vs, **P)
    with pytest.raises(TypeError, match="kv_scales"):
        client.compact(qs, ks, vs, kv_dtype="f8e4m3fn", **P)
    with pytest.raises(ValueError):
        client.compact(qs, ks, vs, kv_dtype="f8e4m3", kv_scales=(1.0, 1.0), **P)
    with pytest.raises(ValueError, match="queries stay"):
        client.compact(ks, ks, vs, kv_dtype="f8e4m3fn", kv_scales=(1.0, 1.0), **P)
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, kv_dtype="f8e4m3fn", kv_scales=[(1.0, 1.0), (0.0, 1.0)], **P)
    assert e.value.errno == errno.EINVAL and "finite and above 0" in str(e.value)
    ks[1][2, 40, 3] = 0x7f  # NaN
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, kv_dtype="f8e4m3fn", kv_scales=SCALES, **P)
    assert e.value.errno == errno.EDOM


def st_write_raw(path, tensors):
    """tensors: name -> (safetensors dtype, shape, bytes)."""
    header, blobs, off = {}, [], 0
    for name, (dt, shape, b) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read_raw(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {k: (d["dtype"], d["shape"], data[8 + n + d["data_offsets"][0]:8 + n + d["data_offsets"][1]])
            for k, d in header.items() if k != "__metadata__"}


@pytest.mark.parametrize("fmt,st", [("f8e4m3fn", "F8_E4M3"), ("f8e5m2", "F8_E5M2")])
def test_snapkvctl_fp8(daemon, tmp_path, fmt, st):
    """snapkvctl compact takes F8_E4M3/F8_E5M2 K/V with layers.N.k_scale and
    .v_scale, offline and through the daemon alike, keeping the input's bytes
    at the positions of the same keys dequantized to F32."""
    g = torch.Generator().manual_seed(9)
    table = torch.tensor([decode(fmt, b) for b in range(256)], dtype=torch.float32)
    f8, f32 = {}, {}
    for l in range(LAYERS):
        q = torch.randn(H_Q, N_Q, D, generator=g)
        k, v = finite_bytes(fmt, (H_KV, L, D), g), finite_bytes(fmt, (H_KV, L, D), g)
        sk, sv = (torch.tensor([x], dtype=torch.float32) for x in SCALES[l])
        f8[f"layers.{l}.q"] = f32[f"layers.{l}.q"] = ("F32", q.shape, q.numpy().tobytes())
        f8[f"layers.{l}.k"] = (st, k.shape, k.numpy().tobytes())
        f8[f"layers.{l}.v"] = (st, v.shape, v.numpy().tobytes())
        f8[f"layers.{l}.k_scale"] = ("F32", [1], sk.numpy().tobytes())
        f8[f"layers.{l}.v_scale"] = ("F32", [1], sv.numpy().tobytes())
        deq = (table[k.long()] * sk).numpy().tobytes()
        f32[f"layers.{l}.k"] = f32[f"layers.{l}.v"] = ("F32", k.shape, deq)
    st_write_raw(tmp_path / "f8.st", f8)
    st_write_raw(tmp_path / "f32.st", f32)
    ctl = os.path.join(BUILD, "snapkvctl")
    args = ["--window", str(N_Q), "--capacity", "24", "--gqa", "group", "-q"]
    env = dict(os.environ, SNAPKV_SOCKET=daemon.sock)
    for src, dst, extra in [("f8.st", "off.st", ["--offline"]), ("f8.st", "on.st", []),
                            ("f32.st", "ref.st", ["--offline"])]:
        subprocess.run([ctl, "compact", *extra, str(tmp_path / src), str(tmp_path / dst), *args],
                       check=True, env=env)
    off, on, ref = (st_read_raw(tmp_path / n) for n in ("off.st", "on.st", "ref.st"))
    assert off == on
    for l in range(LAYERS):
        assert off[f"layers.{l}.k"][0] == st
        assert off[f"layers.{l}.indices"] == ref[f"layers.{l}.indices"]
        assert off[f"layers.{l}.k_scale"][2] == f8[f"layers.{l}.k_scale"][2]
        assert off[f"layers.{l}.v_scale"][2] == f8[f"layers.{l}.v_scale"][2]
        pos = np.frombuffer(off[f"layers.{l}.indices"][2], dtype=np.int32).reshape(H_KV, 24)
        k = np.frombuffer(f8[f"layers.{l}.k"][2], dtype=np.uint8).reshape(H_KV, L, D)
        got = np.frombuffer(off[f"layers.{l}.k"][2], dtype=np.uint8).reshape(H_KV, 24, D)
        for h in range(H_KV):
            assert (got[h] == k[h][pos[h]]).all()
    # a missing scale is refused by name
    del f8["layers.1.v_scale"]
    st_write_raw(tmp_path / "bad.st", f8)
    r = subprocess.run([ctl, "compact", "--offline", str(tmp_path / "bad.st"),
                        str(tmp_path / "x.st"), *args], capture_output=True, text=True)
    assert r.returncode != 0 and "layers.1.v_scale" in r.stderr
