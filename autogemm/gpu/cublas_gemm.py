"""cuBLAS as `matmul` serves it: cuBLASLt with its heuristic's algorithm and a workspace, the way
torch.matmul reaches it, through nvmath-python's low-level bindings (`nvmath.bindings.cublasLt`),
behind the same `launch(pa, pb, pc, alpha, beta, stream=None)` as a generated kernel's launcher.

Why cuBLASLt: with a workspace it may pick split-K and stream-K algorithms that cublasGemmEx without
one cannot (cupy.matmul sets none), so it is the strongest baseline a user has. Why the low-level
bindings: every descriptor, the algorithm and the workspace are prepared once per plan, and a call
is one `cublasLtMatmul` (nvmath's `Matmul.execute()` spent 102 us of host time on a call that takes
torch.matmul 29 us). The heuristic assumes operands aligned as the plan's were: a call whose pointers
are less aligned gets an algorithm chosen for their alignment (chosen once, then kept).

Row-major C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B goes first, and an operand
stored transposed (operands.KernelOperand.transposed) is read with CUBLAS_OP_T.

Where cuBLASLt offers no algorithm, cublasGemmEx (`nvmath.bindings.cublas`, as cupy.matmul calls it)
serves instead; it also serves the problems whose record measured it faster (`api="gemmex"`).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import capture
from .. import dtypes
from .operands import KernelOperand, describe
from ..problem import Problem
from .runtime import cupy_stream

INT32_MAX = 2**31 - 1  # cuBLAS takes sizes and pitches as 32-bit ints
# the workspace of each (GPU, stream): what torch gives cuBLAS on Hopper (its cuBLASLt calls get
# CUBLASLT_WORKSPACE_SIZE, 1 MiB by default, which serving/lt_linear.py asks the heuristic with)
WORKSPACE_BYTES = 32 * 1024 * 1024
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT_TENSOR_OP = 99
# alignments (bytes) cuBLASLt's heuristic is told the operands keep: its default assumption is 256
_ALIGNMENTS = (256, 128, 64, 32, 16, 8, 4, 2)
# alpha = 1, beta = 0 of a plain product, in host memory for the life of the process (cuBLAS reads
# host scalars through their address before it returns)
_ONE_ZERO = {np.float32: np.array([1, 0], dtype=np.float32), np.float64: np.array([1, 0], dtype=np.float64)}

INSTALL_HINT = ("pip install 'autogemm[cuda13]' (or [cuda12] with a CUDA 12 driver) brings it: nvmath-python, and "
                "cuBLAS/cuBLASLt themselves as NVIDIA's nvidia-cublas package (cuda-toolkit[cublas])")


class CublasUnavailable(RuntimeError):
    """nvmath-python, through which autogemm calls cuBLASLt and cuBLAS, cannot be imported."""


def bindings() -> tuple[Any, Any]:
    try:
        from nvmath.bindings import cublas, cublasLt  # (lazy: nvmath-python)
    except ImportError as exc:
        raise CublasUnavailable(f"autogemm serves cuBLAS through nvmath-python, which cannot be imported ({exc}); "
                                f"{INSTALL_HINT}") from None
    return cublasLt, cublas


class _DeviceState:
    """The cuBLASLt and cuBLAS handles of one GPU and the workspace of each stream used on it. A
    cuBLAS handle is bound to one stream at a time: each thread has its own (`legacy_handle`)."""

    def __init__(self, ordinal: int):
        lt, legacy = bindings()
        self.ordinal = ordinal
        self._legacy_bindings = legacy
        try:
            self.lt = lt.create()
        except lt.cuBLASLtError:
            raise
        except Exception as exc:  # the library is missing or does not load (nvmath loads it on first use)
            raise CublasUnavailable(f"cuBLASLt (libcublasLt) cannot be loaded ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); {INSTALL_HINT}") from None
        self.workspaces: dict[int, object] = {}  # stream pointer -> cupy memory
        self.lock = threading.Lock()
        self._threads = threading.local()

    def legacy_handle(self, stream: int) -> int:
        """This thread's cuBLAS handle, bound to `stream` (set only when it changes)."""
        local = self._threads
        handle = getattr(local, "handle", None)
        if handle is None:
            handle = local.handle = self._legacy_bindings.create()
            local.stream = None
        if local.stream != stream:
            self._legacy_bindings.set_stream(handle, stream)
            local.stream = stream
        return handle

    def workspace(self, stream: int) -> int:
        """The workspace of `stream`, allocated on it the first time: CuPy's pool hands out memory
        whose last use is ordered on the stream it is allocated on, and a call on a stream that is
        not CuPy's current one (PyTorch's, from matmul's torch fast path) must not get memory that
        CuPy's current stream may still be using. Under a CUDA graph capture, the capture's own
        (capture.memory): a replay must not share it with the stream's other calls."""
        if capture.capturing(stream):
            return capture.memory(self.ordinal, stream, "cublas", WORKSPACE_BYTES)
        memory = self.workspaces.get(stream)
        if memory is None:
            import cupy  # (lazy: CuPy)

            with self.lock:
                memory = self.workspaces.get(stream)
                if memory is None:
                    if stream == cupy.cuda.get_current_stream().ptr:
                        memory = cupy.cuda.alloc(WORKSPACE_BYTES)
                    else:
                        with cupy_stream(stream, self.ordinal):
                            memory = cupy.cuda.alloc(WORKSPACE_BYTES)
                    self.workspaces[stream] = memory
        return memory.ptr


