# SPDX-License-Identifier: MIT
"""The engine's paged KV cache: one pool per layer for K and V,
[n_blocks, block_size, H_kv, D] (vLLM's block layout), in a tensor from
client.empty() so the daemon reads it in place; a block manager (free list,
reference counts for blocks shared between sequences); and per sequence a
block table and two lengths: the physical one (slots filled) and the logical
one (the next token's position, for RoPE). They are equal until a compaction
keeps fewer slots than the prompt had tokens."""
import torch


class BlockManager:
    def __init__(self, n_blocks):
        self.n = n_blocks
        self.free = list(range(n_blocks - 1, -1, -1))
        self.refs = [0] * n_blocks

    def alloc(self):
        if not self.free:
            raise MemoryError(f"KV pool full: all {self.n} blocks in use")
        b = self.free.pop()
        self.refs[b] = 1
        return b

    def share(self, b):
        assert self.refs[b] > 0
        self.refs[b] += 1

    def release(self, b):
        assert self.refs[b] > 0
        self.refs[b] -= 1
        if self.refs[b] == 0:
            self.free.append(b)

    def alloc_run(self, n, align):
        """n consecutive free blocks starting at a multiple of align (for
        arena runs mapped into the pool at a page boundary)."""
        free = set(self.free)
        for b in range(0, self.n - n + 1, align):
            if all(x in free for x in range(b, b + n)):
                for x in range(b, b + n):
                    self.free.remove(x)
                    self.refs[x] = 1
                return list(range(b, b + n))
        raise MemoryError(f"KV pool: no {n} consecutive free blocks")

    @property
    def used(self):
        return self.n - len(self.free)


class Sequence:
    def __init__(self, name):
        self.name = name
        self.table = []   # block ids; the first `shared` are shared with others
        self.shared = 0
        self.n_phys = 0   # slots filled: kept + g after a compaction
        self.next_pos = 0  # logical position of the next token: L + g


class PagedKV:
    def __init__(self, client, cfg, n_blocks, block_size):
        self.bs = block_size
        self.h, self.d = cfg.n_kv_heads, cfg.head_dim
        # [layers, K/V, blocks, block_size, H_kv, D]: one registered memfd,
        # writable by the daemon (writeback compactions land in its blocks)
        self.pool = client.empty((cfg.n_layers, 2, n_blocks, block_size, self.h, self.d),
                                 torch.float32, writable=True)
        self.pool.zero_()
        self.bm = BlockManager(n_blocks)

    def k_pool(self, l):
        return self.pool[l, 0]

    def v_pool(self, l):
        return self.pool[l, 1]

    def blocks_for(self, slots):
        return (slots + self.bs - 1) // self.bs

    def reserve(self, s, n):
        """Blocks for n more slots of s."""
        while len(s.table) * self.bs < s.n_phys + n:
            s.table.append(self.bm.alloc())

    def write(self, l, s, slot0, k, v):
        """K/V rows [n, H_kv, D] at slots slot0.. of s (never a shared block)."""
        slots = torch.arange(slot0, slot0 + k.shape[0])
        blocks = torch.tensor(s.table, dtype=torch.int64)[slots // self.bs]
        assert all(self.bm.refs[b] == 1 for b in set(blocks.tolist())), "write to a shared block"
        rows = slots % self.bs
        self.pool[l, 0][blocks, rows] = k
        self.pool[l, 1][blocks, rows] = v

    def gather(self, l, s, n):
        """The first n slots of s, [n, H_kv, D] each for K and V: paged
        attention by gathering the sequence's blocks."""
        idx = torch.tensor(s.table[:self.blocks_for(n)], dtype=torch.int64)
        k = self.pool[l, 0][idx].reshape(-1, self.h, self.d)[:n]
        v = self.pool[l, 1][idx].reshape(-1, self.h, self.d)[:n]
        return k, v

    def fork(self, src, dst, n_blocks):
        """dst starts with src's first n_blocks full blocks, shared."""
        assert n_blocks * self.bs <= src.n_phys
        dst.table = list(src.table[:n_blocks])
        for b in dst.table:
            self.bm.share(b)
        dst.shared = n_blocks
        dst.n_phys = dst.next_pos = n_blocks * self.bs

    def free_blocks(self, blocks):
        for b in blocks:
            self.bm.release(b)

    def free(self, s):
        self.free_blocks(s.table)
        s.table, s.shared, s.n_phys = [], 0, 0
