# SPDX-License-Identifier: MIT
"""Writeback without thrown-away copies or per-token traffic (issue 20 points
5 and 8): a protected shared prefix's blocks stay where they are
(in_place_blocks), byte for byte what the full-table path gives elsewhere;
max_decode puts the cache in the ledger at its declared maximum with
append() optional; grow(blocks=...) hands the daemon the engine's new
blocks; release(appended=g) reports g; every refusal leaves all as it was."""
import errno

import pytest
import torch

from skvtest import random_inputs

SHAPE = dict(layers=2, h_q=8, h_kv=4, L=90, D=16, n_q=8)
BS = 16
PROT = 2  # blocks of positions 0 .. 31: a prefix-cached system prompt
P = dict(window=8, budget=48, kernel=5, gqa="group", protect=[(0, PROT * BS)])
TABLE = [3, 9, 0, 17, 5, 11]  # the sequence's input blocks; 3 and 9 are shared


def pool_with_prompt(client, k, v, dtype=torch.float32):
    pool = client.empty((2, 2, 24, BS, 4, 16), dtype, writable=True)
    L = k.shape[2]
    for i, b in enumerate(TABLE):
        t0, t1 = i * BS, min(L, (i + 1) * BS)
        pool[0, :, b, :t1 - t0] = k[:, :, t0:t1].transpose(1, 2)
        pool[1, :, b, :t1 - t0] = v[:, :, t0:t1].transpose(1, 2)
    return pool


def slots(pool, table, n):
    """[2 (K, V), layers, n, H, D]: slot i in block table[i // BS]."""
    idx = torch.tensor(table, dtype=torch.int64)
    return pool[:, :, idx].reshape(2, 2, -1, 4, 16)[:, :, :n]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_in_place_prefix(client, dtype):
    q, k, v = (x.to(dtype) for x in random_inputs(dtype=torch.float32, seed=5, **SHAPE))
    qs = client.empty(tuple(q.shape), dtype)
    qs.copy_(q)
    # the old path: every kept slot written into the destination blocks
    pool = pool_with_prompt(client, k, v, dtype)
    full = [4, 1, 19]
    with client.compact(list(qs), list(pool[0]), list(pool[1]), **P, block_table=TABLE,
                        prompt_len=90, out="writeback", out_block_size=BS,
                        out_block_table=full) as c:
        old = slots(pool, full, c.kept).clone()
        old_pos = [c.positions(l)[:, :c.kept].clone() for l in range(2)]
    # in place: the shared blocks are poisoned first by nobody but stay as
    # they are; only the unprotected part gets destination blocks
    pool = pool_with_prompt(client, k, v, dtype)
    before = pool.clone()
    dest = [19]
    with client.compact(list(qs), list(pool[0]), list(pool[1]), **P, block_table=TABLE,
                        prompt_len=90, out="writeback", out_block_size=BS,
                        out_block_table=dest, in_place_blocks=PROT) as c:
        assert c.in_place_blocks == PROT and c.n_blocks == 3
        assert c.block_table == tuple(TABLE[:PROT] + dest)
        assert torch.equal(slots(pool, list(c.block_table), c.kept), old)
        for l in range(2):
            assert torch.equal(c.positions(l)[:, :c.kept], old_pos[l])
            assert torch.equal(c.positions(l)[:, :PROT * BS],
                               torch.arange(PROT * BS, dtype=torch.int32).expand(4, -1))
        # the daemon wrote block 19 and nothing else
        mask = torch.ones(24, dtype=torch.bool)
        mask[19] = False
        assert torch.equal(pool[:, :, mask], before[:, :, mask])


def test_in_place_through_a_pool(client):
    """The same in-place compaction with the pools registered once (pool=):
    the same slots, positions and untouched blocks as the described layers,
    the table from a list or from registered storage, max_decode carried."""
    q, k, v = random_inputs(dtype=torch.float32, seed=5, **SHAPE)
    qs = client.empty(tuple(q.shape), torch.float32)
    qs.copy_(q)
    ref_pool = pool_with_prompt(client, k, v)
    dest = [19]
    with client.compact(list(qs), list(ref_pool[0]), list(ref_pool[1]), **P, block_table=TABLE,
                        prompt_len=90, out="writeback", out_block_size=BS,
                        out_block_table=dest, in_place_blocks=PROT) as ref:
        want = slots(ref_pool, list(ref.block_table), ref.kept).clone()
        want_pos = [ref.positions(l)[:, :ref.kept].clone() for l in range(2)]
    for table in ("list", "storage"):
        pool = pool_with_prompt(client, k, v)
        reg = client.register_pool(list(pool[0]), list(pool[1]))
        tab = TABLE
        if table == "storage":
            tab = client.empty((len(TABLE),), torch.float32).view(torch.int32)
            tab.copy_(torch.tensor(TABLE, dtype=torch.int32))
        before = pool.clone()
        with client.compact(qs, pool=reg, **P, block_table=tab, prompt_len=90,
                            out="writeback", out_block_size=BS, out_block_table=dest,
                            in_place_blocks=PROT, max_decode=32) as c:
            assert c.in_place_blocks == PROT and c.max_decode == 32
            assert c.block_table == tuple(TABLE[:PROT] + dest)
            assert torch.equal(slots(pool, list(c.block_table), c.kept), want)
            for l in range(2):
                assert torch.equal(c.positions(l)[:, :c.kept], want_pos[l])
            mask = torch.ones(24, dtype=torch.bool)
            mask[19] = False
            assert torch.equal(pool[:, :, mask], before[:, :, mask])
        with pytest.raises(ValueError, match="in_place_blocks 7"):
            client.compact(qs, pool=reg, **P, block_table=TABLE, prompt_len=90,
                           out="writeback", out_block_size=BS, out_block_table=dest,
                           in_place_blocks=7)
        reg.unregister()


