"""The measuring side of a grouped problem's tune (`GroupedMeasurer`): a mixture-of-experts layer's E
products, one launch of the Hopper family's grouped kernel against what a PyTorch user calls instead.

A grouped problem (`Problem.grouped`) is measured as `GpuMeasurer` measures the others (the same
verification, timing protocol, single-call latency and failure kinds), with what makes it grouped:
- its rows fall to the groups as its routing bucket says (`routing.offsets_for`: the same offsets in
  every input set and every run), the offsets on the GPU as int32;
- A is (M, K) random in [-1, 1], B (E, K, N) N-contiguous (layout NN) or the transpose of a contiguous
  (E, N, K) weight (NT), C (M, N); candidates launched through `gpu.grouped_launch.bind_grouped`;
- each group's rows are verified against the float64 product of its rows of A and its matrix of B
  (`check_result` group by group, C poisoned with NaN first);
- two baselines, what the user would call instead: torch._grouped_mm (one launch, the offsets on the GPU)
  and a loop of torch.matmul over the groups (the offsets known on the host: a user's loop reads them
  once; its host sync is not charged to it). The faster is the fallback a kernel must beat.
"""

from __future__ import annotations
from typing import Any

from ..gpu.grouped_launch import GROUPED_DTYPES, bind_grouped
from ..problem import Device, Problem
from ..routing import offsets_for
from .bench import Verdict, check_result, poison, random_uniform, rotation_count, warm_up
from .measuring import FIRST_BASELINE_MS, GpuMeasurer, import_torch
from .timing import TARGET_MS, gpu_time

TORCH_GROUPED = "torch._grouped_mm"
LOOP = "loop of torch.matmul"


def require_groupable(problem: Problem) -> None:
    """ValueError where a grouped problem is not one this measurer tunes: FP16 or BF16, A stored M x K
    (layout NN or NT), no epilogue, as grouped_matmul serves them."""
    if problem.dtype not in GROUPED_DTYPES or problem.trans_a or not problem.epilogue.is_identity:
        raise ValueError(f"{problem}: grouped products are tuned in {' or '.join(GROUPED_DTYPES)}, A stored M x K "
                         "(layout NN or NT), without an epilogue, as grouped_matmul serves them")


