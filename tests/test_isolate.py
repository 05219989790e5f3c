"""The isolated measuring process without a GPU (stand-ins from tests/process_stubs.py): a hung
candidate's process is killed with everything it started, and the measuring process never outlives
the tuner that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from autogemm.families import SimtConfig
from autogemm.isolate import IsolatedEvaluator
from autogemm.problem import Device, Problem

HERE = Path(__file__).parent


def gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie counts: it runs nothing and waits only to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until_gone(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


def test_a_hung_candidate_is_killed_with_everything_its_process_started(tmp_path, monkeypatch):
    """The measuring process used to be killed alone: what it had started went on running."""
    from process_stubs import hang_with_a_child

    class Hanging(IsolatedEvaluator):
        process_target = staticmethod(hang_with_a_child)

    pidfile = tmp_path / "pids"
    monkeypatch.setenv("AUTOGEMM_TEST_PIDFILE", str(pidfile))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), *sys.path]))
    evaluator = Hanging(Problem(64, 64, 64), Device.for_arch("sm_90"), jobs=1, timeout=2.0)
    try:
        result = evaluator.verify(SimtConfig())
        assert result.kind == "timeout" and evaluator.restarts == 1
        measuring, started = map(int, pidfile.read_text().split())
        assert wait_until_gone(measuring) and wait_until_gone(started)
    finally:
        evaluator.close()


def test_the_measuring_process_dies_with_its_parent(tmp_path):
    """A tuner killed outright (SIGKILL: no clean-up runs) used to leave its measuring process, and
    a kernel it was running, behind."""
    pidfile = tmp_path / "follower"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    parent = subprocess.Popen([sys.executable, str(HERE / "process_stubs.py"), str(pidfile)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the follower did not start"
            time.sleep(0.1)
        follower = int(pidfile.read_text())
        assert not gone(follower)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert wait_until_gone(follower), "the measuring process outlived its parent"
    finally:
        parent.kill()
