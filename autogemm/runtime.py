"""The GPU runtime, CuPy: imported where kernels are compiled, launched or timed, with an error that
says how to install it where it is missing (configurations, search spaces and rendering need none).
Also cuBLAS as autogemm serves it and as its baselines time it: `cublas_product` gives the call for
a dtype and compute mode (cupy.matmul, with CuPy's TF32 switch for "tf32"; for bfloat16, which
CuPy computes from version 14, cublasGemmEx where CuPy cannot)."""

from __future__ import annotations

import numpy as np

INSTALL_HINT = 'install the CUDA extra: pip install "autogemm[cuda13]" (or "autogemm[cuda12]" with a CUDA 12 driver)'


class GpuRuntimeMissing(ImportError):
    """CuPy cannot be imported."""


def cupy():
    """The CuPy module; GpuRuntimeMissing naming the extra to install where it cannot be imported."""
    try:
        import cupy as module
    except ImportError as exc:
        raise GpuRuntimeMissing(f"autogemm needs CuPy to run kernels and it cannot be imported ({exc}); "
                                f"{INSTALL_HINT}") from None
    return module


def cublas_product(dtype: str, compute: str):
    """`product(a, b, out=None)`: a @ b through cuBLAS for operands of `dtype` in `compute` mode,
    into `out` when given (a fresh array otherwise), with nothing added to what the call itself
    costs where cupy.matmul does it (fp32, fp16, fp64)."""
    cp = cupy()
    if dtype == "bfloat16":
        return cp.matmul if cupy_computes_bfloat16() else bfloat16_gemm
    if compute != "tf32":
        return cp.matmul
    from cupy._core import _routines_linalg as linalg

    def tf32_matmul(a, b, out=None):
        before = linalg.get_compute_type(np.float32)
        if before == linalg.COMPUTE_TYPE_TF32:  # the user switched CuPy to TF32 already
            return cp.matmul(a, b, out=out)
        linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_TF32)
        try:
            return cp.matmul(a, b, out=out)
        finally:
            linalg.set_compute_type(np.float32, before)

    return tf32_matmul


def cupy_computes_bfloat16() -> bool:
    """CuPy 14 and later hold bfloat16 arrays (ml_dtypes') and multiply them with cuBLAS."""
    return int(cupy().__version__.split(".")[0]) >= 14


def bfloat16_bits_product():
    """`product(a, b, out=None)` for uint16 arrays holding bfloat16 bits (the tuner's buffers):
    cupy.matmul on bfloat16 views where CuPy computes bfloat16, exactly as `matmul` serves it;
    cublasGemmEx on the bits otherwise."""
    if not cupy_computes_bfloat16():
        return bfloat16_gemm
    import ml_dtypes

    matmul = cupy().matmul

    def product(a, b, out=None):
        c = matmul(a.view(ml_dtypes.bfloat16), b.view(ml_dtypes.bfloat16),
                   out=None if out is None else out.view(ml_dtypes.bfloat16))
        return c.view(np.uint16)

    return product


# -- bfloat16 through cublasGemmEx ---------------------------------------------------------------

def _matrix_layout(x):
    """(transposed, leading dimension in elements) of the last two axes of `x` as cuBLAS can read
    them (row-major rows or a transposed view), or None when neither axis is unit-stride."""
    rows, cols = x.shape[-2:]
    item = x.itemsize
    row_stride, col_stride = x.strides[-2:]
    if (col_stride == item or cols == 1) and row_stride % item == 0 and (rows == 1 or row_stride >= cols * item):
        return False, max(row_stride // item if rows > 1 else cols, cols, 1)
    if (row_stride == item or rows == 1) and col_stride % item == 0 and col_stride >= rows * item:
        return True, max(col_stride // item, rows, 1)
    return None


def _batch_stride(x) -> int:
    """Element stride between the matrices of a batch (0 for a 2-D operand broadcast)."""
    return x.strides[0] // x.itemsize if x.ndim == 3 and x.shape[0] > 1 else 0


_ONE_ZERO = np.array([1.0, 0.0], dtype=np.float32)  # alpha, beta of a plain product (host memory)
_ONE_ZERO_POINTER = _ONE_ZERO.ctypes.data


def bfloat16_gemm(a, b, out=None, alpha: float = 1.0, beta: float = 0.0):
    """alpha · a @ b (+ beta · out) for bfloat16 CuPy arrays (ml_dtypes bfloat16, or uint16 arrays
    holding the bits): cublasGemmEx with FP32 accumulation, one strided-batched call for a 3-D
    batch (a 2-D operand broadcast with stride 0). Row-major C = A·B is computed as the
    column-major Cᵀ = Bᵀ·Aᵀ; transposed views are read as they are, other strides copied once."""
    cp = cupy()
    from cupy.cuda import cublas, device

    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = max(a.shape[0] if a.ndim == 3 else 1, b.shape[0] if b.ndim == 3 else 1)
    shape = (batch, m, n) if max(a.ndim, b.ndim) == 3 else (m, n)
    layout_a, layout_b = _matrix_layout(a), _matrix_layout(b)
    if layout_a is None:
        a = cp.ascontiguousarray(a)
        layout_a = _matrix_layout(a)
    if layout_b is None:
        b = cp.ascontiguousarray(b)
        layout_b = _matrix_layout(b)
    target = out
    if out is None:
        target = cp.empty(shape, dtype=a.dtype)
    elif not out.flags.c_contiguous:  # cuBLAS writes row-major rows: through a contiguous buffer
        target = cp.ascontiguousarray(out.view(np.uint16)).view(out.dtype)
    if target.size == 0:
        return target
    # (cuBLAS itself gives C = beta * C for k == 0)
    handle = device.get_cublas_handle()
    bf16, compute_32f = cp.cuda.runtime.CUDA_R_16BF, getattr(cublas, "CUBLAS_COMPUTE_32F", 68)
    if alpha == 1 and beta == 0:
        pointer = _ONE_ZERO_POINTER  # no per-call ctypes lookup on the timed path
    else:
        scalars = np.array([alpha, beta], dtype=np.float32)  # host memory, alive until the call returns
        pointer = scalars.ctypes.data
    op_a = cublas.CUBLAS_OP_T if layout_a[0] else cublas.CUBLAS_OP_N
    op_b = cublas.CUBLAS_OP_T if layout_b[0] else cublas.CUBLAS_OP_N
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        if batch == 1:
            cublas.gemmEx(handle, op_b, op_a, n, m, k, pointer, b.data.ptr, bf16, layout_b[1],
                          a.data.ptr, bf16, layout_a[1], pointer + 4, target.data.ptr, bf16, n,
                          compute_32f, -1)
        else:
            cublas.gemmStridedBatchedEx(
                handle, op_b, op_a, n, m, k, pointer, b.data.ptr, bf16, layout_b[1],
                _batch_stride(b), a.data.ptr, bf16, layout_a[1], _batch_stride(a),
                pointer + 4, target.data.ptr, bf16, n, m * n, batch, compute_32f, -1)
    finally:
        cublas.setPointerMode(handle, mode)
    if target is not out and out is not None:
        out.view(np.uint16)[...] = target.view(np.uint16)
        return out
    return target
