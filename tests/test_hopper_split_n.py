"""Two Hopper consumers that split the tile's columns (wm = bm, wn = bn / 2; templates/hopper_gemm.cu.j2
SPLIT_N): a 192 x 192 tile as two 192 x 96 shares, the tile cuBLAS runs on LLM prefill products. What the
config allows, that it renders each consumer's half of B and of C (from registers, or into TMA store chunks
the two share), and that its kernels compile without spills. CPU only; tests/test_gpu_kernels.py and
tests/test_gpu_epilogue.py run them against float64."""

from __future__ import annotations

import dataclasses

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.kernels.render import render
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills, refuses_with

SPLIT = "hopper_192x192x64_w192x96_s4_g8_k1_o1_p"
PREFILL = Problem.from_layout(6144, 18944, 3584, "nt", dtype="bfloat16")
VARIANTS = [
    (SPLIT, PREFILL),
    (SPLIT + "_c2", Problem.from_layout(1000, 3001, 520, "tt", dtype="float16", epilogue=Epilogue("n", "gelu", True))),
    ("hopper_192x192x64_w192x96_s4_g8_k1_o1_p_c2_ts", PREFILL),
    ("hopper_192x192x64_w192x96_s3_g8_k1_o1_p_ts_fa",
     Problem.from_layout(1000, 3001, 520, "tt", dtype="float16", epilogue=Epilogue("n", "gelu", True))),
    ("hopper_128x256x64_w128x128_s4_g8_k1_o1", Problem.from_layout(1000, 3001, 520, "nn", dtype="float16")),
    ("hopper_128x160x64_w128x80_s5_g8_k1_o1_p", Problem.from_layout(640, 4096, 4096, "nt", dtype="bfloat16")),
]


def test_a_split_n_config_names_two_consumers_of_the_tiles_rows_and_half_its_columns():
    config = config_from_name(SPLIT)
    assert config.name == SPLIT and config.split_n and config.consumers == 2 and config.accumulators() == 3 * 48
    assert config.check(PREFILL, H200) == []
    code = render(config, PREFILL).code
    assert "constexpr int CN = BN / CONSUMERS;" in code and "m64n96k16" in code
    # each consumer reads B from its first column, and its stores start there
    assert "operand_descriptor<B_MN_MAJOR, BN>(stage + A_STAGE_BYTES, col0, ks)" in code and "n0 += col0;" in code
    # a consumer spanning the columns renders none of it
    rows = config_from_name("hopper_128x256x64_w64x256_s4_g8_k1_o1_p")
    assert not rows.split_n and rows.consumers == 2
    plain = render(rows, PREFILL).code
    assert "CN" not in plain and "col0" not in plain and "m64n256k16" in plain
    # with the TMA store the two consumers share one chunk and meet at a barrier of both before and after
    # writing it, so that four stages fit beside it (cuBLAS's 192 x 192 runs four; three ran 20% more cycles)
    stored = config_from_name("hopper_192x192x64_w192x96_s4_g8_k1_o1_p_ts")
    assert stored.check(PREFILL, H200) == []
    # four stages of 192 x 64 of A and of B, one chunk of 192 rows x 128 bytes (shared, not two a consumer),
    # a full and an empty barrier a stage, and a swizzle period of slack (the kernel's static_assert agrees)
    assert stored.smem_bytes(PREFILL) == 4 * (192 + 192) * 64 * 2 + 192 * 128 + 2 * 4 * 8 + 1024
    code = render(stored, PREFILL).code
    assert code.count('asm volatile("bar.sync 5, %0;') == 2 and "constexpr int STORE_BUFFERS = 1;" in code
    assert "bar.sync 5" not in plain and "constexpr int STORE_BUFFERS = 2;" in plain