_STATES: dict[int, _DeviceState] = {}
_STATES_LOCK = threading.Lock()


def device_state(ordinal: int) -> _DeviceState:
    state = _STATES.get(ordinal)
    if state is None:
        with _STATES_LOCK:
            state = _STATES.get(ordinal)
            if state is None:
                state = _STATES[ordinal] = _DeviceState(ordinal)
    return state


def scalar_type(problem: Problem) -> Any:
    """NumPy type of alpha and beta: the compute type's (FP64 for FP64, FP32 otherwise)."""
    return np.dtype(dtypes.lookup(problem.dtype, problem.compute).accumulator_storage).type


def set_attribute(setter: Any, handle: Any, attribute: Any, value: Any, dtype: Any) -> None:
    buffer = np.array([value], dtype=dtype)
    setter(handle, attribute, buffer.ctypes.data, buffer.itemsize)


class LtPlan:
    """Descriptors of one problem and layout, and the algorithm the heuristic picks per alignment.
    `epilogue`: the name of a cuBLASLt epilogue (cublas_epilogue.py) set on the descriptor, with the
    bias's address where it reads one; `d`: D's layout where D is not C (C then is read, D written);
    `workspace_bytes`: the most workspace the algorithm may use (each call passes that much)."""

    def __init__(self, problem: Problem, a: KernelOperand, b: KernelOperand, c: KernelOperand, state: _DeviceState,
                 epilogue: str = "", d: KernelOperand | None = None, bias_pointer: int = 0,
                 workspace_bytes: int = WORKSPACE_BYTES):
        lt, _ = bindings()
        self._lt, self._state = lt, state
        self.workspace_bytes = workspace_bytes  # (the heuristic picks by it: the calls must pass no less)
        row = dtypes.lookup(problem.dtype, problem.compute)
        data_type = row.cuda_data_type
        m, n, k, batch = problem.m, problem.n, problem.k, problem.batch
        self.desc = lt.matmul_desc_create(row.cublas_compute_type, row.cuda_scale_type)
        op_a, op_b = (_OP_T if a.transposed else _OP_N), (_OP_T if b.transposed else _OP_N)
        set_attribute(lt.matmul_desc_set_attribute, self.desc, lt.MatmulDescAttribute.TRANSA, op_b, np.int32)
        set_attribute(lt.matmul_desc_set_attribute, self.desc, lt.MatmulDescAttribute.TRANSB, op_a, np.int32)
        # column-major shapes as stored: cuBLASLt's A is our B, its B our A, its C our Cᵀ
        self.a_desc = self._layout(data_type, (k, n) if b.transposed else (n, k), b, batch)
        self.b_desc = self._layout(data_type, (m, k) if a.transposed else (k, m), a, batch)
        self.c_desc = self._layout(data_type, (n, m), c, batch)
        self.d_desc = self.c_desc if d is None else self._layout(data_type, (n, m), d, batch)
        if epilogue:
            set_attribute(lt.matmul_desc_set_attribute, self.desc, lt.MatmulDescAttribute.EPILOGUE,
                          int(getattr(lt.Epilogue, epilogue)), np.uint32)
        if bias_pointer:
            set_attribute(lt.matmul_desc_set_attribute, self.desc, lt.MatmulDescAttribute.BIAS_POINTER, bias_pointer,
                          np.uint64)
        self.algorithms: dict[int, np.ndarray] = {}

    def _layout(self, data_type: int, rows_cols: tuple[Any, ...], operand: KernelOperand, batch: int) -> int:
        lt = self._lt
        layout = lt.matrix_layout_create(data_type, rows_cols[0], rows_cols[1], operand.ld)
        if batch > 1:
            set_attribute(lt.matrix_layout_set_attribute, layout, lt.MatrixLayoutAttribute.BATCH_COUNT, batch, np.int32)
            set_attribute(lt.matrix_layout_set_attribute, layout, lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET,
                 operand.batch_stride, np.int64)
        return layout

    def algorithm(self, alignment: int) -> np.ndarray | None:
        """The heuristic's first algorithm for operands aligned to `alignment` bytes (None: none)."""
        found = self.algorithms.get(alignment)
        if found is not None or alignment in self.algorithms:
            return found
        ranked = self.ranked(alignment, 1)
        found = ranked[0] if ranked else None
        self.algorithms[alignment] = found
        return found

    def ranked(self, alignment: int, count: int) -> list[np.ndarray]:
        """The heuristic's first `count` algorithms (fewer where it has fewer) for operands aligned to
        `alignment` bytes, best first: each a one-element array of cublasLtMatmulHeuristicResult_t
        (`algo`, `workspace_size`, `waves_count`) whose address a call passes as its algorithm."""
        if not 1 <= count <= 1024:
            raise ValueError(f"cuBLASLt's heuristic is asked for 1 to 1024 algorithms, not {count}")
        lt = self._lt
        preference = lt.matmul_preference_create()
        try:
            set_attribute(lt.matmul_preference_set_attribute, preference, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                 self.workspace_bytes, np.uint64)
            for attribute in (lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_A_BYTES,
                              lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_B_BYTES,
                              lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_C_BYTES,
                              lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_D_BYTES):
                set_attribute(lt.matmul_preference_set_attribute, preference, attribute, alignment, np.uint32)
            results = np.zeros(count, dtype=lt.matmul_heuristic_result_dtype)
            found = np.zeros(1, dtype=np.int32)
            try:
                lt.matmul_algo_get_heuristic(self._state.lt, self.desc, self.a_desc, self.b_desc, self.c_desc,
                                             self.d_desc, preference, count, results.ctypes.data, found.ctypes.data)
            except lt.cuBLASLtError:  # CUBLAS_STATUS_NOT_SUPPORTED: nothing for this problem
                found[0] = 0
        finally:
            lt.matmul_preference_destroy(preference)
        return [results[i:i + 1] for i in range(int(found[0]))]  # (views: each keeps `results` alive)

    def checked(self, other: np.ndarray) -> np.ndarray | None:
        """Another plan's algorithm (a heuristic result, as `ranked` gives them) made this plan's, where
        cuBLASLt's check (cublasLtMatmulAlgoCheck) says it computes this plan's descriptors, epilogue
        included, within its workspace: a heuristic result of its own (the check writes the workspace it
        needs and its waves). None where it does not. Why: the heuristic picks a product's algorithm apart
        for each epilogue, and the bare product's may run the epilogue faster than the one picked for it."""
        lt = self._lt
        algo = other["algo"].copy()  # (apart from the result the check writes)
        result = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
        try:
            lt.matmul_algo_check(self._state.lt, self.desc, self.a_desc, self.b_desc, self.c_desc, self.d_desc,
                                 algo.ctypes.data, result.ctypes.data)
        except lt.cuBLASLtError:  # CUBLAS_STATUS_NOT_SUPPORTED or INVALID_VALUE: not for these descriptors
            return None
        result["algo"] = algo  # (a call passes the result's address as its algorithm's)
        fits = int(result["state"][0]) == 0 and int(result["workspace_size"][0]) <= self.workspace_bytes
        return result if fits else None


