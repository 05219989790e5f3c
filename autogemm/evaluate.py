"""Turning a configuration into a verified measurement, for the tuner.

`GpuEvaluator` compiles candidates in worker processes ahead of time (`start`) while the GPU
verifies and times earlier ones (`finish`). `RecordedEvaluator` replays a table of measurements
captured from a real GPU run, so that the search itself can be tested and compared without a GPU.
Failures are values: every outcome is a `Measurement`, with a failure kind when it is not usable.
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from .bench import TOLERANCE, random_uniform, reference_gemm, relative_error, rotation_count, time_calls, warm_up
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


class GpuEvaluator(Evaluator):
    def __init__(self, problem: Problem, device: Device, jobs: int, seed: int = 0):
        import cupy

        self.problem, self.device = problem, device
        self._cupy = cupy
        self._jobs = jobs
        self._pool = compile_pool(jobs)
        self._rng = cupy.random.default_rng(seed)
        self._seed = seed
        per_set = 4 * problem.batch * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n)
        self._sets = [self._operands(seed + 100 * i) for i in range(rotation_count(per_set, device.l2_bytes))]
        warm_up(self._cublas_runner(0))
        self.cublas_ms = self._time_cublas()

    # ---- operands --------------------------------------------------------------------------------
    def _shapes(self):
        p = self.problem
        batch = (p.batch,) if p.batch > 1 else ()
        a = batch + ((p.k, p.m) if p.trans_a else (p.m, p.k))
        b = batch + ((p.n, p.k) if p.trans_b else (p.k, p.n))
        c = batch + (p.m, p.n)
        return a, b, c

    def _operands(self, seed: int):
        a_shape, b_shape, c_shape = self._shapes()
        a = random_uniform(a_shape, seed=seed)
        b = random_uniform(b_shape, seed=seed + 1)
        c = self._cupy.empty(c_shape, dtype=np.float32)
        return a, b, c

    def _op(self, x, transposed: bool):
        return self._cupy.swapaxes(x, -1, -2) if transposed else x

    def _cublas_runner(self, i: int):
        a, b, c = self._sets[i]
        op_a, op_b = self._op(a, self.problem.trans_a), self._op(b, self.problem.trans_b)
        return lambda: self._cupy.matmul(op_a, op_b, out=c)

    # ---- timing ----------------------------------------------------------------------------------
    def _time_cublas(self, repeats: int = 15) -> float:
        runners = [self._cublas_runner(i) for i in range(len(self._sets))]
        return time_calls(runners, repeats, min_batch=FINAL_MIN_BATCH, sample_ms=FINAL_SAMPLE_MS)

    # ---- candidates --------------------------------------------------------------------------------
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

    def _verify(self, config: SimtConfig) -> float:
        """Relative error on fresh random inputs, output poisoned with NaN first."""
        from .launch import bind

        seed = int(self._rng.integers(0, 2**31))
        a, b, c = self._operands(seed)
        c.fill(np.nan)
        run, _ = bind(config, a, b, c, trans_a=self.problem.trans_a, trans_b=self.problem.trans_b)
        run()
        expected = reference_gemm(a, b, trans_a=self.problem.trans_a, trans_b=self.problem.trans_b)
        return relative_error(c, expected)

    def _measure(self, config: SimtConfig, best_ms: float | None, repeats: int = 10, final: bool = False) -> Measurement:
        from .launch import bind

        cupy = self._cupy
        try:
            error = self._verify(config)
            if not error <= TOLERANCE["fp32"]:
                return Measurement(ok=False, rel_error=error, kind="wrong",
                                   message=f"relative error {error:.3g} exceeds {TOLERANCE['fp32']:g}")
            runners = []
            for a, b, c in self._sets:
                run, _ = bind(config, a, b, c, trans_a=self.problem.trans_a, trans_b=self.problem.trans_b)
                runners.append(run)
            if final:  # the figures that are reported: longer samples, like cuBLAS's
                ms = time_calls(runners, repeats, best_ms, min_batch=FINAL_MIN_BATCH, sample_ms=FINAL_SAMPLE_MS)
            else:
                ms = time_calls(runners, repeats, best_ms)
        except CompileError as exc:
            return Measurement.failure("compile", str(exc))
        except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            return Measurement.failure("launch", f"{type(exc).__name__}: {exc}")
        return Measurement(ok=True, time_ms=ms, tflops=self.problem.flops / ms / 1e9, rel_error=error)

    def finish(self, handle, best_ms: float | None) -> Measurement:
        config, future = handle
        try:
            future.result()
        except CompileError as exc:
            return Measurement.failure("compile", str(exc))
        except BrokenProcessPool as exc:
            self._pool = compile_pool(self._jobs)
            return Measurement.failure("crash", f"compile worker died: {exc}")
        return self._measure(config, best_ms)

    def retime(self, configs: list, rounds: int = 5) -> tuple[list[Measurement], float]:
        """Interleaves the finalists and cuBLAS over several rounds; each gets its median."""
        samples: dict[int, list[float]] = {i: [] for i in range(len(configs))}
        failures: dict[int, Measurement] = {}
        cublas: list[float] = []
        errors: dict[int, float | None] = {}
        for i, config in enumerate(configs):  # re-verify each finalist on fresh inputs first
            check = self._measure(config, None, repeats=3)
            errors[i] = check.rel_error
            if not check.ok:
                failures[i] = check
        for _ in range(rounds):
            for i, config in enumerate(configs):
                if i in failures:
                    continue
                m = self._measure(config, None, repeats=5, final=True)
                if m.ok:
                    samples[i].append(m.time_ms)
                else:
                    failures[i] = m
            cublas.append(self._time_cublas(repeats=5))
        cublas_ms = float(np.median(cublas))
        out = []
        for i in range(len(configs)):
            if i in failures:
                out.append(failures[i])
            else:
                ms = float(np.median(samples[i]))
                out.append(Measurement(ok=True, time_ms=ms, tflops=self.problem.flops / ms / 1e9, rel_error=errors[i]))
        return out, cublas_ms

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


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
