# SPDX-License-Identifier: MIT
"""Fixtures of the snapkv module's tests: a private snapkvd on a temporary
socket (started once per test session, and fresh ones where a test kills
its daemon), the module imported from the build tree, and helpers."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))


def daemon_env():
    """The environment of a snapkvd the suite starts: under ASan
    (run-pytest.sh preloads the runtime into the interpreter, leak checks
    off there) the daemon gets the run's own options back, leaks checked."""
    env = dict(os.environ)
    if "SNAPKV_PYTEST_DAEMON_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env.pop("SNAPKV_PYTEST_DAEMON_ASAN_OPTIONS")
        env.pop("LD_PRELOAD", None)
    return env


def required(what):
    """Whether SNAPKV_REQUIRE (comma-separated, or "all") names WHAT."""
    req = os.environ.get("SNAPKV_REQUIRE", "").split(",")
    return what in req or "all" in req


def skip_unless(what, ok, reason):
    """A module's pytestmark: nothing if OK, else a skip for want of WHAT
    whose reason reads "SKIP(WHAT): REASON" (scripts/run-tests.sh lists
    it), or, where SNAPKV_REQUIRE names WHAT, a failure at collection."""
    if ok:
        return []
    if required(what):
        pytest.fail(f"required {what} (SNAPKV_REQUIRE): {reason}", pytrace=False)
    return pytest.mark.skip(reason=f"SKIP({what}): {reason}")


class Daemon:
    """snapkvd on a socket in a temporary directory."""

    def __init__(self, extra=()):
        self.dir = tempfile.mkdtemp(prefix="snapkv-py.")
        self.sock = os.path.join(self.dir, "snapkvd.sock")
        self.log = open(os.path.join(self.dir, "snapkvd.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(BUILD, "snapkvd"), "--socket", self.sock, "--threads", "1",
             "--log-level", "warning", *extra],
            stdout=self.log, stderr=subprocess.STDOUT, env=daemon_env())
        for _ in range(200):
            if os.path.exists(self.sock):
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not os.path.exists(self.sock):
            self.killed = True  # the RuntimeError below says why
            self.stop()
            raise RuntimeError("snapkvd did not start: " + self.logtext())

    def logtext(self):
        with open(os.path.join(self.dir, "snapkvd.log")) as f:
            return f.read()

    def ctl(self, *args):
        env = dict(os.environ, SNAPKV_SOCKET=self.sock)
        return subprocess.run([os.path.join(BUILD, "snapkvctl"), *args], env=env,
                              capture_output=True, text=True, check=True).stdout

    def ledger(self):
        return json.loads(self.ctl("ledger", "--json"))

    def kill(self, sig=signal.SIGKILL):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait()
        self.killed = True

    def stop(self):
        """SIGTERM, then the exit status must be 0: a daemon that died
        before (unless kill() killed it), hung in its drain or crashed on
        the way out fails the test that owns it."""
        before = self.proc.poll()
        if before is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        log = self.logtext()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        if getattr(self, "killed", False):
            return
        if before is not None:
            raise AssertionError(f"snapkvd had exited (status {before}) before its stop: {log}")
        if rc != 0:
            raise AssertionError(f"snapkvd exited with status {rc} on SIGTERM: {log}")


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture
def fresh_daemon():
    d = Daemon()
    yield d
    d.stop()


@pytest.fixture(scope="session")
def snapkv():
    import snapkv as m
    return m


@pytest.fixture
def client(daemon, snapkv):
    with snapkv.Client(daemon.sock, name="pytest") as c:
        yield c
