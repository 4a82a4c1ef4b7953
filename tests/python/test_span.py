# SPDX-License-Identifier: MIT
"""Span-aware selection (kernels/skv.h) through the daemon: span= of the
module and snapkvctl --span reach the kernels (the daemon's result is
libskv's offline one byte for byte, and differs from top-k's), span 0 is
top-k, and a span the kernels refuse is refused naming it."""
import errno
import os
import subprocess

import pytest
import torch

from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=8, h_kv=4, L=120, D=16, n_q=8)


def kept_positions(c):
    return [c.positions(l)[:, :c.kept].clone() for l in range(c.layers)]


@pytest.mark.parametrize("gqa", ["group", "expand"])
def test_span_changes_the_pick(client, gqa):
    q, k, v = random_inputs(dtype=torch.float32, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    args = dict(window=8, budget=24, kernel=1, gqa=gqa, **kw)
    with client.compact(qs, ks, vs, **args) as top, \
            client.compact(qs, ks, vs, span=0, **args) as zero, \
            client.compact(qs, ks, vs, span=3, **args) as sp:
        assert top.kept == zero.kept == sp.kept == 24  # equal memory
        pt, pz, ps = kept_positions(top), kept_positions(zero), kept_positions(sp)
        assert all(torch.equal(a, b) for a, b in zip(pt, pz))
        assert any(not torch.equal(a, b) for a, b in zip(pt, ps))
        # spans: every head's 16 picks lie in runs, far fewer than top-k's
        runs = lambda p: sum(1 for i in range(16) if i == 0 or p[i] != p[i - 1] + 1)
        assert max(runs(h) for l in ps for h in l) <= 16 // 4 + 1


def test_span_refused(client, snapkv):
    q, k, v = random_inputs(dtype=torch.float32, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    with pytest.raises((ValueError, OverflowError)):
        client.compact(qs, ks, vs, window=8, budget=24, span=65, **kw)
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, window=8, budget="heads:0.2", span=3, **kw)
    assert e.value.errno == errno.EINVAL and "span 3" in str(e.value)


def test_snapkvctl_span(daemon, tmp_path):
    """snapkvctl compact --span: offline and through the daemon the same file."""
    from conftest import BUILD
    from skvtest import st_read, st_write

    q, k, v = random_inputs(dtype=torch.float32, **SHAPE)
    t = {}
    for l in range(2):
        t[f"layers.{l}.q"], t[f"layers.{l}.k"], t[f"layers.{l}.v"] = q[l], k[l], v[l]
    st_write(tmp_path / "in.st", t)
    ctl, env = os.path.join(BUILD, "snapkvctl"), dict(os.environ, SNAPKV_SOCKET=daemon.sock)
    P = ["--window", "8", "--capacity", "24", "--kernel", "1", "-q"]
    for out, extra in [("off", ["--offline", "--span", "3"]), ("on", ["--span", "3"]),
                       ("top", ["--offline"])]:
        subprocess.run([ctl, "compact", *extra, str(tmp_path / "in.st"),
                        str(tmp_path / f"{out}.st"), *P], check=True, env=env)
    off, on, top = (st_read(tmp_path / f"{n}.st") for n in ("off", "on", "top"))
    assert all(torch.equal(off[n], on[n]) for n in off)
    assert any(not torch.equal(off[n], top[n]) for n in off)
    r = subprocess.run([ctl, "compact", "--span", "65", str(tmp_path / "in.st"),
                        str(tmp_path / "x.st"), *P], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "span 65" in r.stderr
