"""Every sampled SIMT configuration against a float64 reference, on shapes that are multiples of
nothing, tile multiples, K = 1, all four layouts, batches, alpha/beta, split-K and misaligned views.
Outputs are poisoned with NaN first, so an element the kernel never wrote fails the test."""

from __future__ import annotations

import numpy as np
import pytest

from autogemm.compile import CompileError
from autogemm.config import SimtConfig
from autogemm.problem import LAYOUTS, Device, Problem
from samples import diverse_sample

from autogemm.bench import random_uniform, reference_gemm, relative_error

pytestmark = pytest.mark.gpu

CONFIGS = diverse_sample(40, seed=2026)
TOLERANCE = 1e-5


def _case_shapes(config):
    """(name, M, N, K, batch, alpha, beta, misalign) for one config; K of the tile-multiple case
    leaves every split of split-K at least one tile."""
    k_tiles = max(4, 2 * config.split_k)
    return [
        ("1x1x1", 1, 1, 1, 1, 1.0, 0.0, False),
        ("1xNxK", 1, 300, 200, 1, 1.0, 0.0, False),
        ("127x129x65", 127, 129, 65, 1, 1.0, 0.0, False),
        ("255x257x1023", 255, 257, 1023, 1, 0.75, 0.0, False),
        ("tile-multiple", 2 * config.bm, 2 * config.bn, k_tiles * config.bk, 1, 1.0, 0.0, False),
        ("K=1", 64, 96, 1, 1, 1.0, 0.0, False),
        ("batch3-alpha-beta", 70, 50, 90, 3, 1.5, -0.5, False),
        ("aligned-tails", 132, 260, 68, 1, 1.0, 0.25, False),
        ("misaligned-view", 100, 84, 76, 2, -1.0, 0.5, True),
    ]


def _operand(shape, batch, misalign, seed):
    """A random operand of `shape` (per matrix); when misaligned, a view one element into a
    larger buffer, so its pointer and row pitch defeat 16-byte vector loads."""
    full = (batch, *shape) if batch > 1 else shape
    if not misalign:
        return random_uniform(full, seed=seed)
    rows, cols = shape
    padded = random_uniform((batch, rows, cols + 3) if batch > 1 else (rows, cols + 3), seed=seed)
    view = padded[..., 1 : cols + 1]
    assert view.data.ptr % 16 != 0
    return view


@pytest.mark.parametrize("config", CONFIGS, ids=[c.name for c in CONFIGS])
def test_config_matches_float64_reference(config):
    import cupy

    from autogemm.launch import gemm

    device = Device.current()
    ran = refused = 0
    for index, (case, m, n, k, batch, alpha, beta, misalign) in enumerate(_case_shapes(config)):
        layout = LAYOUTS[(index + CONFIGS.index(config)) % 4]
        trans_a, trans_b = layout[0] == "t", layout[1] == "t"
        problem = Problem(m, n, k, batch=batch, trans_a=trans_a, trans_b=trans_b)
        run_config = config
        if config.check(problem, device):
            # A small K has fewer K tiles than the config has splits: split as far as K allows
            # (still through the split-K path when that is more than one).
            run_config = config.replace(split_k=max(1, min(config.split_k, config.tiles_k(problem))))
            if run_config.check(problem, device):
                continue  # not runnable for this shape (e.g. registers at its narrower vectors)
        seed = 1000 * index + 7
        a = _operand((k, m) if trans_a else (m, k), batch, misalign, seed)
        b = _operand((n, k) if trans_b else (k, n), batch, misalign, seed + 1)
        c_shape = (batch, m, n) if batch > 1 else (m, n)
        if beta != 0:
            c = random_uniform(c_shape, seed=seed + 2)
        else:
            c = cupy.full(c_shape, np.nan, dtype=np.float32)  # beta == 0 must never read C
        expected = reference_gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        try:
            gemm(run_config, a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        except CompileError as exc:
            if "under max_registers" not in str(exc):
                raise
            refused += 1  # ptxas spilled under this config's explicit register cap: refused, as intended
            continue
        cupy.cuda.Device().synchronize()
        error = relative_error(c, expected)
        assert error <= TOLERANCE, f"{run_config.name} {case} {layout}: relative error {error:.3g}"
        ran += 1
    assert ran >= 1 and ran + refused >= 5, f"{config.name}: only {ran} of 9 cases could run ({refused} refused)"


# Stream-K: shapes where many blocks share one tile (fewer tiles than blocks), where the shares
# straddle tile boundaries unevenly (primes), and batches; each launched three times in a row,
# since the per-tile counters must be back at zero for the next launch to be right.
STREAM_K_CONFIGS = [
    SimtConfig.from_name(name)
    for name in (
        "128x128x16_w32x64_t8x8_v44_s3_pad_g8_k1_o1_r_sk",  # cp.async ring, A through registers
        "64x64x16_w32x32_t4x8_v44_s4_swizzle_g4_k1_o2_sk",  # two blocks per SM
        "32x32x8_w16x32_t4x4_v44_s2_pad_g1_k1_o1_sk",  # register double buffer
        "128x128x8_w32x64_t8x8_v44_s1_pad_g8_k1_o1_sk",  # single buffer
    )
]


@pytest.mark.parametrize("config", STREAM_K_CONFIGS, ids=[c.name for c in STREAM_K_CONFIGS])
@pytest.mark.parametrize(
    "m,n,k,batch,layout,alpha,beta",
    [
        (64, 64, 4096, 1, "nn", 1.0, 0.0),  # one tile over every block
        (331, 509, 2039, 1, "tn", 1.0, 0.5),  # primes
        (1000, 700, 300, 3, "nt", -0.5, 0.25),
        (2048, 2048, 512, 1, "tt", 1.0, 0.0),
    ],
)
def test_stream_k_matches_float64_reference_launch_after_launch(config, m, n, k, batch, layout, alpha, beta):
    import cupy

    from autogemm.launch import bind

    trans_a, trans_b = layout[0] == "t", layout[1] == "t"
    problem = Problem(m, n, k, batch=batch, trans_a=trans_a, trans_b=trans_b)
    reasons = config.check(problem, Device.current())
    assert not reasons, reasons
    a = _operand((k, m) if trans_a else (m, k), batch, False, 11)
    b = _operand((n, k) if trans_b else (k, n), batch, False, 12)
    c0 = random_uniform((batch, m, n) if batch > 1 else (m, n), seed=13)
    expected = reference_gemm(a, b, c0, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    for launch in range(3):
        c = c0.copy()
        run, _ = bind(config, a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
        run()
        cupy.cuda.Device().synchronize()
        error = relative_error(c, expected)
        assert error <= TOLERANCE, f"launch {launch}: relative error {error:.3g}"
