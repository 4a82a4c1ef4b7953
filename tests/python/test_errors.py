# SPDX-License-Identifier: MIT
"""Refusals and errors: tensors outside registered storage (ValueError naming
empty()), daemon refusals as snapkv.Error with errno and the daemon's
message, and a long list of bad arguments that must each raise, never crash
the interpreter."""
import errno

import numpy as np
import pytest
import torch

from skvtest import place, random_inputs

SHAPE = dict(layers=2, h_q=4, h_kv=2, L=40, D=8, n_q=8)
P = dict(window=8, budget=16)


@pytest.fixture
def inputs(client):
    q, k, v = random_inputs(dtype=torch.float32, **SHAPE)
    return place(client, q, k, v, "hnd")


def test_error_is_oserror(snapkv):
    assert issubclass(snapkv.Error, OSError)


def test_register_refusals(client, daemon, snapkv, inputs):
    qs, ks, vs, kw = inputs
    plain = torch.zeros(2, 40, 8)
    for bad in [plain, np.zeros((2, 40, 8), np.float32)]:
        with pytest.raises(ValueError, match=r"empty\(\)"):
            client.register(bad)
        with pytest.raises(ValueError, match=r"empty\(\)"):
            client.compact(qs, [bad, ks[1]], vs, **P, **kw)
    # a view reaching past the buffer's end is refused too
    t = client.empty((4, 8), torch.float32).numpy()
    over = np.lib.stride_tricks.as_strided(t, (2, 40, 8), (40 * 8 * 4 * 1000, 32, 4))
    with pytest.raises(ValueError, match=r"empty\(\)"):
        client.compact([q.numpy() for q in qs], [over, ks[1].numpy()], [v.numpy() for v in vs],
                       **P, **kw)
    # a tensor from another client's empty(): refused until registered here
    with snapkv.Client(daemon.sock, name="other") as other:
        kk = other.empty((2, 40, 8), torch.float32)
        kk.copy_(ks[0])
        with pytest.raises(ValueError, match=r"empty\(\)"):
            client.compact(qs, [kk, ks[1]], vs, **P, **kw)
        client.register(kk)
        client.register(kk)  # again: a no-op
        with client.compact(qs, [kk, ks[1]], vs, **P, **kw) as c:
            assert c.kept == 16


def test_daemon_errors_carry_errno(client, snapkv, inputs):
    qs, ks, vs, kw = inputs
    cases = [dict(kernel=4), dict(window=41, min_window=9), dict(budget=8), dict(window=4)]
    for extra in cases:
        with pytest.raises(snapkv.Error) as e:
            client.compact(qs, ks, vs, **dict(P, **extra), **kw)
        assert e.value.errno == errno.EINVAL, extra
        assert "compact:" in str(e.value) and len(e.value.strerror) > 10


def test_closed_client(daemon, snapkv):
    c = snapkv.Client(daemon.sock)
    t = c.empty((4,), torch.float32)
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(snapkv.Error) as e:
        c.empty((4,), torch.float32)
    assert e.value.errno == errno.ENOTCONN
    with pytest.raises(snapkv.Error):
        c.compact([t], [t], [t])
    t += 1  # the buffer stays mapped
    assert t.tolist() == [1.0] * 4


def test_connect_refused(snapkv, tmp_path):
    with pytest.raises(snapkv.Error) as e:
        snapkv.Client(str(tmp_path / "nobody.sock"))
    assert e.value.errno in (errno.ENOTCONN, errno.ENOENT, errno.ECONNREFUSED)


