# SPDX-License-Identifier: MIT
"""Paged output in the engine's block format through the module: out='paged'
(blocks in the arena, mapped into the engine's pool with map_blocks) and
out='writeback' (into blocks of the engine's writable pool), each slot for
slot the dense HND output of the same request; and their refusals."""
import errno

import pytest
import torch

from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=8, h_kv=4, L=90, D=16, n_q=8)
P = dict(window=8, budget=40, kernel=5, gqa="group", decode_reserve=6)
BS = 16  # 16 x 4 heads x 16 x f32 = 4096 bytes: one page per block


def dense_rows(cache, l):
    """[kept, H, D] K and V of the dense HND output."""
    n = cache.kept
    return cache.k(l)[:, :n].transpose(0, 1), cache.v(l)[:, :n].transpose(0, 1)


def blocks_rows(pool, table, n):
    return pool[torch.tensor(table, dtype=torch.int64)].reshape(-1, *pool.shape[2:])[:n]


@pytest.fixture
def setup(client):
    q, k, v = random_inputs(dtype=torch.float32, seed=11, **SHAPE)
    return q, k, v


def test_paged_arena_and_map(client, setup):
    q, k, v = setup
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    with client.compact(qs, ks, vs, **P, **kw) as d, \
            client.compact(qs, ks, vs, **P, **kw, out="paged", out_block_size=BS) as c:
        assert c.layout == "paged" and c.block_size == BS
        assert c.n_blocks == (c.capacity + BS - 1) // BS and c.kept == d.kept == 40
        pool = client.empty((2, 12, BS, 4, 16), torch.float32)
        pool.fill_(7.0)
        for l in range(2):
            kb, vb = c.k(l), c.v(l)
            assert tuple(kb.shape) == (c.n_blocks, BS, 4, 16)
            dk, dv = dense_rows(d, l)
            assert torch.equal(kb.reshape(-1, 4, 16)[:40], dk)
            assert torch.equal(vb.reshape(-1, 4, 16)[:40], dv)
            assert torch.equal(c.positions(l), d.positions(l)[:, :c.capacity])
            # map the run into the engine's pool at block 5: an unmodified gather reads it
            c.map_blocks(l, "k", pool[l, 5])
            table = list(range(5, 5 + c.n_blocks))
            assert torch.equal(blocks_rows(pool[l], table, 40), dk)
            pool[l, 5, 0, 0, 0] = 3.0  # the engine writes through to the arena
            assert float(c.k(l)[0, 0, 0, 0]) == 3.0
            c.unmap_blocks(l, "k", pool[l, 5])
            assert bool((pool[l, 5:5 + c.n_blocks] == 7.0).all())
        with pytest.raises(ValueError):
            c.map_blocks(0, "k", pool[0, 5, 1])  # not page-aligned
        with pytest.raises(ValueError):
            c.map_blocks(0, "x", pool[0, 5])
        with pytest.raises(ValueError):
            c.map_blocks(0, "k", torch.zeros(4096))
        with pytest.raises(snapkv_error(client)) as e:
            d.map_blocks(0, "k", pool[0, 5])
        assert e.value.errno == errno.EINVAL


