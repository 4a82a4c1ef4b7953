# SPDX-License-Identifier: MIT
"""A partial window (SPEC.md): a q with n_q < window rows is compacted with
W' = n_q in place of W everywhere, so it keeps exactly the bytes of the same
rows given as a full window of n_q; fewer rows than min_window (the
request's, else the daemon's 8) are refused naming it. On main every such
request was refused (EINVAL: snapkv needs the last W query rows)."""
import errno

import pytest
import torch

from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=8, h_kv=4, L=90, D=16, n_q=12)


def cache_bytes(c):
    out = []
    for l in range(c.layers):
        n = c.kept
        for t in (c.k(l)[:, :n], c.v(l)[:, :n]):
            out.append(bytes(t.contiguous().view(torch.uint8).numpy()))
        out.append(bytes(c.positions(l)[:, :n].contiguous().numpy()))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("gqa", ["group", "expand"])
def test_partial_equals_full_of_n_q(client, dtype, gqa):
    q, k, v = random_inputs(dtype=dtype, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    with client.compact(qs, ks, vs, window=32, budget=30, gqa=gqa, **kw) as part, \
            client.compact(qs, ks, vs, window=12, budget=30, gqa=gqa, **kw) as full:
        assert part.kept == full.kept == 30
        assert cache_bytes(part) == cache_bytes(full)
        assert torch.equal(part.retained_mass, full.retained_mass)


def test_min_window(client, snapkv):
    q, k, v = random_inputs(dtype=torch.float32, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    few = [t[:, 7:] for t in qs]  # the last 5 rows
    with pytest.raises(snapkv.Error) as e:
        client.compact(few, ks, vs, window=32, budget=30, **kw)
    assert e.value.errno == errno.EINVAL and "min_window = 8" in str(e.value)
    with client.compact(few, ks, vs, window=32, budget=30, min_window=5, **kw) as c:
        assert c.kept == 30
        assert all(p[-5:].tolist() == list(range(85, 90)) for p in c.positions(0))
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, window=32, budget=30, min_window=13, **kw)
    assert e.value.errno == errno.EINVAL and "min_window = 13" in str(e.value)
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, window=8, budget=30, **kw)
    assert "at most W = 8" in str(e.value)
    with pytest.raises((ValueError, OverflowError)):
        client.compact(qs, ks, vs, window=32, budget=30, min_window=0, **kw)


def test_snapkvctl_partial_window(daemon, tmp_path):
    """snapkvctl compact with fewer q rows than --window: offline and through
    the daemon the same file, the one of --window n_q; below min_window
    refused naming it."""
    import os
    import subprocess

    from conftest import BUILD
    from skvtest import st_read, st_write

    q, k, v = random_inputs(dtype=torch.float32, **SHAPE)
    t = {}
    for l in range(2):
        t[f"layers.{l}.q"], t[f"layers.{l}.k"], t[f"layers.{l}.v"] = q[l], k[l], v[l]
    st_write(tmp_path / "in.st", t)
    ctl, env = os.path.join(BUILD, "snapkvctl"), dict(os.environ, SNAPKV_SOCKET=daemon.sock)
    P = ["--capacity", "30", "-q"]
    for out, extra in [("off", ["--offline", "--window", "32"]), ("on", ["--window", "32"]),
                       ("full", ["--offline", "--window", "12"])]:
        subprocess.run([ctl, "compact", *extra, str(tmp_path / "in.st"),
                        str(tmp_path / f"{out}.st"), *P], check=True, env=env)
    off, on, full = (st_read(tmp_path / f"{n}.st") for n in ("off", "on", "full"))
    for name in off:
        assert torch.equal(off[name], on[name]) and torch.equal(off[name], full[name])
    for l in range(2):
        t[f"layers.{l}.q"] = q[l][:, 7:].contiguous()  # 5 rows
    st_write(tmp_path / "few.st", t)
    r = subprocess.run([ctl, "compact", "--offline", "--window", "32", str(tmp_path / "few.st"),
                        str(tmp_path / "x.st"), *P], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "min_window = 8" in r.stderr
