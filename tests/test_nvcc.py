"""A fixed, diverse sample of variants compiles with nvcc for sm_90 and sm_80 without spills.

CI has nvcc; if it is missing these tests fail (they do not skip) and say so.
"""

from __future__ import annotations

import pytest

from autogemm.compile import find_nvcc
from autogemm.problem import LAYOUTS, Device, Problem
from nvcc_compile import compile_variants
from samples import diverse_sample

# Shapes that switch tails on and off and narrow the vector widths (odd leading dimensions).
SHAPES = [(4096, 4096, 4096), (127, 129, 65), (255, 257, 1023), (132, 260, 68)]
CONFIGS = diverse_sample(24, seed=5)


def _variants(device: Device):
    variants = []
    for i, config in enumerate(CONFIGS):
        m, n, k = SHAPES[i % len(SHAPES)]
        problem = Problem.from_layout(m, n, k, LAYOUTS[(i // len(SHAPES)) % 4])
        if config.check(problem, device):
            problem = Problem.from_layout(4096, 4096, 4096, problem.layout)
        if not config.check(problem, device):
            variants.append((config, problem))
    return variants


def test_nvcc_is_available():
    assert find_nvcc(), "nvcc is required for the compile tests: install the CUDA toolkit"


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_sample_compiles_without_spills(arch):
    device = Device.for_arch(arch)
    variants = _variants(device)
    assert len(variants) >= 24, f"only {len(variants)} variants are valid on {arch}"

    results, errors, spilling = compile_variants(variants, arch)
    assert not errors, "\n".join(errors)
    assert not spilling, "\n".join(spilling)
    stages = {c.stages for c, _, _ in results}
    assert stages == {1, 2, 3, 4}, f"sample lacks pipeline depths: {stages}"
