"""A kernel family added from outside the package (tests/toy_family: a knob table and config class,
a template and a search space) is named, parsed, checked, searched and rendered, and compiles,
with no change to autogemm itself."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from autogemm.kernels.ptxas_report import nvrtc_resources
from autogemm.families import config_from_dict, config_from_name
from autogemm.problem import Device, Problem
from autogemm.kernels.render import kernel_template_hash, render
from autogemm.kernels.space import SearchSpace

TOY = Path(__file__).parent / "toy_family"
sys.path.insert(0, str(TOY))
from toy import ToyConfig  # noqa: E402  (registers the family)

SM90 = Device.for_arch("sm_90")


def test_names_and_dicts_come_from_its_knob_table():
    config = ToyConfig(bm=16, bn=32, bk=8, fma=False)
    assert config.name == "toy_16x32x8_mul"
    assert ToyConfig().name == "toy_8x32x4"
    assert config_from_name(config.name) == config
    assert config_from_dict(config.to_dict()) == config


def test_it_checks_with_its_own_rules_and_the_shared_launch_limits():
    problem = Problem(100, 100, 100)
    assert ToyConfig().check(problem, SM90) == []
    assert ToyConfig(bm=3).check(problem, SM90) == ["choice: bm=3 must be a power of two"]
    assert ToyConfig().check(Problem(100, 100, 100, dtype="float16"), SM90)[0].startswith(
        "dtype: the toy template computes float32/fp32")
    small = dataclasses.replace(SM90, max_threads_per_block=128)
    assert ToyConfig(bm=32, bn=32).check(problem, small) == [
        "threads: 1024 threads per block exceed the device limit 128"]
    assert any(r.startswith("size") for r in ToyConfig().check(Problem(2**31, 1, 1), SM90))


def test_its_space_samples_and_every_config_renders_and_the_template_is_its_own():
    space = SearchSpace.load(TOY / "toy.toml")
    assert space.config_class is ToyConfig
    configs = space.valid_configs(Problem.from_layout(100, 70, 33, "tn"), SM90)
    assert len(configs) == 4 * 4 * 2  # sides x unrollings x fma
    for config in configs:
        source = render(config, Problem.from_layout(100, 70, 33, "tn"))
        assert f"#pragma unroll {config.bk}" in source.code and "TRANS_A = true" in source.code
        assert ("fmaf(" in source.code) == config.fma
    assert kernel_template_hash("toy_gemm.cu.j2") != kernel_template_hash("simt_gemm.cu.j2")


def test_it_compiles_without_spills():
    source = render(ToyConfig(fma=False), Problem(100, 70, 33))
    usage = nvrtc_resources(source, "sm_90")[source.kernel]
    assert usage.registers > 0 and usage.spills == 0


@pytest.mark.gpu
def test_it_runs_through_launch():
    """The toy family through the package's own launch path, against float64."""
    import cupy

    from autogemm.measure.bench import random_uniform, reference_gemm, relative_error
    from autogemm.gpu.launch import gemm

    for layout, config in (("nn", ToyConfig()), ("tt", ToyConfig(bm=4, bn=8, bk=1, fma=False))):
        trans_a, trans_b = layout[0] == "t", layout[1] == "t"
        a = random_uniform((2, 33, 100) if trans_a else (2, 100, 33), seed=1)
        b = random_uniform((70, 33) if trans_b else (33, 70), seed=2)  # shared by the batch
        c = gemm(config, a, b, trans_a=trans_a, trans_b=trans_b, alpha=0.5)
        cupy.cuda.Device().synchronize()
        assert relative_error(c, reference_gemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=0.5)) <= 1e-5
