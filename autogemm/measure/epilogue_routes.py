"""The routes that serve a problem with an epilogue when no fused kernel does, bound to a measurer's input
sets (measuring.GpuMeasurer keeps them): a GEMM followed by the epilogue's pass (gpu/epilogue_pass.py),
cuBLASLt's own epilogue where it has one (gpu/cublas_epilogue.py), eager PyTorch's route for a bias
with more after it: cuBLASLt's BIAS epilogue, then the rest as a pass (`F.gelu(F.linear(x, w, b))`), and
the route autogemm serves PyTorch tensors by: PyTorch's own F.linear call, then the pass (gpu/eager_route.py).
A fused kernel is kept only where it beats each of them."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from .. import dtypes
from ..epilogue import Epilogue
from ..gpu.cublas_epilogue import cublas_epilogue_launcher, lt_epilogue
from ..gpu.cublas_gemm import alignment_of
from ..gpu.eager_route import bias_in_linear, eager_computes, pass_epilogue, pass_follows
from ..gpu.epilogue_pass import pass_kernel, vector_width
from ..gpu.operands import describe
from ..problem import Problem


def storage_layouts(problem: Problem, a: Any, b: Any, c: Any) -> list[Any]:
    """The kernel operands (gpu/operands.py) of one input set: A and B in the problem's layouts, C row-major."""
    return [describe(x, name, bfloat16_bits=True).storage(trans) for x, name, trans in
            ((a, "a", problem.trans_a), (b, "b", problem.trans_b), (c, "c", False))]


def then_pass(problem: Problem, device_ordinal: int, gemm: Any, product: Any, bias: Any, residual: Any,
              epilogue: Epilogue) -> Any:
    """`gemm()` followed by `epilogue`'s pass (packed once) from `product` into a D of its own (`bias`
    None where `epilogue` adds none)."""
    import cupy  # (lazy: CuPy)

    d = cupy.empty_like(product)
    m, n = problem.m, problem.n
    ldr, stride_r = (n, m * n) if residual is not None else (0, 0)
    vector = vector_width(problem.dtype, epilogue, n, (n, m * n, ldr, stride_r),
                          [(x.data.ptr, x.dtype.itemsize) for x in (product, d, bias, residual) if x is not None])
    pointed = pass_kernel(problem.dtype, epilogue, device_ordinal, problem.batch, m, n, n, m * n, ldr, stride_r,
                          vector)
    addresses = [0 if x is None else x.data.ptr for x in (product, d, bias, residual)]

    def run():
        gemm()
        pointed.launch(cupy.cuda.get_current_stream().ptr, *addresses)

    run.output = d  # (kept alive with the call)
    return run


def lt_calls(problem: Problem, device_ordinal: int, sets: Any, extras: Any, epilogue: Epilogue,
             rank: int = 0) -> list[Any] | None:
    """cuBLASLt's own epilogue computing `epilogue` in the GEMM, one call per input set (`sets` of (a, b, c),
    `extras` of (bias, residual)), D written to the set's C, through its heuristic's algorithm of `rank` (0: the
    first; LT_BARE: the GEMM alone's), which each call carries (`algorithm`, a heuristic result: same_algorithm);
    None where cuBLASLt has no epilogue that computes it, none for batches, or no such algorithm."""
    import cupy  # (lazy: CuPy)

    name = lt_epilogue(epilogue, problem.dtype) if not epilogue.is_identity else None
    if name is None or problem.batch > 1:
        return None
    calls, bare = [], dataclasses.replace(problem, epilogue=Epilogue())
    for (a, b, c), (bias, residual) in zip(sets, extras):
        bias = bias if epilogue.bias else None
        residual = residual if epilogue.residual else None
        layout_a, layout_b, layout_c = storage_layouts(problem, a, b, c)
        residual_layout = describe(residual, "residual", bfloat16_bits=True).storage(False) \
            if residual is not None else None
        pointers = [x for x in (layout_a.pointer, layout_b.pointer, layout_c.pointer) if x] + \
            [x.data.ptr for x in (bias, residual) if x is not None]
        launch = cublas_epilogue_launcher(bare, layout_a, layout_b, layout_c, name, residual_layout,
                                          bias.data.ptr if bias is not None else 0,
                                          min(alignment_of(p) for p in pointers), device_ordinal, rank=rank)
        if launch is None:
            return None
        call = functools.partial(
            lambda launch, pa, pb, pc, pbias, presidual: launch(
                pa, pb, pc, 1.0, cupy.cuda.get_current_stream().ptr, pbias, presidual),
            launch, layout_a.pointer, layout_b.pointer, layout_c.pointer,
            bias.data.ptr if bias is not None else 0, residual.data.ptr if residual is not None else 0)
        call.algorithm = launch.algorithm
        calls.append(call)
    return calls


