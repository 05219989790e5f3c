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

BLOCK_WIDTHS = (128, 64, 32)  # threads a block of the pass may have, along a row's columns (blocks of 256 ran
# 0-9% slower than blocks of 128 over the same packs on an H200, on six 16-bit GELU and SiLU outputs: session 76)
THREADS_PER_SM = 2048  # resident threads an SM holds (sm_80 and sm_90; 1536 on sm_86 and sm_89, which
# makes the grid a little wider than it needs to be there)
IDLE_SHARE = 1 / 8  # of a row's thread slots, idle at its end (block_width)
WAVES = 1  # blocks enough for a round of every SM where a row has packs enough for them (two rounds, a pack a
# thread, ran 5-20% slower than one of up to PACKS_PER_THREAD a thread at 256 and 1024 rows of 18176-27648 columns)
PACKS_PER_THREAD = 4  # a thread's packs of a row, at most, where the rows alone fill the GPU (a block sweeping a
# row of 14336 columns, 7 packs a thread, ran 4% slower than blocks of 4: session 76)
MAX_GRID_Y = 65535  # rows of blocks (CUDA's limit on grid y; the kernel loops over the rest)


def block_width(n: int, vector: int = 1) -> int:
    """Threads of a block of the pass over rows of `n` columns, `vector` a thread: the widest of
    BLOCK_WIDTHS whose passes along a row leave at most IDLE_SHARE of their thread slots idle at the row's
    end, else the one that leaves the smallest share. (64 columns of 8 fill a block of 64 threads, and leave
    half of 128 threads' slots idle.)"""
    packs = -(-n // vector)

    def idle(threads: int) -> float:
        slots = -(-packs // threads) * threads
        return (slots - packs) / slots

    return next((threads for threads in BLOCK_WIDTHS if idle(threads) <= IDLE_SHARE),
                min(BLOCK_WIDTHS, key=lambda threads: (idle(threads), -threads)))


def launch_shape(rows: int, n: int, sms: int, vector: int = 1) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """The pass's grid and block for `rows` rows (batch × M) of `n` columns, `vector` a thread: blocks of
    `block_width(n, vector)` threads along a row, each thread taking a pack of columns after another (a row's
    setup paid once for them all), at most PACKS_PER_THREAD of them; more blocks along a row where the rows
    are too few for WAVES rounds of blocks on every SM (prefill products of a few hundred tokens, decode
    ones), as many as the row's packs allow. Beyond grid y's limit the blocks loop over the rows. One
    function gives both, so that the grid is always worked out for the block the pass runs. (On an H200,
    26 GELU and SiLU outputs of 1 to 8192 rows ran 1.026x faster geomean than on session 75's shapes, 0.968x
    to 1.161x; FP16 256 × 18176 behind its GEMM took 7.4 us against PyTorch's GELU's 7.5, where it had taken
    9.4.)"""
    threads = block_width(n, vector)
    along = -(-n // (threads * vector))  # blocks that would take a row one pack a thread
    fill = sms * THREADS_PER_SM // threads  # blocks on every SM at once (for 32 threads, more than
    # an SM holds, but such blocks come only with rows short enough for one block)
    across = max(-(-along // PACKS_PER_THREAD), min(along, -(-WAVES * fill // rows)))
    packs = -(-along // across)  # a thread's packs of a row
    return (-(-along // packs), min(rows, MAX_GRID_Y), 1), (threads, 1, 1)


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


class PointedPass:
    """The pass packed once (`packed_launch.PackedKernel`) and launched on the pointers of a call: the
    product P, D (C is D: beta 0), the bias and the residual (0: none). The packed arguments are one block
    that every thread's call rewrites, so setting them and launching is done under a lock."""

    def __init__(self, packed: Any):
        self.packed = packed
        self.pointers, (self.p_at, self.d_at, self.c_at, self.bias_at, self.residual_at) = packed.slots(
            "P", "D", "C", "bias", "residual")
        self.lock = threading.Lock()

    def launch(self, stream: int, product: int, d: int, bias: int, residual: int) -> None:
        with self.lock:
            pointers = self.pointers
            pointers[self.p_at], pointers[self.d_at], pointers[self.c_at] = product, d, d
            pointers[self.bias_at], pointers[self.residual_at] = bias, residual
            self.packed.launch(stream)

    def description(self) -> tuple | None:
        """`PackedKernel.description` and, last, the byte offsets of the pointers P, D, C, bias and residual in
        its arguments' bytes, which a launch rewrites (None where the kernel cannot be described so)."""
        described = self.packed.description()
        if described is None:
            return None
        size = self.pointers.dtype.itemsize
        return (*described, tuple(at * size for at in (self.p_at, self.d_at, self.c_at, self.bias_at,
                                                        self.residual_at)))


def pass_kernel(dtype: str, epilogue: Epilogue, device: int, batch: int, m: int, n: int, ldp: int, stride_p: int,
                ldr: int, stride_r: int, vector: int) -> PointedPass:
    """The pass packed once for `batch` products of m × n (pitch `ldp`, batch stride `stride_p`) written to a
    C-contiguous D of the same shape (C is D, beta 0), the residual of pitch `ldr` and batch stride
    `stride_r`; a call's pointers are given at its launch."""
    grid, block = launch_shape(batch * m, n, device_info(device).sm_count, vector)
    return PointedPass(compiled_kernel(compiled(dtype, epilogue, device, vector), "gemm", grid, block, 0,
                                       pass_arguments(dtype, batch, m, n, ldp, stride_p, n, m * n, 0.0, ldr, stride_r)))
