"""Tensor-core (WMMA) kernels against a float64 reference, per dtype: a sample of at least 20
configurations each, on edge shapes (1x1x1, 127x129x65, 255x257x1023), all four layouts, a batch
with alpha and beta, split-K and misaligned views. Outputs are poisoned with NaN first. Tolerances
from DESIGN.md (TF32 scaled for K)."""

from __future__ import annotations

import pytest

from autogemm.bench import poison, random_uniform, reference_gemm, relative_error, tolerance
from autogemm.dispatch import DEFAULT_WMMA_CONFIGS
from autogemm.config import WmmaConfig
from autogemm.problem import LAYOUTS, Device, Problem
from wmma_samples import WMMA_KINDS, wmma_sample

pytestmark = pytest.mark.gpu

CASES = [
    # (name, M, N, K, batch, alpha, beta, misalign)
    ("1x1x1", 1, 1, 1, 1, 1.0, 0.0, False),
    ("127x129x65", 127, 129, 65, 1, 1.0, 0.0, False),
    ("255x257x1023", 255, 257, 1023, 1, 0.75, 0.0, False),
    ("batch3-alpha-beta", 70, 50, 90, 3, 1.5, -0.5, False),
    ("misaligned-view", 100, 84, 76, 2, -1.0, 0.5, True),
]


def _operand(shape, batch, misalign, dtype, seed):
    full = (batch, *shape) if batch > 1 else shape
    if not misalign:
        return random_uniform(full, dtype, seed=seed)
    rows, cols = shape
    padded = random_uniform((batch, rows, cols + 3) if batch > 1 else (rows, cols + 3), dtype, seed=seed)
    view = padded[..., 1 : cols + 1]
    assert view.data.ptr % 16 != 0
    return view


def _run_case(config, dtype, compute, case, layout, seed):
    """Runs one case if the config can; returns the relative error, or None when it cannot run."""
    import cupy

    from autogemm.launch import gemm

    name, m, n, k, batch, alpha, beta, misalign = case
    trans_a, trans_b = layout[0] == "t", layout[1] == "t"
    problem = Problem(m, n, k, batch=batch, dtype=dtype, compute=compute, trans_a=trans_a, trans_b=trans_b)
    device = Device.current()
    if config.check(problem, device):
        config = config.replace(split_k=max(1, min(config.split_k, config.tiles_k(problem))))
        if config.check(problem, device):
            return None
    a = _operand((k, m) if trans_a else (m, k), batch, misalign, dtype, seed)
    b = _operand((n, k) if trans_b else (k, n), batch, misalign, dtype, seed + 1)
    c_shape = (batch, m, n) if batch > 1 else (m, n)
    if beta != 0:
        c = random_uniform(c_shape, dtype, seed=seed + 2)
    else:
        c = cupy.empty(c_shape, dtype=a.dtype)
        poison(c)  # beta == 0 must never read C
    expected = reference_gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    gemm(config, a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    cupy.cuda.Device().synchronize()
    error = relative_error(c, expected)
    assert error <= tolerance(problem), f"{config.name} {dtype}/{compute} {name} {layout}: relative error {error:.3g}"
    return error


def _params():
    for dtype, compute, space in WMMA_KINDS:
        for config in wmma_sample(dtype, compute, space, 20, seed=7):
            yield pytest.param(dtype, compute, config, id=f"{dtype}-{compute}-{config.name}")


@pytest.mark.parametrize("dtype, compute, config", list(_params()))
def test_sampled_config_matches_float64_reference(dtype, compute, config):
    # the tile-multiple case always fits; the edge shapes run where the config allows
    tile = ("tile-multiple", 2 * config.bm, 2 * config.bn, max(4, 2 * config.split_k) * config.bk, 1, 1.0, 0.0, False)
    ran = 0
    for index, case in enumerate([tile, *CASES]):
        layout = LAYOUTS[(index + sum(map(ord, config.name))) % 4]
        if _run_case(config, dtype, compute, case, layout, seed=100 * index + 3) is not None:
            ran += 1
    assert ran >= 1


@pytest.mark.parametrize("dtype, compute", [(d, c) for d, c, _ in WMMA_KINDS])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_default_configs_run_every_edge_shape(dtype, compute, layout):
    """The dispatcher's defaults cover every edge shape (tails, K=1 ... ) in every layout."""
    for index, case in enumerate(CASES):
        errors = [
            _run_case(WmmaConfig.from_name(name), dtype, compute, case, layout, seed=10 * index)
            for _, name in DEFAULT_WMMA_CONFIGS[(dtype, compute)]
        ]
        assert any(e is not None for e in errors), f"no default config ran {case[0]} {layout}"


def test_sample_sizes():
    for dtype, compute, space in WMMA_KINDS:
        assert len(wmma_sample(dtype, compute, space, 20, seed=7)) >= 20
