"""Fixed, diverse samples of configurations shared by the render, nvcc and GPU tests."""

from __future__ import annotations

import random

from autogemm.config import SimtConfig
from autogemm.problem import Device, Problem
from autogemm.space import SearchSpace

# Config fields whose every value the samples must contain (the tile shapes vary by themselves).
COVERAGE = {
    "bk": (4, 8, 16, 32),
    "vec": (1, 2, 4),
    "vec_frag": (1, 2, 4),
    "stages": (1, 2, 3, 4),
    "smem": ("plain", "pad", "swizzle"),
    "group_m": (1, 2, 4, 8, 16),
    "split_k": (1, 2, 4, 8),
    "min_blocks": (1, 2, 3, 4),
    "transpose": ("async", "registers"),
    "stream_k": (False, True),
}
# max_registers is covered by the sampled space (several of its trims turn up in every sample).

# Hand-picked configurations that the benchmarks lean on; always part of the samples.
REFERENCE_CONFIGS = (
    SimtConfig(128, 128, 8, 32, 64, 8, 8, 4, 4, 2, "pad", 8, 1),
    SimtConfig(128, 256, 8, 64, 64, 8, 16, 4, 4, 2, "pad", 8, 1),
    SimtConfig(128, 128, 16, 64, 32, 8, 8, 4, 4, 3, "swizzle", 8, 1),
    SimtConfig(64, 64, 16, 32, 32, 4, 8, 4, 4, 4, "pad", 4, 2),
    SimtConfig(64, 128, 16, 32, 64, 8, 8, 4, 4, 3, "pad", 8, 1, 1, "registers"),
)

SAMPLE_PROBLEM = Problem(4096, 4096, 4096)
# The GPU tests run every sampled config on shapes with tails in every layout; a config the
# register model rejects there would be left with too few cases to run.
TAIL_PROBLEMS = (Problem(255, 257, 1023), Problem.from_layout(255, 257, 1023, "tt"))


def _runs_everywhere(config, device: Device) -> bool:
    return not any(config.check(p, device) for p in (SAMPLE_PROBLEM, *TAIL_PROBLEMS))


def diverse_sample(count: int, seed: int, device: Device | None = None) -> list[SimtConfig]:
    """`count` random configs valid on the sample problem and on tails, plus the reference ones,
    topped up so that every value of every knob in COVERAGE appears at least once."""
    device = device or Device.for_arch("sm_90")
    space = SearchSpace.load()
    chosen = {c.name: c for c in REFERENCE_CONFIGS}
    # Three in four sampled configs would carry an explicit register cap (three of the space's
    # four register trims); keep it on every fourth only, so that most run at the automatic cap.
    sampled = space.sample(3 * count, SAMPLE_PROBLEM, device, seed=seed)
    sampled = [c if i % 4 == 0 else c.replace(max_registers=0) for i, c in enumerate(sampled)]
    runnable = [c for c in sampled if space.contains(c) and _runs_everywhere(c, device)]
    for config in runnable[:count]:
        chosen.setdefault(config.name, config)
    rng = random.Random(seed)
    pool = list(chosen.values())
    for knob, values in COVERAGE.items():
        for value in values:
            if any(getattr(c, knob) == value for c in chosen.values()):
                continue
            for base in rng.sample(pool, len(pool)):
                candidate = base.replace(**{knob: value})
                if space.contains(candidate) and _runs_everywhere(candidate, device):
                    chosen[candidate.name] = candidate
                    break
            else:
                raise AssertionError(f"no valid config found with {knob}={value}")
    return sorted(chosen.values(), key=lambda c: c.name)
