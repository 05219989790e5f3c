"""`check` gives every reason it knows, each for the configuration that deserves it."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.config import WmmaConfig, REASON_CODES, SimtConfig, config_from_dict
from autogemm.problem import Device, Problem

SM90 = Device.for_arch("sm_90")
SQUARE = Problem(4096, 4096, 4096)

# (code, config, problem, device): each row must produce its code.
REASON_CASES = [
    ("dtype", SimtConfig(), Problem(64, 64, 64, dtype="float64"), SM90),
    ("choice", SimtConfig(bm=96), SQUARE, SM90),
    ("choice", SimtConfig(smem="diagonal"), SQUARE, SM90),
    ("choice", SimtConfig(vec=3), SQUARE, SM90),
    ("warp-tile", SimtConfig(wm=256), SQUARE, SM90),
    ("thread-tile", SimtConfig(wm=32, tm=64), SQUARE, SM90),
    ("warp-lanes", SimtConfig(tm=4), SQUARE, SM90),
    ("frag-vector", SimtConfig(wm=16, wn=32, tm=2, tn=8), SQUARE, SM90),
    ("threads", SimtConfig(), SQUARE, dataclasses.replace(SM90, max_threads_per_block=128)),
    ("tile-load", SimtConfig(bm=16, bn=16, bk=4, wm=16, wn=16, tm=2, tn=4, vec_frag=2), SQUARE, SM90),
    ("shared-memory", SimtConfig(), SQUARE, dataclasses.replace(SM90, smem_per_block_optin=16 * 1024)),
    ("registers", SimtConfig(wm=64, wn=128, tm=16, tn=16), SQUARE, SM90),
    ("occupancy", SimtConfig(bm=256, bn=256, wm=64, wn=64, tm=8, tn=16, min_blocks=5), SQUARE, SM90),
    ("cp-async", SimtConfig(stages=3), SQUARE, Device.for_arch("sm_75")),
    ("split-k", SimtConfig(split_k=8), Problem(256, 256, 16), SM90),
    ("grid", SimtConfig(split_k=2), Problem(64, 64, 64, batch=40000), SM90),
    ("size", SimtConfig(), Problem(2**31, 1, 1), SM90),
    ("fragment", WmmaConfig(bk=8), Problem(64, 64, 64, dtype="float16"), SM90),
    ("tensor-core", WmmaConfig(), Problem(64, 64, 64, dtype="bfloat16"), Device.for_arch("sm_75")),
    ("layout", WmmaConfig(256, 128, 32, 256, 64, 4, 4, "pad32", wgmma=True),
     Problem(4096, 4096, 4096, dtype="float32", compute="tf32", trans_a=True), SM90),
]


def test_every_reason_code_is_covered_by_a_case():
    assert {case[0] for case in REASON_CASES} == set(REASON_CODES)


@pytest.mark.parametrize("code,config,problem,device", REASON_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(REASON_CASES)])
def test_check_gives_reason(code, config, problem, device):
    reasons = config.check(problem, device)
    codes = {reason.split(":")[0] for reason in reasons}
    assert code in codes, reasons
    assert codes <= set(REASON_CODES), f"undocumented reason code in {reasons}"


def test_default_and_reference_configs_are_valid():
    from samples import REFERENCE_CONFIGS

    for config in (SimtConfig(), *REFERENCE_CONFIGS):
        assert config.check(SQUARE, SM90) == []


def test_reasons_name_the_numbers():
    (reason,) = SimtConfig(split_k=8).check(Problem(256, 256, 16), SM90)
    assert "split_k=8" in reason and "K=16" in reason


def test_name_round_trips():
    config = SimtConfig(64, 128, 16, 32, 64, 4, 8, 2, 4, 3, "swizzle", 4, 2)
    assert config.name == "64x128x16_w32x64_t4x8_v24_s3_swizzle_g4_k2_o1"
    assert SimtConfig.from_name(config.name) == config
    assert config_from_dict(config.to_dict()) == config


def test_from_dict_rejects_unknown_knobs():
    with pytest.raises(ValueError, match="unknown SIMT config knobs: colour"):
        SimtConfig.from_dict({"colour": 3})
    with pytest.raises(ValueError, match="not a SIMT config name"):
        SimtConfig.from_name("128x128")


def test_config_is_frozen_and_hashable():
    config = SimtConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.bm = 64
    assert len({config, SimtConfig()}) == 1


def test_shared_memory_counts_padding_only_for_transposed_stores():
    config = SimtConfig(smem="pad")
    nn = config.smem_bytes(Problem.from_layout(64, 64, 64, "nn"))  # A transposed into shared memory
    tn = config.smem_bytes(Problem.from_layout(64, 64, 64, "tn"))  # no transposed store
    assert nn == tn + 4 * 2 * 8 * 4
