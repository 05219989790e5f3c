"""Correctness check of GEMM kernels against a float64 reference, and the pieces timing shares.

Protocol (docs/decisions/timing-protocol.md): random inputs in [-1, 1] (never zeros), output poisoned with
NaN before the correctness run and every element checked. Timing itself (GPU time in steady state,
single-call latency, the same for every competitor) is timing.py's.
"""

from __future__ import annotations

import dataclasses
import math
import time
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import dtypes
from ..epilogue import Epilogue, error_bound
from ..epilogue import reference as epilogue_reference
from ..epilogue import dequantized
from ..epilogue import scales as epilogue_scales
from ..gpu.cublas_baseline import bfloat16_bits_product, cublas_product

# TF32 rounds every operand to 10 mantissa bits, so its error grows like sqrt(K) beyond this K
TF32_TOLERANCE_K = 4096


def tolerance(problem: Any) -> float:
    """The relative error a correct kernel stays under (the dtype row's, at K = 4096): TF32's
    grows with sqrt(K), the others' are met at any K by the kernels' FP32/FP64 accumulation."""
    row = dtypes.lookup(problem.dtype, problem.compute)
    if problem.compute == "tf32":
        return row.tolerance * max(1.0, (problem.k / TF32_TOLERANCE_K) ** 0.5)
    return row.tolerance


def to_bfloat16(x: Any) -> Any:
    """float32/float64 CuPy array -> uint16 array of bfloat16 bits, rounded to nearest even."""
    import cupy  # (lazy: CuPy)

    f = x.astype(np.float32)
    bits = f.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return cupy.where(cupy.isnan(f), np.uint32(0x7FC0), rounded).astype(np.uint16)


def poison(c: Any) -> None:
    """Fills an output with NaN (bfloat16 NaN bits for uint16), so an element a kernel never
    writes fails the check."""
    c.fill(0x7FC0 if c.dtype == np.uint16 else np.nan)


def to_float64(x: Any) -> Any:
    """Values of an operand as float64 (uint16 arrays hold bfloat16 bits)."""
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def random_uniform(shape: Any, dtype: Any = np.float32, seed: int | None = None) -> Any:
    """Uniform in [-1, 1]; dtype "bfloat16" gives uint16 bfloat16 bits."""
    import cupy  # (lazy: CuPy)

    rng = cupy.random.default_rng(seed)
    values = rng.random(shape, dtype=np.float64) * 2 - 1
    if isinstance(dtype, str) and dtype == "bfloat16":
        return to_bfloat16(values)
    return values.astype(dtype)


def _array_module(x):
    """NumPy for NumPy arrays, CuPy otherwise: the checks below run on either (tests use NumPy)."""
    if isinstance(x, np.ndarray):
        return np
    import cupy  # (lazy: CuPy)

    return cupy


def _op(x, trans: bool, xp):
    return xp.swapaxes(x, -1, -2) if trans else x


def reference_gemm(a: Any, b: Any, c: Any = None, *, trans_a: Any = False, trans_b: Any = False, alpha: Any = 1.0, beta: Any = 0.0) -> Any:
    """alpha * op(A) @ op(B) + beta * C in float64 (cuBLAS DGEMM on upcast copies)."""
    xp = _array_module(a)
    out = alpha * xp.matmul(_op(to_float64(a), trans_a, xp), _op(to_float64(b), trans_b, xp))
    if c is not None and beta != 0:
        out = out + beta * to_float64(c)
    return out


def all_finite(values: Any) -> bool:
    """Whether every element of `values` (float64) is finite. Their sum is tried first: any element that
    is not finite makes it so, and CuPy sums float64 with a reduction built ahead, where
    `isfinite(values).all()` is compiled on a machine's first use for each block size (1.3 s each on an
    H200's host, a tenth of a cold verification); a sum that is not finite (such an element, or
    finite ones that overflow) is settled element by element."""
    if math.isfinite(float(values.sum())):
        return True
    return bool(_array_module(values).isfinite(values).all())


def _norm_error(values: Any, reference: Any) -> float:
    """‖values − ref‖ / ‖ref‖, `values` float64 and finite."""
    xp = _array_module(reference)
    norm = float(xp.linalg.norm(reference.ravel()))
    diff = float(xp.linalg.norm((values - reference).ravel()))
    return diff / norm if norm > 0 else diff


def relative_error(result: Any, reference: Any) -> float:
    """‖result − ref‖ / ‖ref‖ over every element; inf when any element is not finite."""
    result = to_float64(result)
    return _norm_error(result, reference) if all_finite(result) else float("inf")


