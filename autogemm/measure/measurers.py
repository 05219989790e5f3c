"""Which measurer measures a problem (`measurer_for`): the measuring process's one entry point, so that
the evaluator, the isolated measuring process and `cache retime` agree on it."""

from __future__ import annotations

from ..problem import Device, Problem
from .grouped_measuring import GroupedMeasurer
from .measuring import GpuMeasurer
from .scaled_measuring import ScaledMeasurer


def measurer_for(problem: Problem, device: Device, seed: int = 0) -> GpuMeasurer:
    """GroupedMeasurer for a grouped product, ScaledMeasurer for an FP8 one, GpuMeasurer for the others."""
    if problem.grouped:
        return GroupedMeasurer(problem, device, seed)
    if problem.epilogue.scale:
        return ScaledMeasurer(problem, device, seed)
    return GpuMeasurer(problem, device, seed)
