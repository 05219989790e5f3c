"""The tensor-core (WMMA) family without a GPU: configs, checks, every valid config of each shipped
space renders, and a fixed sample compiles with nvcc for sm_80 and sm_90 without spills."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autogemm.config import SimtConfig, WmmaConfig, config_from_dict, config_from_name
from autogemm.problem import LAYOUTS, Device, Problem
from autogemm.render import render
from autogemm.space import SearchSpace, default_space_name
from nvcc_compile import compile_variants
from wmma_samples import WMMA_KINDS, wmma_sample

SM90 = Device.for_arch("sm_90")


def test_name_and_dict_round_trip():
    config = WmmaConfig(128, 64, 32, 64, 32, 8, 4, "plain", 4, 2, 1)
    assert config_from_name(config.name) == config
    assert config_from_dict(config.to_dict()) == config
    assert config.name == "wmma_128x64x32_w64x32_v8_s4_plain_g4_k2_o1"
    mma = config.replace(mma=True, smem="pad32")
    assert mma.name == "wmma_128x64x32_w64x32_v8_s4_pad32_g4_k2_o1_mma"
    assert config_from_name(mma.name) == mma
    assert config_from_dict(mma.to_dict()) == mma
    wgmma = config.replace(wgmma=True)
    assert wgmma.name == "wmma_128x64x32_w64x32_v8_s4_plain_g4_k2_o1_wgmma"
    assert config_from_name(wgmma.name) == wgmma
    assert config_from_dict(wgmma.to_dict()) == wgmma


@pytest.mark.parametrize("dtype, compute, space", WMMA_KINDS)
def test_family_follows_dtype(dtype, compute, space):
    problem = Problem(64, 64, 64, dtype=dtype, compute=compute)
    assert default_space_name(problem) == space
    assert SearchSpace.load(space).family == "wmma"
    assert default_space_name(Problem(64, 64, 64)) == "simt"
    # the cache keeps the families apart: float32 fp32 and tf32 are different problems
    assert Problem(8, 8, 8, compute="tf32").key != Problem(8, 8, 8).key


class _FakeArray:
    """Just enough of an array for bind()'s dtype checks, which run before anything touches a GPU."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)


@pytest.mark.parametrize("config, a, b, message", [
    (WmmaConfig(), "float16", "float32", "A and B differ in dtype: float16 and float32"),
    (SimtConfig(), "float16", "float16", "the SIMT family computes float32"),
    (WmmaConfig(), "int32", "int32", "A has dtype int32; supported: float32, float16, float64"),
])
def test_bind_rejects_dtypes_before_launching(config, a, b, message):
    from autogemm.launch import bind

    with pytest.raises(TypeError, match=re.escape(message)):
        bind(config, _FakeArray(a), _FakeArray(b))


def test_check_reasons():
    half = Problem(256, 256, 256, dtype="float16")
    assert WmmaConfig().check(Problem(256, 256, 256), SM90)[0].startswith("dtype")
    assert any(r.startswith("fragment") for r in WmmaConfig(wm=24).check(half, SM90) + WmmaConfig(bk=8).check(half, SM90))
    bf16 = Problem(256, 256, 256, dtype="bfloat16")
    assert any(r.startswith("tensor-core") for r in WmmaConfig().check(bf16, Device.for_arch("sm_75")))
    assert any(r.startswith("shared-memory") for r in
               WmmaConfig(256, 256, 64, 64, 64, 8, 5).check(half, SM90))
    assert any(r.startswith("choice") for r in WmmaConfig(vec=8).check(Problem(64, 64, 64, dtype="float64"), SM90))
    assert any(r.startswith("registers") for r in
               WmmaConfig(256, 128, 32, 128, 128).check(half, SM90))


def test_mma_path_check_reasons():
    """mma.sync computes 16x8 blocks and loads B for two at once; its FP64 shape needs sm_90."""
    double = Problem(4096, 4096, 4096, dtype="float64")
    fp64 = WmmaConfig(128, 64, 16, 32, 32, 2, 4, "pad32", 8, 1, 1, mma=True)
    assert fp64.check(double, SM90) == []
    assert any(r.startswith("tensor-core: float64/fp64 mma.sync needs compute capability 9.0")
               for r in fp64.check(double, Device.for_arch("sm_80")))
    assert fp64.replace(mma=False).check(double, Device.for_arch("sm_80")) == []
    assert any(r.startswith("fragment") for r in fp64.replace(wm=8, bm=64).check(double, SM90))
    half = Problem(4096, 4096, 4096, dtype="float16")
    assert any(r.startswith("fragment") for r in WmmaConfig(64, 64, 32, 32, 8, 8, 3, mma=True).check(half, SM90))
    # the fitted register model: 64x64 warp tiles fit at BK=64 without tails, not with them
    big = WmmaConfig(128, 256, 64, 64, 64, 8, 3, "pad", 8, 1, 1, mma=True)
    assert big.check(half, SM90) == []
    assert any(r.startswith("registers") for r in big.check(Problem(4095, 4096, 4096, dtype="float16"), SM90))


