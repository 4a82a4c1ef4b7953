# SPDX-License-Identifier: MIT
"""Lifetimes: a cache used after release, tensors outliving their cache and
client, a client used after its daemon died (a clear snapkv.Error, never a
crash), an interpreter exiting with caches held (the daemon frees them: the
ledger says so), and calls from several threads."""
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from conftest import BUILD, Daemon
from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=4, h_kv=2, L=48, D=8, n_q=8)
P = dict(window=8, budget=16, decode_reserve=4)


def compact(client, seed=1):
    q, k, v = random_inputs(dtype=torch.float32, seed=seed, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    return client.compact(qs, ks, vs, **P, **kw), k


def test_cache_after_release(client, snapkv):
    c, k = compact(client)
    kt, pos = c.k(0), c.positions(0)
    n = c.kept
    assert torch.equal(kt[:, :n], k[0][torch.arange(2)[:, None], pos[:, :n].long()])
    c.release()
    assert c.released
    for call in [lambda: c.k(0), lambda: c.kept, lambda: c.append(1), lambda: c.grow(4),
                 lambda: c.release(), lambda: c.retained_mass, lambda: c.next_position]:
        with pytest.raises(snapkv.Error) as e:
            call()
        assert e.value.errno == errno.EBADF and "released" in str(e.value)
    with pytest.raises(snapkv.Error):
        with c:
            pass
    kt.sum()  # the old tensor still points at mapped memory
    with compact(client, seed=2)[0] as d:
        assert d.kept == 16


def test_tensors_outlive_client(daemon, snapkv):
    cl = snapkv.Client(daemon.sock, name="outlive")
    c, k = compact(cl)
    kt, keep = c.k(1), c.kept
    before = kt[:, :keep].clone()
    buf = cl.empty((16,), torch.float16)
    cl.close()
    assert c.released
    del c
    # the arena alias stays mapped: readable (the daemon punched the freed
    # cache's pages, so they read as zeros), never a fault
    assert bool(torch.isfinite(kt).all()) and before.shape == kt[:, :keep].shape
    buf.fill_(2)
    assert float(buf.sum()) == 32


def test_daemon_died(snapkv):
    d = Daemon()
    try:
        cl = snapkv.Client(d.sock, name="orphan", timeout_ms=5000)
        c, _ = compact(cl)
        kt = c.k(0)
        saved = kt.clone()
        d.kill()
        errs = []
        for call in [lambda: compact(cl, seed=3), lambda: c.append(1), lambda: c.grow(4),
                     lambda: cl.stats(), lambda: cl.empty((8,), torch.float32)]:
            with pytest.raises(snapkv.Error) as e:
                call()
            errs.append(e.value.errno)
        assert set(errs) <= {errno.ENOTCONN, errno.ECONNRESET, errno.EPIPE}, errs
        assert torch.equal(kt, saved)  # mappings stay valid
        c.release() if not c.released else None
    except snapkv.Error as e:
        assert e.errno in (errno.ENOTCONN, errno.ECONNRESET, errno.EPIPE)
    finally:
        cl.close()
        d.stop()


HOLDER = textwrap.dedent("""
    import sys
    sys.path[:0] = [{build!r}, {here!r}]
    import snapkv, torch
    from skvtest import place, random_inputs
    cl = snapkv.Client({sock!r}, name="exiting")
    caches = []
    for s in range(3):
        q, k, v = random_inputs(2, 4, 2, 48, 8, 8, torch.float32, seed=s)
        qs, ks, vs, kw = place(cl, q, k, v, "hnd")
        caches.append(cl.compact(qs, ks, vs, window=8, budget=16, **kw))
    print("held", len(caches), flush=True)
    sys.stdin.readline()
    # exit with the client open and three caches held
""")


def engine_caches(daemon, name):
    return [c for c in daemon.ledger()["caches"] if c.get("engine") == name]


def test_exit_with_caches_held(daemon):
    code = HOLDER.format(build=os.path.join(BUILD, "python"), here=os.path.dirname(__file__),
                         sock=daemon.sock)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held 3"
    assert len(engine_caches(daemon, "exiting")) == 3
    p.stdin.close()
    assert p.wait(60) == 0
    # the session ends when the socket closes; the daemon frees what it held
    for _ in range(200):
        if not engine_caches(daemon, "exiting"):
            break
        time.sleep(0.05)
    assert engine_caches(daemon, "exiting") == []


def test_threads(client):
    """Four threads compact on one client at once (the GIL is released while
    waiting; libsnapkv serialises the rest)."""
    out, errs = [], []

    def work(seed):
        try:
            for i in range(5):
                c, _ = compact(client, seed=seed * 10 + i)
                out.append(c.kept)
                c.release()
        except Exception as e:  # pragma: no cover - reported below
            errs.append(e)

    ts = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs and out == [16] * 20


def test_close_releases_everything(daemon, snapkv):
    cl = snapkv.Client(daemon.sock, name="closer")
    caches = [compact(cl, seed=s)[0] for s in range(2)]
    q, k, v = random_inputs(dtype=torch.float32, seed=9, **SHAPE)
    qs, ks, vs, kw = place(cl, q, k, v, "hnd")
    req = cl.submit(qs, ks, vs, **P, **kw)
    assert len(engine_caches(daemon, "closer")) >= 2
    cl.close()
    assert all(c.released for c in caches)
    with pytest.raises(snapkv.Error):
        req.wait(1)
    for _ in range(200):
        if not engine_caches(daemon, "closer"):
            break
        time.sleep(0.05)
    assert engine_caches(daemon, "closer") == []
