"""The measuring side of evaluation, in the process that owns the CUDA context (`GpuMeasurer`):
inputs, verification against float64, GPU time and single-call latency under the timing protocol
(timing.py), and the baselines (cuBLASLt as `matmul` serves it, and cupy.matmul). Its outcomes are
values: every candidate ends as a `Measurement`, with a failure kind when it is not usable."""

from __future__ import annotations

import dataclasses
import itertools
import traceback
import functools
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from ..gpu import launch
from .bench import (Verdict, check_epilogue_result, check_result, cublas_runner, poison, random_uniform, rotation_count,
                    warm_up)
from ..kernels.compile import CompileError, unloaded_after
from ..epilogue import Epilogue
from ..gpu.cublas_epilogue import LT_BARE, LT_ROUTE, LT_RUNNERS_UP, lt_route
from ..gpu.cublas_gemm import cublas_launcher
from ..problem import Device, Problem
from .clocks import ClockMonitor
from ..gpu.eager_route import ROUTE, ROUTE_BIAS_IN_PASS, bias_placement_differs
from .epilogue_routes import (bias_then_pass, eager_route_applies, lt_calls, same_algorithm, storage_layouts,
                              then_pass, torch_linear_calls)
from .timing import TARGET_MS, Sustained, gpu_time, latencies, sustained_times

# GPU time (timing.gpu_time) of a candidate during the search: a short steady run; the finalists and
# the baselines are re-timed with the protocol's full TARGET_MS each.
TRIAL_TARGET_MS = 10.0
TRIAL_MAX_CALLS = 400
# the baselines' first timing, when a measuring process takes a problem (re-timed with the finalists)
FIRST_BASELINE_MS = 30.0
# A generated kernel must also beat the served cuBLAS fallback by this much in single-call latency
# (each call on an idle GPU, host time included, as a user waits for it)
LATENCY_MARGIN = 0.01
SINGLE_CALL_PAIRS = 40
# the baselines a generated kernel is measured against: cuBLASLt as matmul serves it (cublas_gemm)
# and cupy.matmul; the faster of the two in GPU time is the one to beat
SERVED, CUPY = "cublaslt", "cupy.matmul"
# with an epilogue, what matmul serves without a fused kernel: cuBLASLt's GEMM then the epilogue's pass
# (gpu/epilogue_pass.py), and cuBLASLt's own epilogue where it has this one (gpu/cublas_epilogue.py);
# for a bias with an activation or a residual, eager PyTorch's route too (F.linear adds the bias inside
# cuBLASLt's GEMM, then F.gelu and the like make a pass): a fused kernel is kept only where it beats every
# route a user's call could take (session 47 kept a kernel at 1.024x cuBLAS + pass that ran 0.987x eager);
# and where PyTorch is installed, the route autogemm serves PyTorch tensors by without a kernel, PyTorch's own
# F.linear call and the pass after it (gpu/eager_route.py): cuBLASLt's heuristic picks F.linear's GEMM kernel
# apart from ours, and on an H200 a kernel kept at 1.049x the others (BF16 32×9216×7168 with a bias) served
# 0.905x eager's F.linear. That route is timed with the bias in F.linear and, where a pass follows anyway, with the
# bias in the pass too: a record that kept cuBLAS tells the route which ran faster (gpu/eager_route.py). cuBLASLt's
# own epilogue is timed through its heuristic's first algorithm (SERVED_LT) and its runners-up (lt_route(rank)): a
# record that kept cuBLAS tells the torch route which algorithm to serve (gpu/cublas_epilogue.measured_lt_rank)
SERVED_PASS, SERVED_LT, SERVED_LT_BIAS = "cublaslt + pass", LT_ROUTE, "cublaslt bias + pass"


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

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}


def import_torch(problem: Problem, baseline: str) -> Any:
    """PyTorch, which a measurer's baseline needs (ValueError naming the problem and the baseline where
    it is not installed)."""
    try:
        import torch  # (lazy: PyTorch, a measurer's baseline)
    except ImportError:
        raise ValueError(f"{problem}: its tune times its kernels against {baseline}: install PyTorch") from None
    return torch


