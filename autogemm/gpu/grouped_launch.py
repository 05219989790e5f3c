"""The launch of a grouped product (`bind_grouped`): the rows of A split into groups by E + 1 offsets on the
GPU, each group times its own K x N matrix of B, into its rows of C, in one launch of a Hopper kernel
(`templates/hopper_gemm.cu.j2`, `grouped`).

A is (total_M, K) row-major, B (E, K, N) with N contiguous or the transpose of a contiguous (E, N, K)
weight (K contiguous), C (total_M, N) row-major; addresses are given as integers (a tensor's data_ptr(), a
CuPy array's data.ptr), so that the caller keeps its arrays and streams. The offsets are read by the kernel
only: from 0, non-decreasing, to total_M, or the kernel reads and writes out of bounds (the serving layer
checks what it can without a host sync)."""

from __future__ import annotations
from typing import Any

from ..families import GemmConfig
from ..families.hopper import TMA_ALIGN_BYTES
from ..problem import Device, Problem
from .launch import launcher, prepare
from .operands import KernelOperand

GROUPED_DTYPES = ("float16", "bfloat16")  # what grouped kernels are tuned and served for


def grouped_problem(total_m: int, n: int, k: int, groups: int, dtype: str, b_k_major: bool,
                    routing: str = "uniform") -> Problem:
    """The Problem of a grouped product: `groups` groups of `total_m` rows in all, routed as `routing`
    (routing.ROUTINGS) says."""
    return Problem(total_m, n, k, batch=groups, dtype=dtype, trans_b=b_k_major, grouped=True, routing=routing)


def grouped_launcher(config: GemmConfig, problem: Problem, device: Device | None = None, ordinal: int | None = None) -> Any:
    """`launch(pa, pb, poffsets, pc, stream=None)` of `config`'s grouped kernel for `problem` (`grouped_problem`),
    compiled once, for arrays at TMA_ALIGN_BYTES-aligned addresses given at each launch (offsets: int32).
    `device`, `ordinal`: the GPU (None: the current one)."""
    if not problem.grouped:
        raise ValueError(f"{problem} is not a grouped product (grouped_problem makes one)")
    n, k = problem.n, problem.k
    a = KernelOperand(False, k, 0, 0)  # one matrix for every group: its rows are split by the offsets
    b = KernelOperand(problem.trans_b, k if problem.trans_b else n, k * n, 0)  # a matrix per group
    c = KernelOperand(False, n, 0, 0)  # one matrix: each group's rows start at its offset
    widths = config.vector_widths(a, b, c, 1)
    launch = launcher(prepare(config, problem, widths, device), a, b, c, ordinal=ordinal)

    def run(pa: int, pb: int, poffsets: int, pc: int, stream=None):
        launch(pa, pb, pc, 1.0, 0.0, stream, 0, 0, 0, 0, poffsets)

    return run


def bind_grouped(config: GemmConfig, problem: Problem, a_ptr: int, b_ptr: int, offsets_ptr: int, c_ptr: int) -> Any:
    """Compiles `config`'s grouped kernel for `problem` (`grouped_problem`) and returns `run(stream=None)`,
    which computes C's rows group by group from the arrays at these addresses (offsets: int32)."""
    if (a_ptr | b_ptr | c_ptr) % TMA_ALIGN_BYTES:
        raise ValueError(f"a grouped kernel reads A and B and writes C through TMA: their addresses must be "
                         f"{TMA_ALIGN_BYTES}-byte aligned")
    launch = grouped_launcher(config, problem)

    def run(stream=None):
        launch(a_ptr, b_ptr, offsets_ptr, c_ptr, stream)

    return run