def element_bounds(a: Any, b: Any, c: Any, problem: Any, *, alpha: Any = 1.0, beta: Any = 0.0, reference: Any) -> Any:
    """How far each element of a correct result may be from the float64 reference: the classic
    bound for a dot product of length K, |fl(x·y) − x·y| <= γ_K |x|·|y|, taken elementwise over
    |op(A)|·|op(B)| (so a row of large values gets the room it needs and no element gets more):

        2 [ (2 u_in + K u_acc) |alpha| (|A||B|)_ij + u_acc |beta| |C_ij| + u_out |ref_ij| ] + tiny

    u_in: how far the arithmetic moves an input (TF32), for both operands of a product; K u_acc:
    accumulation in any order; u_out: rounding to the element type. The factor 2 is the margin for
    hardware that truncates instead of rounding, for paths that round twice (through a float
    partial sum) and for the float64 reference's own error. Far looser than a typical error (which
    grows like sqrt(K)), far tighter than what a wrong element is off by (a missing product,
    garbage, a stale value)."""
    xp = _array_module(a)
    row = dtypes.lookup(problem.dtype, problem.compute)
    u_acc = row.accumulator_roundoff
    magnitude = xp.matmul(_op(xp.abs(to_float64(a)), problem.trans_a, xp), _op(xp.abs(to_float64(b)), problem.trans_b, xp))
    bound = (2 * (2 * row.input_roundoff + problem.k * u_acc) * abs(alpha)) * magnitude
    if c is not None and beta != 0:
        bound = bound + (2 * u_acc * abs(beta)) * xp.abs(to_float64(c))
    return bound + (2 * row.element_roundoff) * xp.abs(reference) + row.smallest_normal


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking a result against the float64 reference: norm-wise (`rel_error`
    under the dtype's `limit`) and element-wise (`over` elements outside their bound; `worst`,
    the largest ratio of error to bound, <= 1 for a correct result)."""

    rel_error: float
    limit: float
    over: int
    worst: float
    first: tuple[Any, ...] = ()  # index of the first element outside its bound

    @property
    def ok(self) -> bool:
        return self.rel_error <= self.limit and self.over == 0

    @property
    def message(self) -> str:
        if self.rel_error > self.limit:
            return f"relative error {self.rel_error:.3g} exceeds {self.limit:g}"
        if self.over:
            return (f"{self.over} element(s) outside the error bound (worst {self.worst:.3g}x the bound, "
                    f"first at {self.first}); relative error {self.rel_error:.3g}")
        return f"relative error {self.rel_error:.3g}"


def _verdict(result: Any, expected: Any, bound: Any, limit: float) -> Verdict:
    """`result` against `expected` (float64): every element finite, then norm-wise within `limit` and each
    element within its `bound`; `result` converted to float64 once. The largest ratio of error to bound is
    taken first (a reduction built ahead, as `all_finite`'s sum is) and the elements over it are looked for
    only where it exceeds 1."""
    xp = _array_module(expected)
    values = to_float64(result)
    if not all_finite(values):
        bad = xp.argwhere(~xp.isfinite(values))
        return Verdict(float("inf"), limit, int(bad.shape[0]), float("inf"), tuple(int(i) for i in bad[0]))
    ratio = xp.abs(values - expected) / bound
    worst = float(ratio.max()) if ratio.size else 0.0
    over = xp.argwhere(ratio > 1) if worst > 1 else ()
    first = tuple(int(i) for i in over[0]) if len(over) else ()
    return Verdict(_norm_error(values, expected), limit, len(over), worst, first)


def check_result(result: Any, a: Any, b: Any, problem: Any, *, c: Any = None, alpha: Any = 1.0, beta: Any = 0.0, reference: Any = None) -> Verdict:
    """Checks `result` (= alpha·op(A)·op(B) + beta·C for `problem`; `c`: C as it was before the
    call) both norm-wise and element by element; every element must be finite."""
    if reference is None:
        reference = reference_gemm(a, b, c, trans_a=problem.trans_a, trans_b=problem.trans_b, alpha=alpha, beta=beta)
    bound = element_bounds(a, b, c, problem, alpha=alpha, beta=beta, reference=reference)
    return _verdict(result, reference, bound, tolerance(problem))


def check_epilogue_result(result: Any, a: Any, b: Any, problem: Any, *, bias: Any = None, residual: Any = None, alpha: Any = 1.0, beta: Any = 0.0, c: Any = None,
                          scale_a: Any = None, scale_b: Any = None) -> Verdict:
    """`check_result` of a problem with an epilogue (bias, activation, residual; D in the operands'
    dtype): every element of D finite and within `epilogue.error_bound` of the epilogue's float64
    reference (the product's bound, `element_bounds`, with the bias added and grown by the
    activation's slope, then the activation's evaluation and D's roundings), and D's norm-wise
    error within the dtype's limit. `c`: C as it was before the call (beta · C added). A scaled (FP8)
    problem's A and B are given as their values (`fp8.to_float64`) with `scale_a` and `scale_b` (the
    product's bound grows with the scales, and one more rounding in Acc)."""
    xp = _array_module(a)
    epilogue = problem.epilogue
    if epilogue.scale == "block":  # (the scales are the operands': the product of the dequantized ones)
        a, b = dequantized(to_float64(a), to_float64(b), to_float64(scale_a), to_float64(scale_b), xp)
        problem = dataclasses.replace(problem, epilogue=dataclasses.replace(epilogue, scale="tensor"))
        epilogue, scale_a, scale_b = problem.epilogue, xp.ones(1), xp.ones(1)
    # the product without bias, activation and residual (a scaled problem keeps its scaling: it has no other)
    bare = dataclasses.replace(problem, epilogue=Epilogue(scale=epilogue.scale, out_dtype=epilogue.out_dtype)
                               if epilogue.scale else Epilogue())
    row, out = dtypes.lookup(problem.dtype, problem.compute), dtypes.lookup(epilogue.output_dtype(problem.dtype))
    product = reference_gemm(a, b, trans_a=problem.trans_a, trans_b=problem.trans_b, alpha=alpha)
    scale = 1.0  # (what the product is multiplied by: 1 unless the problem is scaled)
    if epilogue.scale:
        scale_a, scale_b = to_float64(scale_a), to_float64(scale_b)
        scale = epilogue_scales(epilogue, scale_a, scale_b)
    bias64 = to_float64(bias) if bias is not None else None
    residual64 = to_float64(residual) if residual is not None else None
    pre = product * scale
    if bias64 is not None:
        pre = pre + (bias64.reshape(-1) if epilogue.bias == "n" else bias64.reshape(-1, 1))
    # what the activation is given: the product's error (scaled), one rounding of the scaling and one
    # of the bias's sum in Acc
    pre_bound = element_bounds(a, b, None, bare, alpha=alpha, reference=product) * abs(scale) \
        + row.accumulator_roundoff * xp.abs(pre)
    if epilogue.scale:
        pre_bound = pre_bound + row.accumulator_roundoff * xp.abs(product * scale)
    expected = epilogue_reference(product, epilogue, bias=bias64, residual=residual64, beta=beta,
                                  c=to_float64(c) if c is not None else None, xp=xp, scale_a=scale_a, scale_b=scale_b)
    bound = error_bound(pre_bound, epilogue, xp.abs(expected), out.element_roundoff,
                        xp.abs(residual64) + xp.abs(expected) if residual64 is not None else 0.0,
                        pre_activation_magnitude=xp.abs(pre), accumulator_unit_roundoff=row.accumulator_roundoff,
                        out_smallest_normal=out.smallest_normal)
    if c is not None and beta != 0:
        bound = bound + 2 * out.element_roundoff * abs(beta) * xp.abs(to_float64(c))
    # (the norm-wise limit of the products' dtype, or of D's where D is written in a coarser one)
    written = dataclasses.replace(bare, dtype=epilogue.output_dtype(problem.dtype), compute="", epilogue=Epilogue())
    return _verdict(result, expected, bound, max(tolerance(bare), tolerance(written)))


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    repeats: int

    def tflops(self, flops: int) -> float:
        return flops / (self.median_ms * 1e-3) / 1e12


def time_gpu(run: Any, *, warmup: int = 3, repeats: int = 20, inputs: int = 1, stream: Any = None) -> Timing:
    """Median of `repeats` CUDA-event timings of `run(i)`, cycling i over `inputs` buffer sets.

    Each repeat is timed on its own (events around one call) so that the median discards
    outliers such as a clock ramp or another process's burst.
    """
    import cupy  # (lazy: CuPy)

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


def warm_up(run: Any, seconds: float = 0.3) -> None:
    """Keeps the GPU busy for a while so that clocks have ramped up before anything is timed."""

    import cupy  # (lazy: CuPy)

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


def cublas_runner(problem: Any, a: Any, b: Any, c: Any) -> Any:
    """`run()` computing C = op(A) @ op(B) with cuBLAS as a user of CuPy would get it and as
    `matmul` serves it: cupy.matmul (in TF32 mode for compute "tf32"; on bfloat16 views of the
    uint16 bits for bfloat16, or cublasGemmEx where CuPy has no bfloat16)."""
    import cupy  # (lazy: CuPy)

    swap = cupy.swapaxes
    op_a = swap(a, -1, -2) if problem.trans_a else a
    op_b = swap(b, -1, -2) if problem.trans_b else b
    product = bfloat16_bits_product() if problem.dtype == "bfloat16" else cublas_product(problem.dtype, problem.compute)
    return lambda: product(op_a, op_b, out=c)
