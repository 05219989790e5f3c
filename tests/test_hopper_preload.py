"""The Hopper family's `preload` knob (templates/hopper_gemm.cu.j2): a TMA-stored chunk's epilogue values (the
bias along N once a chunk, the bias along M and the residual once a row) loaded before any of them is used,
where the store otherwise loads each just ahead of its use; stored from registers, a row's values a group of
pairs at a time. What the config allows, that it renders only where asked, and that its kernels compile without
spills. CPU only; tests/test_gpu_epilogue.py runs them against float64."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills, refuses_with

PRELOAD = "hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_pl"
LAYER = Problem.from_layout(6144, 13824, 5120, "nt", dtype="bfloat16", epilogue=Epilogue("n", "gelu", True))
VARIANTS = [
    (PRELOAD, LAYER),
    ("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_ts_fa_pl",
     Problem.from_layout(1536, 18176, 4544, "nt", dtype="float16", epilogue=Epilogue("n", "silu"))),
    ("hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts_pp_fa_pl",
     Problem.from_layout(1000, 3001, 520, "tt", dtype="float16", epilogue=Epilogue("m", "silu"))),
    ("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts_pl",
     Problem.from_layout(1000, 3001, 520, "nn", dtype="bfloat16", epilogue=Epilogue(residual=True))),
    # ping-pong's 128-row consumers with GELU's fast form: 8 bytes spilled before its constants were folded
    ("hopper_256x128x64_w128x128_s5_g8_k1_o1_p_ts_pp_fa_pl_hd",
     Problem.from_layout(2048, 13824, 5120, "nt", dtype="float16", epilogue=Epilogue("n", "gelu"))),
    # ... with a residual and no activation; 64-row ping-pong consumers with all three
    ("hopper_256x128x64_w128x128_s4_g8_k1_o1_p_ts_pp_pl_hd",
     Problem.from_layout(2048, 13824, 5120, "nt", dtype="bfloat16", epilogue=Epilogue(residual=True))),
    ("hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_pp_fa_pl_hd", LAYER),
    # a bias along N staged in shared memory (test_gpu_epilogue's kernels of it): sharing the tile, and ping-pong
    ("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_ts_pl_hd",
     Problem.from_layout(8800, 1001, 256, "nt", dtype="bfloat16", epilogue=Epilogue("n"))),
    ("hopper_256x128x64_w128x128_s3_g8_k1_o1_p_ts_pp_pl_hd",
     Problem.from_layout(8800, 1001, 256, "nt", dtype="bfloat16", epilogue=Epilogue("n"))),
]
# stored from registers (test_gpu_epilogue's kernels of it): a bias staged, GELU and a residual, two groups of 16
# pairs a row; a bias along M and a residual under ping-pong; SiLU and a residual in a cluster pair, 24 pairs a row
REGISTER_VARIANTS = [
    ("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_pl_hd",
     Problem.from_layout(8800, 1001, 256, "nt", dtype="bfloat16", epilogue=Epilogue("n", "gelu", True))),
    ("hopper_256x128x64_w128x128_s4_g8_k1_o1_p_pp_pl_hd",
     Problem.from_layout(8800, 1001, 256, "nt", dtype="float16", epilogue=Epilogue("m", residual=True))),
    ("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_c2_pl",
     Problem.from_layout(333, 1000, 256, "nt", dtype="bfloat16", epilogue=Epilogue("n", "silu", True))),
    ("hopper_128x128x32_w64x128_s4_g8_k1_o1_p_pl",
     Problem.from_layout(1000, 3000, 1024, "nt", dtype="float32", compute="tf32",
                         epilogue=Epilogue("n", "gelu", True))),
    # a residual alone under ping-pong at 3072 x 2304 x 9216, whole tiles (the SASS the groups were written for
    # loaded it a pair at a time, each pair after the store before it)
    ("hopper_256x128x64_w128x128_s5_g8_k1_o1_p_pp_pl_hd",
     Problem.from_layout(3072, 2304, 9216, "nt", dtype="float16", epilogue=Epilogue(residual=True))),
]


def test_a_preload_config_names_renders_the_loads_ahead_and_nothing_else_changes_without_it():
    config = config_from_name(PRELOAD)
    assert config.preload and config.name == PRELOAD and config.check(LAYER, H200) == []
    code = render(config, LAYER).code
    assert "Two bias_pairs[" in code and "Two residual_pairs[" in code and "finish_given" in code
    plain = render(config_from_name(PRELOAD.removesuffix("_pl")), LAYER).code
    assert "bias_pairs" not in plain and "finish_given" not in plain
    # a bias along M is loaded once a row, no pairs along N
    along_m = Problem.from_layout(6144, 13824, 5120, "nt", dtype="bfloat16", epilogue=Epilogue("m", "relu"))
    code = render(config, along_m).code
    assert "bias_m = " in code and "bias_pairs" not in code and "residual_pairs" not in code


def test_stored_from_registers_a_rows_values_are_loaded_a_group_at_a_time_and_tma_kernels_keep_their_code():
    """Stored from registers, each output's bias and residual had been loaded after the store before it (C may be
    the residual itself: a chain of round trips to memory, 64 a tile in the SASS of a 128 x 256 kernel with a
    residual). With preload a row's values are loaded a group of pairs at a time before any of its outputs
    is written. A kernel with the TMA store goes to its register store only where C cannot take TMA's, and keeps
    the code it had there."""
    name, problem = REGISTER_VARIANTS[0]
    config = config_from_name(name)
    assert not config.tma_store and config.preload and config.check(problem, H200) == []
    code = render(config, problem).code
    assert "constexpr int ROW_PAIRS = BN / 8;" in code and "residual_pairs[p].x = inside_0 ? row_r[" in code
    assert "ROW_PAIRS" not in render(config_from_name(name.replace("_pl", "")), problem).code
    assert "ROW_PAIRS" not in render(config_from_name(PRELOAD), LAYER).code


@pytest.mark.parametrize("name, problem, reason", [
    # it loads for the consumers' own untransposed stores
    ("hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_sw_pl", LAYER, "choice: preload loads the epilogue's values"),
    ("hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_stm_pl", LAYER, "choice: preload loads the epilogue's values"),
    # nothing to load: the same kernel as without it
    (PRELOAD, Problem.from_layout(4096, 4096, 4096, "nt", dtype="bfloat16", epilogue=Epilogue(activation="gelu")),
     "choice: preload loads a bias or a residual"),
    (PRELOAD, Problem.from_layout(4096, 4096, 4096, "nt", dtype="bfloat16"), "choice: preload loads a bias or a residual"),
    # consumers of 128 rows (ping-pong or sharing the tile) with an activation and a residual spill
    ("hopper_256x128x64_w128x128_s4_g8_k1_o1_p_ts_pp_fa_pl_hd", LAYER, "registers: preload with consumers of 128"),
    ("hopper_256x64x64_w128x64_s4_g8_k1_o1_p_ts_pp_pl_hd",
     Problem.from_layout(2048, 13824, 5120, "nt", dtype="bfloat16", epilogue=Epilogue(activation="gelu", residual=True)),
     "registers: preload with consumers of 128"),
    ("hopper_256x128x64_w128x128_s3_g8_k1_o1_p_c2_ts_fa_pl_hd", LAYER, "registers: preload with consumers of 128"),
    # ... stored from registers too (ping-pong with the fast SiLU and a residual: 16 bytes)
    ("hopper_256x128x64_w128x128_s5_g8_k1_o1_p_pp_fa_pl_hd",
     Problem.from_layout(3072, 2304, 9216, "nt", dtype="float16", epilogue=Epilogue("n", "silu", True)),
     "registers: preload with consumers of 128"),
    ("hopper_128x128x128_w64x128_s4_g8_k1_o1_p_ts_pl",
     Problem.from_layout(512, 512, 512, "nt", dtype="float8_e4m3fn", epilogue=Epilogue(scale="row", out_dtype="bfloat16")),
     "dtype: preload is written for 16-bit and TF32 products"),
])
def test_preload_refuses_what_it_is_not_written_for(name, problem, reason):
    refuses_with(name, problem, reason)


@pytest.mark.parametrize("name, problem", VARIANTS + REGISTER_VARIANTS,
                         ids=[f"{n}-{p.epilogue.key}" for n, p in VARIANTS + REGISTER_VARIANTS])
def test_preload_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)


def test_the_space_offers_it_only_to_epilogues_that_load_a_bias_or_a_residual():
    space = SearchSpace.load("hopper")
    for epilogue, loads in [(Epilogue(), False), (Epilogue(activation="gelu"), False), (Epilogue("n"), True),
                            (Epilogue("m", "silu"), True), (Epilogue(residual=True), True)]:
        offered = space.knob_choices(dataclasses.replace(LAYER, epilogue=epilogue), H200)["preload"]
        assert offered == ((False, True) if loads else (False,)), (epilogue, offered)


def test_a_new_studys_wave_seeds_load_a_bias_ahead_where_their_stores_are_their_own():
    """Measured on an H200 (session 60, sustained, BF16, a bias along N at 6144 x 4672 x 4544): 128 x 256 tiles
    ran 452 us without preload and 433 with, ping-pong 256 x 128 ones 424 and 408. waves.PRELOADED_LOADS prices
    that, so the seeds of a bias layer load ahead wherever they store untransposed (through TMA, or from registers
    where a tile refuses TMA's store), and a layer with no bias gets none."""
    from autogemm.tuning.wave_seeds import wave_ranked

    space = SearchSpace.load("hopper")
    bias = Problem.from_layout(6144, 4672, 4544, "nt", dtype="bfloat16", epilogue=Epilogue("n"))
    unswapped = [config for config in wave_ranked(space, bias, H200) if not config.swap]
    assert unswapped and all(config.preload for config in unswapped), [c.name for c in unswapped]
    bare = wave_ranked(space, dataclasses.replace(bias, epilogue=Epilogue()), H200)
    assert bare and not any(config.preload for config in bare)


def test_a_bias_along_n_is_staged_in_shared_memory_at_the_tile_s_start_where_one_unit_stores_the_tile():
    """With preload and a bias along N, each consumer copies its tile's bias into shared memory of its own when it
    starts the tile (stage_bias), and its chunks read it there: in the SASS of 128 x 192, 256 x 128 ping-pong and
    256 x 144 tiles, the chunks' global loads of the bias waited one after the other. Its shared memory is counted
    (a kernel's static_assert holds the layout to it: the compiles above). Split-K's units, a bias along M and
    kernels without preload load as before."""
    bias = dataclasses.replace(LAYER, epilogue=Epilogue("n"))
    config = config_from_name(PRELOAD)
    code = render(config, bias).code
    assert config.stages_bias(bias) and "stage_bias(staged_bias + consumer * BIAS_STAGE_BYTES" in code
    assert "bias_pairs[j] = *reinterpret_cast<const Two*>(tile_bias" in code and "bias_pairs[j].x = n < N" not in code
    unstaged = config_from_name(PRELOAD.removesuffix("_pl"))
    assert config.smem_bytes(bias) == unstaged.smem_bytes(bias) + 2 * 512  # two consumers, 256 BF16 values each
    narrow = config_from_name("hopper_128x136x64_w64x136_s5_g8_k1_o1_p_ts_pl")  # (272 bytes: 17 pieces of 16)
    assert narrow.smem_bytes(bias) - config_from_name(narrow.name.removesuffix("_pl")).smem_bytes(bias) == 2 * 272
    for name, problem in [(PRELOAD.replace("_k1_", "_k2_"), bias),  # split-K's units
                          (PRELOAD, dataclasses.replace(LAYER, epilogue=Epilogue("m"))),  # a bias along M
                          (PRELOAD.removesuffix("_pl"), bias)]:  # no preload
        other = config_from_name(name)
        assert not other.stages_bias(problem) and "stage_bias" not in render(other, problem).code, name
    # stored from registers too: read there a group at a time, the consumer met again before the next tile's copies
    name, problem = REGISTER_VARIANTS[0]
    from_registers = dataclasses.replace(problem, epilogue=Epilogue("n"))
    code = render(config_from_name(name), from_registers).code
    assert config_from_name(name).stages_bias(from_registers)
    assert "bias_pairs[p] = *reinterpret_cast<const Two*>(tile_bias" in code
    assert "consumer_sync(consumer);   // every thread has read the staged bias" in code
    # the layout without it is the one before (the static_assert names no staged bias)
    assert "BIAS_BYTES" not in render(config, dataclasses.replace(LAYER, epilogue=Epilogue(residual=True))).code


def test_nvrtc_compiles_the_staged_bias_kernels_of_the_gpu_tests(tmp_path, monkeypatch):
    """What serves compiles with NVRTC, not nvcc: test_gpu_epilogue's two kernels with a staged bias."""
    from autogemm.kernels import compile as kernel_compile

    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path))  # compiled here and now, none reused
    for name, problem in VARIANTS[-2:]:
        config = config_from_name(name)
        assert config.stages_bias(problem)
        cubin = kernel_compile.compile_to_cubin(render(config, problem), "sm_90")
        assert cubin.read_bytes()[:4] == b"\x7fELF"


def test_the_gpu_tests_of_the_register_stores_preload_run_on_an_h200():
    """tests/test_gpu_epilogue.py's kernels of it, at its shapes: an H200 takes each (the test does not skip)."""
    import test_gpu_epilogue

    for name, epilogue, shapes in test_gpu_epilogue.REGISTER_PRELOAD_CASES:
        config = config_from_name(name)
        assert not config.tma_store and config.preload
        for m, n in shapes:
            problem = Problem.from_layout(m, n, 256, "nt", dtype="bfloat16", epilogue=epilogue)
            assert config.check(problem, H200) == [], (name, m, n)
