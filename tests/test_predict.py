"""The model that predicts a tuned config's ratio to cuBLAS on a shape nobody tuned: the fill of
the GPU's block slots over the waves a shape takes, the padding of tiles on M, N and K, and the
margin a prediction must clear (growing with the distance to the measured shape)."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.families import SimtConfig
from autogemm.predict import WIN_MARGIN, blocks_per_sm, candidates, utilization
from autogemm.problem import Device, Problem
from test_select import _record

H100 = dataclasses.replace(Device.for_arch("sm_90"), name="NVIDIA H100 80GB HBM3", sm_count=132)
CONFIG = SimtConfig(128, 128, 8, 32, 64, 8, 8, 4, 4, 2, "pad", 8, 1, 1)


def slots() -> int:
    return H100.sm_count * blocks_per_sm(CONFIG, Problem(4096, 4096, 4096), H100)


def test_whole_waves_fill_the_gpu_and_one_tile_more_halves_it():
    per_wave = slots()
    full = Problem(128, 128 * per_wave, 64)  # exactly one wave of whole tiles
    assert utilization(CONFIG, full, H100) == pytest.approx(1.0)
    one_more = Problem(128, 128 * (per_wave + 1), 64)
    assert utilization(CONFIG, one_more, H100) == pytest.approx((per_wave + 1) / (2 * per_wave))


def test_tile_padding_on_m_n_and_k_counts():
    per_wave = slots()
    padded = Problem(64, 128 * per_wave, 60)  # half of each tile's rows, 60 of 64 K columns
    assert utilization(CONFIG, padded, H100) == pytest.approx(0.5 * 60 / 64)


def test_stream_k_is_not_charged_for_the_last_wave():
    per_wave = slots()
    problem = Problem(128, 128 * (per_wave + 1), 64)
    assert utilization(CONFIG.replace(stream_k=True), problem, H100) == pytest.approx(1.0)


def test_the_margin_grows_with_distance_and_the_prediction_never_exceeds_the_measured_ratio():
    near, far = Problem(4096, 4096, 4096), Problem(256, 256, 256)
    tuned = [_record(Problem(4096, 4096, 4000), CONFIG, ratio=1.2)]
    (close,) = candidates(near, H100, tuned)
    (distant,) = candidates(far, H100, tuned)
    assert close.needed_ratio == pytest.approx(1 + WIN_MARGIN, abs=0.01) and distant.needed_ratio > close.needed_ratio + 0.1
    assert close.predicted_ratio <= 1.2 and distant.predicted_ratio < close.predicted_ratio