def failure_from_exception(exc: BaseException) -> Measurement:
    """An unexpected exception while measuring one candidate, as its failure: kind "error", the
    exception and the innermost frames of its traceback (where to look for the bug)."""

    frames = "".join(traceback.format_tb(exc.__traceback__, limit=-3))
    return Measurement.failure("error", f"{type(exc).__name__}: {exc}\n{frames}")


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
        self._attach(problem, device, seed)
        if self.epilogue.out_dtype or self.epilogue.gated:
            raise ValueError(f"the epilogue {self.epilogue} is not measured: a fused kernel writes D in the operands' "
                             "dtype, without a gate (matmul serves those with the pass)")
        per_set = 4 * problem.batch * (problem.m * problem.k + problem.k * problem.n + problem.m * problem.n)
        self._sets = [self._operands(seed + 100 * i) for i in range(rotation_count(per_set, device.l2_bytes))]
        # each set's bias and residual (None where the epilogue adds none)
        self._extras = [self._epilogue_inputs(seed + 100 * i + 50) for i in range(len(self._sets))]
        self._served_calls: list[Any] | None = None
        # by the epilogue computed (not by cuBLASLt's name: BIAS adds a residual too where one is read as C)
        self._lt_calls: dict[tuple[Epilogue, int], list[Any] | None] = {}
        self._lt_bias_calls: list[Any] | None = None
        self._torch_linear_calls: dict[bool, list[Any] | None] = {}  # by whether the pass adds the bias
        self._cupy_computes: bool | None = None  # whether cupy.matmul computes this type in this form
        self.baselines: dict[str, float] = {}  # ms of each baseline, from the last timing
        warm_up(self._served()[0])
        self.cublas_ms = self.time_cublas(target_ms=FIRST_BASELINE_MS)

    def _attach(self, problem: Problem, device: Device, seed: int) -> None:
        """What every measurer holds: the problem, the device, CuPy, the verification's random
        generator, and whether the CUDA context is still usable."""
        import cupy  # (lazy: CuPy)

        self.problem, self.device = problem, device
        self._cupy = cupy
        self._rng = cupy.random.default_rng(seed)
        self.poisoned = ""  # set to the error once the CUDA context is unusable
        self.epilogue = problem.epilogue

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

    def _epilogue_inputs(self, seed: int) -> tuple[Any, ...]:
        """(bias, residual) of the epilogue, random in [-1, 1] (None for a part it does not have)."""
        epilogue, p = self.epilogue, self.problem
        bias = random_uniform((p.n if epilogue.bias == "n" else p.m,), p.dtype, seed=seed) if epilogue.bias else None
        residual = random_uniform(self._shapes()[2], p.dtype, seed=seed + 1) if epilogue.residual else None
        return bias, residual

    def _cublas_runner(self, i: int):
        a, b, c = self._sets[i]
        return cublas_runner(self.problem, a, b, c)

    def _served(self) -> list[Any]:
        """cuBLASLt as matmul serves it (cublas_gemm's launcher), bound to each input set; with an
        epilogue, followed by the epilogue's pass from C (the product) into a D of the set's own."""
        if self._served_calls is None:
            problem, calls = self.problem, []
            bare = dataclasses.replace(problem, epilogue=Epilogue())
            for (a, b, c), (bias, residual) in zip(self._sets, self._extras):
                layouts = storage_layouts(problem, a, b, c)
                served = cublas_launcher(bare, *layouts, self.device.compute_capability)
                gemm = functools.partial(served, *(layout.pointer for layout in layouts), 1.0, 0.0)
                calls.append(gemm if self.epilogue.is_identity else
                             then_pass(problem, self.device_ordinal(), gemm, c, bias, residual, self.epilogue))
            self._served_calls = calls
        return self._served_calls

    def device_ordinal(self) -> int:
        return self._cupy.cuda.Device().id

    def _lt(self, epilogue: Epilogue | None = None, rank: int = 0) -> list[Any] | None:
        """cuBLASLt's own epilogue computing `epilogue` (default: the problem's) through its heuristic's algorithm
        of `rank` (0: the first), bound to each input set (epilogue_routes.lt_calls), made once per epilogue and
        rank; None where cuBLASLt cannot compute it, or its heuristic offers no algorithm of that rank."""
        epilogue = self.epilogue if epilogue is None else epilogue
        if (epilogue, rank) not in self._lt_calls:
            self._lt_calls[epilogue, rank] = lt_calls(self.problem, self.device_ordinal(), self._sets, self._extras,
                                                      epilogue, rank)
        return self._lt_calls[epilogue, rank]

    def _lt_bias_then_pass(self) -> list[Any] | None:
        """Eager PyTorch's route for a bias with an activation or a residual (epilogue_routes.bias_then_pass),
        made once; None where the epilogue has no more than a bias, or cuBLASLt cannot add it."""
        if not eager_route_applies(self.epilogue):
            return None
        if self._lt_bias_calls is None:
            bias_only = self._lt(Epilogue(bias="n"))
            if bias_only is None:
                return None
            self._lt_bias_calls = bias_then_pass(self.problem, self.device_ordinal(), bias_only, self._sets,
                                                 self._extras, self.epilogue)
        return self._lt_bias_calls

    def _torch_linear(self, bias_in_pass: bool = False) -> list[Any] | None:
        """The route autogemm serves PyTorch tensors by without a kernel (epilogue_routes.torch_linear_calls):
        the bias where the route's rule puts it (in F.linear but for one token), or in the pass (`bias_in_pass`);
        made once each; None where it does not serve this problem or PyTorch has no CUDA."""
        if bias_in_pass not in self._torch_linear_calls:
            self._torch_linear_calls[bias_in_pass] = torch_linear_calls(
                self.problem, self.device_ordinal(), self._sets, self._extras, False if bias_in_pass else None)
        return self._torch_linear_calls[bias_in_pass]

    def _fallback(self) -> list[Any]:
        """The served fallback's calls: with an epilogue, the route (`baseline_calls`) fastest in GPU time at
        the last timing, cuBLASLt and the pass before any timing; without one, cuBLASLt as served."""
        if self.epilogue.is_identity:
            return self._served()
        routes = self.baseline_calls()
        return routes[min(routes, key=lambda name: self.baselines.get(name, float("inf")))]

    def baseline_calls(self) -> dict[str, Any]:
        """Each baseline's runners (one per input set): cuBLASLt as served and cupy.matmul where CuPy
        computes this type in this form; with an epilogue, the routes matmul serves without a fused kernel
        (SERVED_PASS first; SERVED_LT where cuBLASLt has the epilogue, and its heuristic's runners-up, lt_route(rank)
        for rank 1 to LT_RUNNERS_UP where it offers them, and the GEMM alone's algorithm with the epilogue
        (lt_route(LT_BARE)) where cuBLASLt's check takes it and it is none of those; SERVED_LT_BIAS where it adds
        the bias and a pass the rest; eager_route.ROUTE where PyTorch's F.linear and the pass serve PyTorch tensors, and ROUTE_BIAS_IN_PASS where
        that route could leave the bias to the pass)."""
        served = self._served()
        if not self.epilogue.is_identity:
            routes = {SERVED_PASS: served, SERVED_LT: self._lt()}
            if routes[SERVED_LT] is not None:
                runners_up = {lt_route(rank): self._lt(rank=rank) for rank in range(1, LT_RUNNERS_UP + 1)}
                bare = self._lt(rank=LT_BARE)
                if bare is not None and not any(same_algorithm(bare, calls)
                                                for calls in (routes[SERVED_LT], *runners_up.values()) if calls):
                    runners_up[lt_route(LT_BARE)] = bare
                routes.update(runners_up)
            routes.update({SERVED_LT_BIAS: self._lt_bias_then_pass(), ROUTE: self._torch_linear()})
            if bias_placement_differs(self.epilogue, self.problem.m):
                routes[ROUTE_BIAS_IN_PASS] = self._torch_linear(bias_in_pass=True)
            return {name: calls for name, calls in routes.items() if calls is not None}
        calls = {SERVED: served}
        if self._cupy_computes is None:
            try:
                self._cublas_runner(0)()
                self._cupy_computes = True
            except (TypeError, NotImplementedError):  # CuPy cannot compute this type in this form: no user can
                self._cupy_computes = False
        if self._cupy_computes:
            calls[CUPY] = [self._cublas_runner(i) for i in range(len(self._sets))]
        return calls

    def time_baselines(self, target_ms: float = TARGET_MS) -> dict[str, float]:
        """GPU time (ms a call, timing.gpu_time) of each baseline (`baseline_calls`)."""
        self.baselines = {name: gpu_time(lambda i, runners=runners: runners[i % len(runners)](),
                                         target_ms=target_ms).median_ms
                          for name, runners in self.baseline_calls().items()}
        return self.baselines

    def sustained(self, configs: list[Any]) -> Sustained:
        """Sustained GPU time (timing.sustained_times) of each config and each baseline, taking turns
        in rounds with the GPU never idle, as a training or prefill loop runs them; with the SM clock
        and power seen meanwhile. Each config's runners and each baseline's take the input sets in turn."""
        cupy = self._cupy
        try:
            with unloaded_after():  # (the configs' modules go once timed, as a measured candidate's do)
                competitors: dict[str, list[Any]] = {f"config {i}": self._kernel_runners(config)
                                                     for i, config in enumerate(configs)}
                baselines = self.baseline_calls()
                competitors.update(baselines)
                with ClockMonitor() as monitor:
                    rounds = sustained_times({name: (lambda i, runners=runners: runners[i % len(runners)]())
                                              for name, runners in competitors.items()})
        except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            self._poisoned_by(exc)
            raise
        sustained = Sustained(kernel_rounds=[rounds[f"config {i}"] for i in range(len(configs))],
                              baseline_rounds={name: rounds[name] for name in baselines}, **monitor.figures())
        self.baselines = sustained.baselines
        return sustained

    def time_cublas(self, repeats: int | None = None, target_ms: float = TARGET_MS) -> float:
        """The faster baseline's GPU time, ms a call (`repeats`: unused, the protocol decides)."""
        return min(self.time_baselines(target_ms).values())

    def single_call(self, config: Any, pairs: int = SINGLE_CALL_PAIRS) -> Latency:
        """Evaluator.single_call: the kernel's launcher and the served cuBLASLt, each after
        allocating a fresh output as matmul does. The calls rotate over the input sets, so that
        neither finds its operands still in L2 from the call before (a weight matrix of a decode step
        is not, and 32 MB of FP16 B would be)."""
        cupy = self._cupy
        try:
            with unloaded_after():
                waits = latencies({"kernel": self._as_served(self._kernel_runners(config)),
                                   "baseline": self._as_served(self._fallback())}, rounds=pairs)
        except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            self._poisoned_by(exc)
            raise
        return Latency(statistics.median(waits["kernel"]) * 1e3, statistics.median(waits["baseline"]) * 1e3)

    def fallback_latency_us(self, calls: int = SINGLE_CALL_PAIRS) -> float:
        """The served cuBLAS fallback's single-call latency alone (a record with no generated kernel to
        compare it with), measured as `single_call` measures it."""
        waits = latencies({"baseline": self._as_served(self._fallback())}, rounds=calls)
        return statistics.median(waits["baseline"]) * 1e3

    def _as_served(self, runners: list[Any]):
        """A zero-argument call as matmul serves one: a fresh output allocated, then the launch, the
        launches taking the input sets in turn."""

        cupy, (shape, dtype) = self._cupy, (self._sets[0][2].shape, self._sets[0][2].dtype)
        following = itertools.cycle(runners)

        def call():
            cupy.empty(shape, dtype=dtype)
            next(following)()

        return call

    def _kernel_runners(self, config) -> list[Any]:
        """The candidate bound to each input set (one `run(stream=None)` per set), for timing."""
        problem, epilogue = self.problem, self.epilogue
        if epilogue.is_identity:
            return [launch.bind(config, a, b, c, trans_a=problem.trans_a, trans_b=problem.trans_b)[0]
                    for a, b, c in self._sets]
        return [launch.bind(config, a, b, c, trans_a=problem.trans_a, trans_b=problem.trans_b, epilogue=epilogue,
                            bias=bias, residual=residual)[0]
                for (a, b, c), (bias, residual) in zip(self._sets, self._extras)]

    def _poisoned_by(self, exc: BaseException) -> bool:
        """Whether a CUDA error leaves the context unusable (then remembered in `poisoned`)."""
        if any(name in str(exc) for name in STICKY_CUDA_ERRORS):
            self.poisoned = f"{type(exc).__name__}: {exc}"
            return True
        return False

    def _verify(self, config) -> Verdict:
        """Runs the candidate once on fresh inputs into a NaN-poisoned output and checks every
        element against the float64 reference (norm-wise and element-wise bounds)."""
        seed = int(self._rng.integers(0, 2**31))
        a, b, c = self._operands(seed)
        poison(c)
        problem, epilogue = self.problem, self.epilogue
        if epilogue.is_identity:
            run, _ = launch.bind(config, a, b, c, trans_a=problem.trans_a, trans_b=problem.trans_b)
            run()
            return check_result(c, a, b, problem)
        bias, residual = self._epilogue_inputs(seed + 7)
        run, _ = launch.bind(config, a, b, c, trans_a=problem.trans_a, trans_b=problem.trans_b, epilogue=epilogue,
                             bias=bias, residual=residual)
        run()
        return check_epilogue_result(c, a, b, problem, bias=bias, residual=residual)

    def measure(self, config: Any, best_ms: float | None, repeats: int = 10, final: bool = False) -> Measurement:
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
