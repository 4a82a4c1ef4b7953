# SPDX-License-Identifier: MIT
"""check-vllm's plugin-on checks (integrations/vllm/check_vllm.py --mode on),
run in the process of an in-process engine core: the scheduler-side
connector (scheduler.connector), the worker-side one (patches), STATS."""
import json
import os
import subprocess

from . import connector as C
from . import patches


class Hooks:
    def __init__(self, eng, sched, prompts, check):
        self.eng, self.sched, self.prompts, self.check = eng, sched, prompts, check
        self.events = None
        self.ledger_max = 0  # most caches the daemon's ledger listed at once

    def ledger(self):
        ctl = os.environ.get("SNAPKVCTL")
        if not ctl:
            return None
        out = subprocess.run([ctl, "--socket", self.sched.connector.socket, "ledger", "--json"],
                             capture_output=True, text=True)
        try:
            return json.loads(out.stdout)
        except ValueError:
            return None

    def after_step(self, eng, step):
        w = patches._installed.get("connector")
        if w is not None and w.caches:
            led = self.ledger()
            if led is not None:
                self.ledger_max = max(self.ledger_max, len(led.get("caches", [])))

    def finish(self, res, compare):
        fails = 0

        def check(ok, what):
            nonlocal fails
            self.check(ok, what)
            fails += 0 if ok else 1

        sc = self.sched.connector
        w = patches._installed.get("connector")
        bs = sc.block_size
        print("  per request (vLLM's id): prompt L, window rows, blocks before -> blocks the kept "
              "slots fill, status")
        completed = 0
        byname = {}
        for rid, r in C.STATS["requests"].items():
            byname.setdefault(rid.split("#")[0].rsplit("-", 1)[0], []).append((rid, r))
        for name in [p[0] for p in self.prompts] + ["again"]:
            if name not in byname:
                print(f"    {name}: not compacted")
        for name, rid, r in [(n, rid, r) for n, lst in byname.items() for rid, r in lst]:
            kept = r.get("kept")
            after = -(-kept // bs) if kept is not None else None
            print(f"    {rid}: L {r.get('L')}, W {r.get('n_q')}, blocks {r.get('blocks_before')} -> "
                  f"{after} ({r.get('status')}{', cancel ' + r['cancel'] if 'cancel' in r else ''}"
                  f"{', seen settled after ' + format(r['ms'], '.0f') + ' ms' if 'ms' in r else ''}"
                  f"{', copy ' + format(r['copy_ms'], '.0f') + ' ms' if 'copy_ms' in r else ''}"
                  f"{', ' + r['error'] if 'error' in r else ''}"
                  f"{', slots match' if r.get('slots_match') else ''}"
                  f"{', last partial block: ' + str(r['tail_rows_changed']) + ' kept rows changed after submit (open)' if r.get('tail_rows_changed') else ''}"
                  f"{', held at finish' if r.get('held_at_finish') else ''})")
            if r.get("status") == "completed":
                completed += 1
                check(r.get("slots_match") is True,
                      f"{name}: the kept slots in vLLM's blocks "
                      f"{'(equal to the pool rows at the kept positions of its full blocks)' if r.get('slots_match') else 'WRONG'}")
            check(r.get("dest_freed") == r.get("dest"),
                  f"{name}: its {r.get('dest')} output blocks back in the pool ({r.get('dest_freed')})")
        check(completed >= 5, f"{completed} compactions completed through snapkvd (at least 5)")
        for e in C.STATS["events"]:
            print(f"    event: {e}")
        ev = self.events
        if ev is not None and ev.aborted:
            rid = ev.aborted[0]
            r = C.STATS["requests"].get(rid, {})
            check(ev.abort_state == "compacting" and r.get("held_at_finish") is True and
                  r.get("blocks_released_after_settle") is True,
                  f"r3 aborted while compacting ({ev.abort_state}): blocks held by "
                  f"request_finished, released after get_finished (cancel: "
                  f"{r.get('cancel', r.get('status'))})")
        else:
            check(False, "r3 was never aborted")
        if ev is not None and ev.preempted:
            n = len(byname.get("r1", []))
            print(f"    r1: {n} compaction(s) recorded; preempted at step {ev.preempted[1]} "
                  "(its state reset; the recompute is compacted again when the pool has room "
                  "for the output, see the events)")
        check(not sc.state or all(s["phase"] != "compacting" for s in sc.state.values()),
              "no compaction left in flight (scheduler)")
        # the worker releases a finished request's cache when the next step
        # tells it (scheduler_output.finished_req_ids); after the last request
        # there is no next step: vLLM calls the connector's shutdown() at exit
        left = len(w.caches) if w is not None else None
        if w is not None:
            w.shutdown()
        check(w is not None and not w.inflight and not w.caches,
              f"worker: nothing in flight, every compact cache released ({left} released by "
              "shutdown(), the finished requests no later step announced)")
        check(bool(getattr(w, "pool_buffers", None)),
              "vLLM's KV cache is a registered memfd (get_mem_pool_context)")
        if compare:
            with open(compare) as f:
                off = json.load(f)["results"]
            same = [n for n, *_ in self.prompts if n in res and res[n]["tokens"] == off[n]["tokens"]]
            cmp_ = [n for n, *_ in self.prompts if n in res]
            check(len(same) == len(cmp_),
                  f"greedy tokens equal to the plugin-off run for {len(same)}/{len(cmp_)} requests "
                  "(decoding stays on the full cache: the switch is not done)")
        if os.environ.get("SNAPKVCTL"):
            check(self.ledger_max >= 1,
                  f"the daemon's ledger listed compacted requests while they ran "
                  f"(up to {self.ledger_max} at once)")
            led = self.ledger()
            caches = led.get("caches") if isinstance(led, dict) else None
            check(caches == [], f"daemon ledger empty at the end ({caches})")
        return fails
