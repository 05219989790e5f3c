"""The launch of a scaled FP8 product on CuPy arrays (`bind_scaled`): D = scale_a · scale_b · (A @ Bᵀ)
(+ bias), A stored M × K and B stored N × K (both K-major, as wgmma reads 8-bit types; torch's
`_scaled_mm(a, b)` takes the same memory as a row-major a and a column-major b), D M × N row-major in
one of the dtypes FP8 products are written as. CuPy has no FP8 type: A and B are uint8 arrays of the
named FP8 type's bits (`autogemm.fp8`).

Scales are FP32 device arrays, read by the kernel: one value each (per tensor), M values for A's rows
and N for B's columns (per row), or one per row of A and 128 of K and one per 128 x 128 block of B (per
block: (M, ceil(K/128)) and (ceil(K/128), ceil(N/128)), row-major or both in torch's outer-dimension-major
layout). Every argument is checked before anything is compiled or
launched, and a fault is named (shape, dtype, layout, alignment).
"""

from __future__ import annotations
from typing import Any

import numpy as np

from .. import dtypes, fp8
from ..epilogue import BLOCK, Epilogue
from ..families import GemmConfig
from ..problem import Problem
from . import runtime
from .launch import launcher, prepare
from .operands import KernelOperand

ALIGN_BYTES = 16  # the address TMA reads an operand from; A's and B's pitches (K bytes) likewise


def scaling_of(m: int, n: int, k: int, scale_a: Any, scale_b: Any) -> str:
    """"tensor", "row" or "block" by the scales' shapes (ValueError naming them where they are none)."""
    shape_a, shape_b = tuple(scale_a.shape), tuple(scale_b.shape)
    size_a, size_b = int(np.prod(shape_a)), int(np.prod(shape_b))
    if size_a == 1 and size_b == 1:
        return "tensor"
    if size_a == m and size_b == n and shape_a in ((m,), (m, 1)) and shape_b in ((n,), (1, n)):
        return "row"
    blocks_k, blocks_n = -(-k // BLOCK), -(-n // BLOCK)
    if shape_a == (m, blocks_k) and shape_b == (blocks_k, blocks_n):
        return "block"
    raise ValueError(f"scales must be one value each (per tensor); M = {m} for A's rows, shaped (M, 1), and N = {n} "
                     f"for B's columns, shaped (1, N) (per row); or ({m}, {blocks_k}) for A's rows by 128 of K and "
                     f"({blocks_k}, {blocks_n}) for B's 128 x 128 blocks (per block); got shapes {shape_a} and {shape_b}")


def _contiguous(scale, tensors: bool) -> bool:
    """Whether a scale array is row-major (contiguous). `tensors`: a PyTorch tensor, else a CuPy (or NumPy) array."""
    return scale.is_contiguous() if tensors else scale.flags.c_contiguous


def block_scales_layout(scale_a: Any, scale_b: Any, tensors: bool) -> str | None:
    """How a pair of 2-D block scales lies, as the kernels read it (`scales_outer`): "row" (both row-major),
    "outer" (both in torch's outer-dimension-major layout, the transposes of row-major arrays, which
    torch._scaled_mm reads), or None (neither: they would need a copy). An array with a dimension of one
    lies the same both ways and goes with either. `tensors`: PyTorch tensors, else CuPy (or NumPy) arrays."""
    def layouts(scale) -> set[Any]:
        row, outer = _contiguous(scale, tensors), _contiguous(scale.t() if tensors else scale.T, tensors)
        return {name for name, holds in (("row", row), ("outer", outer)) if holds}

    common = layouts(scale_a) & layouts(scale_b)
    return "row" if "row" in common else "outer" if "outer" in common else None


def scales_outer(scale_a: Any, scale_b: Any, scaling: str, tensors: bool) -> bool:
    """Whether the scales are block scales in torch's outer-dimension-major layout (the kernels' `scales_outer`).
    ValueError, naming both scales' strides, where they lie neither contiguous (row-major) nor, for block
    scales, both in torch's layout. `tensors`: PyTorch tensors, else CuPy (or NumPy) arrays."""
    layout = block_scales_layout(scale_a, scale_b, tensors) if scaling == "block" else None
    if layout is None and not all(_contiguous(scale, tensors) for scale in (scale_a, scale_b)):
        strides = [tuple(scale.stride()) if tensors else scale.strides for scale in (scale_a, scale_b)]
        raise ValueError("scale_a and scale_b must be contiguous" + (
            " (row-major), or both in torch's outer-dimension-major layout (the transposes of row-major "
            "arrays)" if scaling == "block" else "") + f"; got strides {strides[0]} and {strides[1]}")
    return layout == "outer"


def scaled_problem(m: int, n: int, k: int, dtype: str, scaling: str, out_dtype: str, bias: bool) -> Problem:
    """The Problem of a scaled product: layout NT (A M × K, B N × K), the scaling, D's dtype and a bias
    along N in its epilogue."""
    return Problem(m, n, k, dtype=dtype, trans_b=True,
                   epilogue=Epilogue(scale=scaling, bias="n" if bias else "", out_dtype=out_dtype))


def _check_operand(x, name: str, rows_name: str) -> tuple[int, int]:
    cupy = runtime.cupy()
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name} must be a CuPy array of FP8 bits (uint8), got {type(x).__name__}")
    if x.dtype.itemsize != 1:
        raise TypeError(f"{name} must hold FP8 bits (uint8, one byte an element), got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be a matrix ({rows_name} × K), got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be stored {rows_name} × K, rows contiguous (K-major: wgmma reads FP8 so); "
                         f"got strides {x.strides}")
    if x.data.ptr % ALIGN_BYTES:
        raise ValueError(f"{name}'s address must be a multiple of {ALIGN_BYTES} bytes (TMA), got {x.data.ptr:#x}")
    return x.shape


