# SPDX-License-Identifier: MIT
"""Registered KV pools through the module (issue 20 point 4): register_pool
once, then compact(q, pool=..., block_table=..., prompt_len=...) gives the
cache of the same request described layer by layer; q as one tensor or a
list; the table as a list or in registered storage; writeback into the
pool's blocks; submit_many; reuse; the refusals (bad pool, another client's,
table out of bounds, over max_block_table by name, max_session_pools by
name, unregister while in use: EBUSY); pools freed with the session."""
import errno
import json

import pytest
import torch

from skvtest import random_inputs

LAYERS, H_Q, H_KV, D, L, NQ, BS, NB = 3, 8, 4, 16, 90, 8, 16, 24
P = dict(window=8, budget=40, kernel=5, gqa="group")


def snapkv_error(client):
    import snapkv
    return snapkv.Error


@pytest.fixture
def engine(client):
    """An engine's pools [layers][NB, BS, H_KV, D] (writable), the prompt
    paged into shuffled blocks, the window's queries [layers, H_Q, NQ, D]."""
    q, k, v = random_inputs(LAYERS, H_Q, H_KV, L, D, NQ, torch.float32, seed=5)
    kv = client.empty((2, LAYERS, NB, BS, H_KV, D), torch.float32, writable=True)
    kv.zero_()
    table = [7, 2, 19, 11, 4, 15]
    for i, b in enumerate(table):
        t0, t1 = i * BS, min(L, (i + 1) * BS)
        kv[0, :, b, :t1 - t0] = k[:, :, t0:t1].transpose(1, 2)
        kv[1, :, b, :t1 - t0] = v[:, :, t0:t1].transpose(1, 2)
    qb = client.empty((LAYERS, H_Q, NQ, D), torch.float32)
    qb.copy_(q)
    return kv, qb, table


def inline(client, kv, qb, table, **kw):
    return client.compact(list(qb), list(kv[0]), list(kv[1]), **P, block_table=table,
                          prompt_len=L, **kw)


def same(a, b):
    assert a.kept == b.kept
    for l in range(LAYERS):
        assert torch.equal(a.positions(l), b.positions(l))
        assert torch.equal(a.k(l), b.k(l)) and torch.equal(a.v(l), b.v(l))


def test_pool_equals_inline(client, engine):
    kv, qb, table = engine
    pool = client.register_pool(list(kv[0]), list(kv[1]))
    assert pool.id > 0 and pool.layers == LAYERS and pool.block_size == BS
    assert pool.n_blocks == NB and pool.h_kv == H_KV and pool.head_dim == D
    tb = client.empty((len(table),), torch.float32).view(torch.int32)  # by reference
    tb.copy_(torch.tensor(table, dtype=torch.int32))
    with inline(client, kv, qb, table) as ref:
        for i in range(10):  # reused
            with client.compact(qb, pool=pool, **P, block_table=table, prompt_len=L) as c:
                same(ref, c)
        with client.compact(list(qb), pool=pool, **P, block_table=tb, prompt_len=L) as c:
            same(ref, c)
        reqs = client.submit_many([dict(q=qb, pool=pool, **P, block_table=tb, prompt_len=L)
                                   for _ in range(6)])
        assert len(reqs) == 6
        for r in reqs:
            with r.wait() as c:
                same(ref, c)
    pool.unregister()
    assert pool.id == 0
    pool.unregister()  # again: nothing


def test_pool_q_slots(client, engine):
    """register_pool(q=...): the window's queries located once, a request
    names a slot; 'nhd' staging too."""
    kv, qb, table = engine
    slots = client.empty((3, LAYERS, H_Q, NQ, D), torch.float32)
    slots.zero_()
    slots[2].copy_(qb)
    pool = client.register_pool(list(kv[0]), list(kv[1]), q=slots)
    assert pool.q_slots == 3
    nhd = client.empty((LAYERS, NQ, H_Q, D), torch.float32)
    nhd.copy_(qb.transpose(1, 2))
    pool1 = client.register_pool(list(kv[0]), list(kv[1]), q=nhd, layout="nhd")
    assert pool1.q_slots == 1
    with inline(client, kv, qb, table) as ref:
        with client.compact(pool=pool, q_slot=2, **P, block_table=table, prompt_len=L) as c:
            same(ref, c)
        with client.compact(pool=pool1, **P, block_table=table, prompt_len=L) as c:
            same(ref, c)
        reqs = client.submit_many([dict(pool=pool, q_slot=2, **P, block_table=table,
                                        prompt_len=L)] * 3)
        for r in reqs:
            with r.wait() as c:
                same(ref, c)
    with pytest.raises(ValueError):
        client.compact(pool=pool, q_slot=3, **P, block_table=table, prompt_len=L)
    with pytest.raises(ValueError, match="one or the other"):
        client.compact(qb, pool=pool, q_slot=0, **P, block_table=table, prompt_len=L)
    with pytest.raises(TypeError, match="q_slot is for pool"):
        client.compact(list(qb), list(kv[0]), list(kv[1]), q_slot=0, **P, block_table=table,
                       prompt_len=L)
    with pytest.raises(ValueError, match=r"\[slots,\] layers"):
        client.register_pool(list(kv[0]), list(kv[1]), q=qb[0])
    pool.unregister()
    pool1.unregister()


