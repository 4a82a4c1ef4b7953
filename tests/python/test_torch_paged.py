# SPDX-License-Identifier: MIT
"""The reference paged engine (examples/torch-paged) on the real model: it
keeps exactly the positions the C engine (tiny-llama) keeps for the same
prompt and parameters, frees blocks after compaction, and its shared prefix
blocks stay byte-identical. Skipped without the model file."""
import os
import re
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT, skip_unless

MODEL = os.environ.get("SNAPKV_MODEL",
                       os.path.join(ROOT, os.environ.get("SHARED", "../shared"), "models",
                                    "stories260K.gguf"))
ENGINE = os.path.join(ROOT, "examples", "torch-paged", "engine.py")
SYSTEM = ("Once upon a time, in a small town, there lived many children who loved "
          "stories. Every night their mother told them a new story.")
STORY = ("Tom and his friend Ben wanted to build a big tower. They found many blocks in the "
         "toy box. Tom put a red block on a blue block. Ben put a yellow block on top. The "
         "tower was very tall. Then the cat came and jumped on the table.")

pytestmark = skip_unless("model", os.path.exists(MODEL), f"{MODEL} not found")


def py_engine(daemon, *args):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    r = subprocess.run([sys.executable, ENGINE, "-m", MODEL, "--socket", daemon.sock, *args],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def positions(out):
    return [l for l in out.splitlines() if l.startswith("positions layer ")]


@pytest.mark.parametrize("system", [SYSTEM, ""], ids=["shared-prefix", "no-prefix"])
@pytest.mark.parametrize("params", [["-C", "64", "-W", "8", "-k", "5", "--pool", "avg"],
                                    ["-C", "96", "-W", "16", "-k", "7", "--pool", "max"]],
                         ids=["C64-avg", "C96-max"])
def test_kept_positions_equal_c_engine(daemon, system, params):
    out = py_engine(daemon, "--system", system, "-p", STORY, "-n", "2", "--no-compare",
                    "--print-positions", *params)
    shared = int(re.search(r"\((\d+) shared", out).group(1))
    assert (shared > 0) == bool(system)
    prompt = (system + " " + STORY) if system else STORY
    prot = ["--protect", f"0:{shared}"] if shared else []
    c = subprocess.run([os.path.join(BUILD, "tiny-llama"), "-m", MODEL, "--socket", daemon.sock,
                        "-p", prompt, "-n", "2", "--policy", "snapkv", "--gqa", "group",
                        "--print-positions", "-q", *params, *prot],
                       capture_output=True, text=True, timeout=600)
    assert c.returncode == 0, c.stderr
    assert len(positions(c.stdout)) == 5 * 4  # layers x K/V heads
    assert positions(out) == positions(c.stdout)


@pytest.mark.parametrize("out", ["writeback", "paged", "arena"])
def test_engine_frees_blocks_and_shares_prefix(daemon, out):
    out = py_engine(daemon, "-n", "12", "--out", out)
    freed = [int(x) for x in re.findall(r"compaction: (\d+) freed", out)]
    assert len(freed) == 3 and all(f > 0 for f in freed), out
    assert "byte-identical after compaction and decoding: yes" in out, out
    agree = [int(x) for x in re.findall(r"teacher-forced: (\d+) of 11", out)]
    assert len(agree) == 3, out


@pytest.mark.parametrize("out", ["writeback", "paged", "arena"])
def test_engine_mass_budget(daemon, out):
    """--budget mass: one C* for every head in the engine's block layout; the
    writeback table, sized for C_max, gives its unused blocks back; the
    shared prefix stays byte-identical. A fallback keeps the whole prompt."""
    out_ = py_engine(daemon, "-n", "6", "--out", out, "--budget", "mass:0.8:64:160:8")
    c_star = [int(x) for x in re.findall(r"budget mass: C\* (\d+), fallback no", out_)]
    kept = [int(x) for x in re.findall(r"kept (\d+) per head", out_)]
    assert len(c_star) == 3 and c_star == kept and all(64 <= c <= 160 for c in c_star), out_
    assert "byte-identical after compaction and decoding: yes" in out_, out_
    if out == "writeback":  # the table had C_max's 10 blocks: C*'s kept, the rest freed
        own = [int(x) for x in re.findall(r"(\d+) own \+ 3 shared after", out_)]
        assert own == [(c + 15) // 16 - 3 for c in c_star] and max(c_star) < 160, out_
        fb = py_engine(daemon, "-n", "3", "--out", out, "--budget", "mass:0.8:64:160:8",
                       "--fallback-below", "0.9999")
        assert len(re.findall(r"fallback yes", fb)) == 3, fb
        lens = [int(x) for x in re.findall(r"prompt (\d+) tokens", fb)]
        assert [int(x) for x in re.findall(r"kept (\d+) per head", fb)] == lens, fb
