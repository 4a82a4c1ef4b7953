# SPDX-License-Identifier: MIT
"""Cancel and fence (issue 20): an engine gives up on a writeback compaction,
cancels it (Request.cancel(), dropping the Request, or Client.close()) and
reuses its destination blocks: nothing of it may be written afterwards.
Moments: queued behind a long job on the daemon's one worker (never
written), running (stopped part-way or completed first), after completion
(wait() still hands out the cache). After each cancel the blocks are
refilled and a small compaction goes through the same worker (FIFO: it has
left the cancelled job behind); the refill must be intact."""
import time

import pytest
import torch

from conftest import Daemon

LAYERS, H_Q, H_KV, L, D, W, C, BS = 48, 8, 2, 8192, 64, 32, 256, 16
NB = C // BS
FILL = 7.0
HANG_S = 120  # a hang guard, never a timing


@pytest.fixture(scope="module")
def d1():
    d = Daemon(extra=("--workers", "1"))
    yield d
    d.stop()


@pytest.fixture
def cl(d1, snapkv):
    with snapkv.Client(d1.sock, name="cancel") as c:
        yield c


def inputs(c):
    """Every layer reads the same K/V (one layer of memory, a full scoring each)."""
    g = torch.Generator().manual_seed(20)
    kv = c.empty((2, H_KV, L, D), torch.float16)
    kv.copy_(torch.randn(2, H_KV, L, D, generator=g).half())
    q = c.empty((H_Q, W, D), torch.float16)
    q.copy_(torch.randn(H_Q, W, D, generator=g).half())
    return [q] * LAYERS, [kv[0]] * LAYERS, [kv[1]] * LAYERS


def dest(c):
    pool = c.empty((2, LAYERS, NB, BS, H_KV, D), torch.float16, writable=True)
    pool.fill_(FILL)
    return pool


def submit(c, inp, pool, layers=LAYERS):
    q, k, v = inp
    return c.submit(q[:layers], k[:layers], v[:layers], window=W, budget=C, gqa="group",
                    out="writeback", out_block_size=BS, out_block_table=list(range(NB)),
                    out_buffer=(list(pool[0, :layers]), list(pool[1, :layers])))


def written(pool):
    return int((pool != FILL).sum())


def wait_running(pool):
    for _ in range(HANG_S * 500):
        if written(pool):
            return True
        time.sleep(0.002)
    return False


def through_the_worker(c, inp):
    q, k, v = inp
    c.compact(q[:1], k[:1], v[:1], window=W, budget=C, gqa="group").release()


def test_queued_then_running(cl):
    inp = inputs(cl)
    pa, pb = dest(cl), dest(cl)
    ra = submit(cl, inp, pa)
    assert wait_running(pa)
    rb = submit(cl, inp, pb)  # queued behind ra on the one worker
    r = rb.cancel()
    if not ra.done():  # ra still runs: rb never started
        assert r == "unwritten"
        assert written(pb) == 0
    else:
        assert r in ("unwritten", "stopped", "completed")
    pb.fill_(FILL)  # reused
    r = ra.cancel()
    assert r in ("stopped", "completed")
    pa.fill_(FILL)  # reused
    through_the_worker(cl, inp)
    assert written(pa) == 0 and written(pb) == 0
    assert cl.stats()["caches"] == 0


def test_completed_then_wait(cl):
    inp = inputs(cl)
    pa = dest(cl)
    rq = submit(cl, inp, pa, layers=2)
    for _ in range(HANG_S * 500):
        if rq.done():
            break
        time.sleep(0.002)
    assert rq.cancel() == "completed"
    with rq.wait() as c:
        assert c.kept == C
    assert written(pa) > 0
    with pytest.raises(Exception):
        rq.cancel()


def test_drop_cancels(cl):
    inp = inputs(cl)
    pa = dest(cl)
    rq = submit(cl, inp, pa)
    assert wait_running(pa)
    del rq  # unfinished: cancelled, and fenced, before del returns
    pa.fill_(FILL)
    through_the_worker(cl, inp)
    assert written(pa) == 0


def test_close_fences(d1, snapkv, cl):
    inp1 = inputs(cl)
    c2 = snapkv.Client(d1.sock, name="cancel-close")
    inp = inputs(c2)
    pa = dest(c2)  # stays mapped here after close
    rq = submit(c2, inp, pa)
    assert wait_running(pa)
    c2.close()  # the request is dropped first, then the session fenced
    pa.fill_(FILL)
    through_the_worker(cl, inp1)
    assert written(pa) == 0
    del rq