def test_in_place_refusals(client, snapkv):
    q, k, v = random_inputs(dtype=torch.float32, seed=6, **SHAPE)
    qs = client.empty(tuple(q.shape), torch.float32)
    qs.copy_(q)
    pool = pool_with_prompt(client, k, v)
    before = pool.clone()
    kw = dict(P, block_table=TABLE, prompt_len=90, out="writeback", out_block_size=BS)
    ins = (list(qs), list(pool[0]), list(pool[1]))
    cases = [
        # in-place blocks past the protected prefix
        (dict(in_place_blocks=PROT + 1, out_block_table=[19]), "protected"),
        # a destination table too short for the unprotected part
        (dict(in_place_blocks=PROT, out_block_table=[19],
              protect=[(0, PROT * BS)], budget=70), "out_in_place_blocks"),
        # arena output: nothing is in place there
        (dict(in_place_blocks=1, out="paged", out_block_table=None), "WRITEBACK"),
    ]
    for extra, needle in cases:
        with pytest.raises(snapkv.Error) as e:
            client.compact(*ins, **dict(kw, **extra))
        assert e.value.errno == errno.EINVAL and needle in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="in_place_blocks"):
        client.compact(*ins, **kw, out_block_table=[19], in_place_blocks=7)
    # the input not in the destination pools: the bytes are not in place
    other = pool_with_prompt(client, k, v)
    with pytest.raises(snapkv.Error) as e:
        client.compact(list(qs), list(other[0]), list(other[1]), **kw, out_block_table=[19],
                       in_place_blocks=PROT, out_buffer=(list(pool[0]), list(pool[1])))
    assert e.value.errno == errno.EINVAL and "destination pools" in str(e.value)
    assert torch.equal(pool, before)


def test_max_decode_grow_release(client, snapkv, daemon):
    q, k, v = random_inputs(dtype=torch.float32, seed=7, **SHAPE)
    qs = client.empty(tuple(q.shape), torch.float32)
    qs.copy_(q)
    pool = pool_with_prompt(client, k, v)
    c = client.compact(list(qs), list(pool[0]), list(pool[1]), **P, block_table=TABLE,
                       prompt_len=90, out="writeback", out_block_size=BS,
                       out_block_table=[19, 20, 21], max_decode=40, decode_reserve=4)
    assert c.max_decode == 40 and c.decode_limit == 40 and c.capacity == 52
    slot = 2 * 2 * 4 * 16 * 4  # K and V, 2 layers, 4 heads, D 16, f32
    line = daemon.ledger()["caches"][0]
    assert line["max_decode"] == 40 and line["engine_held_bytes"] == slot * (48 + 40)
    # no append per token: one report past the 4 reserved slots is fine
    c.append(10)
    with pytest.raises(snapkv.Error) as e:
        c.append(31)
    assert e.value.errno == errno.ENOSPC and "max_decode" in str(e.value)
    # GROW into the engine's new blocks, up to max_decode
    with pytest.raises(snapkv.Error) as e:
        c.grow(20, blocks=[19])  # one of its own
    assert e.value.errno == errno.EINVAL
    c.grow(20, blocks=[22, 23])  # 72 slots: 5 blocks of 16
    assert c.capacity == 72 and c.block_table == (19, 20, 21, 22, 23)
    assert int(c.positions(1)[2, 48 + 9]) == 90 + 9  # appended past the old rows
    with pytest.raises(snapkv.Error) as e:
        c.grow(17)
    assert e.value.errno == errno.E2BIG and "declared maximum" in str(e.value)
    assert c.capacity == 72
    # the engine reports g when it releases; a bad report releases nothing
    with pytest.raises(snapkv.Error) as e:
        c.release(appended=41)
    assert e.value.errno == errno.EINVAL and not c.released
    c.release(linger=True, appended=33)
    line = daemon.ledger()["caches"][0]
    assert line["appended"] == 33 and line["lingering"]
