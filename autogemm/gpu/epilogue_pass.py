"""The unfused epilogue pass (templates/epilogue.cu.j2), compiled and launched: what follows a GEMM that
cannot apply an epilogue itself (cuBLAS), in one pass over its product. Its grid, the columns a
thread takes (16-byte packs where N, the pitches and the addresses allow), the kernels loaded once per
process, and its arguments by name. Serving runs it after cuBLAS (serving/epilogue_step.py); tuning
times it as part of the baseline an epilogue kernel must beat (measure/measuring.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .. import dtypes
from ..epilogue import Epilogue
from ..kernels.compile import compile_source
from ..kernels.render import render_epilogue
from . import capture, runtime
from .launch import device_info
from .packed_launch import compiled_kernel

THREADS = 256  # per block of the epilogue kernel: along a row's columns
BLOCKS_PER_SM = 8  # enough blocks in flight to keep the memory system busy, few enough to loop
MAX_GRID_Y = 65535  # rows of blocks (CUDA's limit on grid y; the kernel loops over the rest)


def grid(rows: int, n: int, sms: int, vector: int = 1) -> tuple[int, int, int]:
    """The epilogue kernel's grid for `rows` rows (batch × M) of `n` columns, `vector` columns a
    thread: blocks along a row to cover it, rows of blocks up to BLOCKS_PER_SM blocks an SM in all
    (the loops cover the rest)."""
    across = -(-n // (THREADS * vector))
    down = max(1, min(rows, MAX_GRID_Y, sms * BLOCKS_PER_SM // across))
    return across, down, 1


def vector_width(dtype: str, epilogue: Epilogue, n: int, pitches: Any, pointers: Any) -> int:
    """The columns a thread of the epilogue kernel takes (render_epilogue's `vector`): 16 bytes of the
    product's and D's wider type where `n` (D's columns) and every pitch and batch stride in `pitches`
    (elements) are multiples of it and every `(address, itemsize)` in `pointers` is aligned to it; halved
    until they are, down to 1."""
    widest = max(dtypes.lookup(dtype).itemsize, dtypes.lookup(epilogue.output_dtype(dtype)).itemsize)
    vector = 16 // widest
    while vector > 1 and (n % vector or any(pitch % vector for pitch in pitches)
                          or any(address % (vector * size) for address, size in pointers)):
        vector //= 2
    return vector


_kernels: dict[tuple[str, str, int, int], object] = {}  # (dtype, epilogue key, device, vector) -> the loaded kernel
_kernels_lock = threading.Lock()


def compiled(dtype: str, epilogue: Epilogue, device: int, vector: int = 1) -> Any:
    """The epilogue kernel for products of `dtype` (`vector` columns a thread), compiled and loaded on
    GPU `device` once per process (a CompiledKernel). Under a CUDA graph capture only one loaded
    before serves (compiling inside one is refused)."""
    key = (dtype, epilogue.key, device, vector)
    with _kernels_lock:
        found = _kernels.get(key)
    if found is not None:
        return found
    cupy = runtime.cupy()
    if capture.capturing(cupy.cuda.get_current_stream().ptr):
        raise capture.require_plan(f"the epilogue {epilogue} of {dtype} products")
    loaded = compile_source(render_epilogue(dtype, epilogue, vector), device_info(device).arch, 0)
    with _kernels_lock:
        return _kernels.setdefault(key, loaded)


def pass_arguments(dtype: str, batch: int, m: int, n: int, ldp: int, stride_p: int, ldd: int, stride_d: int,
               beta: float, ldr: int, stride_r: int) -> dict[str, Any]:
    """The epilogue kernel's arguments by name (templates/epilogue.cu.j2), its pointers 0: C is D
    (beta · C read from D before D is written), D of `n` columns (the product's 2n where gated)."""
    i32, i64, ptr = np.int32, np.int64, np.uintp
    acc = np.dtype(dtypes.lookup(dtype).accumulator_storage).type
    return dict(P=ptr(0), D=ptr(0), C=ptr(0), M=i32(m), N=i32(n), batch=i32(batch), ldp=i32(ldp),
                stride_p=i64(stride_p), ldd=i32(ldd), stride_d=i64(stride_d), ldc=i32(ldd), stride_c=i64(stride_d),
                beta=acc(beta), bias=ptr(0), residual=ptr(0), ldr=i32(ldr), stride_r=i64(stride_r))


def pass_kernel(dtype: str, epilogue: Epilogue, device: int, batch: int, m: int, n: int, ldp: int, stride_p: int,
                ldr: int, stride_r: int, vector: int) -> Any:
    """The pass packed once (`packed_launch.PackedKernel`, its pointers P, D, C, bias and residual set
    per launch) for `batch` products of m × n (pitch `ldp`, batch stride `stride_p`) written to a
    C-contiguous D of the same shape (C is D, beta 0), the residual of pitch `ldr` and batch stride
    `stride_r`."""
    return compiled_kernel(compiled(dtype, epilogue, device, vector), "gemm",
                           grid(batch * m, n, device_info(device).sm_count, vector), (THREADS, 1, 1), 0,
                           pass_arguments(dtype, batch, m, n, ldp, stride_p, n, m * n, 0.0, ldr, stride_r))