@pytest.mark.parametrize("name, problem, reason", [
    # what split N is written for so far: one tile a block, both consumers on it, stored from registers
    (SPLIT + "_pp", PREFILL, "split-n: consumers that split N"),
    ("hopper_192x192x64_w192x96_s4_g8_k2_o1_p", PREFILL, "split-n: consumers that split N"),
    ("hopper_192x192x64_w192x96_s3_g8_k1_o1_p_ts_stm", PREFILL, "split-n: consumers that split N"),
    ("hopper_192x192x64_w192x96_s3_g8_k1_o1_p_ts_pl", PREFILL, "split-n: consumers that split N"),
    (SPLIT + "_sk", PREFILL, "split-n: consumers that split N"),
    (SPLIT + "_sw", PREFILL, "split-n: consumers that split N"),
    (SPLIT, dataclasses.replace(PREFILL, dtype="float32", compute="tf32"), "dtype: consumers that split N"),
    (SPLIT, Problem.from_layout(512, 512, 512, "nt", dtype="float8_e4m3fn", epilogue=Epilogue(scale="tensor", out_dtype="bfloat16")),
     "dtype: consumers that split N"),
    # B stored K x N comes in boxes of 64 columns: the second consumer's 96 would start inside one
    (SPLIT, dataclasses.replace(PREFILL, trans_b=False), "fragment: a consumer's wn=96 must be a multiple of 64"),
    # the consumers split the columns in two, and then own all the rows
    ("hopper_192x192x64_w192x64_s4_g8_k1_o1_p", PREFILL, "warp-tile"),
    ("hopper_128x192x64_w64x96_s4_g8_k1_o1_p", PREFILL, "warp-tile"),
    # 4 x 64 accumulators a thread: beyond what the consumer's registers hold
    ("hopper_256x256x64_w256x128_s2_g8_k1_o1_p", PREFILL, "registers"),
    # five stages of 192 x 64 and 192 x 64 do not fit, with or without the store chunk
    ("hopper_192x192x64_w192x96_s5_g8_k1_o1_p", PREFILL, "shared-memory"),
    ("hopper_192x192x64_w192x96_s5_g8_k1_o1_p_ts", PREFILL, "shared-memory"),
])
def test_split_n_refuses_what_it_is_not_written_for(name, problem, reason):
    refuses_with(name, problem, reason)


@pytest.mark.parametrize("name, problem", VARIANTS, ids=[f"{n}-{p.layout}" for n, p in VARIANTS])
def test_split_n_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)


def test_the_gpu_tests_of_split_n_and_preload_run_on_an_h200():
    """tests/test_gpu_epilogue.py skips a tile case its GPU's check refuses: on an H200 none of these may be."""
    import test_gpu_epilogue

    cases = [*test_gpu_epilogue._split_n_cases(), *test_gpu_epilogue._preload_cases()]
    assert len(cases) == 9
    assert {config.name: config.check(problem, H200) for config, problem in cases} == {c.name: [] for c, _ in cases}


@pytest.mark.parametrize("bn", [192, 256, 128])
def test_the_shared_store_chunks_take_each_column_of_the_tile_once(bn):
    """The split-N TMA store's arithmetic (templates/hopper_gemm.cu.j2, SPLIT_N), replayed: consumer c's group
    j of 8 columns (col0 = c * CN) goes to chunk (col0 + 8 j) / 64 at column (col0 + 8 j) % 64, a lane's pair
    at 2 t and 2 t + 1 of it. Every column of every chunk is written once, by one thread of one consumer."""
    atom, consumers = 64, 2
    cn = bn // consumers
    written: dict[tuple[int, int], int] = {}
    for consumer in range(consumers):
        col0 = consumer * cn
        for j in range(cn // 8):
            column = col0 + j * 8
            for t in range(4):
                for e in range(2):
                    key = (column // atom, column % atom + 2 * t + e)
                    written[key] = written.get(key, 0) + 1
                    assert key[0] * atom + key[1] == col0 + 8 * j + 2 * t + e  # (the accumulator's own column)
    assert written == {(q, c): 1 for q in range(bn // atom) for c in range(atom)}


def test_nvrtc_compiles_the_split_n_store_and_preload(tmp_path, monkeypatch):
    """What serves compiles with NVRTC, not nvcc (no host compiler behind it): split N's shared TMA store chunks
    with a fused epilogue, and preload's loads ahead, by the installed NVRTC."""
    from autogemm.kernels import compile as kernel_compile

    monkeypatch.setenv("AUTOGEMM_CUBIN_DIR", str(tmp_path))  # compiled here and now, none reused
    layer = Problem.from_layout(1000, 3001, 520, "nt", dtype="bfloat16", epilogue=Epilogue("n", "gelu", True))
    for name in ("hopper_192x192x64_w192x96_s3_g8_k1_o1_p_c2_ts", "hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_pl"):
        cubin = kernel_compile.compile_to_cubin(render(config_from_name(name), layer), "sm_90")
        assert cubin.read_bytes()[:4] == b"\x7fELF"
