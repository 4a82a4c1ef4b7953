#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A passkey prompt built deterministically from a seed: varied English
filler from a Debian package (the licences under /usr/share/common-licenses,
paragraphs in file order from a seeded start), a 5-digit key stated at a
seeded depth, and the question that asks for it.

    make-prompt.py --seed 3 --tokens 1024 --out DIR

writes DIR/doc.txt (the document), DIR/question.txt and DIR/key.txt. With
--engine and --model the paragraphs are counted in the model's tokens
(tiny-llama --tokenize-lines, one call) and the whole prompt, chat
template and question included, comes within a paragraph of --tokens;
without them the length is aimed in characters (about 3.8 per token for
this text and SmolLM2's tokenizer, which varies 15 % with the licence).
"""
import argparse
import os
import random
import subprocess
import tempfile

LICENCES = "/usr/share/common-licenses"
CHARS_PER_TOKEN = 3.8
QUESTION = "What is the pass key? Answer with the number only."
# The framing that brings the full cache to >= 90 % at 2K and 4K (issue
# 28): an instruction before the text says a key is hidden in it, and a
# marker closes the text, so the answer does not run on with the licence.
INTRO = ("There is an important piece of information hidden inside a lot of "
         "irrelevant text. Find it and memorize it. I will quiz you about it.")
OUTRO = "That is the end of the text."
# the chat template, the framing, the question and the needle(s), in
# SmolLM2's tokens
OVERHEAD_TOKENS = 130
# multi-key (--keys N): N key/value lines of distinct colours, one asked
COLOURS = ["blue", "red", "green", "yellow", "white", "black", "orange", "purple"]


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
    ap.add_argument("--engine", help="tiny-llama, to count tokens")
    ap.add_argument("--model", help="the GGUF whose tokenizer counts")
    ap.add_argument("--keys", type=int, default=0,
                    help="multi-key: this many 'The code for the C door is N.' lines "
                         "(at seeded depths), one of them asked; 0: the pass key")
    ap.add_argument("--text", action="store_true",
                    help="natural text: the licence paragraphs alone (no key, no framing, "
                         "no question), for a teacher-forced continuation")
    ap.add_argument("--plain", action="store_true",
                    help="without the framing (issue 26's first version)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    paras = paragraphs()
    key = "%05d" % rng.randrange(10000, 100000)
    depth = a.depth if a.depth is not None else rng.uniform(0.1, 0.9)
    i = rng.randrange(len(paras))
    doc = []
    if a.engine and a.model:
        # each paragraph's tokens, and one for the blank line after it
        cand = [paras[(i + k) % len(paras)] for k in range(len(paras))]
        cand = cand[: 2 + int(2 * a.tokens * CHARS_PER_TOKEN) // 40]
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write("\n".join(cand) + "\n")
            f.flush()
            out = subprocess.run([a.engine, "-m", a.model, "--tokenize-lines", f.name],
                                 capture_output=True, text=True, check=True).stdout
        counts = [len(l.split()) + 1 for l in out.split("\n")[: len(cand)]]
        left = a.tokens - (8 if a.text else OVERHEAD_TOKENS)
        for p, n in zip(cand, counts):
            if left - n < 0 and doc:
                break
            doc.append(p)
            left -= n
    else:
        budget = int(a.tokens * CHARS_PER_TOKEN) - 200  # the template and the question
        size = 0
        while size < budget:
            p = paras[i % len(paras)]
            doc.append(p)
            size += len(p) + 2
            i += 1
    question = QUESTION
    if a.text:
        key, question = "", ""
    elif a.keys:
        doors = rng.sample(COLOURS, a.keys)
        codes = [key] + ["%05d" % rng.randrange(10000, 100000) for _ in doors[1:]]
        depths = sorted(rng.uniform(0.1, 0.9) for _ in doors)
        asked = rng.randrange(a.keys)
        # the asked code is the key; the lines go in at their depths, last first
        codes[0], codes[asked] = codes[asked], codes[0]
        for door, code, dp in reversed(list(zip(doors, codes, depths))):
            doc.insert(round(dp * len(doc)), "The code for the %s door is %s." % (door, code))
        key = codes[asked]
        question = "What is the code for the %s door? Answer with the number only." % doors[asked]
    else:
        needle = "The pass key is %s. Remember it. %s is the pass key." % (key, key)
        doc.insert(round(depth * len(doc)), needle)
    if not a.plain and not a.text:
        doc = [INTRO] + doc + [OUTRO]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "doc.txt"), "w") as f:
        f.write("\n\n".join(doc))
    with open(os.path.join(a.out, "question.txt"), "w") as f:
        f.write(question)
    with open(os.path.join(a.out, "key.txt"), "w") as f:
        f.write(key)


if __name__ == "__main__":
    main()
