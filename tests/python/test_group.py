# SPDX-License-Identifier: MIT
"""Decision groups through the module: two engines (threads, each its own
session, as tensor-parallel ranks) compact in one group and get one C*, the
larger of their own; a group missing a member times out; bad groups are
refused before anything is sent (key, size) or by the daemon (the mode)."""
import errno
import json
import os
import struct
import subprocess
import threading

import pytest
import torch

from conftest import BUILD
from skvtest import place, random_inputs, st_write

SHAPE = dict(layers=2, h_q=4, h_kv=2, L=96, D=16, n_q=8)
MASS = "mass:0.6:12:88:4"
PARAMS = dict(window=8, budget=(24, MASS), kernel=5, pooling="avg", gqa="group")


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
    params = dict(PARAMS, budget=(24, "heads"))
    with pytest.raises(snapkv.Error) as e:
        client.compact(qs, ks, vs, **params, **kw, group=("ragged", 2))
    assert e.value.errno == errno.EINVAL and "heads" in str(e.value)
    assert daemon.ledger()["caches"] == []


def st_metadata(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)).get("__metadata__", {})


def test_snapkvctl_group(daemon, tmp_path):
    """`snapkvctl compact --group KEY:SIZE` from two processes at once: one
    C*, the larger of their own, in both files; --offline refuses --group."""
    ctl = os.path.join(BUILD, "snapkvctl")
    common = ["--socket", daemon.sock, "--window", "8", "--capacity", "24", "--gqa", "group",
              "--budget", MASS]
    ins = []
    for i, (seed, sharp) in enumerate([(51, 0.5), (52, 4.0)]):
        q, k, v = random_inputs(dtype=torch.float32, seed=seed, **SHAPE)
        t = {}
        for l in range(SHAPE["layers"]):
            t[f"layers.{l}.q"], t[f"layers.{l}.k"], t[f"layers.{l}.v"] = q[l] * sharp, k[l], v[l]
        ins.append(tmp_path / f"rank{i}.safetensors")
        st_write(ins[-1], t)
    own = []
    for i in range(2):
        out = tmp_path / f"own{i}.safetensors"
        subprocess.run([ctl, "compact", str(ins[i]), str(out), "-q", *common], check=True)
        own.append(int(st_metadata(out)["budget.c_star"]))
    assert own[0] != own[1], own
    procs = [subprocess.Popen([ctl, "compact", str(ins[i]), str(tmp_path / f"g{i}.safetensors"),
                               "--group", "ctl-tp:2:30000", *common],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se
        assert 'group "ctl-tp": decided with 2 members' in so
    for i in range(2):
        assert int(st_metadata(tmp_path / f"g{i}.safetensors")["budget.c_star"]) == max(own)
    r = subprocess.run([ctl, "compact", "--offline", str(ins[0]), str(tmp_path / "x"),
                        "--group", "ctl-tp:2"], capture_output=True, text=True)
    assert r.returncode == 2 and "--group needs the daemon" in r.stderr
    assert not (tmp_path / "x").exists()
