# SPDX-License-Identifier: MIT
"""The tiny Llama of examples/tiny-llama in torch (float32), computing
exactly what tl-model.c computes: RMSNorm, RoPE on adjacent pairs at each
token's logical position, GQA attention, SwiGLU. Its attention reads K/V only
through a paged pool and a block table per sequence (paged.py), the same code
before and after compaction; keys are stored after RoPE, so attention needs
no positions."""
import numpy as np
import torch

from gguf import GGUF, Tokenizer


class Config:
    def __init__(self, g):
        if g.kv.get("general.architecture") != b"llama":
            raise ValueError("model: general.architecture is not 'llama'")
        self.dim = g.u32("llama.embedding_length")
        self.n_layers = g.u32("llama.block_count")
        self.n_heads = g.u32("llama.attention.head_count")
        self.n_kv_heads = g.u32("llama.attention.head_count_kv", self.n_heads)
        self.hidden = g.u32("llama.feed_forward_length")
        self.eps = g.f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        self.rope_base = g.f32("llama.rope.freq_base", 10000.0)
        self.head_dim = self.dim // self.n_heads


class TinyLlama:
    def __init__(self, path):
        g = GGUF(path)
        self.cfg = c = Config(g)
        self.tok = Tokenizer(g)
        self.vocab = len(self.tok.pieces)

        def w(name):
            return torch.from_numpy(np.array(g.tensors[name]))

        self.embd = w("token_embd.weight")
        self.out_norm = w("output_norm.weight")
        self.output = w("output.weight") if "output.weight" in g.tensors else self.embd
        self.layers = []
        for l in range(c.n_layers):
            p = f"blk.{l}."
            self.layers.append({k: w(p + k + ".weight") for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                "ffn_gate", "ffn_up", "ffn_down")})
        # RoPE: pair (2i, 2i+1) turns by pos * base^(-2i/D), in float32 as tl-model.c
        i = torch.arange(0, c.head_dim, 2, dtype=torch.float32)
        self.freq = 1.0 / torch.pow(torch.tensor(c.rope_base, dtype=torch.float32),
                                    i / float(c.head_dim))

    def rmsnorm(self, x, w):
        ss = (x * x).sum(-1, keepdim=True) / x.shape[-1] + self.cfg.eps
        return w * ((1.0 / torch.sqrt(ss)) * x)

    def rope(self, x, pos):
        """x [N, H, D], pos [N] int64: rotate adjacent pairs."""
        a = pos.to(torch.float32)[:, None] * self.freq[None, :]
        cr, ci = torch.cos(a)[:, None, :], torch.sin(a)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * cr - x1 * ci
        out[..., 1::2] = x0 * ci + x1 * cr
        return out

    def forward(self, kv, seqs, tokens, qcap=None):
        """Run a batch: seqs[i] gets tokens[i] (a list of ids) appended at its
        next physical slots and logical positions; every token attends to its
        sequence's slots up to its own. kv: the paged cache (paged.PagedKV).
        qcap: {seq: (q_out [layers, H_q, W, D], first_position)} to capture
        post-RoPE queries of a prefill window. Returns logits of each
        sequence's last token [len(seqs), vocab]."""
        c = self.cfg
        toks, pos, owner = [], [], []
        for i, (s, ts) in enumerate(zip(seqs, tokens)):
            kv.reserve(s, len(ts))
            toks += ts
            pos += range(s.next_pos, s.next_pos + len(ts))
            owner.append((s, s.n_phys, len(ts)))
        toks = torch.tensor(toks, dtype=torch.int64)
        pos = torch.tensor(pos, dtype=torch.int64)
        x = self.embd[toks]
        G = c.n_heads // c.n_kv_heads
        scale = 1.0 / float(np.sqrt(np.float32(c.head_dim), dtype=np.float32))
        for l, w in enumerate(self.layers):
            h = self.rmsnorm(x, w["attn_norm"])
            q = self.rope((h @ w["attn_q"].T).view(-1, c.n_heads, c.head_dim), pos)
            k = self.rope((h @ w["attn_k"].T).view(-1, c.n_kv_heads, c.head_dim), pos)
            v = (h @ w["attn_v"].T).view(-1, c.n_kv_heads, c.head_dim)
            o = torch.empty_like(q)
            at = 0
            for s, slot0, n in owner:
                kv.write(l, s, slot0, k[at:at + n], v[at:at + n])
                if qcap and s in qcap:
                    qbuf, first = qcap[s]
                    rows = pos[at:at + n] - first
                    sel = (rows >= 0) & (rows < qbuf.shape[2])
                    qbuf[l][:, rows[sel]] = q[at:at + n][sel].transpose(0, 1)
                kk, vv = kv.gather(l, s, slot0 + n)  # [slots, H_kv, D], same path always
                qq = q[at:at + n]  # [n, H_q, D]
                kh = kk.repeat_interleave(G, dim=1)  # query head h reads kv head h // G
                vh = vv.repeat_interleave(G, dim=1)
                sc = torch.einsum("nhd,thd->hnt", qq, kh) * scale
                t = torch.arange(slot0 + n)
                mask = t[None, :] > (slot0 + torch.arange(n))[:, None]
                sc = sc.masked_fill(mask[None], float("-inf"))
                a = torch.softmax(sc, dim=-1)
                o[at:at + n] = torch.einsum("hnt,thd->nhd", a, vh)
                at += n
            x = x + o.reshape(-1, c.dim) @ w["attn_output"].T
            h = self.rmsnorm(x, w["ffn_norm"])
            gt = h @ w["ffn_gate"].T
            x = x + (gt / (1.0 + torch.exp(-gt)) * (h @ w["ffn_up"].T)) @ w["ffn_down"].T
        for s, _, n in owner:
            s.n_phys += n
            s.next_pos += n
        last = torch.tensor([a + n - 1 for a, n in zip(
            np.cumsum([0] + [n for _, _, n in owner[:-1]]), [n for _, _, n in owner])])
        return self.rmsnorm(x[last], self.out_norm) @ self.output.T
