# SPDX-License-Identifier: MIT
"""make check-vllm's driver: vLLM's CPU build serves SmolLM2-135M-Instruct in
this process (the V1 engine core in-process, VLLM_ENABLE_V1_MULTIPROCESSING=0,
so that its scheduler's block pool can be inspected) with real requests:

  - 8 concurrent chat prompts of 1K-2K tokens, the first four sharing a
    system prompt (prefix caching on), chunked prefill on (a 512-token
    step budget), passkey (even) and multi-key (odd) questions;
  - a ninth request whose prompt is the first one's again, submitted after
    the rest finished: fully prefix-cached;
  - a KV pool too small for all eight at once, so that the scheduler
    preempts (recompute) at least one request (counted, asserted);

greedy (temperature 0), 12 new tokens each. Run once per mode:

    python check_vllm.py --model HF_DIR --mode off --out off.json
    python check_vllm.py --model HF_DIR --mode on --socket S --out on.json \\
        --compare off.json

Mode off is vLLM as shipped (the baseline: answers checked, block pool
back to empty). Mode on loads the snapkv_vllm plugin's connector; its
checks are in snapkv_vllm.check (imported only then).
Exit 0 when every check passed, 1 otherwise; each check prints one line.
"""
import argparse
import json
import os
import random
import sys
import time

LICENCES = "/usr/share/common-licenses"
SYSTEM = ("You are a careful assistant. Read the user's document and answer "
          "the question at its end exactly, with the number only.")
COLOURS = ["blue", "red", "green", "yellow", "black", "white", "orange", "grey"]
N_REQ = 8
MAX_TOKENS = 20
BLOCK = 32


