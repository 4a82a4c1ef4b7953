# SPDX-License-Identifier: MIT
"""Compactions through the module: every input layout (HND, NHD, paged with a
shuffled block table) and dtype (f32, f16, bf16), numpy arrays, NHD output;
the compact K/V read through the module are byte-identical to
`snapkvctl compact --offline` on the same input."""
import os
import subprocess

import numpy as np
import pytest
import torch

from conftest import BUILD
from skvtest import place, random_inputs, st_read, st_write

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPE = dict(layers=3, h_q=8, h_kv=4, L=77, D=16, n_q=8)
PARAMS = dict(window=8, budget=24, kernel=5, pooling="avg", gqa="group")


def offline(tmp_path, q, k, v, extra=()):
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    t = {}
    for l in range(k.shape[0]):
        t[f"layers.{l}.q"], t[f"layers.{l}.k"], t[f"layers.{l}.v"] = q[l], k[l], v[l]
    st_write(src, t)
    subprocess.run([os.path.join(BUILD, "snapkvctl"), "compact", "--offline", str(src), str(dst),
                    "--window", "8", "--capacity", "24", "--kernel", "5", "--pooling", "avg",
                    "--gqa", "group", "-q", *extra], check=True)
    return st_read(dst)


def kept_view(cache, l):
    n = cache.kept
    return cache.k(l)[:, :n], cache.v(l)[:, :n], cache.positions(l)[:, :n]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
def test_offline_identical(client, tmp_path, dtype):
    q, k, v = random_inputs(dtype=dtype, **SHAPE)
    ref = offline(tmp_path, q, k, v)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    with client.compact(qs, ks, vs, **PARAMS, **kw) as c:
        assert c.kept == 24 and c.prompt_len == 77 and c.next_position == 77
        assert c.h_store == 4 and c.dtype == {torch.float32: "f32", torch.float16: "f16",
                                              torch.bfloat16: "bf16"}[dtype]
        for l in range(3):
            ck, cv, cp = kept_view(c, l)
            assert ck.dtype == dtype
            assert bytes(ck.contiguous().view(torch.uint8).numpy()) == \
                bytes(ref[f"layers.{l}.k"].contiguous().view(torch.uint8).numpy())
            assert bytes(cv.contiguous().view(torch.uint8).numpy()) == \
                bytes(ref[f"layers.{l}.v"].contiguous().view(torch.uint8).numpy())
            assert torch.equal(cp, ref[f"layers.{l}.indices"])


