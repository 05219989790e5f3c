"""Sustained GPU time on the device (measure/timing.py `sustained_times`, measuring.GpuMeasurer.sustained,
measure/clocks.py): the figures a tune of a GPU-bound product decides on."""

from __future__ import annotations

import statistics

import pytest

pytestmark = pytest.mark.gpu


def test_two_identical_calls_measure_alike_in_sustained_rounds():
    """The rounds' random order keeps either competitor out of one phase of the clocks' swings: with an
    alternating order of 200 ms rounds, two identical torch.matmul calls had measured 3% apart."""
    import cupy

    from autogemm.measure.timing import Sustained, sustained_times

    a = cupy.random.default_rng(1).random((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    b = cupy.random.default_rng(2).random((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
    rounds = sustained_times({"first": lambda i: cupy.matmul(a, b), "second": lambda i: cupy.matmul(a, b)})
    assert len(rounds["first"]) == len(rounds["second"]) == 20
    first, second = statistics.fmean(rounds["first"]), statistics.fmean(rounds["second"])
    # Within three standard errors of the rounds' paired ratios, and 2% at least: on an idle GPU that
    # is about 2%, under the alternating order's 3.3% bias; where the quick tier's workers share the
    # GPU the rounds spread (two identical calls once measured 5.8% apart there) and the bound with them.
    noise = Sustained(kernel_rounds=[rounds["first"]], baseline_rounds={"second": rounds["second"]}).noise(0)
    assert abs(first / second - 1) < max(0.02, 1.5 * noise), (first, second, noise)


@pytest.mark.long(seconds=7)
def test_a_measurers_sustained_figures_pair_each_config_with_the_baselines():
    from autogemm.families import config_from_name
    from autogemm.gpu.launch import current_device
    from autogemm.measure.measurers import measurer_for
    from autogemm.problem import Problem

    device = current_device()
    if device.compute_capability != (9, 0):
        pytest.skip("the Hopper family runs on sm_90")
    problem = Problem.from_layout(2048, 2048, 4096, "nt", dtype="bfloat16")
    measurer = measurer_for(problem, device)
    config = config_from_name("hopper_128x160x64_w64x160_s5_g8_k1_o1_p_sw")
    sustained = measurer.sustained([config])
    assert len(sustained.kernel_rounds) == 1 and len(sustained.kernel_rounds[0]) == sustained.rounds == 20
    assert set(sustained.baselines) == {"cublaslt", "cupy.matmul"} and measurer.baselines == sustained.baselines
    # the ratio to the faster baseline is that of two bf16 GEMMs of one size: within a factor of two
    assert 0.5 < sustained.baseline_ms / sustained.kernel_ms[0] < 2.0
    # (the noise is what the rounds measured: on a GPU the quick tier's workers share it reached 8%)
    assert 0.01 <= sustained.noise(0) < 1.0
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return
    assert sustained.sm_clock_mhz > 100 and sustained.power_w > 10
