"""Correctness check and timing of GEMM kernels against a float64 / cuBLAS reference.

Protocol (see DESIGN.md, Measuring): random inputs in [-1, 1] (never zeros), output poisoned with
NaN before the correctness run and every element checked; then warm-up and the median of repeated
CUDA-event timings, rotating input buffers when they fit in L2 so that the cache is not measured.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

TOLERANCE = {"fp32": 1e-5}


def random_uniform(shape, dtype=np.float32, seed: int | None = None):
    import cupy

    rng = cupy.random.default_rng(seed)
    return (rng.random(shape, dtype=np.float64) * 2 - 1).astype(dtype)


def reference_gemm(a, b, c=None, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    """alpha * op(A) @ op(B) + beta * C in float64 (cuBLAS DGEMM on upcast copies)."""
    import cupy

    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    a64 = cupy.swapaxes(a64, -1, -2) if trans_a else a64
    b64 = cupy.swapaxes(b64, -1, -2) if trans_b else b64
    out = alpha * cupy.matmul(a64, b64)
    if c is not None and beta != 0:
        out = out + beta * c.astype(np.float64)
    return out


def relative_error(result, reference) -> float:
    """‖result − ref‖ / ‖ref‖ over every element; inf when any element is not finite."""
    import cupy

    result = result.astype(np.float64)
    if not bool(cupy.isfinite(result).all()):
        return float("inf")
    norm = float(cupy.linalg.norm(reference.ravel()))
    diff = float(cupy.linalg.norm((result - reference).ravel()))
    return diff / norm if norm > 0 else diff


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    repeats: int

    def tflops(self, flops: int) -> float:
        return flops / (self.median_ms * 1e-3) / 1e12


def time_gpu(run, *, warmup: int = 3, repeats: int = 20, inputs: int = 1, stream=None) -> Timing:
    """Median of `repeats` CUDA-event timings of `run(i)`, cycling i over `inputs` buffer sets.

    Each repeat is timed on its own (events around one call) so that the median discards
    outliers such as a clock ramp or another process's burst.
    """
    import cupy

    stream = stream or cupy.cuda.get_current_stream()
    for i in range(warmup):
        run(i % inputs)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for i in range(repeats):
        start.record(stream)
        run(i % inputs)
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return Timing(statistics.median(times), min(times), repeats)


def time_calls(runners, repeats: int, best_ms: float | None = None, *, min_batch: int = 1,
               sample_ms: float = 0.5) -> float:
    """Median milliseconds per call of zero-argument launchers, cycling through `runners` (one per
    rotated input set). Each timed sample is a batch of back-to-back calls lasting >= `sample_ms`
    (and at least `min_batch` calls), so that launch overhead and idle gaps are not what gets
    measured. A candidate more than 3x slower than `best_ms` gets 3 samples only."""
    first = time_gpu(lambda i: runners[i % len(runners)](), warmup=1, repeats=1, inputs=len(runners))
    per_call = max(first.median_ms, 1e-3)
    if best_ms is not None and per_call > 3 * best_ms:
        repeats = min(repeats, 3)
    batch = max(min_batch, math.ceil(sample_ms / per_call))

    def run(i):
        for j in range(batch):
            runners[(i * batch + j) % len(runners)]()

    return time_gpu(run, warmup=1, repeats=repeats, inputs=len(runners)).median_ms / batch


def warm_up(run, seconds: float = 0.3) -> None:
    """Keeps the GPU busy for a while so that clocks have ramped up before anything is timed."""
    import time

    import cupy

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(4):
            run()
        cupy.cuda.get_current_stream().synchronize()


def rotation_count(bytes_per_set: int, l2_bytes: int) -> int:
    """How many input sets to cycle so that one call's inputs are not still in L2 from the last."""
    if l2_bytes <= 0 or bytes_per_set >= 2 * l2_bytes:
        return 1
    return min(8, -(-3 * l2_bytes // max(bytes_per_set, 1)))
