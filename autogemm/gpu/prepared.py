"""A kernel compiled for one problem class with its launch geometry (`PreparedGemm`): what
`launch.prepare` makes and every launcher (`launch`, `tma_launch`) takes."""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.compile import CompiledKernel
from ..families import GemmConfig
from ..problem import Problem


@dataclass
class PreparedGemm:
    """A kernel compiled for one problem class, with its launch geometry."""

    config: GemmConfig
    problem: Problem
    kernel: CompiledKernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    tiles_per_split: int