def alignment_of(address: int) -> int:
    for alignment in _ALIGNMENTS:
        if address % alignment == 0:
            return alignment
    return 1


def cublas_launcher(problem: Problem, a: KernelOperand, b: KernelOperand, c: KernelOperand,
                    capability: tuple[int, int] | None = None, ordinal: int | None = None, api: str = "lt") -> Any:
    """`launch(pa, pb, pc, alpha, beta, stream=None)`: C = alpha·op(A)·op(B) + beta·C through
    cuBLASLt for operands of these layouts (pitches, batch strides; c not transposed), on `stream`
    (CuPy's current stream when None) of the current device. ValueError when a size or pitch does not
    fit cuBLAS's 32-bit ints; CublasUnavailable without nvmath-python. (`capability` is accepted for
    the callers that pass it; cuBLASLt reads the device itself.) `api="gemmex"`: cublasGemmEx as
    cupy.matmul calls it (cuBLAS's own algorithm choice and workspace), for the problems on which a
    record measured it faster than cuBLASLt's heuristic."""
    if c.transposed:
        raise ValueError("cuBLAS writes C in row-major rows; a transposed C goes through a buffer")
    too_big = [name for name, value in (("M", problem.m), ("N", problem.n), ("K", problem.k), ("batch", problem.batch),
                                        ("a's pitch", a.ld), ("b's pitch", b.ld), ("out's pitch", c.ld))
               if value > INT32_MAX]
    if too_big:
        raise ValueError(f"{', '.join(too_big)} of {problem} exceed cuBLAS's 32-bit limit {INT32_MAX}")
    import cupy  # (lazy: CuPy)

    lt, legacy = bindings()
    state = device_state(cupy.cuda.Device().id if ordinal is None else ordinal)
    if api not in ("lt", "gemmex"):
        raise ValueError(f"unknown cuBLAS API {api!r}: lt or gemmex")
    plan = LtPlan(problem, a, b, c, state)
    itemsize = dtypes.lookup(problem.dtype).itemsize
    # pitches and batch strides bound the alignment every row keeps, whatever the pointers
    pitch_alignment = min(alignment_of(x * itemsize) for x in (a.ld, b.ld, c.ld, a.batch_stride or 256,
                                                              b.batch_stride or 256, c.batch_stride or 256))

    def address(results) -> int:  # 0: no algorithm (the array stays alive in plan.algorithms)
        return 0 if results is None else results.ctypes.data

    best = address(plan.algorithm(min(256, pitch_alignment)))
    scalar = scalar_type(problem)
    one_zero_pointer, step = _ONE_ZERO[scalar].ctypes.data, np.dtype(scalar).itemsize
    matmul, handle, workspace = lt.matmul, state.lt, state.workspace
    desc, a_desc, b_desc, c_desc = plan.desc, plan.a_desc, plan.b_desc, plan.c_desc
    get_stream = cupy.cuda.get_current_stream

    def uncapturable(pa, pb, pc, alpha, beta, stream=None):
        raise capture.CaptureError(f"cuBLASLt has no algorithm for {problem} with these operands' alignment, and "
                                   f"cublasGemmEx, which serves it instead, cannot be captured into a CUDA graph "
                                   f"(its handle's workspace would be shared with every later call)")

    gemmex = _gemmex_launcher(problem, a, b, c, state, legacy, uncapturable)
    algorithms = {}  # the lowest alignment of a call's pointers (when under 256) -> algorithm address

    def launch(pa, pb, pc, alpha, beta, stream=None):
        stream_pointer = stream.ptr if stream is not None else get_stream().ptr
        if alpha == 1 and beta == 0:
            pointer = one_zero_pointer
        else:
            scalars = np.array([alpha, beta], dtype=scalar)
            pointer = scalars.ctypes.data
        low = (pa | pb | pc) & 255
        algorithm = best
        if low:  # pointers less aligned than 256 bytes: an algorithm chosen for their alignment
            algorithm = algorithms.get(low)
            if algorithm is None:
                algorithm = algorithms[low] = address(plan.algorithm(min(alignment_of(low), pitch_alignment)))
        if not algorithm:  # cuBLASLt has none for these operands: cuBLAS's own call
            return gemmex(pa, pb, pc, alpha, beta, stream)
        matmul(handle, desc, pointer, pb, a_desc, pa, b_desc, pointer + step, pc, c_desc, pc, c_desc,
               algorithm, workspace(stream_pointer), WORKSPACE_BYTES, stream_pointer)

    launch.plan = plan  # (kept alive with the launcher; tests read its algorithms)
    if api == "gemmex":  # under a capture, cuBLASLt serves (with the capture's own workspace)
        launch_gemmex = _gemmex_launcher(problem, a, b, c, state, legacy, launch)
        launch_gemmex.plan = plan
        return launch_gemmex
    return launch