@pytest.mark.parametrize("layout", ["nhd", "paged"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
def test_layouts_agree(client, dtype, layout):
    """NHD and paged inputs give exactly the cache of the same data in HND."""
    q, k, v = random_inputs(dtype=dtype, seed=5, **SHAPE)
    a = place(client, q, k, v, "hnd")
    b = place(client, q, k, v, layout)
    with client.compact(*a[:3], **PARAMS, **a[3]) as ca, \
            client.compact(*b[:3], **PARAMS, **b[3]) as cb:
        for l in range(3):
            for x, y in zip(kept_view(ca, l), kept_view(cb, l)):
                assert torch.equal(x.view(torch.uint8) if x.dtype == torch.bfloat16 else x,
                                   y.view(torch.uint8) if y.dtype == torch.bfloat16 else y)


def test_kept_rows_are_input_rows(client):
    q, k, v = random_inputs(dtype=torch.float32, seed=9, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "paged", block_size=16)
    with client.compact(qs, ks, vs, **PARAMS, **kw) as c:
        for l in range(3):
            ck, cv, cp = kept_view(c, l)
            for h in range(4):
                idx = cp[h].long()
                assert torch.equal(ck[h], k[l, h, idx]) and torch.equal(cv[h], v[l, h, idx])
                assert bool((idx[1:] > idx[:-1]).all()) and int(idx[-1]) == 76


def test_expand_and_nhd_output(client):
    q, k, v = random_inputs(dtype=torch.float32, seed=2, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    p = dict(PARAMS, gqa="expand")
    with client.compact(qs, ks, vs, **p, **kw, decode_reserve=3) as a, \
            client.compact(qs, ks, vs, **p, **kw, decode_reserve=3, out_layout="nhd") as b:
        assert a.layout == "hnd" and b.layout == "nhd" and a.h_store == 8
        assert a.capacity == b.capacity == 27
        assert tuple(a.k(0).shape) == (8, 27, 16) and tuple(b.k(0).shape) == (27, 8, 16)
        n = a.kept
        assert torch.equal(a.k(1)[:, :n], b.k(1)[:n].transpose(0, 1))
        assert torch.equal(a.v(2)[:, :n], b.v(2)[:n].transpose(0, 1))
        assert torch.equal(a.positions(0), b.positions(0))
        m = a.retained_mass
        assert tuple(m.shape) == (3, 8) and bool(((m > 0) & (m <= 1.0001)).all())


def test_numpy_arrays(daemon, snapkv, tmp_path):
    """An engine without torch: numpy in, numpy out, the same bytes as offline."""
    q, k, v = random_inputs(dtype=torch.float16, seed=4, **SHAPE)
    ref = offline(tmp_path, q, k, v)
    with snapkv.Client(daemon.sock, name="numpy", arrays="numpy") as c:
        kv = c.empty((2, 3, 4, 77, 16), np.float16)
        qq = c.empty((3, 8, 8, 16), "f16")
        assert isinstance(kv, np.ndarray) and isinstance(qq, np.ndarray)
        kv[0], kv[1], qq[...] = k.numpy(), v.numpy(), q.numpy()
        with c.compact(list(qq), list(kv[0]), list(kv[1]), **PARAMS) as cache:
            for l in range(3):
                ck = cache.k(l)[:, :cache.kept]
                assert isinstance(ck, np.ndarray) and ck.dtype == np.float16
                assert ck.tobytes() == ref[f"layers.{l}.k"].numpy().tobytes()
                assert np.array_equal(cache.positions(l)[:, :cache.kept],
                                      ref[f"layers.{l}.indices"].numpy())


def test_policies_and_protect(client):
    q, k, v = random_inputs(dtype=torch.float32, seed=6, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    for pol in ["snapkv", "h2o", "streamingllm", "window"]:
        args = dict(PARAMS, policy=pol, protect=[(0, 3), (40, 42)])
        qq = qs
        if pol == "h2o":
            full = client.empty((3, 8, 77, 16), torch.float32)
            full.normal_()
            qq = list(full)
        if pol in ("streamingllm", "window"):
            qq = None
        with client.compact(qq, ks, vs, **args, **kw) as c:
            pos = c.positions(1)[:, :c.kept]
            for h in range(c.h_store):
                s = set(pos[h].tolist())
                assert {0, 1, 2, 40, 41} <= s, pol


def test_submit_wait_append_grow(client):
    q, k, v = random_inputs(dtype=torch.float32, seed=7, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    req = client.submit(qs, ks, vs, **PARAMS, **kw, decode_reserve=2)
    c = req.wait(timeout=30)
    with pytest.raises(Exception):
        req.wait()
    assert (c.kept, c.capacity, c.appended, c.next_slot, c.next_position) == (24, 26, 0, 24, 77)
    c.k(0)[:, c.next_slot] = 1.5
    c.append()
    c.append(1)
    assert c.appended == 2 and c.next_position == 79
    assert c.positions(0)[:, 24:26].tolist() == [[77, 78]] * 4
    with pytest.raises(Exception) as e:
        c.append(1)
    assert getattr(e.value, "errno", None) == 28  # ENOSPC: grow first
    c.grow(8)
    assert c.capacity == 34
    assert bool((c.k(0)[:, 24] == 1.5).all())  # the grown region kept the rows
    c.append(3)
    assert c.next_position == 82
    c.release()


def test_head_kept_and_budget_outcome(client):
    """Every (layer, head) of a uniform cache kept `kept` rows; its budget
    outcome says uniform with C* = C, no fallback, not ragged."""
    q, k, v = random_inputs(dtype=torch.float32, seed=11, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    with client.compact(qs, ks, vs, **PARAMS, **kw, decode_reserve=2) as c:
        assert c.head_kept == [[c.kept] * c.h_store for _ in range(c.layers)]
        b = c.budget_outcome
        assert b["mode"] == "uniform" and b["c_star"] == c.budget
        assert b["fallback"] is False and b["ragged"] is False
        assert b["kept_min"] == c.kept and b["kept_mean"] == float(c.kept)


@pytest.mark.parametrize("spec", ["mass-heads:0.9:9:24", "heads:0.2", "layers:20,24,12",
                                  "mass:0.9:9:24:3"])
def test_budget_modes_match_offline(client, tmp_path, spec):
    """budget='...' is snapkvctl's --budget: the same bytes as the offline
    file, head by head (ragged modes write [sum kept, D] per layer, head
    after head); a ragged cache refuses the layer-wide views."""
    q, k, v = random_inputs(dtype=torch.float32, seed=21, **SHAPE)
    ref = offline(tmp_path, q, k, v, extra=("--budget", spec))
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    with client.compact(qs, ks, vs, **dict(PARAMS, budget=(24, spec)), **kw, decode_reserve=2) as c:
        b = c.budget_outcome
        assert b["mode"] == spec.split(":")[0] and b["fallback"] is False
        assert b["ragged"] == (spec.split(":")[0] in ("layers", "heads", "mass-heads"))
        for l in range(c.layers):
            # the file: [sum kept, D] head after head, or [H, kept_l, D] when a
            # layer's heads keep one count (mass, layers)
            ragged = f"layers.{l}.kept" in ref
            counts = ref[f"layers.{l}.kept"].tolist() if ragged \
                else [ref[f"layers.{l}.k"].shape[1]] * c.h_store
            assert c.head_kept[l] == counts
            row = 0
            for h in range(c.h_store):
                n = counts[h]
                hk, hv, hp = c.k_head(l, h), c.v_head(l, h), c.positions_head(l, h)
                assert hk.shape[0] == n + 2 and hp.shape[0] == n + 2
                rk = ref[f"layers.{l}.k"][row:row + n] if ragged else ref[f"layers.{l}.k"][h]
                rv = ref[f"layers.{l}.v"][row:row + n] if ragged else ref[f"layers.{l}.v"][h]
                ri = ref[f"layers.{l}.indices"][row:row + n] if ragged \
                    else ref[f"layers.{l}.indices"][h]
                assert torch.equal(hk[:n], rk) and torch.equal(hv[:n], rv)
                assert torch.equal(hp[:n], ri) and (hp[n:] == -1).all()
                row += n
        if b["ragged"]:
            for view in (c.k, c.v, c.positions):
                with pytest.raises(OSError, match="ragged cache"):
                    view(0)


def test_budget_fallback_and_bad_budget(client):
    """A fallback keeps the whole prompt in every head; a misspelt budget and
    an out-of-range tau are refused before anything is sent."""
    q, k, v = random_inputs(dtype=torch.float32, seed=22, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    with client.compact(qs, ks, vs, **dict(PARAMS, budget=(24, "mass-heads:0.5:9:12")), **kw,
                        fallback_below=0.999) as c:
        b = c.budget_outcome
        assert b["fallback"] is True and c.head_kept == [[77] * 4] * 3
        assert torch.equal(c.positions_head(1, 2)[:77], torch.arange(77, dtype=torch.int32))
    with pytest.raises(ValueError, match="budget: \"adaptive\" is not uniform"):
        client.compact(qs, ks, vs, **dict(PARAMS, budget="adaptive"), **kw)
    with pytest.raises(OSError, match="tau = 1.5"):
        client.compact(qs, ks, vs, **dict(PARAMS, budget=(24, "mass:1.5")), **kw)