def paragraphs():
    out = []
    for name in sorted(os.listdir(LICENCES)):
        path = os.path.join(LICENCES, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for p in f.read().split("\n\n"):
                p = " ".join(p.split())
                if len(p) > 40:
                    out.append(p)
    return out


def chat(system, user):
    s = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return s + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def make_prompts(tok, seed=27):
    """(name, token ids, answer, question token count) for N_REQ requests."""
    paras = paragraphs()
    rng = random.Random(seed)
    shared = SYSTEM + " Background: " + " ".join(paras[3:6])
    out = []
    for i in range(N_REQ):
        target = 1024 + (1024 * i) // (N_REQ - 1) - 64  # 1K..2K tokens
        start = rng.randrange(len(paras))
        body = []
        n = 0
        while n < target:
            p = paras[(start + len(body)) % len(paras)]
            body.append(p)
            n += len(tok(p)["input_ids"]) + 1
        if i % 2 == 0:  # passkey
            key = str(rng.randrange(10000, 100000))
            facts = [f"The pass key is {key}. Remember it."]
            question = "What is the pass key? Answer with the number only."
            answer = key
        else:  # multi-key: three doors, one asked
            cols = rng.sample(COLOURS, 3)
            codes = [str(rng.randrange(10000, 100000)) for _ in cols]
            facts = [f"The code for the {c} door is {k}." for c, k in zip(cols, codes)]
            j = rng.randrange(3)
            question = f"What is the code for the {cols[j]} door? Answer with the number only."
            answer = codes[j]
        for f in facts:
            body.insert(rng.randrange(1, len(body)), f)
        system = shared if i < 4 else SYSTEM
        text = chat(system, "\n\n".join(body) + "\n\n" + question)
        ids = tok(text)["input_ids"]
        qn = len(tok(question + "<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
        out.append((f"r{i}", ids, answer, qn))
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", choices=("off", "on"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", help="the off run's JSON (mode on)")
    ap.add_argument("--socket", help="snapkvd's socket (mode on)")
    ap.add_argument("--blocks", type=int, default=256,
                    help="KV pool in 32-token blocks (256: 8192 tokens, fewer than all 8 need)")
    ap.add_argument("--budget", type=int, default=256, help="C, slots kept per head")
    return ap.parse_args(argv)


def engine(a):
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    kw = dict(model=a.model, tokenizer=a.model, dtype="float32", max_model_len=4096,
              block_size=BLOCK, enable_prefix_caching=True, enable_chunked_prefill=True,
              max_num_batched_tokens=2048, max_num_seqs=N_REQ, num_gpu_blocks_override=a.blocks,
              seed=0, disable_log_stats=True)
    if a.mode == "on":
        from snapkv_vllm import connector_config
        kw.update(connector_config(socket=a.socket, budget=a.budget))
    return LLMEngine.from_engine_args(EngineArgs(**kw))


def scheduler_of(eng):
    """The in-process engine core's scheduler (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return eng.engine_core.engine_core.scheduler


def internal(sched, name):
    """vLLM's internal id of request NAME (the engine adds a suffix)."""
    for rid, r in sched.requests.items():
        if rid == name or rid.rsplit("-", 1)[0] == name:
            return rid, r
    return None, None


class Events:
    """The same two events in both modes, at the same engine step: r1
    preempted (recompute) at its third decode step, r3 aborted in the step
    after its prefill completed (with the plugin on: while its compaction is
    in flight)."""

    def __init__(self, sched, plugin=None):
        self.sched, self.plugin = sched, plugin
        self.preempted = self.aborted = None
        self.abort_state = None

    def after_step(self, eng, step):
        import time as _t

        from vllm.v1.request import RequestStatus

        if self.preempted is None:
            rid, r = internal(self.sched, "r1")
            if r is not None and r.status == RequestStatus.RUNNING and r.num_output_tokens >= 3:
                self.sched.running.remove(r)
                self.sched._preempt_request(r, _t.monotonic())
                self.preempted = (rid, step)
                print(f"  (step {step}: r1 preempted after {r.num_output_tokens} tokens)", flush=True)
        if self.aborted is None:
            rid, r = internal(self.sched, "r3")
            if r is not None and r.num_computed_tokens >= r.num_prompt_tokens:
                if self.plugin is not None:
                    st = self.plugin.state.get(rid)
                    self.abort_state = st["phase"] if st else None
                eng.abort_request(["r3"])
                self.aborted = (rid, step)
                print(f"  (step {step}: r3 aborted after its prefill"
                      f"{'; its compaction ' + str(self.abort_state) if self.plugin else ''})",
                      flush=True)


def run(eng, prompts, hooks=None):
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=5)
    res = {}
    t0 = time.time()
    sched = scheduler_of(eng)
    preempted = set()
    order = []
    events = Events(sched, getattr(sched, "connector", None) if hooks else None)
    if hooks:
        hooks.events = events
    for name, ids, _, qn in prompts[:N_REQ]:
        eng.add_request(name, {"prompt_token_ids": ids}, sp.clone())
    steps = 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                c = o.outputs[0]
                order.append(o.request_id)
                res[o.request_id] = dict(
                    cached=o.num_cached_tokens, tokens=list(c.token_ids), text=c.text,
                    logprobs=[{str(k): v.logprob for k, v in lp.items()} for lp in (c.logprobs or [])])
        for r in list(sched.running) + list(sched.waiting):
            if getattr(r, "num_preemptions", 0) > 0:
                preempted.add(r.request_id.rsplit("-", 1)[0])
        events.after_step(eng, steps)
        if hooks:
            hooks.after_step(eng, steps)
        steps += 1
    t1 = time.time()
    # the prompt that finished last again, alone: every full block of it
    # still in the prefix cache
    last = order[-1]
    name, ids, _, _ = next(p for p in prompts if p[0] == last)
    eng.add_request("again", {"prompt_token_ids": ids}, sp.clone())
    hit = None
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                c = o.outputs[0]
                hit = o.num_cached_tokens
                res["again"] = dict(tokens=list(c.token_ids), text=c.text, logprobs=[])
    return res, dict(steps=steps, seconds=t1 - t0, preempted=sorted(preempted), cached_hit=hit,
                     again=last, again_len=len(ids))


def main(argv):
    a = parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    prompts = make_prompts(tok)
    fails = 0

    def check(ok, what):
        nonlocal fails
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
        fails += 0 if ok else 1

    t = time.time()
    eng = engine(a)
    print(f"check-vllm[{a.mode}]: vLLM up in {time.time() - t:.0f} s; prompts "
          + ", ".join(f"{n} {len(ids)}" for n, ids, _, _ in prompts), flush=True)
    hooks = None
    if a.mode == "on":
        from snapkv_vllm import check as pcheck
        hooks = pcheck.Hooks(eng, scheduler_of(eng), prompts, check)
    res, info = run(eng, prompts, hooks)
    print(f"check-vllm[{a.mode}]: {N_REQ} requests in {info['seconds']:.0f} s, "
          f"{info['steps']} steps; preempted {info['preempted']}", flush=True)
    right = 0
    for name, ids, answer, _ in prompts:
        if name not in res:
            print(f"  {name}: aborted")
            continue
        got = res[name]["text"]
        hit = answer in got
        right += hit
        print(f"  {name}: prompt {len(ids)} tokens ({res[name]['cached']} prefix-cached), "
              f"answer {answer}: {got!r} {'right' if hit else 'wrong'}", flush=True)
    passkeys = [p for i, p in enumerate(prompts) if i % 2 == 0]
    pk_right = sum(p[0] in res and p[2] in res[p[0]]["text"] for p in passkeys)
    if a.mode == "off":
        check(pk_right >= len(passkeys) - 1,
              f"passkey answered {pk_right}/{len(passkeys)} with the full cache (at least "
              f"{len(passkeys) - 1})")
    print(f"  answers right {right}/{len(prompts)} (multi-key is at this model's edge: "
          "reported, not asserted)")
    check("r1" in info["preempted"] and "r1" in res,
          f"r1 preempted (recompute) and finished: preempted {info['preempted']}")
    check("r3" not in res, "r3 aborted")
    full = (info["again_len"] - 1) // BLOCK * BLOCK
    again = info["again"]
    check(info["cached_hit"] is not None and info["cached_hit"] >= full,
          f"{again} again: {info['cached_hit']} of {info['again_len']} prompt tokens from the "
          f"prefix cache (every full block: {full})")
    check(res["again"]["tokens"] == res[again]["tokens"], f"{again} again: the same greedy tokens")
    shared = [res[f"r{i}"]["cached"] if f"r{i}" in res else None for i in range(1, 4)]
    print(f"  prefix-cache hits of r1-r3 (system prompt shared with r0): {shared}")
    sched = scheduler_of(eng)
    pool = sched.kv_cache_manager.block_pool
    free = pool.get_num_free_blocks()
    check(free == pool.num_gpu_blocks - 1,
          f"block pool: {free} of {pool.num_gpu_blocks - 1} blocks free at the end (no leak)")
    if hooks:
        fails += hooks.finish(res, a.compare)
    with open(a.out, "w") as f:
        json.dump(dict(results=res, info=info), f)
    print(f"check-vllm[{a.mode}]: {'passed' if fails == 0 else f'{fails} checks failed'}")
    return 0 if fails == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
