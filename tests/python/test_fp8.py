# SPDX-License-Identifier: MIT
"""fp8 K/V (SPEC.md "Quantized K/V"): uint8 tensors of e4m3fn or e5m2 bytes
named by kv_dtype, with per-layer scales, compact to the positions of the
same keys dequantized (s * byte in fp32) and given as f32, and the cache
holds the input's bytes at those positions, in its dtype, with its scales;
what fp8 may not be is refused. On main the uint8 tensors, kv_dtype and
kv_scales were all refused."""
import errno
import math

import numpy as np
import pytest
import torch

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
