"""cuBLAS as matmul serves it (cublas_gemm): what it refuses, before touching CuPy or the GPU."""

from __future__ import annotations

import pytest

from autogemm.gpu.cublas_gemm import INT32_MAX, cublas_launcher
from autogemm.gpu.operands import KernelOperand
from autogemm.problem import Problem

ROW_MAJOR = KernelOperand(False, 8, 0, 0)


def test_sizes_beyond_32_bits_are_refused_by_name():
    with pytest.raises(ValueError, match=r"M of .* exceed cuBLAS's 32-bit limit 2147483647"):
        cublas_launcher(Problem(INT32_MAX + 1, 8, 8), ROW_MAJOR, ROW_MAJOR, ROW_MAJOR, (9, 0))
    wide = KernelOperand(False, INT32_MAX + 1, 0, 0)
    with pytest.raises(ValueError, match=r"b's pitch of .* exceed"):
        cublas_launcher(Problem(8, 8, 8), ROW_MAJOR, wide, ROW_MAJOR, (9, 0))


def test_a_transposed_output_is_refused():
    with pytest.raises(ValueError, match="cuBLAS writes C in row-major rows"):
        cublas_launcher(Problem(8, 8, 8), ROW_MAJOR, ROW_MAJOR, KernelOperand(True, 8, 0, 0), (9, 0))
