"""The exhaustive GPU samples (run with `pytest -m gpu --exhaustive`): a diverse sample of 40+ SIMT
configs and 20+ tensor-core configs per type (every stage count, padding and instruction path) on
every edge shape, and stream-K launch after launch on shapes that make blocks share tiles, all
against float64. Kernels compile ahead, in parallel. The built-in defaults are in
test_gpu_defaults.py."""

from __future__ import annotations

import pytest

from autogemm.families import SimtConfig, config_from_name
from gpu_cases import Case, Run, execute, precompile, runs_for
from samples import TENSOR_CORE_KINDS, diverse_sample, tensor_core_sample

pytestmark = [pytest.mark.gpu, pytest.mark.exhaustive]

STREAM_K_CONFIGS = (
    "128x128x16_w32x64_t8x8_v44_s3_pad_g8_k1_o1_r_sk",  # cp.async ring, A through registers
    "64x64x16_w32x32_t4x8_v44_s4_swizzle_g4_k1_o2_sk",  # two blocks per SM
    "32x32x8_w16x32_t4x4_v44_s2_pad_g1_k1_o1_sk",  # register double buffer
    "128x128x8_w32x64_t8x8_v44_s1_pad_g8_k1_o1_sk",  # single buffer
)
STREAM_K_CASES = (
    (Case("one tile over every block", 64, 64, 4096), "nn"),
    (Case("primes", 331, 509, 2039, beta=0.5), "tn"),
    (Case("batch", 1000, 700, 300, batch=3, alpha=-0.5, beta=0.25), "nt"),
    (Case("4 waves", 2048, 2048, 512), "tt"),
)


def _device():
    from autogemm.gpu.launch import current_device

    return current_device()


def _sampled():
    """(dtype, compute, config) of every sampled config; built only when the tier runs."""
    out = [("float32", "fp32", c) for c in diverse_sample(40, seed=2026)]
    for dtype, compute, space in TENSOR_CORE_KINDS:
        out += [(dtype, compute, c) for c in tensor_core_sample(dtype, compute, space, 20, seed=7)]
    return out


def pytest_generate_tests(metafunc):
    if "sampled" in metafunc.fixturenames:
        exhaustive = metafunc.config.getoption("--exhaustive")
        items = _sampled() if exhaustive else []
        metafunc.parametrize("sampled", items or [None], ids=[f"{d}-{c}-{x.name}" for d, c, x in items] or ["-"])


@pytest.fixture(scope="module", autouse=True)
def compiled_ahead(request):
    if not request.config.getoption("--exhaustive"):
        return 0
    device = _device()
    runs = [run for i, (d, c, x) in enumerate(_sampled()) for run in runs_for(x, d, c, device, offset=i)]
    runs += [Run(config_from_name(n), case, layout) for n in STREAM_K_CONFIGS for case, layout in STREAM_K_CASES]
    return precompile(runs, device)


def test_sampled_config_matches_float64(sampled):
    dtype, compute, config = sampled
    device = _device()
    runs = runs_for(config, dtype, compute, device, offset=sum(map(ord, config.name)))
    # the sample is drawn so that every config can run a large problem and (SIMT) tails everywhere
    assert len(runs) >= (5 if isinstance(config, SimtConfig) else 1), [str(r) for r in runs]
    for seed, run in enumerate(runs):
        try:
            execute(run, device, seed=1000 * seed + 7)
        except Exception as exc:  # ptxas spilled under an explicit register cap: refused, as intended
            if "under max_registers" not in str(exc):
                raise


@pytest.mark.parametrize("name", STREAM_K_CONFIGS)
@pytest.mark.parametrize("case, layout", STREAM_K_CASES, ids=[c.name for c, _ in STREAM_K_CASES])
def test_stream_k_launch_after_launch(name, case, layout):
    device = _device()
    run = Run(config_from_name(name), case, layout)
    assert run.runnable(device) is run.config
    for launch in range(3):  # the per-tile counters must be back at zero for the next launch
        execute(run, device, seed=5)
