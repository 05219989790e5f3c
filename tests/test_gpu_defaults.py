"""The built-in defaults of every type on every edge shape in every layout, against float64 (run
with `pytest -m gpu --exhaustive`): for each case at least one of a type's defaults runs it (they
are what `matmul` serves where nothing was tuned), and each that can is right. Kernels compile
ahead, in parallel."""

from __future__ import annotations

import pytest

from autogemm.families import config_from_name, family_for
from autogemm.problem import LAYOUTS, Problem
from gpu_cases import EDGE_CASES, Run, execute, precompile
from samples import TENSOR_CORE_KINDS

pytestmark = [pytest.mark.gpu, pytest.mark.exhaustive]
TYPES = [(d, c) for d, c, _ in TENSOR_CORE_KINDS] + [("float32", "fp32")]


def _device():
    from autogemm.gpu.launch import current_device

    return current_device()


def _runs(dtype: str, compute: str, layout: str, device) -> dict:
    """{case name: the runs of every default of the type that can run the case}"""
    defaults = family_for(dtype, compute).defaults(Problem(1, 1, 1, dtype=dtype, compute=compute))
    runs = {case.name: [Run(config_from_name(name), case, layout, dtype, compute) for _, name in defaults]
            for case in EDGE_CASES}
    return {name: [r for r in found if r.runnable(device) is not None] for name, found in runs.items()}


@pytest.fixture(scope="module", autouse=True)
def compiled_ahead(request):
    if not request.config.getoption("--exhaustive"):
        return 0
    device = _device()
    return precompile([run for d, c in TYPES for layout in LAYOUTS for runs in _runs(d, c, layout, device).values()
                       for run in runs], device)


@pytest.mark.parametrize("dtype, compute", TYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_defaults_run_every_edge_shape(dtype, compute, layout):
    device = _device()
    for case, runs in _runs(dtype, compute, layout, device).items():
        assert runs, f"no default runs {case} {layout}"
        for seed, run in enumerate(runs):
            execute(run, device, seed=10 * seed)
