"""Turning a configuration into a verified measurement, for the tuner.

Candidates compile in worker processes ahead of time (`start`) while the GPU verifies and times
earlier ones (`finish`). `IsolatedEvaluator` (the tuner's default) measures in a separate process
that owns the GPU context, so that a candidate that faults, hangs or kills that process costs one
failed trial and a restart, not the tune; `GpuEvaluator` measures in this process.
`RecordedEvaluator` replays a table of measurements captured from a real GPU run, so that the
search itself can be tested and compared without a GPU.
Failures are values: every outcome is a `Measurement`, with a failure kind when it is not usable.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from .bench import cublas_runner, poison, random_uniform, reference_gemm, relative_error, rotation_count, time_calls, tolerance, warm_up
from .compile import CompileError, compile_pool, compile_to_cubin
from .config import SimtConfig
from .problem import Device, Problem
from .render import render

# Re-timing of finalists and cuBLAS: each sample is >= 3 back-to-back calls and >= 2 ms, so that
# host overhead (cupy.matmul's is 15-25 us a call) stays out of the figures that get reported.
FINAL_MIN_BATCH = 3
FINAL_SAMPLE_MS = 2.0

FAILURE_KINDS = ("compile", "launch", "wrong", "timeout", "crash", "cancelled", "unrecorded")


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


class Evaluator:
    """Interface of the tuner's measuring back end."""

    problem: Problem
    device: Device
    cublas_ms: float
    restarts: int = 0  # measuring processes restarted after a crash or a timeout
    restart_s: float = 0.0  # wall time those restarts cost

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
        warm_up(self._cublas_runner(0))
        self.cublas_ms = self.time_cublas()

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

    def time_cublas(self, repeats: int = 15) -> float:
        runners = [self._cublas_runner(i) for i in range(len(self._sets))]
        return time_calls(runners, repeats, min_batch=FINAL_MIN_BATCH, sample_ms=FINAL_SAMPLE_MS)

    def _verify(self, config) -> float:
        from .launch import bind

        seed = int(self._rng.integers(0, 2**31))
        a, b, c = self._operands(seed)
        poison(c)
        run, _ = bind(config, a, b, c, trans_a=self.problem.trans_a, trans_b=self.problem.trans_b)
        run()
        expected = reference_gemm(a, b, trans_a=self.problem.trans_a, trans_b=self.problem.trans_b)
        return relative_error(c, expected)

    def measure(self, config, best_ms: float | None, repeats: int = 10, final: bool = False) -> Measurement:
        """Verifies, then times. `final`: the reported figures, sampled like cuBLAS's."""
        from .launch import bind

        cupy = self._cupy
        try:
            error = self._verify(config)
            limit = tolerance(self.problem)
            if not error <= limit:
                return Measurement(ok=False, rel_error=error, kind="wrong",
                                   message=f"relative error {error:.3g} exceeds {limit:g}")
            runners = []
            for a, b, c in self._sets:
                run, _ = bind(config, a, b, c, trans_a=self.problem.trans_a, trans_b=self.problem.trans_b)
                runners.append(run)
            if final:
                ms = time_calls(runners, repeats, best_ms, min_batch=FINAL_MIN_BATCH, sample_ms=FINAL_SAMPLE_MS)
            else:
                ms = time_calls(runners, repeats, best_ms)
        except CompileError as exc:
            return Measurement.failure("compile", str(exc))
        except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            message = f"{type(exc).__name__}: {exc}"
            if any(name in str(exc) for name in STICKY_CUDA_ERRORS):
                self.poisoned = message
                return Measurement.failure("crash", message)
            return Measurement.failure("launch", message)
        return Measurement(ok=True, time_ms=ms, tflops=self.problem.flops / ms / 1e9, rel_error=error)


