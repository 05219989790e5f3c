"""What the benchmarks share: operands of a problem as a user holds them, labels, geomeans, where
results go."""

from __future__ import annotations

import math
from pathlib import Path

HERE = Path(__file__).resolve().parent


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def percentile(values, fraction: float) -> float:
    """The `fraction` quantile (linear interpolation), e.g. 0.05 for the 5th percentile."""
    values = sorted(values)
    if not values:
        return float("nan")
    position = fraction * (len(values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def results_path(stem: str) -> Path:
    """benchmarks/results/<stem> (the caller adds .md or .json)."""
    out = HERE / "results" / stem
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def problem_label(problem) -> str:
    batch = f"{problem.batch}x" if problem.batch > 1 else ""
    compute = "tf32" if problem.compute == "tf32" else problem.dtype
    return f"{compute} {problem.layout} {batch}{problem.m}x{problem.n}x{problem.k}"


def make_operands(spec, seed: int = 0):
    """(problem, a, b) for spec (dtype, compute, layout, batch, M, N, K): CuPy arrays of values in
    [-1, 1] as a user holds them (a transposed operand is a transposed view of a row-major array;
    bfloat16 as ml_dtypes' type)."""
    import cupy

    from autogemm.measure.bench import random_uniform
    from autogemm.problem import Problem

    dtype, compute, layout, batch, m, n, k = spec
    problem = Problem.from_layout(m, n, k, layout, batch=batch, dtype=dtype, compute=compute)
    lead = (batch,) if batch > 1 else ()
    a = random_uniform(lead + ((k, m) if problem.trans_a else (m, k)), dtype, seed=seed)
    b = random_uniform(lead + ((n, k) if problem.trans_b else (k, n)), dtype, seed=seed + 1)
    if dtype == "bfloat16":
        import ml_dtypes

        a, b = a.view(ml_dtypes.bfloat16), b.view(ml_dtypes.bfloat16)
    if problem.trans_a:
        a = cupy.swapaxes(a, -1, -2)
    if problem.trans_b:
        b = cupy.swapaxes(b, -1, -2)
    return problem, a, b