def same_algorithm(calls: list[Any], others: list[Any]) -> bool:
    """Whether two of lt_calls' routes run the same cuBLASLt algorithm (their first input set's: the sets share
    their layouts), as the GEMM alone's does where it is also the heuristic's first for the epilogue: timing it
    twice would measure one kernel under two names."""
    return calls[0].algorithm["algo"].tobytes() == others[0].algorithm["algo"].tobytes()


def torch_linear_calls(problem: Problem, device_ordinal: int, sets: Any, extras: Any,
                       in_linear: bool | None = None) -> list[Any] | None:
    """The route autogemm serves a layer by on PyTorch tensors where nothing generated does (gpu/eager_route.py:
    eager's GEMM call, `F.linear(x, weight, bias)`, then the rest of the epilogue as the pass over its output
    in place), one call per input set (`sets` of (a, b, c), `extras` of (bias, residual)), on views of the
    sets' memory; None where that route does not serve the problem (eager_computes: 16-bit, no batch, an
    epilogue cuBLASLt does not fuse past the bias) or PyTorch has no CUDA. Each call allocates its output from
    PyTorch's pool, as F.linear does for a user. `in_linear`: whether F.linear adds the bias (None: the route's
    rule, eager_route.bias_in_linear; False: the pass adds it)."""
    from .baselines import as_torch, torch_available  # (lazy: PyTorch)

    epilogue = problem.epilogue
    if problem.batch > 1 or epilogue.is_identity \
            or not eager_computes(epilogue, problem.dtype, 2, 1 if epilogue.bias else None) or not torch_available():
        return None
    import torch.nn.functional as F  # (lazy: PyTorch)

    if in_linear is None:
        in_linear = bias_in_linear(epilogue, problem.m)
    computed = pass_epilogue(epilogue, problem.m, in_linear)
    m, n = problem.m, problem.n
    pointed = None
    if pass_follows(epilogue):
        ldr, stride_r = (n, m * n) if epilogue.residual else (0, 0)
        # (F.linear's output starts a block of PyTorch's, 512-byte aligned: the widest packs that N and every
        # set's bias and residual allow)
        addresses = [(512, dtypes.lookup(problem.dtype).itemsize)] + [
            (x.data.ptr, x.dtype.itemsize) for bias, residual in extras
            for x in (None if in_linear else bias, residual) if x is not None]
        vector = vector_width(problem.dtype, computed, n, (n, m * n, ldr, stride_r), addresses)
        pointed = pass_kernel(problem.dtype, computed, device_ordinal, 1, m, n, n, m * n, ldr, stride_r, vector)
    stream = torch_stream()
    calls = []
    for (a, b, _), (bias, residual) in zip(sets, extras):
        ta, tb = as_torch(a), as_torch(b)
        x = ta.mT if problem.trans_a else ta
        weight = tb if problem.trans_b else tb.mT  # (N × K, as torch.nn.Linear holds it)
        tbias = as_torch(bias) if bias is not None else None
        gemm_bias = tbias if in_linear or pointed is None else None
        pass_bias = 0 if in_linear or bias is None else bias.data.ptr
        pass_residual = 0 if residual is None else residual.data.ptr

        def call(x=x, weight=weight, gemm_bias=gemm_bias, pass_bias=pass_bias, pass_residual=pass_residual):
            y = F.linear(x, weight, gemm_bias)
            if pointed is not None:
                address = y.data_ptr()
                pointed.launch(stream, address, address, pass_bias, pass_residual)
            return y

        calls.append(call)
    return calls


def torch_stream() -> int:
    """PyTorch's current stream's handle, where the route's pass runs after its F.linear; RuntimeError where it
    is not CuPy's current stream, on which the timings record their events (both libraries' default stream
    unless a caller chose another: then the route's time would not be what the events see)."""
    import cupy  # (lazy: CuPy)
    import torch  # (lazy: PyTorch)

    handle, timed = torch.cuda.current_stream().cuda_stream, cupy.cuda.get_current_stream().ptr
    if handle != timed:
        raise RuntimeError(f"PyTorch's current stream ({handle:#x}) is not CuPy's ({timed:#x}): the F.linear route "
                           "would run apart from the events that time it")
    return handle


def eager_route_applies(epilogue: Epilogue) -> bool:
    """Whether eager PyTorch's route (a bias inside cuBLASLt's GEMM, the rest as a pass) differs from the
    others for `epilogue`: a bias along N with an activation or a residual after it."""
    return epilogue.bias == "n" and bool(epilogue.activation or epilogue.residual)


def bias_then_pass(problem: Problem, device_ordinal: int, bias_calls: list[Any], sets: Any, extras: Any,
                   epilogue: Epilogue) -> list[Any]:
    """Eager PyTorch's route, one call per input set: `bias_calls` (cuBLASLt's BIAS epilogue into the set's
    C, from `lt_calls`), then the rest of `epilogue` as a pass into a D of its own."""
    rest = dataclasses.replace(epilogue, bias="")
    return [then_pass(problem, device_ordinal, gemm, c, None, residual, rest)
            for gemm, (_, _, c), (_, residual) in zip(bias_calls, sets, extras)]