class _CompileAhead(Evaluator):
    """Compiles candidates in worker processes while earlier ones are measured; retimes finalists
    through `_remeasure` and `_cublas`, which subclasses route to where the GPU context lives."""

    def _start_pool(self, jobs: int) -> None:
        self._jobs = jobs
        self._pool = compile_pool(jobs)

    def start(self, config: SimtConfig):
        source = render(config, self.problem)
        try:
            future = self._pool.submit(compile_to_cubin, source, self.device.arch)
        except BrokenProcessPool:
            self._pool = compile_pool(self._jobs)
            future = self._pool.submit(compile_to_cubin, source, self.device.arch)
        return config, future

    def cancel(self, handle) -> None:
        handle[1].cancel()

    def _compiled(self, handle) -> Measurement | None:
        """None once the candidate's cubin is ready, else the compile failure."""
        try:
            handle[1].result()
        except CompileError as exc:
            return Measurement.failure("compile", str(exc))
        except BrokenProcessPool as exc:
            self._pool = compile_pool(self._jobs)
            return Measurement.failure("crash", f"compile worker died: {exc}")
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

    def retime(self, configs: list, rounds: int = 5) -> tuple[list[Measurement], float]:
        """Interleaves the finalists and cuBLAS over several rounds; each gets its median."""
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
        out = []
        for i in range(len(configs)):
            if i in failures:
                out.append(failures[i])
            else:
                ms = float(np.median(samples[i]))
                out.append(Measurement(ok=True, time_ms=ms, tflops=self.problem.flops / ms / 1e9, rel_error=errors[i]))
        return out, float(np.median(cublas))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class GpuEvaluator(_CompileAhead):
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
        return self._measurer.time_cublas(repeats)


class FatalEvaluationError(RuntimeError):
    """Measuring cannot go on (the GPU context is lost, or the measuring process cannot start)."""


def candidate_timeout(problem: Problem, device: Device) -> float:
    """Seconds one candidate may take in the measuring process (verification, ~40 timed runs and
    the reference): generous for a kernel at 5% of the device's FP32 peak, plus 10 s of slack."""
    clock_hz = (device.clock_khz or 2_000_000) * 1e3
    peak = device.sm_count * 128 * 2 * clock_hz  # FP32 FMA lanes per SM on sm_80/sm_90
    return 10.0 + 100.0 * problem.flops / (0.05 * peak)


def _measuring_process(conn, problem_key: str, ordinal: int, seed: int) -> None:
    """Body of the isolated measuring process: owns the CUDA context, answers requests."""
    import cupy

    from .config import config_from_dict

    try:
        cupy.cuda.Device(ordinal).use()
        measurer = GpuMeasurer(Problem.from_key(problem_key), Device.current(ordinal), seed)
    except Exception as exc:  # report, do not hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", measurer.cublas_ms))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request[0] == "stop":
            return
        if request[0] == "cublas":
            conn.send(("ok", measurer.time_cublas(request[1])))
            continue
        _, config_data, best_ms, repeats, final = request
        measurement = measurer.measure(config_from_dict(config_data), best_ms, repeats, final)
        conn.send(("ok", asdict(measurement)))
        if measurer.poisoned:
            os._exit(3)  # the context is gone: let the parent start a fresh process


