"""Kernel families and their registry.

A family is one module with a config class (a knob table, derived sizes, `check`, its template and
render context, vector-width rules, defaults and register model), one template and one search
space. The registry maps family names (as records and search spaces name them) to config classes,
a (dtype, compute) pair to the family that computes it (the `family` column of `dtypes`), and a
problem to the families that declare themselves candidates for it (`GemmConfig.candidate_for`:
the spaces a tune searches). A family defined outside the package joins with `register`, its
templates in its `template_dir`.
"""

from __future__ import annotations
from typing import Any

from .. import dtypes
from ..problem import Device, Problem
from .base import GemmConfig, VectorWidths, widest_vector
from .gemv import GemvConfig
from .hopper import HopperConfig
from .launch_kind import LaunchKind
from .simt import SimtConfig
from .tensor_core import TensorCoreConfig

# Every reason `check` can give starts with one of these codes (the tests produce each one).
REASON_CODES = (
    "dtype",  # the family cannot compute this dtype / compute mode
    "choice",  # a knob has a value outside the family's vocabulary
    "warp-tile",  # block tile not a multiple of the warp tile
    "thread-tile",  # warp tile not a multiple of the thread tile
    "warp-lanes",  # the thread tiles of a warp do not make 32 lanes
    "frag-vector",  # thread tile not a multiple of the shared-memory fragment vector width
    "threads",  # more threads per block than the device allows
    "tile-load",  # a tile does not split evenly into the block's vector loads
    "shared-memory",  # more shared memory than the device grants one block
    "registers",  # the thread's register arrays would not fit without spilling
    "occupancy",  # min_blocks blocks cannot share one SM (threads, shared memory)
    "cp-async",  # multi-stage pipelines need cp.async (compute capability 8.0)
    "split-k",  # more K splits than K tiles
    "grid",  # the launch grid exceeds the device's grid limits
    "size",  # a dimension exceeds 32-bit indexing
    "fragment",  # a tile is not a multiple of the tensor-core fragment shape
    "tensor-core",  # the device has no tensor-core instruction for this type
    "layout",  # the instruction cannot read the operands in this layout
    "cluster",  # thread-block clusters need compute capability 9.0
)

_FAMILIES: dict[str, type[GemmConfig]] = {}


def register(config_class: type[GemmConfig]) -> type[GemmConfig]:
    """Adds a family (its config class); returns it, so that it can decorate the class."""
    existing = _FAMILIES.get(config_class.family)
    if existing is not None and existing is not config_class:
        raise ValueError(f"a family named {config_class.family!r} is already registered ({existing.__name__})")
    _FAMILIES[config_class.family] = config_class
    return config_class


register(SimtConfig)
register(TensorCoreConfig)
register(GemvConfig)
register(HopperConfig)


def get(family: str) -> type[GemmConfig]:
    try:
        return _FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown config family {family!r}; known: {', '.join(_FAMILIES)}") from None


def all_families() -> tuple[type[GemmConfig], ...]:
    return tuple(_FAMILIES.values())


def family_for(dtype: str, compute: str = "") -> type[GemmConfig]:
    """The family that computes this dtype and compute mode."""
    return get(dtypes.lookup(dtype, compute).family)


def candidate_families(problem: Problem, device: Device | None = None) -> tuple[type[GemmConfig], ...]:
    """The families each of which declares itself a candidate for `problem` on `device`
    (`GemmConfig.candidate_for`), in their `candidate_order` (the registry's order among equals), less
    those another candidate supersedes there (`GemmConfig.supersedes`: on sm_90, Hopper's 16-bit kernels
    the tensor-core family's). A grouped
    product's are those whose kernels take groups (`takes_grouped`): the others' spaces would spend their
    share of the budget on configs that refuse it."""
    candidates = [family for family in _FAMILIES.values() if family.candidate_for(problem, device)
                  and (family.takes_grouped or not problem.grouped)]
    superseded = {name for family in candidates for name in family.supersedes(problem, device)}
    candidates = [family for family in candidates if family.family not in superseded]
    return tuple(sorted(candidates, key=lambda family: family.candidate_order))


def config_from_dict(data: dict[str, Any], ranges: bool = True) -> GemmConfig:
    """A configuration of any family from its dict form (`to_dict()`, or a record's), every knob of
    its exact type and (unless `ranges` is false) in its range; ValueError otherwise."""
    if not isinstance(data, dict):
        raise ValueError(f"a config must be an object of knobs, got {type(data).__name__}")
    family = data.get("family", SimtConfig.family)
    if not isinstance(family, str):
        raise ValueError(f"config family must be a string, got {family!r}")
    return get(family).from_dict(data, ranges)


def config_from_name(name: str, ranges: bool = True) -> GemmConfig:
    """A configuration of any family from its name; families are told apart by their name prefix.
    ValueError if no family reads it, or (unless `ranges` is false) it names values out of range."""
    candidates = sorted((f for f in _FAMILIES.values() if name.startswith(f.name_prefix)),
                        key=lambda f: len(f.name_prefix), reverse=True)
    first_error = None
    for family in candidates:
        try:
            return family.from_name(name, ranges)
        except ValueError as exc:
            first_error = first_error or exc
    raise first_error or ValueError(f"not a config name of any family: {name!r}")


__all__ = ["GemmConfig", "GemvConfig", "HopperConfig", "LaunchKind", "REASON_CODES", "SimtConfig", "TensorCoreConfig",
           "VectorWidths", "all_families", "candidate_families", "config_from_dict", "config_from_name", "family_for",
           "get", "register", "widest_vector"]
