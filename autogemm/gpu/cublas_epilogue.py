"""cuBLASLt's own epilogues: where cuBLASLt computes one of autogemm's epilogues inside the GEMM, a
product served by cuBLAS needs no elementwise pass after it (serving/epilogue_step.py says when).

cuBLASLt computes D = act(alpha·op(A)·op(B) + beta·C + bias), the bias along the result's N (the rows
of the column-major Dᵀ it writes), the activation ReLU or GELU in its tanh form, or none. autogemm adds
its residual after the activation, cuBLASLt adds C before it: the residual is C (beta = 1) only where
no activation follows. There is no SiLU, no erf GELU and no gate; D has the products' dtype. What it
saves is the pass: one more read and write of D, and a launch.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .. import dtypes
from ..epilogue import Epilogue
from ..problem import Problem
from .cublas_gemm import WORKSPACE_BYTES, LtPlan, alignment_of, bindings, device_state, scalar_type
from .operands import KernelOperand

# A tune of a layer whose epilogue cuBLASLt computes times its heuristic's first algorithm and this many runners-up,
# each a route of its own among the tune's baselines (lt_route): the heuristic picks the BIAS epilogue's kernel apart
# from the bare GEMM's (gpu/eager_route.py), and its pick ran 2-5.5% slower than the bare GEMM's on 8 of 25 bias +
# GELU/SiLU layers of three unseen draws on an H200. Four: of the heuristic's first six, timed sustained with the
# epilogue (H200, 12 rounds), a runner-up beat its first on 4 of 7 bias and residual layers by 1-4%, #2, #3 and
# twice #5 (FP16 bias 1536 x 7168 x 5120: 176.5 us against 184.3, eager 182.1)
LT_RUNNERS_UP = 4
# The rank that names the algorithm the heuristic picks for the GEMM alone, run with the epilogue where cuBLASLt's
# check takes it (LtPlan.checked): the same tunes time it as one more route, the ceiling's kernel with the epilogue
LT_BARE = -1
LT_ROUTE = "cublaslt epilogue"  # the route's name among a tune's baselines (Record.baselines): the heuristic's first
# (autogemm's activation, whether a bias is added) -> cuBLASLt's epilogue
LT_EPILOGUES = {("", False): "DEFAULT", ("", True): "BIAS", ("relu", False): "RELU", ("relu", True): "RELU_BIAS",
                ("gelu_tanh", False): "GELU", ("gelu_tanh", True): "GELU_BIAS"}
# products whose bias cuBLASLt reads in D's type (autogemm's bias has D's type)
LT_DTYPES = ("float16", "bfloat16", "float32")
# alpha, then beta = 1 (a residual read as C) or 0, in host memory for the life of the process
_SCALARS = {(np.float32, True): np.array([1, 1], dtype=np.float32), (np.float32, False): np.array([1, 0], dtype=np.float32)}


def lt_epilogue(epilogue: Epilogue, dtype: str) -> str | None:
    """The name of cuBLASLt's epilogue (nvmath.bindings.cublasLt.Epilogue) that computes `epilogue`
    on `dtype` products within the GEMM, the residual read as C; None where none does."""
    if epilogue.gated or epilogue.bias == "m" or dtype not in LT_DTYPES or epilogue.output_dtype(dtype) != dtype:
        return None
    if epilogue.residual and epilogue.activation:  # (cuBLASLt would add it before the activation)
        return None
    name = LT_EPILOGUES.get((epilogue.activation, bool(epilogue.bias)))
    return None if name == "DEFAULT" and not epilogue.residual else name


def lt_route(rank: int) -> str:
    """The name among a tune's baselines of cuBLASLt's epilogue through its heuristic's algorithm of `rank` (0: the
    first, LT_ROUTE; LT_BARE: the GEMM alone's)."""
    if rank == LT_BARE:
        return f"{LT_ROUTE} (bare GEMM's algorithm)"
    return LT_ROUTE if rank == 0 else f"{LT_ROUTE} #{rank + 1}"


