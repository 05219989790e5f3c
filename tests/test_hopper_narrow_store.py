"""Tiles whose width is no multiple of 64 (bn 96, 144, 160, 168, ... with B K-major) storing C through TMA
(templates/hopper_gemm.cu.j2): in 64-column chunks, the last one the tile's last 64 columns, overlapping the one
before. What the config allows, that only such kernels render it (every other kernel's source is unchanged:
tests/test_waves.py holds the shipped records' byte for byte), and that they compile without spills. Swapped, the
transposed pieces hold 64 of C's rows, the last group of 64 overlapping the ones before. CPU only;
tests/test_gpu_kernels.py and tests/test_gpu_epilogue.py run them against float64."""

from __future__ import annotations

import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.kernels.render import render
from autogemm.problem import Problem
from test_hopper_stream_k import H200, compiles_without_spills, refuses_with

NARROW = "hopper_128x160x64_w64x160_s4_g8_k1_o1_p_ts_hd"
ONE_WAVE = Problem.from_layout(640, 4096, 4096, "nt", dtype="bfloat16")  # 130 tiles of 128 x 160
OVERLAP = "(q * ATOM < BN - ATOM ? q * ATOM : BN - ATOM)"
ELEVEN_K = "hopper_128x168x64_w64x168_s5_g8_k1_o1_p_c2_ts_hd"
SWAPPED = "hopper_128x176x64_w64x176_s5_g8_k1_o1_p_c2_ts_sw_hd"
NN_PROJECTION = Problem.from_layout(1024, 11008, 4096, "nn", dtype="bfloat16")
GROUP = "(qc * CM < BN - CM ? qc * CM : BN - CM)"
VARIANTS = [
    (NARROW, ONE_WAVE),
    ("hopper_128x144x64_w64x144_s5_g8_k1_o1_p_ts_hd", Problem.from_layout(256, 9216, 3072, "nt", dtype="float16")),
    ("hopper_128x176x64_w64x176_s5_g8_k1_o1_p_c2_ts_hd", Problem.from_layout(256, 11008, 4096, "nt", dtype="bfloat16")),
    # widths in steps of 8: 256 x 11008 in 128 x 168 tiles is 132 (one per SM), cuBLAS's own tile there; through
    # TMA with 5 stages, and from registers with split-K's float4 slots
    (ELEVEN_K, Problem.from_layout(256, 11008, 4096, "nt", dtype="bfloat16")),
    ("hopper_128x168x64_w64x168_s4_g8_k2_o1_p_hd", Problem.from_layout(256, 11008, 4096, "nt", dtype="float16")),
    ("hopper_256x96x64_w128x96_s5_g8_k1_o1_p_ts_pp_hd", Problem.from_layout(1471, 1022, 1418, "nt", dtype="bfloat16")),
    ("hopper_128x160x64_w64x160_s4_g8_k1_o1_p_ts_fa_pl",
     Problem.from_layout(1000, 4096, 4096, "nt", dtype="float16", epilogue=Epilogue("n", "gelu"))),
    # a residual through the overlapping chunks with preload: alone, and beside a bias and GELU, on tails
    ("hopper_128x160x64_w64x160_s5_g8_k1_o1_p_ts_pl_hd",
     Problem.from_layout(4096, 5120, 27648, "nt", dtype="bfloat16", epilogue=Epilogue(residual=True))),
    ("hopper_128x224x64_w64x224_s4_g8_k1_o1_p_c2_ts_pl_hd",
     Problem.from_layout(3000, 2300, 4096, "nt", dtype="float16", epilogue=Epilogue("n", "gelu", True))),
    # swapped (NN: the kernel's B is A, K-major), in transposed pieces whose last group of 64 overlaps: 1024 x 11008
    # in 128 x 176 tiles is 516 (98% of four waves), where 128 x 256 leave the last wave 61% full
    (SWAPPED, NN_PROJECTION),
    ("hopper_128x168x64_w64x168_s4_g8_k1_o1_p_ts_pp_sw_hd",
     Problem.from_layout(1024, 11008, 4096, "nn", dtype="float16")),
    ("hopper_128x144x64_w64x144_s5_g8_k2_o1_p_c2_ts_sw_hd",
     Problem.from_layout(256, 4096, 11008, "nn", dtype="bfloat16")),
    ("hopper_128x176x64_w64x176_s4_g8_k1_o1_p_ts_sw_fa_hd",
     Problem.from_layout(1024, 11008, 4096, "nn", dtype="bfloat16", epilogue=Epilogue("n", "gelu"))),
]


