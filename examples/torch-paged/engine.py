#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torch-paged: a reference paged engine in Python beside snapkvd.

Several sequences share a system prompt; its blocks are prefilled once and
shared. Each sequence's prompt is prefilled into its own blocks of a paged KV
pool that lives in a registered memfd (client.empty), the last W post-RoPE
queries per layer are captured into a registered staging tensor, and the
daemon compacts every prompt (submitted together, compacted concurrently)
with the shared prefix protected. The compact K/V go into fresh blocks (the
shared prefix's blocks stay in place), the old ones are freed, and all sequences decode together through the same
paged attention (gather the sequence's blocks) as before, each with its
logical length (next position L + g, for RoPE) and physical length (kept +
g slots). With --compare (default) each sequence is checked against its own
full cache, teacher-forced on the full cache's greedy text.

Destinations (--out): 'writeback' (default: the daemon writes the compact
K/V straight into fresh blocks of the engine's pool, nothing else), 'paged'
(the compact blocks in the daemon's arena, mapped MAP_FIXED into a run of the
pool's blocks: no copy at all), 'arena' (the dense HND output in the arena,
copied by the engine into fresh blocks).

Budgets (--budget): uniform (C, the default) or mass:TAU[:CMIN:CMAX:STEP]
(one C* for every head, the smallest on the ladder whose retained mass
reaches TAU in every head), and --fallback-below F (the whole prompt when a
head would keep less): the block layout takes one length for every head of
every layer. Writeback tables are sized for the most a head may keep
(min(L, C_max); L with a fallback); the blocks past the kept slots go back
to the free list."""
import mmap
import argparse
import os
import sys
import time

import torch

import paged
from model import TinyLlama

SYSTEM = ("Once upon a time, in a small town, there lived many children who loved "
          "stories. Every night their mother told them a new story.")
STORIES = [
    "Max was a little dog. Max lived in a small house with a girl called Lily. Every day, "
    "Lily and Max went to the park. Max loved to run on the green grass and chase the birds. "
    "Lily liked to sit under a big tree and read her book. One sunny day, Max found a big "
    "red ball under the tree. He picked it up with his mouth and ran to Lily.",
    "Sara had a small garden behind her house. Every morning she gave water to the flowers "
    "and talked to the birds. She had red flowers, yellow flowers and a tall sunflower. One "
    "day, a little bird did not sing. Sara was worried. She looked at the bird and saw that "
    "its wing was hurt. Sara took the bird inside and made a soft bed for it in a box.",
    "Tom and his friend Ben wanted to build a big tower. They found many blocks in the "
    "toy box. Tom put a red block on a blue block. Ben put a yellow block on top. The tower "
    "was very tall. Then the cat came and jumped on the table. The tower fell down and the "
    "blocks were everywhere. Tom was sad, but Ben said they could build it again.",
]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", default=os.environ.get(
        "SNAPKV_MODEL", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared",
                                     "models", "stories260K.gguf")))
    p.add_argument("--socket", default=None, help="snapkvd's socket (default: libsnapkv's)")
    p.add_argument("--name", default="torch-paged")
    p.add_argument("-p", "--prompt", action="append", help="a story (repeatable)")
    p.add_argument("--system", default=SYSTEM, help="system prompt shared by all ('' none)")
    p.add_argument("-n", "--steps", type=int, default=48)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--pool-blocks", type=int, default=256)
    p.add_argument("-C", "--capacity", type=int, default=96)
    p.add_argument("-W", "--window", type=int, default=8)
    p.add_argument("-k", "--kernel", type=int, default=5)
    p.add_argument("--pool", default="avg", choices=["avg", "max"])
    p.add_argument("--out", default="writeback", choices=["writeback", "paged", "arena"])
    p.add_argument("--budget", default=None,
                   help="uniform (default) or mass:TAU[:CMIN:CMAX:STEP] (snapkvctl's spelling)")
    p.add_argument("--fallback-below", type=float, default=None,
                   help="keep the whole prompt when a head's retained mass would be below F")
    p.add_argument("--no-compare", dest="compare", action="store_false")
    p.add_argument("--print-positions", action="store_true",
                   help="print the kept positions, as tiny-llama --print-positions")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    a = p.parse_args(argv)
    if a.budget and a.budget.split(":")[0] not in ("uniform", "mass"):
        p.error("--budget: the paged layout takes uniform or mass (one length for every head)")
    return a


def room(a, L):
    """The most slots a head may keep: the size of a writeback table."""
    if a.fallback_below:
        return L
    f = (a.budget or "uniform").split(":")
    c_max = int(f[3]) if f[0] == "mass" and len(f) > 3 else a.capacity
    return min(L, c_max)


def shared_prefix(ids, system_ids, bs):
    """Tokens every sequence starts with, in whole blocks."""
    n = min(len(i) for i in ids)
    if len(ids) == 1:
        n = min(n, len(system_ids))
    for i in range(n):
        if len({tuple(x[:i + 1]) for x in ids} | ({tuple(system_ids[:i + 1])}
                                                   if len(ids) == 1 else set())) > 1:
            n = i
            break
    return n // bs * bs


def kl(p_logits, q_logits):
    lp = torch.log_softmax(p_logits.double(), -1)
    lq = torch.log_softmax(q_logits.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def same_bytes(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


class Engine:
    def __init__(self, args, client, model):
        self.a, self.client, self.m = args, client, model
        c = model.cfg
        self.kv = paged.PagedKV(client, c, args.pool_blocks, args.block_size)
        self.layers = c.n_layers

    def compact_all(self, seqs, qbuf, P):
        """Submit every sequence's compaction, then wait for all."""
        a, kv = self.a, self.kv
        reqs, self.dest = [], []
        for i, s in enumerate(seqs):
            out = {}
            if a.out == "writeback":  # fresh blocks for every slot past the shared prefix
                n = kv.blocks_for(room(a, s.n_phys)) - P // kv.bs
                self.dest.append([kv.bm.alloc() for _ in range(n)])
                # the shared blocks stay where they are (in_place_blocks), and the
                # ledger counts the decode tokens up front (max_decode): no append()
                out = dict(out="writeback", out_block_size=kv.bs, out_block_table=self.dest[-1],
                           in_place_blocks=P // kv.bs, max_decode=a.steps)
            elif a.out == "paged":
                out = dict(out="paged", out_block_size=kv.bs, decode_reserve=a.steps)
            reqs.append(self.client.submit(
                [qbuf[i, l] for l in range(self.layers)],
                [kv.k_pool(l) for l in range(self.layers)],
                [kv.v_pool(l) for l in range(self.layers)],
                block_table=s.table, prompt_len=s.n_phys, window=a.window,
                budget=(a.capacity, a.budget) if a.budget else a.capacity,
                kernel=a.kernel, pooling=a.pool, gqa="group",
                protect=[(0, P)] if P else (),
                fallback_below=a.fallback_below, **out))
        return [r.wait() for r in reqs]

    def adopt_writeback(self, s, cache, dest, P):
        """The daemon wrote the kept slots past the protected prefix into dest;
        the prefix's P/bs shared blocks were left in place (in_place_blocks), so
        the table keeps them and no copy of them exists to free."""
        kv, np_ = self.kv, P // self.kv.bs
        if cache.in_place_blocks != np_ or list(cache.block_table[:np_]) != s.table[:np_]:
            raise RuntimeError(f"{s.name}: the shared blocks are not the cache's first ones")
        used = kv.blocks_for(cache.kept) - np_  # mass: C* may need fewer than the table
        kv.free_blocks(dest[used:])
        old = s.table[s.shared:]
        s.table = s.table[:s.shared] + dest[:used]
        s.n_phys = cache.kept
        return old

    def adopt_paged(self, s, cache, P):
        """Map the cache's arena runs over a run of pool blocks (page-aligned,
        the same blocks in every layer's K and V pool); the blocks past the
        shared prefix join the table. Nothing is copied."""
        kv = self.kv
        block_bytes = kv.bs * kv.h * kv.d * 4
        per_page = max(1, mmap.PAGESIZE // block_bytes)
        n = -(-cache.n_blocks * block_bytes // mmap.PAGESIZE) * mmap.PAGESIZE // block_bytes
        run = kv.bm.alloc_run(max(n, cache.n_blocks), per_page)
        for l in range(self.layers):
            for kvi, which in ((0, "k"), (1, "v")):
                cache.map_blocks(l, which, kv.pool[l, kvi, run[0]])
        for l in range(self.layers):
            pk, pv = kv.gather(l, s, P)
            rk = kv.pool[l, 0, run[0]:run[0] + cache.n_blocks].reshape(-1, kv.h, kv.d)[:P]
            rv = kv.pool[l, 1, run[0]:run[0] + cache.n_blocks].reshape(-1, kv.h, kv.d)[:P]
            if not (same_bytes(rk, pk) and same_bytes(rv, pv)):
                raise RuntimeError(f"{s.name}: compact prefix differs from the shared blocks")
        np_ = P // kv.bs
        old = s.table[s.shared:]
        s.table = s.table[:s.shared] + run[np_:cache.n_blocks]
        s.n_phys = cache.kept
        s.run, s.cache = run, cache  # mapped until the cache is released
        return old

    def unmap(self, s):
        kv = self.kv
        for l in range(self.layers):
            for kvi, which in ((0, "k"), (1, "v")):
                s.cache.unmap_blocks(l, which, kv.pool[l, kvi, s.run[0]])

    def adopt_dense(self, s, cache, P):
        """The daemon's dense output -> fresh blocks after the shared ones.
        The first P compact slots are the protected prefix: they must equal
        the shared blocks byte for byte (checked), so those stay shared."""
        kv, kept = self.kv, cache.kept
        rows = []
        for l in range(self.layers):
            ck = cache.k(l)[:, :kept].transpose(0, 1)  # [kept, H_kv, D]
            cv = cache.v(l)[:, :kept].transpose(0, 1)
            pk, pv = kv.gather(l, s, P)
            if not (same_bytes(ck[:P], pk) and same_bytes(cv[:P], pv)):
                raise RuntimeError(f"{s.name}: compact prefix differs from the shared blocks")
            rows.append((ck[P:].clone(), cv[P:].clone()))
        old = s.table[s.shared:]
        s.table, s.n_phys = s.table[:s.shared], P
        kv.reserve(s, kept - P)
        for l, (k, v) in enumerate(rows):
            kv.write(l, s, P, k, v)
        s.n_phys = kept
        return old


def run(args):
    import snapkv

    torch.set_num_threads(args.threads)
    m = TinyLlama(args.model)
    texts = [(args.system + " " + t) if args.system else t for t in (args.prompt or STORIES)]
    ids = [m.tok.encode(t) for t in texts]
    P = shared_prefix(ids, m.tok.encode(args.system) if args.system else [], args.block_size)
    for t, i in zip(texts, ids):
        if len(i) + args.steps > 512:
            print(f"warning: {len(i) + args.steps} tokens exceed the 512 the model was "
                  "trained on", file=sys.stderr)
        if len(i) - args.window < P:
            sys.exit(f"torch-paged: a prompt of {len(i)} tokens is too short for the "
                     f"window after the {P}-token shared prefix")
    with snapkv.Client(args.socket, name=args.name) as client:
        e = Engine(args, client, m)
        kv = e.kv
        # the shared prefix: prefilled once, its blocks shared by every sequence
        pre = paged.Sequence("prefix")
        if P:
            m.forward(kv, [pre], [ids[0][:P]])
        seqs = [paged.Sequence(chr(ord("A") + i)) for i in range(len(ids))]
        qbuf = client.empty((len(seqs), m.cfg.n_layers, m.cfg.n_heads, args.window,
                             m.cfg.head_dim), torch.float32)
        first = []
        t0 = time.perf_counter()
        for i, s in enumerate(seqs):
            if P:
                kv.fork(pre, s, P // args.block_size)
            L = len(ids[i])
            lg = m.forward(kv, [s], [ids[i][P:]], qcap={s: (qbuf[i], L - args.window)})
            first.append(int(lg[0].argmax()))
        t_prefill = time.perf_counter() - t0
        prefix_blocks = list(pre.table)
        prefix_bytes = [kv.pool[:, :, b].clone() for b in prefix_blocks]
        before = [len(s.table) - s.shared for s in seqs]
        lens = [s.n_phys for s in seqs]

        t0 = time.perf_counter()
        caches = e.compact_all(seqs, qbuf, P)
        t_compact = time.perf_counter() - t0
        if args.print_positions:
            for i, c in enumerate(caches):
                print(f"== positions of sequence {seqs[i].name}")
                for l in range(c.layers):
                    pos = c.positions(l)
                    for h in range(c.h_store):
                        print(f"positions layer {l} head {h}: " +
                              " ".join(str(x) for x in pos[h, :c.kept].tolist()))
        fulls = []
        kept = [c.kept for c in caches]
        outcomes = [c.budget_outcome for c in caches]
        for i, (s, c) in enumerate(zip(seqs, caches)):
            if args.compare:  # the full cache keeps the old blocks for the comparison
                f = paged.Sequence(s.name + "/full")
                f.table, f.shared = list(s.table), 0
                for b in f.table:
                    kv.bm.share(b)
                f.n_phys = f.next_pos = s.n_phys
                fulls.append(f)
            if args.out == "writeback":
                old = e.adopt_writeback(s, c, e.dest[i], P)
            elif args.out == "paged":
                old = e.adopt_paged(s, c, P)
            else:
                old = e.adopt_dense(s, c, P)
                c.release()  # the engine holds the compact K/V in its own blocks now
            kv.free_blocks(old)
        after = [len(s.table) - s.shared for s in seqs]

        # decode every sequence together, teacher-forced on the full cache's text
        toks = list(first)
        agree = [0] * len(seqs)
        kls = [0.0] * len(seqs)
        out = [[t] for t in toks]
        tc = tf = 0.0
        for step in range(args.steps - 1):
            t0 = time.perf_counter()
            lc = m.forward(kv, seqs, [[t] for t in toks])
            tc += time.perf_counter() - t0
            for s, c in zip(seqs, caches):
                # the daemon's index tables follow: g += 1 (writeback declared
                # max_decode instead and reports g once, at release)
                if not c.released and args.out != "writeback":
                    c.append(1)
                    assert c.next_position == s.next_pos and c.next_slot == s.n_phys
            if args.compare:
                t0 = time.perf_counter()
                lf = m.forward(kv, fulls, [[t] for t in toks])
                tf += time.perf_counter() - t0
                d = kl(lf, lc)
                for i in range(len(seqs)):
                    agree[i] += int(lf[i].argmax() == lc[i].argmax())
                    kls[i] += float(d[i])
                toks = [int(x) for x in lf.argmax(-1)]
            else:
                toks = [int(x) for x in lc.argmax(-1)]
            for i, t in enumerate(toks):
                out[i].append(t)
        steps = args.steps - 1

        shared_ok = all(torch.equal(kv.pool[:, :, b], pb)
                        for b, pb in zip(prefix_blocks, prefix_bytes))
        for s, c in zip(seqs, caches):
            if args.out == "paged":
                e.unmap(s)  # before the daemon reuses the region
            if not c.released:
                c.release(appended=steps if args.out == "writeback" else None)
        for i, s in enumerate(seqs):
            text, prev = b"", ids[i][-1]
            for t in out[i]:
                text += m.tok.decode(prev, t)
                prev = t
            print(f"== sequence {s.name}: prompt {lens[i]} tokens ({P} shared, protected), "
                  f"kept {kept[i]} per head")
            if args.budget or args.fallback_below:
                b = outcomes[i]
                print(f"   budget {b['mode']}: C* {b['c_star']}, fallback "
                      f"{'yes' if b['fallback'] else 'no'}, smallest retained mass "
                      f"{b['mass_min']:.4f}")
            print(f"   blocks: {before[i]} own + {s.shared} shared before, {after[i]} own + "
                  f"{s.shared} shared after compaction: {before[i] - after[i]} freed")
            print(f"   lengths: logical {s.next_pos} (next position L + g), physical "
                  f"{s.n_phys} slots (kept + g)")
            if args.compare:
                print(f"   teacher-forced: {agree[i]} of {steps} next-token predictions agree "
                      f"with its full cache, mean KL(full || compact) {kls[i] / steps:.4f}")
            print(f"   text: {texts[i][-40:]!r} ->{text.decode(errors='replace')!r}")
        print(f"== shared prefix: {len(prefix_blocks)} blocks ({P} tokens) shared by "
              f"{len(seqs)} sequences, byte-identical after compaction and decoding: "
              f"{'yes' if shared_ok else 'NO'}")
        how = {"writeback": "written by the daemon into fresh blocks of the pool",
               "paged": "arena blocks mapped into the pool, no copy",
               "arena": "the daemon's dense arena output copied into fresh blocks"}[args.out]
        print(f"== prefill {t_prefill * 1000:.0f} ms, {len(seqs)} compactions "
              f"{t_compact * 1000:.1f} ms (submitted together; --out {args.out}: {how})")
        n = len(seqs) * steps
        msg = f"== decode, {len(seqs)} sequences together: compact caches {n / tc:.0f} tokens/s"
        if args.compare:
            msg += f", full caches {n / tf:.0f} tokens/s"
        print(msg)
        print(f"== pool: {kv.bm.used} of {kv.bm.n} blocks in use"
              + (f" ({sum(len(f.table) for f in fulls)} held for the full-cache comparison)"
                 if fulls else ""))
        return 0 if shared_ok else 1


if __name__ == "__main__":
    sys.exit(run(parse_args(sys.argv[1:])))
