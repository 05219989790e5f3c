"""cuBLAS as `matmul` serves it: one cublasGemmEx (cublasGemmStridedBatchedEx for a batch) per
call, its arguments built once per layout, behind the same `launch(pa, pb, pc, alpha, beta,
stream)` as a generated kernel's launcher.

Why not cupy.matmul: the GPU work is the same (the compute type and algorithm below are the ones
cupy.matmul passes for a 2-D product, so cuBLAS picks the same kernel), but cupy.matmul rebuilds
views, checks dtypes and contiguity and makes scalar arrays on every call, which costs more host
time than the whole call below; on a product of tens of microseconds that host time is the user's
latency. Batches go to cuBLAS in their own dtype and strides (cupy.matmul copies them contiguous,
and widens float16 to float32 first). alpha and beta are cuBLAS's own, so scaling costs no extra
pass.

Row-major C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B goes first, and an operand
stored transposed (operands.KernelOperand.transposed) is read with CUBLAS_OP_T.
"""

from __future__ import annotations

import numpy as np

from . import dtypes
from .operands import KernelOperand, describe
from .problem import Problem

INT32_MAX = 2**31 - 1  # cuBLAS takes sizes and pitches as 32-bit ints

# cudaDataType_t of each dtype (library_types.h)
_CUDA_DATA_TYPE = {"float16": 2, "bfloat16": 14, "float32": 0, "float64": 1}
# cublasComputeType_t of each compute mode, as cupy.matmul chooses it (cublas_api.h)
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_64F = 68, 77, 70
_COMPUTE_TYPE = {"fp32": _COMPUTE_32F, "tf32": _COMPUTE_32F_FAST_TF32, "fp64": _COMPUTE_64F}
_GEMM_DEFAULT, _GEMM_DEFAULT_TENSOR_OP = -1, 99
_OP_N, _OP_T = 0, 1
# alpha = 1, beta = 0 of a plain product, in host memory for the life of the process (cuBLAS reads
# host scalars through their address: an array that only a pointer refers to would be freed and
# its memory reused, and cuBLAS would read whatever came there)
_ONE_ZERO = {np.float32: np.array([1, 0], dtype=np.float32), np.float64: np.array([1, 0], dtype=np.float64)}


def _algorithm(dtype: str, capability: tuple[int, int]) -> int:
    """cupy.matmul's algorithm hint: tensor-op from compute capability 8.0 (7.0 for float16)."""
    if capability >= (8, 0) or (capability >= (7, 0) and dtype == "float16"):
        return _GEMM_DEFAULT_TENSOR_OP
    return _GEMM_DEFAULT


def _scalar_type(problem: Problem):
    """NumPy type of alpha and beta: the compute type's (FP64 for FP64, FP32 otherwise)."""
    return np.dtype(dtypes.lookup(problem.dtype, problem.compute).accumulator_storage).type


def cublas_launcher(problem: Problem, a: KernelOperand, b: KernelOperand, c: KernelOperand,
                    capability: tuple[int, int]):
    """`launch(pa, pb, pc, alpha, beta, stream=None)`: C = alpha·op(A)·op(B) + beta·C through cuBLAS
    for operands of these layouts (pitches, batch strides; c not transposed), on `stream` (the
    current stream when None) of the current device. ValueError when a size or pitch does not fit
    cuBLAS's 32-bit ints."""
    if c.transposed:
        raise ValueError("cuBLAS writes C in row-major rows; a transposed C goes through a buffer")
    too_big = [name for name, value in (("M", problem.m), ("N", problem.n), ("K", problem.k), ("batch", problem.batch),
                                        ("a's pitch", a.ld), ("b's pitch", b.ld), ("out's pitch", c.ld))
               if value > INT32_MAX]
    if too_big:
        raise ValueError(f"{', '.join(too_big)} of {problem} exceed cuBLAS's 32-bit limit {INT32_MAX}")
    from cupy.cuda import device as cuda_device
    from cupy_backends.cuda.libs import cublas

    m, n, k, batch = problem.m, problem.n, problem.k, problem.batch
    data_type = _CUDA_DATA_TYPE[problem.dtype]
    compute_type = _COMPUTE_TYPE[problem.compute]
    algorithm = _algorithm(problem.dtype, capability)
    op_a, op_b = (_OP_T if a.transposed else _OP_N), (_OP_T if b.transposed else _OP_N)
    scalar = _scalar_type(problem)
    one_zero_pointer, step = _ONE_ZERO[scalar].ctypes.data, np.dtype(scalar).itemsize
    get_handle = cuda_device.get_cublas_handle

    # other alpha and beta live in an array of the call's own (cuBLAS reads them before it returns).
    # The two launchers repeat their few lines of preamble rather than share a helper: this is the
    # hot path of every cuBLAS-served call, and a Python call costs what the preamble does.
    if batch == 1:
        gemm_ex = cublas.gemmEx

        def launch(pa, pb, pc, alpha, beta, stream=None):
            if stream is not None:
                with stream:
                    return launch(pa, pb, pc, alpha, beta)
            if alpha == 1 and beta == 0:
                pointer = one_zero_pointer
            else:
                scalars = np.array([alpha, beta], dtype=scalar)
                pointer = scalars.ctypes.data
            # (CuPy's wrapper binds the handle to the current stream)
            gemm_ex(get_handle(), op_b, op_a, n, m, k, pointer, pb, data_type, b.ld, pa, data_type, a.ld,
                    pointer + step, pc, data_type, c.ld, compute_type, algorithm)

        return launch

    strided_batched = cublas.gemmStridedBatchedEx

    def launch_batched(pa, pb, pc, alpha, beta, stream=None):
        if stream is not None:
            with stream:
                return launch_batched(pa, pb, pc, alpha, beta)
        if alpha == 1 and beta == 0:
            pointer = one_zero_pointer
        else:
            scalars = np.array([alpha, beta], dtype=scalar)
            pointer = scalars.ctypes.data
        strided_batched(get_handle(), op_b, op_a, n, m, k, pointer, pb, data_type, b.ld, b.batch_stride,
                        pa, data_type, a.ld, a.batch_stride, pointer + step, pc, data_type, c.ld,
                        c.batch_stride, batch, compute_type, algorithm)

    return launch_batched


def gemm(a, b, out=None, *, alpha: float = 1.0, beta: float = 0.0, compute: str = "", bfloat16_bits: bool = False):
    """alpha · a @ b (+ beta · out) for CuPy arrays through cuBLAS, in one call of the launcher
    above (for the baselines and the tools that need cuBLAS on arrays rather than a plan). With
    `bfloat16_bits`, uint16 arrays hold bfloat16 bits (autogemm's own buffers). Operands that are
    neither row-major nor a transposed view are copied once; an `out` cuBLAS cannot write in place
    goes through a contiguous buffer. K must be at least 1."""
    import cupy

    from .launch import current_device

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
    launch = cublas_launcher(problem, layout_a, layout_b, layout_c, current_device().compute_capability)
    launch(layout_a.pointer, layout_b.pointer, target.data.ptr, alpha, beta)
    if out is not None and target is not out:
        out[...] = target
        return out
    return target
