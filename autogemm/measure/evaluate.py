"""Turning a configuration into a verified measurement, for the tuner.

Candidates compile in worker processes ahead of time (`start`) while the GPU verifies and times
earlier ones (`finish`). `GpuEvaluator` measures in this process; `isolate.IsolatedEvaluator` (the
tuner's default) in a separate process that owns the GPU context; `recorded.RecordedEvaluator`
replays measurements captured from a real GPU run, so that the search can be tested without one.
Failures are values: every outcome is a `Measurement`, with a failure kind when it is not usable.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from ..kernels.compile import CompileError, UnstoredCubin, compile_pool, compile_to_cubin, remember, shared_compile_pool
# the measuring side (what runs where the CUDA context lives), named here too: the tuner's callers
# know these as evaluate's
from .measurers import measurer_for
from .measuring import FAILURE_KINDS, LATENCY_MARGIN, SINGLE_CALL_PAIRS, STICKY_CUDA_ERRORS, GpuMeasurer, Latency, Measurement, failure_from_exception
from ..problem import Device, Problem
from ..kernels.render import render
from .timing import MIN_NOISE, PROTOCOL, Sustained

log: logging.Logger = logging.getLogger(__name__)


class Evaluator:
    """Interface of the tuner's measuring back end."""

    problem: Problem
    device: Device
    cublas_ms: float
    restarts: int = 0  # measuring processes restarted after a crash or a timeout
    restart_s: float = 0.0  # wall time those restarts cost
    unstored: int = 0  # compiled kernels the disk would not take (measured from memory)
    storage_error: str = ""  # why, the last time
    # relative spread of the last retime's cuBLAS figures (half their range over the median, at
    # least MIN_NOISE): a generated kernel must beat cuBLAS by more to be kept over it
    retime_noise: float = 0.01
    # the timing protocol of the figures (timing.PROTOCOL), and each baseline's GPU ms at the last timing
    protocol: int = PROTOCOL
    baselines: dict[str, Any] = {}

    def start(self, config: Any) -> None:
        """Begins work on a candidate (compiling, say) without blocking; returns a handle."""
        raise NotImplementedError

    def finish(self, handle: Any, best_ms: float | None) -> Measurement:
        """Completes a candidate: verifies, then times it. `best_ms` lets a hopeless one stop early."""
        raise NotImplementedError

    def cancel(self, handle: Any) -> None:
        pass

    def ready_within(self, handle: Any, seconds: float) -> bool:
        """Whether the candidate's preparation (its compile) is done within `seconds`, waiting at most
        that long: a search out of time measures no candidate it would first have to wait for.
        A back end with nothing to wait for is always ready."""
        return True

    def retime(self, configs: list[Any]) -> tuple[list[Measurement], float]:
        """Re-verifies and re-times the finalists together with cuBLAS; returns (measurements, cuBLAS ms)."""
        raise NotImplementedError

    def single_call(self, config: Any) -> Latency | None:
        """The kernel's and the served cuBLAS fallback's latency, one call at a time on an idle GPU,
        each served as matmul serves it (a fresh output, then the launch); None where this back end
        cannot measure it."""
        return None

    def sustained(self, configs: list[Any]) -> Sustained | None:
        """Sustained GPU time of the configs and the baselines, taking turns in rounds with the GPU never
        idle (measuring.GpuMeasurer.sustained); None where this back end cannot measure it."""
        return None

    def close(self) -> None:
        pass


