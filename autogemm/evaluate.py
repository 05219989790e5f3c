"""Turning a configuration into a verified measurement, for the tuner.

Candidates compile in worker processes ahead of time (`start`) while the GPU verifies and times
earlier ones (`finish`). `GpuEvaluator` measures in this process; `isolate.IsolatedEvaluator` (the
tuner's default) in a separate process that owns the GPU context; `recorded.RecordedEvaluator`
replays measurements captured from a real GPU run, so that the search can be tested without one.
Failures are values: every outcome is a `Measurement`, with a failure kind when it is not usable.
"""

from __future__ import annotations

import functools
import sys
from collections import OrderedDict
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass

import numpy as np

from .bench import Verdict, check_result, cublas_runner, poison, random_uniform, rotation_count, warm_up
from .compile import (CompileError, UnstoredCubin, compile_pool, compile_to_cubin, remember, shared_compile_pool,
                      unloaded_after)
from .problem import Device, Problem
from .render import render
from .timing import PROTOCOL, TARGET_MS, gpu_time, latencies

# GPU time (timing.gpu_time) of a candidate during the search: a short steady run; the finalists and
# the baselines are re-timed with the protocol's full TARGET_MS each.
TRIAL_TARGET_MS = 10.0
TRIAL_MAX_CALLS = 400
# the baselines' first timing, when a measuring process takes a problem (re-timed with the finalists)
FIRST_BASELINE_MS = 30.0
# The least run-to-run spread assumed of a timing (H100 re-timings of one kernel differ by ~1%)
MIN_NOISE = 0.01
# A generated kernel must also beat the served cuBLAS fallback by this much in single-call latency
# (each call on an idle GPU, host time included, as a user waits for it)
LATENCY_MARGIN = 0.01
SINGLE_CALL_PAIRS = 40
# the baselines a generated kernel is measured against: cuBLASLt as matmul serves it (cublas_gemm)
# and cupy.matmul; the faster of the two in GPU time is the one to beat
SERVED, CUPY = "cublaslt", "cupy.matmul"


@dataclass
class Latency:
    """Single-call latency of a kernel and of the served cuBLAS fallback, microseconds (medians)."""

    kernel_us: float
    baseline_us: float

    @property
    def ratio(self) -> float:
        return self.baseline_us / self.kernel_us


# compile: the compiler refused it; launch: CUDA refused to launch it; wrong: verification failed;
# timeout/crash: it hung or killed the measuring process; oom: GPU memory ran out while measuring
# it; error: preparing or measuring it raised anything else (a bug, reported with its traceback)
FAILURE_KINDS = ("compile", "launch", "wrong", "timeout", "crash", "oom", "error", "cancelled", "unrecorded")


@dataclass
class Measurement:
    ok: bool
    time_ms: float = 0.0
    tflops: float = 0.0
    rel_error: float | None = None
    kind: str = ""  # failure kind, one of FAILURE_KINDS
    message: str = ""

    @classmethod
    def failure(cls, kind: str, message: str) -> Measurement:
        return cls(ok=False, kind=kind, message=message[:2000])

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}


def failure_from_exception(exc: BaseException) -> Measurement:
    """An unexpected exception while measuring one candidate, as its failure: kind "error", the
    exception and the innermost frames of its traceback (where to look for the bug)."""
    import traceback

    frames = "".join(traceback.format_tb(exc.__traceback__, limit=-3))
    return Measurement.failure("error", f"{type(exc).__name__}: {exc}\n{frames}")


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
    baselines: dict = {}

    def start(self, config):
        """Begins work on a candidate (compiling, say) without blocking; returns a handle."""
        raise NotImplementedError

    def finish(self, handle, best_ms: float | None) -> Measurement:
        """Completes a candidate: verifies, then times it. `best_ms` lets a hopeless one stop early."""
        raise NotImplementedError

    def cancel(self, handle) -> None:
        pass

    def retime(self, configs: list) -> tuple[list[Measurement], float]:
        """Re-verifies and re-times the finalists together with cuBLAS; returns (measurements, cuBLAS ms)."""
        raise NotImplementedError

    def single_call(self, config) -> Latency | None:
        """The kernel's and the served cuBLAS fallback's latency, one call at a time on an idle GPU,
        each served as matmul serves it (a fresh output, then the launch); None where this back end
        cannot measure it."""
        return None

    def close(self) -> None:
        pass


# CUDA errors after which the context is unusable: the process that owns it must end.
STICKY_CUDA_ERRORS = (
    "ILLEGAL_ADDRESS", "IllegalAddress", "LAUNCH_FAILED", "LaunchFailure", "ILLEGAL_INSTRUCTION",
    "IllegalInstruction", "MISALIGNED_ADDRESS", "MisalignedAddress", "INVALID_PC", "InvalidPc",
    "HARDWARE_STACK_ERROR", "HardwareStackError", "ASSERT", "Assert", "LAUNCH_TIMEOUT", "LaunchTimeout",
)