class IsolatedEvaluator(_CompileAhead):
    """Measures in a separate process that owns the GPU context. A candidate that kills it, faults
    the context or outlives `timeout` seconds fails with kind crash or timeout; the process is
    restarted (the cost is counted in `restarts` and `restart_s`) and the tune goes on."""

    def __init__(self, problem: Problem, device: Device, jobs: int, seed: int = 0, timeout: float | None = None):
        self.problem, self.device = problem, device
        self.timeout = timeout or candidate_timeout(problem, device)
        self._seed = seed
        self._ctx = multiprocessing.get_context("spawn")
        self._process = None
        self._conn = None
        self._cublas_ms: float | None = None
        self.restarts = 0
        self.restart_s = 0.0
        self._start_pool(jobs)
        # The measuring process starts in the background: its start-up (interpreter, CUDA context,
        # inputs, cuBLAS baseline) overlaps with the tuner's set-up and the first compilations.
        self._spawn()

    @property
    def cublas_ms(self) -> float:
        self._ready()
        return self._cublas_ms

    def _spawn(self) -> None:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(target=_measuring_process, name="autogemm-measure",
                                          args=(child, self.problem.key, self.device.ordinal, self._seed), daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        self._starting = True

    def _ready(self) -> None:
        """Waits until the measuring process has started and measured cuBLAS."""
        if not self._starting:
            return
        self._starting = False
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self._kill()
            raise FatalEvaluationError(f"the measuring process did not start within {STARTUP_TIMEOUT_S:g} s")
        try:
            kind, value = self._conn.recv()
        except EOFError:
            raise FatalEvaluationError(f"the measuring process died while starting (exit code {self._process.exitcode})") from None
        if kind != "ready":
            raise FatalEvaluationError(f"the measuring process could not start: {value}")
        if self._cublas_ms is None:  # the first start's baseline stands for the whole tune
            self._cublas_ms = value

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        if self._process is not None:
            self._process.join(30)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def _restart(self) -> None:
        started = time.perf_counter()
        self._kill()
        self._spawn()
        self._ready()
        self.restarts += 1
        self.restart_s += time.perf_counter() - started

    def _request(self, message, timeout: float):
        """Sends a request; returns ('ok', value) or a failure Measurement after restarting."""
        self._ready()
        try:
            self._conn.send(message)
            if not self._conn.poll(timeout):
                self._restart()
                return Measurement.failure("timeout", f"no answer within {timeout:.1f} s (hung kernel?); "
                                                      "the measuring process was killed and restarted")
            kind, value = self._conn.recv()
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
        answer = self._request(("measure", config.to_dict(), best_ms, repeats, final), self.timeout)
        if isinstance(answer, Measurement):
            return answer
        return Measurement(**answer[1])

    def _cublas(self, repeats: int) -> float:
        answer = self._request(("cublas", repeats), self.timeout)
        if isinstance(answer, Measurement):
            raise FatalEvaluationError(f"cuBLAS timing failed: {answer.message}")
        return answer[1]

    def close(self) -> None:
        super().close()
        if self._conn is not None:
            try:
                self._conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        if self._process is not None:
            self._process.join(10)
        self._kill()


STARTUP_TIMEOUT_S = 180.0


# ---- recorded tables ------------------------------------------------------------------------------
@dataclass
class RecordedTable:
    """Measurements of every configuration of a space, captured from one GPU run."""

    problem: Problem
    device: Device
    cublas_ms: float
    rows: dict[str, Measurement]
    header: dict

    @classmethod
    def load(cls, path: str | Path) -> RecordedTable:
        lines = Path(path).read_text().splitlines()
        header = json.loads(lines[0])
        device_fields = {f.name for f in fields(Device)}
        device_data = {k: v for k, v in header["device"].items() if k in device_fields}
        device_data["compute_capability"] = tuple(device_data["compute_capability"])
        rows = {}
        for line in lines[1:]:
            row = json.loads(line)
            name = row.pop("config")
            rows[name] = Measurement(**row)
        return cls(Problem.from_key(header["problem"]), Device(**device_data), header["cublas_ms"], rows, header)

    def write(self, path: str | Path) -> None:
        with open(path, "w") as out:
            out.write(json.dumps(self.header) + "\n")
            for name, m in sorted(self.rows.items()):
                out.write(json.dumps({"config": name, **m.to_json()}) + "\n")

    @property
    def best(self) -> tuple[str, Measurement]:
        return max(((n, m) for n, m in self.rows.items() if m.ok), key=lambda item: item[1].tflops)


class RecordedEvaluator(Evaluator):
    def __init__(self, table: RecordedTable):
        self.table = table
        self.problem, self.device, self.cublas_ms = table.problem, table.device, table.cublas_ms

    def start(self, config):
        return config

    def finish(self, handle, best_ms: float | None) -> Measurement:
        measured = self.table.rows.get(handle.name)
        if measured is None:
            return Measurement.failure("unrecorded", f"{handle.name} is not in the recorded table")
        return measured

    def retime(self, configs: list) -> tuple[list[Measurement], float]:
        return [self.finish(c, None) for c in configs], self.cublas_ms