def lt_rank_name(rank: int) -> str:
    """How explain names the algorithm of `rank` after the epilogue's name: '#3', or '(bare GEMM's algorithm)'."""
    return "(bare GEMM's algorithm)" if rank == LT_BARE else f"#{rank + 1}"


def measured_lt_rank(baselines: dict, noise: float, rivals: tuple[str, ...] = ()) -> int:
    """The rank of the heuristic's algorithm that serves a layer through cuBLASLt's epilogue, by its tune's
    baselines (ms of each route, Record.baselines): a runner-up that ran faster than the heuristic's first and
    than each route named in `rivals` that the tune timed (those that would serve the layer otherwise), by more
    than `noise` (a share); else 0, the heuristic's first (also where the tune timed no runner-up). The GEMM alone's
    algorithm (LT_BARE) competes as a runner-up does."""
    timed = {rank: baselines.get(lt_route(rank)) for rank in (*range(LT_RUNNERS_UP + 1), LT_BARE)}
    timed = {rank: ms for rank, ms in timed.items() if ms}
    if 0 not in timed:
        return 0
    rank = min(timed, key=timed.__getitem__)
    beaten = [timed[0]] + [baselines[name] for name in rivals if baselines.get(name)]
    return rank if rank and all(timed[rank] * (1 + noise) < ms for ms in beaten) else 0


def cublas_epilogue_launcher(problem: Problem, a: KernelOperand, b: KernelOperand, d: KernelOperand, name: str,
                             residual: KernelOperand | None, bias_pointer: int, alignment: int, ordinal: int,
                             rank: int = 0) -> Any:
    """`launch(pa, pb, pd, alpha, stream, pbias, presidual)` (stream: a CUDA stream's handle): D =
    epilogue `name` of alpha·op(A)·op(B) with the bias at `pbias`, + the residual at `presidual` as C
    where `residual` gives its layout, through cuBLASLt on GPU `ordinal`, for operands of these
    layouts whose every address is a multiple of `alignment` bytes (the caller checks each call's).
    None where cuBLASLt has no algorithm for it. `bias_pointer`: a bias's address for the heuristic.
    `rank`: which of the heuristic's algorithms, best first (0: its choice; a benchmark times the
    runners-up beside it); None where it offers fewer. LT_BARE: the algorithm the heuristic picks for the
    product without the epilogue (D written, no C read), where cuBLASLt's check says it computes this one
    (LtPlan.checked); None where it does not."""
    if rank < LT_BARE:
        raise ValueError(f"a rank of cuBLASLt's heuristic is 0 or more, or LT_BARE ({LT_BARE}), not {rank}")
    lt, _ = bindings()
    state = device_state(ordinal)
    plan = LtPlan(problem, a, b, residual if residual is not None else d, state, name, d=d, bias_pointer=bias_pointer)
    itemsize = dtypes.lookup(problem.dtype).itemsize
    layouts = [x for x in (a, b, d, residual) if x is not None]
    pitch_alignment = min(alignment_of(x * itemsize) for layout in layouts for x in (layout.ld, layout.batch_stride or 256))
    aligned = min(256, alignment, pitch_alignment)
    bare_plan = None
    if rank == LT_BARE:
        bare_plan = LtPlan(problem, a, b, d, state)
        bare = bare_plan.algorithm(aligned)
        found = None if bare is None else plan.checked(bare)
    elif rank:
        ranked = plan.ranked(aligned, rank + 1)
        found = ranked[rank] if len(ranked) > rank else None
    else:
        found = plan.algorithm(aligned)
    if found is None:
        return None
    algorithm = found.ctypes.data
    scalar = scalar_type(problem)
    with_c = residual is not None
    fixed = _SCALARS.get((scalar, with_c))
    fixed = fixed if fixed is not None else np.array([1, 1 if with_c else 0], dtype=scalar)
    step = np.dtype(scalar).itemsize
    matmul, handle, workspace, desc = lt.matmul, state.lt, state.workspace, plan.desc
    a_desc, b_desc, c_desc, d_desc = plan.a_desc, plan.b_desc, plan.c_desc, plan.d_desc
    set_bias = lt.matmul_desc_set_attribute
    bias_attribute = lt.MatmulDescAttribute.BIAS_POINTER
    lock = threading.Lock()  # (the bias's address lives in the descriptor: one call sets and uses it at a time)
    current = np.array([bias_pointer], dtype=np.uint64)

    fixed_pointer = fixed.ctypes.data  # (NumPy's ctypes attribute costs a microsecond a call: taken once)

    def launch(pa, pb, pd, alpha, stream, pbias=0, presidual=0):
        if alpha == 1:
            pointer = fixed_pointer
        else:
            scalars = np.array([alpha, 1 if with_c else 0], dtype=scalar)
            pointer = scalars.ctypes.data  # (scalars lives to the end of the call, which reads it on the host)
        with lock:
            if pbias and pbias != current[0]:
                current[0] = pbias
                set_bias(desc, bias_attribute, current.ctypes.data, 8)
            matmul(handle, desc, pointer, pb, a_desc, pa, b_desc, pointer + step, presidual if with_c else pd, c_desc,
                   pd, d_desc, algorithm, workspace(stream), WORKSPACE_BYTES, stream)

    launch.plan, launch.algorithm, launch.bare_plan = plan, found, bare_plan  # (kept alive with the launcher)
    return launch


