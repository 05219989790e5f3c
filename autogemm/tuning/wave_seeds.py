"""The configurations a new study tries before the sampler's own: for each work-tile shape the space
offers (rows, columns, K splits, ping-pong, swapped roles), one complete configuration, ranked by how
well its work fills the GPU (families/waves.py). A blind sampler finds a tile that fills 132 SMs on
640 x 4096 by luck; the ranking puts it first.

A tile shape is completed with the knobs that cost nothing to guess: slices of K one swizzled row wide,
the most stages that fit (up to PREFERRED_STAGES), group_m 8, a persistent grid, the TMA store, a GELU or
SiLU epilogue's fast forms, a bias or residual loaded ahead, a cluster of two where the row tiles pair up
(not for ping-pong tiles); then, where `check` refuses that, with those knobs relaxed one by one.
"""

from __future__ import annotations

import itertools
from typing import Any

from .. import dtypes
from ..families.waves import fill, relative_cost, work_shape
from ..kernels.space import SearchSpace
from ..problem import Device, Problem

WAVE_SEEDS = 6  # configurations enqueued, best first
# the knobs that decide a work tile's shape and how the work is dealt out (searched in every combination)
SHAPE_KNOBS = ("consumers", "wm", "bn", "split_k", "stream_k", "pingpong", "swap")
PREFERRED_STAGES = 5
# (fast_activation: offered only to GELU and SiLU epilogues, whose cheaper forms cost the store less; preload:
# offered only to epilogues with a bias or a residual, which it loads ahead of the store, through TMA or not)
PREFERRED = {"group_m": 8, "persistent": True, "tma_store": True, "fast_activation": True, "preload": True}
# relaxed in this order where `check` refuses a completion (each to the space's other choices)
RELAXED = ("preload", "cluster", "tma_store", "persistent", "group_m", "bk")


def wave_ranked(space: SearchSpace, problem: Problem, device: Device, count: int = WAVE_SEEDS) -> list[Any]:
    """Up to `count` valid configurations of `space` for `problem`, one per work-tile shape, lowest
    `relative_cost` first (ties: the fuller last wave). Empty for a family that is not seeded so
    (`seeds_by_waves`: the GEMV family's products are memory-bound, not a matter of waves)."""
    if not space.config_class.seeds_by_waves:
        return []
    choices = space.knob_choices(problem, device)
    shape_knobs = [k for k in SHAPE_KNOBS if k in choices]
    if "bn" not in shape_knobs:
        return []
    ranked: dict[tuple[Any, ...], tuple[float, float, Any]] = {}
    for shape in itertools.product(*(choices[k] for k in shape_knobs)):
        config = _completed(space, dict(zip(shape_knobs, shape)), choices, problem, device)
        if config is None:
            continue
        key = work_shape(config, problem, device)
        entry = (relative_cost(config, problem, device), -fill(config, problem, device).efficiency, config)
        if key not in ranked or entry[:2] < ranked[key][:2]:
            ranked[key] = entry
    return [config for _, _, config in sorted(ranked.values(), key=lambda e: e[:2])[:count]]


def _completed(space: SearchSpace, shape: dict[str, Any], choices: dict[str, tuple[Any, ...]], problem: Problem,
               device: Device) -> Any | None:
    """The tile shape completed with the preferred knobs (relaxed one by one, then with fewer
    stages, where the config's check refuses it), or None where none of those is valid."""
    base = {knob: values[0] for knob, values in choices.items()}
    for knob, value in PREFERRED.items():
        if knob in choices and value in choices[knob]:
            base[knob] = value
    # a slice of K one swizzled row wide (the family's TMA box row: 64 16-bit elements), where the space offers it
    row_bytes = getattr(space.config_class, "swizzle_row_bytes", 0)
    row_elements = row_bytes // dtypes.lookup(problem.dtype, problem.compute).itemsize
    if row_elements in choices.get("bk", ()):
        base["bk"] = row_elements
    base.update(shape)
    # pairs where the row tiles pair up evenly; not for ping-pong tiles, which ran slower in pairs on an H200
    # (BF16 4096 x 13824 x 5120, sustained: 256 x 128 ping-pong with 4 stages 894.5 us alone, 949.8 in pairs;
    # with 5 stages 899.0 and 903.8, fused with a bias and SiLU 910.6 and 921.4)
    if "cluster" in choices and 2 in choices["cluster"] and not shape.get("pingpong"):
        probe, _ = space.evaluate({**base, "cluster": 1}, problem, device)
        # (a probe that its check refuses, a swap of a product with no swapped form say, decides nothing)
        if probe is not None and not probe.check(problem, device):
            rows = fill(probe, problem, device).tile[0]
            kernel = probe.kernel_problem(problem)
            base["cluster"] = 2 if -(-kernel.m // rows) % 2 == 0 else 1
    stages = sorted((s for s in choices.get("stages", ()) if s <= PREFERRED_STAGES), reverse=True) or [None]
    # each knob relaxed alone first (a tile that refuses the TMA store keeps its cluster), then cumulatively
    others = {knob: next(v for v in choices[knob] if v != base.get(knob)) for knob in RELAXED
              if knob in choices and len(choices[knob]) > 1}
    attempts = [dict(base)] + [{**base, knob: value} for knob, value in others.items()]
    relaxed = list(others.items())
    for count in range(2, len(relaxed) + 1):  # (the first alone is tried above)
        attempts.append({**base, **dict(relaxed[:count])})
    for values in attempts:
        for stage_count in stages:
            draw = dict(values) if stage_count is None else {**values, "stages": stage_count}
            config, broken = space.evaluate(draw, problem, device)
            if config is not None and not config.check(problem, device):
                return config
    return None