class GroupedMeasurer(GpuMeasurer):
    """GpuMeasurer of a grouped product (module docstring). Its input sets are (A, B, C) as CuPy arrays
    (bfloat16 as uint16 bits), with torch views of them for the baselines."""

    def __init__(self, problem: Problem, device: Device, seed: int = 0):
        self._torch = import_torch(problem, f"{TORCH_GROUPED} and a {LOOP}")
        require_groupable(problem)
        self._attach(problem, device, seed)
        cupy = self._cupy
        self.ends = offsets_for(problem.batch, problem.m, problem.routing)
        self.offsets = cupy.asarray(self.ends, dtype=cupy.int32)
        p = problem
        per_set = 2 * (p.m * p.k + p.batch * p.k * p.n + p.m * p.n)
        self._sets = [self._operands(seed + 100 * i) for i in range(rotation_count(per_set, device.l2_bytes))]
        self._baseline_calls: dict[str, list[Any]] | None = None
        self.baselines: dict[str, float] = {}
        warm_up(self._served()[0])
        self.cublas_ms = self.time_cublas(target_ms=FIRST_BASELINE_MS)

    def _shapes(self):
        p = self.problem
        return (p.m, p.k), ((p.batch, p.n, p.k) if p.trans_b else (p.batch, p.k, p.n)), (p.m, p.n)

    def _operands(self, seed: int):
        a_shape, b_shape, c_shape = self._shapes()
        a = random_uniform(a_shape, self.problem.dtype, seed=seed)
        b = random_uniform(b_shape, self.problem.dtype, seed=seed + 1)
        return a, b, self._cupy.empty(c_shape, dtype=a.dtype)

    def _tensor(self, x):
        """A torch view of an operand's CuPy array (bfloat16 bits as torch.bfloat16)."""
        torch = self._torch
        if self.problem.dtype == "bfloat16":
            return torch.from_dlpack(x.view(self._cupy.int16)).view(torch.bfloat16)
        return torch.from_dlpack(x)

    def _baselines(self) -> dict[str, list[Any]]:
        """Each baseline's calls, one per input set: torch._grouped_mm where this torch has it and takes
        the problem, and the loop of torch.matmul."""
        if self._baseline_calls is None:
            torch, ends = self._torch, self.ends
            grouped_mm = getattr(torch, "_grouped_mm", None)
            # (the offsets are int32, not the operands' type: _tensor would read them as bfloat16 bits)
            ends_on_gpu = torch.from_dlpack(self.offsets)[1:].contiguous()
            calls: dict[str, list[Any]] = {LOOP: []}
            for a, b, c in self._sets:
                ta, tb, tc = self._tensor(a), self._tensor(b), self._tensor(c)
                if self.problem.trans_b:
                    tb = tb.transpose(1, 2)  # (the (E, N, K) weights read as (E, K, N))

                def loop(ta=ta, tb=tb, tc=tc):
                    for e in range(len(ends) - 1):
                        if ends[e + 1] > ends[e]:
                            torch.matmul(ta[ends[e]:ends[e + 1]], tb[e], out=tc[ends[e]:ends[e + 1]])

                calls[LOOP].append(loop)
                if grouped_mm is not None:
                    calls.setdefault(TORCH_GROUPED, []).append(
                        lambda ta=ta, tb=tb: grouped_mm(ta, tb, offs=ends_on_gpu))
            if TORCH_GROUPED in calls:
                try:
                    calls[TORCH_GROUPED][0]()
                    torch.cuda.synchronize()
                except (RuntimeError, TypeError, ValueError, NotImplementedError):
                    del calls[TORCH_GROUPED]  # (not torch's for this dtype, layout or GPU: the loop is what is left)
            self._baseline_calls = calls
        return self._baseline_calls

    def _served(self) -> list[Any]:
        """The faster baseline at the last timing (before any: torch._grouped_mm where it takes the
        problem, else the loop)."""
        calls = self._baselines()
        if self.baselines:
            return calls[min(self.baselines, key=self.baselines.get)]
        return calls.get(TORCH_GROUPED, calls[LOOP])

    def baseline_calls(self) -> dict[str, list[Any]]:
        return self._baselines()

    def time_baselines(self, target_ms: float = TARGET_MS) -> dict[str, float]:
        """GPU time of each baseline; the loop's calls launch a product per non-empty group, which the
        gated batches must know (timing.launch_limits)."""
        groups = sum(1 for start, end in zip(self.ends, self.ends[1:]) if end > start)
        self.baselines = {name: gpu_time(lambda i, calls=calls: calls[i % len(calls)](), target_ms=target_ms,
                                         launches_per_call=groups if name == LOOP else 1).median_ms
                          for name, calls in self._baselines().items()}
        return self.baselines

    def _kernel_runners(self, config) -> list[Any]:
        return [bind_grouped(config, self.problem, a.data.ptr, b.data.ptr, self.offsets.data.ptr, c.data.ptr)
                for a, b, c in self._sets]

    def _verify(self, config) -> Verdict:
        """The candidate once on fresh inputs into a NaN-poisoned C, each group's rows checked against the
        float64 product of its rows of A and its matrix of B (the first group that fails is the verdict,
        else the one of the largest relative error)."""
        p = self.problem
        a, b, c = self._operands(int(self._rng.integers(0, 2**31)))
        poison(c)
        bind_grouped(config, p, a.data.ptr, b.data.ptr, self.offsets.data.ptr, c.data.ptr)()
        worst = None
        for e, (start, end) in enumerate(zip(self.ends, self.ends[1:])):
            if end == start:
                continue
            part = Problem(end - start, p.n, p.k, dtype=p.dtype, compute=p.compute, trans_b=p.trans_b)
            verdict = check_result(c[start:end], a[start:end], b[e], part)
            if not verdict.ok:
                return Verdict(verdict.rel_error, verdict.limit, verdict.over, verdict.worst,
                               (start + verdict.first[0], verdict.first[1]) if verdict.first else ())
            if worst is None or verdict.rel_error > worst.rel_error:
                worst = verdict
        return worst if worst is not None else Verdict(0.0, 1.0, 0, 0.0)