class CompileAheadEvaluator(Evaluator):
    """Compiles candidates in worker processes while earlier ones are measured; retimes finalists
    through `_remeasure` and `_cublas`, which subclasses route to where the GPU context lives."""

    # what the workers run on a source (a function importable in a fresh process)
    compile_function = staticmethod(compile_to_cubin)

    # cubins the disk would not take, by config name, handed to wherever the candidate is measured
    IN_MEMORY_KEPT = 64

    def _start_pool(self, jobs: int) -> None:
        self._jobs = jobs
        # a campaign worker compiles in the campaign's shared pool (compile_service.py)
        self._pool = shared_compile_pool() or compile_pool(jobs)
        self._in_memory: OrderedDict[str, UnstoredCubin] = OrderedDict()

    def _keep_unstored(self, config, cubin) -> None:
        """A kernel compiled but not stored (a full or read-only disk): kept in memory for its
        measuring, said once, counted for the tune's report."""
        if not isinstance(cubin, UnstoredCubin):
            return
        remember(cubin)
        self._in_memory[config.name] = cubin
        self._in_memory.move_to_end(config.name)
        while len(self._in_memory) > self.IN_MEMORY_KEPT:
            self._in_memory.popitem(last=False)
        if not self.unstored:
            log.warning("autogemm: %s; the tune goes on with kernels loaded from memory", cubin.reason)
        self.unstored += 1
        self.storage_error = cubin.reason

    def _submit(self, source):
        try:
            return self._pool.submit(self.compile_function, source, self.device.arch)
        except BrokenProcessPool:  # a worker died since the last submission: a fresh pool
            self._pool = compile_pool(self._jobs)
            return self._pool.submit(self.compile_function, source, self.device.arch)

    def start(self, config: Any) -> Any:
        source = render(config, self.problem)
        return config, self._submit(source), source

    def cancel(self, handle: Any) -> None:
        handle[1].cancel()

    def ready_within(self, handle: Any, seconds: float) -> bool:
        try:
            handle[1].exception(timeout=max(0.0, seconds))  # (a failed compile is ready: finish reports it)
        except FutureTimeout:
            return False
        except CancelledError:
            return True
        return True

    def _compiled(self, handle) -> Measurement | None:
        """None once the candidate's cubin is ready, else the compile failure. When a worker dies,
        every candidate pending in its pool fails with BrokenProcessPool: each is compiled again
        alone, in a pool of its own, so that only the one that kills that worker too is a crash."""
        config, future, source = handle
        try:
            self._keep_unstored(config, future.result())
        except CompileError as exc:
            return Measurement.failure("compile", str(exc))
        except BrokenProcessPool:
            with compile_pool(1) as alone:
                try:
                    self._keep_unstored(config, alone.submit(self.compile_function, source, self.device.arch).result())
                except CompileError as exc:
                    return Measurement.failure("compile", str(exc))
                except BrokenProcessPool as exc:
                    return Measurement.failure("crash", f"the compile worker died on this candidate: {exc}")
        return None

    def finish(self, handle: Any, best_ms: float | None) -> Measurement:
        failed = self._compiled(handle)
        return failed if failed is not None else self._remeasure(handle[0], best_ms, 10, False)

    def verify(self, config: Any, repeats: int = 3) -> Measurement:
        """Verifies one configuration on fresh inputs and times it briefly. It is compiled first,
        in the pool, so that a cold compile (tens of seconds for a Hopper kernel on a fresh
        machine) is not taken for a hung kernel by the measuring process's time limit."""
        failed = self._compiled(self.start(config))
        return failed if failed is not None else self._remeasure(config, None, repeats, False)

    def _remeasure(self, config, best_ms, repeats: int, final: bool) -> Measurement:
        raise NotImplementedError

    def _cublas(self, repeats: int) -> float:
        raise NotImplementedError

    def retime(self, configs: list[Any], rounds: int = 3) -> tuple[list[Measurement], float]:
        """Interleaves the finalists and the baselines over several rounds, each measurement a steady
        run of the protocol's TARGET_MS; each gets its median."""
        samples: dict[int, list[float]] = {i: [] for i in range(len(configs))}
        failures: dict[int, Measurement] = {}
        errors: dict[int, float | None] = {}
        cublas: list[float] = []
        for i, config in enumerate(configs):  # re-verify each finalist on fresh inputs first
            check = self.verify(config)
            errors[i] = check.rel_error
            if not check.ok:
                failures[i] = check
        for _ in range(rounds):
            for i, config in enumerate(configs):
                if i in failures:
                    continue
                m = self._remeasure(config, None, 5, True)
                if m.ok:
                    samples[i].append(m.time_ms)
                else:
                    failures[i] = m
            cublas.append(self._cublas(5))
        cublas_ms = float(np.median(cublas))
        self.retime_noise = max(MIN_NOISE, (max(cublas) - min(cublas)) / (2 * cublas_ms))
        out = []
        for i in range(len(configs)):
            if i in failures:
                out.append(failures[i])
            else:
                ms = float(np.median(samples[i]))
                out.append(Measurement(ok=True, time_ms=ms, tflops=self.problem.flops / ms / 1e9, rel_error=errors[i]))
        return out, cublas_ms

    def close(self) -> None:
        if self._pool is not shared_compile_pool():
            self._pool.shutdown(wait=False, cancel_futures=True)


class GpuEvaluator(CompileAheadEvaluator):
    """Measures in this process. A kernel that corrupts the CUDA context ends the tune (with a
    clear error): use `IsolatedEvaluator` to survive that."""

    def __init__(self, problem: Problem, device: Device, jobs: int, seed: int = 0):
        self.problem, self.device = problem, device
        self._measurer = measurer_for(problem, device, seed)
        self.cublas_ms = self._measurer.cublas_ms
        self._start_pool(jobs)

    def _remeasure(self, config, best_ms, repeats: int, final: bool) -> Measurement:
        if self._measurer.poisoned:
            raise FatalEvaluationError(f"the CUDA context is unusable after {self._measurer.poisoned}; "
                                       "tune with isolation to survive faulting candidates")
        return self._measurer.measure(config, best_ms, repeats, final)

    def _cublas(self, repeats: int) -> float:
        ms = self._measurer.time_cublas(repeats)
        self.baselines = dict(self._measurer.baselines)
        return ms

    def single_call(self, config: Any) -> Latency | None:
        return self._measurer.single_call(config)

    def sustained(self, configs: list[Any]) -> Sustained | None:
        return self._measurer.sustained(configs)


class FatalEvaluationError(RuntimeError):
    """Measuring cannot go on (the GPU context is lost, or the measuring process cannot start)."""
