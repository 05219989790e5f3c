"""cuBLAS as the baselines time it: `cublas_product` gives the call a user would make for a dtype and
compute mode (cupy.matmul; for "tf32" the cuBLAS call CuPy makes in TF32 mode; for bfloat16, which
CuPy computes from version 14, cublasGemmEx where CuPy cannot). `matmul` serves cuBLAS through
cublas_gemm, the same GPU work with less host time per call."""

from __future__ import annotations
from typing import Any

import numpy as np

from .. import dtypes
from .cublas_gemm import gemm
from .runtime import cupy, cupy_computes, numpy_dtype


def cublas_product(dtype: str, compute: str) -> Any:
    """`product(a, b, out=None)`: a @ b through cuBLAS for operands of `dtype` in `compute` mode,
    into `out` when given (a fresh array otherwise), with nothing added to what the call itself
    costs where cupy.matmul does it (a type this CuPy multiplies, in its default compute mode)."""
    cp = cupy()
    if not cupy_computes(dtype):
        return _bits_gemm
    if dtypes.lookup(dtype, compute) is dtypes.lookup(dtype):
        return cp.matmul

    def tf32_matmul(a, b, out=None):
        # what cupy.matmul runs where CuPy is switched to TF32 (its documented switch, CUPY_TF32=1,
        # is read once at import, so it cannot be set for one product): cublasGemmEx with the
        # CUBLAS_COMPUTE_32F_FAST_TF32 compute type and the tensor-op algorithm, as cublas_gemm gives it
        return gemm(a, b, out, compute=compute)

    return tf32_matmul


def bits_product(dtype: str) -> Any:
    """`product(a, b, out=None)` for arrays of `dtype`'s storage holding its bits (the tuner's
    buffers of a type stored as raw bits, bfloat16 in uint16): cupy.matmul on views of the type
    where CuPy computes it, as a user's own call runs it; cublasGemmEx on the bits otherwise."""
    if not cupy_computes(dtype):
        return _bits_gemm
    typed, storage = numpy_dtype(dtype), np.dtype(dtypes.lookup(dtype).storage)
    matmul = cupy().matmul

    def product(a, b, out=None):
        c = matmul(a.view(typed), b.view(typed), out=None if out is None else out.view(typed))
        return c.view(storage)

    return product


def bfloat16_bits_product() -> Any:
    """`bits_product` of bfloat16 (for the callers that name the type)."""
    return bits_product("bfloat16")


def _bits_gemm(a, b, out=None):
    """a @ b where CuPy cannot multiply the type: through cuBLAS on the operands' bits (uint16
    arrays of bfloat16 bits, or bfloat16 arrays)."""
    return gemm(a, b, out, bfloat16_bits=True)
