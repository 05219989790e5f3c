"""Fixed samples of configurations shared by the render, compile and GPU tests.

- `covering_sample`: valid (config, problem) pairs such that every pair of values of two features
  (each knob, the layout, which dimensions have tails) that occurs among many valid draws of a
  space occurs in the sample: interactions between any two knobs are rendered, at a small
  fraction of the space's size.
- `diverse_sample` (SIMT) and `tensor_core_sample`: configs valid on a large problem, topped up so
  that every value of the knobs that shape the kernel appears.
"""

from __future__ import annotations

import itertools
import random

from autogemm.families import SimtConfig, TensorCoreConfig
from autogemm.problem import LAYOUTS, Device, Problem
from autogemm.kernels.space import SearchSpace

# (dtype, compute, shipped space) of every shipped space
KINDS = (
    ("float32", "fp32", "simt"),
    ("float16", "fp32", "wmma_fp16"),
    ("bfloat16", "fp32", "wmma_bf16"),
    ("float32", "tf32", "wmma_tf32"),
    ("float64", "fp64", "wmma_fp64"),
)
TENSOR_CORE_KINDS = KINDS[1:]


def covering_sample(space: SearchSpace, dtype: str, compute: str, device: Device, draws: int = 300,
                    seed: int = 0) -> list[tuple[object, Problem]]:
    """Valid (config, problem) pairs covering every pair of feature values seen in `draws` valid
    configs per problem (4 layouts, with and without tails)."""
    problems = [Problem.from_layout(m, n, k, layout, dtype=dtype, compute=compute)
                for layout in LAYOUTS for m, n, k in ((4096, 4096, 4096), (255, 257, 1023))]
    candidates = []
    for index, problem in enumerate(problems):
        for config in space.sample(draws, problem, device, seed=seed + index):
            features = [(knob, getattr(config, knob)) for knob in space.fields]
            features += [("layout", problem.layout), ("tails", config.even(problem))]
            candidates.append((config, problem, list(itertools.combinations(features, 2))))
    random.Random(seed).shuffle(candidates)
    covered: set = set()
    chosen = []
    for config, problem, pairs in candidates:
        new = [p for p in pairs if p not in covered]
        if new:
            covered.update(new)
            chosen.append((config, problem))
    return chosen


# ---- SIMT -------------------------------------------------------------------------------------------
# Knob values the SIMT samples must contain (the tile shapes vary by themselves); max_registers is
# covered by the sampled space (several of its trims turn up in every sample).
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
    """`count` random SIMT configs valid on the sample problem and on tails, plus the reference
    ones, topped up so that every value of every knob in COVERAGE appears at least once."""
    device = device or Device.for_arch("sm_90")
    space = SearchSpace.load("simt")
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


# ---- tensor cores -------------------------------------------------------------------------------------
WGMMA_BASES = ("wmma_256x128x32_w256x64_v4_s4_pad32_g8_k1_o1_wgmma", "wmma_128x128x32_w128x64_v4_s4_pad32_g8_k1_o1_wgmma",
               "wmma_64x128x32_w64x128_v4_s5_pad_g8_k1_o1_wgmma",  # TF32 (BK = 32: one 128-byte row)
               "wmma_256x128x64_w256x64_v8_s4_pad_g8_k1_o1_wgmma", "wmma_128x128x64_w128x64_v8_s4_pad_g8_k1_o1_wgmma",
               "wmma_64x128x64_w64x128_v8_s5_pad_g8_k1_o1_wgmma")  # 16-bit (BK = 64)


def _top_up(configs: dict, bases, changes, problem: Problem, device: Device) -> None:
    """For each change that no config shows yet, the first base with that change that is valid."""
    for change in changes:
        if any(all(getattr(c, k) == v for k, v in change.items()) for c in configs.values()):
            continue
        for base in list(bases):
            candidate = base.replace(**change)
            if not candidate.check(problem, device):
                configs[candidate.name] = candidate
                break


def tensor_core_sample(dtype: str, compute: str, space: str, count: int, seed: int,
                       device: Device | None = None) -> list[TensorCoreConfig]:
    """`count` configs of the space valid for a 4096^3 problem of the dtype, topped up with every
    stage count in plain and padded rows, each wider padding, the mma.sync path at every stage
    count and with a single k-step per slice, and the wgmma path at every stage count (and, for
    TF32, with two 128-byte rows per slice) where the device has them."""
    device = device or Device.for_arch("sm_90")
    problem = Problem(4096, 4096, 4096, dtype=dtype, compute=compute)
    configs = {c.name: c for c in SearchSpace.load(space).sample(count, problem, device, seed=seed)}
    _top_up(configs, configs.values(), [dict(stages=s, smem=m) for s in range(1, 6) for m in ("pad", "plain")],
            problem, device)
    _top_up(configs, configs.values(), [dict(smem="pad32"), dict(smem="pad64")], problem, device)
    _top_up(configs, configs.values(), [dict(stages=s, instruction="mma") for s in range(1, 6)], problem, device)
    mma_k = {c.replace(instruction="mma").fragment(problem)[2] for c in configs.values()}
    _top_up(configs, configs.values(), [dict(instruction="mma", bk=k) for k in sorted(mma_k)][:1], problem, device)
    wgmma_bases = [c for c in configs.values() if c.instruction == "wgmma"] + \
        [TensorCoreConfig.from_name(name) for name in WGMMA_BASES]
    _top_up(configs, wgmma_bases, [dict(instruction="wgmma", stages=s) for s in (3, 4, 5)]
            + [dict(instruction="wgmma", bk=64, stages=3)], problem, device)
    return sorted(configs.values(), key=lambda c: c.name)