def test_a_narrow_tile_stores_through_tma_with_an_overlapping_last_chunk():
    config = config_from_name(NARROW)
    assert config.check(ONE_WAVE, H200) == []
    code = render(config, ONE_WAVE).code
    assert f"for (int q = 0; q < (BN + ATOM - 1) / ATOM; ++q)" in code
    assert f"tma_store(map_c, chunk, n0 + {OVERLAP}, m0 + row0, batch)" in code
    assert "!C_TRANSPOSED && BN <= 256" in code  # (its own static_assert: TMA store allowed, unswapped)
    # the same tile from registers, and a 64-column multiple through TMA, render as before
    for name in (NARROW.replace("_ts", ""), "hopper_128x192x64_w64x192_s4_g8_k1_o1_p_ts_hd"):
        other = render(config_from_name(name), ONE_WAVE).code
        assert OVERLAP not in other and "(BN + ATOM - 1) / ATOM" not in other


@pytest.mark.parametrize("name, problem, reason", [
    # split N's shared chunk and stmatrix's chunks are whole
    ("hopper_128x160x64_w64x160_s4_g8_k1_o1_p_ts_stm_hd", ONE_WAVE, "fragment: wm=64 must be"),
    ("hopper_128x160x64_w128x80_s4_g8_k1_o1_p_ts_hd", ONE_WAVE, "fragment: wm=128 must be"),
    # a residual read at its use: its columns in common would be read again after the chunk before had stored
    # them, were it D (with preload each chunk's is copied before the chunk before is stored: below)
    (NARROW, Problem.from_layout(640, 4096, 4096, "nt", dtype="bfloat16", epilogue=Epilogue(residual=True)),
     "fragment: wm=64 must be"),
    # ... the same swapped, and stmatrix's transposed pieces are whole groups
    (SWAPPED, Problem.from_layout(1024, 11008, 4096, "nn", dtype="bfloat16", epilogue=Epilogue(residual=True)),
     "fragment: wm=64 must be"),
    (SWAPPED.replace("_hd", "_stm_hd"), NN_PROJECTION, "fragment: wm=64 must be"),
    # swapped, the overlapping group is wm columns: a tile narrower than that has none to store
    ("hopper_256x96x64_w128x96_s5_g8_k1_o1_p_ts_pp_sw_hd", NN_PROJECTION, "choice: the transposed TMA store"),
    # narrower than one chunk
    ("hopper_64x48x64_w64x48_s4_g8_k1_o1_p_ts_hd", ONE_WAVE, "fragment: wm=64 must be"),
    # B stored K x N (MN-major): its boxes are 64-column rows
    (NARROW, Problem.from_layout(640, 4096, 4096, "nn", dtype="bfloat16"), "fragment: wm=64 must be"),
])
def test_the_narrow_tma_store_refuses_what_it_is_not_written_for(name, problem, reason):
    refuses_with(name, problem, reason)


def test_a_swapped_narrow_tile_stores_transposed_pieces_with_an_overlapping_last_group():
    config = config_from_name(SWAPPED)
    assert config.check(NN_PROJECTION, H200) == []
    code = render(config, NN_PROJECTION).code
    assert "for (int q = 0; q < CM / ATOM * ((BN + CM - 1) / CM); ++q)" in code
    assert f"tma_store(map_c, chunk, m0 + row0 + qr * ATOM, n0 + {GROUP}, batch)" in code
    assert f"acc[i][4 * ({GROUP} / 8 + jj) + 2 * h + e]" in code
    assert "C_TRANSPOSED\n              && TMA_STORE" in code and OVERLAP not in code
    # a swapped width that is a multiple of 64 renders as before (the shipped records: tests/test_waves.py)
    whole = render(config_from_name("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_c2_ts_sw_hd"), NN_PROJECTION).code
    assert GROUP not in whole and "n0 + qc * CM, batch)" in whole


