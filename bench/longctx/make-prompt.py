#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A passkey prompt built deterministically from a seed: varied English
filler from a Debian package (the licences under /usr/share/common-licenses,
paragraphs in file order from a seeded start), a 5-digit key stated at a
seeded depth, and the question that asks for it.

    make-prompt.py --seed 3 --tokens 1024 --out DIR

writes DIR/doc.txt (the document), DIR/question.txt and DIR/key.txt. The
length is aimed in characters (about 3.8 per token for this text and
SmolLM2's tokenizer); the engine reports the real token count.
"""
import argparse
import os
import random

LICENCES = "/usr/share/common-licenses"
CHARS_PER_TOKEN = 3.8
QUESTION = "What is the pass key? Answer with the number only."


def paragraphs():
    out = []
    for name in sorted(os.listdir(LICENCES)):
        path = os.path.join(LICENCES, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for p in text.split("\n\n"):
            p = " ".join(p.split())
            if len(p) > 40:
                out.append(p)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--depth", type=float, help="0..1; default seeded in [0.1, 0.9]")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    paras = paragraphs()
    key = "%05d" % rng.randrange(10000, 100000)
    depth = a.depth if a.depth is not None else rng.uniform(0.1, 0.9)
    budget = int(a.tokens * CHARS_PER_TOKEN) - 200  # the template and the question
    i = rng.randrange(len(paras))
    doc = []
    size = 0
    while size < budget:
        p = paras[i % len(paras)]
        doc.append(p)
        size += len(p) + 2
        i += 1
    needle = "The pass key is %s. Remember it. %s is the pass key." % (key, key)
    doc.insert(round(depth * len(doc)), needle)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "doc.txt"), "w") as f:
        f.write("\n\n".join(doc))
    with open(os.path.join(a.out, "question.txt"), "w") as f:
        f.write(QUESTION)
    with open(os.path.join(a.out, "key.txt"), "w") as f:
        f.write(key)


if __name__ == "__main__":
    main()
