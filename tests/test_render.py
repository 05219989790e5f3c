"""Every sampled valid configuration renders, deterministically, with its knobs in the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autogemm.config import SimtConfig
from autogemm.problem import LAYOUTS, Device, Problem
from autogemm.render import VectorWidths, packed_vector_widths, render, template_hash
from autogemm.space import SearchSpace

SM90 = Device.for_arch("sm_90")
SHAPES = [(4096, 4096, 4096), (127, 129, 65), (1, 1, 1), (255, 257, 1023)]


def _variants(count: int):
    configs = SearchSpace.load().sample(count, Problem(4096, 4096, 4096), SM90, seed=11)
    for i, config in enumerate(configs):
        m, n, k = SHAPES[i % len(SHAPES)]
        problem = Problem.from_layout(m, n, k, LAYOUTS[i % 4])
        if config.check(problem, SM90):
            problem = Problem.from_layout(4096, 4096, 4096, LAYOUTS[i % 4])
        yield config, problem


def test_sample_of_300_valid_configs_renders():
    rendered = 0
    for config, problem in _variants(300):
        source = render(config, problem)
        assert source.kernel in source.code
        assert f"constexpr int BM = {config.bm}, BN = {config.bn}, BK = {config.bk};" in source.code
        assert f"constexpr int STAGES = {config.stages};" in source.code
        assert ("cp.async" in source.code) == (config.stages >= 3)
        assert (source.reduce_kernel is not None) == (config.split_k > 1)
        rendered += 1
    assert rendered == 300


def test_rendering_is_deterministic_across_processes():
    config = SimtConfig(stages=3, smem="swizzle", split_k=2)
    problem = Problem.from_layout(255, 257, 1023, "tn")
    here = render(config, problem)
    assert render(config, problem) == here
    code = (
        "from autogemm.config import SimtConfig; from autogemm.problem import Problem; "
        "from autogemm.render import render; "
        "print(render(SimtConfig(stages=3, smem='swizzle', split_k=2), "
        "Problem.from_layout(255, 257, 1023, 'tn')).digest)"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == here.digest


def test_shape_enters_only_through_tile_multiples():
    config = SimtConfig()
    assert render(config, Problem(4096, 4096, 4096)).code == render(config, Problem(2048, 1024, 512)).code
    assert render(config, Problem(4096, 4096, 4096)).code != render(config, Problem(4095, 4096, 4096)).code


def test_vector_widths_follow_alignment_of_packed_operands():
    config = SimtConfig(vec=4)
    assert packed_vector_widths(config, Problem(128, 128, 128)) == VectorWidths(4, 4, 4)
    assert packed_vector_widths(config, Problem(128, 130, 1023)) == VectorWidths(1, 2, 2)
    assert packed_vector_widths(config, Problem.from_layout(126, 128, 1023, "tn")) == VectorWidths(2, 4, 4)
    with pytest.raises(ValueError, match="vector width 4 for A"):
        render(SimtConfig(vec=2), Problem(64, 64, 64), VectorWidths(4, 2, 2))


def test_template_hash_is_stable():
    assert template_hash() == template_hash()
    assert len(template_hash()) == 16


@pytest.mark.parametrize("group_m", [3, 5, 6, 7, 9])
def test_fault_injecting_test_template_still_finds_its_marker(monkeypatch, group_m):
    """The GPU isolation tests inject faults through tests/broken_templates, which splices them in
    front of the shipped template's epilogue marker; if the marker moves, the faults vanish."""
    # (the Jinja environment is cached per template directory, so nothing leaks into other tests)
    monkeypatch.setenv("AUTOGEMM_TEMPLATE_DIR", str(Path(__file__).parent / "broken_templates"))
    config = SimtConfig(64, 64, 8, 32, 32, 4, 8, 4, 4, 2, "pad", group_m, 1)
    assert "// FAULT" in render(config, Problem(512, 512, 512)).code