def test_wgmma_path_check_reasons():
    """wgmma: TF32, FP16, BF16 on sm_90a only, one operand with K contiguous, 64-row blocks along the operand
    fed from registers (N for NN, where the kernel computes C^T), 3-5 stages, one instruction path."""
    tf32 = {layout: Problem.from_layout(4096, 4096, 4096, layout, dtype="float32", compute="tf32") for layout in LAYOUTS}
    nn = WmmaConfig(256, 128, 32, 256, 64, 4, 4, "pad32", 8, 1, 1, wgmma=True)
    assert nn.threads == 256  # two warpgroups
    assert nn.check(tf32["nn"], SM90) == []
    assert any(r.startswith("tensor-core: wgmma needs compute capability 9.0")
               for r in nn.check(tf32["nn"], Device.for_arch("sm_80")))
    assert any(r.startswith("layout") for r in nn.check(tf32["tn"], SM90))
    # NT reads B from shared memory: the 64-row blocks run along M there
    assert any(r.startswith("fragment") for r in nn.replace(wm=32, bm=128).check(tf32["nn"], SM90) +
               nn.replace(wn=32, bn=64).check(tf32["nn"], SM90))
    nt = WmmaConfig(128, 256, 32, 64, 256, 4, 4, "pad32", 8, 1, 1, wgmma=True)
    assert nt.check(tf32["nt"], SM90) == [] and nt.check(tf32["tt"], SM90) == []
    assert any(r.startswith("registers") for r in nt.check(tf32["nn"], SM90))
    assert any(r.startswith("fragment") for r in nn.replace(bk=16).check(tf32["nn"], SM90))
    assert any(r.startswith("choice") for r in nn.replace(stages=2).check(tf32["nn"], SM90))
    assert any(r.startswith("choice") for r in nn.replace(mma=True).check(tf32["nn"], SM90))
    double = Problem(4096, 4096, 4096, dtype="float64")
    assert any(r.startswith("tensor-core: the wgmma path computes") for r in nn.check(double, SM90))
    # 16-bit types: m64nNk16, a 128-byte row is 64 elements of K
    half = Problem(4096, 4096, 4096, dtype="float16")
    assert any(r.startswith("fragment") for r in nn.check(half, SM90))
    assert nn.replace(bk=64, vec=8, smem="pad").check(half, SM90) == []
    with pytest.raises(ValueError, match="layout TN"):
        render(nn, tf32["tn"])
    source = render(nn, tf32["nn"])
    assert source.arch_suffix == "a" and source.target("sm_90") == "sm_90a"
    assert "constexpr bool SWAP = true;" in source.code
    assert "constexpr bool SWAP = false;" in render(nt, tf32["nt"]).code


@pytest.mark.parametrize("dtype, compute, space", WMMA_KINDS)
def test_every_valid_config_renders(dtype, compute, space):
    problem = Problem(4096, 4096, 4096, dtype=dtype, compute=compute)
    configs = SearchSpace.load(space).valid_configs(problem, SM90)
    assert len(configs) > 1000
    names = set()
    for config in configs:
        source = render(config, problem)
        assert f"constexpr int BM = {config.bm}, BN = {config.bn}, BK = {config.bk};" in source.code
        assert f"__launch_bounds__(THREADS, {config.min_blocks})" in source.code
        names.add(source.kernel)
    assert len(names) == len(configs)  # one distinct kernel per config
    assert render(configs[0], problem).code == render(configs[0], problem).code


SHAPES = [(4096, 4096, 4096), (127, 129, 65), (255, 257, 1023)]


def _variants(arch):
    device = Device.for_arch(arch)
    variants = []
    for dtype, compute, space in WMMA_KINDS:
        sample = wmma_sample(dtype, compute, space, 4, seed=11, device=device)
        # six of the sample, the mma.sync path among them where the device has it
        chosen = sample[:4] + [c for c in sample[4:] if c.mma][:2]
        chosen += sample[4 : 4 + 6 - len(chosen)]
        chosen += [c for c in sample if c.wgmma and c not in chosen][:3]  # sm_90a only
        for i, config in enumerate(chosen):
            m, n, k = SHAPES[i % len(SHAPES)]
            problem = Problem.from_layout(m, n, k, LAYOUTS[i % 4], dtype=dtype, compute=compute)
            if config.check(problem, device):
                problem = Problem.from_layout(4096, 4096, 4096, problem.layout, dtype=dtype, compute=compute)
            if not config.check(problem, device):
                variants.append((config, problem))
    return variants


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_sample_compiles_without_spills(arch):
    variants = _variants(arch)
    assert len(variants) >= 20

    _, errors, spilling = compile_variants(variants, arch)
    assert not errors, "\n".join(errors)
    assert not spilling, "\n".join(spilling)