def snapkv_error(client):
    import snapkv
    return snapkv.Error


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["f32", "f16", "bf16"])
def test_writeback(client, setup, dtype):
    q, k, v = (x.to(dtype) for x in setup)
    a = place(client, q, k, v, "hnd")
    L, nb = 90, 6
    pool = client.empty((2, 2, 20, BS, 4, 16), dtype, writable=True)
    table = [3, 9, 0, 17, 5, 11]
    for i, b in enumerate(table):
        t0, t1 = i * BS, min(L, (i + 1) * BS)
        pool[0, :, b, :t1 - t0] = k[:, :, t0:t1].transpose(1, 2)
        pool[1, :, b, :t1 - t0] = v[:, :, t0:t1].transpose(1, 2)
    before = pool.clone()
    dest = [4, 1, 19]
    ks, vs = list(pool[0]), list(pool[1])
    with client.compact(*a[:3], **P, **a[3]) as d, \
            client.compact(a[0], ks, vs, **P, block_table=table, prompt_len=L,
                           out="writeback", out_block_size=BS, out_block_table=dest) as c:
        assert c.layout == "paged" and c.block_table == tuple(dest)
        assert c.k(0) is ks[0] and c.v(1) is vs[1]
        for l in range(2):
            dk, dv = dense_rows(d, l)
            assert torch.equal(blocks_rows(pool[0, l], dest, 40), dk)
            assert torch.equal(blocks_rows(pool[1, l], dest, 40), dv)
            assert torch.equal(c.positions(l)[:, :40], d.positions(l)[:, :40])
        # nothing else in the pool was written (slots 40..47 of the last block unchanged)
        mask = torch.ones(20, dtype=torch.bool)
        mask[dest] = False
        assert torch.equal(pool[:, :, mask], before[:, :, mask])
        assert torch.equal(pool[:, :, 19, 8:], before[:, :, 19, 8:])
        c.append(2)
        assert c.next_position == L + 2
        # GROW past the table's blocks takes the engine's new ones
        with pytest.raises(snapkv_error(client)) as e:
            c.grow(4)
        assert e.value.errno == errno.EINVAL and "new destination blocks" in str(e.value)
        c.grow(4, blocks=[7])
        assert c.capacity == 50 and c.block_table == tuple(dest) + (7,)


def test_writeback_refusals(client, snapkv, setup):
    q, k, v = setup
    a = place(client, q, k, v, "paged", block_size=BS)
    qs, ks, vs, kw = a
    wb = dict(P, out="writeback", out_block_size=BS)
    ro = client.empty((2, 2, 20, BS, 4, 16), torch.float32)
    with pytest.raises(ValueError, match="writable"):
        client.compact(qs, ks, vs, **wb, **kw, out_block_table=[0, 1, 2],
                       out_buffer=(list(ro[0]), list(ro[1])))
    pool = client.empty((2, 2, 20, BS, 4, 16), torch.float32, writable=True)
    pool[0, :, :8].copy_(torch.stack(ks)[:, :8])
    table = list(range(6))
    ok = dict(block_table=table, prompt_len=90)
    pk, pv = list(pool[0]), list(pool[1])
    with pytest.raises(snapkv.Error) as e:  # destination meets a block the request reads
        client.compact(qs, pk, pv, **wb, **ok, out_block_table=[10, 2, 11])
    assert e.value.errno == errno.EINVAL
    with pytest.raises(snapkv.Error) as e:  # two destination blocks meet
        client.compact(qs, pk, pv, **wb, **ok, out_block_table=[10, 10, 11])
    assert e.value.errno == errno.EINVAL
    with pytest.raises(ValueError):  # outside the pool
        client.compact(qs, pk, pv, **wb, **ok, out_block_table=[10, 20, 11])
    with pytest.raises(ValueError):
        client.compact(qs, pk, pv, **wb, **ok)  # no destination table
    with pytest.raises(ValueError):
        client.compact(qs, pk, pv, **dict(P, out="writeback"), **ok, out_block_table=[7])
    with pytest.raises(ValueError):
        client.compact(qs, pk, pv, **dict(P, out="paged", out_block_size=BS), **ok,
                       out_block_table=[7])
    with pytest.raises(ValueError):
        client.compact(qs, pk, pv, **wb, **ok, out_block_table=[10, 12, 13],
                       out_buffer=(pk, pv[:1]))
    with pytest.raises(ValueError):  # registered read-only first: not writable later
        client.register(ro, writable=True)
    with client.compact(qs, pk, pv, **wb, **ok, out_block_table=[10, 12, 13]) as c:
        assert c.kept == 40
