"""Stream-K in the Hopper family (`stream_k`, templates/hopper_gemm.cu.j2 STREAM_K): what the config
allows, the grid and workspace the launcher makes for it, how it fills the SMs, that its kernels compile
without spills, and the kernel's share-out arithmetic replayed in Python: every K slice of every tile run
exactly once, and the slots of a shared tile's blocks distinct. CPU only; tests/test_gpu_kernels.py runs
the kernels against float64."""

from __future__ import annotations

import dataclasses
import pytest

from autogemm.epilogue import Epilogue
from autogemm.families import config_from_name
from autogemm.families.waves import fill, relative_cost
from autogemm.kernels.compile import find_nvcc, nvcc_resources
from autogemm.kernels.render import render
from autogemm.problem import Device, Problem

H200 = dataclasses.replace(Device.for_arch("sm_90"), name="NVIDIA H200", sm_count=132)
STREAM = "hopper_128x128x64_w64x128_s5_g8_k1_o1_p_ts_sk"


def _share_out(units: int, k_tiles: int, blocks: int):
    """The kernel's share-out, as templates/hopper_gemm.cu.j2 computes it (STREAM_K, next_segment and the
    fix-up): per block its segments (tile, kt_begin, k_slices, slot), slot None for a tile it runs whole;
    and per shared tile its blocks (first_block .. last_block) and each one's slot as the finisher reads it."""
    whole = units // blocks * blocks
    if (units - whole) * k_tiles < blocks:
        whole = units
    shared = (units - whole) * k_tiles
    segments = {}
    for w in range(blocks):
        run_begin, run_end = whole * k_tiles + shared * w // blocks, whole * k_tiles + shared * (w + 1) // blocks
        done, at, started = [], run_begin, False
        for tile in range(w, whole, blocks):
            done.append((tile, 0, k_tiles, None))
        while at < run_end:
            tile = at // k_tiles
            kt_begin = at - tile * k_tiles
            k_slices = min(run_end, (tile + 1) * k_tiles) - at
            at += k_slices
            slot = None if k_slices == k_tiles else (1 if started else 0)
            started = True
            done.append((tile, kt_begin, k_slices, slot))
        segments[w] = done
    readers = {}
    for tile in range(whole, units):
        tile_first = (tile - whole) * k_tiles
        first_block = ((tile_first + 1) * blocks - 1) // shared
        last_block = ((tile_first + k_tiles) * blocks - 1) // shared
        readers[tile] = {w: 0 if shared * w // blocks >= tile_first else 1 for w in range(first_block, last_block + 1)}
    return segments, readers


@pytest.mark.parametrize("units, k_tiles, blocks", [
    (108, 284, 132), (36, 144, 132), (216, 9, 132), (288, 47, 132), (4096, 128, 132), (1, 1, 1), (3, 1, 132),
    (133, 2, 132), (131, 300, 132), (7, 5, 3)])
def test_the_share_out_runs_every_slice_once_and_a_shared_tiles_slots_are_its_blocks(units, k_tiles, blocks):
    blocks = min(blocks, units * k_tiles)  # (the launch: HopperConfig.grid_blocks)
    segments, readers = _share_out(units, k_tiles, blocks)
    ran = [tile * k_tiles + kt for done in segments.values() for tile, begin, count, _ in done
           for kt in range(begin, begin + count)]
    assert sorted(ran) == list(range(units * k_tiles))
    assert all(done for done in segments.values()), "a block with nothing to do"
    written = {}
    for w, done in segments.items():
        slots = [slot for _, _, _, slot in done if slot is not None]
        assert slots in ([], [0], [1], [0, 1]), (w, slots)  # a slot of a block is written once
        for tile, _, count, slot in done:
            if slot is not None:
                written.setdefault(tile, {})[w] = slot
            else:
                assert tile not in readers or len(readers[tile]) == 1
    shared_partly = {tile: blocks_ for tile, blocks_ in written.items()}
    assert shared_partly == {tile: r for tile, r in readers.items() if len(r) > 1}


def test_a_stream_k_config_names_renders_and_refuses_what_it_does_not_go_with():
    config = config_from_name(STREAM)
    assert config.stream_k and config.name == STREAM and config.reduces_partial_sums
    problem = Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")
    assert config.check(problem, H200) == []
    source = render(config, problem).code
    assert "STREAM_K:" in source and "next_segment" in source
    assert "next_segment" not in render(config_from_name(STREAM[:-3]), problem).code
    for other in ("hopper_128x128x64_w64x128_s5_g8_k2_o1_p_ts_sk", "hopper_128x128x64_w64x128_s5_g8_k1_o1_p_c2_ts_sk",
                  "hopper_256x128x64_w128x128_s4_g8_k1_o1_p_ts_pp_sk", "hopper_128x128x64_w64x128_s5_g8_k1_o1_ts_sk"):
        reasons = config_from_name(other).check(problem, H200)
        assert any(r.startswith("stream-k") for r in reasons), (other, reasons)
    grouped = Problem(1024, 4096, 2048, dtype="bfloat16", trans_b=True, batch=8, grouped=True)
    assert any(r.startswith("grouped") and "stream_k" in r for r in config.check(grouped, H200))


def test_the_grid_is_a_block_per_sm_and_the_workspace_two_slots_a_block():
    config = config_from_name(STREAM)
    problem = Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")
    kernel = config.kernel_problem(problem)
    assert config.grid_blocks(kernel, H200) == 132
    partial_bytes, counter_bytes = config.split_workspace(kernel, blocks=132)
    assert partial_bytes == 2 * 132 * 128 * 128 * 4
    assert counter_bytes == 3 * 36 * 2 * 4  # a counter per tile and consumer
    tiny = Problem.from_layout(64, 64, 64, "nt", dtype="float16")  # one tile of one slice: one block
    assert config.grid_blocks(config.kernel_problem(tiny), H200) == 1
    plain = config_from_name(STREAM[:-3])
    assert plain.split_workspace(kernel, blocks=132) == (0, 0)


def test_stream_k_fills_the_last_wave_that_whole_tiles_leave_partly_empty():
    problem = Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")  # 108 tiles of 128 x 128
    plain, streamed = fill(config_from_name(STREAM[:-3]), problem, H200), fill(config_from_name(STREAM), problem, H200)
    assert (plain.units, plain.waves, f"{plain.efficiency:.2f}") == (108, 1, "0.82")
    assert streamed.shared_tiles == 108 and streamed.whole_tiles == 0 and streamed.efficiency > 0.99
    assert "stream-K: 108 shared by the SMs" in streamed.describe()
    assert relative_cost(config_from_name(STREAM), problem, H200) < relative_cost(config_from_name(STREAM[:-3]),
                                                                                  problem, H200)
    # the predictor that carries records to other shapes counts only the tile padding for it, as for SIMT's
    from autogemm.results.predict import utilization

    assert utilization(config_from_name(STREAM), problem, H200) > utilization(config_from_name(STREAM[:-3]), problem, H200)
    # whole waves, then the rest shared: 576 tiles are 4 waves of 132 and 48 shared
    cube = Problem.from_layout(3000, 3000, 3000, "nn", dtype="bfloat16")
    waves = fill(config_from_name(STREAM), cube, H200)
    assert (waves.whole_tiles, waves.shared_tiles) == (528, 48)
    # a full last wave leaves nothing to share: as the plain kernel
    full = Problem.from_layout(128 * 12, 128 * 11, 4096, "nt", dtype="bfloat16")
    assert fill(config_from_name(STREAM), full, H200).shared_tiles == 0


STREAM_VARIANTS = [
    (STREAM, Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")),
    ("hopper_128x256x64_w64x256_s3_g8_k1_o1_p_ts_sw_sk", Problem.from_layout(1000, 3001, 200, "tn", dtype="bfloat16")),
    ("hopper_64x192x64_w64x192_s5_g8_k1_o1_p_sk", Problem.from_layout(100, 700, 5000, "nt", dtype="float16")),
    ("hopper_128x128x64_w128x128_s4_g8_k1_o1_p_ts_sk",
     Problem.from_layout(500, 700, 5000, "tt", dtype="bfloat16", epilogue=Epilogue("n", "gelu", True))),
    ("hopper_128x128x32_w64x128_s5_g8_k1_o1_p_sk", Problem.from_layout(300, 500, 700, "tt", dtype="float32", compute="tf32")),
]


@pytest.mark.parametrize("name, problem", STREAM_VARIANTS, ids=[n for n, _ in STREAM_VARIANTS])
def test_stream_k_kernels_compile_without_spills(name, problem):
    assert find_nvcc(), "nvcc is required for the compile tests: install the CUDA toolkit"
    config = config_from_name(name)
    assert config.check(problem, H200) == [], config.check(problem, H200)
    report = nvcc_resources(render(config, problem), "sm_90")
    assert all(not use.spills and not use.stack_bytes for use in report.values()), report


def test_the_seeds_may_stream_k_where_the_space_offers_it(tmp_path):
    """wave_seeds ranks the stream-K shapes beside the others where a space lists the knob."""
    from autogemm.kernels.space import SearchSpace
    from autogemm.tuning.wave_seeds import wave_ranked

    text = SearchSpace.load("hopper").path.read_text()
    assert "\nswap = [false, true]\n" in text
    path = tmp_path / "hopper_stream_k.toml"
    path.write_text(text.replace("\nswap = [false, true]\n", "\nswap = [false, true]\nstream_k = [false, true]\n"))
    problem = Problem.from_layout(333, 4544, 18176, "nn", dtype="float16")
    seeds = wave_ranked(SearchSpace.load(path), problem, H200)
    assert any(seed.stream_k for seed in seeds), [s.name for s in seeds]
    assert len({seed.name for seed in seeds}) == len(seeds)
    assert not any(seed.stream_k for seed in wave_ranked(SearchSpace.load("hopper"), problem, H200))