def test_the_gpu_tests_of_the_swapped_narrow_store_run_on_an_h200():
    """tests/test_gpu_epilogue.py skips a tile case its GPU's check refuses, and tests/test_gpu_kernels.py runs a
    QUICK config only in layouts it can run: on an H200 the swapped narrow store's may be refused in none."""
    import test_gpu_epilogue
    import test_gpu_kernels

    cases = test_gpu_epilogue._swapped_narrow_cases()
    assert cases and all(config.check(problem, H200) == [] for config, problem in cases)
    quick = [(name, dtype) for dtype, _, name in test_gpu_kernels.QUICK if "_ts_" in name and "_sw" in name
             and config_from_name(name).bn % 64]
    assert len(quick) == 1
    for name, dtype in quick:
        swapped_nn = Problem.from_layout(256, 2 * config_from_name(name).bn, 256, "nn", dtype=dtype)
        assert config_from_name(name).check(swapped_nn, H200) == [], name


def test_the_wave_seeds_of_an_nn_projection_lead_with_the_swapped_narrow_tile_through_tma():
    from autogemm.kernels.space import SearchSpace
    from autogemm.tuning.wave_seeds import wave_ranked

    assert wave_ranked(SearchSpace.load("hopper"), NN_PROJECTION, H200)[0].name == SWAPPED


def test_widths_step_by_8_and_only_they_render_their_own_assertion():
    """wgmma's N, a thread's accumulators (four per 8 columns), split-K's float4 slots and the overlapping chunks all
    step by 8 columns: 168 is taken where B is K-major, and only a width that is no multiple of 16 renders the
    assertion for 8 (every other kernel's source is unchanged)."""
    problem = Problem.from_layout(256, 11008, 4096, "nt", dtype="bfloat16")
    for name in (ELEVEN_K, ELEVEN_K.replace("_ts", ""), "hopper_128x168x64_w64x168_s4_g8_k2_o1_p_hd",
                 "hopper_128x88x64_w64x88_s6_g8_k1_o1_p_ts_hd", "hopper_256x104x64_w128x104_s5_g8_k1_o1_p_ts_pp_hd"):
        config = config_from_name(name)
        assert config.check(problem, H200) == [], name
        code = render(config, problem).code
        assert "BN % 8 == 0" in code and "BN % 16 == 0" not in code, name
    assert "BN % 16 == 0" in render(config_from_name(NARROW), ONE_WAVE).code
    # B stored K x N is read in 64-column boxes, whatever the step
    refuses_with(ELEVEN_K, Problem.from_layout(256, 11008, 4096, "nn", dtype="bfloat16"), "fragment: wm=64 must be")


def test_stream_k_refuses_widths_its_fix_up_does_not_divide():
    problem = Problem.from_layout(256, 11008, 4096, "nt", dtype="bfloat16")
    refuses_with("hopper_128x168x64_w64x168_s4_g8_k1_o1_p_ts_sk_hd", problem, "fragment: stream_k adds")
    assert config_from_name("hopper_128x176x64_w64x176_s4_g8_k1_o1_p_ts_sk_hd").check(problem, H200) == []


def test_a_residual_layer_keeps_the_narrow_tile_from_registers():
    layer = Problem.from_layout(640, 4096, 4096, "nt", dtype="bfloat16", epilogue=Epilogue(residual=True))
    assert config_from_name(NARROW.replace("_ts", "")).check(layer, H200) == []


def test_with_preload_a_residual_goes_through_the_overlapping_chunks_copied_before_the_chunk_before_is_stored():
    """With preload each chunk's residual is copied into its store buffer while the chunk before is computed; the
    last chunk overlaps the one before, so its pieces are waited for before that one is stored (D may be the
    residual itself). A residual whose rows cannot be copied in 16-byte pieces would be read at its use, after that
    store: it goes from registers. Kernels without a residual, or of whole chunks, render as before (the byte-for-byte
    test of the shipped records, and tests/test_hopper_preload.py)."""
    layer = Problem.from_layout(640, 4096, 4096, "nt", dtype="bfloat16", epilogue=Epilogue(residual=True))
    name = NARROW.replace("_hd", "_pl_hd")
    config = config_from_name(name)
    assert config.check(layer, H200) == []
    code = render(config, layer).code
    assert "if (TMA_STORE && c_mapped && beta == Acc(0) && residual_through_tma)" in code
    assert "if (q == (BN + ATOM - 1) / ATOM - 2) wait_all_pieces();" in code
    bias = Problem.from_layout(640, 4096, 4096, "nt", dtype="bfloat16", epilogue=Epilogue("n"))
    for other, problem in [(name, bias), ("hopper_128x192x64_w64x192_s4_g8_k1_o1_p_ts_pl_hd", layer)]:
        code = render(config_from_name(other), problem).code
        assert "residual_through_tma" not in code and "- 2) wait_all_pieces();" not in code
    # (tests/test_gpu_epilogue.py runs this config at 8800 x 1000 x 256, in place and not: an H200 takes it)
    assert config.check(Problem.from_layout(8800, 1000, 256, "nt", dtype="bfloat16", epilogue=Epilogue(residual=True)),
                        H200) == []


