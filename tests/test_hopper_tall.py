"""A Hopper consumer of two m64 blocks wider than 128 columns (hopper.py MAX_TALL_ACCUMULATORS): two consumers of
128 x 144 make a 256 x 144 tile (the shape of cuBLAS's nvjet_sm90_hsh_256x144_64x4_2x1, which is ours swapped), 144
accumulators a thread. What the config allows, what the space offers, that the limit other tiles
render stays 128 (their kernels, the shipped records' among them, unchanged), and that its kernels compile without
spills where allowed. CPU only; tests/test_gpu_epilogue.py runs three of them against float64 on tails, and
tests/test_gpu_kernels.py two on every edge shape."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills, refuses_with

TALL = "hopper_256x144x64_w128x144_s3_g8_k1_o1_p_ts_hd"
LAYER = Problem.from_layout(1024, 9216, 2304, "nt", dtype="bfloat16")
SILU = dataclasses.replace(LAYER, epilogue=Epilogue("n", "silu"))
GELU = dataclasses.replace(LAYER, epilogue=Epilogue("n", "gelu"))
# B stored K x N: 144 columns only swapped (the kernel's B is A, K-major), cuBLAS's orientation of the tile (its
# nvjet_sm90_hsh_256x144 at FP16 1000 x 4544 x 18176: 126 tiles, one wave, where 128 x 256 makes 144)
NN = Problem.from_layout(1000, 4544, 18176, "nn", dtype="float16")


def test_two_consumers_of_128_x_144_hold_144_accumulators_and_the_others_keep_128():
    config = config_from_name(TALL)
    assert config.tall_and_wide and config.accumulators() == 144 and config.max_accumulators() == 144
    assert config.check(LAYER, H200) == []
    swapped = config_from_name("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_sw_hd")
    assert swapped.check(NN, H200) == [] and swapped.check(LAYER, H200) != []
    assert swapped.check(dataclasses.replace(LAYER, epilogue=Epilogue("n", "silu"), trans_b=False), H200) == []
    code = render(config, LAYER).code
    assert "m64n144k16" in code and '"a consumer\'s accumulators fit its registers"' in code
    assert "<= 144, " in code
    # a tile of at most 128 columns a consumer of two blocks, or of one block, renders the limit it always did
    for name in ("hopper_256x128x64_w128x128_s3_g8_k1_o1_p_c2_ts_hd", "hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_hd"):
        other = config_from_name(name)
        assert not other.tall_and_wide and other.max_accumulators() == 128
        assert "<= 128, " in render(other, LAYER).code


@pytest.mark.parametrize("name, problem, reason", [
    # 160 accumulators a thread: over the tall limit too
    ("hopper_256x160x64_w128x160_s3_g8_k1_o1_p_ts_hd", LAYER, "registers: 160 accumulators"),
    # swapped without an activation or a residual it spilled 12-136 bytes (nvcc 13), except on B stored K x N from
    # registers without a bias
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_sw_hd", LAYER, "registers: a consumer of 128x144 swapped"),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_ts_sw_hd", NN, "registers: a consumer of 128x144 swapped"),
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_pp_sw_hd", NN, "registers: a consumer of 128x144 swapped"),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_sw_hd", dataclasses.replace(NN, epilogue=Epilogue("n")),
     "registers: a consumer of 128x144 swapped"),
    ("hopper_256x144x64_w128x144_s3_g8_k2_o1_p_ts_hd", LAYER, "tall:"),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_sk_hd", LAYER, "tall:"),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_ts_stm_hd", LAYER, "tall:"),
    # an activation's values preloaded spilled 8-124 bytes (now: unless the bias along N is staged in shared memory)
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_ts_pl_hd", dataclasses.replace(LAYER, epilogue=Epilogue("m", "gelu")),
     "registers: a consumer of 128x144"),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_ts_pp_fa_pl_hd",
     dataclasses.replace(LAYER, epilogue=Epilogue(activation="silu", residual=True)), "registers: a consumer of 128x144"),
    # a residual and a bias through TMA's overlapping chunks in cluster pairs spilled 16-24 bytes on tails
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_c2_ts_pl_hd",
     Problem.from_layout(3000, 2300, 4096, "nt", dtype="bfloat16", epilogue=Epilogue("n", residual=True)),
     "registers: a consumer of 128x144 in cluster pairs"),
    (TALL, dataclasses.replace(LAYER, dtype="float32", compute="tf32"), "dtype: a consumer of 128x144"),
    (TALL, Problem.from_layout(1024, 9216, 2304, "nt", dtype="float8_e4m3fn",
                               epilogue=Epilogue(scale="tensor", out_dtype="bfloat16")), "dtype: a consumer of 128x144"),
    # B stored K x N comes in boxes of 64 columns: 144 is no multiple
    (TALL, dataclasses.replace(LAYER, trans_b=False), "fragment: wm=128"),
    # a TMA store without ping-pong at four stages: 271424 bytes
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_ts_hd", LAYER, "shared-memory"),
    # SiLU's fast form beside a bias along N from global memory, through the TMA store under ping-pong in cluster
    # pairs: 12 bytes spilled (NVRTC 13.5; nvcc 13.0 none)
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_c2_ts_pp_fa_hd", SILU,
     "registers: a consumer of 128x144 in cluster pairs"),
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_ts_pp_fa_hd",
     Problem.from_layout(1000, 9000, 2304, "tt", dtype="float16", epilogue=Epilogue("n", "silu")),
     "registers: a consumer of 128x144 in cluster pairs under ping-pong"),
])
def test_a_tall_consumer_refuses_what_it_is_not_written_for(name, problem, reason):
    refuses_with(name, problem, reason)


def test_the_space_offers_144_columns_to_two_m64_blocks_a_consumer_and_no_wider():
    space = SearchSpace.load("search_spaces/hopper.toml")
    tall = [config for config in space.all_configs if config.tall_and_wide]
    assert tall and {config.bn for config in tall} == {144}
    assert all(config.wm == 128 and config.accumulators() == 144 for config in tall)
    assert space.knob_values(config_from_name(TALL)) is not None


# what ptxas compiled without spills (nvcc 13.0, and NVRTC 13.5 as served) over BF16 and FP16, NT and TT, with
# and without the TMA store, ping-pong, a cluster pair, fast activations and preloaded biases and residuals
# (where allowed), at 3 and 4 stages; a sample
@pytest.mark.parametrize("name, problem", [
    (TALL, LAYER),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_c2_ts_pp_fa_hd", GELU),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_c2_ts_pp_fa_pl_hd", SILU),  # (the bias staged: see the refusals)
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_pp_hd", Problem.from_layout(3000, 2300, 9216, "tt", dtype="float16",
                                                                         epilogue=Epilogue("n", "gelu", True))),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_ts_pp_pl_hd", dataclasses.replace(LAYER, epilogue=Epilogue("n"))),
    # an activation's values preloaded with the bias staged in shared memory: the ping-pong SiLU kernel spilled 48
    # bytes before the staging (BF16 NT, tails)
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_ts_pp_fa_pl_hd",
     Problem.from_layout(1000, 9000, 2304, "nt", dtype="bfloat16", epilogue=Epilogue("n", "silu"))),
    ("hopper_256x144x64_w128x144_s3_g8_k1_o1_p_c2_ts_fa_pl_hd",
     Problem.from_layout(1000, 9000, 2304, "tt", dtype="float16", epilogue=Epilogue("n", "gelu"))),
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_hd", Problem.from_layout(3072, 2304, 9216, "nt", dtype="float16",
                                                                         epilogue=Epilogue(residual=True))),
    ("hopper_256x144x64_w128x144_s5_g8_k1_o1_p_pp_hd", Problem.from_layout(3072, 2304, 9216, "nt", dtype="float16",
                                                                         epilogue=Epilogue(residual=True))),
    # a row's values loaded a group at a time from registers (preload without the TMA store): a residual under
    # ping-pong, and SiLU with the bias staged in a cluster pair, tails
    ("hopper_256x144x64_w128x144_s5_g8_k1_o1_p_pp_pl_hd", Problem.from_layout(3072, 2304, 9216, "nt", dtype="float16",
                                                                            epilogue=Epilogue(residual=True))),
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_pl_hd", Problem.from_layout(1000, 9000, 2304, "tt", dtype="float16",
                                                                            epilogue=Epilogue("n", "silu"))),
    # a residual through the TMA store's overlapping chunks, copied ahead (preload), under ping-pong
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_ts_pp_pl_hd", Problem.from_layout(3072, 2304, 9216, "nt", dtype="float16",
                                                                               epilogue=Epilogue(residual=True))),
    # swapped: B stored K x N from registers, and with an activation or a residual
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_sw_hd", NN),
    ("hopper_256x144x64_w128x144_s5_g8_k1_o1_p_pp_sw_hd", dataclasses.replace(NN, dtype="bfloat16")),
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_ts_pp_sw_fa_hd", dataclasses.replace(SILU, trans_b=False)),
    ("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_c2_sw_hd", Problem.from_layout(1000, 3001, 520, "nt", dtype="float16",
                                                                           epilogue=Epilogue("n", "gelu", True))),
])
def test_tall_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)


def test_a_residual_layers_tall_seed_takes_its_residual_ahead_through_tma_or_from_registers():
    """The tall tile's last chunk of 64 columns overlaps the one before, whose residual, were it D itself, would be
    read after it was written: without preload it stores a residual from registers, where each pair's residual
    waited for the store before it. With preload its TMA store copies each chunk's residual ahead (the last one's
    landed before the one before is stored), and from registers it loads a row's a group of pairs at a time: the
    wave seeds' first for seed 8123's residual layer is the tall tile through TMA, and from registers (5 stages,
    which TMA's chunks leave no room for) it is allowed too."""
    from autogemm.tuning.wave_seeds import wave_ranked

    residual = Problem.from_layout(3072, 2304, 9216, "nt", dtype="float16", epilogue=Epilogue(residual=True))
    first = wave_ranked(SearchSpace.load("hopper"), residual, H200)[0]
    assert first.tall_and_wide and first.tma_store and first.preload, first.name
    assert config_from_name("hopper_256x144x64_w128x144_s5_g8_k1_o1_p_pp_pl_hd").check(residual, H200) == []
    refuses_with("hopper_256x144x64_w128x144_s4_g8_k1_o1_p_ts_pp_hd", residual, "fragment:")


def test_the_gpu_tests_of_the_tall_tile_run_on_an_h200():
    """tests/test_gpu_epilogue.py skips a tile case its GPU's check refuses: on an H200 neither may be."""
    import test_gpu_epilogue

    cases = test_gpu_epilogue._tall_cases()
    assert len(cases) == 3 and all(config.tall_and_wide for config, _ in cases)
    assert {config.name: config.check(problem, H200) for config, problem in cases} == {c.name: [] for c, _ in cases}


def test_nvrtc_compiles_the_tall_tiles_of_the_gpu_tests(tmp_path, monkeypatch):
    """What serves compiles with NVRTC, not nvcc: the GPU tests' two tall kernels, by the installed NVRTC."""
    import test_gpu_epilogue

    from autogemm.kernels import compile as kernel_compile

    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path))  # compiled here and now, none reused
    for config, problem in test_gpu_epilogue._tall_cases():
        cubin = kernel_compile.compile_to_cubin(render(config, problem), "sm_90")
        assert cubin.read_bytes()[:4] == b"\x7fELF"
