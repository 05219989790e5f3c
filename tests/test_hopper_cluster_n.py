"""The Hopper family's `cluster_n` knob (templates/hopper_gemm.cu.j2, CLUSTER_N): the blocks of a cluster also take
horizontally adjacent tiles, and the first block of each row of the cluster's tiles multicasts A's slices to the
row (with `cluster` 2 as well, clusters of 2 x 2 tiles). Measured on an H200 against the same configs without it
(docs/kernels.md): no faster on one-wave products of few rows, where multicast along either axis cost time, so the
search space does not offer it. What the config allows, that it renders only where asked (every shipped record as
before: test_waves), how its tiles count, and that its kernels compile without spills. CPU only;
tests/test_gpu_kernels.py runs them against float64."""

from __future__ import annotations

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.families.waves import fill
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills

ROW_PAIRS = "hopper_128x192x64_w64x192_s4_g16_k1_o1_p_cn2_ts_hd"
SQUARES = "hopper_128x128x64_w64x128_s4_g8_k2_o1_p_c2_cn2_hd"  # 2 x 2 tiles, K split in two, register store
PREFILL = Problem.from_layout(256, 11008, 4096, "nt", dtype="bfloat16")


def test_a_config_along_n_renders_a_multicast_of_a_and_nothing_else_changes_without_it():
    config = config_from_name(ROW_PAIRS)
    assert (config.cluster, config.cluster_n, config.cluster_blocks) == (1, 2, 2) and config.name == ROW_PAIRS
    assert config.check(PREFILL, H200) == []
    code = render(config, PREFILL).code
    assert "constexpr int CLUSTER_M = 1, CLUSTER_N = 2;" in code and "__cluster_dims__(CLUSTER, 1, 1)" in code
    assert "(unsigned short)(A_SHARERS << rank_m)" in code and "n0 >= N) continue;" in code
    plain = render(config_from_name(ROW_PAIRS.replace("_cn2", "")), PREFILL).code
    assert "CLUSTER_N" not in plain and "A_SHARERS" not in plain and "__cluster_dims__" not in plain
    assert config_from_name(SQUARES).cluster_blocks == 4


def test_its_tiles_come_in_whole_clusters():
    """256 x 11008 in 128 x 192 tiles: 2 x 58, in pairs along N 2 x 29 clusters. 2 x 2 clusters of 128 x 128
    tiles over 256 x 11136 (2 x 87 tiles) take 44 clusters, the last one's column past N running with the rest."""
    config = config_from_name(ROW_PAIRS)
    assert config.work_units(PREFILL) == 2 * 29 and fill(config, PREFILL, H200).units == 116
    squares, wider = config_from_name(SQUARES), Problem.from_layout(256, 11136, 4096, "nt", dtype="bfloat16")
    assert squares.work_units(wider) == 44 * 2  # (clusters, each a unit per K split)
    assert fill(squares, wider, H200).units == 2 * 88 * 2
    assert squares.grid_blocks(wider, H200) == H200.sm_count // 4 * 4  # (persistent: whole clusters)
    assert squares.split_workspace(wider)[1] == 44 * 4 * 2 * 4  # an int counter per consumer of each block's tile


FP8 = Problem.from_layout(512, 512, 512, "nt", dtype="float8_e4m3fn",
                          epilogue=Epilogue(scale="tensor", out_dtype="bfloat16"))
GROUPED = Problem.from_layout(512, 512, 512, "nt", batch=4, dtype="bfloat16", grouped=True)
REFUSED = [  # (config, problem, what it is refused with)
    ("hopper_128x128x64_w64x128_s4_g8_k1_o1_p_cn2_ts_sk", PREFILL, "stream_k"),
    ("hopper_192x192x64_w192x96_s4_g8_k1_o1_p_cn2_ts", PREFILL, "split N"),
    ("hopper_128x128x64_w64x128_s4_g8_k1_o1_p_cn2", GROUPED, "grouped"),
    ("hopper_128x128x128_w64x128_s4_g8_k1_o1_p_cn2_ts", FP8, "FP8"),
]


@pytest.mark.parametrize("name, problem, knob", REFUSED, ids=[knob for _, _, knob in REFUSED])
def test_it_refuses_what_it_is_not_written_for(name, problem, knob):
    reasons = config_from_name(name).check(problem, H200)
    assert any(r.startswith("cluster: cluster_n=2") and r.endswith(f"not with {knob}") for r in reasons), reasons
    assert not any(r.startswith("cluster: ") for r in config_from_name(name.replace("_cn2", "")).check(problem, H200))


VARIANTS = [
    (ROW_PAIRS, PREFILL),
    (SQUARES, Problem.from_layout(1000, 3001, 520, "nn", dtype="float16", epilogue=Epilogue("n", "gelu"))),
    # swapped, two consumers taking turns; TF32 with A's fragments from registers
    ("hopper_256x128x64_w128x128_s5_g8_k1_o1_p_cn2_ts_pp_sw_hd",
     Problem.from_layout(640, 4096, 4096, "tn", dtype="bfloat16")),
    ("hopper_128x128x32_w64x128_s4_g1_k1_o1_cn2_ts_hd",
     Problem.from_layout(1000, 3001, 520, "tt", dtype="float32", compute="tf32")),
]


@pytest.mark.parametrize("name, problem", VARIANTS, ids=[f"{n}-{p.layout}-{p.dtype}" for n, p in VARIANTS])
def test_its_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)


def test_the_search_does_not_offer_it():
    space = SearchSpace.load("hopper")
    assert tuple(space.knobs["cluster_n"]) == (1,)
    assert all(config.cluster_n == 1 for config in space.sample(40, PREFILL, H200))