class GpuMeasurer:
    """The GPU side of evaluation, in the process that owns the CUDA context: inputs, verification
    against float64 on fresh random inputs (output poisoned with NaN), timing, cuBLAS baseline."""

    def __init__(self, problem: Problem, device: Device, seed: int = 0):
        import cupy

        self.problem, self.device = problem, device
        self._cupy = cupy
        self._rng = cupy.random.default_rng(seed)
        self.poisoned = ""  # set to the error once the CUDA context is unusable
        per_set = 4 * problem.batch * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n)
        self._sets = [self._operands(seed + 100 * i) for i in range(rotation_count(per_set, device.l2_bytes))]
        self._served_calls: list | None = None
        self.baselines: dict[str, float] = {}  # ms of each baseline, from the last timing
        warm_up(self._served()[0])
        self.cublas_ms = self.time_cublas(target_ms=FIRST_BASELINE_MS)

    def _shapes(self):
        p = self.problem
        batch = (p.batch,) if p.batch > 1 else ()
        a = batch + ((p.k, p.m) if p.trans_a else (p.m, p.k))
        b = batch + ((p.n, p.k) if p.trans_b else (p.k, p.n))
        c = batch + (p.m, p.n)
        return a, b, c

    def _operands(self, seed: int):
        a_shape, b_shape, c_shape = self._shapes()
        dtype = self.problem.dtype
        a = random_uniform(a_shape, dtype, seed=seed)
        b = random_uniform(b_shape, dtype, seed=seed + 1)
        c = self._cupy.empty(c_shape, dtype=a.dtype)
        return a, b, c

    def _cublas_runner(self, i: int):
        a, b, c = self._sets[i]
        return cublas_runner(self.problem, a, b, c)

    def _served(self) -> list:
        """cuBLASLt as matmul serves it (cublas_gemm's launcher), bound to each input set."""
        if self._served_calls is None:
            from .cublas_gemm import cublas_launcher
            from .operands import describe

            problem, calls = self.problem, []
            for a, b, c in self._sets:
                layouts = [describe(x, name, bfloat16_bits=True).storage(trans) for x, name, trans in
                           ((a, "a", problem.trans_a), (b, "b", problem.trans_b), (c, "c", False))]
                launch = cublas_launcher(problem, *layouts, self.device.compute_capability)
                calls.append(functools.partial(launch, *(layout.pointer for layout in layouts), 1.0, 0.0))
            self._served_calls = calls
        return self._served_calls

    def time_baselines(self, target_ms: float = TARGET_MS) -> dict[str, float]:
        """GPU time (ms a call, timing.gpu_time) of each baseline: cuBLASLt as served, cupy.matmul."""
        served = self._served()
        users = [self._cublas_runner(i) for i in range(len(self._sets))]
        baselines = {SERVED: gpu_time(lambda i: served[i % len(served)](), target_ms=target_ms).median_ms}
        try:
            baselines[CUPY] = gpu_time(lambda i: users[i % len(users)](), target_ms=target_ms).median_ms
        except (TypeError, NotImplementedError):  # CuPy cannot compute this type in this form: no user can
            pass
        self.baselines = baselines
        return baselines

    def time_cublas(self, repeats: int | None = None, target_ms: float = TARGET_MS) -> float:
        """The faster baseline's GPU time, ms a call (`repeats`: unused, the protocol decides)."""
        return min(self.time_baselines(target_ms).values())

    def single_call(self, config, pairs: int = SINGLE_CALL_PAIRS) -> Latency:
        """Evaluator.single_call: the kernel's launcher and the served cuBLASLt, each after
        allocating a fresh output as matmul does. The calls rotate over the input sets, so that
        neither finds its operands still in L2 from the call before (a weight matrix of a decode step
        is not, and 32 MB of FP16 B would be)."""
        import itertools
        import statistics

        cupy = self._cupy
        shape, dtype = self._sets[0][2].shape, self._sets[0][2].dtype
        try:
            with unloaded_after():
                next_kernel = itertools.cycle(self._kernel_runners(config))
                next_served = itertools.cycle(self._served())

                def kernel():
                    cupy.empty(shape, dtype=dtype)
                    next(next_kernel)()

                def served():
                    cupy.empty(shape, dtype=dtype)
                    next(next_served)()

                waits = latencies({"kernel": kernel, "baseline": served}, rounds=pairs)
        except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            self._poisoned_by(exc)
            raise
        return Latency(statistics.median(waits["kernel"]) * 1e3, statistics.median(waits["baseline"]) * 1e3)

    def _kernel_runners(self, config) -> list:
        """The candidate bound to each input set (one `run(stream=None)` per set), for timing."""
        from .launch import bind

        problem = self.problem
        return [bind(config, a, b, c, trans_a=problem.trans_a, trans_b=problem.trans_b)[0] for a, b, c in self._sets]

    def _poisoned_by(self, exc: BaseException) -> bool:
        """Whether a CUDA error leaves the context unusable (then remembered in `poisoned`)."""
        if any(name in str(exc) for name in STICKY_CUDA_ERRORS):
            self.poisoned = f"{type(exc).__name__}: {exc}"
            return True
        return False

    def _verify(self, config) -> Verdict:
        """Runs the candidate once on fresh inputs into a NaN-poisoned output and checks every
        element against the float64 reference (norm-wise and element-wise bounds)."""
        from .launch import bind

        seed = int(self._rng.integers(0, 2**31))
        a, b, c = self._operands(seed)
        poison(c)
        run, _ = bind(config, a, b, c, trans_a=self.problem.trans_a, trans_b=self.problem.trans_b)
        run()
        return check_result(c, a, b, self.problem)

    def measure(self, config, best_ms: float | None, repeats: int = 10, final: bool = False) -> Measurement:
        """Verifies, then times. `final`: the reported figures, sampled like cuBLAS's."""
        with unloaded_after():  # this candidate's module goes once measured: memory stays flat
            return self._measure(config, best_ms, repeats, final)

    def _measure(self, config, best_ms: float | None, repeats: int, final: bool) -> Measurement:
        cupy = self._cupy
        try:
            verdict = self._verify(config)
            error = verdict.rel_error
            if not verdict.ok:
                return Measurement(ok=False, rel_error=error, kind="wrong", message=verdict.message)
            runners = self._kernel_runners(config)
            ms = gpu_time(lambda i: runners[i % len(runners)](), target_ms=TARGET_MS if final else TRIAL_TARGET_MS,
                          max_calls=None if final else TRIAL_MAX_CALLS).median_ms
        except CompileError as exc:
            return Measurement.failure("compile", str(exc))
        except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            message = f"{type(exc).__name__}: {exc}"
            if self._poisoned_by(exc):
                return Measurement.failure("crash", message)
            if "OUT_OF_MEMORY" in str(exc) or "MemoryAllocation" in str(exc):
                return Measurement.failure("oom", message)
            return Measurement.failure("launch", message)
        except (cupy.cuda.memory.OutOfMemoryError, MemoryError) as exc:
            return Measurement.failure("oom", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # one candidate's bug is its failure, not the measuring process's end
            return failure_from_exception(exc)
        return Measurement(ok=True, time_ms=ms, tflops=self.problem.flops / ms / 1e9, rel_error=error)


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
            print(f"autogemm: {cubin.reason}; the tune goes on with kernels loaded from memory", file=sys.stderr)
        self.unstored += 1
        self.storage_error = cubin.reason

    def _submit(self, source):
        try:
            return self._pool.submit(self.compile_function, source, self.device.arch)
        except BrokenProcessPool:  # a worker died since the last submission: a fresh pool
            self._pool = compile_pool(self._jobs)
            return self._pool.submit(self.compile_function, source, self.device.arch)

    def start(self, config):
        source = render(config, self.problem)
        return config, self._submit(source), source

    def cancel(self, handle) -> None:
        handle[1].cancel()

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

    def finish(self, handle, best_ms: float | None) -> Measurement:
        failed = self._compiled(handle)
        return failed if failed is not None else self._remeasure(handle[0], best_ms, 10, False)

    def verify(self, config, repeats: int = 3) -> Measurement:
        """Verifies one configuration on fresh inputs and times it briefly."""
        return self._remeasure(config, None, repeats, False)

    def _remeasure(self, config, best_ms, repeats: int, final: bool) -> Measurement:
        raise NotImplementedError

    def _cublas(self, repeats: int) -> float:
        raise NotImplementedError

    def retime(self, configs: list, rounds: int = 3) -> tuple[list[Measurement], float]:
        """Interleaves the finalists and the baselines over several rounds, each measurement a steady
        run of the protocol's TARGET_MS; each gets its median."""
        samples: dict[int, list[float]] = {i: [] for i in range(len(configs))}
        failures: dict[int, Measurement] = {}
        errors: dict[int, float | None] = {}
        cublas: list[float] = []
        for i, config in enumerate(configs):  # re-verify each finalist on fresh inputs first
            check = self._remeasure(config, None, 3, False)
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
        self._measurer = GpuMeasurer(problem, device, seed)
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

    def single_call(self, config) -> Latency | None:
        return self._measurer.single_call(config)


class FatalEvaluationError(RuntimeError):
    """Measuring cannot go on (the GPU context is lost, or the measuring process cannot start)."""
