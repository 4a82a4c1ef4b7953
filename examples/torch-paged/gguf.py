# SPDX-License-Identifier: MIT
"""A GGUF v3 reader and the SentencePiece-BPE tokenizer stored in it, as
examples/tiny-llama reads them (tl-gguf.c, tl-tok.c): the same metadata, the
same tensors (F32 only), the same encoding of a prompt into token ids."""
import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
MAX_STRING = 1 << 20
MAX_COUNT = 1 << 24
# metadata value types: fixed sizes and struct formats
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
GGML_F32 = 0


class GGUFError(ValueError):
    pass


class Reader:
    def __init__(self, data):
        self.data, self.off = data, 0

    def take(self, n):
        if n < 0 or self.off + n > len(self.data):
            raise GGUFError(f"gguf: truncated at byte {self.off} (wanted {n} more)")
        b = self.data[self.off:self.off + n]
        self.off += n
        return b

    def fmt(self, f):
        return struct.unpack(f, self.take(struct.calcsize(f)))[0]

    def string(self):
        n = self.fmt("<Q")
        if n > MAX_STRING:
            raise GGUFError(f"gguf: string of {n} bytes at byte {self.off}")
        return bytes(self.take(n))

    def value(self, t):
        if t in SCALARS:
            return self.fmt(SCALARS[t])
        if t == STRING:
            return self.string()
        if t == ARRAY:
            et, n = self.fmt("<I"), self.fmt("<Q")
            if n > MAX_COUNT:
                raise GGUFError(f"gguf: array of {n} elements")
            return [self.value(et) for _ in range(n)]
        raise GGUFError(f"gguf: unknown value type {t}")


class GGUF:
    """Metadata (key -> value, strings as bytes) and F32 tensors (name ->
    numpy array shaped [ne[n-1], ..., ne[0]], i.e. row-major)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            data = memoryview(f.read())
        r = Reader(data)
        if bytes(r.take(4)) != GGUF_MAGIC:
            raise GGUFError(f"{path}: not a GGUF file")
        version = r.fmt("<I")
        if version != 3:
            raise GGUFError(f"{path}: GGUF version {version} (3 supported)")
        n_tensors, n_kv = r.fmt("<Q"), r.fmt("<Q")
        if n_tensors > MAX_COUNT or n_kv > MAX_COUNT:
            raise GGUFError(f"{path}: {n_tensors} tensors, {n_kv} keys")
        self.kv = {}
        for _ in range(n_kv):
            key = r.string().decode()
            self.kv[key] = r.value(r.fmt("<I"))
        infos = []
        for _ in range(n_tensors):
            name = r.string().decode()
            nd = r.fmt("<I")
            if nd < 1 or nd > 4:
                raise GGUFError(f"{path}: tensor {name} has {nd} dims")
            ne = [r.fmt("<Q") for _ in range(nd)]
            infos.append((name, ne, r.fmt("<I"), r.fmt("<Q")))
        align = self.kv.get("general.alignment", 32)
        base = (r.off + align - 1) // align * align
        self.tensors = {}
        for name, ne, typ, off in infos:
            if typ != GGML_F32:
                continue
            n = int(np.prod(ne))
            start = base + off
            if start + 4 * n > len(data):
                raise GGUFError(f"{path}: tensor {name} outside the file")
            a = np.frombuffer(data, dtype="<f4", count=n, offset=start)
            self.tensors[name] = a.reshape(list(reversed(ne)))

    def u32(self, key, default=None):
        return int(self.kv[key]) if key in self.kv else default

    def f32(self, key, default=None):
        return float(np.float32(self.kv[key])) if key in self.kv else default


SPACE = "\u2581".encode()
TOK_NORMAL, TOK_CONTROL, TOK_BYTE, TOK_UNUSED = 1, 3, 6, 5


class Tokenizer:
    """tl-tok.c's encoding: '▁' + text with spaces as '▁', one piece per code
    point (byte pieces <0xNN> for unknown ones), then merge the best-scoring
    adjacent pair (leftmost on ties) until none merges."""

    def __init__(self, g):
        self.pieces = g.kv["tokenizer.ggml.tokens"]
        self.scores = [float(np.float32(s)) for s in g.kv["tokenizer.ggml.scores"]]
        self.types = g.kv.get("tokenizer.ggml.token_type", [TOK_NORMAL] * len(self.pieces))
        self.lookup = {}
        for i, p in enumerate(self.pieces):
            self.lookup.setdefault(p, i)  # duplicates: the lowest id
        self.bos = g.u32("tokenizer.ggml.bos_token_id", 1)
        self.eos = g.u32("tokenizer.ggml.eos_token_id", 2)
        self.unk = g.u32("tokenizer.ggml.unknown_token_id", 0)
        self.byte_tok = [self.lookup.get(f"<0x{b:02X}>".encode(), -1) for b in range(256)]

    def encode(self, text, bos=True):
        ids = [self.bos] if bos else []
        first = len(ids)
        norm = (SPACE + text.encode().replace(b" ", SPACE)) if text else b""
        s = norm.decode("utf-8", errors="surrogateescape")
        for ch in s:
            b = ch.encode("utf-8", errors="surrogateescape")
            if b in self.lookup:
                ids.append(self.lookup[b])
            else:
                ids.extend(self.byte_tok[x] if self.byte_tok[x] >= 0 else self.unk for x in b)
        while True:
            best, best_id, best_i = 0.0, -1, 0
            for i in range(first, len(ids) - 1):
                t = self.lookup.get(self.pieces[ids[i]] + self.pieces[ids[i + 1]])
                if t is not None and (best_id < 0 or self.scores[t] > best):
                    best, best_id, best_i = self.scores[t], t, i
            if best_id < 0:
                return ids
            ids[best_i:best_i + 2] = [best_id]

    def decode(self, prev, tok):
        p, t = self.pieces[tok], self.types[tok]
        if t in (TOK_CONTROL, TOK_UNUSED):
            return b""
        if t == TOK_BYTE and len(p) == 6 and p.startswith(b"<0x"):
            return bytes([int(p[3:5], 16)])
        if p.startswith(SPACE) and prev == self.bos:
            p = p[len(SPACE):]
        return p.replace(SPACE, b" ")
