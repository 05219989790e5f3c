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

import pytest

from autogemm.families import SimtConfig
from autogemm.measure.isolate import IsolatedEvaluator
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


class _CompilingNothing:
    """For measuring-process stand-ins, which load nothing: a candidate's compile is done at once, in this
    process (verify compiles before it measures; a compile worker would cost a process start each)."""

    def _submit(self, source):
        from concurrent.futures import Future

        from compile_stubs import compile_nothing

        done = Future()
        done.set_result(compile_nothing(source, self.device.arch))
        return done


def test_a_hung_candidate_is_killed_with_everything_its_process_started(tmp_path, monkeypatch):
    """The measuring process used to be killed alone: what it had started went on running."""
    from process_stubs import hang_with_a_child

    class Hanging(_CompilingNothing, IsolatedEvaluator):
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


def _served_by(evaluator) -> tuple[int, int]:
    """(process id, problem M) of the stand-in that answered the evaluator's start."""
    pid, m = divmod(int(evaluator.cublas_ms), 1000)
    return pid, m


def test_a_measuring_process_is_kept_for_the_next_tune_only_inside_keep_measuring_processes(monkeypatch):
    # a campaign worker used to start a measuring process (interpreter, CUDA context) for every tune
    from autogemm.measure import isolate
    from process_stubs import serve_without_a_gpu

    class StandIn(_CompilingNothing, IsolatedEvaluator):
        process_target = staticmethod(serve_without_a_gpu)

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), *sys.path]))
    device = Device.for_arch("sm_90")

    def tune(m: int) -> int:
        evaluator = StandIn(Problem(m, 64, 64), device, jobs=1)
        try:
            pid, served = _served_by(evaluator)
            assert served == m and evaluator.verify(SimtConfig()).ok  # this problem's start, then requests
            return pid
        finally:
            evaluator.close()

    with isolate.keep_measuring_processes(prestart_on=device.ordinal, target=serve_without_a_gpu):
        prestarted = isolate._kept[(serve_without_a_gpu, device.ordinal)][0].pid
        first = tune(64)
        assert first == prestarted
        assert tune(96) == first and tune(128) == first
        os.kill(first, signal.SIGKILL)  # a kept process that died is replaced
        assert wait_until_gone(first)
        replacement = tune(160)
        assert replacement != first and tune(192) == replacement
        # a tune left with a request unanswered (an exception while it waited) does not leave its
        # process to the next tune, whose start would read that answer
        interrupted = StandIn(Problem(224, 999, 64), device, jobs=1)

        def interrupt(signum, frame):
            raise RuntimeError("interrupted")

        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            signal.alarm(1)
            with pytest.raises(RuntimeError, match="interrupted"):
                interrupted.verify(SimtConfig())
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
            interrupted.close()
        assert not isolate._kept and wait_until_gone(replacement)
        last = tune(256)
        assert last != replacement
    assert wait_until_gone(last), "the kept process outlived keep_measuring_processes"
    assert not isolate._kept
    outside = tune(64), tune(64)
    assert outside[0] != outside[1] and all(wait_until_gone(pid) for pid in outside)


def test_the_baselines_timing_may_take_longer_than_a_candidate(monkeypatch):
    """A tune's re-timing asks the measuring process for the baselines' GPU time; on a GPU shared with other
    processes a grouped problem's baselines took longer than its candidate limit, and the tune ended with
    "cuBLAS timing failed: no answer within 10.0 s (hung kernel?)". Here they take 3 s against a 1 s limit."""
    from process_stubs import serve_without_a_gpu

    class StandIn(_CompilingNothing, IsolatedEvaluator):
        process_target = staticmethod(serve_without_a_gpu)

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), *sys.path]))
    evaluator = StandIn(Problem(64, 998, 64), Device.for_arch("sm_90"), jobs=1, timeout=1.0)
    try:
        pid, _ = _served_by(evaluator)
        assert evaluator._cublas(5) == evaluator.cublas_ms and evaluator.baselines == {"stand-in": evaluator.cublas_ms}
        assert evaluator.restarts == 0
    finally:
        evaluator.close()


def test_a_tunes_first_candidate_may_take_longer_than_the_derived_limit(monkeypatch):
    """A campaign's first FP8 problem on a fresh host lost its first candidate to the limit: that candidate also
    paid the measuring process's one-time work. Here measurements take 3 s against a derived limit of 1 s: the
    first is answered (the slack), the second times out; a limit the caller sets gets no slack."""
    from autogemm.measure import isolate
    from process_stubs import serve_without_a_gpu

    class StandIn(_CompilingNothing, IsolatedEvaluator):
        process_target = staticmethod(serve_without_a_gpu)

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), *sys.path]))
    monkeypatch.setattr(isolate, "candidate_timeout", lambda problem, device: 1.0)
    monkeypatch.setattr(isolate, "FIRST_REQUEST_SLACK_S", 10.0)
    slow = Problem(64, 999, 64)  # (the stand-in's measurements of N = 999 take 3 s)
    derived = StandIn(slow, Device.for_arch("sm_90"), jobs=1)
    try:
        assert derived.timeout == 1.0
        assert derived.verify(SimtConfig()).ok and derived.restarts == 0
        assert derived.verify(SimtConfig(bm=64)).kind == "timeout" and derived.restarts == 1
    finally:
        derived.close()
    given = StandIn(slow, Device.for_arch("sm_90"), jobs=1, timeout=1.0)
    try:
        assert given.verify(SimtConfig()).kind == "timeout"
    finally:
        given.close()