def _gemmex_launcher(problem: Problem, a: KernelOperand, b: KernelOperand, c: KernelOperand, state: _DeviceState,
                     legacy, under_capture):
    """`launch(pa, pb, pc, alpha, beta, stream=None)` through cublasGemmEx (StridedBatched for a
    batch) with this thread's handle, as cupy.matmul calls it; a call on a stream under a CUDA graph
    capture goes to `under_capture` instead (a cuBLAS handle keeps a workspace of its own, which a
    graph would share with every later call on it, and creating one with another cannot happen
    inside a capture)."""
    import cupy  # (lazy: CuPy)

    row = dtypes.lookup(problem.dtype, problem.compute)
    data_type, compute_type = row.cuda_data_type, row.cublas_compute_type
    m, n, k, batch = problem.m, problem.n, problem.k, problem.batch
    op_a, op_b = (_OP_T if a.transposed else _OP_N), (_OP_T if b.transposed else _OP_N)
    scalar = scalar_type(problem)
    one_zero_pointer, step = _ONE_ZERO[scalar].ctypes.data, np.dtype(scalar).itemsize
    get_stream, handle_for, capturing = cupy.cuda.get_current_stream, state.legacy_handle, capture.capturing
    gemm_ex, strided = legacy.gemm_ex, legacy.gemm_strided_batched_ex

    def launch(pa, pb, pc, alpha, beta, stream=None):
        stream_pointer = stream.ptr if stream is not None else get_stream().ptr
        if capturing(stream_pointer):
            return under_capture(pa, pb, pc, alpha, beta, stream)
        handle = handle_for(stream_pointer)
        if alpha == 1 and beta == 0:
            pointer = one_zero_pointer
        else:
            scalars = np.array([alpha, beta], dtype=scalar)
            pointer = scalars.ctypes.data
        if batch == 1:
            gemm_ex(handle, op_b, op_a, n, m, k, pointer, pb, data_type, b.ld, pa, data_type, a.ld,
                    pointer + step, pc, data_type, c.ld, compute_type, _GEMM_DEFAULT_TENSOR_OP)
        else:
            strided(handle, op_b, op_a, n, m, k, pointer, pb, data_type, b.ld, b.batch_stride, pa, data_type, a.ld,
                    a.batch_stride, pointer + step, pc, data_type, c.ld, c.batch_stride, batch, compute_type,
                    _GEMM_DEFAULT_TENSOR_OP)

    return launch


