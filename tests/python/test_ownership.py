# SPDX-License-Identifier: MIT
"""Who owns what after the program lets go: a paged cache whose blocks are
mapped over the engine's pool (map_blocks) is never released under the pool
(release() refused while mapped; garbage collection, a with block and
close() unmap first), and a Request dropped before it finished has its
cache released when its completion arrives (not kept until close(), so
thousands of dropped requests do not run into max_caches)."""
import errno
import gc
import os
import time

import pytest
import torch

from conftest import Daemon
from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=8, h_kv=4, L=90, D=16, n_q=8)
P = dict(window=8, budget=40, kernel=5, gqa="group", decode_reserve=6)
BS = 16  # 16 x 4 heads x 16 x f32 = 4096 bytes: one page per block
FILL = 7.0


@pytest.fixture
def inputs(client):
    q, k, v = random_inputs(dtype=torch.float32, seed=21, **SHAPE)
    return place(client, q, k, v, "hnd")


def paged(client, inputs):
    qs, ks, vs, kw = inputs
    return client.compact(qs, ks, vs, **P, **kw, out="paged", out_block_size=BS)


def engine_pool(client):
    pool = client.empty((2, 12, BS, 4, 16), torch.float32)
    pool.fill_(FILL)
    return pool


def own_pages(pool, c):
    """The pool's blocks 5.. hold the buffer's own pages again."""
    return bool((pool[0, 5:5 + c.n_blocks] == FILL).all())


def test_release_while_mapped_refused(client, snapkv, inputs):
    c = paged(client, inputs)
    pool = engine_pool(client)
    c.map_blocks(0, "k", pool[0, 5])
    with pytest.raises(snapkv.Error) as e:
        c.release()
    assert e.value.errno == errno.EBUSY and "unmap_blocks" in str(e.value)
    with pytest.raises(snapkv.Error) as e:
        c.release(linger=True)
    assert e.value.errno == errno.EBUSY
    assert not c.released
    assert float(pool[0, 5, 0, 0, 0]) == float(c.k(0)[0, 0, 0, 0])  # still the cache's
    c.unmap_blocks(0, "k", pool[0, 5])
    assert own_pages(pool, c)
    c.release()
    assert c.released


def test_mapped_over_by_another_cache(client, snapkv, inputs):
    a, b = paged(client, inputs), paged(client, inputs)
    pool = engine_pool(client)
    a.map_blocks(0, "k", pool[0, 5])
    b.map_blocks(0, "k", pool[0, 5])  # b's blocks replace a's there
    a.release()
    with pytest.raises(snapkv.Error) as e:
        b.release()
    assert e.value.errno == errno.EBUSY
    del b  # garbage collection unmaps, then releases
    gc.collect()
    assert bool((pool[0, 5:8] == FILL).all())


def test_gc_and_with_unmap(client, inputs):
    pool = engine_pool(client)
    c = paged(client, inputs)
    n = c.n_blocks
    c.map_blocks(0, "k", pool[0, 5])
    c.map_blocks(1, "v", pool[1, 5])
    del c
    gc.collect()
    assert bool((pool[:, 5:5 + n] == FILL).all())
    # the region the daemon gives the next cache is not the pool's any more:
    # the engine writing its pool leaves that cache alone
    with paged(client, inputs) as d:
        before = d.k(0).clone()
        pool[0, 5:5 + n] = 12345.0
        assert torch.equal(d.k(0), before)
        pool[0, 5:5 + n] = FILL
        d.map_blocks(0, "k", pool[0, 5])
    assert bool((pool[0, 5:5 + n] == FILL).all())  # the with block unmapped


def test_close_unmaps(daemon, snapkv):
    cl = snapkv.Client(daemon.sock, name="mapped-close")
    q, k, v = random_inputs(dtype=torch.float32, seed=22, **SHAPE)
    c = paged(cl, place(cl, q, k, v, "hnd"))
    pool = engine_pool(cl)
    n = c.n_blocks
    c.map_blocks(0, "k", pool[0, 5])
    cl.close()
    assert c.released
    assert bool((pool[0, 5:5 + n] == FILL).all())


def caches_of(cl):
    cl.nop()  # reaps the ring: completions of dropped requests are seen here
    cl.nop()  # and the releases they sent are done by the time this is
    return cl.stats()["caches"]


def settles_at(cl, n):
    """The session's cache count reaches n (compactions still running
    complete, and their caches go back, within a few seconds)."""
    for _ in range(200):
        got = caches_of(cl)
        if got == n:
            return True
        time.sleep(0.02)
    return got


def test_dropped_request_cancelled(daemon, snapkv):
    """A request still waiting when dropped (the first of a decision group
    of two) is cancelled (issue 20), not abandoned: the drop returns once it
    can write nothing more (its group failed at once, not at its 20 s
    timeout) and it keeps nothing; the key is free for a new group."""
    cl = snapkv.Client(daemon.sock, name="dropper")
    q, k, v = random_inputs(dtype=torch.float32, seed=23, **SHAPE)
    qs, ks, vs, kw = place(cl, q, k, v, "hnd")
    req = cl.submit(qs, ks, vs, **P, **kw, group=("drop-1", 2, 20000))
    assert not req.done()
    del req  # unfinished: cancelled before del returns
    assert caches_of(cl) == 0
    a = cl.submit(qs, ks, vs, **P, **kw, group=("drop-1", 2, 20000))
    with cl.compact(qs, ks, vs, **P, **kw, group=("drop-1", 2, 20000)) as c, a.wait() as b:
        assert c.group_size == b.group_size == 2
        assert settles_at(cl, 2) is True
    assert settles_at(cl, 0) is True
    cl.close()


def test_many_dropped_requests(snapkv, tmp_path):
    """Far more dropped requests than max_caches: none is refused for
    "too many caches", and none is left when they are done."""
    conf = tmp_path / "snapkvd.conf"
    conf.write_text("max_caches = 64\n")
    d = Daemon(extra=("--config", str(conf)))
    try:
        cl = snapkv.Client(d.sock, name="flood")
        q, k, v = random_inputs(dtype=torch.float32, seed=24, layers=1, h_q=2, h_kv=1,
                                L=32, D=8, n_q=4)
        qs, ks, vs, kw = place(cl, q, k, v, "hnd")
        n = int(os.environ.get("SKV_DROPS", "20000"))
        for _ in range(n):
            cl.submit(qs, ks, vs, window=4, budget=8, **kw)  # dropped at once
        assert settles_at(cl, 0) is True
        with cl.compact(qs, ks, vs, window=4, budget=8, **kw) as c:
            assert c.kept == 8
        assert settles_at(cl, 0) is True
        cl.close()
    finally:
        d.stop()
