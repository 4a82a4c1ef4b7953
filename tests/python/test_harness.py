# SPDX-License-Identifier: MIT
"""The suite's own daemon fixture tells the truth: a snapkvd that died
before the suite stopped it, or that exits non-zero on SIGTERM, fails the
test that owns it; one the test killed on purpose does not."""
import os
import signal
import subprocess

import pytest

from conftest import Daemon


def test_stop_reports_a_dead_daemon():
    d = Daemon()
    os.kill(d.proc.pid, signal.SIGKILL)  # behind the fixture's back: a crash
    d.proc.wait()
    with pytest.raises(AssertionError, match=r"had exited \(status -9\) before its stop"):
        d.stop()


def test_stop_reports_a_bad_exit_status():
    d = Daemon()
    d.proc.terminate()
    assert d.proc.wait() == 0
    # in its place, a process that exits 3 on SIGTERM (or dies of it, if the
    # signal comes before the trap: non-zero either way)
    d.proc = subprocess.Popen(["sh", "-c", "trap 'exit 3' TERM; while :; do sleep 0.05; done"])
    with pytest.raises(AssertionError, match=r"exited with status -?\d+ on SIGTERM"):
        d.stop()


def test_stop_accepts_a_deliberate_kill():
    d = Daemon()
    d.kill()
    d.stop()
