"""Operand repacking: the launch stage of configs with `repack`. An A or B whose row pitch, batch
stride or address is not a multiple of the kernel's vector width is copied, before each GEMM
launch, into a per-stream pooled buffer whose pitch is, so the kernel loads every operand at full
width.

Why: an odd pitch (4095x4097x1023 stored densely) forces element-by-element loads, and with them
more instructions and live addresses than the big tiles can afford (they spill or fall back to
small tiles, ~0.7-0.88x cuBLAS on an H100 where the same tiles reach 1.0x on aligned operands).
The copy reads and writes each operand once, a few percent of such a GEMM's time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import dtypes
from .operands import KernelOperand
from .packed_launch import WORKSPACES, compiled_kernel, current_stream_pointer
from ..problem import Problem

REPACK_THREADS = 256
REPACK_GRID_Y_MAX = 65535  # rows per launch step (the kernel loops over the rest)
PITCH_ALIGN_BYTES = 16  # the widest vector any family loads


@dataclass(frozen=True)
class Repacking:
    """How one stored operand is copied: `rows` rows of `length` elements, `matrices` of them,
    into rows of pitch `pitch` (elements), `stride` elements apart (0: one matrix shared by a batch)."""

    rows: int
    length: int
    matrices: int
    pitch: int
    stride: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.matrices * self.rows * self.pitch * self.itemsize


def stored_extent(problem: Problem, operand: str) -> tuple[int, int]:
    """(rows, row length) of A or B as stored: A is M x K (K x M with trans_a), B K x N (N x K)."""
    if operand == "A":
        return (problem.k, problem.m) if problem.trans_a else (problem.m, problem.k)
    return (problem.n, problem.k) if problem.trans_b else (problem.k, problem.n)


def plan_repacking(problem: Problem, operand: str, stored: KernelOperand, vec: int,
                   itemsize: int) -> Repacking | None:
    """How to copy `stored` so that a kernel may load it `vec` elements at a time; None when it
    already can."""
    if stored.vector_width(vec, itemsize) >= vec:
        return None
    rows, length = stored_extent(problem, operand)
    align = max(vec, PITCH_ALIGN_BYTES // itemsize)
    pitch = -(-length // align) * align
    matrices = problem.batch if stored.batch_stride else 1
    return Repacking(rows, length, matrices, pitch, rows * pitch if stored.batch_stride else 0, itemsize)


def repacked(stored: KernelOperand, repacking: Repacking | None) -> KernelOperand:
    """The operand as the kernel reads it after `repacking` (its pointer is set per launch)."""
    if repacking is None:
        return stored
    return replace(stored, ld=repacking.pitch, batch_stride=repacking.stride, pointer=0)


def repacking_launcher(prepared: Any, a: KernelOperand, b: KernelOperand, c: KernelOperand, make_launcher: Any, device: int) -> Any:
    """`launch(pa, pb, pc, alpha, beta, stream)` (an epilogue's pointers after it passed on) that copies
    whichever of A and B needs it into its pooled buffer and then runs `make_launcher(prepared, a', b',
    c, device)` on the copies. A lock
    holds from the copy through the GEMM's launch: two threads sharing a stream must not overwrite
    each other's copies in between."""
    problem, config = prepared.problem, prepared.config
    itemsize = dtypes.lookup(problem.dtype, problem.compute).itemsize
    plans = [plan_repacking(problem, name, stored, config.vec, itemsize) for name, stored in (("A", a), ("B", b))]
    inner = make_launcher(prepared, repacked(a, plans[0]), repacked(b, plans[1]), c, device)
    if plans == [None, None]:
        return inner
    i32, i64, ptr = np.int32, np.int64, np.uintp
    copies = []  # (operand index, kernel, its pointers, source and destination positions, pool purpose, bytes)
    for index, (plan, stored) in enumerate(zip(plans, (a, b))):
        if plan is None:
            continue
        vectors = plan.pitch * itemsize // PITCH_ALIGN_BYTES
        grid = (-(-vectors // REPACK_THREADS), min(plan.rows * plan.matrices, REPACK_GRID_Y_MAX), 1)
        kernel = compiled_kernel(prepared.kernel, "repack", grid, (REPACK_THREADS, 1, 1), 0, dict(
            src=ptr(0), dst=ptr(0), rows=i32(plan.rows), length=i32(plan.length), src_ld=i32(stored.ld),
            src_stride=i64(stored.batch_stride), dst_ld=i32(plan.pitch), dst_stride=i64(plan.stride),
            matrices=i32(plan.matrices)))
        pointers, (src_at, dst_at) = kernel.slots("src", "dst")
        copies.append((index, kernel, pointers, src_at, dst_at, "repack_" + "ab"[index], plan.nbytes))
    lock = threading.Lock()
    get_workspace = WORKSPACES.get

    def launch(pa, pb, pc, alpha, beta, stream=None, *epilogue_pointers):
        stream_pointer = current_stream_pointer(stream)
        operands = [pa, pb]
        with lock:
            for index, kernel, pointers, src_at, dst_at, purpose, nbytes in copies:
                buffer = get_workspace(device, stream_pointer, purpose, nbytes)
                pointers[src_at], pointers[dst_at] = operands[index], buffer
                kernel.launch(stream_pointer)
                operands[index] = buffer
            inner(operands[0], operands[1], pc, alpha, beta, stream, *epilogue_pointers)

    return launch

