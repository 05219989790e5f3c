"""Measuring in a separate process that owns the GPU context (the tuner's default): a candidate
that faults the context, hangs past its time or kills the process costs one failed trial (kind
"crash" or "timeout") and a restart of the process, not the tune.

The measuring process leads its own process group (killed whole, so nothing it started outlives
it; Ctrl-C reaches only the tuner, which stops it in order) and dies with the tuner: a tuner that
is killed while a hung kernel spins does not leave that kernel on the GPU. This module is the tuner's side
(starting, keeping, killing and restarting the process, `IsolatedEvaluator`); what runs in the process is
measuring_process.py's."""

from __future__ import annotations

import logging
import contextlib
import multiprocessing
import os
import signal
import time
from typing import Any

from .evaluate import CompileAheadEvaluator, FatalEvaluationError, Latency, Measurement, Sustained
from .measuring_process import measuring_process
from .timing import SUSTAINED_ROUND_MS, SUSTAINED_ROUNDS, sustained_warmup_ms
from ..problem import Device, Problem

log: logging.Logger = logging.getLogger(__name__)
# a new measuring process starts an interpreter, a CUDA context, its inputs and the cuBLAS baseline
STARTUP_TIMEOUT_S = 180.0
KILL_WAIT_S = 30.0  # how long a killed measuring process may take to exit before it counts as stuck
# The baselines' timing (library calls, each timed for ~100 ms of GPU time) is no candidate that may hang, and
# gets at least this long: on a GPU shared with other processes (the GPU test tier's workers, one running a
# deliberately hung kernel) a small grouped problem's two baselines took longer than its 10 s candidate limit
BASELINE_TIMEOUT_S = 60.0
# A tune's first request also pays its process's one-time work (CuPy compiling the checks' kernels, which a
# fresh host has not cached): on a fresh H100 a campaign's first FP8 problem lost its first candidate to the
# 14 s limit (the same kernel, measured again, took 0.05 s). It gets this much more where `candidate_timeout`
# sets the limit; a limit the caller set is kept, and a restarted process (CuPy's kernels on disk) gets none.
FIRST_REQUEST_SLACK_S = 60.0

def candidate_timeout(problem: Problem, device: Device) -> float:
    """Seconds one candidate may take in the measuring process (verification, ~40 timed runs and
    the reference): generous for a kernel at 5% of the device's FP32 peak, plus 10 s of slack."""
    clock_hz = (device.clock_khz or 2_000_000) * 1e3
    peak = device.sm_count * 128 * 2 * clock_hz  # FP32 FMA lanes per SM on sm_80/sm_90
    return 10.0 + 100.0 * problem.flops / (0.05 * peak)


# Measuring processes kept between tunes, inside `keep_measuring_processes`: by (body, GPU ordinal),
# each (process, its pipe), idle (no request of theirs is outstanding)
_kept: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_keeping = 0  # how many keep_measuring_processes blocks are open (they nest: a campaign's, a tune's)


@contextlib.contextmanager
def keep_measuring_processes(prestart_on: int | None = None, target=measuring_process):
    """Within this block, a tune's measuring process outlives the tune, and the next tune on the
    same GPU takes it over (its interpreter and CUDA context; the problem's inputs and cuBLAS
    baseline are set up anew): about 2 s less per tune after the first, which a campaign pays for
    every problem and a tune for every search space. `prestart_on`: a GPU ordinal whose measuring
    process starts now, ahead of the first tune. On leaving the outermost block, the kept processes
    stop."""
    global _keeping
    _keeping += 1
    try:
        if prestart_on is not None and (target, prestart_on) not in _kept:
            _kept[(target, prestart_on)] = _start_process(target, None, prestart_on, 0)
        yield
    finally:
        _keeping -= 1
        if not _keeping:
            while _kept:
                _stop_process(*_kept.popitem()[1])