@pytest.mark.parametrize("name, problem", VARIANTS, ids=[f"{n}-{p.epilogue.key}" for n, p in VARIANTS])
def test_narrow_tma_store_kernels_compile_without_spills(name, problem):
    compiles_without_spills(name, problem)


@pytest.mark.parametrize("bn", range(72, 257, 8))
def test_the_overlapping_chunks_cover_the_tile_each_column_from_its_own_accumulator(bn):
    """The narrow store's arithmetic (templates/hopper_gemm.cu.j2: chunk q's first column, its accumulator index
    a = 4 (origin / 8 + j) + 2 h), replayed: every column of the tile is stored, each from the accumulator that
    holds it (block j' = a / 4 of 8 columns, the pair's e-th), none past the tile's bn / 2 accumulators a thread
    holds, and the chunks are whole (64 columns) and inside the tile. Swapped, the transposed pieces' groups of CM
    kernel columns (`group_column`, accumulator 4 (origin / 8 + jj) + 2 h + e) are the same arithmetic with CM for
    64: a consumer of 64 rows, the only one a swapped tile wider than CM has room for."""
    atom = 64
    chunks = (bn + atom - 1) // atom
    stored = set()
    for q in range(chunks):
        origin = q * atom if q * atom < bn - atom else bn - atom
        assert 0 <= origin and origin % 8 == 0 and origin + atom <= bn
        for j in range(atom // 8):
            for h in (0, 1):
                for t in range(4):
                    for e in (0, 1):
                        a = 4 * (origin // 8 + j) + 2 * h + e
                        column = origin + j * 8 + 2 * t + e
                        assert a < bn // 2 and 8 * (a // 4) + 2 * t + a % 2 == column
                        stored.add(column)
    assert stored == set(range(bn))


REUSED = "if (q == (BN + ATOM - 1) / ATOM - 1 && (q * ATOM < BN - ATOM ? q * ATOM : BN - ATOM) + j * 8 < q * ATOM) {"


@pytest.mark.parametrize("name", ["hopper_256x144x64_w128x144_s4_g16_k1_o1_p_ts_pp_fa_pl_hd",
                                  "hopper_128x160x64_w64x160_s4_g8_k1_o1_p_ts"])
def test_under_an_activation_the_overlapping_last_chunk_copies_the_columns_the_chunk_before_computed(name):
    """The last chunk of a tile no multiple of 64 wide overlaps the one before by 64 - bn % 64 columns. Under an
    activation (GELU's 15 operations a value) computing them twice cost a 128 x 144 ping-pong tile about 10 us of 238
    on FP16 3072 x 9216 x 2304 with a bias and GELU (an H100, sustained): the last chunk copies them out of the other buffer instead, where
    this thread wrote them, with and without preload. A bias or a residual alone, or a width of whole chunks, renders
    as before (the shipped records' byte-for-byte test holds those); tests/test_gpu_epilogue.py's tile cases run the
    copying kernels against float64."""
    gelu = Problem.from_layout(3072, 9216, 2304, "nt", dtype="float16", epilogue=Epilogue("n", "gelu"))
    code = render(config_from_name(name), gelu).code
    assert code.count(REUSED) == 1
    assert "constexpr int shift = (BN % ATOM) * int(sizeof(T));" in code
    for epilogue in (Epilogue("n"), Epilogue(residual=True), Epilogue("n", "gelu", True)):
        problem = Problem.from_layout(3072, 9216, 2304, "nt", dtype="float16", epilogue=epilogue)
        assert REUSED not in render(config_from_name(name), problem).code, epilogue
    whole = "hopper_256x128x64_w128x128_s4_g16_k1_o1_p_ts_pp_fa_pl_hd"
    assert "shift = (BN % ATOM)" not in render(config_from_name(whole), gelu).code
