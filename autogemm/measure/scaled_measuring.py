"""The measuring side of an FP8 problem's tune (`ScaledMeasurer`; `measurers.measurer_for` picks it).

An FP8 product is measured as `GpuMeasurer` measures the others (the same verification, timing
protocol, single-call latency and failure kinds), with what makes it FP8: operands of random values in
[-2, 2] rounded to the FP8 type (uint8 bits, A M × K and B N × K), FP32 scales in [0.5, 1.5] (two
scalars; M and N values; or one per row of A and 128 of K and one per 128 × 128 block of B), D in the problem's output dtype, a bias where the epilogue adds one; candidates
launched through `gpu.scaled_launch.bind_scaled`, verified against the float64 product of the operands'
values (`check_epilogue_result` with the scales); and one baseline, what `scaled_matmul` serves without
a record: torch._scaled_mm (cuBLASLt's FP8) on the same bits and scales, or for block scales it does not
take (K or N not a multiple of 128) the built-in kernel.
"""

from __future__ import annotations
from typing import Any

import numpy as np

from .. import fp8
from ..gpu.runtime import numpy_dtype
from ..epilogue import BLOCK
from ..families import config_from_name
from ..gpu.scaled_launch import DEFAULT_BLOCK_CONFIG, bind_scaled, torch_scales, torch_takes
from ..problem import Device, Problem
from .bench import Verdict, check_epilogue_result, poison, rotation_count, warm_up
from .measuring import FIRST_BASELINE_MS, GpuMeasurer, import_torch

SCALED_MM = "torch._scaled_mm"  # the baseline's name in records
BUILT_IN = "built-in kernel"  # the baseline of block scales torch._scaled_mm does not take


def baseline_name(problem: Problem) -> str:
    """What an FP8 problem's tune is measured against, the name its record carries: what scaled_matmul
    serves it untuned, torch._scaled_mm, or for block scales torch does not take the built-in kernel."""
    return SCALED_MM if torch_takes(problem.epilogue.scale, problem.k, problem.n) else BUILT_IN


class ScaledMeasurer(GpuMeasurer):
    """GpuMeasurer of an FP8 product (module docstring). Its input sets are (A, B, D) with the scales and
    the bias beside them (`_extras`); its fallback is what scaled_matmul serves untuned (`_served`)."""

    def __init__(self, problem: Problem, device: Device, seed: int = 0):
        self._torch = import_torch(problem, SCALED_MM)
        if problem.layout != "nt" or problem.batch != 1:
            raise ValueError(f"{problem}: FP8 products are tuned in layout NT (A M x K, B N x K) without a batch, "
                             "as scaled_matmul serves them")
        self._attach(problem, device, seed)
        self.out_dtype = self.epilogue.output_dtype(problem.dtype)
        per_set = problem.m * problem.k + problem.n * problem.k + 2 * problem.m * problem.n
        count = rotation_count(per_set, device.l2_bytes)
        self._sets, self._extras = zip(*(self._inputs(seed + 100 * i) for i in range(count)))
        self._served_calls: list[Any] | None = None
        self.baselines: dict[str, float] = {}
        warm_up(self._served()[0])
        self.cublas_ms = self.time_cublas(target_ms=FIRST_BASELINE_MS)

    def _inputs(self, seed: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """((A, B, D), (scale_a, scale_b, bias)) of one input set."""
        cupy, p = self._cupy, self.problem
        rng = cupy.random.default_rng(seed)
        a = fp8.quantize(rng.random((p.m, p.k)) * 4 - 2, p.dtype, cupy)
        b = fp8.quantize(rng.random((p.n, p.k)) * 4 - 2, p.dtype, cupy)
        if self.epilogue.scale == "tensor":
            scale_a, scale_b = (rng.random(1) + 0.5).astype(np.float32), (rng.random(1) + 0.5).astype(np.float32)
        elif self.epilogue.scale == "row":
            scale_a = (rng.random((p.m, 1)) + 0.5).astype(np.float32)
            scale_b = (rng.random((1, p.n)) + 0.5).astype(np.float32)
        else:  # one per row of A and 128 of K, one per 128 x 128 block of B
            blocks_k, blocks_n = -(-p.k // BLOCK), -(-p.n // BLOCK)
            scale_a = (rng.random((p.m, blocks_k)) + 0.5).astype(np.float32)
            scale_b = (rng.random((blocks_k, blocks_n)) + 0.5).astype(np.float32)
        out = numpy_dtype(self.out_dtype)
        bias = (rng.random(p.n) * 2 - 1).astype(out) if self.epilogue.bias else None
        return (a, b, cupy.empty((p.m, p.n), dtype=out)), (scale_a, scale_b, bias)

    def _served(self) -> list[Any]:
        """What scaled_matmul serves a problem without a record, on each input set: torch._scaled_mm (torch's
        default use_fast_accum=False), or for block scales torch does not take, the built-in kernel."""
        if self._served_calls is None and not torch_takes(self.epilogue.scale, self.problem.k, self.problem.n):
            self._served_calls = self._kernel_runners(config_from_name(DEFAULT_BLOCK_CONFIG))
        if self._served_calls is None:
            torch = self._torch
            fp8_type, out = getattr(torch, self.problem.dtype), getattr(torch, self.out_dtype)
            calls = []
            for (a, b, _), (scale_a, scale_b, bias) in zip(self._sets, self._extras):
                ta, tb = torch.from_dlpack(a).view(fp8_type), torch.from_dlpack(b).view(fp8_type).t()
                sa, sb = torch_scales(torch, torch.from_dlpack(scale_a), torch.from_dlpack(scale_b), self.epilogue.scale)
                tbias = torch.from_dlpack(bias) if bias is not None else None
                calls.append(lambda ta=ta, tb=tb, sa=sa, sb=sb, tbias=tbias: torch._scaled_mm(
                    ta, tb, sa, sb, bias=tbias, out_dtype=out))
            self._served_calls = calls
        return self._served_calls

    def _lt(self):
        return None

    def baseline_calls(self) -> dict[str, list[Any]]:
        """torch._scaled_mm (or what serves where torch has none): GpuMeasurer.time_baselines times it."""
        return {baseline_name(self.problem): self._served()}

    def _kernel_runners(self, config) -> list[Any]:
        dtype = self.problem.dtype
        return [bind_scaled(config, a, b, scale_a, scale_b, dtype=dtype, out_dtype=self.out_dtype, bias=bias, out=d)[0]
                for (a, b, d), (scale_a, scale_b, bias) in zip(self._sets, self._extras)]

    def _verify(self, config) -> Verdict:
        """The candidate once on fresh inputs into a NaN-poisoned D, every element checked against the
        float64 product of the operands' values, scaled (and the bias added)."""
        (a, b, d), (scale_a, scale_b, bias) = self._inputs(int(self._rng.integers(0, 2**31)))
        poison(d)
        run, _ = bind_scaled(config, a, b, scale_a, scale_b, dtype=self.problem.dtype, out_dtype=self.out_dtype,
                             bias=bias, out=d)
        run()
        cupy, dtype = self._cupy, self.problem.dtype
        return check_epilogue_result(d, fp8.to_float64(a, dtype, cupy), fp8.to_float64(b, dtype, cupy), self.problem,
                                     bias=bias, scale_a=scale_a, scale_b=scale_b)

