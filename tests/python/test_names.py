# SPDX-License-Identifier: MIT
"""budget= names C: an int is uniform C, a string a budget mode, (C, mode)
both; capacity= (the old name of C, easily confused with Cache.capacity, the
slot count) is still accepted for one release with a DeprecationWarning and
gives the same bytes; every misuse is a TypeError or ValueError before
anything is sent."""
import warnings

import pytest
import torch

from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=8, h_kv=4, L=77, D=16, n_q=8)
BASE = dict(window=8, kernel=5, pooling="avg", gqa="group", decode_reserve=2)


def snapshot(c):
    """The kept rows of every head (the decode reserve is not written)."""
    out = []
    for l in range(c.layers):
        for h in range(c.h_store):
            n = c.head_kept[l][h]
            out.append((bytes(c.k_head(l, h)[:n].contiguous().view(torch.uint8).numpy()),
                        bytes(c.v_head(l, h)[:n].contiguous().view(torch.uint8).numpy()),
                        c.positions_head(l, h)[:n].tolist()))
    return out


@pytest.fixture
def inputs(client):
    q, k, v = random_inputs(dtype=torch.float32, seed=31, **SHAPE)
    return place(client, q, k, v, "hnd")


def test_budget_int_is_uniform_c(client, inputs):
    qs, ks, vs, kw = inputs
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # budget= never warns
        with client.compact(qs, ks, vs, **BASE, **kw, budget=24) as c:
            assert c.budget == 24 and c.kept == 24
            assert c.capacity == 24 + 2  # slots: kept + decode reserve
            assert c.budget_outcome["mode"] == "uniform"
            got = snapshot(c)
    with pytest.warns(DeprecationWarning, match="capacity= is deprecated: pass budget=C"):
        with client.compact(qs, ks, vs, **BASE, **kw, capacity=24) as old:
            assert snapshot(old) == got


def test_budget_tuple_is_c_and_mode(client, inputs):
    qs, ks, vs, kw = inputs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with client.compact(qs, ks, vs, **BASE, **kw, budget=(24, "heads:0.2")) as c:
            assert c.budget_outcome["mode"] == "heads"
            assert sum(sum(h) for h in c.head_kept) == 2 * 4 * 24  # layers x h_store x C
            got = snapshot(c)
    with pytest.warns(DeprecationWarning):
        with client.compact(qs, ks, vs, **BASE, **kw, capacity=24, budget="heads:0.2") as old:
            assert snapshot(old) == got


@pytest.mark.parametrize("kw_bad, exc, match", [
    (dict(budget=24, capacity=24), TypeError, "budget C given twice"),
    (dict(budget=(24, "heads"), capacity=24), TypeError, "budget C given twice"),
    (dict(budget=2.5), TypeError, "budget must be an int .*not float"),
    (dict(budget=(24,)), TypeError, r"\(C, mode string\)"),
    (dict(budget=("heads", 24)), TypeError, r"\(C, mode string\)"),
    (dict(budget=0), ValueError, "budget C must be in 1 .. 4194304"),
    (dict(budget=(1 << 23, "heads")), ValueError, "budget C must be in"),
    (dict(budget=(24, "adaptive")), ValueError, "budget: \"adaptive\" is not uniform"),
])
def test_budget_misuse(client, inputs, kw_bad, exc, match):
    qs, ks, vs, kw = inputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(exc, match=match):
            client.compact(qs, ks, vs, **BASE, **kw, **kw_bad)


def test_submit_takes_the_same_names(client, inputs):
    qs, ks, vs, kw = inputs
    r = client.submit(qs, ks, vs, **BASE, **kw, budget=(20, "uniform"))
    with r.wait() as c:
        assert c.budget == 20 and c.kept == 20
