# SPDX-License-Identifier: MIT
"""Decision groups through the module: two engines (threads, each its own
session, as tensor-parallel ranks) compact in one group and get one C*, the
larger of their own; a group missing a member times out; bad groups are
refused before anything is sent (key, size) or by the daemon (the mode)."""
import errno
import threading

import pytest
import torch

from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=4, h_kv=2, L=96, D=16, n_q=8)
PARAMS = dict(window=8, capacity=24, kernel=5, pooling="avg", gqa="group",
              budget="mass:0.6:12:88:4")


def member_inputs(client, seed, sharp):
    """Random inputs; `sharp` scales the queries (a peakier attention keeps
    its mass in fewer positions: a smaller own C*)."""
    q, k, v = random_inputs(dtype=torch.float32, seed=seed, **SHAPE)
    qs, ks, vs, kw = place(client, q * sharp, k, v, "hnd")
    return qs, ks, vs, kw


def test_group_of_two_threads(daemon, snapkv):
    clients = [snapkv.Client(daemon.sock, name=f"tp-rank{i}") for i in range(2)]
    try:
        inputs = [member_inputs(clients[0], 11, 0.5), member_inputs(clients[1], 12, 4.0)]
        own = []
        for c, (qs, ks, vs, kw) in zip(clients, inputs):
            with c.compact(qs, ks, vs, **PARAMS, **kw) as cache:
                own.append(cache.budget_outcome["c_star"])
                assert cache.group_size == 0 and cache.group_wait_us == 0
        assert own[0] != own[1], own  # else max could not be told from either
        results, errors = [None, None], []

        def rank(i):
            try:
                qs, ks, vs, kw = inputs[i]
                cache = clients[i].compact(qs, ks, vs, **PARAMS, **kw, group=("py-tp", 2))
                results[i] = (cache.budget_outcome, cache.group_size, cache.group_wait_us,
                              cache.head_kept)
                cache.release()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        for outcome, size, wait_us, head_kept in results:
            assert outcome["c_star"] == max(own)
            assert outcome["group_size"] == size == 2
            assert outcome["group_wait_us"] == wait_us >= 0
            assert not outcome["fallback"]
            assert all(n == max(own) for layer in head_kept for n in layer)
    finally:
        for c in clients:
            c.close()


def test_group_times_out(client, snapkv, daemon):
    """A group of 2 with one member: ETIME after its timeout, nothing kept."""
    qs, ks, vs, kw = member_inputs(client, 21, 1.0)
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, **PARAMS, **kw, group=("lonely", 2, 300))
    assert e.value.errno == errno.ETIME
    assert daemon.ledger()["caches"] == []


@pytest.mark.parametrize("group, exc, msg", [
    (("k", 0), ValueError, "group size must be in 1"),
    (("", 2), ValueError, "the key has 0 bytes"),
    (("a" * 65, 2), ValueError, "the key has 65 bytes"),
    (("tab\there", 2), ValueError, "not printable ASCII"),
    (("k",), TypeError, "(key, size)"),
    ("k:2", TypeError, "(key, size)"),
    ((2, 2), TypeError, "key must be a string"),
    (("k", 2, -1), ValueError, "group timeout_ms must be in 0"),
])
def test_group_bad_arguments(client, group, exc, msg):
    qs, ks, vs, kw = member_inputs(client, 31, 1.0)
    with pytest.raises(exc, match=msg.replace("(", r"\(").replace(")", r"\)")):
        client.compact(qs, ks, vs, **PARAMS, **kw, group=group)


def test_group_ragged_mode_refused(client, snapkv, daemon):
    """heads in a group: the daemon refuses it naming the mode, at once."""
    qs, ks, vs, kw = member_inputs(client, 41, 1.0)
    params = dict(PARAMS, budget="heads")
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, **params, **kw, group=("ragged", 2))
    assert e.value.errno == errno.EINVAL and "heads" in str(e.value)
    assert daemon.ledger()["caches"] == []