def bad_calls(client, qs, ks, vs, kw):
    t = ks[0]
    yield lambda: client.compact()
    yield lambda: client.compact(qs, ks)
    yield lambda: client.compact(None, None, None)
    yield lambda: client.compact(1, 2, 3)
    yield lambda: client.compact(qs, ks, vs, bogus=1)
    yield lambda: client.compact([], [], [])
    yield lambda: client.compact(qs, ks[:1], vs)
    yield lambda: client.compact(qs, [None, ks[1]], vs, **P)
    yield lambda: client.compact(qs, ["x", ks[1]], vs, **P)
    yield lambda: client.compact(qs, [object(), ks[1]], vs, **P)
    yield lambda: client.compact(qs, [t.to(torch.float64), ks[1]], vs, **P)
    yield lambda: client.compact(qs, [t.to(torch.int32), ks[1]], vs, **P)
    yield lambda: client.compact(qs, [t[0], ks[1]], vs, **P)
    yield lambda: client.compact(qs, [t.unsqueeze(0), ks[1]], vs, **P)
    yield lambda: client.compact(qs, [t[:, :, :0], ks[1]], vs, **P)
    yield lambda: client.compact(qs, [t.transpose(1, 2), ks[1]], vs, **P)
    yield lambda: client.compact(qs, [t.flip(1), ks[1]], vs, **P)
    yield lambda: client.compact(qs, [t[:, :20], ks[1]], vs, **P)
    yield lambda: client.compact([qs[0][:, :, :4], qs[1]], ks, vs, **P)
    for k_, v_ in [("window", -1), ("window", 2**40), ("budget", 0), ("budget", "x"),
                   ("capacity", 0),
                   ("kernel", 256), ("kernel", 1.5), ("sinks", -3), ("decode_reserve", -1),
                   ("decode_reserve", 10**30), ("pooling", "median"), ("pooling", 3),
                   ("gqa", "both"), ("policy", "lru"), ("policy", 7),
                   ("protect", 5), ("protect", [(3, 1)]), ("protect", [(0, 1)] * 17),
                   ("protect", [(0, 2**40)]), ("protect", [("a", "b")]), ("protect", [1, 2]),
                   ("layout", "xyz"), ("out_layout", "paged2"), ("out", "disk"),
                   ("out_block_size", 16), ("prompt_len", 0), ("prompt_len", 41),
                   ("prompt_len", -5), ("block_table", [0]), ("block_table", "abc"),
                   ("evictable", np.array([1, 2]))]:
        yield lambda k_=k_, v_=v_: client.compact(qs, ks, vs, **dict(P, **{k_: v_}))
    pool = client.empty((6, 8, 2, 8), torch.float32)
    for tab, pl in [([0, 1, 2, 3, 6], 40), ([0, 1, 2, 3, -1], 40),
                    ([0, 1], 40), ([[0, 1]], 16), (torch.tensor([0.5]), 8), ([], 8),
                    ([0] * 5, None)]:
        yield lambda tab=tab, pl=pl: client.compact(qs, [pool, pool], [pool, pool], **P,
                                                    block_table=tab, prompt_len=pl)
    yield lambda: client.compact(qs, [pool[0], pool[1]], [pool, pool], **P, block_table=[0])
    yield lambda: client.empty((0,), torch.float32)
    yield lambda: client.empty((-1, 4), torch.float32)
    yield lambda: client.empty((2**40, 2**40), torch.float32)
    yield lambda: client.empty((1,) * 9, torch.float32)
    yield lambda: client.empty("abc", torch.float32)
    yield lambda: client.empty((4,), torch.float64)
    yield lambda: client.empty((4,), "int8")
    yield lambda: client.empty((4,), None)
    yield lambda: client.empty((4,), np.int64)
    yield lambda: client.register(None)
    yield lambda: client.register(torch.zeros(3))
    yield lambda: client.register(b"bytes")


def test_bad_arguments_raise(client, snapkv, inputs):
    qs, ks, vs, kw = inputs
    n = 0
    for call in bad_calls(client, qs, ks, vs, kw):
        try:
            call()
        except (TypeError, ValueError, OverflowError, snapkv.Error):
            pass
        else:
            pytest.fail(f"bad call {n} did not raise")
        n += 1
    assert n > 60
    # and the client still works afterwards
    with client.compact(qs, ks, vs, **P) as c:
        assert c.kept == 16


def test_bad_cache_and_request_arguments(client, snapkv, inputs):
    qs, ks, vs, kw = inputs
    with client.compact(qs, ks, vs, **P) as c:
        for bad in [-1, 2, 2**70, "0", None, 1.0]:
            with pytest.raises((TypeError, IndexError, OverflowError)):
                c.k(bad)
            with pytest.raises((TypeError, IndexError, OverflowError)):
                c.positions(bad)
        for bad in [-1, 2**40, "x", None]:
            with pytest.raises((TypeError, ValueError, OverflowError)):
                c.append(bad)
            with pytest.raises((TypeError, ValueError, OverflowError)):
                c.grow(bad)
        with pytest.raises((TypeError, ValueError)):
            c.grow(0)
    r = client.submit(qs, ks, vs, **P)
    for bad in [-1, float("nan"), "x", 10**12]:
        with pytest.raises((TypeError, ValueError)):
            r.wait(bad)
    r.wait(10).release()
    with pytest.raises((TypeError, ValueError)):
        snapkv.Client(arrays="jax")
    with pytest.raises((TypeError, ValueError, OverflowError)):
        snapkv.Client(timeout_ms=-1)
    with pytest.raises(TypeError):
        snapkv.Client(socket=5)
    with pytest.raises(ValueError):
        snapkv.Client(socket="x" * 200)


class FakeStorage:
    def __init__(self, handle, size):
        self.handle, self.size = handle, size

    def _share_cuda_(self):
        return (0, self.handle, self.size, 0, b"", 0, b"", False)

    def data_ptr(self):
        return 0x7f0000000000


class FakeCuda(torch.Tensor):
    """Looks like a CUDA tensor to the module (this machine has no CUDA)."""
    handle, size = bytes(64), 4096

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0

    def storage(self):
        return FakeStorage(self.handle, self.size)

    def untyped_storage(self):
        return self.storage()


def test_register_cuda_tensor_host_daemon(client, snapkv):
    """The CUDA IPC path up to the daemon: a host-backend daemon refuses it with
    a clear snapkv.Error; malformed sharing data is a ValueError."""
    t = torch.zeros(8).as_subclass(FakeCuda)
    with pytest.raises(snapkv.Error) as e:
        client.register(t)
    assert e.value.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL), e.value
    bad = torch.zeros(8).as_subclass(FakeCuda)
    bad.handle = b"short"
    with pytest.raises(ValueError):
        client.register(bad)
    # a CUDA tensor that was never registered is refused by compact
    with pytest.raises(ValueError, match=r"empty\(\)"):
        client.compact([t.view(1, 2, 4)], [t.view(1, 2, 4)], [t.view(1, 2, 4)])
