# SPDX-License-Identifier: MIT
"""The places where snapkv_vllm patches vLLM 0.32.0 (each listed in
docs/vllm-sglang.md), installed once per worker process by the connector:

1. CPUAttentionBackendImpl.forward (vllm/v1/attention/backends/cpu_attn.py):
   wrapped to hand the post-RoPE query of each layer to the connector, which
   copies the window rows of the requests it captures (the connector API has
   no hook that sees queries: save_kv_layer gets K/V only).
2. GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py, which
   CPUModelRunner inherits): wrapped to remember the runner, whose
   input_batch.req_ids give the order of the rows of query_start_loc.
3. vllm.v1.worker.utils.torch, only while the KV cache is allocated inside
   the connector's get_mem_pool_context (the sanctioned hook; the CPU worker
   honours it): torch.zeros of the one int8 backing buffer becomes a
   registered, daemon-writable memfd from client.empty().
"""
import contextlib

import torch

RUNNER = {}
_installed = {}


def install(connector):
    _installed["connector"] = connector
    if _installed.get("done"):
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    fwd = CPUAttentionBackendImpl.forward

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *a, **kw):
        c = _installed.get("connector")
        if c is not None and attn_metadata is not None:
            c.capture(getattr(layer, "layer_name", None), query, attn_metadata)
        return fwd(self, layer, query, key, value, kv_cache, attn_metadata, output, *a, **kw)

    forward.__wrapped__ = fwd
    CPUAttentionBackendImpl.forward = forward

    ex = GPUModelRunner.execute_model

    def execute_model(self, *a, **kw):
        RUNNER["runner"] = self
        return ex(self, *a, **kw)

    execute_model.__wrapped__ = ex
    GPUModelRunner.execute_model = execute_model
    _installed["done"] = True


class _TorchInMemfd:
    """vllm.v1.worker.utils's `torch` while the KV cache is allocated: its
    zeros() of the int8 backing buffer comes from client.empty()."""

    def __init__(self, connector):
        self._c = connector
        self.buffers = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def zeros(self, *size, dtype=None, device=None, **kw):
        if len(size) == 1 and isinstance(size[0], int) and dtype == torch.int8 and \
                torch.device(device if device is not None else "cpu").type == "cpu" and not kw:
            # the module makes f32/f16/bf16 buffers: the same bytes as f32
            n = size[0]
            if n % 4:
                raise RuntimeError(f"snapkv_vllm: a KV cache of {n} bytes is not whole f32 words")
            t = self._c.connect().empty((n // 4,), torch.float32, writable=True)
            self.buffers.append(t)
            return t.view(torch.int8)  # a new memfd reads as zeros
        return torch.zeros(*size, dtype=dtype, device=device, **kw)


@contextlib.contextmanager
def pool_in_memfd(connector):
    import vllm.v1.worker.utils as wu

    shim = _TorchInMemfd(connector)
    saved = wu.torch
    wu.torch = shim
    try:
        yield
    finally:
        wu.torch = saved
    if not shim.buffers:
        raise RuntimeError("snapkv_vllm: vLLM allocated its KV cache outside "
                           "allocate_kv_cache's torch.zeros: not in registered memory")
    connector.pool_buffers = shim.buffers
