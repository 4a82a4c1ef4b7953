# SPDX-License-Identifier: MIT
"""Prefill ordering from Python (issue 20, point 2): compact()/submit()
after= maps a torch.cuda.Event created with interprocess=True (its
ipc_handle()), the 64 handle bytes, or (tensor, offset, value) naming a CUDA
flag onto the request's prefill wait, each with an optional timeout_ms;
everything else is refused by name before anything is sent. Against
snapkvd --backend cuda on the emulated plugin (when built), an emulated
interprocess event held pending keeps the compaction from starting until
it completes, fails it with ETIME past its timeout, and a cancel while it
waits writes nothing."""
import ctypes
import errno
import os

import pytest
import torch

from conftest import BUILD, Daemon
from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=4, h_kv=2, L=64, D=16, n_q=8)
P = dict(window=8, budget=24, gqa="group")
EMU = os.path.join(BUILD, "tests", "gpu", "emu", "libskv-cuda-emu.so")
EMU_RT = os.path.join(BUILD, "tests", "gpu", "emu", "libcuda-emu-rt.so")  # events, by ctypes


class FakeEvent:
    """What the module reads of a torch.cuda.Event: ipc_handle()."""

    def __init__(self, handle=bytes(64), error=None):
        self.handle, self.error = handle, error

    def ipc_handle(self):
        if self.error:
            raise RuntimeError(self.error)
        return self.handle


@pytest.fixture
def req_args(client):
    q, k, v = random_inputs(dtype=torch.float32, seed=31, **SHAPE)
    qs, ks, vs, kw = place(client, q, k, v, "hnd")
    return (qs, ks, vs), dict(P, **kw)


def test_after_refusals(client, snapkv, req_args):
    a, kw = req_args
    for bad, exc, words in [
        (3, TypeError, "interprocess=True"),
        ("event", TypeError, "interprocess=True"),
        ((1, 2, 3, 4, 5), TypeError, "interprocess=True"),
        (bytes(10), ValueError, "64 bytes"),
        (FakeEvent(bytes(63)), ValueError, "64 bytes"),
        (FakeEvent(error="CUDA error: invalid resource handle"), ValueError,
         "interprocess=True"),
        (FakeEvent(handle=[0] * 64), TypeError, "not bytes"),
        ((FakeEvent(), -1), ValueError, "timeout_ms"),
        ((FakeEvent(), 2 ** 33), ValueError, "timeout_ms"),
        ((FakeEvent(), "1s"), TypeError, "timeout_ms"),
        ((a[1][0], 0, 1), ValueError, "CUDA memory"),  # a memfd buffer: not CUDA
        ((torch.zeros(4), 0, 1), ValueError, "empty()"),  # not registered at all
    ]:
        for call in (client.compact, client.submit):
            with pytest.raises(exc) as e:
                call(*a, **kw, after=bad)
            assert words in str(e.value), (bad, str(e.value))


def test_after_reaches_the_daemon(client, snapkv, req_args):
    """The host backend has no prefill waits: its refusal proves the wait
    was sent, for each form that libsnapkv accepts."""
    a, kw = req_args
    for after in (FakeEvent(), bytes(64), (bytes(64), 500)):
        with pytest.raises(snapkv.Error) as e:
            client.compact(*a, **kw, after=after)
        assert e.value.errno in (errno.ENOTSUP, errno.EOPNOTSUPP), str(e.value)
        assert "prefill" in str(e.value)
    with client.compact(*a, **kw, after=None) as c:  # None: no wait
        assert c.kept == 24


class EmuEvent:
    """An interprocess event of the emulated CUDA runtime, held pending:
    what a torch.cuda.Event(interprocess=True) recorded after a prefill
    still running is."""

    def __init__(self, lib):
        self.lib, self.ev = lib, ctypes.c_void_p()
        assert lib.cudaEventCreateWithFlags(ctypes.byref(self.ev), 4 | 2) == 0
        assert lib.cuda_emu_event_hold(self.ev, 1) == 0
        assert lib.cudaEventRecord(self.ev, None) == 0
        self.h = ctypes.create_string_buffer(64)
        assert lib.cudaIpcGetEventHandle(self.h, self.ev) == 0

    def ipc_handle(self):
        return self.h.raw

    def complete(self):
        self.lib.cuda_emu_event_hold(self.ev, 0)


@pytest.fixture(scope="module")
def emu():
    if not os.path.exists(EMU) or not os.path.exists(EMU_RT):
        pytest.skip(f"{EMU} or {EMU_RT} not built (CUDA=0?)")
    lib = ctypes.CDLL(EMU_RT, mode=os.RTLD_LOCAL)
    lib.cuda_emu_event_hold.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cudaIpcGetEventHandle.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    old = os.environ.get("SKV_CUDA_PLUGIN")
    os.environ["SKV_CUDA_PLUGIN"] = os.path.realpath(EMU)
    try:
        d = Daemon(extra=("--backend", "cuda"))
    finally:
        if old is None:
            del os.environ["SKV_CUDA_PLUGIN"]
        else:
            os.environ["SKV_CUDA_PLUGIN"] = old
    yield lib, d
    d.stop()


@pytest.fixture
def emu_client(emu, snapkv):
    with snapkv.Client(emu[1].sock, name="after") as c:
        yield c


def emu_args(c):
    q, k, v = random_inputs(dtype=torch.float32, seed=32, **SHAPE)
    qs, ks, vs, kw = place(c, q, k, v, "hnd")
    return (qs, ks, vs), dict(P, **kw)


def test_after_event_emu(emu, emu_client, snapkv):
    a, kw = emu_args(emu_client)
    ev = EmuEvent(emu[0])
    rq = emu_client.submit(*a, **kw, after=ev)
    emu_client.nop()  # answered after the daemon took the request
    assert not rq.done()  # the prefill is still running: nothing done
    assert emu_client.stats()["caches"] == 1  # counted while it waits
    ev.complete()
    with rq.wait() as c:
        assert c.kept == 24


def test_after_event_timeout_emu(emu, emu_client, snapkv):
    a, kw = emu_args(emu_client)
    ev = EmuEvent(emu[0])
    with pytest.raises(snapkv.Error) as e:
        emu_client.compact(*a, **kw, after=(ev, 200))
    assert e.value.errno == errno.ETIME and "prefill_wait" in str(e.value)
    ev.complete()


def test_cancel_in_prefill_wait_emu(emu, emu_client):
    a, kw = emu_args(emu_client)
    ev = EmuEvent(emu[0])
    rq = emu_client.submit(*a, **kw, after=(ev, 60000))
    assert rq.cancel() == "unwritten"  # stopped in its wait, nothing run
    assert emu_client.stats()["caches"] == 0
    ev.complete()