def gemm(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, compute: str = "", bfloat16_bits: bool = False) -> Any:
    """alpha · a @ b (+ beta · out) for CuPy arrays through cuBLASLt, in one call of the launcher
    above (for the baselines and the tools that need cuBLAS on arrays rather than a plan). With
    `bfloat16_bits`, uint16 arrays hold bfloat16 bits (autogemm's own buffers). Operands that are
    neither row-major nor a transposed view are copied once; an `out` cuBLAS cannot write in place
    goes through a contiguous buffer. K must be at least 1."""
    import cupy  # (lazy: CuPy)

    info_a, info_b = describe(a, "a", bfloat16_bits=bfloat16_bits), describe(b, "b", bfloat16_bits=bfloat16_bits)
    layout_a, layout_b = info_a.layout(), info_b.layout()
    if layout_a is None:
        a = cupy.ascontiguousarray(a)
        layout_a = describe(a, "a", bfloat16_bits=bfloat16_bits).layout()
    if layout_b is None:
        b = cupy.ascontiguousarray(b)
        layout_b = describe(b, "b", bfloat16_bits=bfloat16_bits).layout()
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = max(a.shape[0] if a.ndim == 3 else 1, b.shape[0] if b.ndim == 3 else 1)
    shape = (batch, m, n) if max(a.ndim, b.ndim) == 3 else (m, n)
    target = out if out is not None and out.flags.c_contiguous else None
    if target is None:
        target = cupy.empty(shape, dtype=a.dtype)
        if out is not None and beta != 0:
            target[...] = out
    if target.size == 0:
        return target if out is None else out
    problem = Problem(m, n, k, batch=batch, dtype=info_a.dtype, compute=compute,  # (K >= 1)
                      trans_a=layout_a.transposed, trans_b=layout_b.transposed)
    layout_c = KernelOperand(False, n, m * n if batch > 1 else 0, target.data.ptr)
    launch = cublas_launcher(problem, layout_a, layout_b, layout_c)
    launch(layout_a.pointer, layout_b.pointer, target.data.ptr, alpha, beta)
    if out is not None and target is not out:
        out[...] = target
        return out
    return target
