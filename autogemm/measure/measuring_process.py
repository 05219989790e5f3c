"""The measuring process's side of isolate.py: what runs in the separate process that owns the GPU context.
It leads its own process group and dies with its parent (`detach`), sets up its context, then answers the
parent's requests (measure a candidate, time the baselines, a finalist's latency, finalists sustained) for one
problem after another (`serve_problems`, `serve`), until the parent says stop or goes away. The parent's side
(starting, keeping, killing and restarting it) is isolate.py's."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

from ..families import config_from_dict
from ..kernels.compile import remember
from ..problem import Device, Problem
from .evaluate import GpuMeasurer, failure_from_exception
from .measurers import measurer_for

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies
PARENT_POLL_S = 1.0


def follow_parent(parent_pid: int) -> None:
    """Makes this process die when `parent_pid` (its parent) does, however the parent ends. Linux
    sends SIGKILL at once (prctl; strictly when the parent's thread that started this process
    ends, which for the tuner is the thread that runs the tune and outlives the evaluator);
    everywhere a daemon thread also checks every second whether the process was orphaned, in case
    the signal was set too late or is unavailable."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the signal was set
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="autogemm-follow-parent", daemon=True).start()


def detach(parent_pid: int) -> None:
    """First thing a measuring process does: lead its own process group, follow its parent."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    follow_parent(parent_pid)


def measuring_process(conn, problem_key: str | None, ordinal: int, seed: int, parent_pid: int) -> None:
    """Body of the isolated measuring process: owns the CUDA context, answers requests for one
    problem after another (`serve_problems`). Started with no problem (`keep_measuring_processes`'s
    prestart), it sets up its context and waits for the first."""
    detach(parent_pid)
    import cupy  # (lazy: CuPy)

    try:
        cupy.cuda.Device(ordinal).use()
        cupy.cuda.runtime.free(cupy.cuda.runtime.malloc(1))  # the context, now rather than with the first problem
        device = Device.current(ordinal)
    except Exception as exc:  # report, do not hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return

    def measurer_of(key: str, seed: int) -> GpuMeasurer:
        return measurer_for(Problem.from_key(key), device, seed)

    def release() -> None:  # the last problem's inputs go back to the device before the next one's
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()

    serve_problems(conn, problem_key, seed, measurer_of, release)


def serve_problems(conn: Any, problem_key: str | None, seed: int, measurer_for: Any, release: Any = lambda: None) -> None:
    """A measuring process's life: for each problem, its measurer (inputs, cuBLAS baseline), a
    "ready" answer and its requests (`serve`), until the parent says stop or goes away. A ("next",
    key, seed) request hands the process, context and all, to the next problem: the parent keeps it
    between tunes (`keep_measuring_processes`) instead of starting another."""
    while True:
        if problem_key is None:
            try:
                request = conn.recv()
            except EOFError:
                return
            if request[0] != "next":
                return
            _, problem_key, seed = request
        try:
            measurer = measurer_for(problem_key, seed)
        except Exception as exc:  # report, do not hang the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            return
        conn.send(("ready", measurer.cublas_ms))
        following = serve(conn, measurer)
        del measurer
        release()
        if following is None:
            return
        _, problem_key, seed = following


def serve(conn: Any, measurer: Any) -> Any:
    """Answers the parent's requests until it says stop or goes away (returns None) or hands the
    process to another problem (returns that ("next", key, seed) request). Whatever one candidate
    raises is that candidate's failure (kind "oom" or "error"), never the end of the process; only
    a context the candidate made unusable ends it (the parent starts a fresh one)."""
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return None
        if request[0] == "stop":
            return None
        if request[0] == "next":
            return request
        if request[0] == "cublas":
            try:
                ms = measurer.time_cublas(request[1])
                conn.send(("ok", {"ms": ms, "baselines": dict(measurer.baselines)}))
            except Exception as exc:
                conn.send(("failed", f"{type(exc).__name__}: {exc}"))
            continue
        if request[0] in ("single", "sustained"):  # a finalist's latency, or finalists timed sustained
            _, configs_data, cubins = request
            for cubin in cubins:
                if cubin is not None:  # compiled but not stored: loaded from these bytes
                    remember(cubin)
            configs = [config_from_dict(data) for data in configs_data]
            try:
                answer = measurer.single_call(configs[0]) if request[0] == "single" else measurer.sustained(configs)
                conn.send(("ok", asdict(answer)))
            except Exception as exc:
                conn.send(("failed", f"{type(exc).__name__}: {exc}"))
            if measurer.poisoned:
                os._exit(3)
            continue
        _, config_data, best_ms, repeats, final, cubin = request
        if cubin is not None:  # compiled but not stored: loaded from these bytes
            remember(cubin)
        try:
            measurement = measurer.measure(config_from_dict(config_data), best_ms, repeats, final)
        except Exception as exc:  # anything measure() did not classify is this candidate's failure
            measurement = failure_from_exception(exc)
        conn.send(("ok", asdict(measurement)))
        if measurer.poisoned:
            os._exit(3)  # the context is gone: let the parent start a fresh process