def _start_process(target, problem_key: str | None, ordinal: int, seed: int) -> tuple[Any, ...]:
    """A measuring process (spawned: no CUDA context is inherited), and the parent's end of its pipe."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=target, name="autogemm-measure", daemon=True,
                              args=(child, problem_key, ordinal, seed, os.getpid()))
    process.start()
    child.close()
    return process, parent


def _stop_process(process, conn, wait: float = 10.0) -> None:
    """Asks a measuring process to stop; kills its group if it has not after `wait` seconds."""
    try:
        conn.send(("stop",))
    except (BrokenPipeError, OSError):
        pass
    process.join(wait)
    _kill_group(process)
    conn.close()


def _kill_group(process) -> bool:
    """Kills a measuring process's group (it and anything it started); False if it has still not
    exited after KILL_WAIT_S (stuck in the driver)."""
    if process.is_alive():
        try:
            os.killpg(process.pid, signal.SIGKILL)  # no group yet if it was killed while starting
        except OSError:
            pass
        process.kill()
    process.join(KILL_WAIT_S)
    return not process.is_alive()


class IsolatedEvaluator(CompileAheadEvaluator):
    """Measures in a separate process that owns the GPU context. A candidate that kills it, faults
    the context or outlives `timeout` seconds fails with kind crash or timeout; the process is
    restarted (the cost is counted in `restarts` and `restart_s`) and the tune goes on."""

    process_target = staticmethod(measuring_process)  # the measuring process's body

    def __init__(self, problem: Problem, device: Device, jobs: int, seed: int = 0, timeout: float | None = None):
        self.problem, self.device = problem, device
        self.timeout = timeout or candidate_timeout(problem, device)
        self._slack = FIRST_REQUEST_SLACK_S if timeout is None else 0.0  # the first request's, then 0
        self._seed = seed
        self._process = None
        self._conn = None
        self._cublas_ms: float | None = None
        self.restarts = 0
        self.restart_s = 0.0
        self._lingering: list[Any] = []  # killed measuring processes that had not exited yet
        self._start_pool(jobs)
        # The measuring process starts in the background: its start-up (interpreter, CUDA context,
        # inputs, cuBLAS baseline) overlaps with the tuner's set-up and the first compilations.
        self._spawn()

    @property
    def cublas_ms(self) -> float:
        self._ready()
        return self._cublas_ms

    def _spawn(self, fresh: bool = False) -> None:
        """Starts the measuring process, or (inside `keep_measuring_processes`, unless `fresh`) takes
        over the one an earlier tune on this GPU left, handing it this problem."""
        self._reused = self._awaiting = False
        kept = None if fresh or not _keeping else _kept.pop((self.process_target, self.device.ordinal), None)
        if kept is not None:
            process, conn = kept
            try:
                conn.send(("next", self.problem.key, self._seed))
                self._process, self._conn, self._reused = process, conn, True
            except (BrokenPipeError, OSError):  # it died while kept
                _stop_process(process, conn, wait=0)
        if not self._reused:
            self._process, self._conn = _start_process(self.process_target, self.problem.key, self.device.ordinal,
                                                       self._seed)
        self._starting = True

    def _ready(self) -> None:
        """Waits until the measuring process has started and measured cuBLAS. A kept process that
        cannot take this problem on is replaced by a fresh one."""
        if not self._starting:
            return
        self._starting = False
        failure = None
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self._kill()
            failure = f"the measuring process did not start within {STARTUP_TIMEOUT_S:g} s"
        else:
            try:
                kind, value = self._conn.recv()
                if kind != "ready":
                    failure = f"the measuring process could not start: {value}"
            except (EOFError, OSError):  # (a kept process that died: connection reset)
                self._process.join(5)
                failure = f"the measuring process died while starting (exit code {self._process.exitcode})"
        if failure is not None:
            if self._reused:
                self._kill()
                self._spawn(fresh=True)
                return self._ready()
            raise FatalEvaluationError(failure)
        if self._cublas_ms is None:  # the first start's baseline stands for the whole tune
            self._cublas_ms = value

    def _kill(self) -> None:
        """Kills the measuring process's group (it and anything it started). One that has not
        exited after KILL_WAIT_S (stuck in the driver) is kept, to be waited for again at close."""
        process = self._process
        if process is not None and not _kill_group(process):
            self._lingering.append(process)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def _restart(self) -> None:
        started = time.perf_counter()
        self._kill()
        self._spawn(fresh=True)
        self._ready()
        self.restarts += 1
        self.restart_s += time.perf_counter() - started

    def _request(self, message, timeout: float):
        """Sends a request; returns ('ok', value) or a failure Measurement after restarting. The first
        request of the tune may take FIRST_REQUEST_SLACK_S longer (with the limit `candidate_timeout` sets)."""
        self._ready()
        timeout, self._slack = timeout + self._slack, 0.0
        try:
            self._awaiting = True  # until its answer is read (an exception may leave it unread)
            self._conn.send(message)
            if not self._conn.poll(timeout):
                self._restart()
                return Measurement.failure("timeout", f"no answer within {timeout:.1f} s (hung kernel?); "
                                                      "the measuring process was killed and restarted")
            kind, value = self._conn.recv()
            self._awaiting = False
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = self._process.exitcode if self._process is not None else None
            if self._process is not None:
                self._process.join(5)
                code = self._process.exitcode
            self._restart()
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            return Measurement.failure("crash", f"the measuring process died ({how}); restarted")
        if self._process is not None and not self._process.is_alive() or (
                isinstance(value, dict) and value.get("kind") == "crash"):
            self._restart()  # it faulted the context and exited after answering
        return kind, value

    def _remeasure(self, config, best_ms, repeats: int, final: bool) -> Measurement:
        answer = self._request(("measure", config.to_dict(), best_ms, repeats, final, self._in_memory.get(config.name)),
                               self.timeout)
        if isinstance(answer, Measurement):
            return answer
        return Measurement(**answer[1])

    def single_call(self, config: Any) -> Latency | None:
        """(None when the measuring process could not say.)"""
        answer = self._request(("single", [config.to_dict()], [self._in_memory.get(config.name)]), self.timeout)
        if isinstance(answer, Measurement) or answer[0] != "ok":
            return None
        return Latency(**answer[1])

    def sustained(self, configs: list[Any]) -> Sustained | None:
        """(None when the measuring process could not say.) The time limit: each competitor's rounds
        and warm-up, several times over, on top of a candidate's."""
        seconds = (len(configs) + 3) * (SUSTAINED_ROUNDS * SUSTAINED_ROUND_MS + sustained_warmup_ms()) / 1e3
        answer = self._request(("sustained", [config.to_dict() for config in configs],
                                [self._in_memory.get(config.name) for config in configs]),
                               self.timeout + 3 * seconds)
        if isinstance(answer, Measurement) or answer[0] != "ok":
            return None
        return Sustained(**answer[1])

    def _cublas(self, repeats: int) -> float:
        answer = self._request(("cublas", repeats), max(self.timeout, BASELINE_TIMEOUT_S))
        if isinstance(answer, Measurement) or answer[0] != "ok":
            raise FatalEvaluationError(f"cuBLAS timing failed: {answer.message if isinstance(answer, Measurement) else answer[1]}")
        self.baselines = answer[1]["baselines"]  # each baseline's ms; "ms", the faster's
        return answer[1]["ms"]

    def close(self) -> None:
        super().close()
        key = (self.process_target, self.device.ordinal)
        if _keeping and not self._starting and not self._awaiting and self._process is not None \
                and self._process.is_alive() and key not in _kept:
            # every request was answered: the process is idle, kept for the next tune on this GPU
            _kept[key] = (self._process, self._conn)
            self._process = self._conn = None
        elif self._conn is not None:
            try:
                self._conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        if self._process is not None:
            self._process.join(10)
        self._kill()
        for process in self._lingering:
            process.join(KILL_WAIT_S)
            if process.is_alive():
                log.warning("autogemm: measuring process %d did not exit after SIGKILL; a kernel it launched may "
                            "still be running on the GPU", process.pid)
        self._lingering.clear()
