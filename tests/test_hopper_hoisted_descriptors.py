"""The Hopper family's `hoisted_descriptors` knob (templates/hopper_gemm.cu.j2, HOISTED_DESCRIPTORS): a K slice's two
shared-memory descriptors computed once, each wgmma's as theirs plus a constant, from a consumer index ptxas knows
to be warp-uniform. On an H200 the main loop then runs the same cycles with 28% fewer instructions (ncu, BF16
4096 x 13824 x 5120, 128 x 192 in pairs: 99.9 M against 139.4 M) and 0.7% faster sustained at the power limit on
average over 9 pairs (docs/kernels.md). What the config allows, that it renders only where asked, that the search
offers it alone while records tuned without it render as before, and that its kernels compile without spills. CPU
only; tests/test_gpu_kernels.py runs them against float64."""

from __future__ import annotations

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace
from autogemm.problem import Problem
from autogemm.tuning.wave_seeds import wave_ranked
from test_hopper_stream_k import H200, compiles_without_spills, refuses_with

HOISTED = "hopper_128x192x64_w64x192_s4_g8_k1_o1_p_c2_ts_hd"
PREFILL = Problem.from_layout(4096, 13824, 5120, "nt", dtype="bfloat16")
VARIANTS = [
    (HOISTED, PREFILL),
    # two consumers taking turns; A MN-major (stored K x M) in TN
    ("hopper_256x128x64_w128x128_s5_g8_k1_o1_p_ts_pp_hd", Problem.from_layout(27648, 5120, 1024, "tn", dtype="bfloat16")),
    # B MN-major (stored K x N) in NN, a bias and GELU in the store
    ("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts_hd",
     Problem.from_layout(1000, 3001, 520, "nn", dtype="float16", epilogue=Epilogue("n", "gelu"))),
    # two consumers that split N: B's descriptor starts at the consumer's column
    ("hopper_192x192x64_w192x96_s4_g8_k1_o1_p_c2_ts_hd", PREFILL),
    # TF32, A's fragments from registers (only B's descriptor is hoisted), and swapped
    ("hopper_128x128x32_w64x128_s4_g1_k1_o1_ts_hd", Problem.from_layout(1000, 3001, 520, "tt", dtype="float32", compute="tf32")),
    ("hopper_128x256x32_w64x256_s4_g8_k1_o1_p_ts_sw_hd", Problem.from_layout(1000, 3001, 520, "nn", dtype="float32", compute="tf32")),
    # FP8 scaled by tensor (the plain main loop)
    ("hopper_128x128x128_w64x128_s4_g8_k1_o1_p_ts_hd",
     Problem.from_layout(512, 512, 512, "nt", dtype="float8_e4m3fn", epilogue=Epilogue(scale="tensor", out_dtype="bfloat16"))),
]


def test_a_hoisted_config_renders_the_slice_descriptors_once_and_nothing_else_changes_without_it():
    config = config_from_name(HOISTED)
    assert config.hoisted_descriptors and config.name == HOISTED and config.check(PREFILL, H200) == []
    code = render(config, PREFILL).code
    assert code.count("operand_step<") == 2  # B's step and A's, in the slice's loop
    assert "const unsigned long long slice_a = operand_descriptor<A_MN_MAJOR, TM>(stage, row0, 0);" in code
    assert "__shfl_sync(0xffffffffu, warpgroup, 0) - 1" in code
    plain = render(config_from_name(HOISTED.removesuffix("_hd")), PREFILL).code
    assert "operand_step" not in plain and "__shfl_sync" not in plain and "slice_a" not in plain
    assert "operand_descriptor<A_MN_MAJOR, TM>(stage, row0 + i * 64, ks)" in plain


def test_block_scaled_products_refuse_it():
    """FP8's block-scaled main loops compute their descriptors as before: the knob would change nothing there."""
    block = Problem.from_layout(512, 512, 512, "nt", dtype="float8_e4m3fn",
                                epilogue=Epilogue(scale="block", out_dtype="bfloat16"))
    refuses_with("hopper_128x128x128_w64x128_s4_g8_k1_o1_p_ts_hd", block, "choice: hoisted_descriptors")
    assert config_from_name("hopper_128x128x128_w64x128_s4_g8_k1_o1_p_ts").check(block, H200) == []


@pytest.mark.parametrize("name, problem", VARIANTS, ids=[f"{n}-{p.layout}-{p.dtype}" for n, p in VARIANTS])
def test_hoisted_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)


def test_the_search_offers_it_alone_and_its_seeds_take_it():
    """New tunes measure only kernels with it (the same cycles, fewer instructions; never slower beyond the
    rounds' spread where measured); a record tuned without it names a config without it, which renders as
    before (test_waves' digests)."""
    space = SearchSpace.load("hopper")
    assert tuple(space.knobs["hoisted_descriptors"]) == (True,)
    assert space.seeds and all(seed.hoisted_descriptors for seed in space.seeds)
    seeds = wave_ranked(space, PREFILL, H200)
    assert seeds and all(seed.hoisted_descriptors for seed in seeds)
    draws = space.sample(40, PREFILL, H200)
    assert draws and all(config.hoisted_descriptors for config in draws)
