"""Fixed samples of tensor-core (WMMA) configurations per dtype, shared by the CPU and GPU tests."""

from __future__ import annotations

from autogemm.problem import Device, Problem
from autogemm.space import SearchSpace

# (dtype, compute, shipped space)
WMMA_KINDS = (
    ("float16", "fp32", "wmma_fp16"),
    ("bfloat16", "fp32", "wmma_bf16"),
    ("float32", "tf32", "wmma_tf32"),
    ("float64", "fp64", "wmma_fp64"),
)


def wmma_sample(dtype: str, compute: str, space: str, count: int, seed: int, device: Device | None = None) -> list:
    """`count` configs of the space valid for a 4096^3 problem of the dtype, including every
    stage count with plain and 16-byte padded rows, each wider padding, and the mma.sync path at
    every stage count and with a single k-step per slice (where the device has it)."""
    device = device or Device.for_arch("sm_90")
    problem = Problem(4096, 4096, 4096, dtype=dtype, compute=compute)
    configs = {c.name: c for c in SearchSpace.load(space).sample(count, problem, device, seed=seed)}
    for stages in (1, 2, 3, 4, 5):
        for smem in ("pad", "plain"):
            if not any(c.stages == stages and c.smem == smem for c in configs.values()):
                for base in list(configs.values()):
                    candidate = base.replace(stages=stages, smem=smem)
                    if not candidate.check(problem, device):
                        configs[candidate.name] = candidate
                        break
    for smem in ("pad32", "pad64"):
        if not any(c.smem == smem for c in configs.values()):
            for base in list(configs.values()):
                candidate = base.replace(smem=smem)
                if not candidate.check(problem, device):
                    configs[candidate.name] = candidate
                    break
    for stages in (1, 2, 3, 4, 5):
        if not any(c.mma and c.stages == stages for c in configs.values()):
            for base in list(configs.values()):
                candidate = base.replace(stages=stages, mma=True)
                if not candidate.check(problem, device):
                    configs[candidate.name] = candidate
                    break
    if not any(c.mma and c.bk == c.fragment(problem)[2] for c in configs.values()):
        for base in list(configs.values()):
            candidate = base.replace(mma=True, bk=base.replace(mma=True).fragment(problem)[2])
            if not candidate.check(problem, device):
                configs[candidate.name] = candidate
                break
    return sorted(configs.values(), key=lambda c: c.name)
