"""Fixed samples of tensor-core (WMMA) configurations per dtype, shared by the CPU and GPU tests."""

from __future__ import annotations

from autogemm.config import WmmaConfig
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
    every stage count and with a single k-step per slice (where the device has it), and the wgmma
    path at every stage count (TF32, FP16, BF16 on sm_90)."""
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
    # Hopper's wgmma path: every stage count and, for TF32, a two-row (BK = 64) slice
    wgmma_bases = [c for c in configs.values() if c.wgmma] + [WmmaConfig.from_name(name) for name in WGMMA_BASES]
    wanted = [dict(stages=3), dict(stages=4), dict(stages=5), dict(bk=64, stages=3)]
    for change in wanted:
        if not any(c.wgmma and all(getattr(c, k) == v for k, v in change.items()) for c in configs.values()):
            for base in wgmma_bases:
                candidate = base.replace(**change)
                if not candidate.check(problem, device):
                    configs[candidate.name] = candidate
                    break
    return sorted(configs.values(), key=lambda c: c.name)


WGMMA_BASES = ("wmma_256x128x32_w256x64_v4_s4_pad32_g8_k1_o1_wgmma", "wmma_128x128x32_w128x64_v4_s4_pad32_g8_k1_o1_wgmma",
               "wmma_64x128x32_w64x128_v4_s5_pad_g8_k1_o1_wgmma",  # TF32 (BK = 32: one 128-byte row)
               "wmma_256x128x64_w256x64_v8_s4_pad_g8_k1_o1_wgmma", "wmma_128x128x64_w128x64_v8_s4_pad_g8_k1_o1_wgmma",
               "wmma_64x128x64_w64x128_v8_s5_pad_g8_k1_o1_wgmma")  # 16-bit (BK = 64)