def test_pool_writeback(client, engine):
    kv, qb, table = engine
    pool = client.register_pool(list(kv[0]), list(kv[1]))
    dest = [23, 0, 21]
    with inline(client, kv, qb, table) as ref, \
            client.compact(qb, pool=pool, **P, block_table=table, prompt_len=L,
                           out="writeback", out_block_size=BS, out_block_table=dest) as c:
        assert c.block_table == tuple(dest)
        for l in range(LAYERS):
            rows = kv[0, l][torch.tensor(dest)].reshape(-1, H_KV, D)[:40]
            assert torch.equal(rows, ref.k(l)[:, :40].transpose(0, 1))
    pool.unregister()


def test_pool_refusals(client, snapkv, engine, daemon):
    kv, qb, table = engine
    pool = client.register_pool(list(kv[0]), list(kv[1]))
    with pytest.raises(TypeError, match="snapkv.Pool"):
        client.compact(qb, pool=object(), **P, block_table=table, prompt_len=L)
    with pytest.raises(ValueError, match="replaces k, v"):
        client.compact(qb, list(kv[0]), list(kv[1]), pool=pool, **P, block_table=table,
                       prompt_len=L)
    with pytest.raises(ValueError, match="block_table is needed"):
        client.compact(qb, pool=pool, **P, prompt_len=L)
    with pytest.raises(ValueError, match="0 .. 23"):
        client.compact(qb, pool=pool, **P, block_table=[1, 99, 2, 3, 4, 5], prompt_len=L)
    # a table in storage: the daemon bounds it by max_block_table, named
    big = client.empty(((1 << 22) + 1,), torch.float32).view(torch.int32)
    big.zero_()
    with pytest.raises(snapkv.Error, match="max_block_table") as e:
        client.compact(qb, pool=pool, **P, block_table=big, prompt_len=L)
    assert e.value.errno == errno.E2BIG
    # another client's pool: refused here, and by the daemon by id
    with snapkv.Client(daemon.sock) as other:
        with pytest.raises(ValueError, match="of this client"):
            other.compact(qb, pool=pool, **P, block_table=table, prompt_len=L)
    # unregister while a request names it: EBUSY (a decision-group member
    # parked for a second member that never comes), then cancelled
    r = client.submit(qb, pool=pool, **P, block_table=table, prompt_len=L,
                      group=("pools-busy", 2, 60000))
    client.nop()  # the ring is taken in order: the request is in
    with pytest.raises(snapkv.Error, match="in use") as e:
        pool.unregister()
    assert e.value.errno == errno.EBUSY
    r.cancel()
    pool.unregister()
    with pytest.raises(ValueError, match="not unregistered"):
        client.compact(qb, pool=pool, **P, block_table=table, prompt_len=L)


def test_pool_limit_and_session_end(snapkv, engine, daemon):
    kv, qb, table = engine
    status = lambda: json.loads(daemon.ctl("status", "--json"))  # noqa: E731
    with snapkv.Client(daemon.sock) as c:
        k = c.empty((LAYERS, NB, BS, H_KV, D), torch.float32)
        pools = [c.register_pool(list(k), list(k)) for _ in range(16)]  # max_session_pools
        with pytest.raises(snapkv.Error, match="max_session_pools") as e:
            c.register_pool(list(k), list(k))
        assert e.value.errno == errno.EMFILE
        assert status()["kv_pools"] >= 16
        del pools
        assert status()["kv_pools"] < 16
        keep = [c.register_pool(list(k), list(k)) for _ in range(3)]
        assert len(keep) == 3
    # the session ended with its pools registered: the daemon freed them
    for _ in range(500):
        if status()["kv_pools"] == 0:
            break
        import time
        time.sleep(0.01)
    assert status()["kv_pools"] == 0
