#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-anchors: tiny-llama against an independent implementation,
transformers loading the same GGUF (SmolLM2-135M-Instruct, Q4_1).

1. Tokenization: every line (a few thousand) of English text from Debian
   packages (the licences under /usr/share/common-licenses, then man pages'
   text lines) encoded by tiny-llama (--tokenize-lines) and by transformers'
   tokenizer loaded from the GGUF (no special tokens added). transformers'
   GGUF converter builds GPT-2's pre-tokenizer only, without the digit split
   the GGUF names (tokenizer.ggml.pre "smollm": llama.cpp isolates every
   \p{N} first, as SmolLM2's own tokenizer.json does with Digits before
   ByteLevel), so lines with whitespace before a digit differ ("   1." is
   'ĠĠĠ' '1' here and in llama.cpp, 'ĠĠ' 'Ġ' '1' there). Required: every
   line identical to the same tokenizer with SmolLM2's pre-tokenizer put
   back (tokenizers' Digits(individual_digits) + ByteLevel), and every
   difference from the converter's as loaded explained by a digit after
   whitespace; the chat template's ids against apply_chat_template too.
2. Prefill logits: for a few prompts (the chat template around a short
   question, a licence passage, a ~1K-token passkey prompt), the same token
   ids (tiny-llama's) through tiny-llama's blocked prefill (--dump-logits)
   and transformers' forward pass in float32 on the CPU: the last position's
   logits within TOL (max absolute difference) and the same argmax.

Runs in the environment scripts/venv.sh makes from requirements.txt beside
this file; exit 1 when a check fails.
"""
import argparse
import glob
import gzip
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, pre_tokenizers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-3  # max |logit difference|; logits span about -10..35


def text_lines(n):
    """n distinct non-blank lines: half from the licences, half from man pages' text."""
    def distinct(lines, k, seen):
        out = []
        for l in lines:
            l = l.replace("\r", "").replace("\0", "")
            if l.strip() and l not in seen and len(out) < k:
                seen.add(l)
                out.append(l)
        return out

    lic, man = [], []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                lic += f.read().split("\n")
    for path in sorted(glob.glob("/usr/share/man/man[18]/*.gz")):
        if len(man) >= 4 * n:
            break
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                man += [l for l in f.read().split("\n") if not l.startswith((".", "'"))]
        except OSError:
            continue
    seen = set()
    first = distinct(lic, n // 2, seen)
    return first + distinct(man, n - len(first), seen)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        sys.exit("bench-anchors: %s failed:\n%s" % (" ".join(cmd), p.stderr))
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--build", default="build")
    ap.add_argument("--lines", type=int, default=3000)
    a = ap.parse_args()
    engine = os.path.join(a.build, "tiny-llama")
    d, f = os.path.split(a.model)
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    smol = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    smol.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tmp = tempfile.mkdtemp(prefix="bench-anchors.")
    ok = True

    # 1. tokenization
    lines = text_lines(a.lines)
    path = os.path.join(tmp, "lines.txt")
    with open(path, "w", encoding="utf-8") as fo:
        fo.write("\n".join(lines) + "\n")
    ours = run([engine, "-m", a.model, "--tokenize-lines", path]).split("\n")
    same, bad, same2, bad2 = 0, [], 0, []
    for i, l in enumerate(lines):
        got = [int(x) for x in ours[i].split()] if i < len(ours) else None
        want = tok.encode(l, add_special_tokens=False)
        want2 = smol.encode(l, add_special_tokens=False).ids
        if got == want:
            same += 1
        else:
            bad.append((l, got, want))
        if got == want2:
            same2 += 1
        else:
            bad2.append((l, got, want2))
    ntok = sum(len(o.split()) for o in ours)
    digit = sum(1 for l, _, _ in bad if re.search(r"\s\d", l))
    print("tokenization of %d lines (%d tokens, %d bytes):" %
          (len(lines), ntok, sum(len(l.encode()) for l in lines)))
    print("  with SmolLM2's pre-tokenizer (Digits + ByteLevel): %d identical" % same2)
    print("  with transformers' GGUF converter as loaded: %d identical; of the %d that "
          "differ, %d have whitespace before a digit" % (same, len(bad), digit))
    for l, got, want in bad2[:5]:
        print("  differs: %r\n    tiny-llama   %s\n    transformers %s" % (l[:80], got, want))
    for l, got, want in bad[:2]:
        print("  e.g. %r\n    tiny-llama          %s\n    transformers (GGUF) %s" %
              (l[:60], got, want))
    ok &= not bad2 and digit == len(bad)

    q = "What is the capital of France?"
    ours_chat = [int(x) for x in run([engine, "-m", a.model, "--chat", "-p", q,
                                      "--print-tokens"]).split(":")[1].split()]
    try:
        want = tok.apply_chat_template([{"role": "user", "content": q}],
                                       add_generation_prompt=True, tokenize=True)
        if hasattr(want, "input_ids") or isinstance(want, dict):
            want = want["input_ids"]
        print("chat template: %s (%d tokens)" % ("identical" if list(want) == ours_chat else
                                                  "DIFFERS: %s vs %s" % (ours_chat, list(want)),
                                                  len(ours_chat)))
        ok &= list(want) == ours_chat
    except Exception as e:  # a GGUF without a template for transformers
        print("chat template: not compared (%s)" % e)

    # 2. prefill logits
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    subprocess.run([sys.executable, os.path.join(HERE, "..", "longctx", "make-prompt.py"),
                    "--seed", "1", "--tokens", "1024", "--out", os.path.join(tmp, "pk")],
                   check=True)
    passage = "\n".join(lines[:40])
    prompts = [("question", ["-p", q]),
               ("licence passage", ["-p", passage + "\n\nSummarize this in one sentence."]),
               ("passkey ~1K", ["-f", os.path.join(tmp, "pk", "doc.txt"), "--question",
                                "What is the pass key? Answer with the number only."])]
    print("prefill logits, tiny-llama vs transformers (float32, CPU), tolerance %g:" % TOL)
    for name, args in prompts:
        ids = [int(x) for x in run([engine, "-m", a.model, "--chat", *args,
                                    "--print-tokens"]).split(":")[1].split()]
        dump = os.path.join(tmp, "logits.f32")
        run([engine, "-m", a.model, "--chat", *args, "-n", "1", "--dump-logits", dump, "-q"])
        ours_l = np.fromfile(dump, dtype=np.float32)
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0, -1].float().numpy()
        diff = np.abs(ours_l - ref)
        top_o, top_r = np.argsort(-ours_l)[:10], np.argsort(-ref)[:10]
        good = diff.max() <= TOL and top_o[0] == top_r[0]
        ok &= bool(good)
        print("  %-16s L %5d: max |diff| %.2e, mean %.2e, logit range %.1f..%.1f, argmax %s "
              "(%d), top-10 overlap %d/10: %s" % (name, len(ids), diff.max(), diff.mean(),
                                                 ref.min(), ref.max(),
                                                 "same" if top_o[0] == top_r[0] else "DIFFERS",
                                                 top_r[0], len(set(top_o) & set(top_r)),
                                                 "ok" if good else "FAIL"))
    print("bench-anchors: %s" % ("all checks passed" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
