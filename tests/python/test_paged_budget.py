# SPDX-License-Identifier: MIT
"""Budget modes with paged output through the module: mass (one C* for
every head) with out='paged' and out='writeback' holds exactly the dense
HND mass cache's rows, slot for slot, in the blocks C* uses; a fallback
needs room for the whole prompt (a writeback table short of it is refused,
nothing written); modes that give heads or layers their own counts are
refused by name."""
import errno

import pytest
import torch

from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=8, h_kv=4, L=90, D=16, n_q=8)
P = dict(window=8, budget=40, kernel=5, gqa="group", decode_reserve=6)
BS = 16
MASS = "mass:0.4:12:60:4"  # C* 36 on this input: 3 blocks with the reserve, C_max 5


def dense_rows(cache, l):
    n = cache.kept
    return cache.k(l)[:, :n].transpose(0, 1), cache.v(l)[:, :n].transpose(0, 1)


def blocks_rows(pool, table, n):
    return pool[torch.tensor(table, dtype=torch.int64)].reshape(-1, *pool.shape[2:])[:n]


@pytest.fixture
def setup(client):
    return random_inputs(dtype=torch.float32, seed=11, **SHAPE)


def test_mass_paged_arena(client, setup):
    qs, ks, vs, kw = place(client, *setup, "hnd")
    with client.compact(qs, ks, vs, **dict(P, budget=(40, MASS)), **kw) as d, \
            client.compact(qs, ks, vs, **dict(P, budget=(40, MASS)), **kw, out="paged",
                           out_block_size=BS) as c:
        cs = d.budget_outcome["c_star"]
        print(f"mass C* {cs}")
        assert 12 < cs < 60 and c.budget_outcome["c_star"] == cs
        assert c.kept == d.kept == cs and c.budget_outcome["ragged"] is False
        assert c.n_blocks == (cs + 6 + BS - 1) // BS < (60 + 6 + BS - 1) // BS
        for l in range(2):
            dk, dv = dense_rows(d, l)
            assert torch.equal(c.k(l).reshape(-1, 4, 16)[:cs], dk)
            assert torch.equal(c.v(l).reshape(-1, 4, 16)[:cs], dv)
            assert torch.equal(c.positions(l), d.positions(l))


def test_mass_writeback_and_fallback(client, snapkv, setup):
    q, k, v = setup
    a = place(client, q, k, v, "hnd")
    pool = client.empty((2, 2, 20, BS, 4, 16), torch.float32, writable=True)
    pool.normal_()
    before = pool.clone()
    dest = [4, 1, 19, 7]  # room for C_max
    ks, vs = list(pool[0]), list(pool[1])
    wb = dict(P, out="writeback", out_block_size=BS)
    with client.compact(*a[:3], **dict(P, budget=(40, MASS)), **a[3]) as d, \
            client.compact(*a[:3], **dict(wb, budget=(40, MASS)), **a[3], out_block_table=dest,
                           out_buffer=(ks, vs)) as c:
        cs = c.kept
        assert cs == d.kept and c.budget_outcome["c_star"] == d.budget_outcome["c_star"]
        assert c.n_blocks == (cs + 6 + BS - 1) // BS < len(dest)  # the rest is the engine's
        for l in range(2):
            dk, dv = dense_rows(d, l)
            assert torch.equal(blocks_rows(pool[0, l], dest, cs), dk)
            assert torch.equal(blocks_rows(pool[1, l], dest, cs), dv)
        # the rest of the pool, and the table's rows past C*, untouched
        rows = pool.reshape(2, 2, 20 * BS, 4, 16).clone()
        was = before.reshape(2, 2, 20 * BS, 4, 16)
        for s in range(cs):
            rows[:, :, dest[s // BS] * BS + s % BS] = was[:, :, dest[s // BS] * BS + s % BS]
        assert torch.equal(rows, was)
    pool.copy_(before)
    # a fallback keeps all 90 rows: 4 blocks are short of it, refused untouched
    with pytest.raises(snapkv.Error) as e:
        client.compact(*a[:3], **dict(wb, budget=(40, MASS)), **a[3], fallback_below=0.999,
                       out_block_table=dest, out_buffer=(ks, vs))
    assert e.value.errno == errno.EINVAL
    assert "has 4 blocks, the 90 kept slots need 6 of 16 (fallback_below" in str(e.value)
    assert torch.equal(pool, before)
    dest6 = dest + [9, 12]
    with client.compact(*a[:3], **dict(wb, budget=(40, MASS)), **a[3], fallback_below=0.999,
                        out_block_table=dest6, out_buffer=(ks, vs)) as c:
        assert c.budget_outcome["fallback"] is True and c.kept == 90
        for l in range(2):
            assert torch.equal(blocks_rows(pool[0, l], dest6, 90), k[l].transpose(0, 1))
            assert torch.equal(blocks_rows(pool[1, l], dest6, 90), v[l].transpose(0, 1))


@pytest.mark.parametrize("budget,what", [("mass-heads:0.6:12:60", "heads"),
                                         ("heads", "heads"), ("pyramid:0.5", "layers")])
def test_ragged_modes_refused(client, snapkv, setup, budget, what):
    qs, ks, vs, kw = place(client, *setup, "hnd")
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, **dict(P, budget=(40, budget)), **kw, out="paged", out_block_size=BS)
    assert e.value.errno == errno.EINVAL
    assert f"gives {what} different counts: paged output needs one count" in str(e.value)