def prepared_bias_launcher(problem: Problem, a: KernelOperand, b: KernelOperand, d: KernelOperand, bias_pointer: int,
                           alignment: int, ordinal: int, workspace_bytes: int) -> Any:
    """`launch(pa, pb, pd, stream, pbias)`: D = op(A)·op(B) + bias through cuBLASLt's BIAS epilogue, its
    descriptors and algorithm made once for operands of these layouts, every address a multiple of
    `alignment` bytes, with a workspace of `workspace_bytes` (the heuristic picks by it: PyTorch's size picks
    PyTorch's kernel). For a caller that has checked each call's addresses, that the current device is
    `ordinal` and that `stream` (a CUDA stream's handle) is not capturing a graph, and holds a lock around
    the call (the bias's address is set in the descriptor). None where cuBLASLt has no algorithm for it."""
    if workspace_bytes > WORKSPACE_BYTES:
        raise ValueError(f"a workspace of {workspace_bytes} bytes exceeds the {WORKSPACE_BYTES} autogemm allocates")
    lt, _ = bindings()
    state = device_state(ordinal)
    plan = LtPlan(problem, a, b, d, state, "BIAS", bias_pointer=bias_pointer, workspace_bytes=workspace_bytes)
    found = plan.algorithm(min(256, alignment))
    if found is None:
        return None
    algorithm = found.ctypes.data
    scalar = scalar_type(problem)
    scalars = _SCALARS.get((scalar, False))
    scalars = scalars if scalars is not None else np.array([1, 0], dtype=scalar)  # alpha 1, beta 0
    alpha_pointer, beta_pointer = scalars.ctypes.data, scalars.ctypes.data + scalars.itemsize
    matmul, handle, workspaces, workspace = lt.matmul, state.lt, state.workspaces, state.workspace
    desc, a_desc, b_desc, c_desc = plan.desc, plan.a_desc, plan.b_desc, plan.c_desc
    set_bias, bias_attribute = lt.matmul_desc_set_attribute, lt.MatmulDescAttribute.BIAS_POINTER
    current = np.array([bias_pointer], dtype=np.uint64)
    current_pointer = current.ctypes.data
    last_bias = [bias_pointer]  # (a Python int: comparing with NumPy's scalar cost more)

    def launch(pa, pb, pd, stream, pbias):
        if pbias != last_bias[0]:
            current[0] = last_bias[0] = pbias
            set_bias(desc, bias_attribute, current_pointer, 8)
        memory = workspaces.get(stream)
        matmul(handle, desc, alpha_pointer, pb, a_desc, pa, b_desc, beta_pointer, pd, c_desc, pd, c_desc, algorithm,
               memory.ptr if memory is not None else workspace(stream), workspace_bytes, stream)

    launch.plan, launch.algorithm = plan, found  # (kept alive with the launcher)
    return launch