def bind_scaled(config: GemmConfig, a: Any, b: Any, scale_a: Any, scale_b: Any, *, dtype: str, out_dtype: str = "bfloat16", bias: Any = None,
                out: Any = None) -> Any:
    """Validates the arguments, compiles `config`'s kernel and returns (run, d): `run(stream=None)`
    computes D = scale_a · scale_b · (A @ Bᵀ) (+ bias, N values of D's dtype) into d (`out`, or a new
    array of D's dtype; bfloat16 as ml_dtypes' type, or given as uint16 bits)."""
    cupy = runtime.cupy()
    if dtype not in fp8.FP8_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not an FP8 type; choose {' or '.join(fp8.FP8_DTYPES)}")
    m, k = _check_operand(a, "a", "M")
    n, k_b = _check_operand(b, "b", "N")
    if k_b != k:
        raise ValueError(f"a is {m} × {k} and b {n} × {k_b}: both are stored K-major, so their K must match")
    for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(scale, cupy.ndarray) or scale.dtype != np.float32:
            raise TypeError(f"{name} must be a float32 CuPy array on the GPU, got "
                            f"{getattr(scale, 'dtype', type(scale).__name__)}")
    scaling = scaling_of(m, n, k, scale_a, scale_b)
    outer = scales_outer(scale_a, scale_b, scaling, tensors=False)  # (block scales are read as they lie)
    problem = scaled_problem(m, n, k, dtype, scaling, out_dtype, bias is not None)
    storage = dtypes.lookup(out_dtype).storage
    held = {np.dtype(storage), runtime.numpy_dtype(out_dtype)}  # (bfloat16: ml_dtypes' type, or its bits as uint16)
    if bias is not None and (not isinstance(bias, cupy.ndarray) or bias.shape != (n,) or bias.dtype not in held):
        raise ValueError(f"bias must be a CuPy vector of N = {n} values of D's dtype {out_dtype}; "
                         f"got {getattr(bias, 'shape', type(bias).__name__)} {getattr(bias, 'dtype', '')}")
    if out is None:
        out = cupy.empty((m, n), dtype=runtime.numpy_dtype(out_dtype))
    elif not isinstance(out, cupy.ndarray) or out.shape != (m, n) or out.dtype not in held \
            or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous CuPy array of shape ({m}, {n}) and D's dtype {out_dtype}")
    a_operand = KernelOperand(False, k, 0, a.data.ptr)
    b_operand = KernelOperand(True, k, 0, b.data.ptr)
    d_operand = KernelOperand(False, n, 0, out.data.ptr)
    widths = config.vector_widths(a_operand, b_operand, d_operand, 1)
    launch = launcher(prepare(config, problem, widths), a_operand, b_operand, d_operand)
    pointers = (a.data.ptr, b.data.ptr, out.data.ptr)
    pbias = bias.data.ptr if bias is not None else 0

    def run(stream=None):
        launch(*pointers, 1.0, 0.0, stream, pbias, 0, scale_a.data.ptr, scale_b.data.ptr, 0, outer)

    return run, out


def torch_scales(torch: Any, scale_a: Any, scale_b: Any, scaling: str) -> Any:
    """The scales (tensors) as torch._scaled_mm takes them for `scaling`: per tensor as scalars; per row as
    given; per block in its outer-dimension-major layout (the transposes of row-major (M, K/128) and
    (K/128, N/128) arrays, as cuBLASLt reads block scales), copied where they are not."""
    if scaling == "tensor":
        return scale_a.reshape(()), scale_b.reshape(())
    if scaling == "block":
        return scale_a.t().contiguous().t(), scale_b.t().contiguous().t()
    return scale_a, scale_b


def torch_takes(scaling: str, k: int, n: int) -> bool:
    """Whether torch._scaled_mm computes a product of this scaling, K and N: every scaling, but block scales
    only where K and N are multiples of 128 (with a tail it gives wrong results without a word: a 256 x 384 x
    272 product was off by 35% on an H100 with torch 2.11)."""
    return scaling != "block" or (k % BLOCK == 0 and n % BLOCK == 0)


# the kernel of a block-scaled product that nothing tuned serves where torch._scaled_mm does not (a tail of K or N)
DEFAULT_BLOCK_CONFIG = "hopper_128x128x128_w64x128_s4_g8_k1_o1_p"
