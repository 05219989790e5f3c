"""Hopper tiles wider than one wgmma (templates/hopper_gemm.cu.j2 WIDE): 128 x 320, each consumer of 64 rows issuing
two wgmmas a k-step (256 and 64 columns) on the two parts of its accumulators, B's K-major slice in two TMA boxes of
160 rows. cuBLAS runs this tile (nvjet_sm90_tst_320x128_64x3_1x2, column-major) on large BF16 products on an H200.
What the config allows, what it renders, the boxes the host asks TMA for, and that its kernels compile without
spills. CPU only; tests/test_gpu_kernels.py runs two of them against float64 on every edge shape."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.gpu.operands import KernelOperand
from autogemm.gpu.tma_launch import operand_layout
from autogemm.kernels.render import render
from autogemm.kernels.space import SearchSpace
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills, refuses_with

WIDE = "hopper_128x320x64_w64x320_s3_g8_k1_o1_p_c2_ts_hd"
LARGE = Problem.from_layout(4096, 14336, 4096, "nn", dtype="bfloat16")


def test_a_wide_tile_issues_two_wgmmas_over_one_consumers_accumulators():
    config = config_from_name(WIDE)
    assert config.wide and config.wgmma_pieces() == (256, 64) and config.accumulators() == 160
    for layout in ("nn", "nt", "tn", "tt"):
        assert config.check(dataclasses.replace(LARGE, trans_a=layout[0] == "t", trans_b=layout[1] == "t"), H200) == []
    code = render(config, LARGE).code
    assert "m64n256k16" in code and "m64n64k16" in code and "m64n320" not in code
    # the second instruction writes accumulators 128.. (columns 256..) and reads B from its 256th column on
    assert '"+f"(d[128])' in code and '"+f"(d[159])' in code and "desc_b + SECOND_PIECE_STEP" in code
    # a tile of one wgmma renders none of it
    narrow = render(config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts_hd"), LARGE).code
    assert "WIDE" not in narrow and "SECOND_PIECE_STEP" not in narrow and "BOX_PIECES" not in narrow


def test_b_comes_in_two_boxes_where_k_major_and_in_64_column_boxes_where_not():
    config = config_from_name(WIDE)
    nt = dataclasses.replace(LARGE, trans_b=True)
    layout, _ = operand_layout(nt, KernelOperand(True, nt.k, 0, 0), "B", config)
    assert layout.box == (64, 160, 1)  # a TMA box holds 256 rows at most: two of bn / 2
    layout, _ = operand_layout(LARGE, KernelOperand(False, LARGE.n, 0, 0), "B", config)
    assert layout.box == (64, 64, 1)  # MN-major: boxes of 64 columns by bk, five a slice
    narrow = config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p_c2_ts_hd")
    assert operand_layout(nt, KernelOperand(True, nt.k, 0, 0), "B", narrow)[0].box == (64, 256, 1)


@pytest.mark.parametrize("name, problem, reason", [
    # one m64 block a consumer: two would hold 320 accumulators a thread
    ("hopper_256x320x64_w128x320_s2_g8_k1_o1_p_hd", LARGE, "fragment: a tile wider than"),
    # 320 only: a width cuBLAS runs, whose second piece starts on one of B's 64-column boxes
    ("hopper_128x288x64_w64x288_s3_g8_k1_o1_p_hd", LARGE, "fragment: a tile wider than"),
    ("hopper_128x320x64_w64x320_s3_g8_k2_o1_p_hd", LARGE, "wide:"),
    ("hopper_128x320x64_w64x320_s3_g8_k1_o1_p_sk_hd", LARGE, "wide:"),
    ("hopper_128x320x64_w64x320_s3_g8_k1_o1_p_ts_stm_hd", LARGE, "wide:"),
    ("hopper_128x320x64_w64x320_s3_g8_k1_o1_p_c2_ts", LARGE, "choice: a tile wider than one wgmma"),
    # swapped, it spills 40-52 bytes
    ("hopper_128x320x64_w64x320_s3_g8_k1_o1_p_ts_sw_hd", LARGE, "registers: a tile wider than"),
    (WIDE, dataclasses.replace(LARGE, dtype="float32", compute="tf32", trans_b=True), "dtype: a tile wider than"),
    (WIDE, Problem.from_layout(512, 512, 512, "nt", dtype="float8_e4m3fn", epilogue=Epilogue(scale="tensor", out_dtype="bfloat16")),
     "dtype: a tile wider than"),
    # four stages of 128 + 320 rows of 128 bytes and the store chunks exceed 227 KB
    ("hopper_128x320x64_w64x320_s4_g8_k1_o1_p_c2_ts_hd", LARGE, "shared-memory"),
])
def test_a_wide_tile_refuses_what_it_is_not_written_for(name, problem, reason):
    refuses_with(name, problem, reason)


def test_the_space_offers_320_to_one_m64_block_a_consumer():
    space = SearchSpace.load("search_spaces/hopper.toml")
    assert 320 in space.knob_choices(LARGE, H200)["bn"]
    wide = [config for config in space.all_configs if config.bn == 320]
    assert wide and all(config.wm == 64 and config.accumulators() == 160 for config in wide)
    assert space.knob_values(config_from_name(WIDE)) is not None


@pytest.mark.parametrize("name, problem", [
    (WIDE, LARGE),
    (WIDE, dataclasses.replace(LARGE, trans_b=True)),
    ("hopper_128x320x64_w64x320_s4_g8_k1_o1_p_ts_pp_hd", LARGE),
    ("hopper_128x320x64_w64x320_s3_g8_k1_o1_p_hd", Problem.from_layout(1000, 3001, 520, "tt", dtype="float16")),
    (WIDE, Problem.from_layout(4000, 14000, 4000, "nt", dtype="float16", epilogue=Epilogue("n", "gelu", True))),
])
def test_wide_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)
