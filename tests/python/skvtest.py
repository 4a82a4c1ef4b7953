# SPDX-License-Identifier: MIT
"""Helpers of the snapkv module's tests: random K/V/Q in registered buffers in
every layout, and safetensors files for `snapkvctl compact --offline`."""
import json
import struct

import numpy as np
import torch

ST_DTYPE = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.int32: "I32"}
ST_TORCH = {v: k for k, v in ST_DTYPE.items()}


def st_write(path, tensors):
    """tensors: name -> CPU torch tensor (any layout; written contiguous)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype != torch.int32 \
            else t.contiguous().numpy().tobytes()
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base, out = 8 + n, {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        b, e = d["data_offsets"]
        raw = bytearray(data[base + b:base + e])
        t = torch.frombuffer(raw, dtype=torch.uint8) if e > b else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(ST_TORCH[d["dtype"]]).reshape(d["shape"])
    return out


def random_inputs(layers, h_q, h_kv, L, D, n_q, dtype, seed=1):
    """Plain tensors q [layers][H_q, n_q, D], k, v [layers][H_kv, L, D]: the
    last n_q positions' queries correlate with some keys, as in a model."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(layers, h_kv, L, D, generator=g)
    v = torch.randn(layers, h_kv, L, D, generator=g)
    q = torch.randn(layers, h_q, n_q, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def place(client, q, k, v, layout, block_size=8, seed=3):
    """Copy q, k, v into buffers of client.empty() in layout 'hnd', 'nhd' or
    'paged' (blocks shuffled). Returns (q_list, k_list, v_list, kwargs)."""
    layers, h_kv, L, D = k.shape
    dt = k.dtype
    qs = []
    qbuf = client.empty((layers,) + tuple(q.shape[1:]) if layout != "nhd" else
                        (layers, q.shape[2], q.shape[1], D), dt)
    for l in range(layers):
        if layout == "nhd":
            qbuf[l].copy_(q[l].transpose(0, 1))
        else:
            qbuf[l].copy_(q[l])
        qs.append(qbuf[l])
    if layout == "hnd":
        buf = client.empty((2, layers, h_kv, L + 5, D), dt)  # room past L: strides != shape
        buf[0, :, :, :L].copy_(k)
        buf[1, :, :, :L].copy_(v)
        return qs, [buf[0, l, :, :L] for l in range(layers)], \
            [buf[1, l, :, :L] for l in range(layers)], {"layout": "hnd"}
    if layout == "nhd":
        buf = client.empty((2, layers, L, h_kv, D), dt)
        buf[0].copy_(k.transpose(1, 2))
        buf[1].copy_(v.transpose(1, 2))
        return qs, list(buf[0]), list(buf[1]), {"layout": "nhd"}
    nb = (L + block_size - 1) // block_size
    pool_blocks = 2 * nb + 3
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(pool_blocks, generator=g)[:nb].to(torch.int32)
    pool = client.empty((2, layers, pool_blocks, block_size, h_kv, D), dt)
    for i in range(nb):
        t0, t1 = i * block_size, min(L, (i + 1) * block_size)
        b = int(table[i])
        pool[0, :, b, :t1 - t0].copy_(k[:, :, t0:t1].transpose(1, 2))
        pool[1, :, b, :t1 - t0].copy_(v[:, :, t0:t1].transpose(1, 2))
    return qs, list(pool[0]), list(pool[1]), {"block_table": table, "prompt_len": L}
